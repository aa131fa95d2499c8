//! Commands over envd's `process.Process`: `Start` streamed into a [`Process`] whose
//! stdin goes by `SendInput`/`CloseStdin`, signals by `SendSignal`, and terminal size
//! by `Update`.

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use sandcell::raw::ProcessControl;
use sandcell::{
    ByteStream, Error, ErrorKind, ExecRequest, ExitStatus, Process, Result, TerminalSize,
};
use tokio::io::AsyncReadExt;
use tokio::sync::{mpsc, watch};

use super::envd::{
    CloseStdinRequest, EndEvent, ProcessConfig, ProcessInput, ProcessSelector,
    ProcessStreamMessage, Pty, PtySize, SendInputRequest, SendSignalRequest, StartRequest,
    UpdateRequest,
};
use super::envd_client::{EnvdClient, Frames};
use crate::protocol::{ExecBody, ExecResponse};

/// How long past its timeout a command may go unreported before this client stops
/// waiting for envd and kills it itself.
const TIMEOUT_GRACE: Duration = Duration::from_secs(5);

/// The bytes of stdin one `SendInput` carries at most.
const INPUT_CHUNK: usize = 64 * 1024;

/// How a command ended, as the stream said (errors kept as kind and message, so every
/// waiter gets one).
type Ending = std::result::Result<ExitStatus, (ErrorKind, String)>;

/// Starts `request` in envd's sandbox, in the sandbox directory `cwd`.
pub(crate) async fn start(envd: &EnvdClient, request: ExecRequest, cwd: String) -> Result<Process> {
    let pty = request.pty;
    let mut argv = request.argv.into_iter();
    let cmd = argv.next().unwrap_or_default();
    let given_stdin = request.stdin;
    let start = StartRequest {
        process: ProcessConfig {
            cmd,
            args: argv.collect(),
            envs: request.env,
            cwd: Some(cwd),
        },
        pty: pty.map(|size| Pty {
            size: Some(PtySize {
                cols: u32::from(size.cols),
                rows: u32::from(size.rows),
            }),
        }),
        tag: None,
        // Without stdin envd gives the command end of file at once.
        stdin: Some(given_stdin.as_ref().is_none_or(|b| !b.is_empty())),
    };
    let mut frames = envd
        .stream("process.Process/Start", &start, request.timeout)
        .await?;
    let pid = loop {
        let Some(frame) = frames.next().await else {
            return Err(Error::new(
                ErrorKind::Backend,
                "envd ended a command's stream before it started",
            ));
        };
        let message: ProcessStreamMessage = decode(&frame?)?;
        if let Some(started) = message.event.start {
            break started.pid;
        }
    };
    let (out_tx, out_rx) = mpsc::unbounded_channel();
    let (err_tx, err_rx) = mpsc::unbounded_channel();
    let (status_tx, status_rx) = watch::channel(None);
    let router = Router {
        envd: envd.clone(),
        pid,
        out: out_tx,
        err: err_tx,
        status: status_tx,
    };
    tokio::spawn(router.run(frames, request.timeout));
    let input = Input {
        envd: envd.clone(),
        pid,
        pty: pty.is_some(),
    };
    let stdin: Option<sandcell::ProcessStdin> = match given_stdin {
        Some(bytes) if bytes.is_empty() => None,
        Some(bytes) => {
            tokio::spawn(async move {
                if input.send(bytes).await.is_ok() {
                    let _ = input.close().await;
                }
            });
            None
        }
        None => {
            let (writer, reader) = tokio::io::duplex(INPUT_CHUNK);
            tokio::spawn(input.pump(reader));
            Some(Box::pin(writer))
        }
    };
    let control = EnvdProcess {
        envd: envd.clone(),
        pid,
        status: status_rx,
        pty: pty.is_some(),
    };
    Ok(sandcell::raw::process(
        Box::new(control),
        stdin,
        channel_stream(out_rx),
        channel_stream(err_rx),
    ))
}

fn decode(json: &[u8]) -> Result<ProcessStreamMessage> {
    serde_json::from_slice(json).map_err(|e| {
        Error::with_source(ErrorKind::Backend, "envd sent a malformed process event", e)
    })
}

fn channel_stream(rx: mpsc::UnboundedReceiver<Bytes>) -> ByteStream {
    futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|data| (Ok(data), rx))
    })
    .boxed()
}

/// What stdin writes become: `SendInput` calls, then `CloseStdin`.
struct Input {
    envd: EnvdClient,
    pid: u32,
    /// Input goes to the terminal rather than to stdin.
    pty: bool,
}

