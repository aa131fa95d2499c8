//! A command run through the wire: its output streams, credited as the caller reads,
//! its stdin, and the control a [`Process`] holds.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use async_trait::async_trait;
use bytes::Bytes;
use futures::{Stream, StreamExt};
use tokio::io::AsyncWrite;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::PollSemaphore;

use super::super::frame::{self, Frame, Kind, ERR, MAIN};
use super::super::mux::{Charge, Mux};
use super::super::proto::{self, WireError};
use super::Request;
use crate::backend::ByteStream;
use crate::error::{Error, Result};
use crate::exec::{ExitStatus, TerminalSize};
use crate::process::{Process, ProcessControl, ProcessStdin};

/// The [`Process`] of a started command whose reply (`output_limit`) was read.
pub(super) fn assemble(
    req: Request,
    stdin_bytes: Option<Bytes>,
    pty: bool,
    output_limit: Option<usize>,
) -> Process {
    let (mux, id) = (Arc::clone(&req.mux), req.id);
    let (out_tx, out_rx) = mpsc::unbounded_channel();
    let (err_tx, err_rx) = mpsc::unbounded_channel();
    let (status_tx, status_rx) = watch::channel(None);
    tokio::spawn(route_process_frames(req, out_tx, err_tx, status_tx));
    let stdin: Option<ProcessStdin> = match stdin_bytes {
        // Given bytes are written, then stdin is closed, as on every backend.
        Some(bytes) => {
            let mux = Arc::clone(&mux);
            tokio::spawn(async move {
                if mux.send_data(id, MAIN, bytes).await.is_ok() {
                    let _ = mux.send_end(id, MAIN);
                }
            });
            None
        }
        None => Some(Box::pin(StdinWriter::new(Arc::clone(&mux), id))),
    };
    let control = WireProcess {
        mux: Arc::clone(&mux),
        id,
        status: status_rx,
        pty,
    };
    Process::new(
        Box::new(control),
        stdin,
        output_stream(Arc::clone(&mux), id, MAIN, out_rx),
        output_stream(mux, id, ERR, err_rx),
    )
    .with_output_limit(output_limit)
}

/// Output on its way to the caller, with its count in the connection's bound on data
/// taken and not yet used: an agent's tiny frames the caller does not read are
/// bounded too.
type Output = Result<(Bytes, Charge)>;

async fn route_process_frames(
    mut req: Request,
    out: mpsc::UnboundedSender<Output>,
    err: mpsc::UnboundedSender<Output>,
    status: watch::Sender<Option<std::result::Result<ExitStatus, String>>>,
) {
    let (mut out, mut err) = (Some(out), Some(err));
    let failure = loop {
        match req.rx.recv_charged().await {
            Some((f, charge)) => match f.kind {
                Kind::Data => {
                    // A dropped reader means "discard": the stream granted unlimited credit.
                    if let Some(tx) = &out {
                        let _ = tx.send(Ok((f.payload, charge)));
                    }
                }
                Kind::DataErr => {
                    if let Some(tx) = &err {
                        let _ = tx.send(Ok((f.payload, charge)));
                    }
                }
                Kind::End if f.tag() == ERR => err = None,
                Kind::End => out = None,
                Kind::Exit => match proto::decode::<ExitStatus>(&f.payload, "exit status") {
                    Ok(s) => {
                        let _ = status.send(Some(Ok(s)));
                        return;
                    }
                    Err(e) => break e,
                },
                Kind::Abort => match proto::decode::<WireError>(&f.payload, "abort") {
                    Ok(e) => break Error::from(e),
                    Err(e) => break e,
                },
                other => break frame::protocol(format_args!("{other:?} frame for a process")),
            },
            None => break req.lost(),
        }
    };
    for tx in [out, err].into_iter().flatten() {
        let _ = tx.send(Err(Error::new(failure.kind(), failure.to_string())));
    }
    let _ = status.send(Some(Err(failure.to_string())));
}

/// An output stream that grants the agent credit as the caller takes chunks, and
/// unlimited credit once the caller drops it (so the process never blocks on it).
struct CreditedStream {
    mux: Arc<Mux>,
    id: u64,
    tag: u8,
    rx: mpsc::UnboundedReceiver<Output>,
}

impl Stream for CreditedStream {
    type Item = Result<Bytes>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let item = self.rx.poll_recv(cx);
        if let Poll::Ready(Some(Ok((chunk, _)))) = &item {
            self.mux.grant(self.id, self.tag, chunk.len());
        }
        // The chunk's count goes with it, as it is handed over.
        item.map(|item| item.map(|output| output.map(|(chunk, _charge)| chunk)))
    }
}

