//! The conformance suite over RemoteBackend → sandcell-server (local backend), through
//! real HTTP on loopback.
#![cfg(feature = "server")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use sandcell::testing::conformance;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_backend_passes_the_conformance_suite() {
    let server = common::serve_local().await;
    let backend = common::client(&server.url).await;
    assert!(backend.has_extensions());
    conformance::run_all(&backend).await;
    conformance::manager_sessions(std::sync::Arc::new(backend)).await;
}
