//! Commands over sandcell-server's streaming exec: the event stream split into stdout,
//! stderr and the exit status; stdin, signals and kill as calls naming the process.

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::channel::mpsc;
use futures::{SinkExt, StreamExt};
use reqwest::Method;
use sandcell::{Error, ErrorKind, ExecRequest, ExitStatus, Process, ProcessControl, Result};
use tokio::io::AsyncReadExt;
use tokio::sync::watch;

use crate::http::{transport_error, Body, Call, Http};
use crate::protocol::{ExecEvent, SignalBody, StreamExecBody, B64};

/// Largest stdin chunk sent in one call.
const STDIN_CHUNK: usize = 64 << 10;

/// Starts `request` on machine `machine_path` (`/v1/apps/{app}/machines/{id}`).
pub(crate) async fn start(
    http: Arc<Http>,
    machine_path: String,
    mut request: ExecRequest,
) -> Result<Process> {
    let stdin = request.stdin.take();
    let open_stdin = stdin.is_none();
    let body = StreamExecBody {
        request,
        stdin: stdin.map(B64),
    };
    let path = format!("{machine_path}/sandcell/exec");
    let what = format!("POST {path}");
    let body = serde_json::to_value(&body)
        .map_err(|e| Error::with_source(ErrorKind::Backend, "encoding a command", e))?;
    // A POST is not retried: a lost answer may mean the command ran.
    let response = http
        .send(Call::extension(Method::POST, path, Body::Json(&body)))
        .await?;
    let mut lines = ndjson(response);
    let (process, output_limit) = match lines.next().await {
        Some(Ok(ExecEvent::Started {
            process,
            output_limit,
        })) => (process, output_limit),
        Some(Ok(ExecEvent::Error(e))) => return Err(error_of(e)),
        Some(Err(e)) => return Err(e),
        _ => {
            return Err(Error::new(
                ErrorKind::Backend,
                format!("{what}: the stream did not start with the process id"),
            ))
        }
    };
    let (mut out_tx, out_rx) = mpsc::channel::<Result<Bytes>>(16);
    let (mut err_tx, err_rx) = mpsc::channel::<Result<Bytes>>(16);
    let (status_tx, status_rx) = watch::channel::<Option<Result<ExitStatus, Failure>>>(None);
    tokio::spawn(async move {
        let mut end = None;
        while let Some(event) = lines.next().await {
            match event {
                Ok(ExecEvent::Stdout(B64(data))) => {
                    let _ = out_tx.send(Ok(data)).await;
                }
                Ok(ExecEvent::Stderr(B64(data))) => {
                    let _ = err_tx.send(Ok(data)).await;
                }
                Ok(ExecEvent::Exit(status)) => {
                    end = Some(Ok(status));
                    break;
                }
                Ok(ExecEvent::Error(e)) => {
                    end = Some(Err(error_of(e)));
                    break;
                }
                Ok(ExecEvent::Started { .. }) => {}
                Err(e) => {
                    end = Some(Err(e));
                    break;
                }
            }
        }
        let end = end.unwrap_or_else(|| {
            Err(Error::new(
                ErrorKind::Unavailable,
                "the connection ended before the command's exit status arrived",
            ))
        });
        let end = end.map_err(|e| Failure(e.kind(), e.to_string()));
        if let Err(failure) = &end {
            let _ = out_tx.send(Err(failure.error())).await;
        }
        drop((out_tx, err_tx));
        let _ = status_tx.send(Some(end));
    });
    let process_path = format!("{machine_path}/sandcell/processes/{process}");
    let stdin_writer = if open_stdin {
        Some(stdin_pipe(
            Arc::clone(&http),
            format!("{process_path}/stdin"),
        ))
    } else {
        None
    };
    let control = Remote {
        http,
        path: process_path,
        status: status_rx,
    };
    Ok(Process::new(
        Box::new(control),
        stdin_writer,
        out_rx.boxed(),
        err_rx.boxed(),
    )
    .with_output_limit(output_limit))
}

/// An error event as an [`Error`].
fn error_of(body: crate::protocol::ErrorBody) -> Error {
    let kind = body
        .kind
        .as_deref()
        .and_then(ErrorKind::from_name)
        .unwrap_or(ErrorKind::Backend);
    Error::new(kind, body.error)
}

