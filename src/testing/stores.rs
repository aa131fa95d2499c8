//! Conformance for store implementations: every `# Behavior` item of
//! [`StateStore`] and [`SnapshotStore`], as plain async functions.
//!
//! ```
//! # async fn demo() {
//! use sandcell::store::{InMemorySnapshotStore, InMemoryStateStore};
//! sandcell::testing::stores::state_store_all(&InMemoryStateStore::new()).await;
//! sandcell::testing::stores::snapshot_store_all(&InMemorySnapshotStore::new()).await;
//! # }
//! # tokio::runtime::Runtime::new().unwrap().block_on(demo());
//! ```

use bytes::Bytes;
use chrono::{Duration, Utc};
use futures::{StreamExt, TryStreamExt};

use crate::snapshot::{PackedBlob, SnapshotManifest};
use crate::store::{
    Claim, ClaimOutcome, Lease, PoolEntry, SessionKey, SessionRecord, SnapshotKey, SnapshotStore,
    StateStore,
};
use crate::{Error, ErrorKind, SandboxId, SandboxSpec, SandboxStatus};

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

fn record(key: &SessionKey, status: SandboxStatus) -> SessionRecord {
    let mut r =
        SessionRecord::provisioning(key.clone(), "mock", SandboxSpec::default(), Utc::now());
    r.status = status;
    r
}

/// Runs every state-store case.
pub async fn state_store_all(store: &dyn StateStore) {
    state_put_get_delete(store).await;
    state_claim(store).await;
    state_leases(store).await;
    state_touch(store).await;
    state_pool(store).await;
    state_instance_id(store).await;
}

/// `instance_id` is a non-empty name from `[A-Za-z0-9_-]`, the same on every call.
/// (That another store has another id, and the same store opened again the same one,
/// needs two stores: see [`state_instance_ids_differ`].)
pub async fn state_instance_id(store: &dyn StateStore) {
    let id = store.instance_id().await.unwrap();
    assert!(
        !id.is_empty()
            && id.len() <= 128
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-')),
        "{id:?}"
    );
    assert_eq!(store.instance_id().await.unwrap(), id);
}

/// Two distinct stores have distinct instance ids.
pub async fn state_instance_ids_differ(one: &dyn StateStore, other: &dyn StateStore) {
    assert_ne!(
        one.instance_id().await.unwrap(),
        other.instance_id().await.unwrap()
    );
}

/// `put` inserts or replaces, `get` of an unknown key is `None`, `delete` is idempotent,
/// `list` filters by tenant and sorts by key.
pub async fn state_put_get_delete(store: &dyn StateStore) {
    let tenant = unique("t");
    let b = SessionKey::new(&tenant, "b").unwrap();
    let a = SessionKey::new(&tenant, "a").unwrap();
    assert_eq!(store.get(&a).await.unwrap(), None);
    let mut rb = record(&b, SandboxStatus::Running);
    rb.sandbox_id = Some(SandboxId::new("sb-1").unwrap());
    store.put(&rb).await.unwrap();
    store.put(&record(&a, SandboxStatus::Idle)).await.unwrap();
    assert_eq!(store.get(&b).await.unwrap(), Some(rb.clone()));
    rb.status = SandboxStatus::Suspended;
    rb.sandbox_id = None;
    store.put(&rb).await.unwrap();
    assert_eq!(store.get(&b).await.unwrap(), Some(rb.clone()));

    let listed = store.list(Some(&tenant)).await.unwrap();
    let keys: Vec<_> = listed.iter().map(|r| r.key.clone()).collect();
    assert_eq!(keys, vec![a.clone(), b.clone()]);
    assert!(store.list(None).await.unwrap().len() >= 2);
    assert!(store.list(Some(&unique("other"))).await.unwrap().is_empty());

    store.delete(&a, 0).await.unwrap();
    store.delete(&a, 0).await.unwrap();
    assert_eq!(store.get(&a).await.unwrap(), None);
    store.delete(&b, 0).await.unwrap();
}

fn claim_of(key: SessionKey, owner: &str, limit: Option<u32>) -> Claim {
    let now = Utc::now();
    Claim::new(
        SessionRecord::provisioning(key, "mock", SandboxSpec::default(), now),
        owner,
        now + Duration::seconds(30),
        limit,
        now - Duration::seconds(300),
    )
}

/// Deletes what a case left, whatever its tokens.
async fn clear_tenant(store: &dyn StateStore, tenant: &str) {
    for r in store.list(Some(tenant)).await.unwrap() {
        store.delete(&r.key, r.token()).await.unwrap();
    }
}

