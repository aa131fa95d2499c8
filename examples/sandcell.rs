//! `sandcell`: poke at sandboxes by hand — acquire a session, run commands in it, move files
//! in and out, snapshot, suspend, clean up after a crash.
//!
//! Every invocation is a new process over one [`SandboxManager`] whose state (SQLite) and
//! snapshots live in a data directory, so each command reconnects to, or restores, what
//! earlier ones left. Commands that touch a session's sandbox (`exec`, `write`, `read`,
//! `ls`, `snapshot`) resume a suspended session first.
//!
//! ```text
//! cargo run --example sandcell -- acquire demo
//! echo 'print(6 * 7)' | cargo run --example sandcell -- write demo main.py
//! cargo run --example sandcell -- exec demo -- python3 main.py
//! cargo run --example sandcell -- suspend demo
//! cargo run --example sandcell -- read demo main.py        # restored from the snapshot
//! ```
//!
//! Output is JSON (one object per line) wherever it is data; errors are one line on stderr.
//! Exit status: 0 on success, 2 for bad input (bad path, unknown session or template, bad
//! flag), 1 for other failures; `exec` exits with the command's status (124 when its
//! timeout fired, 128 + N when signal N ended it).

use std::collections::BTreeMap;
use std::fmt::Display;
use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use futures::{FutureExt, StreamExt};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use sandcell::manager::{ShutdownPolicy, SnapshotRetention};
use sandcell::store::SessionRecord;
use sandcell::{
    Error, ErrorKind, EventKind, ExecRequest, ExitStatus, ReleaseMode, SandboxBackend,
    SandboxManager, SandboxPath, SandboxSpec, SessionKey,
};
use sandcell_local::LocalBackend;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;

/// Exit status for bad input: a bad path, an unknown session or template, a bad flag.
const EXIT_BAD_INPUT: u8 = 2;
/// Exit status for every other failure.
const EXIT_FAILURE: u8 = 1;
/// Exit status of `exec` when the command's timeout fired (as coreutils' `timeout`).
const EXIT_TIMEOUT: u8 = 124;
/// Ctrl-C: `exec` kills the command and reports it as ended by this signal (status 130).
const SIGINT: i32 = 2;

#[derive(Debug, Parser)]
#[command(
    name = "sandcell",
    version,
    about = "Manage sandcell sandboxes and sessions from the shell",
    after_help = "Run `sandcell COMMAND --help` for a command's options."
)]
struct Cli {
    /// Where the session state, snapshots and workspaces live.
    #[arg(
        long,
        global = true,
        env = "SANDCELL_DATA_DIR",
        default_value = ".sandcell"
    )]
    data_dir: PathBuf,
    /// Which backend runs the sandboxes.
    #[arg(long, global = true, value_enum, default_value_t = BackendKind::Local)]
    backend: BackendKind,
    /// Control-plane URL of the remote backend (a sandcell-server, or a Fly Machines
    /// endpoint), e.g. `http://127.0.0.1:7711`.
    #[arg(long, global = true)]
    remote_url: Option<String>,
    /// Bearer token for the remote backend.
    #[arg(
        long,
        global = true,
        env = "SANDCELL_REMOTE_TOKEN",
        hide_env_values = true
    )]
    remote_token: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum BackendKind {
    /// Directories and processes on this host.
    Local,
    /// Docker containers.
    Docker,
    /// Remote VMs over a Fly-Machines-style API.
    Remote,
}

impl BackendKind {
    fn name(self) -> &'static str {
        match self {
            BackendKind::Local => "local",
            BackendKind::Docker => "docker",
            BackendKind::Remote => "remote",
        }
    }

    /// The flag that selects this backend, as a hint shows it.
    fn flag(self) -> &'static str {
        match self {
            BackendKind::Local => "",
            BackendKind::Docker => " --backend docker",
            BackendKind::Remote => " --backend remote",
        }
    }
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Manage template directories (local backend).
    #[command(subcommand)]
    Template(TemplateCommand),
    #[command(flatten)]
    Session(SessionCommand),
}

/// The commands that work through the session manager.
#[derive(Debug, Subcommand)]
enum SessionCommand {
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
}

/// Exactly one of `--destroy` and `--purge`.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
struct ReleaseHow {
    /// Destroy the sandbox; the snapshots stay and a later acquire restores them.
    #[arg(long)]
    destroy: bool,
    /// Destroy the sandbox and delete the session and all its snapshots.
    #[arg(long)]
    purge: bool,
}

