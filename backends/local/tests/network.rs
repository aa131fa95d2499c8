//! `Network::Full` at `Isolation::Namespaces` is a network of the sandbox's own
//! (ADVERSARIAL 38): it reaches neither the host (its loopback, its other addresses)
//! nor another sandbox, and still reaches the world outside through NAT. The "world"
//! is a network namespace this test makes, joined to the host by a veth and reachable
//! only by the host's routing; it has no route back to the sandboxes' addresses, so
//! reaching it proves their traffic is translated to the host's.
//!
//! Needs root (the veth, the host's rules), `ip`, `nft`, `curl` and `python3`.

// Test helpers outside #[test] fns report failures by panicking too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::Ipv4Addr;
use std::process::Command;

use sandcell::testing::egress::{self, EgressWorld};
use sandcell::testing::outside::{
    serve_on_host, sh, OutsideWorld as Host, OUTSIDE_BODY, OUTSIDE_PORT,
};
use sandcell::{ErrorKind, Network, SandboxBackend, SandboxBackendExt, SandboxId, SandboxSpec};
use sandcell_local::{Isolation, LocalBackend};

/// The tests add and remove interfaces the leak checks count: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn backend(root: &std::path::Path) -> Option<LocalBackend> {
    match LocalBackend::builder()
        .root(root)
        .isolation(Isolation::Namespaces)
        .build()
    {
        Ok(b) if b.capabilities().network_full => Some(b),
        Ok(_) => {
            sandcell::testing::require_or_skip(
                "NAMESPACES",
                "Network::Full at Isolation::Namespaces",
                Err("it needs root".to_owned()),
            );
            None
        }
        Err(e) => {
            assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
            sandcell::testing::require_or_skip(
                "NAMESPACES",
                "Isolation::Namespaces",
                Err(e.to_string()),
            );
            None
        }
    }
}

fn sandbox_links() -> Vec<String> {
    std::fs::read_dir("/sys/class/net")
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("scn"))
        .collect()
}

