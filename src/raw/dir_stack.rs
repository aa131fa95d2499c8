//! A depth-first walk's path of directories, holding a bounded number of them open
//! however deep the tree: every walk of sandbox content in [`super`] and the local
//! backend's disk usage, exports and watches go through it.

use std::ffi::CString;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;

/// How many directories of the path a [`DirStack`] walk has taken it keeps open.
pub const OPEN_LEVELS: usize = 8;

/// A directory's identity while it exists: its device and inode numbers.
fn dir_id(st: &rustix::fs::Stat) -> (u64, u64) {
    // `Stat`'s field types differ between architectures.
    #[allow(clippy::unnecessary_cast, clippy::useless_conversion)]
    (st.st_dev as u64, st.st_ino as u64)
}

/// Opens the directory above the one open as `child` through its `..`, and checks it
/// is the directory `expected` (by device and inode): one moved elsewhere meanwhile
/// fails with `ESTALE` rather than lead the walk out of its tree.
fn reopen_above(child: BorrowedFd<'_>, expected: (u64, u64)) -> rustix::io::Result<OwnedFd> {
    let fd = rustix::fs::openat(
        child,
        c"..",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    if dir_id(&rustix::fs::fstat(&fd)?) != expected {
        return Err(Errno::STALE);
    }
    Ok(fd)
}

/// One directory on a [`DirStack`]'s path.
#[derive(Debug)]
pub struct Level<T> {
    /// Open while the level is among the [`OPEN_LEVELS`] deepest.
    pub(super) fd: Option<OwnedFd>,
    id: (u64, u64),
    /// Its name in the directory above.
    pub name: CString,
    /// What the walk keeps of it (the entries still to visit, say).
    pub data: T,
}

impl<T> Level<T> {
    /// The directory, open (the top level always is).
    pub fn fd(&self) -> rustix::io::Result<BorrowedFd<'_>> {
        self.fd.as_ref().map(|fd| fd.as_fd()).ok_or(Errno::BADF)
    }
}

/// The directories from a walk's start down to where it is, for a depth-first walk of
/// a tree of any depth with a bounded number of descriptors and no recursion: only
/// the [`OPEN_LEVELS`] deepest are held open; one above them is reopened through the
/// `..` of the level beneath when the walk climbs back to it, and must be the same
/// directory it was (`ESTALE` otherwise). Memory grows with depth (a name and a few
/// words a level), descriptors do not.
#[derive(Debug)]
pub struct DirStack<T> {
    levels: Vec<Level<T>>,
}

impl<T> Default for DirStack<T> {
    fn default() -> Self {
        DirStack { levels: Vec::new() }
    }
}

impl<T> DirStack<T> {
    /// An empty stack.
    pub fn new() -> Self {
        Self::default()
    }

    /// Descends into the directory open as `fd` (named `name` in the current top).
    pub fn push(&mut self, fd: OwnedFd, name: CString, data: T) -> rustix::io::Result<()> {
        let id = dir_id(&rustix::fs::fstat(&fd)?);
        self.levels.push(Level {
            fd: Some(fd),
            id,
            name,
            data,
        });
        if let Some(above) = self.levels.len().checked_sub(OPEN_LEVELS + 1) {
            self.levels[above].fd = None;
        }
        Ok(())
    }

    /// Climbs out of the top level and returns it (still open); the level beneath,
    /// the new top, is open again.
    pub fn pop(&mut self) -> rustix::io::Result<Option<Level<T>>> {
        let Some(done) = self.levels.pop() else {
            return Ok(None);
        };
        if let Some(top) = self.levels.last_mut() {
            if top.fd.is_none() {
                top.fd = Some(reopen_above(done.fd()?, top.id)?);
            }
        }
        Ok(Some(done))
    }

    /// The deepest level.
    pub fn top(&self) -> Option<&Level<T>> {
        self.levels.last()
    }

    /// The deepest level, to change what it keeps.
    pub fn top_mut(&mut self) -> Option<&mut Level<T>> {
        self.levels.last_mut()
    }

    /// How deep the walk is (0 before the first push).
    pub fn depth(&self) -> usize {
        self.levels.len()
    }

    /// The levels from the first down.
    pub fn levels(&self) -> impl Iterator<Item = &Level<T>> {
        self.levels.iter()
    }
}
