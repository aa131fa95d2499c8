//! The multiplexer: many requests over one connection, each with its own frames and
//! per-stream flow control.
//!
//! A reader task routes incoming frames to the request they belong to; a writer task
//! sends outgoing frames in order. Data is credit-based: a side may have at most
//! [`WINDOW`] unacknowledged bytes in flight per stream, and the receiver grants more as
//! its consumer takes chunks, so a slow consumer holds back its producer instead of
//! growing a buffer. A peer that sends more than it was granted, or a malformed frame,
//! ends the connection.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinHandle;

use super::frame::{self, read_frame, Frame, Kind, CHUNK, ERR, MAIN, WINDOW};
use crate::error::{Error, ErrorKind, Result};
use crate::lock_unpoisoned as lock;

/// Bytes of data one connection may have waiting to be written, whatever credit its
/// peer granted: what a caller still holds past this is held, and counted, by it.
const QUEUED_DATA: usize = 1 << 20;

/// Bytes of frames other than data (replies, credits, ends, exits) one connection may
/// have waiting to be written, each counted with [`FRAME_COST`]. A peer that sends
/// calls and never reads would have their replies pile up: past this the connection
/// ends.
const QUEUED_CONTROL: usize = 16 << 20;

/// Bytes of frames one connection may have received and its requests not yet taken,
/// each counted with [`FRAME_COST`]. Data is held back by credit, but a peer can still
/// send small frames, or frames to a request busy elsewhere: past this the connection
/// ends.
const QUEUED_INBOUND: usize = 64 << 20;

/// What a frame costs beyond its payload, in memory here: its header and bookkeeping.
const FRAME_COST: usize = 64;

/// Requests a peer may have open on one connection at once: each holds a task and its
/// state here. Past it the connection ends (a protocol error).
pub(crate) const MAX_OPEN_REQUESTS: usize = 16_384;

/// How long frames still queued when the connection ends may take to be written: a
/// peer that reads nothing must not hold the writer (and the connection) forever.
const WRITE_AFTER_END: std::time::Duration = std::time::Duration::from_secs(5);

/// Called by the reader for a `Call` frame opening a new request (server side).
pub(crate) type OnCall = Box<dyn Fn(Arc<Mux>, Frame, Inbound) + Send + Sync>;

/// The frames a request receives, in order. Each is counted against the connection's
/// [`QUEUED_INBOUND`] until it is taken (or the request goes).
pub(crate) struct Inbound {
    rx: mpsc::UnboundedReceiver<Charged>,
}

impl Inbound {
    /// The next frame; `None` once the request is closed or the connection ended.
    pub(crate) async fn recv(&mut self) -> Option<Frame> {
        self.rx.recv().await.map(|Charged { frame, .. }| frame)
    }

    /// The next frame with its count, for a consumer that passes its data on to be
    /// used later (a process's stdin, a caller's stream): the count holds until the
    /// [`Charge`] is dropped, so data taken but not yet used is bounded too.
    pub(crate) async fn recv_charged(&mut self) -> Option<(Frame, Charge)> {
        self.rx
            .recv()
            .await
            .map(|Charged { frame, charge }| (frame, charge))
    }
}

/// A received frame with its count in [`QUEUED_INBOUND`].
struct Charged {
    frame: Frame,
    charge: Charge,
}

/// Bytes counted in [`QUEUED_INBOUND`], given back on drop.
pub(crate) struct Charge {
    bytes: usize,
    queued: Arc<std::sync::atomic::AtomicUsize>,
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.queued
            .fetch_sub(self.bytes, std::sync::atomic::Ordering::Relaxed);
    }
}

/// What `frame` counts for in [`QUEUED_CONTROL`] and [`QUEUED_INBOUND`].
fn cost(frame: &Frame) -> usize {
    frame.payload.len() + FRAME_COST
}

pub(crate) struct Mux {
    /// Frames to write, each with the bytes of `queued` it holds until written.
    out: mpsc::UnboundedSender<(Frame, u32)>,
    /// Room for data waiting to be written: a peer that grants itself credit and reads
    /// nothing must not have this side queue whatever it asks for.
    queued: Arc<Semaphore>,
    /// Control frames waiting to be written, in bytes (see [`QUEUED_CONTROL`]).
    queued_control: std::sync::atomic::AtomicUsize,
    /// Frames received and not yet taken, in bytes (see [`QUEUED_INBOUND`]).
    queued_inbound: Arc<std::sync::atomic::AtomicUsize>,
    /// Cancelled when the connection ends: the writer then gives what is queued
    /// [`WRITE_AFTER_END`] to go out, and stops, however the peer reads.
    closing: tokio_util::sync::CancellationToken,
    state: Mutex<State>,
    ended: tokio::sync::Notify,
    reader: Mutex<Option<JoinHandle<()>>>,
}

