//! Snapshot keys and the [`SnapshotStore`] contract.

use std::fmt;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::backend::ByteStream;
use crate::error::Result;
use crate::sandbox::validate_name;
use crate::snapshot::SnapshotManifest;
use crate::store::session::SessionKey;

/// Where a snapshot lives: `{tenant}/{session}/{snapshot_id}`. Serializes as
/// `{"tenant": .., "session": .., "id": ..}`.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub struct SnapshotKey {
    #[serde(flatten)]
    session: SessionKey,
    id: String,
}

impl SnapshotKey {
    /// The key of snapshot `id` of `session`; `id` follows the same rules as a session id.
    pub fn new(session: SessionKey, id: impl Into<String>) -> Result<Self> {
        let id = id.into();
        validate_name("snapshot id", &id)?;
        Ok(SnapshotKey { session, id })
    }

    /// The session the snapshot belongs to.
    pub fn session(&self) -> &SessionKey {
        &self.session
    }

    /// The snapshot id (the manifest's `id`).
    pub fn id(&self) -> &str {
        &self.id
    }
}

impl fmt::Debug for SnapshotKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for SnapshotKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.session, self.id)
    }
}

/// Durable storage for snapshot blobs and their manifests.
///
/// A snapshot is written in two steps, blob first and manifest last; only a snapshot
/// whose manifest is stored exists for `list` and `manifest`. A crash between the two
/// steps therefore leaves the previous snapshot as the latest.
///
/// # Behavior
/// - `put_blob` consumes the stream; if the stream yields an error or the write fails,
///   nothing is kept and the error is returned.
/// - `put_manifest` without a stored blob for the key is `NotFound`.
/// - `manifest`/`blob` of a key without a manifest are `NotFound`.
/// - `list` returns the stored manifests of one session, oldest first (by `created_at`,
///   then id); blobs without a manifest are not listed.
/// - `delete` removes the manifest, then the blob; deleting a missing key succeeds.
/// - `sweep_orphans(before)` deletes every blob without a manifest (what a crash
///   between the two steps leaves) last written before `before`, with any partial
///   write as old, and returns their keys; a snapshot with a manifest, and a blob
///   written since `before` (an upload whose manifest may still come), are kept.
#[async_trait]
pub trait SnapshotStore: Send + Sync + 'static {
    /// Stores the compressed blob of `key`, returning its size in bytes.
    async fn put_blob(&self, key: &SnapshotKey, blob: ByteStream) -> Result<u64>;

    /// Stores the manifest of `key`, making the snapshot visible.
    async fn put_manifest(&self, key: &SnapshotKey, manifest: &SnapshotManifest) -> Result<()>;

    /// The manifest of `key`.
    async fn manifest(&self, key: &SnapshotKey) -> Result<SnapshotManifest>;

    /// The blob of `key`, as stored (compressed).
    async fn blob(&self, key: &SnapshotKey) -> Result<ByteStream>;

    /// The snapshots of `session`, oldest first.
    async fn list(&self, session: &SessionKey) -> Result<Vec<SnapshotManifest>>;

    /// Deletes a snapshot.
    async fn delete(&self, key: &SnapshotKey) -> Result<()>;

    /// Deletes blobs no manifest references that were written before `before`.
    async fn sweep_orphans(&self, before: DateTime<Utc>) -> Result<Vec<SnapshotKey>>;
}

macro_rules! forward_snapshot_store {
    ($ty:ty) => {
        #[async_trait]
        impl<T: SnapshotStore + ?Sized> SnapshotStore for $ty {
            async fn put_blob(&self, key: &SnapshotKey, blob: ByteStream) -> Result<u64> {
                (**self).put_blob(key, blob).await
            }
            async fn put_manifest(
                &self,
                key: &SnapshotKey,
                manifest: &SnapshotManifest,
            ) -> Result<()> {
                (**self).put_manifest(key, manifest).await
            }
            async fn manifest(&self, key: &SnapshotKey) -> Result<SnapshotManifest> {
                (**self).manifest(key).await
            }
            async fn blob(&self, key: &SnapshotKey) -> Result<ByteStream> {
                (**self).blob(key).await
            }
            async fn list(&self, session: &SessionKey) -> Result<Vec<SnapshotManifest>> {
                (**self).list(session).await
            }
            async fn delete(&self, key: &SnapshotKey) -> Result<()> {
                (**self).delete(key).await
            }
            async fn sweep_orphans(&self, before: DateTime<Utc>) -> Result<Vec<SnapshotKey>> {
                (**self).sweep_orphans(before).await
            }
        }
    };
}

forward_snapshot_store!(Box<T>);
forward_snapshot_store!(std::sync::Arc<T>);

/// Sorts manifests oldest first, ties broken by id, so every store lists alike.
pub(crate) fn sort_manifests(manifests: &mut [SnapshotManifest]) {
    manifests.sort_by(|a, b| {
        a.created_at
            .cmp(&b.created_at)
            .then_with(|| a.id.cmp(&b.id))
    });
}
