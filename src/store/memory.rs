//! In-memory stores: for tests, examples and single-process embedders that need no restore.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use chrono::{DateTime, Utc};
use futures::StreamExt;

use crate::backend::ByteStream;
use crate::error::{Error, Result};
use crate::snapshot::SnapshotManifest;
use crate::store::snapshots::{sort_manifests, SnapshotKey, SnapshotStore};
use crate::store::{
    check_fence, decide_claim, decide_lease, Claim, ClaimOutcome, Lease, PoolEntry, SessionKey,
    SessionRecord, StateStore,
};

use crate::lock_unpoisoned as lock;

#[derive(Debug, Default)]
struct StateInner {
    sessions: BTreeMap<SessionKey, SessionRecord>,
    pool: BTreeMap<String, PoolEntry>,
}

/// A [`StateStore`] in memory. Clones share the same state (and instance id), so
/// several managers in one process can share it; nothing survives the process.
#[derive(Debug, Clone)]
pub struct InMemoryStateStore {
    inner: Arc<Mutex<StateInner>>,
    instance_id: Arc<str>,
}

impl Default for InMemoryStateStore {
    fn default() -> Self {
        InMemoryStateStore {
            inner: Arc::default(),
            instance_id: uuid::Uuid::new_v4().simple().to_string().into(),
        }
    }
}

impl InMemoryStateStore {
    /// An empty store with a new instance id.
    pub fn new() -> Self {
        Self::default()
    }
}

#[async_trait]
impl StateStore for InMemoryStateStore {
    async fn instance_id(&self) -> Result<String> {
        Ok(self.instance_id.to_string())
    }

    async fn claim(&self, claim: &Claim) -> Result<ClaimOutcome> {
        let mut inner = lock(&self.inner);
        let key = &claim.record.key;
        let tenant = inner
            .sessions
            .values()
            .filter(|r| r.key.tenant() == key.tenant());
        let outcome = decide_claim(claim, inner.sessions.get(key), tenant)?;
        match &outcome {
            ClaimOutcome::Claimed { record, .. } | ClaimOutcome::Live(record) => {
                inner.sessions.insert(key.clone(), record.clone());
            }
            ClaimOutcome::Busy(_) | ClaimOutcome::Held(_) | ClaimOutcome::Elsewhere(_) => {}
        }
        Ok(outcome)
    }

    async fn get(&self, key: &SessionKey) -> Result<Option<SessionRecord>> {
        Ok(lock(&self.inner).sessions.get(key).cloned())
    }

    async fn put(&self, record: &SessionRecord) -> Result<()> {
        let mut inner = lock(&self.inner);
        let stored = inner.sessions.get(&record.key);
        check_fence(&record.key, stored, record.token())?;
        let mut record = record.clone();
        record.lease = stored.and_then(|r| r.lease.clone());
        inner.sessions.insert(record.key.clone(), record);
        Ok(())
    }

