//! Egress reports: how many connections each session's sandbox made through its egress
//! proxy since the last report, per host, as [`EventKind::Egress`] events.

use std::collections::{HashMap, HashSet};

use crate::backend::SandboxBackend;
use crate::egress::EgressCount;
use crate::error::Result;
use crate::manager::{lock, EventKind, Inner, SandboxManager};
use crate::spec::Network;
use crate::SandboxId;

impl<B: SandboxBackend> SandboxManager<B> {
    /// Reads the egress counts of this manager's live allowlisted sessions
    /// ([`SandboxMetrics::egress`](crate::SandboxMetrics::egress)) and emits one
    /// [`EventKind::Egress`] event per session whose counts grew since the last report,
    /// carrying the increase per host. Answers how many events it emitted. The
    /// background reaper calls this after each pass; call it yourself on your own
    /// schedule when the reaper is off. Sessions another manager holds are its to
    /// report; a sandbox that cannot be read is skipped until the next report.
    ///
    /// Counts live in the process that serves a sandbox's proxy: after a backend
    /// restarts, its counts start again from zero and the next report carries them
    /// whole.
    pub async fn report_egress(&self) -> Result<usize> {
        self.inner.report_egress().await
    }
}

impl<B: SandboxBackend> Inner<B> {
    pub(crate) async fn report_egress(&self) -> Result<usize> {
        let capabilities = self.backend.capabilities();
        if !capabilities.metrics || !capabilities.network_allowlist {
            return Ok(0);
        }
        let records = self.state.list(None).await?;
        let now = self.clock.now();
        let mut live = HashSet::new();
        let mut emitted = 0;
        for record in &records {
            let Some(id) = &record.sandbox_id else {
                continue;
            };
            if record.backend != self.backend.name()
                || !record.is_live()
                || !matches!(record.spec.network, Network::Allowlist(_))
                || record.held_against(&self.manager_id, now).is_some()
            {
                continue;
            }
            live.insert(id.clone());
            let counts = match self.backend.metrics(id).await {
                Ok(metrics) => metrics.egress,
                Err(e) => {
                    tracing::debug!(sandbox = %id, error = %e, "no egress counts this time");
                    continue;
                }
            };
            let grown = {
                let mut seen = lock(&self.egress_seen);
                let grown = increase(seen.get(id).map(Vec::as_slice).unwrap_or(&[]), &counts);
                seen.insert(id.clone(), counts);
                grown
            };
            if !grown.is_empty() {
                self.emit(
                    self.event(EventKind::Egress)
                        .session(&record.key)
                        .sandbox(id)
                        .egress(grown),
                );
                emitted += 1;
            }
        }
        lock(&self.egress_seen).retain(|id, _| live.contains(id));
        Ok(emitted)
    }
}

/// What `now` counts beyond `before`, per host, leaving out hosts with no change. A
/// host whose count fell (the proxy restarted and counts again from zero) reports its
/// new count whole.
pub(crate) fn increase(before: &[EgressCount], now: &[EgressCount]) -> Vec<EgressCount> {
    let before: HashMap<&str, &EgressCount> = before.iter().map(|c| (c.host.as_str(), c)).collect();
    now.iter()
        .filter_map(|count| {
            let (allowed, denied) = match before.get(count.host.as_str()) {
                Some(old) if count.allowed >= old.allowed && count.denied >= old.denied => {
                    (count.allowed - old.allowed, count.denied - old.denied)
                }
                _ => (count.allowed, count.denied),
            };
            (allowed > 0 || denied > 0).then(|| EgressCount::new(&count.host, allowed, denied))
        })
        .collect()
}

/// The last counts read per sandbox.
pub(crate) type EgressSeen = std::sync::Mutex<HashMap<SandboxId, Vec<EgressCount>>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn increase_is_per_host_and_survives_a_restart() {
        let before = [EgressCount::new("a", 2, 1), EgressCount::new("b", 5, 0)];
        let now = [
            EgressCount::new("a", 4, 1),
            EgressCount::new("b", 1, 0),
            EgressCount::new("c", 0, 3),
        ];
        assert_eq!(
            increase(&before, &now),
            [
                EgressCount::new("a", 2, 0),
                EgressCount::new("b", 1, 0),
                EgressCount::new("c", 0, 3),
            ]
        );
        assert!(increase(&now, &now).is_empty());
    }
}
