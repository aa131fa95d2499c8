//! What a server is configured with: its tenants, the bounds on what clients send
//! and hold, and what they may ask for.

use super::{listen, tenants, Tenant};

/// How a server answers: its tenants, body limits and what clients may ask for.
#[derive(Clone)]
#[non_exhaustive]
pub struct ServerConfig {
    /// Who may call, each with its own token (checked non-empty and unique when set).
    pub(super) tenants: Vec<Tenant>,
    /// Largest JSON body accepted (default 1 MiB); a larger one is answered `413`.
    pub max_json_bytes: usize,
    /// The longest a client may take to send a request's head (line and headers)
    /// before its connection is closed (default 10 s; HTTP/1), and to begin its first
    /// request once connected.
    pub header_read_timeout: std::time::Duration,
    /// The longest the server waits on a request's body without it making progress
    /// (default 30 s): past it the request is answered `408` and (HTTP/1) its
    /// connection closed. Waiting starts over with each KiB that comes in, so a slow
    /// upload gets through and a trickle does not hold a connection; the time a
    /// handler spends elsewhere does not count, and responses are never bounded (a
    /// command's output streams as long as it runs).
    pub body_read_timeout: std::time::Duration,
    /// The longest a connection may go with no request in flight before it is closed
    /// (default 60 s; before its first request, the shorter of this and
    /// `header_read_timeout`). A streaming response keeps its request in flight; a
    /// connection upgraded to the wire protocol is no longer the listener's. For
    /// HTTP/1 the shorter of this and `header_read_timeout` applies between requests
    /// too, since the wait for a next request is also the wait for its head.
    pub idle_timeout: std::time::Duration,
    /// The longest a response the server holds in memory (a file download, a
    /// directory listing) waits for its client to take the next chunk (default 30 s):
    /// past it the response is cut short and what it held goes back to the tenant's
    /// transfer budget, so a client that asks and reads nothing holds no share of it
    /// for as long as its connection lives. A command's output is not bounded.
    pub held_response_timeout: std::time::Duration,
    /// The most connections served at once, TLS handshakes included (default 1024);
    /// past it the server accepts no more until one closes. A connection upgraded to
    /// the wire protocol leaves the count once upgraded (each is one tenant's
    /// authenticated session with one sandbox, and stays in that tenant's
    /// [`max_connections_per_tenant`](Self::max_connections_per_tenant)).
    pub max_connections: usize,
    /// The most connections one tenant holds at once (default 256, a quarter of
    /// `max_connections`'s default): a connection counts against the tenant of its
    /// first authenticated request until it closes, and past the share a request on a
    /// new connection is refused (`429`, `LimitExceeded`) and its connection closed. So
    /// one tenant's connections, each kept busy, leave room for the others'. A
    /// connection upgraded to the wire protocol stays in its tenant's count until it
    /// closes (it leaves `max_connections`'s): a client holding a wire connection per
    /// machine holds at most this many machines' at once.
    pub max_connections_per_tenant: usize,
    /// The most connections one client address holds before a request authenticates
    /// on them (default 64): a connection counts against no tenant until then, so
    /// one client opening connections and sending nothing (or only requests that fail
    /// to authenticate) held every one of `max_connections`. Past it a new connection
    /// from that address is closed unserved. A connection whose request did not
    /// authenticate is closed after its answer. Behind a proxy every client has the
    /// proxy's address: raise it there, and bound clients at the proxy.
    pub max_unauthenticated_per_address: usize,
    /// The most commands one tenant runs at once, on every face together (default
    /// 256), each counted from its start to its end, not to its request's: an E2B
    /// process runs on after its stream closes, an MCP tool call after its client left.
    /// Past it a new command is refused (`LimitExceeded`). Each running command
    /// holds a few of the server's file descriptors: keep tenants × this × 4 within the
    /// server's open-file limit.
    pub max_commands_per_tenant: usize,
    /// Largest file a client may write or read (default 64 MiB): a file passes
    /// through the server's memory whole, so a larger one is refused (`413` on the E2B
    /// face, `LimitExceeded` on the wire), a read's before the file is read.
    pub max_file_bytes: usize,
    /// What the files passing through the server whole on a tenant's behalf (E2B
    /// `/files` downloads, wire reads and writes) may hold together (default 256 MiB,
    /// and never less than `max_file_bytes`): past it a transfer is refused (`429`,
    /// `LimitExceeded`) until one ends, so a client that opens many and reads none
    /// back holds no more than this of the server's memory.
    pub max_transfer_bytes_per_tenant: u64,
    /// Most file content one archive import may carry (default 1 GiB).
    pub max_archive_bytes: u64,
    /// Most archives (exports, imports, changes) a tenant's wire connections stream at
    /// once (default 8); past it a call is `LimitExceeded` until one ends. Each holds
    /// one of the host's blocking threads for as long as its client keeps up, so a
    /// tenant that starts hundreds and reads none holds no more than this.
    pub max_archive_streams_per_tenant: usize,
    /// Most file watches a tenant holds at once, on every face (E2B's `WatchDir` and
    /// `CreateWatcher`, the wire's `watch`; default 8); past it another is
    /// `LimitExceeded` until one ends. Each holds an inotify instance, of which the
    /// server's user has few (128 by default, shared with its other processes), and a
    /// polled E2B watcher buffers events until it is read: one tenant's watches took
    /// every instance, and every other tenant's watch failed.
    pub max_watches_per_tenant: usize,
    /// The limits every sandbox gets, on every face (Fly, E2B, MCP), where its create
    /// sets none of its own; each is applied only when the backend enforces it
    /// (`Capabilities::cpu_limit`, `memory_limit`, `pids_limit`, `disk_limit`).
    /// Default: [`Limits::recommended`](sandcell::Limits::recommended), one core,
    /// 512 MiB, 1024 processes and 10 GiB of disk; a sandbox without them got as many processes, as much memory and as much of the host's
    /// disk as the host had.
    pub default_limits: sandcell::Limits,
    /// The faces served (default all of them; MCP's only once
    /// [`with_mcp`](Self::with_mcp) gave it a manager). Only [`Face::Fly`], the server
    /// answers as a plain Fly endpoint does, and clients move files over `exec`.
    pub faces: std::collections::BTreeSet<Face>,
    /// Host directories no answer names (default none): a message that mentions one
    /// (the backend's root, say, in an error racing a destroy) has the path cut out.
    /// `sandcell-server` lists the backend's root and the MCP data directory.
    pub private_paths: Vec<std::path::PathBuf>,
    /// The host directories a client's spec may mount from (default none: every host
    /// mount is refused). A mount must resolve beneath one of them, symbolic links
    /// followed, and may be read-write only where that directory allows it.
    pub host_paths: Vec<HostPath>,
    /// The template E2B's default template name, `base`, stands for (default
    /// `"default"`, the local backend's; on Docker, an image with `bash`, which E2B's
    /// SDKs run every command with).
    pub e2b_base_template: String,
    /// The Python inside a sandbox that runs the code interpreter's kernels (E2B's
    /// `/execute`): it needs `jupyter-client` and a kernel per language (default
    /// `python3`). E2B's code-interpreter templates (`code-interpreter-v1`) stand for
    /// the base template: the kernels come from this Python.
    pub code_python: String,
    /// Most code runs (E2B's `/execute`) a tenant streams at once (default 8). Each
    /// holds up to a few MiB of its sandbox's output on this host while its client
    /// reads: counted, a tenant's unread streams cannot run the server out of memory
    /// (FINDINGS12 H1).
    pub max_code_runs_per_tenant: usize,
    /// The session manager whose sessions MCP's tools act on at `/mcp` (feature `mcp`;
    /// default none: no MCP route).
    #[cfg(feature = "mcp")]
    pub(super) mcp: Option<std::sync::Arc<sandcell_mcp::Manager>>,
    /// Each tenant's create lock, shared by every face and by what MCP's manager
    /// creates through.
    pub(super) create_locks: std::sync::Arc<tenants::CreateLocks>,
    /// The tenants' running commands, shared by every face (MCP's included).
    pub(super) commands: std::sync::Arc<crate::command_slots::CommandSlots>,
}

