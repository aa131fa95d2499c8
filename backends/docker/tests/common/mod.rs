//! Shared set-up for the Docker tests: the engine probe, the images every test builds
//! locally (no registry is reachable), and the agent binary.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use sandcell::SandboxBackend;
use sandcell_docker::{BuildStage, DockerBackend, ImageSpec};

/// The label every test sandbox carries, so the leak check can find them.
pub(crate) const TEST_LABEL: (&str, &str) = ("sandcell.test", "docker");
/// The imported busybox root file system.
pub(crate) const BASE_IMAGE: &str = "sandcell-test/busybox:latest";
/// BASE_IMAGE with a non-root `sandbox` user (built FROM it).
pub(crate) const USER_IMAGE: &str = "sandcell-test/busybox-user:latest";

/// Whether an engine answers. Without one the tests print why and skip, unless
/// `SANDCELL_REQUIRE_DOCKER=1` (set by CI), where a missing engine fails them.
pub(crate) async fn engine_available() -> bool {
    let probe = DockerBackend::builder()
        .build()
        .expect("a default builder builds");
    let ping = probe.ping().await.map_err(|e| e.to_string());
    sandcell::testing::require_or_skip("DOCKER", "a Docker engine", ping)
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

/// Imports the busybox image and builds the user image from it, once per test binary.
pub(crate) async fn images() {
    static READY: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    READY
        .get_or_init(|| async {
            let probe = DockerBackend::builder().build().unwrap();
            if probe.docker().inspect_image(USER_IMAGE).await.is_ok() {
                return;
            }
            let work = tempfile::tempdir().unwrap();
            let rootfs = work.path().join("rootfs");
            let busybox = sandcell_docker::testing::host_busybox()
                .expect("busybox is installed (apt-get install busybox-static)");
            sandcell_docker::testing::busybox_rootfs(&busybox, &rootfs).unwrap();
            let context = work.path().join("context");
            std::fs::create_dir_all(&context).unwrap();
            std::fs::write(
                context.join("Dockerfile"),
                format!("FROM {BASE_IMAGE}\nUSER sandbox\nENV PATH=/bin\n"),
            )
            .unwrap();
            // Two backends, so the import finishes before the build that needs it.
            DockerBackend::builder()
                .template("base", ImageSpec::import(&rootfs, BASE_IMAGE))
                .build()
                .unwrap()
                .prepare_images()
                .await
                .expect("importing the busybox image");
            DockerBackend::builder()
                .template(
                    "user",
                    ImageSpec::Build(BuildStage::new(&context, USER_IMAGE)),
                )
                .build()
                .unwrap()
                .prepare_images()
                .await
                .expect("building the user image");
        })
        .await;
}

/// The static agent binary: `SANDCELL_DOCKER_AGENT`, or built on demand (as `.ci/run`
/// does) into `target/agent`.
pub(crate) fn agent_binary() -> PathBuf {
    static AGENT: OnceLock<PathBuf> = OnceLock::new();
    AGENT
        .get_or_init(|| {
            if let Some(path) = std::env::var_os("SANDCELL_DOCKER_AGENT").filter(|p| !p.is_empty())
            {
                return PathBuf::from(path);
            }
            // The workspace root: the nearest ancestor with the lock file (this module is
            // also used from the root crate's tests).
            let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
                .ancestors()
                .find(|d| d.join("Cargo.lock").exists())
                .expect("inside the workspace")
                .to_path_buf();
            let target = workspace.join("target/agent");
            let status = std::process::Command::new(env!("CARGO"))
                .args([
                    "build",
                    "--release",
                    "-p",
                    "sandcell-agent",
                    "--target",
                    "x86_64-unknown-linux-gnu",
                    "--target-dir",
                ])
                .arg(&target)
                .env("RUSTFLAGS", "-C target-feature=+crt-static")
                .current_dir(&workspace)
                .status()
                .unwrap();
            assert!(
                status.success(),
                "building the static sandcell-agent failed"
            );
            target.join("x86_64-unknown-linux-gnu/release/sandcell-agent")
        })
        .clone()
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
