//! `JsonLinesSession`: a long-running process in a sandbox that speaks JSON lines on
//! stdin and stdout — a CLI agent, a language server shim — driven one request at a
//! time: send a request, stream reply packets until a terminal one, check health with a
//! ping and a deadline, restart the process when it dies.
//!
//! Nothing here hangs on a broken process: one that exits mid-reply, writes a line that
//! is not JSON, or writes a line longer than the cap ends the reply with an error, and
//! the next request starts a fresh process (unless restarts are off).

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures::stream::{BoxStream, StreamExt};
use serde_json::Value;
use tokio::io::AsyncWriteExt;

use crate::backend::{ByteStream, SandboxBackend};
use crate::error::{Error, ErrorKind, Result};
use crate::exec::ExecRequest;
use crate::process::{Process, ProcessStdin};
use crate::sandbox::SandboxId;

/// Decides whether a packet is of a given kind.
pub type PacketTest = Arc<dyn Fn(&Value) -> bool + Send + Sync>;

/// How a [`JsonLinesSession`] reads its process's protocol.
#[derive(Clone)]
#[non_exhaustive]
pub struct JsonLinesOptions {
    /// Whether a packet ends a reply. Default: its `"type"` is `"done"`, `"result"` or
    /// `"error"`.
    pub is_terminal: PacketTest,
    /// The health-check request. Default: `{"type": "ping"}`.
    pub ping: Value,
    /// Whether a packet answers the ping. Default: its `"type"` is `"pong"`.
    pub is_pong: PacketTest,
    /// Start a new process when the last one died (default true).
    pub restart: bool,
    /// The longest line accepted, in bytes (default 1 MiB).
    pub max_line: usize,
}

impl Default for JsonLinesOptions {
    fn default() -> Self {
        let kind = |v: &Value| v.get("type").and_then(Value::as_str).map(str::to_owned);
        JsonLinesOptions {
            is_terminal: Arc::new(move |v| {
                matches!(kind(v).as_deref(), Some("done" | "result" | "error"))
            }),
            ping: serde_json::json!({"type": "ping"}),
            is_pong: Arc::new(move |v| kind(v).as_deref() == Some("pong")),
            restart: true,
            max_line: 1 << 20,
        }
    }
}

impl fmt::Debug for JsonLinesOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JsonLinesOptions")
            .field("ping", &self.ping)
            .field("restart", &self.restart)
            .field("max_line", &self.max_line)
            .finish_non_exhaustive()
    }
}

/// A JSON-lines process in a sandbox; see the [module docs](self).
pub struct JsonLinesSession {
    backend: Arc<dyn SandboxBackend>,
    sandbox: SandboxId,
    request: ExecRequest,
    options: JsonLinesOptions,
    state: Arc<tokio::sync::Mutex<State>>,
}

impl fmt::Debug for JsonLinesSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JsonLinesSession")
            .field("sandbox", &self.sandbox)
            .field("argv", &self.request.argv)
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct State {
    running: Option<Running>,
    /// Processes started after the first.
    restarts: u32,
    started: bool,
}

impl State {
    /// Kills the running process, if any; the next request starts a new one.
    async fn kill(&mut self) {
        if let Some(mut running) = self.running.take() {
            let _ = running.process.kill().await;
        }
    }
}

struct Running {
    process: Process,
    stdin: ProcessStdin,
    lines: Lines,
}

/// Splits an output stream into lines, with a length cap.
pub(crate) struct Lines {
    stream: ByteStream,
    buf: BytesMut,
    max: usize,
    /// How much of `buf` is known to hold no newline: each byte is looked at once, or
    /// a long line fed a byte at a time cost its length squared (FINDINGS11 F7).
    scanned: usize,
}

impl Lines {
    /// Lines of `stream`, each at most `max` bytes.
    pub(crate) fn new(stream: ByteStream, max: usize) -> Self {
        Lines {
            stream,
            buf: BytesMut::new(),
            max,
            scanned: 0,
        }
    }

    /// The next line without its newline; `None` at the end of the stream.
    pub(crate) async fn next(&mut self) -> Result<Option<Bytes>> {
        loop {
            if let Some(at) = self.buf[self.scanned..].iter().position(|b| *b == b'\n') {
                let nl = self.scanned + at;
                self.scanned = 0;
                let line = self.buf.split_to(nl + 1);
                return Ok(Some(line.freeze().slice(..nl)));
            }
            self.scanned = self.buf.len();
            if self.buf.len() > self.max {
                return Err(Error::limit_exceeded(format!(
                    "the process wrote a line longer than {} bytes",
                    self.max
                )));
            }
            match self.stream.next().await {
                Some(Ok(chunk)) => self.buf.extend_from_slice(&chunk),
                Some(Err(e)) => return Err(e),
                None if self.buf.is_empty() => return Ok(None),
                // A last line without a newline still counts.
                None => {
                    self.scanned = 0;
                    return Ok(Some(self.buf.split().freeze()));
                }
            }
        }
    }
}

