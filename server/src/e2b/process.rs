//! envd's `process.Process` service over the backend: every command is a
//! [`Background`] process, numbered with a pid of the E2B face's own, so a caller can
//! list it, reconnect to it, write to it, resize its terminal and signal it while it
//! runs; it is forgotten once it ends. Each sandbox counts its own pids, so no tenant
//! learns from them how busy another is (ADVERSARIAL case 41).

use std::collections::{BTreeMap, HashMap};

use axum::extract::{Extension, Path, Request, State};
use axum::response::Response;
use futures::stream::{BoxStream, StreamExt};
use sandcell::background::{Background, BackgroundId};
use sandcell::{Error, ErrorKind, ExecRequest, ExitStatus, ProcessEvent, SandboxId, TerminalSize};

use super::rpc::{self, RpcResult, StreamTiming};
use super::{paths, Envd};
use crate::lock;
use crate::AppState;
use sandcell_remote::e2b::envd::{
    CloseStdinRequest, ConnectRequest, DataEvent, EndEvent, ListResponse, ProcessInfo,
    ProcessSelector, ProcessStreamMessage, SendInputRequest, SendSignalRequest, StartRequest,
    UpdateRequest,
};

/// Most processes one sandbox runs through envd at once: each keeps up to 1 MiB of its
/// output for reconnects, so a client cannot make the server hold unbounded memory.
const MAX_PROCESSES: usize = 256;

/// A sandbox's first pid: low pids look like a fresh machine's; any number would do.
const FIRST_PID: u32 = 100;

/// The running processes of every sandbox, by pid, and each sandbox's next pid.
#[derive(Default)]
pub(crate) struct Processes {
    background: Background,
    running: std::sync::Mutex<HashMap<SandboxId, BTreeMap<u32, Running>>>,
    next_pids: std::sync::Mutex<HashMap<SandboxId, u32>>,
}

#[derive(Clone)]
struct Running {
    id: BackgroundId,
    info: ProcessInfo,
    pty: bool,
}

impl Processes {
    fn find(&self, sandbox: &SandboxId, selector: &ProcessSelector) -> RpcResult<(u32, Running)> {
        let running = lock(&self.running);
        let found = running
            .get(sandbox)
            .and_then(|by_pid| match (selector.pid, &selector.tag) {
                (Some(pid), _) => by_pid.get(&pid).map(|r| (pid, r.clone())),
                (None, Some(tag)) => by_pid
                    .iter()
                    .find(|(_, r)| r.info.tag.as_ref() == Some(tag))
                    .map(|(pid, r)| (*pid, r.clone())),
                (None, None) => None,
            });
        found.ok_or_else(|| {
            rpc::RpcError(Error::not_found(format!(
                "process {} not found",
                selector
                    .pid
                    .map(|p| p.to_string())
                    .or_else(|| selector.tag.clone())
                    .unwrap_or_default()
            )))
        })
    }

    /// `sandbox`'s next pid, counted per sandbox.
    fn next_pid(&self, sandbox: &SandboxId) -> u32 {
        let mut next_pids = lock(&self.next_pids);
        let next = next_pids.entry(sandbox.clone()).or_insert(FIRST_PID);
        let pid = *next;
        *next = next.checked_add(1).unwrap_or(FIRST_PID);
        pid
    }

    /// Forgets every process of `sandbox` (it is gone).
    pub(crate) fn forget_sandbox(&self, sandbox: &SandboxId) {
        lock(&self.running).remove(sandbox);
        lock(&self.next_pids).remove(sandbox);
        self.background.forget_sandbox(sandbox);
    }
}

/// `POST /process.Process/{method}`.
pub(super) async fn call(
    State(state): State<AppState>,
    Extension(envd): Extension<Envd>,
    Path(method): Path<String>,
    request: Request,
) -> Response {
    let timing = StreamTiming::of(request.headers());
    let answer = match method.as_str() {
        "Start" => {
            let started = start(&state, &envd, rpc::message(request).await, timing).await;
            Ok(started.unwrap_or_else(|e| rpc::stream_error(&e.0)))
        }
        "Connect" => {
            let connected = connect(&state, &envd, rpc::message(request).await, timing);
            Ok(connected.unwrap_or_else(|e| rpc::stream_error(&e.0)))
        }
        "List" => Ok(list(&state, &envd)),
        "SendInput" => send_input(&state, &envd, rpc::message(request).await).await,
        "CloseStdin" => close_stdin(&state, &envd, rpc::message(request).await).await,
        "SendSignal" => send_signal(&state, &envd, rpc::message(request).await).await,
        "Update" => update(&state, &envd, rpc::message(request).await).await,
        other => Err(rpc::unknown_method("process.Process", other)),
    };
    answer.unwrap_or_else(axum::response::IntoResponse::into_response)
}

