//! The conformance suite against the in-memory MockBackend, directly and behind
//! `Box<dyn SandboxBackend>` / `Arc<dyn SandboxBackend>`.

#![cfg(feature = "testing")]

use std::sync::Arc;

use sandcell::testing::{conformance, MockBackend};
use sandcell::SandboxBackend;

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

#[tokio::test]
async fn a_template_with_files_passes_too() {
    // Exercises the cases that edit and delete template content (incremental snapshots).
    let mock = MockBackend::new()
        .with_template(
            "default",
            [
                ("README.md", &b"# template\n"[..]),
                ("src/lib.rs", b"pub fn f() {}\n"),
                ("src/util/mod.rs", b"// util\n"),
            ],
        )
        .unwrap();
    conformance::run_all(&mock).await;
    assert_eq!(mock.live_count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_through_the_manager() {
    let mock = MockBackend::new();
    conformance::manager_sessions(Arc::new(mock.clone())).await;
    assert_eq!(mock.live_count(), 0);
}
