//! Snapshots of a live sandbox: one capture path (export, normalize, compress, stream
//! out) that the manager, the tests and the helpers writing to a `Write` all take, and
//! the restore through a backend's import.

use std::io::{Read, Write};

use crate::archive::{ArchiveLimits, ImportOptions};
use crate::backend::{ByteStream, SandboxBackend};
use crate::error::{Error, ErrorKind, Result};
use crate::path::SandboxPath;
use crate::sandbox::SandboxId;

use super::{pack_tar, verified_tar_reader, PackOptions, PackedBlob, SnapshotManifest};

/// What a capture takes from the sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CaptureScope<'a> {
    /// A directory of the workspace, in full.
    Dir(&'a SandboxPath),
    /// Only what changed in the workspace since its template (changed and added entries
    /// in the blob, deletions in the manifest). Needs
    /// [`Capabilities::incremental_snapshot`](crate::Capabilities::incremental_snapshot).
    Changes,
    /// The changes where the backend can tell them, else the whole workspace: what the
    /// session manager takes.
    ChangesOrWorkspace,
}

/// A snapshot being taken: the blob streams out while it is packed (on a blocking
/// thread), so a store can write it without holding it in memory.
///
/// [Take](Self::take_blob) the blob and read it to its end, then call
/// [`finish`](Self::finish) for the manifest. If packing fails, the stream's last item is
/// the error and `finish` fails.
#[must_use = "the blob must be consumed and the capture finished"]
pub struct Capture {
    blob: Option<ByteStream>,
    pending: PendingManifest,
}

/// What the manifest needs besides the packed blob's sizes and hash.
struct PendingManifest {
    packed: tokio::sync::oneshot::Receiver<PackedBlob>,
    backend: String,
    template: String,
    sandbox: SandboxId,
    incremental: bool,
    deleted: Vec<SandboxPath>,
}

impl PendingManifest {
    async fn finish(self) -> Result<SnapshotManifest> {
        let packed = self.packed.await.map_err(|_| {
            Error::new(
                ErrorKind::Backend,
                "snapshot packing ended without a result (the blob was not read to its end, or packing failed)",
            )
        })?;
        let mut manifest =
            SnapshotManifest::new(&packed, &self.backend, self.template).sandbox(self.sandbox);
        manifest.incremental = self.incremental;
        manifest.deleted = self.deleted;
        Ok(manifest)
    }
}

impl std::fmt::Debug for Capture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Capture")
            .field("backend", &self.pending.backend)
            .field("sandbox", &self.pending.sandbox)
            .field("incremental", &self.pending.incremental)
            .finish_non_exhaustive()
    }
}

impl Capture {
    /// The compressed, normalized blob; empty when taken a second time.
    pub fn take_blob(&mut self) -> ByteStream {
        self.blob
            .take()
            .unwrap_or_else(|| Box::pin(futures::stream::empty()))
    }

    /// Whether the blob holds only the changes since the template.
    pub fn is_incremental(&self) -> bool {
        self.pending.incremental
    }

    /// The manifest of the blob, once the [taken blob](Self::take_blob) has been read to
    /// its end.
    pub async fn finish(self) -> Result<SnapshotManifest> {
        self.pending.finish().await
    }
}

/// Starts a snapshot of sandbox `id`: exports `scope` from the backend and returns the
/// blob as a stream, normalized and compressed as it is read. Must be called inside a
/// tokio runtime.
pub async fn capture_stream<B>(
    backend: &B,
    id: &SandboxId,
    scope: CaptureScope<'_>,
    opts: &PackOptions,
) -> Result<Capture>
where
    B: SandboxBackend + ?Sized,
{
    let info = backend.inspect(id).await?;
    let changes = match scope {
        CaptureScope::Dir(_) => None,
        CaptureScope::Changes if !backend.capabilities().incremental_snapshot => {
            return Err(Error::unsupported(format!(
                "backend {} does not support incremental snapshots",
                backend.name()
            )))
        }
        CaptureScope::Changes => Some(backend.export_changes(id).await?),
        CaptureScope::ChangesOrWorkspace if backend.capabilities().incremental_snapshot => {
            match backend.export_changes(id).await {
                Ok(changes) => Some(changes),
                Err(e) if e.kind() == ErrorKind::Unsupported => None,
                Err(e) => return Err(e),
            }
        }
        CaptureScope::ChangesOrWorkspace => None,
    };
    let incremental = changes.is_some();
    let (tar, deleted) = match (changes, scope) {
        (Some(c), _) => (c.tar, c.deleted),
        (None, CaptureScope::Dir(path)) => (backend.export_tar(id, path).await?, Vec::new()),
        (None, _) => (
            backend.export_tar(id, &SandboxPath::root()).await?,
            Vec::new(),
        ),
    };
    let (blob, packed) = compress_stream(tar, opts);
    Ok(Capture {
        blob: Some(blob),
        pending: PendingManifest {
            packed,
            backend: backend.name().to_owned(),
            template: info.template,
            sandbox: id.clone(),
            incremental,
            deleted,
        },
    })
}

