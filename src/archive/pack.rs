//! Packing a host directory or a backend's tar stream into a normalized tar stream.
//!
//! Normalized means: only files, directories, symlinks and hard links; modes masked to
//! `0o777`; no owners; paths relative and checked. Symlinks are stored, never followed.

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::check::EntryChecker;
use super::ArchiveLimits;
use crate::error::{Error, Result};

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
    let mut builder = tar::Builder::new(out);
    builder.mode(tar::HeaderMode::Deterministic);
    let mut stats = PackStats::default();
    let mut stack: Vec<PathBuf> = vec![PathBuf::new()];
    while let Some(rel_dir) = stack.pop() {
        let full_dir = dir.join(&rel_dir);
        let mut names: Vec<_> = fs::read_dir(&full_dir)
            .map_err(|e| Error::io(format_args!("listing {}", full_dir.display()), e))?
            .map(|r| r.map(|e| e.file_name()))
            .collect::<std::io::Result<_>>()
            .map_err(|e| Error::io(format_args!("listing {}", full_dir.display()), e))?;
        names.sort();
        // Subdirectories are pushed in reverse so they pop in sorted order.
        let mut subdirs = Vec::new();
        for name in names {
            let rel = rel_dir.join(&name);
            if !keep(&rel) {
                continue;
            }
            let full = dir.join(&rel);
            if rel.to_str().is_none() {
                return Err(Error::invalid_input(format!(
                    "cannot archive {}: the name is not UTF-8",
                    rel.display()
                )));
            }
            let meta = fs::symlink_metadata(&full)
                .map_err(|e| Error::io(format_args!("inspecting {}", rel.display()), e))?;
            let mtime = meta.mtime().max(0) as u64;
            let mode = meta.permissions().mode();
            let ft = meta.file_type();
            if ft.is_dir() {
                let mut h = entry_header(tar::EntryType::Directory, mode, 0, mtime);
                builder
                    .append_data(&mut h, &rel, std::io::empty())
                    .map_err(|e| Error::io(format_args!("archiving {}", rel.display()), e))?;
                subdirs.push(rel);
            } else if ft.is_file() {
                let mut file = fs::File::open(&full)
                    .map_err(|e| Error::io(format_args!("opening {}", rel.display()), e))?;
                let mut h = entry_header(tar::EntryType::Regular, mode, meta.len(), mtime);
                // The builder writes the header (and a long name's records); the content
                // goes straight from the file to the sink, then the padding, as
                // `append_data` would have written them.
                let archiving = |e| Error::io(format_args!("archiving {}", rel.display()), e);
                builder
                    .append_data(&mut h, &rel, std::io::empty())
                    .map_err(archiving)?;
                let sink = builder.get_mut();
                // A file that changes size while being read must not corrupt the stream:
                // the entry carries exactly its declared size, cut or zero-padded.
                sink.copy_file(&mut file, meta.len()).map_err(archiving)?;
                let padding = (512 - meta.len() % 512) % 512;
                sink.write_all(&[0; 512][..padding as usize])
                    .map_err(archiving)?;
                stats.content_bytes += meta.len();
            } else if ft.is_symlink() {
                let target = fs::read_link(&full)
                    .map_err(|e| Error::io(format_args!("reading symlink {}", rel.display()), e))?;
                let mut h = entry_header(tar::EntryType::Symlink, 0o777, 0, mtime);
                builder.append_link(&mut h, &rel, &target).map_err(|e| {
                    Error::io(format_args!("archiving symlink {}", rel.display()), e)
                })?;
            } else {
                tracing::warn!(path = %rel.display(), "skipping special file (socket, FIFO or device) while archiving");
                stats.skipped += 1;
                continue;
            }
            stats.entries += 1;
        }
        stack.extend(subdirs.into_iter().rev());
    }
    finish(builder)?;
    Ok(stats)
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
