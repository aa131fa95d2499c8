//! Starting a command without a fork: the child shares this process's memory while the
//! calling thread waits for its exec, as `posix_spawn` does (nothing is copied, however
//! large this process is), yet makes the sandbox's setup (process group or session,
//! cgroups, limits, Landlock, seccomp) before it execs, which `posix_spawn` cannot.
//! The child is then waited for through a pidfd.
//!
//! A forked child costs a copy of this process's page tables, a vfork-style one does
//! not: on the bench machine that is most of what a sandbox command cost over a raw
//! spawn (see the README's exec figures).

#![allow(unsafe_code)]

use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicI32, Ordering};

use sandcell::ExitStatus;
use tokio::io::unix::AsyncFd;

use crate::child::ChildSetup;

/// The child's stack. It runs the setup and the exec calls, nothing deep; a guard page
/// below it turns an overflow into a fault of the child instead of a write elsewhere.
const STACK_BYTES: usize = 128 * 1024;

/// `PATH` for a command whose environment has none (what execvp(3) searches then).
const PATH_WHEN_UNSET: &str = "/bin:/usr/bin";

/// What a command starts with, all made before the child exists: the child allocates
/// nothing.
pub(crate) struct Command<'a> {
    pub(crate) argv: &'a [String],
    pub(crate) env: &'a BTreeMap<String, String>,
    pub(crate) cwd: &'a Path,
    /// The descriptors that become the child's stdin, stdout and stderr.
    pub(crate) stdio: [&'a OwnedFd; 3],
    /// Whether the child starts a process group of its own (unless the setup asks for
    /// a session, which makes one too).
    pub(crate) process_group: bool,
    pub(crate) setup: &'a ChildSetup,
}

/// Everything the child reads, laid out by the parent. The child writes only `error`.
struct ChildArgs<'a> {
    /// Where to look for the program, in order (the program itself when it names a path).
    candidates: &'a [CString],
    argv: *const *const c_char,
    /// `/bin/sh`, a slot for the candidate, then the arguments: for a program the
    /// kernel cannot execute (no `#!`), run as a shell script, as execvp(3) does.
    sh_argv: *mut *const c_char,
    envp: *const *const c_char,
    cwd: &'a CStr,
    stdio: [RawFd; 3],
    process_group: bool,
    setup: &'a ChildSetup,
    /// The errno of the step that failed; 0 if the child exec'd.
    error: AtomicI32,
}

/// Starts `command`. The process has run its setup and exec'd (or failed to, which is
/// the error returned) by the time this returns.
pub(crate) fn spawn(command: &Command<'_>) -> io::Result<Leader> {
    let to_c = |s: &str| {
        CString::new(s).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte"))
    };
    let program = command
        .argv
        .first()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "an empty command"))?;
    let args = command
        .argv
        .iter()
        .map(|a| to_c(a))
        .collect::<io::Result<Vec<_>>>()?;
    let env = command
        .env
        .iter()
        .map(|(k, v)| to_c(&format!("{k}={v}")))
        .collect::<io::Result<Vec<_>>>()?;
    let candidates = if program.contains('/') {
        vec![to_c(program)?]
    } else {
        let path = command
            .env
            .get("PATH")
            .map_or(PATH_WHEN_UNSET, String::as_str);
        path.split(':')
            .map(|dir| match dir {
                "" => to_c(program),
                dir => to_c(&format!("{dir}/{program}")),
            })
            .collect::<io::Result<Vec<_>>>()?
    };
    let cwd = CString::new(command.cwd.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte"))?;
    let null = std::ptr::null::<c_char>();
    let argv: Vec<*const c_char> = args
        .iter()
        .map(|a| a.as_ptr())
        .chain(std::iter::once(null))
        .collect();
    let sh = c"/bin/sh";
    let mut sh_argv: Vec<*const c_char> = [sh.as_ptr(), null]
        .into_iter()
        .chain(args.iter().skip(1).map(|a| a.as_ptr()))
        .chain(std::iter::once(null))
        .collect();
    let envp: Vec<*const c_char> = env
        .iter()
        .map(|e| e.as_ptr())
        .chain(std::iter::once(null))
        .collect();
    // Above 2, so placing one on stdin, stdout or stderr cannot overwrite another.
    let mut low = Vec::new();
    let mut stdio: [RawFd; 3] = [0; 3];
    for (slot, fd) in stdio.iter_mut().zip(command.stdio) {
        *slot = fd.as_raw_fd();
        if *slot < 3 {
            let high = rustix::io::fcntl_dupfd_cloexec(fd, 3)?;
            *slot = high.as_raw_fd();
            low.push(high);
        }
    }
    let child = ChildArgs {
        candidates: &candidates,
        argv: argv.as_ptr(),
        sh_argv: sh_argv.as_mut_ptr(),
        envp: envp.as_ptr(),
        cwd: &cwd,
        stdio,
        process_group: command.process_group,
        setup: command.setup,
        error: AtomicI32::new(0),
    };
    let stack = Stack::new()?;
    let mut pidfd: c_int = -1;
    let flags = libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD | libc::SIGCHLD;
    // SAFETY: sigset_t is plain data, filled in by sigfillset.
    let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut before: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: signals are blocked around the clone so no handler of this process runs
    // in the child (which shares its memory) before it has reset them; `child_main`
    // gets a pointer to `child`, which outlives the child's use of it because
    // CLONE_VFORK suspends this thread until the child has exec'd or exited; the stack
    // is mapped for that long too; the child writes only its own stack and `error`.
    let (pid, clone_error) = unsafe {
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut before);
        let pid = libc::clone(
            child_main,
            stack.top(),
            flags,
            std::ptr::from_ref(&child).cast_mut().cast::<c_void>(),
            &mut pidfd as *mut c_int,
        );
        let clone_error = io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, &before, std::ptr::null_mut());
        (pid, clone_error)
    };
    drop(stack);
    drop((sh_argv, low));
    if pid < 0 {
        if clone_error.raw_os_error() == Some(libc::EINVAL) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "starting a command needs pidfds, which this kernel lacks (Linux 5.4 or later)",
            ));
        }
        return Err(clone_error);
    }
    // SAFETY: with CLONE_PIDFD the kernel stored a new descriptor there.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    match child.error.load(Ordering::Acquire) {
        0 => Leader::new(pid, pidfd),
        errno => {
            // It has exited already; reap it so it leaves no zombie.
            let _ = rustix::process::waitid(
                rustix::process::WaitId::PidFd(pidfd.as_fd()),
                rustix::process::WaitIdOptions::EXITED,
            );
            Err(io::Error::from_raw_os_error(errno))
        }
    }
}