#[derive(Debug, Subcommand)]
enum TemplateCommand {
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
struct SessionArgs {
    /// Session id.
    session: String,
    /// Tenant the session belongs to.
    #[arg(long, default_value = "default")]
    tenant: String,
}

impl SessionArgs {
    fn key(&self) -> Result<SessionKey, CliError> {
        Ok(SessionKey::new(&self.tenant, &self.session)?)
    }
}

fn parse_key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("expected K=V, got {s:?}")),
    }
}

fn parse_seconds(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .parse()
        .map_err(|_| format!("expected a number of seconds, got {s:?}"))?;
    Duration::try_from_secs_f64(secs)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| format!("expected a positive number of seconds, got {s:?}"))
}

/// A failure to report: one line of what went wrong and what to do, and the exit status.
#[derive(Debug)]
struct CliError {
    status: u8,
    message: String,
    hint: Option<String>,
}

impl CliError {
    fn bad_input(message: impl Display, hint: impl Display) -> Self {
        CliError {
            status: EXIT_BAD_INPUT,
            message: message.to_string(),
            hint: Some(hint.to_string()),
        }
    }

    fn failure(message: impl Display, hint: impl Display) -> Self {
        CliError {
            status: EXIT_FAILURE,
            message: message.to_string(),
            hint: Some(hint.to_string()),
        }
    }
}

impl From<Error> for CliError {
    fn from(err: Error) -> Self {
        let status = match err.kind() {
            ErrorKind::InvalidInput | ErrorKind::NotFound => EXIT_BAD_INPUT,
            _ => EXIT_FAILURE,
        };
        let hint = match err.kind() {
            ErrorKind::InvalidInput => "check the arguments (`sandcell --help`)",
            ErrorKind::NotFound => {
                "check the name or path (`sandcell list`, `sandcell ls SESSION`)"
            }
            ErrorKind::AlreadyExists => "pick another name or remove the existing one",
            ErrorKind::PermissionDenied => "the sandbox does not allow this path or operation",
            ErrorKind::LimitExceeded => "release a session or raise the limit",
            ErrorKind::Timeout => "retry, or allow more time",
            ErrorKind::Unavailable => "check that the backend is running, then retry",
            ErrorKind::Corrupt => {
                "the snapshot is damaged; `sandcell release SESSION --purge` starts over"
            }
            ErrorKind::InvalidState => "check the session with `sandcell list`",
            ErrorKind::Unsupported => "this backend cannot do that; try another backend",
            _ => "rerun with SANDCELL_LOG=debug for details",
        };
        CliError {
            status,
            message: error_chain(&err),
            hint: Some(hint.to_owned()),
        }
    }
}

impl From<std::io::Error> for CliError {
    fn from(err: std::io::Error) -> Self {
        CliError::failure(err, "check the terminal's input and output")
    }
}

/// The error and its sources on one line.
fn error_chain(err: &dyn std::error::Error) -> String {
    let mut line = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !normalized(&line).contains(&normalized(&text)) {
            line.push_str(": ");
            line.push_str(&text);
        }
        source = cause.source();
    }
    one_line(&line)
}

/// Lower case, without the `(os error N)` suffix: how a source that only repeats the
/// message is recognised.
fn normalized(text: &str) -> String {
    let text = text.to_lowercase();
    match text.rfind(" (os error ") {
        Some(at) => text[..at].to_owned(),
        None => text,
    }
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn main() -> ExitCode {
    // A bug must still end with one line and status 1, not a backtrace.
    std::panic::set_hook(Box::new(|info| {
        eprintln!(
            "sandcell: internal error: {}; please report this",
            one_line(&info.to_string())
        );
        std::process::exit(i32::from(EXIT_FAILURE));
    }));
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => return usage_error(&err),
    };
    init_logging();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            return report(&CliError::failure(
                format_args!("cannot start the async runtime: {err}"),
                "check the process limits",
            ))
        }
    };
    let status = match runtime.block_on(run(cli)) {
        Ok(status) => status,
        Err(err) => report(&err),
    };
    // A command still reading our stdin (`exec -i`) must not keep the process alive.
    runtime.shutdown_timeout(Duration::from_millis(100));
    status
}

