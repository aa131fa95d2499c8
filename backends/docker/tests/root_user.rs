//! A container is never the host's root unless the operator says so (ADVERSARIAL 37):
//! on an engine that maps a container's root to the host's (rootful, no
//! `userns-remap`), an image whose user is root runs as `UNPRIVILEGED_USER`, owning its
//! workspace, and a spec or exec request naming a uid-0 user is refused.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use sandcell::{ErrorKind, ExecRequest, SandboxBackend, SandboxBackendExt, SandboxSpec};
use sandcell_docker::{DockerBackend, ImageSpec};

fn spec(test: &str) -> SandboxSpec {
    SandboxSpec::new("root").label(common::TEST_LABEL.0, test)
}

/// A backend whose `root` template is the busybox image, whose user is root.
async fn backend(allow_host_root: bool) -> DockerBackend {
    common::images().await;
    DockerBackend::builder()
        .template("root", ImageSpec::pull(common::BASE_IMAGE))
        .agent(common::agent_binary())
        .allow_host_root(allow_host_root)
        .build()
        .unwrap()
}

/// Whether the engine makes a container's root the host's, as its own info says.
async fn root_is_host_root(backend: &DockerBackend) -> bool {
    let info = backend.docker().info().await.unwrap();
    !info.security_options.unwrap_or_default().iter().any(|o| {
        o.split(',')
            .any(|part| part == "name=rootless" || part == "name=userns")
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_root_image_runs_as_an_unprivileged_user_unless_allowed() {
    if !common::engine_available().await {
        return;
    }
    let backend = backend(false).await;
    let expected = match root_is_host_root(&backend).await {
        true => "1000000000",
        false => "0",
    };
    let sandbox = backend.create(&spec("root-user")).await.unwrap();
    let _guard = common::Guard::new(&backend, &sandbox.id);
    backend
        .write(&sandbox.id, &"mine.txt".parse().unwrap(), "x".into())
        .await
        .unwrap();
    let out = backend
        .run_shell(
            &sandbox.id,
            "id -u; id -g; stat -c %u /workspace; stat -c %u mine.txt; echo made > made.txt && echo wrote",
        )
        .await
        .unwrap();
    assert_eq!(
        out.stdout_str(),
        format!("{expected}\n{expected}\n{expected}\n{expected}\nwrote\n"),
        "{out:?}"
    );

    if expected == "0" {
        return;
    }
    // Asked for by name or number, with or without a group, root is refused.
    for user in ["root", "0", "0:0", "root:root", "00"] {
        let err = backend
            .create(&spec("root-user").user(user))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{user}: {err}");
        let err = backend
            .run(&sandbox.id, ExecRequest::shell("id -u").user(user))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{user}: {err}");
    }
    // Nor in a group that is root's, nor spelt as the engine would read as 0.
    for (user, kind) in [
        ("1234:0", ErrorKind::PermissionDenied),
        ("-0", ErrorKind::InvalidInput),
        (" 0", ErrorKind::InvalidInput),
    ] {
        let err = backend
            .create(&spec("root-user").user(user))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), kind, "{user}: {err}");
        let err = backend
            .run(&sandbox.id, ExecRequest::shell("id -u").user(user))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), kind, "{user}: {err}");
    }
    // An image whose user is root by another spelling is refused, not run.
    let context = tempfile::tempdir().unwrap();
    std::fs::write(
        context.path().join("Dockerfile"),
        format!("FROM {}\nUSER 00\n", common::BASE_IMAGE),
    )
    .unwrap();
    let spelt = DockerBackend::builder()
        .template(
            "root",
            ImageSpec::build(context.path(), "sandcell-test/busybox-user-00:latest"),
        )
        .agent(common::agent_binary())
        .build()
        .unwrap();
    let err = spelt.create(&spec("root-user")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err}");
    // Another user of the image is not root: allowed.
    let out = backend
        .run(&sandbox.id, ExecRequest::shell("id -u").user("1234"))
        .await
        .unwrap();
    assert_eq!(out.stdout_str(), "1234\n", "{out:?}");
    let mine = sandcell::LabelSelector::new().label(common::TEST_LABEL.0, "root-user");
    let left: Vec<String> = backend
        .list(&mine)
        .await
        .unwrap()
        .into_iter()
        .map(|info| info.id.to_string())
        .filter(|id| id != sandbox.id.as_str())
        .collect();
    assert!(left.is_empty(), "refused creates left containers: {left:?}");

    // The explicit opt-out.
    let allowed = self::backend(true).await;
    let sandbox = allowed.create(&spec("root-user")).await.unwrap();
    let _guard = common::Guard::new(&allowed, &sandbox.id);
    let out = allowed.run_shell(&sandbox.id, "id -u").await.unwrap();
    assert_eq!(out.stdout_str(), "0\n", "{out:?}");
}
