//! Network policy scenarios every backend that claims a policy runs: servers on this
//! machine standing in for the internet, and what a sandbox can and cannot reach of
//! them under `None`, `Full` and an allowlist.
//!
//! The "internet" is two documentation addresses (`198.51.100.1` for host A,
//! `198.51.100.2` for host B) added to this host's loopback interface, which the
//! egress proxy treats as public, plus a service on `127.0.0.1` that stands for the
//! host's own loopback services. Adding the addresses needs root and `ip` (iproute2);
//! [`EgressWorld::start`] says so plainly when it cannot.
//!
//! The sandbox needs `curl` on its `PATH` (the scenarios drive it with the standard
//! proxy variables the backend sets).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::{Network, SandboxBackend, SandboxBackendExt, SandboxId, SandboxSpec};

/// Host A's address.
pub const HOST_A: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);
/// Host B's address.
pub const HOST_B: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 2);
/// What host A answers over HTTP.
pub const BODY_A: &str = "hello from a";
/// What host A answers over HTTPS.
pub const BODY_A_TLS: &str = "hello from a over tls";
/// What host B answers.
pub const BODY_B: &str = "hello from b";
/// What the host's loopback service answers.
pub const BODY_LOOPBACK: &str = "loopback secret";
/// The name under the allowed wildcard that resolves to the host's loopback.
pub const REBOUND: &str = "evil.pkg.test";

/// Servers standing in for the internet; they stop when this is dropped.
#[derive(Debug)]
pub struct EgressWorld {
    /// Host A's HTTP port.
    pub a_http: u16,
    /// Host A's HTTPS port (a certificate for `a.test` from [`ca_pem`](Self::ca_pem)).
    pub a_https: u16,
    /// Host B's HTTP port.
    pub b_http: u16,
    /// The loopback service's port on `127.0.0.1`.
    pub loopback: u16,
    /// Host A's port that answers [`BULK_BYTES`] zero bytes over HTTP (for benches), as
    /// fast as it can, or at the rate a query `?bytes_per_second=N` asks for.
    pub a_bulk: u16,
    /// Host B's UDP port, which counts the datagrams it receives.
    pub b_udp: u16,
    udp_datagrams: Arc<AtomicUsize>,
    ca_pem: String,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for EgressWorld {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl EgressWorld {
    /// Adds the two addresses to loopback (once per boot) and starts the servers.
    pub async fn start() -> EgressWorld {
        for addr in [HOST_A, HOST_B] {
            add_loopback_address(addr);
        }
        let ca_key = rcgen::KeyPair::generate().expect("a CA key");
        let mut ca_params =
            rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "sandcell egress test CA");
        let ca = ca_params.self_signed(&ca_key).expect("the CA certificate");
        let key = rcgen::KeyPair::generate().expect("a server key");
        let cert = rcgen::CertificateParams::new(vec!["a.test".to_owned()])
            .expect("server parameters")
            .signed_by(&key, &ca, &ca_key)
            .expect("the server certificate");
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
            )
            .expect("the TLS configuration");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));

        let mut tasks = Vec::new();
        let (a_http, task) = serve(SocketAddr::from((HOST_A, 0)), BODY_A, None).await;
        tasks.push(task);
        let (a_https, task) =
            serve(SocketAddr::from((HOST_A, 0)), BODY_A_TLS, Some(acceptor)).await;
        tasks.push(task);
        let (b_http, task) = serve(SocketAddr::from((HOST_B, 0)), BODY_B, None).await;
        tasks.push(task);
        let (loopback, task) = serve(
            SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            BODY_LOOPBACK,
            None,
        )
        .await;
        tasks.push(task);
        let bulk = TcpListener::bind(SocketAddr::from((HOST_A, 0)))
            .await
            .expect("listening for bulk downloads");
        let a_bulk = bulk.local_addr().expect("local address").port();
        tasks.push(tokio::spawn(serve_bulk(bulk)));
        let udp = tokio::net::UdpSocket::bind(SocketAddr::from((HOST_B, 0)))
            .await
            .expect("a UDP socket on B");
        let b_udp = udp.local_addr().expect("local address").port();
        let udp_datagrams = Arc::new(AtomicUsize::new(0));
        let seen = udp_datagrams.clone();
        tasks.push(tokio::spawn(async move {
            let mut buf = [0u8; 2048];
            while udp.recv_from(&mut buf).await.is_ok() {
                seen.fetch_add(1, Ordering::SeqCst);
            }
        }));
        EgressWorld {
            a_bulk,
            b_udp,
            udp_datagrams,
            a_http,
            a_https,
            b_http,
            loopback,
            ca_pem: ca.pem(),
            tasks,
        }
    }

    /// The names the egress proxy must resolve for these scenarios: give them to the
    /// backend's `egress_hosts` setting.
    pub fn hosts() -> BTreeMap<String, Vec<IpAddr>> {
        BTreeMap::from([
            ("a.test".to_owned(), vec![IpAddr::V4(HOST_A)]),
            ("b.test".to_owned(), vec![IpAddr::V4(HOST_B)]),
            (REBOUND.to_owned(), vec![IpAddr::V4(Ipv4Addr::LOCALHOST)]),
        ])
    }

    /// How many UDP datagrams host B has received.
    pub fn udp_datagrams(&self) -> usize {
        self.udp_datagrams.load(Ordering::SeqCst)
    }

    /// Serves [`BODY_B`] on host B at `port` too (with `SO_REUSEPORT`, so scenarios
    /// running at once can each ask for the same port) until the handle is aborted.
    pub fn b_also_on(&self, port: u16) -> tokio::task::JoinHandle<()> {
        let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
        socket.set_reuseport(true).expect("SO_REUSEPORT");
        socket
            .bind(SocketAddr::from((HOST_B, port)))
            .unwrap_or_else(|e| panic!("listening on {HOST_B}:{port}: {e}"));
        let listener = socket.listen(64).expect("listening");
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(answer(stream, BODY_B));
            }
        })
    }

    /// The test CA's certificate, for `curl --cacert`.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }
}

