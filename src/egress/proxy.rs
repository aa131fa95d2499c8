//! The egress proxy: an HTTP proxy (`CONNECT` tunnels and absolute-form requests) that
//! lets a sandbox connect only where its [`Allowlist`] allows, resolving names itself.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::allowlist::{normalize_name, reaches_host, Allowlist};
use super::host_networks::{host_networks, private};
use super::relay::{self, Socket};
use super::sni::{self, Hello};

mod counts;
mod head;

pub use counts::{EgressCount, OTHER_HOSTS};
use head::{read_head, respond, Request};

/// The largest request head the proxy reads.
const MAX_HEAD: usize = 16 * 1024;
/// How long a client has to send its request head, and a tunnel its TLS hello.
const CLIENT_PATIENCE: Duration = Duration::from_secs(30);
/// How long resolving a name and connecting to it may take.
const UPSTREAM_PATIENCE: Duration = Duration::from_secs(10);
/// Buffer per direction of a relayed connection.
const RELAY_BUFFER: usize = 256 * 1024;
/// The response header that says why the proxy refused a connection.
pub const DENIED_HEADER: &str = "x-sandcell-egress-denied";

/// An egress proxy for one sandbox (or several sharing a policy). Cheap to clone: the
/// clones share the allowlist and the counts.
///
/// Hand it each connection the sandbox opens with [`serve`](Self::serve), or a listener
/// with [`spawn_listener`](Self::spawn_listener). It speaks HTTP/1.1 proxying:
///
/// - `CONNECT host:port` opens a tunnel (HTTPS, or any TCP protocol) when a rule allows
///   the host. If the tunnel starts with a TLS ClientHello, the server name in it must
///   be allowed too, so a tunnel opened to an allowed name cannot be fronted to another.
/// - `GET http://host/...` (any method, absolute form) is forwarded when a rule allows
///   the host.
/// - Names are resolved here, never by the sandbox: an allowed name that resolves only
///   to this host's addresses, or to [private](super::is_private) ones or ones on a
///   network this host is directly on ([`on_host_network`](crate::raw::egress::on_host_network))
///   that no address rule allows (which it can only where the operator allows private ranges,
///   [`allow_private_ranges`](Self::allow_private_ranges)), is refused, and the
///   connection goes to an address that was checked. An address that reaches this
///   host ([`reaches_host`](super::reaches_host), or one of its own) is never a target
///   (ADVERSARIAL 38).
/// - A refusal is `403 Forbidden` with the reason in the body and in the
///   [`DENIED_HEADER`] header; an upstream that cannot be resolved or reached is
///   `502 Bad Gateway`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use sandcell::egress::Allowlist;
/// use sandcell::raw::egress::EgressProxy;
/// use tokio::io::{AsyncReadExt, AsyncWriteExt};
///
/// let proxy = EgressProxy::new(Allowlist::parse(["pypi.org:443"]).unwrap());
/// let (mut sandbox, proxied) = tokio::io::duplex(4096);
/// let serving = tokio::spawn({
///     let proxy = proxy.clone();
///     async move { proxy.serve(proxied).await }
/// });
/// sandbox.write_all(b"CONNECT evil.test:443 HTTP/1.1\r\n\r\n").await.unwrap();
/// let mut answer = String::new();
/// sandbox.read_to_string(&mut answer).await.unwrap();
/// assert!(answer.starts_with("HTTP/1.1 403"));
/// assert!(answer.contains("evil.test:443"));
/// serving.await.unwrap();
/// assert_eq!(proxy.counts()[0].denied, 1);
/// # }
/// ```
#[derive(Clone)]
pub struct EgressProxy {
    inner: Arc<Inner>,
}

struct Inner {
    allowlist: RwLock<Arc<Allowlist>>,
    hosts: BTreeMap<String, Vec<IpAddr>>,
    counts: Mutex<BTreeMap<String, EgressCount>>,
    /// Whether an address rule may allow a private address (the operator's choice).
    private_ranges: std::sync::atomic::AtomicBool,
    /// Unit tests' upstreams listen on `127.0.0.1`: there it counts as public.
    #[cfg(test)]
    loopback_is_public: bool,
}

