//! Commands through the engine's exec API: the path for containers without the agent
//! (and for commands run as another user). Behaves as the agent path does: a missing
//! program is `NotFound`, a timeout or kill ends the whole process tree inside the
//! container, and the exit status is read only after both output streams drained.
//!
//! A small `/bin/sh` wrapper makes that possible without an agent: it checks the program
//! exists, prints its own pid on the first stdout line (read and removed here), then
//! `exec`s the command, so the pid is the command's. Kills walk `/proc` inside the
//! container from that pid, stopping each process before killing it so none can fork
//! away meanwhile; then they kill every process that inherited the command's
//! `SANDCELL_EXEC` tag from its environment, which catches what a double fork orphaned
//! to the container's init (a process that clears its environment loses the tag: the
//! agent path has no such gap). Images without `/bin/sh` need the agent.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use async_trait::async_trait;
use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, ResizeExecOptions, StartExecOptions, StartExecResults};
use bollard::Docker;
use bytes::{Bytes, BytesMut};
use futures::stream::BoxStream;
use futures::StreamExt;
use sandcell::raw::ProcessControl;
use sandcell::{
    ByteStream, Error, ErrorKind, ExecRequest, ExitStatus, Process, ProcessStdin, Result,
    SandboxId, TerminalSize,
};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, watch};

use crate::error::engine;

const MARKER: &str = "sandcell-exec ";
const WRAPPER: &str =
    r#"command -v "$1" >/dev/null 2>&1 || exit 127; echo "sandcell-exec $$"; exec "$@""#;
/// Sends `$2` to the tree rooted at `$1`, parents first.
const SIGNAL_TREE: &str = r#"t() { kill "$2" "$1" 2>/dev/null; for s in /proc/[0-9]*/status; do case "$(grep '^PPid:' "$s" 2>/dev/null)" in *"	$1") c=${s#/proc/}; t "${c%/status}" "$2";; esac; done; }; t "$1" "$2""#;
/// Kills the tree rooted at `$1`, then (twice, for what forked meanwhile) every process
/// whose environment holds `SANDCELL_EXEC=$3`.
const KILL_TREE: &str = r#"t() { kill -STOP "$1" 2>/dev/null; for s in /proc/[0-9]*/status; do case "$(grep '^PPid:' "$s" 2>/dev/null)" in *"	$1") c=${s#/proc/}; t "${c%/status}";; esac; done; kill -KILL "$1" 2>/dev/null; kill -CONT "$1" 2>/dev/null; }; t "$1"; for r in 1 2; do for e in /proc/[0-9]*/environ; do if tr '\000' '\n' < "$e" 2>/dev/null | grep -qx "SANDCELL_EXEC=$3"; then p=${e#/proc/}; kill -KILL "${p%/environ}" 2>/dev/null; fi; done; done"#;
/// The environment variable tagging everything one command started.
const TAG_VAR: &str = "SANDCELL_EXEC";

type Output = BoxStream<'static, std::result::Result<LogOutput, bollard::errors::Error>>;
type Status = Option<std::result::Result<ExitStatus, String>>;

