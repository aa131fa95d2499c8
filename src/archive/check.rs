//! The entry checks every archive import obeys, and the reader that applies them.

use std::collections::HashSet;
use std::io::Read;

use super::ArchiveLimits;
use crate::error::{Error, ErrorKind, Result};
use crate::path::SandboxPath;

/// What a checked entry creates.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum EntryKind {
    /// A regular file whose contents follow.
    File,
    /// A directory.
    Dir,
    /// A symlink with its target as stored (never followed).
    Symlink(String),
    /// A hard link to a regular file earlier in the same archive.
    HardLink(SandboxPath),
}

/// An archive entry that passed every check, relative to the import's destination.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CheckedEntry {
    /// Where it goes, relative to the destination.
    pub path: SandboxPath,
    /// What it is.
    pub kind: EntryKind,
    /// Permission bits (never above `0o777`).
    pub mode: u32,
    /// Content size in bytes (0 except for files).
    pub size: u64,
    /// Modification time, seconds since the epoch.
    pub mtime: u64,
}

/// Checks archive entries one by one, remembering what earlier entries created.
#[derive(Debug)]
pub struct EntryChecker {
    limits: ArchiveLimits,
    entries: u64,
    bytes: u64,
    symlinks: HashSet<SandboxPath>,
    files: HashSet<SandboxPath>,
}

impl EntryChecker {
    /// A checker with `limits` and nothing seen yet.
    pub fn new(limits: ArchiveLimits) -> Self {
        EntryChecker {
            limits,
            entries: 0,
            bytes: 0,
            symlinks: HashSet::new(),
            files: HashSet::new(),
        }
    }

    /// Records that `path` is a symlink already present at the destination, so entries
    /// beneath it are refused (merge imports into existing workspaces).
    pub fn assume_existing_symlink(&mut self, path: SandboxPath) {
        self.symlinks.insert(path);
    }

