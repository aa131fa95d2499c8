//! What a sandbox's command does between its creation and its exec: its session,
//! cgroups, limits, identity, Landlock ruleset, seccomp filters, capabilities and
//! descriptors ([`ChildSetup`]).

#![allow(unsafe_code)]

use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use crate::sys::{SocketFilter, SYS_LANDLOCK_RESTRICT_SELF};

/// What the child does before it execs.
#[derive(Debug, Default)]
pub(crate) struct ChildSetup {
    /// `cgroup.procs` descriptors to join.
    pub(crate) cgroup_procs: Vec<OwnedFd>,
    /// A Landlock ruleset to enforce.
    pub(crate) landlock: Option<std::sync::Arc<OwnedFd>>,
    /// Largest file the process may write (`RLIMIT_FSIZE`), from `Limits::disk_bytes`.
    pub(crate) max_file_bytes: Option<u64>,
    /// The sockets the process may open (narrowed for `Network::None` and
    /// `Network::Allowlist` below `Isolation::Namespaces`).
    pub(crate) sockets: SocketFilter,
    /// Make the command a child subreaper, so what it starts and then orphans (a double
    /// fork, `setsid ... &` whose parent exits) stays beneath it while it runs, where a
    /// timeout or kill finds it. For sandboxes without cgroups.
    pub(crate) subreaper: bool,
    /// Start a session of its own (and so a process group whose id is its pid) rather
    /// than only a process group: every command does, so none shares the caller's
    /// terminal, and one on a terminal takes it as its controlling one.
    pub(crate) new_session: bool,
    /// Make stdin (a terminal) the controlling terminal of that session.
    pub(crate) controlling_terminal: bool,
    /// The command is a sandbox's (any isolation but `None`): no new privileges, no
    /// `TIOCSTI` or `TIOCLINUX` on any terminal it holds, no kernel keyrings.
    pub(crate) confined: bool,
    /// Drop every capability (bounding, ambient, inheritable, permitted, effective)
    /// before the exec, so even a command a root host process starts holds none in the
    /// host's user namespace (ADVERSARIAL 37). Not for the helper that joins a
    /// sandbox's namespaces, which needs them and drops them itself.
    pub(crate) drop_capabilities: bool,
    /// Give the command an IPC namespace of its own (while it still may, as root):
    /// at `Isolation::Landlock` under root every sandbox is the same owner uid in the
    /// host's IPC namespace, which neither Landlock nor the uid keeps apart, so without
    /// it one sandbox could attach another's System V shared memory, queues and
    /// semaphores (their ids are listed in `/proc/sysvipc`).
    pub(crate) ipc_namespace: bool,
    /// Become this identity before the exec: the owner of a root backend's sandboxes
    /// (see [`crate::owner`]).
    pub(crate) run_as: Option<RunAs>,
}

/// Who a command of a root backend's sandbox runs as.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RunAs {
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    /// Its one supplementary group, if any: at `Isolation::Landlock`, the sandbox's
    /// own ([`crate::sandbox_group`]).
    pub(crate) group: Option<u32>,
}

/// Makes the child join the sandbox's cgroups, drop core dumps and enforce its Landlock
/// ruleset before it execs, so not even its first instruction runs outside them (moving
/// it after `spawn` returns would race a fast `fork`). For the commands the backend
/// starts outside the exec path (the namespaces' init); commands go through
/// [`crate::spawn`], which makes the same setup without a fork.
pub(crate) fn before_exec(cmd: &mut tokio::process::Command, setup: ChildSetup) {
    // SAFETY: the closure runs in the forked child, and `apply` is async-signal-safe.
    unsafe {
        cmd.pre_exec(move || setup.apply());
    }
}

