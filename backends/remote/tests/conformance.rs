//! The conformance suite over FlyBackend → sandcell-server (local backend), through
//! real HTTP on loopback, one test per case.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use sandcell::testing::conformance::Fixture;

async fn setup() -> Fixture {
    let server = common::serve_local().await;
    let backend = common::client(&server.url).await;
    assert!(backend.has_extensions());
    Fixture::new(backend).guard(server)
}

sandcell::conformance_tests!(setup);