/// Whether the host's ruleset has the sandboxes' table or a rule for their veths.
fn rules_present() -> bool {
    // The table by name: the Docker backend's own table names `scn*` in a rule too.
    let nft = sh("nft list tables");
    let iptables = Command::new("iptables")
        .args(["-S"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    nft.contains("sandcell_net") || iptables.contains("scn")
}

async fn full(b: &LocalBackend) -> SandboxId {
    b.create(&SandboxSpec::default().network(Network::Full))
        .await
        .unwrap()
        .id
}

async fn fetch(b: &LocalBackend, id: &SandboxId, url: &str) -> egress::Fetched {
    egress::fetch(b, id, "--noproxy '*' -m 3", url).await
}

/// ADVERSARIAL 38: neither a server on the host's `127.0.0.1` nor one on an address of
/// the host's that is not loopback answers a sandbox with the full network.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adversarial_38_full_network_does_not_reach_the_host() {
    let _serial = SERIAL.lock().await;
    let root = tempfile::tempdir().unwrap();
    let Some(b) = backend(root.path()) else {
        return;
    };
    let host = Host::new();
    let loopback = serve_on_host(Ipv4Addr::LOCALHOST, "host loopback secret");
    let own = serve_on_host(host.own_addr(), "host address secret");
    let id = full(&b).await;
    for url in [
        format!("http://127.0.0.1:{loopback}/"),
        format!("http://{}:{own}/", host.own_addr()),
        // A neighbour on a network the host is on (its LAN), answering "outside".
        format!("http://{}:{OUTSIDE_PORT}/", host.neighbour_addr()),
    ] {
        let seen = fetch(&b, &id, &url).await;
        assert!(
            seen.exit != 0 && !seen.body.contains("secret"),
            "{url} reached from the sandbox: {seen:?}"
        );
    }
    b.destroy(&id).await.unwrap();
}

/// ADVERSARIAL 38: a server one sandbox runs on its `127.0.0.1` or its own address does
/// not answer another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adversarial_38_full_sandboxes_do_not_reach_each_other() {
    let _serial = SERIAL.lock().await;
    let root = tempfile::tempdir().unwrap();
    let Some(b) = backend(root.path()) else {
        return;
    };
    let _host = Host::new();
    let a = full(&b).await;
    let other = full(&b).await;
    let out = b
        .run_shell(
            &a,
            "echo 'sandbox a secret' > index.html; \
             setsid python3 -m http.server 8000 --bind 0.0.0.0 >/dev/null 2>&1 < /dev/null & \
             python3 -c \"import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); \
             s.connect(('198.18.0.1', 9)); print(s.getsockname()[0])\"",
        )
        .await
        .unwrap();
    let own = out.stdout_str().trim().to_owned();
    let own: Ipv4Addr = own.parse().unwrap_or_else(|_| panic!("{out:?}"));
    assert!(!own.is_loopback(), "{own}");
    let mut up = false;
    for _ in 0..100 {
        if fetch(&b, &a, "http://127.0.0.1:8000/index.html")
            .await
            .body
            .contains("secret")
        {
            up = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(up, "the server in sandbox a did not come up");
    for url in [
        "http://127.0.0.1:8000/index.html".to_owned(),
        format!("http://{own}:8000/index.html"),
    ] {
        let seen = fetch(&b, &other, &url).await;
        assert!(
            seen.exit != 0 && !seen.body.contains("secret"),
            "{url} in sandbox a reached from another: {seen:?}"
        );
    }
    b.destroy(&a).await.unwrap();
    b.destroy(&other).await.unwrap();
}

/// ADVERSARIAL 38: the way out still works, through NAT (the outside namespace has no
/// route to a sandbox's address), and the sandbox's interfaces are its own (loopback
/// and its veth, none of the host's); after a reset too. Destroy leaves no veth and,
/// with the last sandbox, no rules.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adversarial_38_full_network_reaches_outside_through_nat_and_leaves_nothing() {
    let _serial = SERIAL.lock().await;
    let root = tempfile::tempdir().unwrap();
    let Some(b) = backend(root.path()) else {
        return;
    };
    let host = Host::new();
    let before = sandbox_links();
    let id = full(&b).await;
    for round in ["created", "reset"] {
        let seen = fetch(&b, &id, &host.outside_url()).await;
        assert_eq!(seen.body, OUTSIDE_BODY, "{round}: {seen:?}");
        let out = b
            .run_shell(
                &id,
                "python3 -c \"import socket; print(sorted(n for _, n in socket.if_nameindex()))\"",
            )
            .await
            .unwrap();
        assert_eq!(
            out.stdout_str().trim(),
            "['eth0', 'lo']",
            "{round}: {out:?}"
        );
        assert_eq!(sandbox_links().len(), before.len() + 1, "{round}: one veth");
        b.reset(&id).await.unwrap();
    }
    b.destroy(&id).await.unwrap();
    assert_eq!(
        sandbox_links(),
        before,
        "destroy removes the sandbox's veth"
    );
    if before.is_empty() {
        assert!(
            !rules_present(),
            "no rules with no sandbox:\n{}",
            sh("nft list ruleset")
        );
    }
}

/// ADVERSARIAL 38: an allowlist naming loopback, link-local or unspecified addresses
/// is refused when the rule is accepted (create, `set_network`), and one naming a
/// private range unless the operator allows them; one naming an address
/// of the host's own (host B's, on its loopback interface) is accepted, and the proxy
/// refuses to relay to it, at each level that enforces an allowlist.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adversarial_38_allowlists_refuse_the_host() {
    let world = EgressWorld::start().await;
    for isolation in [Isolation::Namespaces, Isolation::Landlock] {
        let root = tempfile::tempdir().unwrap();
        let mut builder = LocalBackend::builder()
            .root(root.path())
            .isolation(isolation);
        for (name, addrs) in EgressWorld::hosts() {
            builder = builder.egress_host(name, addrs);
        }
        let Ok(b) = builder.build() else { continue };
        if !b.capabilities().network_allowlist {
            continue;
        }
        for rule in [
            "127.0.0.1",
            "0.0.0.0/0",
            "169.254.169.254:80",
            "[::1]:22",
            "fe80::/10",
        ] {
            let spec = SandboxSpec::default().network(Network::Allowlist(vec![rule.into()]));
            let err = b.create(&spec).await.unwrap_err();
            assert_eq!(
                err.kind(),
                ErrorKind::InvalidInput,
                "{isolation:?} {rule}: {err}"
            );
        }
        // Private ranges only where the operator allows them.
        for rule in ["10.1.0.0/16", "192.168.1.1:80", "172.0.0.0/8", "fd00::/8"] {
            let spec = SandboxSpec::default().network(Network::Allowlist(vec![rule.into()]));
            let err = b.create(&spec).await.unwrap_err();
            assert_eq!(
                err.kind(),
                ErrorKind::InvalidInput,
                "{isolation:?} {rule}: {err}"
            );
            assert!(err.to_string().contains("private range"), "{err}");
        }
        let operator_root = tempfile::tempdir().unwrap();
        let operator = LocalBackend::builder()
            .root(operator_root.path())
            .isolation(isolation)
            .egress_private_ranges(true)
            .build()
            .unwrap();
        let private =
            SandboxSpec::default().network(Network::Allowlist(vec!["10.1.0.0/16".into()]));
        let info = operator.create(&private).await.unwrap();
        operator.destroy(&info.id).await.unwrap();
        let own = egress::HOST_B.to_string();
        let info = b
            .create(&SandboxSpec::default().network(Network::Allowlist(vec![own.clone()])))
            .await
            .unwrap();
        let err = b
            .set_network(&info.id, &Network::Allowlist(vec!["127.0.0.1".into()]))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{isolation:?}: {err}");
        let seen =
            egress::fetch(&b, &info.id, "", &format!("http://{own}:{}/", world.b_http)).await;
        assert_eq!(
            seen.status, 403,
            "{isolation:?}: the host's own address: {seen:?}"
        );
        assert!(seen.body.contains("reaches this host"), "{seen:?}");
        assert!(!seen.body.contains(egress::BODY_B), "{seen:?}");
        b.destroy(&info.id).await.unwrap();
    }
}

