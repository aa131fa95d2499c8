//! The snapshot format: a normalized tar stream compressed with zstd, plus a JSON manifest.
//!
//! A snapshot blob is portable — taken on one backend, restorable on any other — because
//! it is built from the same normalized tar every backend exports and imports through
//! the checks of [`crate::archive`]. The [`SnapshotManifest`] carries the blob's sha256.
//!
//! Verification gates every restore: the blob is hashed as it is decompressed, and the
//! unpacked tree (or the backend import) is only committed if the hash matched and the
//! stream ended cleanly. Decompression, hashing and writing run on separate threads, so
//! verification costs no second pass over the blob.
//!
//! ```
//! use sandcell::archive::ArchiveLimits;
//! use sandcell::snapshot::{self, PackOptions, SnapshotManifest};
//!
//! let src = tempfile::tempdir()?;
//! std::fs::write(src.path().join("notes.md"), "# hello")?;
//! let mut blob = Vec::new();
//! let packed = snapshot::pack_dir(src.path(), &mut blob, &PackOptions::default())?;
//! let manifest = SnapshotManifest::new(&packed, "local", "default");
//!
//! let dest = tempfile::tempdir()?;
//! let restored = dest.path().join("restored");
//! snapshot::unpack_to_dir(std::io::Cursor::new(blob), &manifest, &restored, &ArchiveLimits::default())?;
//! assert_eq!(std::fs::read_to_string(restored.join("notes.md"))?, "# hello");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod capture;
mod frames;

pub use capture::{
    capture, capture_changes, capture_stream, compress_stream, restore, Capture, CaptureScope,
};

use std::io::{self, BufRead, Read, Write};
use std::path::Path;
use std::sync::mpsc;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::archive::{self, ArchiveLimits, UnpackStats};
use crate::error::{Error, ErrorKind, Result};
use crate::path::SandboxPath;
use crate::sandbox::SandboxId;

/// The manifest format version this crate writes and reads.
pub const FORMAT_VERSION: u32 = 1;

/// How to compress a snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PackOptions {
    /// zstd level (1 is fast and is what the benches compare against `zstd -1`).
    pub level: i32,
    /// zstd worker threads; 0 compresses on the calling thread.
    pub workers: u32,
}

impl Default for PackOptions {
    /// Level 1, one worker per available core.
    fn default() -> Self {
        PackOptions {
            level: 1,
            workers: std::thread::available_parallelism()
                .map(|n| n.get() as u32)
                .unwrap_or(1),
        }
    }
}

/// What packing produced: sizes, entry count and the blob's hash.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PackedBlob {
    /// Bytes of the uncompressed tar stream.
    pub tar_bytes: u64,
    /// Bytes of the compressed blob.
    pub size_bytes: u64,
    /// Entries in the archive.
    pub entry_count: u64,
    /// File content bytes in the archive.
    pub content_bytes: u64,
    /// Lower-case hex sha256 of the compressed blob.
    pub sha256: String,
}

/// The JSON document stored beside each blob.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SnapshotManifest {
    /// Always [`FORMAT_VERSION`] for manifests this crate writes.
    pub format_version: u32,
    /// Snapshot id (a UUID).
    pub id: String,
    /// The sandbox it was taken from, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_id: Option<SandboxId>,
    /// The backend it was taken on.
    pub backend: String,
    /// The template the sandbox was created from.
    pub template: String,
    /// The snapshot this one is incremental to, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// When it was taken.
    pub created_at: DateTime<Utc>,
    /// Compressed blob size in bytes.
    pub size_bytes: u64,
    /// Uncompressed tar size in bytes.
    pub tar_bytes: u64,
    /// Entries in the archive.
    pub entry_count: u64,
    /// Lower-case hex sha256 of the compressed blob.
    pub sha256: String,
    /// Always `"zstd"` for this format version.
    pub compression: String,
    /// Whether the blob holds only what changed since the template (see [`capture_changes`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub incremental: bool,
    /// For incremental snapshots: template paths that were deleted, removed before the
    /// blob's entries are merged in on restore.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deleted: Vec<SandboxPath>,
}

