//! Commands: Fly's buffered exec, and the streamed extension with stdin, signals and kill.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::channel::mpsc;
use futures::{SinkExt, StreamExt};
use sandcell::{Error, ExecRequest, ProcessStdin, SandboxId};
use serde::Deserialize;
use tokio::io::AsyncWriteExt;

use super::{machine, ApiError, ApiResult, AppState, JsonBody};
use crate::protocol::{
    ErrorBody, ExecBody, ExecEvent, ExecResponse, SignalBody, StreamExecBody, B64,
};

/// A streamed command still running.
pub(crate) struct Running {
    pub(crate) sandbox: SandboxId,
    stdin: tokio::sync::Mutex<Option<ProcessStdin>>,
    commands: tokio::sync::mpsc::UnboundedSender<Command>,
}

/// A call on the process, answered once done.
enum Command {
    Kill(tokio::sync::oneshot::Sender<sandcell::Result<()>>),
    Signal(i32, tokio::sync::oneshot::Sender<sandcell::Result<()>>),
}

/// `POST .../exec`: runs to the end and answers everything at once.
pub(super) async fn buffered(
    State(state): State<AppState>,
    Path((app, id)): Path<(String, String)>,
    JsonBody(body): JsonBody<ExecBody>,
) -> ApiResult<Json<ExecResponse>> {
    let info = machine(&state, &app, &id).await?;
    let mut request = ExecRequest::new(body.command);
    request.stdin = Some(Bytes::from(body.stdin.unwrap_or_default()));
    if let Some(seconds) = body.timeout.filter(|s| *s > 0) {
        request.timeout = Some(Duration::from_secs(seconds));
    }
    let output = state
        .backend
        .exec(&info.id, request)
        .await?
        .collect(sandcell::DEFAULT_OUTPUT_LIMIT)
        .await?;
    Ok(Json(ExecResponse {
        exit_code: output.status.code,
        exit_signal: output.status.signal,
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }))
}

/// `POST .../sandcell/exec`: starts the command and streams its events. A client that
/// goes away stops receiving; the command runs on (its timeout still applies), as a
/// dropped `Process` handle does.
pub(super) async fn streamed(
    State(state): State<AppState>,
    Path((app, id)): Path<(String, String)>,
    JsonBody(body): JsonBody<StreamExecBody>,
) -> ApiResult<Response> {
    let info = machine(&state, &app, &id).await?;
    let mut request = body.request;
    request.stdin = body.stdin.map(|b| b.0);
    let mut process = state.backend.exec(&info.id, request).await?;
    let process_id = uuid::Uuid::new_v4().simple().to_string();
    let (commands, mut command_rx) = tokio::sync::mpsc::unbounded_channel();
    let running = Arc::new(Running {
        sandbox: info.id.clone(),
        stdin: tokio::sync::Mutex::new(process.take_stdin()),
        commands,
    });
    crate::lock(&state.processes).insert(process_id.clone(), Arc::clone(&running));

    // Small buffer: a client that reads slowly slows the command, as a pipe would.
    let (mut events, receiver) = mpsc::channel::<ExecEvent>(16);
    let _ = events
        .send(ExecEvent::Started {
            process: process_id.clone(),
            output_limit: process.output_limit(),
        })
        .await;
    let stdout = process.take_stdout();
    let stderr = process.take_stderr();
    let pump = |stream: Option<sandcell::OutputStream>, mut tx: mpsc::Sender<ExecEvent>, err| {
        async move {
            let Some(mut stream) = stream else { return };
            while let Some(chunk) = stream.next().await {
                let event = match chunk {
                    Ok(data) if err => ExecEvent::Stderr(B64(data)),
                    Ok(data) => ExecEvent::Stdout(B64(data)),
                    Err(e) => ExecEvent::Error(ErrorBody::from_error(&e)),
                };
                // A gone client: keep draining so the command never blocks on a pipe.
                let _ = tx.send(event).await;
            }
        }
    };
    let out_task = tokio::spawn(pump(stdout, events.clone(), false));
    let err_task = tokio::spawn(pump(stderr, events.clone(), true));
    let table = Arc::clone(&state);
    tokio::spawn(async move {
        let status = loop {
            tokio::select! {
                status = process.wait() => break status,
                Some(command) = command_rx.recv() => match command {
                    Command::Kill(reply) => {
                        let _ = reply.send(process.kill().await);
                    }
                    Command::Signal(signal, reply) => {
                        let _ = reply.send(process.signal(signal).await);
                    }
                },
            }
        };
        let _ = out_task.await;
        let _ = err_task.await;
        crate::lock(&table.processes).remove(&process_id);
        let last = match status {
            Ok(status) => ExecEvent::Exit(status),
            Err(e) => ExecEvent::Error(ErrorBody::from_error(&e)),
        };
        let _ = events.send(last).await;
    });
    let lines = receiver.map(|event| {
        let mut line = serde_json::to_vec(&event).unwrap_or_default();
        line.push(b'\n');
        Ok::<_, std::convert::Infallible>(Bytes::from(line))
    });
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(lines),
    )
        .into_response())
}

