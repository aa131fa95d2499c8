//! The conformance suite against the local backend, one test per case: with each
//! workspace strategy, through the wire protocol, and the session manager over it.

// Test helpers outside #[test] fns report failures by panicking too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use sandcell::testing::conformance::Fixture;
use sandcell::SandboxBackend;
use sandcell_local::{LocalBackend, WorkspaceStrategy};

/// A local backend in a temporary root that must hold no sandbox once a case is over.
fn fixture(
    strategy: WorkspaceStrategy,
    wrap: fn(LocalBackend) -> Box<dyn SandboxBackend>,
) -> Fixture {
    let root = tempfile::tempdir().unwrap();
    let backend = LocalBackend::builder()
        .root(root.path())
        .workspace(strategy)
        .build()
        .unwrap();
    let sandboxes = root.path().join("sandboxes");
    Fixture::new(wrap(backend))
        .check_after(move || {
            let left = std::fs::read_dir(&sandboxes).map_or(0, |d| d.count());
            assert_eq!(left, 0, "every conformance sandbox was destroyed");
        })
        .guard(root)
}

fn direct(backend: LocalBackend) -> Box<dyn SandboxBackend> {
    Box::new(backend)
}

mod copy_workspaces {
    async fn setup() -> super::Fixture {
        super::fixture(super::WorkspaceStrategy::Copy, super::direct)
    }
    sandcell::conformance_tests!(setup);
}

mod overlay_workspaces {
    async fn setup() -> Option<super::Fixture> {
        super::common::overlay_available()
            .then(|| super::fixture(super::WorkspaceStrategy::Overlay, super::direct))
    }
    sandcell::conformance_tests!(setup);
}

mod through_the_wire_protocol {
    fn wired(backend: super::LocalBackend) -> Box<dyn super::SandboxBackend> {
        Box::new(sandcell::testing::WireLoop::new(backend))
    }
    async fn setup() -> super::Fixture {
        super::fixture(super::WorkspaceStrategy::Copy, wired)
    }
    sandcell::conformance_tests!(setup);
}

/// The crate docs' capability table says what the backend reports, at every isolation
/// level this host has and with every workspace strategy.
#[test]
fn the_capability_table_matches_the_backend() {
    let source = include_str!("../src/lib.rs");
    let root = tempfile::tempdir().unwrap();
    for isolation in [
        sandcell_local::Isolation::Landlock,
        sandcell_local::Isolation::Namespaces,
        sandcell_local::Isolation::None,
    ] {
        for workspace in [
            WorkspaceStrategy::Overlay,
            WorkspaceStrategy::Copy,
            WorkspaceStrategy::InPlace,
        ] {
            let Ok(backend) = LocalBackend::builder()
                .root(root.path())
                .isolation(isolation)
                .workspace(workspace)
                .build()
            else {
                continue;
            };
            sandcell::testing::check_capability_table(source, "local", &backend.capabilities())
                .unwrap_or_else(|e| panic!("{isolation:?}, {workspace:?}: {e}"));
        }
    }
}
