//! Resource readings: what [`SandboxBackend::metrics`](crate::SandboxBackend::metrics)
//! reports.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// A point-in-time reading of one sandbox's resource use. Each field is `None` where
/// the backend cannot know it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SandboxMetrics {
    /// When the reading was taken.
    pub at: DateTime<Utc>,
    /// CPU time (user and system) used by the sandbox's processes so far, ended ones
    /// included where the backend accounts for them (a cgroup does).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "crate::config::duration::option"
    )]
    pub cpu_time: Option<Duration>,
    /// Memory in use, in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    /// The memory limit, in bytes, where one is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_limit_bytes: Option<u64>,
    /// Processes running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processes: Option<u64>,
    /// Bytes of the workspace's files (what the sandbox wrote, for an overlay over a
    /// template: the template's files and the changes to them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_bytes: Option<u64>,
    /// The disk limit, in bytes, where one is set
    /// ([`Limits::disk_bytes`](crate::Limits::disk_bytes)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_limit_bytes: Option<u64>,
    /// Connections the sandbox's egress proxy allowed and denied, by host, for a
    /// sandbox with [`Network::Allowlist`](crate::Network::Allowlist) (empty otherwise).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<crate::egress::EgressCount>,
}

impl SandboxMetrics {
    /// A reading taken now, with every field unknown; backends fill in what they know.
    pub fn now() -> Self {
        SandboxMetrics {
            at: Utc::now(),
            cpu_time: None,
            memory_bytes: None,
            memory_limit_bytes: None,
            processes: None,
            disk_bytes: None,
            disk_limit_bytes: None,
            egress: Vec::new(),
        }
    }
}
