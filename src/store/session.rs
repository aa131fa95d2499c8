//! Session records and the [`StateStore`] contract, with the claim rule every store shares.

use std::fmt;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::sandbox::validate_name;
use crate::sandbox::{SandboxId, SandboxStatus};
use crate::spec::SandboxSpec;

/// Identifies a session: a tenant and a session id within it.
///
/// Both parts are 1–128 characters from `[A-Za-z0-9._-]`, not starting with `.`, so a key
/// is safe in a label value, a file name and a snapshot key (`{tenant}/{session}/{id}`).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SessionKey {
    tenant: String,
    session: String,
}

impl SessionKey {
    /// Validates and builds a key.
    pub fn new(tenant: impl Into<String>, session: impl Into<String>) -> Result<Self> {
        let (tenant, session) = (tenant.into(), session.into());
        validate_name("tenant", &tenant)?;
        validate_name("session id", &session)?;
        Ok(SessionKey { tenant, session })
    }

    /// The tenant.
    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    /// The session id within the tenant.
    pub fn session(&self) -> &str {
        &self.session
    }
}

impl fmt::Debug for SessionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.tenant, self.session)
    }
}

impl fmt::Display for SessionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.tenant, self.session)
    }
}

/// What the state store knows about one session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SessionRecord {
    /// The session.
    pub key: SessionKey,
    /// Where the session is: `Provisioning`, `Running`, `Paused` and `Idle` hold a sandbox
    /// (and count against the tenant's limit); `Suspended`, `Terminated` and `Failed` do not.
    pub status: SandboxStatus,
    /// The sandbox currently serving the session, if any.
    pub sandbox_id: Option<SandboxId>,
    /// The backend's name.
    pub backend: String,
    /// The spec the session's sandboxes are created from (restores reuse it).
    pub spec: SandboxSpec,
    /// When the session was first acquired.
    pub created_at: DateTime<Utc>,
    /// When the current sandbox was created (for the lifetime limit).
    pub sandbox_created_at: Option<DateTime<Utc>>,
    /// The last recorded activity.
    pub last_active: DateTime<Utc>,
    /// The last change to this record (a fresh `Provisioning` record is an acquire in flight).
    pub updated_at: DateTime<Utc>,
}

impl SessionRecord {
    /// A record for a session being provisioned now.
    pub fn provisioning(
        key: SessionKey,
        backend: impl Into<String>,
        spec: SandboxSpec,
        now: DateTime<Utc>,
    ) -> Self {
        SessionRecord {
            key,
            status: SandboxStatus::Provisioning,
            sandbox_id: None,
            backend: backend.into(),
            spec,
            created_at: now,
            sandbox_created_at: None,
            last_active: now,
            updated_at: now,
        }
    }

    /// Whether this status holds a sandbox (and so counts against the tenant's limit).
    pub fn holds_sandbox(&self) -> bool {
        matches!(
            self.status,
            SandboxStatus::Provisioning
                | SandboxStatus::Running
                | SandboxStatus::Paused
                | SandboxStatus::Idle
        )
    }

    /// Whether the session has a sandbox ready for use: it holds one and is not still
    /// being provisioned.
    pub fn is_live(&self) -> bool {
        self.holds_sandbox() && self.status != SandboxStatus::Provisioning
    }
}

/// A pre-created sandbox waiting in a warm pool (or being created for one).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PoolEntry {
    /// Unique slot id; the sandbox carries it as the `sandcell.pool-slot` label.
    pub slot: String,
    /// The pool (one per warm-pool spec).
    pub pool: String,
    /// The sandbox, once created; `None` while it is being created.
    pub sandbox_id: Option<SandboxId>,
    /// When the slot was opened.
    pub created_at: DateTime<Utc>,
}

impl PoolEntry {
    /// A slot being filled now.
    pub fn new(pool: impl Into<String>, now: DateTime<Utc>) -> Self {
        PoolEntry {
            slot: uuid::Uuid::new_v4().simple().to_string(),
            pool: pool.into(),
            sandbox_id: None,
            created_at: now,
        }
    }
}

/// A request to take a session over for provisioning (see [`StateStore::claim`]).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Claim {
    /// The record to write if the claim succeeds (status `Provisioning`).
    pub record: SessionRecord,
    /// At most this many sessions of the tenant may hold a sandbox.
    pub tenant_limit: Option<u32>,
    /// `Provisioning` records last updated before this are abandoned (their acquirer
    /// died) and neither block the key nor count against the limit.
    pub stale_before: DateTime<Utc>,
}

