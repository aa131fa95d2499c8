//! Network policies on the local backend: an allowlist at `Isolation::Namespaces`
//! (the only level with a network of the sandbox's own), `None` and `Full` at each
//! level that claims them, against servers on this machine.

// Test helpers outside #[test] fns report failures by panicking too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use sandcell::testing::egress::{self, EgressWorld};
use sandcell::{ErrorKind, Network, SandboxBackend, SandboxBackendExt, SandboxSpec};
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
    // A full network here reaches nothing of the host's, this world's addresses on its
    // loopback included (ADVERSARIAL 38): tests/network.rs checks its way out.
    egress::none_holds(&b, SandboxSpec::default(), &world).await;
}

/// At each level that enforces an allowlist: a backend in a new process (here, a new
/// backend over the same root after the first is gone) serves the way out again; the
/// listener survives a reset (at `Namespaces` the namespaces are made afresh); destroy
/// stops it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_way_out_follows_a_new_backend_and_reset_and_ends_with_destroy() {
    let world = EgressWorld::start().await;
    let a = format!("http://a.test:{}/", world.a_http);
    for isolation in [Isolation::Namespaces, Isolation::Landlock] {
        let root = tempfile::tempdir().unwrap();
        let Some(first) = backend(root.path(), isolation) else {
            continue;
        };
        if !first.capabilities().network_allowlist {
            continue;
        }
        let info = first
            .create(&SandboxSpec::default().network(egress::allowlist()))
            .await
            .unwrap();
        assert_eq!(
            egress::fetch(&first, &info.id, "", &a).await.body,
            egress::BODY_A
        );
        drop(first);
        // The first backend's proxy task closes its listener when the runtime next polls
        // the aborted task (a process that exits closes it at once).
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let b = backend(root.path(), isolation).unwrap();
        let seen = egress::fetch(&b, &info.id, "", &a).await;
        assert_eq!(
            seen.body,
            egress::BODY_A,
            "{isolation:?}, adopted: {seen:?}"
        );
        b.reset(&info.id).await.unwrap();
        let seen = egress::fetch(&b, &info.id, "", &a).await;
        assert_eq!(
            seen.body,
            egress::BODY_A,
            "{isolation:?}, after reset: {seen:?}"
        );
        let proxy = b
            .run_shell(&info.id, "printf %s \"${HTTP_PROXY#http://}\"")
            .await
            .unwrap()
            .stdout_str()
            .into_owned();
        b.destroy(&info.id).await.unwrap();
        assert!(b.metrics(&info.id).await.is_err());
        if isolation == Isolation::Landlock {
            // Nothing listens on the host's port any more.
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            assert!(
                tokio::net::TcpStream::connect(&proxy).await.is_err(),
                "the listener at {proxy} is closed"
            );
        }
    }
}

/// At Landlock the sandbox shares the host's network, narrowed by the kernel to the
/// proxy's port on loopback: the same scenarios hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn landlock_enforces_an_allowlist() {
    let root = tempfile::tempdir().unwrap();
    let Some(b) = backend(root.path(), Isolation::Landlock) else {
        return;
    };
    if !b.capabilities().network_allowlist {
        // Landlock's TCP rules (Linux 6.7) and a cgroup v2 to filter connects need root.
        sandcell::testing::require_or_skip(
            "LANDLOCK_NETWORK",
            "an allowlist at Isolation::Landlock",
            Err("no Landlock ABI 4, or no writable cgroup v2".to_owned()),
        );
        return;
    }
    assert!(b.capabilities().network_update);
    let world = EgressWorld::start().await;
    egress::allowlist_is_enforced(&b, SandboxSpec::default(), &world).await;
    // A full network here reaches nothing of the host's, this world's addresses on its
    // loopback included (ADVERSARIAL 38): tests/network.rs checks its way out.
    egress::none_holds(&b, SandboxSpec::default(), &world).await;
}

/// Without isolation the sandbox has the host's network as it is: an allowlist is
/// refused, never silently widened.
#[tokio::test]
async fn no_isolation_refuses_an_allowlist() {
    let root = tempfile::tempdir().unwrap();
    let b = backend(root.path(), Isolation::None).unwrap();
    assert!(!b.capabilities().network_allowlist);
    let err = b
        .create(&SandboxSpec::default().network(egress::allowlist()))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    assert!(err.to_string().contains("allowlist"), "{err}");
    // A malformed list is InvalidInput before anything else.
    let root = tempfile::tempdir().unwrap();
    let b = backend(root.path(), Isolation::None).unwrap();
    let err = b
        .create(&SandboxSpec::default().network(Network::Allowlist(vec!["a.test:0".into()])))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
}

/// The manager reports each session's egress as events: the increase per host since
/// the last report, nothing when nothing changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_manager_reports_egress_as_events() {
    use futures::StreamExt;
    use sandcell::store::{InMemorySnapshotStore, InMemoryStateStore};
    use sandcell::{EventKind, SandboxManager, SessionKey};

    let root = tempfile::tempdir().unwrap();
    let Some(b) = backend(root.path(), Isolation::Landlock)
        .filter(|b| b.capabilities().network_allowlist)
        .or_else(|| backend(root.path(), Isolation::Namespaces))
    else {
        return;
    };
    let world = EgressWorld::start().await;
    let manager = SandboxManager::builder(b)
        .state_store(std::sync::Arc::new(InMemoryStateStore::new()))
        .snapshot_store(std::sync::Arc::new(InMemorySnapshotStore::new()))
        .build()
        .await
        .unwrap();
    let mut events = manager.subscribe();
    let key = SessionKey::new("acme", "egress").unwrap();
    let sandbox = manager
        .acquire(&key, &SandboxSpec::default().network(egress::allowlist()))
        .await
        .unwrap();
    let a = format!("http://a.test:{}/", world.a_http);
    let b_url = format!("http://b.test:{}/", world.b_http);
    for url in [&a, &a, &b_url] {
        egress::fetch(sandbox.backend(), sandbox.id(), "", url).await;
    }
    assert_eq!(manager.report_egress().await.unwrap(), 1);
    let event = next_egress(&mut events).await;
    assert_eq!(event.session.as_ref(), Some(&key));
    let count = |host: &str| {
        event
            .egress
            .iter()
            .find(|c| c.host == host)
            .map(|c| (c.allowed, c.denied))
    };
    assert_eq!(count("a.test"), Some((2, 0)), "{event:?}");
    assert_eq!(count("b.test"), Some((0, 1)), "{event:?}");
    // Nothing new: no event.
    assert_eq!(manager.report_egress().await.unwrap(), 0);
    egress::fetch(sandbox.backend(), sandbox.id(), "", &a).await;
    assert_eq!(manager.report_egress().await.unwrap(), 1);
    let event = next_egress(&mut events).await;
    assert_eq!(event.egress.len(), 1, "{event:?}");
    assert_eq!(
        (event.egress[0].host.as_str(), event.egress[0].allowed),
        ("a.test", 1)
    );
    drop(sandbox);
    manager
        .release(&key, sandcell::ReleaseMode::Destroy)
        .await
        .unwrap();

    async fn next_egress(events: &mut sandcell::manager::EventStream) -> sandcell::ManagerEvent {
        loop {
            let event = tokio::time::timeout(std::time::Duration::from_secs(5), events.next())
                .await
                .expect("an event in time")
                .expect("the stream is open");
            if event.kind == EventKind::Egress {
                return event;
            }
        }
    }
}
