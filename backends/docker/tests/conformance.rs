//! The conformance suite against a real Docker engine through the in-container agent,
//! one test per case, and the session manager over it. Each case's sandboxes carry a
//! label of their own, so the check for leftovers after a case sees only its own.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use sandcell::testing::conformance::Fixture;

/// A backend with the agent, or `None` (loudly, or failing where CI requires Docker)
/// without an engine.
async fn setup() -> Option<Fixture> {
    if !common::engine_available().await {
        return None;
    }
    Some(Fixture::new(common::backend(true).await))
}

sandcell::conformance_tests!(setup);

/// The crate docs' capability table says what the backend reports, with and without
/// the agent (building a backend needs no engine, with the agent its binary).
#[tokio::test]
async fn the_capability_table_matches_the_backend() {
    let source = include_str!("../src/lib.rs");
    for backend in [
        sandcell_docker::DockerBackend::builder().build().unwrap(),
        sandcell_docker::DockerBackend::builder()
            .agent(common::agent_binary())
            .build()
            .unwrap(),
    ] {
        sandcell::testing::check_capability_table(
            source,
            "docker",
            &sandcell::SandboxBackend::capabilities(&backend),
        )
        .unwrap();
    }
}
