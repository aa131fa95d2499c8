//! Unpacking a checked archive into a host directory: staging first, then swap-in.

use std::collections::HashSet;
use std::ffi::{CStr, CString, OsStr};
use std::fs::{self, File};
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

use super::pack::open_beneath;
use super::{read_entries, ArchiveLimits, CheckedEntry, EntryKind};
use crate::error::{Error, Result};

/// What an unpack wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct UnpackStats {
    /// Entries created.
    pub entries: u64,
    /// File content bytes written.
    pub content_bytes: u64,
}

/// Unpacks the tar stream `reader` so that `dest` ends up holding exactly its entries.
///
/// Everything is written to a fresh staging directory beside `dest` (same file system);
/// only when the whole stream was read without error is `dest` replaced by it. On any
/// error — a hostile entry, a cap, a stream error such as a hash mismatch raised at the
/// end — the staging directory is removed and `dest` is left exactly as it was. The
/// parent of `dest` must exist.
pub fn unpack_to_dir(
    reader: impl Read,
    dest: &Path,
    limits: &ArchiveLimits,
) -> Result<UnpackStats> {
    unpack_to_dir_with(reader, dest, limits, |_| Ok(()))
}

/// Like [`unpack_to_dir`], with `precheck` run on every entry after the standard checks
/// and before it is written (a backend refuses entries beneath symlinks that already
/// exist where the tree will be merged).
pub fn unpack_to_dir_with<F>(
    reader: impl Read,
    dest: &Path,
    limits: &ArchiveLimits,
    mut precheck: F,
) -> Result<UnpackStats>
where
    F: FnMut(&CheckedEntry) -> Result<()>,
{
    let parent = dest
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let staging = Scratch::new_in(parent, ".sandcell-staging-").map_err(|e| {
        Error::io(
            format_args!("creating a staging directory in {}", parent.display()),
            e,
        )
    })?;
    let root = rustix::fs::open(
        staging.path(),
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io("opening the staging directory", e))?;
    let mut writer = DirWriter::new(root);
    read_entries(reader, limits, |entry, content| {
        precheck(entry)?;
        writer.write_entry(entry, content)
    })?;
    writer.finish()?;
    // Through the descriptor: the staging path may have been swapped for a symlink.
    rustix::fs::fchmod(&writer.root, Mode::from_raw_mode(0o755))
        .map_err(|e| io("setting staging directory mode", e))?;
    let stats = writer.stats;
    swap_in(staging, dest)?;
    Ok(stats)
}

/// Replaces `dest` with the staging directory; `dest` may be absent.
fn swap_in(staging: Scratch, dest: &Path) -> Result<()> {
    let old = match fs::symlink_metadata(dest) {
        Ok(_) => {
            let parent = dest
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            let old = Scratch::new_in(parent, ".sandcell-old-")
                .map_err(|e| Error::io("creating a directory for the replaced contents", e))?;
            let old_path = old.path().join("old");
            fs::rename(dest, &old_path)
                .map_err(|e| Error::io(format_args!("moving {} aside", dest.display()), e))?;
            Some((old, old_path))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(Error::io(format_args!("inspecting {}", dest.display()), e)),
    };
    let staged = staging.keep();
    if let Err(e) = fs::rename(&staged, dest) {
        // Put the original back so a failed swap changes nothing.
        if let Some((_, old_path)) = &old {
            let _ = fs::rename(old_path, dest);
        }
        let _ = crate::raw::tree::remove_dir_all(&staged);
        return Err(Error::io(
            format_args!("moving the unpacked tree to {}", dest.display()),
            e,
        ));
    }
    // `old` removes the replaced contents when dropped.
    drop(old);
    Ok(())
}

/// A directory made for one unpack, removed when dropped unless kept. Removed with
/// the crate's walk ([`crate::raw::tree::remove_dir_all`]), never `std`'s recursive
/// one (which `tempfile` uses): an import stages inside the workspace, where a sandbox
/// process can move a directory chain of any depth into it, and a recursion that deep
/// overflows the thread's stack and aborts the host process.
struct Scratch(Option<PathBuf>);

impl Scratch {
    /// Makes a fresh directory named `prefix` and a random suffix in `parent`.
    fn new_in(parent: &Path, prefix: &str) -> std::io::Result<Self> {
        let dir = tempfile::Builder::new().prefix(prefix).tempdir_in(parent)?;
        Ok(Scratch(Some(dir.keep())))
    }

    fn path(&self) -> &Path {
        self.0.as_deref().unwrap_or(Path::new(""))
    }

    /// The directory, no longer removed on drop.
    fn keep(mut self) -> PathBuf {
        self.0.take().unwrap_or_default()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            let _ = crate::raw::tree::remove_dir_all(&path);
        }
    }
}

