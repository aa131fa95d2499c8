//! The conformance suite against a real Docker engine, through the in-container agent.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use sandcell::testing::conformance;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_sandboxes_pass_the_conformance_suite() {
    if !common::engine_available().await {
        return;
    }
    let backend = common::backend(true).await;
    conformance::run_all(&backend).await;
    let selector =
        sandcell::LabelSelector::new().with(conformance::TEST_LABEL.0, conformance::TEST_LABEL.1);
    use sandcell::SandboxBackend;
    assert!(
        backend.list(&selector).await.unwrap().is_empty(),
        "every conformance sandbox was destroyed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_through_the_manager() {
    if !common::engine_available().await {
        return;
    }
    let backend = common::backend(true).await;
    conformance::manager_sessions(std::sync::Arc::new(backend.clone())).await;
    assert!(common::leftovers(&backend).await.is_empty());
}