fn add_loopback_address(addr: Ipv4Addr) {
    // Tests of one binary start worlds in parallel: add each address once.
    static ADDING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = ADDING.lock().unwrap_or_else(|p| p.into_inner());
    let present = std::process::Command::new("ip")
        .args(["-4", "-o", "addr", "show", "dev", "lo"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains(&format!("{addr}/32")))
        .unwrap_or(false);
    if present {
        return;
    }
    let out = std::process::Command::new("ip")
        .args(["addr", "add", &format!("{addr}/32"), "dev", "lo"])
        .output()
        .unwrap_or_else(|e| panic!("the egress scenarios need `ip` (iproute2): {e}"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() || stderr.contains("File exists"),
        "the egress scenarios add {addr} to loopback, which needs root: {stderr}"
    );
}

async fn serve(
    addr: SocketAddr,
    body: &'static str,
    tls: Option<tokio_rustls::TlsAcceptor>,
) -> (u16, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind(addr)
        .await
        .unwrap_or_else(|e| panic!("listening on {addr}: {e}"));
    let port = listener.local_addr().expect("local address").port();
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let tls = tls.clone();
            tokio::spawn(async move {
                match tls {
                    Some(acceptor) => {
                        if let Ok(stream) = acceptor.accept(stream).await {
                            answer(stream, body).await;
                        }
                    }
                    None => answer(stream, body).await,
                }
            });
        }
    });
    (port, task)
}

/// How many bytes [`EgressWorld::a_bulk`] answers: 100 MiB.
pub const BULK_BYTES: usize = 100 << 20;
/// The bulk server writes this much at a time.
const BULK_CHUNK: usize = 256 * 1024;

/// The rate a bulk request asks for with `?bytes_per_second=N` (a server behind a
/// link of that speed), or `None`: as fast as the machine goes.
fn bulk_pace(head: &str) -> Option<u64> {
    let target = head.split_whitespace().nth(1)?;
    let (_, query) = target.split_once('?')?;
    query
        .split('&')
        .find_map(|pair| pair.strip_prefix("bytes_per_second="))?
        .parse()
        .ok()
        .filter(|&rate| rate > 0)
}

