//! The bodies of E2B's control plane (`openapi.yml`) that both ends exchange: creates,
//! connects, timeouts, the sandbox views and errors.
//!
//! Field names are the API's (camelCase, plus the two snake_case ones it has); every
//! optional field is skipped when unset, so what the provider sends is exactly what the
//! published schema declares (the contract tests check that).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The envd version sandcell reports: 0.6.4 turns on every feature of the E2B SDKs
/// (recursive and network-mount watches, stdin, default user, octet-stream uploads,
/// file metadata, entries in watch events).
pub const ENVD_VERSION: &str = "0.6.4";

/// `POST /sandboxes` and `POST /v2/sandboxes`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct NewSandbox {
    /// The template to start from.
    #[serde(rename = "templateID")]
    pub template_id: String,
    /// Seconds the sandbox lives (default 15).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<u32>,
    /// Pause rather than kill the sandbox when its time is up.
    #[serde(rename = "autoPause", default, skip_serializing_if = "Option::is_none")]
    pub auto_pause: Option<bool>,
    /// Whether envd calls need the access token the create answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secure: Option<bool>,
    /// Whether the sandbox may reach the internet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_internet_access: Option<bool>,
    /// Egress rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkConfig>,
    /// Free-form metadata, listed and filtered on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<BTreeMap<String, String>>,
    /// Environment variables of every command.
    #[serde(rename = "envVars", default, skip_serializing_if = "Option::is_none")]
    pub env_vars: Option<BTreeMap<String, String>>,
}

/// A sandbox's egress rules (`SandboxNetworkConfig`), and the body of
/// `PUT /sandboxes/{id}/network` (`SandboxNetworkUpdateConfig`, which adds
/// `allow_internet_access`). Allowed destinations win over denied ones.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub struct NetworkConfig {
    /// Destinations egress may reach: CIDR blocks, addresses, names, `*.` wildcards.
    #[serde(rename = "allowOut", skip_serializing_if = "Option::is_none")]
    pub allow_out: Option<Vec<String>>,
    /// CIDR blocks or addresses egress may not reach.
    #[serde(rename = "denyOut", skip_serializing_if = "Option::is_none")]
    pub deny_out: Option<Vec<String>>,
    /// Whether the sandbox's URLs answer without authentication (ingress; sandcell
    /// does not serve them, and ignores this).
    #[serde(rename = "allowPublicTraffic", skip_serializing_if = "Option::is_none")]
    pub allow_public_traffic: Option<bool>,
    /// An egress proxy of the caller's (not supported by sandcell-server).
    #[serde(rename = "egressProxy", skip_serializing_if = "Option::is_none")]
    pub egress_proxy: Option<serde_json::Value>,
    /// A host mask for requests (not supported by sandcell-server).
    #[serde(rename = "maskRequestHost", skip_serializing_if = "Option::is_none")]
    pub mask_request_host: Option<String>,
    /// Per-domain request transforms (not supported by sandcell-server).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rules: Option<serde_json::Value>,
    /// Only in an update: `false` denies everything not allowed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_internet_access: Option<bool>,
}

/// `POST /sandboxes/{id}/connect` (and `/v2/...`): resumes a paused sandbox and
/// extends its time to at least `timeout` seconds from now.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ConnectSandbox {
    /// Seconds from now.
    pub timeout: u32,
}

/// `POST /sandboxes/{id}/timeout`: the sandbox ends `timeout` seconds from now.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct SandboxTimeout {
    /// Seconds from now.
    pub timeout: u32,
}

/// A created or connected sandbox.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
// Tolerant reading: a field an API version leaves out reads as its default.
#[serde(default)]
pub struct Sandbox {
    /// Its template.
    #[serde(rename = "templateID")]
    pub template_id: String,
    /// Its id.
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    /// Deprecated by the API, still required.
    #[serde(rename = "clientID")]
    pub client_id: String,
    /// The version of the sandbox's envd.
    #[serde(rename = "envdVersion")]
    pub envd_version: String,
    /// The token envd calls carry as `X-Access-Token`.
    #[serde(
        rename = "envdAccessToken",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub envd_access_token: Option<String>,
    /// The base domain of the sandbox's own hosts (`{port}-{id}.{domain}`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
}

/// `GET /sandboxes/{id}`, and each item of the list.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
// Tolerant reading: a field an API version leaves out reads as its default.
#[serde(default)]
pub struct SandboxDetail {
    /// Its template.
    #[serde(rename = "templateID")]
    pub template_id: String,
    /// Its id.
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    /// Deprecated by the API, still required.
    #[serde(rename = "clientID")]
    pub client_id: String,
    /// When it started (RFC 3339).
    #[serde(rename = "startedAt")]
    pub started_at: String,
    /// When its time is up (RFC 3339).
    #[serde(rename = "endAt")]
    pub end_at: String,
    /// The version of the sandbox's envd.
    #[serde(rename = "envdVersion")]
    pub envd_version: String,
    /// CPUs.
    #[serde(rename = "cpuCount")]
    pub cpu_count: u32,
    /// Memory, in MiB.
    #[serde(rename = "memoryMB")]
    pub memory_mb: u64,
    /// Disk, in MiB.
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: u64,
    /// `running` or `paused`.
    pub state: String,
    /// Its metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<BTreeMap<String, String>>,
    /// Its egress rules, where it has any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkConfig>,
    /// The token envd calls carry (only in `GET /sandboxes/{id}`).
    #[serde(
        rename = "envdAccessToken",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub envd_access_token: Option<String>,
}

/// One reading of `GET /sandboxes/{id}/metrics`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
// Tolerant reading: a field an API version leaves out reads as its default.
#[serde(default)]
pub struct SandboxMetric {
    /// When (RFC 3339).
    pub timestamp: String,
    /// When (Unix seconds).
    #[serde(rename = "timestampUnix")]
    pub timestamp_unix: i64,
    /// CPUs.
    #[serde(rename = "cpuCount")]
    pub cpu_count: u32,
    /// CPU use, in percent of all CPUs.
    #[serde(rename = "cpuUsedPct")]
    pub cpu_used_pct: f64,
    /// Memory used, in bytes.
    #[serde(rename = "memUsed")]
    pub mem_used: u64,
    /// Memory available, in bytes.
    #[serde(rename = "memTotal")]
    pub mem_total: u64,
    /// Memory used as cache, in bytes.
    #[serde(rename = "memCache")]
    pub mem_cache: u64,
    /// Disk used, in bytes.
    #[serde(rename = "diskUsed")]
    pub disk_used: u64,
    /// Disk available, in bytes.
    #[serde(rename = "diskTotal")]
    pub disk_total: u64,
}

/// Every error the control plane answers.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ApiError {
    /// The HTTP status, again.
    pub code: u16,
    /// What went wrong.
    pub message: String,
}
