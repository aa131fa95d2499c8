//! ADVERSARIAL 38 on the Docker backend: a `Network::Full` sandbox is on a bridge of
//! its own that this host's rules guard. It reaches the world outside through the
//! engine's NAT (a network namespace this test makes, with no route back to any
//! container's address), and neither the host (a server on every host address, the
//! gateway of its own bridge and of the engine's default one included) nor a server
//! in another sandbox; a published port still answers the host. Destroy takes the
//! bridge and, with the last such sandbox, the rules.
//!
//! Needs root, `ip`, `nft`, `curl` and `python3` on the host, like the local backend's.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::Ipv4Addr;

use sandcell::testing::outside::{
    serve_on_host, serve_on_host_at, sh, OutsideWorld, OUTSIDE_BODY, OUTSIDE_PORT,
};
use sandcell::{Network, SandboxBackend, SandboxBackendExt, SandboxId, SandboxSpec};
use sandcell_docker::DockerBackend;

/// The tests add interfaces and count the rules: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn full(docker: &DockerBackend) -> (SandboxId, common::Guard) {
    let spec = SandboxSpec::new("default")
        .label(common::TEST_LABEL.0, "network")
        .network(Network::Full);
    let id = docker.create(&spec).await.unwrap().id;
    let guard = common::Guard::new(docker, &id);
    (id, guard)
}

/// The body busybox `nc` in sandbox `id` got for a GET of `http://{addr}:{port}/`, or
/// `None` when no response came. (Not `wget`: busybox-static's crashes here.)
async fn fetch(
    docker: &DockerBackend,
    id: &SandboxId,
    addr: Ipv4Addr,
    port: u16,
) -> Option<String> {
    let out = docker
        .run_shell(
            id,
            &format!("printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 {addr} {port}"),
        )
        .await
        .unwrap();
    let response = out.stdout_str();
    let (head, body) = response.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.").then(|| body.to_owned())
}

/// The sandbox's address on its own network, and that network's gateway (the host's
/// address on its bridge).
async fn addresses_of(docker: &DockerBackend, id: &SandboxId) -> (Ipv4Addr, Ipv4Addr) {
    let container = docker
        .docker()
        .inspect_container(id.as_str(), None)
        .await
        .unwrap();
    let networks = container.network_settings.unwrap().networks.unwrap();
    assert_eq!(networks.len(), 1, "one network: {networks:?}");
    let endpoint = networks.into_values().next().unwrap();
    let parse = |addr: Option<String>| addr.unwrap().parse().unwrap();
    (parse(endpoint.ip_address), parse(endpoint.gateway))
}

fn sandcell_bridges() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir("/sys/class/net")
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("scd"))
        .collect();
    names.sort();
    names
}

fn rules_present() -> bool {
    sh("nft list tables").contains("sandcell_docker")
}

