//! Session leases between managers on two "hosts": two MockBackends (each sandbox
//! reachable from one host only) sharing one state store and one snapshot store.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use sandcell::manager::ShutdownPolicy;
use sandcell::snapshot::SnapshotManifest;
use sandcell::store::{
    Claim, ClaimOutcome, InMemorySnapshotStore, SessionKey, SessionRecord, SnapshotKey,
    SnapshotStore, SqliteStateStore, StateStore,
};
use sandcell::testing::MockBackend;
use sandcell::{
    ByteStream, ErrorKind, EventKind, ReleaseMode, Result, SandboxBackend, SandboxManager,
    SandboxSpec, SandboxStatus,
};

const TTL: Duration = Duration::from_millis(600);

struct Hosts {
    _dir: tempfile::TempDir,
    state: SqliteStateStore,
    snapshots: InMemorySnapshotStore,
}

impl Hosts {
    async fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let state = SqliteStateStore::open(dir.path().join("state.db"))
            .await
            .unwrap();
        Hosts {
            _dir: dir,
            state,
            snapshots: InMemorySnapshotStore::new(),
        }
    }

    /// A manager called `id` over its own host's backend.
    async fn manager(&self, id: &str, backend: &MockBackend) -> SandboxManager<MockBackend> {
        self.manager_with(id, backend, self.snapshots.clone()).await
    }

    /// As [`manager`](Self::manager), reaching the shared snapshots through `snapshots`.
    async fn manager_with(
        &self,
        id: &str,
        backend: &MockBackend,
        snapshots: impl SnapshotStore,
    ) -> SandboxManager<MockBackend> {
        SandboxManager::builder(backend.clone())
            .manager_id(id)
            .lease_ttl(TTL)
            .shutdown_policy(ShutdownPolicy::Keep)
            .state_store(self.state.clone())
            .snapshot_store(snapshots)
            .build()
            .await
            .unwrap()
    }

    /// The shared snapshots behind a gate (see [`Gated`]).
    fn gated(&self, gate: &Arc<tokio::sync::Semaphore>, reads: bool) -> Gated {
        Gated {
            inner: self.snapshots.clone(),
            gate: Arc::clone(gate),
            reads,
        }
    }
}

fn key() -> SessionKey {
    SessionKey::new("acme", "chat").unwrap()
}

fn spec() -> SandboxSpec {
    SandboxSpec::new("default")
}