/// One of the APIs a server answers, each a router of its own, composed as
/// [`ServerConfig::faces`] says (`sandcell-server --faces fly,wire,e2b,mcp`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Face {
    /// The Fly Machines API subset (`/v1/apps/{app}/machines...`).
    Fly,
    /// sandcell's extensions of the Fly face: the wire-protocol upgrade every
    /// in-sandbox operation goes over, capabilities, clones.
    Wire,
    /// E2B's control plane and envd, for E2B's SDKs.
    E2b,
    /// MCP's tools over streamable HTTP at `/mcp` (needs
    /// [`ServerConfig::with_mcp`]).
    Mcp,
}

impl Face {
    /// Every face.
    pub const ALL: [Face; 4] = [Face::Fly, Face::Wire, Face::E2b, Face::Mcp];

    /// The name `--faces` takes.
    pub fn name(self) -> &'static str {
        match self {
            Face::Fly => "fly",
            Face::Wire => "wire",
            Face::E2b => "e2b",
            Face::Mcp => "mcp",
        }
    }
}

impl std::str::FromStr for Face {
    type Err = sandcell::Error;

    fn from_str(name: &str) -> sandcell::Result<Face> {
        Face::ALL
            .into_iter()
            .find(|face| face.name() == name)
            .ok_or_else(|| {
                sandcell::Error::invalid_input(format!(
                    "no face {name:?}: the faces are fly, wire, e2b and mcp"
                ))
            })
    }
}

