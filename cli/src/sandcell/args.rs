//! The command line's grammar: flags, subcommands and their value parsers.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use sandcell::{SandboxPath, SessionKey};

use crate::error::{error_chain, CliError};

#[derive(Debug, Parser)]
#[command(
    name = "sandcell",
    version,
    about = "Manage sandcell sandboxes and sessions from the shell",
    after_help = "Run `sandcell COMMAND --help` for a command's options."
)]
pub(crate) struct Cli {
    /// Where the session state, snapshots and workspaces live.
    #[arg(
        long,
        global = true,
        env = "SANDCELL_DATA_DIR",
        default_value = ".sandcell"
    )]
    pub(crate) data_dir: PathBuf,
    /// Which backend runs the sandboxes.
    #[arg(long, global = true, value_enum, default_value_t = BackendKind::Local)]
    pub(crate) backend: BackendKind,
    #[command(flatten)]
    pub(crate) stores: StoreArgs,
    /// Control-plane URL of the remote backend (a sandcell-server, or a Fly Machines
    /// endpoint), e.g. `http://127.0.0.1:7711`.
    #[arg(long, global = true)]
    pub(crate) remote_url: Option<String>,
    /// Bearer token for the remote backend.
    #[arg(
        long,
        global = true,
        env = "SANDCELL_REMOTE_TOKEN",
        hide_env_values = true
    )]
    pub(crate) remote_token: Option<String>,
    /// API key of the e2b backend (as E2B's SDKs read it).
    #[arg(long, global = true, env = "E2B_API_KEY", hide_env_values = true)]
    pub(crate) e2b_api_key: Option<String>,
    /// Control-plane URL of the e2b backend; unset, `https://api.{domain}`. A
    /// sandcell-server serves it on its own URL.
    #[arg(long, global = true, env = "E2B_API_URL")]
    pub(crate) e2b_api_url: Option<String>,
    /// Where envd is for every sandbox of the e2b backend (routed by headers); unset,
    /// each sandbox's own host under the domain. A sandcell-server serves it on its own
    /// URL.
    #[arg(long, global = true, env = "E2B_SANDBOX_URL")]
    pub(crate) e2b_sandbox_url: Option<String>,
    /// E2B's domain (default `e2b.app`).
    #[arg(long, global = true, env = "E2B_DOMAIN")]
    pub(crate) e2b_domain: Option<String>,
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Where the manager keeps its state and snapshots, and who it is to other managers
/// sharing them.
#[derive(Debug, Clone, Args)]
pub(crate) struct StoreArgs {
    /// The session state: `sqlite:PATH` or `postgres://user:password@host/db` (shared by
    /// several hosts). Default: `state.db` in the data directory.
    #[arg(
        long = "state",
        global = true,
        env = "SANDCELL_STATE",
        hide_env_values = true
    )]
    pub(crate) state: Option<String>,
    /// The snapshots: `file:DIR` or `s3://bucket/prefix` (endpoint, region and
    /// credentials from the `AWS_*` variables); also `gs://` and `az://`. Default:
    /// `snapshots/` in the data directory.
    #[arg(long = "snapshots", global = true, env = "SANDCELL_SNAPSHOTS")]
    pub(crate) snapshots: Option<String>,
    /// This manager's id: the owner of the session leases it takes. Give every host
    /// sharing one state store its own. Default: derived from the state store, so
    /// programs with other data directories on the same backend are never mistaken
    /// for this one.
    #[arg(long, global = true, env = "SANDCELL_MANAGER_ID")]
    pub(crate) manager_id: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum BackendKind {
    /// Directories and processes on this host.
    Local,
    /// Docker containers.
    Docker,
    /// Remote VMs over a Fly-Machines-style API.
    Remote,
    /// E2B sandboxes (E2B's cloud, or a sandcell-server's E2B face).
    E2b,
}