impl ChildSetup {
    /// Makes this setup in the calling process, which is a child about to exec.
    ///
    /// # Safety
    ///
    /// Only for a child between its creation and its exec, where only
    /// async-signal-safe work is allowed (and, for a child sharing its parent's memory,
    /// nothing may be written but its own stack): it makes raw syscalls only —
    /// setsid(2), ioctl(2) TIOCSCTTY on fd 0, write(2) of a static buffer to descriptors
    /// the parent opened, setrlimit(2), prctl(2) (no-new-privs, subreaper, capability
    /// sets), landlock_restrict_self(2), seccomp(2) with a static filter, capset(2),
    /// unshare(2) of the IPC namespace and close_range(2) — and allocates
    /// nothing; errors convert from an errno without allocating.
    pub(crate) unsafe fn apply(&self) -> std::io::Result<()> {
        let no_core = rustix::process::Rlimit {
            current: Some(0),
            maximum: Some(0),
        };
        if self.new_session {
            rustix::process::setsid()?;
        }
        if self.controlling_terminal {
            // SAFETY: fd 0 is open in the child (its terminal), for the call's length.
            rustix::process::ioctl_tiocsctty(unsafe { BorrowedFd::borrow_raw(0) })?;
        }
        for fd in &self.cgroup_procs {
            // "0" means "the writing process".
            rustix::io::write(fd, b"0")?;
        }
        rustix::process::setrlimit(rustix::process::Resource::Core, no_core)?;
        if let Some(bytes) = self.max_file_bytes {
            let limit = rustix::process::Rlimit {
                current: Some(bytes),
                maximum: Some(bytes),
            };
            rustix::process::setrlimit(rustix::process::Resource::Fsize, limit)?;
        }
        if self.ipc_namespace {
            rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWIPC)?;
        }
        if self.drop_capabilities {
            // Before the uid changes, while this process still may.
            drop_bounding_set();
        }
        if let Some(RunAs { uid, gid, group }) = self.run_as {
            let groups: &[libc::gid_t] = match &group {
                Some(group) => std::slice::from_ref(group),
                None => &[],
            };
            // Raw calls: C libraries broadcast their wrappers to every thread.
            // SAFETY: setgroups(2) with a list of `groups.len()` ids, setresgid(2) and
            // setresuid(2) with integer arguments.
            unsafe {
                if libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) < 0
                    || libc::syscall(libc::SYS_setresgid, gid, gid, gid) < 0
                    || libc::syscall(libc::SYS_setresuid, uid, uid, uid) < 0
                {
                    return Err(std::io::Error::last_os_error());
                }
            }
        }
        // SAFETY: prctl(2) with integer arguments.
        if self.subreaper && unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let filter: &[libc::sock_filter] = match self.sockets {
            SocketFilter::Any => &[],
            SocketFilter::NoNetwork => &crate::seccomp::NO_NETWORK,
            SocketFilter::TcpOnly => &crate::seccomp::TCP_ONLY,
        };
        if self.confined || self.landlock.is_some() || !filter.is_empty() {
            rustix::thread::set_no_new_privs(true)?;
        }
        if let Some(ruleset) = &self.landlock {
            // SAFETY: the ruleset descriptor is open for the call's length.
            if unsafe { libc::syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset.as_raw_fd(), 0u32) } < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Outside namespaces other processes of this uid are in reach by pid, by
            // System V IPC (unless the command has an IPC namespace of its own) and,
            // where the uid may write cgroups, by starting children in theirs.
            // SAFETY: static filters, no-new-privileges set above.
            unsafe {
                crate::seccomp::install(&crate::seccomp::NO_NEIGHBOUR_TUNING)?;
                crate::seccomp::install(&crate::seccomp::NO_CLONE3)?;
                if !self.ipc_namespace {
                    crate::seccomp::install(&crate::seccomp::NO_SYSV_IPC)?;
                }
            }
        }
        if !filter.is_empty() {
            // SAFETY: a static filter, no-new-privileges set above.
            unsafe { crate::seccomp::install(filter)? };
        }
        if self.confined {
            // SAFETY: as above.
            unsafe { crate::seccomp::install(&crate::seccomp::NO_TERMINAL_INJECTION)? };
            // SAFETY: as above.
            unsafe { crate::seccomp::install(&crate::seccomp::NO_KEYRING)? };
        }
        if self.drop_capabilities {
            clear_capabilities()?;
        }
        close_inherited();
        Ok(())
    }
}

/// Empties the calling thread's capability bounding set, so no exec can grant it a
/// capability again. Needs `CAP_SETPCAP`; without it there is nothing to drop, and
/// no-new-privileges keeps the exec from granting any. Async-signal-safe: prctl(2).
fn drop_bounding_set() {
    for cap in 0..64 {
        // SAFETY: prctl(2) with integer arguments; EINVAL past the last capability and
        // EPERM without CAP_SETPCAP are expected.
        unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) };
    }
}

/// Drops every capability the calling thread, which is about to exec, still holds:
/// the ambient set, then the inheritable, permitted and effective sets at once.
/// Async-signal-safe: prctl(2) and capset(2) on stack memory.
fn clear_capabilities() -> std::io::Result<()> {
    // SAFETY: prctl(2) with integer arguments.
    unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        )
    };
    // `_LINUX_CAPABILITY_VERSION_3`: a header, then two 32-bit halves of
    // (effective, permitted, inheritable).
    let header: [u32; 2] = [0x2008_0522, 0];
    let data = [0u32; 6];
    // SAFETY: capset(2) reads both buffers, which are as large as version 3 needs.
    if unsafe { libc::syscall(libc::SYS_capset, header.as_ptr(), data.as_ptr()) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Marks every descriptor above stdio close-on-exec, so the command gets none of this
/// process's (another sandbox's terminal, a socket, a directory) whether or not it was
/// opened with `O_CLOEXEC` (ADVERSARIAL 44). Marking instead of closing leaves the
/// setup's own descriptors usable until the exec. Async-signal-safe: close_range(2),
/// or on kernels without its `CLOSE_RANGE_CLOEXEC` (before 5.11) fcntl(2) on each.
fn close_inherited() {
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
    // SAFETY: close_range(2) with integer arguments.
    let marked =
        unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, CLOSE_RANGE_CLOEXEC) } == 0;
    if marked {
        return;
    }
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit(2) into stack memory.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    let last = limit.rlim_cur.min(1 << 20) as libc::c_int;
    for fd in 3..last {
        // SAFETY: fcntl(2) on any number; EBADF for one not open.
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    }
}
