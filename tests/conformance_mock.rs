//! The conformance suite against the in-memory MockBackend.

#![cfg(feature = "testing")]

use sandcell::testing::{conformance, MockBackend};

#[tokio::test]
async fn mock_backend_passes_the_conformance_suite() {
    let backend = MockBackend::new();
    conformance::run_all(&backend).await;
    assert_eq!(
        backend.live_count(),
        0,
        "every conformance sandbox was destroyed"
    );
}
