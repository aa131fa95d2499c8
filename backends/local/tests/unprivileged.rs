//! The local backend run by an unprivileged user (as uid 65534 when the tests run as
//! root): namespaced sandboxes.

// Test helpers outside #[test] fns report failures by panicking too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use sandcell::{ErrorKind, ExecRequest, SandboxBackend, SandboxBackendExt, SandboxSpec};
use sandcell_local::{Isolation, LocalBackend};

mod common;

/// `Isolation::Namespaces` works for an unprivileged user: bubblewrap's namespaces are
/// joined by every command (they used to be refused, `nsenter: reassociate to
/// namespace 'ns/ipc' failed`), and the sandbox's files are this user's on the host.
#[tokio::test]
async fn namespaces_work_for_an_unprivileged_user() {
    if !common::unprivileged("namespaces_work_for_an_unprivileged_user") {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let b = match LocalBackend::builder()
        .root(root.path().join("root"))
        .isolation(Isolation::Namespaces)
        .build()
    {
        Ok(b) => b,
        Err(e) => {
            assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
            sandcell::testing::require_or_skip("NAMESPACES", "namespaces", Err(e.to_string()));
            return;
        }
    };
    let info = b.create(&SandboxSpec::default()).await.unwrap();
    let out = b
        .run(
            &info.id,
            ExecRequest::new(["sh", "-c", "echo made > made.txt && pwd && id -u"]),
        )
        .await
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.stdout_str(), "/workspace\n0\n");
    let host = Path::new(&info.details["host_path"]).join("made.txt");
    assert_eq!(std::fs::read_to_string(&host).unwrap(), "made\n");
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        std::fs::metadata(&host).unwrap().uid(),
        rustix::process::geteuid().as_raw(),
        "the sandbox's root is this user on the host"
    );
    b.destroy(&info.id).await.unwrap();
}