/// ADVERSARIAL 47: a sandbox whose namespaces ended on their own (it killed the
/// command bubblewrap waits on) loses its veth to the kernel; when it is destroyed
/// later, the veth of another sandbox that got the same name meanwhile stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adversarial_47_destroy_removes_only_its_own_veth() {
    let _serial = SERIAL.lock().await;
    let root = tempfile::tempdir().unwrap();
    let Some(b) = backend(root.path()) else {
        return;
    };
    let host = Host::new();
    let before = sandbox_links();
    let ended = full(&b).await;
    assert_eq!(sandbox_links().len(), before.len() + 1);
    // pid 2 is the `sleep infinity` bubblewrap's init waits on: with it, the
    // namespaces go, and the kernel deletes their veth.
    let _ = b.run_shell(&ended, "kill -KILL 2").await;
    let mut gone = false;
    for _ in 0..100 {
        if sandbox_links().len() == before.len() {
            gone = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(gone, "the ended sandbox's veth is gone");
    let others = sandbox_links();
    let other = full(&b).await;
    let theirs: Vec<String> = sandbox_links()
        .into_iter()
        .filter(|link| !others.contains(link))
        .collect();
    assert_eq!(theirs.len(), 1, "{theirs:?}");
    assert_eq!(
        fetch(&b, &other, &host.outside_url()).await.body,
        OUTSIDE_BODY
    );
    let _ = b.destroy(&ended).await;
    assert!(
        sandbox_links().contains(&theirs[0]),
        "destroying the ended sandbox removed another's veth, {}",
        theirs[0]
    );
    let seen = fetch(&b, &other, &host.outside_url()).await;
    assert_eq!(seen.body, OUTSIDE_BODY, "{seen:?}");
    b.destroy(&other).await.unwrap();
}

/// The host-wide lock of sandbox networking is root's alone: a local user who could
/// open it could hold it, and every full-network create, reset and destroy would wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_network_lock_is_roots_alone() {
    use std::os::unix::fs::PermissionsExt;
    let _serial = SERIAL.lock().await;
    let root = tempfile::tempdir().unwrap();
    let Some(b) = backend(root.path()) else {
        return;
    };
    let _host = Host::new();
    let id = full(&b).await;
    let mode = std::fs::metadata("/run/sandcell-network.lock")
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o077, 0, "mode {mode:o}");
    b.destroy(&id).await.unwrap();
}

/// Sends one UDP datagram from each of `argv[1]` sockets of its own (a flow each in
/// the host's connection tracking) to `argv[2]`:9999, then says it is done.
const UDP_FLOWS: &str = r#"
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.sendto(b"x", (sys.argv[2], 9999))
    socks.append(s)
print("sent")
"#;

/// Says when it listens, then counts the distinct senders of the datagrams it gets on
/// `argv[1]`:9999 until none has come for two seconds, and prints the count.
const UDP_COUNTER: &str = r#"
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
s.bind((sys.argv[1], 9999))
print("listening", flush=True)
s.settimeout(15)
seen = set()
try:
    while True:
        seen.add(s.recvfrom(16)[1])
        s.settimeout(2)
except socket.timeout:
    pass
print(len(seen), flush=True)
"#;