impl SnapshotManifest {
    /// A manifest with a fresh id for a blob just packed.
    pub fn new(blob: &PackedBlob, backend: impl Into<String>, template: impl Into<String>) -> Self {
        SnapshotManifest {
            format_version: FORMAT_VERSION,
            id: uuid::Uuid::new_v4().to_string(),
            sandbox_id: None,
            backend: backend.into(),
            template: template.into(),
            parent: None,
            created_at: Utc::now(),
            size_bytes: blob.size_bytes,
            tar_bytes: blob.tar_bytes,
            entry_count: blob.entry_count,
            sha256: blob.sha256.clone(),
            compression: "zstd".to_owned(),
            incremental: false,
            deleted: Vec::new(),
        }
    }

    /// Records the sandbox it came from.
    pub fn sandbox(mut self, id: SandboxId) -> Self {
        self.sandbox_id = Some(id);
        self
    }

    /// Records the parent snapshot (incremental snapshots).
    pub fn parent(mut self, parent: impl Into<String>) -> Self {
        self.parent = Some(parent.into());
        self
    }

    /// The manifest as pretty JSON.
    pub fn to_json(&self) -> Result<String> {
        serde_json::to_string_pretty(self)
            .map_err(|e| Error::with_source(ErrorKind::Backend, "encoding snapshot manifest", e))
    }

    /// Parses and validates a manifest: known version and compression, a well-formed hash.
    pub fn from_json(json: &str) -> Result<Self> {
        let m: SnapshotManifest = serde_json::from_str(json).map_err(|e| {
            Error::with_source(
                ErrorKind::Corrupt,
                format!("snapshot manifest is not valid: {e}"),
                e,
            )
        })?;
        m.validate()?;
        Ok(m)
    }

    /// Checks the version, compression and hash fields.
    pub fn validate(&self) -> Result<()> {
        if self.format_version != FORMAT_VERSION {
            return Err(Error::unsupported(format!(
                "snapshot format version {} is not supported (this build reads version {FORMAT_VERSION})",
                self.format_version
            )));
        }
        if self.compression != "zstd" {
            return Err(Error::unsupported(format!(
                "snapshot compression {:?} is not supported",
                self.compression
            )));
        }
        self.expected_hash().map(|_| ())
    }

    fn expected_hash(&self) -> Result<[u8; 32]> {
        let mut out = [0u8; 32];
        hex::decode_to_slice(&self.sha256, &mut out).map_err(|_| {
            Error::corrupt(format!(
                "snapshot manifest {} has a malformed sha256 {:?}",
                self.id, self.sha256
            ))
        })?;
        Ok(out)
    }
}

/// Runs `fill` against a frame-parallel zstd writer over `out` (see [`frames`]),
/// returning sizes and hash.
fn compress<W, F>(out: W, opts: &PackOptions, fill: F) -> Result<PackedBlob>
where
    W: Write,
    F: FnOnce(&mut frames::FrameWriter<W>) -> Result<archive::PackStats>,
{
    let mut writer = frames::FrameWriter::new(out, opts.level, opts.workers)?;
    let stats = fill(&mut writer)?;
    let written = writer.finish()?;
    Ok(PackedBlob {
        tar_bytes: written.input_bytes,
        size_bytes: written.output_bytes,
        entry_count: stats.entries,
        content_bytes: stats.content_bytes,
        sha256: hex::encode(written.sha256),
    })
}

/// Packs the contents of `dir` into a compressed blob written to `out` (blocking).
pub fn pack_dir<W: Write>(dir: &Path, out: W, opts: &PackOptions) -> Result<PackedBlob> {
    compress(out, opts, |w| archive::pack::pack_dir_into(dir, w))
}

/// Packs a backend's tar stream into a compressed blob written to `out` (blocking),
/// normalizing and checking every entry on the way.
pub fn pack_tar<R: Read, W: Write>(
    tar: R,
    out: W,
    opts: &PackOptions,
    limits: &ArchiveLimits,
) -> Result<PackedBlob> {
    compress(out, opts, |w| archive::normalize_tar(tar, w, limits))
}

