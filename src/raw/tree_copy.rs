//! Copies of directory trees through descriptors: files (their data ranges only, so
//! holes stay holes), directories, symlinks and, in an overlay layer, whiteouts and
//! opaque marks, with their owners, modes and times; hard links kept as links.

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags, Timespec, Timestamps};
use rustix::io::Errno;

use super::{is_mount_root, list_names, open_subdir, remove_tree, DirStack, Names};
use crate::error::{Error, Result};

pub(super) fn copy_to_new(src: &Path, dst: &Path, layer: bool) -> Result<()> {
    // No host path in the error: a sandbox can make a copy fail with a kind a server
    // passes to its client (a directory too large to walk is `LimitExceeded`), and the
    // paths name the host's layout. The log has them.
    let fail = |e: Errno| {
        tracing::debug!(src = %src.display(), dst = %dst.display(), error = %e, "a tree copy failed");
        Error::io("copying the sandbox's files", e.into())
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
pub(super) struct Copier {
    /// Copy an overlay layer's whiteouts and opaque marks.
    pub(super) layer: bool,
    /// Stay on this file system: a directory on another is left out.
    pub(super) dev: Option<u64>,
}

/// Where overlayfs marks a directory opaque. Every overlay here is mounted by root,
/// which uses the `trusted.` mark; a `user.overlay.opaque` is a sandbox's own extended
/// attribute and is never taken for overlay metadata.
const OPAQUE_XATTRS: [&CStr; 1] = [c"trusted.overlay.opaque"];

/// What a copy keeps of a source directory on its path: the status to give its copy
/// once full, and the entries still to copy.
struct Copying {
    st: rustix::fs::Stat,
    names: Names,
}

impl Copier {
    /// Copies directory `src_name` of `src_parent` to the new `dst_name` of
    /// `dst_parent`, depth first, with no recursion and at most [`OPEN_LEVELS`]
    /// descriptors on each side ([`DirStack`]), however deep the tree.
    pub(super) fn copy_dir(
        &self,
        src_parent: BorrowedFd<'_>,
        src_name: &CStr,
        dst_parent: BorrowedFd<'_>,
        dst_name: &CStr,
    ) -> rustix::io::Result<()> {
        let mut src: DirStack<Copying> = DirStack::new();
        // Each copy level keeps how long `at` was before its name was added.
        let mut dst: DirStack<usize> = DirStack::new();
        let mut links = Links::new(dst_parent);
        // The directory being filled, from `dst_parent`.
        let mut at = dst_name.to_bytes().to_vec();
        let Some((from, copying, to)) = self.enter(src_parent, src_name, dst_parent, dst_name)?
        else {
            return Ok(());
        };
        src.push(from, src_name.to_owned(), copying)?;
        dst.push(to, dst_name.to_owned(), 0)?;
        while let Some(level) = src.top_mut() {
            if let Some(name) = level.data.names.pop() {
                let (from, to) = (level.fd()?, dst.top().ok_or(Errno::BADF)?.fd()?);
                let st = rustix::fs::statat(from, &name, AtFlags::SYMLINK_NOFOLLOW)?;
                if rustix::fs::FileType::from_raw_mode(st.st_mode)
                    != rustix::fs::FileType::Directory
                {
                    self.copy_entry(from, &name, to, &st, &mut links, &at)?;
                } else if let Some((from, copying, to)) = self.enter(from, &name, to, &name)? {
                    if is_mount_root(from.as_fd()) {
                        // A host directory mounted here: left out, its mount point
                        // copied empty.
                        finish(to.as_fd(), &copying.st)?;
                        continue;
                    }
                    let before = at.len();
                    at.push(b'/');
                    at.extend_from_slice(name.to_bytes());
                    src.push(from, name.clone(), copying)?;
                    dst.push(to, name, before)?;
                }
                continue;
            }
            // Full: its copy gets the source's owner, mode and times, and the walk
            // climbs back out of both.
            let st = level.data.st;
            let (Some(_), Some(copy)) = (src.pop()?, dst.pop()?) else {
                return Err(Errno::BADF);
            };
            at.truncate(copy.data);
            finish(copy.fd()?, &st)?;
        }
        Ok(())
    }

    /// Starts the copy of directory `src_name` of `src_parent` as the new `dst_name`
    /// of `dst_parent`: both open, and what the copy keeps of the source. None (and
    /// nothing made) for a directory on another file system, which a copy leaves out.
    fn enter(
        &self,
        src_parent: BorrowedFd<'_>,
        src_name: &CStr,
        dst_parent: BorrowedFd<'_>,
        dst_name: &CStr,
    ) -> rustix::io::Result<Option<(OwnedFd, Copying, OwnedFd)>> {
        let from = open_subdir(src_parent, src_name)?;
        let st = rustix::fs::fstat(&from)?;
        if self.dev.is_some_and(|dev| dev != st.st_dev) {
            return Ok(None);
        }
        // Writable by its owner while it fills; its own mode is set once it is full.
        rustix::fs::mkdirat(dst_parent, dst_name, Mode::from_raw_mode(0o700))?;
        let to = open_subdir(dst_parent, dst_name)?;
        if self.layer {
            for name in OPAQUE_XATTRS {
                let mut value = [0u8; 8];
                if let Ok(n) = rustix::fs::fgetxattr(&from, name, &mut value) {
                    rustix::fs::fsetxattr(&to, name, &value[..n], rustix::fs::XattrFlags::empty())?;
                }
            }
        }
        let names = list_names(from.as_fd())?;
        Ok(Some((from, Copying { st, names }, to)))
    }

    /// Copies `name` of `src_dir`, which `st` says is not a directory, into `dst_dir`.
    /// A regular file with other links is linked to the copy of the first one met, in
    /// `links`; `at` is `dst_dir`'s path from where the copy is made.
    fn copy_entry(
        &self,
        src_dir: BorrowedFd<'_>,
        name: &CStr,
        dst_dir: BorrowedFd<'_>,
        st: &rustix::fs::Stat,
        links: &mut Links<'_>,
        at: &[u8],
    ) -> rustix::io::Result<()> {
        match rustix::fs::FileType::from_raw_mode(st.st_mode) {
            rustix::fs::FileType::CharacterDevice if self.layer && st.st_rdev == 0 => {
                rustix::fs::mknodat(
                    dst_dir,
                    name,
                    rustix::fs::FileType::CharacterDevice,
                    Mode::from_raw_mode(st.st_mode & 0o777),
                    0,
                )?;
                own_entry(dst_dir, name, st)
            }
            rustix::fs::FileType::Symlink => {
                let target = rustix::fs::readlinkat(src_dir, name, Vec::new())?;
                rustix::fs::symlinkat(target.as_c_str(), dst_dir, name)?;
                own_entry(dst_dir, name, st)
            }
            rustix::fs::FileType::RegularFile => {
                // O_NONBLOCK: a FIFO swapped in since the look must not hang the open
                // (and the copy, with every lock its caller holds).
                let from = rustix::fs::openat(
                    src_dir,
                    name,
                    OFlags::RDONLY
                        | OFlags::NOFOLLOW
                        | OFlags::NONBLOCK
                        | OFlags::NOCTTY
                        | OFlags::CLOEXEC,
                    Mode::empty(),
                )?;
                let st = rustix::fs::fstat(&from)?;
                if rustix::fs::FileType::from_raw_mode(st.st_mode)
                    != rustix::fs::FileType::RegularFile
                {
                    // Swapped for something else: left out, as a special file is.
                    return if self.dev.is_some() {
                        Ok(())
                    } else {
                        Err(Errno::OPNOTSUPP)
                    };
                }
                if links.link(&st, dst_dir, name) {
                    return Ok(());
                }
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
                copy_data(from.as_fd(), to.as_fd(), st.st_size.max(0) as u64)?;
                finish(to.as_fd(), &st)?;
                links.note(&st, at, name);
                Ok(())
            }
            // A FIFO, socket or device in a template has no meaning a copy could keep; in
            // a workspace one is left out, as an export leaves it out.
            _ if self.dev.is_some() => Ok(()),
            _ => Err(Errno::OPNOTSUPP),
        }
    }
}

/// The most multiply-linked files a copy remembers, and the most bytes of their paths;
/// past either, further links are copied as files of their own.
const MAX_LINKED: usize = 100_000;
const MAX_LINKED_PATH_BYTES: usize = 16 << 20;

/// Hard links met in a copy: for each source file with more than one link, where its
/// first copy went (a path from the copy's parent), so each later link to it becomes
/// a link to that copy. Copied as files of their own, 200 links a sandbox made to one
/// 1 MiB file took 200 MiB of the host's disk in its clone.
struct Links<'a> {
    base: BorrowedFd<'a>,
    first: HashMap<(u64, u64), CString>,
    path_bytes: usize,
}

impl<'a> Links<'a> {
    fn new(base: BorrowedFd<'a>) -> Self {
        Links {
            base,
            first: HashMap::new(),
            path_bytes: 0,
        }
    }

    /// Links `name` in `dst_dir` to the copy of the file `st` describes, where one was
    /// made: whether it did. The copy is found beneath the copy's parent with no link
    /// followed (the tree is the copier's own, but nothing here trusts that).
    fn link(&self, st: &rustix::fs::Stat, dst_dir: BorrowedFd<'_>, name: &CStr) -> bool {
        if st.st_nlink < 2 {
            return false;
        }
        let Some(first) = self.first.get(&key(st)) else {
            return false;
        };
        let Ok(copy) = rustix::fs::openat2(
            self.base,
            first.as_c_str(),
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        ) else {
            return false;
        };
        let is_file = rustix::fs::fstat(&copy)
            .is_ok_and(|c| rustix::fs::FileType::from_raw_mode(c.st_mode).is_file());
        // Through /proc, as unprivileged callers may (`AT_EMPTY_PATH` needs
        // CAP_DAC_READ_SEARCH).
        let path = format!("/proc/self/fd/{}", copy.as_raw_fd());
        is_file
            && rustix::fs::linkat(
                rustix::fs::CWD,
                path.as_str(),
                dst_dir,
                name,
                AtFlags::SYMLINK_FOLLOW,
            )
            .is_ok()
    }

    /// Remembers that the file `st` describes was copied as `name` in directory `at`.
    fn note(&mut self, st: &rustix::fs::Stat, at: &[u8], name: &CStr) {
        if st.st_nlink < 2 || self.first.len() >= MAX_LINKED {
            return;
        }
        let len = at.len() + 1 + name.to_bytes().len();
        if self.path_bytes + len > MAX_LINKED_PATH_BYTES || self.first.contains_key(&key(st)) {
            return;
        }
        let mut path = at.to_vec();
        path.push(b'/');
        path.extend_from_slice(name.to_bytes());
        if let Ok(path) = CString::new(path) {
            self.path_bytes += len;
            self.first.insert(key(st), path);
        }
    }
}

/// A file's identity on its host: device and inode.
// `Stat`'s field types differ between architectures.
#[allow(clippy::unnecessary_cast, clippy::useless_conversion)]
fn key(st: &rustix::fs::Stat) -> (u64, u64) {
    (st.st_dev as u64, st.st_ino as u64)
}

/// Copies the first `len` bytes of `from` into the empty `to`, holes as holes: only
/// the ranges holding data are copied (found with `SEEK_DATA` and `SEEK_HOLE`), and
/// `to` is then given its length. A plain copy reads a hole as zeros and writes them
/// out, so a sandbox's `truncate -s 1T f` (which costs it nothing) filled the host's
/// disk when the sandbox was cloned.
fn copy_data(from: BorrowedFd<'_>, to: BorrowedFd<'_>, len: u64) -> rustix::io::Result<()> {
    use rustix::fs::SeekFrom;
    let mut pos = 0u64;
    while pos < len {
        let start = match rustix::fs::seek(from, SeekFrom::Data(pos)) {
            Ok(start) => start,
            // No data past `pos`: the rest is a hole.
            Err(Errno::NXIO) => break,
            Err(e) => return Err(e),
        };
        if start >= len {
            break;
        }
        let end = rustix::fs::seek(from, SeekFrom::Hole(start))?.min(len);
        copy_range(from, to, start, end)?;
        pos = end;
    }
    rustix::fs::ftruncate(to, len)
}

/// Copies bytes `start..end` of `from` to the same offsets of `to`: in the kernel
/// where it can, through a buffer where it cannot. A file that shrank meanwhile ends
/// the copy early; `to`'s length is set after.
fn copy_range(
    from: BorrowedFd<'_>,
    to: BorrowedFd<'_>,
    start: u64,
    end: u64,
) -> rustix::io::Result<()> {
    let (mut at_in, mut at_out) = (start, start);
    while at_in < end {
        let want = usize::try_from(end - at_in)
            .unwrap_or(usize::MAX)
            .min(1 << 30);
        match rustix::fs::copy_file_range(from, Some(&mut at_in), to, Some(&mut at_out), want) {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            Err(Errno::XDEV | Errno::NOSYS | Errno::INVAL | Errno::OPNOTSUPP) => break,
            Err(e) => return Err(e),
        }
    }
    let mut buf = vec![0u8; 256 * 1024];
    while at_in < end {
        let want = usize::try_from(end - at_in)
            .unwrap_or(usize::MAX)
            .min(buf.len());
        let n = rustix::io::pread(from, &mut buf[..want], at_in)?;
        if n == 0 {
            return Ok(());
        }
        let mut written = 0;
        while written < n {
            written += rustix::io::pwrite(to, &buf[written..n], at_in + written as u64)?;
        }
        at_in += n as u64;
    }
    Ok(())
}

/// Gives a copied file or directory its source's owner, mode and times. The owner
/// first, since a change of owner clears set-user-ID bits.
fn finish(fd: BorrowedFd<'_>, st: &rustix::fs::Stat) -> rustix::io::Result<()> {
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