impl std::fmt::Debug for EgressProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EgressProxy")
            .field("allowlist", &self.allowlist())
            .field("hosts", &self.inner.hosts)
            .finish_non_exhaustive()
    }
}

/// Why a connection was not made.
enum Refusal {
    /// The allowlist refuses it: 403.
    Denied(String),
    /// The upstream cannot be resolved or reached: 502.
    Failed(String),
    /// The request is not one a proxy serves: 400.
    Malformed(String),
}

/// Where a request asked to go.
struct Target {
    host: String,
    port: u16,
}

impl EgressProxy {
    /// A proxy enforcing `allowlist`, resolving names with the system's resolver.
    pub fn new(allowlist: Allowlist) -> Self {
        Self::with_hosts(allowlist, BTreeMap::new())
    }

    /// A proxy that resolves the names in `hosts` to the given addresses instead of
    /// asking the system's resolver (as an `/etc/hosts` of its own would). The
    /// addresses are checked like resolved ones.
    pub fn with_hosts(allowlist: Allowlist, hosts: BTreeMap<String, Vec<IpAddr>>) -> Self {
        let hosts = hosts
            .into_iter()
            .filter_map(|(name, addrs)| Some((normalize_name(&name)?, addrs)))
            .collect();
        EgressProxy {
            inner: Arc::new(Inner {
                allowlist: RwLock::new(Arc::new(allowlist)),
                hosts,
                counts: Mutex::new(BTreeMap::new()),
                private_ranges: std::sync::atomic::AtomicBool::new(false),
                #[cfg(test)]
                loopback_is_public: false,
            }),
        }
    }

    /// The allowlist in force.
    pub fn allowlist(&self) -> Arc<Allowlist> {
        Arc::clone(
            &self
                .inner
                .allowlist
                .read()
                .unwrap_or_else(|p| p.into_inner()),
        )
    }

    /// Lets an address rule allow a private address ([`is_private`](super::is_private): the host's
    /// networks and reserved ranges), which an operator chooses, never a sandbox's
    /// allowlist alone (ADVERSARIAL 38). Off by default: a private address is refused
    /// whatever the rules. Loopback, link-local and the host's own addresses stay
    /// refused either way.
    pub fn allow_private_ranges(&self, allowed: bool) {
        self.inner
            .private_ranges
            .store(allowed, std::sync::atomic::Ordering::Relaxed);
    }

