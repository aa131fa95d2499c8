//! A namespaced sandbox's init held by descriptor ([`PinnedInit`]): everything done
//! through it (entering the sandbox's namespaces, opening its root, its terminal
//! multiplexer or its network namespace) reaches that process or fails, never a process
//! that has since been given its pid.
//!
//! A pid names a process only while it lives. A sandbox can end its own init, and the
//! kernel may then give the pid to any new process, another sandbox's or the host's
//! (ADVERSARIAL 47): a helper told `--target <pid>` or `/proc/<pid>/ns/mnt` after a
//! check of the pid would enter whatever holds the pid by the time it looks. So the
//! backend opens the init's `/proc/<pid>` directory instead, which the kernel binds to
//! the process rather than to the number: once that process is gone nothing beneath the
//! directory opens, whoever has the pid now. A pidfd taken first shows the process is
//! still running once the directory is open (so its pid was not free meanwhile, and the
//! directory is its), and the start time read through the directory shows it is the
//! init recorded at create.
//!
//! The directory stays in this process, close-on-exec, and helpers reach it as
//! `/proc/<this process>/fd/<n>/ns/mnt` and so on: `nsenter` does not close what it
//! inherits, so a descriptor handed down to it would reach `setpriv`, `env` and the
//! command itself (ADVERSARIAL 44).

use std::os::fd::{AsRawFd, OwnedFd};

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;
use sandcell::{Error, ErrorKind, Result, SandboxId};

/// A process's `/proc` directory, opened while the process is known to be the one
/// meant: held, it names that process and no other.
#[derive(Debug)]
pub(crate) struct PinnedInit {
    pid: i32,
    /// When the process started, in clock ticks after boot (`stat`, field 22).
    start: u64,
    /// `/proc/<pid>`, bound to the process.
    dir: OwnedFd,
    /// Where a child of this process finds `dir`: `/proc/<this process>/fd/<dir>`.
    for_children: String,
}

impl PinnedInit {
    /// Pins `init`, the idle process of sandbox `id`'s namespaces recorded as started at
    /// `start`. Fails with `InvalidState` if it has ended (the sandbox ended it from
    /// inside, or the host restarted), whoever has its pid now, or if the sandbox was made
    /// by a version that did not record its start.
    pub(crate) fn pin(id: &SandboxId, init: i32, start: Option<u64>) -> Result<PinnedInit> {
        let Some(start) = start else {
            return Err(Error::new(
                ErrorKind::InvalidState,
                format!("the namespaces of sandbox {id} were made by an older version of sandcell; reset it"),
            ));
        };
        match PinnedInit::open(init)? {
            Some(pinned) if pinned.start == start => Ok(pinned),
            _ => Err(Error::new(
                ErrorKind::InvalidState,
                format!("the namespaces of sandbox {id} are gone (ended from inside, or the host restarted); reset it"),
            )),
        }
    }

    /// Pins whatever process has `pid` now, or answers `None` if none does or it has
    /// exited (a zombie's namespaces are gone already).
    pub(crate) fn open(pid: i32) -> Result<Option<PinnedInit>> {
        let failed = |step: &str, e: Errno| {
            Error::io(
                format_args!("holding a sandbox's process ({step})"),
                e.into(),
            )
        };
        // `Pid::from_raw` asserts on a negative number: a corrupt record is no process.
        let Some(raw) = (pid > 0)
            .then(|| rustix::process::Pid::from_raw(pid))
            .flatten()
        else {
            return Ok(None);
        };
        let pidfd = match rustix::process::pidfd_open(raw, rustix::process::PidfdFlags::empty()) {
            Ok(pidfd) => pidfd,
            Err(Errno::SRCH) => return Ok(None),
            Err(Errno::NOSYS) => {
                return Err(Error::unsupported(
                    "isolation level Namespaces needs pidfd_open (Linux 5.3 or later)",
                ))
            }
            Err(e) => return Err(failed("pidfd_open", e)),
        };
        let dir = match rustix::fs::open(
            format!("/proc/{pid}"),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(dir) => dir,
            Err(Errno::NOENT | Errno::SRCH) => return Ok(None),
            Err(e) => return Err(failed("opening its /proc directory", e)),
        };
        // Still running, so not reaped: its pid was taken all along, and the directory
        // just opened is its own.
        let mut poll = [rustix::event::PollFd::new(
            &pidfd,
            rustix::event::PollFlags::IN,
        )];
        let timeout = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        if rustix::event::poll(&mut poll, Some(&timeout)).map_err(|e| failed("poll", e))? > 0 {
            return Ok(None);
        }
        let Some(start) = stat_field(&dir, 19) else {
            return Ok(None);
        };
        let this = rustix::fs::readlink("/proc/self", Vec::new())
            .map_err(|e| failed("finding this process in /proc", e))?;
        let for_children = format!("/proc/{}/fd/{}", this.to_string_lossy(), dir.as_raw_fd());
        Ok(Some(PinnedInit {
            pid,
            start,
            dir,
            for_children,
        }))
    }

