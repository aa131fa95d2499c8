//! The egress proxies one backend instance serves, by sandbox: what a backend keeps so
//! destroy stops a proxy, `set_network` reaches it and metrics read its counts.

use std::collections::HashMap;
use std::sync::Mutex;

use super::{Allowlist, EgressCount, EgressProxy};
use crate::SandboxId;

/// Proxies by sandbox, each with the task serving its listener; removing one aborts
/// the task, which closes its connections.
#[derive(Debug, Default)]
pub struct ServedProxies {
    running: Mutex<HashMap<SandboxId, Served>>,
}

#[derive(Debug)]
struct Served {
    proxy: EgressProxy,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ServedProxies {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SandboxId, Served>> {
        // Whole entries are inserted and removed at once: a poisoned map is intact.
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a proxy is served for `id`.
    pub fn serves(&self, id: &SandboxId) -> bool {
        self.lock().contains_key(id)
    }

    /// Records `proxy`, served by `task`, for `id` (replacing and stopping any other).
    pub fn insert(&self, id: SandboxId, proxy: EgressProxy, task: tokio::task::JoinHandle<()>) {
        self.lock().insert(id, Served { proxy, task });
    }

    /// Stops serving `id`.
    pub fn forget(&self, id: &SandboxId) {
        self.lock().remove(id);
    }

    /// Gives the proxy of `id` a new allowlist; `false` if none is served here.
    pub fn set_allowlist(&self, id: &SandboxId, allowlist: Allowlist) -> bool {
        match self.lock().get(id) {
            Some(served) => {
                served.proxy.set_allowlist(allowlist);
                true
            }
            None => false,
        }
    }

    /// The counts of the proxy of `id` (empty if none is served here).
    pub fn counts(&self, id: &SandboxId) -> Vec<EgressCount> {
        self.lock()
            .get(id)
            .map(|served| served.proxy.counts())
            .unwrap_or_default()
    }
}
