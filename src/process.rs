//! `Process`: the handle `exec` returns — output streams, a stdin writer, wait and kill.
//!
//! Backends build a `Process` from their own streams and a [`ProcessControl`]; callers
//! either read the streams, turn the handle into one ordered [`ProcessEvent`] stream, or
//! [`collect`](Process::collect) everything with output caps.

use std::fmt;
use std::pin::Pin;
use std::time::Instant;

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use futures::stream::{Stream, StreamExt};
use tokio::io::AsyncWrite;

mod guarded;

use crate::backend::ByteStream;
use crate::error::Result;
use crate::exec::{ExecOutput, ExitStatus, TerminalSize};

/// A writer to the process's stdin. Dropping it (or `shutdown`) closes stdin.
pub type ProcessStdin = Pin<Box<dyn AsyncWrite + Send + Sync>>;

/// The backend side of a process handle: waiting for it and killing it.
#[async_trait]
pub trait ProcessControl: Send + Sync {
    /// Waits for the process to end. Must be cancel-safe: a call dropped before it
    /// finishes may be followed by another (callers race it against other work), and
    /// calls after the end return the same status.
    async fn wait(&mut self) -> Result<ExitStatus>;
    /// Kills the process and everything it started. Idempotent; no error if it already ended.
    async fn kill(&mut self) -> Result<()>;
    /// Sends a Unix signal to the process and everything it started; no error if it
    /// already ended. `Unsupported` unless the backend implements it.
    async fn signal(&mut self, signal: i32) -> Result<()> {
        Err(crate::Error::unsupported(format!(
            "this backend cannot send signal {signal} to a process"
        )))
    }
    /// Changes the size of the process's terminal. `InvalidInput` for a process
    /// started without one (the default); no error if it already ended.
    async fn resize(&mut self, size: TerminalSize) -> Result<()> {
        let _ = size;
        Err(crate::Error::invalid_input(
            "the process has no terminal: exec it with ExecRequest::pty",
        ))
    }
}

/// One item of a process's combined output, in arrival order.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProcessEvent {
    /// A chunk of stdout.
    Stdout(Bytes),
    /// A chunk of stderr.
    Stderr(Bytes),
    /// The process ended; always the last event.
    Exit(ExitStatus),
}

/// A running command. Dropping the handle does not kill the process; call
/// [`kill`](Process::kill) for that (the timeout still applies).
pub struct Process {
    stdin: Option<ProcessStdin>,
    stdout: Option<ByteStream>,
    stderr: Option<ByteStream>,
    control: Box<dyn ProcessControl>,
    started: Instant,
    output_limit: Option<usize>,
}

impl fmt::Debug for Process {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Process")
            .field("stdin", &self.stdin.is_some())
            .field("stdout", &self.stdout.is_some())
            .field("stderr", &self.stderr.is_some())
            .finish_non_exhaustive()
    }
}

impl Process {
    /// Assembles a handle ([`raw::process`](crate::raw::process) for backends).
    pub(crate) fn new(
        control: Box<dyn ProcessControl>,
        stdin: Option<ProcessStdin>,
        stdout: ByteStream,
        stderr: ByteStream,
    ) -> Self {
        Process {
            stdin,
            stdout: Some(stdout),
            stderr: Some(stderr),
            control,
            started: Instant::now(),
            output_limit: None,
        }
    }

    /// A command that already ran, its whole output in hand (a buffered exec API); for
    /// backend implementors. Waiting answers `status`; kill and signals do nothing.
    pub(crate) fn finished(stdout: Bytes, stderr: Bytes, status: ExitStatus) -> Self {
        let once =
            |data: Bytes| futures::stream::iter((!data.is_empty()).then_some(Ok(data))).boxed();
        Process::new(Box::new(Finished(status)), None, once(stdout), once(stderr))
    }

    /// Sets the output cap the sandbox's spec asks for (`Limits::output_bytes`), used by
    /// collectors when the request sets none; for backend implementors.
    pub(crate) fn with_output_limit(mut self, limit: Option<usize>) -> Self {
        self.output_limit = limit;
        self
    }

    /// Holds `guard` until the process ends (not until this handle is dropped: the
    /// command runs on); [`raw::hold_until_exit`](crate::raw::hold_until_exit).
    pub(crate) fn holding(self, guard: Box<dyn Send + Sync>) -> Self {
        Process {
            control: Box::new(guarded::Guarded::new(self.control, guard)),
            ..self
        }
    }

    /// The sandbox's default output cap, if its spec sets one.
    pub fn output_limit(&self) -> Option<usize> {
        self.output_limit
    }

    /// Takes the stdin writer; `None` if the request supplied stdin bytes or it was taken.
    pub fn take_stdin(&mut self) -> Option<ProcessStdin> {
        self.stdin.take()
    }

    /// Takes the stdout stream; `None` if already taken.
    pub fn take_stdout(&mut self) -> Option<ByteStream> {
        self.stdout.take()
    }

    /// Takes the stderr stream; `None` if already taken.
    pub fn take_stderr(&mut self) -> Option<ByteStream> {
        self.stderr.take()
    }

