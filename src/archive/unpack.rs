//! Unpacking a checked archive into a host directory: staging first, then swap-in.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

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
    let staging = tempfile::Builder::new()
        .prefix(".sandcell-staging-")
        .tempdir_in(parent)
        .map_err(|e| {
            Error::io(
                format_args!("creating a staging directory in {}", parent.display()),
                e,
            )
        })?;
    let mut writer = DirWriter::new(staging.path().to_path_buf());
    read_entries(reader, limits, |entry, content| {
        precheck(entry)?;
        writer.write_entry(entry, content)
    })?;
    writer.finish()?;
    fs::set_permissions(staging.path(), fs::Permissions::from_mode(0o755))
        .map_err(|e| Error::io("setting staging directory mode", e))?;
    let stats = writer.stats;
    swap_in(staging, dest)?;
    Ok(stats)
}

/// Replaces `dest` with the staging directory; `dest` may be absent.
fn swap_in(staging: tempfile::TempDir, dest: &Path) -> Result<()> {
    let old = match fs::symlink_metadata(dest) {
        Ok(_) => {
            let parent = dest
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            let old = tempfile::Builder::new()
                .prefix(".sandcell-old-")
                .tempdir_in(parent)
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
        let _ = fs::remove_dir_all(&staged);
        return Err(Error::io(
            format_args!("moving the unpacked tree to {}", dest.display()),
            e,
        ));
    }
    // `old` (a TempDir) removes the replaced contents when dropped.
    drop(old);
    Ok(())
}

/// Writes checked entries beneath a fresh root that only this writer touches.
pub(crate) struct DirWriter {
    root: PathBuf,
    known_dirs: HashSet<PathBuf>,
    dir_modes: Vec<(PathBuf, u32, u64)>,
    buf: Vec<u8>,
    umask: Option<u32>,
    pub(crate) stats: UnpackStats,
}

impl DirWriter {
    pub(crate) fn new(root: PathBuf) -> Self {
        DirWriter {
            root,
            known_dirs: HashSet::new(),
            dir_modes: Vec::new(),
            buf: vec![0; 256 * 1024],
            umask: current_umask(),
            stats: UnpackStats::default(),
        }
    }

    fn ensure_parent(&mut self, rel: &Path) -> Result<()> {
        let Some(parent) = rel.parent().filter(|p| !p.as_os_str().is_empty()) else {
            return Ok(());
        };
        if self.known_dirs.contains(parent) {
            return Ok(());
        }
        // No ancestor can be a symlink: the checker refuses entries beneath archive
        // symlinks and the staging root held nothing else.
        fs::create_dir_all(self.root.join(parent)).map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists | std::io::ErrorKind::NotADirectory => {
                Error::invalid_input(format!(
                    "archive entry {} needs {} to be a directory, but an earlier entry made it a file",
                    rel.display(),
                    parent.display()
                ))
            }
            _ => Error::io(format_args!("creating directory {}", parent.display()), e),
        })?;
        let mut p = Some(parent);
        while let Some(dir) = p.filter(|d| !d.as_os_str().is_empty()) {
            if !self.known_dirs.insert(dir.to_path_buf()) {
                break;
            }
            p = dir.parent();
        }
        Ok(())
    }

    /// Removes whatever an earlier entry left at `full` (a later entry replaces it).
    fn clear(&mut self, full: &Path, rel: &Path) -> Result<()> {
        match fs::symlink_metadata(full) {
            Ok(meta) if meta.is_dir() => {
                fs::remove_dir_all(full)
                    .map_err(|e| Error::io(format_args!("replacing {}", rel.display()), e))?;
                self.known_dirs.retain(|d| !d.starts_with(rel));
                // Its mode and time are no longer ours to set: what takes its place may
                // be a symlink, and `finish` would follow it out of the tree.
                self.dir_modes.retain(|(p, _, _)| !p.starts_with(full));
            }
            Ok(_) => fs::remove_file(full)
                .map_err(|e| Error::io(format_args!("replacing {}", rel.display()), e))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(format_args!("inspecting {}", rel.display()), e)),
        }
        Ok(())
    }

    pub(crate) fn write_entry(
        &mut self,
        entry: &CheckedEntry,
        content: &mut dyn Read,
    ) -> Result<()> {
        let rel = entry.path.to_relative_path();
        let full = self.root.join(rel);
        self.ensure_parent(rel)?;
        match &entry.kind {
            EntryKind::Dir => {
                if !self.known_dirs.contains(rel) {
                    match fs::symlink_metadata(&full) {
                        Ok(m) if m.is_dir() => {}
                        Ok(_) => {
                            self.clear(&full, rel)?;
                            fs::create_dir(&full).map_err(|e| {
                                Error::io(format_args!("creating {}", rel.display()), e)
                            })?;
                        }
                        Err(_) => fs::create_dir(&full).map_err(|e| {
                            Error::io(format_args!("creating {}", rel.display()), e)
                        })?,
                    }
                    self.known_dirs.insert(rel.to_path_buf());
                }
                self.dir_modes.push((full, entry.mode, entry.mtime));
            }
            EntryKind::File => {
                let mut file = match create_new(&full, entry.mode) {
                    Ok(f) => f,
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                        self.clear(&full, rel)?;
                        create_new(&full, entry.mode)
                            .map_err(|e| Error::io(format_args!("creating {}", rel.display()), e))?
                    }
                    Err(e) => return Err(Error::io(format_args!("creating {}", rel.display()), e)),
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
                self.clear(&full, rel)?;
                std::os::unix::fs::symlink(target, &full).map_err(|e| {
                    Error::io(format_args!("creating symlink {}", rel.display()), e)
                })?;
            }
            EntryKind::HardLink(target) => {
                self.clear(&full, rel)?;
                fs::hard_link(self.root.join(target.to_relative_path()), &full).map_err(|e| {
                    if e.kind() == std::io::ErrorKind::NotFound {
                        // A link to itself, or to an entry a later one replaced.
                        Error::invalid_input(format!(
                            "archive hard link {} points at {target}, which the archive no \
                             longer holds",
                            entry.path
                        ))
                    } else {
                        Error::io(format_args!("creating hard link {}", rel.display()), e)
                    }
                })?;
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
        for (path, mode, mtime_secs) in self.dir_modes.drain(..) {
            // Only a directory this unpack made and nothing replaced (`clear` drops the
            // replaced); checked again so a link is never followed.
            if !fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
                continue;
            }
            fs::set_permissions(&path, fs::Permissions::from_mode(mode))
                .map_err(|e| Error::io(format_args!("setting mode of {}", path.display()), e))?;
            if let Ok(dir) = File::open(&path) {
                let _ = dir.set_modified(mtime(mtime_secs));
            }
        }
        Ok(())
    }
}

/// The process umask, read without changing it (Linux reports it in /proc since 4.7).
fn current_umask() -> Option<u32> {
    let status = fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Umask:"))?;
    u32::from_str_radix(line.trim_start_matches("Umask:").trim(), 8).ok()
}

fn create_new(path: &Path, mode: u32) -> std::io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode | 0o600)
        .open(path)
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