/// Claims: live sessions are returned, fresh claims in flight are busy, the tenant limit
/// is enforced with the limit in the message, and concurrent claims never exceed it.
pub async fn state_claim(store: &dyn StateStore) {
    let tenant = unique("t");
    let key = |s: &str| SessionKey::new(&tenant, s).unwrap();
    let claim = |s: &str, limit| claim_of(key(s), "m1", limit);

    let ClaimOutcome::Claimed {
        previous: None,
        record: claimed,
    } = store.claim(&claim("a", Some(2))).await.unwrap()
    else {
        panic!("a first claim succeeds")
    };
    assert_eq!(store.get(&key("a")).await.unwrap().as_ref(), Some(&claimed));
    assert!(matches!(
        store.claim(&claim("a", Some(2))).await.unwrap(),
        ClaimOutcome::Busy(_)
    ));
    let mut live = store.get(&key("a")).await.unwrap().unwrap();
    live.status = SandboxStatus::Running;
    live.sandbox_id = Some(SandboxId::new("sb-a").unwrap());
    store.put(&live).await.unwrap();
    let reuse = claim("a", Some(2));
    let ClaimOutcome::Live(reused) = store.claim(&reuse).await.unwrap() else {
        panic!("a live session is returned")
    };
    assert_eq!(reused.sandbox_id, live.sandbox_id);
    assert_eq!(
        reused.last_active, reuse.record.updated_at,
        "a reuse is recorded as activity by the claim's own write"
    );
    assert_eq!(
        reused.token(),
        live.token(),
        "the same owner keeps its token"
    );
    let mut foreign = claim_of(key("a"), "m1", Some(2));
    foreign.record.backend = "other".into();
    let ClaimOutcome::Elsewhere(elsewhere) = store.claim(&foreign).await.unwrap() else {
        panic!("a session live on another backend is reported, not claimed")
    };
    assert_eq!(elsewhere.backend, "mock");
    assert_eq!(
        store.get(&key("a")).await.unwrap().as_ref(),
        Some(&reused),
        "a claim from another backend writes nothing, not even the lease"
    );

    assert!(matches!(
        store.claim(&claim("b", Some(2))).await.unwrap(),
        ClaimOutcome::Claimed { previous: None, .. }
    ));
    let err = store.claim(&claim("c", Some(2))).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LimitExceeded, "{err}");
    assert!(err.to_string().contains("limit is 2"), "{err}");
    assert_eq!(
        store.get(&key("c")).await.unwrap(),
        None,
        "a refused claim writes nothing"
    );

    // A suspended session does not count and keeps its creation time when reclaimed.
    let mut suspended = store.get(&key("b")).await.unwrap().unwrap();
    suspended.status = SandboxStatus::Suspended;
    suspended.created_at = Utc::now() - Duration::days(1);
    store.put(&suspended).await.unwrap();
    assert!(matches!(
        store.claim(&claim("b", Some(2))).await.unwrap(),
        ClaimOutcome::Claimed { previous: Some(prev), .. } if prev == suspended
    ));
    assert_eq!(
        store.get(&key("b")).await.unwrap().unwrap().created_at,
        suspended.created_at
    );

    // Concurrent claims over distinct keys: exactly `limit` succeed.
    let tenant2 = unique("t");
    let results = futures::future::join_all((0..20).map(|i| {
        let claim = claim_of(
            SessionKey::new(&tenant2, format!("s{i}")).unwrap(),
            "m1",
            Some(3),
        );
        async move { store.claim(&claim).await }
    }))
    .await;
    let ok = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(ok, 3, "{results:?}");
    assert!(results
        .iter()
        .filter_map(|r| r.as_ref().err())
        .all(|e| e.kind() == ErrorKind::LimitExceeded));
    clear_tenant(store, &tenant).await;
    clear_tenant(store, &tenant2).await;
}

