//! Every store implementation against the store conformance cases.
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instance_ids_name_one_store_and_survive_reopening() {
    use sandcell::store::StateStore;
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a/state.db"), dir.path().join("b/state.db"));
    let first = SqliteStateStore::open(&a).await.unwrap();
    let other = SqliteStateStore::open(&b).await.unwrap();
    stores::state_instance_ids_differ(&first, &other).await;
    let id = first.instance_id().await.unwrap();
    let second = SqliteStateStore::open(&a).await.unwrap();
    assert_eq!(second.instance_id().await.unwrap(), id);
    first.close().await;
    second.close().await;
    let reopened = SqliteStateStore::open(&a).await.unwrap();
    assert_eq!(reopened.instance_id().await.unwrap(), id);

    let memory = InMemoryStateStore::new();
    stores::state_instance_ids_differ(&memory, &InMemoryStateStore::new()).await;
    // Clones are one store.
    assert_eq!(
        memory.clone().instance_id().await.unwrap(),
        memory.instance_id().await.unwrap()
    );
}

/// ADVERSARIAL 45 (the LOW item of issue 47): the state store holds every spec's
/// environment, so no other local user may read it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_state_database_and_its_directories_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data/nested");
    let path = data.join("state.db");
    let store = SqliteStateStore::open(&path).await.unwrap();
    // A write, so the WAL and shared-memory files exist.
    use sandcell::store::StateStore;
    let key = sandcell::store::SessionKey::new("acme", "s1").unwrap();
    let record = sandcell::store::SessionRecord::provisioning(
        key,
        "mock",
        sandcell::SandboxSpec::new("default"),
        chrono::Utc::now(),
    );
    store.put(&record).await.unwrap();
    assert_eq!(mode(&data), 0o700);
    assert_eq!(mode(&dir.path().join("data")), 0o700);
    for file in ["state.db", "state.db-wal", "state.db-shm"] {
        assert_eq!(mode(&data.join(file)), 0o600, "{file}");
    }
    store.close().await;

    // A database an older version left world-readable is made private when opened.
    for file in ["state.db", "state.db-wal", "state.db-shm"] {
        let p = data.join(file);
        if p.exists() {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        }
    }
    let reopened = SqliteStateStore::open(&path).await.unwrap();
    assert_eq!(mode(&path), 0o600);
    reopened.close().await;

    // Snapshot directories the file store creates are private too.
    let snapshots = dir.path().join("snapshots");
    let fs_store = FsSnapshotStore::new(&snapshots);
    stores::snapshot_round_trip(&fs_store).await;
    for entry in walk(&snapshots) {
        if entry.is_dir() {
            assert_eq!(mode(&entry), 0o700, "{}", entry.display());
        }
    }
}

/// ADVERSARIAL 45: a state database (or its WAL) that is a symlink, or a file another
/// user made first, is refused, and the file it names is left as it was: in a
/// directory another user could write, root would otherwise have changed its mode
/// and written every spec's environment where they chose.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_database_someone_else_placed_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "x").unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o644)).unwrap();
    for linked in ["state.db", "state.db-wal"] {
        let data = dir.path().join(format!("data-{linked}"));
        std::fs::create_dir(&data).unwrap();
        std::os::unix::fs::symlink(&victim, data.join(linked)).unwrap();
        let err = SqliteStateStore::open(data.join("state.db"))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), sandcell::ErrorKind::PermissionDenied, "{err}");
        let meta = std::fs::metadata(&victim).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o644, "{linked}");
        assert_eq!(std::fs::read(&victim).unwrap(), b"x", "{linked}");
    }
    // A directory others may write, sticky or not (a shared /tmp), is refused before
    // SQLite makes its `-wal` there.
    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let err = SqliteStateStore::open(shared.join("state.db"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), sandcell::ErrorKind::PermissionDenied, "{err}");
    assert!(!shared.join("state.db").exists());
    if rustix::process::geteuid().is_root() {
        let data = dir.path().join("theirs");
        std::fs::create_dir(&data).unwrap();
        std::fs::write(data.join("state.db"), "").unwrap();
        let nobody = Some(rustix::fs::Uid::from_raw(65534));
        rustix::fs::chown(data.join("state.db"), nobody, None).unwrap();
        let err = SqliteStateStore::open(data.join("state.db"))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("owned by uid 65534"), "{err}");
    }
}

/// Attack 1D: the database's missing parents were made (through any link on the way)
/// before the parent was checked, so a refused open still left root's directories
/// wherever another user's link pointed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_made_beneath_a_refused_database_directory() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let open = dir.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let err = SqliteStateStore::open(open.join("made/by/me/state.db"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), sandcell::ErrorKind::PermissionDenied, "{err}");
    assert!(
        !open.join("made").exists(),
        "made beneath a refused directory"
    );
    if rustix::process::geteuid().is_root() {
        // Another user's link, in a directory they share, to a directory of root's.
        let share = dir.path().join("share");
        std::fs::create_dir(&share).unwrap();
        std::fs::set_permissions(&share, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let private = dir.path().join("private");
        std::fs::create_dir(&private).unwrap();
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::symlink(&private, share.join("evil")).unwrap();
        std::os::unix::fs::lchown(share.join("evil"), Some(65534), None).unwrap();
        let err = SqliteStateStore::open(share.join("evil/made/by/root/state.db"))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("owned by uid 65534"), "{err}");
        assert_eq!(std::fs::read_dir(&private).unwrap().count(), 0);
    }
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = vec![dir.to_path_buf()];
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
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
