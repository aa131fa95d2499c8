//! [`ObjectSnapshotStore`]: snapshots in any `object_store` (feature `object-store`).

use std::collections::HashSet;
use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectStore, PutPayload, WriteMultipart};

use crate::backend::ByteStream;
use crate::error::{Error, ErrorKind, Result};
use crate::snapshot::SnapshotManifest;
use crate::store::session::SessionKey;
use crate::store::snapshots::{sort_manifests, SnapshotKey, SnapshotStore};

/// A [`SnapshotStore`] over any [`ObjectStore`] (S3, GCS, Azure, memory, local files).
///
/// Objects: `{prefix}/{tenant}/{session}/{id}.tar.zst` (uploaded as a multipart upload,
/// aborted on error) and `{id}.json`. Object stores make each object appear whole or
/// not at all, so the manifest written last is the commit point.
///
/// ```
/// # async fn demo() -> sandcell::Result<()> {
/// use std::sync::Arc;
/// use sandcell::store::{ObjectSnapshotStore, SessionKey, SnapshotStore};
///
/// let store = ObjectSnapshotStore::new(Arc::new(object_store::memory::InMemory::new()), "snapshots");
/// assert!(store.list(&SessionKey::new("acme", "s1")?).await?.is_empty());
/// # Ok(()) }
/// # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
/// ```
#[derive(Debug, Clone)]
pub struct ObjectSnapshotStore {
    store: Arc<dyn ObjectStore>,
    prefix: Path,
}

fn store_error(context: impl std::fmt::Display, e: object_store::Error) -> Error {
    let kind = match &e {
        object_store::Error::NotFound { .. } => ErrorKind::NotFound,
        object_store::Error::AlreadyExists { .. } => ErrorKind::AlreadyExists,
        object_store::Error::PermissionDenied { .. }
        | object_store::Error::Unauthenticated { .. } => ErrorKind::PermissionDenied,
        _ => ErrorKind::Unavailable,
    };
    let temporary = kind == ErrorKind::Unavailable;
    Error::with_source(kind, format!("snapshot store: {context}"), e).set_temporary(temporary)
}

impl ObjectSnapshotStore {
    /// A store at `url`, configured from the environment as each service's own tools
    /// are:
    ///
    /// | URL | feature | configuration |
    /// |---|---|---|
    /// | `s3://bucket/prefix` | `s3` | `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, `AWS_ENDPOINT_URL` (an S3-protocol server; `AWS_ALLOW_HTTP=true` for plain HTTP) ... |
    /// | `gs://bucket/prefix` | `gcs` | `GOOGLE_SERVICE_ACCOUNT`, `GOOGLE_APPLICATION_CREDENTIALS` ... |
    /// | `az://container/prefix` | `azure` | `AZURE_STORAGE_ACCOUNT_NAME`, `AZURE_STORAGE_ACCOUNT_KEY` ... |
    /// | `memory:` | — | none: an empty store in this process |
    ///
    /// A request is retried at most three times, within 30 s, before its error is
    /// returned.
    ///
    /// # Errors
    /// `InvalidInput` for a malformed URL or configuration; `Unsupported` for a scheme
    /// whose feature this build lacks.
    ///
    /// ```
    /// # fn demo() -> sandcell::Result<()> {
    /// use sandcell::store::ObjectSnapshotStore;
    /// let store = ObjectSnapshotStore::from_url("memory:")?;
    /// # Ok(()) }
    /// # demo().unwrap();
    /// ```
    pub fn from_url(url: &str) -> Result<Self> {
        let (scheme, rest) = url.split_once(':').ok_or_else(|| {
            Error::invalid_input(format!("snapshot store URL {url:?} has no scheme"))
        })?;
        if scheme == "memory" {
            return Ok(Self::new(
                Arc::new(object_store::memory::InMemory::new()),
                "",
            ));
        }
        let rest = rest.strip_prefix("//").ok_or_else(|| {
            Error::invalid_input(format!(
                "snapshot store URL {url:?} should read {scheme}://bucket/prefix"
            ))
        })?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(Error::invalid_input(format!(
                "snapshot store URL {url:?} names no bucket"
            )));
        }
        let store = cloud_store(scheme, bucket, url)?;
        Ok(Self::new(store, prefix.trim_end_matches('/')))
    }

    /// A store keeping its objects under `prefix` (may be empty) of `store`.
    pub fn new(store: Arc<dyn ObjectStore>, prefix: &str) -> Self {
        ObjectSnapshotStore {
            store,
            prefix: Path::from(prefix),
        }
    }

    fn session_prefix(&self, session: &SessionKey) -> Path {
        self.prefix.child(session.tenant()).child(session.session())
    }

    fn blob_path(&self, key: &SnapshotKey) -> Path {
        self.session_prefix(key.session())
            .child(format!("{}.tar.zst", key.id()))
    }

    fn manifest_path(&self, key: &SnapshotKey) -> Path {
        self.session_prefix(key.session())
            .child(format!("{}.json", key.id()))
    }
}

