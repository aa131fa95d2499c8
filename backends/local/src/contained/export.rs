//! The export walk: a workspace directory written as a tar, every directory opened
//! relative to its parent with `O_NOFOLLOW`, entries looked at without following them.

use std::ffi::{CStr, CString, OsStr};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use rustix::fs::{AtFlags, Mode, OFlags};
use rustix::io::Errno;
use sandcell::archive::PackStats;
use sandcell::raw::tree::{is_mount_root, DirStack};
use sandcell::MAX_PATH_LEN;
use sandcell::{Error, FileKind, Result, SandboxPath};

use super::meta::Meta;
use super::{fail, list_names, open_subdir};

/// Writes the directory open as `top` (the workspace's `dir`) as an uncompressed tar.
///
/// Depth first with a bounded number of descriptors however deep or wide the tree
/// ([`sandcell::raw::tree::DirStack`]); a path longer than a sandbox path may be
/// ([`sandcell::MAX_PATH_LEN`]) fails the export. No importer takes such a
/// path, and without the cap a chain of directories `d/d/d/...` would cost the host
/// header bytes quadratic in its depth (40,000 levels, a few megabytes of
/// directories, made a 1.6 GB stream).
pub(super) fn write_tar(top: OwnedFd, dir: &SandboxPath, out: &mut dyn Write) -> Result<PackStats> {
    let mut export = Export {
        builder: tar::Builder::new(out),
        stats: PackStats::default(),
        dir,
        path: String::new(),
    };
    // Host directories mounted into the workspace are not part of it: the walk stays
    // on the workspace's own file system and out of mount points (a bind mount of a
    // directory on that file system has its device), which are exported empty.
    let top_dev = rustix::fs::fstat(&top)
        .map_err(|e| fail(format_args!("exporting {dir}"), e))?
        .st_dev;
    let climbing = |e| fail(format_args!("exporting {dir}: a directory was moved"), e);
    let subdirs = export.directory(top.as_fd())?;
    let mut stack = DirStack::new();
    stack
        .push(top, c".".to_owned(), (0, subdirs))
        .map_err(climbing)?;
    while let Some(level) = stack.top_mut() {
        let Some(name) = level.data.1.pop() else {
            if let Some(done) = stack.pop().map_err(climbing)? {
                export.path.truncate(done.data.0);
            }
            continue;
        };
        let at = export.path.len();
        let rel = export.rel(&name)?;
        match open_subdir(level.fd().map_err(climbing)?, &name) {
            Ok(fd)
                if rustix::fs::fstat(&fd).map(|st| st.st_dev).ok() != Some(top_dev)
                    || is_mount_root(fd.as_fd()) =>
            {
                tracing::debug!(dir = %dir, entry = %rel, "not exporting a mount point's contents");
            }
            Ok(fd) => {
                export.path = rel;
                let subdirs = export.directory(fd.as_fd())?;
                stack.push(fd, name, (at, subdirs)).map_err(climbing)?;
            }
            Err(Errno::NOENT | Errno::NOTDIR | Errno::LOOP) => {
                tracing::warn!(dir = %dir, entry = %rel, "a directory was removed or replaced while exporting; its contents are left out");
            }
            Err(e) => return Err(fail(format_args!("exporting {dir}: opening {rel}"), e)),
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
    dir: &'a SandboxPath,
    /// Where the walk is, relative to `dir` (empty at its top).
    path: String,
}

impl Export<'_, '_> {
    /// The archive path of entry `name` of the directory the walk is in.
    fn rel(&self, name: &CStr) -> Result<String> {
        let dir = self.dir;
        let Ok(name) = name.to_str() else {
            return Err(Error::invalid_input(format!(
                "exporting {dir}: cannot archive {}/{}: the name is not UTF-8",
                display_rel(&self.path),
                name.to_string_lossy()
            )));
        };
        let rel = if self.path.is_empty() {
            name.to_owned()
        } else {
            format!("{}/{name}", self.path)
        };
        if rel.len() > MAX_PATH_LEN {
            return Err(Error::invalid_input(format!(
                "exporting {dir}: cannot archive {}/...: a path beneath it is longer than \
                 the {MAX_PATH_LEN} bytes a sandbox path may be",
                display_rel(&self.path).chars().take(64).collect::<String>()
            )));
        }
        Ok(rel)
    }

    /// Archives the entries of the directory open as `fd` (where the walk is) and
    /// answers its subdirectories, last first.
    fn directory(&mut self, fd: BorrowedFd<'_>) -> Result<Vec<CString>> {
        let dir = self.dir;
        let names = list_names(fd).map_err(|e| {
            fail(
                format_args!("exporting {dir}: listing {}", display_rel(&self.path)),
                e,
            )
        })?;
        let mut subdirs = Vec::new();
        for name in names {
            let rel = self.rel(&name)?;
            let found = open_entry(fd, &name)
                .map_err(|e| fail(format_args!("exporting {dir}: reading {rel}"), e))?;
            let archived = |e| Error::io(format_args!("exporting {dir}: archiving {rel}"), e);
            match found {
                Found::Dir(meta) => {
                    let mut h = meta.header(tar::EntryType::Directory, meta.mode, 0);
                    self.builder
                        .append_data(&mut h, &rel, std::io::empty())
                        .map_err(archived)?;
                    subdirs.push(name);
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
        // Reversed so they pop in sorted order.
        subdirs.reverse();
        Ok(subdirs)
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
pub(super) fn exactly(reader: impl Read, size: u64) -> impl Read {
    reader.take(size).chain(std::io::repeat(0)).take(size)
}