/// The child: setup, then exec. Records why it could not, and exits.
extern "C" fn child_main(arg: *mut c_void) -> c_int {
    // SAFETY: `spawn` passes a `ChildArgs` that lives until this process has exec'd.
    let args = unsafe { &*arg.cast::<ChildArgs<'_>>() };
    // SAFETY: this is the vfork-style child `setup_and_exec` is written for.
    let error = unsafe { setup_and_exec(args) };
    args.error.store(
        error.raw_os_error().unwrap_or(libc::EINVAL),
        Ordering::Release,
    );
    // SAFETY: _exit(2) ends this process only, running nothing of the parent's.
    unsafe { libc::_exit(127) }
}

/// What the child does, in the order std's own spawn does it: signals back to their
/// defaults, stdio, group or session, directory, the sandbox's setup, an empty signal
/// mask, and the exec. Returns only on failure.
///
/// # Safety
///
/// Only in the child of `spawn`: it shares the parent's memory, so it makes raw
/// syscalls and writes nothing but its own stack and the `sh_argv` slot.
unsafe fn setup_and_exec(args: &ChildArgs<'_>) -> io::Error {
    // Every signal goes back to its default (the table is the child's own copy): a
    // handler of the parent's would run on the parent's memory, and a sandbox command
    // must not inherit what the host process ignores (SIGPIPE, which Rust programs
    // ignore; SIGHUP under `nohup`; glibc's two internal signals, which a
    // `posix_spawn`ed parent may have inherited ignored). Raw rt_sigaction(2), since
    // glibc's wrapper refuses its internal signals: the kernel's struct starts with the
    // handler, and all zeroes is SIG_DFL with no flags and an empty mask.
    const SIGSETSIZE: usize = 8;
    for signal in 1..=64 {
        let mut old = [0u64; 4];
        // SAFETY: rt_sigaction(2) reading into and writing from local buffers as large as
        // the kernel's struct.
        unsafe {
            if libc::syscall(
                libc::SYS_rt_sigaction,
                signal,
                std::ptr::null::<u64>(),
                old.as_mut_ptr(),
                SIGSETSIZE,
            ) != 0
            {
                continue;
            }
            let handler = old[0] as libc::sighandler_t;
            if handler != libc::SIG_DFL {
                let default = [0u64; 4];
                libc::syscall(
                    libc::SYS_rt_sigaction,
                    signal,
                    default.as_ptr(),
                    std::ptr::null_mut::<u64>(),
                    SIGSETSIZE,
                );
            }
        }
    }
    for (target, fd) in args.stdio.iter().enumerate() {
        // SAFETY: dup2(2) of a descriptor the parent keeps open.
        if unsafe { libc::dup2(*fd, target as c_int) } < 0 {
            return io::Error::last_os_error();
        }
    }
    // SAFETY: plain syscalls.
    unsafe {
        if args.process_group && !args.setup.new_session && libc::setpgid(0, 0) < 0 {
            return io::Error::last_os_error();
        }
        if libc::chdir(args.cwd.as_ptr()) < 0 {
            return io::Error::last_os_error();
        }
        if let Err(e) = args.setup.apply() {
            return e;
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::pthread_sigmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
    }
    // execvp(3)'s search: a candidate that is missing is skipped, one that is there
    // but not executable is remembered, any other failure ends the search.
    let mut denied = false;
    for candidate in args.candidates {
        // SAFETY: NUL-terminated arrays the parent built.
        unsafe { libc::execve(candidate.as_ptr(), args.argv, args.envp) };
        let error = io::Error::last_os_error();
        match error.raw_os_error().unwrap_or(0) {
            libc::ENOEXEC => {
                // SAFETY: the slot after `/bin/sh` is this child's to fill.
                unsafe {
                    *args.sh_argv.add(1) = candidate.as_ptr();
                    libc::execve(c"/bin/sh".as_ptr(), args.sh_argv, args.envp);
                }
                return io::Error::last_os_error();
            }
            libc::EACCES => denied = true,
            libc::ENOENT | libc::ENOTDIR | libc::ESTALE | libc::ENODEV | libc::ETIMEDOUT => {}
            _ => return error,
        }
    }
    io::Error::from_raw_os_error(if denied { libc::EACCES } else { libc::ENOENT })
}

/// A mapped stack with a guard page below it, unmapped on drop.
struct Stack {
    base: *mut c_void,
    len: usize,
}

impl Stack {
    fn new() -> io::Result<Stack> {
        // SAFETY: sysconf(3) with a valid name.
        let guard = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        let len = STACK_BYTES + guard;
        // SAFETY: a fresh anonymous mapping, then its lowest page made inaccessible.
        unsafe {
            let base = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            );
            if base == libc::MAP_FAILED {
                return Err(io::Error::last_os_error());
            }
            let stack = Stack { base, len };
            if libc::mprotect(base, guard, libc::PROT_NONE) < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(stack)
        }
    }

    /// The stack's highest address, where a downward-growing stack starts.
    fn top(&self) -> *mut c_void {
        // SAFETY: one past the end of the mapping.
        unsafe { self.base.cast::<u8>().add(self.len).cast() }
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: the mapping `new` made, used by no one once the child has exec'd.
        unsafe { libc::munmap(self.base, self.len) };
    }
}

/// A started command's first process, waited for through its pidfd.
pub(crate) struct Leader {
    pid: i32,
    pidfd: AsyncFd<OwnedFd>,
    status: Option<ExitStatus>,
}

impl Leader {
    fn new(pid: i32, pidfd: OwnedFd) -> io::Result<Leader> {
        // SAFETY: the `OwnedFd` is the pidfd's only owner, kept (never replaced or
        // closed) for as long as the `AsyncFd` lives.
        let registered =
            unsafe { AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE) };
        let pidfd = match registered {
            Ok(pidfd) => pidfd,
            Err(e) => {
                // The command runs, but nothing could wait for it (the reactor is out of
                // room): end it rather than leave it unsupervised, and reap it.
                let (pidfd, cause) = e.into_parts();
                let _ = rustix::process::pidfd_send_signal(&pidfd, rustix::process::Signal::KILL);
                let _ = reap(&pidfd, true);
                return Err(cause);
            }
        };
        Ok(Leader {
            pid,
            pidfd,
            status: None,
        })
    }

    /// The process id (also the group id of a command in a group of its own).
    pub(crate) fn id(&self) -> i32 {
        self.pid
    }

    /// Waits for the process to exit and reaps it; later calls answer the same status.
    pub(crate) async fn wait(&mut self) -> io::Result<ExitStatus> {
        loop {
            if let Some(status) = self.status {
                return Ok(status);
            }
            let mut ready = self.pidfd.readable().await?;
            match reap(self.pidfd.get_ref(), false)? {
                Some(status) => self.status = Some(status),
                None => ready.clear_ready(),
            }
        }
    }
}

