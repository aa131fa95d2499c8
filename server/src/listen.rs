//! The accept loop under [`serve`](super::serve) and [`serve_tls`](super::serve_tls):
//! at most [`ServerConfig::max_connections`](super::ServerConfig::max_connections)
//! connections at once, each closed when its request head is not in within
//! [`ServerConfig::header_read_timeout`](super::ServerConfig::header_read_timeout),
//! when a request's body stalls for
//! [`ServerConfig::body_read_timeout`](super::ServerConfig::body_read_timeout)
//! ([`super::requests`]), or when it has no request in flight for
//! [`ServerConfig::idle_timeout`](super::ServerConfig::idle_timeout); and a graceful
//! shutdown that waits for the connections it has.
//!
//! axum's own `serve` sets no timer, so a client that sends half a request head (or
//! nothing at all, or half a body) holds its connection (and a task) for as long as it
//! likes; this loop is that one with the bounds added.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

use super::config::ServerConfig;
use super::connection_shares::{ConnectionOwner, Unauthenticated, Unclaimed};
use super::requests::{InFlight, Service};

/// How long a client may take to send a request head, by default: long enough for a
/// slow link, short enough that held-open connections cannot pile up.
pub(crate) const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How many connections are served at once, by default (a TLS handshake counts as
/// one); past it the server stops accepting until one closes.
pub(crate) const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// How many of them one tenant holds, by default: a quarter, so a tenant keeping its
/// connections busy leaves most of the server to the others.
pub(crate) const DEFAULT_MAX_CONNECTIONS_PER_TENANT: usize = DEFAULT_MAX_CONNECTIONS / 4;
/// How long the server waits on a request body that makes no progress, by default:
/// as long as nginx's `client_body_timeout` is twice over, for slow links.
pub(crate) const DEFAULT_BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a connection may go without a request in flight, by default: long enough
/// for a client between the steps of its work to keep its connection.
pub(crate) const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// How many connections one client address holds before a request authenticates on
/// them, by default: far more than a client opens at once, a sixteenth of
/// `max_connections`'s default.
pub(crate) const DEFAULT_MAX_UNAUTHENTICATED_PER_ADDRESS: usize = DEFAULT_MAX_CONNECTIONS / 16;

/// The bounds the accept loop applies.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    pub(crate) header_read_timeout: Duration,
    pub(crate) body_read_timeout: Duration,
    pub(crate) idle_timeout: Duration,
}

impl Bounds {
    /// How long a new connection may go before its first request begins: the wait for
    /// a request's head, or less where connections idle for less.
    fn first_request_timeout(&self) -> Duration {
        self.header_read_timeout.min(self.idle_timeout)
    }

    /// How long a connection may live before a request authenticates on it: its first
    /// request's head and body, each in its time.
    fn unclaimed_lifetime(&self) -> Duration {
        self.first_request_timeout() + self.body_read_timeout
    }
}

/// How long a connection told to close (a request on it did not authenticate) has to
/// finish its answers before it is closed outright.
const CLOSING_GRACE: Duration = Duration::from_secs(5);

/// Where a connection's places come from: the server's slots, and its address's
/// share of the connections nobody has authenticated on yet.
#[derive(Clone)]
pub(crate) struct Admission {
    pub(crate) slots: Arc<Semaphore>,
    pub(crate) unauthenticated: Arc<Unauthenticated>,
}

/// A connection accepted, with its places.
pub(crate) type Accepted<Io> = (Io, OwnedSemaphorePermit, Unclaimed);

/// Where connections come from: a TCP listener, or TLS streams whose handshake is
/// done. Each comes with its place among the connections allowed at once, and among
/// its address's unauthenticated ones (an address past its bound is closed unserved).
pub(crate) trait Accept: Send + 'static {
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;

    /// The next connection, once `admission` has room for it.
    fn accept(&mut self, admission: &Admission) -> impl Future<Output = Accepted<Self::Io>> + Send;
}

impl Accept for tokio::net::TcpListener {
    type Io = tokio::net::TcpStream;