async fn serve_bulk(listener: TcpListener) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            let Some(head) = read_head(&mut stream).await else {
                return;
            };
            let response = format!(
                "HTTP/1.1 200 OK\r\ncontent-length: {BULK_BYTES}\r\nconnection: close\r\n\r\n"
            );
            if stream.write_all(response.as_bytes()).await.is_err() {
                return;
            }
            let pace = bulk_pace(&head);
            let chunk = vec![0u8; BULK_CHUNK];
            let started = tokio::time::Instant::now();
            for sent in 1..=BULK_BYTES / chunk.len() {
                if stream.write_all(&chunk).await.is_err() {
                    return;
                }
                if let Some(bytes_per_second) = pace {
                    let due = (sent * BULK_CHUNK) as f64 / bytes_per_second as f64;
                    tokio::time::sleep_until(started + Duration::from_secs_f64(due)).await;
                }
            }
            let _ = stream.shutdown().await;
        });
    }
}

/// Reads a request head (up to 16 KiB); `None` if the client went away first.
async fn read_head<S: AsyncRead + Unpin>(stream: &mut S) -> Option<String> {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    Some(String::from_utf8_lossy(&head).into_owned())
}

/// Reads one request head and answers `body`, closing the connection.
async fn answer<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S, body: &str) {
    if read_head(&mut stream).await.is_none() {
        return;
    }
    let response = format!(
        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.shutdown().await;
}

/// What one `curl` in the sandbox saw.
#[derive(Debug)]
pub struct Fetched {
    /// curl's exit code (0: a response came; 7: no connection; 56: the proxy refused a
    /// tunnel).
    pub exit: i32,
    /// The response body.
    pub body: String,
    /// The HTTP status (0 when there was no response).
    pub status: u16,
    /// curl's error message.
    pub stderr: String,
}

/// Runs `curl` in the sandbox against `url` with extra `options`.
pub async fn fetch(b: &dyn SandboxBackend, id: &SandboxId, options: &str, url: &str) -> Fetched {
    let script = format!(
        "curl -sS -m 10 {options} -o body.out -w '%{{http_code}}' '{url}'; code=$?; echo; \
         echo \"exit=$code\"; cat body.out 2>/dev/null; rm -f body.out"
    );
    let out = b.run_shell(id, &script).await.expect("running curl");
    let stdout = out.stdout_str();
    let mut lines = stdout.splitn(3, '\n');
    let status = lines.next().unwrap_or("").trim().parse().unwrap_or(0);
    let exit = lines
        .next()
        .and_then(|l| l.trim().strip_prefix("exit="))
        .and_then(|c| c.parse().ok())
        .unwrap_or(-1);
    Fetched {
        exit,
        status,
        body: lines.next().unwrap_or("").to_owned(),
        stderr: out.stderr_str().into_owned(),
    }
}

/// The allowlist the scenarios use: host A by name and anything beneath `pkg.test`.
pub fn allowlist() -> Network {
    Network::Allowlist(vec!["a.test".to_owned(), "*.pkg.test".to_owned()])
}

async fn with<F, Fut>(b: &dyn SandboxBackend, spec: SandboxSpec, f: F)
where
    F: FnOnce(SandboxId) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let info = b.create(&spec).await.expect("create");
    let id = info.id.clone();
    let result = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(f(id))).await;
    b.destroy(&info.id).await.expect("destroy");
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

