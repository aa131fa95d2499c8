//! The interpreter handle: starts the helper in the sandbox, routes its answer lines
//! to the requests that wait for them, and stops it (and its kernels) when dropped.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::{Stream, StreamExt};
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use super::types::{CodeContext, CodeEvent, CodeLanguage, CodeOutput, RunCode};
use crate::backend::SandboxBackend;
use crate::error::{Error, ErrorKind, Result};
use crate::exec::ExecRequest;
use crate::json_lines::Lines;
use crate::path::SandboxPath;
use crate::process::{Process, ProcessStdin};
use crate::sandbox::SandboxId;

const HELPER: &str = include_str!("helper.py");

/// How long writing a request may take: a helper that stopped reading (its pipe full)
/// is given up, or a caller, and the interrupt a dropped run sends, would wait for ever.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long past its own timeout a run may go before the host gives up on the helper:
/// the helper interrupts it at the timeout and waits a while for the kernel.
const RUN_GRACE: Duration = Duration::from_secs(20);

/// Answer lines waiting for one request before the helper's reader waits for them.
/// Lines are the sandbox's to write (its programs can reach the helper's pipe), so
/// what one run holds is bounded: at most this many lines of at most `max_line`.
const ANSWER_BACKLOG: usize = 4;

/// How to start a [`CodeInterpreter`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CodeInterpreterOptions {
    /// The Python inside the sandbox that has `jupyter_client` (default `python3`).
    pub python: String,
    /// How long the helper may take to start (default 60 s).
    pub start_timeout: Duration,
    /// How long a call other than a run may take (default 90 s: creating or restarting
    /// a context starts a kernel, which the helper waits 60 s for). Past it the helper
    /// is given up (`Timeout`; later calls `Unavailable`).
    pub call_timeout: Duration,
    /// The most [`CodeInterpreter::run_to_end`] gathers, in bytes of text and results
    /// (default 32 MiB); past it the run is interrupted and the call is
    /// `LimitExceeded`. A streamed run ([`CodeInterpreter::run`]) holds a few lines only.
    pub max_output: usize,
    /// The longest answer line accepted, in bytes (default 16 MiB: images are inline,
    /// base64). A longer one ends the helper with `LimitExceeded`'s message.
    pub max_line: usize,
}

impl Default for CodeInterpreterOptions {
    fn default() -> Self {
        CodeInterpreterOptions {
            python: "python3".into(),
            start_timeout: Duration::from_secs(60),
            call_timeout: Duration::from_secs(90),
            max_output: 32 << 20,
            max_line: 16 << 20,
        }
    }
}

impl CodeInterpreterOptions {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs the helper with this Python.
    pub fn python(mut self, python: impl Into<String>) -> Self {
        self.python = python.into();
        self
    }
}

/// Who waits for which answer, and why the helper ended once it has.
#[derive(Default)]
struct Routes {
    open: HashMap<u64, mpsc::Sender<Value>>,
    ended: Option<String>,
}

type SharedRoutes = Arc<Mutex<Routes>>;

fn routes(shared: &SharedRoutes) -> std::sync::MutexGuard<'_, Routes> {
    shared
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

struct Inner {
    options: CodeInterpreterOptions,
    stdin: tokio::sync::Mutex<Option<ProcessStdin>>,
    routes: SharedRoutes,
    next_id: AtomicU64,
    process: Mutex<Option<Process>>,
}

/// Code contexts in one sandbox; see the [module docs](super).
///
/// Cloning shares the helper; it stops (with every context's kernel) when the last
/// clone and the last [`CodeRun`] are dropped.
#[derive(Clone)]
pub struct CodeInterpreter {
    inner: Arc<Inner>,
}

impl fmt::Debug for CodeInterpreter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CodeInterpreter").finish_non_exhaustive()
    }
}

