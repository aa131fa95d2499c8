//! `SandboxManager`: sessions over a backend — acquire, release, snapshots, reaping,
//! reconcile, warm pools and shutdown.
//!
//! The manager owns what every backend shares, so backends stay thin: a session
//! (`tenant`, `session id`) maps to at most one live sandbox; the state store makes the
//! per-tenant limit atomic across processes; snapshots go to a snapshot store in the
//! portable format of [`crate::snapshot`]; and a new manager on the same stores
//! reconnects to live sandboxes or restores lost ones from their latest snapshot.
//!
//! ```
//! # #[cfg(all(feature = "testing", feature = "sqlite"))]
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use sandcell::testing::MockBackend;
//! use sandcell::{ReleaseMode, SandboxBackend, SandboxManager, SandboxSpec, SessionKey};
//!
//! let dir = tempfile::tempdir()?;
//! let manager = SandboxManager::builder(MockBackend::new())
//!     .data_dir(dir.path())
//!     .max_sandboxes_per_tenant(5)
//!     .build()
//!     .await?;
//! let key = SessionKey::new("acme", "chat-42")?;
//! let sandbox = manager.acquire(&key, &SandboxSpec::new("default")).await?;
//! let notes = "notes.md".parse()?;
//! // Every backend operation goes through `call`: it records the session's activity
//! // and names the operation, sandbox and session on an error.
//! sandbox.call("write", |b, id| b.write(id, &notes, "hello".into())).await?;
//!
//! // Suspend: snapshot, then destroy. The next acquire restores the workspace.
//! manager.release(&key, ReleaseMode::Suspend).await?;
//! let sandbox = manager.acquire(&key, &SandboxSpec::new("default")).await?;
//! assert_eq!(sandbox.call("read", |b, id| b.read(id, &notes)).await?, "hello");
//! manager.release(&key, ReleaseMode::Purge).await?;
//! # Ok(()) }
//! # #[cfg(all(feature = "testing", feature = "sqlite"))]
//! # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
//! ```

mod builder;
mod events;
mod handle;
mod maintenance;
mod settings;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

pub use builder::{ManagerBuilder, WarmPool};
pub use events::{EventKind, EventStream, ManagerEvent};
pub use handle::SandboxHandle;
pub use maintenance::{ReapReport, ReconcileReport, SessionError, ShutdownReport};
pub use settings::{ManagerSettings, ShutdownPolicy, SnapshotRetention, SuspendStrategy};

use crate::archive::ImportOptions;
use crate::backend::SandboxBackend;
use crate::error::{Error, ErrorKind, Result};
use crate::path::SandboxPath;
use crate::sandbox::{SandboxId, SandboxInfo, SandboxStatus};
use crate::snapshot::{PackOptions, SnapshotManifest};
use crate::spec::SandboxSpec;
use crate::store::{
    Claim, ClaimOutcome, SessionKey, SessionRecord, SnapshotKey, SnapshotStore, StateStore,
};

/// Label carrying the manager id on every resource a manager creates.
pub const LABEL_MANAGER: &str = "sandcell.manager";
/// Label carrying the tenant of a session's sandbox.
pub const LABEL_TENANT: &str = "sandcell.tenant";
/// Label carrying the session id of a session's sandbox.
pub const LABEL_SESSION: &str = "sandcell.session";
/// Label carrying the warm pool a pre-created sandbox belongs to.
pub const LABEL_POOL: &str = "sandcell.pool";
/// Label carrying the warm-pool slot of a pre-created sandbox.
pub const LABEL_POOL_SLOT: &str = "sandcell.pool-slot";

/// What [`SandboxManager::release`] does with a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ReleaseMode {
    /// Leave the sandbox running, marked idle; the reaper suspends it after the idle timeout.
    Keep,
    /// Park the session per [`SuspendStrategy`]: snapshot then destroy, or pause.
    Suspend,
    /// Destroy the sandbox, keeping the session's snapshots.
    Destroy,
    /// Destroy the sandbox, delete every snapshot and forget the session.
    Purge,
}

/// Wall-clock time that advances with tokio's clock, so tests with paused time can move
/// the manager through idle timeouts and lifetimes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    base_utc: DateTime<Utc>,
    base: tokio::time::Instant,
}