/// A host directory clients may mount from (see [`ServerConfig::host_paths`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HostPath {
    /// The directory; mounts of it and of anything beneath it are allowed.
    pub dir: std::path::PathBuf,
    /// Whether those mounts may be read-write (else only read-only ones are).
    pub writable: bool,
}

impl HostPath {
    /// Read-only mounts of `dir` and beneath it.
    pub fn read_only(dir: impl Into<std::path::PathBuf>) -> Self {
        HostPath {
            dir: dir.into(),
            writable: false,
        }
    }

    /// Read-write (or read-only) mounts of `dir` and beneath it.
    pub fn writable(dir: impl Into<std::path::PathBuf>) -> Self {
        HostPath {
            dir: dir.into(),
            writable: true,
        }
    }
}

impl std::fmt::Debug for ServerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerConfig")
            .field("tenants", &self.tenants)
            .field("max_json_bytes", &self.max_json_bytes)
            .field("header_read_timeout", &self.header_read_timeout)
            .field("body_read_timeout", &self.body_read_timeout)
            .field("idle_timeout", &self.idle_timeout)
            .field("held_response_timeout", &self.held_response_timeout)
            .field("max_connections", &self.max_connections)
            .field(
                "max_connections_per_tenant",
                &self.max_connections_per_tenant,
            )
            .field(
                "max_unauthenticated_per_address",
                &self.max_unauthenticated_per_address,
            )
            .field("max_commands_per_tenant", &self.max_commands_per_tenant)
            .field("max_file_bytes", &self.max_file_bytes)
            .field(
                "max_transfer_bytes_per_tenant",
                &self.max_transfer_bytes_per_tenant,
            )
            .field("max_archive_bytes", &self.max_archive_bytes)
            .field(
                "max_archive_streams_per_tenant",
                &self.max_archive_streams_per_tenant,
            )
            .field("max_watches_per_tenant", &self.max_watches_per_tenant)
            .field("default_limits", &self.default_limits)
            .field("faces", &self.faces)
            .field("host_paths", &self.host_paths)
            .field("private_paths", &self.private_paths)
            .field("e2b_base_template", &self.e2b_base_template)
            .field("code_python", &self.code_python)
            .field("max_code_runs_per_tenant", &self.max_code_runs_per_tenant)
            .finish()
    }
}

impl ServerConfig {
    /// Defaults, with one tenant, `default`, whose token is `token`. An empty token
    /// lets no one in.
    pub fn new(token: impl Into<String>) -> Self {
        Self::of(vec![Tenant::new("default", token)])
    }

    /// Defaults, with `tenants`; `InvalidInput` unless there is at least one and every
    /// name and token is non-empty and unique.
    pub fn with_tenants(tenants: impl IntoIterator<Item = Tenant>) -> sandcell::Result<Self> {
        let tenants: Vec<Tenant> = tenants.into_iter().collect();
        tenants::validate(&tenants)?;
        Ok(Self::of(tenants))
    }

