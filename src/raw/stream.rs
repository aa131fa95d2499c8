//! Bridges between blocking readers and writers and async [`ByteStream`]s.
//!
//! Tar and zstd are blocking; backends speak async streams. These helpers run the
//! blocking side on tokio's blocking pool with bounded buffering in between.
//!
//! The other side of each is often a client: a reader that takes nothing more, or a
//! writer that sends nothing more, would park the blocking thread for as long as it
//! likes, and tokio's pool (512 threads) is what every backend's file work shares. So
//! a blocking side that sees no progress for [`STALLED_STREAM_TIMEOUT`] gives up with
//! [`ErrorKind::Timeout`](crate::ErrorKind::Timeout). How many run at once is for the
//! caller to bound (sandcell-server bounds each tenant's archive streams): a cap here
//! would deadlock bridges that feed each other (a snapshot compresses an export).

use std::io::{self, Read, Write};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;

use crate::backend::ByteStream;
use crate::error::{Error, Result};

const CHUNK: usize = 256 * 1024;

/// How long the blocking side of a bridge waits for the other to take (or send)
/// anything before it gives up (a second in this crate's own unit tests).
pub const STALLED_STREAM_TIMEOUT: Duration = match cfg!(test) {
    true => Duration::from_secs(1),
    false => Duration::from_secs(60),
};

/// How many items the async side of a bridge has moved (or whether it is gone): what
/// the blocking side waits on, with a deadline, rather than on the channel itself.
#[derive(Debug, Default)]
struct Progress {
    /// Items moved; `u64::MAX` once the async side is gone.
    moved: Mutex<u64>,
    changed: Condvar,
}

impl Progress {
    fn lock(&self) -> std::sync::MutexGuard<'_, u64> {
        self.moved
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn step(&self) {
        let mut moved = self.lock();
        *moved = moved.saturating_add(1).min(u64::MAX - 1);
        self.changed.notify_all();
    }

    fn gone(&self) {
        *self.lock() = u64::MAX;
        self.changed.notify_all();
    }

    fn seen(&self) -> u64 {
        *self.lock()
    }

    /// Waits until the count is no longer `seen`, or fails once
    /// [`STALLED_STREAM_TIMEOUT`] passes without that.
    fn wait_past(&self, seen: u64, what: &str) -> io::Result<()> {
        if seen == u64::MAX {
            // Gone: the channel is closing; look again.
            std::thread::yield_now();
            return Ok(());
        }
        let guard = self.lock();
        let (_guard, waited) = self
            .changed
            .wait_timeout_while(guard, STALLED_STREAM_TIMEOUT, |moved| *moved == seen)
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match waited.timed_out() {
            true => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("{what} for {} s", STALLED_STREAM_TIMEOUT.as_secs()),
            )),
            false => Ok(()),
        }
    }
}

/// Marks a bridge's async side gone when it is dropped.
struct Gone(Arc<Progress>);

impl Drop for Gone {
    fn drop(&mut self) {
        self.0.gone();
    }
}

/// Turns an async byte stream into a blocking reader, for use inside `spawn_blocking`.
/// A stream error surfaces as an `io::Error` that [`Error::io`] turns back into the
/// original error. Must be called inside a tokio runtime.
///
/// The stream is polled by a task of the runtime, never on the thread that reads: a
/// backend's blocking thread may hold an identity of a sandbox's while it reads (the
/// local backend's owner), and a thread the stream's own work started from it (the
/// blocking pool grows from the thread that asks) would keep that identity.
pub fn stream_to_reader(stream: ByteStream) -> impl Read + Send + 'static {
    // `Ok(None)` marks the end: a channel that closes without it (the task cancelled
    // at a runtime's shutdown, or a panicking stream) is a truncated stream, not EOF.
    let (tx, rx) = tokio::sync::mpsc::channel::<io::Result<Option<Bytes>>>(4);
    let progress = Arc::new(Progress::default());
    let feeding = Gone(Arc::clone(&progress));
    tokio::spawn(async move {
        // Dropped last, so a reader told the feeder is gone finds the channel closed.
        let _gone = feeding;
        let tx = tx;
        let mut stream = stream;
        loop {
            let item = tokio::select! {
                item = stream.next() => item,
                // A reader that went away wants no more, even of a stream that never
                // yields again.
                () = tx.closed() => return,
            };
            let (item, last) = match item {
                Some(Ok(bytes)) => (Ok(Some(bytes)), false),
                Some(Err(e)) => (Err(e.into_io()), true),
                None => (Ok(None), true),
            };
            if tx.send(item).await.is_err() || last {
                return;
            }
            _gone.0.step();
        }
    });
    ChannelReader {
        rx,
        progress,
        current: Bytes::new(),
        ended: false,
    }
}