impl Clock {
    fn new() -> Self {
        Clock {
            base_utc: Utc::now(),
            base: tokio::time::Instant::now(),
        }
    }

    pub(crate) fn now(&self) -> DateTime<Utc> {
        self.base_utc + chrono::Duration::from_std(self.base.elapsed()).unwrap_or_default()
    }
}

fn chrono_duration(d: Duration) -> chrono::Duration {
    chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
}

/// Manages sandboxes per session over one backend. Cheap to clone; clones share state.
///
/// See the [module docs](crate::manager) for an example.
pub struct SandboxManager<B: SandboxBackend> {
    inner: Arc<Inner<B>>,
}

impl<B: SandboxBackend> Clone for SandboxManager<B> {
    fn clone(&self) -> Self {
        SandboxManager {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<B: SandboxBackend> std::fmt::Debug for SandboxManager<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxManager")
            .field("backend", &self.inner.backend.name())
            .field("settings", &self.inner.settings)
            .finish_non_exhaustive()
    }
}

pub(crate) struct Inner<B: SandboxBackend> {
    /// Shared so services can restart their processes from their own tasks.
    pub(crate) backend: Arc<B>,
    pub(crate) state: Arc<dyn StateStore>,
    pub(crate) snapshots: Arc<dyn SnapshotStore>,
    pub(crate) settings: ManagerSettings,
    pub(crate) pools: Vec<WarmPool>,
    pub(crate) clock: Clock,
    key_locks: Mutex<HashMap<SessionKey, Weak<tokio::sync::Mutex<()>>>>,
    events: broadcast::Sender<ManagerEvent>,
    /// Last heartbeat written to the store per session (heartbeats are throttled).
    heartbeats: Mutex<HashMap<SessionKey, DateTime<Utc>>>,
    /// Sessions this manager acquired (what shutdown acts on).
    pub(crate) owned: Mutex<HashSet<SessionKey>>,
    /// Pool slots this manager created.
    pub(crate) own_slots: Mutex<HashSet<String>>,
    pub(crate) cancel: CancellationToken,
    pub(crate) tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    pub(crate) pool_wakeup: Arc<tokio::sync::Notify>,
    /// One pool fill at a time in this process, so concurrent fills do not overshoot.
    pub(crate) fill_lock: tokio::sync::Mutex<()>,
    /// Background processes started through handles; they end with their sandbox.
    pub(crate) background: crate::background::Background,
    /// Services started through handles, with their ports.
    pub(crate) services: crate::services::Services,
}

impl<B: SandboxBackend> Drop for Inner<B> {
    fn drop(&mut self) {
        // Background tasks hold only weak references; this stops them promptly.
        self.cancel.cancel();
    }
}

pub(crate) use crate::lock_unpoisoned as lock;

impl<B: SandboxBackend> SandboxManager<B> {
    /// Starts building a manager over `backend`.
    pub fn builder(backend: B) -> ManagerBuilder<B> {
        ManagerBuilder::new(backend)
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.inner.backend
    }

    /// The background processes started with [`SandboxHandle::spawn`]: attach to them,
    /// write to them, signal them and wait for them by id, from any handle or none.
    pub fn background(&self) -> &crate::background::Background {
        &self.inner.background
    }

    /// The services started with [`SandboxHandle::start_service`]: list and stop them.
    pub fn services(&self) -> &crate::services::Services {
        &self.inner.services
    }

    /// The settings in force.
    pub fn settings(&self) -> &ManagerSettings {
        &self.inner.settings
    }

    /// The state store.
    pub fn state_store(&self) -> &Arc<dyn StateStore> {
        &self.inner.state
    }

    /// The snapshot store.
    pub fn snapshot_store(&self) -> &Arc<dyn SnapshotStore> {
        &self.inner.snapshots
    }

    /// A stream of lifecycle events from now on.
    pub fn subscribe(&self) -> EventStream {
        events::stream(self.inner.events.subscribe())
    }

