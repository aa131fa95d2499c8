//! The bodies both ends exchange: the subset of the Fly Machines API sandcell uses, and
//! sandcell-server's extensions (its capabilities, the upgrade to the wire protocol,
//! errors with their sandcell kind).
//!
//! Fly bodies skip every field sandcell does not set, so what goes over the wire is
//! exactly what the published schema declares (the contract tests check that).

use std::collections::BTreeMap;

use sandcell::{Error, ErrorKind};
use serde::{Deserialize, Serialize};

/// Metadata key carrying the whole sandcell spec as JSON, so a sandcell server can
/// honour what Fly's machine config has no field for (workdir, network, timeouts).
pub const SPEC_METADATA: &str = "sandcell.spec";

/// `POST /apps/{app}/machines`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct CreateMachineRequest {
    /// Unique per app; sandcell always sets one, so an ambiguous create can be resolved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Where to launch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// The machine's configuration.
    pub config: MachineConfig,
}

/// A clone of a running machine (sandcell-server's extension): a new machine with the
/// source's image, workspace and limits, carrying `metadata` instead of the source's.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct CloneMachineRequest {
    /// Unique per app, as for a create, so an ambiguous clone can be resolved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The clone's metadata.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
}

/// The part of a machine's configuration sandcell sets.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct MachineConfig {
    /// The image (sandcell's template name).
    #[serde(default)]
    pub image: String,
    /// Environment variables.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// CPUs and memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest: Option<Guest>,
    /// The keep-alive command.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init: Option<Init>,
    /// Free-form metadata: sandcell's labels, and [`SPEC_METADATA`].
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    /// Destroy the machine when it exits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_destroy: Option<bool>,
}

/// `config.guest`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Guest {
    /// `shared` or `performance`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_kind: Option<String>,
    /// Whole CPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<u32>,
    /// Memory in MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
}

/// `config.init`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Init {
    /// The command the machine runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cmd: Vec<String>,
}

/// A machine as the API reports it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Machine {
    /// The machine id.
    pub id: String,
    /// Its unique name.
    #[serde(default)]
    pub name: String,
    /// `created`, `starting`, `started`, `stopping`, `stopped`, `suspending`,
    /// `suspended`, `replacing`, `destroying`, `destroyed`, `failed`.
    #[serde(default)]
    pub state: String,
    /// The region.
    #[serde(default)]
    pub region: String,
    /// The current version, which `wait` takes.
    #[serde(default)]
    pub instance_id: String,
    /// Its configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<MachineConfig>,
    /// RFC 3339.
    #[serde(default)]
    pub created_at: String,
    /// RFC 3339.
    #[serde(default)]
    pub updated_at: String,
}

/// `GET .../wait` answers this when the state was reached.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct WaitResponse {
    /// True when reached.
    #[serde(default)]
    pub ok: bool,
    /// The state reached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
}

/// `POST .../exec`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ExecBody {
    /// The command.
    pub command: Vec<String>,
    /// Text fed to stdin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
    /// Seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<u64>,
}

/// The answer to `POST .../exec`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ExecResponse {
    /// The exit code, when it exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The signal that ended it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_signal: Option<i32>,
    /// Its stdout, as text.
    #[serde(default)]
    pub stdout: String,
    /// Its stderr, as text.
    #[serde(default)]
    pub stderr: String,
}

/// `POST .../stop`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct StopBody {
    /// E.g. `SIGTERM`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
    /// E.g. `10s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
}

/// An error body: `{"error": ...}`, plus the sandcell kind when a sandcell server sent it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ErrorBody {
    /// The message.
    #[serde(default)]
    pub error: String,
    /// [`ErrorKind::as_str`]; absent from other servers (and from proxies).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
}

impl ErrorBody {
    /// The body for `e`.
    pub fn from_error(e: &Error) -> Self {
        ErrorBody {
            error: e.to_string(),
            kind: Some(e.kind().name().to_owned()),
        }
    }
}

/// The HTTP status a sandcell server answers an error of `kind` with.
pub fn status_for(kind: ErrorKind) -> u16 {
    match kind {
        ErrorKind::NotFound => 404,
        ErrorKind::AlreadyExists | ErrorKind::Conflict => 409,
        ErrorKind::Unsupported => 501,
        ErrorKind::InvalidInput => 400,
        ErrorKind::PermissionDenied => 403,
        ErrorKind::LimitExceeded | ErrorKind::Corrupt => 422,
        ErrorKind::InvalidState => 412,
        ErrorKind::Timeout => 504,
        ErrorKind::Unavailable => 503,
        _ => 500,
    }
}

/// The kind an error status means when the body does not say (a plain Fly endpoint).
pub fn kind_for(status: u16) -> ErrorKind {
    match status {
        400 | 422 => ErrorKind::InvalidInput,
        401 | 403 => ErrorKind::PermissionDenied,
        404 | 410 => ErrorKind::NotFound,
        408 | 504 => ErrorKind::Timeout,
        409 => ErrorKind::AlreadyExists,
        412 => ErrorKind::InvalidState,
        413 => ErrorKind::LimitExceeded,
        429 | 502 | 503 => ErrorKind::Unavailable,
        501 => ErrorKind::Unsupported,
        _ => ErrorKind::Backend,
    }
}

/// The `Upgrade` token of `GET .../sandcell/wire`: the connection then speaks
/// [sandcell's wire protocol](sandcell::raw::wire) for the machine.
pub const WIRE_UPGRADE: &str = "sandcell-wire";

/// `GET /sandcell/capabilities`: what the served backend can do.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ServerInfo {
    /// The served backend's name.
    pub backend: String,
    /// Its capabilities, as the server offers them.
    pub capabilities: sandcell::Capabilities,
}