#[cfg(any(feature = "s3", feature = "gcs", feature = "azure"))]
fn retry() -> object_store::RetryConfig {
    object_store::RetryConfig {
        max_retries: 3,
        retry_timeout: std::time::Duration::from_secs(30),
        ..Default::default()
    }
}

#[cfg(any(feature = "s3", feature = "gcs", feature = "azure"))]
fn built(url: &str, store: object_store::Result<impl ObjectStore>) -> Result<Arc<dyn ObjectStore>> {
    match store {
        Ok(store) => Ok(Arc::new(store)),
        Err(e) => Err(Error::with_source(
            ErrorKind::InvalidInput,
            format!("configuring the snapshot store at {url}"),
            e,
        )),
    }
}

/// The object store of a cloud `scheme` for `bucket`, or why this build has none.
fn cloud_store(scheme: &str, bucket: &str, url: &str) -> Result<Arc<dyn ObjectStore>> {
    match scheme {
        "s3" => s3(bucket, url),
        "gs" => gcs(bucket, url),
        "az" | "azure" => azure(bucket, url),
        other => Err(Error::invalid_input(format!(
            "snapshot store URL {url:?}: unknown scheme {other:?} (s3://, gs://, az://, memory:)"
        ))),
    }
}

#[cfg(not(all(feature = "s3", feature = "gcs", feature = "azure")))]
fn without(feature: &str, url: &str) -> Error {
    Error::unsupported(format!(
        "snapshot store URL {url:?} needs sandcell's `{feature}` feature"
    ))
}

#[cfg(feature = "s3")]
fn s3(bucket: &str, url: &str) -> Result<Arc<dyn ObjectStore>> {
    built(
        url,
        object_store::aws::AmazonS3Builder::from_env()
            .with_bucket_name(bucket)
            .with_retry(retry())
            .build(),
    )
}

#[cfg(not(feature = "s3"))]
fn s3(_: &str, url: &str) -> Result<Arc<dyn ObjectStore>> {
    Err(without("s3", url))
}

#[cfg(feature = "gcs")]
fn gcs(bucket: &str, url: &str) -> Result<Arc<dyn ObjectStore>> {
    built(
        url,
        object_store::gcp::GoogleCloudStorageBuilder::from_env()
            .with_bucket_name(bucket)
            .with_retry(retry())
            .build(),
    )
}

#[cfg(not(feature = "gcs"))]
fn gcs(_: &str, url: &str) -> Result<Arc<dyn ObjectStore>> {
    Err(without("gcs", url))
}

#[cfg(feature = "azure")]
fn azure(bucket: &str, url: &str) -> Result<Arc<dyn ObjectStore>> {
    built(
        url,
        object_store::azure::MicrosoftAzureBuilder::from_env()
            .with_container_name(bucket)
            .with_retry(retry())
            .build(),
    )
}

#[cfg(not(feature = "azure"))]
fn azure(_: &str, url: &str) -> Result<Arc<dyn ObjectStore>> {
    Err(without("azure", url))
}

#[async_trait]
impl SnapshotStore for ObjectSnapshotStore {
    async fn put_blob(&self, key: &SnapshotKey, mut blob: ByteStream) -> Result<u64> {
        let path = self.blob_path(key);
        let upload = self
            .store
            .put_multipart(&path)
            .await
            .map_err(|e| store_error(format_args!("starting upload of {key}"), e))?;
        let mut writer = WriteMultipart::new(upload);
        let mut written = 0u64;
        let result: Result<()> = async {
            while let Some(chunk) = blob.next().await {
                let chunk = chunk?;
                writer
                    .wait_for_capacity(4)
                    .await
                    .map_err(|e| store_error(format_args!("uploading {key}"), e))?;
                written += chunk.len() as u64;
                writer.put(chunk);
            }
            Ok(())
        }
        .await;
        match result {
            Ok(()) => {
                writer
                    .finish()
                    .await
                    .map_err(|e| store_error(format_args!("finishing upload of {key}"), e))?;
                Ok(written)
            }
            Err(e) => {
                if let Err(abort) = writer.abort().await {
                    tracing::warn!(snapshot = %key, error = %abort, "could not abort a failed snapshot upload");
                }
                Err(e)
            }
        }
    }

