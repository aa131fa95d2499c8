//! Host-side file operations contained beneath a workspace directory.
//!
//! Every path is resolved by the kernel, starting from a descriptor of the workspace
//! root, with `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`: symlinks that stay
//! inside the workspace are followed, and a resolution that would leave it (an absolute
//! link, one `..` too many) fails with `EXDEV`, reported as `PermissionDenied`. No string
//! check stands between a path and the host. Operations that act on the last component
//! itself (`stat`, `remove`, `rename`) resolve the parent that way and then use an `*at`
//! call on the name, so a final symlink is seen, not followed. Tree walks (recursive
//! remove, export) open every directory relative to its parent with `O_NOFOLLOW`, so a
//! process swapping a directory for a symlink mid-walk cannot redirect them.

use std::ffi::CString;
use std::fmt;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;
use sandcell::archive::PackStats;
use sandcell::{DirEntry, Error, ErrorKind, FileInfo, FileKind, Result, SandboxPath};

use meta::Meta;

pub(crate) use sandcell::raw::tree::{copy_layer, copy_tree};
pub(crate) use sandcell::raw::tree::{list_names, list_names_within, open_subdir, remove_tree};
mod export;
mod meta;
mod usage;

/// How every path inside the workspace is resolved.
const RESOLVE: ResolveFlags = ResolveFlags::BENEATH.union(ResolveFlags::NO_MAGICLINKS);

/// Mode of files created by `write`, before the process umask.
const FILE_MODE: u32 = 0o644;
/// Mode of directories created by `write`, `mkdir` and `rename`, before the umask.
const DIR_MODE: u32 = 0o755;

/// A workspace directory, held open so every operation resolves from the same inode
/// even if the host path is renamed meanwhile.
#[derive(Debug)]
pub(crate) struct Workspace {
    /// `O_PATH` descriptor of the workspace directory: the anchor of every resolution.
    root: OwnedFd,
    /// The host path the workspace was opened from.
    root_path: PathBuf,
}

impl Workspace {
    /// Opens the workspace directory `root` (a trusted host path; symlinks in it are
    /// followed once, here).
    pub(crate) fn open(root: &Path) -> Result<Self> {
        let fd = rustix::fs::open(
            root,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| {
            // No host path for the client: a call racing its sandbox's destroy lands
            // here with `NotFound`, a kind servers pass on as it is.
            tracing::debug!(workspace = %root.display(), error = %e, "opening a workspace failed");
            match e {
                Errno::NOENT => Error::not_found("the sandbox's workspace is gone (destroyed)"),
                e => fail("opening the sandbox's workspace", e),
            }
        })?;
        Ok(Workspace {
            root: fd,
            root_path: root.to_path_buf(),
        })
    }

    /// The host path the workspace was opened from.
    pub(crate) fn root_path(&self) -> &Path {
        &self.root_path
    }

    /// The `O_PATH` descriptor of the workspace's root, which holds its mount.
    pub(crate) fn into_fd(self) -> OwnedFd {
        self.root
    }

    /// Reads a whole regular file of at most `max_bytes` (`LimitExceeded` past it, having
    /// read at most one byte more), following a final symlink while it stays inside.
    pub(crate) fn read(&self, path: &SandboxPath, max_bytes: u64) -> Result<Vec<u8>> {
        let ctx = || format!("reading {path}");
        if path.is_root() {
            return Err(Error::invalid_input(format!("{}: is a directory", ctx())));
        }
        // O_NONBLOCK so a FIFO planted at `path` cannot hang the open.
        let fd = self
            .open_in(path, OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY)
            .map_err(|e| fail(ctx(), missing_if_not_dir(e)))?;
        let meta = Meta::of(&rustix::fs::fstat(&fd).map_err(|e| fail(ctx(), e))?);
        match meta.kind {
            FileKind::File => {}
            FileKind::Dir => {
                return Err(Error::invalid_input(format!("{}: is a directory", ctx())))
            }
            _ => {
                return Err(Error::invalid_input(format!(
                    "{}: not a regular file",
                    ctx()
                )))
            }
        }
        // The size is only a hint: the file may grow while it is read.
        let mut data = Vec::with_capacity(meta.size.min(max_bytes).min(1 << 20) as usize);
        File::from(fd)
            .take(max_bytes.saturating_add(1))
            .read_to_end(&mut data)
            .map_err(|e| Error::io(ctx(), e))?;
        sandcell::raw::check_read_limit(path, data.len() as u64, max_bytes)?;
        Ok(data)
    }

