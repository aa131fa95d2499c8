//! Packing a host directory or a backend's tar stream into a normalized tar stream.
//!
//! Normalized means: only files, directories, symlinks and hard links; modes masked to
//! `0o777`; no owners; paths relative and checked. Symlinks are stored, never followed.

use std::ffi::{CStr, OsStr};
use std::fs;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use super::check::EntryChecker;
use super::ArchiveLimits;
use crate::error::{Error, Result};
use crate::raw::tree::list_names;

/// What a pack wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PackStats {
    /// Entries written.
    pub entries: u64,
    /// File content bytes written.
    pub content_bytes: u64,
    /// Sockets, FIFOs and devices left out.
    pub skipped: u64,
}

/// A normalized header: mode masked to `0o777`, owner 0, no names.
pub(crate) fn entry_header(kind: tar::EntryType, mode: u32, size: u64, mtime: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode & 0o777);
    h.set_size(size);
    h.set_mtime(mtime);
    h.set_uid(0);
    h.set_gid(0);
    h
}

/// Reads exactly `len` bytes: the inner reader's, cut off at `len`, then zeros if it ends
/// early. `tar::Builder::append_data` only pads to the next 512-byte block, so a file
/// that shrank since its header was written would otherwise shift every later entry.
pub(crate) struct ExactSize<R> {
    inner: std::io::Take<R>,
    left: u64,
}

impl<R: Read> ExactSize<R> {
    pub(crate) fn new(inner: R, len: u64) -> Self {
        ExactSize {
            inner: inner.take(len),
            left: len,
        }
    }
}

impl<R: Read> Read for ExactSize<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.left == 0 || buf.is_empty() {
            return Ok(0);
        }
        let n = match self.inner.read(buf)? {
            0 => {
                let n = buf
                    .len()
                    .min(usize::try_from(self.left).unwrap_or(usize::MAX));
                buf[..n].fill(0);
                n
            }
            n => n,
        };
        self.left -= n as u64;
        Ok(n)
    }
}

/// Writes the end-of-archive marker and flushes the writer.
fn finish<W: Write>(builder: tar::Builder<W>) -> Result<()> {
    builder
        .into_inner()
        .map_err(|e| Error::io("finishing the archive", e))?
        .flush()
        .map_err(|e| Error::io("flushing the archive", e))
}

/// Where a packed tree goes: a writer that can also take a file's content straight
/// from the file.
pub(crate) trait ContentSink: Write {
    /// Appends exactly `len` bytes of `file`: cut off at `len`, zero-padded if the file
    /// ends early (it shrank since its header was written). Returns the bytes that came
    /// from the file.
    fn copy_file(&mut self, file: &mut fs::File, len: u64) -> std::io::Result<u64>;
}

/// A plain writer as a [`ContentSink`]: content goes through a buffer of its own.
struct Buffered<W> {
    inner: W,
    buf: Vec<u8>,
}

impl<W: Write> Write for Buffered<W> {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.inner.write(data)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

impl<W: Write> ContentSink for Buffered<W> {
    fn copy_file(&mut self, file: &mut fs::File, len: u64) -> std::io::Result<u64> {
        if self.buf.is_empty() {
            self.buf = vec![0; 256 * 1024];
        }
        let mut exact = ExactSize::new(file, len);
        let mut from_file = 0;
        loop {
            let n = exact.read(&mut self.buf)?;
            if n == 0 {
                return Ok(from_file);
            }
            self.inner.write_all(&self.buf[..n])?;
            from_file += n as u64;
        }
    }
}

/// Writes the contents of `dir` (not `dir` itself) as a normalized tar stream to `out`.
///
/// Entries come in sorted order, so the same tree gives the same stream. Symlinks are
/// stored as links; special files are skipped and counted; names must be UTF-8.
pub fn pack_dir_tar<W: Write>(dir: &Path, out: W) -> Result<PackStats> {
    pack_dir_into(
        dir,
        Buffered {
            inner: out,
            buf: Vec::new(),
        },
    )
}

/// [`pack_dir_tar`] into a [`ContentSink`].
pub(crate) fn pack_dir_into<S: ContentSink>(dir: &Path, out: S) -> Result<PackStats> {
    pack_selected_into(dir, out, &|_| true)
}

/// [`pack_dir_tar`] of the entries `keep` accepts (by path relative to `dir`); a
/// directory it refuses is not entered. An overlay's change set, read from the merged
/// view, uses it with the paths its layers hold.
pub(crate) fn pack_selected_tar<W: Write>(
    dir: &Path,
    out: W,
    keep: &dyn Fn(&Path) -> bool,
) -> Result<PackStats> {
    let out = Buffered {
        inner: out,
        buf: Vec::new(),
    };
    pack_selected_into(dir, out, keep)
}

fn pack_selected_into<S: ContentSink>(
    dir: &Path,
    out: S,
    keep: &dyn Fn(&Path) -> bool,
) -> Result<PackStats> {
    // The root is a trusted host path (a `/proc/self/fd/N` of a held directory too),
    // followed once here; nothing beneath it is ever reached by a host path again.
    let root = rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| Error::io(format_args!("opening {}", dir.display()), e.into()))?;
    pack_beneath(root.as_fd(), out, keep)
}

