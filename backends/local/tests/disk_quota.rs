//! Disk limits on the local backend (issue 46, item 5), pinned to
//! `../shared/ADVERSARIAL.md` case 40 (sandboxes without limits: one took 3 GB of the
//! host's root file system): a sandbox with `Limits::disk_bytes` writes to a file
//! system of its own of that size, filled here from inside until it refuses; and
//! nothing of it (a mount, a loop device, the image) outlives its destroy, a failed
//! create, or a host restart.
//!
//! These need root, `/dev/loop-control` and `mke2fs`; without them the tests skip
//! loudly, unless `SANDCELL_REQUIRE_DISK_QUOTA=1` (set by CI), where they fail.

// Test helpers outside #[test] fns report failures by panicking too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use sandcell::{ErrorKind, Limits, SandboxBackend, SandboxBackendExt, SandboxPath, SandboxSpec};
use sandcell_local::{Isolation, LocalBackend, WorkspaceStrategy};

/// The limit the filling tests give a sandbox.
const CAP: u64 = 64 << 20;
/// What they try to write: well past it.
const FILL: u64 = 200 << 20;

/// A backend over `root` that gives disk limits, or `None` (loudly) where this host
/// cannot, unless `SANDCELL_REQUIRE_DISK_QUOTA=1`.
fn backend(root: &Path, strategy: WorkspaceStrategy, isolation: Isolation) -> Option<LocalBackend> {
    match LocalBackend::builder()
        .root(root)
        .workspace(strategy)
        .isolation(isolation)
        .build()
    {
        Ok(b) => with_disk_limits(b),
        Err(e) if isolation == Isolation::Namespaces => {
            assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
            sandcell::testing::require_or_skip(
                "NAMESPACES",
                "namespace isolation",
                Err(e.to_string()),
            );
            None
        }
        Err(e) => panic!("{e}"),
    }
}

/// `backend` where it claims disk limits; else `None`, as [`backend`] decides.
fn with_disk_limits(backend: LocalBackend) -> Option<LocalBackend> {
    let probe = if backend.capabilities().disk_limit {
        Ok(())
    } else {
        Err(
            "the backend does not claim Capabilities::disk_limit (it needs root, \
             /dev/loop-control and mke2fs)"
                .to_owned(),
        )
    };
    sandcell::testing::require_or_skip("DISK_QUOTA", "disk limits", probe).then_some(backend)
}

fn capped(bytes: u64) -> SandboxSpec {
    SandboxSpec::default().limits(Limits::new().disk_bytes(bytes))
}

/// The bytes the files beneath `dir` take on `dir`'s own file system (allocated
/// blocks, not apparent sizes), not descending into anything mounted beneath it: what
/// the host's disk gave for them.
fn host_bytes(dir: &Path) -> u64 {
    let device = std::fs::symlink_metadata(dir).unwrap().dev();
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(at) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&at) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(meta) = entry.path().symlink_metadata() else {
                continue;
            };
            if meta.dev() != device {
                continue;
            }
            total += meta.blocks() * 512;
            if meta.is_dir() {
                stack.push(entry.path());
            }
        }
    }
    total
}

/// Mount points beneath `dir`, from this process's mount table.
fn mounts_beneath(dir: &Path) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .filter(|point| Path::new(point).starts_with(dir))
        .map(str::to_owned)
        .collect()
}

/// Loop devices attached to a file beneath `dir`, as `losetup -a` finds them (sysfs).
fn loops_beneath(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/sys/block").unwrap().flatten() {
        let backing = entry.path().join("loop/backing_file");
        if let Ok(file) = std::fs::read_to_string(&backing) {
            if Path::new(file.trim()).starts_with(dir) {
                found.push(format!(
                    "{}: {}",
                    entry.file_name().to_string_lossy(),
                    file.trim()
                ));
            }
        }
    }
    found
}

/// Checks that nothing of any sandbox under `root` is left: no mount, no loop device
/// (the kernel detaches an autoclear device in the background: waited for, briefly),
/// no sandbox directory.
async fn nothing_left(root: &Path) {
    assert_eq!(mounts_beneath(root), Vec::<String>::new(), "mounts left");
    let mut loops = loops_beneath(root);
    for _ in 0..100 {
        if loops.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        loops = loops_beneath(root);
    }
    assert_eq!(loops, Vec::<String>::new(), "loop devices left");
    let sandboxes = std::fs::read_dir(root.join("sandboxes")).unwrap().count();
    assert_eq!(sandboxes, 0, "sandbox directories left");
}

