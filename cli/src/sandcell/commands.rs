//! One function per command: what it does and what it prints.

use std::io::Read;
use std::path::Path;
use std::process::ExitCode;

use futures::{FutureExt, StreamExt};
use sandcell::{
    EventKind, ExecRequest, ReleaseMode, SandboxBackend, SandboxPath, SandboxSpec, SessionKey,
};
use serde_json::json;

use crate::args::{
    parse_path, BackendKind, Cli, Command, SessionCommand, StoreArgs, TemplateCommand,
};
use crate::error::CliError;
use crate::exec::{exit_code_of, stream_process};
use crate::output::{print_json, session_json, write_stdout, Progress};
use crate::session::{
    hosted_config, known_session, leave_backend, open_manager, open_session, Manager,
};
use crate::templates::Templates;

pub(crate) async fn run(cli: Cli) -> Result<ExitCode, CliError> {
    // It holds every session's environment, and root mounts and writes beneath it:
    // never a directory another user made first or can replace (`./.sandcell` in a
    // shared directory, ADVERSARIAL 45). The path that was judged is the one used: with
    // no trailing `/` or `.`, which would make every later use follow a final link.
    let refused = |e: sandcell::Error| {
        CliError::failure(
            crate::error::error_chain(&e),
            "pass --data-dir DIR with a directory of your own (a missing one is made 0700)",
        )
    };
    let data_dir = &sandcell::raw::private_dir::normalize(&cli.data_dir).map_err(refused)?;
    sandcell::raw::private_dir::ensure_private_dir(data_dir).map_err(refused)?;
    if cli.backend != BackendKind::Remote && cli.remote_url.is_some() {
        return Err(CliError::bad_input(
            "--remote-url applies to --backend remote only",
            "drop it, or add --backend remote",
        ));
    }
    let backend = cli.backend;
    let hosted = hosted_config(&cli)?;
    match cli.command {
        Command::Template(TemplateCommand::Add { .. }) if hosted.is_some() => {
            Err(CliError::bad_input(
                "a hosted backend's templates live on its server",
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
            let manager = std::sync::Arc::new(
                open_manager(data_dir, &cli.stores, backend, hosted, Some(&command)).await?,
            );
            run_session_command(&manager, data_dir, &cli.stores, backend, command).await
        }
    }
}

/// `sandcell mcp`: the manager's sessions as MCP tools on stdin and stdout, until the
/// client closes them; sessions outlive it, like every command's.
async fn serve_mcp(
    manager: &std::sync::Arc<Manager>,
    data_dir: &Path,
    backend: BackendKind,
    tenant: String,
    template: Option<String>,
) -> Result<ExitCode, CliError> {
    sandcell::SessionKey::new(tenant.as_str(), "probe").map_err(|e| {
        CliError::bad_input(
            format_args!("--tenant: {e}"),
            "use letters, digits, '-' and '_'",
        )
    })?;
    let mut settings = sandcell_mcp::ToolSettings::default();
    if let Some(template) = template {
        Templates::require(data_dir, backend, &template)?;
        settings.spec = sandcell::SandboxSpec::new(template);
    }
    let tools = sandcell_mcp::SandboxTools::new(std::sync::Arc::clone(manager), tenant, settings);
    let served = sandcell_mcp::serve_stdio(tools).await;
    manager.shutdown().await;
    served?;
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn run_session_command(
    manager: &std::sync::Arc<Manager>,
    data_dir: &Path,
    stores: &StoreArgs,
    backend: BackendKind,
    command: SessionCommand,
) -> Result<ExitCode, CliError> {
    match command {
        SessionCommand::Acquire {
            session,
            template,
            env,
            limits,
        } => {
            let key = session.key()?;
            if let Some(template) = &template {
                Templates::require(data_dir, backend, template)?;
            }
            // A known session keeps its spec (template, env); flags add to it. One on
            // another backend moves here: its latest snapshot is restored.
            let mut spec = match manager.session(&key).await? {
                Some(record) => {
                    if record.backend != backend.name() {
                        Templates::require(data_dir, backend, &record.spec.template)?;
                        leave_backend(data_dir, stores, &record, backend).await?;
                    }
                    record.spec
                }
                None => {
                    let template = template.as_deref().unwrap_or("default");
                    Templates::require(data_dir, backend, template)?;
                    let caps = manager.backend().capabilities();
                    SandboxSpec::new(template).limits(limits.resolve(&caps))
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
        SessionCommand::Shell {
            session,
            cwd,
            env,
            argv,
        } => {
            let key = session.key()?;
            let terminal = crate::shell::UserTerminal::open()?;
            let mut request = if argv.is_empty() {
                ExecRequest::shell(crate::shell::DEFAULT_SHELL)
            } else {
                ExecRequest::new(argv)
            };
            if let Some(cwd) = cwd {
                request = request.cwd(parse_path(&cwd)?);
            }
            // Programs on the terminal need to know what it understands.
            let term = std::env::var("TERM").unwrap_or_else(|_| "xterm-256color".to_owned());
            request.env.insert("TERM".to_owned(), term);
            request.env.extend(env);
            let request = request.pty(terminal.size());
            let handle = open_session(manager, &key).await?;
            let process = handle.call("exec", |b, id| b.exec(id, request)).await?;
            let status = crate::shell::attach(&terminal, process).await?;
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
        SessionCommand::List { tenant, metrics } => {
            if let Some(tenant) = &tenant {
                // The rule a key applies, so a typo is an error rather than an empty list.
                SessionKey::new(tenant, "x")?;
            }
            for record in manager.list(tenant.as_deref()).await? {
                let mut line = session_json(&record);
                if metrics {
                    add_metrics(manager, &record, &mut line).await;
                }
                print_json(&line)?;
            }
            Ok(ExitCode::SUCCESS)
        }
        SessionCommand::Mcp { tenant, template } => {
            serve_mcp(manager, data_dir, backend, tenant, template).await
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

/// Adds the live sandbox's reading to a `list` line. Read from the backend directly: a
/// look at a session is not activity that should keep it from being reaped.
async fn add_metrics(
    manager: &Manager,
    record: &sandcell::store::SessionRecord,
    line: &mut serde_json::Value,
) {
    let reading = match (&record.sandbox_id, record.is_live()) {
        (Some(id), true) => manager.backend().metrics(id).await,
        _ => {
            line["metrics"] = serde_json::Value::Null;
            return;
        }
    };
    match reading.map(|m| serde_json::to_value(&m)) {
        Ok(Ok(value)) => line["metrics"] = value,
        Ok(Err(err)) => {
            line["metrics"] = serde_json::Value::Null;
            line["metrics_error"] = json!(err.to_string());
        }
        Err(err) => {
            line["metrics"] = serde_json::Value::Null;
            line["metrics_error"] = json!(crate::error::error_chain(&err));
        }
    }
}
