//! The manager's housekeeping: reaping, retention, background tasks and shutdown
//! (reconcile and warm pools have files of their own).

use std::collections::HashSet;
use std::sync::{Arc, Weak};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use tracing::Instrument;

use crate::backend::SandboxBackend;
use crate::error::{Error, ErrorKind, Result};
#[cfg(doc)]
use crate::manager::LABEL_STORE;
use crate::manager::{
    chrono_duration, live_sandbox, lock, EventKind, Inner, ReleaseMode, SandboxManager,
    ShutdownPolicy, SnapshotRetention,
};
use crate::sandbox::{SandboxId, SandboxStatus};
use crate::snapshot::SnapshotManifest;
use crate::store::{SessionKey, SessionRecord, SnapshotKey};

/// What one [`reap_once`](SandboxManager::reap_once) pass did.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[non_exhaustive]
pub struct ReapReport {
    /// Idle sessions snapshotted and destroyed.
    pub suspended: Vec<SessionKey>,
    /// Sessions whose sandbox passed its lifetime and was destroyed.
    pub expired: Vec<SessionKey>,
    /// Sessions whose sandbox was unhealthy, now failed.
    pub failed: Vec<SessionKey>,
    /// Sessions whose sandbox had disappeared.
    pub lost: Vec<SessionKey>,
    /// Sessions due for suspension whose snapshot failed, each with its error; their
    /// sandboxes were kept.
    pub snapshot_failures: Vec<SessionError>,
    /// Snapshots deleted by retention.
    pub snapshots_deleted: Vec<SnapshotKey>,
    /// Snapshot blobs without a manifest, older than `orphan_grace`, deleted (the
    /// reaper sweeps at most once per `orphan_grace`).
    pub orphan_blobs_deleted: Vec<SnapshotKey>,
    /// Other failures; the pass went on past them.
    pub errors: Vec<SessionError>,
}

/// One session's failure in a maintenance pass, kept as data: which session, the
/// error's kind (serialized by [`ErrorKind::name`]) and its message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct SessionError {
    /// The session the failure was for.
    pub session: SessionKey,
    /// What went wrong, as a matchable kind.
    pub kind: ErrorKind,
    /// The error's message, with its context.
    pub message: String,
}

impl SessionError {
    pub(crate) fn new(session: &SessionKey, error: &crate::Error) -> Self {
        SessionError {
            session: session.clone(),
            kind: error.kind(),
            message: format!("{error:#}"),
        }
    }
}

impl std::fmt::Display for SessionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.session, self.message)
    }
}

/// What [`reconcile`](SandboxManager::reconcile) did.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[non_exhaustive]
pub struct ReconcileReport {
    /// Resources with this manager's and this store's labels that the store did not
    /// know, destroyed.
    pub destroyed: Vec<SandboxId>,
    /// Sessions whose sandbox was gone from the backend, marked accordingly.
    pub lost: Vec<SessionKey>,
    /// Warm-pool entries whose sandbox was gone (or never created), removed.
    pub pool_entries_removed: usize,
    /// Snapshot blobs without a manifest, older than `orphan_grace`, deleted.
    pub orphan_blobs_deleted: Vec<SnapshotKey>,
}

/// What [`shutdown`](SandboxManager::shutdown) did with this manager's sessions.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[non_exhaustive]
pub struct ShutdownReport {
    /// Sessions suspended.
    pub suspended: Vec<SessionKey>,
    /// Sessions destroyed.
    pub destroyed: Vec<SessionKey>,
    /// Sessions left running.
    pub kept: Vec<SessionKey>,
    /// Warm-pool sandboxes of this manager destroyed.
    pub pool_destroyed: usize,
    /// Sessions that could not be handled, with why; their sandboxes were kept.
    pub errors: Vec<SessionError>,
}

/// The snapshots `retention` deletes from one session's list (oldest first).
pub(crate) fn expired_snapshots<'a>(
    manifests: &'a [SnapshotManifest],
    retention: &SnapshotRetention,
    now: DateTime<Utc>,
) -> Vec<&'a SnapshotManifest> {
    let n = manifests.len();
    manifests
        .iter()
        .enumerate()
        .filter(|(i, m)| {
            let beyond_count = retention.keep_last.is_some_and(|k| i + k < n);
            let too_old = retention
                .max_age
                .is_some_and(|age| m.created_at + chrono_duration(age) < now);
            beyond_count || too_old
        })
        .map(|(_, m)| m)
        .collect()
}

