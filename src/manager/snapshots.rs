//! Snapshots of sessions: writing them through the one capture path, suspending, and
//! restoring one into a fresh sandbox (swapped in for a live session).

use super::*;

impl<B: SandboxBackend> Inner<B> {
    pub(super) async fn restore_into(
        &self,
        key: &SessionKey,
        id: &SandboxId,
        manifest: &SnapshotManifest,
    ) -> Result<()> {
        let snap_key = SnapshotKey::new(key.clone(), manifest.id.clone())?;
        let blob = self.snapshots.blob(&snap_key).await?;
        let reader = crate::raw::stream::stream_to_reader(blob);
        crate::snapshot::restore(
            &self.backend,
            id,
            &SandboxPath::root(),
            reader,
            manifest,
            ImportOptions::default(),
        )
        .await
        .map_err(|e| e.context(format_args!("restoring snapshot {snap_key}")))
    }

    /// Packs the workspace of `id` into the snapshot store: only the changes since the
    /// template where the backend can tell, the whole workspace otherwise.
    ///
    /// `leased` is the session's record under this manager's lease: a snapshot that
    /// commits after the lease was taken over is deleted again and refused (`Conflict`),
    /// so a manager that lost the session cannot shadow the new owner's snapshots.
    pub(crate) async fn snapshot_sandbox(
        &self,
        leased: &SessionRecord,
        id: &SandboxId,
    ) -> Result<SnapshotManifest> {
        if self.backend.capabilities().files_while_paused
            || self.backend.inspect(id).await?.status != SandboxStatus::Paused
        {
            return self.write_snapshot(leased, id).await;
        }
        // This backend reaches files through the sandbox's own processes: thaw it for
        // the export, and leave it paused again whatever the export did.
        self.backend.resume(id).await?;
        let snapshot = self.write_snapshot(leased, id).await;
        let paused_again = self.backend.pause(id).await;
        let snapshot = snapshot?;
        paused_again.map(|()| snapshot)
    }

