//! The move a rename falls back to where rename(2) cannot act: a directory of an
//! overlay workspace's lower layer (the template) answers `EXDEV`. The tree is copied
//! beside its source (files, directories and symlinks; modes and modification times
//! kept), then the source is removed, as `mv` does across file systems. A copy that
//! fails part-way is removed again, so the source is never lost and nothing half-made
//! is left.

use std::ffi::CStr;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::fs::{AtFlags, Mode, OFlags, Timespec, Timestamps};
use rustix::io::Errno;

use super::{list_names, open_subdir, remove_tree};

/// Moves directory `src_name` of `src_parent` to `dst_name` of `dst_parent` (which
/// must not exist) by copying it and removing the source.
pub(super) fn move_tree(
    src_parent: BorrowedFd<'_>,
    src_name: &CStr,
    dst_parent: BorrowedFd<'_>,
    dst_name: &CStr,
) -> rustix::io::Result<()> {
    if let Err(e) = copy_dir(src_parent, src_name, dst_parent, dst_name) {
        let _ = remove_tree(dst_parent, dst_name);
        return Err(e);
    }
    remove_tree(src_parent, src_name)
}

fn copy_dir(
    src_parent: BorrowedFd<'_>,
    src_name: &CStr,
    dst_parent: BorrowedFd<'_>,
    dst_name: &CStr,
) -> rustix::io::Result<()> {
    let src = open_subdir(src_parent, src_name)?;
    let st = rustix::fs::fstat(&src)?;
    // Writable by its owner while it fills; its own mode is set once it is full.
    rustix::fs::mkdirat(dst_parent, dst_name, Mode::from_raw_mode(0o700))?;
    let dst = open_subdir(dst_parent, dst_name)?;
    for name in list_names(src.as_fd())? {
        copy_entry(src.as_fd(), &name, dst.as_fd())?;
    }
    finish(&dst, &st)
}

fn copy_entry(
    src_dir: BorrowedFd<'_>,
    name: &CStr,
    dst_dir: BorrowedFd<'_>,
) -> rustix::io::Result<()> {
    let st = rustix::fs::statat(src_dir, name, AtFlags::SYMLINK_NOFOLLOW)?;
    match rustix::fs::FileType::from_raw_mode(st.st_mode) {
        rustix::fs::FileType::Directory => copy_dir(src_dir, name, dst_dir, name),
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
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            )?;
            let (mut from, mut to) = (File::from(from), File::from(to));
            std::io::copy(&mut from, &mut to)
                .map_err(|e| e.raw_os_error().map_or(Errno::IO, Errno::from_raw_os_error))?;
            finish(&to.into(), &st)
        }
        // A FIFO, socket or device in a template has no meaning a copy could keep.
        _ => Err(Errno::OPNOTSUPP),
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
