//! Serving over TLS: a certificate and key read from PEM, and a listener that hands
//! the HTTP server connections whose handshake has finished.
//!
//! Handshakes run in tasks of their own, bounded by [`HANDSHAKE_TIMEOUT`], so a client
//! that connects and says nothing holds up no one else's connection; each holds one of
//! the server's connection slots from its accept on.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use sandcell::{Error, ErrorKind, Result};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use super::listen::Admission;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// The longest a client may take over its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections whose handshake finished but the server has not yet taken.
const READY_BACKLOG: usize = 64;

/// A server certificate chain and its private key, for [`serve_tls`](super::serve_tls).
///
/// Only HTTP/1.1 is offered (over ALPN), which the wire protocol's upgrade needs.
#[derive(Clone)]
pub struct Tls(Arc<rustls::ServerConfig>);

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tls(..)")
    }
}

impl Tls {
    /// The certificate chain (leaf first) and private key in the PEM files at
    /// `cert` and `key`; `InvalidInput` naming the file that cannot be used, and
    /// `PermissionDenied` for a key file every user may read (a sandbox would read
    /// it: see [`sandcell::raw::secret_file`]).
    pub fn from_pem_files(cert: impl AsRef<Path>, key: impl AsRef<Path>) -> Result<Self> {
        let cert = cert.as_ref();
        let cert = std::fs::read(cert).map_err(|e| {
            Error::invalid_input(format!("{} cannot be read ({e})", cert.display()))
        })?;
        let key = sandcell::raw::secret_file::read(key.as_ref(), "the TLS key")?;
        Self::from_pem(&cert, &key)
    }

    /// The certificate chain (leaf first) and private key in PEM text.
    pub fn from_pem(cert: &[u8], key: &[u8]) -> Result<Self> {
        let chain = CertificateDer::pem_slice_iter(cert)
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| Error::invalid_input(format!("the certificate is not PEM: {e}")))?;
        if chain.is_empty() {
            return Err(Error::invalid_input(
                "the certificate file holds no certificate",
            ));
        }
        let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| {
            Error::invalid_input(format!("the key file holds no usable private key: {e}"))
        })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::with_source(ErrorKind::Backend, "setting up TLS", e))?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|e| {
                Error::invalid_input(format!("the certificate and key do not go together: {e}"))
            })?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Tls(Arc::new(config)))
    }
}

/// A listener yielding TLS connections once their handshake is done.
pub(crate) struct TlsListener {
    ready: mpsc::Receiver<Ready>,
    acceptor: tokio::task::JoinHandle<()>,
}

/// A connection whose handshake is done, with its connection slot.
type Ready = super::listen::Accepted<TlsStream<TcpStream>>;

impl TlsListener {
    /// Accepts on `listener` while `admission` has room.
    pub(crate) fn new(listener: TcpListener, tls: &Tls, admission: Admission) -> Self {
        let (sender, ready) = mpsc::channel(READY_BACKLOG);
        let acceptor = TlsAcceptor::from(Arc::clone(&tls.0));
        let acceptor = tokio::spawn(accept_loop(listener, acceptor, admission, sender));
        TlsListener { ready, acceptor }
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

/// Accepts TCP connections and shakes hands with each in its own task.
async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    admission: Admission,
    ready: mpsc::Sender<Ready>,
) {
    loop {
        let permit = super::listen::slot(&admission.slots).await;
        let (tcp, peer): (TcpStream, SocketAddr) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors and the like: pause rather than spin.
                tracing::warn!(error = %e, "accepting a connection");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        // Before the handshake: a handshake holds a place as long as a request does.
        let Some(unclaimed) = admission.unauthenticated.admit(peer.ip()) else {
            tracing::debug!(%peer, "closing a connection: its address holds its bound \
                of unauthenticated connections");
            continue;
        };
        // See `serve`: a command's round trip is a few small messages.
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let ready = ready.clone();
        tokio::spawn(async move {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => {
                    let _ = ready.send((stream, permit, unclaimed)).await;
                }
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "a TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "a TLS handshake timed out"),
            }
        });
    }
}

impl super::listen::Accept for TlsListener {
    type Io = TlsStream<TcpStream>;

    async fn accept(&mut self, _admission: &Admission) -> Ready {
        match self.ready.recv().await {
            Some(connection) => connection,
            // The accept loop ends only when aborted, which happens on drop.
            None => std::future::pending().await,
        }
    }
}