    fn of(tenants: Vec<Tenant>) -> Self {
        ServerConfig {
            create_locks: std::sync::Arc::new(tenants::CreateLocks::of(&tenants)),
            commands: std::sync::Arc::new(crate::command_slots::CommandSlots::new(
                DEFAULT_MAX_COMMANDS_PER_TENANT,
            )),
            tenants,
            max_json_bytes: 1 << 20,
            header_read_timeout: listen::DEFAULT_HEADER_READ_TIMEOUT,
            body_read_timeout: listen::DEFAULT_BODY_READ_TIMEOUT,
            idle_timeout: listen::DEFAULT_IDLE_TIMEOUT,
            held_response_timeout: std::time::Duration::from_secs(30),
            max_connections: listen::DEFAULT_MAX_CONNECTIONS,
            max_connections_per_tenant: listen::DEFAULT_MAX_CONNECTIONS_PER_TENANT,
            max_unauthenticated_per_address: listen::DEFAULT_MAX_UNAUTHENTICATED_PER_ADDRESS,
            max_commands_per_tenant: DEFAULT_MAX_COMMANDS_PER_TENANT,
            max_file_bytes: 64 << 20,
            max_transfer_bytes_per_tenant: 256 << 20,
            max_archive_bytes: 1 << 30,
            max_archive_streams_per_tenant: 8,
            max_watches_per_tenant: 8,
            default_limits: sandcell::Limits::recommended(),
            faces: Face::ALL.into_iter().collect(),
            host_paths: Vec::new(),
            private_paths: Vec::new(),
            e2b_base_template: "default".to_owned(),
            code_python: "python3".to_owned(),
            max_code_runs_per_tenant: 8,
            #[cfg(feature = "mcp")]
            mcp: None,
        }
    }

    /// Serves MCP's tools over streamable HTTP at `/mcp`, acting on the sessions of a
    /// manager over `backend` (the backend this server serves), which `configure` sets
    /// up (its data directory, idle timeout, ...). Callers authenticate with a tenant's
    /// token as `Authorization: Bearer`, and each tenant's tools see only that tenant's
    /// sessions. A transport session (`Mcp-Session-Id`) answers only the tenant that
    /// opened it; the manager's id is reserved (no Fly or E2B client may label a
    /// sandbox as this manager's). The manager creates and clones through this
    /// server's tenancy: each sandbox carries its tenant's label, gets the default
    /// limits, and counts against the tenant's quotas with its sandboxes on the other
    /// faces, under the same create lock.
    ///
    /// Call it after the tenants are final (it is built for them).
    #[cfg(feature = "mcp")]
    pub async fn with_mcp(
        mut self,
        backend: std::sync::Arc<dyn sandcell::SandboxBackend>,
        configure: impl FnOnce(
            sandcell::manager::ManagerBuilder<Box<dyn sandcell::SandboxBackend>>,
        )
            -> sandcell::manager::ManagerBuilder<Box<dyn sandcell::SandboxBackend>>,
    ) -> sandcell::Result<Self> {
        let counted = super::mcp_quotas::TenantQuotas::new(backend, &self);
        let builder = sandcell::SandboxManager::builder(Box::new(counted) as Box<_>);
        self.mcp = Some(std::sync::Arc::new(configure(builder).build().await?));
        Ok(self)
    }

    /// The manager MCP's tools act on, once [`with_mcp`](Self::with_mcp) made it (to
    /// shut it down when the server stops).
    #[cfg(feature = "mcp")]
    pub fn mcp_manager(&self) -> Option<&std::sync::Arc<sandcell_mcp::Manager>> {
        self.mcp.as_ref()
    }

    /// The tenants.
    pub fn tenants(&self) -> &[Tenant] {
        &self.tenants
    }

    /// Allows client mounts of `path` and beneath it.
    pub fn allow_host_path(mut self, path: HostPath) -> Self {
        self.host_paths.push(path);
        self
    }
}

/// How many commands one tenant runs at once, by default.
const DEFAULT_MAX_COMMANDS_PER_TENANT: usize = 256;
