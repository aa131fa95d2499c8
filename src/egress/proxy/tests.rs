//! Tests of the egress proxy.

use super::counts::MAX_COUNTED_HOSTS;
use super::*;
use tokio::net::UnixStream;

async fn ask(proxy: &EgressProxy, request: &[u8]) -> String {
    let (mut sandbox, proxied) = tokio::io::duplex(64 * 1024);
    let serving = tokio::spawn({
        let proxy = proxy.clone();
        async move { proxy.serve(proxied).await }
    });
    sandbox.write_all(request).await.unwrap();
    // The sandbox sends nothing more (a tunnel's proxy would otherwise wait for it).
    sandbox.shutdown().await.unwrap();
    let mut answer = Vec::new();
    sandbox.read_to_end(&mut answer).await.unwrap();
    serving.await.unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

async fn upstream() -> (TcpListener, u16) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    (listener, port)
}

fn proxy(rules: &[&str], hosts: &[(&str, &str)]) -> EgressProxy {
    EgressProxy::with_hosts(
        Allowlist::parse(rules).unwrap(),
        hosts
            .iter()
            .map(|(n, a)| (n.to_string(), vec![a.parse().unwrap()]))
            .collect(),
    )
}

/// A proxy whose upstreams may be on `127.0.0.1`, where the tests' listen.
fn proxy_to_loopback(rules: &[&str], hosts: &[(&str, &str)]) -> EgressProxy {
    let mut proxy = proxy(rules, hosts);
    Arc::get_mut(&mut proxy.inner).unwrap().loopback_is_public = true;
    proxy
}

#[tokio::test]
async fn a_denied_name_or_address_gets_403_with_the_reason() {
    let proxy = proxy(&["a.test:443"], &[]);
    let answer = ask(&proxy, b"CONNECT b.test:443 HTTP/1.1\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{answer}");
    assert!(
        answer.contains("x-sandcell-egress-denied: no rule"),
        "{answer}"
    );
    assert!(answer.contains("b.test:443"), "{answer}");
    // A documentation address no host here is directly on (192.0.2.0/24 can be).
    let public = "203.0.113.9";
    assert!(!crate::raw::egress::on_host_network(
        public.parse().unwrap()
    ));
    let get = format!("GET http://{public}/ HTTP/1.1\r\nhost: x\r\n\r\n");
    let answer = ask(&proxy, get.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    assert!(
        answer.contains(&format!("address {public} port 80")),
        "{answer}"
    );
    let answer = ask(&proxy, b"CONNECT a.test:80 HTTP/1.1\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    let counts = proxy.counts();
    assert_eq!(counts.len(), 3);
    assert!(counts.iter().all(|c| c.denied == 1 && c.allowed == 0));
}

#[tokio::test]
async fn a_name_pointed_at_a_private_address_is_refused() {
    let (_listener, port) = upstream().await;
    let proxy = proxy(&["*.pkg.test"], &[("evil.pkg.test", "127.0.0.1")]);
    let request = format!("CONNECT evil.pkg.test:{port} HTTP/1.1\r\n\r\n");
    let answer = ask(&proxy, request.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    assert!(
        answer.contains("resolves to 127.0.0.1: an address of this host's"),
        "{answer}"
    );
    // No address rule can let it through: one naming it is refused.
    assert!(Allowlist::parse([format!("127.0.0.1:{port}")]).is_err());
}

/// ADVERSARIAL 38: an address that reaches this host is refused as a target,
/// whatever the rules; a private one needs an address rule.
#[tokio::test]
async fn adversarial_38_this_hosts_addresses_are_refused() {
    let (_listener, port) = upstream().await;
    let proxy = proxy(&["a.test", "10.0.0.0/8"], &[]);
    for target in ["127.0.0.1", "[::1]", "169.254.169.254", "0.0.0.0"] {
        let request = format!("CONNECT {target}:{port} HTTP/1.1\r\n\r\n");
        let answer = ask(&proxy, request.as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 403"), "{target}: {answer}");
        assert!(answer.contains("reaches this host"), "{target}: {answer}");
    }
}

#[tokio::test]
async fn malformed_requests_get_400_and_nothing_is_opened() {
    let proxy = proxy(&["a.test"], &[]);
    for request in [
        &b"GET / HTTP/1.1\r\nhost: a.test\r\n\r\n"[..],
        b"GET https://a.test/ HTTP/1.1\r\n\r\n",
        b"CONNECT a.test HTTP/1.1\r\n\r\n",
        b"CONNECT a.test:0 HTTP/1.1\r\n\r\n",
        b"CONNECT a.test:1 HTTP/2\r\n\r\n",
        b"GET http://u:p@a.test/ HTTP/1.1\r\n\r\n",
        b"CONNECT a..test:80 HTTP/1.1\r\n\r\n",
        b"no head at all",
        b"\xff\xfe\r\n\r\n",
    ] {
        let answer = ask(&proxy, request).await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{request:?}: {answer}");
    }
    let mut huge = b"GET http://a.test/ HTTP/1.1\r\n".to_vec();
    huge.extend(std::iter::repeat_n(b'x', MAX_HEAD + 10));
    assert!(ask(&proxy, &huge).await.starts_with("HTTP/1.1 400"));
    assert!(proxy.counts().is_empty());
}

#[tokio::test]
async fn an_allowed_request_is_forwarded_in_origin_form() {
    let (listener, port) = upstream().await;
    let server = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let (head, _) = read_head(&mut s).await.unwrap().unwrap();
        s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nhi")
            .await
            .unwrap();
        s.shutdown().await.unwrap();
        String::from_utf8(head).unwrap()
    });
    let proxy = proxy_to_loopback(&[&format!("up.test:{port}")], &[("up.test", "127.0.0.1")]);
    let request = format!(
        "GET http://up.test:{port}/p?q=1 HTTP/1.1\r\nhost: up.test\r\nproxy-connection: keep-alive\r\n\r\n"
    );
    let answer = ask(&proxy, request.as_bytes()).await;
    assert!(answer.ends_with("hi"), "{answer}");
    let head = server.await.unwrap();
    assert!(head.starts_with("GET /p?q=1 HTTP/1.1\r\n"), "{head}");
    assert!(!head.contains("proxy-connection"), "{head}");
    assert_eq!(proxy.counts()[0].allowed, 1);
}

#[tokio::test]
async fn a_tunnel_fronted_to_a_denied_name_is_closed() {
    let (listener, port) = upstream().await;
    let received = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut got = Vec::new();
        let _ = s.read_to_end(&mut got).await;
        got
    });
    let proxy = proxy_to_loopback(&[&format!("a.test:{port}")], &[("a.test", "127.0.0.1")]);
    let mut request = format!("CONNECT a.test:{port} HTTP/1.1\r\n\r\n").into_bytes();
    request.extend(sni::tests::hello_for(Some("b.test")));
    let answer = ask(&proxy, &request).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        received.await.unwrap().is_empty(),
        "nothing reaches upstream"
    );
    let b = proxy
        .counts()
        .into_iter()
        .find(|c| c.host == "b.test")
        .unwrap();
    assert_eq!(b.denied, 1);
}

