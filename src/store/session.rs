//! Session records and the [`StateStore`] contract (its rules are in `rules`).

use std::fmt;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::sandbox::validate_name;
use crate::sandbox::{SandboxId, SandboxStatus};
use crate::spec::SandboxSpec;
#[cfg(doc)]
use crate::store::{check_fence, decide_claim, decide_lease};
use crate::store::{Claim, ClaimOutcome, Lease};

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
    /// The manager that may change the session, with its fencing token; `None` on a
    /// record no manager has claimed yet (and on records written before leases existed).
    #[serde(default)]
    pub lease: Option<Lease>,
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
            lease: None,
        }
    }

    /// The fencing token of the record's lease; 0 when it has none.
    pub fn token(&self) -> u64 {
        self.lease.as_ref().map_or(0, |l| l.token)
    }

    /// The lease that blocks `owner` at `now`, if any: another manager's unexpired lease
    /// on a session that holds a sandbox. A session without a sandbox blocks nobody.
    pub fn held_against(&self, owner: &str, now: DateTime<Utc>) -> Option<&Lease> {
        self.lease
            .as_ref()
            .filter(|l| self.holds_sandbox() && l.owner != owner && l.expires_at > now)
    }

    /// Whether this status holds a sandbox. A claim still in flight counts against its
    /// tenant's limit only while it is not abandoned: [`counts_against_limit`](Self::counts_against_limit).
    pub fn holds_sandbox(&self) -> bool {
        matches!(
            self.status,
            SandboxStatus::Provisioning
                | SandboxStatus::Running
                | SandboxStatus::Paused
                | SandboxStatus::Idle
        )
    }

    /// Whether the record counts against its tenant's sandbox limit at `now`: it holds a
    /// sandbox, and if it is a claim in flight (`Provisioning`), that claim is not
    /// abandoned: it was written at or after `stale_before` (now less the manager's
    /// provision timeout) and its claimer's lease has not lapsed (a claimer that died
    /// stops renewing it). The one rule claims are decided by ([`decide_claim`]).
    pub fn counts_against_limit(&self, now: DateTime<Utc>, stale_before: DateTime<Utc>) -> bool {
        self.holds_sandbox()
            && (self.status != SandboxStatus::Provisioning
                || (self.updated_at >= stale_before
                    && self.lease.as_ref().is_none_or(|l| l.expires_at > now)))
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

/// Durable session state shared by every manager using the same store.
///
/// # Behavior
/// - `claim` is atomic across every process sharing the store: two claims can never both
///   succeed for one key, nor push a tenant past `tenant_limit`. It decides by
///   [`decide_claim`] and writes the claimer's lease with the outcome.
/// - Leases fence every write ([`Lease`]): `put` and `delete` carry the record's
///   fencing token and change nothing unless the stored record carries the same one
///   ([`check_fence`]; an absent record has token 0), failing with
///   [`ErrorKind::Conflict`](crate::ErrorKind::Conflict) otherwise. `put` never changes
///   the stored lease: `claim`, `take_lease` and `renew_leases` own it.
/// - `take_lease` gives its caller the lease of an existing session by [`decide_lease`]:
///   kept by the same owner, raised to a new token for another owner, refused with
///   `Conflict` naming the owner while another's unexpired lease covers a sandbox.
/// - `renew_leases` moves the expiry of every lease `owner` holds on a session that
///   holds a sandbox, and of no other.
/// - `get` of an unknown key is `None`; `delete` of one is `Ok`.
/// - `list` returns records sorted by key; `list(Some(t))` only tenant `t`'s.
/// - `pool_take` removes and returns one entry of the pool that has a sandbox, or `None`;
///   two takes never return the same entry.
/// - `instance_id` names the store itself: generated once, when the store is first
///   opened, and kept with its data, so every call and every process opening the same
///   store gets the same id, and another store (another file, database or in-memory
///   instance) a different one. It is 1-128 characters from `[A-Za-z0-9_-]`.
#[async_trait]
pub trait StateStore: Send + Sync + 'static {
    /// This store's instance id (see the `# Behavior` list). Managers label every
    /// sandbox they create with it, and reconcile destroys only sandboxes carrying the
    /// id of its own store.
    async fn instance_id(&self) -> Result<String>;

    /// Atomically decides and records a claim on a session: see [`ClaimOutcome`]. A tenant
    /// at its limit is [`ErrorKind::LimitExceeded`](crate::ErrorKind::LimitExceeded) with
    /// the limit in the message, and nothing is written.
    async fn claim(&self, claim: &Claim) -> Result<ClaimOutcome>;

    /// The record of `key`.
    async fn get(&self, key: &SessionKey) -> Result<Option<SessionRecord>>;

    /// Inserts or replaces the record of `record.key`, if the stored record's fencing
    /// token is `record`'s; the stored lease is kept as it is.
    async fn put(&self, record: &SessionRecord) -> Result<()>;

    /// Gives `owner` the lease of the existing session `key`, expiring at `until`, and
    /// returns the record with it; `now` decides whether the current lease expired.
    async fn take_lease(
        &self,
        key: &SessionKey,
        owner: &str,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> Result<SessionRecord>;

    /// Extends to `until` every lease `owner` holds on a live session (one that holds a
    /// sandbox, [`SessionRecord::is_live`]); returns how many.
    ///
    /// A claim still provisioning is not renewed here: its claimer renews it with
    /// [`take_lease`](Self::take_lease) while it works, so a claim whose claimer died
    /// expires with its lease even when a process with the same owner id lives on.
    async fn renew_leases(&self, owner: &str, until: DateTime<Utc>) -> Result<u64>;

    /// Records activity: sets `last_active` (never moving it backwards). Unknown keys are ignored.
    async fn touch(&self, key: &SessionKey, at: DateTime<Utc>) -> Result<()>;

    /// Forgets a session, if the stored record's fencing token is `token`.
    async fn delete(&self, key: &SessionKey, token: u64) -> Result<()>;

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
            async fn instance_id(&self) -> Result<String> {
                (**self).instance_id().await
            }
            async fn claim(&self, claim: &Claim) -> Result<ClaimOutcome> {
                (**self).claim(claim).await
            }
            async fn get(&self, key: &SessionKey) -> Result<Option<SessionRecord>> {
                (**self).get(key).await
            }
            async fn put(&self, record: &SessionRecord) -> Result<()> {
                (**self).put(record).await
            }
            async fn take_lease(
                &self,
                key: &SessionKey,
                owner: &str,
                now: DateTime<Utc>,
                until: DateTime<Utc>,
            ) -> Result<SessionRecord> {
                (**self).take_lease(key, owner, now, until).await
            }
            async fn renew_leases(&self, owner: &str, until: DateTime<Utc>) -> Result<u64> {
                (**self).renew_leases(owner, until).await
            }
            async fn touch(&self, key: &SessionKey, at: DateTime<Utc>) -> Result<()> {
                (**self).touch(key, at).await
            }
            async fn delete(&self, key: &SessionKey, token: u64) -> Result<()> {
                (**self).delete(key, token).await
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
}
