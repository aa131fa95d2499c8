//! How much a workspace holds on disk: a walk that holds a bounded number of
//! descriptors whatever the tree's shape.
//!
//! Descriptors are this process's to share with every other sandbox it serves: a walk
//! holding one per directory waiting to be read (30,000 subdirectories in one sandbox)
//! made every other sandbox's calls fail with `EMFILE` meanwhile, and its own figure
//! came out short. This one goes depth first and keeps only names for what waits. It
//! holds a descriptor for the deepest [`HELD_LEVELS`] directories of the path it is on
//! (and the top); coming back up to a level whose descriptor it let go, it opens that
//! level again from the deepest one it holds, by a path of names resolved beneath it
//! with no symlink or mount crossed, and the levels below it from there.

use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;
use sandcell::{FileKind, Result};

use super::meta::Meta;
use super::{fail, list_names, open_subdir, Workspace};

/// The most descriptors of directories a walk holds beneath its top one. Besides these it
/// opens one more at a time (the directory it lists, or a step of a reopening).
const HELD_LEVELS: usize = 16;

/// The longest path of names a reopening hands the kernel at once, under `PATH_MAX`
/// (4,096 with its NUL) with room to spare; a longer way is walked in several steps.
const MAX_STEP_BYTES: usize = 4000;

/// How a reopening resolves its path of names: never through a symlink, a magic link,
/// `..` out of where it starts, or onto another mount (the walk does not count those).
const REOPEN: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS)
    .union(ResolveFlags::NO_XDEV);

/// A directory on the walk's current path.
struct Level {
    /// Its name in the level above (unused for the top).
    name: CString,
    /// Its descriptor, while it is among the deepest [`HELD_LEVELS`] (always, at the top).
    fd: Option<OwnedFd>,
    /// Its subdirectories on the same file system, not walked yet.
    pending: Vec<CString>,
}

impl Workspace {
    /// Bytes of the regular files in the workspace, on its own file system (host
    /// mounts left out), walked without following symlinks and holding at most
    /// [`HELD_LEVELS`] + 3 descriptors at once. An entry that vanishes or moves
    /// mid-walk is skipped: the figure is a reading, not a snapshot.
    pub(crate) fn disk_usage(&self) -> Result<u64> {
        let top =
            open_subdir(self.root.as_fd(), c".").map_err(|e| fail("measuring the workspace", e))?;
        let dev = rustix::fs::fstat(&top)
            .map_err(|e| fail("measuring the workspace", e))?
            .st_dev;
        let mut total = 0u64;
        let mut path = vec![enter(c".".to_owned(), top, dev, &mut total)];
        while let Some(level) = path.last_mut() {
            let Some(name) = level.pending.pop() else {
                path.pop();
                continue;
            };
            if level.fd.is_none() && reopen(&mut path).is_err() {
                // The directory moved or went since it was listed: what is left of it
                // is not where it was, so it is not counted.
                path.pop();
                continue;
            }
            let Some(parent) = path.last().and_then(|l| l.fd.as_ref()) else {
                continue;
            };
            let Ok(fd) = open_subdir(parent.as_fd(), &name) else {
                continue;
            };
            // Checked on the descriptor: the name may lead elsewhere since its `stat`.
            if !rustix::fs::fstat(&fd).is_ok_and(|st| st.st_dev == dev) {
                continue;
            }
            // A host directory bound in from the same file system has the same device.
            if sandcell::raw::tree::is_mount_root(fd.as_fd()) {
                continue;
            }
            path.push(enter(name, fd, dev, &mut total));
            let_go(&mut path);
        }
        Ok(total)
    }
}

/// Reads directory `fd` (named `name` in its parent): the sizes of its regular files go
/// to `total`, its subdirectories on file system `dev` wait in the level returned.
fn enter(name: CString, fd: OwnedFd, dev: u64, total: &mut u64) -> Level {
    let mut pending = Vec::new();
    for child in list_names(fd.as_fd()).unwrap_or_default() {
        let Ok(st) = rustix::fs::statat(&fd, &child, AtFlags::SYMLINK_NOFOLLOW) else {
            continue;
        };
        let meta = Meta::of(&st);
        match meta.kind {
            FileKind::File => *total = total.saturating_add(meta.size),
            FileKind::Dir if st.st_dev == dev => pending.push(child),
            _ => {}
        }
    }
    // Taken from the end: name order.
    pending.reverse();
    Level {
        name,
        fd: Some(fd),
        pending,
    }
}

/// Lets go of the descriptors of the shallowest levels beyond the deepest
/// [`HELD_LEVELS`] below the top.
fn let_go(path: &mut [Level]) {
    let held = path[1..].iter().filter(|l| l.fd.is_some()).count();
    for level in path[1..]
        .iter_mut()
        .filter(|l| l.fd.is_some())
        .take(held.saturating_sub(HELD_LEVELS))
    {
        level.fd = None;
    }
}

/// Opens the deepest level of `path` again, and the levels above it up to
/// [`HELD_LEVELS`] (those the walk comes back to next): the first of them by its path of
/// names from the deepest level still held, the rest each from the one above, letting go
/// of the shallowest as it goes.
fn reopen(path: &mut [Level]) -> rustix::io::Result<()> {
    let last = path.len() - 1;
    // The top is always held.
    let held = path[..last]
        .iter()
        .rposition(|l| l.fd.is_some())
        .unwrap_or(0);
    let first = (held + 1).max((last + 1).saturating_sub(HELD_LEVELS));
    let names: Vec<&CStr> = path[held + 1..=first]
        .iter()
        .map(|l| l.name.as_c_str())
        .collect();
    let fd = {
        let Some(from) = path[held].fd.as_ref() else {
            return Err(Errno::BADF);
        };
        open_by_names(from.as_fd(), &names)?
    };
    path[first].fd = Some(fd);
    let_go(path);
    for i in first + 1..=last {
        let fd = match path[i - 1].fd.as_ref() {
            Some(parent) => open_subdir(parent.as_fd(), &path[i].name)?,
            None => return Err(Errno::BADF),
        };
        path[i].fd = Some(fd);
        let_go(path);
    }
    Ok(())
}

/// The directory at the path of `names` beneath `from`, resolved by the kernel in as few
/// steps as `PATH_MAX` allows, each holding the one descriptor it starts from.
fn open_by_names(from: BorrowedFd<'_>, names: &[&CStr]) -> rustix::io::Result<OwnedFd> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mut current: Option<OwnedFd> = None;
    let mut rest = names;
    loop {
        let mut step = Vec::new();
        let mut taken = 0;
        for name in rest {
            let bytes = name.to_bytes();
            if taken > 0 && step.len() + 1 + bytes.len() > MAX_STEP_BYTES {
                break;
            }
            if taken > 0 {
                step.push(b'/');
            }
            step.extend_from_slice(bytes);
            taken += 1;
        }
        if taken == 0 {
            return current.ok_or(Errno::INVAL);
        }
        let step = CString::new(step).map_err(|_| Errno::INVAL)?;
        let base = current.as_ref().map_or(from, |fd| fd.as_fd());
        current = Some(rustix::fs::openat2(
            base,
            &step,
            flags,
            Mode::empty(),
            REOPEN,
        )?);
        rest = &rest[taken..];
    }
}

#[cfg(test)]
mod tests;