impl CodeInterpreter {
    /// Starts the helper in sandbox `id`.
    ///
    /// # Errors
    /// `Unsupported` when the backend has no interactive exec; `Unsupported` naming
    /// what to install when the sandbox's Python lacks `jupyter_client`; `Timeout`
    /// when the helper does not start within the options' `start_timeout`.
    pub async fn start<B: SandboxBackend + ?Sized>(
        backend: &B,
        id: &SandboxId,
        options: CodeInterpreterOptions,
    ) -> Result<Self> {
        if !backend.capabilities().interactive_exec {
            return Err(Error::unsupported(format!(
                "code contexts need interactive exec, which the {} backend does not have",
                backend.name()
            )));
        }
        // Isolated mode: the workspace (its working directory) is not on its import
        // path, nor are PYTHON* variables heeded, so no module of the sandbox's stands in
        // for one the helper imports (FINDINGS11 F6).
        let request = ExecRequest::new([options.python.as_str(), "-I", "-c", HELPER]);
        let mut process = backend.exec(id, request).await?;
        let (Some(stdin), Some(stdout), Some(stderr)) = (
            process.take_stdin(),
            process.take_stdout(),
            process.take_stderr(),
        ) else {
            let _ = process.kill().await;
            return Err(Error::new(
                ErrorKind::Backend,
                "the code helper has no pipes",
            ));
        };
        let routes = SharedRoutes::default();
        // Kernels log to it: read, or the helper would block on a full pipe; its last
        // line says why, should the helper die.
        let said = tokio::spawn(last_words(stderr));
        let (ready_tx, ready) = tokio::sync::oneshot::channel();
        tokio::spawn(read_answers(
            Lines::new(stdout, options.max_line),
            Arc::clone(&routes),
            ready_tx,
            said,
        ));
        let interpreter = CodeInterpreter {
            inner: Arc::new(Inner {
                options: options.clone(),
                stdin: tokio::sync::Mutex::new(Some(stdin)),
                routes,
                next_id: AtomicU64::new(1),
                process: Mutex::new(Some(process)),
            }),
        };
        match tokio::time::timeout(options.start_timeout, ready).await {
            Ok(Ok(Ok(()))) => Ok(interpreter),
            Ok(Ok(Err(fatal))) => Err(Error::unsupported(fatal)),
            Ok(Err(_)) => Err(interpreter.ended()),
            Err(_) => Err(Error::new(
                ErrorKind::Timeout,
                format!(
                    "the code helper did not start within {:?}",
                    options.start_timeout
                ),
            )),
        }
    }

    /// Makes a context running `language`, working in `cwd` (the workspace when
    /// `None`).
    ///
    /// # Errors
    /// `Unsupported` naming what to install when the sandbox has no kernel for
    /// `language`; `NotFound` when `cwd` is no directory.
    pub async fn create_context(
        &self,
        language: CodeLanguage,
        cwd: Option<&SandboxPath>,
    ) -> Result<CodeContext> {
        let answer = self
            .ask(json!({"op": "create", "language": language, "cwd": cwd.map(SandboxPath::as_str)}))
            .await?;
        decode(answer.get("context"))
    }

    /// Every context, the default ones made so far among them.
    pub async fn contexts(&self) -> Result<Vec<CodeContext>> {
        let answer = self.ask(json!({"op": "list"})).await?;
        decode(answer.get("contexts"))
    }

    /// Restarts a context's kernel: its state is gone, the context stays.
    pub async fn restart_context(&self, context: &str) -> Result<()> {
        self.ask(json!({"op": "restart", "context": context}))
            .await
            .map(drop)
    }

    /// Removes a context and stops its kernel.
    pub async fn remove_context(&self, context: &str) -> Result<()> {
        self.ask(json!({"op": "remove", "context": context}))
            .await
            .map(drop)
    }

    /// Runs `code`, streaming what it produces; the stream ends after
    /// [`CodeEvent::End`] or an error. Dropping the stream before its end interrupts
    /// the run (the context stays).
    pub async fn run(&self, code: &str, options: RunCode) -> Result<CodeRun> {
        let RunCode {
            context,
            language,
            env,
            timeout,
        } = options;
        let request = json!({
            "op": "execute",
            "code": code,
            "context": context,
            "language": language.unwrap_or(CodeLanguage::Python),
            "env": env,
            "timeout": timeout.map(|t| t.as_secs_f64()),
        });
        let (id, answers) = self.send(request).await?;
        let deadline = timeout.map(|t| Box::pin(tokio::time::sleep(t + RUN_GRACE)));
        Ok(CodeRun {
            interpreter: self.clone(),
            id,
            answers,
            deadline,
            done: false,
        })
    }

    /// Runs `code` to its end and gathers what it produced.
    pub async fn run_to_end(&self, code: &str, options: RunCode) -> Result<CodeOutput> {
        let mut run = self.run(code, options).await?;
        let mut output = CodeOutput::default();
        let mut gathered = 0;
        while let Some(event) = run.next().await {
            let event = event?;
            gathered += event.size();
            if gathered > self.inner.options.max_output {
                // Dropping the run interrupts it.
                return Err(Error::limit_exceeded(format!(
                    "the run produced more than {} bytes; stream it with run() instead",
                    self.inner.options.max_output
                )));
            }
            output.add(event);
        }
        Ok(output)
    }