impl Input {
    async fn send(&self, data: Bytes) -> Result<()> {
        let input = if self.pty {
            ProcessInput {
                pty: Some(data),
                ..ProcessInput::default()
            }
        } else {
            ProcessInput {
                stdin: Some(data),
                ..ProcessInput::default()
            }
        };
        let request = SendInputRequest {
            process: ProcessSelector::pid(self.pid),
            input,
        };
        self.envd
            .unary::<_, serde_json::Value>("process.Process/SendInput", &request)
            .await
            .map(drop)
    }

    async fn close(&self) -> Result<()> {
        let request = CloseStdinRequest {
            process: ProcessSelector::pid(self.pid),
        };
        self.envd
            .unary::<_, serde_json::Value>("process.Process/CloseStdin", &request)
            .await
            .map(drop)
    }

    /// Forwards what the caller writes until it closes its end (or the command ends).
    async fn pump(self, mut reader: tokio::io::DuplexStream) {
        let mut buffer = vec![0u8; INPUT_CHUNK];
        loop {
            match reader.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if self
                        .send(Bytes::copy_from_slice(&buffer[..n]))
                        .await
                        .is_err()
                    {
                        // The command ended (or envd is gone): nothing reads any more.
                        return;
                    }
                }
            }
        }
        // A terminal has no end of file to send; its shell reads Ctrl-D instead.
        if !self.pty {
            let _ = self.close().await;
        }
    }
}

/// Routes a command's events: output to its streams, its end to waiters.
struct Router {
    envd: EnvdClient,
    pid: u32,
    out: mpsc::UnboundedSender<Bytes>,
    err: mpsc::UnboundedSender<Bytes>,
    status: watch::Sender<Option<Ending>>,
}

