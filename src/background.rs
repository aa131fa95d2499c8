//! Background processes: commands that outlive the call that started them, kept by id so
//! a caller can list them, read what they printed so far and follow it, write to their
//! stdin, signal them and wait for them. They end with their sandbox.
//!
//! The table works over any backend that can run commands: it holds the [`Process`](crate::Process)
//! handles `exec` returns and a supervisor task per process drains its output into a
//! bounded log, so a process never blocks on a full pipe however long nobody attaches.
//!
//! ```
//! # #[cfg(feature = "testing")]
//! # async fn demo() -> sandcell::Result<()> {
//! use sandcell::background::Background;
//! use sandcell::testing::{MockBackend, MockReply};
//! use sandcell::{ExecRequest, ProcessEvent, SandboxBackend, SandboxSpec};
//! use futures::StreamExt;
//!
//! let backend = MockBackend::new().on_exec("server", |_| MockReply::stdout("listening\n"));
//! let sandbox = backend.create(&SandboxSpec::new("default")).await?;
//! let table = Background::new();
//! // The mock answers once its stdin is closed: give it an empty one.
//! let id = table.start(&backend, &sandbox.id, ExecRequest::new(["server"]).stdin("")).await?;
//! let events: Vec<ProcessEvent> = table.attach(&id)?.collect().await;
//! assert_eq!(events[0], ProcessEvent::Stdout("listening\n".into()));
//! assert!(table.wait(&id).await?.success());
//! # Ok(()) }
//! # #[cfg(feature = "testing")]
//! # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
//! ```

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use chrono::{DateTime, Utc};
use futures::stream::{BoxStream, StreamExt};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, watch, Notify};

use crate::backend::SandboxBackend;
use crate::error::{Error, ErrorKind, Result};
use crate::exec::{ExecRequest, ExitStatus, TerminalSize};
use crate::lock_unpoisoned as lock;
use crate::process::{ProcessEvent, ProcessStdin};
use crate::sandbox::SandboxId;

/// How much output each process keeps for [`Background::attach`] unless configured
/// otherwise; older output is dropped first.
pub const DEFAULT_RETAINED_OUTPUT: usize = 1 << 20;

/// A background process's id (`bg-` and 16 hex digits), unique within its table.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct BackgroundId(String);

impl BackgroundId {
    fn generate() -> Self {
        BackgroundId(format!(
            "bg-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..16]
        ))
    }

    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for BackgroundId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for BackgroundId {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        crate::sandbox::validate_name("process id", s)?;
        Ok(BackgroundId(s.to_owned()))
    }
}

/// What a background process is and does.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct BackgroundInfo {
    /// Its id.
    pub id: BackgroundId,
    /// The sandbox it runs in.
    pub sandbox: SandboxId,
    /// The command.
    pub argv: Vec<String>,
    /// When it started.
    pub started_at: DateTime<Utc>,
    /// How it ended; `None` while it runs.
    pub status: Option<ExitStatus>,
    /// Bytes it has written to stdout and stderr, including any dropped from the log.
    pub output_bytes: u64,
}

/// A table of background processes, shared by its clones.
#[derive(Clone)]
pub struct Background {
    entries: Arc<Mutex<HashMap<BackgroundId, Arc<Entry>>>>,
    retained: usize,
}

impl Default for Background {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for Background {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Background")
            .field("processes", &lock(&self.entries).len())
            .field("retained", &self.retained)
            .finish()
    }
}

struct Entry {
    info: Mutex<BackgroundInfo>,
    log: Mutex<Log>,
    /// Woken on new output and on exit.
    changed: Notify,
    stdin: tokio::sync::Mutex<Option<ProcessStdin>>,
    control: mpsc::UnboundedSender<Control>,
    status: watch::Receiver<Option<std::result::Result<ExitStatus, String>>>,
}

enum Control {
    Kill,
    Signal(i32, tokio::sync::oneshot::Sender<Result<()>>),
    Resize(TerminalSize, tokio::sync::oneshot::Sender<Result<()>>),
}

