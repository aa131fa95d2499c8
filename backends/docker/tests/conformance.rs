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
