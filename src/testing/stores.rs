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
    Claim, ClaimOutcome, PoolEntry, SessionKey, SessionRecord, SnapshotKey, SnapshotStore,
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
    state_touch(store).await;
    state_pool(store).await;
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

    store.delete(&a).await.unwrap();
    store.delete(&a).await.unwrap();
    assert_eq!(store.get(&a).await.unwrap(), None);
    store.delete(&b).await.unwrap();
}

/// Claims: live sessions are returned, fresh claims in flight are busy, the tenant limit
/// is enforced with the limit in the message, and concurrent claims never exceed it.
pub async fn state_claim(store: &dyn StateStore) {
    let tenant = unique("t");
    let key = |s: &str| SessionKey::new(&tenant, s).unwrap();
    let stale_before = Utc::now() - Duration::seconds(300);
    let claim = |s: &str, limit| {
        Claim::new(
            SessionRecord::provisioning(key(s), "mock", SandboxSpec::default(), Utc::now()),
            limit,
            stale_before,
        )
    };

    assert_eq!(
        store.claim(&claim("a", Some(2))).await.unwrap(),
        ClaimOutcome::Claimed(None)
    );
    assert!(matches!(
        store.claim(&claim("a", Some(2))).await.unwrap(),
        ClaimOutcome::Busy(_)
    ));
    let mut live = store.get(&key("a")).await.unwrap().unwrap();
    live.status = SandboxStatus::Running;
    live.sandbox_id = Some(SandboxId::new("sb-a").unwrap());
    store.put(&live).await.unwrap();
    assert_eq!(
        store.claim(&claim("a", Some(2))).await.unwrap(),
        ClaimOutcome::Live(live.clone())
    );

    assert!(matches!(
        store.claim(&claim("b", Some(2))).await.unwrap(),
        ClaimOutcome::Claimed(None)
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
        ClaimOutcome::Claimed(Some(prev)) if prev == suspended
    ));
    assert_eq!(
        store.get(&key("b")).await.unwrap().unwrap().created_at,
        suspended.created_at
    );

    // Concurrent claims over distinct keys: exactly `limit` succeed.
    let tenant2 = unique("t");
    let results = futures::future::join_all((0..20).map(|i| {
        let record = SessionRecord::provisioning(
            SessionKey::new(&tenant2, format!("s{i}")).unwrap(),
            "mock",
            SandboxSpec::default(),
            Utc::now(),
        );
        async move {
            store
                .claim(&Claim::new(record, Some(3), stale_before))
                .await
        }
    }))
    .await;
    let ok = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(ok, 3, "{results:?}");
    assert!(results
        .iter()
        .filter_map(|r| r.as_ref().err())
        .all(|e| e.kind() == ErrorKind::LimitExceeded));
    for r in store.list(Some(&tenant)).await.unwrap() {
        store.delete(&r.key).await.unwrap();
    }
    for r in store.list(Some(&tenant2)).await.unwrap() {
        store.delete(&r.key).await.unwrap();
    }
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
    store.delete(&key).await.unwrap();
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

fn manifest_for(key: &SnapshotKey, data: &[u8], age_secs: i64) -> SnapshotManifest {
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
