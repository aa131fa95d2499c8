//! `sandcell-server`: serves a local or Docker sandcell backend as a Fly-Machines-style
//! API (plus the upgrade to sandcell's wire protocol) for `FlyBackend` clients, and
//! as E2B's API (control plane and envd) for E2B's own SDKs.
//!
//! ```text
//! SANDCELL_SERVER_TOKEN=secret sandcell-server --backend local --root /tmp/sandcell-server
//! # E2B's SDKs: the token is the API key, and envd is on the same address.
//! E2B_API_KEY=secret E2B_API_URL=http://127.0.0.1:7711 E2B_SANDBOX_URL=http://127.0.0.1:7711 python agent.py
//! ```
//!
//! It listens on `127.0.0.1:7711` unless `--listen` says otherwise (HTTPS with
//! `--tls-cert` and `--tls-key`); every request needs `Authorization: Bearer <token>`,
//! the one `--token` or a tenant's from `--tenants FILE`, and a tenant sees only its own
//! sandboxes. The local backend runs at the strongest isolation
//! the host offers (no isolation only with `--unsafe-no-isolation`), and clients' host
//! mounts are refused except beneath `--allow-host-path` directories.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, ValueEnum};
use sandcell::SandboxBackend;
use sandcell_server::{serve, serve_tls, HostPath, ServerConfig, TenantsFile, Tls};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Backend {
    /// Processes on this host (`sandcell-local`).
    Local,
    /// Docker containers (`sandcell-docker`; the engine from DOCKER_HOST or the default socket).
    Docker,
}