    /// Writes a whole file: creates missing parents, replaces an existing file's contents
    /// keeping its mode, and follows a final symlink while it stays inside.
    pub(crate) fn write(&self, path: &SandboxPath, data: &[u8]) -> Result<()> {
        let ctx = || format!("writing {path}");
        if path.is_root() {
            return Err(Error::invalid_input(format!("{}: is a directory", ctx())));
        }
        // No O_TRUNC here: the file is truncated only once it is known to be a regular
        // file. O_NONBLOCK keeps a FIFO without a reader from hanging the open.
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::NONBLOCK | OFlags::NOCTTY;
        let mode = Mode::from_raw_mode(FILE_MODE);
        let open = || open_beneath(self.root.as_fd(), path.as_str(), flags, mode);
        let fd = match open() {
            Err(Errno::NOENT) => {
                let parent = path.parent().unwrap_or_else(SandboxPath::root);
                self.ensure_dir(&parent).map_err(|e| fail(ctx(), e))?;
                open()
            }
            other => other,
        }
        .map_err(|e| match e {
            Errno::NXIO => Error::invalid_input(format!("{}: not a regular file", ctx())),
            e => fail(ctx(), e),
        })?;
        let meta = Meta::of(&rustix::fs::fstat(&fd).map_err(|e| fail(ctx(), e))?);
        if meta.kind != FileKind::File {
            return Err(Error::invalid_input(format!(
                "{}: not a regular file",
                ctx()
            )));
        }
        rustix::fs::ftruncate(&fd, 0).map_err(|e| fail(ctx(), e))?;
        File::from(fd)
            .write_all(data)
            .map_err(|e| Error::io(ctx(), e))
    }

    /// Metadata of `path` without following a final symlink; the root is a directory.
    pub(crate) fn stat(&self, path: &SandboxPath) -> Result<FileInfo> {
        let ctx = || format!("inspecting {path}");
        if path.is_root() {
            let meta = Meta::of(&rustix::fs::fstat(&self.root).map_err(|e| fail(ctx(), e))?);
            return Ok(meta.info(path.clone(), None));
        }
        let (parent, name) = self
            .parent_of(path)
            .map_err(|e| fail(ctx(), missing_if_not_dir(e)))?;
        let meta = Meta::of(
            &rustix::fs::statat(&parent, name, AtFlags::SYMLINK_NOFOLLOW)
                .map_err(|e| fail(ctx(), e))?,
        );
        let target = if meta.kind == FileKind::Symlink {
            let target =
                rustix::fs::readlinkat(&parent, name, Vec::new()).map_err(|e| fail(ctx(), e))?;
            Some(String::from_utf8_lossy(target.as_bytes()).into_owned())
        } else {
            None
        };
        Ok(meta.info(path.clone(), target))
    }

