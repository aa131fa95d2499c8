//! Stores named by URL: what `SandboxConfig`'s `state_url` and `snapshots_url`, and the
//! CLI's `--state` and `--snapshots`, accept.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::store::{FsSnapshotStore, SnapshotStore, StateStore};

/// Opens the state store `url` names:
///
/// - `sqlite:PATH` or `sqlite://PATH` (feature `sqlite`): one SQLite file, created with
///   its directories if missing;
/// - `postgres://user:password@host/db` or `postgresql://...` (feature `postgres`):
///   shared by managers on several hosts.
///
/// # Errors
/// `InvalidInput` for an unknown scheme, `Unsupported` for one whose feature this build
/// lacks, and the store's own errors (an unreachable server is `Unavailable`).
///
/// ```
/// # async fn demo() -> sandcell::Result<()> {
/// let dir = tempfile::tempdir().unwrap();
/// let url = format!("sqlite:{}", dir.path().join("state.db").display());
/// let store = sandcell::store::open_state_store(&url).await?;
/// assert!(store.list(None).await?.is_empty());
/// # Ok(()) }
/// # #[cfg(feature = "sqlite")]
/// # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
/// ```
pub async fn open_state_store(url: &str) -> Result<Arc<dyn StateStore>> {
    let (scheme, rest) = url.split_once(':').unwrap_or((url, ""));
    match scheme {
        "postgres" | "postgresql" => postgres(url).await,
        "sqlite" => {
            let path = rest.strip_prefix("//").unwrap_or(rest);
            if path.is_empty() {
                return Err(Error::invalid_input(format!(
                    "state store URL {url:?} names no file (sqlite:PATH)"
                )));
            }
            sqlite(path).await
        }
        _ => Err(Error::invalid_input(format!(
            "state store URL {url:?}: unknown scheme; use sqlite:PATH or postgres://..."
        ))),
    }
}

/// Opens the snapshot store `url` names:
///
/// - `file:DIR` or `file://DIR`: a [`FsSnapshotStore`] in that directory;
/// - `s3://bucket/prefix`, `gs://bucket/prefix`, `az://container/prefix`, `memory:`
///   (features `s3`, `gcs`, `azure`, `object-store`): an
///   [`ObjectSnapshotStore`](crate::store::ObjectSnapshotStore) configured from the
///   environment, see its `from_url`.
///
/// # Errors
/// `InvalidInput` for an unknown scheme or a malformed URL, `Unsupported` for one whose
/// feature this build lacks.
///
/// ```
/// let dir = tempfile::tempdir().unwrap();
/// let url = format!("file:{}", dir.path().display());
/// let store = sandcell::store::open_snapshot_store(&url).unwrap();
/// ```
pub fn open_snapshot_store(url: &str) -> Result<Arc<dyn SnapshotStore>> {
    let (scheme, rest) = url.split_once(':').unwrap_or((url, ""));
    match scheme {
        "file" => {
            let dir = rest.strip_prefix("//").unwrap_or(rest);
            if dir.is_empty() {
                return Err(Error::invalid_input(format!(
                    "snapshot store URL {url:?} names no directory (file:DIR)"
                )));
            }
            Ok(Arc::new(FsSnapshotStore::new(dir)))
        }
        "s3" | "gs" | "az" | "azure" | "memory" => object(url),
        _ => Err(Error::invalid_input(format!(
            "snapshot store URL {url:?}: unknown scheme; use file:DIR, s3://bucket/prefix, \
             gs://bucket/prefix or az://container/prefix"
        ))),
    }
}

#[cfg(feature = "object-store")]
fn object(url: &str) -> Result<Arc<dyn SnapshotStore>> {
    Ok(Arc::new(crate::store::ObjectSnapshotStore::from_url(url)?))
}

#[cfg(not(feature = "object-store"))]
fn object(url: &str) -> Result<Arc<dyn SnapshotStore>> {
    Err(Error::unsupported(format!(
        "snapshot store URL {url:?} needs sandcell's `s3`, `gcs` or `azure` feature"
    )))
}

#[cfg(feature = "postgres")]
async fn postgres(url: &str) -> Result<Arc<dyn StateStore>> {
    Ok(Arc::new(
        crate::store::PostgresStateStore::connect(url).await?,
    ))
}

#[cfg(not(feature = "postgres"))]
async fn postgres(_: &str) -> Result<Arc<dyn StateStore>> {
    Err(Error::unsupported(
        "the state store URL names PostgreSQL, but sandcell was built without its `postgres` feature",
    ))
}

#[cfg(feature = "sqlite")]
async fn sqlite(path: &str) -> Result<Arc<dyn StateStore>> {
    Ok(Arc::new(crate::store::SqliteStateStore::open(path).await?))
}

#[cfg(not(feature = "sqlite"))]
async fn sqlite(path: &str) -> Result<Arc<dyn StateStore>> {
    Err(Error::unsupported(format!(
        "the state store URL names SQLite ({path}), but sandcell was built without its `sqlite` feature"
    )))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::ErrorKind;

    #[tokio::test]
    async fn bad_urls_are_typed_errors() {
        for url in ["mysql://x/y", "sqlite:", "nonsense"] {
            let err = open_state_store(url).await.err().unwrap();
            assert_eq!(err.kind(), ErrorKind::InvalidInput, "{url}: {err}");
        }
        for url in ["ftp://x/y", "file:", "s3:bucket", "s3:///prefix"] {
            let err = open_snapshot_store(url).err().unwrap();
            let kind = err.kind();
            assert!(
                matches!(kind, ErrorKind::InvalidInput | ErrorKind::Unsupported),
                "{url}: {err}"
            );
        }
        assert_eq!(
            open_snapshot_store("ftp://x").err().unwrap().kind(),
            ErrorKind::InvalidInput
        );
    }
}
