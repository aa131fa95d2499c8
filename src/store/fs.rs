//! [`FsSnapshotStore`]: snapshots as files under a directory, written durably.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::backend::ByteStream;
use crate::error::{Error, ErrorKind, Result};
use crate::snapshot::SnapshotManifest;
use crate::store::session::SessionKey;
use crate::store::snapshots::{sort_manifests, SnapshotKey, SnapshotStore};

const BLOB_SUFFIX: &str = ".tar.zst";
const MANIFEST_SUFFIX: &str = ".json";
const TEMP_PREFIX: &str = ".tmp-";

/// A [`SnapshotStore`] on a local filesystem.
///
/// Layout: `{root}/{tenant}/{session}/{id}.tar.zst` and `{id}.json`. Every file is written
/// to a temporary name in the same directory, fsynced, renamed into place, and the
/// directory fsynced, so after a crash a file is either complete or absent. Temporary
/// files left by a crash start with `.tmp-` and are never listed.
#[derive(Debug, Clone)]
pub struct FsSnapshotStore {
    root: PathBuf,
}

impl FsSnapshotStore {
    /// A store rooted at `root` (created on first write).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        FsSnapshotStore { root: root.into() }
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn session_dir(&self, session: &SessionKey) -> PathBuf {
        self.root.join(session.tenant()).join(session.session())
    }

    fn blob_path(&self, key: &SnapshotKey) -> PathBuf {
        self.session_dir(key.session())
            .join(format!("{}{BLOB_SUFFIX}", key.id()))
    }

    fn manifest_path(&self, key: &SnapshotKey) -> PathBuf {
        self.session_dir(key.session())
            .join(format!("{}{MANIFEST_SUFFIX}", key.id()))
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::with_source(ErrorKind::Backend, "snapshot store task failed", e))?
}

fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Writes `dest` durably: temp file in the same directory, `fill`, fsync, rename, fsync dir.
/// On any error the temp file is removed and `dest` is untouched.
fn write_durably(dest: &Path, fill: impl FnOnce(&mut File) -> Result<u64>) -> Result<u64> {
    let dir = dest
        .parent()
        .ok_or_else(|| Error::invalid_input(format!("{} has no parent", dest.display())))?;
    crate::raw::private_dir::create_private_dir_all(dir)
        .map_err(|e| Error::io(format_args!("creating {}", dir.display()), e))?;
    let mut temp = tempfile::Builder::new()
        .prefix(TEMP_PREFIX)
        .tempfile_in(dir)
        .map_err(|e| {
            Error::io(
                format_args!("creating a temporary file in {}", dir.display()),
                e,
            )
        })?;
    let written = fill(temp.as_file_mut())?;
    temp.as_file_mut()
        .flush()
        .and_then(|()| temp.as_file().sync_all())
        .map_err(|e| Error::io(format_args!("syncing {}", dest.display()), e))?;
    temp.persist(dest)
        .map_err(|e| Error::io(format_args!("renaming into {}", dest.display()), e.error))?;
    fsync_dir(dir).map_err(|e| Error::io(format_args!("syncing {}", dir.display()), e))?;
    Ok(written)
}

/// The entries of `dir`, none if it does not exist.
fn entries(dir: &Path) -> Result<Vec<fs::DirEntry>> {
    match fs::read_dir(dir) {
        Ok(entries) => entries
            .collect::<io::Result<Vec<_>>>()
            .map_err(|e| Error::io(format_args!("listing {}", dir.display()), e)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(Error::io(format_args!("listing {}", dir.display()), e)),
    }
}

/// `sweep_orphans` over `{root}/{tenant}/{session}/`: blobs without a manifest, and the
/// temporary files of writes that never finished, last modified before `before`.
fn sweep_dir(root: &Path, before: std::time::SystemTime) -> Result<Vec<SnapshotKey>> {
    let mut swept = Vec::new();
    for tenant in entries(root)? {
        for session in entries(&tenant.path())? {
            let (t, s) = (tenant.file_name(), session.file_name());
            let (Some(t), Some(s)) = (t.to_str(), s.to_str()) else {
                continue;
            };
            let Ok(session_key) = SessionKey::new(t, s) else {
                continue;
            };
            let dir = session.path();
            for entry in entries(&dir)? {
                let path = entry.path();
                let modified = entry.metadata().and_then(|m| m.modified());
                if !modified.is_ok_and(|m| m < before) {
                    continue;
                }
                let name = entry.file_name();
                let Some(name) = name.to_str() else { continue };
                if name.starts_with(TEMP_PREFIX) {
                    remove_if_exists(&path)?;
                    continue;
                }
                let Some(id) = name.strip_suffix(BLOB_SUFFIX) else {
                    continue;
                };
                let Ok(key) = SnapshotKey::new(session_key.clone(), id) else {
                    continue;
                };
                if !dir.join(format!("{id}{MANIFEST_SUFFIX}")).exists() {
                    remove_if_exists(&path)?;
                    swept.push(key);
                }
            }
        }
    }
    Ok(swept)
}

fn remove_if_exists(path: &Path) -> Result<()> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(format_args!("removing {}", path.display()), e)),
    }
}

#[async_trait]
impl SnapshotStore for FsSnapshotStore {
    async fn put_blob(&self, key: &SnapshotKey, blob: ByteStream) -> Result<u64> {
        let dest = self.blob_path(key);
        let reader = crate::raw::stream::stream_to_reader(blob);
        blocking(move || {
            let mut reader = reader;
            write_durably(&dest, |file| {
                io::copy(&mut reader, file).map_err(|e| Error::io("writing snapshot blob", e))
            })
        })
        .await
    }

