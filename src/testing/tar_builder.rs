//! `RawTar`: writes tar archives byte by byte, including the hostile entries that
//! well-behaved tar libraries refuse to produce.

use bytes::Bytes;

/// A tar archive assembled from raw headers, for feeding importers hostile input.
///
/// ```
/// use sandcell::testing::RawTar;
///
/// let tar = RawTar::new()
///     .symlink("a", "/etc")
///     .file("a/passwd", b"owned")
///     .finish();
/// assert_eq!(tar.len() % 512, 0);
/// ```
#[derive(Debug, Clone, Default)]
pub struct RawTar {
    data: Vec<u8>,
}

impl RawTar {
    /// An empty archive.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends an entry with exactly these fields; `name` and `link` must fit in 100 bytes.
    pub fn entry(
        mut self,
        kind: tar::EntryType,
        name: &str,
        link: &str,
        mode: u32,
        data: &[u8],
    ) -> Self {
        let mut h = tar::Header::new_gnu();
        {
            let old = h.as_old_mut();
            let n = name.len().min(100);
            old.name[..n].copy_from_slice(&name.as_bytes()[..n]);
            let l = link.len().min(100);
            old.linkname[..l].copy_from_slice(&link.as_bytes()[..l]);
        }
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_size(data.len() as u64);
        h.set_mtime(1_700_000_000);
        h.set_uid(0);
        h.set_gid(0);
        h.set_cksum();
        self.data.extend_from_slice(h.as_bytes());
        self.data.extend_from_slice(data);
        let pad = (512 - data.len() % 512) % 512;
        self.data.extend(std::iter::repeat_n(0u8, pad));
        self
    }

    /// Appends a regular file with mode `0o644`.
    pub fn file(self, name: &str, data: &[u8]) -> Self {
        self.entry(tar::EntryType::Regular, name, "", 0o644, data)
    }

    /// Appends a directory with mode `0o755`.
    pub fn dir(self, name: &str) -> Self {
        self.entry(tar::EntryType::Directory, name, "", 0o755, b"")
    }

    /// Appends a symlink.
    pub fn symlink(self, name: &str, target: &str) -> Self {
        self.entry(tar::EntryType::Symlink, name, target, 0o777, b"")
    }

    /// Appends a hard link.
    pub fn hard_link(self, name: &str, target: &str) -> Self {
        self.entry(tar::EntryType::Link, name, target, 0o644, b"")
    }

    /// Appends a header claiming `size` content bytes, without the content (for caps
    /// that must trip on the header alone).
    pub fn file_header_only(mut self, name: &str, size: u64) -> Self {
        let mut h = tar::Header::new_gnu();
        {
            let old = h.as_old_mut();
            let n = name.len().min(100);
            old.name[..n].copy_from_slice(&name.as_bytes()[..n]);
        }
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(0o644);
        h.set_size(size);
        h.set_cksum();
        self.data.extend_from_slice(h.as_bytes());
        self
    }

    /// Ends the archive with two zero blocks and returns its bytes.
    pub fn finish(mut self) -> Bytes {
        self.data.extend_from_slice(&[0u8; 1024]);
        Bytes::from(self.data)
    }
}