impl<B: SandboxBackend> SandboxManager<B> {
    /// One reaper pass, for callers with their own scheduler:
    /// - a sandbox gone from the backend marks its session lost (restorable if it has a
    ///   snapshot); an unhealthy one (`Failed`) is destroyed and its session marked failed;
    /// - past `max_lifetime`: snapshot (per `snapshot_on_expiry`), then destroy;
    /// - idle past `idle_timeout`: snapshot, then destroy.
    ///
    /// A failed snapshot is logged, reported and emitted as
    /// [`EventKind::SnapshotFailed`]; the sandbox is kept for the next pass. Then
    /// snapshots past retention are deleted, and (at most once per `orphan_grace`)
    /// snapshot blobs no manifest references that are older than `orphan_grace`.
    /// Sessions busy in this process, and sessions another manager holds the lease of,
    /// are skipped; a session whose holder's lease expired is taken over.
    pub async fn reap_once(&self) -> Result<ReapReport> {
        self.inner
            .reap_once()
            .instrument(tracing::info_span!("sandcell.reap"))
            .await
    }

    /// Destroys resources labelled with this manager's id and its state store's
    /// instance id ([`LABEL_STORE`]) that the state store
    /// does not know (orphans of a crash), marks records whose sandbox is gone (unless
    /// another manager holds their lease), and deletes snapshot blobs no manifest
    /// references that are older than `orphan_grace`. Resources without both labels —
    /// another program's on the same backend, with a store of its own — are never
    /// touched. Runs at `build` unless disabled.
    pub async fn reconcile(&self) -> Result<ReconcileReport> {
        self.inner
            .reconcile()
            .instrument(tracing::info_span!("sandcell.reconcile"))
            .await
    }

    /// Creates warm-pool sandboxes until every pool is full, up to
    /// [`pool_fill_parallelism`](crate::ManagerSettings::pool_fill_parallelism) at once;
    /// returns how many it created. The background filler calls this too. Fills in one
    /// process are serialized; managers in several processes sharing a store may
    /// together overshoot a pool's size by one fill each.
    pub async fn fill_pools(&self) -> Result<usize> {
        self.inner
            .fill_pools()
            .instrument(tracing::info_span!("sandcell.fill_pools"))
            .await
    }

    /// Stops the background tasks, then applies the [`ShutdownPolicy`] to the sessions
    /// this manager acquired; with `Suspend` or `Destroy`, also destroys the warm-pool
    /// sandboxes it created. Afterwards `acquire` fails with `InvalidState`.
    pub async fn shutdown(&self) -> ShutdownReport {
        self.inner
            .shutdown()
            .instrument(tracing::info_span!("sandcell.shutdown"))
            .await
    }

    pub(crate) fn start_background_tasks(&self) {
        let weak = Arc::downgrade(&self.inner);
        let cancel = self.inner.cancel.clone();
        let mut tasks = lock(&self.inner.tasks);
        if let Some(interval) = self.inner.settings.reaper_interval {
            tasks.push(tokio::spawn(every(
                weak.clone(),
                cancel.clone(),
                interval,
                "reaper pass",
                |inner| async move {
                    let pass = inner.reap_once();
                    pass.instrument(tracing::info_span!("sandcell.reap"))
                        .await?;
                    inner.report_egress().await.map(drop)
                },
            )));
        }
        // Leases last three intervals: one missed renewal loses nothing.
        tasks.push(tokio::spawn(every(
            weak.clone(),
            cancel.clone(),
            (self.inner.settings.lease_ttl / 3).max(Duration::from_millis(1)),
            "renewing session leases",
            |inner| async move { inner.renew_leases().await.map(drop) },
        )));
        if !self.inner.pools.is_empty() {
            let wakeup = Arc::clone(&self.inner.pool_wakeup);
            tasks.push(tokio::spawn(pool_loop(weak, cancel, wakeup)));
        }
    }
}

/// Runs `pass` every `interval` until `cancel` or until the manager is dropped: it is
/// held only during a pass. A failed pass is logged as `what` and tried again next tick.
async fn every<B, F, Fut>(
    inner: Weak<Inner<B>>,
    cancel: tokio_util::sync::CancellationToken,
    interval: Duration,
    what: &'static str,
    pass: F,
) where
    B: SandboxBackend,
    F: Fn(Arc<Inner<B>>) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = ticker.tick() => {}
        }
        let Some(inner) = inner.upgrade() else { return };
        tokio::select! {
            _ = cancel.cancelled() => return,
            result = pass(inner) => if let Err(e) = result {
                tracing::warn!(error = %e, "{what} failed; retrying next interval");
            }
        }
    }
}