#[derive(Debug, Parser)]
#[command(
    name = "sandcell-server",
    version,
    about = "Serve a sandcell backend over HTTP"
)]
struct Args {
    /// The backend to serve.
    #[arg(long, value_enum, default_value = "local")]
    backend: Backend,
    /// The address to listen on (loopback unless you mean otherwise).
    #[arg(long, default_value = "127.0.0.1:7711")]
    listen: SocketAddr,
    /// The bearer token clients must send: one tenant, named `default`. Prefer the
    /// environment variable, which other users of the host cannot read off `ps`.
    #[arg(
        long,
        env = "SANDCELL_SERVER_TOKEN",
        hide_env_values = true,
        required_unless_present = "tenants",
        conflicts_with = "tenants"
    )]
    token: Option<String>,
    /// A YAML file of tenants, each with its own token and optional quotas:
    /// `tenants: [{name, token, max_sandboxes, max_cpus, max_memory_mb}]`. A tenant
    /// sees and touches only its own sandboxes.
    #[arg(long, value_name = "FILE")]
    tenants: Option<PathBuf>,
    /// Where the local backend keeps its sandboxes.
    #[arg(long, default_value = "sandcell-server-data")]
    root: PathBuf,
    /// The backend's options as JSON (the `type`-less body of a sandcell config), e.g.
    /// `{"templates": {"python": "/srv/templates/python"}}`; overrides --root.
    #[arg(long)]
    options: Option<String>,
    /// Largest file a client may upload or download, in bytes (a file passes through
    /// the server's memory whole).
    #[arg(long, default_value_t = 64 << 20)]
    max_file_bytes: usize,
    /// Bytes of files passing through the server whole that one tenant's transfers
    /// may hold at once (at least --max-file-bytes); past it a transfer is refused
    /// (429) until one ends.
    #[arg(long, default_value_t = 256 << 20)]
    max_transfer_bytes_per_tenant: u64,
    /// Most archives (exports, imports) one tenant's wire connections stream at once;
    /// past it another is refused until one ends.
    #[arg(long, value_name = "N", default_value_t = 8)]
    max_archive_streams_per_tenant: usize,
    /// Most file watches one tenant holds at once, on every face; past it another is
    /// refused until one ends.
    #[arg(long, value_name = "N", default_value_t = 8)]
    max_watches_per_tenant: usize,
    /// Seconds a client may take to send a request's head before its connection is
    /// closed.
    #[arg(long, value_name = "SECS", default_value_t = 10)]
    header_read_timeout: u64,
    /// Seconds the server waits on a request's body that makes no progress (less than
    /// a KiB of it arriving) before it answers 408 and closes the connection.
    #[arg(long, value_name = "SECS", default_value_t = 30)]
    body_read_timeout: u64,
    /// Seconds a connection may go with no request in flight before it is closed.
    #[arg(long, value_name = "SECS", default_value_t = 60)]
    idle_timeout: u64,
    /// Seconds a response held in memory (a file download, a directory listing) waits
    /// for its client to take the next chunk before it is cut short and what it held
    /// goes back to the tenant's transfer budget.
    #[arg(long, value_name = "SECS", default_value_t = 30)]
    held_response_timeout: u64,
    /// The most connections served at once (TLS handshakes included); past it the
    /// server accepts no more until one closes.
    #[arg(long, value_name = "N", default_value_t = 1024)]
    max_connections: usize,
    /// The most connections one tenant holds at once (counted from its first
    /// authenticated request on each); past it a new connection's request is refused.
    #[arg(long, value_name = "N", default_value_t = 256)]
    max_connections_per_tenant: usize,
    /// The most connections one client address holds before a request authenticates
    /// on them; past it a new connection from that address is closed unserved. Behind
    /// a proxy, raise it (every client has the proxy's address).
    #[arg(long, value_name = "N", default_value_t = 64)]
    max_unauthenticated_per_address: usize,
    /// The most commands one tenant runs at once, on every face together, each counted
    /// until it ends (an E2B process or an MCP call runs on after its client left).
    #[arg(long, value_name = "N", default_value_t = 256)]
    max_commands_per_tenant: usize,
    /// CPU cores (thousandths: 1000 is one core) a sandbox gets when its create asks
    /// for none, on every face; applied where the backend enforces CPU limits.
    #[arg(long, value_name = "MILLIS", default_value_t = 1000)]
    default_cpu_millis: u32,
    /// Memory, in MiB, a sandbox gets when its create asks for none, on every face.
    #[arg(long, value_name = "MIB", default_value_t = 512)]
    default_memory_mb: u64,
    /// Processes a sandbox may run when its create asks for no limit, on every face.
    #[arg(long, value_name = "N", default_value_t = 1024)]
    default_pids: u32,
    /// Disk, in MiB, a sandbox gets when its create asks for none, on every face:
    /// everything it writes (its workspace's changes, its temp files) is held on a
    /// disk of that size; applied where the backend enforces disk limits (the local
    /// backend as root). 0 gives no disk limit by default.
    #[arg(long, value_name = "MIB", default_value_t = 10240)]
    default_disk_mb: u64,
    /// The faces to serve, comma-separated: `fly` (the Fly Machines API subset),
    /// `wire` (sandcell's extensions of it: the wire protocol, capabilities, clones),
    /// `e2b` (E2B's API and envd), `mcp` (MCP's tools, with --mcp-data-dir). Default:
    /// all of them.
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "FACE,...",
        default_value = "fly,wire,e2b,mcp"
    )]
    faces: Vec<sandcell_server::Face>,
    /// Serve only the Fly Machines API subset, as a plain Fly endpoint would (clients
    /// then move files over exec): `--faces fly`.
    #[arg(long, conflicts_with = "faces")]
    fly_only: bool,
    /// The template E2B's default template, `base`, stands for (on Docker: an image
    /// with bash, which E2B's SDKs run every command with).
    #[arg(long, value_name = "TEMPLATE", default_value = "default")]
    e2b_base_template: String,
    /// The Python inside sandboxes that runs the code interpreter's Jupyter kernels
    /// (E2B's `run_code`): it needs jupyter-client and ipykernel; on the local
    /// backend a virtual environment under /opt, which sandboxes see.
    #[arg(long, value_name = "PYTHON", default_value = "python3")]
    code_python: String,
    /// A host directory clients may mount from, read-only; `DIR:rw` allows read-write
    /// mounts too. Repeatable. Without it every host mount in a client's spec is refused.
    #[arg(long = "allow-host-path", value_name = "DIR[:rw]")]
    allow_host_paths: Vec<String>,
    /// Serve the local backend without isolation when the host offers none (or when
    /// --options asks for `"isolation": "none"`): clients' commands then run as this
    /// server's user, with its access to the host. Without this flag the server uses
    /// the strongest isolation the host offers (namespaces, then Landlock) or refuses
    /// to start.
    #[arg(long)]
    unsafe_no_isolation: bool,
    /// Serve HTTPS with this PEM certificate chain (leaf first); needs --tls-key.
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Serve MCP's tools over streamable HTTP at `/mcp` (each tenant's token as
    /// `Authorization: Bearer`; each tenant sees its own sessions), keeping the
    /// sessions' state and snapshots in DIR.
    #[arg(long, value_name = "DIR", conflicts_with = "fly_only")]
    mcp_data_dir: Option<PathBuf>,
    /// The most live sandboxes one tenant's MCP sessions hold at once; past it, a new
    /// session is a tool error naming the limit. (A tenants file's quotas bound the
    /// Fly and E2B faces; this bounds MCP's.)
    #[arg(long, value_name = "N", default_value_t = 8, requires = "mcp_data_dir")]
    mcp_max_sandboxes: u32,
    /// Suspend an MCP session's sandbox (snapshot, then stop it) after this many
    /// seconds without a call; the next call restores it.
    #[arg(
        long,
        value_name = "SECS",
        default_value_t = 900,
        requires = "mcp_data_dir"
    )]
    mcp_idle_secs: u64,
}