impl Claim {
    /// A claim for `record`.
    pub fn new(
        record: SessionRecord,
        tenant_limit: Option<u32>,
        stale_before: DateTime<Utc>,
    ) -> Self {
        Claim {
            record,
            tenant_limit,
            stale_before,
        }
    }
}

/// The result of [`StateStore::claim`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ClaimOutcome {
    /// The claim's record was written; the caller provisions the sandbox. Carries the
    /// record it replaced, if any (a suspended session, an abandoned claim).
    Claimed(Option<SessionRecord>),
    /// The session already holds a sandbox; nothing was written.
    Live(SessionRecord),
    /// Another acquirer is provisioning this session right now; nothing was written.
    Busy(SessionRecord),
}

/// The claim rule of [`StateStore::claim`]: decides a claim from the current record of
/// the key (`existing`) and the tenant's records. Every store, this crate's and outside
/// ones, applies it so the rule is written once; a store makes it atomic by reading
/// both and writing the claimed record in one transaction (or under one lock).
///
/// # Errors
/// [`ErrorKind::LimitExceeded`](crate::ErrorKind::LimitExceeded) when the tenant is at
/// its limit.
pub fn decide_claim<'a>(
    claim: &Claim,
    existing: Option<&SessionRecord>,
    tenant_records: impl IntoIterator<Item = &'a SessionRecord>,
) -> Result<ClaimOutcome> {
    let fresh = |r: &SessionRecord| {
        r.status != SandboxStatus::Provisioning || r.updated_at >= claim.stale_before
    };
    if let Some(existing) = existing {
        if existing.holds_sandbox() && fresh(existing) {
            return Ok(if existing.status == SandboxStatus::Provisioning {
                ClaimOutcome::Busy(existing.clone())
            } else {
                ClaimOutcome::Live(existing.clone())
            });
        }
    }
    if let Some(limit) = claim.tenant_limit {
        let held = tenant_records
            .into_iter()
            .filter(|r| r.key != claim.record.key && r.holds_sandbox() && fresh(r))
            .count();
        if held >= limit as usize {
            return Err(Error::limit_exceeded(format!(
                "tenant '{}' already holds {held} sandboxes; its limit is {limit} \
                 (release or suspend a session, or raise max_sandboxes_per_tenant)",
                claim.record.key.tenant()
            )));
        }
    }
    Ok(ClaimOutcome::Claimed(existing.cloned()))
}

/// Durable session state shared by every manager using the same store.
///
/// # Behavior
/// - `claim` is atomic across every process sharing the store: two claims can never both
///   succeed for one key, nor push a tenant past `tenant_limit`.
/// - `put` replaces the record of its key (or inserts it); `get` of an unknown key is `None`.
/// - `delete` is idempotent.
/// - `list` returns records sorted by key; `list(Some(t))` only tenant `t`'s.
/// - `pool_take` removes and returns one entry of the pool that has a sandbox, or `None`;
///   two takes never return the same entry.
#[async_trait]
pub trait StateStore: Send + Sync + 'static {
    /// Atomically decides and records a claim on a session: see [`ClaimOutcome`]. A tenant
    /// at its limit is [`ErrorKind::LimitExceeded`](crate::ErrorKind::LimitExceeded) with
    /// the limit in the message, and nothing is written.
    async fn claim(&self, claim: &Claim) -> Result<ClaimOutcome>;

    /// The record of `key`.
    async fn get(&self, key: &SessionKey) -> Result<Option<SessionRecord>>;

    /// Inserts or replaces the record of `record.key`.
    async fn put(&self, record: &SessionRecord) -> Result<()>;

    /// Records activity: sets `last_active` (never moving it backwards). Unknown keys are ignored.
    async fn touch(&self, key: &SessionKey, at: DateTime<Utc>) -> Result<()>;

    /// Forgets a session.
    async fn delete(&self, key: &SessionKey) -> Result<()>;

    /// Records of one tenant, or of all.
    async fn list(&self, tenant: Option<&str>) -> Result<Vec<SessionRecord>>;

    /// Inserts or replaces a warm-pool entry.
    async fn pool_put(&self, entry: &PoolEntry) -> Result<()>;

    /// Removes and returns one ready entry (with a sandbox) of `pool`, oldest first.
    async fn pool_take(&self, pool: &str) -> Result<Option<PoolEntry>>;

    /// Every pool entry, ready or not.
    async fn pool_list(&self) -> Result<Vec<PoolEntry>>;

    /// Removes a pool entry; idempotent.
    async fn pool_remove(&self, slot: &str) -> Result<()>;
}