/// The reading end of [`stream_to_reader`].
struct ChannelReader {
    rx: tokio::sync::mpsc::Receiver<io::Result<Option<Bytes>>>,
    progress: Arc<Progress>,
    current: Bytes,
    ended: bool,
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.current.is_empty() {
            if self.ended {
                return Ok(0);
            }
            let seen = self.progress.seen();
            match self.rx.try_recv() {
                Ok(Ok(Some(bytes))) => self.current = bytes,
                Ok(Ok(None)) => self.ended = true,
                Ok(Err(e)) => return Err(e),
                Err(tokio::sync::mpsc::error::TryRecvError::Empty) => self
                    .progress
                    .wait_past(seen, "the stream's writer sent nothing")?,
                Err(tokio::sync::mpsc::error::TryRecvError::Disconnected) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the stream stopped before its end",
                    ))
                }
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current.split_to(n));
        Ok(n)
    }
}

/// Turns a blocking reader into an async byte stream, reading on a blocking thread.
/// Must be called inside a tokio runtime.
pub fn reader_to_stream<R: Read + Send + 'static>(mut reader: R) -> ByteStream {
    writer_to_stream(move |out| {
        io::copy(&mut reader, out).map_err(|e| Error::io("reading archive", e))?;
        Ok(())
    })
}

/// Runs `produce` on a blocking thread, streaming what it writes. An error it returns
/// becomes the stream's last item. Must be called inside a tokio runtime.
///
/// A write the stream's reader takes nothing of for [`STALLED_STREAM_TIMEOUT`] fails
/// (so `produce` ends, and its thread is free), and the stream ends with that error if
/// it is still read.
pub fn writer_to_stream<F>(produce: F) -> ByteStream
where
    F: FnOnce(&mut dyn Write) -> Result<()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes>>(4);
    let progress = Arc::new(Progress::default());
    let reading = Gone(Arc::clone(&progress));
    tokio::task::spawn_blocking(move || {
        let mut writer = ChannelWriter {
            tx,
            progress,
            buf: Vec::with_capacity(CHUNK),
        };
        let result = produce(&mut writer)
            .and_then(|()| writer.flush().map_err(|e| Error::io("sending archive", e)));
        if let Err(e) = result {
            let _ = writer.send(Err(e));
        }
    });
    futures::stream::unfold((rx, reading), |(mut rx, reading)| async move {
        let item = rx.recv().await?;
        reading.0.step();
        Some((item, (rx, reading)))
    })
    .boxed()
}

struct ChannelWriter {
    tx: tokio::sync::mpsc::Sender<Result<Bytes>>,
    progress: Arc<Progress>,
    buf: Vec<u8>,
}