#[derive(Default)]
struct State {
    slots: HashMap<u64, Slot>,
    /// Why the connection ended, once it has.
    closed: Option<String>,
}

struct Slot {
    inbound: mpsc::UnboundedSender<Charged>,
    /// What this side may still send, per stream.
    send_credit: [Arc<Semaphore>; 2],
    /// What the peer may still send, per stream.
    recv_budget: [u64; 2],
}

impl Slot {
    fn new(inbound: mpsc::UnboundedSender<Charged>) -> Self {
        Slot {
            inbound,
            send_credit: [
                Arc::new(Semaphore::new(WINDOW as usize)),
                Arc::new(Semaphore::new(WINDOW as usize)),
            ],
            recv_budget: [u64::from(WINDOW); 2],
        }
    }

    fn close(&self) {
        for credit in &self.send_credit {
            credit.close();
        }
    }
}

impl Drop for Mux {
    fn drop(&mut self) {
        if let Some(reader) = lock(&self.reader).take() {
            reader.abort();
        }
    }
}

impl std::fmt::Debug for Mux {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = lock(&self.state);
        f.debug_struct("Mux")
            .field("requests", &state.slots.len())
            .field("closed", &state.closed)
            .finish()
    }
}

impl Mux {
    /// Starts the reader and writer tasks over a connection. The connection ends when
    /// the peer closes it, on a protocol error, or when the last `Arc<Mux>` is dropped.
    pub(crate) fn start<R, W>(reader: R, writer: W, on_call: Option<OnCall>) -> Arc<Mux>
    where
        R: AsyncRead + Send + Unpin + 'static,
        W: AsyncWrite + Send + Unpin + 'static,
    {
        let (out, rx) = mpsc::unbounded_channel();
        let mux = Arc::new(Mux {
            out,
            queued: Arc::new(Semaphore::new(QUEUED_DATA)),
            queued_control: std::sync::atomic::AtomicUsize::new(0),
            queued_inbound: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            closing: tokio_util::sync::CancellationToken::new(),
            state: Mutex::new(State::default()),
            ended: tokio::sync::Notify::new(),
            reader: Mutex::new(None),
        });
        let closing = mux.closing.clone();
        tokio::spawn(write_loop(Arc::downgrade(&mux), rx, writer, closing));
        let task = tokio::spawn(read_loop(Arc::downgrade(&mux), reader, on_call));
        *lock(&mux.reader) = Some(task);
        mux
    }

    /// The error for work on a connection that has ended.
    fn closed_error(reason: &str) -> Error {
        Error::new(
            ErrorKind::Unavailable,
            format!("the connection to the sandbox agent ended: {reason}"),
        )
    }

    /// The error for a request that can go no further: the connection ended, or (while
    /// it stands) the request itself was closed.
    pub(crate) fn ended_error(&self) -> Error {
        Self::closed_error(self.closed().as_deref().unwrap_or("the request ended"))
    }

    /// Whether the connection has ended, and why.
    pub(crate) fn closed(&self) -> Option<String> {
        lock(&self.state).closed.clone()
    }

    /// Ends the connection: every open request sees its inbound channel close and every
    /// pending send fails.
    pub(crate) fn shutdown(&self, reason: impl Into<String>) {
        let mut state = lock(&self.state);
        if state.closed.is_none() {
            state.closed = Some(reason.into());
        }
        for (_, slot) in state.slots.drain() {
            slot.close();
        }
        drop(state);
        // Nothing more will be written: senders waiting for room fail.
        self.queued.close();
        self.closing.cancel();
        self.ended.notify_waiters();
    }

    /// Waits until the connection has ended.
    pub(crate) async fn wait_closed(&self) {
        loop {
            let notified = self.ended.notified();
            if self.closed().is_some() {
                return;
            }
            notified.await;
        }
    }

    /// Registers request `id` and returns the channel its frames arrive on.
    pub(crate) fn open(&self, id: u64) -> Result<Inbound> {
        let mut state = lock(&self.state);
        if let Some(reason) = &state.closed {
            return Err(Self::closed_error(reason));
        }
        let (tx, rx) = mpsc::unbounded_channel();
        state.slots.insert(id, Slot::new(tx));
        Ok(Inbound { rx })
    }

    /// Forgets request `id`: later frames for it are dropped, pending sends fail.
    pub(crate) fn close(&self, id: u64) {
        if let Some(slot) = lock(&self.state).slots.remove(&id) {
            slot.close();
        }
    }

