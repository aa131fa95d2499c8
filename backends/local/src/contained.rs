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

use std::ffi::{CStr, CString, OsStr};
use std::fmt;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags, ResolveFlags, Stat};
use rustix::io::Errno;
use sandcell::archive::PackStats;
use sandcell::{DirEntry, Error, ErrorKind, FileInfo, FileKind, Result, SandboxPath};

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
        .map_err(|e| fail(format_args!("opening workspace {}", root.display()), e))?;
        Ok(Workspace {
            root: fd,
            root_path: root.to_path_buf(),
        })
    }

    /// The host path the workspace was opened from.
    pub(crate) fn root_path(&self) -> &Path {
        &self.root_path
    }

    /// Reads a whole regular file, following a final symlink while it stays inside.
    pub(crate) fn read(&self, path: &SandboxPath) -> Result<Vec<u8>> {
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
        let mut data = Vec::new();
        File::from(fd)
            .read_to_end(&mut data)
            .map_err(|e| Error::io(ctx(), e))?;
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
        let names = list_names(fd.as_fd()).map_err(|e| fail(ctx(), e))?;
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
        rustix::fs::renameat(&src_parent, src_name, &dst_parent, dst_name).map_err(|e| match e {
            Errno::INVAL => into_itself(),
            // Here EXDEV is not an escape (both parents were resolved beneath the root)
            // but a move across mounts, e.g. a lower-layer directory of an overlay.
            Errno::XDEV => Error::unsupported(format!(
                "{}: cannot move between file systems (or a directory of a lower overlay layer)",
                ctx()
            )),
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
    /// The stream is the one [`sandcell::archive::pack_dir_tar`] writes for the same tree:
    /// each directory's entries in byte order, then its subdirectories' contents in turn.
    /// Symlinks are stored with their target, never followed; sockets, FIFOs and devices
    /// are skipped and counted; entries that vanish mid-walk are left out.
    pub(crate) fn export_tar(&self, dir: &SandboxPath, out: &mut dyn Write) -> Result<PackStats> {
        let top = self
            .open_dir_as(dir, OFlags::RDONLY)
            .map_err(|e| fail(format_args!("exporting {dir}"), e))?;
        let mut export = Export {
            builder: tar::Builder::new(out),
            stats: PackStats::default(),
            pending: Vec::new(),
            dir,
        };
        // Host directories mounted into the workspace are not part of it: the walk stays
        // on the workspace's own file system (a mount point is exported empty).
        let top_dev = rustix::fs::fstat(&top)
            .map_err(|e| fail(format_args!("exporting {dir}"), e))?
            .st_dev;
        export.directory(top, String::new())?;
        while let Some(next) = export.pending.pop() {
            match open_subdir(next.parent.as_fd(), &next.name) {
                Ok(fd) if rustix::fs::fstat(&fd).map(|st| st.st_dev).ok() != Some(top_dev) => {
                    tracing::debug!(dir = %dir, entry = %next.rel, "not exporting a mount point's contents");
                }
                Ok(fd) => export.directory(fd, next.rel)?,
                Err(Errno::NOENT | Errno::NOTDIR | Errno::LOOP) => {
                    tracing::warn!(dir = %dir, entry = %next.rel, "a directory was removed or replaced while exporting; its contents are left out");
                }
                Err(e) => {
                    return Err(fail(
                        format_args!("exporting {dir}: opening {}", next.rel),
                        e,
                    ))
                }
            }
        }
        let Export { builder, stats, .. } = export;
        builder
            .into_inner()
            .map_err(|e| Error::io(format_args!("exporting {dir}: finishing the archive"), e))?
            .flush()
            .map_err(|e| Error::io(format_args!("exporting {dir}: flushing the archive"), e))?;
        Ok(stats)
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

/// Opens `name` in `parent` as a directory for reading, refusing to follow a symlink.
fn open_subdir(parent: BorrowedFd<'_>, name: &CStr) -> rustix::io::Result<OwnedFd> {
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
fn list_names(dir: BorrowedFd<'_>) -> rustix::io::Result<Vec<CString>> {
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
fn remove_tree(parent: BorrowedFd<'_>, name: &CStr) -> rustix::io::Result<()> {
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
        _ => (ErrorKind::Backend, None),
    };
    let io = std::io::Error::from(e);
    let message = match why {
        Some(why) => format!("{context}: {why}"),
        None => format!("{context}: {io}"),
    };
    Error::with_source(kind, message, io)
}

/// The parts of a `stat` result this module uses.
#[derive(Debug, Clone, Copy)]
struct Meta {
    kind: FileKind,
    mode: u32,
    /// Bytes for files and symlinks (the target's length), 0 otherwise.
    size: u64,
    mtime: i64,
    mtime_nsec: u32,
    dev: u64,
    ino: u64,
}

impl Meta {
    // `Stat`'s field types differ between architectures, so some casts are no-ops here.
    #[allow(clippy::unnecessary_cast)]
    fn of(st: &Stat) -> Meta {
        let kind = match FileType::from_raw_mode(st.st_mode) {
            FileType::RegularFile => FileKind::File,
            FileType::Directory => FileKind::Dir,
            FileType::Symlink => FileKind::Symlink,
            _ => FileKind::Other,
        };
        let size = match kind {
            FileKind::File | FileKind::Symlink => st.st_size.max(0) as u64,
            _ => 0,
        };
        Meta {
            kind,
            mode: st.st_mode & 0o777,
            size,
            mtime: st.st_mtime as i64,
            mtime_nsec: (st.st_mtime_nsec as u64).min(999_999_999) as u32,
            dev: st.st_dev as u64,
            ino: st.st_ino as u64,
        }
    }

    fn info(&self, path: SandboxPath, symlink_target: Option<String>) -> FileInfo {
        FileInfo::new(path, self.kind, self.size, self.mode)
            .with_modified(chrono::DateTime::from_timestamp(
                self.mtime,
                self.mtime_nsec,
            ))
            .with_symlink_target(symlink_target)
    }

    /// A normalized tar header: mode masked to `0o777`, owner 0.
    fn header(&self, kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(mode & 0o777);
        h.set_size(size);
        h.set_mtime(self.mtime.max(0) as u64);
        h.set_uid(0);
        h.set_gid(0);
        h
    }
}

/// A directory whose contents are still to be exported, named relative to its parent's
/// descriptor so it is opened with `O_NOFOLLOW` when its turn comes.
struct PendingDir {
    parent: Rc<OwnedFd>,
    name: CString,
    rel: String,
}

/// One entry of a directory being exported, looked at without following it.
enum Found {
    Dir(Meta),
    File(File, Meta),
    Symlink(CString, Meta),
    Special,
    Gone,
}

/// State of one `export_tar` walk.
struct Export<'a, 'w> {
    builder: tar::Builder<&'w mut dyn Write>,
    stats: PackStats,
    /// Directories to export, the next on top.
    pending: Vec<PendingDir>,
    dir: &'a SandboxPath,
}

impl Export<'_, '_> {
    /// Archives the entries of the directory open as `fd` (at `rel_dir` in the archive)
    /// and queues its subdirectories.
    fn directory(&mut self, fd: OwnedFd, rel_dir: String) -> Result<()> {
        let dir = self.dir;
        let fd = Rc::new(fd);
        let names = list_names(fd.as_fd()).map_err(|e| {
            fail(
                format_args!("exporting {dir}: listing {}", display_rel(&rel_dir)),
                e,
            )
        })?;
        let mut subdirs = Vec::new();
        for name in names {
            let rel = match name.to_str() {
                Ok(n) if rel_dir.is_empty() => n.to_owned(),
                Ok(n) => format!("{rel_dir}/{n}"),
                Err(_) => {
                    return Err(Error::invalid_input(format!(
                        "exporting {dir}: cannot archive {}/{}: the name is not UTF-8",
                        display_rel(&rel_dir),
                        name.to_string_lossy()
                    )))
                }
            };
            let found = open_entry(fd.as_fd(), &name)
                .map_err(|e| fail(format_args!("exporting {dir}: reading {rel}"), e))?;
            let archived = |e| Error::io(format_args!("exporting {dir}: archiving {rel}"), e);
            match found {
                Found::Dir(meta) => {
                    let mut h = meta.header(tar::EntryType::Directory, meta.mode, 0);
                    self.builder
                        .append_data(&mut h, &rel, std::io::empty())
                        .map_err(archived)?;
                    subdirs.push(PendingDir {
                        parent: Rc::clone(&fd),
                        name,
                        rel,
                    });
                }
                Found::File(file, meta) => {
                    let mut h = meta.header(tar::EntryType::Regular, meta.mode, meta.size);
                    self.builder
                        .append_data(&mut h, &rel, exactly(file, meta.size))
                        .map_err(archived)?;
                    self.stats.content_bytes += meta.size;
                }
                Found::Symlink(target, meta) => {
                    let mut h = meta.header(tar::EntryType::Symlink, 0o777, 0);
                    self.builder
                        .append_link(&mut h, &rel, OsStr::from_bytes(target.as_bytes()))
                        .map_err(archived)?;
                }
                Found::Special => {
                    tracing::warn!(dir = %dir, entry = %rel, "skipping special file (socket, FIFO or device) while exporting");
                    self.stats.skipped += 1;
                    continue;
                }
                Found::Gone => continue,
            }
            self.stats.entries += 1;
        }
        // Pushed in reverse so they pop in sorted order.
        self.pending.extend(subdirs.into_iter().rev());
        Ok(())
    }
}

fn display_rel(rel: &str) -> &str {
    if rel.is_empty() {
        "."
    } else {
        rel
    }
}

/// Looks at `name` in `dir` without following it, opening it if it is a regular file.
///
/// A process in the sandbox may change the entry between the look and the open; the
/// look is repeated a few times rather than trusting a stale answer.
fn open_entry(dir: BorrowedFd<'_>, name: &CStr) -> rustix::io::Result<Found> {
    for _ in 0..4 {
        let meta = match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => Meta::of(&st),
            Err(Errno::NOENT) => return Ok(Found::Gone),
            Err(e) => return Err(e),
        };
        match meta.kind {
            FileKind::Dir => return Ok(Found::Dir(meta)),
            FileKind::File => {
                // O_NONBLOCK: should a FIFO take the name meanwhile, the open must not hang.
                let flags = OFlags::RDONLY
                    | OFlags::NOFOLLOW
                    | OFlags::NONBLOCK
                    | OFlags::NOCTTY
                    | OFlags::CLOEXEC;
                match rustix::fs::openat(dir, name, flags, Mode::empty()) {
                    Ok(fd) => {
                        // The size and mode that count are the open file's.
                        let meta = Meta::of(&rustix::fs::fstat(&fd)?);
                        if meta.kind == FileKind::File {
                            return Ok(Found::File(File::from(fd), meta));
                        }
                    }
                    Err(Errno::NOENT) => return Ok(Found::Gone),
                    Err(Errno::LOOP | Errno::NXIO) => {}
                    Err(e) => return Err(e),
                }
            }
            FileKind::Symlink => match rustix::fs::readlinkat(dir, name, Vec::new()) {
                Ok(target) => return Ok(Found::Symlink(target, meta)),
                Err(Errno::NOENT) => return Ok(Found::Gone),
                // No longer a symlink.
                Err(Errno::INVAL) => {}
                Err(e) => return Err(e),
            },
            _ => return Ok(Found::Special),
        }
    }
    Err(Errno::AGAIN)
}

/// Exactly `size` bytes of `reader`: cut off if the file grew since its size was taken,
/// zero-filled if it shrank, so the tar entry always matches its header.
fn exactly(reader: impl Read, size: u64) -> impl Read {
    reader.take(size).chain(std::io::repeat(0)).take(size)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::os::unix::fs::{symlink, PermissionsExt};
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    const SECRET: &[u8] = b"TOP-SECRET-bytes-that-live-outside-the-workspace";

    fn p(s: &str) -> SandboxPath {
        SandboxPath::new(s).unwrap()
    }

    /// A workspace and, next to it, a host directory that must never be touched.
    struct Fixture {
        _dir: tempfile::TempDir,
        root: PathBuf,
        ws: Workspace,
        outside: tempfile::TempDir,
    }

    impl Fixture {
        fn new() -> Fixture {
            let dir = tempfile::tempdir().unwrap();
            let root = dir.path().join("ws");
            std::fs::create_dir(&root).unwrap();
            let ws = Workspace::open(&root).unwrap();
            let outside = tempfile::tempdir().unwrap();
            std::fs::write(outside.path().join("secret"), SECRET).unwrap();
            Fixture {
                _dir: dir,
                root,
                ws,
                outside,
            }
        }

        fn host(&self, rel: &str) -> PathBuf {
            self.root.join(rel)
        }

        fn link(&self, at: &str, target: impl AsRef<Path>) {
            let at = self.host(at);
            std::fs::create_dir_all(at.parent().unwrap()).unwrap();
            symlink(target, at).unwrap();
        }

        /// The outside directory's files and their contents.
        fn outside_snapshot(&self) -> BTreeMap<String, Vec<u8>> {
            snapshot(self.outside.path())
        }
    }

    fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
        let mut out = BTreeMap::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name().to_string_lossy().into_owned();
            let ty = entry.file_type().unwrap();
            if ty.is_dir() {
                for (k, v) in snapshot(&entry.path()) {
                    out.insert(format!("{name}/{k}"), v);
                }
                out.insert(name, b"<dir>".to_vec());
            } else if ty.is_symlink() {
                out.insert(name, b"<link>".to_vec());
            } else {
                out.insert(name, std::fs::read(entry.path()).unwrap());
            }
        }
        out
    }

    fn kind<T: fmt::Debug>(r: Result<T>) -> ErrorKind {
        r.unwrap_err().kind()
    }

    fn contains(haystack: &[u8], needle: &[u8]) -> bool {
        haystack.windows(needle.len()).any(|w| w == needle)
    }

    type TarEntry = (String, tar::EntryType, Option<String>, Vec<u8>);

    fn tar_entries(data: &[u8]) -> Vec<TarEntry> {
        let mut archive = tar::Archive::new(data);
        archive
            .entries()
            .unwrap()
            .map(|e| {
                let mut e = e.unwrap();
                let path = e.path().unwrap().to_string_lossy().into_owned();
                let ty = e.header().entry_type();
                let link = e
                    .link_name()
                    .unwrap()
                    .map(|l| l.to_string_lossy().into_owned());
                let mut content = Vec::new();
                e.read_to_end(&mut content).unwrap();
                (path, ty, link, content)
            })
            .collect()
    }

    fn export(ws: &Workspace, dir: &str) -> Result<(Vec<u8>, PackStats)> {
        let mut out = Vec::new();
        let stats = ws.export_tar(&p(dir), &mut out)?;
        Ok((out, stats))
    }

    #[test]
    fn files_round_trip() {
        let f = Fixture::new();
        let data: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
        f.ws.write(&p("rt/deep/er/bin.dat"), &data).unwrap();
        assert_eq!(f.ws.read(&p("rt/deep/er/bin.dat")).unwrap(), data);
        f.ws.write(&p("rt/deep/er/bin.dat"), b"short").unwrap();
        assert_eq!(f.ws.read(&p("rt/deep/er/bin.dat")).unwrap(), b"short");
        f.ws.write(&p("rt/empty"), b"").unwrap();
        assert!(f.ws.read(&p("rt/empty")).unwrap().is_empty());
        f.ws.write(&p("rt/b.txt"), b"bb").unwrap();

        let st = f.ws.stat(&p("rt/b.txt")).unwrap();
        assert_eq!(
            (st.kind, st.size, st.path.clone()),
            (FileKind::File, 2, p("rt/b.txt"))
        );
        assert!(st.modified.is_some());
        assert!(st.symlink_target.is_none());
        let dir = f.ws.stat(&p("rt/deep")).unwrap();
        assert_eq!((dir.kind, dir.size), (FileKind::Dir, 0));
        assert_eq!(f.ws.stat(&SandboxPath::root()).unwrap().kind, FileKind::Dir);

        let listed: Vec<_> =
            f.ws.list_dir(&p("rt"))
                .unwrap()
                .into_iter()
                .map(|e| (e.name, e.path, e.kind, e.size))
                .collect();
        assert_eq!(
            listed,
            vec![
                ("b.txt".to_owned(), p("rt/b.txt"), FileKind::File, 2),
                ("deep".to_owned(), p("rt/deep"), FileKind::Dir, 0),
                ("empty".to_owned(), p("rt/empty"), FileKind::File, 0),
            ]
        );
        let top: Vec<_> =
            f.ws.list_dir(&SandboxPath::root())
                .unwrap()
                .into_iter()
                .map(|e| e.path)
                .collect();
        assert_eq!(top, vec![p("rt")]);
        assert_eq!(std::fs::read(f.host("rt/b.txt")).unwrap(), b"bb");
    }

    #[test]
    fn write_keeps_an_existing_mode_and_creates_plain_files() {
        let f = Fixture::new();
        f.ws.write(&p("x.sh"), b"#!/bin/sh\n").unwrap();
        let mode = f.ws.stat(&p("x.sh")).unwrap().mode;
        // 0o644 less whatever the process umask takes away.
        assert_eq!(mode & 0o711, 0o600, "{mode:o}");
        std::fs::set_permissions(f.host("x.sh"), std::fs::Permissions::from_mode(0o750)).unwrap();
        f.ws.write(&p("x.sh"), b"echo hi\n").unwrap();
        assert_eq!(f.ws.stat(&p("x.sh")).unwrap().mode, 0o750);
        assert_eq!(f.ws.read(&p("x.sh")).unwrap(), b"echo hi\n");
    }

    #[test]
    fn errors_have_the_reference_kinds() {
        let f = Fixture::new();
        f.ws.write(&p("d/file"), b"1").unwrap();
        f.ws.write(&p("full/inner/x"), b"1").unwrap();
        f.link("loop", "loop");
        let root = SandboxPath::root();
        use ErrorKind::*;

        assert_eq!(kind(f.ws.read(&p("missing"))), NotFound);
        assert_eq!(kind(f.ws.read(&p("d"))), InvalidInput);
        assert_eq!(kind(f.ws.read(&root)), InvalidInput);
        assert_eq!(kind(f.ws.read(&p("d/file/below"))), NotFound);
        assert_eq!(kind(f.ws.read(&p("loop"))), InvalidInput);

        assert_eq!(kind(f.ws.write(&root, b"x")), InvalidInput);
        assert_eq!(kind(f.ws.write(&p("d"), b"x")), InvalidInput);
        assert_eq!(kind(f.ws.write(&p("d/file/below"), b"x")), InvalidInput);
        assert_eq!(kind(f.ws.write(&p("loop"), b"x")), InvalidInput);

        assert_eq!(kind(f.ws.stat(&p("missing"))), NotFound);
        assert_eq!(kind(f.ws.stat(&p("d/missing"))), NotFound);
        assert_eq!(kind(f.ws.stat(&p("d/file/below"))), NotFound);

        assert_eq!(kind(f.ws.list_dir(&p("d/file"))), InvalidInput);
        assert_eq!(kind(f.ws.list_dir(&p("nope"))), NotFound);
        assert_eq!(kind(f.ws.list_dir(&p("d/file/below"))), NotFound);

        assert_eq!(kind(f.ws.remove(&root, true)), InvalidInput);
        assert_eq!(kind(f.ws.remove(&p("nope"), false)), NotFound);
        assert_eq!(kind(f.ws.remove(&p("full"), false)), InvalidInput);
        assert_eq!(
            f.ws.read(&p("full/inner/x")).unwrap(),
            b"1",
            "a refused remove removes nothing"
        );

        assert_eq!(kind(f.ws.mkdir(&p("d/file"))), AlreadyExists);
        assert_eq!(kind(f.ws.mkdir(&p("d/file/below"))), AlreadyExists);

        assert_eq!(kind(f.ws.rename(&root, &p("x"))), InvalidInput);
        assert_eq!(kind(f.ws.rename(&p("d"), &root)), InvalidInput);
        assert_eq!(kind(f.ws.rename(&p("nope"), &p("x"))), NotFound);
        assert_eq!(kind(f.ws.rename(&p("d"), &p("d/new/inside"))), InvalidInput);
        assert!(
            !f.host("d/new").exists(),
            "a refused move creates no parents"
        );
        assert_eq!(kind(f.ws.rename(&p("d/file"), &p("full"))), AlreadyExists);

        assert_eq!(kind(f.ws.open_dir(&p("d/file"))), InvalidInput);
        assert_eq!(kind(f.ws.open_dir(&p("nope"))), NotFound);
        assert_eq!(kind(f.ws.resolve_dir(&p("d/file"))), InvalidInput);
        assert_eq!(kind(f.ws.resolve_dir(&p("nope"))), NotFound);

        assert_eq!(kind(export(&f.ws, "nope")), NotFound);
        assert_eq!(kind(export(&f.ws, "d/file")), InvalidInput);

        let err = f.ws.write(&p("d"), b"x").unwrap_err();
        assert!(err.to_string().starts_with("writing d: "), "{err}");
        assert_eq!(
            kind(Workspace::open(&f.root.join("no-such-workspace"))),
            NotFound
        );
    }

    #[test]
    fn mkdir_creates_parents_and_is_idempotent() {
        let f = Fixture::new();
        f.ws.mkdir(&p("mk/a/b")).unwrap();
        f.ws.mkdir(&p("mk/a/b")).unwrap();
        f.ws.mkdir(&SandboxPath::root()).unwrap();
        assert!(f.host("mk/a/b").is_dir());
        f.link("mk/ln", "a");
        f.ws.mkdir(&p("mk/ln"))
            .expect("an in-workspace link to a directory is a directory");
        f.ws.mkdir(&p("mk/ln/c/d")).unwrap();
        assert!(f.host("mk/a/c/d").is_dir());
        assert_eq!(f.ws.stat(&p("mk/ln")).unwrap().kind, FileKind::Symlink);
    }

    #[test]
    fn rename_moves_files_dirs_and_links() {
        let f = Fixture::new();
        f.ws.write(&p("mv/a/b/f"), b"1").unwrap();
        f.ws.rename(&p("mv/a/b/f"), &p("mv/new/parents/g")).unwrap();
        assert_eq!(f.ws.read(&p("mv/new/parents/g")).unwrap(), b"1");
        assert_eq!(kind(f.ws.stat(&p("mv/a/b/f"))), ErrorKind::NotFound);

        f.ws.write(&p("mv/other"), b"2").unwrap();
        f.ws.rename(&p("mv/other"), &p("mv/new/parents/g"))
            .expect("replaces a file");
        assert_eq!(f.ws.read(&p("mv/new/parents/g")).unwrap(), b"2");

        f.ws.rename(&p("mv/a"), &p("mv/moved")).unwrap();
        assert_eq!(f.ws.stat(&p("mv/moved/b")).unwrap().kind, FileKind::Dir);

        f.ws.write(&p("mv/plain"), b"3").unwrap();
        f.ws.rename(&p("mv/moved"), &p("mv/plain"))
            .expect("a directory replaces a file");
        assert_eq!(f.ws.stat(&p("mv/plain/b")).unwrap().kind, FileKind::Dir);

        f.ws.rename(&p("mv/plain"), &p("mv/plain"))
            .expect("renaming onto itself does nothing");

        f.link("mv/link", "new/parents/g");
        f.ws.rename(&p("mv/link"), &p("mv/link2")).unwrap();
        let st = f.ws.stat(&p("mv/link2")).unwrap();
        assert_eq!(st.kind, FileKind::Symlink, "the link itself moved");
        assert_eq!(st.symlink_target.as_deref(), Some("new/parents/g"));
        assert_eq!(f.ws.read(&p("mv/new/parents/g")).unwrap(), b"2");

        // Into itself through an in-workspace link: the kernel refuses it.
        f.link("mv/via", "plain");
        assert_eq!(
            kind(f.ws.rename(&p("mv/plain"), &p("mv/via/b/x"))),
            ErrorKind::InvalidInput
        );
    }

    #[test]
    fn remove_files_links_and_trees() {
        let f = Fixture::new();
        f.ws.write(&p("rm/f"), b"1").unwrap();
        f.ws.write(&p("rm/tree/a/b/c"), b"1").unwrap();
        f.ws.mkdir(&p("rm/empty")).unwrap();
        f.link("rm/link", "tree");
        f.ws.remove(&p("rm/link"), true).unwrap();
        assert!(
            f.host("rm/tree/a/b/c").exists(),
            "removing a link keeps its target"
        );
        f.ws.remove(&p("rm/f"), false).unwrap();
        f.ws.remove(&p("rm/empty"), false).unwrap();
        f.ws.remove(&p("rm/tree"), true).unwrap();
        assert!(f.ws.list_dir(&p("rm")).unwrap().is_empty());
        f.ws.remove(&p("rm"), false).unwrap();
        assert!(!f.host("rm").exists());
    }

    #[test]
    fn inner_symlinks_are_followed() {
        let f = Fixture::new();
        f.ws.mkdir(&p("sl/sub")).unwrap();
        f.link("sl/inner", "sub");
        f.link("sl/sub/up", "..");
        f.ws.write(&p("sl/inner/f"), b"in").unwrap();
        assert_eq!(f.ws.read(&p("sl/sub/f")).unwrap(), b"in");
        assert_eq!(f.ws.read(&p("sl/sub/up/inner/f")).unwrap(), b"in");
        let st = f.ws.stat(&p("sl/inner")).unwrap();
        assert_eq!(st.kind, FileKind::Symlink, "stat does not follow");
        assert_eq!((st.size, st.symlink_target.as_deref()), (3, Some("sub")));
        assert_eq!(f.ws.stat(&p("sl/inner/f")).unwrap().kind, FileKind::File);
        let listed: Vec<_> =
            f.ws.list_dir(&p("sl/inner"))
                .unwrap()
                .into_iter()
                .map(|e| (e.path, e.kind))
                .collect();
        assert_eq!(
            listed,
            vec![
                (p("sl/inner/f"), FileKind::File),
                (p("sl/inner/up"), FileKind::Symlink)
            ]
        );
        f.ws.open_dir(&p("sl/inner")).unwrap();
        assert_eq!(f.ws.resolve_dir(&p("sl/inner")).unwrap(), f.host("sl/sub"));
        assert_eq!(f.ws.resolve_dir(&SandboxPath::root()).unwrap(), f.root);
        let (tar, _) = export(&f.ws, "sl/inner").unwrap();
        let names: Vec<_> = tar_entries(&tar).into_iter().map(|e| e.0).collect();
        assert_eq!(names, vec!["f", "up"]);

        // A dangling link that stays inside: writing through it creates the target.
        f.link("sl/dangling", "sub/created");
        f.ws.write(&p("sl/dangling"), b"new").unwrap();
        assert_eq!(std::fs::read(f.host("sl/sub/created")).unwrap(), b"new");
        assert_eq!(
            f.ws.stat(&p("sl/dangling")).unwrap().kind,
            FileKind::Symlink
        );
    }

    #[test]
    fn resolve_dir_is_spelled_under_the_root_path() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("real/sub")).unwrap();
        symlink(dir.path().join("real"), dir.path().join("alias")).unwrap();
        let ws = Workspace::open(&dir.path().join("alias")).unwrap();
        assert_eq!(ws.root_path(), dir.path().join("alias"));
        assert_eq!(
            ws.resolve_dir(&p("sub")).unwrap(),
            dir.path().join("alias/sub")
        );
    }

    #[test]
    fn escapes_are_refused_and_touch_nothing_outside() {
        let f = Fixture::new();
        let outside = f.outside.path().to_path_buf();
        std::fs::write(outside.join("x"), b"outside x").unwrap();
        f.ws.mkdir(&p("sl/sub")).unwrap();
        f.ws.write(&p("sl/keep"), b"keep").unwrap();
        f.link("sl/abs", &outside);
        f.link("sl/rel", "../../../../../../../../../../../../../../../..");
        f.link("sl/sub/up", "../..");
        f.link("sl/abs_file", outside.join("secret"));
        let before = f.outside_snapshot();
        let ws_before = snapshot(&f.root);

        // `sl/sub/up` is the workspace root, so `sl/sub/up/sl/rel` chains two links.
        for base in ["sl/abs", "sl/rel", "sl/sub/up/sl/abs", "sl/sub/up/sl/rel"] {
            let base = p(base);
            let below = |name: &str| base.join(name).unwrap();
            let denied = |what: &str, got: ErrorKind| {
                assert_eq!(got, ErrorKind::PermissionDenied, "{what} under {base}");
            };
            denied("read", kind(f.ws.read(&below("secret"))));
            denied("read", kind(f.ws.read(&below("x"))));
            denied("write", kind(f.ws.write(&below("owned"), b"x")));
            denied("write", kind(f.ws.write(&below("x"), b"x")));
            denied("write deep", kind(f.ws.write(&below("a/b/owned"), b"x")));
            denied("mkdir", kind(f.ws.mkdir(&below("owned"))));
            denied("mkdir deep", kind(f.ws.mkdir(&below("a/b"))));
            denied("list_dir", kind(f.ws.list_dir(&base)));
            denied("stat", kind(f.ws.stat(&below("x"))));
            denied("remove", kind(f.ws.remove(&below("x"), true)));
            denied(
                "rename into",
                kind(f.ws.rename(&p("sl/keep"), &below("owned"))),
            );
            denied(
                "rename into deep",
                kind(f.ws.rename(&p("sl/keep"), &below("a/owned"))),
            );
            denied(
                "rename out of",
                kind(f.ws.rename(&below("x"), &p("stolen"))),
            );
            denied("open_dir", kind(f.ws.open_dir(&base)));
            denied("resolve_dir", kind(f.ws.resolve_dir(&base)));
            denied("export", kind(export(&f.ws, base.as_str())));
        }
        assert_eq!(
            kind(f.ws.read(&p("sl/abs_file"))),
            ErrorKind::PermissionDenied
        );
        assert_eq!(
            kind(f.ws.write(&p("sl/abs_file"), b"x")),
            ErrorKind::PermissionDenied
        );
        assert_eq!(f.outside_snapshot(), before, "nothing outside changed");
        assert_eq!(
            snapshot(&f.root),
            ws_before,
            "nothing inside changed either"
        );

        f.ws.remove(&p("sl/abs"), false)
            .expect("removing a link removes the link");
        assert_eq!(f.outside_snapshot(), before);
    }

    #[test]
    fn recursive_remove_never_follows_links() {
        let f = Fixture::new();
        let outside = f.outside.path().to_path_buf();
        std::fs::create_dir(outside.join("dir")).unwrap();
        std::fs::write(outside.join("dir/keep"), b"keep").unwrap();
        f.ws.write(&p("tree/a/b/file"), b"1").unwrap();
        f.link("tree/out", &outside);
        f.link("tree/a/b/deep_out", outside.join("dir"));
        f.link("tree/a/file_out", outside.join("secret"));
        f.link("top_out", &outside);
        let before = f.outside_snapshot();
        f.ws.remove(&p("tree"), true).unwrap();
        f.ws.remove(&p("top_out"), true).unwrap();
        assert!(f.ws.list_dir(&SandboxPath::root()).unwrap().is_empty());
        assert_eq!(f.outside_snapshot(), before, "outside files survive");
    }

    #[test]
    fn export_stores_links_and_never_their_targets() {
        let f = Fixture::new();
        f.ws.write(&p("src/a.txt"), b"alpha").unwrap();
        f.ws.write(&p("src/nested/b.bin"), &[7u8; 3000]).unwrap();
        f.ws.write(&p("src/a.dir/z"), b"z").unwrap();
        f.ws.mkdir(&p("src/emptydir")).unwrap();
        f.link("src/link", "a.txt");
        let secret = f.outside.path().join("secret");
        f.link("src/secret_link", &secret);
        f.link("src/outdir_link", f.outside.path());
        f.link("src/shadow", "/etc/shadow");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            f.host("src/fifo").as_path(),
            FileType::Fifo,
            Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        std::fs::set_permissions(f.host("src/a.txt"), std::fs::Permissions::from_mode(0o4755))
            .unwrap();

        let (tar, stats) = export(&f.ws, "src").unwrap();
        assert!(!contains(&tar, SECRET), "no bytes of a link's target");
        let entries = tar_entries(&tar);
        let summary: Vec<_> = entries
            .iter()
            .map(|(path, ty, link, _)| (path.as_str(), *ty, link.as_deref()))
            .collect();
        use tar::EntryType as T;
        let secret_str = secret.to_str().unwrap();
        let outdir_str = f.outside.path().to_str().unwrap();
        assert_eq!(
            summary,
            vec![
                ("a.dir", T::Directory, None),
                ("a.txt", T::Regular, None),
                ("emptydir", T::Directory, None),
                ("link", T::Symlink, Some("a.txt")),
                ("nested", T::Directory, None),
                ("outdir_link", T::Symlink, Some(outdir_str)),
                ("secret_link", T::Symlink, Some(secret_str)),
                ("shadow", T::Symlink, Some("/etc/shadow")),
                ("a.dir/z", T::Regular, None),
                ("nested/b.bin", T::Regular, None),
            ]
        );
        assert_eq!(entries[1].3, b"alpha");
        assert_eq!(entries[9].3, vec![7u8; 3000]);
        assert_eq!(
            (stats.entries, stats.skipped, stats.content_bytes),
            (10, 1, 5 + 1 + 3000)
        );

        let mut archive = tar::Archive::new(&tar[..]);
        for entry in archive.entries().unwrap() {
            let entry = entry.unwrap();
            let h = entry.header();
            assert_eq!((h.uid().unwrap(), h.gid().unwrap()), (0, 0));
            assert_eq!(h.mode().unwrap() & !0o777, 0, "mode masked");
            assert!(h.mtime().unwrap() > 0);
        }

        // The same stream the host packer writes for the same tree.
        let mut host = Vec::new();
        sandcell::archive::pack_dir_tar(&f.host("src"), &mut host).unwrap();
        assert!(host == tar, "export matches pack_dir_tar byte for byte");

        // Through an in-workspace link to the directory, and from the root.
        f.link("src_link", "src");
        assert_eq!(export(&f.ws, "src_link").unwrap().0, tar);
        let (all, _) = export(&f.ws, "").unwrap();
        assert!(!contains(&all, SECRET));
        assert_eq!(tar_entries(&all)[0].0, "src");
    }

    #[test]
    fn export_entries_match_their_headers() {
        assert_eq!(read_all(exactly(&b"abc"[..], 5)), b"abc\0\0");
        assert_eq!(read_all(exactly(&b"abcdef"[..], 4)), b"abcd");
        assert_eq!(read_all(exactly(&b""[..], 0)), b"");
    }

    fn read_all(mut r: impl Read) -> Vec<u8> {
        let mut out = Vec::new();
        r.read_to_end(&mut out).unwrap();
        out
    }

    #[test]
    fn symlink_ancestor_finds_the_link_closest_to_the_root() {
        let f = Fixture::new();
        f.ws.write(&p("a/b/file"), b"1").unwrap();
        f.link("a/l1", "b");
        f.link("l0", "a");
        f.link("a/b/out", f.outside.path());
        assert_eq!(
            f.ws.symlink_ancestor(&p("a/l1/x/y")).unwrap(),
            Some(p("a/l1"))
        );
        assert_eq!(f.ws.symlink_ancestor(&p("l0/l1/z")).unwrap(), Some(p("l0")));
        assert_eq!(
            f.ws.symlink_ancestor(&p("a/b/out/x")).unwrap(),
            Some(p("a/b/out"))
        );
        assert_eq!(
            f.ws.symlink_ancestor(&p("a/l1")).unwrap(),
            None,
            "not the path itself"
        );
        assert_eq!(f.ws.symlink_ancestor(&p("a/b/c/d")).unwrap(), None);
        assert_eq!(f.ws.symlink_ancestor(&p("missing/l/x")).unwrap(), None);
        assert_eq!(f.ws.symlink_ancestor(&p("a/b/file/x")).unwrap(), None);
        assert_eq!(f.ws.symlink_ancestor(&SandboxPath::root()).unwrap(), None);
    }

    /// A thread keeps exchanging directory `d` with a symlink to an outside directory
    /// while the workspace is written, read, listed and exported through `d`.
    #[test]
    fn swapping_a_directory_for_an_outside_link_never_escapes() {
        let f = Fixture::new();
        std::fs::write(f.outside.path().join("f"), SECRET).unwrap();
        f.ws.write(&p("d/f"), b"inside").unwrap();
        f.link("swap", f.outside.path());
        let before = f.outside_snapshot();

        let stop = Arc::new(AtomicBool::new(false));
        let swaps = Arc::new(AtomicU64::new(0));
        let swapper = {
            let (stop, swaps) = (Arc::clone(&stop), Arc::clone(&swaps));
            let (d, swap) = (f.host("d"), f.host("swap"));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    rustix::fs::renameat_with(
                        rustix::fs::CWD,
                        d.as_path(),
                        rustix::fs::CWD,
                        swap.as_path(),
                        rustix::fs::RenameFlags::EXCHANGE,
                    )
                    .unwrap();
                    swaps.fetch_add(1, Ordering::Relaxed);
                }
            })
        };

        let start = Instant::now();
        let mut rounds = 0u64;
        let mut exported_while_dir = 0u64;
        let mut writes_denied = 0u64;
        while start.elapsed() < Duration::from_millis(300) {
            rounds += 1;
            match f.ws.write(&p("d/f"), b"inside") {
                Err(e) if e.kind() == ErrorKind::PermissionDenied => writes_denied += 1,
                _ => {}
            }
            let _ = f.ws.write(&p("d/new"), b"inside");
            let _ = f.ws.mkdir(&p("d/sub/deeper"));
            if let Ok(data) = f.ws.read(&p("d/f")) {
                assert_ne!(data, SECRET, "read through the swapped link");
            }
            if let Ok(entries) = f.ws.list_dir(&p("d")) {
                assert!(entries.iter().all(|e| e.name != "secret"), "listed outside");
            }
            let mut out = Vec::new();
            let result = f.ws.export_tar(&SandboxPath::root(), &mut out);
            assert!(!contains(&out, SECRET), "exported outside bytes");
            if result.is_ok() && tar_entries(&out).iter().any(|e| e.0 == "d/f") {
                exported_while_dir += 1;
            }
            let _ = f.ws.remove(&p("d/sub"), true);
        }
        stop.store(true, Ordering::Relaxed);
        swapper.join().unwrap();

        assert_eq!(
            f.outside_snapshot(),
            before,
            "nothing appeared or changed outside"
        );
        assert!(swaps.load(Ordering::Relaxed) > 100, "the race ran");
        assert!(
            rounds > 10 && exported_while_dir > 0 && writes_denied > 0,
            "{rounds} rounds, {exported_while_dir} exports saw d, {writes_denied} writes refused"
        );
    }
}