/// With the [`allowlist`], the sandbox reaches host A by name over HTTP and HTTPS, and
/// nothing else: not B by name or address, not B by a connection that ignores the
/// proxy, not the host's loopback through a name under the wildcard that resolves to
/// it (DNS rebinding) or directly (ADVERSARIAL 33: a host loopback service is denied).
/// Refusals are 403s naming the reason, and the
/// sandbox's metrics count them. Where the backend claims `network_update`, a new list
/// applies to the next connection.
pub async fn allowlist_is_enforced(b: &dyn SandboxBackend, base: SandboxSpec, world: &EgressWorld) {
    let spec = base.network(allowlist());
    with(b, spec, |id| async move {
        let b = &*b;
        let id = &id;
        b.write_string(id, &"ca.pem".parse().expect("path"), world.ca_pem())
            .await
            .expect("writing the CA");
        let a = format!("http://a.test:{}/", world.a_http);
        let seen = fetch(b, id, "", &a).await;
        assert_eq!(
            (seen.exit, seen.status),
            (0, 200),
            "A by name over HTTP: {seen:?}"
        );
        assert_eq!(seen.body, BODY_A);
        let seen = fetch(
            b,
            id,
            "--cacert ca.pem",
            &format!("https://a.test:{}/", world.a_https),
        )
        .await;
        assert_eq!(
            (seen.exit, seen.status),
            (0, 200),
            "A by name over HTTPS: {seen:?}"
        );
        assert_eq!(seen.body, BODY_A_TLS);

        let b_by_name = format!("http://b.test:{}/", world.b_http);
        let seen = fetch(b, id, "", &b_by_name).await;
        assert_eq!(seen.status, 403, "B by name is refused: {seen:?}");
        assert!(
            seen.body.contains("b.test"),
            "the 403 names the host: {seen:?}"
        );
        assert!(!seen.body.contains(BODY_B));
        let seen = fetch(b, id, "--proxytunnel", &b_by_name).await;
        assert_ne!(seen.exit, 0, "a tunnel to B is refused: {seen:?}");
        let b_by_ip = format!("http://{HOST_B}:{}/", world.b_http);
        let seen = fetch(b, id, "", &b_by_ip).await;
        assert_eq!(seen.status, 403, "B by address is refused: {seen:?}");
        let seen = fetch(b, id, "--noproxy '*'", &b_by_ip).await;
        assert_ne!(seen.exit, 0, "B by a direct connection fails: {seen:?}");
        assert!(!seen.body.contains(BODY_B), "{seen:?}");
        let seen = fetch(
            b,
            id,
            "--noproxy '*'",
            &format!("http://{HOST_A}:{}/", world.a_http),
        )
        .await;
        assert_ne!(seen.exit, 0, "even A fails without the proxy: {seen:?}");

        let rebound = format!("http://{REBOUND}:{}/", world.loopback);
        let seen = fetch(b, id, "", &rebound).await;
        assert_eq!(
            seen.status, 403,
            "a name rebound to loopback is refused: {seen:?}"
        );
        assert!(seen.body.contains("private"), "{seen:?}");
        let loopback = format!("http://127.0.0.1:{}/", world.loopback);
        let seen = fetch(b, id, "--noproxy '*'", &loopback).await;
        assert!(
            !seen.body.contains(BODY_LOOPBACK),
            "host loopback is out of reach: {seen:?}"
        );
        let seen = fetch(b, id, "--noproxy ''", &loopback).await;
        assert!(
            !seen.body.contains(BODY_LOOPBACK),
            "host loopback is out of reach: {seen:?}"
        );
        // The one port the sandbox may connect to leads to the proxy alone, not to the
        // same port on another host.
        let port = proxy_port(b, id).await;
        let b_on_proxy_port = world.b_also_on(port);
        let seen = fetch(b, id, "--noproxy '*'", &format!("http://{HOST_B}:{port}/")).await;
        b_on_proxy_port.abort();
        assert!(
            seen.exit != 0 && !seen.body.contains(BODY_B),
            "B on the proxy's port is out of reach: {seen:?}"
        );
        // No UDP either (TFTP is curl's UDP protocol).
        let before = world.udp_datagrams();
        let seen = fetch(
            b,
            id,
            "--noproxy '*' -m 3",
            &format!("tftp://{HOST_B}:{}/x", world.b_udp),
        )
        .await;
        assert_ne!(seen.exit, 0, "{seen:?}");
        assert_eq!(
            world.udp_datagrams(),
            before,
            "no datagram reaches B: {seen:?}"
        );

        if b.capabilities().metrics {
            let egress = b.metrics(id).await.expect("metrics").egress;
            let count = |host: &str| egress.iter().find(|c| c.host == host).cloned();
            let a = count("a.test").expect("a.test is counted");
            assert!(a.allowed >= 2 && a.denied == 0, "{egress:?}");
            let bc = count("b.test").expect("b.test is counted");
            assert!(bc.denied >= 2 && bc.allowed == 0, "{egress:?}");
            assert!(count(REBOUND).is_some_and(|c| c.denied >= 1), "{egress:?}");
        }

        if b.capabilities().network_update {
            let only_b = Network::Allowlist(vec!["b.test".to_owned()]);
            b.set_network(id, &only_b).await.expect("set_network");
            assert_eq!(b.inspect(id).await.expect("inspect").network, only_b);
            let seen = fetch(b, id, "", &b_by_name).await;
            assert_eq!((seen.status, seen.body.as_str()), (200, BODY_B), "{seen:?}");
            let seen = fetch(b, id, "", &a).await;
            assert_eq!(
                seen.status, 403,
                "A is refused once the list changes: {seen:?}"
            );
            let refused = b.set_network(id, &Network::Full).await;
            assert_eq!(
                refused.expect_err("only an allowlist").kind(),
                crate::ErrorKind::Unsupported
            );
        } else {
            let refused = b.set_network(id, &allowlist()).await;
            assert_eq!(
                refused.expect_err("not claimed").kind(),
                crate::ErrorKind::Unsupported
            );
        }
    })
    .await;
    eprintln!("egress[{}]: allowlist_is_enforced", b.name());
}

