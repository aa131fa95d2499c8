//! [`serve`]: the agent side, one sandbox of a backend behind a connection.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, OwnedSemaphorePermit};

use super::frame::{Frame, Kind, ERR, MAIN};
use super::mux::{Inbound, Mux};
use super::proto::{self, Call, Reply, WireError};
pub use super::serve_options::{PublicErrors, ServeOptions};

use crate::backend::{ByteStream, SandboxBackend};
use crate::error::{Error, ErrorKind, Result};
use crate::raw::budget::Reservation;
use crate::raw::{read_at_most, read_within};
use crate::sandbox::SandboxId;

/// Serves sandbox `sandbox` of `backend` to one [`WireClient`](super::WireClient) over a
/// connection, until the client closes it, with the default [`ServeOptions`].
///
/// Returns once the connection has ended and every request it started has finished.
/// A command still running when the connection ends is killed: nobody is left to read
/// its result.
pub async fn serve<R, W>(
    backend: Arc<dyn SandboxBackend>,
    sandbox: SandboxId,
    reader: R,
    writer: W,
) -> Result<()>
where
    R: AsyncRead + Send + Unpin + 'static,
    W: AsyncWrite + Send + Unpin + 'static,
{
    serve_with(ServeOptions::default(), backend, sandbox, reader, writer).await
}

/// [`serve`] with the bounds of `options`.
pub async fn serve_with<R, W>(
    options: ServeOptions,
    backend: Arc<dyn SandboxBackend>,
    sandbox: SandboxId,
    reader: R,
    writer: W,
) -> Result<()>
where
    R: AsyncRead + Send + Unpin + 'static,
    W: AsyncWrite + Send + Unpin + 'static,
{
    // Every handler holds a sender; `recv` returns `None` once all have finished.
    let (alive, mut all_done) = mpsc::channel::<()>(1);
    let on_call: super::mux::OnCall = Box::new(move |mux, frame, rx| {
        let (backend, sandbox, alive) = (Arc::clone(&backend), sandbox.clone(), alive.clone());
        let options = options.clone();
        tokio::spawn(async move {
            let id = frame.id;
            handle(&options, &*backend, &sandbox, &mux, frame, rx).await;
            mux.close(id);
            drop(alive);
        });
    });
    let mux = Mux::start(reader, writer, Some(on_call));
    mux.wait_closed().await;
    drop(mux);
    let _ = all_done.recv().await;
    Ok(())
}

