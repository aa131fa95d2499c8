//! The rules every [`StateStore`] applies, written once: leases and fencing (who may
//! change a session) and claims (who provisions it, under the tenant's limit).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

#[cfg(doc)]
use super::StateStore;
use super::{SessionKey, SessionRecord};
use crate::error::{Error, ErrorKind, Result};
use crate::sandbox::SandboxStatus;

/// Who may change a session, and until when.
///
/// A manager holds the lease of every session whose sandbox it runs, renewing it while
/// it lives ([`StateStore::renew_leases`]). Another manager may take a lease over once it
/// has expired (or at once, on a session that holds no sandbox); each change of owner
/// raises the fencing `token`, and the store refuses any write that carries an older
/// token, so a manager that paused, crashed or lost its network past its lease can no
/// longer change the session. Managers sharing a manager id are one owner.
///
/// Expiry compares timestamps written by different hosts: their clocks must agree to
/// well within the lease's time to live.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Lease {
    /// The manager id of the owner.
    pub owner: String,
    /// The fencing token: raised every time the session changes owner.
    pub token: u64,
    /// When the lease lapses unless renewed.
    pub expires_at: DateTime<Utc>,
}

impl Lease {
    /// A lease of `owner` with `token`, until `expires_at`.
    /// `expires_at` is kept to the microsecond, as every store keeps it.
    pub fn new(owner: impl Into<String>, token: u64, expires_at: DateTime<Utc>) -> Self {
        use chrono::SubsecRound;
        Lease {
            owner: owner.into(),
            token,
            expires_at: expires_at.trunc_subsecs(6),
        }
    }

    /// The lease `owner` holds after taking the session from `current`: the same owner
    /// keeps its token, a new one raises it.
    pub fn next(current: Option<&Lease>, owner: &str, expires_at: DateTime<Utc>) -> Lease {
        let token = match current {
            Some(l) if l.owner == owner => l.token,
            Some(l) => l.token + 1,
            None => 1,
        };
        Lease::new(owner, token, expires_at)
    }
}

/// The error for a session whose lease another manager holds.
pub fn held_elsewhere(key: &SessionKey, lease: &Lease) -> Error {
    Error::new(
        ErrorKind::Conflict,
        format!(
            "session {key} is held by manager '{}' until {} (its lease); it is used there \
             and is taken over only once that lease expires",
            lease.owner,
            lease
                .expires_at
                .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
        ),
    )
}

/// The fencing rule of [`StateStore::put`] and [`StateStore::delete`]: a write carrying
/// `token` may replace `stored` only if `stored` (absent: token 0) carries the same
/// token. Every store applies it in the transaction (or statement) that writes.
///
/// # Errors
/// [`ErrorKind::Conflict`] naming the current owner.
pub fn check_fence(key: &SessionKey, stored: Option<&SessionRecord>, token: u64) -> Result<()> {
    let current = stored.map_or(0, SessionRecord::token);
    if current == token {
        return Ok(());
    }
    let owner = stored.and_then(|r| r.lease.as_ref()).map_or_else(
        || "nobody (it was deleted)".to_owned(),
        |l| format!("manager '{}'", l.owner),
    );
    Err(Error::new(
        ErrorKind::Conflict,
        format!(
            "session {key} changed hands: it is now held by {owner} with fencing token \
             {current}, and this write carried token {token}; it was refused"
        ),
    ))
}

/// The rule of [`StateStore::take_lease`]: the record of `existing` with `owner`'s lease.
///
/// # Errors
/// `NotFound` for no record; [`ErrorKind::Conflict`] naming the owner when another
/// manager's unexpired lease covers a session that holds a sandbox.
pub fn decide_lease(
    key: &SessionKey,
    existing: Option<&SessionRecord>,
    owner: &str,
    now: DateTime<Utc>,
    until: DateTime<Utc>,
) -> Result<SessionRecord> {
    let existing =
        existing.ok_or_else(|| Error::not_found(format!("session {key} does not exist")))?;
    if let Some(lease) = existing.held_against(owner, now) {
        return Err(held_elsewhere(key, lease));
    }
    let mut record = existing.clone();
    record.lease = Some(Lease::next(existing.lease.as_ref(), owner, until));
    Ok(record)
}

/// A request to take a session over for provisioning (see [`StateStore::claim`]).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Claim {
    /// The record to write if the claim succeeds (status `Provisioning`); its
    /// `updated_at` is the claim's "now" for lease expiry.
    pub record: SessionRecord,
    /// The manager claiming: it gets the session's lease.
    pub owner: String,
    /// When the lease it gets expires unless renewed.
    pub lease_until: DateTime<Utc>,
    /// At most this many sessions of the tenant may hold a sandbox.
    pub tenant_limit: Option<u32>,
    /// `Provisioning` records last updated before this are abandoned (their acquirer
    /// died) and neither block the key nor count against the limit; so are those whose
    /// claimer's lease has expired.
    pub stale_before: DateTime<Utc>,
}

