//! How the tools are set up: the manager they drive, what a session's sandbox gets
//! (spec, default limits) and how much a call may move, and the tenant a request acts
//! for.

use sandcell::{SandboxBackend, SandboxManager, SandboxSpec};

/// The manager the tools drive: any backend.
pub type Manager = SandboxManager<Box<dyn SandboxBackend>>;

/// How the tools behave; [`Default`] suits a model's context.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ToolSettings {
    /// The spec a new session's sandbox gets (default: the `default` template).
    pub spec: SandboxSpec,
    /// The bytes of a command's stdout (and of its stderr) a result keeps: the first
    /// and last halves, with a marker between (default 32 KiB).
    pub output_limit: usize,
    /// The largest file `write_file` takes, decoded (default 10 MiB).
    pub max_write_bytes: usize,
    /// The largest file `read_file` reads from, whatever range it answers (default
    /// 64 MiB): the file is read whole, so a larger one is a tool error saying how
    /// to read it in parts, before it is read.
    pub max_read_bytes: u64,
    /// The limits a session's sandbox gets where [`spec`](ToolSettings::spec) sets
    /// none and the backend enforces them (default
    /// [`Limits::recommended`](sandcell::Limits::recommended): one core, 512 MiB, 1024
    /// processes, 10 GiB of disk). A model's command is untrusted: without these a
    /// fork bomb or an allocation loop meets only the host's limits. Set
    /// `Limits::new()` to opt out.
    pub default_limits: sandcell::Limits,
    /// What a model is told of an error (default: all of it): a server facing tenants
    /// rewrites its backend's failures so that no host path reaches them, as on its
    /// other faces.
    pub public_errors: sandcell::raw::wire::PublicErrors,
    /// The most tool calls one tenant has in flight at once, `run_command` included
    /// (default 16); past it a call is a tool error until one ends. A call runs to its
    /// end after its client has gone, and may hold a file read whole or a glob's
    /// matches.
    pub max_calls_per_tenant: usize,
    /// The Python inside a session's sandbox that runs `run_code`'s kernels: it needs
    /// `jupyter-client` and a kernel per language (default `python3`).
    pub code_python: String,
}

impl Default for ToolSettings {
    fn default() -> Self {
        ToolSettings {
            spec: SandboxSpec::new("default"),
            output_limit: 32 * 1024,
            max_write_bytes: 10 << 20,
            max_read_bytes: 64 << 20,
            default_limits: sandcell::Limits::recommended(),
            public_errors: Default::default(),
            max_calls_per_tenant: 16,
            code_python: "python3".into(),
        }
    }
}

/// The tenant an HTTP request acts for: the server in front authenticates the caller
/// and puts this in the request's extensions (see
/// [`SandboxTools::per_request_tenant`](crate::SandboxTools::per_request_tenant)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant(pub String);