async fn start(
    state: &AppState,
    envd: &Envd,
    request: RpcResult<StartRequest>,
    timing: StreamTiming,
) -> RpcResult<Response> {
    let request = request?;
    let config = request.process.clone();
    if config.cmd.is_empty() {
        return Err(Error::invalid_input("process.cmd is empty").into());
    }
    let mut argv = vec![config.cmd.clone()];
    argv.extend(config.args.iter().cloned());
    let mut exec = ExecRequest::new(argv);
    exec.cwd = Some(paths::to_workspace(config.cwd.as_deref().unwrap_or(""))?);
    exec.env = config.envs.clone();
    let pty = request.pty.as_ref().map(|p| {
        let size = p.size.unwrap_or_default();
        TerminalSize::new(clamp(size.rows, 24), clamp(size.cols, 80))
    });
    if let Some(size) = pty {
        exec = exec.pty(size);
    } else if request.stdin != Some(true) {
        // Without `stdin: true` a command reads end of file at once, as envd's do.
        exec = exec.stdin("");
    }
    // The call's deadline is the command's: the backend ends it and all it started.
    exec.timeout = timing.deadline;
    let processes = &state.e2b.processes;
    let running = lock(&processes.running)
        .get(envd.id())
        .map_or(0, BTreeMap::len);
    if running >= MAX_PROCESSES {
        return Err(Error::limit_exceeded(format!(
            "sandbox {} already runs {MAX_PROCESSES} processes through envd: wait for or \
             kill one first",
            envd.id()
        ))
        .into());
    }
    // Held until the process ends (`forget_when_done`), not until its stream closes.
    let tenant = envd
        .info
        .labels
        .get(crate::tenants::TENANT_LABEL)
        .map(String::as_str)
        .unwrap_or_default();
    let slot = state.config.commands.slot(tenant)?;
    let id = processes
        .background
        .start(state.backend.as_ref(), envd.id(), exec)
        .await?;
    let pid = processes.next_pid(envd.id());
    let running = Running {
        id: id.clone(),
        info: ProcessInfo {
            config,
            pid,
            tag: request.tag.clone(),
        },
        pty: pty.is_some(),
    };
    lock(&processes.running)
        .entry(envd.id().clone())
        .or_default()
        .insert(pid, running.clone());
    // Attach before anything can forget the process, so no event is missed.
    let events = processes.background.attach(&id)?;
    forget_when_done(state, envd.id().clone(), pid, id.clone(), slot);
    let start = futures::stream::once(async move { Ok(ProcessStreamMessage::start(pid)) });
    let messages = start.chain(messages_of(events, running.pty)).boxed();
    Ok(rpc::stream(
        messages,
        ProcessStreamMessage::keepalive(),
        timing,
    ))
}

/// Drops a process from the tables once it ends (a caller attached meanwhile still
/// gets every event: the stream holds the record), and gives its tenant's place back.
fn forget_when_done(
    state: &AppState,
    sandbox: SandboxId,
    pid: u32,
    id: BackgroundId,
    slot: tokio::sync::OwnedSemaphorePermit,
) {
    let state = std::sync::Arc::clone(state);
    let ended = state.e2b.processes.background.wait(&id);
    tokio::spawn(async move {
        let _ = ended.await;
        drop(slot);
        let processes = &state.e2b.processes;
        if let Some(by_pid) = lock(&processes.running).get_mut(&sandbox) {
            by_pid.remove(&pid);
        }
        let _ = processes.background.forget(&id);
    });
}

fn clamp(n: u32, default: u16) -> u16 {
    match n {
        0 => default,
        n => u16::try_from(n).unwrap_or(u16::MAX),
    }
}

fn connect(
    state: &AppState,
    envd: &Envd,
    request: RpcResult<ConnectRequest>,
    timing: StreamTiming,
) -> RpcResult<Response> {
    let request = request?;
    let processes = &state.e2b.processes;
    let (pid, running) = processes.find(envd.id(), &request.process)?;
    let events = processes.background.follow(&running.id)?;
    let start = futures::stream::once(async move { Ok(ProcessStreamMessage::start(pid)) });
    let messages = start.chain(messages_of(events, running.pty)).boxed();
    // A reconnect's deadline bounds the stream alone, never the process.
    Ok(rpc::stream(
        messages,
        ProcessStreamMessage::keepalive(),
        timing,
    ))
}

