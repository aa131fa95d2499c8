//! Isolation levels of the local backend: what a sandbox process can and cannot touch.

// Test helpers outside #[test] fns report failures by panicking too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use sandcell::testing::conformance;
use sandcell::{ErrorKind, Mount, SandboxBackend, SandboxBackendExt, SandboxSpec};
use sandcell_local::{Isolation, LocalBackend};

/// A Landlock backend, or `None` (loudly) where the kernel has no Landlock, unless
/// `SANDCELL_REQUIRE_LANDLOCK=1` (set by CI), where that is a failure.
fn landlock_backend(root: &std::path::Path) -> Option<LocalBackend> {
    match LocalBackend::builder()
        .root(root)
        .isolation(Isolation::Landlock)
        .build()
    {
        Ok(b) => Some(b),
        Err(e) => {
            assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
            assert!(
                std::env::var("SANDCELL_REQUIRE_LANDLOCK").as_deref() != Ok("1"),
                "Landlock is required here: {e}"
            );
            eprintln!("SKIPPED: {e}; set SANDCELL_REQUIRE_LANDLOCK=1 to fail instead");
            None
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn landlock_passes_the_conformance_suite() {
    let root = tempfile::tempdir().unwrap();
    let Some(backend) = landlock_backend(root.path()) else {
        return;
    };
    conformance::run_all(&backend).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn landlock_confines_writes_to_the_workspace() {
    let root = tempfile::tempdir().unwrap();
    let Some(backend) = landlock_backend(root.path()) else {
        return;
    };
    assert!(backend.capabilities().read_only_mounts_enforced);
    let outside = tempfile::tempdir().unwrap();
    let knowledge = tempfile::tempdir().unwrap();
    std::fs::write(knowledge.path().join("facts.md"), "fact").unwrap();
    let spec = SandboxSpec::default()
        .with_mount(Mount::read_only(knowledge.path(), "files".parse().unwrap()));
    let sb = backend.create(&spec).await.unwrap();

    let escape = format!("echo x > {}/escaped", outside.path().display());
    assert!(
        !backend.run_shell(&sb.id, &escape).await.unwrap().success(),
        "writing outside is refused"
    );
    assert!(!outside.path().join("escaped").exists());

    let ok = backend
        .run_shell(&sb.id, "echo in > inside.txt && cat /etc/hostname >/dev/null && echo hi > /dev/null && cat files/facts.md")
        .await
        .unwrap();
    assert!(
        ok.success(),
        "workspace writes, reads elsewhere and /dev/null work: {}",
        ok.stderr_str()
    );
    assert_eq!(ok.stdout_str(), "fact");

    let remount = backend
        .run_shell(
            &sb.id,
            "mount -o remount,rw,bind files 2>&1; echo x > files/new.md",
        )
        .await
        .unwrap();
    assert!(
        !remount.success(),
        "a read-only mount cannot be made writable"
    );
    assert!(!knowledge.path().join("new.md").exists());

    backend.destroy(&sb.id).await.unwrap();
    assert_eq!(
        std::fs::read_to_string(knowledge.path().join("facts.md")).unwrap(),
        "fact"
    );
}