    /// Returns the session's sandbox: reuses the live one (resuming it if paused), else
    /// restores the latest snapshot into a fresh sandbox, else creates one (from a warm
    /// pool when one matches `spec`).
    ///
    /// `spec` describes a sandbox to create. A live sandbox is reused as it is, and a
    /// restored one starts from the template its snapshot was taken from, whatever
    /// `spec.template` says (the snapshot holds the workspace relative to it).
    ///
    /// Concurrent acquires of one key — in this process or in others sharing the state
    /// store — yield one sandbox. A tenant at its limit gets
    /// [`ErrorKind::LimitExceeded`] with the limit in the message. A snapshot that fails
    /// to restore is an error (nothing is created); restore an older one with
    /// [`restore`](Self::restore) or [`purge`](ReleaseMode::Purge) the session.
    pub async fn acquire(&self, key: &SessionKey, spec: &SandboxSpec) -> Result<SandboxHandle<B>> {
        let span = tracing::info_span!(
            "sandcell.acquire",
            tenant = key.tenant(),
            session = key.session(),
            sandbox = tracing::field::Empty
        );
        let result = self
            .inner
            .acquire(key, spec)
            .instrument(span.clone())
            .await
            .map_err(|e| e.context(format_args!("acquiring session {key}")));
        let info = result?;
        span.record("sandbox", info.id.as_str());
        lock(&self.inner.owned).insert(key.clone());
        Ok(SandboxHandle::new(
            Arc::clone(&self.inner),
            key.clone(),
            info,
        ))
    }

    /// Releases a session; see [`ReleaseMode`]. An unknown session is `NotFound`.
    ///
    /// A failed snapshot during `Suspend` is returned as the error and the sandbox is
    /// kept, so nothing is lost.
    pub async fn release(&self, key: &SessionKey, mode: ReleaseMode) -> Result<()> {
        let span = tracing::info_span!(
            "sandcell.release",
            tenant = key.tenant(),
            session = key.session(),
            mode = ?mode,
            sandbox = tracing::field::Empty
        );
        self.inner
            .release(key, mode)
            .instrument(span)
            .await
            .map_err(|e| e.context(format_args!("releasing session {key}")))
    }

    /// Snapshots the session's live sandbox into the snapshot store and returns the
    /// manifest. A session without a live sandbox is `InvalidState`.
    pub async fn snapshot(&self, key: &SessionKey) -> Result<SnapshotManifest> {
        let span = tracing::info_span!(
            "sandcell.snapshot",
            tenant = key.tenant(),
            session = key.session(),
            sandbox = tracing::field::Empty
        );
        let inner = &self.inner;
        async {
            let _guard = inner.lock_key(key).await;
            let record = inner.record(key).await?;
            let id = live_sandbox(&record)?;
            tracing::Span::current().record("sandbox", id.as_str());
            inner.snapshot_sandbox(key, &id).await
        }
        .instrument(span)
        .await
        .map_err(|e| e.context(format_args!("snapshotting session {key}")))
    }

    /// Replaces the session's workspace with snapshot `snapshot_id`: a fresh sandbox is
    /// created and restored, then swapped in for the old one (which is destroyed). On any
    /// error the session is unchanged.
    pub async fn restore(&self, key: &SessionKey, snapshot_id: &str) -> Result<SandboxHandle<B>> {
        let span = tracing::info_span!(
            "sandcell.restore",
            tenant = key.tenant(),
            session = key.session(),
            snapshot = snapshot_id,
            sandbox = tracing::field::Empty
        );
        let info = self
            .inner
            .restore(key, snapshot_id)
            .instrument(span)
            .await
            .map_err(|e| e.context(format_args!("restoring session {key} to {snapshot_id}")))?;
        lock(&self.inner.owned).insert(key.clone());
        Ok(SandboxHandle::new(
            Arc::clone(&self.inner),
            key.clone(),
            info,
        ))
    }

    /// What the state store knows about one session, or `None` if it was never acquired
    /// (or was purged).
    pub async fn session(&self, key: &SessionKey) -> Result<Option<SessionRecord>> {
        self.inner.state.get(key).await
    }

    /// The session records of `tenant` (or of every tenant), sorted by key.
    pub async fn list(&self, tenant: Option<&str>) -> Result<Vec<SessionRecord>> {
        self.inner.state.list(tenant).await
    }

