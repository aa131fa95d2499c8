//! Pseudo-terminals for commands run with `ExecRequest::pty`: the master side the
//! backend reads and writes without blocking, and the slave side the command gets as
//! its stdin, stdout and stderr.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use rustix::pty::OpenptFlags;
use rustix::termios::Winsize;
use sandcell::{Error, Result, TerminalSize};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The backend's side of a terminal. Clones share one descriptor: one reads the
/// command's output, one types its input, one resizes. The terminal hangs up when the
/// last clone goes.
#[derive(Clone)]
pub(crate) struct Terminal {
    master: Arc<AsyncFd<OwnedFd>>,
}

impl std::fmt::Debug for Terminal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Terminal").finish_non_exhaustive()
    }
}

/// Opens a terminal of `size`: the master, registered with the reactor of the current
/// runtime, and the slave for the command.
///
/// `sandbox_root` says where the multiplexer is: the host's (`None`), or the one of the
/// `devpts` instance a sandbox's namespaces mount at `/dev/pts`, beneath their root
/// directory, whose terminals the command can name from inside (`tty` finds
/// `/dev/pts/N` there).
pub(crate) fn open(
    size: TerminalSize,
    sandbox_root: Option<&OwnedFd>,
) -> Result<(Terminal, OwnedFd)> {
    let failed = |step: &str, e: rustix::io::Errno| {
        Error::io(format_args!("opening a terminal ({step})"), e.into())
    };
    let master = match sandbox_root {
        None => rustix::pty::openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)
            .map_err(|e| failed("posix_openpt", e))?,
        Some(root) => {
            open_ptmx(root, "dev/pts/ptmx").map_err(|e| failed("opening the sandbox's ptmx", e))?
        }
    };
    rustix::pty::grantpt(&master).map_err(|e| failed("grantpt", e))?;
    rustix::pty::unlockpt(&master).map_err(|e| failed("unlockpt", e))?;
    // The slave straight from the master (TIOCGPTPEER): no path in /dev/pts to look
    // up, so it cannot be raced or swapped.
    let slave = rustix::pty::ioctl_tiocgptpeer(
        &master,
        OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC,
    )
    .map_err(|e| failed("TIOCGPTPEER", e))?;
    rustix::termios::tcsetwinsize(&master, winsize(size)).map_err(|e| failed("TIOCSWINSZ", e))?;
    let flags = rustix::fs::fcntl_getfl(&master).map_err(|e| failed("F_GETFL", e))?;
    rustix::fs::fcntl_setfl(&master, flags | rustix::fs::OFlags::NONBLOCK)
        .map_err(|e| failed("F_SETFL", e))?;
    let master = crate::sys::async_fd(master)
        .map_err(|e| Error::io("registering a terminal with the runtime", e))?;
    Ok((
        Terminal {
            master: Arc::new(master),
        },
        slave,
    ))
}

/// Opens `rel` beneath the directory `root` if it is a pseudo-terminal multiplexer
/// (character device 5:2): the path is beneath a tree the sandbox can see, so whatever
/// is there is checked before it is used, and a FIFO put in its place cannot block the
/// open. It is looked up as if `root` were `/`: the sandbox can make its init chroot
/// into a directory of its own (it can trace the init), and an absolute link there
/// (`dev` -> `/dev`) would otherwise lead this process, as root, to the host's files.
fn open_ptmx(root: &OwnedFd, rel: &str) -> rustix::io::Result<OwnedFd> {
    use rustix::fs::{FileType, Mode, OFlags, ResolveFlags};
    let fd = rustix::fs::openat2(
        root,
        rel,
        OFlags::RDWR | OFlags::NOCTTY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
    )?;
    let stat = rustix::fs::fstat(&fd)?;
    let is_ptmx = FileType::from_raw_mode(stat.st_mode) == FileType::CharacterDevice
        && rustix::fs::major(stat.st_rdev) == 5
        && rustix::fs::minor(stat.st_rdev) == 2;
    if is_ptmx {
        Ok(fd)
    } else {
        Err(rustix::io::Errno::NODEV)
    }
}

fn winsize(size: TerminalSize) -> Winsize {
    Winsize {
        ws_row: size.rows,
        ws_col: size.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}

impl Terminal {
    /// Changes the size; the kernel sends `SIGWINCH` to the terminal's foreground job.
    pub(crate) fn resize(&self, size: TerminalSize) -> Result<()> {
        size.validate()?;
        rustix::termios::tcsetwinsize(self.master.get_ref(), winsize(size))
            .map_err(|e| Error::io("resizing a terminal", e.into()))
    }
}

impl AsFd for Terminal {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.master.get_ref().as_fd()
    }
}

impl AsyncRead for Terminal {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            let mut guard = ready!(self.master.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            match guard.try_io(|fd| {
                rustix::io::read(fd.get_ref(), &mut *unfilled).map_err(io::Error::from)
            }) {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                // Linux answers EIO once every slave descriptor is closed: the end of
                // the output, not a failure.
                Ok(Err(e)) if e.raw_os_error() == Some(libc::EIO) => return Poll::Ready(Ok(())),
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

impl AsyncWrite for Terminal {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        loop {
            let mut guard = ready!(self.master.poll_write_ready(cx))?;
            match guard.try_io(|fd| rustix::io::write(fd.get_ref(), data).map_err(io::Error::from))
            {
                Ok(result) => return Poll::Ready(result),
                Err(_would_block) => continue,
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    /// A terminal has no end of input to send: closing the master would hang up the
    /// command. Typing `0x04` (Ctrl-D) at the start of a line is how a terminal says it.
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use std::path::Path;

    /// What stands at a sandbox's `/dev/pts/ptmx` is checked before it is used: another
    /// device is refused, and a FIFO put there neither blocks the open nor is taken.
    #[test]
    fn only_a_real_multiplexer_is_opened() {
        let open_dir = |path: &Path| {
            rustix::fs::open(
                path,
                rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY,
                rustix::fs::Mode::empty(),
            )
            .unwrap()
        };
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("ptmx");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o666),
            0,
        )
        .unwrap();
        let sandbox = open_dir(dir.path());
        assert_eq!(
            open_ptmx(&sandbox, "ptmx").unwrap_err(),
            rustix::io::Errno::NODEV
        );
        let host = open_dir(Path::new("/"));
        assert_eq!(
            open_ptmx(&host, "dev/null").unwrap_err(),
            rustix::io::Errno::NODEV
        );
        std::os::unix::fs::symlink("/dev/ptmx", dir.path().join("link")).unwrap();
        assert!(
            open_ptmx(&sandbox, "link").is_err(),
            "a symlink is not followed"
        );
        // An absolute link on the way stays beneath the sandbox's root.
        // (Followed from this process's root, `up/ptmx` would be the host's `/dev/ptmx`.)
        std::os::unix::fs::symlink("/dev", dir.path().join("up")).unwrap();
        assert_eq!(
            open_ptmx(&sandbox, "up/ptmx").unwrap_err(),
            rustix::io::Errno::NOENT
        );
        assert!(open_ptmx(&host, "dev/ptmx").is_ok());
    }
}