static NOTES: std::sync::LazyLock<sandcell::SandboxPath> =
    std::sync::LazyLock::new(|| "notes.md".parse().unwrap());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_session_is_refused_elsewhere_while_its_owner_renews_its_lease() {
    let hosts = Hosts::new().await;
    let (backend_a, backend_b) = (MockBackend::new(), MockBackend::new());
    let a = hosts.manager("host-a", &backend_a).await;
    let b = hosts.manager("host-b", &backend_b).await;
    a.acquire(&key(), &spec()).await.unwrap();

    // Four lease lifetimes later the owner's renewals still hold it.
    for _ in 0..4 {
        tokio::time::sleep(TTL).await;
        let err = b.acquire(&key(), &spec()).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Conflict, "{err:#}");
        assert!(
            err.to_string().contains("'host-a'"),
            "names the owner: {err}"
        );
        assert!(
            err.to_string().contains(" until "),
            "says until when: {err}"
        );
    }
    // Nothing was duplicated: one sandbox, on host A, and B's reaper and reconcile
    // leave the session alone.
    assert_eq!(backend_b.live_count(), 0);
    b.reap_once().await.unwrap();
    let report = b.reconcile().await.unwrap();
    assert!(report.lost.is_empty(), "{report:?}");
    let record = a.session(&key()).await.unwrap().unwrap();
    assert_eq!(record.status, SandboxStatus::Running);
    assert_eq!(record.lease.unwrap().owner, "host-a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_lease_is_taken_over_from_the_latest_snapshot_and_the_old_owner_is_fenced() {
    let hosts = Hosts::new().await;
    let (backend_a, backend_b) = (MockBackend::new(), MockBackend::new());
    let a = hosts.manager("host-a", &backend_a).await;
    let b = hosts.manager("host-b", &backend_b).await;
    let mut events = b.subscribe();

    let sandbox = a.acquire(&key(), &spec()).await.unwrap();
    sandbox
        .call("write", |be, id| be.write(id, &NOTES, "saved".into()))
        .await
        .unwrap();
    a.snapshot(&key()).await.unwrap();
    sandbox
        .call("write", |be, id| be.write(id, &NOTES, "unsaved".into()))
        .await
        .unwrap();
    let before = a.session(&key()).await.unwrap().unwrap().token();

    // Host A stops renewing (a pause, a partition) but keeps its sandbox.
    a.shutdown().await;
    tokio::time::sleep(TTL + Duration::from_millis(200)).await;

    // Host B takes over: A's sandbox is out of its reach, so the session comes back
    // from its latest snapshot.
    let taken = b.acquire(&key(), &spec()).await.unwrap();
    let content = taken
        .call("read", |be, id| be.read(id, &NOTES))
        .await
        .unwrap();
    assert_eq!(content, "saved");
    let record = b.session(&key()).await.unwrap().unwrap();
    let lease = record.lease.clone().unwrap();
    assert_eq!(lease.owner, "host-b");
    assert!(lease.token > before, "a takeover raises the fencing token");
    assert_eq!(record.sandbox_id.as_ref(), Some(taken.id()));
    let mut kinds = Vec::new();
    while let Ok(Some(event)) =
        tokio::time::timeout(Duration::from_millis(100), events.next()).await
    {
        kinds.push(event.kind);
    }
    assert!(kinds.contains(&EventKind::Lost), "{kinds:?}");
    assert!(kinds.contains(&EventKind::Restored), "{kinds:?}");

    // A wakes up: its late changes are refused and change nothing.
    for err in [
        a.release(&key(), ReleaseMode::Suspend).await.unwrap_err(),
        a.snapshot(&key()).await.unwrap_err(),
        a.release(&key(), ReleaseMode::Purge).await.unwrap_err(),
    ] {
        assert_eq!(err.kind(), ErrorKind::Conflict, "{err:#}");
        assert!(err.to_string().contains("'host-b'"), "{err}");
    }
    assert_eq!(b.session(&key()).await.unwrap().unwrap(), record);
    assert_eq!(b.snapshots(&key()).await.unwrap().len(), 1);

    // A restarted manager on host A finds its old sandbox orphaned and destroys it.
    assert_eq!(backend_a.live_count(), 1);
    let a_again = hosts.manager("host-a", &backend_a).await;
    assert_eq!(backend_a.live_count(), 0, "reconcile at build");
    drop(a_again);
    b.release(&key(), ReleaseMode::Purge).await.unwrap();
    assert!(hosts.state.list(None).await.unwrap().is_empty());
}

/// A snapshot store whose `put_blob` (or, with `reads`, `blob`) waits for a permit: a
/// manager paused mid-snapshot or mid-restore.
#[derive(Clone)]
struct Gated {
    inner: InMemorySnapshotStore,
    gate: Arc<tokio::sync::Semaphore>,
    reads: bool,
}