    async fn accept(&mut self, admission: &Admission) -> Accepted<Self::Io> {
        let permit = slot(&admission.slots).await;
        loop {
            match tokio::net::TcpListener::accept(self).await {
                Ok((tcp, peer)) => {
                    let Some(unclaimed) = admission.unauthenticated.admit(peer.ip()) else {
                        tracing::debug!(%peer, "closing a connection: its address holds \
                            its bound of unauthenticated connections");
                        continue;
                    };
                    // A command's round trip is a few small messages; Nagle's algorithm
                    // against delayed acknowledgements would add tens of ms to each.
                    let _ = tcp.set_nodelay(true);
                    return (tcp, permit, unclaimed);
                }
                Err(e) => {
                    // Out of file descriptors and the like: pause rather than spin.
                    tracing::warn!(error = %e, "accepting a connection");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }
}

/// The accept loop's bounds and its connections' places; `InvalidInput` for a zero
/// cap.
pub(crate) fn bounds_of(config: &ServerConfig) -> std::io::Result<(Bounds, Admission)> {
    let timeouts = [
        config.header_read_timeout,
        config.body_read_timeout,
        config.idle_timeout,
    ];
    if config.max_connections == 0
        || config.max_connections_per_tenant == 0
        || config.max_unauthenticated_per_address == 0
        || timeouts.iter().any(|t| t.is_zero())
    {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "max_connections, max_connections_per_tenant, \
             max_unauthenticated_per_address, header_read_timeout, body_read_timeout and \
             idle_timeout must be above zero",
        ));
    }
    let bounds = Bounds {
        header_read_timeout: config.header_read_timeout,
        body_read_timeout: config.body_read_timeout,
        idle_timeout: config.idle_timeout,
    };
    let slots = Arc::new(Semaphore::new(
        config.max_connections.min(Semaphore::MAX_PERMITS),
    ));
    let unauthenticated = Unauthenticated::new(config.max_unauthenticated_per_address);
    Ok((
        bounds,
        Admission {
            slots,
            unauthenticated,
        },
    ))
}

/// A place among the connections allowed at once (the semaphore is never closed).
pub(crate) async fn slot(slots: &Arc<Semaphore>) -> OwnedSemaphorePermit {
    match Arc::clone(slots).acquire_owned().await {
        Ok(permit) => permit,
        Err(_) => std::future::pending().await,
    }
}

/// Serves `router` on what `incoming` accepts until `shutdown` resolves, then lets
/// each connection finish its requests.
pub(crate) async fn run<A: Accept>(
    mut incoming: A,
    admission: Admission,
    bounds: Bounds,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(bounds.header_read_timeout);
    // CONNECT for HTTP/2 upgrades, as axum's `serve` enables it.
    builder.http2().enable_connect_protocol();
    let builder = Arc::new(builder);
    // Dropped on shutdown: every connection task sees it and shuts down gracefully.
    let (stop, stopping) = watch::channel(());
    // Held by every connection task: closed once all have finished.
    let (done, all_done) = watch::channel(());
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (io, permit, unclaimed) = tokio::select! {
            accepted = incoming.accept(&admission) => accepted,
            () = &mut shutdown => break,
        };
        let in_flight = InFlight::new();
        let owner = Arc::new(ConnectionOwner::new(Some(unclaimed)));
        let service = Service::new(
            router.clone(),
            bounds.body_read_timeout,
            in_flight.clone(),
            Arc::clone(&owner),
        );
        let (builder, mut stopping, all_done) =
            (Arc::clone(&builder), stopping.clone(), all_done.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let _all_done = all_done;
            let connection = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
            let mut connection = std::pin::pin!(connection);
            let mut stopped = false;
            // A connection nobody authenticates on has a hard end, whatever it has in
            // flight: an HTTP/2 client that never opened its window for the answer
            // kept its request in flight, and its place, for as long as it liked.
            let unclaimed_until = tokio::time::sleep(bounds.unclaimed_lifetime());
            let mut unclaimed_until = std::pin::pin!(unclaimed_until);
            let mut claimed = false;
            let closing_grace = async {
                in_flight.closing().await;
                tokio::time::sleep(CLOSING_GRACE).await;
            };
            let mut closing_grace = std::pin::pin!(closing_grace);
            loop {
                tokio::select! {
                    result = connection.as_mut() => {
                        if let Err(e) = result {
                            tracing::trace!(error = %e, "a connection ended with an error");
                        }
                        break;
                    }
                    changed = stopping.changed(), if !stopped => {
                        // The sender is dropped: the server is shutting down.
                        let _: Result<(), watch::error::RecvError> = changed;
                        stopped = true;
                        connection.as_mut().graceful_shutdown();
                    }
                    // Idle: closed as at shutdown, which ends an idle connection at
                    // once. A client that begins a request just then sees the close
                    // every keep-alive client must expect, and retries. One that has
                    // sent no request yet is waited for as for a request's head (hyper
                    // times a head from its first byte only). Upgraded, a connection
                    // has left this loop.
                    () = in_flight.idle_for(bounds.idle_timeout, bounds.first_request_timeout()), if !stopped => {
                        stopped = true;
                        connection.as_mut().graceful_shutdown();
                    }
                    () = &mut unclaimed_until, if !claimed => {
                        if !owner.is_claimed() {
                            tracing::debug!("closing a connection nobody authenticated on");
                            break;
                        }
                        claimed = true;
                    }
                    // Told to close (a request on it did not authenticate), a
                    // connection that does not finish soon is closed outright.
                    () = &mut closing_grace, if !owner.is_claimed() => break,
                }
            }
        });
    }
    drop(stop);
    drop(all_done);
    done.closed().await;
}