/// Snapshots `path` of a sandbox into `out`; returns the manifest and the writer. The
/// same capture as [`capture_stream`], written out on a blocking thread.
pub async fn capture<B, W>(
    backend: &B,
    id: &SandboxId,
    path: &SandboxPath,
    out: W,
    opts: &PackOptions,
) -> Result<(SnapshotManifest, W)>
where
    B: SandboxBackend + ?Sized,
    W: Write + Send + 'static,
{
    let capture = capture_stream(backend, id, CaptureScope::Dir(path), opts).await?;
    write_capture(capture, out).await
}

/// Snapshots only what changed in a sandbox's workspace since its template, into `out`.
/// Needs [`Capabilities::incremental_snapshot`](crate::Capabilities::incremental_snapshot).
/// [`restore`] applies it to a fresh sandbox of the same template on any backend.
pub async fn capture_changes<B, W>(
    backend: &B,
    id: &SandboxId,
    out: W,
    opts: &PackOptions,
) -> Result<(SnapshotManifest, W)>
where
    B: SandboxBackend + ?Sized,
    W: Write + Send + 'static,
{
    let capture = capture_stream(backend, id, CaptureScope::Changes, opts).await?;
    write_capture(capture, out).await
}

/// Copies a capture's blob into `out` on a blocking thread, then finishes it.
async fn write_capture<W>(capture: Capture, out: W) -> Result<(SnapshotManifest, W)>
where
    W: Write + Send + 'static,
{
    let mut capture = capture;
    let blob = capture.take_blob();
    let Capture { pending, .. } = capture;
    let mut reader = crate::raw::stream::stream_to_reader(blob);
    let out = tokio::task::spawn_blocking(move || {
        let mut out = out;
        std::io::copy(&mut reader, &mut out)
            .map_err(|e| Error::io("writing the snapshot blob", e))?;
        Ok::<_, Error>(out)
    })
    .await
    .map_err(|e| Error::with_source(ErrorKind::Backend, "snapshot task failed", e))??;
    Ok((pending.finish().await?, out))
}

/// Restores a blob into `path` of a sandbox through the backend's `import_tar`. The
/// backend's import is atomic, so a blob that fails verification or the checks leaves
/// the workspace unchanged.
pub async fn restore<B, R>(
    backend: &B,
    id: &SandboxId,
    path: &SandboxPath,
    blob: R,
    manifest: &SnapshotManifest,
    opts: ImportOptions,
) -> Result<()>
where
    B: SandboxBackend + ?Sized,
    R: Read + Send + 'static,
{
    let reader = verified_tar_reader(blob, manifest, &opts.limits)?;
    let mut opts = opts;
    if manifest.incremental {
        // The sandbox starts from the template; deletions go first (an opaque directory
        // is deleted, then its new contents arrive), then the changes merge in.
        for deleted in &manifest.deleted {
            let target = path.join(deleted.as_str())?;
            match backend.remove(id, &target, true).await {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(e.context(format_args!("applying deletion of {deleted}"))),
            }
        }
        opts.mode = crate::archive::ImportMode::Merge;
    }
    backend
        .import_tar(id, path, crate::raw::stream::reader_to_stream(reader), opts)
        .await
}

/// Normalizes and compresses an uncompressed tar stream as a stream of blob bytes.
///
/// The blob streams out while it is packed (on a blocking thread), so a store can write it
/// without holding it in memory. The receiver yields the [`PackedBlob`] (sizes and hash)
/// once the stream has been consumed to its end; if packing fails, the stream's last item
/// is the error and the receiver is closed. Must be called inside a tokio runtime.
pub fn compress_stream(
    tar: ByteStream,
    opts: &PackOptions,
) -> (ByteStream, tokio::sync::oneshot::Receiver<PackedBlob>) {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let opts = *opts;
    let reader = crate::raw::stream::stream_to_reader(tar);
    let blob = crate::raw::stream::writer_to_stream(move |out| {
        let mut reader = reader;
        let packed = pack_tar(&mut reader, out, &opts, &ArchiveLimits::default())?;
        let _ = tx.send(packed);
        Ok(())
    });
    (blob, rx)
}