/// Fills a 64 MiB sandbox from inside, in its workspace and its temp directory, and
/// through the backend: every write stops short of the limit with `ENOSPC` (a
/// `LimitExceeded` error through the backend), and the host's disk gives no more than
/// the limit. Then destroy leaves no mount, loop device or image. For overlay and
/// copied workspaces, and at `Isolation::Namespaces`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case40_a_sandbox_cannot_write_past_its_disk_limit() {
    let cases = [
        (WorkspaceStrategy::Overlay, Isolation::Landlock),
        (WorkspaceStrategy::Copy, Isolation::Landlock),
        (WorkspaceStrategy::Overlay, Isolation::Namespaces),
    ];
    for (strategy, isolation) in cases {
        let what = format!("{strategy:?} at {isolation:?}");
        let root = tempfile::tempdir().unwrap();
        let Some(backend) = backend(root.path(), strategy, isolation) else {
            continue;
        };
        let before = host_bytes(root.path());
        let sb = backend.create(&capped(CAP)).await.unwrap();
        let reading = backend.metrics(&sb.id).await.unwrap();
        assert_eq!(
            reading.disk_limit_bytes,
            Some(CAP),
            "metrics name the limit"
        );
        for target in ["big", "$TMPDIR/big"] {
            let out = backend
                .run_shell(
                    &sb.id,
                    &format!(
                        "head -c {FILL} /dev/zero > {target}; s=$?; wc -c < {target}; exit $s"
                    ),
                )
                .await
                .unwrap();
            assert!(
                !out.success(),
                "{what}: writing {FILL} bytes to {target} succeeded"
            );
            assert!(
                out.stderr_str().contains("No space left on device"),
                "{what}: {target}: {}",
                out.stderr_str()
            );
            let written: u64 = out.stdout_str().trim().parse().unwrap();
            assert!(
                written < CAP,
                "{what}: {target} took {written} bytes, past the {CAP}-byte limit"
            );
            let used = host_bytes(root.path()) - before;
            assert!(
                used <= CAP + (1 << 20),
                "{what}: the host's disk gave {used} bytes for a {CAP}-byte limit"
            );
            backend
                .run_shell(&sb.id, &format!("rm {target}"))
                .await
                .unwrap();
            // What the sandbox frees, the host gets back.
            let used = host_bytes(root.path()) - before;
            assert!(
                used < 8 << 20,
                "{what}: the host's disk still gives {used} bytes once {target} is gone"
            );
        }
        // Through the backend's own file operations: a typed limit, not a failure.
        let err = backend
            .write(
                &sb.id,
                &SandboxPath::new("api.bin").unwrap(),
                vec![0u8; (CAP + (8 << 20)) as usize].into(),
            )
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::LimitExceeded, "{what}: {err}");
        assert!(
            !err.to_string().contains(&*root.path().to_string_lossy()),
            "{what}: the error names a host path: {err}"
        );
        // Room again once the file is gone.
        backend
            .remove(&sb.id, &SandboxPath::new("api.bin").unwrap(), false)
            .await
            .ok();
        let out = backend
            .run_shell(&sb.id, "head -c 1048576 /dev/zero > small && wc -c < small")
            .await
            .unwrap();
        assert_eq!(
            out.stdout_str().trim(),
            "1048576",
            "{what}: {}",
            out.stderr_str()
        );

        assert!(!mounts_beneath(root.path()).is_empty());
        assert_eq!(
            loops_beneath(root.path()).len(),
            1,
            "{what}: one loop device"
        );
        backend.destroy(&sb.id).await.unwrap();
        nothing_left(root.path()).await;
    }
}