    /// Queues a frame.
    pub(crate) fn send(&self, frame: Frame) -> Result<()> {
        if let Some(reason) = self.closed() {
            return Err(Self::closed_error(&reason));
        }
        let bytes = cost(&frame);
        let waiting = bytes
            + self
                .queued_control
                .fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
        if waiting > QUEUED_CONTROL {
            let reason = format!(
                "the peer read nothing while {} MiB of replies waited",
                QUEUED_CONTROL >> 20
            );
            self.shutdown(reason.clone());
            return Err(Self::closed_error(&reason));
        }
        self.out
            .send((frame, 0))
            .map_err(|_| Self::closed_error("the writer stopped"))
    }

    /// The credit for sending on stream `tag` of request `id`, if the request is open.
    pub(crate) fn credit(&self, id: u64, tag: u8) -> Option<Arc<Semaphore>> {
        lock(&self.state)
            .slots
            .get(&id)
            .map(|slot| Arc::clone(&slot.send_credit[usize::from(tag & 1)]))
    }

    /// Sends `data` on stream `tag` of request `id`, waiting for credit as needed.
    pub(crate) async fn send_data(&self, id: u64, tag: u8, data: Bytes) -> Result<()> {
        let credit = self.credit(id, tag).ok_or_else(|| self.ended_error())?;
        let kind = if tag == ERR {
            Kind::DataErr
        } else {
            Kind::Data
        };
        let mut offset = 0;
        while offset < data.len() {
            let end = (offset + CHUNK).min(data.len());
            // A copy, not a slice: a slice waiting in the queue would keep all of
            // `data` alive after the caller let it (and its budget) go.
            let chunk = Bytes::copy_from_slice(&data[offset..end]);
            let permit = credit
                .acquire_many(chunk.len() as u32)
                .await
                .map_err(|_| self.ended_error())?;
            permit.forget();
            let room = Arc::clone(&self.queued)
                .acquire_many_owned(chunk.len() as u32)
                .await
                .map_err(|_| self.ended_error())?;
            room.forget();
            if let Some(reason) = self.closed() {
                return Err(Self::closed_error(&reason));
            }
            self.out
                .send((Frame::new(kind, id, chunk), (end - offset) as u32))
                .map_err(|_| Self::closed_error("the writer stopped"))?;
            offset = end;
        }
        Ok(())
    }

    /// Ends stream `tag` of request `id`.
    pub(crate) fn send_end(&self, id: u64, tag: u8) -> Result<()> {
        self.send(Frame::new(Kind::End, id, vec![tag]))
    }

    /// Lets the peer send `n` more bytes on stream `tag` of request `id`.
    pub(crate) fn grant(&self, id: u64, tag: u8, n: usize) {
        let n = u32::try_from(n).unwrap_or(u32::MAX);
        {
            let mut state = lock(&self.state);
            match state.slots.get_mut(&id) {
                Some(slot) => {
                    let budget = &mut slot.recv_budget[usize::from(tag & 1)];
                    *budget = budget.saturating_add(u64::from(n));
                }
                None => return,
            }
        }
        let mut payload = Vec::with_capacity(5);
        payload.push(tag);
        payload.extend_from_slice(&n.to_be_bytes());
        let _ = self.send(Frame::new(Kind::Credit, id, payload));
    }

    /// Routes one incoming frame. An error ends the connection.
    fn dispatch(self: &Arc<Self>, frame: Frame, on_call: Option<&OnCall>) -> Result<()> {
        let mut state = lock(&self.state);
        // Ended: the reader stops, and lets its half of the connection go.
        if let Some(reason) = &state.closed {
            return Err(Self::closed_error(reason));
        }
        match frame.kind {
            Kind::Call => {
                let Some(on_call) = on_call else {
                    return Err(frame::protocol("call frame from the server"));
                };
                if state.slots.contains_key(&frame.id) {
                    return Err(frame::protocol(format_args!(
                        "reuse of request {}",
                        frame.id
                    )));
                }
                if state.slots.len() >= MAX_OPEN_REQUESTS {
                    return Err(frame::protocol(format_args!(
                        "more than {MAX_OPEN_REQUESTS} requests open at once"
                    )));
                }
                let (tx, rx) = mpsc::unbounded_channel();
                state.slots.insert(frame.id, Slot::new(tx));
                drop(state);
                on_call(Arc::clone(self), frame, Inbound { rx });
            }
            Kind::Credit => {
                if frame.payload.len() != 5 {
                    return Err(frame::protocol("credit frame size"));
                }
                let mut n = [0u8; 4];
                n.copy_from_slice(&frame.payload[1..5]);
                let n = u32::from_be_bytes(n) as usize;
                if let Some(slot) = state.slots.get(&frame.id) {
                    let credit = &slot.send_credit[usize::from(frame.tag() & 1)];
                    // The semaphore has a ceiling; "unlimited" grants stop short of it.
                    let room = Semaphore::MAX_PERMITS / 2
                        - credit.available_permits().min(Semaphore::MAX_PERMITS / 2);
                    credit.add_permits(n.min(room));
                }
            }
            Kind::Data | Kind::DataErr => {
                let tag = if frame.kind == Kind::DataErr {
                    ERR
                } else {
                    MAIN
                };
                // Nobody sends empty data; queued, it would cost memory and no credit.
                if frame.payload.is_empty() {
                    return Err(frame::protocol("an empty data frame"));
                }
                if let Some(slot) = state.slots.get_mut(&frame.id) {
                    let budget = &mut slot.recv_budget[usize::from(tag)];
                    let len = frame.payload.len() as u64;
                    if len > *budget {
                        return Err(frame::protocol("data beyond the granted window"));
                    }
                    *budget -= len;
                    let charged = self.charge(frame)?;
                    let _ = slot.inbound.send(charged);
                }
            }
            _ => {
                if let Some(slot) = state.slots.get(&frame.id) {
                    let charged = self.charge(frame)?;
                    let _ = slot.inbound.send(charged);
                }
            }
        }
        Ok(())
    }
}

