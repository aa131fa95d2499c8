//! Warm pools: sandboxes made ahead of the sessions that will take them, filled in
//! the background and taken by an acquire under its claim.

use crate::backend::SandboxBackend;
use crate::error::{ErrorKind, Result};
use crate::manager::{
    chrono_duration, lock, EventKind, Inner, LABEL_MANAGER, LABEL_POOL, LABEL_POOL_SLOT,
    LABEL_STORE,
};
use crate::sandbox::{SandboxId, SandboxInfo, SandboxStatus};
use crate::spec::SandboxSpec;
use crate::store::{PoolEntry, SessionRecord};

impl<B: SandboxBackend> Inner<B> {
    pub(crate) async fn fill_pools(&self) -> Result<usize> {
        let _filling = self.fill_lock.lock().await;
        let mut created = 0;
        let stale_before = self.clock.now() - chrono_duration(self.settings.provision_timeout);
        let parallel = self.settings.pool_fill_parallelism.max(1);
        for pool in &self.pools {
            let have = self
                .state
                .pool_list()
                .await?
                .iter()
                .filter(|e| {
                    e.pool == pool.name && (e.sandbox_id.is_some() || e.created_at >= stale_before)
                })
                .count();
            let mut missing = pool.size.saturating_sub(have);
            while missing > 0 {
                if self.cancel.is_cancelled() {
                    return Ok(created);
                }
                // A batch runs every create to its end, failed or not: none is dropped
                // half-way, which could leave a sandbox that no pool entry names.
                let batch = missing.min(parallel);
                let results =
                    futures::future::join_all((0..batch).map(|_| self.fill_one(pool))).await;
                missing -= batch;
                let mut failed = None;
                for result in results {
                    match result {
                        Ok(()) => created += 1,
                        Err(e) => {
                            failed.get_or_insert(e);
                        }
                    }
                }
                if let Some(e) = failed {
                    return Err(e);
                }
            }
        }
        Ok(created)
    }

    /// Creates one sandbox for `pool` and records it as ready.
    async fn fill_one(&self, pool: &crate::manager::WarmPool) -> Result<()> {
        let mut entry = PoolEntry::new(&pool.name, self.clock.now());
        // The entry goes in first so a concurrent reconcile sees the sandbox as in
        // flight, never as an orphan.
        self.state.pool_put(&entry).await?;
        lock(&self.own_slots).insert(entry.slot.clone());
        let spec = pool
            .spec
            .clone()
            .label(LABEL_MANAGER, &self.manager_id)
            .label(LABEL_STORE, &self.store_id)
            .label(LABEL_POOL, &pool.name)
            .label(LABEL_POOL_SLOT, &entry.slot);
        let info = match self.create_sandbox(&spec).await {
            Ok(info) => info,
            Err(e) => {
                self.state.pool_remove(&entry.slot).await?;
                lock(&self.own_slots).remove(&entry.slot);
                return Err(e.context(format_args!("filling warm pool {}", pool.name)));
            }
        };
        entry.sandbox_id = Some(info.id.clone());
        if let Err(e) = self.state.pool_put(&entry).await {
            let _ = self.destroy_sandbox(&info.id).await;
            return Err(e);
        }
        self.emit(
            self.event(EventKind::PoolFilled)
                .sandbox(&info.id)
                .detail(&pool.name),
        );
        Ok(())
    }

    /// A ready sandbox from the pool whose spec equals `spec`, if there is one.
    pub(crate) async fn take_from_pool(
        &self,
        spec: &SandboxSpec,
        taken_id: &mut Option<SandboxId>,
        record: &(dyn Fn(&SandboxId) -> SessionRecord + Sync),
    ) -> Result<Option<SandboxInfo>> {
        let Some(pool) = self.pools.iter().find(|p| p.spec == *spec) else {
            return Ok(None);
        };
        let taken = self.take_ready(pool, taken_id, record).await;
        // Whatever happened, the pool needs refilling. Woken only now, after the take,
        // a fill that starts at once counts the pool without the taken sandbox; woken
        // before it, a fill could find the pool still full and sleep through the gap.
        self.pool_wakeup.notify_one();
        taken
    }

    /// Takes the oldest ready sandbox of `pool` that is still running; dead ones found
    /// on the way are dropped. Each candidate's session record (`record`) is written
    /// while the candidate is inspected, so the two round trips overlap; `taken_id`
    /// names the one returned, or the one whose record could not be written, for the
    /// caller to destroy.
    async fn take_ready(
        &self,
        pool: &crate::manager::WarmPool,
        taken_id: &mut Option<SandboxId>,
        record: &(dyn Fn(&SandboxId) -> SessionRecord + Sync),
    ) -> Result<Option<SandboxInfo>> {
        while let Some(entry) = self.state.pool_take(&pool.name).await? {
            lock(&self.own_slots).remove(&entry.slot);
            let Some(id) = entry.sandbox_id else { continue };
            let session = record(&id);
            let (inspected, recorded) =
                futures::join!(self.backend.inspect(&id), self.state.put(&session));
            if let Err(e) = recorded {
                *taken_id = Some(id);
                return Err(e);
            }
            match inspected {
                Ok(info) if info.status == SandboxStatus::Running => {
                    *taken_id = Some(id);
                    return Ok(Some(info));
                }
                Ok(_) => {
                    let _ = self.destroy_sandbox(&id).await;
                }
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => {
                    let _ = self.destroy_sandbox(&id).await;
                    return Err(e);
                }
            }
        }
        Ok(None)
    }
}
