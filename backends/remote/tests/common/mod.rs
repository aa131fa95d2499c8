//! Shared set-up: a sandcell-server over a local backend on a loopback port, and a
//! client for it.

#![allow(dead_code)]

pub(crate) mod openapi;
pub(crate) mod proxy;

use std::sync::Arc;
use std::time::Duration;

use sandcell::SandboxBackend;
use sandcell_local::LocalBackend;
use sandcell_remote::server::{serve, HostPath, ServerConfig};
use sandcell_remote::{RemoteBackend, RemoteConfig, RetryPolicy};

/// The token test servers take.
pub(crate) const TOKEN: &str = "test-token";

/// A running server; dropping it stops the server (its sandboxes' directory goes too).
pub(crate) struct TestServer {
    pub(crate) url: String,
    pub(crate) local: LocalBackend,
    task: tokio::task::JoinHandle<()>,
    _root: tempfile::TempDir,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves a fresh local backend on `127.0.0.1:<any>`, allowing host mounts from the
/// temporary directory (where the conformance suite makes its host directories).
pub(crate) async fn serve_local() -> TestServer {
    let config = ServerConfig::new(TOKEN).allow_host_path(HostPath::writable(std::env::temp_dir()));
    serve_local_with(config).await
}

/// Serves a fresh local backend on `127.0.0.1:<any>` with `config`.
pub(crate) async fn serve_local_with(config: ServerConfig) -> TestServer {
    let root = tempfile::tempdir().unwrap();
    let local = LocalBackend::builder().root(root.path()).build().unwrap();
    serve_built(local, root, config).await
}

/// Serves `local` (whose root is `root`) on `127.0.0.1:<any>` with `config`.
pub(crate) async fn serve_built(
    local: LocalBackend,
    root: tempfile::TempDir,
    config: ServerConfig,
) -> TestServer {
    let backend: Arc<dyn SandboxBackend> = Arc::new(local.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        let _ = serve(listener, backend, config, std::future::pending()).await;
    });
    TestServer {
        url,
        local,
        task,
        _root: root,
    }
}

/// Quick retries, so fault tests do not wait seconds.
pub(crate) fn fast_retries() -> RetryPolicy {
    RetryPolicy::new(3, Duration::from_millis(20), Duration::from_millis(100))
}

/// A client of `url` with quick retries.
pub(crate) async fn client(url: &str) -> RemoteBackend {
    RemoteBackend::connect(RemoteConfig::new(url, TOKEN).retry(fast_retries()))
        .await
        .unwrap()
}

/// An E2B provider for the E2B face of the server at `url`, with quick retries.
pub(crate) async fn e2b_client(url: &str) -> sandcell_remote::e2b::E2bBackend {
    let config = sandcell_remote::e2b::E2bConfig::self_hosted(url, TOKEN).retry(fast_retries());
    sandcell_remote::e2b::E2bBackend::connect(config)
        .await
        .unwrap()
}

/// A served backend; dropping it stops the server.
pub(crate) struct Served {
    pub(crate) url: String,
    pub(crate) addr: std::net::SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub(crate) async fn serve_backend(
    backend: Arc<dyn SandboxBackend>,
    config: ServerConfig,
) -> Served {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let _ = serve(listener, backend, config, std::future::pending()).await;
    });
    Served {
        url: format!("http://{addr}"),
        addr,
        task,
    }
}