    /// The stored snapshots of a session, oldest first.
    pub async fn snapshots(&self, key: &SessionKey) -> Result<Vec<SnapshotManifest>> {
        self.inner.snapshots.list(key).await
    }
}

fn live_sandbox(record: &SessionRecord) -> Result<SandboxId> {
    match (&record.sandbox_id, record.is_live()) {
        (Some(id), true) => Ok(id.clone()),
        _ => Err(Error::new(
            ErrorKind::InvalidState,
            format!(
                "session {} has no live sandbox (it is {}); acquire it first",
                record.key, record.status
            ),
        )),
    }
}

impl<B: SandboxBackend> Inner<B> {
    pub(crate) fn emit(&self, event: ManagerEvent) {
        tracing::debug!(kind = %event.kind, session = ?event.session, sandbox = ?event.sandbox_id, "lifecycle event");
        // No subscribers is fine.
        let _ = self.events.send(event);
    }

    pub(crate) fn event(&self, kind: EventKind) -> ManagerEvent {
        ManagerEvent::new(kind, self.clock.now())
    }

    /// Serializes operations on one session within this process.
    pub(crate) async fn lock_key(&self, key: &SessionKey) -> tokio::sync::OwnedMutexGuard<()> {
        self.key_mutex(key).lock_owned().await
    }

    /// Like `lock_key`, but `None` if the session is busy right now.
    pub(crate) fn try_lock_key(
        &self,
        key: &SessionKey,
    ) -> Option<tokio::sync::OwnedMutexGuard<()>> {
        self.key_mutex(key).try_lock_owned().ok()
    }

    fn key_mutex(&self, key: &SessionKey) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = lock(&self.key_locks);
        if let Some(m) = locks.get(key).and_then(Weak::upgrade) {
            return m;
        }
        // Drop entries nobody holds any more, so the map does not grow without bound.
        locks.retain(|_, w| w.strong_count() > 0);
        let m = Arc::new(tokio::sync::Mutex::new(()));
        locks.insert(key.clone(), Arc::downgrade(&m));
        m
    }

    pub(crate) async fn record(&self, key: &SessionKey) -> Result<SessionRecord> {
        self.state
            .get(key)
            .await?
            .ok_or_else(|| Error::not_found(format!("session {key} does not exist")))
    }

    /// The labels every sandbox of `key` carries.
    /// Creates a sandbox: every sandbox the manager makes starts here, so a spec the
    /// backend cannot honour is refused before the backend is called (third-party
    /// backends that forget the check included).
    pub(crate) async fn create_sandbox(&self, spec: &SandboxSpec) -> Result<SandboxInfo> {
        spec.check_supported(&self.backend.capabilities())?;
        self.backend.create(spec).await
    }

    fn session_spec(&self, key: &SessionKey, spec: &SandboxSpec) -> SandboxSpec {
        spec.clone()
            .with_label(LABEL_MANAGER, &self.settings.manager_id)
            .with_label(LABEL_TENANT, key.tenant())
            .with_label(LABEL_SESSION, key.session())
    }

    /// Records activity, writing a heartbeat to the store at most every few seconds.
    pub(crate) async fn touch(&self, key: &SessionKey) {
        let now = self.clock.now();
        let interval = self
            .settings
            .idle_timeout
            .map(|t| (t / 10).min(Duration::from_secs(30)))
            .unwrap_or(Duration::from_secs(30));
        {
            let mut beats = lock(&self.heartbeats);
            if let Some(last) = beats.get(key) {
                if now - *last < chrono_duration(interval) {
                    return;
                }
            }
            beats.insert(key.clone(), now);
        }
        if let Err(e) = self.state.touch(key, now).await {
            // Activity is advisory: a missed heartbeat at worst suspends early, and the
            // suspended session is restored on next use.
            tracing::warn!(session = %key, error = %e, "could not record activity");
        }
    }