/// The response body split into events, one per line.
fn ndjson(response: reqwest::Response) -> futures::stream::BoxStream<'static, Result<ExecEvent>> {
    let bytes = response.bytes_stream();
    futures::stream::unfold(
        (bytes, Vec::<u8>::new()),
        |(mut bytes, mut buffer)| async move {
            loop {
                if let Some(newline) = buffer.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = buffer.drain(..=newline).collect();
                    let event = serde_json::from_slice::<ExecEvent>(&line).map_err(|e| {
                        Error::with_source(ErrorKind::Backend, "a malformed exec event", e)
                    });
                    return Some((event, (bytes, buffer)));
                }
                match bytes.next().await {
                    Some(Ok(chunk)) => buffer.extend_from_slice(&chunk),
                    Some(Err(e)) => {
                        let error = transport_error("reading a command's output", &e);
                        return Some((Err(error), (bytes, Vec::new())));
                    }
                    None => return None,
                }
            }
        },
    )
    .boxed()
}

/// A writer whose bytes are posted, in order, to the process's stdin; dropping it
/// closes stdin.
fn stdin_pipe(http: Arc<Http>, path: String) -> sandcell::ProcessStdin {
    let (writer, mut reader) = tokio::io::duplex(STDIN_CHUNK);
    tokio::spawn(async move {
        let mut buffer = vec![0u8; STDIN_CHUNK];
        loop {
            let n = match reader.read(&mut buffer).await {
                Ok(0) | Err(_) => 0,
                Ok(n) => n,
            };
            let close = n == 0;
            let url = if close {
                format!("{path}?close=true")
            } else {
                path.clone()
            };
            let sent = http
                .request(Method::POST, &url)
                .body(Bytes::copy_from_slice(&buffer[..n]))
                .send()
                .await;
            let ok = matches!(&sent, Ok(r) if r.status().is_success());
            if close || !ok {
                // A process that ended or closed its stdin takes no more; dropping the
                // reader makes further writes fail, as a closed pipe does.
                return;
            }
        }
    });
    Box::pin(writer)
}

/// An error kept to be reported more than once.
#[derive(Debug, Clone)]
struct Failure(ErrorKind, String);

impl Failure {
    fn error(&self) -> Error {
        Error::new(self.0, self.1.clone())
    }
}

/// Wait, kill and signal for a streamed command.
struct Remote {
    http: Arc<Http>,
    path: String,
    status: watch::Receiver<Option<Result<ExitStatus, Failure>>>,
}

impl Remote {
    /// Posts `.../kill` or `.../signal`; a process that already ended is fine.
    async fn post(&self, tail: &str, body: Option<SignalBody>) -> Result<()> {
        let value = body.map(|b| serde_json::json!(b));
        let body = value.as_ref().map_or(Body::None, Body::Json);
        let call = Call::extension(Method::POST, format!("{}/{tail}", self.path), body);
        match self.http.send(call).await {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }
}

#[async_trait]
impl ProcessControl for Remote {
    async fn wait(&mut self) -> Result<ExitStatus> {
        // Cancel-safe: the receiver keeps the value; a new call waits again.
        let status = self
            .status
            .wait_for(Option::is_some)
            .await
            .map_err(|_| Error::new(ErrorKind::Backend, "the command's reader went away"))?;
        match status.as_ref() {
            Some(Ok(status)) => Ok(*status),
            Some(Err(failure)) => Err(failure.error()),
            None => Err(Error::new(ErrorKind::Backend, "no exit status")),
        }
    }

    async fn kill(&mut self) -> Result<()> {
        if self.status.borrow().is_some() {
            return Ok(());
        }
        self.post("kill", None).await
    }

    async fn signal(&mut self, signal: i32) -> Result<()> {
        if self.status.borrow().is_some() {
            return Ok(());
        }
        self.post("signal", Some(SignalBody { signal })).await
    }
}

/// A command that already ran (a plain endpoint's buffered exec), as a [`Process`].
pub(crate) fn finished(stdout: Bytes, stderr: Bytes, status: ExitStatus) -> Process {
    let once = |data: Bytes| futures::stream::iter((!data.is_empty()).then_some(Ok(data))).boxed();
    Process::new(Box::new(Finished(status)), None, once(stdout), once(stderr))
}

struct Finished(ExitStatus);

#[async_trait]
impl ProcessControl for Finished {
    async fn wait(&mut self) -> Result<ExitStatus> {
        Ok(self.0)
    }

    async fn kill(&mut self) -> Result<()> {
        Ok(())
    }
}
