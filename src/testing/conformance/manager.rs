//! The session manager over a backend: acquire, suspend, restore, reconcile, purge.

use bytes::Bytes;

use super::{assert_kind, p, spec};
use crate::{ErrorKind, SandboxBackend, SandboxBackendExt};

/// The session manager over this backend, the path an agent framework takes: a session
/// is acquired, used, suspended (snapshot, then the sandbox destroyed), and a second
/// manager on the same stores restores it into a new sandbox; reconcile destroys a
/// sandbox carrying the manager's label that no session knows and leaves an unlabelled
/// one alone; a fork is an independent session; purge leaves nothing. Takes the backend shared, as a manager owns one.
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
        .create(&spec().label(LABEL_MANAGER, &manager_id))
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
