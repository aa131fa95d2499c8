//! The conformance suite over the E2B provider → sandcell-server's E2B face → this
//! Docker backend (with the agent), through real HTTP on loopback, one test per case:
//! what E2B's own SDKs reach, checked the way every backend is.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;

use sandcell::testing::conformance::Fixture;
use sandcell_remote::e2b::{E2bBackend, E2bConfig};
use sandcell_server::{serve, ServerConfig, Tenant};

const TOKEN: &str = "e2b-provider-test";

/// Stops the in-process server when the fixture is dropped.
struct Serving(tokio::task::JoinHandle<()>);

impl Drop for Serving {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn setup() -> Option<Fixture> {
    if !common::engine_available().await {
        return None;
    }
    let docker: Arc<dyn sandcell::SandboxBackend> = Arc::new(common::backend(true).await);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    // Cases run at once on one engine: a tenant of its own per case keeps each case's
    // lists to its own sandboxes.
    static CASES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let case = CASES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tenant = Tenant::new(format!("case-{}-{case}", std::process::id()), TOKEN);
    let config = ServerConfig::with_tenants([tenant]).unwrap();
    let task = tokio::spawn(async move {
        let _ = serve(listener, docker, config, std::future::pending()).await;
    });
    let backend = E2bBackend::connect(E2bConfig::self_hosted(&url, TOKEN))
        .await
        .unwrap();
    Some(Fixture::new(backend).guard(Serving(task)))
}

sandcell::conformance_tests!(setup);