    async fn put_manifest(&self, key: &SnapshotKey, manifest: &SnapshotManifest) -> Result<()> {
        match self.store.head(&self.blob_path(key)).await {
            Ok(_) => {}
            Err(object_store::Error::NotFound { .. }) => {
                return Err(Error::not_found(format!(
                    "snapshot {key} has no stored blob; store the blob before its manifest"
                )))
            }
            Err(e) => return Err(store_error(format_args!("checking the blob of {key}"), e)),
        }
        let json = manifest.to_json()?;
        self.store
            .put(
                &self.manifest_path(key),
                PutPayload::from(json.into_bytes()),
            )
            .await
            .map_err(|e| store_error(format_args!("writing the manifest of {key}"), e))?;
        Ok(())
    }

    async fn manifest(&self, key: &SnapshotKey) -> Result<SnapshotManifest> {
        let bytes = self
            .store
            .get(&self.manifest_path(key))
            .await
            .map_err(|e| store_error(format_args!("reading snapshot {key}"), e))?
            .bytes()
            .await
            .map_err(|e| store_error(format_args!("reading snapshot {key}"), e))?;
        let json = std::str::from_utf8(&bytes).map_err(|e| {
            Error::with_source(
                ErrorKind::Corrupt,
                format!("manifest of {key} is not UTF-8"),
                e,
            )
        })?;
        SnapshotManifest::from_json(json).map_err(|e| e.context(format_args!("snapshot {key}")))
    }

    async fn blob(&self, key: &SnapshotKey) -> Result<ByteStream> {
        self.manifest(key).await?;
        let result = self
            .store
            .get(&self.blob_path(key))
            .await
            .map_err(|e| store_error(format_args!("reading the blob of {key}"), e))?;
        let key = key.clone();
        Ok(result
            .into_stream()
            .map_err(move |e| store_error(format_args!("reading the blob of {key}"), e))
            .boxed())
    }

    async fn list(&self, session: &SessionKey) -> Result<Vec<SnapshotManifest>> {
        let prefix = self.session_prefix(session);
        let objects: Vec<_> = self
            .store
            .list(Some(&prefix))
            .try_collect()
            .await
            .map_err(|e| store_error(format_args!("listing snapshots of {session}"), e))?;
        let mut out = Vec::new();
        for object in objects {
            let Some(id) = object
                .location
                .filename()
                .and_then(|n| n.strip_suffix(".json"))
            else {
                continue;
            };
            let key = SnapshotKey::new(session.clone(), id)?;
            match self.manifest(&key).await {
                Ok(m) => out.push(m),
                // Deleted between the listing and the read.
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        sort_manifests(&mut out);
        Ok(out)
    }

    async fn sweep_orphans(&self, before: DateTime<Utc>) -> Result<Vec<SnapshotKey>> {
        let objects: Vec<_> = self
            .store
            .list(Some(&self.prefix))
            .try_collect()
            .await
            .map_err(|e| store_error("listing snapshots to sweep", e))?;
        let mut manifests = HashSet::new();
        let mut blobs = Vec::new();
        for object in &objects {
            // `{prefix}/{tenant}/{session}/{file}`; anything else is not ours.
            let Some(parts) = object.location.prefix_match(&self.prefix) else {
                continue;
            };
            let parts: Vec<_> = parts.collect();
            let [tenant, session, file] = parts.as_slice() else {
                continue;
            };
            let Ok(session) = SessionKey::new(tenant.as_ref(), session.as_ref()) else {
                continue;
            };
            let file = file.as_ref();
            if let Some(id) = file.strip_suffix(".json") {
                manifests.insert((session, id.to_owned()));
            } else if let Some(id) = file.strip_suffix(".tar.zst") {
                if object.last_modified < before {
                    blobs.push((session, id.to_owned()));
                }
            }
        }
        let mut swept = Vec::new();
        for (session, id) in blobs {
            if manifests.contains(&(session.clone(), id.clone())) {
                continue;
            }
            let Ok(key) = SnapshotKey::new(session, id) else {
                continue;
            };
            match self.store.delete(&self.blob_path(&key)).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => swept.push(key),
                Err(e) => return Err(store_error(format_args!("sweeping {key}"), e)),
            }
        }
        Ok(swept)
    }

    async fn delete(&self, key: &SnapshotKey) -> Result<()> {
        for path in [self.manifest_path(key), self.blob_path(key)] {
            match self.store.delete(&path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(store_error(format_args!("deleting {key}"), e)),
            }
        }
        Ok(())
    }
}