impl Drop for CreditedStream {
    fn drop(&mut self) {
        self.mux.grant(self.id, self.tag, u32::MAX as usize);
    }
}

fn output_stream(
    mux: Arc<Mux>,
    id: u64,
    tag: u8,
    rx: mpsc::UnboundedReceiver<Output>,
) -> ByteStream {
    CreditedStream { mux, id, tag, rx }.boxed()
}

/// The process's stdin: data frames within the agent's credit; dropping it (or
/// `shutdown`) closes stdin.
struct StdinWriter {
    mux: Arc<Mux>,
    id: u64,
    credit: Option<PollSemaphore>,
    ended: bool,
}

impl StdinWriter {
    fn new(mux: Arc<Mux>, id: u64) -> Self {
        StdinWriter {
            mux,
            id,
            credit: None,
            ended: false,
        }
    }
}

impl AsyncWrite for StdinWriter {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.ended {
            return Poll::Ready(Err(std::io::ErrorKind::BrokenPipe.into()));
        }
        let n = buf.len().min(frame::CHUNK);
        if n == 0 {
            return Poll::Ready(Ok(0));
        }
        let (mux, id) = (Arc::clone(&self.mux), self.id);
        let credit = self.credit.get_or_insert_with(|| {
            PollSemaphore::new(mux.credit(id, MAIN).unwrap_or_else(|| {
                let closed = Arc::new(tokio::sync::Semaphore::new(0));
                closed.close();
                closed
            }))
        });
        match credit.poll_acquire_many(cx, n as u32) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(None) => Poll::Ready(Err(std::io::ErrorKind::BrokenPipe.into())),
            Poll::Ready(Some(permit)) => {
                permit.forget();
                match mux.send(Frame::new(
                    Kind::Data,
                    id,
                    Bytes::copy_from_slice(&buf[..n]),
                )) {
                    Ok(()) => Poll::Ready(Ok(n)),
                    Err(e) => Poll::Ready(Err(e.into_io())),
                }
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        if !self.ended {
            self.ended = true;
            let _ = self.mux.send_end(self.id, MAIN);
        }
        Poll::Ready(Ok(()))
    }
}

impl Drop for StdinWriter {
    fn drop(&mut self) {
        if !self.ended {
            let _ = self.mux.send_end(self.id, MAIN);
        }
    }
}

/// Wait and kill for a process started over the wire.
struct WireProcess {
    mux: Arc<Mux>,
    id: u64,
    status: watch::Receiver<Option<std::result::Result<ExitStatus, String>>>,
    /// Whether it runs on a terminal (resizes are sent without an answer).
    pty: bool,
}

#[async_trait]
impl ProcessControl for WireProcess {
    async fn wait(&mut self) -> Result<ExitStatus> {
        let status =
            self.status.wait_for(Option::is_some).await.map_err(|_| {
                Error::new(crate::ErrorKind::Unavailable, "the process router stopped")
            })?;
        match status.as_ref() {
            Some(Ok(s)) => Ok(*s),
            Some(Err(message)) => Err(Error::new(crate::ErrorKind::Unavailable, message.clone())),
            None => Err(Error::new(crate::ErrorKind::Backend, "no exit status")),
        }
    }

    async fn kill(&mut self) -> Result<()> {
        if self.status.borrow().is_none() {
            // A connection that is gone took the process with it (the agent kills it).
            let _ = self.mux.send(Frame::new(Kind::Kill, self.id, Bytes::new()));
        }
        Ok(())
    }

    async fn signal(&mut self, signal: i32) -> Result<()> {
        if self.status.borrow().is_none() {
            self.mux.send(Frame::new(
                Kind::Signal,
                self.id,
                signal.to_be_bytes().to_vec(),
            ))?;
        }
        Ok(())
    }

    async fn resize(&mut self, size: TerminalSize) -> Result<()> {
        if !self.pty {
            return Err(Error::invalid_input(
                "the process has no terminal: exec it with ExecRequest::pty",
            ));
        }
        if self.status.borrow().is_none() {
            let mut payload = size.rows.to_be_bytes().to_vec();
            payload.extend_from_slice(&size.cols.to_be_bytes());
            self.mux.send(Frame::new(Kind::Resize, self.id, payload))?;
        }
        Ok(())
    }
}
