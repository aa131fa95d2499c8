//! The conformance suite over the E2B provider → sandcell-server's E2B face (local
//! backend), through real HTTP on loopback, one test per case.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use sandcell::testing::conformance::Fixture;

async fn setup() -> Fixture {
    let server = common::serve_local().await;
    let backend = common::e2b_client(&server.url).await;
    Fixture::new(backend).guard(server)
}

sandcell::conformance_tests!(setup);
