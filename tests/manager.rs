//! SandboxManager against the MockBackend: sessions, limits, restore, reaping,
//! reconcile, retention, warm pools and shutdown.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use sandcell::manager::{
    SnapshotRetention, LABEL_MANAGER, LABEL_POOL_SLOT, LABEL_SESSION, LABEL_STORE, LABEL_TENANT,
};
use sandcell::snapshot::SnapshotManifest;
use sandcell::store::{
    FsSnapshotStore, InMemorySnapshotStore, InMemoryStateStore, SessionKey, SnapshotKey,
    SnapshotStore, SqliteStateStore, StateStore,
};
use sandcell::testing::MockBackend;
use sandcell::{
    ByteStream, Error, ErrorKind, EventKind, ExecRequest, ReleaseMode, SandboxBackend,
    SandboxBackendExt, SandboxManager, SandboxSpec, SandboxStatus,
};

fn key(session: &str) -> SessionKey {
    SessionKey::new("acme", session).unwrap()
}

fn spec() -> SandboxSpec {
    SandboxSpec::new("default")
}

fn path(p: &str) -> sandcell::SandboxPath {
    p.parse().unwrap()
}

async fn memory_manager(backend: &MockBackend) -> SandboxManager<MockBackend> {
    SandboxManager::builder(backend.clone())
        .state_store(InMemoryStateStore::new())
        .snapshot_store(InMemorySnapshotStore::new())
        .build()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_acquires_of_one_key_create_one_sandbox() {
    let backend = MockBackend::new();
    let manager = memory_manager(&backend).await;
    let mut events = manager.subscribe();
    let handles = futures::future::join_all((0..100).map(|_| {
        let manager = manager.clone();
        tokio::spawn(async move { manager.acquire(&key("one"), &spec()).await })
    }))
    .await;
    let ids: HashSet<_> = handles
        .into_iter()
        .map(|h| h.unwrap().unwrap().id().clone())
        .collect();
    assert_eq!(ids.len(), 1, "{ids:?}");
    assert_eq!(backend.live_count(), 1);
    let first = events.next().await.unwrap();
    assert_eq!(first.kind, EventKind::Created);
    assert_eq!(first.session, Some(key("one")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_limit_holds_across_two_managers_sharing_one_sqlite_file() {
    let dir = tempfile::tempdir().unwrap();
    let backend = MockBackend::new();
    let mut managers = Vec::new();
    for _ in 0..2 {
        // Each manager opens the file itself, as two processes would.
        let state = SqliteStateStore::open(dir.path().join("state.db"))
            .await
            .unwrap();
        managers.push(
            SandboxManager::builder(backend.clone())
                .state_store(state)
                .snapshot_store(FsSnapshotStore::new(dir.path().join("snapshots")))
                .max_sandboxes_per_tenant(5)
                .build()
                .await
                .unwrap(),
        );
    }
    let results = futures::future::join_all((0..50).map(|i| {
        let manager = managers[i % 2].clone();
        tokio::spawn(async move { manager.acquire(&key(&format!("s{i}")), &spec()).await })
    }))
    .await;
    let mut ok = 0;
    for r in results {
        match r.unwrap() {
            Ok(_) => ok += 1,
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::LimitExceeded, "{e}");
                assert!(e.to_string().contains("limit is 5"), "{e}");
            }
        }
    }
    assert_eq!(ok, 5);
    assert_eq!(backend.live_count(), 5);
    let holding = managers[0]
        .list(Some("acme"))
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.holds_sandbox())
        .count();
    assert_eq!(holding, 5);
    // Another tenant is not affected.
    managers[1]
        .acquire(&SessionKey::new("other", "s").unwrap(), &spec())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_manager_reconnects_to_live_sandboxes_and_restores_lost_ones() {
    let dir = tempfile::tempdir().unwrap();
    let backend = MockBackend::new();
    let (kept_id, lost_id) = {
        let first = SandboxManager::builder(backend.clone())
            .data_dir(dir.path())
            .build()
            .await
            .unwrap();
        let kept = first.acquire(&key("kept"), &spec()).await.unwrap();
        kept.call("write", |b, id| async move {
            b.write(id, &path("a.txt"), "live".into()).await
        })
        .await
        .unwrap();
        let lost = first.acquire(&key("lost"), &spec()).await.unwrap();
        lost.call("write", |b, id| async move {
            b.write(id, &path("b.txt"), "saved".into()).await
        })
        .await
        .unwrap();
        first.snapshot(&key("lost")).await.unwrap();
        lost.call("write", |b, id| async move {
            b.write(id, &path("b.txt"), "after the snapshot".into())
                .await
        })
        .await
        .unwrap();
        (kept.id().clone(), lost.id().clone())
        // `first` is dropped without shutdown, as a crashed process would be.
    };
    // The machine restarted: one sandbox survived, one did not.
    backend.destroy(&lost_id).await.unwrap();

    let second = SandboxManager::builder(backend.clone())
        .data_dir(dir.path())
        .build()
        .await
        .unwrap();
    let record = second
        .state_store()
        .get(&key("lost"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        record.status,
        SandboxStatus::Suspended,
        "reconcile marks the lost session"
    );

    let kept = second.acquire(&key("kept"), &spec()).await.unwrap();
    assert_eq!(kept.id(), &kept_id);
    assert_eq!(
        kept.call(
            "read",
            |b, id| async move { b.read(id, &path("a.txt")).await }
        )
        .await
        .unwrap(),
        "live"
    );

    let restored = second.acquire(&key("lost"), &spec()).await.unwrap();
    assert_ne!(restored.id(), &lost_id);
    assert_eq!(
        restored
            .call(
                "read",
                |b, id| async move { b.read(id, &path("b.txt")).await }
            )
            .await
            .unwrap(),
        "saved"
    );
    assert_eq!(backend.live_count(), 2);
}

#[tokio::test(start_paused = true)]
async fn idle_reaping_snapshots_before_destroying_and_activity_defers_it() {
    let backend = MockBackend::new();
    let manager = SandboxManager::builder(backend.clone())
        .state_store(InMemoryStateStore::new())
        .snapshot_store(InMemorySnapshotStore::new())
        .idle_timeout(Duration::from_secs(600))
        .build()
        .await
        .unwrap();
    let sandbox = manager.acquire(&key("idle"), &spec()).await.unwrap();
    sandbox
        .call("write", |b, id| async move {
            b.write(id, &path("work.py"), "print(1)".into()).await
        })
        .await
        .unwrap();
    let mut events = manager.subscribe();

    tokio::time::advance(Duration::from_secs(300)).await;
    sandbox
        .call(
            "read",
            |b, id| async move { b.read(id, &path("work.py")).await },
        )
        .await
        .unwrap();
    tokio::time::advance(Duration::from_secs(540)).await;
    let report = manager.reap_once().await.unwrap();
    assert!(
        report.suspended.is_empty(),
        "used 9 minutes ago: {report:?}"
    );
    assert_eq!(backend.live_count(), 1);

    tokio::time::advance(Duration::from_secs(120)).await;
    let report = manager.reap_once().await.unwrap();
    assert_eq!(report.suspended, vec![key("idle")]);
    assert_eq!(backend.live_count(), 0);
    let kinds: Vec<_> = [events.next().await.unwrap(), events.next().await.unwrap()]
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(kinds, vec![EventKind::Snapshotted, EventKind::ReapedIdle]);
    let record = manager
        .state_store()
        .get(&key("idle"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.status, SandboxStatus::Suspended);
    assert_eq!(record.sandbox_id, None);

    let again = manager.acquire(&key("idle"), &spec()).await.unwrap();
    assert_eq!(
        again
            .call(
                "read",
                |b, id| async move { b.read(id, &path("work.py")).await }
            )
            .await
            .unwrap(),
        "print(1)"
    );
}

/// A snapshot store whose writes can be made to fail, or to "crash" (panic) after the blob.
#[derive(Clone)]
struct FaultyStore<S> {
    inner: S,
    fail_blobs: Arc<AtomicBool>,
    crash_before_manifest: Arc<AtomicBool>,
}

impl<S> FaultyStore<S> {
    fn new(inner: S) -> Self {
        FaultyStore {
            inner,
            fail_blobs: Arc::default(),
            crash_before_manifest: Arc::default(),
        }
    }
}

#[async_trait]
impl<S: SnapshotStore + Clone> SnapshotStore for FaultyStore<S> {
    async fn put_blob(&self, key: &SnapshotKey, blob: ByteStream) -> sandcell::Result<u64> {
        if self.fail_blobs.load(Ordering::SeqCst) {
            return Err(Error::new(STORE_FAILURE, "injected: the store is down"));
        }
        self.inner.put_blob(key, blob).await
    }
    async fn put_manifest(&self, key: &SnapshotKey, m: &SnapshotManifest) -> sandcell::Result<()> {
        if self.crash_before_manifest.load(Ordering::SeqCst) {
            panic!("injected crash between blob and manifest");
        }
        self.inner.put_manifest(key, m).await
    }
    async fn manifest(&self, key: &SnapshotKey) -> sandcell::Result<SnapshotManifest> {
        self.inner.manifest(key).await
    }
    async fn blob(&self, key: &SnapshotKey) -> sandcell::Result<ByteStream> {
        self.inner.blob(key).await
    }
    async fn list(&self, session: &SessionKey) -> sandcell::Result<Vec<SnapshotManifest>> {
        self.inner.list(session).await
    }
    async fn delete(&self, key: &SnapshotKey) -> sandcell::Result<()> {
        self.inner.delete(key).await
    }
    async fn sweep_orphans(
        &self,
        before: chrono::DateTime<chrono::Utc>,
    ) -> sandcell::Result<Vec<SnapshotKey>> {
        self.inner.sweep_orphans(before).await
    }
}

/// The kind of the failure `FaultyStore` injects.
const STORE_FAILURE: ErrorKind = ErrorKind::Unavailable;

#[tokio::test(start_paused = true)]
async fn a_failed_snapshot_keeps_the_sandbox_for_the_next_pass() {
    let backend = MockBackend::new();
    let store = FaultyStore::new(InMemorySnapshotStore::new());
    let manager = SandboxManager::builder(backend.clone())
        .state_store(InMemoryStateStore::new())
        .snapshot_store(store.clone())
        .idle_timeout(Duration::from_secs(60))
        .build()
        .await
        .unwrap();
    let sandbox = manager.acquire(&key("precious"), &spec()).await.unwrap();
    sandbox
        .call("write", |b, id| async move {
            b.write(id, &path("data"), "irreplaceable".into()).await
        })
        .await
        .unwrap();
    let mut events = manager.subscribe();
    store.fail_blobs.store(true, Ordering::SeqCst);
    tokio::time::advance(Duration::from_secs(120)).await;

    let report = manager.reap_once().await.unwrap();
    assert_eq!(report.snapshot_failures.len(), 1);
    assert_eq!(report.snapshot_failures[0].session, key("precious"));
    assert_eq!(report.snapshot_failures[0].kind, STORE_FAILURE);
    assert!(report.suspended.is_empty());
    let event = events.next().await.unwrap();
    assert_eq!(event.kind, EventKind::SnapshotFailed);
    assert_eq!(
        event.error_kind,
        Some(STORE_FAILURE),
        "the cause's kind, as data"
    );
    let json = serde_json::to_value(&event).unwrap();
    assert_eq!(json["error_kind"], STORE_FAILURE.name());
    assert_eq!(backend.live_count(), 1);
    assert_eq!(
        sandbox
            .call(
                "read",
                |b, id| async move { b.read(id, &path("data")).await }
            )
            .await
            .unwrap(),
        "irreplaceable"
    );
    let record = manager
        .state_store()
        .get(&key("precious"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.sandbox_id.as_ref(), Some(sandbox.id()));

    // Release(Suspend) reports the failure too and keeps the sandbox.
    let err = manager
        .release(&key("precious"), ReleaseMode::Suspend)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert_eq!(backend.live_count(), 1);

    store.fail_blobs.store(false, Ordering::SeqCst);
    tokio::time::advance(Duration::from_secs(120)).await;
    let report = manager.reap_once().await.unwrap();
    assert_eq!(report.suspended, vec![key("precious")]);
    assert_eq!(backend.live_count(), 0);
    let back = manager.acquire(&key("precious"), &spec()).await.unwrap();
    assert_eq!(
        back.call(
            "read",
            |b, id| async move { b.read(id, &path("data")).await }
        )
        .await
        .unwrap(),
        "irreplaceable"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_destroys_only_orphans_carrying_its_own_label() {
    let backend = MockBackend::new();
    let manager = SandboxManager::builder(backend.clone())
        .manager_id("mgr-a")
        .state_store(InMemoryStateStore::new())
        .snapshot_store(InMemorySnapshotStore::new())
        .build()
        .await
        .unwrap();
    let known = manager.acquire(&key("known"), &spec()).await.unwrap();
    let make = |labels: &[(&str, &str)]| {
        let mut s = spec();
        for (k, v) in labels {
            s = s.label(*k, *v);
        }
        let backend = backend.clone();
        async move { backend.create(&s).await.unwrap().id }
    };
    let store = manager.store_id().to_owned();
    let orphan = make(&[
        (LABEL_MANAGER, "mgr-a"),
        (LABEL_STORE, &store),
        (LABEL_TENANT, "acme"),
        (LABEL_SESSION, "ghost"),
    ])
    .await;
    let orphan_slot = make(&[
        (LABEL_MANAGER, "mgr-a"),
        (LABEL_STORE, &store),
        (LABEL_POOL_SLOT, "gone"),
    ])
    .await;
    let other_manager = make(&[
        (LABEL_MANAGER, "mgr-b"),
        (LABEL_STORE, &store),
        (LABEL_TENANT, "acme"),
        (LABEL_SESSION, "x"),
    ])
    .await;
    // Another program that set the same manager id, with a store of its own.
    let other_store = make(&[
        (LABEL_MANAGER, "mgr-a"),
        (LABEL_STORE, "another-store"),
        (LABEL_TENANT, "acme"),
        (LABEL_SESSION, "ghost"),
    ])
    .await;
    // Made before stores were labelled: no store label, left alone.
    let unlabelled_store = make(&[(LABEL_MANAGER, "mgr-a")]).await;
    let unlabelled = make(&[]).await;

    let report = manager.reconcile().await.unwrap();
    let mut destroyed = report.destroyed.clone();
    destroyed.sort();
    let mut want = vec![orphan.clone(), orphan_slot.clone()];
    want.sort();
    assert_eq!(destroyed, want);
    for id in [&orphan, &orphan_slot] {
        assert_eq!(
            backend.inspect(id).await.unwrap_err().kind(),
            ErrorKind::NotFound
        );
    }
    for id in [
        known.id(),
        &other_manager,
        &other_store,
        &unlabelled_store,
        &unlabelled,
    ] {
        backend.inspect(id).await.unwrap();
    }
    assert!(manager.reconcile().await.unwrap().destroyed.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_blob_and_manifest_leaves_the_previous_snapshot_restorable() {
    let dir = tempfile::tempdir().unwrap();
    let backend = MockBackend::new();
    let fs = FsSnapshotStore::new(dir.path().join("snapshots"));
    let faulty = FaultyStore::new(fs.clone());
    let manager = SandboxManager::builder(backend.clone())
        .data_dir(dir.path())
        .snapshot_store(faulty.clone())
        .build()
        .await
        .unwrap();
    let sandbox = manager.acquire(&key("crashy"), &spec()).await.unwrap();
    sandbox
        .call("write", |b, id| async move {
            b.write(id, &path("state"), "v1".into()).await
        })
        .await
        .unwrap();
    let first = manager.snapshot(&key("crashy")).await.unwrap();
    sandbox
        .call("write", |b, id| async move {
            b.write(id, &path("state"), "v2".into()).await
        })
        .await
        .unwrap();

    faulty.crash_before_manifest.store(true, Ordering::SeqCst);
    let crashed = tokio::spawn({
        let manager = manager.clone();
        async move { manager.snapshot(&key("crashy")).await }
    })
    .await;
    assert!(crashed.unwrap_err().is_panic());
    // The second blob reached the disk; its manifest never did.
    let session_dir = dir.path().join("snapshots/acme/crashy");
    let blobs = std::fs::read_dir(&session_dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".tar.zst")
        })
        .count();
    assert_eq!(blobs, 2);
    drop(manager);

    // The process is gone and so is its sandbox; a new manager restores what it can.
    backend.destroy(sandbox.id()).await.unwrap();
    let second = SandboxManager::builder(backend.clone())
        .data_dir(dir.path())
        .build()
        .await
        .unwrap();
    let listed: Vec<_> = second.snapshots(&key("crashy")).await.unwrap();
    assert_eq!(listed, vec![first.clone()]);
    let back = second.acquire(&key("crashy"), &spec()).await.unwrap();
    assert_eq!(
        back.call(
            "read",
            |b, id| async move { b.read(id, &path("state")).await }
        )
        .await
        .unwrap(),
        "v1"
    );
    // The orphaned blob outlived the default grace period of an hour; with a short
    // one, reconcile deletes it and nothing else.
    let count_blobs = || {
        std::fs::read_dir(&session_dir)
            .unwrap()
            .filter(|e| {
                let name = e.as_ref().unwrap().file_name();
                name.to_string_lossy().ends_with(".tar.zst")
            })
            .count()
    };
    assert_eq!(count_blobs(), 2);
    let third = SandboxManager::builder(backend.clone())
        .data_dir(dir.path())
        .orphan_grace(Duration::from_millis(1))
        .reconcile_on_start(false)
        .build()
        .await
        .unwrap();
    let report = third.reconcile().await.unwrap();
    assert_eq!(report.orphan_blobs_deleted.len(), 1, "{report:?}");
    assert_ne!(report.orphan_blobs_deleted[0].id(), first.id);
    assert_eq!(count_blobs(), 1);
    assert_eq!(third.snapshots(&key("crashy")).await.unwrap(), vec![first]);
}

#[tokio::test(start_paused = true)]
async fn retention_deletes_what_it_should_and_nothing_else() {
    let backend = MockBackend::new();
    let manager = SandboxManager::builder(backend.clone())
        .state_store(InMemoryStateStore::new())
        .snapshot_store(InMemorySnapshotStore::new())
        .retention(
            SnapshotRetention::keep_all()
                .keep_last(2)
                .max_age(Duration::from_secs(3600)),
        )
        .build()
        .await
        .unwrap();
    // `old`: one snapshot, then two hours pass.
    manager.acquire(&key("old"), &spec()).await.unwrap();
    manager.snapshot(&key("old")).await.unwrap();
    tokio::time::advance(Duration::from_secs(7200)).await;
    // `many`: four snapshots ten minutes apart; `one`: a single recent snapshot.
    manager.acquire(&key("many"), &spec()).await.unwrap();
    let mut many = Vec::new();
    for _ in 0..4 {
        many.push(manager.snapshot(&key("many")).await.unwrap().id);
        tokio::time::advance(Duration::from_secs(600)).await;
    }
    manager.acquire(&key("one"), &spec()).await.unwrap();
    let one = manager.snapshot(&key("one")).await.unwrap().id;

    let report = manager.reap_once().await.unwrap();
    let mut deleted: Vec<_> = report
        .snapshots_deleted
        .iter()
        .map(|k| k.to_string())
        .collect();
    deleted.sort();
    assert_eq!(deleted.len(), 3, "{deleted:?}");
    let ids = |k: &str| {
        let manager = manager.clone();
        let k = key(k);
        async move {
            manager
                .snapshots(&k)
                .await
                .unwrap()
                .into_iter()
                .map(|m| m.id)
                .collect::<Vec<_>>()
        }
    };
    assert!(ids("old").await.is_empty(), "older than max_age");
    assert_eq!(ids("many").await, many[2..].to_vec(), "newest two kept");
    assert_eq!(ids("one").await, vec![one]);
    assert!(manager
        .reap_once()
        .await
        .unwrap()
        .snapshots_deleted
        .is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_modes_keep_suspend_destroy_and_purge() {
    let backend = MockBackend::new();
    let manager = memory_manager(&backend).await;
    let sandbox = manager.acquire(&key("s"), &spec()).await.unwrap();
    sandbox
        .call("write", |b, id| async move {
            b.write(id, &path("f"), "1".into()).await
        })
        .await
        .unwrap();

    manager.release(&key("s"), ReleaseMode::Keep).await.unwrap();
    let record = manager.state_store().get(&key("s")).await.unwrap().unwrap();
    assert_eq!(record.status, SandboxStatus::Idle);
    assert_eq!(
        manager.acquire(&key("s"), &spec()).await.unwrap().id(),
        sandbox.id()
    );

    manager
        .release(&key("s"), ReleaseMode::Suspend)
        .await
        .unwrap();
    assert_eq!(backend.live_count(), 0);
    assert_eq!(manager.snapshots(&key("s")).await.unwrap().len(), 1);
    let restored = manager.acquire(&key("s"), &spec()).await.unwrap();
    assert_eq!(
        restored
            .call("read", |b, id| async move { b.read(id, &path("f")).await })
            .await
            .unwrap(),
        "1"
    );

    manager
        .release(&key("s"), ReleaseMode::Destroy)
        .await
        .unwrap();
    assert_eq!(backend.live_count(), 0);
    let record = manager.state_store().get(&key("s")).await.unwrap().unwrap();
    assert_eq!(record.status, SandboxStatus::Terminated);
    assert_eq!(
        manager.snapshots(&key("s")).await.unwrap().len(),
        1,
        "destroy keeps snapshots"
    );

    manager.acquire(&key("s"), &spec()).await.unwrap();
    manager
        .release(&key("s"), ReleaseMode::Purge)
        .await
        .unwrap();
    assert_eq!(backend.live_count(), 0);
    assert!(manager.snapshots(&key("s")).await.unwrap().is_empty());
    assert_eq!(manager.state_store().get(&key("s")).await.unwrap(), None);
    let err = manager
        .release(&key("s"), ReleaseMode::Keep)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    let fresh = manager.acquire(&key("s"), &spec()).await.unwrap();
    assert_eq!(
        fresh
            .call("read", |b, id| async move { b.read(id, &path("f")).await })
            .await
            .unwrap_err()
            .kind(),
        ErrorKind::NotFound
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_swaps_in_an_older_snapshot_and_destroys_the_old_sandbox() {
    let backend = MockBackend::new();
    let manager = memory_manager(&backend).await;
    let sandbox = manager.acquire(&key("r"), &spec()).await.unwrap();
    sandbox
        .call("write", |b, id| async move {
            b.write(id, &path("f"), "v1".into()).await
        })
        .await
        .unwrap();
    let v1 = manager.snapshot(&key("r")).await.unwrap();
    sandbox
        .call("write", |b, id| async move {
            b.write(id, &path("f"), "v2".into()).await
        })
        .await
        .unwrap();
    manager.snapshot(&key("r")).await.unwrap();

    let restored = manager.restore(&key("r"), &v1.id).await.unwrap();
    assert_ne!(restored.id(), sandbox.id());
    assert_eq!(
        restored
            .call("read", |b, id| async move { b.read(id, &path("f")).await })
            .await
            .unwrap(),
        "v1"
    );
    assert_eq!(backend.live_count(), 1);
    assert_eq!(
        sandbox
            .call("read", |b, id| async move { b.read(id, &path("f")).await })
            .await
            .unwrap_err()
            .kind(),
        ErrorKind::NotFound
    );

    let err = manager
        .restore(&key("r"), "no-such-snapshot")
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    assert_eq!(
        restored
            .call("read", |b, id| async move { b.read(id, &path("f")).await })
            .await
            .unwrap(),
        "v1",
        "a failed restore changes nothing"
    );
}

/// A manager over a mock backend with a full warm pool of `size` for `spec()`, and the
/// pooled sandboxes.
async fn pooled_manager(
    size: usize,
) -> (
    MockBackend,
    SandboxManager<MockBackend>,
    HashSet<sandcell::SandboxId>,
) {
    let backend = MockBackend::new();
    let manager = SandboxManager::builder(backend.clone())
        .state_store(InMemoryStateStore::new())
        .snapshot_store(InMemorySnapshotStore::new())
        .warm_pool("default", spec(), size)
        .build()
        .await
        .unwrap();
    // The background filler and this call share the work; together they fill the pool.
    manager.fill_pools().await.unwrap();
    let pooled: HashSet<_> = manager
        .state_store()
        .pool_list()
        .await
        .unwrap()
        .into_iter()
        .filter_map(|e| e.sandbox_id)
        .collect();
    assert_eq!(pooled.len(), size);
    (backend, manager, pooled)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_session_takes_a_warm_pool_sandbox_and_the_pool_refills() {
    let (backend, manager, pooled) = pooled_manager(2).await;
    let sandbox = manager.acquire(&key("warm"), &spec()).await.unwrap();
    assert!(pooled.contains(sandbox.id()), "took a pooled sandbox");
    // A spec no pool serves is created fresh.
    let other = manager
        .acquire(&key("cold"), &spec().env("A", "1"))
        .await
        .unwrap();
    assert!(!pooled.contains(other.id()));
    manager.fill_pools().await.unwrap();
    let ready = manager.state_store().pool_list().await.unwrap();
    assert_eq!(ready.iter().filter(|e| e.sandbox_id.is_some()).count(), 2);
    assert!(manager.reconcile().await.unwrap().destroyed.is_empty());

    let report = manager.shutdown().await;
    assert_eq!(report.pool_destroyed, 2);
    assert_eq!(report.suspended.len(), 2);
    assert_eq!(backend.live_count(), 0);
}

/// A pool sandbox that died while it waited is never handed out, and the session's
/// record names the sandbox the session really got (the record is written while the
/// candidate is checked, so a dead candidate's record must be replaced).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_pool_sandbox_is_skipped_and_the_record_names_the_one_taken() {
    let (backend, manager, pooled) = pooled_manager(2).await;
    // Both die while waiting: the acquire goes through both and creates afresh.
    for id in &pooled {
        backend.destroy(id).await.unwrap();
    }
    let sandbox = manager
        .acquire(&key("after-deaths"), &spec())
        .await
        .unwrap();
    assert!(
        !pooled.contains(sandbox.id()),
        "a dead pool sandbox was handed out"
    );
    let record = manager
        .state_store()
        .get(&key("after-deaths"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.sandbox_id.as_ref(), Some(sandbox.id()));
    assert_eq!(record.status, SandboxStatus::Running);
    let info = backend.inspect(sandbox.id()).await.unwrap();
    assert_eq!(info.status, SandboxStatus::Running);
    manager.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_fills_with_creates_in_parallel_up_to_the_setting() {
    let backend = MockBackend::new().create_delay(Duration::from_millis(20));
    let manager = SandboxManager::builder(backend.clone())
        .state_store(InMemoryStateStore::new())
        .snapshot_store(InMemorySnapshotStore::new())
        .warm_pool("default", spec(), 7)
        .pool_fill_parallelism(3)
        .max_sandboxes_per_tenant(1)
        .build()
        .await
        .unwrap();
    // The background filler and this call take turns; either creates three at once.
    while manager.fill_pools().await.unwrap() > 0 {}
    assert_eq!(backend.most_concurrent_creates(), 3);
    assert_eq!(backend.live_count(), 7, "exactly the pool, never more");
    // A full pool does not lift the tenant limit: one session takes one sandbox.
    let _one = manager.acquire(&key("one"), &spec()).await.unwrap();
    let err = manager.acquire(&key("two"), &spec()).await.err().unwrap();
    assert_eq!(err.kind(), ErrorKind::LimitExceeded, "{err}");
    manager.shutdown().await;
    assert_eq!(backend.live_count(), 0);

    let zero = SandboxManager::builder(MockBackend::new())
        .state_store(InMemoryStateStore::new())
        .snapshot_store(InMemorySnapshotStore::new())
        .pool_fill_parallelism(0)
        .build()
        .await
        .err()
        .unwrap();
    assert_eq!(zero.kind(), ErrorKind::InvalidInput, "{zero}");
}

#[tokio::test(start_paused = true)]
async fn sandboxes_past_their_lifetime_are_snapshotted_and_destroyed() {
    let backend = MockBackend::new();
    let manager = SandboxManager::builder(backend.clone())
        .state_store(InMemoryStateStore::new())
        .snapshot_store(InMemorySnapshotStore::new())
        .max_lifetime(Duration::from_secs(3600))
        .build()
        .await
        .unwrap();
    let sandbox = manager.acquire(&key("old"), &spec()).await.unwrap();
    sandbox
        .call("write", |b, id| async move {
            b.write(id, &path("f"), "kept".into()).await
        })
        .await
        .unwrap();
    for _ in 0..8 {
        tokio::time::advance(Duration::from_secs(500)).await;
        sandbox
            .call("read", |b, id| async move { b.read(id, &path("f")).await })
            .await
            .unwrap();
    }
    let report = manager.reap_once().await.unwrap();
    assert_eq!(
        report.expired,
        vec![key("old")],
        "busy, but past its lifetime"
    );
    assert_eq!(backend.live_count(), 0);
    let back = manager.acquire(&key("old"), &spec()).await.unwrap();
    assert_eq!(
        back.call("read", |b, id| async move { b.read(id, &path("f")).await })
            .await
            .unwrap(),
        "kept"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_sandbox_is_found_by_the_reaper_and_restored_on_acquire() {
    let backend = MockBackend::new();
    let manager = memory_manager(&backend).await;
    let sandbox = manager.acquire(&key("v"), &spec()).await.unwrap();
    sandbox
        .call("write", |b, id| async move {
            b.write(id, &path("f"), "x".into()).await
        })
        .await
        .unwrap();
    manager.snapshot(&key("v")).await.unwrap();
    backend.destroy(sandbox.id()).await.unwrap();
    let report = manager.reap_once().await.unwrap();
    assert_eq!(report.lost, vec![key("v")]);
    let back = manager.acquire(&key("v"), &spec()).await.unwrap();
    assert_eq!(
        back.call("read", |b, id| async move { b.read(id, &path("f")).await })
            .await
            .unwrap(),
        "x"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_suspends_live_sessions_and_refuses_new_work() {
    let backend = MockBackend::new();
    let state = InMemoryStateStore::new();
    let snapshots = InMemorySnapshotStore::new();
    let manager = SandboxManager::builder(backend.clone())
        .state_store(state.clone())
        .snapshot_store(snapshots.clone())
        .reaper_interval(Duration::from_secs(1))
        .build()
        .await
        .unwrap();
    for s in ["a", "b"] {
        let sb = manager.acquire(&key(s), &spec()).await.unwrap();
        sb.call("write", |b, id| async move {
            b.write(id, &path("f"), s.to_owned().into()).await
        })
        .await
        .unwrap();
    }
    let report = manager.shutdown().await;
    assert_eq!(report.suspended, vec![key("a"), key("b")]);
    assert!(report.errors.is_empty());
    assert_eq!(backend.live_count(), 0);
    let err = manager.acquire(&key("a"), &spec()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidState, "{err}");

    let next = SandboxManager::builder(backend.clone())
        .state_store(state)
        .snapshot_store(snapshots)
        .build()
        .await
        .unwrap();
    let a = next.acquire(&key("a"), &spec()).await.unwrap();
    assert_eq!(
        a.call("read", |b, id| async move { b.read(id, &path("f")).await })
            .await
            .unwrap(),
        "a"
    );
}

#[tokio::test]
async fn invalid_settings_fail_at_build() {
    let cases: Vec<(&str, sandcell::ManagerBuilder<MockBackend>)> = vec![
        ("no stores", SandboxManager::builder(MockBackend::new())),
        (
            "zero limit",
            SandboxManager::builder(MockBackend::new())
                .state_store(InMemoryStateStore::new())
                .snapshot_store(InMemorySnapshotStore::new())
                .max_sandboxes_per_tenant(0),
        ),
        (
            "bad manager id",
            SandboxManager::builder(MockBackend::new())
                .state_store(InMemoryStateStore::new())
                .snapshot_store(InMemorySnapshotStore::new())
                .manager_id("a/b"),
        ),
        (
            "duplicate pool",
            SandboxManager::builder(MockBackend::new())
                .state_store(InMemoryStateStore::new())
                .snapshot_store(InMemorySnapshotStore::new())
                .warm_pool("p", spec(), 1)
                .warm_pool("p", spec(), 1),
        ),
    ];
    for (what, builder) in cases {
        let err = builder.build().await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{what}: {err}");
    }
    // The mock supports pause, so the pause strategy builds.
    SandboxManager::builder(MockBackend::new())
        .state_store(InMemoryStateStore::new())
        .snapshot_store(InMemorySnapshotStore::new())
        .suspend_strategy(sandcell::manager::SuspendStrategy::Pause)
        .build()
        .await
        .unwrap();
    let err = memory_manager(&MockBackend::new())
        .await
        .acquire(&key("x"), &SandboxSpec::new("no-such-template"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pause_strategy_freezes_and_acquire_resumes_the_same_sandbox() {
    let backend = MockBackend::new().on_exec("true", |_| sandcell::testing::MockReply::stdout(""));
    let manager = SandboxManager::builder(backend.clone())
        .state_store(InMemoryStateStore::new())
        .snapshot_store(InMemorySnapshotStore::new())
        .suspend_strategy(sandcell::manager::SuspendStrategy::Pause)
        .build()
        .await
        .unwrap();
    let sandbox = manager.acquire(&key("p"), &spec()).await.unwrap();
    manager
        .release(&key("p"), ReleaseMode::Suspend)
        .await
        .unwrap();
    assert_eq!(
        backend.inspect(sandbox.id()).await.unwrap().status,
        SandboxStatus::Paused
    );
    let err = sandbox
        .call("run", |b, id| {
            b.run(id, sandcell::ExecRequest::new(["true"]))
        })
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidState);
    let mut events = manager.subscribe();
    let again = manager.acquire(&key("p"), &spec()).await.unwrap();
    assert_eq!(again.id(), sandbox.id());
    assert_eq!(events.next().await.unwrap().kind, EventKind::Resumed);
    again
        .call("run", |b, id| {
            b.run(id, sandcell::ExecRequest::new(["true"]))
        })
        .await
        .unwrap();
    assert!(manager.snapshots(&key("p")).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unhealthy_sandbox_marks_its_session_failed_and_acquire_restores_it() {
    let backend = MockBackend::new();
    let manager = memory_manager(&backend).await;
    let sandbox = manager.acquire(&key("sick"), &spec()).await.unwrap();
    sandbox
        .call("write", |b, id| async move {
            b.write(id, &path("f"), "saved".into()).await
        })
        .await
        .unwrap();
    manager.snapshot(&key("sick")).await.unwrap();
    backend.mark_failed(sandbox.id()).unwrap();
    let mut events = manager.subscribe();

    let report = manager.reap_once().await.unwrap();
    assert_eq!(report.failed, vec![key("sick")]);
    assert_eq!(events.next().await.unwrap().kind, EventKind::Failed);
    assert_eq!(backend.live_count(), 0, "the broken sandbox is destroyed");
    let record = manager
        .state_store()
        .get(&key("sick"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.status, SandboxStatus::Failed);

    let back = manager.acquire(&key("sick"), &spec()).await.unwrap();
    assert_eq!(
        back.call("read", |b, id| async move { b.read(id, &path("f")).await })
            .await
            .unwrap(),
        "saved"
    );
}

/// Whatever way the manager destroys a sandbox, the records of its background processes
/// (and its services' ports) go with it: release to destroy, purge, and the swap of a
/// live restore all take one path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_destroy_forgets_the_sandboxs_background_processes() {
    let backend = MockBackend::new().on_exec("true", |_| sandcell::testing::MockReply::stdout(""));
    let manager = memory_manager(&backend).await;
    let records = |id: &sandcell::SandboxId| manager.background().list(Some(id)).len();

    // Release to destroy.
    let handle = manager.acquire(&key("destroyed"), &spec()).await.unwrap();
    handle.spawn(ExecRequest::new(["true"])).await.unwrap();
    assert_eq!(records(handle.id()), 1);
    manager
        .release(&key("destroyed"), ReleaseMode::Destroy)
        .await
        .unwrap();
    assert_eq!(records(handle.id()), 0, "destroy forgets them");

    // Purge.
    let handle = manager.acquire(&key("purged"), &spec()).await.unwrap();
    handle.spawn(ExecRequest::new(["true"])).await.unwrap();
    manager
        .release(&key("purged"), ReleaseMode::Purge)
        .await
        .unwrap();
    assert_eq!(records(handle.id()), 0, "purge forgets them");

    // A live restore replaces the sandbox.
    let handle = manager.acquire(&key("restored"), &spec()).await.unwrap();
    let snapshot = manager.snapshot(&key("restored")).await.unwrap();
    handle.spawn(ExecRequest::new(["true"])).await.unwrap();
    let fresh = manager
        .restore(&key("restored"), &snapshot.id)
        .await
        .unwrap();
    assert_ne!(fresh.id(), handle.id());
    assert_eq!(
        records(handle.id()),
        0,
        "the replaced sandbox's records go with it"
    );
    assert!(manager.background().list(None).is_empty());
}

/// A session's handle reads its sandbox's metrics and watches its files, naming the
/// operation and session on an error.
#[tokio::test]
async fn a_handle_reads_metrics_and_watches_files() {
    let backend = MockBackend::new();
    let manager = memory_manager(&backend).await;
    let handle = manager.acquire(&key("observed"), &spec()).await.unwrap();
    let mut events = handle
        .watch(&path(""), sandcell::WatchOptions::new())
        .await
        .unwrap();
    let seen = path("seen.txt");
    handle
        .call("write", |b, id| b.write(id, &seen, "12345".into()))
        .await
        .unwrap();
    let event = events.next().await.unwrap().unwrap();
    assert_eq!(
        (event.kind, event.path.as_str()),
        (sandcell::WatchEventKind::Created, "seen.txt")
    );
    assert_eq!(handle.metrics().await.unwrap().disk_bytes, Some(5));
    let Err(err) = handle
        .watch(&path("missing"), sandcell::WatchOptions::new())
        .await
    else {
        panic!("watching a missing directory succeeded");
    };
    assert_eq!(err.operation(), Some("watch"));
    assert_eq!(err.session(), Some(&key("observed")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_counts_against_the_tenant_limit_and_leaves_nothing_when_refused() {
    let dir = tempfile::tempdir().unwrap();
    let backend = MockBackend::new();
    let manager = SandboxManager::builder(backend.clone())
        .data_dir(dir.path())
        .max_sandboxes_per_tenant(2)
        .build()
        .await
        .unwrap();
    let mut events = manager.subscribe();
    let a = path("a.txt");
    let source = manager.acquire(&key("main"), &spec()).await.unwrap();
    source
        .call("write", |b, id| b.write(id, &a, "one".into()))
        .await
        .unwrap();
    let fork = manager.fork(&key("main"), &key("fork")).await.unwrap();
    assert_eq!(
        &fork.call("read", |b, id| b.read(id, &a)).await.unwrap()[..],
        b"one"
    );
    let record = manager.session(&key("fork")).await.unwrap().unwrap();
    assert_eq!(record.sandbox_id.as_ref(), Some(fork.id()));
    assert_eq!(record.spec.template, "default");
    let info = backend.inspect(fork.id()).await.unwrap();
    assert_eq!(
        info.labels.get(LABEL_SESSION).map(String::as_str),
        Some("fork")
    );
    assert_eq!(
        info.labels.get(LABEL_TENANT).map(String::as_str),
        Some("acme")
    );
    loop {
        let event = events.next().await.unwrap();
        if event.kind == EventKind::Forked {
            assert_eq!(event.session, Some(key("fork")));
            break;
        }
    }

    // The tenant is at its limit of two: a third session by fork is refused, and
    // leaves neither a sandbox nor a record.
    let err = manager
        .fork(&key("main"), &key("third"))
        .await
        .map(|_| ())
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LimitExceeded, "{err}");
    assert_eq!(backend.live_count(), 2);
    assert!(manager.session(&key("third")).await.unwrap().is_none());

    // A suspended session is not overwritten by a fork, and keeps its snapshot.
    manager
        .release(&key("fork"), ReleaseMode::Suspend)
        .await
        .unwrap();
    let err = manager
        .fork(&key("main"), &key("fork"))
        .await
        .map(|_| ())
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::AlreadyExists, "{err}");
    let kept = manager.session(&key("fork")).await.unwrap().unwrap();
    assert!(!kept.holds_sandbox(), "{kept:?}");
    assert_eq!(manager.snapshots(&key("fork")).await.unwrap().len(), 1);

    // Bad sources and targets.
    let err = manager
        .fork(&key("main"), &key("main"))
        .await
        .map(|_| ())
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    let err = manager
        .fork(&key("fork"), &key("other"))
        .await
        .map(|_| ())
        .unwrap_err();
    assert_eq!(
        err.kind(),
        ErrorKind::InvalidState,
        "a suspended source: {err}"
    );
    let err = manager
        .fork(&key("nobody"), &key("other"))
        .await
        .map(|_| ())
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    assert!(manager.session(&key("other")).await.unwrap().is_none());
}
