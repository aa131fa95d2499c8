//! Landlock rulesets for `Isolation::Landlock`: what a sandbox process may read, write
//! and execute, built in the parent and enforced by the child before it execs.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};
use sandcell::{Error, Result};

use crate::sys;

// Access rights from <linux/landlock.h>.
const EXECUTE: u64 = 1 << 0;
const WRITE_FILE: u64 = 1 << 1;
const READ_FILE: u64 = 1 << 2;
const READ_DIR: u64 = 1 << 3;
/// Every right of ABI 1 (bits 0 to 12: remove, make dir/file/link/device ...).
const ABI1_ALL: u64 = (1 << 13) - 1;
const REFER: u64 = 1 << 13;
const TRUNCATE: u64 = 1 << 14;

/// Device files every program expects to open for writing.
const WRITABLE_DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/tty",
    "/dev/random",
    "/dev/urandom",
];

/// The kernel's Landlock ABI version, or why there is none.
pub(crate) fn abi() -> Result<u32> {
    sys::landlock_abi().map_err(|errno| {
        Error::unsupported(format!(
            "isolation level Landlock is not available: the kernel answered {errno} (Landlock needs Linux 5.13 or newer with \"landlock\" in its lsm= list)"
        ))
    })
}

/// A ruleset for one sandbox process: read and execute beneath `readable`, everything
/// beneath `writable`, read and write on the usual device files.
pub(crate) fn ruleset(abi: u32, readable: &[PathBuf], writable: &[PathBuf]) -> Result<OwnedFd> {
    let mut handled = ABI1_ALL;
    if abi >= 2 {
        handled |= REFER;
    }
    if abi >= 3 {
        handled |= TRUNCATE;
    }
    let file_write = WRITE_FILE | READ_FILE | (handled & TRUNCATE);
    let fd = sys::landlock_create_ruleset(handled)
        .map_err(|e| Error::io("creating a Landlock ruleset", e.into()))?;
    for path in readable {
        add(&fd, path, READ_FILE | READ_DIR | EXECUTE)?;
    }
    for path in writable {
        add(&fd, path, handled)?;
    }
    for device in WRITABLE_DEVICES {
        let device = Path::new(device);
        if device.exists() {
            add(&fd, device, file_write)?;
        }
    }
    Ok(fd)
}

fn add(ruleset: &OwnedFd, path: &Path, mut access: u64) -> Result<()> {
    let target =
        rustix::fs::open(path, OFlags::PATH | OFlags::CLOEXEC, Mode::empty()).map_err(|e| {
            Error::io(
                format_args!("opening {} for a Landlock rule", path.display()),
                e.into(),
            )
        })?;
    let is_dir = rustix::fs::fstat(&target)
        .map(|st| {
            rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Directory
        })
        .unwrap_or(false);
    if !is_dir {
        // Rules on files may only carry rights that apply to files.
        access &= EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE;
    }
    sys::landlock_add_path_rule(ruleset.as_fd(), target.as_fd(), access).map_err(|e| {
        Error::io(
            format_args!("adding a Landlock rule for {}", path.display()),
            e.into(),
        )
    })
}
