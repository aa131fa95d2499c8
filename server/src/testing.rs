//! A server on a loopback port for tests: what this crate's tests, the clients' tests
//! and an embedder's own tests start, stopped when dropped. With the feature
//! `testing`, one over a local backend of its own too ([`serve_local`]).

use std::net::SocketAddr;
use std::sync::Arc;

use sandcell::SandboxBackend;

use crate::{serve, ServerConfig};

/// A server running on `127.0.0.1` at [`url`](Served::url); dropping it stops it.
#[derive(Debug)]
pub struct Served {
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    /// The address it listens on.
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves `backend` with `config` on a free loopback port, on the current runtime.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use std::sync::Arc;
/// use sandcell_server::{testing::serve_on_loopback, ServerConfig};
///
/// let backend = Arc::new(sandcell::testing::MockBackend::new());
/// let served = serve_on_loopback(backend, ServerConfig::new("token")).await?;
/// assert!(served.url.starts_with("http://127.0.0.1:"));
/// # std::io::Result::Ok(()) }).unwrap();
/// ```
pub async fn serve_on_loopback(
    backend: Arc<dyn SandboxBackend>,
    config: ServerConfig,
) -> std::io::Result<Served> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        if let Err(e) = serve(listener, backend, config, std::future::pending()).await {
            tracing::warn!(error = %e, "the test server stopped");
        }
    });
    Ok(Served {
        url: format!("http://{addr}"),
        addr,
        task,
    })
}

/// A server over a local backend of its own, whose sandboxes live in a temporary
/// directory; dropping it stops the server and removes the directory.
#[cfg(feature = "testing")]
#[derive(Debug)]
pub struct LocalServer {
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    /// The served backend, to look at what the server did.
    pub local: sandcell_local::LocalBackend,
    _served: Served,
    _root: tempfile::TempDir,
}

/// Serves a fresh local backend (in a new temporary directory) with `config` on a free
/// loopback port.
#[cfg(feature = "testing")]
pub async fn serve_local(config: ServerConfig) -> sandcell::Result<LocalServer> {
    let root = tempfile::tempdir()
        .map_err(|e| sandcell::Error::io("making the test server's directory", e))?;
    let local = sandcell_local::LocalBackend::builder()
        .root(root.path())
        .build()?;
    serve_local_backend(local, root, config).await
}

/// Serves `local`, whose sandboxes live in `root`, with `config` on a free loopback
/// port; `root` goes when the server is dropped.
#[cfg(feature = "testing")]
pub async fn serve_local_backend(
    local: sandcell_local::LocalBackend,
    root: tempfile::TempDir,
    config: ServerConfig,
) -> sandcell::Result<LocalServer> {
    let served = serve_on_loopback(Arc::new(local.clone()), config)
        .await
        .map_err(|e| sandcell::Error::io("starting the test server", e))?;
    Ok(LocalServer {
        url: served.url.clone(),
        local,
        _served: served,
        _root: root,
    })
}
