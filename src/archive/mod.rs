//! Tar archives in and out of workspaces: the caps and entry checks every import obeys.
//!
//! Every backend's `import_tar`, directory download and snapshot restore read archives
//! through [`raw::archive::read_entries`](crate::raw::archive::read_entries), which
//! checks each entry before anything is written:
//!
//! | hostile entry | error kind |
//! |---|---|
//! | absolute path, `..` component, NUL, non-UTF-8 name | `InvalidInput` |
//! | device node, FIFO, socket or other special entry | `InvalidInput` |
//! | setuid, setgid or sticky bit | `PermissionDenied` |
//! | an entry reached through a symlink (archive's own or pre-existing) | `PermissionDenied` |
//! | a hard link to anything but a regular file earlier in the archive | `PermissionDenied` |
//! | more bytes, entries, depth or name length than [`ArchiveLimits`] allow | `LimitExceeded` |
//!
//! Symlinks themselves are stored as they are, whatever their target (a Python venv has
//! absolute ones): storing a link escapes nothing, following one would, and no importer
//! ever follows one. Host-side unpacking goes to a staging directory that is only swapped
//! in once the whole archive was read and verified
//! ([`raw::archive::unpack_to_dir`](crate::raw::archive::unpack_to_dir)).

pub(crate) mod check;
pub(crate) mod pack;
pub(crate) mod unpack;

pub(crate) use check::{parse_error, read_entries, CappedReader, CheckedEntry, EntryKind};
#[cfg(feature = "testing")]
pub(crate) use pack::entry_header;
pub use pack::PackStats;
pub(crate) use pack::{normalize_tar, pack_dir_tar};
pub(crate) use unpack::unpack_to_dir;
pub use unpack::UnpackStats;

use serde::{Deserialize, Serialize};

use crate::path::{MAX_NAME_LEN, MAX_PATH_LEN};

/// Caps applied while reading an archive. Exceeding any is
/// [`ErrorKind::LimitExceeded`](crate::ErrorKind::LimitExceeded).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct ArchiveLimits {
    /// Total bytes of file contents.
    pub max_bytes: u64,
    /// Number of entries (files, directories, links).
    pub max_entries: u64,
    /// Path depth in components.
    pub max_depth: usize,
    /// Length of one path component in bytes (at most 255).
    pub max_name_len: usize,
}

impl Default for ArchiveLimits {
    /// 16 GiB, one million entries, depth 256, names of 255 bytes.
    fn default() -> Self {
        ArchiveLimits {
            max_bytes: 16 << 30,
            max_entries: 1_000_000,
            max_depth: 256,
            max_name_len: MAX_NAME_LEN,
        }
    }
}

impl ArchiveLimits {
    /// Sets the cap on total content bytes.
    pub fn max_bytes(mut self, v: u64) -> Self {
        self.max_bytes = v;
        self
    }
    /// Sets the cap on entries.
    pub fn max_entries(mut self, v: u64) -> Self {
        self.max_entries = v;
        self
    }
    /// Sets the cap on depth.
    pub fn max_depth(mut self, v: usize) -> Self {
        self.max_depth = v;
        self
    }
    /// Sets the cap on component length.
    pub fn max_name_len(mut self, v: usize) -> Self {
        self.max_name_len = v;
        self
    }

    /// Each cap the smaller of these and `cap`'s: how a server bounds the limits a
    /// client asks for.
    pub fn at_most(&self, cap: &ArchiveLimits) -> ArchiveLimits {
        ArchiveLimits {
            max_bytes: self.max_bytes.min(cap.max_bytes),
            max_entries: self.max_entries.min(cap.max_entries),
            max_depth: self.max_depth.min(cap.max_depth),
            max_name_len: self.max_name_len.min(cap.max_name_len),
        }
    }

    /// The most raw tar bytes an archive within these caps can take: contents plus
    /// headers, long-name records and padding. Readers stop at this many bytes, so a
    /// decompression bomb (or garbage after the end marker) cannot run on forever.
    pub fn max_stream_bytes(&self) -> u64 {
        let per_entry = 512 * 2 + 2 * (MAX_PATH_LEN as u64 + 512) + 512;
        self.max_bytes
            .saturating_add(self.max_entries.saturating_mul(per_entry))
            .saturating_add(1 << 20)
    }
}

/// Whether an import merges into the destination or replaces it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ImportMode {
    /// Entries are added; existing files with the same path are replaced, others kept.
    #[default]
    Merge,
    /// The destination ends up holding exactly the archive's entries.
    Replace,
}

/// How `import_tar` treats its archive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ImportOptions {
    /// Merge or replace.
    pub mode: ImportMode,
    /// Caps on what the archive may hold.
    pub limits: ArchiveLimits,
}

impl ImportOptions {
    /// Merge with default limits.
    pub fn merge() -> Self {
        Self::default()
    }
    /// Replace with default limits.
    pub fn replace() -> Self {
        ImportOptions {
            mode: ImportMode::Replace,
            ..Self::default()
        }
    }
    /// Sets the limits.
    pub fn limits(mut self, limits: ArchiveLimits) -> Self {
        self.limits = limits;
        self
    }
}