    async fn put_manifest(&self, key: &SnapshotKey, manifest: &SnapshotManifest) -> Result<()> {
        let blob = self.blob_path(key);
        let dest = self.manifest_path(key);
        let json = manifest.to_json()?;
        let key = key.clone();
        blocking(move || {
            if !blob.is_file() {
                return Err(Error::not_found(format!(
                    "snapshot {key} has no stored blob; store the blob before its manifest"
                )));
            }
            write_durably(&dest, |file| {
                file.write_all(json.as_bytes())
                    .map_err(|e| Error::io("writing snapshot manifest", e))?;
                Ok(json.len() as u64)
            })
            .map(|_| ())
        })
        .await
    }

    async fn manifest(&self, key: &SnapshotKey) -> Result<SnapshotManifest> {
        let path = self.manifest_path(key);
        let json = match tokio::fs::read_to_string(&path).await {
            Ok(json) => json,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(Error::not_found(format!("snapshot {key} does not exist")))
            }
            Err(e) => return Err(Error::io(format_args!("reading {}", path.display()), e)),
        };
        SnapshotManifest::from_json(&json).map_err(|e| e.context(format_args!("snapshot {key}")))
    }

    async fn blob(&self, key: &SnapshotKey) -> Result<ByteStream> {
        // The manifest is the commit point: a blob without one does not exist yet.
        self.manifest(key).await?;
        let path = self.blob_path(key);
        let file = File::open(&path).map_err(|e| {
            Error::io(format_args!("opening {}", path.display()), e)
                .context(format_args!("snapshot {key}"))
        })?;
        Ok(crate::raw::stream::reader_to_stream(file))
    }

    async fn list(&self, session: &SessionKey) -> Result<Vec<SnapshotManifest>> {
        let dir = self.session_dir(session);
        let session = session.clone();
        blocking(move || {
            let entries = match fs::read_dir(&dir) {
                Ok(entries) => entries,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
                Err(e) => return Err(Error::io(format_args!("listing {}", dir.display()), e)),
            };
            let mut out = Vec::new();
            for entry in entries {
                let entry =
                    entry.map_err(|e| Error::io(format_args!("listing {}", dir.display()), e))?;
                let name = entry.file_name();
                let Some(name) = name.to_str() else { continue };
                let Some(id) = name.strip_suffix(MANIFEST_SUFFIX) else {
                    continue;
                };
                if name.starts_with('.') {
                    continue;
                }
                let path = entry.path();
                let json = fs::read_to_string(&path)
                    .map_err(|e| Error::io(format_args!("reading {}", path.display()), e))?;
                match SnapshotManifest::from_json(&json) {
                    Ok(m) if m.id == id => out.push(m),
                    // A manifest we cannot read is reported, not silently treated as
                    // "no snapshot": the caller would otherwise restore an older one.
                    Ok(m) => {
                        return Err(Error::corrupt(format!(
                            "{} holds the manifest of snapshot {} (session {session})",
                            path.display(),
                            m.id
                        )))
                    }
                    Err(e) => return Err(e.context(format_args!("{}", path.display()))),
                }
            }
            sort_manifests(&mut out);
            Ok(out)
        })
        .await
    }

    async fn sweep_orphans(&self, before: DateTime<Utc>) -> Result<Vec<SnapshotKey>> {
        let root = self.root.clone();
        blocking(move || sweep_dir(&root, before.into())).await
    }

    async fn delete(&self, key: &SnapshotKey) -> Result<()> {
        let manifest = self.manifest_path(key);
        let blob = self.blob_path(key);
        blocking(move || {
            remove_if_exists(&manifest)?;
            remove_if_exists(&blob)?;
            if let Some(dir) = manifest.parent() {
                // Make the removal of the manifest durable before anyone relies on it.
                match fsync_dir(dir) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(Error::io(format_args!("syncing {}", dir.display()), e)),
                }
            }
            Ok(())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use futures::StreamExt;

    #[tokio::test]
    async fn the_sweep_removes_old_partial_writes_and_keeps_new_ones() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsSnapshotStore::new(dir.path());
        let session = dir.path().join("t").join("s");
        fs::create_dir_all(&session).unwrap();
        let old = session.join(format!("{TEMP_PREFIX}crashed"));
        let new = session.join(format!("{TEMP_PREFIX}writing"));
        for path in [&old, &new] {
            fs::write(path, b"partial").unwrap();
        }
        let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        File::options()
            .write(true)
            .open(&old)
            .unwrap()
            .set_modified(hour_ago)
            .unwrap();
        store
            .sweep_orphans(Utc::now() - chrono::Duration::minutes(10))
            .await
            .unwrap();
        assert!(!old.exists());
        assert!(new.exists());
    }

    #[tokio::test]
    async fn failed_blob_stream_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsSnapshotStore::new(dir.path());
        let key = SnapshotKey::new(SessionKey::new("t", "s").unwrap(), "snap").unwrap();
        let stream = futures::stream::iter([
            Ok(bytes::Bytes::from_static(b"partial")),
            Err(Error::corrupt("source failed")),
        ])
        .boxed();
        let err = store.put_blob(&key, stream).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
        let left: Vec<_> = fs::read_dir(store.session_dir(key.session()))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(left.is_empty(), "left behind: {left:?}");
    }
}
