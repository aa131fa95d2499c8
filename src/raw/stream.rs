//! Bridges between blocking readers and writers and async [`ByteStream`]s.
//!
//! Tar and zstd are blocking; backends speak async streams. These helpers run the
//! blocking side on tokio's blocking pool with bounded buffering in between.

use std::io::{self, Read, Write};

use bytes::Bytes;
use futures::StreamExt;

use crate::backend::ByteStream;
use crate::error::{Error, Result};

const CHUNK: usize = 256 * 1024;

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
    tokio::spawn(async move {
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
        }
    });
    ChannelReader {
        rx,
        current: Bytes::new(),
        ended: false,
    }
}

/// The reading end of [`stream_to_reader`].
struct ChannelReader {
    rx: tokio::sync::mpsc::Receiver<io::Result<Option<Bytes>>>,
    current: Bytes,
    ended: bool,
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.current.is_empty() {
            if self.ended {
                return Ok(0);
            }
            match self.rx.blocking_recv() {
                Some(Ok(Some(bytes))) => self.current = bytes,
                Some(Ok(None)) => self.ended = true,
                Some(Err(e)) => return Err(e),
                None => {
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
pub fn writer_to_stream<F>(produce: F) -> ByteStream
where
    F: FnOnce(&mut dyn Write) -> Result<()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes>>(4);
    tokio::task::spawn_blocking(move || {
        let mut writer = ChannelWriter {
            tx: tx.clone(),
            buf: Vec::with_capacity(CHUNK),
        };
        let result = produce(&mut writer)
            .and_then(|()| writer.flush().map_err(|e| Error::io("sending archive", e)));
        if let Err(e) = result {
            let _ = tx.blocking_send(Err(e));
        }
    });
    futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    })
    .boxed()
}

struct ChannelWriter {
    tx: tokio::sync::mpsc::Sender<Result<Bytes>>,
    buf: Vec<u8>,
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
        self.tx
            .blocking_send(Ok(chunk))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the reader stopped reading"))
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