    /// Checks one entry given its raw header fields. `Ok(None)` means "nothing to do"
    /// (the archive's root directory).
    pub fn check(
        &mut self,
        entry_type: tar::EntryType,
        path: &[u8],
        link: Option<&[u8]>,
        mode: u32,
        size: u64,
        mtime: u64,
    ) -> Result<Option<CheckedEntry>> {
        // Archive-wide metadata (`git archive` writes one with the commit id) creates
        // nothing; local pax and GNU long-name records never reach here, the tar reader
        // folds them into the entry they describe.
        if entry_type == tar::EntryType::XGlobalHeader {
            return Ok(None);
        }
        let shown = String::from_utf8_lossy(path);
        let shown: &str = &shown;
        self.entries += 1;
        if self.entries > self.limits.max_entries {
            return Err(Error::limit_exceeded(format!(
                "archive has more than {} entries",
                self.limits.max_entries
            )));
        }
        let path = entry_path(path, shown)?;
        if path.depth() > self.limits.max_depth {
            return Err(Error::limit_exceeded(format!(
                "archive entry {shown:?} is {} levels deep, the limit is {}",
                path.depth(),
                self.limits.max_depth
            )));
        }
        if let Some(name) = path
            .components()
            .find(|c| c.len() > self.limits.max_name_len)
        {
            return Err(Error::limit_exceeded(format!(
                "archive entry {shown:?} has a {}-byte name, the limit is {}",
                name.len(),
                self.limits.max_name_len
            )));
        }
        if mode & 0o7000 != 0 {
            return Err(Error::permission_denied(format!(
                "archive entry {shown:?} has setuid, setgid or sticky bits (mode {mode:o})"
            )));
        }
        if let Some(link_path) = self.symlink_ancestor(&path) {
            return Err(Error::permission_denied(format!(
                "archive entry {shown:?} would be written through the symlink {link_path:?}"
            )));
        }
        let kind = match entry_type {
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                self.bytes = self.bytes.saturating_add(size);
                if self.bytes > self.limits.max_bytes {
                    return Err(Error::limit_exceeded(format!(
                        "archive holds more than {} bytes of file contents",
                        self.limits.max_bytes
                    )));
                }
                EntryKind::File
            }
            tar::EntryType::Directory => EntryKind::Dir,
            tar::EntryType::Symlink => {
                let target = link.unwrap_or_default();
                let target = std::str::from_utf8(target).map_err(|_| {
                    Error::invalid_input(format!(
                        "archive symlink {shown:?} has a target that is not UTF-8"
                    ))
                })?;
                if target.is_empty() || target.len() > 4095 {
                    return Err(Error::invalid_input(format!(
                        "archive symlink {shown:?} has an empty or over-long target"
                    )));
                }
                EntryKind::Symlink(target.to_owned())
            }
            tar::EntryType::Link => {
                let target = entry_path(link.unwrap_or_default(), shown)?;
                if !self.files.contains(&target) || self.symlink_ancestor(&target).is_some() {
                    return Err(Error::permission_denied(format!(
                        "archive hard link {shown:?} points to {target:?}, which is not a regular file earlier in the archive"
                    )));
                }
                EntryKind::HardLink(target)
            }
            tar::EntryType::Char | tar::EntryType::Block | tar::EntryType::Fifo => {
                return Err(Error::invalid_input(format!(
                    "archive entry {shown:?} is a device node or FIFO; only files, directories and links are allowed"
                )))
            }
            other => {
                return Err(Error::invalid_input(format!(
                    "archive entry {shown:?} has unsupported type {other:?}"
                )))
            }
        };
        if path.is_root() {
            return match kind {
                EntryKind::Dir => Ok(None),
                _ => Err(Error::invalid_input(
                    "archive entry at the root is not a directory",
                )),
            };
        }
        // A later entry at the same path replaces the earlier one.
        self.symlinks.remove(&path);
        self.files.remove(&path);
        match &kind {
            EntryKind::Symlink(_) => {
                self.symlinks.insert(path.clone());
            }
            EntryKind::File | EntryKind::HardLink(_) => {
                self.files.insert(path.clone());
            }
            EntryKind::Dir => {}
        }
        Ok(Some(CheckedEntry {
            path,
            kind,
            mode: mode & 0o777,
            size: if matches!(
                entry_type,
                tar::EntryType::Regular | tar::EntryType::Continuous
            ) {
                size
            } else {
                0
            },
            mtime,
        }))
    }

    fn symlink_ancestor(&self, path: &SandboxPath) -> Option<SandboxPath> {
        if self.symlinks.is_empty() {
            return None;
        }
        let mut ancestor = path.parent();
        while let Some(p) = ancestor {
            if p.is_root() {
                break;
            }
            if self.symlinks.contains(&p) {
                return Some(p);
            }
            ancestor = p.parent();
        }
        None
    }
}

/// An error from parsing a tar stream: ours keep their kind (a stream error, a cap),
/// anything the tar parser raised means the archive is malformed.
pub(crate) fn parse_error(context: &str, err: std::io::Error) -> Error {
    if err.get_ref().is_some_and(|inner| inner.is::<Error>()) {
        return Error::io(context, err);
    }
    Error::with_source(
        ErrorKind::Corrupt,
        format!("{context}: malformed archive: {err}"),
        err,
    )
}

fn entry_path(raw: &[u8], shown: &str) -> Result<SandboxPath> {
    let text = std::str::from_utf8(raw).map_err(|_| {
        Error::invalid_input(format!(
            "archive entry {shown:?} has a name that is not UTF-8"
        ))
    })?;
    SandboxPath::new(text).map_err(|e| e.context("archive entry rejected"))
}

/// Reads an uncompressed tar stream, checks every entry and hands it to `sink` with a
/// reader over its contents. Stops with the first error; after the end-of-archive
/// marker it drains the rest of the stream, so an error the stream raises at its very
/// end (a hash mismatch) still fails the import. Returns the number of entries.
pub fn read_entries<R, F>(reader: R, limits: &ArchiveLimits, mut sink: F) -> Result<u64>
where
    R: Read,
    F: FnMut(&CheckedEntry, &mut dyn Read) -> Result<()>,
{
    read_entries_with(EntryChecker::new(*limits), reader, limits, &mut sink)
}