async fn handle(
    options: &ServeOptions,
    backend: &dyn SandboxBackend,
    sandbox: &SandboxId,
    mux: &Arc<Mux>,
    frame: Frame,
    rx: Inbound,
) {
    let id = frame.id;
    let public = &options.public_errors;
    let reply = |result: Result<serde_json::Value>| {
        let _ = mux.send(Frame::new(
            Kind::Reply,
            id,
            proto::encode(&public.reply(result)),
        ));
    };
    let call: Call = match proto::decode_call(&frame.payload) {
        Ok(call) => call,
        Err(e) => return reply(Err(e)),
    };
    // What the call says is kept, not how the client padded it.
    drop(frame);
    let call = match call.serve_simple(backend, sandbox).await {
        Ok(result) => return reply(result),
        Err(streamed) => streamed,
    };
    fn value<T: serde::Serialize>(r: Result<T>) -> Result<serde_json::Value> {
        r.and_then(|v| {
            serde_json::to_value(v)
                .map_err(|e| Error::new(ErrorKind::Backend, format!("encoding a reply: {e}")))
        })
    }
    match call {
        Call::Exec { request } => {
            let slot = options.command_slot();
            exec(backend, sandbox, mux, id, (request, slot), rx, public).await;
        }
        Call::Read { path } => {
            // Held until the last byte is queued: `send_data` queues copies, so
            // nothing of the file outlives it.
            let read = match &options.budget {
                Some(budget) => {
                    read_within(backend, sandbox, &path, options.max_file_bytes, budget)
                        .await
                        .map(|(data, held)| (Some(held), data))
                }
                None => read_at_most(backend, sandbox, &path, options.max_file_bytes)
                    .await
                    .map(|data| (None, data)),
            };
            match read {
                Ok((_held, data)) => {
                    reply(Ok(serde_json::Value::Null));
                    if mux.send_data(id, MAIN, data).await.is_ok() {
                        let _ = mux.send_end(id, MAIN);
                    }
                }
                Err(e) => reply(Err(e)),
            }
        }
        Call::Write { path } => {
            let mut data = BytesMut::new();
            let mut body = incoming(Arc::clone(mux), id, rx);
            let mut result = Ok(());
            let mut held = options.reserve(0).ok().flatten();
            while let Some(chunk) = body.next().await {
                let grown = match (&mut held, &options.budget, &chunk) {
                    (Some(held), Some(budget), Ok(chunk)) => held.grow(budget, chunk.len() as u64),
                    _ => Ok(()),
                };
                if let Err(e) = grown {
                    result = Err(e);
                    break;
                }
                match chunk {
                    Ok(chunk) if (data.len() + chunk.len()) as u64 > options.max_file_bytes => {
                        result = Err(Error::new(
                            ErrorKind::LimitExceeded,
                            format!(
                                "writing {path}: the file is larger than the {} bytes this server accepts",
                                options.max_file_bytes
                            ),
                        ));
                        break;
                    }
                    Ok(chunk) => data.extend_from_slice(&chunk),
                    Err(e) => {
                        result = Err(e);
                        break;
                    }
                }
            }
            drop(body);
            let result = match result {
                Ok(()) => backend.write(sandbox, &path, data.freeze()).await,
                Err(e) => Err(e),
            };
            drop(held);
            reply(value(result));
        }
        // Streamed: a listing of up to `MAX_DIR_ENTRIES` is far over one frame.
        Call::ListDir { path } => match list_within(options, backend, sandbox, &path).await {
            Ok((_held, json)) => {
                reply(Ok(serde_json::Value::Null));
                if mux.send_data(id, MAIN, json.into()).await.is_ok() {
                    let _ = mux.send_end(id, MAIN);
                }
            }
            Err(e) => reply(Err(e)),
        },
        Call::ExportTar { path } => {
            let slot = options.stream_slot();
            let exported = match slot {
                Ok(_) => backend.export_tar(sandbox, &path).await,
                Err(e) => Err(e),
            };
            match exported {
                Ok(tar) => {
                    reply(Ok(serde_json::Value::Null));
                    send_stream(mux, id, tar, rx, public).await;
                }
                Err(e) => reply(Err(e)),
            }
        }
        Call::ImportTar {
            path,
            options: mut import,
        } => {
            import.limits = import.limits.at_most(&options.archive_limits);
            let result = match options.stream_slot() {
                Ok(_slot) => {
                    let tar = incoming(Arc::clone(mux), id, rx);
                    backend.import_tar(sandbox, &path, tar, import).await
                }
                Err(e) => Err(e),
            };
            reply(value(result));
        }
        Call::ExportChanges => {
            let slot = options.stream_slot();
            let changes = match slot {
                Ok(_) => backend.export_changes(sandbox).await,
                Err(e) => Err(e),
            };
            match changes {
                Ok(changes) => {
                    reply(value(Ok(changes.deleted)));
                    send_stream(mux, id, changes.tar, rx, public).await;
                }
                Err(e) => reply(Err(e)),
            }
        }
        Call::Watch {
            path,
            options: watch,
        } => {
            // Held until the watch ends.
            let slot = options.watch_slot();
            let watching = match slot {
                Ok(_) => backend.watch(sandbox, &path, watch).await,
                Err(e) => Err(e),
            };
            match watching {
                Ok(events) => {
                    reply(Ok(serde_json::Value::Null));
                    send_events(mux, id, events, rx, public).await;
                }
                Err(e) => reply(Err(e)),
            }
        }
        // The simple calls are served above (`Call::serve_simple`), where a new one is
        // added; the conformance suite, run through `testing::WireLoop`, finds one
        // that is in neither place.
        other => reply(Err(Error::unsupported(format!(
            "this wire server does not serve {other:?}"
        )))),
    }
}

/// Lists `path` as the data of a `ListDir` reply, held within the budget until it is
/// sent: the worst case is taken before the directory is read (the listing is in
/// memory before it can be counted), and given back down to what it encodes to.
async fn list_within(
    options: &ServeOptions,
    backend: &dyn SandboxBackend,
    sandbox: &SandboxId,
    path: &crate::SandboxPath,
) -> Result<(Option<Reservation>, Vec<u8>)> {
    let worst = proto::MAX_LISTING_WIRE_BYTES as u64;
    let reserved = options.budget.as_ref().map_or(0, |b| worst.min(b.bytes()));
    let mut held = options.reserve(reserved)?;
    let entries = backend.list_dir(sandbox, path).await?;
    let json = proto::encode_listing(path, &entries)?;
    drop(entries);
    if let (Some(held), Some(budget)) = (&mut held, &options.budget) {
        let size = json.len() as u64;
        match size.checked_sub(reserved) {
            Some(more) => held.grow(budget, more)?,
            None => held.shrink_to(size),
        }
    }
    Ok((held, json))
}