impl Claim {
    /// A claim for `record` by manager `owner`, whose lease lasts until `lease_until`.
    pub fn new(
        record: SessionRecord,
        owner: impl Into<String>,
        lease_until: DateTime<Utc>,
        tenant_limit: Option<u32>,
        stale_before: DateTime<Utc>,
    ) -> Self {
        Claim {
            record,
            owner: owner.into(),
            lease_until,
            tenant_limit,
            stale_before,
        }
    }
}

/// The result of [`StateStore::claim`].
// A short-lived return value, matched at once: boxing would only cost an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ClaimOutcome {
    /// The claim's record was written, with the claimer's lease; the caller provisions
    /// the sandbox.
    Claimed {
        /// The record it replaced, if any (a suspended session, an abandoned claim).
        previous: Option<SessionRecord>,
        /// The record written.
        record: SessionRecord,
    },
    /// The session already holds a sandbox and the claimer now holds its lease (kept,
    /// or taken over from an expired one); only the lease was written. Carries the
    /// record with that lease.
    Live(SessionRecord),
    /// Another acquirer is provisioning this session right now; nothing was written.
    Busy(SessionRecord),
    /// The session holds a sandbox under another manager's unexpired lease; nothing was
    /// written.
    Held(SessionRecord),
    /// The session holds a sandbox on another backend than the claim's (the record's
    /// `backend` differs); nothing was written. Its sandbox must be released through a
    /// manager on that backend before the session can move (a suspended session is
    /// restored on whichever backend claims it).
    Elsewhere(SessionRecord),
}

