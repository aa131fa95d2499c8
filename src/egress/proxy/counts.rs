//! What the proxy counts: connections allowed and denied, by host, in a bounded map.

use serde::{Deserialize, Serialize};

use super::EgressProxy;

/// Hosts counted one by one; beyond this many the rest share one entry, so a sandbox
/// asking for endless names cannot grow the proxy's memory.
pub(super) const MAX_COUNTED_HOSTS: usize = 1024;
/// The entry hosts beyond the first 1,024 counted are counted under.
pub const OTHER_HOSTS: &str = "(other hosts)";

/// Connections to one host the proxy allowed and denied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct EgressCount {
    /// The host as the sandbox asked for it: a name, or an address.
    pub host: String,
    /// Connections the allowlist allowed (made or not: a refused or unreachable
    /// upstream still counts).
    pub allowed: u64,
    /// Connections the allowlist refused.
    pub denied: u64,
}

impl EgressCount {
    /// Counts for `host`.
    pub fn new(host: &str, allowed: u64, denied: u64) -> Self {
        EgressCount {
            host: host.to_owned(),
            allowed,
            denied,
        }
    }
}

impl EgressProxy {
    /// Connections allowed and denied so far, by host, sorted by host.
    pub fn counts(&self) -> Vec<EgressCount> {
        self.inner
            .counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    pub(super) fn count(&self, host: &str, allowed: bool) {
        let mut counts = self.inner.counts.lock().unwrap_or_else(|p| p.into_inner());
        let key = if counts.contains_key(host) || counts.len() < MAX_COUNTED_HOSTS {
            host
        } else {
            OTHER_HOSTS
        };
        let entry = counts
            .entry(key.to_owned())
            .or_insert_with(|| EgressCount::new(key, 0, 0));
        if allowed {
            entry.allowed += 1;
        } else {
            entry.denied += 1;
        }
    }
}