/// Starts `request` in container `id` through the engine.
pub(crate) async fn exec(
    docker: &Docker,
    id: &SandboxId,
    workspace: &str,
    request: ExecRequest,
) -> Result<Process> {
    let cwd = match &request.cwd {
        Some(cwd) if !cwd.is_root() => format!("{workspace}/{}", cwd.as_str()),
        _ => workspace.to_owned(),
    };
    let tty = request.pty.is_some();
    let wrapper = match request.pty {
        // The terminal's size is set before the command runs: this engine version's
        // exec has no initial console size, and a resize after start would race it.
        Some(size) => format!(
            "stty rows {} cols {} 2>/dev/null; {WRAPPER}",
            size.rows, size.cols
        ),
        None => WRAPPER.to_owned(),
    };
    let mut cmd = vec![
        "/bin/sh".to_owned(),
        "-c".to_owned(),
        wrapper,
        "sh".to_owned(),
    ];
    cmd.extend(request.argv.iter().cloned());
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let mut env: Vec<String> = request
        .env
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    env.push(format!("{TAG_VAR}={tag}"));
    let created = docker
        .create_exec(
            id.as_str(),
            CreateExecOptions {
                cmd: Some(cmd),
                attach_stdin: Some(true),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                tty: Some(tty),
                env: Some(env),
                working_dir: Some(cwd.clone()),
                user: request.user.clone(),
                ..Default::default()
            },
        )
        .await
        .map_err(|e| {
            engine(
                format_args!("starting {:?} in sandbox {id}", request.argv[0]),
                e,
            )
        })?;
    let options = StartExecOptions {
        tty,
        ..Default::default()
    };
    let started = docker
        .start_exec(&created.id, Some(options))
        .await
        .map_err(|e| {
            engine(
                format_args!("starting {:?} in sandbox {id}", request.argv[0]),
                e,
            )
        })?;
    let StartExecResults::Attached {
        mut output,
        mut input,
    } = started
    else {
        return Err(Error::new(
            ErrorKind::Backend,
            "the engine started the exec detached",
        ));
    };

    // Wait for the wrapper's announcement; whatever came with it is command output.
    let mut early_out = BytesMut::new();
    let mut early_err = BytesMut::new();
    let pid = loop {
        match output.next().await {
            // A terminal's output is one raw stream.
            Some(Ok(LogOutput::StdOut { message } | LogOutput::Console { message })) => {
                early_out.extend_from_slice(&message);
                if let Some(nl) = early_out.iter().position(|b| *b == b'\n') {
                    let line = early_out.split_to(nl + 1);
                    let line = String::from_utf8_lossy(&line);
                    match line
                        .trim_end()
                        .strip_prefix(MARKER)
                        .and_then(|p| p.parse::<u32>().ok())
                    {
                        Some(pid) => break pid,
                        // The runtime reports a failed start (a missing cwd) in the stream.
                        None if line.contains("chdir to cwd") => {
                            return Err(Error::not_found(format!(
                                "working directory {cwd} does not exist"
                            )))
                        }
                        None => {
                            return Err(Error::new(
                                ErrorKind::Backend,
                                format!("the command did not start: {}", line.trim_end()),
                            ))
                        }
                    }
                }
            }
            Some(Ok(LogOutput::StdErr { message })) => early_err.extend_from_slice(&message),
            Some(Ok(_)) => {}
            Some(Err(e)) => {
                return Err(engine(format_args!("running a command in sandbox {id}"), e))
            }
            None => {
                let code = docker
                    .inspect_exec(&created.id)
                    .await
                    .ok()
                    .and_then(|i| i.exit_code);
                let stderr = String::from_utf8_lossy(&early_err).trim().to_owned();
                return Err(match code {
                    Some(127) => Error::not_found(format!(
                        "program {:?} was not found on the sandbox's PATH",
                        request.argv[0]
                    )),
                    _ if stderr.contains("chdir") || stderr.contains("no such file") => {
                        Error::not_found(format!("working directory {cwd}: {stderr}"))
                    }
                    _ => Error::new(
                        ErrorKind::Backend,
                        format!(
                            "the command did not start (exit {code:?}): {stderr}; the engine path needs /bin/sh in the image"
                        ),
                    ),
                });
            }
        }
    };

    let (out_tx, out_rx) = mpsc::unbounded_channel();
    let (err_tx, err_rx) = mpsc::unbounded_channel();
    if !early_out.is_empty() {
        let _ = out_tx.send(Ok(early_out.freeze()));
    }
    if !early_err.is_empty() {
        let _ = err_tx.send(Ok(early_err.freeze()));
    }
    let (status_tx, status_rx) = watch::channel::<Status>(None);
    let killer = Killer {
        docker: docker.clone(),
        container: id.as_str().to_owned(),
        user: request.user.clone(),
        pid,
        tag,
        state: Arc::new(Mutex::new(KillState::default())),
    };
    tokio::spawn(route(
        docker.clone(),
        created.id.clone(),
        output,
        out_tx,
        err_tx,
        status_tx,
        killer.clone(),
    ));
    if let Some(timeout) = request.timeout {
        let (killer, mut status) = (killer.clone(), status_rx.clone());
        tokio::spawn(async move {
            let ended = status.wait_for(Option::is_some);
            if tokio::time::timeout(timeout, ended).await.is_err() {
                killer.kill(true).await;
            }
        });
    }
    let stdin: Option<ProcessStdin> = match request.stdin {
        Some(data) => {
            tokio::spawn(async move {
                let _ = input.write_all(&data).await;
                // A terminal has no end of input; closing the stream would hang it up.
                if !tty {
                    let _ = input.shutdown().await;
                }
            });
            None
        }
        None => Some(Box::pin(SyncWriter(Mutex::new(input)))),
    };
    Ok(sandcell::raw::process(
        Box::new(EngineProcess {
            status: status_rx,
            killer,
            terminal: tty.then(|| (docker.clone(), created.id.clone())),
        }),
        stdin,
        receiver(out_rx),
        receiver(err_rx),
    ))
}

fn receiver(rx: mpsc::UnboundedReceiver<Result<Bytes>>) -> ByteStream {
    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|i| (i, rx)) }).boxed()
}