/// Sends a watch's events as JSON lines until the watch ends (then `End`, or `Abort` on
/// an error) or the client sends `Kill` or goes. While the client does not read, the
/// credit runs out and the backend's own bounded buffer overflows, not this one.
async fn send_events(
    mux: &Mux,
    id: u64,
    mut events: crate::WatchStream,
    mut rx: Inbound,
    public: &PublicErrors,
) {
    // Any frame from the client (its `Kill`) or its going away ends the watch.
    let mut stopped = std::pin::pin!(async move {
        let _ = rx.recv().await;
    });
    loop {
        let next = tokio::select! {
            next = events.next() => next,
            () = &mut stopped => return,
        };
        let sent = match next {
            Some(Ok(event)) => {
                let mut line = proto::encode(&event);
                line.push(b'\n');
                tokio::select! {
                    sent = mux.send_data(id, MAIN, Bytes::from(line)) => sent,
                    () = &mut stopped => return,
                }
            }
            Some(Err(e)) => {
                let _ = mux.send(Frame::new(Kind::Abort, id, proto::encode(&public.wire(&e))));
                return;
            }
            None => {
                let _ = mux.send_end(id, MAIN);
                return;
            }
        };
        if sent.is_err() {
            return;
        }
    }
}

/// The client's data frames for request `id` as a byte stream, granting credit as
/// chunks are taken. Ends at `End`; an `Abort` or a lost connection is an error item.
fn incoming(mux: Arc<Mux>, id: u64, rx: Inbound) -> ByteStream {
    futures::stream::unfold(Some((mux, rx)), move |state| async move {
        let (mux, mut rx) = state?;
        match rx.recv().await {
            Some(f) if f.kind == Kind::Data => {
                mux.grant(id, MAIN, f.payload.len());
                Some((Ok(f.payload), Some((mux, rx))))
            }
            Some(f) if f.kind == Kind::End => None,
            Some(f) if f.kind == Kind::Abort => {
                let e = proto::decode::<WireError>(&f.payload, "abort")
                    .map(Error::from)
                    .unwrap_or_else(|e| e);
                Some((Err(e), None))
            }
            Some(f) => Some((
                Err(super::frame::protocol(format_args!(
                    "{:?} frame in a data stream",
                    f.kind
                ))),
                None,
            )),
            None => Some((
                Err(Error::new(
                    ErrorKind::Unavailable,
                    "the client went away mid-upload",
                )),
                None,
            )),
        }
    })
    .boxed()
}

/// Sends a byte stream as data frames and an `End`, or an `Abort` if it fails.
/// Sends `stream` as request `id`'s data, until its end, or until the client kills
/// the request (it dropped the stream: the producer is dropped with it, and a thread
/// of the host's that an export holds is free at once).
async fn send_stream(
    mux: &Mux,
    id: u64,
    mut stream: ByteStream,
    mut rx: Inbound,
    public: &PublicErrors,
) {
    // What comes for the request while it streams: only a kill (or its end) matters.
    async fn killed(rx: &mut Inbound) {
        while let Some(frame) = rx.recv().await {
            if frame.kind == Kind::Kill {
                return;
            }
        }
    }
    loop {
        let chunk = tokio::select! {
            chunk = stream.next() => chunk,
            () = killed(&mut rx) => return,
        };
        let sent = match chunk {
            None => break,
            Some(Ok(chunk)) => tokio::select! {
                sent = mux.send_data(id, MAIN, chunk) => sent,
                () = killed(&mut rx) => return,
            },
            Some(Err(e)) => {
                let _ = mux.send(Frame::new(Kind::Abort, id, proto::encode(&public.wire(&e))));
                return;
            }
        };
        if sent.is_err() {
            return;
        }
    }
    let _ = mux.send_end(id, MAIN);
}

