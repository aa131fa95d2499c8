//! Workspaces on the local backend: templates stay shared and untouched, sandboxes do
//! not see each other, snapshots never carry host bytes, and state outlives the process.

// Test helpers outside #[test] fns report failures by panicking too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use sandcell::snapshot::{self, PackOptions};
use sandcell::{SandboxBackend, SandboxBackendExt, SandboxPath, SandboxSpec};
use sandcell_local::{LocalBackend, WorkspaceStrategy};

mod common;

fn template() -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    std::fs::create_dir(t.path().join("src")).unwrap();
    std::fs::write(t.path().join("src/lib.rs"), "// template\n").unwrap();
    t
}

async fn isolated_from_each_other(strategy: WorkspaceStrategy) {
    let root = tempfile::tempdir().unwrap();
    let tpl = template();
    let backend = LocalBackend::builder()
        .root(root.path())
        .template("t", tpl.path())
        .workspace(strategy)
        .build()
        .unwrap();
    let a = backend.create(&SandboxSpec::new("t")).await.unwrap();
    let b = backend.create(&SandboxSpec::new("t")).await.unwrap();
    assert_eq!(a.details["workspace"], strategy_name(strategy));
    let lib: SandboxPath = "src/lib.rs".parse().unwrap();
    backend
        .write_string(&a.id, &lib, "// changed in a\n")
        .await
        .unwrap();
    backend
        .write_string(&a.id, &"new.txt".parse().unwrap(), "a only")
        .await
        .unwrap();
    backend
        .remove(&a.id, &"src".parse().unwrap(), true)
        .await
        .unwrap();
    assert_eq!(
        backend.read_to_string(&b.id, &lib).await.unwrap(),
        "// template\n"
    );
    assert!(!backend
        .exists(&b.id, &"new.txt".parse().unwrap())
        .await
        .unwrap());
    assert_eq!(
        std::fs::read_to_string(tpl.path().join("src/lib.rs")).unwrap(),
        "// template\n",
        "template untouched"
    );
    assert!(!tpl.path().join("new.txt").exists());
    backend.destroy(&a.id).await.unwrap();
    backend.destroy(&b.id).await.unwrap();
    assert!(
        tpl.path().join("src/lib.rs").exists(),
        "destroy leaves the template alone"
    );
}