impl BackendKind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            BackendKind::Local => "local",
            BackendKind::Docker => "docker",
            BackendKind::Remote => "remote",
            BackendKind::E2b => "e2b",
        }
    }

    /// The flag that selects this backend, as a hint shows it.
    pub(crate) fn flag(self) -> &'static str {
        match self {
            BackendKind::Local => "",
            BackendKind::Docker => " --backend docker",
            BackendKind::Remote => " --backend remote",
            BackendKind::E2b => " --backend e2b",
        }
    }
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Manage template directories (local backend).
    #[command(subcommand)]
    Template(TemplateCommand),
    #[command(flatten)]
    Session(SessionCommand),
}

/// The commands that work through the session manager.
#[derive(Debug, Subcommand)]
pub(crate) enum SessionCommand {
    /// Reuse, restore or create a session's sandbox; prints one JSON object.
    Acquire {
        #[command(flatten)]
        session: SessionArgs,
        /// The template a new session starts from (see `template add`; default: `default`).
        /// A known session keeps its own.
        #[arg(long)]
        template: Option<String>,
        /// An environment variable for every command in the sandbox.
        #[arg(long = "env", value_name = "K=V", value_parser = parse_key_value)]
        env: Vec<(String, String)>,
        #[command(flatten)]
        limits: LimitArgs,
    },
    /// Run a command; its stdout and stderr pass through and its exit status is ours.
    Exec {
        #[command(flatten)]
        session: SessionArgs,
        /// Kill the command (and everything it started) after this many seconds; exit 124.
        #[arg(long, value_name = "SECS", value_parser = parse_seconds)]
        timeout: Option<Duration>,
        /// Working directory, relative to the workspace.
        #[arg(long, value_name = "PATH")]
        cwd: Option<String>,
        /// An environment variable for this command.
        #[arg(long = "env", value_name = "K=V", value_parser = parse_key_value)]
        env: Vec<(String, String)>,
        /// Forward our stdin to the command (otherwise it reads an empty stdin).
        #[arg(short, long)]
        interactive: bool,
        /// The command and its arguments.
        #[arg(last = true, required = true, value_name = "ARGV")]
        argv: Vec<String>,
    },
    /// An interactive terminal in the session's sandbox (bash, else sh, unless a command
    /// is given): keys go to it raw (Ctrl-C included), size changes follow, and its exit
    /// status is ours.
    Shell {
        #[command(flatten)]
        session: SessionArgs,
        /// Working directory, relative to the workspace.
        #[arg(long, value_name = "PATH")]
        cwd: Option<String>,
        /// An environment variable for the shell.
        #[arg(long = "env", value_name = "K=V", value_parser = parse_key_value)]
        env: Vec<(String, String)>,
        /// The program to run instead of a shell, and its arguments.
        #[arg(last = true, value_name = "ARGV")]
        argv: Vec<String>,
    },
    /// Write a file from stdin.
    Write {
        #[command(flatten)]
        session: SessionArgs,
        /// The file, relative to the workspace.
        path: String,
    },
    /// Print a file to stdout.
    Read {
        #[command(flatten)]
        session: SessionArgs,
        /// The file, relative to the workspace.
        path: String,
    },
    /// List a directory; one JSON object per entry.
    Ls {
        #[command(flatten)]
        session: SessionArgs,
        /// The directory, relative to the workspace (default: the workspace).
        path: Option<String>,
    },
    /// Snapshot the workspace; prints the snapshot manifest as JSON.
    Snapshot {
        #[command(flatten)]
        session: SessionArgs,
    },
    /// Snapshot, then destroy the sandbox; the next access restores it.
    Suspend {
        #[command(flatten)]
        session: SessionArgs,
    },
    /// Destroy the sandbox (keeping snapshots), or purge the session entirely.
    Release {
        #[command(flatten)]
        session: SessionArgs,
        #[command(flatten)]
        how: ReleaseHow,
    },
    /// List sessions; one JSON object per session.
    List {
        /// Only this tenant's sessions.
        #[arg(long)]
        tenant: Option<String>,
        /// Add each live sandbox's resource use now (`metrics`: CPU time, memory and
        /// its limit, processes, workspace bytes; `null` with `metrics_error` where the
        /// backend cannot say).
        #[arg(long)]
        metrics: bool,
    },
    /// Reconcile (destroy labelled sandboxes nobody knows, mark vanished ones) and reap
    /// once; prints a JSON summary.
    Gc {
        /// Also suspend sessions unused for this many seconds.
        #[arg(long, value_name = "SECS", value_parser = parse_seconds)]
        idle_timeout: Option<Duration>,
        /// Also delete all but the newest N snapshots of each session.
        #[arg(long, value_name = "N")]
        keep_last: Option<usize>,
    },
    /// Serve MCP (Model Context Protocol) on stdin and stdout: tools to run commands and
    /// edit files in named sessions, for an agent that starts this as its MCP server.
    Mcp {
        /// The tenant whose sessions the tools act on.
        #[arg(long, default_value = "default")]
        tenant: String,
        /// The template a new session starts from (default: `default`).
        #[arg(long)]
        template: Option<String>,
    },
}