async fn pool_loop<B: SandboxBackend>(
    inner: Weak<Inner<B>>,
    cancel: tokio_util::sync::CancellationToken,
    wakeup: Arc<tokio::sync::Notify>,
) {
    loop {
        let Some(strong) = inner.upgrade() else {
            return;
        };
        let fill = strong
            .fill_pools()
            .instrument(tracing::info_span!("sandcell.fill_pools"));
        let failed = tokio::select! {
            _ = cancel.cancelled() => return,
            result = fill => match result {
                Ok(_) => false,
                Err(e) => {
                    tracing::warn!(error = %e, "warm pool refill failed; retrying");
                    true
                }
            }
        };
        drop(strong);
        let pause = if failed {
            Duration::from_secs(5)
        } else {
            Duration::from_secs(60)
        };
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = wakeup.notified() => {}
            _ = tokio::time::sleep(pause) => {}
        }
    }
}

impl<B: SandboxBackend> Inner<B> {
    pub(crate) async fn reap_once(&self) -> Result<ReapReport> {
        let mut report = ReapReport::default();
        let records = self.state.list(None).await?;
        let now = self.clock.now();
        for record in &records {
            if record.backend != self.backend.name() || !record.is_live() {
                continue;
            }
            // Another manager holds it: that manager's reaper looks after it.
            if record.held_against(&self.manager_id, now).is_some() {
                continue;
            }
            let key = &record.key;
            // A session in use in this process is not idle; look again next pass.
            let Some(_guard) = self.try_lock_key(key) else {
                continue;
            };
            let Some(mut record) = self.leased_for_maintenance(key).await? else {
                continue;
            };
            if !record.is_live() {
                continue;
            }
            if let Err(e) = self.reap_session(&mut record, &mut report).await {
                tracing::warn!(session = %key, error = %e, "reaping a session failed");
                report.errors.push(SessionError::new(key, &e));
            }
        }
        let now = self.clock.now();
        let grace = chrono_duration(self.settings.orphan_grace);
        let due = lock(&self.last_sweep).is_none_or(|last| last + grace <= now);
        if due {
            match self.sweep_orphans().await {
                Ok(swept) => report.orphan_blobs_deleted = swept,
                Err(e) => tracing::warn!(error = %e, "sweeping orphaned snapshot blobs failed"),
            }
        }
        for record in &records {
            let manifests = match self.snapshots.list(&record.key).await {
                Ok(m) => m,
                Err(e) => {
                    report.errors.push(SessionError::new(&record.key, &e));
                    continue;
                }
            };
            for manifest in expired_snapshots(&manifests, &self.settings.retention, now) {
                let key = SnapshotKey::new(record.key.clone(), manifest.id.clone())?;
                match self.snapshots.delete(&key).await {
                    Ok(()) => {
                        self.emit(
                            self.event(EventKind::SnapshotDeleted)
                                .session(&record.key)
                                .snapshot(&manifest.id),
                        );
                        report.snapshots_deleted.push(key);
                    }
                    Err(e) => report.errors.push(SessionError::new(
                        &record.key,
                        &e.context(format_args!("deleting snapshot {}", key.id())),
                    )),
                }
            }
        }
        Ok(report)
    }

    async fn reap_session(
        &self,
        record: &mut SessionRecord,
        report: &mut ReapReport,
    ) -> Result<()> {
        let id = live_sandbox(record)?;
        let key = record.key.clone();
        match self.backend.inspect(&id).await {
            Ok(info)
                if matches!(
                    info.status,
                    SandboxStatus::Failed | SandboxStatus::Terminated
                ) =>
            {
                self.fail_sandbox(record, &format!("the backend reports it {}", info.status))
                    .await?;
                report.failed.push(key);
                return Ok(());
            }
            Ok(_) => {
                // Seed 000's rule: a service that died for good fails its sandbox.
                if let Some(service) = self.services.unhealthy(&id).first() {
                    self.fail_sandbox(
                        record,
                        &format!("service {:?} ended and may not restart", service.name),
                    )
                    .await?;
                    report.failed.push(key);
                    return Ok(());
                }
            }
            Err(e) if e.kind() == ErrorKind::NotFound => {
                self.mark_gone(record, EventKind::Lost, "the sandbox no longer exists")
                    .await?;
                report.lost.push(key);
                return Ok(());
            }
            Err(e) => return Err(e),
        }
        let now = self.clock.now();
        let expired = match (self.settings.max_lifetime, record.sandbox_created_at) {
            (Some(max), Some(born)) => born + chrono_duration(max) <= now,
            _ => false,
        };
        let idle = self
            .settings
            .idle_timeout
            .is_some_and(|t| record.last_active + chrono_duration(t) <= now);
        if expired && !self.settings.snapshot_on_expiry {
            self.destroy_sandbox(&id).await?;
            self.detach(record, SandboxStatus::Terminated).await?;
            self.emit(
                self.event(EventKind::ReapedExpired)
                    .session(&key)
                    .sandbox(&id),
            );
            report.expired.push(key);
        } else if expired || idle {
            let kind = if expired {
                EventKind::ReapedExpired
            } else {
                EventKind::ReapedIdle
            };
            match self.snapshot_sandbox(record, &id).await {
                Ok(manifest) => {
                    self.finish_suspend(record, &id, &manifest, kind).await?;
                    if expired {
                        report.expired.push(key);
                    } else {
                        report.suspended.push(key);
                    }
                }
                Err(e) => {
                    // Never destroy what could not be saved: keep it for the next pass.
                    tracing::warn!(session = %key, sandbox = %id, error = %e, "snapshot failed; keeping the sandbox");
                    self.emit(
                        self.event(EventKind::SnapshotFailed)
                            .session(&key)
                            .sandbox(&id)
                            .error(&e),
                    );
                    report.snapshot_failures.push(SessionError::new(&key, &e));
                }
            }
        }
        Ok(())
    }

