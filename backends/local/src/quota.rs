//! Disk limits: a sandbox with `Limits::disk_bytes` writes to a file system of its own,
//! of that size, so it cannot take more of the host's disk than its limit.
//!
//! Everything such a sandbox writes is on that file system: an overlay workspace's upper
//! and work directories (its mount point too), a copied workspace, and its temp
//! directory ([`SandboxDir::with_disk`] puts them beneath `disk/`). A write past the
//! limit fails with `ENOSPC` inside the sandbox, and as `ErrorKind::LimitExceeded`
//! through the backend's file operations.
//!
//! # Why an ext4 image on a loop device
//!
//! - **tmpfs with `size=`** would cap it too, but in memory: ten sandboxes with the
//!   server's default of 10 GiB each could take 100 GiB of RAM. A disk limit should
//!   spend disk.
//! - **Project quotas** (XFS, or ext4 with the `project` feature) cap a directory tree
//!   in place, but only on a file system made or mounted with them, which a host's root
//!   file system usually is not, and changing that is the operator's call, not a
//!   library's.
//! - **A sparse image file formatted ext4 and loop-mounted** needs only root and
//!   `/dev/loop-control`, works on whatever file system the backend's root is on, and
//!   costs the host what the sandbox holds (plus a few MiB of metadata), never more
//!   than the limit. Creating one takes tens of milliseconds (`mke2fs` of a sparse
//!   file; nothing is zeroed). The limits of all sandboxes together may exceed the
//!   host's free space: the images are sparse, so size `disk_bytes` for the sandboxes
//!   the host runs at once.
//!
//! The file system has no journal (it is scratch space: nothing remounts it after a
//! host restart), reserves no blocks for root, and is mounted `nosuid,nodev` like the
//! overlay over it; not `noexec`, since at `Isolation::Landlock` sandbox processes run
//! the programs they build from these very paths. Its metadata takes a little of the
//! limit (about 6% at 64 MiB, less on larger ones): the limit bounds what the host
//! gives, and the sandbox can store slightly less.
//!
//! Only a root backend can make one (a loop device and a mount), and only for a
//! workspace it makes: an in-place workspace is the template directory itself, which
//! no file system of the sandbox's can hold. Elsewhere `Capabilities::disk_limit` is
//! false and a spec asking for a disk limit is refused (`Unsupported`) by the core's
//! one check.
//!
//! # Lifecycle
//!
//! Nothing here needs undoing by hand. The loop device is attached with autoclear
//! ([`crate::loopdev`]), so it goes with the unmount of its file system; the mount is
//! beneath the sandbox directory, which destroy (and a failed create) unmounts whole
//! before deleting it (`crate::materialize::unmount_all`); and the image is a file in
//! that directory. After a host restart nothing is mounted or attached any more, and
//! destroy deletes the directory with the image in it.

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::{Command, Stdio};

use rustix::mount::MountFlags;
use sandcell::{Error, ErrorKind, Result};

use crate::layout::SandboxDir;
use crate::process::DEFAULT_PATH;

/// The smallest disk limit a sandbox can have: below it `mke2fs` cannot lay out a file
/// system with room for anything.
pub(crate) const MIN_BYTES: u64 = 1 << 20;

/// The program that formats an image (e2fsprogs).
const MKE2FS: &str = "mke2fs";

/// Mount options: a metadata error makes the file system read-only rather than let it
/// be written on; the inode tables of the sparse image read as zeros already, so the
/// kernel need not write them out in the background (which would grow the image); and
/// what the sandbox deletes is punched out of the image (`discard`), so the host's disk
/// gives back what the sandbox frees instead of keeping its high-water mark.
const MOUNT_OPTIONS: &std::ffi::CStr = c"errors=remount-ro,noinit_itable,discard";

/// Whether this host lets the backend give sandboxes disks of their own; `Err` says
/// what is missing.
pub(crate) fn probe() -> std::result::Result<(), String> {
    if !rustix::process::geteuid().is_root() {
        return Err("a loop device and a mount need root".to_owned());
    }
    if crate::namespace::find(MKE2FS).is_none() {
        return Err(format!(
            "{MKE2FS} is not on {DEFAULT_PATH}: install e2fsprogs"
        ));
    }
    crate::loopdev::available()
        .map_err(|e| format!("{} cannot be opened: {e}", crate::loopdev::CONTROL))?;
    if !ext4_known() {
        return Err("the kernel has no ext4 (neither built in nor as a module)".to_owned());
    }
    Ok(())
}

