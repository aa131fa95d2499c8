//! Relaying bytes between two sockets. On Linux with splice(2): each direction moves
//! the bytes from one socket into a pipe and on to the other inside the kernel, so they
//! are never copied through the relay's memory. Elsewhere, and where a socket refuses
//! splicing, by reading and writing.

use std::future::Future;
use std::io;
use std::os::fd::AsFd;

use tokio::io::Interest;
use tokio::net::{TcpStream, UnixStream};

/// The buffer a copying direction reads into.
const COPY_BUFFER: usize = 256 * 1024;

mod sealed {
    pub trait Sealed {}
    impl Sealed for tokio::net::TcpStream {}
    impl Sealed for tokio::net::UnixStream {}
}

/// A socket [`relay`] can move bytes in and out of: a Tokio [`TcpStream`] or
/// [`UnixStream`]. Sealed; the methods are the streams' own.
pub trait Socket: sealed::Sealed + AsFd + Send + Sync {
    /// Waits until the socket may be readable.
    fn readable(&self) -> impl Future<Output = io::Result<()>> + Send;
    /// Waits until the socket may be writable.
    fn writable(&self) -> impl Future<Output = io::Result<()>> + Send;
    /// Runs `f`, an operation on the socket's descriptor; if it fails with
    /// `WouldBlock`, the socket's readiness for `interest` is cleared.
    fn try_io<R>(&self, interest: Interest, f: impl FnOnce() -> io::Result<R>) -> io::Result<R>;
}

macro_rules! socket {
    ($stream:ty) => {
        impl Socket for $stream {
            fn readable(&self) -> impl Future<Output = io::Result<()>> + Send {
                <$stream>::readable(self)
            }
            fn writable(&self) -> impl Future<Output = io::Result<()>> + Send {
                <$stream>::writable(self)
            }
            fn try_io<R>(
                &self,
                interest: Interest,
                f: impl FnOnce() -> io::Result<R>,
            ) -> io::Result<R> {
                <$stream>::try_io(self, interest, f)
            }
        }
    };
}
socket!(TcpStream);
socket!(UnixStream);

/// Relays bytes both ways between `a` and `b` until both directions end. A direction
/// ends when its source reaches the end of its stream, which is passed on by shutting
/// the destination for writing (so half-closed protocols work), or at the first error,
/// which ends the whole relay and is returned. Returns the bytes moved from `a` to `b`
/// and from `b` to `a`.
///
/// On Linux each direction holds a pipe (two descriptors) while it runs, and no buffer:
/// the bytes stay in the kernel. A direction that cannot make its pipe (out of
/// descriptors), or whose sockets refuse splicing, copies through a buffer instead.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::io::Result<()> {
/// use tokio::io::{AsyncReadExt, AsyncWriteExt};
/// use tokio::net::UnixStream;
///
/// let (mut client, a) = UnixStream::pair()?;
/// let (b, mut server) = UnixStream::pair()?;
/// let relaying = tokio::spawn(async move { sandcell::raw::egress::relay(&a, &b).await });
/// client.write_all(b"ping").await?;
/// client.shutdown().await?;
/// let mut heard = String::new();
/// server.read_to_string(&mut heard).await?;
/// assert_eq!(heard, "ping");
/// server.write_all(b"pong").await?;
/// drop(server);
/// let mut answer = String::new();
/// client.read_to_string(&mut answer).await?;
/// assert_eq!(answer, "pong");
/// assert_eq!(relaying.await??, (4, 4));
/// # Ok(())
/// # }
/// ```
pub async fn relay<A: Socket, B: Socket>(a: &A, b: &B) -> io::Result<(u64, u64)> {
    tokio::try_join!(pump(a, b), pump(b, a))
}