/// The walk of [`pack_selected_into`] beneath an open directory. A sandbox may change
/// the tree while it is read, so every entry is reached through a descriptor: a
/// directory is opened from `root` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS` (a
/// directory swapped for a symlink fails the pack rather than leading out of the
/// tree), an entry is inspected and opened relative to its directory with
/// `O_NOFOLLOW`, and a file's header is written from the descriptor actually read.
/// At most three descriptors are open at a time, however deep or wide the tree.
fn pack_beneath<S: ContentSink>(
    root: BorrowedFd<'_>,
    out: S,
    keep: &dyn Fn(&Path) -> bool,
) -> Result<PackStats> {
    let mut builder = tar::Builder::new(out);
    builder.mode(tar::HeaderMode::Deterministic);
    let mut stats = PackStats::default();
    let mut stack: Vec<PathBuf> = vec![PathBuf::new()];
    while let Some(rel_dir) = stack.pop() {
        let listing = |e: Errno| Error::io(format_args!("listing {}", rel_dir.display()), e.into());
        let dir = open_beneath(root, &rel_dir).map_err(listing)?;
        let names = list_names(dir.as_fd()).map_err(listing)?;
        // Subdirectories are pushed in reverse so they pop in sorted order.
        let mut subdirs = Vec::new();
        for name in names {
            let rel = rel_dir.join(OsStr::from_bytes(name.to_bytes()));
            if !keep(&rel) {
                continue;
            }
            if rel.to_str().is_none() {
                return Err(Error::invalid_input(format!(
                    "cannot archive {}: the name is not UTF-8",
                    rel.display()
                )));
            }
            let inspecting =
                |e: Errno| Error::io(format_args!("inspecting {}", rel.display()), e.into());
            let archiving = |e| Error::io(format_args!("archiving {}", rel.display()), e);
            let st = match rustix::fs::statat(&dir, &name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => st,
                // Removed since the listing: the tree is read as it is, not as it was.
                Err(Errno::NOENT) => continue,
                Err(e) => return Err(inspecting(e)),
            };
            match FileType::from_raw_mode(st.st_mode) {
                FileType::Directory => {
                    let mut h = entry_header(tar::EntryType::Directory, st.st_mode, 0, mtime(&st));
                    builder
                        .append_data(&mut h, &rel, std::io::empty())
                        .map_err(archiving)?;
                    subdirs.push(rel);
                }
                FileType::RegularFile => {
                    let Some((mut file, st)) =
                        open_regular(dir.as_fd(), &name).map_err(inspecting)?
                    else {
                        // Swapped for something else since it was inspected.
                        stats.skipped += 1;
                        continue;
                    };
                    let len = st.st_size.max(0) as u64;
                    let mut h = entry_header(tar::EntryType::Regular, st.st_mode, len, mtime(&st));
                    // The builder writes the header (and a long name's records); the
                    // content goes straight from the file to the sink, then the padding,
                    // as `append_data` would have written them.
                    builder
                        .append_data(&mut h, &rel, std::io::empty())
                        .map_err(archiving)?;
                    let sink = builder.get_mut();
                    // A file that changes size while being read must not corrupt the
                    // stream: the entry carries exactly its declared size.
                    sink.copy_file(&mut file, len).map_err(archiving)?;
                    let padding = (512 - len % 512) % 512;
                    sink.write_all(&[0; 512][..padding as usize])
                        .map_err(archiving)?;
                    stats.content_bytes += len;
                }
                FileType::Symlink => {
                    let target = match rustix::fs::readlinkat(&dir, &name, Vec::new()) {
                        Ok(target) => target,
                        Err(Errno::NOENT | Errno::INVAL) => {
                            stats.skipped += 1;
                            continue;
                        }
                        Err(e) => return Err(inspecting(e)),
                    };
                    let target = Path::new(OsStr::from_bytes(target.to_bytes()));
                    let mut h = entry_header(tar::EntryType::Symlink, 0o777, 0, mtime(&st));
                    builder.append_link(&mut h, &rel, target).map_err(|e| {
                        Error::io(format_args!("archiving symlink {}", rel.display()), e)
                    })?;
                }
                _ => {
                    tracing::warn!(path = %rel.display(), "skipping special file (socket, FIFO or device) while archiving");
                    stats.skipped += 1;
                    continue;
                }
            }
            stats.entries += 1;
        }
        stack.extend(subdirs.into_iter().rev());
    }
    finish(builder)?;
    Ok(stats)
}