/// The streamed command `process` of machine `id`.
async fn running(state: &AppState, app: &str, id: &str, process: &str) -> ApiResult<Arc<Running>> {
    let info = machine(state, app, id).await?;
    crate::lock(&state.processes)
        .get(process)
        .filter(|p| p.sandbox == info.id)
        .cloned()
        .ok_or_else(|| {
            ApiError(Error::not_found(format!(
                "process {process} is not running"
            )))
        })
}

#[derive(Debug, Deserialize)]
pub(super) struct StdinQuery {
    #[serde(default)]
    close: bool,
}

/// `POST .../sandcell/processes/{process}/stdin`: the body goes to stdin; `?close=true`
/// closes it afterwards.
pub(super) async fn stdin(
    State(state): State<AppState>,
    Path((app, id, process)): Path<(String, String, String)>,
    Query(query): Query<StdinQuery>,
    body: Body,
) -> ApiResult<Json<serde_json::Value>> {
    let running = running(&state, &app, &id, &process).await?;
    let mut stdin = running.stdin.lock().await;
    let writer = stdin.as_mut().ok_or_else(|| {
        ApiError(Error::invalid_input(format!(
            "stdin of {process} is closed"
        )))
    })?;
    let mut body = body.into_data_stream();
    while let Some(chunk) = body.next().await {
        let chunk =
            chunk.map_err(|e| ApiError(Error::invalid_input(format!("reading the body: {e}"))))?;
        writer.write_all(&chunk).await.map_err(|e| {
            ApiError(Error::new(
                sandcell::ErrorKind::InvalidState,
                format!("writing to the stdin of {process}: {e}"),
            ))
        })?;
    }
    writer.flush().await.ok();
    if query.close {
        if let Some(mut writer) = stdin.take() {
            let _ = writer.shutdown().await;
        }
    }
    Ok(super::ok())
}

/// `POST .../sandcell/processes/{process}/signal`.
pub(super) async fn signal(
    State(state): State<AppState>,
    Path((app, id, process)): Path<(String, String, String)>,
    JsonBody(body): JsonBody<SignalBody>,
) -> ApiResult<Json<serde_json::Value>> {
    let running = running(&state, &app, &id, &process).await?;
    call(&running, |reply| Command::Signal(body.signal, reply)).await
}

/// Sends a command to the task that owns the process and waits for its answer; a
/// process that ended meanwhile is fine (kill and signal are idempotent).
async fn call(
    running: &Running,
    command: impl FnOnce(tokio::sync::oneshot::Sender<sandcell::Result<()>>) -> Command,
) -> ApiResult<Json<serde_json::Value>> {
    let (reply, answer) = tokio::sync::oneshot::channel();
    if running.commands.send(command(reply)).is_ok() {
        if let Ok(result) = answer.await {
            result?;
        }
    }
    Ok(super::ok())
}

/// `POST .../sandcell/processes/{process}/kill`.
pub(super) async fn kill(
    State(state): State<AppState>,
    Path((app, id, process)): Path<(String, String, String)>,
) -> ApiResult<Json<serde_json::Value>> {
    let running = running(&state, &app, &id, &process).await?;
    call(&running, Command::Kill).await
}
