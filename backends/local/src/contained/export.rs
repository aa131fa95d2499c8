//! The export walk: a workspace directory written as a tar, every directory opened
//! relative to its parent with `O_NOFOLLOW`, entries looked at without following them.

use std::ffi::{CStr, CString, OsStr};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::rc::Rc;

use rustix::fs::{AtFlags, Mode, OFlags};
use rustix::io::Errno;
use sandcell::archive::PackStats;
use sandcell::{Error, FileKind, Result, SandboxPath};

use super::meta::Meta;
use super::{fail, list_names, open_subdir};

/// Writes the directory open as `top` (the workspace's `dir`) as an uncompressed tar.
pub(super) fn write_tar(top: OwnedFd, dir: &SandboxPath, out: &mut dyn Write) -> Result<PackStats> {
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
pub(super) fn exactly(reader: impl Read, size: u64) -> impl Read {
    reader.take(size).chain(std::io::repeat(0)).take(size)
}