#[async_trait]
impl SnapshotStore for Gated {
    async fn put_blob(&self, key: &SnapshotKey, blob: ByteStream) -> Result<u64> {
        let _permit = match self.reads {
            false => Some(self.gate.acquire().await.unwrap()),
            true => None,
        };
        self.inner.put_blob(key, blob).await
    }
    async fn put_manifest(&self, key: &SnapshotKey, manifest: &SnapshotManifest) -> Result<()> {
        self.inner.put_manifest(key, manifest).await
    }
    async fn manifest(&self, key: &SnapshotKey) -> Result<SnapshotManifest> {
        self.inner.manifest(key).await
    }
    async fn blob(&self, key: &SnapshotKey) -> Result<ByteStream> {
        let _permit = match self.reads {
            true => Some(self.gate.acquire().await.unwrap()),
            false => None,
        };
        self.inner.blob(key).await
    }
    async fn list(&self, session: &SessionKey) -> Result<Vec<SnapshotManifest>> {
        self.inner.list(session).await
    }
    async fn delete(&self, key: &SnapshotKey) -> Result<()> {
        self.inner.delete(key).await
    }
    async fn sweep_orphans(
        &self,
        before: chrono::DateTime<chrono::Utc>,
    ) -> Result<Vec<SnapshotKey>> {
        self.inner.sweep_orphans(before).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_committed_under_a_lost_lease_is_taken_back() {
    let hosts = Hosts::new().await;
    let (backend_a, backend_b) = (MockBackend::new(), MockBackend::new());
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let a = hosts
        .manager_with("host-a", &backend_a, hosts.gated(&gate, false))
        .await;
    let b = hosts.manager("host-b", &backend_b).await;
    a.acquire(&key(), &spec()).await.unwrap();

    // A starts a snapshot and stalls in the middle; its renewals stop too.
    let pending = tokio::spawn({
        let a = a.clone();
        async move { a.snapshot(&key()).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    a.shutdown().await;
    tokio::time::sleep(TTL + Duration::from_millis(200)).await;
    // B's reaper takes the lease over and finds A's sandbox out of its reach.
    let report = b.reap_once().await.unwrap();
    assert_eq!(report.lost, vec![key()]);

    // A resumes and commits: the snapshot is refused and taken back.
    gate.add_permits(1);
    let err = pending.await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Conflict, "{err:#}");
    assert!(b.snapshots(&key()).await.unwrap().is_empty());
    let record = b.session(&key()).await.unwrap().unwrap();
    assert_eq!(record.lease.unwrap().owner, "host-b");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suspended_session_moves_to_another_host_at_once() {
    let hosts = Hosts::new().await;
    let (backend_a, backend_b) = (MockBackend::new(), MockBackend::new());
    let a = hosts.manager("host-a", &backend_a).await;
    let b = hosts.manager("host-b", &backend_b).await;
    let sandbox = a.acquire(&key(), &spec()).await.unwrap();
    sandbox
        .call("write", |be, id| be.write(id, &NOTES, "moved".into()))
        .await
        .unwrap();
    a.release(&key(), ReleaseMode::Suspend).await.unwrap();
    // No sandbox, no wait: the lease blocks nobody.
    let there = b.acquire(&key(), &spec()).await.unwrap();
    assert_eq!(
        there
            .call("read", |be, id| be.read(id, &NOTES))
            .await
            .unwrap(),
        "moved"
    );
    assert_eq!(backend_a.live_count(), 0);
    assert_eq!(backend_b.live_count(), 1);
}

/// A claim left in flight by a process that died lapses with its lease, even while a
/// restarted process with the same manager id renews that id's leases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_left_by_a_dead_process_lapses_though_its_manager_id_lives_on() {
    let hosts = Hosts::new().await;
    let backend = MockBackend::new();
    let now = chrono::Utc::now();
    let dead = Claim::new(
        SessionRecord::provisioning(key(), backend.name(), spec(), now),
        "host-a",
        now + chrono::Duration::from_std(TTL).unwrap(),
        None,
        now - chrono::Duration::seconds(600),
    );
    assert!(matches!(
        hosts.state.claim(&dead).await.unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
    // The restarted manager's renewals run for several lease lifetimes.
    let a = hosts.manager("host-a", &backend).await;
    tokio::time::sleep(TTL * 3).await;
    let acquired = tokio::time::timeout(Duration::from_secs(10), a.acquire(&key(), &spec()))
        .await
        .expect("the dead claim lapsed: acquire does not wait for provision_timeout");
    acquired.unwrap();
    assert_eq!(backend.live_count(), 1);
}

/// A restore that outlasts the lease keeps its claim: the claimer renews it while it
/// works, so another host waits instead of provisioning the session a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_that_outlasts_its_lease_keeps_its_claim() {
    let hosts = Hosts::new().await;
    let (backend_a, backend_b, backend_c) =
        (MockBackend::new(), MockBackend::new(), MockBackend::new());
    let a = hosts.manager("host-a", &backend_a).await;
    a.acquire(&key(), &spec()).await.unwrap();
    a.release(&key(), ReleaseMode::Suspend).await.unwrap();

    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let c = hosts
        .manager_with("host-c", &backend_c, hosts.gated(&gate, true))
        .await;
    let b = hosts.manager("host-b", &backend_b).await;
    // C claims and stalls reading the snapshot for three lease lifetimes.
    let restoring = tokio::spawn({
        let c = c.clone();
        async move { c.acquire(&key(), &spec()).await.map(drop) }
    });
    tokio::time::sleep(TTL).await;
    let waiting = tokio::spawn({
        let b = b.clone();
        async move { b.acquire(&key(), &spec()).await.map(drop) }
    });
    tokio::time::sleep(TTL * 2).await;
    gate.add_permits(1);
    restoring.await.unwrap().unwrap();
    let err = waiting.await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Conflict, "{err:#}");
    assert!(err.to_string().contains("'host-c'"), "{err}");
    assert_eq!(backend_b.live_count(), 0, "provisioned once");
    assert_eq!(backend_c.live_count(), 1);
}