    /// Lists a directory (following in-workspace symlinks to it), sorted by name, with
    /// each entry's kind as `lstat` sees it.
    ///
    /// Entries whose name is not UTF-8 (or would make the path too long) cannot be named
    /// by a [`SandboxPath`] and are left out with a warning.
    pub(crate) fn list_dir(&self, path: &SandboxPath) -> Result<Vec<DirEntry>> {
        let ctx = || format!("listing {path}");
        let fd = self
            .open_dir_as(path, OFlags::RDONLY)
            .map_err(|e| fail(ctx(), e))?;
        // Counted as read: a sandboxed program decides how large a directory is.
        let mut limit = sandcell::raw::ListingLimit::new(ctx());
        let names = list_names_within(fd.as_fd(), |name| {
            let name = name.to_bytes().len();
            limit.admit_sized(path.as_str().len() + 1 + name, name)
        })
        .map_err(|e| fail(ctx(), e))??;
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            let Some(child) = name.to_str().ok().and_then(|n| path.join(n).ok()) else {
                tracing::warn!(dir = %path, name = ?name, "leaving out an entry that cannot be named by a sandbox path");
                continue;
            };
            let meta = match rustix::fs::statat(&fd, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => Meta::of(&st),
                // Removed since the directory was read.
                Err(Errno::NOENT) => continue,
                Err(e) => return Err(fail(ctx(), e)),
            };
            out.push(DirEntry::new(child, meta.kind, meta.size));
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Removes a file, a symlink (the link itself) or a directory (a non-empty one only
    /// when `recursive`; the walk never follows a symlink).
    pub(crate) fn remove(&self, path: &SandboxPath, recursive: bool) -> Result<()> {
        let ctx = || format!("removing {path}");
        if path.is_root() {
            return Err(Error::invalid_input(format!(
                "{}: the workspace root cannot be removed",
                ctx()
            )));
        }
        let (parent, name) = self
            .parent_of(path)
            .map_err(|e| fail(ctx(), missing_if_not_dir(e)))?;
        let meta = Meta::of(
            &rustix::fs::statat(&parent, name, AtFlags::SYMLINK_NOFOLLOW)
                .map_err(|e| fail(ctx(), e))?,
        );
        if meta.kind != FileKind::Dir {
            return rustix::fs::unlinkat(&parent, name, AtFlags::empty())
                .map_err(|e| fail(ctx(), e));
        }
        if recursive {
            let name = CString::new(name).map_err(|_| fail(ctx(), Errno::INVAL))?;
            return remove_tree(parent.as_fd(), &name).map_err(|e| fail(ctx(), e));
        }
        rustix::fs::unlinkat(&parent, name, AtFlags::REMOVEDIR).map_err(|e| match e {
            // rmdir(2) may report a non-empty directory either way.
            Errno::NOTEMPTY | Errno::EXIST => Error::invalid_input(format!(
                "{}: it is a non-empty directory; remove it recursively",
                ctx()
            )),
            e => fail(ctx(), e),
        })
    }

    /// Creates a directory and any missing parents; succeeds if it exists (also through
    /// an in-workspace symlink to a directory).
    pub(crate) fn mkdir(&self, path: &SandboxPath) -> Result<()> {
        self.ensure_dir(path).map(drop).map_err(|e| match e {
            Errno::NOTDIR | Errno::EXIST => Error::new(
                ErrorKind::AlreadyExists,
                format!(
                    "creating directory {path}: something that is not a directory is in the way"
                ),
            ),
            e => fail(format_args!("creating directory {path}"), e),
        })
    }

    /// Renames a file, symlink (the link itself) or directory, creating the parents of
    /// `to` and replacing a non-directory at `to`.
    pub(crate) fn rename(&self, from: &SandboxPath, to: &SandboxPath) -> Result<()> {
        let ctx = || format!("renaming {from} to {to}");
        if from.is_root() || to.is_root() {
            return Err(Error::invalid_input(format!(
                "{}: the workspace root cannot be renamed",
                ctx()
            )));
        }
        let (src_parent, src_name) = self
            .parent_of(from)
            .map_err(|e| fail(ctx(), missing_if_not_dir(e)))?;
        let src = Meta::of(
            &rustix::fs::statat(&src_parent, src_name, AtFlags::SYMLINK_NOFOLLOW)
                .map_err(|e| fail(ctx(), e))?,
        );
        let into_itself =
            || Error::invalid_input(format!("{}: cannot move {from} into itself", ctx()));
        // Checked before any parent of `to` is created, so a refused move changes nothing.
        // Moves into `from` through a symlink are caught by the kernel (EINVAL) below.
        if src.kind == FileKind::Dir && to.starts_with(from) && to != from {
            return Err(into_itself());
        }
        let (dst_parent, dst_name) = match self.parent_of(to) {
            Err(Errno::NOENT) => {
                let parent = to.parent().unwrap_or_else(SandboxPath::root);
                let fd = self.ensure_dir(&parent).map_err(|e| fail(ctx(), e))?;
                Ok((fd, to.file_name().unwrap_or(".")))
            }
            other => other,
        }
        .map_err(|e| fail(ctx(), e))?;
        match rustix::fs::statat(&dst_parent, dst_name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => {
                let dst = Meta::of(&st);
                if (dst.dev, dst.ino) == (src.dev, src.ino) {
                    // The same entry (or a hard link of it): rename(2) would do nothing.
                    return Ok(());
                }
                if dst.kind == FileKind::Dir {
                    return Err(Error::new(
                        ErrorKind::AlreadyExists,
                        format!("{}: {to} is a directory", ctx()),
                    ));
                }
                if src.kind == FileKind::Dir {
                    // rename(2) will not put a directory over a file; the contract replaces it.
                    rustix::fs::unlinkat(&dst_parent, dst_name, AtFlags::empty())
                        .map_err(|e| fail(ctx(), e))?;
                }
            }
            Err(Errno::NOENT) => {}
            Err(e) => return Err(fail(ctx(), e)),
        }
        let result = rustix::fs::renameat(&src_parent, src_name, &dst_parent, dst_name);
        let result = match result {
            // Here EXDEV is not an escape (both parents were resolved beneath the root)
            // but a directory of an overlay's lower layer: moved by copying it.
            Err(Errno::XDEV) if src.kind == FileKind::Dir => {
                c_name(src_name).and_then(|src_name| {
                    let dst_name = c_name(dst_name)?;
                    sandcell::raw::tree::move_tree(
                        src_parent.as_fd(),
                        &src_name,
                        dst_parent.as_fd(),
                        &dst_name,
                    )
                })
            }
            other => other,
        };
        result.map_err(|e| match e {
            Errno::INVAL => into_itself(),
            Errno::XDEV => {
                Error::unsupported(format!("{}: cannot move between file systems", ctx()))
            }
            e => fail(ctx(), e),
        })
    }

    /// Opens a directory inside the workspace (following in-workspace symlinks), for use
    /// as a cwd check.
    ///
    /// The descriptor is `O_PATH`: good for `fchdir`, `fstat` and `*at` calls, not for
    /// reading entries.
    pub(crate) fn open_dir(&self, path: &SandboxPath) -> Result<OwnedFd> {
        self.open_dir_as(path, OFlags::PATH)
            .map_err(|e| fail(format_args!("opening directory {path}"), e))
    }

    /// Host path of a directory inside the workspace after contained resolution, e.g.
    /// for a process cwd, spelled under [`Workspace::root_path`]. NotFound, InvalidInput
    /// (not a directory) or PermissionDenied (escape).
    ///
    /// The result is a path again: whoever uses it later resolves it again, so it is only
    /// as good as the workspace is stable until then.
    pub(crate) fn resolve_dir(&self, path: &SandboxPath) -> Result<PathBuf> {
        let ctx = || format!("resolving directory {path}");
        let fd = self.open_dir(path)?;
        let real = fd_path(fd.as_fd()).map_err(|e| Error::io(ctx(), e))?;
        let root_real = fd_path(self.root.as_fd()).map_err(|e| Error::io(ctx(), e))?;
        if root_real.as_os_str().as_bytes().ends_with(b" (deleted)") {
            return Err(Error::not_found(format!(
                "{}: the workspace directory has been removed",
                ctx()
            )));
        }
        let rel = real.strip_prefix(&root_real).map_err(|_| {
            Error::permission_denied(format!(
                "{}: the directory is no longer inside the workspace",
                ctx()
            ))
        })?;
        Ok(if rel.as_os_str().is_empty() {
            self.root_path.clone()
        } else {
            self.root_path.join(rel)
        })
    }

    /// Writes `dir` (a directory in the workspace, possibly reached through an
    /// in-workspace symlink) as an uncompressed tar to `out`, entries relative to `dir`.
    ///
    /// The stream is the one [`sandcell::raw::archive::pack_dir_tar`] writes for the same tree:
    /// each directory's entries in byte order, then its subdirectories' contents in turn.
    /// Symlinks are stored with their target, never followed; sockets, FIFOs and devices
    /// are skipped and counted; entries that vanish mid-walk are left out.
    pub(crate) fn export_tar(&self, dir: &SandboxPath, out: &mut dyn Write) -> Result<PackStats> {
        let top = self
            .open_dir_as(dir, OFlags::RDONLY)
            .map_err(|e| fail(format_args!("exporting {dir}"), e))?;
        export::write_tar(top, dir, out)
    }

    /// The symlink closest to the root among `path`'s ancestors (not `path` itself), if
    /// any: used to refuse archive entries beneath existing symlinks. A missing component
    /// (or one that is not a directory) ends the search with `None`.
    pub(crate) fn symlink_ancestor(&self, path: &SandboxPath) -> Result<Option<SandboxPath>> {
        let ctx = || format!("looking for symlinks above {path}");
        let components: Vec<&str> = path.components().collect();
        let Some((_, ancestors)) = components.split_last() else {
            return Ok(None);
        };
        let mut dir = self
            .open_in(&SandboxPath::root(), OFlags::PATH | OFlags::DIRECTORY)
            .map_err(|e| fail(ctx(), e))?;
        let mut prefix = SandboxPath::root();
        for name in ancestors {
            prefix = prefix.join(name)?;
            let is_link = |dir: &OwnedFd| -> Result<Option<bool>> {
                match rustix::fs::statat(dir, *name, AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(st) => Ok(Some(Meta::of(&st).kind == FileKind::Symlink)),
                    Err(Errno::NOENT | Errno::NOTDIR) => Ok(None),
                    Err(e) => Err(fail(ctx(), e)),
                }
            };
            match is_link(&dir)? {
                None => return Ok(None),
                Some(true) => return Ok(Some(prefix)),
                Some(false) => {}
            }
            // Step down literally: the components above are real directories, checked.
            dir = match rustix::fs::openat(
                &dir,
                *name,
                OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            ) {
                Ok(fd) => fd,
                Err(Errno::NOENT) => return Ok(None),
                // Not a directory (any more): a link if it was swapped for one just now.
                Err(Errno::NOTDIR | Errno::LOOP) => {
                    return Ok(is_link(&dir)?.unwrap_or(false).then_some(prefix))
                }
                Err(e) => return Err(fail(ctx(), e)),
            };
        }
        Ok(None)
    }

    /// Opens `path` from the workspace root, contained.
    fn open_in(&self, path: &SandboxPath, flags: OFlags) -> rustix::io::Result<OwnedFd> {
        let rel = if path.is_root() { "." } else { path.as_str() };
        open_beneath(self.root.as_fd(), rel, flags, Mode::empty())
    }

    /// Opens `path`'s parent directory (contained, `O_PATH`) and returns it with the
    /// final name. Callers handle the root before asking.
    fn parent_of<'p>(&self, path: &'p SandboxPath) -> rustix::io::Result<(OwnedFd, &'p str)> {
        let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
            return Err(Errno::INVAL);
        };
        let fd = self.open_in(&parent, OFlags::PATH | OFlags::DIRECTORY)?;
        Ok((fd, name))
    }

