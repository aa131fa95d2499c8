//! Network policies through sandcell-server: a remote client's allowlist is enforced by
//! the served local backend, `set_network` crosses the wire, and `inspect` reports the
//! list in force; the E2B provider's `allowOut` and network updates reach it too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use sandcell::testing::egress::{self, EgressWorld};
use sandcell::{ErrorKind, Network, SandboxBackend, SandboxSpec};
use sandcell_local::LocalBackend;
use sandcell_server::ServerConfig;

/// A server over a local backend at its default isolation that resolves the egress
/// scenarios' names, or `None` (skipped) where that level cannot enforce an allowlist.
async fn serve_egress() -> Option<common::TestServer> {
    let root = tempfile::tempdir().unwrap();
    let mut builder = LocalBackend::builder().root(root.path());
    for (name, addrs) in EgressWorld::hosts() {
        builder = builder.egress_host(name, addrs);
    }
    let local = builder.build().unwrap();
    if !local.capabilities().network_allowlist {
        sandcell::testing::require_or_skip(
            "LANDLOCK_NETWORK",
            "an allowlist at the local backend's default isolation",
            Err("no Landlock ABI 4, or no writable cgroup v2".to_owned()),
        );
        return None;
    }
    Some(common::serve_built(local, root, ServerConfig::new(common::TOKEN)).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_served_allowlist_is_enforced_and_changes_over_the_wire() {
    let Some(server) = serve_egress().await else {
        return;
    };
    let remote = common::client(&server.url).await;
    let caps = remote.capabilities();
    assert!(caps.network_allowlist && caps.network_update, "{caps:?}");
    let world = EgressWorld::start().await;
    egress::allowlist_is_enforced(&remote, SandboxSpec::default(), &world).await;
    egress::none_and_full_hold(&remote, SandboxSpec::default(), &world).await;
}

/// The E2B provider sends an allowlist as `allowOut` with everything else denied, and
/// a new one with `PUT /sandboxes/{id}/network`; the server's E2B face gives the
/// served backend exactly that, and reports it in the sandbox's view.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_e2b_provider_carries_allowlists_and_their_changes() {
    let Some(server) = serve_egress().await else {
        return;
    };
    let e2b = common::e2b_client(&server.url).await;
    let world = EgressWorld::start().await;
    let a = format!("http://a.test:{}/", world.a_http);
    let b_url = format!("http://b.test:{}/", world.b_http);

    let info = e2b
        .create(&SandboxSpec::default().network(egress::allowlist()))
        .await
        .unwrap();
    assert_eq!(info.network, egress::allowlist());
    let seen = egress::fetch(&e2b, &info.id, "", &a).await;
    assert_eq!(
        (seen.status, seen.body.as_str()),
        (200, egress::BODY_A),
        "{seen:?}"
    );
    let seen = egress::fetch(&e2b, &info.id, "", &b_url).await;
    assert_eq!(seen.status, 403, "{seen:?}");
    let seen = egress::fetch(
        &e2b,
        &info.id,
        "--noproxy '*'",
        &format!("http://{}:{}/", egress::HOST_B, world.b_http),
    )
    .await;
    assert_ne!(seen.exit, 0, "no way around the proxy: {seen:?}");

    let only_b = Network::Allowlist(vec!["b.test".to_owned()]);
    e2b.set_network(&info.id, &only_b).await.unwrap();
    assert_eq!(e2b.inspect(&info.id).await.unwrap().network, only_b);
    assert_eq!(
        server.local.inspect(&info.id).await.unwrap().network,
        only_b
    );
    let seen = egress::fetch(&e2b, &info.id, "", &b_url).await;
    assert_eq!(
        (seen.status, seen.body.as_str()),
        (200, egress::BODY_B),
        "{seen:?}"
    );
    let seen = egress::fetch(&e2b, &info.id, "", &a).await;
    assert_eq!(seen.status, 403, "{seen:?}");
    let err = e2b.set_network(&info.id, &Network::Full).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    e2b.destroy(&info.id).await.unwrap();

    // What E2B's rules cannot say is refused, not widened.
    let err = e2b
        .create(&SandboxSpec::default().network(Network::Allowlist(vec!["a.test:80".into()])))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    let none = e2b
        .create(&SandboxSpec::default().network(Network::None))
        .await
        .unwrap();
    assert_eq!(none.network, Network::None);
    let seen = egress::fetch(&e2b, &none.id, "", &a).await;
    assert_ne!(seen.exit, 0, "{seen:?}");
    e2b.destroy(&none.id).await.unwrap();
}