impl JsonLinesSession {
    /// Starts `request` in `sandbox` as a JSON-lines process. Its stdin must stay open:
    /// a request that supplies stdin bytes is `InvalidInput`. Needs
    /// [`Capabilities::interactive_exec`](crate::Capabilities::interactive_exec): without
    /// it the call is `Unsupported` before anything runs (such a backend answers only
    /// once the command has ended, so no conversation is possible).
    pub async fn start(
        backend: Arc<dyn SandboxBackend>,
        sandbox: &SandboxId,
        request: ExecRequest,
        options: JsonLinesOptions,
    ) -> Result<Self> {
        if !backend.capabilities().interactive_exec {
            return Err(Error::unsupported(format!(
                "a JSON-lines session needs interactive exec; the {} backend runs a command to its end before answering",
                backend.name()
            )));
        }
        if request.stdin.is_some() {
            return Err(Error::invalid_input(
                "a JSON-lines session writes its own stdin; the request must not supply it",
            ));
        }
        let session = JsonLinesSession {
            backend,
            sandbox: sandbox.clone(),
            request,
            options,
            state: Arc::new(tokio::sync::Mutex::new(State::default())),
        };
        let mut state = session.state.lock().await;
        session.ensure_running(&mut state).await?;
        drop(state);
        Ok(session)
    }

    /// How many times the process was started again after dying.
    pub async fn restarts(&self) -> u32 {
        self.state.lock().await.restarts
    }

    async fn ensure_running(&self, state: &mut State) -> Result<()> {
        if state.running.is_some() {
            return Ok(());
        }
        if state.started && !self.options.restart {
            return Err(Error::new(
                ErrorKind::InvalidState,
                "the JSON-lines process has ended and restarts are off",
            ));
        }
        let mut process = self
            .backend
            .exec(&self.sandbox, self.request.clone())
            .await?;
        let stdin = process
            .take_stdin()
            .ok_or_else(|| Error::new(ErrorKind::Backend, "the process has no stdin"))?;
        let stdout = process
            .take_stdout()
            .ok_or_else(|| Error::new(ErrorKind::Backend, "the process has no stdout"))?;
        if state.started {
            state.restarts += 1;
        }
        state.started = true;
        state.running = Some(Running {
            process,
            stdin,
            lines: Lines::new(stdout, self.options.max_line),
        });
        Ok(())
    }