    fn private_allowed(&self) -> bool {
        self.inner
            .private_ranges
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Replaces the allowlist. New connections see it at once; open ones stay open.
    pub fn set_allowlist(&self, allowlist: Allowlist) {
        *self
            .inner
            .allowlist
            .write()
            .unwrap_or_else(|p| p.into_inner()) = Arc::new(allowlist);
    }

    /// Serves `listener` until the returned task is aborted (or dropped with the
    /// runtime); aborting it closes every connection it opened.
    pub fn spawn_listener(&self, listener: TcpListener) -> tokio::task::JoinHandle<()> {
        let listener = Arc::new(listener);
        self.spawn_accepting(move || {
            let listener = Arc::clone(&listener);
            async move {
                let (client, _) = listener.accept().await?;
                let _ = client.set_nodelay(true);
                Ok(client)
            }
        })
    }

    /// [`spawn_listener`](Self::spawn_listener) for a Unix socket (a sandbox that
    /// reaches its proxy through a socket mounted into it).
    pub fn spawn_unix_listener(
        &self,
        listener: tokio::net::UnixListener,
    ) -> tokio::task::JoinHandle<()> {
        let listener = Arc::new(listener);
        self.spawn_accepting(move || {
            let listener = Arc::clone(&listener);
            async move { listener.accept().await.map(|(client, _)| client) }
        })
    }

    fn spawn_accepting<S, A, F>(&self, mut accept: A) -> tokio::task::JoinHandle<()>
    where
        S: Socket + AsyncRead + AsyncWrite + Unpin + 'static,
        A: FnMut() -> F + Send + 'static,
        F: std::future::Future<Output = std::io::Result<S>> + Send,
    {
        let proxy = self.clone();
        tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            loop {
                tokio::select! {
                    accepted = accept() => {
                        let Ok(client) = accepted else {
                            // Out of descriptors: give the others time to close.
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        };
                        let proxy = proxy.clone();
                        connections.spawn(async move { proxy.serve_socket(client).await });
                    }
                    Some(_) = connections.join_next(), if !connections.is_empty() => {}
                }
            }
        })
    }

    /// Serves one connection from the sandbox: reads its request, refuses it or relays
    /// it, and returns when either side closes.
    pub async fn serve<S>(&self, mut client: S)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let Some(admitted) = self.admit(&mut client).await else {
            return;
        };
        let (mut client_read, client_write) = tokio::io::split(client);
        let (upstream_read, mut upstream_write) = admitted.upstream.into_split();
        // The server may speak first (SSH, SMTP): its direction runs from the start.
        let mut down = std::pin::pin!(copy(upstream_read, client_write));
        let mut first = admitted.first;
        if let Some(port) = admitted.sni_port {
            let check = async {
                let mut buf = [0u8; 4096];
                loop {
                    if let Some(verdict) = self.judge_hello(&first, port) {
                        return verdict;
                    }
                    match client_read.read(&mut buf).await {
                        Ok(0) | Err(_) => return false,
                        Ok(n) => first.extend_from_slice(&buf[..n]),
                    }
                }
            };
            if !self.until_checked(check, &mut down).await {
                return;
            }
        }
        if upstream_write.write_all(&first).await.is_err() {
            return;
        }
        tokio::join!(copy(client_read, upstream_write), down);
    }

    /// [`serve`](Self::serve) for a socket: the same, but the relay splices (see
    /// [`relay`](super::relay)).
    async fn serve_socket<S>(&self, mut client: S)
    where
        S: Socket + AsyncRead + AsyncWrite + Unpin,
    {
        let Some(admitted) = self.admit(&mut client).await else {
            return;
        };
        let upstream = &admitted.upstream;
        let mut down = std::pin::pin!(relay::pump(upstream, &client));
        let mut first = admitted.first;
        if let Some(port) = admitted.sni_port {
            let check = async {
                let mut buf = [0u8; 4096];
                loop {
                    if let Some(verdict) = self.judge_hello(&first, port) {
                        return verdict;
                    }
                    match relay::read_some(&client, &mut buf).await {
                        Ok(0) | Err(_) => return false,
                        Ok(n) => first.extend_from_slice(&buf[..n]),
                    }
                }
            };
            if !self.until_checked(check, &mut down).await {
                return;
            }
        }
        if relay::write_all(upstream, &first).await.is_err() {
            return;
        }
        let _ = tokio::join!(relay::pump(&client, upstream), down);
    }

    /// Reads the request, refuses it or connects to where it asked to go. Returns the
    /// upstream connection with the bytes to send it first.
    async fn admit<S>(&self, client: &mut S) -> Option<Admitted>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let Ok(Ok(Some((head, rest)))) =
            tokio::time::timeout(CLIENT_PATIENCE, read_head(client)).await
        else {
            let _ = respond(client, 400, "the request head is missing or too long").await;
            return None;
        };
        let request = match Request::parse(&head) {
            Ok(request) => request,
            Err(why) => {
                let _ = respond(client, 400, &why).await;
                return None;
            }
        };
        let upstream = match self.open(&request.target).await {
            Ok(upstream) => upstream,
            Err(refusal) => {
                let (status, why) = match refusal {
                    Refusal::Denied(why) => (403, why),
                    Refusal::Failed(why) => (502, why),
                    Refusal::Malformed(why) => (400, why),
                };
                let _ = respond(client, status, &why).await;
                return None;
            }
        };
        if !request.connect {
            let mut first = request.forwarded_head();
            first.extend_from_slice(&rest);
            return Some(Admitted {
                upstream,
                first,
                sni_port: None,
            });
        }
        client
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .await
            .ok()?;
        // A tunnel opened to a name must not be fronted to another.
        let by_name = request.target.host.parse::<IpAddr>().is_err();
        Some(Admitted {
            upstream,
            first: rest,
            sni_port: by_name.then_some(request.target.port),
        })
    }
    /// Checks `target` against the allowlist, resolving a name, and connects to the
    /// first address that passes.
    async fn open(&self, target: &Target) -> Result<TcpStream, Refusal> {
        let allowlist = self.allowlist();
        let port = target.port;
        let candidates: Vec<SocketAddr> = if let Ok(addr) = target.host.parse::<IpAddr>() {
            if self.reaches_this_host(addr, false) {
                self.count(&target.host, false);
                return Err(Refusal::Denied(format!(
                    "address {addr} reaches this host (loopback, link-local or one of its \
                     own addresses): no rule can allow it"
                )));
            }
            if private(addr, &host_networks())
                && !self.private_allowed()
                && !self.test_upstream(addr)
            {
                self.count(&target.host, false);
                return Err(Refusal::Denied(format!(
                    "address {addr} is private or on a network this host is on, and the \
                     operator has not allowed private ranges"
                )));
            }
            if allowlist.allows_addr(addr, port).is_none() {
                self.count(&target.host, false);
                return Err(Refusal::Denied(format!(
                    "no rule of the sandbox's network allowlist allows address {addr} port {port}"
                )));
            }
            vec![SocketAddr::new(addr, port)]
        } else {
            let Some(name) = normalize_name(&target.host) else {
                return Err(Refusal::Malformed(format!(
                    "{:?} is not a host name",
                    target.host
                )));
            };
            let Some(rule) = allowlist.allows_name(&name, port) else {
                self.count(&name, false);
                return Err(Refusal::Denied(format!(
                    "no rule of the sandbox's network allowlist allows {name}:{port}"
                )));
            };
            let resolved = self.resolve(&name, port).await?;
            let pinned = self.inner.hosts.contains_key(&name);
            let near = host_networks();
            let (passed, refused): (Vec<SocketAddr>, Vec<SocketAddr>) =
                resolved.into_iter().partition(|addr| {
                    self.test_upstream(addr.ip())
                        || (!self.reaches_this_host(addr.ip(), pinned)
                            && (!private(addr.ip(), &near)
                                || (self.private_allowed()
                                    && allowlist.allows_addr(addr.ip(), port).is_some())))
                });
            if passed.is_empty() {
                self.count(&name, false);
                let addrs: Vec<String> = refused.iter().map(|a| a.ip().to_string()).collect();
                return Err(Refusal::Denied(format!(
                    "rule {rule:?} allows {name}, but it resolves to {}: an address of this \
                     host's, or a private address no address rule allows",
                    addrs.join(", ")
                )));
            }
            passed
        };
        let pinned =
            normalize_name(&target.host).is_some_and(|name| self.inner.hosts.contains_key(&name));
        self.count(&target.host, true);
        let mut last = String::from("no address");
        for addr in candidates {
            match tokio::time::timeout(UPSTREAM_PATIENCE, TcpStream::connect(addr)).await {
                // The kernel answers a connection to one of this host's own addresses
                // from that address: one the check before missed (an address added
                // meanwhile) is closed before a byte is relayed.
                Ok(Ok(stream)) if !pinned && self.looped_back(&stream) => {
                    self.count(&target.host, false);
                    return Err(Refusal::Denied(format!(
                        "{} reaches this host: no rule can allow it",
                        target.host
                    )));
                }
                Ok(Ok(stream)) => {
                    let _ = stream.set_nodelay(true);
                    return Ok(stream);
                }
                Ok(Err(e)) => last = format!("{addr}: {e}"),
                Err(_) => last = format!("{addr}: no answer in {UPSTREAM_PATIENCE:?}"),
            }
        }
        Err(Refusal::Failed(format!(
            "cannot connect to {}:{port} ({last})",
            target.host
        )))
    }

    /// Whether `addr` is loopback, link-local or unspecified ([`reaches_host`]), or an
    /// address of this host's own, which it can bind (ADVERSARIAL 38). An address the
    /// operator pinned the name asked for to ([`with_hosts`](Self::with_hosts),
    /// `pinned`) is the operator's choice: only the first test applies to it. The same
    /// address asked for as an address gets both.
    fn reaches_this_host(&self, addr: IpAddr, pinned: bool) -> bool {
        if self.test_upstream(addr) {
            return false;
        }
        reaches_host(addr)
            || (!pinned && std::net::UdpSocket::bind(SocketAddr::new(addr, 0)).is_ok())
    }

    /// Whether `stream` connected to this host itself: the kernel picks the
    /// destination as the source of a connection to one of the host's addresses.
    fn looped_back(&self, stream: &TcpStream) -> bool {
        match (stream.local_addr(), stream.peer_addr()) {
            (Ok(local), Ok(peer)) => local.ip() == peer.ip() && !self.test_upstream(peer.ip()),
            _ => true,
        }
    }

    /// A unit test's upstream on loopback (never outside tests).
    fn test_upstream(&self, addr: IpAddr) -> bool {
        #[cfg(test)]
        if self.inner.loopback_is_public {
            return addr.is_loopback();
        }
        let _ = addr;
        false
    }

    async fn resolve(&self, name: &str, port: u16) -> Result<Vec<SocketAddr>, Refusal> {
        if let Some(addrs) = self.inner.hosts.get(name) {
            return Ok(addrs.iter().map(|ip| SocketAddr::new(*ip, port)).collect());
        }
        match tokio::time::timeout(UPSTREAM_PATIENCE, tokio::net::lookup_host((name, port))).await {
            Ok(Ok(addrs)) => Ok(addrs.collect()),
            Ok(Err(e)) => Err(Refusal::Failed(format!("cannot resolve {name}: {e}"))),
            Err(_) => Err(Refusal::Failed(format!(
                "cannot resolve {name}: no answer in {UPSTREAM_PATIENCE:?}"
            ))),
        }
    }

    /// Judges the start of a tunnel opened to a name: `None` while a TLS ClientHello
    /// may still be arriving, then whether the tunnel may go on. A hello must name a
    /// host the allowlist allows on `port`; anything else than TLS passes.
    fn judge_hello(&self, first: &[u8], port: u16) -> Option<bool> {
        match sni::client_hello(first) {
            Hello::Incomplete if first.len() < sni::MAX_RECORD => None,
            Hello::Incomplete => Some(false),
            Hello::NotTls | Hello::Nameless => Some(true),
            Hello::Name(name) => {
                let allowed = self.allowlist().allows_name(&name, port).is_some();
                if !allowed {
                    self.count(&name, false);
                }
                Some(allowed)
            }
        }
    }

    /// Runs `check` for at most [`CLIENT_PATIENCE`] while `down` (the upstream's
    /// direction) runs too: false if it times out, or the upstream closes first.
    async fn until_checked<C, D>(&self, check: C, down: &mut std::pin::Pin<&mut D>) -> bool
    where
        C: std::future::Future<Output = bool>,
        D: std::future::Future,
    {
        let check = tokio::time::timeout(CLIENT_PATIENCE, check);
        tokio::select! {
            checked = check => checked.unwrap_or(false),
            _ = down.as_mut() => false,
        }
    }
}

/// Admitted: the upstream a request may reach, and what to send it first.
struct Admitted {
    upstream: TcpStream,
    /// The forwarded request head, or bytes that followed a `CONNECT` head.
    first: Vec<u8>,
    /// For a tunnel opened to a name, its port: the TLS hello it starts with is judged.
    sni_port: Option<u16>,
}

/// Copies `from` to `to` until `from` ends, then closes `to` for writing.
async fn copy<R, W>(mut from: R, mut to: W)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; RELAY_BUFFER];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

#[cfg(test)]
mod tests;
