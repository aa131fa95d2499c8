//! Network policies on the local backend: an allowlist at `Isolation::Namespaces`
//! (the only level with a network of the sandbox's own), `None` and `Full` at each
//! level that claims them, against servers on this machine.

// Test helpers outside #[test] fns report failures by panicking too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use sandcell::testing::egress::{self, EgressWorld};
use sandcell::{ErrorKind, Network, SandboxBackend, SandboxSpec};
use sandcell_local::{Isolation, LocalBackend};

fn backend(root: &std::path::Path, isolation: Isolation) -> Option<LocalBackend> {
    let mut builder = LocalBackend::builder().root(root).isolation(isolation);
    for (name, addrs) in EgressWorld::hosts() {
        builder = builder.egress_host(name, addrs);
    }
    match builder.build() {
        Ok(b) => Some(b),
        Err(e) => {
            assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
            let need = match isolation {
                Isolation::Namespaces => "NAMESPACES",
                _ => "LANDLOCK",
            };
            sandcell::testing::require_or_skip(need, "this isolation level", Err(e.to_string()));
            None
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaces_enforce_an_allowlist() {
    let root = tempfile::tempdir().unwrap();
    let Some(b) = backend(root.path(), Isolation::Namespaces) else {
        return;
    };
    assert!(b.capabilities().network_allowlist && b.capabilities().network_update);
    let world = EgressWorld::start().await;
    egress::allowlist_is_enforced(&b, SandboxSpec::default(), &world).await;
    egress::none_and_full_hold(&b, SandboxSpec::default(), &world).await;
}

/// The listener survives a reset (the namespaces are made afresh), and destroy stops it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_way_out_follows_reset_and_ends_with_destroy() {
    let root = tempfile::tempdir().unwrap();
    let Some(b) = backend(root.path(), Isolation::Namespaces) else {
        return;
    };
    let world = EgressWorld::start().await;
    let info = b
        .create(&SandboxSpec::default().network(egress::allowlist()))
        .await
        .unwrap();
    let a = format!("http://a.test:{}/", world.a_http);
    assert_eq!(
        egress::fetch(&b, &info.id, "", &a).await.body,
        egress::BODY_A
    );
    b.reset(&info.id).await.unwrap();
    let seen = egress::fetch(&b, &info.id, "", &a).await;
    assert_eq!(seen.body, egress::BODY_A, "after reset: {seen:?}");
    b.destroy(&info.id).await.unwrap();
    assert!(b.metrics(&info.id).await.is_err());
}

/// Below `Namespaces` the sandbox shares the host's network, which cannot be narrowed to
/// a proxy: an allowlist is refused, never silently widened.
#[tokio::test]
async fn levels_without_a_network_of_their_own_refuse_an_allowlist() {
    for isolation in [Isolation::Landlock, Isolation::None] {
        let root = tempfile::tempdir().unwrap();
        let Some(b) = backend(root.path(), isolation) else {
            continue;
        };
        assert!(!b.capabilities().network_allowlist);
        let err = b
            .create(&SandboxSpec::default().network(egress::allowlist()))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
        assert!(err.to_string().contains("allowlist"), "{err}");
    }
    // A malformed list is InvalidInput before anything else.
    let root = tempfile::tempdir().unwrap();
    let b = backend(root.path(), Isolation::None).unwrap();
    let err = b
        .create(&SandboxSpec::default().network(Network::Allowlist(vec!["a.test:0".into()])))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
}
