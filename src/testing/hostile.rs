//! The hostile archives every importer must refuse, in one list that the conformance
//! suite runs against backends and the host-directory tests run against the unpacker.

use bytes::Bytes;

use super::RawTar;
use crate::archive::{ArchiveLimits, ImportOptions};
use crate::ErrorKind;

/// One hostile archive and the error kind importing it must end in.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct HostileArchive {
    /// What makes it hostile.
    pub name: &'static str,
    /// The raw tar bytes.
    pub tar: Bytes,
    /// Mode and limits to import it with (the limits are what a cap case trips).
    pub options: ImportOptions,
    /// The kind of error the import must fail with.
    pub expected: ErrorKind,
}

/// Every hostile archive case; `outside` is an absolute host directory that symlinks and
/// absolute entries aim at, which must still be empty after each import.
pub fn hostile_archives(outside: &str) -> Vec<HostileArchive> {
    let m = ImportOptions::merge;
    let r = ImportOptions::replace;
    let cases: Vec<(&'static str, Bytes, ImportOptions, ErrorKind)> = vec![
        (
            "dot-dot entry",
            RawTar::new()
                .file("ok", b"1")
                .file("../escape", b"x")
                .finish(),
            m(),
            ErrorKind::InvalidInput,
        ),
        (
            "nested dot-dot entry",
            RawTar::new().file("a/../../escape", b"x").finish(),
            m(),
            ErrorKind::InvalidInput,
        ),
        (
            "absolute entry",
            RawTar::new().file(&format!("{outside}/abs"), b"x").finish(),
            m(),
            ErrorKind::InvalidInput,
        ),
        (
            "symlink then file through it",
            RawTar::new()
                .symlink("a", outside)
                .file("a/owned", b"x")
                .finish(),
            m(),
            ErrorKind::PermissionDenied,
        ),
        (
            "link to .. then nested dir",
            RawTar::new()
                .symlink("up", "..")
                .dir("up/x")
                .dir("up/x/y")
                .file("up/x/y/z", b"x")
                .finish(),
            m(),
            ErrorKind::PermissionDenied,
        ),
        (
            "link to .. then file (replace mode)",
            RawTar::new()
                .symlink("up", "../..")
                .file("up/owned", b"x")
                .finish(),
            r(),
            ErrorKind::PermissionDenied,
        ),
        (
            "hard link to absolute path",
            RawTar::new().hard_link("h", "/etc/passwd").finish(),
            m(),
            ErrorKind::InvalidInput,
        ),
        (
            "hard link to ..",
            RawTar::new().hard_link("h", "../existing.txt").finish(),
            m(),
            ErrorKind::InvalidInput,
        ),
        (
            "hard link to a file not in the archive",
            RawTar::new().hard_link("h", "existing.txt").finish(),
            m(),
            ErrorKind::PermissionDenied,
        ),
        (
            "hard link through a symlink",
            RawTar::new()
                .symlink("l", outside)
                .hard_link("h", "l/x")
                .finish(),
            m(),
            ErrorKind::PermissionDenied,
        ),
        (
            "char device",
            RawTar::new()
                .entry(tar::EntryType::Char, "dev", "", 0o644, b"")
                .finish(),
            m(),
            ErrorKind::InvalidInput,
        ),
        (
            "block device",
            RawTar::new()
                .entry(tar::EntryType::Block, "blk", "", 0o644, b"")
                .finish(),
            m(),
            ErrorKind::InvalidInput,
        ),
        (
            "fifo",
            RawTar::new()
                .entry(tar::EntryType::Fifo, "fifo", "", 0o644, b"")
                .finish(),
            m(),
            ErrorKind::InvalidInput,
        ),
        (
            "setuid file",
            RawTar::new()
                .entry(tar::EntryType::Regular, "suid", "", 0o4755, b"#!")
                .finish(),
            m(),
            ErrorKind::PermissionDenied,
        ),
        (
            "setgid dir",
            RawTar::new()
                .entry(tar::EntryType::Directory, "sgid", "", 0o2755, b"")
                .finish(),
            m(),
            ErrorKind::PermissionDenied,
        ),
        (
            "entry-count bomb",
            (0..101)
                .fold(RawTar::new(), |t, i| t.file(&format!("f{i}"), b""))
                .finish(),
            m().limits(ArchiveLimits::default().max_entries(100)),
            ErrorKind::LimitExceeded,
        ),
        (
            "declared size over the byte cap",
            RawTar::new().file_header_only("huge", 1 << 40).finish(),
            m().limits(ArchiveLimits::default().max_bytes(1 << 20)),
            ErrorKind::LimitExceeded,
        ),
        (
            "too deep",
            RawTar::new().file("a/b/c/d/e/f", b"x").finish(),
            m().limits(ArchiveLimits::default().max_depth(4)),
            ErrorKind::LimitExceeded,
        ),
        (
            "name too long",
            RawTar::new().file(&"n".repeat(40), b"x").finish(),
            m().limits(ArchiveLimits::default().max_name_len(32)),
            ErrorKind::LimitExceeded,
        ),
        (
            "truncated archive",
            {
                let full = RawTar::new().file("t", &[1u8; 4096]).finish();
                full.slice(..1024)
            },
            r(),
            ErrorKind::Corrupt,
        ),
    ];
    cases
        .into_iter()
        .map(|(name, tar, options, expected)| HostileArchive {
            name,
            tar,
            options,
            expected,
        })
        .collect()
}