    /// Sends `message` and streams the reply's packets, the terminal one last. The
    /// next request waits until this reply has been read to its end (or dropped, which
    /// kills the process: its half-read reply would poison the next one).
    pub async fn request(&self, message: &Value) -> Result<BoxStream<'static, Result<Value>>> {
        let mut state = Arc::clone(&self.state).lock_owned().await;
        self.ensure_running(&mut state).await?;
        let running = state.running.as_mut().ok_or_else(|| {
            Error::new(ErrorKind::Backend, "the JSON-lines process is not running")
        })?;
        let mut line = serde_json::to_vec(message)
            .map_err(|e| Error::invalid_input(format!("encoding the request: {e}")))?;
        line.push(b'\n');
        if let Err(e) = running.stdin.write_all(&line).await {
            let why = died(&mut state).await;
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!("the JSON-lines process is gone ({why}); writing the request failed: {e}"),
            ));
        }
        let _ = running.stdin.flush().await;
        let is_terminal = Arc::clone(&self.options.is_terminal);
        let reply = Reply {
            state: Some(state),
            done: false,
        };
        Ok(futures::stream::unfold(
            (reply, is_terminal),
            |(mut reply, is_terminal)| async move {
                if reply.done {
                    return None;
                }
                let item = reply.next().await;
                if item.as_ref().is_err() || item.as_ref().is_ok_and(|v| is_terminal(v)) {
                    reply.done = true;
                    reply.state = None; // releases the session for the next request
                }
                Some((item, (reply, is_terminal)))
            },
        )
        .boxed())
    }

    /// Sends the ping and waits at most `deadline` for the pong; returns the round trip.
    /// Packets before the pong are skipped. A process that does not answer in time is
    /// killed (the next request starts a new one) and the result is `Timeout`.
    pub async fn ping(&self, deadline: Duration) -> Result<Duration> {
        let started = Instant::now();
        let is_pong = Arc::clone(&self.options.is_pong);
        let ping = self.options.ping.clone();
        let attempt = async {
            let mut state = Arc::clone(&self.state).lock_owned().await;
            self.ensure_running(&mut state).await?;
            let running = state.running.as_mut().ok_or_else(|| {
                Error::new(ErrorKind::Backend, "the JSON-lines process is not running")
            })?;
            let mut line = serde_json::to_vec(&ping).unwrap_or_default();
            line.push(b'\n');
            running.stdin.write_all(&line).await.map_err(|e| {
                Error::new(ErrorKind::Unavailable, format!("writing the ping: {e}"))
            })?;
            let mut reply = Reply {
                state: Some(state),
                done: false,
            };
            loop {
                let packet = reply.next().await?;
                if is_pong(&packet) {
                    reply.done = true;
                    return Ok(started.elapsed());
                }
            }
        };
        match tokio::time::timeout(deadline, attempt).await {
            Ok(result) => result,
            Err(_) => {
                let mut state = self.state.lock().await;
                state.kill().await;
                Err(Error::new(
                    ErrorKind::Timeout,
                    format!("no pong within {deadline:?}; the process was killed"),
                ))
            }
        }
    }

    /// Kills the process; the next request starts a new one (if restarts are on).
    pub async fn restart(&self) -> Result<()> {
        let mut state = self.state.lock().await;
        if let Some(mut running) = state.running.take() {
            running.process.kill().await?;
        }
        self.ensure_running(&mut state).await
    }

    /// Kills the process for good.
    pub async fn close(self) -> Result<()> {
        let mut state = self.state.lock().await;
        if let Some(mut running) = state.running.take() {
            running.process.kill().await?;
            let _ = running.process.wait().await;
        }
        Ok(())
    }
}

/// A reply being read: holds the session until it ends.
struct Reply {
    state: Option<tokio::sync::OwnedMutexGuard<State>>,
    done: bool,
}

impl Drop for Reply {
    fn drop(&mut self) {
        // Dropped mid-reply: the rest of it would be read as the next reply's. Kill.
        if !self.done {
            if let Some(state) = self.state.as_mut() {
                if let Some(mut running) = state.running.take() {
                    tokio::spawn(async move {
                        let _ = running.process.kill().await;
                    });
                }
            }
        }
    }
}

impl Reply {
    async fn next(&mut self) -> Result<Value> {
        let Some(state) = self.state.as_mut() else {
            return Err(Error::new(ErrorKind::InvalidState, "the reply has ended"));
        };
        let Some(running) = state.running.as_mut() else {
            return Err(Error::new(
                ErrorKind::Unavailable,
                "the JSON-lines process is gone",
            ));
        };
        loop {
            match running.lines.next().await {
                Ok(Some(line)) if line.iter().all(u8::is_ascii_whitespace) => continue,
                Ok(Some(line)) => {
                    return match serde_json::from_slice::<Value>(&line) {
                        Ok(v) => Ok(v),
                        Err(e) => {
                            let shown: String =
                                String::from_utf8_lossy(&line).chars().take(120).collect();
                            state.kill().await;
                            Err(Error::new(
                                ErrorKind::Backend,
                                format!("the process wrote a line that is not JSON ({e}): {shown:?}; it was killed"),
                            ))
                        }
                    };
                }
                Ok(None) => {
                    let why = died(state).await;
                    return Err(Error::new(
                        ErrorKind::Unavailable,
                        format!("the JSON-lines process ended before finishing its reply ({why})"),
                    ));
                }
                Err(e) => {
                    state.kill().await;
                    return Err(e);
                }
            }
        }
    }
}

/// Takes the dead process out of the state and says how it ended.
async fn died(state: &mut State) -> String {
    match state.running.take() {
        Some(mut running) => {
            let _ = running.process.kill().await;
            match tokio::time::timeout(Duration::from_secs(5), running.process.wait()).await {
                Ok(Ok(status)) => match (status.code, status.signal) {
                    (Some(code), _) => format!("exit code {code}"),
                    (None, Some(signal)) => format!("signal {signal}"),
                    _ => "no status".to_owned(),
                },
                Ok(Err(e)) => e.to_string(),
                Err(_) => "still running".to_owned(),
            }
        }
        None => "already gone".to_owned(),
    }
}