/// Moves bytes from `from` to `to` until `from` ends, then shuts `to` for writing.
/// Returns the bytes moved.
pub(crate) async fn pump<F: Socket, T: Socket>(from: &F, to: &T) -> io::Result<u64> {
    let moved = spliced::pump(from, to).await?;
    // The peer may be gone already; its end was passed on either way.
    let _ = to.try_io(Interest::WRITABLE, || {
        rustix::net::shutdown(to, rustix::net::Shutdown::Write).map_err(io::Error::from)
    });
    Ok(moved)
}

/// Reads what `from` has, waiting for something; `Ok(0)` is the end of its stream.
pub(crate) async fn read_some<S: Socket>(from: &S, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        from.readable().await?;
        match from.try_io(Interest::READABLE, || {
            rustix::io::read(from, &mut *buf).map_err(io::Error::from)
        }) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            done => return done,
        }
    }
}

/// Writes all of `bytes` to `to`.
pub(crate) async fn write_all<S: Socket>(to: &S, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        to.writable().await?;
        match to.try_io(Interest::WRITABLE, || {
            rustix::io::write(to, bytes).map_err(io::Error::from)
        }) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Moves bytes by reading them into a buffer and writing them out.
async fn copy<F: Socket, T: Socket>(from: &F, to: &T) -> io::Result<u64> {
    let mut buf = vec![0u8; COPY_BUFFER];
    let mut moved = 0;
    loop {
        let n = read_some(from, &mut buf).await?;
        if n == 0 {
            return Ok(moved);
        }
        write_all(to, &buf[..n]).await?;
        moved += n as u64;
    }
}

#[cfg(target_os = "linux")]
mod spliced {
    use std::io;

    use rustix::pipe::{fcntl_setpipe_size, pipe_with, splice, PipeFlags, SpliceFlags};
    use tokio::io::Interest;

    use super::Socket;

    /// Bytes a direction moves per step: the pipe's size. Only pages in flight take
    /// memory; a larger pipe means fewer calls.
    const STEP: usize = 1024 * 1024;

    /// Moves bytes through a pipe of its own with splice(2); copies instead when the
    /// pipe cannot be made or the sockets refuse splicing before anything moved.
    pub(super) async fn pump<F: Socket, T: Socket>(from: &F, to: &T) -> io::Result<u64> {
        let Ok((pipe_out, pipe_in)) = pipe_with(PipeFlags::CLOEXEC | PipeFlags::NONBLOCK) else {
            return super::copy(from, to).await;
        };
        // The default pipe holds 64 KiB. Refused above the system's limit (1 MiB unless
        // raised, for all but root), which only makes the steps smaller.
        let _ = fcntl_setpipe_size(&pipe_in, STEP);
        let flags = SpliceFlags::MOVE | SpliceFlags::NONBLOCK;
        let mut moved = 0u64;
        loop {
            // The pipe is empty here, so `WouldBlock` means `from` has nothing yet.
            from.readable().await?;
            let n = match from.try_io(Interest::READABLE, || {
                splice(from, None, &pipe_in, None, STEP, flags).map_err(io::Error::from)
            }) {
                Ok(0) => return Ok(moved),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e)
                    if moved == 0
                        && e.raw_os_error() == Some(rustix::io::Errno::INVAL.raw_os_error()) =>
                {
                    return super::copy(from, to).await;
                }
                Err(e) => return Err(e),
            };
            let mut left = n;
            while left > 0 {
                to.writable().await?;
                match to.try_io(Interest::WRITABLE, || {
                    splice(&pipe_out, None, to, None, left, flags).map_err(io::Error::from)
                }) {
                    Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                    Ok(m) => left -= m,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                }
            }
            moved += n as u64;
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod spliced {
    use super::Socket;

    /// Without splice(2), a direction copies.
    pub(super) async fn pump<F: Socket, T: Socket>(from: &F, to: &T) -> std::io::Result<u64> {
        super::copy(from, to).await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream, UnixStream};

    use super::*;

    /// A connected pair of TCP streams on loopback.
    async fn tcp_pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (near, far) = tokio::join!(TcpStream::connect(addr), listener.accept());
        (near.unwrap(), far.unwrap().0)
    }

    /// Bytes no two offsets of which repeat within a step, so a reordered or dropped
    /// chunk shows.
    fn pattern(len: usize) -> Vec<u8> {
        (0..len as u64)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 7) as u8)
            .collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn moves_every_byte_both_ways_between_tcp_and_unix() {
        let (mut client, a) = tcp_pair().await;
        let (b, mut server) = UnixStream::pair().unwrap();
        let relaying = tokio::spawn(async move { relay(&a, &b).await });
        // Both ways at once, each larger than many pipes' worth.
        let up = pattern(9 * COPY_BUFFER + 17);
        let down: Vec<u8> = pattern(5 * COPY_BUFFER + 3).into_iter().rev().collect();
        let (mut client_read, mut client_write) = client.split();
        let (mut server_read, mut server_write) = server.split();
        let (sent_up, heard_up, sent_down, heard_down) = tokio::join!(
            async {
                client_write.write_all(&up).await.unwrap();
                client_write.shutdown().await.unwrap();
            },
            async {
                let mut heard = Vec::new();
                server_read.read_to_end(&mut heard).await.unwrap();
                heard
            },
            async {
                server_write.write_all(&down).await.unwrap();
                server_write.shutdown().await.unwrap();
            },
            async {
                let mut heard = Vec::new();
                client_read.read_to_end(&mut heard).await.unwrap();
                heard
            },
        );
        let ((), ()) = (sent_up, sent_down);
        assert!(heard_up == up, "upstream bytes differ");
        assert!(heard_down == down, "downstream bytes differ");
        let moved = relaying.await.unwrap().unwrap();
        assert_eq!(moved, (up.len() as u64, down.len() as u64));
    }

    #[tokio::test]
    async fn a_half_close_is_passed_on_and_the_other_way_keeps_going() {
        let (mut client, a) = tcp_pair().await;
        let (b, mut server) = tcp_pair().await;
        let relaying = tokio::spawn(async move { relay(&a, &b).await });
        client.write_all(b"request").await.unwrap();
        client.shutdown().await.unwrap();
        let mut request = Vec::new();
        server.read_to_end(&mut request).await.unwrap();
        assert_eq!(request, b"request");
        // The client has stopped sending, but still hears the answer.
        server.write_all(b"answer").await.unwrap();
        drop(server);
        let mut answer = Vec::new();
        client.read_to_end(&mut answer).await.unwrap();
        assert_eq!(answer, b"answer");
        assert_eq!(relaying.await.unwrap().unwrap(), (7, 6));
    }

    #[tokio::test]
    async fn a_reset_ends_the_relay_with_the_error() {
        let (client, a) = tcp_pair().await;
        let (b, server) = tcp_pair().await;
        let relaying = tokio::spawn(async move { relay(&a, &b).await });
        // Closing with a zero linger resets the connection.
        server.set_zero_linger().unwrap();
        drop(server);
        let outcome = tokio::time::timeout(std::time::Duration::from_secs(10), relaying)
            .await
            .expect("the relay ends")
            .unwrap();
        assert!(outcome.is_err(), "{outcome:?}");
        drop(client);
    }

    #[tokio::test]
    async fn copying_moves_the_same_bytes_as_splicing() {
        let (mut client, a) = tcp_pair().await;
        let (b, mut server) = UnixStream::pair().unwrap();
        let copying = tokio::spawn(async move { copy(&a, &b).await });
        let bytes = pattern(3 * COPY_BUFFER + 1);
        let writing = async {
            client.write_all(&bytes).await.unwrap();
            client.shutdown().await.unwrap();
        };
        let reading = async {
            let mut heard = Vec::new();
            server.read_to_end(&mut heard).await.unwrap();
            heard
        };
        let ((), heard) = tokio::join!(writing, reading);
        assert!(heard == bytes);
        assert_eq!(copying.await.unwrap().unwrap(), bytes.len() as u64);
    }
}
