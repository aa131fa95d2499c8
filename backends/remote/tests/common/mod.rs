//! Shared set-up: a sandcell-server over a local backend on a loopback port, and a
//! client for it.

#![allow(dead_code)]

pub(crate) mod openapi;
pub(crate) mod proxy;

use std::time::Duration;

use sandcell_local::LocalBackend;
use sandcell_remote::{FlyBackend, FlyConfig, RetryPolicy};
use sandcell_server::testing;
use sandcell_server::{HostPath, ServerConfig};

/// The token test servers take.
pub(crate) const TOKEN: &str = "test-token";

/// A running server over a local backend; dropping it stops the server (its
/// sandboxes' directory goes too).
pub(crate) type TestServer = sandcell_server::testing::LocalServer;

/// Serves a fresh local backend on `127.0.0.1:<any>`, allowing host mounts from the
/// temporary directory (where the conformance suite makes its host directories).
pub(crate) async fn serve_local() -> TestServer {
    let config = ServerConfig::new(TOKEN).allow_host_path(HostPath::writable(std::env::temp_dir()));
    serve_local_with(config).await
}

/// Serves a fresh local backend on `127.0.0.1:<any>` with `config`.
pub(crate) async fn serve_local_with(config: ServerConfig) -> TestServer {
    testing::serve_local(config).await.unwrap()
}

/// Serves `local` (whose root is `root`) on `127.0.0.1:<any>` with `config`.
pub(crate) async fn serve_built(
    local: LocalBackend,
    root: tempfile::TempDir,
    config: ServerConfig,
) -> TestServer {
    testing::serve_local_backend(local, root, config)
        .await
        .unwrap()
}

/// Quick retries, so fault tests do not wait seconds.
pub(crate) fn fast_retries() -> RetryPolicy {
    RetryPolicy::new(3, Duration::from_millis(20), Duration::from_millis(100))
}

/// A client of `url` with quick retries.
pub(crate) async fn client(url: &str) -> FlyBackend {
    FlyBackend::connect(FlyConfig::new(url, TOKEN).retry(fast_retries()))
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
