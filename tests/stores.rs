//! Every store implementation against the store conformance cases.
#![cfg(feature = "testing")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[cfg(feature = "object-store")]
use std::sync::Arc;

use sandcell::store::{
    FsSnapshotStore, InMemorySnapshotStore, InMemoryStateStore, SqliteStateStore,
};
use sandcell::testing::stores;

#[tokio::test]
async fn in_memory_state_store() {
    stores::state_store_all(&InMemoryStateStore::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_state_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStateStore::open(dir.path().join("nested/state.db"))
        .await
        .unwrap();
    stores::state_store_all(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_state_survives_reopen_and_is_shared_between_handles() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let first = SqliteStateStore::open(&path).await.unwrap();
    let second = SqliteStateStore::open(&path).await.unwrap();
    let key = sandcell::store::SessionKey::new("acme", "s1").unwrap();
    let record = sandcell::store::SessionRecord::provisioning(
        key.clone(),
        "mock",
        sandcell::SandboxSpec::new("default"),
        chrono::Utc::now(),
    );
    use sandcell::store::StateStore;
    first.put(&record).await.unwrap();
    assert_eq!(second.get(&key).await.unwrap(), Some(record.clone()));
    first.close().await;
    second.close().await;
    let reopened = SqliteStateStore::open(&path).await.unwrap();
    assert_eq!(reopened.get(&key).await.unwrap(), Some(record));
}

#[tokio::test]
async fn in_memory_snapshot_store() {
    stores::snapshot_store_all(&InMemorySnapshotStore::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fs_snapshot_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = FsSnapshotStore::new(dir.path().join("snapshots"));
    stores::snapshot_store_all(&store).await;
    // Nothing but empty session directories is left: no temp files, no orphan blobs.
    let mut files = Vec::new();
    let mut stack = vec![dir.path().to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                files.push(e.path());
            }
        }
    }
    assert!(files.is_empty(), "left behind: {files:?}");
}

#[cfg(feature = "object-store")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn object_store_in_memory() {
    let store = sandcell::store::ObjectSnapshotStore::new(
        Arc::new(object_store::memory::InMemory::new()),
        "snapshots",
    );
    stores::snapshot_store_all(&store).await;
}

#[cfg(feature = "object-store")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn object_store_local_filesystem() {
    let dir = tempfile::tempdir().unwrap();
    let fs = object_store::local::LocalFileSystem::new_with_prefix(dir.path()).unwrap();
    let store = sandcell::store::ObjectSnapshotStore::new(Arc::new(fs), "");
    stores::snapshot_store_all(&store).await;
}