/// Exactly one of `--destroy` and `--purge`.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub(crate) struct ReleaseHow {
    /// Destroy the sandbox; the snapshots stay and a later acquire restores them.
    #[arg(long)]
    pub(crate) destroy: bool,
    /// Destroy the sandbox and delete the session and all its snapshots.
    #[arg(long)]
    pub(crate) purge: bool,
}

#[derive(Debug, Subcommand)]
pub(crate) enum TemplateCommand {
    /// Register (or re-point) a template. Local: new sandboxes start from a
    /// copy-on-write view of DIR. Docker: DIR is a build context, or give an image.
    Add {
        /// Template name.
        name: String,
        /// Host directory (Docker: or an image reference).
        #[arg(value_name = "DIR")]
        dir: PathBuf,
    },
    /// List registered templates; one JSON object per template.
    List,
}

#[derive(Debug, Args)]
pub(crate) struct SessionArgs {
    /// Session id.
    pub(crate) session: String,
    /// Tenant the session belongs to.
    #[arg(long, default_value = "default")]
    pub(crate) tenant: String,
}

impl SessionArgs {
    pub(crate) fn key(&self) -> Result<SessionKey, CliError> {
        Ok(SessionKey::new(&self.tenant, &self.session)?)
    }
}

/// A new session's resource limits. Where a flag is left out, the library's
/// recommended limit applies (one CPU, 512 MiB of memory, 1024 processes, 10 GiB of
/// disk), where the backend enforces that kind of limit.
#[derive(Debug, Clone, Default, clap::Args)]
pub(crate) struct LimitArgs {
    /// CPU time, in thousandths of a core (1000: one core).
    #[arg(long, value_name = "MILLICORES")]
    pub(crate) cpu_millis: Option<u32>,
    /// Memory, in MiB.
    #[arg(long, value_name = "MIB")]
    pub(crate) memory_mb: Option<u64>,
    /// Processes and threads.
    #[arg(long, value_name = "N")]
    pub(crate) pids: Option<u32>,
    /// Disk the workspace may fill, in MiB.
    #[arg(long, value_name = "MIB")]
    pub(crate) disk_mb: Option<u64>,
}

impl LimitArgs {
    /// The limits the flags name, the recommended ones the backend enforces filling
    /// the rest; an explicit limit the backend cannot enforce is kept (and refused).
    pub(crate) fn resolve(&self, caps: &sandcell::Capabilities) -> sandcell::Limits {
        let mut given = sandcell::Limits::new();
        given.cpu_millis = self.cpu_millis;
        given.memory_bytes = self.memory_mb.map(|mb| mb.saturating_mul(1 << 20));
        given.pids = self.pids;
        given.disk_bytes = self.disk_mb.map(|mb| mb.saturating_mul(1 << 20));
        given.with_enforced_defaults(&sandcell::Limits::recommended(), caps)
    }
}

pub(crate) fn parse_key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("expected K=V, got {s:?}")),
    }
}

pub(crate) fn parse_seconds(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .parse()
        .map_err(|_| format!("expected a number of seconds, got {s:?}"))?;
    Duration::try_from_secs_f64(secs)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| format!("expected a positive number of seconds, got {s:?}"))
}

pub(crate) fn parse_path(path: &str) -> Result<SandboxPath, CliError> {
    path.parse::<SandboxPath>().map_err(|err| {
        CliError::bad_input(
            error_chain(&err),
            "give a path relative to the workspace, without `..`",
        )
    })
}