    /// Whether the helper still runs: once it has ended (its sandbox destroyed or
    /// restarted, or killed), every call answers `Unavailable` and a new interpreter is
    /// needed.
    pub fn is_running(&self) -> bool {
        routes(&self.inner.routes).ended.is_none()
    }

    /// Sends one request and waits for its one answer.
    async fn ask(&self, request: Value) -> Result<Value> {
        let (id, mut answers) = self.send(request).await?;
        let answer = tokio::time::timeout(self.inner.options.call_timeout, answers.recv()).await;
        routes(&self.inner.routes).open.remove(&id);
        match answer {
            Ok(Some(answer)) => failure(&answer).map_or(Ok(answer), Err),
            Ok(None) => Err(self.ended()),
            Err(_) => {
                let why = format!(
                    "it did not answer within {:?}",
                    self.inner.options.call_timeout
                );
                self.abandon(&why);
                Err(Error::new(
                    ErrorKind::Timeout,
                    format!("the code helper: {why}"),
                ))
            }
        }
    }

    async fn send(&self, mut request: Value) -> Result<(u64, mpsc::Receiver<Value>)> {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        request["id"] = id.into();
        let (tx, rx) = mpsc::channel(ANSWER_BACKLOG);
        {
            let mut routes = routes(&self.inner.routes);
            if routes.ended.is_some() {
                drop(routes);
                return Err(self.ended());
            }
            routes.open.insert(id, tx);
        }
        let mut line = serde_json::to_vec(&request)
            .map_err(|e| Error::invalid_input(format!("encoding a code request: {e}")))?;
        line.push(b'\n');
        let written = tokio::time::timeout(WRITE_TIMEOUT, async {
            let mut stdin = self.inner.stdin.lock().await;
            match stdin.as_mut() {
                Some(stdin) => stdin.write_all(&line).await.and(stdin.flush().await),
                None => Err(std::io::ErrorKind::BrokenPipe.into()),
            }
        })
        .await;
        match written {
            Ok(Ok(())) => Ok((id, rx)),
            Ok(Err(_)) => {
                routes(&self.inner.routes).open.remove(&id);
                Err(self.ended())
            }
            Err(_) => {
                self.abandon("it stopped reading its requests");
                Err(self.ended())
            }
        }
    }

    /// Gives the helper up: every waiting request learns `why`, later ones are
    /// `Unavailable`, and the helper is killed with its kernels.
    fn abandon(&self, why: &str) {
        {
            let mut routes = routes(&self.inner.routes);
            routes.ended.get_or_insert_with(|| why.to_owned());
            routes.open.clear();
        }
        let process = self
            .inner
            .process
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let (Some(mut process), Ok(runtime)) = (process, tokio::runtime::Handle::try_current()) {
            runtime.spawn(async move {
                let _ = process.kill().await;
            });
        }
    }

    /// Why requests can no longer be answered.
    fn ended(&self) -> Error {
        let why = routes(&self.inner.routes)
            .ended
            .clone()
            .unwrap_or_else(|| "it stopped".into());
        Error::new(
            ErrorKind::Unavailable,
            format!("the code helper ended: {why}"),
        )
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Its stdin closing ends the helper, which stops its kernels; killed if it
        // has not ended a while later.
        let stdin = self.stdin.get_mut().take();
        let process = self
            .process
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let (Some(mut process), Ok(runtime)) = (process, tokio::runtime::Handle::try_current()) {
            runtime.spawn(async move {
                drop(stdin);
                if tokio::time::timeout(Duration::from_secs(10), process.wait())
                    .await
                    .is_err()
                {
                    let _ = process.kill().await;
                }
            });
        }
    }
}

/// One run's events; see [`CodeInterpreter::run`].
pub struct CodeRun {
    interpreter: CodeInterpreter,
    id: u64,
    answers: mpsc::Receiver<Value>,
    /// The run's timeout and a grace: past it the helper has failed to end the run.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    done: bool,
}

impl fmt::Debug for CodeRun {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CodeRun").field("done", &self.done).finish()
    }
}

