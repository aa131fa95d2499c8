//! The crate's only `unsafe`: work done in the child between `fork` and `exec`.

#![allow(unsafe_code)]

use std::os::fd::OwnedFd;

/// Makes the child join the sandbox's cgroups and drop core dumps before it execs, so
/// not even its first instruction runs outside them (moving it after `spawn` returns
/// would race a fast `fork`).
pub(crate) fn before_exec(cmd: &mut tokio::process::Command, cgroup_procs: Vec<OwnedFd>) {
    let no_core = rustix::process::Rlimit {
        current: Some(0),
        maximum: Some(0),
    };
    // SAFETY: the closure runs in the forked child, where only async-signal-safe work is
    // allowed. It makes two kinds of raw syscalls — write(2) of a static buffer to
    // descriptors the parent opened, and setrlimit(2) — and allocates nothing; errors
    // convert from an errno without allocating.
    unsafe {
        cmd.pre_exec(move || {
            for fd in &cgroup_procs {
                // "0" means "the writing process".
                rustix::io::write(fd, b"0")?;
            }
            rustix::process::setrlimit(rustix::process::Resource::Core, no_core)?;
            Ok(())
        });
    }
}
