//! Snapshots move between backends: a workspace with nested directories, modes, symlinks,
//! an empty directory and a 20 MB binary, snapshotted on the local backend and restored
//! on the mock, and back (`sandcell::testing::portable`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use sandcell::testing::{portable, MockBackend};
use sandcell::{SandboxBackend, SandboxSpec, SessionKey};
use sandcell_local::LocalBackend;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_moves_between_local_and_the_mock_both_ways() {
    let root = tempfile::tempdir().unwrap();
    let local = LocalBackend::builder().root(root.path()).build().unwrap();
    let mock = MockBackend::new();
    let spec = SandboxSpec::default();
    portable::snapshot_moves(&local, spec.clone(), &mock, spec.clone()).await;
    portable::snapshot_moves(&mock, spec.clone(), &local, spec).await;
    assert!(local.list(&Default::default()).await.unwrap().is_empty());
}

/// The manifest's backend is data, not a lock: a session suspended on one backend is
/// restored on the other by the next acquire there, and back; while it is live, the
/// other backend's manager is refused and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_moves_between_local_and_the_mock_both_ways() {
    let root = tempfile::tempdir().unwrap();
    let (local, mock) = portable::sharing_managers(
        LocalBackend::builder().root(root.path()).build().unwrap(),
        MockBackend::new(),
    )
    .await;
    let spec = SandboxSpec::default();
    let key = SessionKey::new("acme", "moving").unwrap();
    portable::session_moves(&local, &mock, &key, &spec).await;
    portable::session_moves(&mock, &local, &key, &spec).await;
    assert!(local
        .backend()
        .list(&Default::default())
        .await
        .unwrap()
        .is_empty());
    assert!(mock
        .backend()
        .list(&Default::default())
        .await
        .unwrap()
        .is_empty());
}