/// The retained output: events numbered from the start, oldest dropped beyond the cap.
#[derive(Default)]
struct Log {
    events: VecDeque<(u64, ProcessEvent)>,
    /// The number the next event gets.
    next: u64,
    bytes: usize,
    ended: bool,
}

impl Log {
    fn push(&mut self, event: ProcessEvent, cap: usize) {
        let size = event_size(&event);
        self.events.push_back((self.next, event));
        self.next += 1;
        self.bytes += size;
        while self.bytes > cap && self.events.len() > 1 {
            if let Some((_, old)) = self.events.pop_front() {
                self.bytes -= event_size(&old);
            }
        }
    }
}

fn event_size(event: &ProcessEvent) -> usize {
    match event {
        ProcessEvent::Stdout(b) | ProcessEvent::Stderr(b) => b.len(),
        _ => 0,
    }
}

fn unknown(id: &BackgroundId) -> Error {
    Error::not_found(format!("no background process {id}"))
}

impl Background {
    /// An empty table keeping [`DEFAULT_RETAINED_OUTPUT`] per process.
    pub fn new() -> Self {
        Self::with_retained_output(DEFAULT_RETAINED_OUTPUT)
    }

    /// An empty table keeping the last `bytes` of each process's output for `attach`.
    pub fn with_retained_output(bytes: usize) -> Self {
        Background {
            entries: Arc::new(Mutex::new(HashMap::new())),
            retained: bytes.max(1),
        }
    }

    /// Starts `request` in `sandbox` and keeps it running in the background. Its stdin
    /// stays open for [`send_input`](Self::send_input) unless the request supplies it.
    /// The request's timeout, if any, still applies. Needs
    /// [`Capabilities::interactive_exec`](crate::Capabilities::interactive_exec)
    /// (`Unsupported` without it: such a backend would answer only once the command ended).
    pub async fn start(
        &self,
        backend: &dyn SandboxBackend,
        sandbox: &SandboxId,
        request: ExecRequest,
    ) -> Result<BackgroundId> {
        if !backend.capabilities().interactive_exec {
            return Err(Error::unsupported(format!(
                "background processes need interactive exec; the {} backend runs a command to its end before answering",
                backend.name()
            )));
        }
        let argv = request.argv.clone();
        let mut process = backend.exec(sandbox, request).await?;
        let id = BackgroundId::generate();
        let (control, mut control_rx) = mpsc::unbounded_channel();
        let (status_tx, status) = watch::channel(None);
        let entry = Arc::new(Entry {
            info: Mutex::new(BackgroundInfo {
                id: id.clone(),
                sandbox: sandbox.clone(),
                argv,
                started_at: Utc::now(),
                status: None,
                output_bytes: 0,
            }),
            log: Mutex::new(Log::default()),
            changed: Notify::new(),
            stdin: tokio::sync::Mutex::new(process.take_stdin()),
            control,
            status,
        });
        let mut stdout = process.take_stdout();
        let mut stderr = process.take_stderr();
        let retained = self.retained;
        let supervised = Arc::clone(&entry);
        tokio::spawn(async move {
            let entry = supervised;
            let record = |event: ProcessEvent| {
                if let ProcessEvent::Stdout(b) | ProcessEvent::Stderr(b) = &event {
                    lock(&entry.info).output_bytes += b.len() as u64;
                }
                lock(&entry.log).push(event, retained);
                entry.changed.notify_waiters();
            };
            loop {
                tokio::select! {
                    chunk = next(&mut stdout) => match chunk {
                        Some(Ok(b)) => record(ProcessEvent::Stdout(b)),
                        _ => stdout = None,
                    },
                    chunk = next(&mut stderr) => match chunk {
                        Some(Ok(b)) => record(ProcessEvent::Stderr(b)),
                        _ => stderr = None,
                    },
                    Some(control) = control_rx.recv() => match control {
                        Control::Kill => { let _ = process.kill().await; }
                        Control::Signal(signal, reply) => {
                            let _ = reply.send(process.signal(signal).await);
                        }
                        Control::Resize(size, reply) => {
                            let _ = reply.send(process.resize(size).await);
                        }
                    },
                    status = process.wait(), if stdout.is_none() && stderr.is_none() => {
                        let status = status.map_err(|e| e.to_string());
                        if let Ok(s) = &status {
                            lock(&entry.info).status = Some(*s);
                            record(ProcessEvent::Exit(*s));
                        }
                        lock(&entry.log).ended = true;
                        entry.changed.notify_waiters();
                        let _ = status_tx.send(Some(status));
                        break;
                    }
                }
            }
        });
        lock(&self.entries).insert(id.clone(), entry);
        Ok(id)
    }

