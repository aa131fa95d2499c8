//! The conformance suite against a real Docker engine, through the in-container agent,
//! then the session manager over it. One test, so the leak check at the end sees only
//! what these cases made.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use sandcell::testing::conformance;
use sandcell::SandboxBackend;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_sandboxes_pass_the_conformance_suite() {
    if !common::engine_available().await {
        return;
    }
    let backend = common::backend(true).await;
    conformance::run_all(&backend).await;
    conformance::manager_sessions(std::sync::Arc::new(backend.clone())).await;
    let selector =
        sandcell::LabelSelector::new().with(conformance::TEST_LABEL.0, conformance::TEST_LABEL.1);
    assert!(
        backend.list(&selector).await.unwrap().is_empty(),
        "every conformance sandbox was destroyed"
    );
}
