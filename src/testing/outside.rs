//! A world outside the host for network tests (needs root, `ip`, `curl`, `python3`):
//! a network namespace joined to the host by a veth, its server one hop beyond the
//! host's own network on it, reachable only through the host's routing and with no route back to any sandbox's address, so a sandbox that
//! reaches it proves its traffic was translated to the host's; and an address of the
//! host's own that is not loopback, on an interface of its own.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// The outside server's port.
pub const OUTSIDE_PORT: u16 = 8080;
/// What the outside server answers.
pub const OUTSIDE_BODY: &str = "hello from outside";

/// What a test adds to the host, removed when dropped: an interface (a veth; kernels
/// without the dummy driver exist) holding an address of the host's, and the outside
/// namespace with its veth and an HTTP server answering [`OUTSIDE_BODY`].
#[derive(Debug)]
pub struct OutsideWorld {
    tag: u32,
    server: std::process::Child,
}

/// Runs `script` with `sh`; panics with its error output when it fails.
pub fn sh(script: &str) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg(script)
        .output()
        .expect("sh runs");
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A server on this host answering every connection with `body`, on `addr` and a free
/// port; its port.
pub fn serve_on_host(addr: Ipv4Addr, body: &'static str) -> u16 {
    serve_on_host_at(addr, 0, body)
}

/// A server on this host answering every connection with `body`, on `addr` and `port`
/// (0: a free one); its port.
pub fn serve_on_host_at(addr: Ipv4Addr, port: u16, body: &'static str) -> u16 {
    let listener = TcpListener::bind(SocketAddr::from((addr, port))).expect("a free port");
    let port = listener.local_addr().expect("a bound listener").port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut buf = [0; 1024];
            let _ = stream.read(&mut buf);
            let _ = write!(
                stream,
                "HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
        }
    });
    port
}

impl OutsideWorld {
    /// Makes the interfaces, the namespace and its server; panics if it does not come up.
    pub fn new() -> OutsideWorld {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let tag = (std::process::id() % 200) + NEXT.fetch_add(1, Ordering::Relaxed);
        let tag = tag % 250 + 1;
        sh(&format!(
            "ip link del sctd{tag} 2>/dev/null; ip link del sctv{tag} 2>/dev/null; \
             ip netns del sct{tag} 2>/dev/null; \
             ip link add sctd{tag} type veth peer name sctp{tag} && ip link set sctp{tag} up && ip addr add {own}/32 dev sctd{tag} && \
             ip link set sctd{tag} up && \
             ip netns add sct{tag} && \
             ip link add sctv{tag} type veth peer name eth0 netns sct{tag} && \
             ip addr add {gw}/30 dev sctv{tag} && ip link set sctv{tag} up && \
             ip -n sct{tag} addr add {peer}/30 dev eth0 && \
             ip -n sct{tag} link set eth0 up && ip -n sct{tag} link set lo up && \
             ip -n sct{tag} addr add {outside}/32 dev lo && \
             ip route add {outside}/32 via {peer}",
            own = Self::own_addr_of(tag),
            gw = Self::gateway_of(tag),
            peer = Self::peer_of(tag),
            outside = Self::outside_of(tag),
        ));
        // No default route in the outside namespace: it can answer the host's own
        // address on the veth, never a sandbox's.
        let script = format!(
            "import http.server\n\
             class H(http.server.BaseHTTPRequestHandler):\n\
             \x20   def do_GET(self):\n\
             \x20       self.send_response(200); self.end_headers(); self.wfile.write(b'{OUTSIDE_BODY}')\n\
             http.server.HTTPServer(('0.0.0.0', {OUTSIDE_PORT}), H).serve_forever()\n"
        );
        let server = Command::new("ip")
            .args([
                "netns",
                "exec",
                &format!("sct{tag}"),
                "python3",
                "-c",
                &script,
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("ip netns exec starts");
        // Dropped (the server waited for, the interfaces removed) should it not answer.
        let world = OutsideWorld { tag, server };
        let url = world.outside_url();
        for _ in 0..100 {
            let out = Command::new("curl")
                .args(["-s", "-m", "1", &url])
                .output()
                .expect("curl runs");
            if out.stdout == OUTSIDE_BODY.as_bytes() {
                return world;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        panic!("the outside server did not come up");
    }

    fn own_addr_of(tag: u32) -> Ipv4Addr {
        Ipv4Addr::new(198, 19, tag as u8, 1)
    }
    fn gateway_of(tag: u32) -> Ipv4Addr {
        Ipv4Addr::new(198, 18, tag as u8, 1)
    }
    /// The outside namespace's end of the veth, on a network the host is on.
    fn peer_of(tag: u32) -> Ipv4Addr {
        Ipv4Addr::new(198, 18, tag as u8, 2)
    }
    /// The server's address, one hop beyond the host (as the world is), and neither
    /// private nor reserved.
    fn outside_of(tag: u32) -> Ipv4Addr {
        Ipv4Addr::new(203, 0, 113, tag as u8)
    }

    /// The host's own address on the test's interface.
    pub fn own_addr(&self) -> Ipv4Addr {
        Self::own_addr_of(self.tag)
    }

    /// The outside server's address.
    pub fn outside_addr(&self) -> Ipv4Addr {
        Self::outside_of(self.tag)
    }

    /// The outside namespace's address on the host's network with it: a neighbour
    /// of the host's, where the server answers too.
    pub fn neighbour_addr(&self) -> Ipv4Addr {
        Self::peer_of(self.tag)
    }

    /// The outside server's URL.
    pub fn outside_url(&self) -> String {
        format!("http://{}:{OUTSIDE_PORT}/", self.outside_addr())
    }

    /// The outside namespace's name, for `ip netns exec`.
    pub fn namespace(&self) -> String {
        format!("sct{}", self.tag)
    }
}

impl Default for OutsideWorld {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for OutsideWorld {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
        let tag = self.tag;
        let _ = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "ip link del sctd{tag}; ip link del sctv{tag}; ip netns del sct{tag}"
            ))
            .output();
    }
}
