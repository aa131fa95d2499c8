//! The crate's only `unsafe`: raw system calls without a safe wrapper (Landlock), and
//! work done in the child between `fork` and `exec`.

#![allow(unsafe_code)]

use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use rustix::io::Errno;

const SYS_LANDLOCK_CREATE_RULESET: libc::c_long = 444;
const SYS_LANDLOCK_ADD_RULE: libc::c_long = 445;
const SYS_LANDLOCK_RESTRICT_SELF: libc::c_long = 446;
const LANDLOCK_CREATE_RULESET_VERSION: u32 = 1;
const LANDLOCK_RULE_PATH_BENEATH: libc::c_int = 1;

/// `struct landlock_path_beneath_attr` (packed in the kernel's ABI).
#[repr(C, packed)]
struct PathBeneath {
    allowed_access: u64,
    parent_fd: i32,
}

fn errno() -> Errno {
    Errno::from_raw_os_error(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
}

/// The Landlock ABI version the kernel supports.
pub(crate) fn landlock_abi() -> Result<u32, Errno> {
    // SAFETY: with the VERSION flag the kernel reads no attribute (NULL, size 0) and
    // returns the ABI version or -1 with errno.
    let r = unsafe {
        libc::syscall(
            SYS_LANDLOCK_CREATE_RULESET,
            std::ptr::null::<u8>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if r < 0 {
        Err(errno())
    } else {
        Ok(r as u32)
    }
}

/// Creates a ruleset that handles the filesystem rights in `handled_access_fs`.
pub(crate) fn landlock_create_ruleset(handled_access_fs: u64) -> Result<OwnedFd, Errno> {
    // The first field of `struct landlock_ruleset_attr`; passing only its size is
    // valid on every ABI version.
    let attr: u64 = handled_access_fs;
    // SAFETY: `attr` lives across the call and its size is passed exactly; the kernel
    // returns a new descriptor we then own, or -1.
    let r = unsafe {
        libc::syscall(
            SYS_LANDLOCK_CREATE_RULESET,
            &attr as *const u64,
            std::mem::size_of::<u64>(),
            0u32,
        )
    };
    if r < 0 {
        return Err(errno());
    }
    // SAFETY: the kernel just returned this descriptor to us and nothing else owns it.
    Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(r as i32) })
}

/// Allows `access` beneath the file or directory open as `target`.
pub(crate) fn landlock_add_path_rule(
    ruleset: BorrowedFd<'_>,
    target: BorrowedFd<'_>,
    access: u64,
) -> Result<(), Errno> {
    let attr = PathBeneath {
        allowed_access: access,
        parent_fd: target.as_raw_fd(),
    };
    // SAFETY: both descriptors are borrowed and open for the call; `attr` outlives it
    // and has the kernel's packed layout.
    let r = unsafe {
        libc::syscall(
            SYS_LANDLOCK_ADD_RULE,
            ruleset.as_raw_fd(),
            LANDLOCK_RULE_PATH_BENEATH,
            &attr as *const PathBeneath,
            0u32,
        )
    };
    if r < 0 {
        Err(errno())
    } else {
        Ok(())
    }
}

/// What the child does before it execs.
#[derive(Debug, Default)]
pub(crate) struct ChildSetup {
    /// `cgroup.procs` descriptors to join.
    pub(crate) cgroup_procs: Vec<OwnedFd>,
    /// A Landlock ruleset to enforce.
    pub(crate) landlock: Option<std::sync::Arc<OwnedFd>>,
    /// Largest file the process may write (`RLIMIT_FSIZE`), from `Limits::disk_bytes`.
    pub(crate) max_file_bytes: Option<u64>,
}

/// Makes the child join the sandbox's cgroups, drop core dumps and enforce its Landlock
/// ruleset before it execs, so not even its first instruction runs outside them (moving
/// it after `spawn` returns would race a fast `fork`).
pub(crate) fn before_exec(cmd: &mut tokio::process::Command, setup: ChildSetup) {
    let no_core = rustix::process::Rlimit {
        current: Some(0),
        maximum: Some(0),
    };
    let file_size = setup.max_file_bytes.map(|bytes| rustix::process::Rlimit {
        current: Some(bytes),
        maximum: Some(bytes),
    });
    // SAFETY: the closure runs in the forked child, where only async-signal-safe work is
    // allowed. It makes raw syscalls only — write(2) of a static buffer to descriptors
    // the parent opened, setrlimit(2), prctl(2) and landlock_restrict_self(2) — and
    // allocates nothing; errors convert from an errno without allocating.
    unsafe {
        cmd.pre_exec(move || {
            for fd in &setup.cgroup_procs {
                // "0" means "the writing process".
                rustix::io::write(fd, b"0")?;
            }
            rustix::process::setrlimit(rustix::process::Resource::Core, no_core)?;
            if let Some(limit) = file_size {
                rustix::process::setrlimit(rustix::process::Resource::Fsize, limit)?;
            }
            if let Some(ruleset) = &setup.landlock {
                rustix::thread::set_no_new_privs(true)?;
                if libc::syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset.as_raw_fd(), 0u32) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}