/// The proxy serving a socket (as its listeners do), which splices.
fn serve_unix(proxy: &EgressProxy) -> (UnixStream, tokio::task::JoinHandle<()>) {
    let (sandbox, proxied) = UnixStream::pair().unwrap();
    let proxy = proxy.clone();
    (
        sandbox,
        tokio::spawn(async move { proxy.serve_socket(proxied).await }),
    )
}

#[tokio::test]
async fn a_spliced_tunnel_fronted_to_a_denied_name_is_closed() {
    let (listener, port) = upstream().await;
    let received = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut got = Vec::new();
        let _ = s.read_to_end(&mut got).await;
        got
    });
    let rule = format!("a.test:{port}");
    let proxy = proxy_to_loopback(&[&rule], &[("a.test", "127.0.0.1")]);
    let (mut sandbox, serving) = serve_unix(&proxy);
    let mut request = format!("CONNECT a.test:{port} HTTP/1.1\r\n\r\n").into_bytes();
    request.extend(sni::tests::hello_for(Some("b.test")));
    sandbox.write_all(&request).await.unwrap();
    let mut answer = Vec::new();
    sandbox.read_to_end(&mut answer).await.unwrap();
    serving.await.unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        received.await.unwrap().is_empty(),
        "nothing reaches upstream"
    );
    assert_eq!(proxy.counts().iter().map(|c| c.denied).sum::<u64>(), 1);
}

/// A server that speaks first (SSH, SMTP) through a tunnel opened to a name: its
/// banner must arrive while the proxy still waits for the client's first bytes.
#[tokio::test]
async fn a_spliced_tunnel_carries_a_server_that_speaks_first() {
    let (listener, port) = upstream().await;
    let server = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        s.write_all(b"SSH-2.0-test\r\n").await.unwrap();
        let mut got = Vec::new();
        s.read_to_end(&mut got).await.unwrap();
        s.write_all(&got).await.unwrap();
    });
    let rule = format!("a.test:{port}");
    let proxy = proxy_to_loopback(&[&rule], &[("a.test", "127.0.0.1")]);
    let (mut sandbox, serving) = serve_unix(&proxy);
    sandbox
        .write_all(format!("CONNECT a.test:{port} HTTP/1.1\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let established = b"HTTP/1.1 200 Connection established\r\n\r\n";
    let banner = b"SSH-2.0-test\r\n";
    let mut first = vec![0u8; established.len() + banner.len()];
    sandbox.read_exact(&mut first).await.unwrap();
    assert_eq!(&first[..established.len()], established);
    assert_eq!(&first[established.len()..], banner);
    sandbox.write_all(b"SSH-2.0-client\r\n").await.unwrap();
    sandbox.shutdown().await.unwrap();
    let mut echoed = Vec::new();
    sandbox.read_to_end(&mut echoed).await.unwrap();
    assert_eq!(echoed, b"SSH-2.0-client\r\n");
    server.await.unwrap();
    serving.await.unwrap();
}

#[tokio::test]
async fn counts_stay_bounded_whatever_the_sandbox_asks() {
    let proxy = proxy(&["a.test"], &[]);
    for i in 0..(MAX_COUNTED_HOSTS + 50) {
        proxy.count(&format!("h{i}.test"), false);
    }
    let counts = proxy.counts();
    assert_eq!(counts.len(), MAX_COUNTED_HOSTS + 1);
    let other = counts.iter().find(|c| c.host == OTHER_HOSTS).unwrap();
    assert_eq!(other.denied, 50);
}
