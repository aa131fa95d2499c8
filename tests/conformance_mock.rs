//! The conformance suite against the in-memory MockBackend, one test per case (with and
//! without template files), and once through behind `Box<dyn SandboxBackend>` /
//! `Arc<dyn SandboxBackend>`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use sandcell::testing::{conformance, MockBackend};
use sandcell::SandboxBackend;

/// A mock that must have nothing live once the case is over.
fn fixture(mock: MockBackend) -> conformance::Fixture {
    conformance::Fixture::new(mock.clone()).check_after(move || {
        assert_eq!(
            mock.live_count(),
            0,
            "every conformance sandbox was destroyed"
        );
    })
}

mod mock {
    async fn setup() -> super::conformance::Fixture {
        super::fixture(super::MockBackend::new())
    }
    sandcell::conformance_tests!(setup);
}

/// Exercises the cases that edit and delete template content (incremental snapshots).
mod mock_with_a_template {
    async fn setup() -> super::conformance::Fixture {
        let mock = super::MockBackend::new()
            .template(
                "default",
                [
                    ("README.md", &b"# template\n"[..]),
                    ("src/lib.rs", b"pub fn f() {}\n"),
                    ("src/util/mod.rs", b"// util\n"),
                ],
            )
            .expect("a template");
        super::fixture(mock)
    }
    sandcell::conformance_tests!(setup);
}

#[tokio::test]
async fn boxed_and_shared_trait_objects_pass_too() {
    let mock = MockBackend::new();
    let boxed: Box<dyn SandboxBackend> = Box::new(mock.clone());
    conformance::run_all(&boxed).await;
    let shared: Arc<dyn SandboxBackend> = Arc::new(mock.clone());
    conformance::lifecycle(&shared).await;
    conformance::hostile_archives_are_rejected(&shared).await;
    assert_eq!(mock.live_count(), 0);
}
