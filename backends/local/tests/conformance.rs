//! The conformance suite against the local backend, with each workspace strategy.

// Test helpers outside #[test] fns report failures by panicking too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use sandcell::testing::conformance;
use sandcell_local::{LocalBackend, WorkspaceStrategy};

async fn run(strategy: WorkspaceStrategy) {
    let root = tempfile::tempdir().unwrap();
    let backend = LocalBackend::builder()
        .root(root.path())
        .workspace(strategy)
        .build()
        .unwrap();
    conformance::run_all(&backend).await;
    let left = std::fs::read_dir(root.path().join("sandboxes"))
        .unwrap()
        .count();
    assert_eq!(left, 0, "every conformance sandbox was destroyed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_workspaces_pass_the_conformance_suite() {
    run(WorkspaceStrategy::Copy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlay_workspaces_pass_the_conformance_suite() {
    if !common::overlay_available() {
        return;
    }
    run(WorkspaceStrategy::Overlay).await;
}

mod common;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_local_backend_passes_through_the_wire_protocol() {
    let root = tempfile::tempdir().unwrap();
    let backend = LocalBackend::builder()
        .root(root.path())
        .workspace(WorkspaceStrategy::Copy)
        .build()
        .unwrap();
    conformance::run_all(&sandcell::testing::WireLoop::new(backend)).await;
    let left = std::fs::read_dir(root.path().join("sandboxes"))
        .unwrap()
        .count();
    assert_eq!(left, 0, "every conformance sandbox was destroyed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_through_the_manager() {
    let root = tempfile::tempdir().unwrap();
    let backend = LocalBackend::builder().root(root.path()).build().unwrap();
    conformance::manager_sessions(std::sync::Arc::new(backend)).await;
    let left = std::fs::read_dir(root.path().join("sandboxes"))
        .unwrap()
        .count();
    assert_eq!(left, 0, "nothing left");
}