/// Every IPv4 address of this host's, loopback aside.
fn host_addresses() -> Vec<Ipv4Addr> {
    sh("ip -4 -o addr show")
        .lines()
        .filter_map(|l| l.split_whitespace().nth(3))
        .filter_map(|a| a.split('/').next()?.parse().ok())
        .filter(|a: &Ipv4Addr| !a.is_loopback())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adversarial_38_a_full_sandbox_reaches_outside_but_not_the_host_nor_a_neighbour() {
    if !common::engine_available().await {
        return;
    }
    let _serial = SERIAL.lock().await;
    let docker = common::backend(true).await;
    assert!(docker.capabilities().network_full);
    let bridges_before = sandcell_bridges();
    let world = OutsideWorld::new();
    // On every host address: the bridges' gateways, docker0's, the test's own.
    let host_port = serve_on_host(Ipv4Addr::UNSPECIFIED, "host secret");
    let (a, _a_guard) = full(&docker).await;
    let (b, _b_guard) = full(&docker).await;
    assert_eq!(
        sandcell_bridges().len(),
        bridges_before.len() + 2,
        "a bridge each"
    );

    let seen = fetch(&docker, &a, world.outside_addr(), OUTSIDE_PORT).await;
    assert_eq!(seen.as_deref(), Some(OUTSIDE_BODY), "the way out");
    // The same server at its address on a network the host is on: the host's LAN.
    let seen = fetch(&docker, &a, world.neighbour_addr(), OUTSIDE_PORT).await;
    assert_eq!(
        seen, None,
        "a neighbour on the host's network reached from a"
    );

    // Nor a name server of the host's bound to every address, at any of them: not at
    // the host's other addresses, not at a's own bridge address, where only the
    // engine's resolver (Podman's, bound there) may answer a.
    let dns_port = serve_on_host_at(Ipv4Addr::UNSPECIFIED, 53, "host resolver secret");
    for addr in [world.own_addr(), addresses_of(&docker, &a).await.1] {
        let seen = fetch(&docker, &a, addr, dns_port).await;
        assert_eq!(seen, None, "the host's port 53 at {addr} reached from a");
    }

    let addresses = host_addresses();
    assert!(addresses.contains(&world.own_addr()), "{addresses:?}");
    for addr in addresses {
        let seen = fetch(&docker, &a, addr, host_port).await;
        assert_eq!(seen, None, "{addr}:{host_port} (the host's) reached from a");
    }

    // A server in b, on all of b's addresses; the host reaches it, a does not.
    docker
        .run_shell(&b, "mkdir -p www && echo neighbour secret > www/index.html")
        .await
        .unwrap();
    let mut server = docker
        .exec(
            &b,
            sandcell::ExecRequest::new(["httpd", "-f", "-p", "8081", "-h", "/workspace/www"]),
        )
        .await
        .unwrap();
    let b_addr = addresses_of(&docker, &b).await.0;
    let b_url = format!("http://{b_addr}:8081/");
    let mut up = false;
    for _ in 0..50 {
        let out = std::process::Command::new("curl")
            .args(["-s", "-m", "1", &b_url])
            .output()
            .unwrap();
        if String::from_utf8_lossy(&out.stdout).contains("neighbour secret") {
            up = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(up, "the server in b answers the host at {b_url}");
    assert_eq!(
        fetch(&docker, &a, b_addr, 8081).await,
        None,
        "a reached b's server"
    );
    let _ = server.kill().await;

    // Rules flushed from the host are put back before a reset restarts a sandbox.
    sh("nft delete table inet sandcell_docker");
    docker.reset(&a).await.unwrap();
    assert!(rules_present(), "the rules are back");
    let seen = fetch(&docker, &a, world.own_addr(), host_port).await;
    assert_eq!(seen, None, "the host reached from a after a reset");

    docker.destroy(&a).await.unwrap();
    docker.destroy(&b).await.unwrap();
    assert_eq!(
        sandcell_bridges(),
        bridges_before,
        "destroy removes the bridges"
    );
    if bridges_before.is_empty() {
        assert!(
            !rules_present(),
            "no rules with no sandbox:\n{}",
            sh("nft list ruleset")
        );
    }
}

/// A sandbox without a network gets none: no bridge, no interface but loopback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_without_a_network_gets_no_bridge() {
    if !common::engine_available().await {
        return;
    }
    let _serial = SERIAL.lock().await;
    let docker = common::backend(true).await;
    let before = sandcell_bridges();
    let spec = SandboxSpec::new("default").label(common::TEST_LABEL.0, "network");
    let id = docker.create(&spec).await.unwrap().id;
    let _guard = common::Guard::new(&docker, &id);
    assert_eq!(sandcell_bridges(), before);
    let out = docker
        .run_shell(&id, "ip -4 -o addr show 2>/dev/null || ifconfig")
        .await
        .unwrap();
    assert!(!out.stdout_str().contains("eth0"), "{out:?}");
    docker.destroy(&id).await.unwrap();
    assert_eq!(sandcell_bridges(), before);
}
