//! The parts of a `stat` result the contained operations use, and the tar header one makes.

use rustix::fs::{FileType, Stat};
use sandcell::{FileInfo, FileKind, SandboxPath};

/// The parts of a `stat` result this module uses.
#[derive(Debug, Clone, Copy)]
pub(super) struct Meta {
    pub(super) kind: FileKind,
    pub(super) mode: u32,
    /// Bytes for files and symlinks (the target's length), 0 otherwise.
    pub(super) size: u64,
    pub(super) mtime: i64,
    pub(super) mtime_nsec: u32,
    pub(super) dev: u64,
    pub(super) ino: u64,
}

impl Meta {
    // `Stat`'s field types differ between architectures, so some casts are no-ops here.
    #[allow(clippy::unnecessary_cast)]
    pub(super) fn of(st: &Stat) -> Meta {
        let kind = match FileType::from_raw_mode(st.st_mode) {
            FileType::RegularFile => FileKind::File,
            FileType::Directory => FileKind::Dir,
            FileType::Symlink => FileKind::Symlink,
            _ => FileKind::Other,
        };
        let size = match kind {
            FileKind::File | FileKind::Symlink => st.st_size.max(0) as u64,
            _ => 0,
        };
        Meta {
            kind,
            mode: st.st_mode & 0o777,
            size,
            mtime: st.st_mtime as i64,
            mtime_nsec: (st.st_mtime_nsec as u64).min(999_999_999) as u32,
            dev: st.st_dev as u64,
            ino: st.st_ino as u64,
        }
    }

    pub(super) fn info(&self, path: SandboxPath, symlink_target: Option<String>) -> FileInfo {
        FileInfo::new(path, self.kind, self.size, self.mode)
            .modified(chrono::DateTime::from_timestamp(
                self.mtime,
                self.mtime_nsec,
            ))
            .symlink_target(symlink_target)
    }

    /// A normalized tar header: mode masked to `0o777`, owner 0.
    pub(super) fn header(&self, kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(mode & 0o777);
        h.set_size(size);
        h.set_mtime(self.mtime.max(0) as u64);
        h.set_uid(0);
        h.set_gid(0);
        h
    }
}