    /// Opens `path` as a directory with `flags`. `ENOTDIR` is told apart the way the
    /// reference backend does: `path` itself not a directory stays `ENOTDIR`
    /// (InvalidInput), a parent not being one is `ENOENT` (the path does not exist).
    fn open_dir_as(&self, path: &SandboxPath, flags: OFlags) -> rustix::io::Result<OwnedFd> {
        match self.open_in(path, flags | OFlags::DIRECTORY) {
            Err(Errno::NOTDIR) => match self.open_in(path, OFlags::PATH) {
                Ok(_) => Err(Errno::NOTDIR),
                Err(e) => Err(missing_if_not_dir(e)),
            },
            other => other,
        }
    }

    /// Opens directory `path` (`O_PATH`), creating it and missing parents. Each new
    /// directory is made with `mkdirat` on its contained parent and then re-opened
    /// contained, so a name swapped for a symlink meanwhile is resolved (or refused)
    /// like any other. Something other than a directory in the way is `ENOTDIR`.
    fn ensure_dir(&self, path: &SandboxPath) -> rustix::io::Result<OwnedFd> {
        let dir_flags = OFlags::PATH | OFlags::DIRECTORY;
        let mut missing = Vec::new();
        let mut current = path.clone();
        let mut fd = loop {
            match self.open_in(&current, dir_flags) {
                Ok(fd) => break fd,
                Err(Errno::NOENT) => match current.parent() {
                    Some(parent) => missing.push(std::mem::replace(&mut current, parent)),
                    None => return Err(Errno::NOENT),
                },
                Err(e) => return Err(e),
            }
        };
        for dir in missing.into_iter().rev() {
            let name = dir.file_name().unwrap_or(".");
            match rustix::fs::mkdirat(&fd, name, Mode::from_raw_mode(DIR_MODE)) {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(e) => return Err(e),
            }
            fd = match self.open_in(&dir, dir_flags) {
                Ok(fd) => fd,
                // The name exists but leads nowhere: a dangling symlink holds it.
                Err(Errno::NOENT) => return Err(Errno::NOTDIR),
                Err(e) => return Err(e),
            };
        }
        Ok(fd)
    }
}

