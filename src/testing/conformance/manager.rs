//! The session manager over a backend: acquire, suspend, restore, reconcile, purge.

use bytes::Bytes;

use super::{assert_kind, p, spec};
use crate::{ErrorKind, SandboxBackend, SandboxBackendExt};

/// The session manager over this backend, the path an agent framework takes: a session
/// is acquired, used, suspended (snapshot, then the sandbox destroyed), and a second
/// manager on the same stores restores it into a new sandbox; reconcile destroys a
/// sandbox carrying the manager's and the store's labels that no session knows and
/// leaves an unlabelled one alone; a fork is an independent session; purge leaves nothing. Takes the backend shared, as a manager owns one.
pub async fn manager_sessions(backend: std::sync::Arc<dyn SandboxBackend>) {
    use crate::manager::LABEL_MANAGER;
    use crate::store::{InMemorySnapshotStore, InMemoryStateStore, SessionKey};
    use crate::{ReleaseMode, SandboxManager};

    let state = InMemoryStateStore::new();
    let snapshots = InMemorySnapshotStore::new();
    let manager_id = format!(
        "conformance-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let build = || {
        SandboxManager::builder(std::sync::Arc::clone(&backend))
            .state_store(state.clone())
            .snapshot_store(snapshots.clone())
            .manager_id(&manager_id)
            .build()
    };
    let key = SessionKey::new("conformance", "session").unwrap();
    let first = build().await.expect("a manager over the backend");
    let handle = first.acquire(&key, &spec()).await.expect("acquire");
    let first_id = handle.id().clone();
    let notes = p("notes/a.txt");
    handle
        .call("write", |b, id| {
            b.write(id, &notes, Bytes::from_static(b"kept"))
        })
        .await
        .unwrap();
    if backend.capabilities().shell {
        let out = handle
            .call("run_shell", |b, id| b.run_shell(id, "cat notes/a.txt"))
            .await
            .unwrap();
        assert_eq!(out.stdout_str(), "kept");
    }
    first
        .release(&key, ReleaseMode::Suspend)
        .await
        .expect("suspend");
    assert_kind(
        backend.inspect(&first_id).await.map(|_| ()),
        ErrorKind::NotFound,
        "a suspended session's sandbox is destroyed",
    );
    drop(handle);
    first.shutdown().await;

    // Another process, say: the same stores, a new manager.
    let second = build().await.expect("a second manager");
    let handle = second.acquire(&key, &spec()).await.expect("acquire again");
    assert_ne!(handle.id(), &first_id, "restored into a new sandbox");
    let read = handle.call("read", |b, id| b.read(id, &notes)).await;
    assert_eq!(&read.unwrap()[..], b"kept");

    let orphan = backend
        .create(
            &spec()
                .label(LABEL_MANAGER, &manager_id)
                .label(crate::manager::LABEL_STORE, second.store_id()),
        )
        .await
        .unwrap();
    let bystander = backend.create(&spec()).await.unwrap();
    let report = second.reconcile().await.expect("reconcile");
    assert_eq!(report.destroyed, vec![orphan.id.clone()], "only the orphan");
    assert_kind(
        backend.inspect(&orphan.id).await.map(|_| ()),
        ErrorKind::NotFound,
        "the orphan is gone",
    );
    backend
        .inspect(&bystander.id)
        .await
        .expect("an unlabelled sandbox is left alone");
    backend.destroy(&bystander.id).await.unwrap();

    // A fork is a new session over a clone: independent both ways, never over an
    // existing session, and gone with its own purge.
    let forked_key = SessionKey::new("conformance", "fork").unwrap();
    if backend.capabilities().clone {
        let fork = second.fork(&key, &forked_key).await.expect("fork");
        assert_ne!(fork.id(), handle.id());
        let read = fork.call("read", |b, id| b.read(id, &notes)).await;
        assert_eq!(
            &read.unwrap()[..],
            b"kept",
            "the fork starts with the workspace"
        );
        fork.call("write", |b, id| {
            b.write(id, &notes, Bytes::from_static(b"fork"))
        })
        .await
        .unwrap();
        let read = handle.call("read", |b, id| b.read(id, &notes)).await;
        assert_eq!(
            &read.unwrap()[..],
            b"kept",
            "the source does not see the fork's write"
        );
        assert_kind(
            second.fork(&key, &forked_key).await.map(|_| ()),
            ErrorKind::AlreadyExists,
            "a fork into an existing session",
        );
        let fork_id = fork.id().clone();
        second
            .release(&forked_key, ReleaseMode::Purge)
            .await
            .unwrap();
        assert_kind(
            backend.inspect(&fork_id).await.map(|_| ()),
            ErrorKind::NotFound,
            "purging the fork destroys its sandbox",
        );
        let read = handle.call("read", |b, id| b.read(id, &notes)).await;
        assert_eq!(&read.unwrap()[..], b"kept", "and leaves the source");
    } else {
        assert_kind(
            second.fork(&key, &forked_key).await.map(|_| ()),
            ErrorKind::Unsupported,
            "a fork without the clone capability",
        );
        assert!(second.session(&forked_key).await.unwrap().is_none());
    }

    let live = handle.id().clone();
    second
        .release(&key, ReleaseMode::Purge)
        .await
        .expect("purge");
    assert_kind(
        backend.inspect(&live).await.map(|_| ()),
        ErrorKind::NotFound,
        "purge destroys the sandbox",
    );
    assert!(second.snapshots(&key).await.unwrap().is_empty());
    assert!(second.session(&key).await.unwrap().is_none());
    second.shutdown().await;
}

