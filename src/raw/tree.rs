//! Directory trees walked through descriptors, never through a followed link: listing,
//! removing, copying and moving them. Every directory is opened relative to its parent
//! with `O_NOFOLLOW`, so a sandbox process swapping an entry for a symlink mid-walk can
//! neither redirect a copy nor make a removal reach outside the tree. The local
//! backend's workspaces and clones and Docker's host-directory workspaces use these.
//!
//! A tree is copied with its files, directories and symlinks, their owners (where the
//! copier may set them), modes and modification times. A copy that fails part-way is removed again.

use std::ffi::{CStr, CString};
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{AtFlags, Dir, Mode, OFlags, Timespec, Timestamps};
use rustix::io::Errno;

use crate::error::{Error, Result};

/// Opens directory `name` of `parent` for reading, refusing a symlink (`ELOOP` or
/// `ENOTDIR`).
pub fn open_subdir(parent: BorrowedFd<'_>, name: &CStr) -> rustix::io::Result<OwnedFd> {
    rustix::fs::openat(
        parent,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

/// The names in directory `dir` (any descriptor of it, `O_PATH` too), sorted by bytes,
/// without `.` and `..`. Read in full before the caller changes the directory, since
/// deleting while reading may skip entries on some file systems.
pub fn list_names(dir: BorrowedFd<'_>) -> rustix::io::Result<Vec<CString>> {
    let fd = rustix::fs::openat(
        dir,
        c".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let mut names = Vec::new();
    for entry in Dir::new(fd)? {
        let entry = entry?;
        let name = entry.file_name();
        if name != c"." && name != c".." {
            names.push(name.to_owned());
        }
    }
    names.sort();
    Ok(names)
}

/// Removes directory `name` in `parent` and everything in it. Directories are opened
/// with `O_NOFOLLOW`, and entries are unlinked before being looked into, so a symlink
/// is only ever removed, never followed. One descriptor is held per level.
pub fn remove_tree(parent: BorrowedFd<'_>, name: &CStr) -> rustix::io::Result<()> {
    struct Level {
        fd: OwnedFd,
        name: CString,
        pending: Vec<CString>,
        relists: u8,
    }
    let open_level = |parent: BorrowedFd<'_>, name: &CStr| -> rustix::io::Result<Level> {
        let fd = open_subdir(parent, name)?;
        let pending = list_names(fd.as_fd())?;
        Ok(Level {
            fd,
            name: name.to_owned(),
            pending,
            relists: 0,
        })
    };
    let mut stack = vec![open_level(parent, name)?];
    while let Some(level) = stack.last_mut() {
        if let Some(child) = level.pending.pop() {
            match rustix::fs::unlinkat(&level.fd, child.as_c_str(), AtFlags::empty()) {
                Ok(()) | Err(Errno::NOENT) => {}
                // Linux answers unlink(2) of a directory with EISDIR.
                Err(Errno::ISDIR) => match open_level(level.fd.as_fd(), &child) {
                    Ok(next) => stack.push(next),
                    Err(Errno::NOENT) => {}
                    // Swapped for a non-directory since the unlink: unlink that instead.
                    Err(Errno::NOTDIR | Errno::LOOP) => {
                        rustix::fs::unlinkat(&level.fd, child.as_c_str(), AtFlags::empty())?
                    }
                    Err(e) => return Err(e),
                },
                Err(e) => return Err(e),
            }
            continue;
        }
        let Some(mut done) = stack.pop() else { break };
        let above = stack.last().map_or(parent, |l| l.fd.as_fd());
        match rustix::fs::unlinkat(above, done.name.as_c_str(), AtFlags::REMOVEDIR) {
            Ok(()) | Err(Errno::NOENT) => {}
            // Something was created in it meanwhile: clear it again, a few times at most.
            Err(Errno::NOTEMPTY | Errno::EXIST) if done.relists < 3 => {
                done.relists += 1;
                done.pending = list_names(done.fd.as_fd())?;
                stack.push(done);
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Moves directory `src_name` of `src_parent` to `dst_name` of `dst_parent` (which
/// must not exist) by copying it and removing the source.
pub fn move_tree(
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

/// Copies the directory at host path `src` to `dst`, which must not exist (its parent
/// must). Directories on another file system than `src` (host mounts inside a
/// workspace) are left out, as are FIFOs, sockets and devices.
///
/// # Errors
/// The first failing call, as its [`std::io::ErrorKind`] maps (`NotFound`,
/// `AlreadyExists` for an existing `dst`, `PermissionDenied`); nothing is left at `dst`.
pub fn copy_tree(src: &Path, dst: &Path) -> Result<()> {
    copy_to_new(src, dst, false)
}

/// [`copy_tree`] of an overlay's upper layer: its whiteouts (0:0 character devices)
/// and opaque-directory marks are copied too, so the copy is the same layer over the
/// same lower directory. Copying whiteouts needs `CAP_MKNOD`.
///
/// # Errors
/// As [`copy_tree`].
pub fn copy_layer(src: &Path, dst: &Path) -> Result<()> {
    copy_to_new(src, dst, true)
}

fn copy_to_new(src: &Path, dst: &Path, layer: bool) -> Result<()> {
    let fail = |e: Errno| {
        Error::io(
            format_args!("copying {} to {}", src.display(), dst.display()),
            e.into(),
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

/// Where overlayfs marks a directory opaque. Every overlay here is mounted by root,
/// which uses the `trusted.` mark; a `user.overlay.opaque` is a sandbox's own extended
/// attribute and is never taken for overlay metadata.
const OPAQUE_XATTRS: [&CStr; 1] = [c"trusted.overlay.opaque"];

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
                )?;
                own_entry(dst_dir, name, &st)
            }
            rustix::fs::FileType::Symlink => {
                let target = rustix::fs::readlinkat(src_dir, name, Vec::new())?;
                rustix::fs::symlinkat(target.as_c_str(), dst_dir, name)?;
                own_entry(dst_dir, name, &st)
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

/// Gives a copied file or directory its source's owner, mode and times. The owner
/// first, since a change of owner clears set-user-ID bits.
fn finish(fd: &OwnedFd, st: &rustix::fs::Stat) -> rustix::io::Result<()> {
    permitted(rustix::fs::fchown(fd, Some(uid(st)), Some(gid(st))))?;
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

/// Gives entry `name` of `dir` (a link or whiteout, never followed) `st`'s owner.
fn own_entry(dir: BorrowedFd<'_>, name: &CStr, st: &rustix::fs::Stat) -> rustix::io::Result<()> {
    permitted(rustix::fs::chownat(
        dir,
        name,
        Some(uid(st)),
        Some(gid(st)),
        AtFlags::SYMLINK_NOFOLLOW,
    ))
}

fn uid(st: &rustix::fs::Stat) -> rustix::fs::Uid {
    rustix::fs::Uid::from_raw(st.st_uid)
}

fn gid(st: &rustix::fs::Stat) -> rustix::fs::Gid {
    rustix::fs::Gid::from_raw(st.st_gid)
}

/// A change of owner only root may make (the source owned by another user) is left
/// undone: the copy is then owned by the copier, as `cp -r` leaves it. A copy made as
/// root keeps every owner, which a container's user needs of its workspace.
fn permitted(result: rustix::io::Result<()>) -> rustix::io::Result<()> {
    match result {
        Err(Errno::PERM) => Ok(()),
        other => other,
    }
}