impl Drop for Leader {
    /// A process nobody waited for is reaped when it ends, by a thread of its own, so
    /// it never stays a zombie.
    fn drop(&mut self) {
        if self.status.is_some() {
            return;
        }
        let Ok(pidfd) = self.pidfd.get_ref().try_clone() else {
            return;
        };
        if let Ok(None) = reap(&pidfd, false) {
            std::thread::spawn(move || reap(&pidfd, true));
        }
    }
}

/// The exit status of the process behind `pidfd` once it has exited (reaping it), or
/// `None` if it has not yet and `block` is false.
fn reap(pidfd: &OwnedFd, block: bool) -> io::Result<Option<ExitStatus>> {
    use rustix::process::{waitid, WaitId, WaitIdOptions};
    let options = match block {
        true => WaitIdOptions::EXITED,
        false => WaitIdOptions::EXITED | WaitIdOptions::NOHANG,
    };
    let Some(status) = waitid(WaitId::PidFd(pidfd.as_fd()), options)? else {
        return Ok(None);
    };
    Ok(Some(
        match (status.exit_status(), status.terminating_signal()) {
            (Some(code), _) => ExitStatus::exited(code),
            (None, Some(signal)) => ExitStatus::signaled(signal),
            (None, None) => ExitStatus::exited(-1),
        },
    ))
}
