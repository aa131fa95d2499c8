//! Shared set-up for the Docker tests: the engine probe, the images every test builds
//! locally (no registry is reachable), and the agent binary.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use sandcell::SandboxBackend;
use sandcell_docker::{DockerBackend, ImageSpec};

/// The label every test sandbox carries, so the leak check can find them.
pub(crate) const TEST_LABEL: (&str, &str) = ("sandcell.test", "docker");
// Each test binary uses some of these.
#[allow(unused_imports)]
pub(crate) use sandcell_docker::testing::{engine_available, BASE_IMAGE, USER_IMAGE};

/// The test images ([`sandcell_docker::testing::test_images`]).
pub(crate) async fn images() {
    sandcell_docker::testing::test_images()
        .await
        .expect("importing the busybox image and building the user image");
}

/// The static agent binary ([`sandcell_docker::testing::agent_binary`]).
pub(crate) fn agent_binary() -> PathBuf {
    sandcell_docker::testing::agent_binary().expect("the static agent")
}

/// What the backend marks its host workspaces with: the engine's data root.
pub(crate) async fn engine_id() -> String {
    let probe = DockerBackend::builder()
        .build()
        .expect("a default builder builds");
    probe
        .docker()
        .info()
        .await
        .unwrap()
        .docker_root_dir
        .unwrap()
}

/// Whether the engine is Podman (through its Docker-compatible API).
pub(crate) async fn is_podman(backend: &DockerBackend) -> bool {
    let version = backend
        .docker()
        .version()
        .await
        .expect("the engine's version");
    version
        .components
        .unwrap_or_default()
        .iter()
        .any(|c| c.name.contains("Podman"))
}

/// A backend whose `default` template is the user image; with or without the agent.
pub(crate) async fn backend(with_agent: bool) -> DockerBackend {
    images().await;
    let mut builder = DockerBackend::builder().template("default", ImageSpec::pull(USER_IMAGE));
    if with_agent {
        builder = builder.agent(agent_binary());
    }
    // The OCI runtime under test, when not the engine's default (CI runs the suite
    // under gVisor's `runsc` too).
    if let Some(runtime) = std::env::var("SANDCELL_TEST_DOCKER_RUNTIME")
        .ok()
        .filter(|r| !r.is_empty())
    {
        builder = builder.runtime(runtime);
    }
    builder.build().unwrap()
}

/// Test containers still on the engine (any `sandcell.test` label).
pub(crate) async fn leftovers(backend: &DockerBackend) -> Vec<String> {
    let selector = sandcell::LabelSelector::new().label_present(TEST_LABEL.0);
    backend
        .list(&selector)
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.id.to_string())
        .collect()
}

/// Destroys a sandbox when dropped, so a failing assertion leaves nothing behind.
pub(crate) struct Guard {
    backend: DockerBackend,
    id: sandcell::SandboxId,
}

impl Guard {
    pub(crate) fn new(backend: &DockerBackend, id: &sandcell::SandboxId) -> Self {
        Guard {
            backend: backend.clone(),
            id: id.clone(),
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let (backend, id) = (self.backend.clone(), self.id.clone());
        // Drop may run inside the test's runtime: destroy on a thread with its own.
        let _ = std::thread::spawn(move || {
            if let Ok(rt) = tokio::runtime::Runtime::new() {
                let _ = rt.block_on(backend.destroy(&id));
            }
        })
        .join();
    }
}

/// A project directory for host-directory workspaces holding `files` (path, contents),
/// owned, directories and all, by the image's user (uid 1000), as an agent's checkout is.
pub(crate) fn owned_project(dir: &Path, files: &[(&str, &str)]) {
    std::fs::create_dir_all(dir).unwrap();
    for (path, contents) in files {
        let path = dir.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, contents).unwrap();
    }
    let mut pending = vec![dir.to_path_buf()];
    while let Some(p) = pending.pop() {
        std::os::unix::fs::chown(&p, Some(1000), Some(1000)).unwrap();
        if p.is_dir() {
            pending.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
        }
    }
}