/// A create that fails once the sandbox's disk is made (a copied template larger than
/// the limit) is `LimitExceeded` and leaves nothing: no mount, loop device or image.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_create_leaves_no_disk_behind() {
    let root = tempfile::tempdir().unwrap();
    let template = tempfile::tempdir().unwrap();
    std::fs::write(template.path().join("large.bin"), vec![7u8; 3 << 20]).unwrap();
    let built = LocalBackend::builder()
        .root(root.path())
        .template("large", template.path())
        .workspace(WorkspaceStrategy::Copy)
        .build()
        .unwrap();
    let Some(backend) = with_disk_limits(built) else {
        return;
    };
    let spec = SandboxSpec::new("large").limits(Limits::new().disk_bytes(2 << 20));
    let err = backend.create(&spec).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LimitExceeded, "{err}");
    nothing_left(root.path()).await;
    // And the template fits a disk large enough for it.
    let spec = SandboxSpec::new("large").limits(Limits::new().disk_bytes(8 << 20));
    let sb = backend.create(&spec).await.unwrap();
    let read = backend
        .read(&sb.id, &SandboxPath::new("large.bin").unwrap())
        .await
        .unwrap();
    assert_eq!(read.len(), 3 << 20);
    backend.destroy(&sb.id).await.unwrap();
    nothing_left(root.path()).await;
}

/// After a host restart nothing is mounted or attached any more: destroy still removes
/// the sandbox, image and all. (The restart is played by unmounting everything beneath
/// the sandbox directory, which takes the loop device with it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destroy_after_a_host_restart_removes_everything() {
    let root = tempfile::tempdir().unwrap();
    let Some(backend) = backend(root.path(), WorkspaceStrategy::Overlay, Isolation::Landlock)
    else {
        return;
    };
    let sb = backend.create(&capped(CAP)).await.unwrap();
    backend
        .write_string(&sb.id, &"kept.txt".parse().unwrap(), "x")
        .await
        .unwrap();
    let mut points = mounts_beneath(root.path());
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for point in points {
        let status = std::process::Command::new("umount")
            .args(["-l", &point])
            .status()
            .unwrap();
        assert!(status.success(), "umount -l {point}");
    }
    // A new backend over the same root, as after the restart.
    let after = LocalBackend::builder().root(root.path()).build().unwrap();
    after.destroy(&sb.id).await.unwrap();
    nothing_left(root.path()).await;
}

/// A clone of a sandbox with a disk limit has a disk of its own with the same limit
/// and the source's files (copied, never frozen into a layer outside the limit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clone_gets_a_disk_of_its_own() {
    let root = tempfile::tempdir().unwrap();
    let Some(backend) = backend(root.path(), WorkspaceStrategy::Overlay, Isolation::Landlock)
    else {
        return;
    };
    let source = backend.create(&capped(CAP)).await.unwrap();
    let out = backend
        .run_shell(&source.id, "head -c 10485760 /dev/zero > ten")
        .await
        .unwrap();
    assert!(out.success(), "{}", out.stderr_str());
    let clone = backend
        .clone_sandbox(&source.id, Default::default())
        .await
        .unwrap();
    assert!(
        !root.path().join("layers").exists()
            || std::fs::read_dir(root.path().join("layers"))
                .unwrap()
                .flatten()
                .all(|e| e.file_name() == ".lock"),
        "no layer was frozen out of the source's disk"
    );
    assert_eq!(loops_beneath(root.path()).len(), 2, "a loop device each");
    let out = backend
        .run_shell(
            &clone.id,
            &format!("wc -c < ten; head -c {FILL} /dev/zero > big"),
        )
        .await
        .unwrap();
    assert_eq!(out.stdout_str().trim(), "10485760");
    assert!(!out.success(), "the clone wrote past its limit");
    // The source kept its own room.
    let out = backend
        .run_shell(&source.id, "head -c 20971520 /dev/zero > twenty")
        .await
        .unwrap();
    assert!(out.success(), "{}", out.stderr_str());
    for id in [&source.id, &clone.id] {
        backend.destroy(id).await.unwrap();
    }
    nothing_left(root.path()).await;
}

/// Where a workspace cannot be held by a disk of the sandbox's own (an in-place
/// workspace is the template directory itself), a disk limit is refused as
/// `Unsupported`, from a spec and from the backend's defaults alike, and nothing is
/// made. This holds with or without root.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_place_workspaces_refuse_a_disk_limit() {
    let root = tempfile::tempdir().unwrap();
    let template = tempfile::tempdir().unwrap();
    let backend = LocalBackend::builder()
        .root(root.path())
        .template("t", template.path())
        .workspace(WorkspaceStrategy::InPlace)
        .build()
        .unwrap();
    assert!(!backend.capabilities().disk_limit);
    let err = backend
        .create(&SandboxSpec::new("t").limits(Limits::new().disk_bytes(CAP)))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    assert!(err.to_string().contains("limits.disk_bytes"), "{err}");

    let defaulted = LocalBackend::builder()
        .root(root.path())
        .template("t", template.path())
        .workspace(WorkspaceStrategy::InPlace)
        .default_limits(Limits::new().disk_bytes(CAP))
        .build()
        .unwrap();
    let err = defaulted.create(&SandboxSpec::new("t")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    assert!(err.to_string().contains("default_limits"), "{err}");
    assert_eq!(
        std::fs::read_dir(root.path().join("sandboxes"))
            .unwrap()
            .count(),
        0
    );
}

