//! [`ObjectSnapshotStore`] over S3 against a real S3-protocol server: the snapshot
//! store conformance cases, a multipart upload larger than a part, an upload cut off
//! midway, and a manager suspending and restoring through it.
//!
//! The server is the one the usual variables name (`AWS_ENDPOINT_URL`,
//! `AWS_ALLOW_HTTP=true`, credentials and region); `.ci/run` starts moto's server and
//! sets them. Without `AWS_ENDPOINT_URL` the tests skip, and fail instead under
//! `SANDCELL_REQUIRE_S3=1`. Each test makes a bucket of its own.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use sandcell::snapshot::SnapshotManifest;
use sandcell::store::{ObjectSnapshotStore, SessionKey, SnapshotKey, SnapshotStore};
use sandcell::testing::{stores, MockBackend};
use sandcell::{Error, ErrorKind, ReleaseMode, SandboxBackend, SandboxManager, SandboxSpec};
use sha2::Digest;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn endpoint() -> Option<String> {
    sandcell::testing::require_env("S3", "AWS_ENDPOINT_URL", "an S3-protocol server")
}

/// One plain HTTP/1.1 request to the server (moto takes unsigned bucket requests):
/// the status and the whole response.
async fn http(endpoint: &str, method: &str, path: &str) -> (u16, String) {
    let authority = endpoint
        .strip_prefix("http://")
        .expect("an http:// endpoint")
        .trim_end_matches('/');
    let mut stream = tokio::net::TcpStream::connect(authority).await.unwrap();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {authority}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.unwrap();
    let response = String::from_utf8_lossy(&response).into_owned();
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_default();
    (status, response)
}

/// A fresh bucket, and the store at `s3://{bucket}/snapshots`.
async fn bucket(endpoint: &str) -> (String, ObjectSnapshotStore) {
    let bucket = format!("sandcell-{}", uuid::Uuid::new_v4().simple());
    let (status, response) = http(endpoint, "PUT", &format!("/{bucket}")).await;
    assert_eq!(status, 200, "creating bucket {bucket}: {response}");
    let store = ObjectSnapshotStore::from_url(&format!("s3://{bucket}/snapshots")).unwrap();
    (bucket, store)
}

/// `len` bytes that do not compress, in chunks of 256 KiB, failing at `fail_at` if set.
fn blob(len: usize, fail_at: Option<usize>) -> (Vec<u8>, sandcell::ByteStream) {
    let mut data = Vec::with_capacity(len);
    let mut block = sha2::Sha256::digest(b"sandcell").to_vec();
    while data.len() < len {
        block = sha2::Sha256::digest(&block).to_vec();
        data.extend_from_slice(&block);
    }
    data.truncate(len);
    let mut chunks: Vec<Result<Bytes, Error>> = data
        .chunks(256 * 1024)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    if let Some(at) = fail_at {
        chunks.truncate(at / (256 * 1024));
        chunks.push(Err(Error::new(
            ErrorKind::Unavailable,
            "injected: the snapshot source died",
        )));
    }
    (data, futures::stream::iter(chunks).boxed())
}