/// Leases: a live session under another manager's unexpired lease is held (claim and
/// `take_lease` refuse, naming the owner); an expired lease is taken over with a higher
/// token; writes and deletes carrying an old token are refused and change nothing;
/// `put` keeps the stored lease; `renew_leases` renews only its owner's live sessions,
/// never a claim still provisioning.
pub async fn state_leases(store: &dyn StateStore) {
    let tenant = unique("t");
    let key = SessionKey::new(&tenant, "s").unwrap();
    let now = Utc::now();
    let secs = Duration::seconds;

    // m1 claims and makes the session live.
    let ClaimOutcome::Claimed { record, .. } = store
        .claim(&claim_of(key.clone(), "m1", None))
        .await
        .unwrap()
    else {
        panic!("a first claim succeeds")
    };
    let first = record.token();
    assert!(first > 0, "a claim carries a fencing token");
    assert_eq!(record.lease.as_ref().unwrap().owner, "m1");
    // A claim still provisioning is its claimer's to renew (by take_lease), not
    // renew_leases': one left by a dead process must lapse even while its owner id
    // lives on in a restarted one.
    store.renew_leases("m1", now + secs(900)).await.unwrap();
    let claimed = store.get(&key).await.unwrap().unwrap();
    assert_eq!(
        claimed.lease, record.lease,
        "renew_leases skips a claim in flight"
    );
    let kept = store
        .take_lease(&key, "m1", now, now + secs(60))
        .await
        .unwrap();
    assert_eq!(
        kept.token(),
        first,
        "the claimer renews its claim, keeping the token"
    );
    let mut live = record.clone();
    live.status = SandboxStatus::Running;
    live.sandbox_id = Some(SandboxId::new("sb-1").unwrap());
    store.put(&live).await.unwrap();

    // m2 is refused while m1's lease runs, and writes nothing.
    assert!(matches!(
        store.claim(&claim_of(key.clone(), "m2", None)).await.unwrap(),
        ClaimOutcome::Held(held) if held.lease.as_ref().unwrap().owner == "m1"
    ));
    let err = store
        .take_lease(&key, "m2", now, now + secs(30))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Conflict, "{err}");
    assert!(err.to_string().contains("m1"), "names the owner: {err}");
    assert_eq!(store.get(&key).await.unwrap().unwrap().token(), first);

    // m1 renews: only its live sessions.
    let until = now + secs(300);
    assert!(store.renew_leases("m1", until).await.unwrap() >= 1);
    assert_eq!(
        store.renew_leases(&unique("nobody"), until).await.unwrap(),
        0
    );
    let renewed = store.get(&key).await.unwrap().unwrap();
    assert_eq!(
        renewed.lease.as_ref().unwrap().expires_at,
        Lease::new("m1", 0, until).expires_at
    );
    assert_eq!(renewed.token(), first, "renewing keeps the token");

    // Past the lease (seen from a later "now"), m2 takes over with a higher token.
    let later = until + secs(1);
    let taken = store
        .take_lease(&key, "m2", later, later + secs(30))
        .await
        .unwrap();
    assert!(taken.token() > first, "a takeover raises the token");
    assert_eq!(taken.lease.as_ref().unwrap().owner, "m2");

    // m1's late writes are refused and change nothing.
    let mut late = live.clone();
    late.status = SandboxStatus::Suspended;
    late.sandbox_id = None;
    let err = store.put(&late).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Conflict, "{err}");
    assert!(err.to_string().contains("m2"), "names the new owner: {err}");
    let err = store.delete(&key, first).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Conflict, "{err}");
    let stored = store.get(&key).await.unwrap().unwrap();
    assert_eq!(stored.status, SandboxStatus::Running);
    assert_eq!(stored.lease, taken.lease);
    // And m1's renewals no longer touch it.
    store.renew_leases("m1", later + secs(600)).await.unwrap();
    assert_eq!(store.get(&key).await.unwrap().unwrap().lease, taken.lease);

    // m2's writes go through and keep its lease; a put cannot move the lease.
    let mut mine = taken.clone();
    mine.status = SandboxStatus::Idle;
    mine.lease = Some(Lease::new("m2", taken.token(), later - secs(100)));
    store.put(&mine).await.unwrap();
    let stored = store.get(&key).await.unwrap().unwrap();
    assert_eq!(stored.status, SandboxStatus::Idle);
    assert_eq!(stored.lease, taken.lease);

    // A session without a sandbox blocks nobody: m1 may take it at once.
    mine.status = SandboxStatus::Suspended;
    mine.sandbox_id = None;
    store.put(&mine).await.unwrap();
    assert_eq!(
        store.renew_leases("m2", later + secs(600)).await.unwrap(),
        0
    );
    let back = store
        .take_lease(&key, "m1", later, later + secs(30))
        .await
        .unwrap();
    assert!(back.token() > taken.token());

    // Unknown sessions: no lease to take; deleting is done already.
    let missing = SessionKey::new(&tenant, "missing").unwrap();
    let err = store
        .take_lease(&missing, "m1", now, now)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound);
    store.delete(&missing, 7).await.unwrap();
    let mut ghost = record.clone();
    ghost.key = missing.clone();
    assert_eq!(
        store.put(&ghost).await.unwrap_err().kind(),
        ErrorKind::Conflict,
        "a leased write of a deleted session is refused"
    );
    assert_eq!(store.get(&missing).await.unwrap(), None);

    store.delete(&key, back.token()).await.unwrap();
    assert_eq!(store.get(&key).await.unwrap(), None);
}