    fn entry(&self, id: &BackgroundId) -> Result<Arc<Entry>> {
        lock(&self.entries)
            .get(id)
            .cloned()
            .ok_or_else(|| unknown(id))
    }

    /// The processes of `sandbox` (or of every sandbox), oldest first.
    pub fn list(&self, sandbox: Option<&SandboxId>) -> Vec<BackgroundInfo> {
        let mut out: Vec<BackgroundInfo> = lock(&self.entries)
            .values()
            .map(|e| lock(&e.info).clone())
            .filter(|i| sandbox.is_none_or(|s| &i.sandbox == s))
            .collect();
        out.sort_by(|a, b| a.started_at.cmp(&b.started_at).then(a.id.cmp(&b.id)));
        out
    }

    /// One process.
    pub fn info(&self, id: &BackgroundId) -> Result<BackgroundInfo> {
        Ok(lock(&self.entry(id)?.info).clone())
    }

    /// The output kept so far (the last [`DEFAULT_RETAINED_OUTPUT`] bytes, or as
    /// configured), then new output as it comes, ending with [`ProcessEvent::Exit`] once
    /// the process has ended. Any number of callers may attach at once.
    pub fn attach(&self, id: &BackgroundId) -> Result<BoxStream<'static, ProcessEvent>> {
        let entry = self.entry(id)?;
        let start = lock(&entry.log)
            .events
            .front()
            .map(|(n, _)| *n)
            .unwrap_or(0);
        Ok(Self::follow_from(entry, start))
    }

    /// New output from now on (none of what was kept), ending with
    /// [`ProcessEvent::Exit`] once the process has ended; a process that has already
    /// ended answers its exit alone.
    pub fn follow(&self, id: &BackgroundId) -> Result<BoxStream<'static, ProcessEvent>> {
        let entry = self.entry(id)?;
        let start = {
            let log = lock(&entry.log);
            match log.events.back() {
                // The exit, when there is one, is the last event kept.
                Some((n, ProcessEvent::Exit(_))) => *n,
                _ => log.next,
            }
        };
        Ok(Self::follow_from(entry, start))
    }

    fn follow_from(entry: Arc<Entry>, start: u64) -> BoxStream<'static, ProcessEvent> {
        futures::stream::unfold((entry, start), |(entry, cursor)| async move {
            loop {
                // Register before looking, so a push in between still wakes us.
                let changed = entry.changed.notified();
                {
                    let log = lock(&entry.log);
                    let first = log.events.front().map(|(n, _)| *n).unwrap_or(log.next);
                    // Output dropped while this reader lagged is skipped.
                    let at = cursor.max(first);
                    if let Some((n, event)) = log.events.get((at - first) as usize) {
                        let next = *n + 1;
                        return Some((event.clone(), (Arc::clone(&entry), next)));
                    }
                    if log.ended {
                        return None;
                    }
                }
                changed.await;
            }
        })
        .boxed()
    }

    /// Writes to the process's stdin.
    pub async fn send_input(&self, id: &BackgroundId, data: Bytes) -> Result<()> {
        let entry = self.entry(id)?;
        let mut stdin = entry.stdin.lock().await;
        let writer = stdin.as_mut().ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidState,
                format!("the stdin of background process {id} is closed"),
            )
        })?;
        writer
            .write_all(&data)
            .await
            .map_err(|e| Error::io(format_args!("writing to background process {id}"), e))?;
        writer
            .flush()
            .await
            .map_err(|e| Error::io(format_args!("writing to background process {id}"), e))
    }

    /// Closes the process's stdin (it reads end of file).
    pub async fn close_input(&self, id: &BackgroundId) -> Result<()> {
        let entry = self.entry(id)?;
        if let Some(mut writer) = entry.stdin.lock().await.take() {
            let _ = writer.shutdown().await;
        }
        Ok(())
    }

    /// Sends `signal` (a Unix signal number) to the process and everything it started.
    /// `Unsupported` where the backend cannot; a process that ended already is fine.
    pub async fn signal(&self, id: &BackgroundId, signal: i32) -> Result<()> {
        let entry = self.entry(id)?;
        let (reply, answer) = tokio::sync::oneshot::channel();
        if entry.control.send(Control::Signal(signal, reply)).is_err() {
            return Ok(());
        }
        answer.await.unwrap_or(Ok(()))
    }

    /// Changes the size of the process's terminal: `InvalidInput` for a process
    /// started without one; a process that ended already is fine.
    pub async fn resize(&self, id: &BackgroundId, size: TerminalSize) -> Result<()> {
        let entry = self.entry(id)?;
        let (reply, answer) = tokio::sync::oneshot::channel();
        if entry.control.send(Control::Resize(size, reply)).is_err() {
            return Ok(());
        }
        answer.await.unwrap_or(Ok(()))
    }

    /// Kills the process and everything it started.
    pub fn kill(&self, id: &BackgroundId) -> Result<()> {
        let _ = self.entry(id)?.control.send(Control::Kill);
        Ok(())
    }

    /// Waits for the process to end. The process is looked up when this is called, so
    /// the returned future still resolves if the record is dropped meanwhile (say, with
    /// its sandbox).
    pub fn wait(
        &self,
        id: &BackgroundId,
    ) -> impl std::future::Future<Output = Result<ExitStatus>> + Send + 'static {
        let status = self.entry(id).map(|e| e.status.clone());
        async move {
            let mut status = status?;
            let status = status
                .wait_for(Option::is_some)
                .await
                .map_err(|_| Error::new(ErrorKind::Backend, "the process supervisor stopped"))?;
            match status.as_ref() {
                Some(Ok(s)) => Ok(*s),
                Some(Err(message)) => Err(Error::new(ErrorKind::Backend, message.clone())),
                None => Err(Error::new(ErrorKind::Backend, "no exit status")),
            }
        }
    }

    /// Drops the table's record of a process that has ended; `InvalidState` while it
    /// runs.
    pub fn forget(&self, id: &BackgroundId) -> Result<()> {
        let mut entries = lock(&self.entries);
        let entry = entries.get(id).ok_or_else(|| unknown(id))?;
        if entry.status.borrow().is_none() {
            return Err(Error::new(
                ErrorKind::InvalidState,
                format!("background process {id} is still running"),
            ));
        }
        entries.remove(id);
        Ok(())
    }

    /// Drops every record of `sandbox`'s processes, once the sandbox is gone: they died
    /// with it.
    pub fn forget_sandbox(&self, sandbox: &SandboxId) {
        lock(&self.entries).retain(|_, e| &lock(&e.info).sandbox != sandbox);
    }
}

async fn next(stream: &mut Option<crate::backend::ByteStream>) -> Option<Result<Bytes>> {
    match stream {
        Some(s) => s.next().await,
        None => std::future::pending().await,
    }
}

#[cfg(all(test, feature = "testing"))]
mod tests {
    use super::*;
    use crate::testing::{MockBackend, MockReply};

    #[tokio::test]
    async fn a_backend_without_interactive_exec_is_refused() {
        let mut caps = MockBackend::new().capabilities();
        caps.interactive_exec = false;
        let backend = MockBackend::new()
            .on_exec("sleep", |_| MockReply::stdout(""))
            .set_capabilities(caps);
        let sandbox = backend
            .create(&crate::SandboxSpec::new("default"))
            .await
            .unwrap();
        let err = Background::new()
            .start(&backend, &sandbox.id, ExecRequest::new(["sleep", "9"]))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::Unsupported, "{err}");
    }
}
