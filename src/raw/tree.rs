//! Directory trees walked through descriptors, never through a followed link: listing,
//! removing, copying and moving them. Every directory is opened relative to its parent
//! with `O_NOFOLLOW`, so a sandbox process swapping an entry for a symlink mid-walk can
//! neither redirect a copy nor make a removal reach outside the tree. The local
//! backend's workspaces and clones and Docker's host-directory workspaces use these.
//!
//! A tree is copied with its files, directories and symlinks, their owners (where the
//! copier may set them), modes and modification times. A copy that fails part-way is removed again.
//!
//! A sandbox can make a tree of any depth (`mkdir d; cd d` in a loop). No walk here
//! recurses, so none can overflow its thread's stack (which aborts the whole process),
//! and each keeps only the [`OPEN_LEVELS`] directories nearest its position open
//! ([`DirStack`]), so none can run the process out of descriptors.

use std::ffi::{CStr, CString};
use std::ops::ControlFlow;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{AtFlags, Dir, Mode, OFlags};
use rustix::io::Errno;

use crate::error::Result;

#[path = "tree_copy.rs"]
mod copy;
#[path = "dir_stack.rs"]
mod dir_stack;
#[path = "walk_names.rs"]
mod walk_names;
use copy::{copy_to_new, Copier};
pub use dir_stack::{DirStack, Level, OPEN_LEVELS};
pub use walk_names::{held_walk_bytes, IntoNames, Names, MAX_HELD_WALK_BYTES};

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

/// Whether the directory open as `dir` is the root of a mount: a host directory bound
/// into a workspace, say, which a walk of the workspace must not go into (a bind mount
/// of a directory on the workspace's own file system has its device number, so
/// comparing devices does not tell). False where the kernel cannot say (before 5.8).
pub fn is_mount_root(dir: BorrowedFd<'_>) -> bool {
    use rustix::fs::{StatxAttributes, StatxFlags};
    match rustix::fs::statx(
        dir,
        c"",
        AtFlags::EMPTY_PATH | AtFlags::NO_AUTOMOUNT,
        StatxFlags::empty(),
    ) {
        Ok(st) => {
            st.stx_attributes_mask.contains(StatxAttributes::MOUNT_ROOT)
                && st.stx_attributes.contains(StatxAttributes::MOUNT_ROOT)
        }
        Err(_) => false,
    }
}

/// Most names [`list_names`] holds for one directory.
pub const MAX_WALK_NAMES: usize = 250_000;
/// Most bytes of names [`list_names`] holds for one directory.
pub const MAX_WALK_NAME_BYTES: usize = 32 << 20;

/// The names in directory `dir` (any descriptor of it, `O_PATH` too), sorted by bytes,
/// without `.` and `..`. Read in full before the caller changes the directory, since
/// deleting while reading may skip entries on some file systems.
///
/// A directory of more than [`MAX_WALK_NAMES`] names, or [`MAX_WALK_NAME_BYTES`] of
/// them, fails with `EFBIG` (which [`Error::io`](crate::Error::io) reads as
/// `LimitExceeded`) as soon as the reading passes it: hard links cost no inodes, so a
/// sandbox can make a directory of millions of names, and walks that go in sorted
/// order (snapshots, exports, copies) hold one directory's names whole. And the
/// listings held at once share [`MAX_HELD_WALK_BYTES`]: one that finds it spent fails
/// with `ENOMEM` (read as `LimitExceeded` too), except a small directory's, which
/// never draws on it ([`Names`]).
pub fn list_names(dir: BorrowedFd<'_>) -> rustix::io::Result<Names> {
    let (mut count, mut bytes) = (0usize, 0usize);
    let mut names = Names::new();
    let mut failed = None;
    for_each_name(dir, |name| {
        count += 1;
        bytes += name.to_bytes().len();
        let held = match count > MAX_WALK_NAMES || bytes > MAX_WALK_NAME_BYTES {
            true => Err(Errno::FBIG),
            false => names.push(name.to_owned()),
        };
        match held {
            Ok(()) => ControlFlow::Continue(()),
            Err(e) => {
                failed = Some(e);
                ControlFlow::Break(())
            }
        }
    })?;
    if let Some(e) = failed {
        return Err(e);
    }
    names.sort();
    Ok(names)
}