    /// Waits for the process to end. Streams not taken are not drained by this call,
    /// so prefer [`collect`](Process::collect) or [`events`](Process::events) unless you
    /// read them yourself.
    pub async fn wait(&mut self) -> Result<ExitStatus> {
        self.stdin = None;
        self.control.wait().await
    }

    /// Kills the process and its children.
    pub async fn kill(&mut self) -> Result<()> {
        self.control.kill().await
    }

    /// Sends a Unix signal (`SIGTERM` is 15, `SIGINT` 2) to the process and its
    /// children; `Unsupported` where the backend cannot.
    pub async fn signal(&mut self, signal: i32) -> Result<()> {
        self.control.signal(signal).await
    }

    /// Changes the size of the terminal of a process started with
    /// [`ExecRequest::pty`](crate::ExecRequest::pty): the process sees the new size and
    /// gets `SIGWINCH`. `InvalidInput` for a process without a terminal or a size below
    /// 1x1; no error if the process already ended.
    pub async fn resize(&mut self, size: TerminalSize) -> Result<()> {
        size.validate()?;
        self.control.resize(size).await
    }

    /// The combined output as one stream in arrival order, ending with
    /// [`ProcessEvent::Exit`]. Closes stdin unless it was taken.
    pub fn events(mut self) -> impl Stream<Item = Result<ProcessEvent>> + Send + 'static {
        self.stdin = None;
        let out = self
            .stdout
            .take()
            .unwrap_or_else(|| futures::stream::empty().boxed())
            .map(|r| r.map(ProcessEvent::Stdout));
        let err = self
            .stderr
            .take()
            .unwrap_or_else(|| futures::stream::empty().boxed())
            .map(|r| r.map(ProcessEvent::Stderr));
        let mut control = self.control;
        let exit =
            futures::stream::once(async move { control.wait().await.map(ProcessEvent::Exit) });
        futures::stream::select(out, err).chain(exit)
    }

    /// Drains both streams concurrently, keeping at most `limit` bytes of each (the rest
    /// is read and dropped, and the `*_truncated` flag set), then waits for the exit.
    /// Closes stdin unless it was taken.
    pub async fn collect(mut self, limit: usize) -> Result<ExecOutput> {
        self.stdin = None;
        let stdout = self.stdout.take();
        let stderr = self.stderr.take();
        let (out, err) = tokio::try_join!(drain(stdout, limit), drain(stderr, limit))?;
        let status = self.control.wait().await?;
        Ok(ExecOutput {
            status,
            stdout: out.0,
            stderr: err.0,
            stdout_truncated: out.1,
            stderr_truncated: err.1,
            duration: self.started.elapsed(),
        })
    }
}

async fn drain(stream: Option<ByteStream>, limit: usize) -> Result<(Bytes, bool)> {
    let Some(mut stream) = stream else {
        return Ok((Bytes::new(), false));
    };
    let mut buf = BytesMut::new();
    let mut truncated = false;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk?;
        let room = limit.saturating_sub(buf.len());
        if chunk.len() > room {
            truncated = true;
        }
        buf.extend_from_slice(&chunk[..chunk.len().min(room)]);
    }
    Ok((buf.freeze(), truncated))
}

/// The control of [`Process::finished`]: the status is known, nothing runs.
struct Finished(ExitStatus);

#[async_trait]
impl ProcessControl for Finished {
    async fn wait(&mut self) -> Result<ExitStatus> {
        Ok(self.0)
    }

    async fn kill(&mut self) -> Result<()> {
        Ok(())
    }

    async fn signal(&mut self, _signal: i32) -> Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunks(parts: &[&'static [u8]]) -> ByteStream {
        let items: Vec<Result<Bytes>> = parts.iter().map(|p| Ok(Bytes::from_static(p))).collect();
        futures::stream::iter(items).boxed()
    }

    #[tokio::test]
    async fn collect_caps_each_stream_and_keeps_draining() {
        let p = Process::new(
            Box::new(Finished(ExitStatus::exited(0))),
            None,
            chunks(&[b"hello ", b"world", b"!!!"]),
            chunks(&[b"e"]),
        );
        let out = p.collect(8).await.unwrap();
        assert_eq!(&out.stdout[..], b"hello wo");
        assert!(out.stdout_truncated);
        assert_eq!(&out.stderr[..], b"e");
        assert!(!out.stderr_truncated);
        assert!(out.success());
    }

    #[tokio::test]
    async fn events_end_with_exit() {
        let p = Process::new(
            Box::new(Finished(ExitStatus::exited(7))),
            None,
            chunks(&[b"a"]),
            chunks(&[b"b"]),
        );
        let events: Vec<_> = p.events().map(|e| e.unwrap()).collect().await;
        assert_eq!(events.len(), 3);
        assert_eq!(
            events.last(),
            Some(&ProcessEvent::Exit(ExitStatus::exited(7)))
        );
        assert!(events.contains(&ProcessEvent::Stdout(Bytes::from_static(b"a"))));
    }
}