/// Writes checked entries beneath a fresh root.
///
/// The root may sit where a sandbox can write (an import stages inside the live
/// workspace, so the final moves are renames), and a sandbox process may swap any
/// directory in it for a symlink while the unpack runs. So nothing is reached by host
/// path: the root is held open, every parent is opened from it with no symlink
/// followed on the way ([`open_beneath`]), and entries are made with `*at` calls that
/// never follow a final symlink. A swap fails the unpack; it never writes elsewhere.
pub(crate) struct DirWriter {
    root: OwnedFd,
    known_dirs: HashSet<PathBuf>,
    /// Directories made, relative to the root, with the mode and time they get last.
    dir_modes: Vec<(PathBuf, u32, u64)>,
    buf: Vec<u8>,
    umask: Option<u32>,
    pub(crate) stats: UnpackStats,
}

impl DirWriter {
    /// A writer beneath the directory `root` (opened for reading).
    pub(crate) fn new(root: OwnedFd) -> Self {
        DirWriter {
            root,
            known_dirs: HashSet::new(),
            dir_modes: Vec::new(),
            buf: vec![0; 256 * 1024],
            umask: current_umask(),
            stats: UnpackStats::default(),
        }
    }

    /// Makes every missing directory on the way to `rel`, one component at a time
    /// beneath the root, and returns `rel`'s parent, open.
    fn parent_of(&mut self, rel: &Path) -> Result<OwnedFd> {
        let parent = rel.parent().unwrap_or(Path::new(""));
        if parent.as_os_str().is_empty() || self.known_dirs.contains(parent) {
            return open_beneath(self.root.as_fd(), parent)
                .map_err(|e| io(format_args!("opening {}", parent.display()), e));
        }
        let mut dir = open_beneath(self.root.as_fd(), Path::new(""))
            .map_err(|e| io("opening the staging directory", e))?;
        let mut made = PathBuf::new();
        for component in parent.components() {
            made.push(component);
            let name = c_name(component.as_os_str())?;
            match rustix::fs::mkdirat(&dir, &name, Mode::from_raw_mode(0o755)) {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(e) => return Err(io(format_args!("creating directory {}", made.display()), e)),
            }
            dir = match crate::raw::tree::open_subdir(dir.as_fd(), &name) {
                Ok(next) => next,
                // No ancestor can be an archive symlink (the checker refuses entries
                // beneath those): this is an earlier entry's file.
                Err(Errno::NOTDIR | Errno::LOOP) => {
                    return Err(Error::invalid_input(format!(
                        "archive entry {} needs {} to be a directory, but an earlier entry made it a file",
                        rel.display(),
                        parent.display()
                    )))
                }
                Err(e) => return Err(io(format_args!("opening {}", made.display()), e)),
            };
            self.known_dirs.insert(made.clone());
        }
        Ok(dir)
    }