fn usage_error(err: &clap::Error) -> ExitCode {
    use clap::error::ErrorKind as Kind;
    if matches!(err.kind(), Kind::DisplayHelp | Kind::DisplayVersion) {
        let _ = err.print();
        return ExitCode::SUCCESS;
    }
    // clap's message runs until the first blank line; usage and tips follow it.
    let text = err.to_string();
    let message = text
        .lines()
        .take_while(|line| !line.trim().is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    let message = one_line(message.trim_start_matches("error: ")).replace(": ,", ":");
    report(&CliError::bad_input(
        message,
        "run `sandcell --help` (or `sandcell COMMAND --help`) for usage",
    ))
}

fn report(err: &CliError) -> ExitCode {
    match &err.hint {
        Some(hint) => eprintln!("sandcell: {}; {hint}", err.message),
        None => eprintln!("sandcell: {}", err.message),
    }
    ExitCode::from(err.status)
}

/// `SANDCELL_LOG=debug` (or `info`, `trace`, ...) prints the library's tracing to stderr.
fn init_logging() {
    let Some(level) = std::env::var("SANDCELL_LOG")
        .ok()
        .and_then(|v| v.parse::<tracing::Level>().ok())
    else {
        return;
    };
    tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .init();
}

async fn run(cli: Cli) -> Result<ExitCode, CliError> {
    let data_dir = &cli.data_dir;
    if cli.backend != BackendKind::Remote && cli.remote_url.is_some() {
        return Err(CliError::bad_input(
            "--remote-url applies to --backend remote only",
            "drop it, or add --backend remote",
        ));
    }
    let backend = cli.backend;
    let remote = match backend {
        BackendKind::Remote => Some(remote_config(&cli)?),
        _ => None,
    };
    match cli.command {
        Command::Template(TemplateCommand::Add { .. }) if backend == BackendKind::Remote => {
            Err(CliError::bad_input(
                "a remote backend's templates live on its server",
                "pass the server's template name to `acquire --template`",
            ))
        }
        Command::Template(TemplateCommand::Add { name, dir }) => {
            let source = Templates::add(data_dir, backend, &name, &dir)?;
            print_json(&json!({ "template": name, "backend": backend.name(), "source": source }))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Template(TemplateCommand::List) => {
            for (name, source) in Templates::load(data_dir)?.of(backend) {
                print_json(
                    &json!({ "template": name, "backend": backend.name(), "source": source }),
                )?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Session(command) => {
            let manager = open_manager(data_dir, backend, remote, &command).await?;
            run_session_command(&manager, data_dir, backend, command).await
        }
    }
}

async fn run_session_command(
    manager: &Manager,
    data_dir: &Path,
    backend: BackendKind,
    command: SessionCommand,
) -> Result<ExitCode, CliError> {
    match command {
        SessionCommand::Acquire {
            session,
            template,
            env,
        } => {
            let key = session.key()?;
            if let Some(template) = &template {
                if !Templates::load(data_dir)?.contains(backend, template) {
                    return Err(CliError::bad_input(
                        format_args!("unknown template {template:?}"),
                        format_args!(
                            "register it with `sandcell{} template add {template} {}`",
                            backend.flag(),
                            if backend == BackendKind::Docker {
                                "DIR|IMAGE"
                            } else {
                                "DIR"
                            }
                        ),
                    ));
                }
            }
            // A known session keeps its spec (template, env); flags add to it.
            let mut spec = match manager.session(&key).await? {
                Some(record) => {
                    same_backend(manager, &record)?;
                    record.spec
                }
                None => {
                    let template = template.as_deref().unwrap_or("default");
                    if !Templates::load(data_dir)?.contains(backend, template) {
                        return Err(CliError::bad_input(
                            format_args!("the {} backend has no template {template:?}", backend.name()),
                            format_args!(
                                "register one with `sandcell{} template add {template} IMAGE`, or pass --template",
                                backend.flag()
                            ),
                        ));
                    }
                    SandboxSpec::new(template)
                }
            };
            spec.env.extend(env);
            let mut events = manager.subscribe();
            let progress = Progress::start(format_args!("acquiring session {key}"));
            let handle = manager.acquire(&key, &spec).await?;
            progress.finish();
            let mut outcome = "reused";
            while let Some(Some(event)) = events.next().now_or_never() {
                if event.session.as_ref() == Some(&key) {
                    outcome = match event.kind {
                        EventKind::Created => "created",
                        EventKind::Restored => "restored",
                        EventKind::Resumed => "resumed",
                        _ => continue,
                    };
                }
            }
            let record = manager.session(&key).await?.ok_or_else(|| {
                CliError::failure(
                    format_args!("session {key} vanished right after it was acquired"),
                    "another process released it; acquire again",
                )
            })?;
            let mut out = session_json(&record);
            out["outcome"] = json!(outcome);
            out["workspace"] = json!(handle.info().details.get("workspace"));
            print_json(&out)?;
            Ok(ExitCode::SUCCESS)
        }
        SessionCommand::Exec {
            session,
            timeout,
            cwd,
            env,
            interactive,
            argv,
        } => {
            let key = session.key()?;
            let mut request = ExecRequest::new(argv);
            if let Some(cwd) = cwd {
                request = request.cwd(parse_path(&cwd)?);
            }
            request.env.extend(env);
            if let Some(timeout) = timeout {
                request = request.timeout(timeout);
            }
            if !interactive {
                request = request.stdin(bytes::Bytes::new());
            }
            let handle = open_session(manager, &key).await?;
            let process = handle.call("exec", |b, id| b.exec(id, request)).await?;
            let status = stream_process(process).await?;
            Ok(exit_code_of(&status))
        }
        SessionCommand::Write { session, path } => {
            let key = session.key()?;
            let path = parse_path(&path)?;
            let mut data = Vec::new();
            std::io::stdin().lock().read_to_end(&mut data)?;
            let handle = open_session(manager, &key).await?;
            handle
                .call("write", |b, id| b.write(id, &path, data.into()))
                .await?;
            Ok(ExitCode::SUCCESS)
        }
        SessionCommand::Read { session, path } => {
            let key = session.key()?;
            let path = parse_path(&path)?;
            let handle = open_session(manager, &key).await?;
            let data = handle.call("read", |b, id| b.read(id, &path)).await?;
            write_stdout(&data)?;
            Ok(ExitCode::SUCCESS)
        }
        SessionCommand::Ls { session, path } => {
            let key = session.key()?;
            let path = match path {
                Some(path) => parse_path(&path)?,
                None => SandboxPath::root(),
            };
            let handle = open_session(manager, &key).await?;
            for entry in handle
                .call("list_dir", |b, id| b.list_dir(id, &path))
                .await?
            {
                print_json(&json!(entry))?;
            }
            Ok(ExitCode::SUCCESS)
        }
        SessionCommand::Snapshot { session } => {
            let key = session.key()?;
            open_session(manager, &key).await?;
            let progress = Progress::start(format_args!("snapshotting {key}"));
            let manifest = manager.snapshot(&key).await?;
            progress.finish();
            print_json(&json!(manifest))?;
            Ok(ExitCode::SUCCESS)
        }
        SessionCommand::Suspend { session } => {
            let key = session.key()?;
            known_session(manager, &key).await?;
            let progress = Progress::start(format_args!("suspending {key}"));
            manager.release(&key, ReleaseMode::Suspend).await?;
            progress.finish();
            let record = known_session(manager, &key).await?;
            let mut out = session_json(&record);
            out["snapshot"] = json!(manager.snapshots(&key).await?.last().map(|m| &m.id));
            print_json(&out)?;
            Ok(ExitCode::SUCCESS)
        }
        SessionCommand::Release { session, how } => {
            let key = session.key()?;
            known_session(manager, &key).await?;
            let mode = if how.purge {
                ReleaseMode::Purge
            } else {
                ReleaseMode::Destroy
            };
            manager.release(&key, mode).await?;
            let status = match manager.session(&key).await? {
                Some(record) => session_json(&record),
                None => json!({
                    "tenant": key.tenant(),
                    "session": key.session(),
                    "sandbox_id": null,
                    "status": "purged",
                    "backend": manager.backend().name(),
                }),
            };
            print_json(&status)?;
            Ok(ExitCode::SUCCESS)
        }
        SessionCommand::List { tenant } => {
            if let Some(tenant) = &tenant {
                // The rule a key applies, so a typo is an error rather than an empty list.
                SessionKey::new(tenant, "x")?;
            }
            for record in manager.list(tenant.as_deref()).await? {
                print_json(&session_json(&record))?;
            }
            Ok(ExitCode::SUCCESS)
        }
        SessionCommand::Gc { .. } => {
            let progress = Progress::start("reconciling and reaping");
            let reconcile = manager.reconcile().await?;
            let reap = manager.reap_once().await?;
            progress.finish();
            print_json(&json!({ "reconcile": reconcile, "reap": reap }))?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// The manager the CLI drives: any backend, boxed.
type Manager = SandboxManager<Box<dyn SandboxBackend>>;

/// Opens the manager over the data directory. Sessions outlive the process: shutdown keeps
/// their sandboxes, and reconcile runs only in `gc`, where the user asked for it.
/// The remote backend's settings from the flags (or their environment variables).
fn remote_config(cli: &Cli) -> Result<sandcell_remote::RemoteConfig, CliError> {
    let url = cli.remote_url.clone().ok_or_else(|| {
        CliError::bad_input(
            "--backend remote needs the server's URL",
            "pass --remote-url URL (e.g. http://127.0.0.1:7711 for a local sandcell-server)",
        )
    })?;
    let token = cli.remote_token.clone().ok_or_else(|| {
        CliError::bad_input(
            "--backend remote needs an API token",
            "pass --remote-token TOKEN or set SANDCELL_REMOTE_TOKEN",
        )
    })?;
    Ok(sandcell_remote::RemoteConfig::new(url, token))
}

async fn open_manager(
    data_dir: &Path,
    kind: BackendKind,
    remote: Option<sandcell_remote::RemoteConfig>,
    command: &SessionCommand,
) -> Result<Manager, CliError> {
    let templates = Templates::load(data_dir)?;
    let backend: Box<dyn SandboxBackend> = match (kind, remote) {
        (BackendKind::Remote, Some(config)) => {
            Box::new(sandcell_remote::RemoteBackend::connect(config).await?)
        }
        (BackendKind::Docker, _) => {
            let mut docker = sandcell_docker::DockerBackend::builder()
                .from_env()
                .on_progress(|p| Progress::note(&format!("{} {}", p.image, p.message)));
            for (name, source) in templates.of(kind) {
                docker = docker.template(name.clone(), docker_image(&name, &source));
            }
            Box::new(docker.build()?)
        }
        _ => {
            let mut local = LocalBackend::builder().root(data_dir.join("local"));
            for (name, dir) in templates.of(kind) {
                local = local.template(name, dir);
            }
            Box::new(local.build()?)
        }
    };
    let mut builder = SandboxManager::builder(backend)
        .data_dir(data_dir)
        .shutdown_policy(ShutdownPolicy::Keep)
        .reconcile_on_start(false);
    if let SessionCommand::Gc {
        idle_timeout,
        keep_last,
    } = command
    {
        if let Some(idle) = idle_timeout {
            builder = builder.idle_timeout(*idle);
        }
        if let Some(n) = keep_last {
            builder = builder.retention(SnapshotRetention::keep_all().keep_last(*n));
        }
    }
    Ok(builder.build().await?)
}

/// A Docker template's image: a directory is a build context, anything else a reference.
fn docker_image(name: &str, source: &str) -> sandcell_docker::ImageSpec {
    if Path::new(source).is_dir() {
        sandcell_docker::ImageSpec::build(source, format!("sandcell-cli/{name}:latest"))
    } else {
        sandcell_docker::ImageSpec::pull(source)
    }
}

/// A session created on another backend cannot be driven through this one.
fn same_backend(manager: &Manager, record: &SessionRecord) -> Result<(), CliError> {
    let here = manager.backend().name();
    if record.backend == here {
        return Ok(());
    }
    Err(CliError::bad_input(
        format_args!(
            "session {:?} lives on the {} backend, not {here}",
            record.key.session(),
            record.backend
        ),
        format_args!("pass --backend {}", record.backend),
    ))
}

/// The session's record; an unknown session is bad input.
async fn known_session(manager: &Manager, key: &SessionKey) -> Result<SessionRecord, CliError> {
    let record = manager.session(key).await?.ok_or_else(|| {
        let tenant = if key.tenant() == "default" {
            String::new()
        } else {
            format!(" --tenant {}", key.tenant())
        };
        CliError::bad_input(
            format_args!(
                "unknown session {:?} of tenant {:?}",
                key.session(),
                key.tenant()
            ),
            format_args!(
                "start it with `sandcell acquire {}{tenant}`, or see `sandcell list`",
                key.session()
            ),
        )
    })?;
    same_backend(manager, &record)?;
    Ok(record)
}

/// The session's sandbox, restored or resumed if it was suspended.
async fn open_session(
    manager: &Manager,
    key: &SessionKey,
) -> Result<sandcell::SandboxHandle<Box<dyn SandboxBackend>>, CliError> {
    let record = known_session(manager, key).await?;
    let progress = (!record.is_live()).then(|| Progress::start(format_args!("restoring {key}")));
    let handle = manager.acquire(key, &record.spec).await?;
    if let Some(progress) = progress {
        progress.finish();
    }
    Ok(handle)
}

fn parse_path(path: &str) -> Result<SandboxPath, CliError> {
    path.parse::<SandboxPath>().map_err(|err| {
        CliError::bad_input(
            error_chain(&err),
            "give a path relative to the workspace, without `..`",
        )
    })
}

/// Copies the process's output to ours as it arrives, then returns its exit status. Ctrl-C
/// kills the command and everything it started before we exit.
async fn stream_process(mut process: sandcell::Process) -> Result<ExitStatus, CliError> {
    let stdin_pump = process.take_stdin().map(|mut writer| {
        tokio::spawn(async move {
            let mut stdin = tokio::io::stdin();
            let _ = tokio::io::copy(&mut stdin, &mut writer).await;
            let _ = writer.shutdown().await;
        })
    });
    let mut stdout = process.take_stdout();
    let mut stderr = process.take_stderr();
    let mut out = tokio::io::stdout();
    let mut err = tokio::io::stderr();
    // A reader that went away (`| head`) stops the copying, not the command.
    let (mut out_open, mut err_open) = (true, true);
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    while stdout.is_some() || stderr.is_some() {
        tokio::select! {
            chunk = next_chunk(&mut stdout) => match chunk {
                Some(chunk) => {
                    let chunk = chunk?;
                    if out_open && (out.write_all(&chunk).await.is_err() || out.flush().await.is_err()) {
                        out_open = false;
                    }
                }
                None => stdout = None,
            },
            chunk = next_chunk(&mut stderr) => match chunk {
                Some(chunk) => {
                    let chunk = chunk?;
                    if err_open && (err.write_all(&chunk).await.is_err() || err.flush().await.is_err()) {
                        err_open = false;
                    }
                }
                None => stderr = None,
            },
            _ = &mut interrupted => {
                process.kill().await?;
                return Ok(ExitStatus::signaled(SIGINT));
            }
        }
    }
    let status = process.wait().await?;
    if let Some(pump) = stdin_pump {
        pump.abort();
    }
    Ok(status)
}

async fn next_chunk(
    stream: &mut Option<sandcell::OutputStream>,
) -> Option<sandcell::Result<bytes::Bytes>> {
    match stream {
        Some(stream) => stream.next().await,
        None => std::future::pending().await,
    }
}

/// The shell's convention: the exit code, 124 on timeout, 128 + N for signal N.
fn exit_code_of(status: &ExitStatus) -> ExitCode {
    if status.timed_out {
        return ExitCode::from(EXIT_TIMEOUT);
    }
    match (status.code, status.signal) {
        (Some(code), _) => ExitCode::from(u8::try_from(code & 0xff).unwrap_or(EXIT_FAILURE)),
        (None, Some(signal)) => {
            ExitCode::from(u8::try_from(128 + (signal & 0x7f)).unwrap_or(EXIT_FAILURE))
        }
        (None, None) => ExitCode::from(EXIT_FAILURE),
    }
}

/// A session as the CLI prints it.
fn session_json(record: &SessionRecord) -> Value {
    json!({
        "tenant": record.key.tenant(),
        "session": record.key.session(),
        "sandbox_id": record.sandbox_id,
        "status": record.status,
        "backend": record.backend,
        "template": record.spec.template,
        "created_at": record.created_at,
        "last_active": record.last_active,
    })
}

fn print_json(value: &Value) -> Result<(), CliError> {
    let mut line = value.to_string();
    line.push('\n');
    write_stdout(line.as_bytes())
}

/// Writes to stdout; a closed pipe (`| head`) ends the output quietly.
fn write_stdout(data: &[u8]) -> Result<(), CliError> {
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(data).and_then(|()| stdout.flush()) {
        Err(err) if err.kind() != std::io::ErrorKind::BrokenPipe => Err(err.into()),
        _ => Ok(()),
    }
}

/// A spinner with the elapsed time on a terminal; nothing when stderr is not one.
/// Image pulls and builds report into it, under the operation's own message.
struct Progress(ProgressBar);

/// The spinner on screen, if any, with its message.
static CURRENT: std::sync::Mutex<Option<(ProgressBar, String)>> = std::sync::Mutex::new(None);

impl Progress {
    fn start(message: impl Display) -> Self {
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        if std::io::stderr().is_terminal() {
            if let Ok(style) = ProgressStyle::with_template("{spinner} {msg} ({elapsed})") {
                bar.set_style(style);
            }
            bar.set_message(message.to_string());
            bar.enable_steady_tick(Duration::from_millis(100));
            if let Ok(mut current) = CURRENT.lock() {
                *current = Some((bar.clone(), message.to_string()));
            }
        }
        Progress(bar)
    }

    /// Shows a step of a long operation (an image build line) on the current spinner.
    fn note(step: &str) {
        if let Ok(current) = CURRENT.lock() {
            if let Some((bar, message)) = current.as_ref() {
                bar.set_message(format!("{message}: {}", one_line(step)));
            }
        }
    }

    fn finish(self) {
        if let Ok(mut current) = CURRENT.lock() {
            *current = None;
        }
        self.0.finish_and_clear();
    }
}

/// Registered templates per backend, persisted as `templates.json` in the data directory:
/// `{"local": {name: dir}, "docker": {name: dir-or-image}}`.
#[derive(Debug, Default)]
struct Templates(BTreeMap<String, BTreeMap<String, String>>);

impl Templates {
    const FILE: &'static str = "templates.json";

    fn load(data_dir: &Path) -> Result<Self, CliError> {
        let path = data_dir.join(Self::FILE);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Templates)
                .map_err(|err| {
                    CliError::failure(
                        format_args!("{} is not valid: {err}", path.display()),
                        "fix or delete it, then add the templates again",
                    )
                }),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(Templates::default()),
            Err(err) => Err(CliError::failure(
                format_args!("cannot read {}: {err}", path.display()),
                "check the data directory's permissions",
            )),
        }
    }

    /// The templates of one backend.
    fn of(&self, backend: BackendKind) -> BTreeMap<String, String> {
        self.0.get(backend.name()).cloned().unwrap_or_default()
    }

    fn contains(&self, backend: BackendKind, name: &str) -> bool {
        // The local backend provides an empty "default" template unless one is registered;
        // a remote server knows its own templates (an unknown one fails the create).
        (backend == BackendKind::Local && name == "default")
            || backend == BackendKind::Remote
            || self.of(backend).contains_key(name)
    }

    /// Validates and records a template; returns the stored source (a canonical
    /// directory, or for Docker an image reference).
    fn add(
        data_dir: &Path,
        backend: BackendKind,
        name: &str,
        source: &Path,
    ) -> Result<String, CliError> {
        SandboxSpec::new(name).validate().map_err(|err| {
            CliError::bad_input(
                error_chain(&err),
                "use letters, digits, `.`, `_` and `-` in template names",
            )
        })?;
        let stored = match std::fs::canonicalize(source).ok().filter(|d| d.is_dir()) {
            Some(dir) => dir.to_string_lossy().into_owned(),
            // For Docker, a name that is not a directory is an image reference.
            None if backend == BackendKind::Docker && !source.as_os_str().is_empty() => {
                source.to_string_lossy().into_owned()
            }
            None => {
                return Err(CliError::bad_input(
                    format_args!("{} is not a directory", source.display()),
                    "give an existing host directory",
                ))
            }
        };
        let mut templates = Self::load(data_dir)?;
        templates
            .0
            .entry(backend.name().to_owned())
            .or_default()
            .insert(name.to_owned(), stored.clone());
        let io_err = |err: std::io::Error| {
            CliError::failure(
                format_args!("cannot write {}: {err}", data_dir.display()),
                "check the data directory's permissions",
            )
        };
        std::fs::create_dir_all(data_dir).map_err(io_err)?;
        // Temp file + rename: a crash never leaves a half-written registry.
        let mut file = tempfile::NamedTempFile::new_in(data_dir).map_err(io_err)?;
        let json = serde_json::to_vec_pretty(&templates.0)
            .map_err(|err| CliError::failure(err, "rerun with SANDCELL_LOG=debug for details"))?;
        file.write_all(&json).map_err(io_err)?;
        file.as_file().sync_all().map_err(io_err)?;
        file.persist(data_dir.join(Self::FILE))
            .map_err(|err| io_err(err.error))?;
        Ok(stored)
    }
}