    async fn take_lease(
        &self,
        key: &SessionKey,
        owner: &str,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> Result<SessionRecord> {
        let mut inner = lock(&self.inner);
        let record = decide_lease(key, inner.sessions.get(key), owner, now, until)?;
        inner.sessions.insert(key.clone(), record.clone());
        Ok(record)
    }

    async fn renew_leases(&self, owner: &str, until: DateTime<Utc>) -> Result<u64> {
        let mut renewed = 0;
        for record in lock(&self.inner).sessions.values_mut() {
            let holds = record.is_live();
            if let Some(lease) = record.lease.as_mut() {
                if lease.owner == owner && holds {
                    *lease = Lease::new(owner, lease.token, until);
                    renewed += 1;
                }
            }
        }
        Ok(renewed)
    }

    async fn touch(&self, key: &SessionKey, at: DateTime<Utc>) -> Result<()> {
        if let Some(r) = lock(&self.inner).sessions.get_mut(key) {
            r.last_active = r.last_active.max(at);
        }
        Ok(())
    }

    async fn delete(&self, key: &SessionKey, token: u64) -> Result<()> {
        let mut inner = lock(&self.inner);
        if let Some(stored) = inner.sessions.get(key) {
            check_fence(key, Some(stored), token)?;
            inner.sessions.remove(key);
        }
        Ok(())
    }

    async fn list(&self, tenant: Option<&str>) -> Result<Vec<SessionRecord>> {
        Ok(lock(&self.inner)
            .sessions
            .values()
            .filter(|r| tenant.is_none_or(|t| r.key.tenant() == t))
            .cloned()
            .collect())
    }

    async fn pool_put(&self, entry: &PoolEntry) -> Result<()> {
        lock(&self.inner)
            .pool
            .insert(entry.slot.clone(), entry.clone());
        Ok(())
    }

    async fn pool_take(&self, pool: &str) -> Result<Option<PoolEntry>> {
        let mut inner = lock(&self.inner);
        let oldest = inner
            .pool
            .values()
            .filter(|e| e.pool == pool && e.sandbox_id.is_some())
            .min_by(|a, b| a.created_at.cmp(&b.created_at).then(a.slot.cmp(&b.slot)))
            .map(|e| e.slot.clone());
        Ok(oldest.and_then(|slot| inner.pool.remove(&slot)))
    }

    async fn pool_list(&self) -> Result<Vec<PoolEntry>> {
        Ok(lock(&self.inner).pool.values().cloned().collect())
    }

    async fn pool_remove(&self, slot: &str) -> Result<()> {
        lock(&self.inner).pool.remove(slot);
        Ok(())
    }
}

#[derive(Debug, Default)]
struct StoredSnapshot {
    blob: Option<Bytes>,
    manifest: Option<SnapshotManifest>,
    written_at: Option<DateTime<Utc>>,
}

/// A [`SnapshotStore`] in memory. Clones share the same snapshots.
#[derive(Debug, Clone, Default)]
pub struct InMemorySnapshotStore {
    inner: Arc<Mutex<BTreeMap<SnapshotKey, StoredSnapshot>>>,
}

impl InMemorySnapshotStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }
}

fn missing(key: &SnapshotKey) -> Error {
    Error::not_found(format!("snapshot {key} does not exist"))
}

#[async_trait]
impl SnapshotStore for InMemorySnapshotStore {
    async fn put_blob(&self, key: &SnapshotKey, mut blob: ByteStream) -> Result<u64> {
        let mut buf = BytesMut::new();
        while let Some(chunk) = blob.next().await {
            buf.extend_from_slice(&chunk?);
        }
        let len = buf.len() as u64;
        let mut inner = lock(&self.inner);
        let stored = inner.entry(key.clone()).or_default();
        stored.blob = Some(buf.freeze());
        stored.written_at = Some(Utc::now());
        Ok(len)
    }

    async fn put_manifest(&self, key: &SnapshotKey, manifest: &SnapshotManifest) -> Result<()> {
        let mut inner = lock(&self.inner);
        match inner.get_mut(key) {
            Some(s) if s.blob.is_some() => {
                s.manifest = Some(manifest.clone());
                Ok(())
            }
            _ => Err(Error::not_found(format!(
                "snapshot {key} has no stored blob; store the blob before its manifest"
            ))),
        }
    }

    async fn manifest(&self, key: &SnapshotKey) -> Result<SnapshotManifest> {
        lock(&self.inner)
            .get(key)
            .and_then(|s| s.manifest.clone())
            .ok_or_else(|| missing(key))
    }

    async fn blob(&self, key: &SnapshotKey) -> Result<ByteStream> {
        let blob = lock(&self.inner)
            .get(key)
            .filter(|s| s.manifest.is_some())
            .and_then(|s| s.blob.clone())
            .ok_or_else(|| missing(key))?;
        Ok(futures::stream::iter([Ok(blob)]).boxed())
    }

    async fn list(&self, session: &SessionKey) -> Result<Vec<SnapshotManifest>> {
        let mut out: Vec<_> = lock(&self.inner)
            .iter()
            .filter(|(k, _)| k.session() == session)
            .filter_map(|(_, s)| s.manifest.clone())
            .collect();
        sort_manifests(&mut out);
        Ok(out)
    }

    async fn delete(&self, key: &SnapshotKey) -> Result<()> {
        lock(&self.inner).remove(key);
        Ok(())
    }

    async fn sweep_orphans(&self, before: DateTime<Utc>) -> Result<Vec<SnapshotKey>> {
        let mut inner = lock(&self.inner);
        let orphans: Vec<SnapshotKey> = inner
            .iter()
            .filter(|(_, s)| s.manifest.is_none() && s.written_at.is_some_and(|at| at < before))
            .map(|(k, _)| k.clone())
            .collect();
        for key in &orphans {
            inner.remove(key);
        }
        Ok(orphans)
    }
}
