//! The interpreter handle: starts the helper in the sandbox, routes its answer lines
//! to the requests that wait for them, and stops it (and its kernels) when dropped.

use std::collections::HashMap;
use std::fmt;
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
    /// The longest answer line accepted, in bytes (default 16 MiB: images are inline,
    /// base64). A longer one ends the helper with `LimitExceeded`'s message.
    pub max_line: usize,
}

impl Default for CodeInterpreterOptions {
    fn default() -> Self {
        CodeInterpreterOptions {
            python: "python3".into(),
            start_timeout: Duration::from_secs(60),
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
        let request = ExecRequest::new([options.python.as_str(), "-c", HELPER]);
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
        Ok(CodeRun {
            interpreter: self.clone(),
            id,
            answers,
            done: false,
        })
    }

    /// Runs `code` to its end and gathers what it produced.
    pub async fn run_to_end(&self, code: &str, options: RunCode) -> Result<CodeOutput> {
        let mut run = self.run(code, options).await?;
        let mut output = CodeOutput::default();
        while let Some(event) = run.next().await {
            output.add(event?);
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
        let answer = answers.recv().await;
        routes(&self.inner.routes).open.remove(&id);
        match answer {
            Some(answer) => failure(&answer).map_or(Ok(answer), Err),
            None => Err(self.ended()),
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
        let mut stdin = self.inner.stdin.lock().await;
        let written = match stdin.as_mut() {
            Some(stdin) => stdin.write_all(&line).await.and(stdin.flush().await),
            None => Err(std::io::ErrorKind::BrokenPipe.into()),
        };
        if written.is_err() {
            routes(&self.inner.routes).open.remove(&id);
            return Err(self.ended());
        }
        Ok((id, rx))
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
            Poll::Pending => return Poll::Pending,
            Poll::Ready(answer) => answer,
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
