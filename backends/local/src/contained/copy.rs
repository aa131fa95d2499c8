//! Copying trees without following links: the move a rename falls back to where
//! rename(2) cannot act (a directory of an overlay workspace's lower layer, the
//! template, answers `EXDEV`: the tree is copied beside its source, then the source
//! removed, as `mv` does across file systems), and the copy of a workspace or of an
//! overlay's upper layer a clone starts from. Files, directories and symlinks are
//! copied with their modes and modification times; every directory and file is opened
//! relative to its parent with `O_NOFOLLOW`, so a sandbox process swapping an entry for
//! a link cannot redirect the copy. A copy that fails part-way is removed again.

use std::ffi::{CStr, CString};
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{AtFlags, Mode, OFlags, Timespec, Timestamps};
use rustix::io::Errno;

use sandcell::{Error, Result};

use super::{list_names, open_subdir, remove_tree};

/// Moves directory `src_name` of `src_parent` to `dst_name` of `dst_parent` (which
/// must not exist) by copying it and removing the source.
pub(super) fn move_tree(
    src_parent: BorrowedFd<'_>,
    src_name: &CStr,
    dst_parent: BorrowedFd<'_>,
    dst_name: &CStr,
) -> rustix::io::Result<()> {
    let copier = Copier {
        layer: false,
        dev: None,
    };
    if let Err(e) = copier.copy_dir(src_parent, src_name, dst_parent, dst_name) {
        let _ = remove_tree(dst_parent, dst_name);
        return Err(e);
    }
    remove_tree(src_parent, src_name)
}

/// Copies the directory at host path `src` to `dst` (which must not exist; its parent
/// must). With `layer`, `src` is an overlay's upper layer: its whiteouts (0:0
/// character devices) and opaque-directory marks are copied too. Directories on
/// another file system than `src` (host mounts inside a workspace) are left out.
pub(crate) fn copy_tree(src: &Path, dst: &Path, layer: bool) -> Result<()> {
    let fail = |e: Errno| {
        super::fail(
            format_args!("copying {} to {}", src.display(), dst.display()),
            e,
        )
    };
    let open = |path: &Path| {
        rustix::fs::open(
            path,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
    };
    let (Some(dst_parent), Some(dst_name)) = (dst.parent(), dst.file_name()) else {
        return Err(Error::invalid_input(format!(
            "cannot copy to {}",
            dst.display()
        )));
    };
    let dst_name = CString::new(dst_name.as_bytes())
        .map_err(|_| Error::invalid_input("a path with a NUL byte"))?;
    let src_fd = open(src).map_err(fail)?;
    let dst_parent = open(dst_parent).map_err(fail)?;
    let copier = Copier {
        layer,
        dev: Some(rustix::fs::fstat(&src_fd).map_err(fail)?.st_dev),
    };
    if let Err(e) = copier.copy_dir(src_fd.as_fd(), c".", dst_parent.as_fd(), &dst_name) {
        let _ = remove_tree(dst_parent.as_fd(), &dst_name);
        return Err(fail(e));
    }
    Ok(())
}

/// How a tree is copied.
struct Copier {
    /// Copy an overlay layer's whiteouts and opaque marks.
    layer: bool,
    /// Stay on this file system: a directory on another is left out.
    dev: Option<u64>,
}

/// Where overlayfs marks a directory opaque (`userxattr` mounts use the second).
const OPAQUE_XATTRS: [&CStr; 2] = [c"trusted.overlay.opaque", c"user.overlay.opaque"];

impl Copier {
    fn copy_dir(
        &self,
        src_parent: BorrowedFd<'_>,
        src_name: &CStr,
        dst_parent: BorrowedFd<'_>,
        dst_name: &CStr,
    ) -> rustix::io::Result<()> {
        let src = open_subdir(src_parent, src_name)?;
        let st = rustix::fs::fstat(&src)?;
        if self.dev.is_some_and(|dev| dev != st.st_dev) {
            return Ok(());
        }
        // Writable by its owner while it fills; its own mode is set once it is full.
        rustix::fs::mkdirat(dst_parent, dst_name, Mode::from_raw_mode(0o700))?;
        let dst = open_subdir(dst_parent, dst_name)?;
        if self.layer {
            for name in OPAQUE_XATTRS {
                let mut value = [0u8; 8];
                if let Ok(n) = rustix::fs::fgetxattr(&src, name, &mut value) {
                    rustix::fs::fsetxattr(
                        &dst,
                        name,
                        &value[..n],
                        rustix::fs::XattrFlags::empty(),
                    )?;
                }
            }
        }
        for name in list_names(src.as_fd())? {
            self.copy_entry(src.as_fd(), &name, dst.as_fd())?;
        }
        finish(&dst, &st)
    }

    fn copy_entry(
        &self,
        src_dir: BorrowedFd<'_>,
        name: &CStr,
        dst_dir: BorrowedFd<'_>,
    ) -> rustix::io::Result<()> {
        let st = rustix::fs::statat(src_dir, name, AtFlags::SYMLINK_NOFOLLOW)?;
        match rustix::fs::FileType::from_raw_mode(st.st_mode) {
            rustix::fs::FileType::Directory => self.copy_dir(src_dir, name, dst_dir, name),
            rustix::fs::FileType::CharacterDevice if self.layer && st.st_rdev == 0 => {
                rustix::fs::mknodat(
                    dst_dir,
                    name,
                    rustix::fs::FileType::CharacterDevice,
                    Mode::from_raw_mode(st.st_mode & 0o777),
                    0,
                )
            }
            rustix::fs::FileType::Symlink => {
                let target = rustix::fs::readlinkat(src_dir, name, Vec::new())?;
                rustix::fs::symlinkat(target.as_c_str(), dst_dir, name)
            }
            rustix::fs::FileType::RegularFile => {
                let from = rustix::fs::openat(
                    src_dir,
                    name,
                    OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )?;
                let to = rustix::fs::openat(
                    dst_dir,
                    name,
                    OFlags::WRONLY
                        | OFlags::CREATE
                        | OFlags::EXCL
                        | OFlags::NOFOLLOW
                        | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o600),
                )?;
                let (mut from, mut to) = (File::from(from), File::from(to));
                std::io::copy(&mut from, &mut to)
                    .map_err(|e| e.raw_os_error().map_or(Errno::IO, Errno::from_raw_os_error))?;
                finish(&to.into(), &st)
            }
            // A FIFO, socket or device in a template has no meaning a copy could keep; in
            // a workspace one is left out, as an export leaves it out.
            _ if self.dev.is_some() => Ok(()),
            _ => Err(Errno::OPNOTSUPP),
        }
    }
}

/// Gives a copied file or directory its source's mode and times.
fn finish(fd: &OwnedFd, st: &rustix::fs::Stat) -> rustix::io::Result<()> {
    rustix::fs::fchmod(fd, Mode::from_raw_mode(st.st_mode & 0o7777))?;
    // `Stat`'s field types differ between architectures.
    #[allow(clippy::unnecessary_cast, clippy::useless_conversion)]
    let time = |sec, nsec| Timespec {
        tv_sec: sec as _,
        tv_nsec: nsec as _,
    };
    let times = Timestamps {
        last_access: time(st.st_atime, st.st_atime_nsec),
        last_modification: time(st.st_mtime, st.st_mtime_nsec),
    };
    rustix::fs::futimens(fd, &times)
}
