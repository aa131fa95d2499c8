//! Release and the ways a session loses its sandbox: destroy (one path, which also
//! drops background records and service ports), detach, failure, purge.

use super::*;

impl<B: SandboxBackend> Inner<B> {
    /// Destroys a sandbox: the one way the manager does, so the records of its
    /// background processes and its services' ports always go with it.
    pub(crate) async fn destroy_sandbox(&self, id: &SandboxId) -> Result<()> {
        self.backend.destroy(id).await?;
        self.background.forget_sandbox(id);
        self.services.forget_sandbox(id);
        Ok(())
    }

    /// Records that the session no longer has a sandbox, with its new `status`.
    pub(crate) async fn detach(
        &self,
        record: &mut SessionRecord,
        status: SandboxStatus,
    ) -> Result<()> {
        record.status = status;
        // Its background processes went with the sandbox; drop their records.
        if let Some(id) = record.sandbox_id.take() {
            self.background.forget_sandbox(&id);
            self.services.forget_sandbox(&id);
        }
        record.sandbox_created_at = None;
        record.updated_at = self.clock.now();
        self.state.put(record).await
    }

    /// The record's sandbox disappeared: the session is suspended if it has a snapshot to
    /// come back from, terminated otherwise.
    pub(crate) async fn mark_gone(
        &self,
        record: &mut SessionRecord,
        kind: EventKind,
        why: &str,
    ) -> Result<()> {
        let has_snapshot = !self.snapshots.list(&record.key).await?.is_empty();
        let mut event = self.event(kind).session(&record.key).detail(why);
        if let Some(id) = &record.sandbox_id {
            event = event.sandbox(id);
        }
        tracing::warn!(session = %record.key, sandbox = ?record.sandbox_id, why, "session lost its sandbox");
        let status = if has_snapshot {
            SandboxStatus::Suspended
        } else {
            SandboxStatus::Terminated
        };
        self.detach(record, status).await?;
        self.emit(event);
        Ok(())
    }

    /// Marks a session failed and destroys its sandbox (its snapshots stay, so the next
    /// acquire restores the latest one).
    pub(crate) async fn fail_sandbox(&self, record: &mut SessionRecord, why: &str) -> Result<()> {
        if let Some(id) = record.sandbox_id.clone() {
            self.destroy_sandbox(&id).await?;
            self.emit(
                self.event(EventKind::Failed)
                    .session(&record.key)
                    .sandbox(&id)
                    .detail(why),
            );
        }
        tracing::warn!(session = %record.key, why, "sandbox failed");
        self.detach(record, SandboxStatus::Failed).await
    }

    pub(super) async fn release(&self, key: &SessionKey, mode: ReleaseMode) -> Result<()> {
        let _guard = self.lock_key(key).await;
        let mut record = self.take_lease(key).await?;
        if let Some(id) = &record.sandbox_id {
            tracing::Span::current().record("sandbox", id.as_str());
        }
        let live = record.is_live();
        match mode {
            ReleaseMode::Keep => {
                if live && record.status != SandboxStatus::Paused {
                    record.status = SandboxStatus::Idle;
                    record.last_active = self.clock.now();
                    record.updated_at = record.last_active;
                    self.state.put(&record).await?;
                }
            }
            ReleaseMode::Suspend if live => match self.settings.suspend {
                SuspendStrategy::Pause => {
                    let id = live_sandbox(&record)?;
                    self.backend.pause(&id).await?;
                    record.status = SandboxStatus::Paused;
                    record.updated_at = self.clock.now();
                    self.state.put(&record).await?;
                    self.emit(self.event(EventKind::Suspended).session(key).sandbox(&id));
                }
                _ => {
                    self.suspend_record(&mut record, EventKind::Suspended)
                        .await?
                }
            },
            ReleaseMode::Suspend => {}
            ReleaseMode::Destroy => {
                if let Some(id) = record.sandbox_id.clone() {
                    self.destroy_sandbox(&id).await?;
                    self.emit(self.event(EventKind::Destroyed).session(key).sandbox(&id));
                }
                self.detach(&mut record, SandboxStatus::Terminated).await?;
            }
            ReleaseMode::Purge => {
                if let Some(id) = record.sandbox_id.take() {
                    self.destroy_sandbox(&id).await?;
                }
                for manifest in self.snapshots.list(key).await? {
                    self.snapshots
                        .delete(&SnapshotKey::new(key.clone(), manifest.id)?)
                        .await?;
                }
                self.state.delete(key, record.token()).await?;
                self.emit(self.event(EventKind::Purged).session(key));
            }
        }
        if mode != ReleaseMode::Keep {
            lock(&self.owned).remove(key);
            lock(&self.heartbeats).remove(key);
        }
        Ok(())
    }
}