/// `touch` moves `last_active` forward only and ignores unknown keys.
pub async fn state_touch(store: &dyn StateStore) {
    let key = SessionKey::new(unique("t"), "s").unwrap();
    store.touch(&key, Utc::now()).await.unwrap();
    assert_eq!(store.get(&key).await.unwrap(), None);
    let r = record(&key, SandboxStatus::Running);
    store.put(&r).await.unwrap();
    let later = r.last_active + Duration::seconds(10);
    store.touch(&key, later).await.unwrap();
    store.touch(&key, r.last_active).await.unwrap();
    assert_eq!(store.get(&key).await.unwrap().unwrap().last_active, later);
    store.delete(&key, 0).await.unwrap();
}

/// Pool entries: only ready ones are taken, oldest first, each at most once.
pub async fn state_pool(store: &dyn StateStore) {
    let pool = unique("pool");
    let now = Utc::now();
    let pending = PoolEntry::new(&pool, now - Duration::seconds(30));
    store.pool_put(&pending).await.unwrap();
    assert_eq!(store.pool_take(&pool).await.unwrap(), None);
    let mut ready = Vec::new();
    for i in 0..3 {
        let mut e = PoolEntry::new(&pool, now + Duration::seconds(i));
        e.sandbox_id = Some(SandboxId::new(format!("sb-{i}")).unwrap());
        store.pool_put(&e).await.unwrap();
        ready.push(e);
    }
    assert!(store.pool_list().await.unwrap().contains(&pending));
    assert_eq!(
        store.pool_take(&pool).await.unwrap().as_ref(),
        Some(&ready[0])
    );
    let taken = futures::future::join_all((0..4).map(|_| store.pool_take(&pool))).await;
    let mut got: Vec<_> = taken
        .into_iter()
        .filter_map(|r| r.unwrap())
        .map(|e| e.slot)
        .collect();
    got.sort();
    let mut want = vec![ready[1].slot.clone(), ready[2].slot.clone()];
    want.sort();
    assert_eq!(got, want);
    store.pool_remove(&pending.slot).await.unwrap();
    store.pool_remove(&pending.slot).await.unwrap();
    assert!(!store
        .pool_list()
        .await
        .unwrap()
        .iter()
        .any(|e| e.pool == pool));
}

/// A manifest for a blob of `data` stored under `key`, taken `age_secs` ago: what a
/// snapshot-store test commits a blob with.
pub fn manifest_for(key: &SnapshotKey, data: &[u8], age_secs: i64) -> SnapshotManifest {
    let blob = PackedBlob {
        tar_bytes: 0,
        size_bytes: data.len() as u64,
        entry_count: 0,
        content_bytes: 0,
        sha256: {
            use sha2::Digest;
            hex::encode(sha2::Sha256::digest(data))
        },
    };
    let mut m = SnapshotManifest::new(&blob, "mock", "default");
    m.id = key.id().to_owned();
    m.created_at = Utc::now() - Duration::seconds(age_secs);
    m
}

fn bytes_stream(data: &'static [u8]) -> crate::ByteStream {
    futures::stream::iter([Ok(Bytes::from_static(data))]).boxed()
}

/// Runs every snapshot-store case.
pub async fn snapshot_store_all(store: &dyn SnapshotStore) {
    snapshot_round_trip(store).await;
    snapshot_manifest_is_the_commit_point(store).await;
    snapshot_failed_blob_keeps_nothing(store).await;
    snapshot_orphans_are_swept(store).await;
}

