//! Reconcile: what the backend holds against what the store recorded, so a sandbox
//! this manager's store made and lost track of is destroyed and a session whose
//! sandbox went is marked so.

use std::collections::{HashMap, HashSet};

use crate::backend::SandboxBackend;
use crate::error::{ErrorKind, Result};
use crate::manager::{
    chrono_duration, EventKind, Inner, ReconcileReport, LABEL_MANAGER, LABEL_POOL_SLOT,
    LABEL_SESSION, LABEL_STORE, LABEL_TENANT,
};
use crate::sandbox::{LabelSelector, SandboxId, SandboxStatus};
use crate::store::{PoolEntry, SessionKey, SessionRecord};

impl<B: SandboxBackend> Inner<B> {
    pub(crate) async fn reconcile(&self) -> Result<ReconcileReport> {
        let mut report = ReconcileReport::default();
        let now = self.clock.now();
        let me = &self.manager_id;
        let stale_before = now - chrono_duration(self.settings.provision_timeout);
        let selector = LabelSelector::new().label(LABEL_MANAGER, &self.manager_id);
        let listed = self.backend.list(&selector).await?;
        let records = self.state.list(None).await?;
        let pool = self.state.pool_list().await?;
        let by_id: HashSet<&SandboxId> = records
            .iter()
            .filter_map(|r| r.sandbox_id.as_ref())
            .collect();
        let by_key: HashMap<&SessionKey, &SessionRecord> =
            records.iter().map(|r| (&r.key, r)).collect();
        let slots: HashMap<&str, &PoolEntry> = pool.iter().map(|e| (e.slot.as_str(), e)).collect();
        let in_flight = |r: &SessionRecord| {
            r.status == SandboxStatus::Provisioning && r.updated_at >= stale_before
        };
        let any_in_flight = records.iter().any(&in_flight);
        for info in &listed {
            // Only what this store recorded can be an orphan of it: a neighbour with
            // its own store (another program, another data directory) on the same
            // backend is never touched, nor a sandbox an older version made unlabelled.
            if by_id.contains(&info.id)
                || info.labels.get(LABEL_STORE).map(String::as_str) != Some(self.store_id.as_str())
            {
                continue;
            }
            if let Some(slot) = info.labels.get(LABEL_POOL_SLOT) {
                match slots.get(slot.as_str()) {
                    Some(entry) if entry.sandbox_id.as_ref().is_none_or(|id| id == &info.id) => {
                        continue
                    }
                    // Taken from the pool by an acquire that has not recorded it yet.
                    None if any_in_flight => continue,
                    _ => {}
                }
            }
            let session = match (
                info.labels.get(LABEL_TENANT),
                info.labels.get(LABEL_SESSION),
            ) {
                (Some(t), Some(s)) => SessionKey::new(t, s).ok(),
                _ => None,
            };
            if let Some(record) = session.as_ref().and_then(|k| by_key.get(k)) {
                if in_flight(record) {
                    continue;
                }
            }
            self.destroy_sandbox(&info.id).await?;
            tracing::info!(sandbox = %info.id, session = ?session, "destroyed an orphaned sandbox");
            let mut event = self.event(EventKind::OrphanDestroyed).sandbox(&info.id);
            if let Some(k) = &session {
                event = event.session(k);
            }
            self.emit(event);
            report.destroyed.push(info.id.clone());
        }
        let listed_ids: HashSet<&SandboxId> = listed.iter().map(|i| &i.id).collect();
        for record in &records {
            let Some(id) = &record.sandbox_id else {
                continue;
            };
            if !record.is_live()
                || listed_ids.contains(id)
                || record.backend != self.backend.name()
                || record.held_against(me, now).is_some()
            {
                continue;
            }
            let _guard = self.lock_key(&record.key).await;
            let Some(mut fresh) = self.leased_for_maintenance(&record.key).await? else {
                continue;
            };
            if fresh.sandbox_id.as_ref() != Some(id) || !fresh.is_live() {
                continue;
            }
            match self.backend.inspect(id).await {
                Err(e) if e.kind() == ErrorKind::NotFound => {
                    self.mark_gone(&mut fresh, EventKind::Lost, "the sandbox no longer exists")
                        .await?;
                    report.lost.push(record.key.clone());
                }
                Err(e) => return Err(e),
                Ok(_) => {}
            }
        }
        report.orphan_blobs_deleted = self.sweep_orphans().await?;
        for entry in &pool {
            let gone = match &entry.sandbox_id {
                Some(id) => !listed_ids.contains(id),
                None => entry.created_at < stale_before,
            };
            if gone {
                self.state.pool_remove(&entry.slot).await?;
                report.pool_entries_removed += 1;
            }
        }
        Ok(report)
    }
}
