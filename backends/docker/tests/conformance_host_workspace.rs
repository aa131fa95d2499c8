//! The conformance suite against a real engine through the agent, with the template's
//! workspace a host directory (an overlay per sandbox over a shared project, seed 004)
//! instead of the image's content. Each case gets its own project and runtime
//! directory, and must leave no workspace layers behind.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use sandcell::testing::conformance::Fixture;
use sandcell_docker::{DockerBackend, ImageSpec};

async fn setup() -> Option<Fixture> {
    if !common::engine_available().await {
        return None;
    }
    common::images().await;
    let dir = tempfile::tempdir().unwrap();
    let template = dir.path().join("project");
    // A file and a nested one, so template-file cases (snapshot deletions) have some.
    common::owned_project(
        &template,
        &[("README", "a shared project\n"), ("src/main.txt", "main\n")],
    );
    let runtime = dir.path().join("runtime");
    let mut builder = DockerBackend::builder()
        .template("default", ImageSpec::pull(common::USER_IMAGE))
        .host_workspace("default", &template)
        .runtime_dir(&runtime)
        .agent(common::agent_binary());
    if let Some(r) = std::env::var("SANDCELL_TEST_DOCKER_RUNTIME")
        .ok()
        .filter(|r| !r.is_empty())
    {
        builder = builder.runtime(r);
    }
    let backend = builder.build().unwrap();
    let workspaces = runtime.join("workspaces");
    Some(
        Fixture::new(backend)
            .check_after(move || {
                let left: Vec<_> = std::fs::read_dir(&workspaces)
                    .map(|d| d.flatten().map(|e| e.file_name()).collect())
                    .unwrap_or_default();
                assert!(left.is_empty(), "workspace layers left behind: {left:?}");
                let project = std::fs::read_dir(&template).unwrap().count();
                assert_eq!(project, 2, "the project is never written");
            })
            .guard(dir),
    )
}

sandcell::conformance_tests!(setup);