/// `sweep_orphans` deletes a blob without a manifest once it is older than the cut-off,
/// and never a committed snapshot or a younger blob.
pub async fn snapshot_orphans_are_swept(store: &dyn SnapshotStore) {
    let session = SessionKey::new(unique("t"), "s").unwrap();
    let orphan = SnapshotKey::new(session.clone(), "orphan").unwrap();
    let kept = SnapshotKey::new(session.clone(), "kept").unwrap();
    store
        .put_blob(&orphan, bytes_stream(b"lost"))
        .await
        .unwrap();
    store.put_blob(&kept, bytes_stream(b"kept")).await.unwrap();
    store
        .put_manifest(&kept, &manifest_for(&kept, b"kept", 0))
        .await
        .unwrap();

    // Within the grace period: an upload whose manifest may still come.
    let swept = store
        .sweep_orphans(Utc::now() - Duration::hours(1))
        .await
        .unwrap();
    assert!(!swept.contains(&orphan), "{swept:?}");
    // Past it (object stores keep whole seconds): gone, and only it.
    let swept = store
        .sweep_orphans(Utc::now() + Duration::seconds(5))
        .await
        .unwrap();
    assert!(swept.contains(&orphan), "{swept:?}");
    assert!(!swept.contains(&kept), "{swept:?}");
    assert_eq!(
        store
            .put_manifest(&orphan, &manifest_for(&orphan, b"lost", 0))
            .await
            .unwrap_err()
            .kind(),
        ErrorKind::NotFound,
        "the swept blob is gone"
    );
    let blob: Vec<Bytes> = store
        .blob(&kept)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(blob.concat(), b"kept");
    assert!(store
        .sweep_orphans(Utc::now() + Duration::seconds(5))
        .await
        .unwrap()
        .iter()
        .all(|k| k.session() != &session));
    store.delete(&kept).await.unwrap();
}

/// Blob and manifest round-trip; `list` is oldest first; `delete` is idempotent.
pub async fn snapshot_round_trip(store: &dyn SnapshotStore) {
    let session = SessionKey::new(unique("t"), "s").unwrap();
    let newer = SnapshotKey::new(session.clone(), "b-newer").unwrap();
    let older = SnapshotKey::new(session.clone(), "a-older").unwrap();
    let items: [(&SnapshotKey, &'static [u8], i64); 2] =
        [(&newer, b"new", 10), (&older, b"old", 20)];
    for (key, data, age) in items {
        assert_eq!(store.put_blob(key, bytes_stream(data)).await.unwrap(), 3);
        store
            .put_manifest(key, &manifest_for(key, data, age))
            .await
            .unwrap();
    }
    let ids: Vec<_> = store
        .list(&session)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.id)
        .collect();
    assert_eq!(ids, vec!["a-older", "b-newer"]);
    assert_eq!(store.manifest(&newer).await.unwrap().id, "b-newer");
    let blob: Vec<Bytes> = store
        .blob(&newer)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(blob.concat(), b"new");
    assert!(store
        .list(&SessionKey::new(session.tenant(), "other").unwrap())
        .await
        .unwrap()
        .is_empty());
    for key in [&newer, &older] {
        store.delete(key).await.unwrap();
        store.delete(key).await.unwrap();
        assert_eq!(
            store.manifest(key).await.unwrap_err().kind(),
            ErrorKind::NotFound
        );
    }
    assert!(store.list(&session).await.unwrap().is_empty());
}

/// A blob without a manifest is invisible, and a manifest without a blob is refused.
pub async fn snapshot_manifest_is_the_commit_point(store: &dyn SnapshotStore) {
    let session = SessionKey::new(unique("t"), "s").unwrap();
    let key = SnapshotKey::new(session.clone(), "half").unwrap();
    store.put_blob(&key, bytes_stream(b"data")).await.unwrap();
    assert!(store.list(&session).await.unwrap().is_empty());
    assert_eq!(
        store.manifest(&key).await.unwrap_err().kind(),
        ErrorKind::NotFound
    );
    assert_eq!(
        store.blob(&key).await.err().map(|e| e.kind()),
        Some(ErrorKind::NotFound)
    );
    let orphan = SnapshotKey::new(session.clone(), "no-blob").unwrap();
    let err = store
        .put_manifest(&orphan, &manifest_for(&orphan, b"", 0))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    assert!(store.list(&session).await.unwrap().is_empty());
    store.delete(&key).await.unwrap();
}

/// A blob stream that fails is not stored, and the error comes back.
pub async fn snapshot_failed_blob_keeps_nothing(store: &dyn SnapshotStore) {
    let session = SessionKey::new(unique("t"), "s").unwrap();
    let key = SnapshotKey::new(session.clone(), "broken").unwrap();
    let stream = futures::stream::iter([
        Ok(Bytes::from_static(b"partial")),
        Err(Error::corrupt("the source failed")),
    ])
    .boxed();
    let err = store.put_blob(&key, stream).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
    let err = store
        .put_manifest(&key, &manifest_for(&key, b"", 0))
        .await
        .unwrap_err();
    assert_eq!(
        err.kind(),
        ErrorKind::NotFound,
        "a failed blob must not be kept: {err}"
    );
}