/// Like [`read_entries`] with a prepared [`EntryChecker`] (one that knows the
/// destination's existing symlinks).
pub fn read_entries_with<R, F>(
    mut checker: EntryChecker,
    reader: R,
    limits: &ArchiveLimits,
    sink: &mut F,
) -> Result<u64>
where
    R: Read,
    F: FnMut(&CheckedEntry, &mut dyn Read) -> Result<()>,
{
    let capped = CappedReader {
        inner: reader,
        left: limits.max_stream_bytes(),
    };
    let mut archive = tar::Archive::new(capped);
    let mut count = 0;
    let entries = archive
        .entries()
        .map_err(|e| parse_error("reading archive", e))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| parse_error("reading archive entry", e))?;
        let header = entry.header();
        let entry_type = header.entry_type();
        let mode = header
            .mode()
            .map_err(|e| parse_error("reading archive entry mode", e))?;
        let mtime = header.mtime().unwrap_or(0);
        let size = entry.size();
        let path = entry.path_bytes().into_owned();
        let link = entry.link_name_bytes().map(|l| l.into_owned());
        let Some(checked) = checker.check(entry_type, &path, link.as_deref(), mode, size, mtime)?
        else {
            continue;
        };
        count += 1;
        sink(&checked, &mut entry)?;
    }
    let mut rest = archive.into_inner();
    std::io::copy(&mut rest, &mut std::io::sink())
        .map_err(|e| parse_error("reading the end of the archive", e))?;
    Ok(count)
}

/// A reader that fails with `LimitExceeded` once more than `left` bytes were read.
#[derive(Debug)]
pub(crate) struct CappedReader<R> {
    pub(crate) inner: R,
    pub(crate) left: u64,
}

impl<R: Read> Read for CappedReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n as u64 > self.left {
            return Err(Error::new(
                ErrorKind::LimitExceeded,
                "archive stream is larger than its limits allow (decompression bomb?)",
            )
            .into_io());
        }
        self.left -= n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(
        c: &mut EntryChecker,
        t: tar::EntryType,
        p: &str,
        link: Option<&str>,
    ) -> Result<Option<CheckedEntry>> {
        c.check(t, p.as_bytes(), link.map(str::as_bytes), 0o644, 1, 0)
    }

    #[test]
    fn rejects_traversal_through_archive_symlinks() {
        let mut c = EntryChecker::new(ArchiveLimits::default());
        check(&mut c, tar::EntryType::Symlink, "a", Some("/etc")).unwrap();
        let err = check(&mut c, tar::EntryType::Regular, "a/passwd", None).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::PermissionDenied);
        // Replacing the link with a directory makes the path usable again.
        check(&mut c, tar::EntryType::Directory, "a", None).unwrap();
        check(&mut c, tar::EntryType::Regular, "a/passwd", None).unwrap();
    }

    #[test]
    fn global_pax_headers_are_skipped() {
        let mut c = EntryChecker::new(ArchiveLimits::default());
        let skipped = check(
            &mut c,
            tar::EntryType::XGlobalHeader,
            "pax_global_header",
            None,
        )
        .unwrap();
        assert_eq!(skipped, None);
        assert!(check(&mut c, tar::EntryType::Regular, "a.txt", None)
            .unwrap()
            .is_some());
    }

    #[test]
    fn hard_links_must_point_at_earlier_files() {
        let mut c = EntryChecker::new(ArchiveLimits::default());
        check(&mut c, tar::EntryType::Regular, "f", None).unwrap();
        check(&mut c, tar::EntryType::Link, "g", Some("f")).unwrap();
        for target in ["/etc/passwd", "../x", "missing"] {
            assert!(
                check(&mut c, tar::EntryType::Link, "h", Some(target)).is_err(),
                "{target}"
            );
        }
    }

    #[test]
    fn caps_are_enforced() {
        let limits = ArchiveLimits::default()
            .max_entries(2)
            .max_depth(2)
            .max_name_len(4);
        let mut c = EntryChecker::new(limits);
        assert_eq!(
            check(&mut c, tar::EntryType::Regular, "a/b/c", None)
                .unwrap_err()
                .kind(),
            ErrorKind::LimitExceeded
        );
        assert_eq!(
            check(&mut c, tar::EntryType::Regular, "abcde", None)
                .unwrap_err()
                .kind(),
            ErrorKind::LimitExceeded
        );
        assert_eq!(
            check(&mut c, tar::EntryType::Regular, "ok", None)
                .unwrap_err()
                .kind(),
            ErrorKind::LimitExceeded
        );
    }
}