/// One sandbox holds at most 2048 flows in the host's connection tracking, which the
/// host and every sandbox share: 3000 datagrams from 3000 sockets reach the world as
/// 2048 flows, and the sandbox's next connection waits for its flows to end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_holds_a_bounded_share_of_connection_tracking() {
    let _serial = SERIAL.lock().await;
    let root = tempfile::tempdir().unwrap();
    let Some(b) = backend(root.path()) else {
        return;
    };
    let host = Host::new();
    let outside = host.outside_addr().to_string();
    let mut counter = Command::new("ip")
        .args(["netns", "exec", &host.namespace(), "python3", "-c"])
        .args([UDP_COUNTER, &outside])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Nothing is sent before it listens (on a loaded host its start can take seconds).
    let mut counts = std::io::BufReader::new(counter.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut counts, &mut line).unwrap();
    assert_eq!(line, "listening\n");
    let id = full(&b).await;
    let sent = b
        .exec(
            &id,
            sandcell::ExecRequest::new(["python3", "-c", UDP_FLOWS, "3000", &outside]),
        )
        .await
        .unwrap()
        .collect(1 << 16)
        .await
        .unwrap();
    let mut counted = String::new();
    std::io::Read::read_to_string(&mut counts, &mut counted).unwrap();
    counter.wait().unwrap();
    b.destroy(&id).await.unwrap();
    assert_eq!(sent.stdout_str().trim(), "sent", "{sent:?}");
    let flows: usize = counted.trim().parse().unwrap();
    assert!(
        (1900..=2048).contains(&flows),
        "{flows} of 3000 flows reached the world"
    );
}

/// ADVERSARIAL 38 for allowlists: an address rule for the host's neighbour (on a
/// network the host is directly on, whatever its range) is refused when the sandbox is
/// made, and a name pinned to it is refused by the proxy, while a name pinned to an
/// address beyond the host still answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adversarial_38_an_allowlist_reaches_no_neighbour_of_the_host() {
    let _serial = SERIAL.lock().await;
    let root = tempfile::tempdir().unwrap();
    let host = Host::new();
    let Some(b) = LocalBackend::builder()
        .root(root.path())
        .isolation(Isolation::Namespaces)
        .egress_host("neighbour.test", vec![host.neighbour_addr().into()])
        .egress_host("outside.test", vec![host.outside_addr().into()])
        .build()
        .ok()
        .filter(|b| b.capabilities().network_allowlist)
    else {
        backend(root.path());
        return;
    };
    let neighbour = host.neighbour_addr().to_string();
    let refused = b
        .create(&SandboxSpec::default().network(Network::Allowlist(vec![neighbour.clone()])))
        .await
        .unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::InvalidInput, "{refused}");
    let names = vec!["neighbour.test".to_owned(), "outside.test".to_owned()];
    let id = b
        .create(&SandboxSpec::default().network(Network::Allowlist(names)))
        .await
        .unwrap()
        .id;
    let outside_url = format!("http://outside.test:{OUTSIDE_PORT}/");
    let near_url = format!("http://neighbour.test:{OUTSIDE_PORT}/");
    let outside = egress::fetch(&b, &id, "", &outside_url).await;
    let near = egress::fetch(&b, &id, "", &near_url).await;
    assert_eq!(outside.body.trim(), OUTSIDE_BODY, "{outside:?}");
    assert!(
        near.status != 200 && !near.body.contains(OUTSIDE_BODY),
        "the proxy relayed to the host's neighbour: {near:?}"
    );

    // The same network routed from a table of its own (policy routing, a VPN client):
    // the main table no longer shows it, the interface's address still does.
    let link = format!("sctv{}", &host.namespace()[3..]);
    let network = Ipv4Addr::from(u32::from(host.neighbour_addr()) & !3);
    sh(&format!(
        "ip route del {network}/30 dev {link} && ip route add {network}/30 dev {link} table 4242 && \
         ip rule add to {network}/30 lookup 4242"
    ));
    // Past the two seconds the interfaces' networks are reused for.
    tokio::time::sleep(std::time::Duration::from_millis(2100)).await;
    let again = b
        .create(&SandboxSpec::default().network(Network::Allowlist(vec![neighbour])))
        .await;
    let near = egress::fetch(&b, &id, "", &near_url).await;
    sh(&format!("ip rule del to {network}/30 lookup 4242"));
    b.destroy(&id).await.unwrap();
    if let Ok(made) = &again {
        b.destroy(&made.id).await.unwrap();
    }
    assert_eq!(again.unwrap_err().kind(), ErrorKind::InvalidInput);
    assert!(
        near.status != 200 && !near.body.contains(OUTSIDE_BODY),
        "the proxy relayed to a neighbour routed from another table: {near:?}"
    );
}
