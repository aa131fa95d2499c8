//! Acquire: reconnect to a session's live sandbox, or claim a slot under the tenant
//! limit and provision one (restore, warm pool, or create).

use super::*;

impl<B: SandboxBackend> Inner<B> {
    /// The labels every sandbox of `key` carries.
    /// Creates a sandbox: every sandbox the manager makes starts here, so a spec the
    /// backend cannot honour is refused before the backend is called (third-party
    /// backends that forget the check included).
    pub(crate) async fn create_sandbox(&self, spec: &SandboxSpec) -> Result<SandboxInfo> {
        spec.check_supported(&self.backend.capabilities())?;
        self.backend.create(spec).await
    }

    pub(super) fn session_spec(&self, key: &SessionKey, spec: &SandboxSpec) -> SandboxSpec {
        spec.clone()
            .label(LABEL_MANAGER, &self.manager_id)
            .label(LABEL_STORE, &self.store_id)
            .label(LABEL_TENANT, key.tenant())
            .label(LABEL_SESSION, key.session())
    }

    /// Records activity, writing a heartbeat to the store at most every few seconds.
    pub(crate) async fn touch(&self, key: &SessionKey) {
        let now = self.clock.now();
        let interval = self
            .settings
            .idle_timeout
            .map(|t| (t / 10).min(Duration::from_secs(30)))
            .unwrap_or(Duration::from_secs(30));
        {
            let mut beats = lock(&self.heartbeats);
            if let Some(last) = beats.get(key) {
                if now - *last < chrono_duration(interval) {
                    return;
                }
            }
            beats.insert(key.clone(), now);
        }
        if let Err(e) = self.state.touch(key, now).await {
            // Activity is advisory: a missed heartbeat at worst suspends early, and the
            // suspended session is restored on next use.
            tracing::warn!(session = %key, error = %e, "could not record activity");
        }
    }