/// The manager's housekeeping over this backend, not only the mock: the tenant limit
/// holds across two managers sharing a store; a session idle past `idle_timeout` and one
/// past `max_lifetime` are snapshotted and destroyed by the reaper and come back on
/// acquire; retention deletes the oldest snapshots; a warm pool's sandbox serves a new
/// session and is refilled; the pause strategy freezes and resumes the same sandbox
/// (where the backend can pause); a session live under one manager's lease is refused to
/// another manager id, naming the holder. Takes the backend shared.
pub async fn manager_housekeeping(backend: std::sync::Arc<dyn SandboxBackend>) {
    use std::time::Duration;

    use crate::manager::{SnapshotRetention, SuspendStrategy};
    use crate::store::{InMemorySnapshotStore, InMemoryStateStore, SessionKey};
    use crate::{ReleaseMode, SandboxManager, SandboxStatus};

    let state = InMemoryStateStore::new();
    let snapshots = InMemorySnapshotStore::new();
    let id = |name: &str| format!("{name}-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let (manager_id, other_id) = (id("housekeeping"), id("elsewhere"));
    let builder = |manager_id: &str| {
        SandboxManager::builder(std::sync::Arc::clone(&backend))
            .state_store(state.clone())
            .snapshot_store(snapshots.clone())
            .manager_id(manager_id)
            .max_sandboxes_per_tenant(2)
    };
    let key = |s: &str| SessionKey::new("housekeeping", s).unwrap();
    let notes = p("notes.txt");

    // The tenant limit, across two managers (processes) sharing the store.
    let first = builder(&manager_id)
        .idle_timeout(Duration::from_millis(300))
        .build()
        .await
        .expect("a manager");
    let second = builder(&manager_id)
        .build()
        .await
        .expect("a second manager");
    let idle = first.acquire(&key("idle"), &spec()).await.expect("acquire");
    idle.call("write", |b, id| {
        b.write(id, &notes, Bytes::from_static(b"idle"))
    })
    .await
    .unwrap();
    let busy = second
        .acquire(&key("busy"), &spec())
        .await
        .expect("acquire");
    assert_kind(
        first.acquire(&key("third"), &spec()).await.map(|_| ()),
        ErrorKind::LimitExceeded,
        "a third session over a limit of two, across managers",
    );

    // Another manager id: the live sessions are held, named by the error.
    let elsewhere = builder(&other_id)
        .build()
        .await
        .expect("a manager elsewhere");
    let err = elsewhere.acquire(&key("busy"), &spec()).await.err();
    let err = err.expect("a session live under another manager's lease is refused");
    assert_eq!(err.kind(), ErrorKind::Conflict, "{err:#}");
    assert!(err.to_string().contains(&manager_id), "{err}");
    elsewhere.shutdown().await;

    // Idle reaping: only the idle session is suspended; it comes back on acquire.
    tokio::time::sleep(Duration::from_millis(400)).await;
    busy.call("touch", |b, id| b.exists(id, &notes))
        .await
        .unwrap();
    let report = first.reap_once().await.expect("reap");
    assert!(report.suspended.contains(&key("idle")), "{report:?}");
    assert_kind(
        backend.inspect(idle.id()).await.map(|_| ()),
        ErrorKind::NotFound,
        "an idle session's sandbox is destroyed",
    );
    let back = first.acquire(&key("idle"), &spec()).await.expect("restore");
    let read = back.call("read", |b, id| b.read(id, &notes)).await;
    assert_eq!(&read.unwrap()[..], b"idle");
    for s in ["idle", "busy"] {
        first.release(&key(s), ReleaseMode::Purge).await.unwrap();
    }
    first.shutdown().await;
    second.shutdown().await;

    // Lifetime: snapshotted, destroyed, restored. Retention: the oldest snapshots go.
    let aging = builder(&manager_id)
        .max_lifetime(Duration::from_millis(300))
        .retention(SnapshotRetention::keep_all().keep_last(2))
        .build()
        .await
        .expect("a manager");
    let old = aging.acquire(&key("old"), &spec()).await.expect("acquire");
    old.call("write", |b, id| {
        b.write(id, &notes, Bytes::from_static(b"old"))
    })
    .await
    .unwrap();
    for _ in 0..2 {
        aging.snapshot(&key("old")).await.expect("snapshot");
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    let report = aging.reap_once().await.expect("reap");
    assert_eq!(report.expired, vec![key("old")], "{report:?}");
    assert_eq!(report.snapshots_deleted.len(), 1, "{report:?}");
    assert_eq!(aging.snapshots(&key("old")).await.unwrap().len(), 2);
    let back = aging.acquire(&key("old"), &spec()).await.expect("restore");
    assert_ne!(back.id(), old.id());
    let read = back.call("read", |b, id| b.read(id, &notes)).await;
    assert_eq!(&read.unwrap()[..], b"old");
    aging
        .release(&key("old"), ReleaseMode::Purge)
        .await
        .unwrap();
    aging.shutdown().await;

    // A warm pool serves a new session with its sandbox, then refills.
    let pooled = builder(&manager_id)
        .warm_pool("conformance", spec(), 1)
        .build()
        .await
        .expect("a manager with a pool");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let ready = loop {
        let entries = pooled.state_store().pool_list().await.unwrap();
        if let Some(id) = entries.iter().find_map(|e| e.sandbox_id.clone()) {
            break id;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the pool never filled"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let handle = pooled
        .acquire(&key("pooled"), &spec())
        .await
        .expect("acquire");
    assert_eq!(handle.id(), &ready, "the pool's sandbox serves the session");
    // Well inside the filler's 60 s rest: a missed wake-up fails here.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let entries = pooled.state_store().pool_list().await.unwrap();
        if entries.iter().any(|e| e.sandbox_id.is_some()) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the pool never refilled"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    pooled
        .release(&key("pooled"), ReleaseMode::Purge)
        .await
        .unwrap();
    // Shutdown destroys the pool's sandboxes.
    let report = pooled.shutdown().await;
    assert!(report.errors.is_empty(), "{report:?}");
    assert_eq!(report.pool_destroyed, 1, "{report:?}");

    // The pause strategy, where the backend can pause.
    if backend.capabilities().pause {
        let pausing = builder(&manager_id)
            .suspend_strategy(SuspendStrategy::Pause)
            .build()
            .await
            .expect("a manager");
        let handle = pausing.acquire(&key("paused"), &spec()).await.unwrap();
        pausing
            .release(&key("paused"), ReleaseMode::Suspend)
            .await
            .expect("pause");
        assert_eq!(
            backend.inspect(handle.id()).await.unwrap().status,
            SandboxStatus::Paused
        );
        let again = pausing.acquire(&key("paused"), &spec()).await.unwrap();
        assert_eq!(again.id(), handle.id(), "resumed, not restored");
        pausing
            .release(&key("paused"), ReleaseMode::Purge)
            .await
            .unwrap();
        pausing.shutdown().await;
    }

    // Nothing of these managers is left on the backend.
    let selector = crate::LabelSelector::new().label(crate::manager::LABEL_MANAGER, &manager_id);
    let left = backend.list(&selector).await.unwrap();
    assert!(left.is_empty(), "left behind: {left:?}");
}