fn strategy_name(s: WorkspaceStrategy) -> &'static str {
    match s {
        WorkspaceStrategy::Overlay => "overlay",
        _ => "copy",
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_sandboxes_do_not_see_each_other() {
    isolated_from_each_other(WorkspaceStrategy::Copy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlay_sandboxes_do_not_see_each_other() {
    if common::overlay_available() {
        isolated_from_each_other(WorkspaceStrategy::Overlay).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_to_a_host_secret_snapshots_as_a_link() {
    let root = tempfile::tempdir().unwrap();
    let secret_dir = tempfile::tempdir().unwrap();
    let secret = secret_dir.path().join("shadow");
    let marker = format!("host-secret-{}", uuid_like());
    std::fs::write(&secret, &marker).unwrap();
    let backend = LocalBackend::builder().root(root.path()).build().unwrap();
    let sb = backend.create(&SandboxSpec::default()).await.unwrap();
    let script = format!("ln -s {} leak && ln -s /etc/shadow leak2", secret.display());
    assert!(backend.run_shell(&sb.id, &script).await.unwrap().success());

    let (manifest, blob) = snapshot::capture(
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
        !contains(&tar, marker.as_bytes()),
        "no host bytes in the snapshot"
    );
    if let Ok(shadow) = std::fs::read("/etc/shadow") {
        if shadow.len() > 16 {
            assert!(
                !contains(&tar, &shadow[..16]),
                "no /etc/shadow bytes in the snapshot"
            );
        }
    }
    let mut archive = tar::Archive::new(&tar[..]);
    let kinds: Vec<(String, tar::EntryType)> = archive
        .entries()
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.path().unwrap().display().to_string(),
                e.header().entry_type(),
            )
        })
        .collect();
    assert!(
        kinds.contains(&("leak".to_owned(), tar::EntryType::Symlink)),
        "{kinds:?}"
    );
    assert!(manifest.entry_count >= 2);
    backend.destroy(&sb.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_outlives_the_backend_instance() {
    let root = tempfile::tempdir().unwrap();
    let first = LocalBackend::builder().root(root.path()).build().unwrap();
    let sb = first
        .create(&SandboxSpec::default().label("who", "first"))
        .await
        .unwrap();
    first
        .write_string(&sb.id, &"kept.txt".parse().unwrap(), "still here")
        .await
        .unwrap();
    first
        .run_shell(&sb.id, "sleep 1000 >/dev/null 2>&1 &")
        .await
        .unwrap();
    let workspace = PathBuf::from(&sb.details["host_path"]);
    drop(first);

    let second = LocalBackend::builder().root(root.path()).build().unwrap();
    let seen = second.inspect(&sb.id).await.unwrap();
    assert_eq!(seen.labels["who"], "first");
    let listed = second
        .list(&sandcell::LabelSelector::new().label("who", "first"))
        .await
        .unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        second
            .read_to_string(&sb.id, &"kept.txt".parse().unwrap())
            .await
            .unwrap(),
        "still here"
    );
    assert_eq!(common::processes_in(&workspace).len(), 1);
    second.destroy(&sb.id).await.unwrap();
    for _ in 0..100 {
        if common::processes_in(&workspace).is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(
        common::processes_in(&workspace).is_empty(),
        "a new instance's destroy kills what the old one started"
    );
    assert!(!workspace.exists());
}

#[test]
fn a_missing_template_directory_fails_at_build() {
    let root = tempfile::tempdir().unwrap();
    let err = LocalBackend::builder()
        .root(root.path())
        .template("t", root.path().join("missing"))
        .build()
        .unwrap_err();
    assert_eq!(err.kind(), sandcell::ErrorKind::NotFound, "{err}");
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

fn uuid_like() -> String {
    format!("{:x}", std::process::id() as u64 * 2654435761)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlay_changes_restore_here_and_on_another_backend() {
    if !common::overlay_available() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let tpl = tempfile::tempdir().unwrap();
    let files: [(&str, &[u8]); 5] = [
        ("keep.txt", b"same"),
        ("edit.txt", b"old"),
        ("gone/a.txt", b"a"),
        ("replaced/old.txt", b"old"),
        ("del.txt", b"bye"),
    ];
    for (path, data) in files {
        let host = tpl.path().join(path);
        std::fs::create_dir_all(host.parent().unwrap()).unwrap();
        std::fs::write(host, data).unwrap();
    }
    let backend = LocalBackend::builder()
        .root(root.path())
        .template("t", tpl.path())
        .workspace(WorkspaceStrategy::Overlay)
        .build()
        .unwrap();
    let sb = backend.create(&SandboxSpec::new("t")).await.unwrap();
    let script = "echo new > edit.txt && rm -r gone del.txt && rm -r replaced && mkdir replaced && echo fresh > replaced/new.txt && mkdir -p add/deep && echo hi > add/deep/f";
    assert!(backend.run_shell(&sb.id, script).await.unwrap().success());

    let (manifest, blob) =
        snapshot::capture_changes(&backend, &sb.id, Vec::new(), &PackOptions::default())
            .await
            .unwrap();
    let deleted: Vec<&str> = manifest.deleted.iter().map(|p| p.as_str()).collect();
    assert_eq!(
        deleted,
        ["del.txt", "gone", "replaced"],
        "whiteouts and the opaque dir"
    );
    let expected = sandcell::testing::conformance::fingerprint(&backend, &sb.id).await;

    let fresh = backend.create(&SandboxSpec::new("t")).await.unwrap();
    snapshot::restore(
        &backend,
        &fresh.id,
        &SandboxPath::root(),
        std::io::Cursor::new(blob.clone()),
        &manifest,
        sandcell::archive::ImportOptions::replace(),
    )
    .await
    .unwrap();
    assert_eq!(
        sandcell::testing::conformance::fingerprint(&backend, &fresh.id).await,
        expected
    );

    // Any backend with the same template can take the change set.
    let mock = sandcell::testing::MockBackend::new()
        .template("t", files)
        .unwrap();
    let other = mock.create(&SandboxSpec::new("t")).await.unwrap();
    snapshot::restore(
        &mock,
        &other.id,
        &SandboxPath::root(),
        std::io::Cursor::new(blob),
        &manifest,
        sandcell::archive::ImportOptions::replace(),
    )
    .await
    .unwrap();
    assert_eq!(
        sandcell::testing::conformance::fingerprint(&mock, &other.id).await,
        expected
    );

    backend.destroy(&sb.id).await.unwrap();
    backend.destroy(&fresh.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copied_workspaces_refuse_incremental_export() {
    let root = tempfile::tempdir().unwrap();
    let backend = LocalBackend::builder()
        .root(root.path())
        .workspace(WorkspaceStrategy::Copy)
        .build()
        .unwrap();
    assert!(!backend.capabilities().incremental_snapshot);
    let sb = backend.create(&SandboxSpec::default()).await.unwrap();
    let err = snapshot::capture_changes(&backend, &sb.id, Vec::new(), &PackOptions::default())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), sandcell::ErrorKind::Unsupported);
    backend.destroy(&sb.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_process_swapping_a_dir_for_a_link_never_leads_file_operations_out() {
    let root = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), "outside-secret-bytes").unwrap();
    let backend = LocalBackend::builder().root(root.path()).build().unwrap();
    let outside_path = outside.path().to_path_buf();
    sandcell::testing::conformance::with_sandbox(&backend, SandboxSpec::default(), |id| {
        let backend = &backend;
        let outside = &outside_path;
        async move {
            // `d` is always there, atomically retargeted (rename of one link over another)
            // between a directory inside the workspace and the outside directory.
            let script = format!(
                "mkdir -p real && ln -sfn real d && while :; do ln -sfn {} d.tmp && mv -T d.tmp d; ln -sfn real d.tmp && mv -T d.tmp d; done 2>/dev/null",
                outside.as_path().display()
            );
            let mut swapper = backend
                .exec(
                    &id,
                    sandcell::ExecRequest::shell(script).timeout(std::time::Duration::from_secs(60)),
                )
                .await
                .unwrap();
            // Start only once the swapper owns `d` (an early write would create it as a
            // directory and jam the swapping).
            let d: SandboxPath = "d".parse().unwrap();
            let mut ready = false;
            for _ in 0..500 {
                if backend
                    .stat(&id, &d)
                    .await
                    .is_ok_and(|i| i.kind == sandcell::FileKind::Symlink)
                {
                    ready = true;
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            assert!(ready, "the swapper started");
            let d_file: SandboxPath = "d/f".parse().unwrap();
            let (mut operations, mut written, mut refused) = (0, 0, 0);
            for i in 0..300 {
                match backend
                    .write(&id, &d_file, bytes::Bytes::from(format!("{i}")))
                    .await
                {
                    Ok(()) => written += 1,
                    Err(e) if e.kind() == sandcell::ErrorKind::PermissionDenied => refused += 1,
                    Err(_) => {}
                }
                if let Ok(data) = backend.read(&id, &d_file).await {
                    assert!(!data.starts_with(b"outside"), "read through the link");
                }
                let _ = backend.list_dir(&id, &"d".parse().unwrap()).await;
                let _ = backend.mkdir(&id, &"d/sub".parse().unwrap()).await;
                if i % 30 == 0 {
                    let (_, blob) = snapshot::capture(
                        backend,
                        &id,
                        &SandboxPath::root(),
                        Vec::new(),
                        &PackOptions::default(),
                    )
                    .await
                    .unwrap();
                    let tar = zstd::decode_all(&blob[..]).unwrap();
                    assert!(
                        !contains(&tar, b"outside-secret-bytes"),
                        "export followed the link"
                    );
                }
                operations += 1;
            }
            swapper.kill().await.unwrap();
            let _ = swapper.wait().await;
            assert_eq!(operations, 300);
            assert!(
                written > 0 && refused > 0,
                "both states were hit: {written} written, {refused} refused"
            );
            let names: Vec<_> = std::fs::read_dir(outside.as_path())
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(
                names,
                ["secret"],
                "nothing was written outside the workspace"
            );
            assert_eq!(
                std::fs::read_to_string(outside.as_path().join("secret")).unwrap(),
                "outside-secret-bytes"
            );
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_place_workspace_is_the_template_itself_and_survives_destroy() {
    use sandcell::{ExecRequest, SandboxBackend, SandboxBackendExt, SandboxSpec};
    let dir = tempfile::tempdir().unwrap();
    let owned = dir.path().join("owned");
    std::fs::create_dir_all(&owned).unwrap();
    std::fs::write(owned.join("before.txt"), "before").unwrap();
    if rustix::process::geteuid().is_root() {
        // A root backend's sandbox writes in its template as the owner, through a view
        // of the template's owner: a template root owns is refused (see `identity.rs`).
        for path in [owned.clone(), owned.join("before.txt")] {
            std::os::unix::fs::chown(path, Some(4242), Some(4242)).unwrap();
        }
    }
    let backend = sandcell_local::LocalBackend::builder()
        .root(dir.path().join("root"))
        .template("here", &owned)
        .workspace(sandcell_local::WorkspaceStrategy::InPlace)
        .build()
        .unwrap();
    assert!(!backend.capabilities().incremental_snapshot);
    let sandbox = backend.create(&SandboxSpec::new("here")).await.unwrap();
    assert_eq!(sandbox.details["workspace"], "in_place");
    backend
        .write_string(&sandbox.id, &"sub/new.txt".parse().unwrap(), "new")
        .await
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(owned.join("sub/new.txt")).unwrap(),
        "new"
    );
    let out = backend
        .run(&sandbox.id, ExecRequest::new(["cat", "before.txt"]))
        .await
        .unwrap();
    assert_eq!(out.stdout_str(), "before");
    // A replace-import swaps contents inside the directory, not the directory itself.
    let tar = backend
        .export_tar(&sandbox.id, &sandcell::SandboxPath::root())
        .await
        .unwrap();
    backend
        .import_tar(
            &sandbox.id,
            &sandcell::SandboxPath::root(),
            tar,
            sandcell::archive::ImportOptions::replace(),
        )
        .await
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(owned.join("sub/new.txt")).unwrap(),
        "new"
    );
    backend.destroy(&sandbox.id).await.unwrap();
    assert_eq!(
        std::fs::read_to_string(owned.join("before.txt")).unwrap(),
        "before"
    );
    assert_eq!(
        std::fs::read_to_string(owned.join("sub/new.txt")).unwrap(),
        "new"
    );
}

/// A directory that comes from the template (an overlay's lower layer, where rename(2)
/// answers EXDEV) is moved whole: contents, links and modes, the source gone, the
/// template untouched, and the change set says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_directory_renames_on_an_overlay_workspace() {
    use std::os::unix::fs::PermissionsExt;
    if !common::overlay_available() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let tpl = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(tpl.path().join("lib/sub")).unwrap();
    std::fs::write(tpl.path().join("lib/a.txt"), "a").unwrap();
    std::fs::write(tpl.path().join("lib/sub/run.sh"), "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(
        tpl.path().join("lib/sub/run.sh"),
        std::fs::Permissions::from_mode(0o750),
    )
    .unwrap();
    std::os::unix::fs::symlink("a.txt", tpl.path().join("lib/link")).unwrap();
    let backend = LocalBackend::builder()
        .root(root.path())
        .template("t", tpl.path())
        .workspace(WorkspaceStrategy::Overlay)
        .build()
        .unwrap();
    let sb = backend.create(&SandboxSpec::new("t")).await.unwrap();
    let p = |s: &str| SandboxPath::new(s).unwrap();

    backend
        .rename(&sb.id, &p("lib"), &p("moved/lib2"))
        .await
        .unwrap();
    assert_eq!(
        &backend.read(&sb.id, &p("moved/lib2/a.txt")).await.unwrap()[..],
        b"a"
    );
    let run = backend
        .stat(&sb.id, &p("moved/lib2/sub/run.sh"))
        .await
        .unwrap();
    assert_eq!(run.mode & 0o777, 0o750);
    let link = backend.stat(&sb.id, &p("moved/lib2/link")).await.unwrap();
    assert_eq!(link.symlink_target.as_deref(), Some("a.txt"));
    let gone = backend.stat(&sb.id, &p("lib")).await.unwrap_err();
    assert_eq!(gone.kind(), sandcell::ErrorKind::NotFound);
    assert!(
        tpl.path().join("lib/a.txt").exists(),
        "the template is untouched"
    );

    let (manifest, _) =
        snapshot::capture_changes(&backend, &sb.id, Vec::new(), &PackOptions::default())
            .await
            .unwrap();
    let deleted: Vec<&str> = manifest.deleted.iter().map(|p| p.as_str()).collect();
    assert_eq!(deleted, ["lib"]);
    backend.destroy(&sb.id).await.unwrap();
}

/// An overlay clone holds the source's changes only: what it changed, whiteouts of what
/// it deleted and opaque directories included, over the same template, which is not
/// copied. A copy clone copies the workspace whole, and neither follows a link out.
#[tokio::test]
async fn an_overlay_clone_holds_only_the_changes() {
    if !common::overlay_available() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let tpl = template();
    std::fs::create_dir(tpl.path().join("docs")).unwrap();
    std::fs::write(tpl.path().join("docs/old.md"), "old").unwrap();
    for n in 0..200 {
        std::fs::write(
            tpl.path().join(format!("src/f{n}.rs")),
            "// template file\n",
        )
        .unwrap();
    }
    let secret = tempfile::tempdir().unwrap();
    std::fs::write(secret.path().join("secret"), "host secret").unwrap();
    let backend = LocalBackend::builder()
        .root(root.path())
        .template("t", tpl.path())
        .workspace(WorkspaceStrategy::Overlay)
        .build()
        .unwrap();
    let source = backend.create(&SandboxSpec::new("t")).await.unwrap();
    let id = &source.id;
    backend
        .write_string(id, &"src/lib.rs".parse().unwrap(), "// changed\n")
        .await
        .unwrap();
    backend
        .remove(id, &"src/f7.rs".parse().unwrap(), false)
        .await
        .unwrap();
    // Replaced whole: an opaque directory in the upper layer.
    backend
        .remove(id, &"docs".parse().unwrap(), true)
        .await
        .unwrap();
    backend
        .write_string(id, &"docs/new.md".parse().unwrap(), "new")
        .await
        .unwrap();
    let out = backend
        .run_shell(id, &format!("ln -s {} leak", secret.path().display()))
        .await
        .unwrap();
    assert!(out.success(), "{out:?}");

    let clone = backend.clone_sandbox(id, Default::default()).await.unwrap();
    assert_eq!(clone.details["workspace"], "overlay");
    let read = |path: &str| {
        let (backend, clone) = (backend.clone(), clone.id.clone());
        let path: SandboxPath = path.parse().unwrap();
        async move { backend.read_to_string(&clone, &path).await }
    };
    assert_eq!(read("src/lib.rs").await.unwrap(), "// changed\n");
    assert_eq!(read("src/f8.rs").await.unwrap(), "// template file\n");
    assert_eq!(
        read("src/f7.rs").await.unwrap_err().kind(),
        sandcell::ErrorKind::NotFound
    );
    assert_eq!(read("docs/new.md").await.unwrap(), "new");
    assert_eq!(
        read("docs/old.md").await.unwrap_err().kind(),
        sandcell::ErrorKind::NotFound
    );
    let link = backend
        .stat(&clone.id, &"leak".parse().unwrap())
        .await
        .unwrap();
    assert_eq!(
        link.kind,
        sandcell::FileKind::Symlink,
        "a link is copied as a link"
    );

    // Only the changes were taken: the clone's upper layer and the frozen layers it
    // shares with its source hold a handful of entries, not the template's two hundred
    // files.
    let clone_dir = root.path().join("sandboxes").join(clone.id.as_str());
    let mut stack = vec![clone_dir.join("upper")];
    for name in std::fs::read_to_string(clone_dir.join("layers"))
        .unwrap_or_default()
        .lines()
    {
        stack.push(root.path().join("layers").join(name));
    }
    let mut count = 0;
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            count += 1;
            if entry.file_type().unwrap().is_dir() {
                stack.push(entry.path());
            }
        }
    }
    assert!(count <= 8, "the clone's upper layer holds {count} entries");
    backend.destroy(id).await.unwrap();
    backend.destroy(&clone.id).await.unwrap();
    assert_eq!(
        std::fs::read_dir(root.path().join("sandboxes"))
            .unwrap()
            .count(),
        0
    );
}

/// ADVERSARIAL 47: a sandbox process may set `user.overlay.opaque` on a template
/// directory it sees; that is its own extended attribute, not overlay metadata, so its
/// change set must not claim the template's files there are deleted.
#[tokio::test]
async fn a_user_opaque_attribute_is_not_overlay_metadata() {
    if !common::overlay_available() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let tpl = template();
    let backend = LocalBackend::builder()
        .root(root.path())
        .template("t", tpl.path())
        .workspace(WorkspaceStrategy::Overlay)
        .build()
        .unwrap();
    let sb = backend.create(&SandboxSpec::new("t")).await.unwrap();
    // Touching a file copies `src` up; the attribute then lands on the upper copy.
    let set = backend
        .run_shell(
            &sb.id,
            "touch src/new.rs && python3 -c 'import os; os.setxattr(\"src\", \"user.overlay.opaque\", b\"y\"); print(os.getxattr(\"src\", \"user.overlay.opaque\"))'",
        )
        .await
        .unwrap();
    let set_it = set.success();
    let changes = backend.export_changes(&sb.id).await.unwrap();
    backend.destroy(&sb.id).await.unwrap();
    if !set_it {
        // Without python3 the attack cannot be staged; CI has it.
        sandcell::testing::require_or_skip("PYTHON", "python3", Err(set.stderr_str().into()));
        return;
    }
    assert_eq!(set.stdout_str(), "b'y'\n", "the attribute was set");
    assert!(
        changes.deleted.is_empty(),
        "a user.overlay.opaque mark deleted {:?} from the change set",
        changes.deleted
    );
}

/// ADVERSARIAL 37: a namespaced sandbox's mount table does not tell it where its files
/// are on the host. overlayfs shows its options as given, so layers named by host path
/// showed the backend's root (and the sandbox's directory in it) to the sandbox; with
/// a disk of its own, its temp directory's mount names nothing of the host either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespaced_sandbox_mount_table_names_no_host_path() {
    if !common::overlay_available() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let builder = LocalBackend::builder()
        .root(root.path())
        .workspace(WorkspaceStrategy::Overlay);
    let Some(backend) = common::build_at(builder, sandcell_local::Isolation::Namespaces) else {
        return;
    };
    let host_root = std::fs::canonicalize(root.path()).unwrap();
    let host_root = host_root.to_string_lossy();
    let mut specs = vec![("no disk limit", SandboxSpec::default())];
    if backend.capabilities().disk_limit {
        let limited = SandboxSpec::default().limits(sandcell::Limits::new().disk_bytes(64 << 20));
        specs.push(("a disk limit", limited));
    }
    for (what, spec) in specs {
        let sb = backend.create(&spec).await.unwrap();
        let seen = backend
            .run_shell(&sb.id, "cat /proc/self/mountinfo")
            .await
            .unwrap();
        backend.destroy(&sb.id).await.unwrap();
        let table = seen.stdout_str();
        assert!(seen.success() && table.contains(" /workspace "), "{seen:?}");
        let workspace = table
            .lines()
            .find(|line| line.contains(" /workspace "))
            .unwrap();
        assert!(
            !workspace.contains(&*host_root),
            "with {what}, the workspace's mount names the host path: {workspace}"
        );
        if what == "a disk limit" {
            assert!(
                !table.contains(&*host_root),
                "with {what}, the mount table names the host path:\n{table}"
            );
        }
    }
}