/// Opens directory `rel` beneath `root` for reading; no symlink is followed on the way
/// and `..` cannot climb out (the empty path is `root` itself).
pub(crate) fn open_beneath(root: BorrowedFd<'_>, rel: &Path) -> rustix::io::Result<OwnedFd> {
    let rel: &Path = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    let how = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let mut retries = 0;
    loop {
        // EAGAIN: a rename elsewhere on the file system raced the lookup; try again.
        match rustix::fs::openat2(root, rel, flags, Mode::empty(), how) {
            Err(Errno::AGAIN) if retries < 16 => retries += 1,
            other => return other,
        }
    }
}

/// Opens entry `name` of `dir` for reading if it is a regular file, with the status of
/// what was opened. It is first opened as `O_PATH` without following a symlink, so
/// opening has no effect on a FIFO or device swapped in meanwhile, and only reopened
/// for reading once the descriptor is known to be a regular file.
fn open_regular(
    dir: BorrowedFd<'_>,
    name: &CStr,
) -> rustix::io::Result<Option<(fs::File, rustix::fs::Stat)>> {
    let path = match rustix::fs::openat(
        dir,
        name,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(None),
        Err(e) => return Err(e),
    };
    let st = rustix::fs::fstat(&path)?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Ok(None);
    }
    // Reopening through the descriptor's magic link reaches the very inode inspected.
    // O_NONBLOCK: a write lease its owner (a sandbox process) never gives up would
    // otherwise hold the open for the kernel's lease-break time, 45 s a file by
    // default; it fails with EWOULDBLOCK at once instead.
    let file = rustix::fs::open(
        format!("/proc/self/fd/{}", path.as_raw_fd()).as_str(),
        OFlags::RDONLY | OFlags::NOCTTY | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    Ok(Some((fs::File::from(file), st)))
}

/// An entry's modification time as a tar header takes it (none before 1970).
fn mtime(st: &rustix::fs::Stat) -> u64 {
    // `Stat`'s field types differ between architectures.
    #[allow(clippy::unnecessary_cast)]
    let secs = st.st_mtime as i64;
    secs.max(0) as u64
}

/// Re-writes a backend's tar stream in normalized form, checking every entry against
/// `limits` (a backend's export is not trusted more than any other archive).
pub fn normalize_tar<R: Read, W: Write>(
    reader: R,
    out: W,
    limits: &ArchiveLimits,
) -> Result<PackStats> {
    let mut checker = EntryChecker::new(*limits);
    let mut archive = tar::Archive::new(super::CappedReader {
        inner: reader,
        left: limits.max_stream_bytes(),
    });
    let mut builder = tar::Builder::new(out);
    let mut stats = PackStats::default();
    let entries = archive
        .entries()
        .map_err(|e| super::parse_error("reading archive", e))?;
    for entry in entries {
        let entry = entry.map_err(|e| super::parse_error("reading archive entry", e))?;
        let h = entry.header();
        let kind = h.entry_type();
        if matches!(
            kind,
            tar::EntryType::Char | tar::EntryType::Block | tar::EntryType::Fifo
        ) {
            stats.skipped += 1;
            continue;
        }
        let mode = h
            .mode()
            .map_err(|e| super::parse_error("reading entry mode", e))?
            & 0o777;
        let mtime = h.mtime().unwrap_or(0);
        let size = entry.size();
        let path = entry.path_bytes().into_owned();
        let link = entry.link_name_bytes().map(|l| l.into_owned());
        let Some(checked) = checker.check(kind, &path, link.as_deref(), mode, size, mtime)? else {
            continue;
        };
        let rel = checked.path.as_str();
        match &checked.kind {
            super::EntryKind::File => {
                let mut out_h = entry_header(tar::EntryType::Regular, mode, size, mtime);
                builder
                    .append_data(&mut out_h, rel, entry)
                    .map_err(|e| Error::io(format_args!("archiving {rel}"), e))?;
                stats.content_bytes += size;
            }
            super::EntryKind::Dir => {
                let mut out_h = entry_header(tar::EntryType::Directory, mode, 0, mtime);
                builder
                    .append_data(&mut out_h, rel, std::io::empty())
                    .map_err(|e| Error::io(format_args!("archiving {rel}"), e))?;
            }
            super::EntryKind::Symlink(target) => {
                let mut out_h = entry_header(tar::EntryType::Symlink, 0o777, 0, mtime);
                builder
                    .append_link(&mut out_h, rel, target)
                    .map_err(|e| Error::io(format_args!("archiving {rel}"), e))?;
            }
            super::EntryKind::HardLink(target) => {
                let mut out_h = entry_header(tar::EntryType::Link, mode, 0, mtime);
                builder
                    .append_link(&mut out_h, rel, target.as_str())
                    .map_err(|e| Error::io(format_args!("archiving {rel}"), e))?;
            }
        }
        stats.entries += 1;
    }
    finish(builder)?;
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_size_cuts_and_pads() {
        let mut out = Vec::new();
        ExactSize::new(&b"abcdef"[..], 4)
            .read_to_end(&mut out)
            .unwrap();
        assert_eq!(out, b"abcd");
        out.clear();
        ExactSize::new(&b"ab"[..], 5).read_to_end(&mut out).unwrap();
        assert_eq!(out, b"ab\0\0\0");
    }
}
