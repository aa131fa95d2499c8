//! File metadata returned by file operations: `FileInfo`, `DirEntry`, `FileKind`.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::path::SandboxPath;

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