/// As [`list_names`], but asks `admit` about each name as it is read and stops at the
/// first it refuses, answering that refusal (the outer result is the directory's
/// own failure). Bounds what a huge directory costs before its size is known: see
/// [`ListingLimit`](crate::raw::ListingLimit).
pub fn list_names_within(
    dir: BorrowedFd<'_>,
    mut admit: impl FnMut(&CStr) -> crate::Result<()>,
) -> rustix::io::Result<crate::Result<Vec<CString>>> {
    let mut names = Vec::new();
    let mut refusal = None;
    for_each_name(dir, |name| match admit(name) {
        Ok(()) => {
            names.push(name.to_owned());
            ControlFlow::Continue(())
        }
        Err(refused) => {
            refusal = Some(refused);
            ControlFlow::Break(())
        }
    })?;
    if let Some(refused) = refusal {
        return Ok(Err(refused));
    }
    names.sort();
    Ok(Ok(names))
}

/// Calls `each` with the names in directory `dir` (any descriptor of it, `O_PATH`
/// too), without `.` and `..`, in the directory's own order, until it breaks: the one
/// reading of a directory every walk here makes, holding no names of its own.
pub fn for_each_name(
    dir: BorrowedFd<'_>,
    mut each: impl FnMut(&CStr) -> ControlFlow<()>,
) -> rustix::io::Result<()> {
    let fd = rustix::fs::openat(
        dir,
        c".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    for entry in Dir::new(fd)? {
        let entry = entry?;
        let name = entry.file_name();
        if name != c"." && name != c".." && each(name).is_break() {
            break;
        }
    }
    Ok(())
}

/// How many names [`remove_tree`] reads of one directory at a time: it unlinks them
/// and reads again, so a directory of millions of names (hard links cost no inodes) is
/// never held whole.
const REMOVE_BATCH: usize = 4096;

/// Most directory reads one [`remove_tree`] makes (each directory is read once, again
/// after each of its subdirectories is gone, and once more per batch): past it the
/// tree is taken to be filling as fast as it is emptied (`ENOTEMPTY`), rather than
/// keep a thread busy for as long as a racing sandbox likes.
const MAX_REMOVE_READS: u32 = 1 << 24;

/// Up to `max` names of directory `dir` (any descriptor of it), without `.` and `..`,
/// in the directory's own order; and whether it stopped at `max` (more may follow).
fn first_names(dir: BorrowedFd<'_>, max: usize) -> rustix::io::Result<(Vec<CString>, bool)> {
    let mut names = Vec::new();
    let mut more = false;
    for_each_name(dir, |name| {
        if names.len() == max {
            more = true;
            return ControlFlow::Break(());
        }
        names.push(name.to_owned());
        ControlFlow::Continue(())
    })?;
    Ok((names, more))
}