/// The port of the proxy the sandbox's `HTTP_PROXY` names.
async fn proxy_port(b: &dyn SandboxBackend, id: &SandboxId) -> u16 {
    let out = b
        .run_shell(id, "printf %s \"$HTTP_PROXY\"")
        .await
        .expect("reading HTTP_PROXY");
    let url = out.stdout_str();
    url.rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .unwrap_or_else(|| panic!("HTTP_PROXY is a proxy URL with a port: {url:?}"))
}

/// `Network::None` reaches neither host; `Network::Full` (where claimed) reaches both
/// by address (and B's UDP port: the check that no datagram arrives elsewhere can fail).
///
/// A backend whose full network keeps sandboxes from the host's own addresses
/// (ADVERSARIAL 38) cannot reach this world, whose hosts are addresses on the host's
/// loopback: it runs [`none_holds`] and checks its way out with a world of its own.
pub async fn none_and_full_hold(b: &dyn SandboxBackend, base: SandboxSpec, world: &EgressWorld) {
    let a = format!("http://{HOST_A}:{}/", world.a_http);
    let bb = format!("http://{HOST_B}:{}/", world.b_http);
    none_holds(b, base.clone(), world).await;
    if b.capabilities().network_full {
        with(b, base.network(Network::Full), |id| async move {
            let seen = fetch(b, &id, "--noproxy '*'", &a).await;
            assert_eq!(seen.body, BODY_A, "Network::Full reaches A: {seen:?}");
            let seen = fetch(b, &id, "--noproxy '*'", &bb).await;
            assert_eq!(seen.body, BODY_B, "Network::Full reaches B: {seen:?}");
            let before = world.udp_datagrams();
            let tftp = format!("tftp://{HOST_B}:{}/x", world.b_udp);
            let seen = fetch(b, &id, "--noproxy '*' -m 2", &tftp).await;
            assert!(
                world.udp_datagrams() > before,
                "Network::Full sends B a datagram: {seen:?}"
            );
        })
        .await;
    }
    eprintln!("egress[{}]: none_and_full_hold", b.name());
}

/// The first half of [`none_and_full_hold`]: `Network::None` reaches neither host, by
/// TCP or UDP.
pub async fn none_holds(b: &dyn SandboxBackend, base: SandboxSpec, world: &EgressWorld) {
    let a = format!("http://{HOST_A}:{}/", world.a_http);
    let bb = format!("http://{HOST_B}:{}/", world.b_http);
    with(b, base.network(Network::None), |id| {
        let (a, bb) = (a.clone(), bb.clone());
        async move {
            for url in [&a, &bb] {
                let seen = fetch(b, &id, "", url).await;
                assert_ne!(seen.exit, 0, "Network::None reaches nothing: {seen:?}");
            }
            let before = world.udp_datagrams();
            let tftp = format!("tftp://{HOST_B}:{}/x", world.b_udp);
            let seen = fetch(b, &id, "-m 2", &tftp).await;
            assert_eq!(world.udp_datagrams(), before, "no datagram: {seen:?}");
        }
    })
    .await;
}