    /// Removes whatever an earlier entry left at `name` in `dir` (`rel` beneath the
    /// root): a later entry replaces it.
    fn clear(&mut self, dir: BorrowedFd<'_>, name: &CStr, rel: &Path) -> Result<()> {
        let replacing = |e| io(format_args!("replacing {}", rel.display()), e);
        match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {
                crate::raw::tree::remove_tree(dir, name).map_err(replacing)?;
                self.known_dirs.retain(|d| !d.starts_with(rel));
                // Its mode and time are no longer ours to set.
                self.dir_modes.retain(|(p, _, _)| !p.starts_with(rel));
            }
            Ok(_) => rustix::fs::unlinkat(dir, name, AtFlags::empty()).map_err(replacing)?,
            Err(Errno::NOENT) => {}
            Err(e) => return Err(io(format_args!("inspecting {}", rel.display()), e)),
        }
        Ok(())
    }

    pub(crate) fn write_entry(
        &mut self,
        entry: &CheckedEntry,
        content: &mut dyn Read,
    ) -> Result<()> {
        let rel = entry.path.to_relative_path();
        let dir = self.parent_of(rel)?;
        let name = c_name(rel.file_name().unwrap_or(rel.as_os_str()))?;
        match &entry.kind {
            EntryKind::Dir => {
                if !self.known_dirs.contains(rel) {
                    match rustix::fs::statat(&dir, &name, AtFlags::SYMLINK_NOFOLLOW) {
                        Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {}
                        found => {
                            if found.is_ok() {
                                self.clear(dir.as_fd(), &name, rel)?;
                            }
                            rustix::fs::mkdirat(&dir, &name, Mode::from_raw_mode(0o755))
                                .map_err(|e| io(format_args!("creating {}", rel.display()), e))?;
                        }
                    }
                    self.known_dirs.insert(rel.to_path_buf());
                }
                self.dir_modes
                    .push((rel.to_path_buf(), entry.mode, entry.mtime));
            }
            EntryKind::File => {
                let mut file = match create_new(dir.as_fd(), &name, entry.mode) {
                    Ok(f) => f,
                    Err(Errno::EXIST) => {
                        self.clear(dir.as_fd(), &name, rel)?;
                        create_new(dir.as_fd(), &name, entry.mode)
                            .map_err(|e| io(format_args!("creating {}", rel.display()), e))?
                    }
                    Err(e) => return Err(io(format_args!("creating {}", rel.display()), e)),
                };
                let written = copy_exact(content, &mut file, &mut self.buf)
                    .map_err(|e| Error::io(format_args!("writing {}", rel.display()), e))?;
                if written != entry.size {
                    return Err(Error::corrupt(format!(
                        "archive entry {} is truncated: {written} of {} bytes",
                        entry.path, entry.size
                    )));
                }
                // The creation mode went through the umask; set it exactly unless the
                // umask provably left it alone (saves a syscall per file in the common case).
                let create_mode = entry.mode | 0o600;
                let exact = create_mode == entry.mode
                    && self.umask.is_some_and(|mask| create_mode & mask == 0);
                if !exact {
                    file.set_permissions(fs::Permissions::from_mode(entry.mode))
                        .map_err(|e| {
                            Error::io(format_args!("setting mode of {}", rel.display()), e)
                        })?;
                }
                file.set_modified(mtime(entry.mtime)).map_err(|e| {
                    Error::io(format_args!("setting mtime of {}", rel.display()), e)
                })?;
                self.stats.content_bytes += written;
            }
            EntryKind::Symlink(target) => {
                self.clear(dir.as_fd(), &name, rel)?;
                let target = c_name(target.as_ref())?;
                rustix::fs::symlinkat(&target, &dir, &name)
                    .map_err(|e| io(format_args!("creating symlink {}", rel.display()), e))?;
            }
            EntryKind::HardLink(target) => {
                self.clear(dir.as_fd(), &name, rel)?;
                let target_rel = target.to_relative_path();
                let missing = || {
                    // A link to itself, or to an entry a later one replaced.
                    Error::invalid_input(format!(
                        "archive hard link {} points at {target}, which the archive no \
                         longer holds",
                        entry.path
                    ))
                };
                let target_dir = match open_beneath(
                    self.root.as_fd(),
                    target_rel.parent().unwrap_or(Path::new("")),
                ) {
                    Ok(fd) => fd,
                    Err(Errno::NOENT | Errno::NOTDIR) => return Err(missing()),
                    Err(e) => {
                        return Err(io(format_args!("creating hard link {}", rel.display()), e))
                    }
                };
                let target_name = c_name(target_rel.file_name().unwrap_or(target_rel.as_os_str()))?;
                // linkat(2) without AT_SYMLINK_FOLLOW links a final symlink itself.
                match rustix::fs::linkat(&target_dir, &target_name, &dir, &name, AtFlags::empty()) {
                    Ok(()) => {}
                    Err(Errno::NOENT) => return Err(missing()),
                    Err(e) => {
                        return Err(io(format_args!("creating hard link {}", rel.display()), e))
                    }
                }
            }
        }
        self.stats.entries += 1;
        Ok(())
    }

    /// Applies directory modes and times, deepest first, so a read-only directory does
    /// not stop its children from being written.
    pub(crate) fn finish(&mut self) -> Result<()> {
        self.dir_modes
            .sort_by_key(|(p, _, _)| std::cmp::Reverse(p.components().count()));
        for (rel, mode, mtime_secs) in std::mem::take(&mut self.dir_modes) {
            // Opened with no symlink followed: one swapped in since is left alone.
            let Ok(dir) = open_beneath(self.root.as_fd(), &rel) else {
                continue;
            };
            rustix::fs::fchmod(&dir, Mode::from_raw_mode(mode & 0o7777))
                .map_err(|e| io(format_args!("setting mode of {}", rel.display()), e))?;
            let _ = File::from(dir).set_modified(mtime(mtime_secs));
        }
        Ok(())
    }
}

/// An errno as the crate's error, with what was being done.
fn io(what: impl std::fmt::Display, e: Errno) -> Error {
    Error::io(what, e.into())
}

/// A path component (or link target) as the `*at` calls take it.
fn c_name(name: &OsStr) -> Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| Error::invalid_input("a path with a NUL byte"))
}

/// The process umask, read without changing it (Linux reports it in /proc since 4.7).
fn current_umask() -> Option<u32> {
    let status = fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Umask:"))?;
    u32::from_str_radix(line.trim_start_matches("Umask:").trim(), 8).ok()
}

/// Creates file `name` in `dir`, which must not exist (a symlink there is not followed).
fn create_new(dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> rustix::io::Result<File> {
    rustix::fs::openat(
        dir,
        name,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode((mode | 0o600) & 0o7777),
    )
    .map(File::from)
}

fn mtime(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
}

fn copy_exact(from: &mut dyn Read, to: &mut File, buf: &mut [u8]) -> std::io::Result<u64> {
    let mut total = 0u64;
    loop {
        let n = match from.read(buf) {
            Ok(0) => return Ok(total),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        to.write_all(&buf[..n])?;
        total += n as u64;
    }
}