/// A process's events as envd's messages; a command its timeout ended fails the
/// stream with `deadline_exceeded`.
fn messages_of(
    events: BoxStream<'static, ProcessEvent>,
    pty: bool,
) -> impl futures::Stream<Item = sandcell::Result<ProcessStreamMessage>> + Send {
    events.map(move |event| match event {
        ProcessEvent::Stdout(bytes) if pty => Ok(ProcessStreamMessage::data(DataEvent {
            pty: Some(bytes),
            ..DataEvent::default()
        })),
        ProcessEvent::Stdout(bytes) => Ok(ProcessStreamMessage::data(DataEvent {
            stdout: Some(bytes),
            ..DataEvent::default()
        })),
        ProcessEvent::Stderr(bytes) => Ok(ProcessStreamMessage::data(DataEvent {
            stderr: Some(bytes),
            ..DataEvent::default()
        })),
        ProcessEvent::Exit(status) if status.timed_out => Err(Error::new(
            ErrorKind::Timeout,
            "the command ran past its timeout and was killed",
        )),
        ProcessEvent::Exit(status) => Ok(ProcessStreamMessage::end(end_of(status))),
        _ => Ok(ProcessStreamMessage::keepalive()),
    })
}

/// An exit as envd reports it (Go's `ProcessState` wording).
fn end_of(status: ExitStatus) -> EndEvent {
    match (status.code, status.signal) {
        (Some(code), _) => EndEvent {
            exit_code: code,
            exited: true,
            status: format!("exit status {code}"),
            error: None,
        },
        (None, Some(signal)) => EndEvent {
            exit_code: -1,
            exited: false,
            status: format!("signal: {}", signal_name(signal)),
            error: None,
        },
        (None, None) => EndEvent {
            exit_code: -1,
            exited: false,
            status: "unknown".to_owned(),
            error: None,
        },
    }
}

fn signal_name(signal: i32) -> String {
    match signal {
        1 => "hangup".to_owned(),
        2 => "interrupt".to_owned(),
        9 => "killed".to_owned(),
        13 => "broken pipe".to_owned(),
        15 => "terminated".to_owned(),
        n => format!("signal {n}"),
    }
}

fn list(state: &AppState, envd: &Envd) -> Response {
    let processes = lock(&state.e2b.processes.running)
        .get(envd.id())
        .map(|by_pid| by_pid.values().map(|r| r.info.clone()).collect())
        .unwrap_or_default();
    rpc::reply(&ListResponse { processes })
}

/// The background process `selector` names in the caller's sandbox.
fn selected(state: &AppState, envd: &Envd, selector: &ProcessSelector) -> RpcResult<BackgroundId> {
    Ok(state.e2b.processes.find(envd.id(), selector)?.1.id)
}

/// The empty answer of a call that only acts.
fn done() -> RpcResult<Response> {
    Ok(rpc::reply(&serde_json::json!({})))
}

async fn send_input(
    state: &AppState,
    envd: &Envd,
    request: RpcResult<SendInputRequest>,
) -> RpcResult<Response> {
    let request = request?;
    let id = selected(state, envd, &request.process)?;
    let data = request
        .input
        .stdin
        .or(request.input.pty)
        .unwrap_or_default();
    state.e2b.processes.background.send_input(&id, data).await?;
    done()
}

async fn close_stdin(
    state: &AppState,
    envd: &Envd,
    request: RpcResult<CloseStdinRequest>,
) -> RpcResult<Response> {
    let id = selected(state, envd, &request?.process)?;
    state.e2b.processes.background.close_input(&id).await?;
    done()
}

async fn send_signal(
    state: &AppState,
    envd: &Envd,
    request: RpcResult<SendSignalRequest>,
) -> RpcResult<Response> {
    let request = request?;
    let id = selected(state, envd, &request.process)?;
    let background = &state.e2b.processes.background;
    match request.signal {
        0 => return Err(Error::invalid_input("no signal given").into()),
        9 => background.kill(&id)?,
        signal => background.signal(&id, signal).await?,
    }
    done()
}

async fn update(
    state: &AppState,
    envd: &Envd,
    request: RpcResult<UpdateRequest>,
) -> RpcResult<Response> {
    let request = request?;
    let id = selected(state, envd, &request.process)?;
    if let Some(size) = request.pty.and_then(|p| p.size) {
        let size = TerminalSize::new(clamp(size.rows, 24), clamp(size.cols, 80));
        state.e2b.processes.background.resize(&id, size).await?;
    }
    done()
}