enum Chunk {
    Data(Vec<u8>),
    Done,
    Failed(Error),
}

impl std::fmt::Debug for Chunk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Chunk::Data(d) => write!(f, "Data({} bytes)", d.len()),
            Chunk::Done => f.write_str("Done"),
            Chunk::Failed(e) => write!(f, "Failed({e})"),
        }
    }
}

const CHUNK: usize = 1 << 20;
const IN_FLIGHT: usize = 8;

/// One stage's output: chunks from a producer thread, spent buffers sent back to it.
#[derive(Debug)]
struct ChunkReader {
    rx: mpsc::Receiver<Chunk>,
    /// Spent buffers go back to the producer, so it neither allocates nor page-faults
    /// a fresh megabyte per chunk.
    recycle: mpsc::SyncSender<Vec<u8>>,
    current: Vec<u8>,
    pos: usize,
    done: bool,
}

/// The producer side of a [`ChunkReader`].
struct ChunkWriter {
    tx: mpsc::SyncSender<Chunk>,
    spare: mpsc::Receiver<Vec<u8>>,
}

impl ChunkWriter {
    /// A buffer of [`CHUNK`] bytes, recycled when one is available.
    fn buffer(&self) -> Vec<u8> {
        let mut buf = self.spare.try_recv().unwrap_or_default();
        // Only the part never written before gets zeroed.
        buf.resize(CHUNK, 0);
        buf
    }

    /// Sends a chunk; `false` when the reader has gone away.
    fn send(&self, chunk: Chunk) -> bool {
        self.tx.send(chunk).is_ok()
    }
}

/// Starts `produce` on a new thread; its result ends the stream (`Done` or `Failed`).
fn spawn_stage<F>(name: &str, produce: F) -> Result<ChunkReader>
where
    F: FnOnce(&ChunkWriter) -> Result<()> + Send + 'static,
{
    let (tx, rx) = mpsc::sync_channel(IN_FLIGHT);
    let (recycle, spare) = mpsc::sync_channel(IN_FLIGHT + 2);
    let writer = ChunkWriter { tx, spare };
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            let last = match produce(&writer) {
                Ok(()) => Chunk::Done,
                Err(e) => Chunk::Failed(e),
            };
            writer.send(last);
        })
        .map_err(|e| Error::io("starting a snapshot pipeline thread", e))?;
    Ok(ChunkReader {
        rx,
        recycle,
        current: Vec::new(),
        pos: 0,
        done: false,
    })
}

impl ChunkReader {
    /// Makes sure `current[pos..]` is non-empty unless the stream ended.
    fn refill(&mut self) -> io::Result<()> {
        while self.pos >= self.current.len() && !self.done {
            match self.rx.recv() {
                Ok(Chunk::Data(d)) => {
                    let spent = std::mem::replace(&mut self.current, d);
                    if spent.capacity() > 0 {
                        let _ = self.recycle.try_send(spent);
                    }
                    self.pos = 0;
                }
                Ok(Chunk::Done) => self.done = true,
                Ok(Chunk::Failed(e)) => return Err(e.into_io()),
                // A stage always ends with Done or Failed; anything else is a panic and
                // must not look like a clean end.
                Err(_) => {
                    return Err(Error::corrupt(
                        "a snapshot pipeline thread stopped before the end of the blob",
                    )
                    .into_io())
                }
            }
        }
        Ok(())
    }
}

impl Read for ChunkReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let available = self.fill_buf()?;
        let n = buf.len().min(available.len());
        buf[..n].copy_from_slice(&available[..n]);
        self.consume(n);
        Ok(n)
    }
}

// The decoder reads straight out of the chunks, without a second buffer.
impl BufRead for ChunkReader {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        self.refill()?;
        Ok(&self.current[self.pos.min(self.current.len())..])
    }

    fn consume(&mut self, amount: usize) {
        self.pos = (self.pos + amount).min(self.current.len());
    }
}