    async fn acquire(&self, key: &SessionKey, spec: &SandboxSpec) -> Result<SandboxInfo> {
        spec.validate()?;
        if self.cancel.is_cancelled() {
            return Err(maintenance::shut_down_error());
        }
        let _guard = self.lock_key(key).await;
        let started = tokio::time::Instant::now();
        let mut backoff = Duration::from_millis(20);
        loop {
            match self.state.claim(&self.claim(key, spec)).await? {
                ClaimOutcome::Live(record) => {
                    if let Some(info) = self.reconnect(record).await? {
                        return Ok(info);
                    }
                    // The sandbox was gone; the record now says so. Claim again.
                }
                ClaimOutcome::Busy(_) => {
                    // Another process is provisioning this session: wait for it.
                    if started.elapsed() > self.settings.provision_timeout {
                        return Err(Error::new(
                            ErrorKind::Timeout,
                            "another manager has been provisioning this session for longer than provision_timeout",
                        ));
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
                ClaimOutcome::Claimed(previous) => {
                    return self.provision(key, spec, previous, None).await;
                }
            }
        }
    }

    /// Brings a live record's sandbox back into use. `None` if it turned out to be gone or
    /// broken (the record is updated accordingly).
    async fn reconnect(&self, mut record: SessionRecord) -> Result<Option<SandboxInfo>> {
        let Some(id) = record.sandbox_id.clone() else {
            self.mark_gone(&mut record, EventKind::Lost, "the record had no sandbox id")
                .await?;
            return Ok(None);
        };
        let info = match self.backend.inspect(&id).await {
            Ok(info) => info,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                self.mark_gone(&mut record, EventKind::Lost, "the sandbox no longer exists")
                    .await?;
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        match info.status {
            SandboxStatus::Failed | SandboxStatus::Terminated => {
                self.fail_sandbox(
                    &mut record,
                    &format!("the backend reports it {}", info.status),
                )
                .await?;
                return Ok(None);
            }
            SandboxStatus::Paused => {
                self.backend.resume(&id).await?;
                self.emit(
                    self.event(EventKind::Resumed)
                        .session(&record.key)
                        .sandbox(&id),
                );
            }
            _ => self.emit(
                self.event(EventKind::Reused)
                    .session(&record.key)
                    .sandbox(&id),
            ),
        }
        let now = self.clock.now();
        record.status = SandboxStatus::Running;
        record.last_active = now;
        record.updated_at = now;
        self.state.put(&record).await?;
        let mut info = info;
        info.status = SandboxStatus::Running;
        Ok(Some(info))
    }

    /// Destroys a sandbox: the one way the manager does, so the records of its
    /// background processes and its services' ports always go with it.
    pub(crate) async fn destroy_sandbox(&self, id: &SandboxId) -> Result<()> {
        self.backend.destroy(id).await?;
        self.background.forget_sandbox(id);
        self.services.forget_sandbox(id);
        Ok(())
    }

    /// Records that the session no longer has a sandbox, with its new `status`.
    pub(crate) async fn detach(
        &self,
        record: &mut SessionRecord,
        status: SandboxStatus,
    ) -> Result<()> {
        record.status = status;
        // Its background processes went with the sandbox; drop their records.
        if let Some(id) = record.sandbox_id.take() {
            self.background.forget_sandbox(&id);
            self.services.forget_sandbox(&id);
        }
        record.sandbox_created_at = None;
        record.updated_at = self.clock.now();
        self.state.put(record).await
    }

    /// A claim on `key` for provisioning it from `spec`, under the tenant limit.
    fn claim(&self, key: &SessionKey, spec: &SandboxSpec) -> Claim {
        let now = self.clock.now();
        Claim::new(
            SessionRecord::provisioning(key.clone(), self.backend.name(), spec.clone(), now),
            self.settings.max_sandboxes_per_tenant,
            now - chrono_duration(self.settings.provision_timeout),
        )
    }

    /// The record's sandbox disappeared: the session is suspended if it has a snapshot to
    /// come back from, terminated otherwise.
    pub(crate) async fn mark_gone(
        &self,
        record: &mut SessionRecord,
        kind: EventKind,
        why: &str,
    ) -> Result<()> {
        let has_snapshot = !self.snapshots.list(&record.key).await?.is_empty();
        let mut event = self.event(kind).session(&record.key).detail(why);
        if let Some(id) = &record.sandbox_id {
            event = event.sandbox(id);
        }
        tracing::warn!(session = %record.key, sandbox = ?record.sandbox_id, why, "session lost its sandbox");
        let status = if has_snapshot {
            SandboxStatus::Suspended
        } else {
            SandboxStatus::Terminated
        };
        self.detach(record, status).await?;
        self.emit(event);
        Ok(())
    }

    /// Marks a session failed and destroys its sandbox (its snapshots stay, so the next
    /// acquire restores the latest one).
    pub(crate) async fn fail_sandbox(&self, record: &mut SessionRecord, why: &str) -> Result<()> {
        if let Some(id) = record.sandbox_id.clone() {
            self.destroy_sandbox(&id).await?;
            self.emit(
                self.event(EventKind::Failed)
                    .session(&record.key)
                    .sandbox(&id)
                    .detail(why),
            );
        }
        tracing::warn!(session = %record.key, why, "sandbox failed");
        self.detach(record, SandboxStatus::Failed).await
    }

    /// Provisions a claimed session: restore `snapshot` (or the latest one) into a fresh
    /// sandbox, else take a warm-pool sandbox, else create. On error, the sandbox is
    /// destroyed and the claim rolled back.
    async fn provision(
        &self,
        key: &SessionKey,
        spec: &SandboxSpec,
        previous: Option<SessionRecord>,
        snapshot: Option<SnapshotManifest>,
    ) -> Result<SandboxInfo> {
        let snapshot = match snapshot {
            Some(m) => Some(m),
            None => self.snapshots.list(key).await?.pop(),
        };
        let mut created: Option<SandboxId> = None;
        let session_created_at = previous.as_ref().map(|p| p.created_at);
        let result = self
            .provision_inner(
                key,
                spec,
                snapshot.as_ref(),
                session_created_at,
                &mut created,
            )
            .await;
        match result {
            Ok(info) => Ok(info),
            Err(e) => {
                if let Some(id) = created {
                    if let Err(destroy) = self.destroy_sandbox(&id).await {
                        tracing::error!(sandbox = %id, error = %destroy, "could not destroy a sandbox after a failed acquire; reconcile will");
                    }
                }
                let rollback = match previous {
                    Some(prev) if prev.status != SandboxStatus::Provisioning => {
                        self.state.put(&prev).await
                    }
                    _ => self.state.delete(key).await,
                };
                if let Err(rollback) = rollback {
                    tracing::error!(session = %key, error = %rollback, "could not roll back a claim; it expires after provision_timeout");
                }
                Err(e)
            }
        }
    }

    async fn provision_inner(
        &self,
        key: &SessionKey,
        spec: &SandboxSpec,
        snapshot: Option<&SnapshotManifest>,
        session_created_at: Option<DateTime<Utc>>,
        created: &mut Option<SandboxId>,
    ) -> Result<SandboxInfo> {
        // A snapshot holds the workspace relative to the template it was taken from
        // (incremental snapshots hold only the changes), so that template, not the
        // caller's, is the one the restored sandbox must start from.
        let rebased;
        let spec = match snapshot {
            Some(manifest) if manifest.template != spec.template => {
                tracing::debug!(
                    session = %key,
                    requested = %spec.template,
                    snapshot = %manifest.template,
                    "restoring onto the snapshot's template"
                );
                let mut s = spec.clone();
                s.template = manifest.template.clone();
                rebased = s;
                &rebased
            }
            _ => spec,
        };
        let (info, kind) = match snapshot {
            Some(manifest) => {
                let info = self.create_sandbox(&self.session_spec(key, spec)).await?;
                *created = Some(info.id.clone());
                self.restore_into(key, &info.id, manifest).await?;
                (info, EventKind::Restored)
            }
            None => match self.take_from_pool(spec).await? {
                Some(info) => {
                    *created = Some(info.id.clone());
                    (info, EventKind::Created)
                }
                None => {
                    let info = self.create_sandbox(&self.session_spec(key, spec)).await?;
                    *created = Some(info.id.clone());
                    (info, EventKind::Created)
                }
            },
        };
        let now = self.clock.now();
        let mut record =
            SessionRecord::provisioning(key.clone(), self.backend.name(), spec.clone(), now);
        record.created_at = session_created_at.unwrap_or(now);
        record.status = SandboxStatus::Running;
        record.sandbox_id = Some(info.id.clone());
        record.sandbox_created_at = Some(now);
        self.state.put(&record).await?;
        let mut event = self.event(kind).session(key).sandbox(&info.id);
        if let Some(m) = snapshot {
            event = event.snapshot(&m.id);
        }
        self.emit(event);
        Ok(info)
    }

    async fn restore_into(
        &self,
        key: &SessionKey,
        id: &SandboxId,
        manifest: &SnapshotManifest,
    ) -> Result<()> {
        let snap_key = SnapshotKey::new(key.clone(), manifest.id.clone())?;
        let blob = self.snapshots.blob(&snap_key).await?;
        let reader = crate::stream::stream_to_reader(blob);
        crate::snapshot::restore(
            &self.backend,
            id,
            &SandboxPath::root(),
            reader,
            manifest,
            ImportOptions::default(),
        )
        .await
        .map_err(|e| e.context(format_args!("restoring snapshot {snap_key}")))
    }

    /// Packs the workspace of `id` into the snapshot store: only the changes since the
    /// template where the backend can tell, the whole workspace otherwise.
    pub(crate) async fn snapshot_sandbox(
        &self,
        key: &SessionKey,
        id: &SandboxId,
    ) -> Result<SnapshotManifest> {
        if self.backend.capabilities().files_while_paused
            || self.backend.inspect(id).await?.status != SandboxStatus::Paused
        {
            return self.write_snapshot(key, id).await;
        }
        // This backend reaches files through the sandbox's own processes: thaw it for
        // the export, and leave it paused again whatever the export did.
        self.backend.resume(id).await?;
        let snapshot = self.write_snapshot(key, id).await;
        let paused_again = self.backend.pause(id).await;
        let snapshot = snapshot?;
        paused_again.map(|()| snapshot)
    }

    /// Exports the workspace of `id` and stores it as a new snapshot of `key`.
    async fn write_snapshot(&self, key: &SessionKey, id: &SandboxId) -> Result<SnapshotManifest> {
        let now = self.clock.now();
        let snapshot_id = format!(
            "{}-{}",
            now.format("%Y%m%dT%H%M%S%.6fZ"),
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        let snap_key = SnapshotKey::new(key.clone(), snapshot_id.clone())?;
        let opts = PackOptions {
            level: self.settings.snapshot_level,
            ..PackOptions::default()
        };
        // The one capture path tests and helpers take too.
        let mut capture = crate::snapshot::capture_stream(
            &*self.backend,
            id,
            crate::snapshot::CaptureScope::ChangesOrWorkspace,
            &opts,
        )
        .await?;
        self.snapshots
            .put_blob(&snap_key, capture.take_blob())
            .await?;
        let mut manifest = match capture.finish().await {
            Ok(manifest) => manifest,
            Err(e) => {
                self.discard(&snap_key).await;
                return Err(e);
            }
        };
        manifest.id = snapshot_id.clone();
        manifest.created_at = now;
        if let Err(e) = self.snapshots.put_manifest(&snap_key, &manifest).await {
            self.discard(&snap_key).await;
            return Err(e);
        }
        self.emit(
            self.event(EventKind::Snapshotted)
                .session(key)
                .sandbox(id)
                .snapshot(&snapshot_id),
        );
        Ok(manifest)
    }

    /// Deletes a half-written snapshot (best effort: without a manifest it is invisible).
    async fn discard(&self, key: &SnapshotKey) {
        if let Err(e) = self.snapshots.delete(key).await {
            tracing::warn!(snapshot = %key, error = %e, "could not delete a half-written snapshot");
        }
    }

    /// Snapshot, then destroy; the record becomes `Suspended`. A failed snapshot is
    /// emitted as `SnapshotFailed` and returned, and the sandbox is kept.
    pub(crate) async fn suspend_record(
        &self,
        record: &mut SessionRecord,
        kind: EventKind,
    ) -> Result<()> {
        let id = live_sandbox(record)?;
        let manifest = match self.snapshot_sandbox(&record.key, &id).await {
            Ok(m) => m,
            Err(e) => {
                self.emit(
                    self.event(EventKind::SnapshotFailed)
                        .session(&record.key)
                        .sandbox(&id)
                        .detail(&e),
                );
                return Err(e);
            }
        };
        self.finish_suspend(record, &id, &manifest, kind).await
    }

    /// After a successful snapshot: destroy the sandbox and record the session suspended.
    pub(crate) async fn finish_suspend(
        &self,
        record: &mut SessionRecord,
        id: &SandboxId,
        manifest: &SnapshotManifest,
        kind: EventKind,
    ) -> Result<()> {
        self.destroy_sandbox(id).await?;
        self.detach(record, SandboxStatus::Suspended).await?;
        self.emit(
            self.event(kind)
                .session(&record.key)
                .sandbox(id)
                .snapshot(&manifest.id),
        );
        Ok(())
    }

    async fn release(&self, key: &SessionKey, mode: ReleaseMode) -> Result<()> {
        let _guard = self.lock_key(key).await;
        let mut record = self.record(key).await?;
        if let Some(id) = &record.sandbox_id {
            tracing::Span::current().record("sandbox", id.as_str());
        }
        let live = record.is_live();
        match mode {
            ReleaseMode::Keep => {
                if live && record.status != SandboxStatus::Paused {
                    record.status = SandboxStatus::Idle;
                    record.last_active = self.clock.now();
                    record.updated_at = record.last_active;
                    self.state.put(&record).await?;
                }
            }
            ReleaseMode::Suspend if live => match self.settings.suspend {
                SuspendStrategy::Pause => {
                    let id = live_sandbox(&record)?;
                    self.backend.pause(&id).await?;
                    record.status = SandboxStatus::Paused;
                    record.updated_at = self.clock.now();
                    self.state.put(&record).await?;
                    self.emit(self.event(EventKind::Suspended).session(key).sandbox(&id));
                }
                _ => {
                    self.suspend_record(&mut record, EventKind::Suspended)
                        .await?
                }
            },
            ReleaseMode::Suspend => {}
            ReleaseMode::Destroy => {
                if let Some(id) = record.sandbox_id.clone() {
                    self.destroy_sandbox(&id).await?;
                    self.emit(self.event(EventKind::Destroyed).session(key).sandbox(&id));
                }
                self.detach(&mut record, SandboxStatus::Terminated).await?;
            }
            ReleaseMode::Purge => {
                if let Some(id) = record.sandbox_id.take() {
                    self.destroy_sandbox(&id).await?;
                }
                for manifest in self.snapshots.list(key).await? {
                    self.snapshots
                        .delete(&SnapshotKey::new(key.clone(), manifest.id)?)
                        .await?;
                }
                self.state.delete(key).await?;
                self.emit(self.event(EventKind::Purged).session(key));
            }
        }
        if mode != ReleaseMode::Keep {
            lock(&self.owned).remove(key);
            lock(&self.heartbeats).remove(key);
        }
        Ok(())
    }

    async fn restore(&self, key: &SessionKey, snapshot_id: &str) -> Result<SandboxInfo> {
        let _guard = self.lock_key(key).await;
        let record = self.record(key).await?;
        let manifest = self
            .snapshots
            .manifest(&SnapshotKey::new(key.clone(), snapshot_id)?)
            .await?;
        let live = record.is_live();
        if !live {
            // No sandbox yet: claim a slot under the tenant limit, then provision from
            // this snapshot.
            return match self.state.claim(&self.claim(key, &record.spec)).await? {
                ClaimOutcome::Claimed(previous) => {
                    self.provision(key, &record.spec, previous, Some(manifest))
                        .await
                }
                _ => Err(Error::new(
                    ErrorKind::InvalidState,
                    "the session was acquired concurrently; retry the restore",
                )),
            };
        }
        // Live: restore into a fresh sandbox, then swap it in.
        let fresh = self
            .create_sandbox(&self.session_spec(key, &record.spec))
            .await?;
        tracing::Span::current().record("sandbox", fresh.id.as_str());
        if let Err(e) = self.restore_into(key, &fresh.id, &manifest).await {
            if let Err(d) = self.destroy_sandbox(&fresh.id).await {
                tracing::error!(sandbox = %fresh.id, error = %d, "could not destroy a sandbox after a failed restore; reconcile will");
            }
            return Err(e);
        }
        let old = record.sandbox_id.clone();
        let mut record = record;
        let now = self.clock.now();
        record.status = SandboxStatus::Running;
        record.sandbox_id = Some(fresh.id.clone());
        record.sandbox_created_at = Some(now);
        record.last_active = now;
        record.updated_at = now;
        self.state.put(&record).await?;
        if let Some(old) = old {
            if let Err(e) = self.destroy_sandbox(&old).await {
                tracing::warn!(sandbox = %old, error = %e, "could not destroy the replaced sandbox; reconcile will");
            }
        }
        self.emit(
            self.event(EventKind::Restored)
                .session(key)
                .sandbox(&fresh.id)
                .snapshot(&manifest.id),
        );
        Ok(fresh)
    }
}
