//! Lifecycle events: what the manager did, for metrics and audit logs.

use std::fmt;

use chrono::{DateTime, Utc};
use futures::stream::BoxStream;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

use crate::error::ErrorKind;
use crate::sandbox::SandboxId;
use crate::store::SessionKey;

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum EventKind {
    /// A sandbox was created for a session (fresh, or taken from a warm pool).
    Created,
    /// An acquire found the session's sandbox live and reused it.
    Reused,
    /// A paused sandbox was resumed.
    Resumed,
    /// A snapshot was restored into a fresh sandbox.
    Restored,
    /// A snapshot was stored.
    Snapshotted,
    /// Taking a snapshot failed; the sandbox was kept.
    SnapshotFailed,
    /// A session was suspended (snapshot then destroy, or paused).
    Suspended,
    /// A session's sandbox was destroyed on request.
    Destroyed,
    /// A session and its snapshots were deleted.
    Purged,
    /// The reaper suspended an idle session.
    ReapedIdle,
    /// The reaper destroyed a sandbox past its lifetime.
    ReapedExpired,
    /// A sandbox was found unhealthy; the session is marked failed.
    Failed,
    /// A session's sandbox had disappeared from the backend.
    Lost,
    /// Reconcile destroyed a labelled resource the store did not know.
    OrphanDestroyed,
    /// Retention deleted a snapshot.
    SnapshotDeleted,
    /// A warm-pool sandbox was created.
    PoolFilled,
    /// A session was forked: its sandbox cloned into a new session (the event's).
    Forked,
    /// A session's sandbox made connections through its egress proxy: the event's
    /// `egress` holds the increase per host since the last such event
    /// ([`SandboxManager::report_egress`](crate::SandboxManager::report_egress)).
    Egress,
}

impl EventKind {
    /// The kind as its serialized string.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Created => "created",
            EventKind::Reused => "reused",
            EventKind::Resumed => "resumed",
            EventKind::Restored => "restored",
            EventKind::Snapshotted => "snapshotted",
            EventKind::SnapshotFailed => "snapshot_failed",
            EventKind::Suspended => "suspended",
            EventKind::Destroyed => "destroyed",
            EventKind::Purged => "purged",
            EventKind::ReapedIdle => "reaped_idle",
            EventKind::ReapedExpired => "reaped_expired",
            EventKind::Failed => "failed",
            EventKind::Lost => "lost",
            EventKind::OrphanDestroyed => "orphan_destroyed",
            EventKind::SnapshotDeleted => "snapshot_deleted",
            EventKind::PoolFilled => "pool_filled",
            EventKind::Forked => "forked",
            EventKind::Egress => "egress",
        }
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One lifecycle event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ManagerEvent {
    /// What happened.
    pub kind: EventKind,
    /// The session, if the event concerns one.
    pub session: Option<SessionKey>,
    /// The sandbox, if any.
    pub sandbox_id: Option<SandboxId>,
    /// The snapshot, for snapshot events.
    pub snapshot_id: Option<String>,
    /// Why, for failures and losses: the error's message with its context, or what
    /// the manager found.
    pub detail: Option<String>,
    /// The error's kind, for events an error caused (`SnapshotFailed`), serialized by
    /// [`ErrorKind::name`].
    pub error_kind: Option<ErrorKind>,
    /// For [`EventKind::Egress`]: connections allowed and denied per host since the
    /// session's last egress event.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<crate::egress::EgressCount>,
    /// When (by the manager's clock).
    pub at: DateTime<Utc>,
}

impl ManagerEvent {
    pub(crate) fn new(kind: EventKind, at: DateTime<Utc>) -> Self {
        ManagerEvent {
            kind,
            session: None,
            sandbox_id: None,
            snapshot_id: None,
            detail: None,
            error_kind: None,
            egress: Vec::new(),
            at,
        }
    }

    pub(crate) fn session(mut self, key: &SessionKey) -> Self {
        self.session = Some(key.clone());
        self
    }

    pub(crate) fn sandbox(mut self, id: &SandboxId) -> Self {
        self.sandbox_id = Some(id.clone());
        self
    }

    pub(crate) fn snapshot(mut self, id: &str) -> Self {
        self.snapshot_id = Some(id.to_owned());
        self
    }

    pub(crate) fn egress(mut self, counts: Vec<crate::egress::EgressCount>) -> Self {
        self.egress = counts;
        self
    }

    pub(crate) fn detail(mut self, detail: impl fmt::Display) -> Self {
        self.detail = Some(detail.to_string());
        self
    }

    /// The event was caused by `error`: its kind, and its message with context.
    pub(crate) fn error(mut self, error: &crate::Error) -> Self {
        self.error_kind = Some(error.kind());
        self.detail = Some(format!("{error:#}"));
        self
    }
}

/// A stream of events from [`SandboxManager::subscribe`](crate::SandboxManager::subscribe).
/// A subscriber that falls more than 1024 events behind skips the oldest (logged).
pub type EventStream = BoxStream<'static, ManagerEvent>;

pub(crate) fn stream(rx: broadcast::Receiver<ManagerEvent>) -> EventStream {
    futures::stream::unfold(rx, |mut rx| async move {
        loop {
            match rx.recv().await {
                Ok(event) => return Some((event, rx)),
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    tracing::warn!(skipped = n, "event subscriber fell behind");
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    })
    .boxed()
}