    /// The record of `key` for a maintenance pass to act on under this manager's lease:
    /// read as it is while the lease is this manager's, taken over once expired; `None`
    /// if the session is gone or another manager holds it.
    pub(super) async fn leased_for_maintenance(
        &self,
        key: &SessionKey,
    ) -> Result<Option<SessionRecord>> {
        let Some(record) = self.state.get(key).await? else {
            return Ok(None);
        };
        let now = self.clock.now();
        let mine = record
            .lease
            .as_ref()
            .is_some_and(|l| l.owner == self.manager_id && l.expires_at > now);
        if mine {
            return Ok(Some(record));
        }
        match self.take_lease(key).await {
            Ok(record) => Ok(Some(record)),
            Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::Conflict) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Deletes snapshot blobs that no manifest references, older than `orphan_grace`.
    pub(super) async fn sweep_orphans(&self) -> Result<Vec<SnapshotKey>> {
        let now = self.clock.now();
        let swept = self
            .snapshots
            .sweep_orphans(now - chrono_duration(self.settings.orphan_grace))
            .await?;
        *lock(&self.last_sweep) = Some(now);
        for key in &swept {
            tracing::info!(snapshot = %key, "deleted an orphaned snapshot blob");
        }
        Ok(swept)
    }

    /// Extends every lease this manager holds; the background renewer calls this every
    /// third of `lease_ttl`.
    pub(crate) async fn renew_leases(&self) -> Result<u64> {
        self.state
            .renew_leases(&self.manager_id, self.lease_until())
            .await
    }

    pub(crate) async fn shutdown(&self) -> ShutdownReport {
        self.cancel.cancel();
        let tasks: Vec<_> = lock(&self.tasks).drain(..).collect();
        for task in tasks {
            let _ = task.await;
        }
        let mut report = ShutdownReport::default();
        let mut keys: Vec<_> = lock(&self.owned).drain().collect();
        keys.sort();
        let policy = self.settings.shutdown;
        for key in keys {
            let mode = match policy {
                ShutdownPolicy::Keep => {
                    report.kept.push(key);
                    continue;
                }
                ShutdownPolicy::Destroy => ReleaseMode::Destroy,
                _ => ReleaseMode::Suspend,
            };
            match self.release(&key, mode).await {
                Ok(()) if mode == ReleaseMode::Destroy => report.destroyed.push(key),
                Ok(()) => report.suspended.push(key),
                // Gone, or taken over by another manager: not this one's to shut down.
                Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::Conflict) => {}
                Err(e) => {
                    tracing::error!(session = %key, error = %e, "could not shut down a session; its sandbox was kept");
                    report.errors.push(SessionError::new(&key, &e));
                }
            }
        }
        if policy != ShutdownPolicy::Keep {
            let slots: HashSet<String> = lock(&self.own_slots).drain().collect();
            match self.state.pool_list().await {
                Ok(entries) => {
                    for entry in entries.into_iter().filter(|e| slots.contains(&e.slot)) {
                        if let Some(id) = &entry.sandbox_id {
                            if let Err(e) = self.destroy_sandbox(id).await {
                                tracing::warn!(sandbox = %id, error = %e, "could not destroy a warm-pool sandbox");
                                continue;
                            }
                            report.pool_destroyed += 1;
                        }
                        if let Err(e) = self.state.pool_remove(&entry.slot).await {
                            tracing::warn!(slot = %entry.slot, error = %e, "could not remove a pool entry");
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "could not list warm-pool entries at shutdown")
                }
            }
        }
        report
    }
}

pub(crate) fn shut_down_error() -> Error {
    Error::new(ErrorKind::InvalidState, "the manager has been shut down")
}