/// Removes directory `name` in `parent` and everything in it. Directories are opened
/// with `O_NOFOLLOW`, and entries are unlinked before being looked into, so a symlink
/// is only ever removed, never followed. At most [`OPEN_LEVELS`] descriptors are held,
/// however deep the tree ([`DirStack`]), and at most 4096 names, however
/// wide: only the directory being cleared holds names, read a batch at a time (the
/// one above reads again once it is back). A mount point in the tree fails the
/// removal with `EBUSY` before anything beneath it is removed.
pub fn remove_tree(parent: BorrowedFd<'_>, name: &CStr) -> rustix::io::Result<()> {
    struct Pending {
        names: Vec<CString>,
        /// Whether the directory may hold names not read yet.
        more: bool,
        relists: u8,
    }
    let reads = std::cell::Cell::new(0u32);
    // Takes the next batch of names of directory `dir` into `pending`.
    let read = |pending: &mut Pending, dir: BorrowedFd<'_>| -> rustix::io::Result<()> {
        reads.set(reads.get() + 1);
        if reads.get() > MAX_REMOVE_READS {
            return Err(Errno::NOTEMPTY);
        }
        (pending.names, pending.more) = first_names(dir, REMOVE_BATCH)?;
        Ok(())
    };
    // A mount point is refused before anything in it is touched: its contents are
    // another file system's (a host directory bound into a workspace), and the mount
    // point itself could not be removed anyway.
    let open_level =
        |parent: BorrowedFd<'_>, name: &CStr| -> rustix::io::Result<(OwnedFd, Pending)> {
            let fd = open_subdir(parent, name)?;
            if is_mount_root(fd.as_fd()) {
                return Err(Errno::BUSY);
            }
            let mut pending = Pending {
                names: Vec::new(),
                more: false,
                relists: 0,
            };
            read(&mut pending, fd.as_fd())?;
            Ok((fd, pending))
        };
    let mut stack = DirStack::new();
    let (fd, pending) = open_level(parent, name)?;
    stack.push(fd, name.to_owned(), pending)?;
    while let Some(level) = stack.top_mut() {
        if let Some(child) = level.data.names.pop() {
            let dir = level.fd()?;
            let descend = match rustix::fs::unlinkat(dir, child.as_c_str(), AtFlags::empty()) {
                Ok(()) | Err(Errno::NOENT) => None,
                // Linux answers unlink(2) of a directory with EISDIR.
                Err(Errno::ISDIR) => match open_level(dir, &child) {
                    Ok(next) => Some(next),
                    Err(Errno::NOENT) => None,
                    // Swapped for a non-directory since the unlink: unlink that instead.
                    Err(Errno::NOTDIR | Errno::LOOP) => {
                        rustix::fs::unlinkat(dir, child.as_c_str(), AtFlags::empty())?;
                        None
                    }
                    Err(e) => return Err(e),
                },
                Err(e) => return Err(e),
            };
            if let Some((fd, pending)) = descend {
                // Names wait in one directory only: this one reads again once the
                // child is gone.
                level.data.names = Vec::new();
                level.data.more = true;
                stack.push(fd, child, pending)?;
            }
            continue;
        }
        if level.data.more {
            let Level { fd, data, .. } = level;
            let Some(fd) = fd else {
                return Err(Errno::BADF);
            };
            read(data, fd.as_fd())?;
            continue;
        }
        let Some(mut done) = stack.pop()? else { break };
        let above = match stack.top() {
            Some(level) => level.fd()?,
            None => parent,
        };
        match rustix::fs::unlinkat(above, done.name.as_c_str(), AtFlags::REMOVEDIR) {
            Ok(()) | Err(Errno::NOENT) => {}
            // Something was created in it meanwhile: clear it again, a few times at most.
            Err(Errno::NOTEMPTY | Errno::EXIST) if done.data.relists < 3 => {
                done.data.relists += 1;
                done.data.more = true;
                let Level { fd, name, data, .. } = done;
                let Some(fd) = fd else {
                    return Err(Errno::BADF);
                };
                stack.push(fd, name, data)?;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Removes the directory at host path `path` and everything in it, as
/// `std::fs::remove_dir_all` would (a symlink or file there is unlinked; the path's
/// parent is resolved as any path is), but with [`remove_tree`]'s walk: no recursion,
/// so a tree of any depth cannot overflow the thread's stack (`std`'s recursive walk
/// aborts the process on a chain some ten thousand directories deep, which any
/// sandbox can make in its workspace), and a bounded number of descriptors.
///
/// # Errors
/// The first failing call, as its [`std::io::ErrorKind`] maps (`NotFound` for a
/// missing `path`).
pub fn remove_dir_all(path: &Path) -> std::io::Result<()> {
    let (parent, name) = match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) => (parent, name),
        _ => return Err(std::io::Error::from(Errno::INVAL)),
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let name = CString::new(name.as_bytes()).map_err(|_| std::io::Error::from(Errno::INVAL))?;
    let parent = rustix::fs::open(
        parent,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let st = rustix::fs::statat(&parent, &name, AtFlags::SYMLINK_NOFOLLOW)?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::Directory {
        return Ok(rustix::fs::unlinkat(&parent, &name, AtFlags::empty())?);
    }
    match remove_tree(parent.as_fd(), &name) {
        // Swapped for a link or file since: remove that.
        Err(Errno::NOTDIR | Errno::LOOP) => {
            Ok(rustix::fs::unlinkat(&parent, &name, AtFlags::empty())?)
        }
        other => Ok(other?),
    }
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