impl Mux {
    /// Counts a received frame against [`QUEUED_INBOUND`], or refuses it (ending the
    /// connection) when its requests have that much waiting already.
    fn charge(&self, frame: Frame) -> Result<Charged> {
        let bytes = cost(&frame);
        let before = self
            .queued_inbound
            .fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
        let charged = Charged {
            frame,
            charge: Charge {
                bytes,
                queued: Arc::clone(&self.queued_inbound),
            },
        };
        if before + bytes > QUEUED_INBOUND {
            return Err(frame::protocol(format_args!(
                "the peer sent {} MiB its requests had not taken",
                QUEUED_INBOUND >> 20
            )));
        }
        Ok(charged)
    }
}

async fn read_loop<R>(mux: Weak<Mux>, reader: R, on_call: Option<OnCall>)
where
    R: AsyncRead + Send + Unpin + 'static,
{
    let mut reader = BufReader::with_capacity(CHUNK + 64, reader);
    let reason = loop {
        let frame = match read_frame(&mut reader).await {
            Ok(Some(frame)) => frame,
            Ok(None) => break "the peer closed it".to_owned(),
            Err(e) => break e.to_string(),
        };
        let Some(mux) = mux.upgrade() else { return };
        if let Err(e) = mux.dispatch(frame, on_call.as_ref()) {
            break e.to_string();
        }
    };
    if let Some(mux) = mux.upgrade() {
        mux.shutdown(reason);
    }
}

async fn write_loop<W>(
    mux: Weak<Mux>,
    mut rx: mpsc::UnboundedReceiver<(Frame, u32)>,
    writer: W,
    closing: tokio_util::sync::CancellationToken,
) where
    W: AsyncWrite + Send + Unpin + 'static,
{
    let given_up = async {
        closing.cancelled().await;
        tokio::time::sleep(WRITE_AFTER_END).await;
    };
    tokio::select! {
        () = write_frames(&mux, &mut rx, writer) => {}
        // The writer (and its half of the connection) goes; so does what is queued.
        () = given_up => {}
    }
}

async fn write_frames<W>(mux: &Weak<Mux>, rx: &mut mpsc::UnboundedReceiver<(Frame, u32)>, writer: W)
where
    W: AsyncWrite + Send + Unpin + 'static,
{
    let mut writer = BufWriter::with_capacity(CHUNK + 64, writer);
    let mut buf = BytesMut::new();
    let result: std::io::Result<()> = async {
        while let Some((frame, mut held)) = rx.recv().await {
            // Data frames hold bytes of `queued`; the others count in `queued_control`.
            let mut control = if held == 0 { cost(&frame) } else { 0 };
            frame.encode(&mut buf);
            // Batch whatever else is already queued into one write.
            while buf.len() < 4 * CHUNK {
                match rx.try_recv() {
                    Ok((frame, more)) => {
                        frame.encode(&mut buf);
                        held += more;
                        if more == 0 {
                            control += cost(&frame);
                        }
                    }
                    Err(_) => break,
                }
            }
            writer.write_all(&buf).await?;
            buf.clear();
            writer.flush().await?;
            // Written: its room is free for the next.
            if let Some(mux) = mux.upgrade() {
                mux.queued.add_permits(held as usize);
                mux.queued_control
                    .fetch_sub(control, std::sync::atomic::Ordering::Relaxed);
            }
        }
        writer.shutdown().await
    }
    .await;
    if let Err(e) = result {
        if let Some(mux) = mux.upgrade() {
            mux.shutdown(format!("writing to it failed: {e}"));
        }
    }
}