impl ChannelWriter {
    /// Sends `item`, waiting while the channel is full for at most
    /// [`STALLED_STREAM_TIMEOUT`] without the reader taking anything.
    fn send(&self, mut item: Result<Bytes>) -> io::Result<()> {
        use tokio::sync::mpsc::error::TrySendError;
        loop {
            let seen = self.progress.seen();
            match self.tx.try_send(item) {
                Ok(()) => return Ok(()),
                Err(TrySendError::Closed(_)) => {
                    return Err(io::Error::new(
                        io::ErrorKind::BrokenPipe,
                        "the reader stopped reading",
                    ))
                }
                Err(TrySendError::Full(back)) => {
                    item = back;
                    self.progress.wait_past(seen, "the reader took nothing")?;
                }
            }
        }
    }
}

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= CHUNK {
            self.flush()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK)));
        self.send(Ok(chunk))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_stream_that_stops_short_is_not_read_as_complete() {
        let stream: ByteStream = Box::pin(
            futures::stream::iter([Ok(Bytes::from_static(b"some"))]).chain(
                futures::stream::poll_fn(|_| -> std::task::Poll<Option<Result<Bytes>>> {
                    panic!("the stream's producer failed")
                }),
            ),
        );
        let read = tokio::task::spawn_blocking(move || {
            let mut buf = Vec::new();
            stream_to_reader(stream).read_to_end(&mut buf).map(|_| buf)
        })
        .await
        .unwrap();
        assert_eq!(read.unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
    }

    #[tokio::test]
    async fn a_dropped_reader_lets_go_of_a_stream_that_never_yields() {
        struct Dropped(Option<tokio::sync::oneshot::Sender<()>>);
        impl Drop for Dropped {
            fn drop(&mut self) {
                if let Some(tx) = self.0.take() {
                    let _ = tx.send(());
                }
            }
        }
        let (tx, dropped) = tokio::sync::oneshot::channel();
        let guard = Dropped(Some(tx));
        let stream: ByteStream =
            Box::pin(futures::stream::pending().map(move |x: Result<Bytes>| {
                let _held = &guard;
                x
            }));
        drop(stream_to_reader(stream));
        tokio::time::timeout(std::time::Duration::from_secs(5), dropped)
            .await
            .expect("the stream outlived its reader")
            .unwrap();
    }

    /// ADVERSARIAL 40: a reader that takes nothing more frees the producer's thread
    /// once the stall timeout passes, with a timeout; it does not hold it for as long
    /// as it likes.
    #[tokio::test]
    async fn a_producer_whose_reader_stalls_gives_up_its_thread() {
        let (ended, why) = tokio::sync::oneshot::channel();
        let mut stream = writer_to_stream(move |out| {
            let chunk = vec![0u8; CHUNK];
            let failed = loop {
                if let Err(e) = out.write_all(&chunk) {
                    break e;
                }
            };
            let _ = ended.send(failed.kind());
            Err(Error::io("writing", failed))
        });
        assert!(
            stream.next().await.unwrap().is_ok(),
            "the first chunk comes"
        );
        let kind = tokio::time::timeout(STALLED_STREAM_TIMEOUT * 5, why)
            .await
            .expect("the producer still holds its thread")
            .unwrap();
        assert_eq!(kind, io::ErrorKind::TimedOut);
        drop(stream);
    }

    /// A writer that sends nothing more fails the read with a timeout, not a thread
    /// parked for good.
    #[tokio::test]
    async fn a_reader_whose_writer_stalls_times_out() {
        let stream: ByteStream = Box::pin(
            futures::stream::iter([Ok(Bytes::from_static(b"some"))])
                .chain(futures::stream::pending()),
        );
        let read = tokio::task::spawn_blocking(move || {
            let mut buf = Vec::new();
            stream_to_reader(stream).read_to_end(&mut buf)
        });
        let read = tokio::time::timeout(STALLED_STREAM_TIMEOUT * 5, read)
            .await
            .expect("the reader still waits")
            .unwrap();
        let error = Error::io("reading", read.unwrap_err());
        assert_eq!(error.kind(), crate::ErrorKind::Timeout, "{error}");
    }

    #[tokio::test]
    async fn errors_cross_the_bridge_with_their_kind() {
        let stream = writer_to_stream(|out| {
            out.write_all(b"partial").map_err(|e| Error::io("w", e))?;
            Err(Error::corrupt("broken at the end"))
        });
        let err = tokio::task::spawn_blocking(move || {
            let mut reader = stream_to_reader(stream);
            let mut buf = Vec::new();
            reader.read_to_end(&mut buf).unwrap_err()
        })
        .await
        .unwrap();
        assert_eq!(Error::io("reading", err).kind(), crate::ErrorKind::Corrupt);
    }
}