/// Demultiplexes the exec's output, then reads its exit code once the streams drained.
async fn route(
    docker: Docker,
    exec_id: String,
    mut output: Output,
    out: mpsc::UnboundedSender<Result<Bytes>>,
    err: mpsc::UnboundedSender<Result<Bytes>>,
    status: watch::Sender<Status>,
    killer: Killer,
) {
    while let Some(item) = output.next().await {
        match item {
            Ok(LogOutput::StdOut { message }) | Ok(LogOutput::Console { message }) => {
                let _ = out.send(Ok(message));
            }
            Ok(LogOutput::StdErr { message }) => {
                let _ = err.send(Ok(message));
            }
            Ok(LogOutput::StdIn { .. }) => {}
            Err(e) => {
                let message = format!("reading command output: {e}");
                let _ = out.send(Err(Error::new(ErrorKind::Unavailable, message.clone())));
                let _ = status.send(Some(Err(message)));
                return;
            }
        }
    }
    drop((out, err));
    let result = match docker.inspect_exec(&exec_id).await {
        Ok(inspect) => {
            let kill = *lock(&killer.state);
            let code = inspect.exit_code.unwrap_or(-1);
            let exit = if kill.killed && (code == 137 || code < 0) {
                ExitStatus::signaled(9)
            } else {
                ExitStatus::exited(code as i32)
            };
            Ok(exit.timed_out(kill.timed_out))
        }
        Err(e) => Err(engine("reading the exit code", e).to_string()),
    };
    let _ = status.send(Some(result));
}

use crate::lock;

#[derive(Debug, Default, Clone, Copy)]
struct KillState {
    killed: bool,
    timed_out: bool,
}

/// Kills a command's process tree inside the container.
#[derive(Clone)]
struct Killer {
    docker: Docker,
    container: String,
    user: Option<String>,
    pid: u32,
    /// The command's `SANDCELL_EXEC` tag.
    tag: String,
    state: Arc<Mutex<KillState>>,
}

impl Killer {
    async fn kill(&self, timed_out: bool) {
        {
            let mut state = lock(&self.state);
            state.killed = true;
            state.timed_out |= timed_out;
        }
        self.run(KILL_TREE, "-KILL").await;
    }

    /// Sends `signal` to the command's whole tree.
    async fn signal(&self, signal: i32) {
        self.run(SIGNAL_TREE, &format!("-{signal}")).await;
    }

    /// Runs one of the tree scripts inside the container as the command's user.
    async fn run(&self, script: &str, signal: &str) {
        let created = self
            .docker
            .create_exec(
                &self.container,
                CreateExecOptions {
                    cmd: Some(vec![
                        "/bin/sh".to_owned(),
                        "-c".to_owned(),
                        script.to_owned(),
                        "sh".to_owned(),
                        self.pid.to_string(),
                        signal.to_owned(),
                        self.tag.clone(),
                    ]),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    user: self.user.clone(),
                    ..Default::default()
                },
            )
            .await;
        let Ok(created) = created else {
            tracing::warn!(container = %self.container, pid = self.pid, "could not start the kill");
            return;
        };
        if let Ok(StartExecResults::Attached { mut output, .. }) =
            self.docker.start_exec(&created.id, None).await
        {
            while output.next().await.is_some() {}
        }
    }
}

struct EngineProcess {
    status: watch::Receiver<Status>,
    killer: Killer,
    /// The engine and exec id that resize the command's terminal, where it has one.
    terminal: Option<(Docker, String)>,
}

#[async_trait]
impl ProcessControl for EngineProcess {
    async fn wait(&mut self) -> Result<ExitStatus> {
        let status = self
            .status
            .wait_for(Option::is_some)
            .await
            .map_err(|_| Error::new(ErrorKind::Backend, "the output router stopped"))?;
        match status.as_ref() {
            Some(Ok(s)) => Ok(*s),
            Some(Err(message)) => Err(Error::new(ErrorKind::Unavailable, message.clone())),
            None => Err(Error::new(ErrorKind::Backend, "no exit status")),
        }
    }

    async fn kill(&mut self) -> Result<()> {
        if self.status.borrow().is_none() {
            self.killer.kill(false).await;
        }
        Ok(())
    }

    async fn signal(&mut self, signal: i32) -> Result<()> {
        if self.status.borrow().is_none() {
            self.killer.signal(signal).await;
        }
        Ok(())
    }

    async fn resize(&mut self, size: TerminalSize) -> Result<()> {
        size.validate()?;
        let Some((docker, exec_id)) = &self.terminal else {
            return Err(Error::invalid_input(
                "the process has no terminal: exec it with ExecRequest::pty",
            ));
        };
        if self.status.borrow().is_some() {
            return Ok(());
        }
        let options = ResizeExecOptions {
            height: size.rows,
            width: size.cols,
        };
        match docker.resize_exec(exec_id, options).await {
            Ok(()) => Ok(()),
            // It ended between the check and the call.
            Err(_) if self.status.borrow().is_some() => Ok(()),
            Err(e) => Err(engine("resizing a terminal", e)),
        }
    }
}

/// The engine's stdin writer is `Send` but not `Sync`; a mutex makes it both.
struct SyncWriter(Mutex<Pin<Box<dyn AsyncWrite + Send>>>);

impl AsyncWrite for SyncWriter {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        lock(&self.0).as_mut().poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        lock(&self.0).as_mut().poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        lock(&self.0).as_mut().poll_shutdown(cx)
    }
}