/// The claim rule of [`StateStore::claim`]: decides a claim from the current record of
/// the key (`existing`) and the tenant's records. Every store, this crate's and outside
/// ones, applies it so the rule is written once; a store makes it atomic by reading
/// both and writing what the outcome says (the `Claimed` record, or the `Live` record
/// with its new lease and the claim's time as its last activity) in one transaction (or
/// under one lock).
///
/// # Errors
/// [`ErrorKind::LimitExceeded`](crate::ErrorKind::LimitExceeded) when the tenant is at
/// its limit.
pub fn decide_claim<'a>(
    claim: &Claim,
    existing: Option<&SessionRecord>,
    tenant_records: impl IntoIterator<Item = &'a SessionRecord>,
) -> Result<ClaimOutcome> {
    let now = claim.record.updated_at;
    // A claim in flight is abandoned once provision_timeout has passed, or as soon as
    // its claimer's lease lapsed (it died; a live claimer renews it while it works).
    let counts = |r: &SessionRecord| r.counts_against_limit(now, claim.stale_before);
    let mut lease = Lease::next(
        existing.and_then(|r| r.lease.as_ref()),
        &claim.owner,
        claim.lease_until,
    );
    // An abandoned claim is replaced under a new token whoever claims, its own owner
    // id included (a restart, or one of the processes sharing the default id): the
    // claimer that stalled past its lease must find its writes refused.
    if let Some(stale) = existing.filter(|r| r.status == SandboxStatus::Provisioning && !counts(r))
    {
        lease.token = lease.token.max(stale.token() + 1);
    }
    if let Some(existing) = existing {
        if counts(existing) {
            if existing.status == SandboxStatus::Provisioning {
                return Ok(ClaimOutcome::Busy(existing.clone()));
            }
            if existing.held_against(&claim.owner, now).is_some() {
                return Ok(ClaimOutcome::Held(existing.clone()));
            }
            if existing.backend != claim.record.backend {
                return Ok(ClaimOutcome::Elsewhere(existing.clone()));
            }
            // Reuse is activity: recorded with the lease, in the claim's one write.
            let mut live = existing.clone();
            live.lease = Some(lease);
            live.last_active = live.last_active.max(now);
            live.updated_at = now;
            return Ok(ClaimOutcome::Live(live));
        }
    }
    if let Some(limit) = claim.tenant_limit {
        let held = tenant_records
            .into_iter()
            .filter(|r| r.key != claim.record.key && counts(r))
            .count();
        if held >= limit as usize {
            return Err(Error::limit_exceeded(format!(
                "tenant '{}' already holds {held} sandboxes; its limit is {limit} \
                 (release or suspend a session, or raise max_sandboxes_per_tenant)",
                claim.record.key.tenant()
            )));
        }
    }
    let mut record = claim.record.clone();
    if let Some(previous) = existing {
        record.created_at = previous.created_at;
    }
    record.lease = Some(lease);
    Ok(ClaimOutcome::Claimed {
        previous: existing.cloned(),
        record,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::spec::SandboxSpec;
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
    fn claim_rule() {
        let now = Utc::now();
        let claim = |session: &str, limit| {
            Claim::new(
                rec("t", session, SandboxStatus::Provisioning),
                "m1",
                now + chrono::Duration::seconds(30),
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
            ClaimOutcome::Claimed {
                previous: Some(_),
                ..
            }
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
        // A claimer whose lease lapsed died: its claim is abandoned at once.
        inflight.lease = Some(Lease::new("dead", 3, now - chrono::Duration::seconds(1)));
        assert!(matches!(
            decide_claim(&claim("c", None), Some(&inflight), [&inflight]).unwrap(),
            ClaimOutcome::Claimed { record, .. } if record.token() == 4
        ));
        // Its own owner id too takes it over under a new token: the stalled claimer's
        // late writes, under the old one, are refused.
        inflight.lease = Some(Lease::new("m1", 3, now - chrono::Duration::seconds(1)));
        let ClaimOutcome::Claimed { record, .. } =
            decide_claim(&claim("c", None), Some(&inflight), [&inflight]).unwrap()
        else {
            panic!("an abandoned claim is taken over")
        };
        assert_eq!(record.token(), 4, "a new token for the same owner");
        assert_eq!(
            check_fence(&record.key, Some(&record), 3)
                .unwrap_err()
                .kind(),
            ErrorKind::Conflict
        );
        inflight.lease = None;
        inflight.updated_at = now - chrono::Duration::seconds(120);
        assert!(matches!(
            decide_claim(&claim("c", Some(1)), Some(&inflight), [&inflight, &live])
                .unwrap_err()
                .kind(),
            ErrorKind::LimitExceeded
        ));
        assert!(matches!(
            decide_claim(&claim("c", Some(2)), Some(&inflight), [&inflight, &live]).unwrap(),
            ClaimOutcome::Claimed {
                previous: Some(_),
                ..
            }
        ));
    }

    #[test]
    fn lease_rules() {
        let now = Utc::now();
        let secs = chrono::Duration::seconds;
        let claim = Claim::new(
            rec("t", "a", SandboxStatus::Provisioning),
            "m1",
            now + secs(30),
            None,
            now - secs(60),
        );
        // A first claim gets token 1.
        let ClaimOutcome::Claimed { record, .. } = decide_claim(&claim, None, []).unwrap() else {
            panic!("not claimed")
        };
        assert_eq!(record.lease, Some(Lease::new("m1", 1, now + secs(30))));

        // Live under another manager's unexpired lease: held, named by the error.
        let mut live = rec("t", "a", SandboxStatus::Running);
        live.lease = Some(Lease::new("m2", 4, now + secs(10)));
        assert!(matches!(
            decide_claim(&claim, Some(&live), [&live]).unwrap(),
            ClaimOutcome::Held(_)
        ));
        let err = decide_lease(&live.key, Some(&live), "m1", now, now + secs(30)).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Conflict);
        assert!(err.to_string().contains("manager 'm2'"), "{err}");
        // The same owner keeps its token.
        let kept = decide_lease(&live.key, Some(&live), "m2", now, now + secs(30)).unwrap();
        assert_eq!(kept.token(), 4);

        // Expired: taken over with a higher token.
        live.lease = Some(Lease::new("m2", 4, now - secs(1)));
        let ClaimOutcome::Live(taken) = decide_claim(&claim, Some(&live), [&live]).unwrap() else {
            panic!("not taken over")
        };
        assert_eq!(taken.lease, Some(Lease::new("m1", 5, now + secs(30))));

        // A session without a sandbox blocks nobody.
        let mut suspended = rec("t", "a", SandboxStatus::Suspended);
        suspended.lease = Some(Lease::new("m2", 4, now + secs(10)));
        let taken = decide_lease(&suspended.key, Some(&suspended), "m1", now, now).unwrap();
        assert_eq!(taken.token(), 5);

        // Fencing: only the stored token passes.
        assert!(check_fence(&live.key, Some(&live), 4).is_ok());
        assert_eq!(
            check_fence(&live.key, Some(&live), 3).unwrap_err().kind(),
            ErrorKind::Conflict
        );
        assert!(check_fence(&live.key, None, 0).is_ok());
        assert!(check_fence(&live.key, None, 2).is_err());
        assert_eq!(
            decide_lease(&live.key, None, "m1", now, now)
                .unwrap_err()
                .kind(),
            ErrorKind::NotFound
        );
    }
}