impl Stream for CodeRun {
    type Item = Result<CodeEvent>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        let answer = match self.answers.poll_recv(cx) {
            Poll::Ready(answer) => answer,
            Poll::Pending => {
                let late = self
                    .deadline
                    .as_mut()
                    .is_some_and(|deadline| deadline.as_mut().poll(cx).is_ready());
                if !late {
                    return Poll::Pending;
                }
                self.done = true;
                self.interpreter
                    .abandon("it did not end a run past the run's timeout");
                return Poll::Ready(Some(Err(Error::new(
                    ErrorKind::Timeout,
                    "the code helper did not end the run past its timeout; it was stopped",
                ))));
            }
        };
        let item = match answer {
            None => Err(self.interpreter.ended()),
            Some(answer) => match failure(&answer) {
                Some(error) => Err(error),
                None => serde_json::from_value::<CodeEvent>(answer).map_err(|e| {
                    Error::new(
                        ErrorKind::Backend,
                        format!("the code helper sent an event this library does not know: {e}"),
                    )
                }),
            },
        };
        if matches!(item, Ok(CodeEvent::End) | Err(_)) {
            self.done = true;
            routes(&self.interpreter.inner.routes).open.remove(&self.id);
        }
        Poll::Ready(Some(item))
    }
}

impl Drop for CodeRun {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        routes(&self.interpreter.inner.routes).open.remove(&self.id);
        // Left before its end: the kernel stops working on it.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let interpreter = self.interpreter.clone();
            let run = self.id;
            runtime.spawn(async move {
                if let Ok((id, _)) = interpreter
                    .send(json!({"op": "interrupt", "run": run}))
                    .await
                {
                    routes(&interpreter.inner.routes).open.remove(&id);
                }
            });
        }
    }
}

/// The error an answer reports, if it is one (`failed`, `timeout`).
fn failure(answer: &Value) -> Option<Error> {
    let text = |key: &str| {
        answer
            .get(key)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    match answer.get("type").and_then(Value::as_str) {
        Some("timeout") => Some(Error::new(ErrorKind::Timeout, text("message"))),
        Some("failed") => {
            let kind = match text("kind").as_str() {
                "unsupported" => ErrorKind::Unsupported,
                "not_found" => ErrorKind::NotFound,
                "invalid_input" => ErrorKind::InvalidInput,
                _ => ErrorKind::Backend,
            };
            Some(Error::new(kind, text("message")))
        }
        _ => None,
    }
}

fn decode<T: serde::de::DeserializeOwned>(value: Option<&Value>) -> Result<T> {
    serde_json::from_value(value.cloned().unwrap_or(Value::Null)).map_err(|e| {
        Error::new(
            ErrorKind::Backend,
            format!("the code helper answered in a shape this library does not know: {e}"),
        )
    })
}

/// Reads the helper's lines and hands each to the request it answers; when the
/// helper ends, every open request learns why.
async fn read_answers(
    mut lines: Lines,
    shared: SharedRoutes,
    ready: tokio::sync::oneshot::Sender<std::result::Result<(), String>>,
    said: tokio::task::JoinHandle<Option<String>>,
) {
    let mut ready = Some(ready);
    let why = loop {
        let line = match lines.next().await {
            Ok(Some(line)) => line,
            Ok(None) => break "its output closed".to_owned(),
            Err(e) => break e.to_string(),
        };
        let Ok(answer) = serde_json::from_slice::<Value>(&line) else {
            continue;
        };
        match answer.get("type").and_then(Value::as_str) {
            Some("ready") => {
                if let Some(ready) = ready.take() {
                    let _ = ready.send(Ok(()));
                }
                continue;
            }
            Some("fatal") => {
                let message = answer
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("the code helper failed")
                    .to_owned();
                if let Some(ready) = ready.take() {
                    let _ = ready.send(Err(message.clone()));
                }
                break message;
            }
            _ => {}
        }
        let Some(id) = answer.get("id").and_then(Value::as_u64) else {
            continue;
        };
        let route = routes(&shared).open.get(&id).cloned();
        if let Some(route) = route {
            // A reader slower than the kernel holds the pipe: memory stays bounded.
            let _ = route.send(answer).await;
        }
    };
    let why = match tokio::time::timeout(Duration::from_secs(1), said).await {
        Ok(Ok(Some(said))) => format!("{why}; it last said: {said}"),
        _ => why,
    };
    let mut routes = routes(&shared);
    routes.ended = Some(why);
    routes.open.clear();
}

/// Reads the helper's stderr to its end; answers the last line it said.
async fn last_words(mut stderr: crate::backend::ByteStream) -> Option<String> {
    let mut last = Vec::new();
    while let Some(Ok(chunk)) = stderr.next().await {
        last.extend_from_slice(&chunk);
        if last.len() > 4096 {
            last.drain(..last.len() - 4096);
        }
    }
    let said = String::from_utf8_lossy(&last);
    said.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .map(|l| l.trim().to_owned())
}
