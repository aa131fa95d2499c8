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

mod acquire;
mod builder;
mod egress;
mod events;
mod fork;
mod handle;
mod maintenance;
mod pools;
mod reconcile;
mod release;
mod settings;
mod snapshots;

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
    check_fence, Claim, ClaimOutcome, SessionKey, SessionRecord, SnapshotKey, SnapshotStore,
    StateStore,
};

/// Label carrying the manager id on every resource a manager creates.
pub const LABEL_MANAGER: &str = "sandcell.manager";
/// Label carrying the instance id of the state store that recorded the sandbox
/// ([`StateStore::instance_id`]): reconcile destroys only sandboxes of its own store.
pub const LABEL_STORE: &str = "sandcell.store";
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
    /// The manager id in force: set, or derived from the store's instance id.
    pub(crate) manager_id: String,
    /// The state store's instance id, labelled on every sandbox this manager creates.
    pub(crate) store_id: String,
    pub(crate) pools: Vec<WarmPool>,
    pub(crate) clock: Clock,
    key_locks: Mutex<HashMap<SessionKey, Weak<tokio::sync::Mutex<()>>>>,
    events: broadcast::Sender<ManagerEvent>,
    /// Last heartbeat written to the store per session (heartbeats are throttled).
    heartbeats: Mutex<HashMap<SessionKey, DateTime<Utc>>>,
    /// When the reaper last swept the snapshot store for orphaned blobs.
    pub(crate) last_sweep: Mutex<Option<DateTime<Utc>>>,
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
    /// The egress counts last reported per sandbox.
    pub(crate) egress_seen: egress::EgressSeen,
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

    /// The manager id in force ([`ManagerSettings::manager_id`], or the default derived
    /// from the state store).
    pub fn manager_id(&self) -> &str {
        &self.inner.manager_id
    }

    /// The state store's instance id ([`StateStore::instance_id`]), which every sandbox
    /// this manager creates carries as [`LABEL_STORE`].
    pub fn store_id(&self) -> &str {
        &self.inner.store_id
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
            let record = inner.take_lease(key).await?;
            let id = live_sandbox(&record)?;
            tracing::Span::current().record("sandbox", id.as_str());
            inner.snapshot_sandbox(&record, &id).await
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

    /// Forks session `source` into the new session `target`: its live sandbox is cloned
    /// ([`SandboxBackend::clone_sandbox`]) and the clone becomes `target`'s sandbox, with
    /// `source`'s spec. Writes to either are not seen by the other.
    ///
    /// `target` counts against its tenant's limit like an acquire (`LimitExceeded`). An
    /// existing `target` (live, or suspended with snapshots) is `AlreadyExists`; a
    /// `source` without a live sandbox is `InvalidState`; a backend without
    /// [`Capabilities::clone`](crate::Capabilities::clone) is `Unsupported`. On any
    /// error nothing is left: no clone, no `target` record.
    ///
    /// ```
    /// # #[cfg(all(feature = "testing", feature = "sqlite"))]
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use sandcell::testing::MockBackend;
    /// use sandcell::{SandboxBackend, SandboxManager, SandboxSpec, SessionKey};
    ///
    /// let dir = tempfile::tempdir()?;
    /// let manager = SandboxManager::builder(MockBackend::new())
    ///     .data_dir(dir.path())
    ///     .build()
    ///     .await?;
    /// let main = SessionKey::new("acme", "main")?;
    /// let sandbox = manager.acquire(&main, &SandboxSpec::new("default")).await?;
    /// let notes = "notes.md".parse()?;
    /// sandbox.call("write", |b, id| b.write(id, &notes, "draft".into())).await?;
    ///
    /// // Try something on a copy; the original is untouched.
    /// let experiment = SessionKey::new("acme", "experiment")?;
    /// let fork = manager.fork(&main, &experiment).await?;
    /// fork.call("write", |b, id| b.write(id, &notes, "rewritten".into())).await?;
    /// assert_eq!(sandbox.call("read", |b, id| b.read(id, &notes)).await?, "draft");
    /// # Ok(()) }
    /// # #[cfg(all(feature = "testing", feature = "sqlite"))]
    /// # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
    /// ```
    pub async fn fork(&self, source: &SessionKey, target: &SessionKey) -> Result<SandboxHandle<B>> {
        let span = tracing::info_span!(
            "sandcell.fork",
            tenant = target.tenant(),
            session = target.session(),
            source = %source,
        );
        let info = self
            .inner
            .fork(source, target)
            .instrument(span)
            .await
            .map_err(|e| e.context(format_args!("forking session {source} into {target}")))?;
        lock(&self.inner.owned).insert(target.clone());
        Ok(SandboxHandle::new(
            Arc::clone(&self.inner),
            target.clone(),
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

    /// The record of `key` under this manager's lease (kept, or taken over from an
    /// expired one): every change a manager makes to a session starts here.
    pub(crate) async fn take_lease(&self, key: &SessionKey) -> Result<SessionRecord> {
        // A session live on another backend is refused before its lease is touched, so
        // the managers of that backend keep theirs.
        if let Some(record) = self.state.get(key).await? {
            self.refuse_elsewhere(&record)?;
        }
        let now = self.clock.now();
        let record = self
            .state
            .take_lease(key, &self.manager_id, now, self.lease_until())
            .await?;
        self.refuse_elsewhere(&record)?;
        Ok(record)
    }

    /// `InvalidState` for a session whose sandbox lives on another backend than this
    /// manager's: only a manager on that backend can reach it. Its record says which; a
    /// session without a live sandbox moves freely (the next acquire restores it here).
    pub(crate) fn refuse_elsewhere(&self, record: &SessionRecord) -> Result<()> {
        if !record.holds_sandbox() || record.backend == self.backend.name() {
            return Ok(());
        }
        Err(self.elsewhere(record))
    }

    /// The error for a session live on another backend.
    pub(crate) fn elsewhere(&self, record: &SessionRecord) -> Error {
        let here = self.backend.name();
        Error::new(
            ErrorKind::InvalidState,
            format!(
                "session {} is live on the {} backend, not {here}; suspend it through a \
                 manager on {} and it is restored on whichever backend acquires it next",
                record.key, record.backend, record.backend
            ),
        )
    }

    /// When a lease taken or renewed now expires.
    pub(crate) fn lease_until(&self) -> DateTime<Utc> {
        self.clock.now() + chrono_duration(self.settings.lease_ttl)
    }

    /// The error for a session another manager holds.
    pub(crate) fn held(&self, record: &SessionRecord) -> Error {
        match &record.lease {
            Some(lease) => crate::store::held_elsewhere(&record.key, lease),
            None => Error::new(
                ErrorKind::Conflict,
                format!("session {} is held elsewhere", record.key),
            ),
        }
    }
}
