//! Fork: a session's live sandbox cloned into a new session, claimed under the tenant
//! limit like any acquire.

use super::*;

impl<B: SandboxBackend> Inner<B> {
    pub(super) async fn fork(
        &self,
        source: &SessionKey,
        target: &SessionKey,
    ) -> Result<SandboxInfo> {
        if source == target {
            return Err(Error::invalid_input(format!(
                "cannot fork session {source} into itself"
            )));
        }
        if !self.backend.capabilities().clone {
            return Err(Error::unsupported(format!(
                "backend {} cannot clone a running sandbox",
                self.backend.name()
            )));
        }
        if self.cancel.is_cancelled() {
            return Err(maintenance::shut_down_error());
        }
        // Both keys held, in one order whichever way round they are asked for, so two
        // forks between the same sessions cannot deadlock.
        let (first, second) = if source < target {
            (source, target)
        } else {
            (target, source)
        };
        let _first = self.lock_key(first).await;
        let _second = self.lock_key(second).await;

        let record = self.record(source).await?;
        self.refuse_elsewhere(&record)?;
        let source_id = live_sandbox(&record)?;
        let spec = record.spec.clone();
        let claimed = match self.state.claim(&self.claim(target, &spec)).await? {
            ClaimOutcome::Claimed {
                previous: None,
                record,
            } => record,
            outcome => {
                // The target exists (live, being provisioned, or suspended with its
                // snapshots): a fork never replaces a session.
                if let ClaimOutcome::Claimed {
                    previous: Some(mut previous),
                    record,
                } = outcome
                {
                    previous.lease = record.lease;
                    self.state.put(&previous).await?;
                }
                return Err(Error::new(
                    ErrorKind::AlreadyExists,
                    format!("session {target} already exists; fork into a new session"),
                ));
            }
        };
        let labels = self.session_spec(target, &spec).labels;
        let cloned = match self.backend.clone_sandbox(&source_id, labels).await {
            Ok(info) => info,
            Err(e) => {
                self.roll_back_claim(&claimed).await;
                return Err(e);
            }
        };
        let now = self.clock.now();
        let mut forked =
            SessionRecord::provisioning(target.clone(), self.backend.name(), spec, now);
        forked.status = SandboxStatus::Running;
        forked.sandbox_id = Some(cloned.id.clone());
        forked.sandbox_created_at = Some(now);
        forked.lease.clone_from(&claimed.lease);
        if let Err(e) = self.state.put(&forked).await {
            if let Err(destroy) = self.destroy_sandbox(&cloned.id).await {
                tracing::error!(sandbox = %cloned.id, error = %destroy, "could not destroy a clone after a failed fork; reconcile will");
            }
            self.roll_back_claim(&claimed).await;
            return Err(e);
        }
        self.emit(
            self.event(EventKind::Forked)
                .session(target)
                .sandbox(&cloned.id)
                .detail(format_args!("from session {source}")),
        );
        Ok(cloned)
    }

    async fn roll_back_claim(&self, claimed: &SessionRecord) {
        let key = &claimed.key;
        if let Err(e) = self.state.delete(key, claimed.token()).await {
            tracing::error!(session = %key, error = %e, "could not roll back a claim; it expires after provision_timeout");
        }
    }
}