/// Fills `buf` from `reader` as far as it goes; returns how much was read.
fn fill(reader: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// A reader over the tar stream inside a blob.
///
/// Three threads form a pipeline: one reads and hashes the blob, one decompresses it, and
/// the caller's thread consumes the tar stream. The reader yields an error instead of
/// end-of-file if the blob does not hash to the manifest's value, does not decompress, or
/// expands beyond the limits' stream size.
#[derive(Debug)]
pub struct VerifiedTarReader {
    inner: ChunkReader,
}

impl Read for VerifiedTarReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.read(buf)
    }
}

/// Starts reading, hashing and decompressing `blob`; see [`VerifiedTarReader`].
pub fn verified_tar_reader<R: Read + Send + 'static>(
    blob: R,
    manifest: &SnapshotManifest,
    limits: &ArchiveLimits,
) -> Result<VerifiedTarReader> {
    manifest.validate()?;
    let expected = manifest.expected_hash()?;
    let max = limits.max_stream_bytes();
    let compressed = spawn_stage("sandcell-sha256", move |out| {
        hash_stage(blob, expected, out)
    })?;
    let inner = spawn_stage("sandcell-unzstd", move |out| {
        decode_stage(compressed, max, out)
    })?;
    Ok(VerifiedTarReader { inner })
}

/// Reads the blob, hashes it, and passes it on; fails at the end if the hash differs.
fn hash_stage<R: Read>(mut blob: R, expected: [u8; 32], out: &ChunkWriter) -> Result<()> {
    let mut hasher = Sha256::new();
    loop {
        let mut buf = out.buffer();
        let n = fill(&mut blob, &mut buf).map_err(|e| Error::io("reading snapshot blob", e))?;
        if n == 0 {
            break;
        }
        buf.truncate(n);
        hasher.update(&buf);
        if !out.send(Chunk::Data(buf)) {
            // The consumer gave up (an entry was rejected); nothing left to do.
            return Ok(());
        }
    }
    let actual = hasher.finalize();
    if actual.as_slice() != expected {
        return Err(Error::corrupt(format!(
            "snapshot blob hash mismatch: expected {}, got {}",
            hex::encode(expected),
            hex::encode(actual)
        )));
    }
    Ok(())
}

/// Decompresses the hashed stream, bounded by `max` output bytes.
fn decode_stage(compressed: ChunkReader, max: u64, out: &ChunkWriter) -> Result<()> {
    let mut decoder = zstd::stream::read::Decoder::with_buffer(compressed)
        .map_err(|e| Error::io("starting zstd", e))?;
    let failed = |e: io::Error| {
        if e.get_ref().is_some_and(|inner| inner.is::<Error>()) {
            Error::io("reading snapshot blob", e)
        } else {
            Error::with_source(
                ErrorKind::Corrupt,
                format!("snapshot blob is corrupt: {e}"),
                e,
            )
        }
    };
    let mut total = 0u64;
    loop {
        let mut buf = out.buffer();
        let n = fill(&mut decoder, &mut buf).map_err(failed)?;
        if n == 0 {
            break;
        }
        total += n as u64;
        if total > max {
            return Err(Error::limit_exceeded(format!(
                "snapshot expands to more than {max} bytes (decompression bomb?)"
            )));
        }
        buf.truncate(n);
        if !out.send(Chunk::Data(buf)) {
            return Ok(());
        }
    }
    // Read what follows the last frame too, so trailing garbage fails the hash check
    // and the hash stage reports its verdict.
    let mut rest = decoder.finish();
    io::copy(&mut rest, &mut io::sink()).map_err(failed)?;
    Ok(())
}

/// Restores a blob into the host directory `dest` (blocking). `dest` is replaced only
/// if the blob verifies and every entry passes the checks; otherwise it is untouched.
pub fn unpack_to_dir<R: Read + Send + 'static>(
    blob: R,
    manifest: &SnapshotManifest,
    dest: &Path,
    limits: &ArchiveLimits,
) -> Result<UnpackStats> {
    let reader = verified_tar_reader(blob, manifest, limits)?;
    archive::unpack_to_dir(reader, dest, limits)
}
