//! The interpreter handle: starts the helper in the sandbox, routes its answer lines
//! to the requests that wait for them, and stops it (and its kernels) when dropped.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::{Stream, StreamExt};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::types::{CodeContext, CodeEvent, CodeLanguage, CodeOutput, RunCode};
use crate::backend::SandboxBackend;
use crate::error::{Error, ErrorKind, Result};
use crate::exec::ExecRequest;
use crate::json_lines::Lines;
use crate::path::SandboxPath;
use crate::sandbox::SandboxId;

use super::pipe::{
    failure, give_up, last_words, read_answers, routes, write_requests, Queued, Route,
    SharedProcess, SharedRoutes, WRITE_TIMEOUT,
};

const HELPER: &str = include_str!("helper.py");

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
    /// The longest answer line accepted, in bytes (default 4 MiB: images are inline,
    /// base64). A longer one ends the helper with `LimitExceeded`'s message.
    pub max_line: usize,
    /// The answer lines waiting for their callers, in bytes, across every run of the
    /// interpreter (default 16 MiB): past it the helper waits (its pipe fills) until a
    /// caller reads. The lines are the sandbox's to write, so this bounds what one
    /// sandbox holds of its host's memory however many runs it leaves unread.
    pub max_queued: usize,
}

impl Default for CodeInterpreterOptions {
    fn default() -> Self {
        CodeInterpreterOptions {
            python: "python3".into(),
            start_timeout: Duration::from_secs(60),
            call_timeout: Duration::from_secs(90),
            max_output: 32 << 20,
            max_line: 4 << 20,
            max_queued: 16 << 20,
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

struct Inner {
    options: CodeInterpreterOptions,
    /// Whole request lines for the writer task: a caller that goes away mid-send
    /// leaves no half line in the helper's input. Dropped with `Inner`, which closes
    /// that input and so ends the helper.
    writes: mpsc::Sender<Vec<u8>>,
    routes: SharedRoutes,
    next_id: AtomicU64,
    process: SharedProcess,
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
        let process = SharedProcess::new(Mutex::new(Some(process)));
        let (writes, to_write) = mpsc::channel(16);
        tokio::spawn(write_requests(
            stdin,
            to_write,
            Arc::clone(&routes),
            Arc::clone(&process),
        ));
        let queued_cap = options.max_queued.clamp(1, u32::MAX as usize);
        let queued = Arc::new(tokio::sync::Semaphore::new(queued_cap));
        // Kernels log to it: read, or the helper would block on a full pipe; its last
        // line says why, should the helper die.
        let said = tokio::spawn(last_words(stderr));
        let (ready_tx, ready) = tokio::sync::oneshot::channel();
        tokio::spawn(read_answers(
            Lines::new(stdout, options.max_line),
            Arc::clone(&routes),
            queued,
            queued_cap,
            ready_tx,
            said,
        ));
        let interpreter = CodeInterpreter {
            inner: Arc::new(Inner {
                options: options.clone(),
                writes,
                routes,
                next_id: AtomicU64::new(1),
                process,
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
        let (route, answers) = self.send(request).await?;
        let deadline = timeout.map(|t| Box::pin(tokio::time::sleep(t + RUN_GRACE)));
        Ok(CodeRun {
            interpreter: self.clone(),
            id: route.id,
            route: Some(route),
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
        let (route, mut answers) = self.send(request).await?;
        let answer = tokio::time::timeout(self.inner.options.call_timeout, answers.recv()).await;
        drop(route);
        match answer {
            Ok(Some(answer)) => match failure(&answer.line) {
                Some(error) => Err(error),
                None => serde_json::from_slice(&answer.line).map_err(|e| {
                    Error::new(
                        ErrorKind::Backend,
                        format!(
                            "the code helper answered something this library does not read: {e}"
                        ),
                    )
                }),
            },
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

    async fn send(&self, mut request: Value) -> Result<(Route, mpsc::Receiver<Queued>)> {
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
        let route = Route {
            routes: Arc::clone(&self.inner.routes),
            id,
        };
        let mut line = serde_json::to_vec(&request)
            .map_err(|e| Error::invalid_input(format!("encoding a code request: {e}")))?;
        line.push(b'\n');
        match tokio::time::timeout(WRITE_TIMEOUT, self.inner.writes.send(line)).await {
            Ok(Ok(())) => Ok((route, rx)),
            Ok(Err(_)) => Err(self.ended()),
            Err(_) => {
                self.abandon("it stopped reading its requests");
                Err(self.ended())
            }
        }
    }

    /// Gives the helper up (see [`give_up`]).
    fn abandon(&self, why: &str) {
        give_up(&self.inner.routes, &self.inner.process, why);
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
        // `writes` going with it closes the helper's input, which ends the helper and
        // its kernels; killed if it has not ended a while later.
        let process = self
            .process
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let (Some(mut process), Ok(runtime)) = (process, tokio::runtime::Handle::try_current()) {
            runtime.spawn(async move {
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
    /// Its place among the routes, until its end.
    route: Option<Route>,
    answers: mpsc::Receiver<Queued>,
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
            Some(answer) => match failure(&answer.line) {
                Some(error) => Err(error),
                None => serde_json::from_slice::<CodeEvent>(&answer.line).map_err(|e| {
                    Error::new(
                        ErrorKind::Backend,
                        format!("the code helper sent an event this library does not know: {e}"),
                    )
                }),
            },
        };
        if matches!(item, Ok(CodeEvent::End) | Err(_)) {
            self.done = true;
            self.route = None;
        }
        Poll::Ready(Some(item))
    }
}

impl Drop for CodeRun {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        self.route = None;
        // Left before its end: the kernel stops working on it.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let interpreter = self.interpreter.clone();
            let run = self.id;
            runtime.spawn(async move {
                let _ = interpreter
                    .send(json!({"op": "interrupt", "run": run}))
                    .await;
            });
        }
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
