//! Snapshots move between backends: a workspace with nested directories, modes, symlinks,
//! an empty directory and a 20 MB binary, snapshotted on each of Docker (with the agent;
//! image and host-directory workspaces), the local backend and the remote backend (a
//! sandcell-server over a local backend) and restored on each of the others
//! (`sandcell::testing::portable`).

// Test helpers outside #[test] fns report failures by panicking too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use sandcell::testing::portable;
use sandcell::{SandboxBackend, SandboxSpec, SessionKey};
use sandcell_local::LocalBackend;
use sandcell_remote::{FlyBackend, FlyConfig};
use sandcell_server::{serve, ServerConfig};

mod common;

const TOKEN: &str = "portable-token";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_moves_between_every_pair_of_backends() {
    if !common::engine_available().await {
        return;
    }
    // File operations (and so snapshots) on Docker go through the agent.
    let docker = common::backend(true).await;
    // And Docker with a host-directory workspace: an empty project owned by the
    // image's user, each sandbox's files in its own upper layer.
    let host_root = tempfile::tempdir().unwrap();
    let project = host_root.path().join("project");
    std::fs::create_dir(&project).unwrap();
    std::os::unix::fs::chown(&project, Some(1000), Some(1000)).unwrap();
    let docker_host = sandcell_docker::DockerBackend::builder()
        .template(
            "default",
            sandcell_docker::ImageSpec::pull(common::USER_IMAGE),
        )
        .host_workspace("default", &project)
        .runtime_dir(host_root.path().join("runtime"))
        .agent(common::agent_binary())
        .build()
        .unwrap();
    let local_root = tempfile::tempdir().unwrap();
    let local = LocalBackend::builder()
        .root(local_root.path())
        .build()
        .unwrap();
    // The remote backend, against a sandcell-server over a local backend of its own.
    let served_root = tempfile::tempdir().unwrap();
    let served: Arc<dyn SandboxBackend> = Arc::new(
        LocalBackend::builder()
            .root(served_root.path())
            .build()
            .unwrap(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        let _ = serve(
            listener,
            served,
            ServerConfig::new(TOKEN),
            std::future::pending(),
        )
        .await;
    });
    let remote = FlyBackend::connect(FlyConfig::new(&url, TOKEN))
        .await
        .unwrap();

    let docker_spec = SandboxSpec::default().label(common::TEST_LABEL.0, common::TEST_LABEL.1);
    let backends: [(&str, &dyn SandboxBackend, SandboxSpec); 4] = [
        ("docker", &docker, docker_spec.clone()),
        ("docker-host-workspace", &docker_host, docker_spec),
        ("local", &local, SandboxSpec::default()),
        ("remote", &remote, SandboxSpec::default()),
    ];
    for (from_name, from, from_spec) in &backends {
        for (to_name, to, to_spec) in &backends {
            if from_name == to_name {
                continue;
            }
            eprintln!("snapshot from {from_name} to {to_name}");
            portable::snapshot_moves(*from, from_spec.clone(), *to, to_spec.clone()).await;
        }
    }
    server.abort();
    // Its own label only: the other test of this file runs alongside.
    let left = docker
        .list(&sandcell::LabelSelector::new().label(common::TEST_LABEL.0, common::TEST_LABEL.1))
        .await
        .unwrap();
    assert!(left.is_empty(), "{left:?}");
    let workspaces = host_root.path().join("runtime").join("workspaces");
    let layers = std::fs::read_dir(&workspaces).map_or(0, |d| d.count());
    assert_eq!(
        layers,
        0,
        "host workspaces left in {}",
        workspaces.display()
    );
    assert!(local.list(&Default::default()).await.unwrap().is_empty());
}

/// A session made on Docker moves to the local backend once suspended, and back: the
/// manifest's backend is data, not a lock (`portable::session_moves`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_moves_between_docker_and_local_managers() {
    if !common::engine_available().await {
        return;
    }
    let local_root = tempfile::tempdir().unwrap();
    let (docker, local) = portable::sharing_managers(
        common::backend(true).await,
        LocalBackend::builder()
            .root(local_root.path())
            .build()
            .unwrap(),
    )
    .await;
    // A label of its own: the other test of this file runs alongside.
    let spec = SandboxSpec::default().label(common::TEST_LABEL.0, "session-moves");
    let key = SessionKey::new("acme", "moving").unwrap();
    portable::session_moves(&docker, &local, &key, &spec).await;
    portable::session_moves(&local, &docker, &key, &spec).await;
    let left = docker
        .backend()
        .list(&sandcell::LabelSelector::new().label(common::TEST_LABEL.0, "session-moves"))
        .await
        .unwrap();
    assert!(left.is_empty(), "{left:?}");
    assert!(local
        .backend()
        .list(&Default::default())
        .await
        .unwrap()
        .is_empty());
}