macro_rules! forward_state_store {
    ($ty:ty) => {
        #[async_trait]
        impl<T: StateStore + ?Sized> StateStore for $ty {
            async fn claim(&self, claim: &Claim) -> Result<ClaimOutcome> {
                (**self).claim(claim).await
            }
            async fn get(&self, key: &SessionKey) -> Result<Option<SessionRecord>> {
                (**self).get(key).await
            }
            async fn put(&self, record: &SessionRecord) -> Result<()> {
                (**self).put(record).await
            }
            async fn touch(&self, key: &SessionKey, at: DateTime<Utc>) -> Result<()> {
                (**self).touch(key, at).await
            }
            async fn delete(&self, key: &SessionKey) -> Result<()> {
                (**self).delete(key).await
            }
            async fn list(&self, tenant: Option<&str>) -> Result<Vec<SessionRecord>> {
                (**self).list(tenant).await
            }
            async fn pool_put(&self, entry: &PoolEntry) -> Result<()> {
                (**self).pool_put(entry).await
            }
            async fn pool_take(&self, pool: &str) -> Result<Option<PoolEntry>> {
                (**self).pool_take(pool).await
            }
            async fn pool_list(&self) -> Result<Vec<PoolEntry>> {
                (**self).pool_list().await
            }
            async fn pool_remove(&self, slot: &str) -> Result<()> {
                (**self).pool_remove(slot).await
            }
        }
    };
}

forward_state_store!(Box<T>);
forward_state_store!(std::sync::Arc<T>);

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::ErrorKind;

    fn rec(tenant: &str, session: &str, status: SandboxStatus) -> SessionRecord {
        let mut r = SessionRecord::provisioning(
            SessionKey::new(tenant, session).unwrap(),
            "mock",
            SandboxSpec::default(),
            Utc::now(),
        );
        r.status = status;
        r
    }

    #[test]
    fn keys_reject_unsafe_names() {
        for (t, s) in [
            ("", "a"),
            ("a", ""),
            ("a/b", "c"),
            ("a", ".."),
            ("a", "x y"),
        ] {
            assert_eq!(
                SessionKey::new(t, s).unwrap_err().kind(),
                ErrorKind::InvalidInput
            );
        }
        assert_eq!(
            SessionKey::new("acme", "s-1.2_x").unwrap().to_string(),
            "acme/s-1.2_x"
        );
    }

    #[test]
    fn claim_rule() {
        let now = Utc::now();
        let claim = |session: &str, limit| {
            Claim::new(
                rec("t", session, SandboxStatus::Provisioning),
                limit,
                now - chrono::Duration::seconds(60),
            )
        };
        let live = rec("t", "a", SandboxStatus::Running);
        let suspended = rec("t", "b", SandboxStatus::Suspended);
        let all = [live.clone(), suspended.clone()];

        assert!(matches!(
            decide_claim(&claim("a", None), Some(&live), &all).unwrap(),
            ClaimOutcome::Live(_)
        ));
        // Suspended sessions do not count; one live one does.
        assert!(matches!(
            decide_claim(&claim("b", Some(2)), Some(&suspended), &all).unwrap(),
            ClaimOutcome::Claimed(Some(_))
        ));
        let err = decide_claim(&claim("c", Some(1)), None, &all).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::LimitExceeded);
        assert!(err.to_string().contains("limit is 1"), "{err}");

        // A fresh claim in flight blocks the key; an abandoned one is taken over.
        let mut inflight = rec("t", "c", SandboxStatus::Provisioning);
        assert!(matches!(
            decide_claim(&claim("c", None), Some(&inflight), [&inflight]).unwrap(),
            ClaimOutcome::Busy(_)
        ));
        inflight.updated_at = now - chrono::Duration::seconds(120);
        assert!(matches!(
            decide_claim(&claim("c", Some(1)), Some(&inflight), [&inflight, &live])
                .unwrap_err()
                .kind(),
            ErrorKind::LimitExceeded
        ));
        assert!(matches!(
            decide_claim(&claim("c", Some(2)), Some(&inflight), [&inflight, &live]).unwrap(),
            ClaimOutcome::Claimed(Some(_))
        ));
    }
}
