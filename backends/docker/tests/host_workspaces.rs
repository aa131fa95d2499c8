//! Host-directory workspaces (seed 004 on containers): sandboxes of one template share a
//! host directory as the read-only lower layer of an overlay, each with a private upper
//! layer bind-mounted at its workspace.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use futures::TryStreamExt;
use sandcell::{ErrorKind, SandboxBackend, SandboxBackendExt, SandboxSpec};
use sandcell_docker::{DockerBackend, ImageSpec};

mod common;

fn spec() -> SandboxSpec {
    SandboxSpec::default().label(common::TEST_LABEL.0, "host-workspaces")
}

/// A project with a file at the top and one nested.
fn project(dir: &Path) {
    common::owned_project(dir, &[("a.txt", "shared"), ("sub/b.txt", "b")]);
}

fn mounted(path: &Path) -> bool {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let path = path.to_string_lossy();
    table
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(path.as_ref()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_on_one_project_share_its_files_and_never_each_others_writes() {
    if !common::engine_available().await {
        return;
    }
    common::images().await;
    let dir = tempfile::tempdir().unwrap();
    let template = dir.path().join("project");
    project(&template);
    let runtime = dir.path().join("runtime");
    let backend = DockerBackend::builder()
        .template("default", ImageSpec::pull(common::USER_IMAGE))
        .host_workspace("default", &template)
        .runtime_dir(&runtime)
        .agent(common::agent_binary())
        .build()
        .unwrap();
    let one = backend.create(&spec()).await.unwrap();
    let _g1 = common::Guard::new(&backend, &one.id);
    let two = backend.create(&spec()).await.unwrap();
    let _g2 = common::Guard::new(&backend, &two.id);
    assert_eq!(
        one.details.get("workspace").map(String::as_str),
        Some("overlay")
    );
    let seen = backend.inspect(&one.id).await.unwrap();
    assert_eq!(
        seen.details.get("workspace").map(String::as_str),
        Some("overlay")
    );

    let a = "a.txt".parse().unwrap();
    assert_eq!(backend.read_to_string(&two.id, &a).await.unwrap(), "shared");
    backend.write_string(&one.id, &a, "mine").await.unwrap();
    backend
        .write_string(&one.id, &"new.txt".parse().unwrap(), "added")
        .await
        .unwrap();
    backend
        .remove(&one.id, &"sub/b.txt".parse().unwrap(), false)
        .await
        .unwrap();
    let inside = backend
        .run_shell(&two.id, "cat a.txt; echo; ls; ls sub")
        .await
        .unwrap();
    assert_eq!(
        inside.stdout_str(),
        "shared\na.txt\nsub\nb.txt\n",
        "the other agent sees none of it"
    );
    assert_eq!(
        std::fs::read_to_string(template.join("a.txt")).unwrap(),
        "shared"
    );
    assert!(!template.join("new.txt").exists());
    assert!(
        template.join("sub/b.txt").exists(),
        "the project is never written"
    );

    // The upper layer is the change set.
    let changes = backend.export_changes(&one.id).await.unwrap();
    assert_eq!(changes.deleted, vec!["sub/b.txt".parse().unwrap()]);
    let tar: Vec<u8> = changes
        .tar
        .map_ok(|b| b.to_vec())
        .try_concat()
        .await
        .unwrap();
    let mut names: Vec<String> = tar::Archive::new(tar.as_slice())
        .entries()
        .unwrap()
        .map(|e| e.unwrap().path().unwrap().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".txt"))
        .collect();
    names.sort();
    assert_eq!(names, ["a.txt", "new.txt"]);

    // A clone copies the upper layer (the deletion's whiteout too) over the same
    // project, owned as before: independent both ways.
    let copy = backend
        .clone_sandbox(&one.id, Default::default())
        .await
        .unwrap();
    let _g3 = common::Guard::new(&backend, &copy.id);
    assert_eq!(
        copy.details.get("workspace").map(String::as_str),
        Some("overlay")
    );
    let inside = backend
        .run_shell(
            &copy.id,
            "cat a.txt new.txt; echo; ls sub | wc -l; id -u; stat -c %u a.txt",
        )
        .await
        .unwrap();
    assert_eq!(
        inside.stdout_str(),
        "mineadded\n0\n1000\n1000\n",
        "{inside:?}"
    );
    backend
        .write_string(&copy.id, &a, "the clone's")
        .await
        .unwrap();
    backend
        .write_string(&one.id, &"after.txt".parse().unwrap(), "later")
        .await
        .unwrap();
    assert_eq!(backend.read_to_string(&one.id, &a).await.unwrap(), "mine");
    let absent = backend
        .read(&copy.id, &"after.txt".parse().unwrap())
        .await
        .err()
        .unwrap();
    assert_eq!(absent.kind(), ErrorKind::NotFound, "{absent}");
    assert_eq!(
        std::fs::read_to_string(template.join("a.txt")).unwrap(),
        "shared"
    );
    let copy_root = runtime.join("workspaces").join(copy.id.as_str());
    assert!(mounted(&copy_root.join("merged")));
    backend.destroy(&copy.id).await.unwrap();
    assert!(!copy_root.exists());
    assert_eq!(backend.read_to_string(&one.id, &a).await.unwrap(), "mine");

    // A reset restarts the container; the upper layer stays.
    backend.reset(&one.id).await.unwrap();
    assert_eq!(backend.read_to_string(&one.id, &a).await.unwrap(), "mine");

    // Destroy unmounts the view and deletes the layers.
    let merged = runtime
        .join("workspaces")
        .join(one.id.as_str())
        .join("merged");
    assert!(mounted(&merged));
    backend.destroy(&one.id).await.unwrap();
    backend.destroy(&two.id).await.unwrap();
    assert!(!mounted(&merged));
    assert!(!runtime.join("workspaces").join(one.id.as_str()).exists());
    assert!(!runtime.join("workspaces").join(two.id.as_str()).exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_workspace_mistakes_are_refused_and_images_have_no_changes() {
    if !common::engine_available().await {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let unknown = DockerBackend::builder()
        .host_workspace("nope", dir.path())
        .build()
        .unwrap_err();
    assert_eq!(unknown.kind(), ErrorKind::InvalidInput, "{unknown}");
    std::fs::write(dir.path().join("file"), "x").unwrap();
    // As the local backend answers a template directory: missing is `NotFound`.
    for (bad, kind) in [
        (dir.path().join("missing"), ErrorKind::NotFound),
        (dir.path().join("file"), ErrorKind::InvalidInput),
    ] {
        let err = DockerBackend::builder()
            .template("default", ImageSpec::pull(common::USER_IMAGE))
            .host_workspace("default", &bad)
            .build()
            .unwrap_err();
        assert_eq!(err.kind(), kind, "{err}");
    }
    let backend = common::backend(true).await;
    let sandbox = backend.create(&spec()).await.unwrap();
    let _guard = common::Guard::new(&backend, &sandbox.id);
    assert_eq!(
        sandbox.details.get("workspace").map(String::as_str),
        Some("image")
    );
    let err = backend.export_changes(&sandbox.id).await.err().unwrap();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    assert!(err.to_string().contains("host_workspace"), "{err}");
}

/// A crash between mount and container create leaves a mounted workspace without a
/// container: the next process's first list (a manager's reconcile lists) removes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workspace_a_crash_left_is_swept_by_the_next_process() {
    if !common::engine_available().await {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let template = dir.path().join("project");
    project(&template);
    let runtime = dir.path().join("runtime");
    let root = runtime.join("workspaces").join("docker-crashed0000");
    let merged = root.join("merged");
    std::fs::create_dir_all(&merged).unwrap();
    sandcell::raw::overlay::mount(&template, &root.join("upper"), &root.join("work"), &merged)
        .unwrap();
    assert!(mounted(&merged));
    // Marked as this engine's, as the backend marks those it mounts; another program's
    // on another engine (sharing the runtime directory) is not this one's to sweep.
    let engine = common::engine_id().await;
    std::fs::write(root.join("engine"), &engine).unwrap();
    let theirs = runtime.join("workspaces").join("docker-elsewhere00");
    std::fs::create_dir_all(theirs.join("upper")).unwrap();
    std::fs::write(theirs.join("upper/precious.txt"), "theirs").unwrap();
    std::fs::write(theirs.join("engine"), "another-engine").unwrap();
    // Older than the grace a create in flight gets.
    let old = rustix::fs::Timespec {
        tv_sec: (std::time::SystemTime::now() - std::time::Duration::from_secs(600))
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as _,
        tv_nsec: 0,
    };
    for stale in [&root, &theirs] {
        rustix::fs::utimensat(
            rustix::fs::CWD,
            stale,
            &rustix::fs::Timestamps {
                last_access: old,
                last_modification: old,
            },
            rustix::fs::AtFlags::empty(),
        )
        .unwrap();
    }
    // A fresh one: younger than the grace, it is left alone.
    let fresh = runtime.join("workspaces").join("docker-inflight000");
    std::fs::create_dir_all(fresh.join("merged")).unwrap();
    let backend = DockerBackend::builder()
        .template("default", ImageSpec::pull(common::USER_IMAGE))
        .host_workspace("default", &template)
        .runtime_dir(&runtime)
        .build()
        .unwrap();
    backend.list(&Default::default()).await.unwrap();
    assert!(!mounted(&merged), "the stale view is unmounted");
    assert!(!root.exists(), "and its layers deleted");
    assert!(fresh.exists(), "a create in flight keeps its workspace");
    assert_eq!(
        std::fs::read_to_string(theirs.join("upper/precious.txt")).unwrap(),
        "theirs",
        "another engine's workspace is left alone (ADVERSARIAL 46)"
    );
    assert_eq!(
        std::fs::read_to_string(template.join("a.txt")).unwrap(),
        "shared"
    );
}
