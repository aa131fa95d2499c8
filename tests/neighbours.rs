//! ADVERSARIAL 46: programs with data directories of their own on one backend (one
//! local root, one mock engine) never destroy each other's sandboxes: not when one
//! starts (reconcile on build), not in its `gc` (reconcile and a reaper pass), and a
//! restarted program keeps its manager id and its sessions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use bytes::Bytes;
use sandcell::manager::{ShutdownPolicy, LABEL_STORE};
use sandcell::store::SessionKey;
use sandcell::testing::MockBackend;
use sandcell::{
    LabelSelector, ReleaseMode, SandboxBackend, SandboxManager, SandboxPath, SandboxSpec,
};
use sandcell_local::{Isolation, LocalBackend};

fn key() -> SessionKey {
    SessionKey::new("acme", "chat").unwrap()
}

fn notes() -> SandboxPath {
    "notes.md".parse().unwrap()
}

/// A program: its own data directory (SQLite state, file snapshots), default settings
/// but for leaving its sandboxes running when it exits (as the CLI does).
async fn program<B: SandboxBackend>(backend: B, data_dir: &Path) -> SandboxManager<B> {
    SandboxManager::builder(backend)
        .data_dir(data_dir)
        .shutdown_policy(ShutdownPolicy::Keep)
        .build()
        .await
        .unwrap()
}

/// What `sandcell gc` does.
async fn gc<B: SandboxBackend>(manager: &SandboxManager<B>) {
    let report = manager.reconcile().await.unwrap();
    assert!(report.destroyed.is_empty(), "{report:?}");
    assert!(report.lost.is_empty(), "{report:?}");
    manager.reap_once().await.unwrap();
}

async fn neighbours<B: SandboxBackend>(backend: impl Fn() -> B) {
    let dirs = tempfile::tempdir().unwrap();
    let notes = notes();
    let (x, y) = (dirs.path().join("x"), dirs.path().join("y"));

    let theirs = program(backend(), &y).await;
    let sandbox = theirs
        .acquire(&key(), &SandboxSpec::new("default"))
        .await
        .unwrap();
    let their_id = sandbox.id().clone();
    sandbox
        .call("write", |b, id| {
            b.write(id, &notes, Bytes::from_static(b"y's"))
        })
        .await
        .unwrap();

    // Another program on the same backend starts (reconciling) and collects garbage.
    let mine = program(backend(), &x).await;
    assert_ne!(mine.manager_id(), theirs.manager_id());
    gc(&mine).await;
    let ours = mine
        .acquire(&key(), &SandboxSpec::new("default"))
        .await
        .unwrap();
    assert_ne!(ours.id(), &their_id);
    gc(&mine).await;
    gc(&theirs).await;

    // Y's sandbox is the one it made, with its file: not a fresh, empty one.
    assert!(backend().inspect(&their_id).await.is_ok());
    let read = sandbox.call("read", |b, id| b.read(id, &notes)).await;
    assert_eq!(&read.unwrap()[..], b"y's");

    // X restarted keeps its manager id (so its leases) and finds its session live.
    let id = mine.manager_id().to_owned();
    let ours_id = ours.id().clone();
    drop(ours);
    mine.shutdown().await;
    drop(mine);
    let again = program(backend(), &x).await;
    assert_eq!(again.manager_id(), id);
    let ours = again
        .acquire(&key(), &SandboxSpec::new("default"))
        .await
        .unwrap();
    assert_eq!(ours.id(), &ours_id, "reconnected, not restored");
    assert!(backend().inspect(&their_id).await.is_ok());

    for manager in [&again, &theirs] {
        manager.release(&key(), ReleaseMode::Purge).await.unwrap();
        let selector = LabelSelector::new().label(LABEL_STORE, manager.store_id());
        assert!(backend().list(&selector).await.unwrap().is_empty());
        manager.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn programs_sharing_a_mock_engine_leave_each_other_alone() {
    let engine = MockBackend::new();
    neighbours(|| engine.clone()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn programs_sharing_a_local_root_leave_each_other_alone() {
    let root = tempfile::tempdir().unwrap();
    // Two programs, two backend values over one root, as two processes would have.
    neighbours(|| {
        LocalBackend::builder()
            .root(root.path())
            .isolation(Isolation::None)
            .build()
            .unwrap()
    })
    .await;
}