async fn exec(
    backend: &dyn SandboxBackend,
    sandbox: &SandboxId,
    mux: &Arc<Mux>,
    id: u64,
    (request, slot): (crate::ExecRequest, Result<Option<OwnedSemaphorePermit>>),
    mut rx: Inbound,
    public: &PublicErrors,
) {
    let started = match slot {
        Ok(slot) => backend
            .exec(sandbox, request)
            .await
            .map(|process| match slot {
                // Held until the command ends, whether or not this call is left.
                Some(slot) => crate::raw::hold_until_exit(process, slot),
                None => process,
            }),
        Err(e) => Err(e),
    };
    let mut process = match started {
        Ok(process) => process,
        Err(e) => {
            let reply = public.reply::<()>(Err(e));
            let _ = mux.send(Frame::new(Kind::Reply, id, proto::encode(&reply)));
            return;
        }
    };
    let reply = Reply::from_result(Ok(process.output_limit()));
    let _ = mux.send(Frame::new(Kind::Reply, id, proto::encode(&reply)));

    let pumps = [
        tokio::spawn(pump(Arc::clone(mux), id, MAIN, process.take_stdout())),
        tokio::spawn(pump(Arc::clone(mux), id, ERR, process.take_stderr())),
    ];
    // Stdin is fed from its own task, so a command that never reads it cannot stop
    // kill requests from being handled.
    // Each chunk keeps its count in the connection's bound until it is written: a
    // client's tiny frames for a command that reads nothing are bounded too.
    let (stdin_tx, mut stdin_rx) = mpsc::unbounded_channel::<(Bytes, super::mux::Charge)>();
    if let Some(mut stdin) = process.take_stdin() {
        let mux = Arc::clone(mux);
        tokio::spawn(async move {
            while let Some((chunk, _charge)) = stdin_rx.recv().await {
                if stdin.write_all(&chunk).await.is_err() {
                    break;
                }
                mux.grant(id, MAIN, chunk.len());
            }
            let _ = stdin.shutdown().await;
        });
    }
    let mut stdin_tx = Some(stdin_tx);
    let mut connected = true;
    let status = loop {
        tokio::select! {
            status = process.wait() => break status,
            frame = rx.recv_charged(), if connected => match frame {
                Some((f, charge)) if f.kind == Kind::Data => {
                    if let Some(tx) = &stdin_tx {
                        let _ = tx.send((f.payload, charge));
                    }
                }
                Some((f, _)) if f.kind == Kind::End || f.kind == Kind::Abort => stdin_tx = None,
                Some((f, _)) if f.kind == Kind::Kill => {
                    let _ = process.kill().await;
                }
                Some((f, _)) if f.kind == Kind::Resize && f.payload.len() == 4 => {
                    let size = crate::TerminalSize::new(
                        u16::from_be_bytes([f.payload[0], f.payload[1]]),
                        u16::from_be_bytes([f.payload[2], f.payload[3]]),
                    );
                    if let Err(e) = process.resize(size).await {
                        tracing::debug!(error = %e, "resize not applied");
                    }
                }
                Some((f, _)) if f.kind == Kind::Signal && f.payload.len() == 4 => {
                    let mut n = [0u8; 4];
                    n.copy_from_slice(&f.payload);
                    if let Err(e) = process.signal(i32::from_be_bytes(n)).await {
                        tracing::debug!(error = %e, "signal not delivered");
                    }
                }
                Some(_) => {}
                None => {
                    // The client is gone: nobody will read the result.
                    connected = false;
                    stdin_tx = None;
                    let _ = process.kill().await;
                }
            }
        }
    };
    drop(stdin_tx);
    for pump in pumps {
        let _ = pump.await;
    }
    let frame = match status {
        Ok(status) => Frame::new(Kind::Exit, id, proto::encode(&status)),
        Err(e) => Frame::new(Kind::Abort, id, proto::encode(&public.wire(&e))),
    };
    let _ = mux.send(frame);
}

/// Copies one output stream to the client; keeps draining if the client is gone so the
/// process never blocks on a full pipe.
async fn pump(mux: Arc<Mux>, id: u64, tag: u8, stream: Option<ByteStream>) {
    let Some(mut stream) = stream else {
        let _ = mux.send_end(id, tag);
        return;
    };
    let mut connected = true;
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(chunk) if connected => {
                connected = mux.send_data(id, tag, chunk).await.is_ok();
            }
            Ok(_) => {}
            Err(e) => {
                tracing::debug!(error = %e, "process output stream failed");
                break;
            }
        }
    }
    if connected {
        let _ = mux.send_end(id, tag);
    }
}