/// A disk limit too small to hold a file system is `InvalidInput`, and nothing is made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_limit_below_the_smallest_disk_is_invalid() {
    let root = tempfile::tempdir().unwrap();
    let Some(backend) = backend(root.path(), WorkspaceStrategy::Overlay, Isolation::Landlock)
    else {
        return;
    };
    let err = backend.create(&capped(4096)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    nothing_left(root.path()).await;
}

/// ADVERSARIAL 40: a clone that copies its source's upper layer (a source with a disk
/// of its own) does not make other sandboxes' destroys wait for the copy: it held the
/// lock every destroy and clone share for as long as the copy took (a tenant's
/// 200,000 files held another tenant's destroys for 9 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clone_copying_a_layer_holds_up_no_other_destroy() {
    let root = tempfile::tempdir().unwrap();
    let Some(backend) = backend(root.path(), WorkspaceStrategy::Overlay, Isolation::Landlock)
    else {
        return;
    };
    let source = backend.create(&capped(1 << 30)).await.unwrap();
    let out = backend
        .run_shell(
            &source.id,
            "mkdir many && cd many && seq 1 40000 | xargs touch",
        )
        .await
        .unwrap();
    assert!(out.success(), "{}", out.stderr_str());
    let other = backend.create(&SandboxSpec::default()).await.unwrap();

    let cloning = tokio::spawn({
        let (backend, id) = (backend.clone(), source.id.clone());
        async move {
            let clone = backend.clone_sandbox(&id, Default::default()).await;
            (clone, std::time::Instant::now())
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    backend.destroy(&other.id).await.unwrap();
    let destroyed = std::time::Instant::now();
    let (clone, cloned) = cloning.await.unwrap();
    let clone = clone.unwrap();
    assert!(
        destroyed < cloned,
        "the destroy waited for the clone's copy ({:?} after it)",
        destroyed - cloned
    );
    let out = backend
        .run_shell(&clone.id, "ls many | wc -l")
        .await
        .unwrap();
    assert_eq!(out.stdout_str().trim(), "40000", "the clone is whole");
    for id in [&source.id, &clone.id] {
        backend.destroy(id).await.unwrap();
    }
    nothing_left(root.path()).await;
}

/// A sandbox on a disk of its own takes an archive into its workspace's root, as a
/// snapshot's restore does, at every isolation level, in a root only root may enter
/// (as `sandcell-server` makes it). Host-side work runs as the sandbox owner: under
/// `Namespaces` the root stayed `0700`, and every restore failed to make its staging
/// directory (permission denied).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_archive_restores_into_the_root_of_a_sandbox_with_a_disk() {
    use std::os::unix::fs::PermissionsExt;
    for isolation in [Isolation::Landlock, Isolation::Namespaces] {
        let root = tempfile::tempdir().unwrap();
        std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let Some(backend) = backend(root.path(), WorkspaceStrategy::Overlay, isolation) else {
            continue;
        };
        let source = backend.create(&capped(CAP)).await.unwrap().id;
        backend
            .write(&source, &"kept.txt".parse().unwrap(), "kept".into())
            .await
            .unwrap();
        let tar = backend
            .export_tar(&source, &SandboxPath::root())
            .await
            .unwrap();
        let restored = backend.create(&capped(CAP)).await.unwrap().id;
        backend
            .import_tar(
                &restored,
                &SandboxPath::root(),
                tar,
                sandcell::archive::ImportOptions::replace(),
            )
            .await
            .unwrap_or_else(|e| panic!("{isolation:?}: {e}"));
        let read = backend
            .read(&restored, &"kept.txt".parse().unwrap())
            .await
            .unwrap();
        assert_eq!(read, "kept", "{isolation:?}");
        for id in [source, restored] {
            backend.destroy(&id).await.unwrap();
        }
        nothing_left(root.path()).await;
    }
}
