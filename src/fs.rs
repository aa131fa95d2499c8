//! File metadata returned by file operations: `FileInfo`, `DirEntry`, `FileKind`.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::path::SandboxPath;

/// Most entries one [`list_dir`](crate::SandboxBackend::list_dir) answers; a larger
/// directory is `LimitExceeded` (list it by `exec`, or export it as a tar stream). A
/// listing is held whole in memory, and a sandboxed program chooses how many files a
/// directory holds.
pub const MAX_DIR_ENTRIES: usize = 100_000;

/// Most bytes of names and paths one [`list_dir`](crate::SandboxBackend::list_dir)
/// answers (each entry counted as its path plus its name); past it the listing is
/// `LimitExceeded`. With long paths this binds before [`MAX_DIR_ENTRIES`] does.
pub const MAX_LISTING_BYTES: usize = 32 << 20;

/// The type of a file system entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum FileKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link (never followed by `stat` or `list_dir`).
    Symlink,
    /// Anything else (socket, FIFO, device): reported, never archived.
    Other,
}

/// Metadata of one path, as `lstat` sees it (symlinks are reported, not followed).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct FileInfo {
    /// The path asked about.
    pub path: SandboxPath,
    /// What it is.
    pub kind: FileKind,
    /// Size in bytes (0 for directories).
    pub size: u64,
    /// Permission bits, masked to `0o777`.
    pub mode: u32,
    /// Last modification time, where the backend knows it.
    pub modified: Option<DateTime<Utc>>,
    /// For symlinks, the link target as stored.
    pub symlink_target: Option<String>,
}

impl FileInfo {
    /// A new record; `mode` is masked to `0o777`.
    pub fn new(path: SandboxPath, kind: FileKind, size: u64, mode: u32) -> Self {
        FileInfo {
            path,
            kind,
            size,
            mode: mode & 0o777,
            modified: None,
            symlink_target: None,
        }
    }

    /// Sets the modification time.
    pub fn modified(mut self, modified: Option<DateTime<Utc>>) -> Self {
        self.modified = modified;
        self
    }

    /// Sets the symlink target.
    pub fn symlink_target(mut self, target: Option<String>) -> Self {
        self.symlink_target = target;
        self
    }
}

/// One entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DirEntry {
    /// The entry's name within its directory.
    pub name: String,
    /// Its full path from the workspace root.
    pub path: SandboxPath,
    /// What it is.
    pub kind: FileKind,
    /// Size in bytes (0 for directories).
    pub size: u64,
}

impl DirEntry {
    /// A new entry.
    pub fn new(path: SandboxPath, kind: FileKind, size: u64) -> Self {
        DirEntry {
            name: path.file_name().unwrap_or_default().to_owned(),
            path,
            kind,
            size,
        }
    }
}

/// Counts a listing against [`MAX_DIR_ENTRIES`] and [`MAX_LISTING_BYTES`] as it is
/// read, so a backend stops reading a huge directory instead of holding it first.
///
/// ```
/// use sandcell::raw::ListingLimit;
///
/// let mut limit = ListingLimit::new("listing /workspace/data");
/// limit.admit("data/a.txt", "a.txt").unwrap();
/// assert_eq!(limit.entries(), 1);
/// ```
#[derive(Debug, Clone)]
pub struct ListingLimit {
    what: String,
    entries: usize,
    bytes: usize,
}

impl ListingLimit {
    /// A fresh count; `what` names the listing in the error.
    pub fn new(what: impl Into<String>) -> Self {
        ListingLimit {
            what: what.into(),
            entries: 0,
            bytes: 0,
        }
    }

    /// Counts one more entry: `LimitExceeded` once the listing is over either limit.
    pub fn admit(&mut self, path: &str, name: &str) -> Result<()> {
        self.admit_sized(path.len(), name.len())
    }

    /// [`admit`](Self::admit) by the lengths alone, for a reader that has not built
    /// the entry's path yet (and need not, for a directory it will refuse).
    pub fn admit_sized(&mut self, path_bytes: usize, name_bytes: usize) -> Result<()> {
        self.entries += 1;
        self.bytes = self.bytes.saturating_add(path_bytes + name_bytes);
        if self.entries > MAX_DIR_ENTRIES {
            return Err(Error::limit_exceeded(format!(
                "{}: the directory holds more than {MAX_DIR_ENTRIES} entries; \
                 list it with a command or export it as a tar stream",
                self.what
            )));
        }
        if self.bytes > MAX_LISTING_BYTES {
            return Err(Error::limit_exceeded(format!(
                "{}: the listing's names and paths are over {MAX_LISTING_BYTES} bytes",
                self.what
            )));
        }
        Ok(())
    }

    /// Counts every entry of a listing already held (one a remote peer sent).
    pub fn admit_all(&mut self, entries: &[DirEntry]) -> Result<()> {
        entries
            .iter()
            .try_for_each(|e| self.admit(e.path.as_str(), &e.name))
    }

    /// Entries counted so far.
    pub fn entries(&self) -> usize {
        self.entries
    }
}