    pub(super) async fn acquire(
        &self,
        key: &SessionKey,
        spec: &SandboxSpec,
    ) -> Result<SandboxInfo> {
        spec.validate()?;
        if self.cancel.is_cancelled() {
            return Err(maintenance::shut_down_error());
        }
        let _guard = self.lock_key(key).await;
        let started = tokio::time::Instant::now();
        let mut backoff = Duration::from_millis(20);
        loop {
            match self.state.claim(&self.claim(key, spec)).await? {
                ClaimOutcome::Live(record) => {
                    if let Some(info) = self.reconnect(record).await? {
                        return Ok(info);
                    }
                    // The sandbox was gone; the record now says so. Claim again.
                }
                ClaimOutcome::Busy(_) => {
                    // Another process is provisioning this session: wait for it.
                    if started.elapsed() > self.settings.provision_timeout {
                        return Err(Error::new(
                            ErrorKind::Timeout,
                            "another manager has been provisioning this session for longer than provision_timeout",
                        ));
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
                ClaimOutcome::Claimed { previous, record } => {
                    return self.provision(key, spec, previous, &record, None).await;
                }
                ClaimOutcome::Held(record) => return Err(self.held(&record)),
                ClaimOutcome::Elsewhere(record) => return Err(self.elsewhere(&record)),
            }
        }
    }

    /// Brings a live record's sandbox back into use. `None` if it turned out to be gone or
    /// broken (the record is updated accordingly).
    pub(super) async fn reconnect(&self, mut record: SessionRecord) -> Result<Option<SandboxInfo>> {
        let Some(id) = record.sandbox_id.clone() else {
            self.mark_gone(&mut record, EventKind::Lost, "the record had no sandbox id")
                .await?;
            return Ok(None);
        };
        let info = match self.backend.inspect(&id).await {
            Ok(info) => info,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                self.mark_gone(&mut record, EventKind::Lost, "the sandbox no longer exists")
                    .await?;
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        match info.status {
            SandboxStatus::Failed | SandboxStatus::Terminated => {
                self.fail_sandbox(
                    &mut record,
                    &format!("the backend reports it {}", info.status),
                )
                .await?;
                return Ok(None);
            }
            SandboxStatus::Paused => {
                self.backend.resume(&id).await?;
                self.emit(
                    self.event(EventKind::Resumed)
                        .session(&record.key)
                        .sandbox(&id),
                );
            }
            _ => self.emit(
                self.event(EventKind::Reused)
                    .session(&record.key)
                    .sandbox(&id),
            ),
        }
        // The claim recorded the activity; a write is left only for a status change
        // (a paused sandbox resumed, a record that said otherwise).
        if record.status != SandboxStatus::Running {
            let now = self.clock.now();
            record.status = SandboxStatus::Running;
            record.last_active = now;
            record.updated_at = now;
            self.state.put(&record).await?;
        }
        let mut info = info;
        info.status = SandboxStatus::Running;
        Ok(Some(info))
    }

    /// A claim on `key` for provisioning it from `spec`, under the tenant limit.
    pub(super) fn claim(&self, key: &SessionKey, spec: &SandboxSpec) -> Claim {
        let now = self.clock.now();
        Claim::new(
            SessionRecord::provisioning(key.clone(), self.backend.name(), spec.clone(), now),
            &self.manager_id,
            now + chrono_duration(self.settings.lease_ttl),
            self.settings.max_sandboxes_per_tenant,
            now - chrono_duration(self.settings.provision_timeout),
        )
    }

    /// Provisions a claimed session (`claimed` is the record the claim wrote, with this
    /// manager's lease): restore `snapshot` (or the latest one) into a fresh sandbox,
    /// else take a warm-pool sandbox, else create. On error, the sandbox is destroyed and
    /// the claim rolled back.
    pub(super) async fn provision(
        &self,
        key: &SessionKey,
        spec: &SandboxSpec,
        previous: Option<SessionRecord>,
        claimed: &SessionRecord,
        snapshot: Option<SnapshotManifest>,
    ) -> Result<SandboxInfo> {
        let snapshot = match snapshot {
            Some(m) => Some(m),
            None => self.snapshots.list(key).await?.pop(),
        };
        let mut created: Option<SandboxId> = None;
        let session_created_at = previous.as_ref().map(|p| p.created_at);
        let work = self.provision_inner(
            key,
            spec,
            snapshot.as_ref(),
            session_created_at,
            claimed,
            &mut created,
        );
        let result = self.renewing_claim(key, work).await;
        match result {
            Ok(info) => Ok(info),
            Err(e) => {
                if let Some(id) = created {
                    if let Err(destroy) = self.destroy_sandbox(&id).await {
                        tracing::error!(sandbox = %id, error = %destroy, "could not destroy a sandbox after a failed acquire; reconcile will");
                    }
                }
                // Under the claim's lease: a manager that took the session over since
                // keeps what it wrote.
                let rollback = match previous {
                    Some(mut prev) if prev.status != SandboxStatus::Provisioning => {
                        prev.lease.clone_from(&claimed.lease);
                        self.state.put(&prev).await
                    }
                    _ => self.state.delete(key, claimed.token()).await,
                };
                if let Err(rollback) = rollback {
                    tracing::error!(session = %key, error = %rollback, "could not roll back a claim; it expires after provision_timeout");
                }
                Err(e)
            }
        }
    }

    /// Runs `work` while renewing this manager's lease on `key`'s claim. The store's
    /// `renew_leases` leaves claims to their claimer, so a claim outlives its lease
    /// only while the process that made it works on it: one left by a process that
    /// died is abandoned even when a process with the same manager id (a restart) lives.
    async fn renewing_claim<T>(
        &self,
        key: &SessionKey,
        work: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        tokio::pin!(work);
        let period = (self.settings.lease_ttl / 3).max(Duration::from_millis(50));
        loop {
            tokio::select! {
                result = &mut work => return result,
                () = tokio::time::sleep(period) => {
                    let now = self.clock.now();
                    let renewed = self
                        .state
                        .take_lease(key, &self.manager_id, now, self.lease_until())
                        .await;
                    if let Err(e) = renewed {
                        // The claim's final write is fenced: if another manager took the
                        // session over meanwhile, that write fails and the claim rolls back.
                        tracing::warn!(session = %key, error = %e, "could not renew the lease of a claim being provisioned");
                    }
                }
            }
        }
    }

    pub(super) async fn provision_inner(
        &self,
        key: &SessionKey,
        spec: &SandboxSpec,
        snapshot: Option<&SnapshotManifest>,
        session_created_at: Option<DateTime<Utc>>,
        claimed: &SessionRecord,
        created: &mut Option<SandboxId>,
    ) -> Result<SandboxInfo> {
        // A snapshot holds the workspace relative to the template it was taken from
        // (incremental snapshots hold only the changes), so that template, not the
        // caller's, is the one the restored sandbox must start from.
        let rebased;
        let spec = match snapshot {
            Some(manifest) if manifest.template != spec.template => {
                tracing::debug!(
                    session = %key,
                    requested = %spec.template,
                    snapshot = %manifest.template,
                    "restoring onto the snapshot's template"
                );
                let mut s = spec.clone();
                s.template = manifest.template.clone();
                rebased = s;
                &rebased
            }
            _ => spec,
        };
        let record_of = |id: &SandboxId| {
            let now = self.clock.now();
            let mut record =
                SessionRecord::provisioning(key.clone(), self.backend.name(), spec.clone(), now);
            record.created_at = session_created_at.unwrap_or(now);
            record.status = SandboxStatus::Running;
            record.sandbox_id = Some(id.clone());
            record.sandbox_created_at = Some(now);
            record.lease.clone_from(&claimed.lease);
            record
        };
        let (info, kind) = match snapshot {
            Some(manifest) => {
                let info = self.create_sandbox(&self.session_spec(key, spec)).await?;
                *created = Some(info.id.clone());
                self.restore_into(key, &info.id, manifest).await?;
                self.state.put(&record_of(&info.id)).await?;
                (info, EventKind::Restored)
            }
            // The pool's sandbox is recorded while it is checked: the two round trips
            // overlap (a dead one is replaced, and so is its record).
            None => match self.take_from_pool(spec, created, &record_of).await? {
                Some(info) => (info, EventKind::Created),
                None => {
                    let info = self.create_sandbox(&self.session_spec(key, spec)).await?;
                    *created = Some(info.id.clone());
                    self.state.put(&record_of(&info.id)).await?;
                    (info, EventKind::Created)
                }
            },
        };
        let mut event = self.event(kind).session(key).sandbox(&info.id);
        if let Some(m) = snapshot {
            event = event.snapshot(&m.id);
        }
        self.emit(event);
        Ok(info)
    }
}
