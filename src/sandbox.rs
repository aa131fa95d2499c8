//! Sandbox identity and state: `SandboxId`, `SandboxInfo`, `SandboxStatus`, `LabelSelector`.

use std::collections::BTreeMap;
use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// A backend-assigned sandbox id: non-empty, at most 128 bytes of `[A-Za-z0-9._-]`.
///
/// The character set keeps ids safe as directory names, container names and URL segments.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SandboxId(String);

impl SandboxId {
    /// Validates `id`.
    pub fn new(id: impl Into<String>) -> Result<Self> {
        let id = id.into();
        validate_name("sandbox id", &id)?;
        Ok(SandboxId(id))
    }

    /// A fresh random id with a prefix (`"mock-3f2a..."`). The prefix must itself be valid.
    pub fn generate(prefix: &str) -> Self {
        let id = format!("{prefix}-{}", uuid::Uuid::new_v4().simple());
        // A bad prefix is a programming error in a backend; fall back to a bare uuid
        // rather than panicking.
        SandboxId::new(id).unwrap_or_else(|_| SandboxId(uuid::Uuid::new_v4().simple().to_string()))
    }

    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The rule for names that end up in file names, labels and URLs (sandbox ids, tenants,
/// session and snapshot ids): 1-128 characters from `[A-Za-z0-9._-]`, not starting with `.`.
pub(crate) fn validate_name(what: &str, value: &str) -> Result<()> {
    let ok = !value.is_empty()
        && value.len() <= 128
        && !value.starts_with('.')
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(Error::invalid_input(format!(
            "invalid {what} {value:?}: use 1-128 characters from [A-Za-z0-9._-], not starting with '.'"
        )))
    }
}

impl fmt::Debug for SandboxId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for SandboxId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for SandboxId {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        SandboxId::new(s)
    }
}

impl TryFrom<String> for SandboxId {
    type Error = Error;
    fn try_from(s: String) -> Result<Self> {
        SandboxId::new(s)
    }
}

impl From<SandboxId> for String {
    fn from(id: SandboxId) -> String {
        id.0
    }
}

/// Where a sandbox is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum SandboxStatus {
    /// Being created.
    Provisioning,
    /// Ready to run commands.
    Running,
    /// Frozen by `pause`; `resume` continues it.
    Paused,
    /// Running but unused (set by the manager).
    Idle,
    /// Snapshotted and destroyed; `acquire` restores it (set by the manager).
    Suspended,
    /// Gone.
    Terminated,
    /// Broken; it will not run commands again.
    Failed,
}

impl SandboxStatus {
    /// The status as its serialized string.
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxStatus::Provisioning => "provisioning",
            SandboxStatus::Running => "running",
            SandboxStatus::Paused => "paused",
            SandboxStatus::Idle => "idle",
            SandboxStatus::Suspended => "suspended",
            SandboxStatus::Terminated => "terminated",
            SandboxStatus::Failed => "failed",
        }
    }
}

impl fmt::Display for SandboxStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a backend reports about one sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SandboxInfo {
    /// The id.
    pub id: SandboxId,
    /// The backend's name (`"local"`, `"docker"`, `"mock"` ...).
    pub backend: String,
    /// The template it was created from.
    pub template: String,
    /// Current status.
    pub status: SandboxStatus,
    /// Labels given at creation.
    pub labels: BTreeMap<String, String>,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// The network policy the sandbox has: never [`Network::Default`](crate::Network::Default),
    /// which the backend resolves at create. A peer that predates the field reports
    /// `Default`, meaning "not said".
    #[serde(default)]
    pub network: crate::Network,
    /// Backend-specific facts worth showing (e.g. `"workspace": "overlay"`, a container id).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub details: BTreeMap<String, String>,
}

impl SandboxInfo {
    /// A record for a sandbox just created from `spec`.
    pub fn new(
        id: SandboxId,
        backend: impl Into<String>,
        spec: &crate::SandboxSpec,
        status: SandboxStatus,
    ) -> Self {
        SandboxInfo {
            id,
            backend: backend.into(),
            template: spec.template.clone(),
            status,
            labels: spec.labels.clone(),
            created_at: Utc::now(),
            network: spec.network.clone(),
            details: BTreeMap::new(),
        }
    }
}

/// Selects sandboxes by label: every listed pair must match (an empty selector selects all).
///
/// ```
/// use sandcell::LabelSelector;
/// use std::collections::BTreeMap;
///
/// let sel = LabelSelector::new().label("sandcell.tenant", "acme").label_present("sandcell.manager");
/// let mut labels = BTreeMap::new();
/// labels.insert("sandcell.tenant".to_string(), "acme".to_string());
/// assert!(!sel.matches(&labels));
/// labels.insert("sandcell.manager".to_string(), "m1".to_string());
/// assert!(sel.matches(&labels));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabelSelector {
    /// Labels that must be present with exactly this value.
    #[serde(default)]
    pub equals: BTreeMap<String, String>,
    /// Label keys that must be present with any value.
    #[serde(default)]
    pub exists: Vec<String>,
}

impl LabelSelector {
    /// Selects everything.
    pub fn new() -> Self {
        Self::default()
    }

    /// Also requires `key=value`.
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.equals.insert(key.into(), value.into());
        self
    }

    /// Also requires `key` to be present.
    pub fn label_present(mut self, key: impl Into<String>) -> Self {
        self.exists.push(key.into());
        self
    }

    /// Whether `labels` satisfy every condition.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.equals.iter().all(|(k, v)| labels.get(k) == Some(v))
            && self.exists.iter().all(|k| labels.contains_key(k))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_validated() {
        assert!(SandboxId::new("sb-1.a_b").is_ok());
        for bad in ["", "../x", "a/b", ".hidden", "a b", &"x".repeat(129)] {
            assert!(SandboxId::new(bad).is_err(), "{bad:?}");
        }
        assert!(SandboxId::generate("mock").as_str().starts_with("mock-"));
        assert!(serde_json::from_str::<SandboxId>("\"../../etc\"").is_err());
    }
}