/// `openat2` beneath `dirfd`, retried on `EAGAIN` (the kernel's answer when a concurrent
/// rename raced a `..` step of the resolution).
fn open_beneath(
    dirfd: BorrowedFd<'_>,
    path: &str,
    flags: OFlags,
    mode: Mode,
) -> rustix::io::Result<OwnedFd> {
    let mut retries = 0;
    loop {
        match rustix::fs::openat2(dirfd, path, flags | OFlags::CLOEXEC, mode, RESOLVE) {
            Err(Errno::AGAIN) if retries < 16 => retries += 1,
            other => return other,
        }
    }
}

/// A path component as the `*at` calls take it.
fn c_name(name: &str) -> rustix::io::Result<CString> {
    CString::new(name).map_err(|_| Errno::INVAL)
}

/// The kernel's current path of an open descriptor.
fn fd_path(fd: BorrowedFd<'_>) -> std::io::Result<PathBuf> {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// `ENOTDIR` on a path's way means the path does not exist, as the reference backend
/// reports it.
fn missing_if_not_dir(e: Errno) -> Errno {
    if e == Errno::NOTDIR {
        Errno::NOENT
    } else {
        e
    }
}

/// Turns an errno into sandcell's error, saying what was being done.
fn fail(context: impl fmt::Display, e: Errno) -> Error {
    let (kind, why) = match e {
        Errno::XDEV => (
            ErrorKind::PermissionDenied,
            Some("the path resolves outside the workspace"),
        ),
        Errno::ACCESS | Errno::PERM => (ErrorKind::PermissionDenied, None),
        Errno::ROFS => (ErrorKind::PermissionDenied, Some("read-only mount")),
        Errno::NOENT => (ErrorKind::NotFound, Some("no such file or directory")),
        Errno::NOTDIR => (ErrorKind::InvalidInput, Some("not a directory")),
        Errno::ISDIR => (ErrorKind::InvalidInput, Some("is a directory")),
        Errno::NOTEMPTY => (ErrorKind::InvalidInput, Some("directory not empty")),
        Errno::INVAL | Errno::NAMETOOLONG => (ErrorKind::InvalidInput, None),
        Errno::EXIST => (ErrorKind::AlreadyExists, Some("already exists")),
        Errno::LOOP => (
            ErrorKind::InvalidInput,
            Some("too many levels of symbolic links"),
        ),
        Errno::NOSYS => (
            ErrorKind::Unsupported,
            Some("a system call is unavailable (openat2 needs Linux 5.6 or newer)"),
        ),
        // The walk limits of `raw::tree`: one directory too large to walk, or the names
        // every walk holds at once at their cap.
        Errno::FBIG => (
            ErrorKind::LimitExceeded,
            Some("a directory too large to walk"),
        ),
        Errno::NOMEM => (
            ErrorKind::LimitExceeded,
            Some("the host holds as many directory listings as it may; try again shortly"),
        ),
        _ => (ErrorKind::Backend, None),
    };
    let io = std::io::Error::from(e);
    let message = match why {
        Some(why) => format!("{context}: {why}"),
        None => format!("{context}: {io}"),
    };
    Error::with_source(kind, message, io)
}

#[cfg(test)]
mod tests;
