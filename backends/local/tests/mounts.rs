//! Host directories mounted into sandboxes: read-only really is, writes land on the host
//! where asked, snapshots leave them out, and destroy never deletes through them.

// Test helpers outside #[test] fns report failures by panicking too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use bytes::Bytes;
use sandcell::snapshot::{self, PackOptions};
use sandcell::{ErrorKind, Mount, SandboxBackend, SandboxBackendExt, SandboxPath, SandboxSpec};
use sandcell_local::LocalBackend;

mod common;

fn p(s: &str) -> SandboxPath {
    s.parse().unwrap()
}

fn mounts_under(root: &Path) -> usize {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| Path::new(m).starts_with(root))
        .count()
}

/// A host directory a sandbox may write in: as root, another user's, since a root
/// backend's sandboxes (which run as its owner uid) may not write in one root owns
/// (see `identity.rs`).
fn writable_host_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    if rustix::process::geteuid().is_root() {
        std::os::unix::fs::chown(dir.path(), Some(4242), Some(4242)).unwrap();
    }
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn knowledge_dirs_are_read_only_and_survive_destroy() {
    let root = tempfile::tempdir().unwrap();
    let knowledge = tempfile::tempdir().unwrap();
    std::fs::write(knowledge.path().join("facts.md"), "the sky is blue").unwrap();
    let output = writable_host_dir();
    let backend = LocalBackend::builder().root(root.path()).build().unwrap();
    assert!(backend.capabilities().host_mounts);
    let spec = SandboxSpec::default()
        .mount(Mount::read_only(knowledge.path(), p("files")))
        .mount(Mount::read_write(output.path(), p("out")));
    let sb = match backend.create(&spec).await {
        Ok(sb) => sb,
        Err(e) if e.kind() == ErrorKind::PermissionDenied || e.kind() == ErrorKind::Backend => {
            // Mounting needs the same privilege as overlay workspaces, which CI requires.
            sandcell::testing::require_or_skip("OVERLAY", "bind mounts", Err(e.to_string()));
            return;
        }
        Err(e) => panic!("{e}"),
    };

    let out = backend
        .run_shell(&sb.id, "cat files/facts.md")
        .await
        .unwrap();
    assert_eq!(out.stdout_str(), "the sky is blue");
    let out = backend
        .run_shell(&sb.id, "echo x > files/new.md")
        .await
        .unwrap();
    assert!(
        !out.success(),
        "a write to the read-only mount fails inside the sandbox"
    );
    let err = backend
        .write(&sb.id, &p("files/new.md"), Bytes::from_static(b"x"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err}");
    assert!(!knowledge.path().join("new.md").exists());

    assert!(backend
        .run_shell(&sb.id, "echo result > out/report.txt")
        .await
        .unwrap()
        .success());
    assert_eq!(
        std::fs::read_to_string(output.path().join("report.txt")).unwrap(),
        "result\n"
    );

    let (_, blob) = snapshot::capture(
        &backend,
        &sb.id,
        &SandboxPath::root(),
        Vec::new(),
        &PackOptions::default(),
    )
    .await
    .unwrap();
    let tar = zstd::decode_all(&blob[..]).unwrap();
    assert!(
        !tar.windows(15).any(|w| w == b"the sky is blue"),
        "mounted host content is not part of the snapshot"
    );

    backend.destroy(&sb.id).await.unwrap();
    assert_eq!(
        std::fs::read_to_string(knowledge.path().join("facts.md")).unwrap(),
        "the sky is blue"
    );
    assert_eq!(
        std::fs::read_to_string(output.path().join("report.txt")).unwrap(),
        "result\n"
    );
    assert_eq!(mounts_under(root.path()), 0, "no mount is left behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_mount_source_fails_create_and_leaves_nothing() {
    let root = tempfile::tempdir().unwrap();
    let backend = LocalBackend::builder().root(root.path()).build().unwrap();
    let spec =
        SandboxSpec::default().mount(Mount::read_only("/nonexistent/sandcell/dir", p("files")));
    let err = backend.create(&spec).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    assert_eq!(
        std::fs::read_dir(root.path().join("sandboxes"))
            .unwrap()
            .count(),
        0
    );
    assert_eq!(mounts_under(root.path()), 0);
}

/// A snapshot leaves a host mount's contents out; restoring it with
/// `ImportOptions::replace()` into the same sandbox must leave them alone too, not
/// empty the host directory on the way to putting the workspace back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replacing_restore_leaves_a_writable_mount_alone() {
    let root = tempfile::tempdir().unwrap();
    let output = writable_host_dir();
    std::fs::write(output.path().join("host-data.txt"), "the host's").unwrap();
    let backend = LocalBackend::builder().root(root.path()).build().unwrap();
    let spec = SandboxSpec::default().mount(Mount::read_write(output.path(), p("work/out")));
    let sb = match backend.create(&spec).await {
        Ok(sb) => sb,
        Err(e) if e.kind() == ErrorKind::PermissionDenied || e.kind() == ErrorKind::Backend => {
            sandcell::testing::require_or_skip("OVERLAY", "bind mounts", Err(e.to_string()));
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let restored = async {
        backend
            .write(&sb.id, &p("work/notes.txt"), Bytes::from_static(b"mine"))
            .await?;
        let (manifest, blob) = snapshot::capture(
            &backend,
            &sb.id,
            &SandboxPath::root(),
            Vec::new(),
            &PackOptions::default(),
        )
        .await?;
        snapshot::restore(
            &backend,
            &sb.id,
            &SandboxPath::root(),
            std::io::Cursor::new(blob),
            &manifest,
            sandcell::archive::ImportOptions::replace(),
        )
        .await
    }
    .await;
    backend.destroy(&sb.id).await.unwrap();
    let host_data = std::fs::read_to_string(output.path().join("host-data.txt"));
    assert!(
        host_data.is_ok(),
        "the restore (which answered {restored:?}) deleted the host's file in the mount"
    );
}

/// With a copied workspace (a plain directory on the host's file system), a host
/// directory bound in from that same file system has the workspace's device number:
/// telling mounts by device let its contents into snapshots and disk usage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bind_mount_from_the_workspaces_own_file_system_stays_out_of_snapshots() {
    let base = tempfile::tempdir().unwrap();
    let (root, knowledge) = (base.path().join("root"), base.path().join("knowledge"));
    std::fs::create_dir_all(&knowledge).unwrap();
    std::fs::write(knowledge.join("facts.md"), "the sky is blue").unwrap();
    let backend = LocalBackend::builder()
        .root(&root)
        .workspace(sandcell_local::WorkspaceStrategy::Copy)
        .build()
        .unwrap();
    let spec = SandboxSpec::default().mount(Mount::read_only(&knowledge, p("files")));
    let sb = match backend.create(&spec).await {
        Ok(sb) => sb,
        Err(e) if e.kind() == ErrorKind::PermissionDenied || e.kind() == ErrorKind::Backend => {
            sandcell::testing::require_or_skip("OVERLAY", "bind mounts", Err(e.to_string()));
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let captured = snapshot::capture(
        &backend,
        &sb.id,
        &SandboxPath::root(),
        Vec::new(),
        &PackOptions::default(),
    )
    .await;
    let usage = backend.metrics(&sb.id).await;
    backend.destroy(&sb.id).await.unwrap();
    let (_, blob) = captured.unwrap();
    let tar = zstd::decode_all(&blob[..]).unwrap();
    assert!(
        !tar.windows(15).any(|w| w == b"the sky is blue"),
        "mounted host content is not part of the snapshot"
    );
    assert_eq!(usage.unwrap().disk_bytes, Some(0), "nor of the disk usage");
}

/// ADVERSARIAL 37: a writable host mount of a directory whose group is root's, at
/// `Isolation::Namespaces` under a root backend, is refused as one whose owner is
/// root is: through the idmapped view, what the sandbox made there (a setgid program
/// among it) would be root's group's on the host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writable_mount_of_a_root_group_directory_is_refused() {
    if !rustix::process::geteuid().is_root() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let builder = LocalBackend::builder().root(root.path());
    let Some(backend) = common::build_at(builder, sandcell_local::Isolation::Namespaces) else {
        return;
    };
    let shared = tempfile::tempdir().unwrap();
    std::os::unix::fs::chown(shared.path(), Some(4242), Some(0)).unwrap();
    let spec = SandboxSpec::default().mount(Mount::read_write(shared.path(), p("shared")));
    let err = backend.create(&spec).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err}");
    // Read-only, it is shown.
    let spec = SandboxSpec::default().mount(Mount::read_only(shared.path(), p("shared")));
    let sb = backend.create(&spec).await.unwrap();
    backend.destroy(&sb.id).await.unwrap();
    assert_eq!(std::fs::read_dir(shared.path()).unwrap().count(), 0);
}