/// Whether the kernel has ext4 now, or as a module a mount would load.
fn ext4_known() -> bool {
    let listed = std::fs::read_to_string("/proc/filesystems")
        .is_ok_and(|list| list.lines().any(|line| line.trim_end().ends_with("\text4")));
    listed || {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        std::fs::read_dir(format!("/lib/modules/{}/kernel/fs/ext4", release.trim())).is_ok_and(
            |mut entries| {
                entries.any(|e| {
                    e.is_ok_and(|e| e.file_name().to_string_lossy().starts_with("ext4.ko"))
                })
            },
        )
    }
}

/// Makes the sandbox in `dir` a file system of its own of `bytes` bytes, mounted at
/// `dir.disk()`: a sparse image, formatted and attached to a loop device. Made first,
/// before anything else of the sandbox's, so what follows is written on it. On an
/// error, what was made is removed with the sandbox directory by the caller (an
/// unattached image, or a mount `unmount_all` finds).
pub(crate) fn make(dir: &SandboxDir, bytes: u64) -> Result<()> {
    if bytes < MIN_BYTES {
        return Err(Error::invalid_input(format!(
            "limits.disk_bytes is {bytes}: the local backend's smallest disk is \
             {MIN_BYTES} bytes (1 MiB)"
        )));
    }
    let mke2fs = crate::namespace::find(MKE2FS).ok_or_else(|| {
        Error::unsupported(format!(
            "a disk limit needs {MKE2FS}, which is no longer on {DEFAULT_PATH}: install e2fsprogs"
        ))
    })?;
    std::fs::create_dir_all(dir.disk())
        .map_err(|e| Error::io("creating the sandbox directory", e))?;
    let image_path = dir.disk_image();
    let image = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC)
        .open(&image_path)
        .map_err(|e| Error::io("creating the sandbox's disk image", e))?;
    // Sparse: the host gives only what is written.
    image.set_len(bytes).map_err(|e| {
        Error::with_source(
            ErrorKind::InvalidInput,
            format!(
                "limits.disk_bytes is {bytes}: more than one file on this host's file \
                 system can hold ({e})"
            ),
            e,
        )
    })?;
    format(&mke2fs, &image_path)?;
    let attached = crate::loopdev::attach(&image)
        .map_err(|e| Error::io("attaching the sandbox's disk image to a loop device", e))?;
    rustix::mount::mount(
        &attached.path,
        dir.disk(),
        "ext4",
        MountFlags::NOSUID | MountFlags::NODEV,
        Some(MOUNT_OPTIONS),
    )
    .map_err(|e| Error::io("mounting the sandbox's disk", e.into()))?;
    // The mount now holds the device; dropping `attached` leaves it to autoclear.
    Ok(())
}

/// Formats the image at `path` as ext4 for a sandbox: no journal, no blocks reserved
/// for root, nothing zeroed. Runs `mke2fs` with an environment built here (a host
/// helper gets nothing of a client's).
fn format(mke2fs: &Path, image: &Path) -> Result<()> {
    let out = Command::new(mke2fs)
        .args([
            "-q",
            "-F",
            "-t",
            "ext4",
            "-O",
            "^has_journal,^resize_inode",
            "-m",
            "0",
        ])
        .args(["-E", "nodiscard,lazy_itable_init=1"])
        .arg(image)
        .env_clear()
        .env("PATH", DEFAULT_PATH)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| Error::io(format_args!("starting {}", mke2fs.display()), e))?;
    if out.status.success() {
        return Ok(());
    }
    Err(Error::new(
        ErrorKind::Backend,
        format!(
            "formatting the sandbox's disk: {MKE2FS} failed ({}): {}",
            out.status,
            // Its messages name the image; the caller's error names no host path.
            String::from_utf8_lossy(&out.stderr)
                .replace(&*image.to_string_lossy(), "the image")
                .trim()
        ),
    ))
}

/// `error` as what it is for a sandbox with a disk of its own of `limit` bytes (none:
/// unchanged): a full disk is `LimitExceeded`, the limit at work, rather than a
/// backend failure. `what` replaces the message where it may name host paths.
pub(crate) fn full_disk(error: Error, limit: Option<u64>, what: Option<&str>) -> Error {
    let Some(limit) = limit else {
        return error;
    };
    if error.kind() != ErrorKind::Backend || !is_full(&error) {
        return error;
    }
    let message = match what {
        Some(what) => what.to_owned(),
        None => error.to_string(),
    };
    Error::new(
        ErrorKind::LimitExceeded,
        format!("{message}: the sandbox's disk is full (limits.disk_bytes is {limit})"),
    )
}

/// Whether `error` was caused by a full disk (or a spent quota).
fn is_full(error: &Error) -> bool {
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        let errno = cause
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::raw_os_error);
        if matches!(errno, Some(libc::ENOSPC | libc::EDQUOT)) {
            return true;
        }
        source = cause.source();
    }
    false
}