fn manifest(key: &SnapshotKey, data: &[u8]) -> SnapshotManifest {
    stores::manifest_for(key, data, 0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_snapshot_store_conformance() {
    let Some(endpoint) = endpoint() else { return };
    let (_, store) = bucket(&endpoint).await;
    stores::snapshot_store_all(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_larger_than_a_part_goes_up_in_parts_and_comes_back_whole() {
    let Some(endpoint) = endpoint() else { return };
    let (bucket, store) = bucket(&endpoint).await;
    let key = SnapshotKey::new(SessionKey::new("acme", "big").unwrap(), "snap-1").unwrap();
    // 12 MiB against parts of 5 MiB: three parts.
    let (data, stream) = blob(12 << 20, None);
    assert_eq!(
        store.put_blob(&key, stream).await.unwrap(),
        data.len() as u64
    );
    store
        .put_manifest(&key, &manifest(&key, &data))
        .await
        .unwrap();

    // S3 gives a multipart object the ETag `"{md5 of the part md5s}-{parts}"`.
    let (status, head) = http(
        &endpoint,
        "HEAD",
        &format!("/{bucket}/snapshots/acme/big/snap-1.tar.zst"),
    )
    .await;
    assert_eq!(status, 200, "{head}");
    let etag = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("etag:")
                .map(str::to_owned)
        })
        .expect("an ETag header");
    assert!(etag.trim().trim_matches('"').ends_with("-3"), "{etag}");

    let back: Vec<Bytes> = store.blob(&key).await.unwrap().try_collect().await.unwrap();
    let back = back.concat();
    assert_eq!(back.len(), data.len());
    assert!(back == data, "the blob came back changed");
}

/// No half-written snapshot: a cut upload leaves no object, no open multipart upload
/// and no visible snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_cut_off_midway_leaves_nothing() {
    let Some(endpoint) = endpoint() else { return };
    let (bucket, store) = bucket(&endpoint).await;
    let session = SessionKey::new("acme", "cut").unwrap();
    let key = SnapshotKey::new(session.clone(), "snap-1").unwrap();
    // Two parts' worth goes up, then the source fails.
    let (_, stream) = blob(12 << 20, Some(11 << 20));
    let err = store.put_blob(&key, stream).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err:#}");

    // No snapshot, no object, and no multipart upload left open with its parts.
    assert!(store.list(&session).await.unwrap().is_empty());
    let (status, _) = http(
        &endpoint,
        "HEAD",
        &format!("/{bucket}/snapshots/acme/cut/snap-1.tar.zst"),
    )
    .await;
    assert_eq!(status, 404);
    let (status, uploads) = http(&endpoint, "GET", &format!("/{bucket}?uploads")).await;
    assert_eq!(status, 200, "{uploads}");
    assert!(
        !uploads.contains("<UploadId>"),
        "an upload was left open: {uploads}"
    );
    let err = store
        .put_manifest(&key, &manifest(&key, b""))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manager_suspends_to_s3_and_restores_from_it() {
    let Some(endpoint) = endpoint() else { return };
    let (_, store) = bucket(&endpoint).await;
    let dir = tempfile::tempdir().unwrap();
    let backend = MockBackend::new();
    let manager = SandboxManager::builder(backend.clone())
        .data_dir(dir.path())
        .snapshot_store(store.clone())
        .build()
        .await
        .unwrap();
    let key = SessionKey::new("acme", "chat").unwrap();
    let notes: sandcell::SandboxPath = "notes.md".parse().unwrap();
    let sandbox = manager
        .acquire(&key, &SandboxSpec::new("default"))
        .await
        .unwrap();
    let path = notes.clone();
    sandbox
        .call("write", |b, id| async move {
            b.write(id, &path, "in s3".into()).await
        })
        .await
        .unwrap();
    manager.release(&key, ReleaseMode::Suspend).await.unwrap();
    assert_eq!(backend.live_count(), 0);
    assert_eq!(store.list(&key).await.unwrap().len(), 1);

    let back = manager
        .acquire(&key, &SandboxSpec::new("default"))
        .await
        .unwrap();
    let content = back
        .call("read", |b, id| async move { b.read(id, &notes).await })
        .await
        .unwrap();
    assert_eq!(content, "in s3");
    manager.release(&key, ReleaseMode::Purge).await.unwrap();
    assert!(store.list(&key).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_file_puts_the_snapshots_in_a_bucket() {
    let Some(endpoint) = endpoint() else { return };
    let (bucket, store) = bucket(&endpoint).await;
    let data = tempfile::tempdir().unwrap();
    let registry = sandcell::BackendRegistry::new().register("mock", MockBackend::from_options);
    let config: sandcell::SandboxConfig = serde_json::from_value(serde_json::json!({
        "type": "mock",
        "data_dir": data.path(),
        "state_url": format!("sqlite:{}", data.path().join("elsewhere/state.db").display()),
        "snapshots_url": format!("s3://{bucket}/snapshots"),
    }))
    .unwrap();
    let manager = config.build_manager(&registry).await.unwrap();
    let key = SessionKey::new("acme", "cfg").unwrap();
    manager
        .acquire(&key, &SandboxSpec::new("default"))
        .await
        .unwrap();
    let manifest = manager.snapshot(&key).await.unwrap();
    // The snapshot is in the bucket, and nothing went to the data directory's defaults.
    assert_eq!(store.list(&key).await.unwrap(), vec![manifest]);
    assert!(!data.path().join("snapshots").exists());
    assert!(!data.path().join("state.db").exists());
    assert!(data.path().join("elsewhere/state.db").exists());
    manager.release(&key, ReleaseMode::Purge).await.unwrap();

    let mut bad = config.clone();
    bad.snapshots_url = Some("ftp://bucket/x".to_owned());
    let err = bad.build_manager(&registry).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
}