    /// Exports the workspace of `id` and stores it as a new snapshot of the session.
    pub(super) async fn write_snapshot(
        &self,
        leased: &SessionRecord,
        id: &SandboxId,
    ) -> Result<SnapshotManifest> {
        let key = &leased.key;
        let now = self.clock.now();
        let snapshot_id = format!(
            "{}-{}",
            now.format("%Y%m%dT%H%M%S%.6fZ"),
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        let snap_key = SnapshotKey::new(key.clone(), snapshot_id.clone())?;
        let opts = PackOptions {
            level: self.settings.snapshot_level,
            ..PackOptions::default()
        };
        // The one capture path tests and helpers take too.
        let mut capture = crate::snapshot::capture_stream(
            &*self.backend,
            id,
            crate::snapshot::CaptureScope::ChangesOrWorkspace,
            &opts,
        )
        .await?;
        self.snapshots
            .put_blob(&snap_key, capture.take_blob())
            .await?;
        let mut manifest = match capture.finish().await {
            Ok(manifest) => manifest,
            Err(e) => {
                self.discard(&snap_key).await;
                return Err(e);
            }
        };
        manifest.id = snapshot_id.clone();
        manifest.created_at = now;
        if let Err(e) = self.snapshots.put_manifest(&snap_key, &manifest).await {
            self.discard(&snap_key).await;
            return Err(e);
        }
        // The snapshot store cannot check a fencing token in its commit: check right
        // after it, and take back a snapshot written under a lost lease.
        let stored = self.state.get(key).await;
        if let Err(e) = stored.and_then(|s| check_fence(key, s.as_ref(), leased.token())) {
            self.discard(&snap_key).await;
            return Err(e);
        }
        self.emit(
            self.event(EventKind::Snapshotted)
                .session(key)
                .sandbox(id)
                .snapshot(&snapshot_id),
        );
        Ok(manifest)
    }

    /// Deletes a half-written snapshot (best effort: without a manifest it is invisible).
    pub(super) async fn discard(&self, key: &SnapshotKey) {
        if let Err(e) = self.snapshots.delete(key).await {
            tracing::warn!(snapshot = %key, error = %e, "could not delete a half-written snapshot");
        }
    }

    /// Snapshot, then destroy; the record becomes `Suspended`. A failed snapshot is
    /// emitted as `SnapshotFailed` and returned, and the sandbox is kept.
    pub(crate) async fn suspend_record(
        &self,
        record: &mut SessionRecord,
        kind: EventKind,
    ) -> Result<()> {
        let id = live_sandbox(record)?;
        let manifest = match self.snapshot_sandbox(record, &id).await {
            Ok(m) => m,
            Err(e) => {
                self.emit(
                    self.event(EventKind::SnapshotFailed)
                        .session(&record.key)
                        .sandbox(&id)
                        .error(&e),
                );
                return Err(e);
            }
        };
        self.finish_suspend(record, &id, &manifest, kind).await
    }

    /// After a successful snapshot: destroy the sandbox and record the session suspended.
    pub(crate) async fn finish_suspend(
        &self,
        record: &mut SessionRecord,
        id: &SandboxId,
        manifest: &SnapshotManifest,
        kind: EventKind,
    ) -> Result<()> {
        self.destroy_sandbox(id).await?;
        self.detach(record, SandboxStatus::Suspended).await?;
        self.emit(
            self.event(kind)
                .session(&record.key)
                .sandbox(id)
                .snapshot(&manifest.id),
        );
        Ok(())
    }

    pub(super) async fn restore(&self, key: &SessionKey, snapshot_id: &str) -> Result<SandboxInfo> {
        let _guard = self.lock_key(key).await;
        let record = self.take_lease(key).await?;
        let manifest = self
            .snapshots
            .manifest(&SnapshotKey::new(key.clone(), snapshot_id)?)
            .await?;
        let live = record.is_live();
        if !live {
            // No sandbox yet: claim a slot under the tenant limit, then provision from
            // this snapshot.
            return match self.state.claim(&self.claim(key, &record.spec)).await? {
                ClaimOutcome::Claimed {
                    previous,
                    record: claimed,
                } => {
                    self.provision(key, &record.spec, previous, &claimed, Some(manifest))
                        .await
                }
                ClaimOutcome::Held(record) => Err(self.held(&record)),
                _ => Err(Error::new(
                    ErrorKind::InvalidState,
                    "the session was acquired concurrently; retry the restore",
                )),
            };
        }
        // Live: restore into a fresh sandbox, then swap it in.
        let fresh = self
            .create_sandbox(&self.session_spec(key, &record.spec))
            .await?;
        tracing::Span::current().record("sandbox", fresh.id.as_str());
        if let Err(e) = self.restore_into(key, &fresh.id, &manifest).await {
            if let Err(d) = self.destroy_sandbox(&fresh.id).await {
                tracing::error!(sandbox = %fresh.id, error = %d, "could not destroy a sandbox after a failed restore; reconcile will");
            }
            return Err(e);
        }
        let old = record.sandbox_id.clone();
        let mut record = record;
        let now = self.clock.now();
        record.status = SandboxStatus::Running;
        record.sandbox_id = Some(fresh.id.clone());
        record.sandbox_created_at = Some(now);
        record.last_active = now;
        record.updated_at = now;
        self.state.put(&record).await?;
        if let Some(old) = old {
            if let Err(e) = self.destroy_sandbox(&old).await {
                tracing::warn!(sandbox = %old, error = %e, "could not destroy the replaced sandbox; reconcile will");
            }
        }
        self.emit(
            self.event(EventKind::Restored)
                .session(key)
                .sandbox(&fresh.id)
                .snapshot(&manifest.id),
        );
        Ok(fresh)
    }
}