    /// The process's pid (valid while the process runs; use the paths to reach it).
    pub(crate) fn pid(&self) -> i32 {
        self.pid
    }

    /// When the process started, in clock ticks after boot: with the pid, its identity.
    pub(crate) fn start(&self) -> u64 {
        self.start
    }

    /// Opens `rel` beneath the process's `/proc` directory (`ns/net`, `root`).
    pub(crate) fn open_at(&self, rel: &str, flags: OFlags) -> std::io::Result<OwnedFd> {
        Ok(rustix::fs::openat(
            &self.dir,
            rel,
            flags | OFlags::CLOEXEC,
            Mode::empty(),
        )?)
    }

    /// `rel` beneath the process's `/proc` directory, as a path for this process. Not
    /// for what lies beneath `root`, whose links would be followed from this process's
    /// root: open `root` with [`PinnedInit::open_at`] and look beneath it in that root.
    #[cfg(test)]
    pub(crate) fn path(&self, rel: &str) -> std::path::PathBuf {
        std::path::PathBuf::from(format!("/proc/self/fd/{}/{rel}", self.dir.as_raw_fd()))
    }

    /// `rel` beneath the process's `/proc` directory, as a path for a helper this
    /// process starts (`nsenter --mount=...`). Valid while `self` is held.
    pub(crate) fn child_path(&self, rel: &str) -> String {
        format!("{}/{rel}", self.for_children)
    }

    /// Whether the process is still running: a read through its directory fails once
    /// it is gone, and `stat`'s state says whether it is a zombie.
    pub(crate) fn is_running(&self) -> bool {
        stat_field(&self.dir, 0).is_some_and(|state: String| !matches!(&*state, "Z" | "X"))
    }

    /// The process's parent, as a pid.
    pub(crate) fn parent(&self) -> Option<i32> {
        stat_field(&self.dir, 1)
    }

    /// The process's command line, NUL-separated.
    pub(crate) fn cmdline(&self) -> Option<Vec<u8>> {
        read(&self.dir, "cmdline")
    }

    /// The pids of the process's children (of its main thread).
    pub(crate) fn children(&self) -> Vec<i32> {
        read(&self.dir, &format!("task/{}/children", self.pid))
            .map(|children| {
                String::from_utf8_lossy(&children)
                    .split_whitespace()
                    .filter_map(|pid| pid.parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Whether the process has a user namespace of its own to join. Bubblewrap running
    /// as root may share this process's, and joining one's own user namespace again
    /// fails.
    pub(crate) fn has_own_user_ns(&self) -> bool {
        let own = rustix::fs::readlink("/proc/self/ns/user", Vec::new()).ok();
        let theirs = rustix::fs::readlinkat(&self.dir, "ns/user", Vec::new()).ok();
        own != theirs
    }
}

/// Reads `rel` beneath a `/proc/<pid>` directory; `None` once the process is gone.
fn read(dir: &OwnedFd, rel: &str) -> Option<Vec<u8>> {
    let file =
        rustix::fs::openat(dir, rel, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()).ok()?;
    let mut out = Vec::new();
    std::io::Read::read_to_end(&mut std::fs::File::from(file), &mut out).ok()?;
    Some(out)
}

/// Field `index` of `stat` after the command name (0 is the state, 1 the parent, 19
/// the start time), parsed.
fn stat_field<T: std::str::FromStr>(dir: &OwnedFd, index: usize) -> Option<T> {
    let stat = read(dir, "stat")?;
    let stat = String::from_utf8_lossy(&stat);
    // The command name, in parentheses, may hold spaces and parentheses itself.
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(index)?.parse().ok()
}

#[cfg(test)]
mod tests;