impl Router {
    async fn run(self, mut frames: Frames, timeout: Option<Duration>) {
        let overdue = async {
            match timeout {
                Some(t) => tokio::time::sleep(t + TIMEOUT_GRACE).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(overdue);
        let mut ended: Option<Ending> = None;
        loop {
            let frame = tokio::select! {
                frame = frames.next() => frame,
                () = &mut overdue, if ended.is_none() => {
                    // envd should have ended it by now: end it from here.
                    let _ = signal(&self.envd, self.pid, 9).await;
                    ended = Some(Ok(ExitStatus::signaled(9).timed_out(true)));
                    break;
                }
            };
            match frame {
                None => break,
                Some(Ok(json)) => match decode(&json) {
                    Ok(message) => {
                        if let Some(end) = self.route(message) {
                            ended = Some(Ok(end));
                        }
                    }
                    Err(e) => {
                        ended = Some(Err((e.kind(), e.to_string())));
                        break;
                    }
                },
                // envd ends a command its deadline passed with `deadline_exceeded`.
                Some(Err(e)) if e.kind() == ErrorKind::Timeout && ended.is_none() => {
                    ended = Some(Ok(ExitStatus::signaled(9).timed_out(true)));
                    break;
                }
                Some(Err(e)) => {
                    if ended.is_none() {
                        ended = Some(Err((e.kind(), e.to_string())));
                    }
                    break;
                }
            }
        }
        let ending = ended.unwrap_or_else(|| {
            Err((
                ErrorKind::Unavailable,
                format!(
                    "the stream of process {} in sandbox {} ended before the command did",
                    self.pid,
                    self.envd.id()
                ),
            ))
        });
        self.status.send_replace(Some(ending));
    }

    /// Passes output on; answers the exit an end event reports.
    fn route(&self, message: ProcessStreamMessage) -> Option<ExitStatus> {
        let event = message.event;
        if let Some(data) = event.data {
            for (bytes, to) in [
                (data.stdout, &self.out),
                (data.pty, &self.out),
                (data.stderr, &self.err),
            ] {
                if let Some(bytes) = bytes.filter(|b| !b.is_empty()) {
                    let _ = to.send(bytes);
                }
            }
        }
        event.end.map(|end| exit_of(&end))
    }
}

/// An exit as envd reports it: a code, or a signal named as Go names them.
fn exit_of(end: &EndEvent) -> ExitStatus {
    if end.exited {
        return ExitStatus::exited(end.exit_code);
    }
    let name = end.status.strip_prefix("signal: ").unwrap_or(&end.status);
    let signal = match name {
        "hangup" => 1,
        "interrupt" => 2,
        "quit" => 3,
        "aborted" => 6,
        "killed" => 9,
        "user defined signal 1" => 10,
        "segmentation fault" => 11,
        "user defined signal 2" => 12,
        "broken pipe" => 13,
        "alarm clock" => 14,
        "terminated" => 15,
        other => other
            .strip_prefix("signal ")
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(9),
    };
    ExitStatus::signaled(signal)
}

async fn signal(envd: &EnvdClient, pid: u32, signal: i32) -> Result<()> {
    let request = SendSignalRequest {
        process: ProcessSelector::pid(pid),
        signal,
    };
    match envd
        .unary::<_, serde_json::Value>("process.Process/SendSignal", &request)
        .await
    {
        Ok(_) => Ok(()),
        // Ended already.
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// The handle's side: waiting on the router, signals and resizes through envd.
struct EnvdProcess {
    envd: EnvdClient,
    pid: u32,
    status: watch::Receiver<Option<Ending>>,
    pty: bool,
}

#[async_trait]
impl ProcessControl for EnvdProcess {
    async fn wait(&mut self) -> Result<ExitStatus> {
        let ending = self
            .status
            .wait_for(Option::is_some)
            .await
            .map_err(|_| Error::new(ErrorKind::Backend, "the command's router is gone"))?
            .clone();
        match ending {
            Some(Ok(status)) => Ok(status),
            Some(Err((kind, message))) => Err(Error::new(kind, message)),
            None => Err(Error::new(ErrorKind::Backend, "the command's end was lost")),
        }
    }

    async fn kill(&mut self) -> Result<()> {
        if self.status.borrow().is_some() {
            return Ok(());
        }
        signal(&self.envd, self.pid, 9).await
    }

    async fn signal(&mut self, number: i32) -> Result<()> {
        if self.status.borrow().is_some() {
            return Ok(());
        }
        signal(&self.envd, self.pid, number).await
    }

    async fn resize(&mut self, size: TerminalSize) -> Result<()> {
        if !self.pty {
            return Err(Error::invalid_input(
                "the process has no terminal: exec it with ExecRequest::pty",
            ));
        }
        size.validate()?;
        if self.status.borrow().is_some() {
            return Ok(());
        }
        let request = UpdateRequest {
            process: ProcessSelector::pid(self.pid),
            pty: Some(Pty {
                size: Some(PtySize {
                    cols: u32::from(size.cols),
                    rows: u32::from(size.rows),
                }),
            }),
        };
        match self
            .envd
            .unary::<_, serde_json::Value>("process.Process/Update", &request)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// Files over exec through envd: a command run to its end, its output gathered as
/// text (what [`ExecFiles`](crate::exec_files::ExecFiles) needs).
#[derive(Debug)]
pub(crate) struct BufferedEnvd {
    /// Each sandbox's envd client, looked up by id.
    pub(crate) lookup: std::sync::Arc<dyn EnvdLookup>,
}

/// Finds the envd client of a sandbox.
#[async_trait]
pub(crate) trait EnvdLookup: Send + Sync + std::fmt::Debug {
    /// The client of sandbox `id` and the directory its commands start in.
    async fn envd_of(&self, id: &str) -> Result<(EnvdClient, String)>;
}

#[async_trait]
impl crate::exec_files::BufferedExec for BufferedEnvd {
    async fn exec(&self, id: &str, body: &ExecBody) -> Result<ExecResponse> {
        let (envd, cwd) = self.lookup.envd_of(id).await?;
        let mut request = ExecRequest::new(body.command.clone());
        request.stdin = Some(Bytes::from(body.stdin.clone().unwrap_or_default()));
        request.timeout = body.timeout.map(Duration::from_secs);
        let output = start(&envd, request, cwd)
            .await?
            .collect(usize::MAX)
            .await?;
        let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
        Ok(ExecResponse {
            exit_code: output.status.code,
            exit_signal: output.status.signal,
            stdout: text(&output.stdout),
            stderr: text(&output.stderr),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn end(exited: bool, code: i32, status: &str) -> EndEvent {
        EndEvent {
            exit_code: code,
            exited,
            status: status.to_owned(),
            error: None,
        }
    }

    #[test]
    fn exits_read_back_as_codes_and_signals() {
        assert_eq!(
            exit_of(&end(true, 3, "exit status 3")),
            ExitStatus::exited(3)
        );
        for (status, signal) in [
            ("signal: killed", 9),
            ("signal: terminated", 15),
            ("signal: interrupt", 2),
            ("signal: hangup", 1),
            ("signal: signal 40", 40),
        ] {
            assert_eq!(
                exit_of(&end(false, -1, status)),
                ExitStatus::signaled(signal),
                "{status}"
            );
        }
        // Something unreadable is still an end by a signal, never a success.
        assert_eq!(exit_of(&end(false, -1, "???")), ExitStatus::signaled(9));
    }
}