/// The local backend at the isolation `options` asks for, or the strongest this host
/// offers; `none` only with `--unsafe-no-isolation`. Its sandboxes never share this
/// host's network unless `options` asks for it.
fn local_backend(
    mut options: serde_json::Value,
    unsafe_no_isolation: bool,
) -> sandcell::Result<Box<dyn SandboxBackend>> {
    let asked = options
        .get("isolation")
        .and_then(|v| v.as_str())
        .map(str::to_owned);
    // At Landlock a full network would be this host's, shared by every client's
    // sandboxes (ADVERSARIAL 38): refused unless --options says otherwise.
    if let Some(options) = options.as_object_mut() {
        options
            .entry("share_host_network")
            .or_insert(serde_json::json!(false));
        // A tenant's sandboxes share one budget of kernel watches, so no tenant spends
        // the whole server's (FINDINGS8 T1).
        options
            .entry("watch_budget_label")
            .or_insert(serde_json::json!(sandcell_server::TENANT_LABEL));
    }
    match asked.as_deref() {
        Some("none") if !unsafe_no_isolation => Err(sandcell::Error::invalid_input(
            "--options asks for \"isolation\": \"none\", which gives every client this \
             server's access to the host; pass --unsafe-no-isolation to mean it",
        )),
        Some(_) => sandcell_local::LocalBackend::from_options(options),
        None => {
            let mut tried = Vec::new();
            for level in ["namespaces", "landlock"] {
                options["isolation"] = serde_json::json!(level);
                match sandcell_local::LocalBackend::from_options(options.clone()) {
                    Ok(backend) => {
                        eprintln!("sandcell-server: local backend isolation: {level}");
                        return Ok(backend);
                    }
                    Err(e) => tried.push(format!("{level}: {e}")),
                }
            }
            if !unsafe_no_isolation {
                return Err(sandcell::Error::unsupported(format!(
                    "this host offers no isolation for the local backend ({}); pass \
                     --unsafe-no-isolation to serve without it",
                    tried.join("; ")
                )));
            }
            eprintln!("sandcell-server: local backend isolation: none (--unsafe-no-isolation)");
            options["isolation"] = serde_json::json!("none");
            sandcell_local::LocalBackend::from_options(options)
        }
    }
}

/// `DIR` or `DIR:rw`, as `--allow-host-path` takes it.
fn host_path(arg: &str) -> sandcell::Result<HostPath> {
    let (dir, writable) = match arg.strip_suffix(":rw") {
        Some(dir) => (dir, true),
        None => (arg.strip_suffix(":ro").unwrap_or(arg), false),
    };
    let dir = PathBuf::from(dir);
    if !dir.is_absolute() || !dir.is_dir() {
        return Err(sandcell::Error::invalid_input(format!(
            "--allow-host-path {arg:?}: not an absolute path to an existing directory"
        )));
    }
    Ok(if writable {
        HostPath::writable(dir)
    } else {
        HostPath::read_only(dir)
    })
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    raise_open_file_limit();
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sandcell-server: {e}");
            ExitCode::from(if e.kind() == sandcell::ErrorKind::InvalidInput {
                2
            } else {
                1
            })
        }
    }
}

/// The server's tenants: those of `--tenants FILE`, or one holding `--token`.
fn server_config(args: &Args) -> sandcell::Result<ServerConfig> {
    match (&args.tenants, &args.token) {
        (Some(file), _) => {
            let bytes = sandcell::raw::secret_file::read(file, "--tenants")?;
            let text = String::from_utf8(bytes).map_err(|_| {
                sandcell::Error::invalid_input(format!(
                    "--tenants {}: not UTF-8 text",
                    file.display()
                ))
            })?;
            let tenants = TenantsFile::from_yaml(&text)
                .and_then(ServerConfig::with_tenants)
                .map_err(|e| e.context(format!("--tenants {}", file.display())))?;
            Ok(tenants)
        }
        (None, Some(token)) if !token.trim().is_empty() => Ok(ServerConfig::new(token.clone())),
        (None, _) => Err(sandcell::Error::invalid_input(
            "an empty token would let anyone in; set --token, SANDCELL_SERVER_TOKEN or \
             --tenants FILE",
        )),
    }
}

async fn run(args: Args) -> sandcell::Result<()> {
    let mut config = server_config(&args)?;
    let options = match &args.options {
        Some(json) => serde_json::from_str(json)
            .map_err(|e| sandcell::Error::invalid_input(format!("--options is not JSON: {e}")))?,
        None => match args.backend {
            Backend::Local => serde_json::json!({ "root": args.root }),
            Backend::Docker => serde_json::json!({}),
        },
    };
    // Answers never name where the server keeps its sandboxes and sessions.
    if let Some(root) = options.get("root").and_then(|r| r.as_str()) {
        config.private_paths.push(PathBuf::from(root));
    }
    config
        .private_paths
        .extend(args.mcp_data_dir.iter().cloned());
    let backend: Arc<dyn SandboxBackend> = match args.backend {
        Backend::Local => Arc::from(local_backend(options, args.unsafe_no_isolation)?),
        Backend::Docker => Arc::from(sandcell_docker::DockerBackend::from_options(options)?),
    };
    config.max_file_bytes = args.max_file_bytes;
    config.max_transfer_bytes_per_tenant = args.max_transfer_bytes_per_tenant;
    config.max_archive_streams_per_tenant = args.max_archive_streams_per_tenant;
    config.max_watches_per_tenant = args.max_watches_per_tenant;
    config.header_read_timeout = std::time::Duration::from_secs(args.header_read_timeout);
    config.body_read_timeout = std::time::Duration::from_secs(args.body_read_timeout);
    config.idle_timeout = std::time::Duration::from_secs(args.idle_timeout);
    config.held_response_timeout = std::time::Duration::from_secs(args.held_response_timeout);
    config.max_connections = args.max_connections;
    config.max_connections_per_tenant = args.max_connections_per_tenant;
    config.max_unauthenticated_per_address = args.max_unauthenticated_per_address;
    config.max_commands_per_tenant = args.max_commands_per_tenant;
    config.default_limits = sandcell::Limits::new()
        .cpu_millis(args.default_cpu_millis)
        .memory_bytes(args.default_memory_mb.saturating_mul(1 << 20))
        .pids(args.default_pids);
    if args.default_disk_mb > 0 {
        config.default_limits.disk_bytes = Some(args.default_disk_mb.saturating_mul(1 << 20));
    }
    config.faces = match args.fly_only {
        true => [sandcell_server::Face::Fly].into(),
        false => args.faces.iter().copied().collect(),
    };
    config.e2b_base_template = args.e2b_base_template.clone();
    config.code_python = args.code_python.clone();
    for arg in &args.allow_host_paths {
        config = config.allow_host_path(host_path(arg)?);
    }
    if let Some(dir) = &args.mcp_data_dir {
        // The sessions of MCP's tools outlive the server, as the CLI's do.
        config = config
            .with_mcp(Arc::clone(&backend), |builder| {
                builder
                    .data_dir(dir)
                    .shutdown_policy(sandcell::manager::ShutdownPolicy::Keep)
                    .max_sandboxes_per_tenant(args.mcp_max_sandboxes)
                    .idle_timeout(std::time::Duration::from_secs(args.mcp_idle_secs))
            })
            .await?;
    }
    let mcp = config.mcp_manager().cloned();
    // Read before listening, so a bad certificate fails the start, not each client.
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(Tls::from_pem_files(cert, key)?),
        _ => None,
    };
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| {
            sandcell::Error::with_source(
                sandcell::ErrorKind::Unavailable,
                format!("listening on {}", args.listen),
                e,
            )
        })?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    eprintln!(
        "sandcell-server: serving backend {} on {scheme}://{}",
        backend.name(),
        args.listen
    );
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let served = match tls {
        Some(tls) => serve_tls(listener, tls, backend, config, shutdown).await,
        None => serve(listener, backend, config, shutdown).await,
    };
    if let Some(manager) = mcp {
        manager.shutdown().await;
    }
    served.map_err(|e| sandcell::Error::with_source(sandcell::ErrorKind::Backend, "serving", e))
}

/// Raises the soft open-file limit to the hard one: every connection, running command
/// and watch holds descriptors, and the soft limit is often 1024 (systemd's default),
/// which a few tenants' commands would reach.
fn raise_open_file_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        let raised = rustix::process::Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        if let Err(e) = setrlimit(Resource::Nofile, raised) {
            tracing::warn!(error = %e, "raising the open-file limit");
        }
    }
}
