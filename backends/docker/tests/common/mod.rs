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
    match probe.ping().await {
        Ok(()) => true,
        Err(e) if std::env::var("SANDCELL_REQUIRE_DOCKER").as_deref() == Ok("1") => {
            panic!("a Docker engine is required (SANDCELL_REQUIRE_DOCKER=1) but unreachable: {e}")
        }
        Err(e) => {
            eprintln!(
                "SKIPPED: no Docker engine ({e}); set SANDCELL_REQUIRE_DOCKER=1 to fail instead"
            );
            false
        }
    }
}

/// A root file system with a static busybox and its applets, a `sandbox` user (uid 1000)
/// and a world-writable /tmp.
fn busybox_rootfs(dir: &Path) {
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .map(Path::new)
        .find(|p| p.exists())
        .expect("busybox is installed (apt-get install busybox-static)");
    for d in ["bin", "etc", "tmp", "home/sandbox"] {
        std::fs::create_dir_all(dir.join(d)).unwrap();
    }
    std::fs::copy(busybox, dir.join("bin/busybox")).unwrap();
    let applets = std::process::Command::new(busybox)
        .arg("--list")
        .output()
        .unwrap();
    for applet in String::from_utf8_lossy(&applets.stdout).lines() {
        if applet != "busybox" && !applet.is_empty() {
            let _ = std::os::unix::fs::symlink("busybox", dir.join("bin").join(applet));
        }
    }
    std::fs::write(
        dir.join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/sh\nsandbox:x:1000:1000:sandbox:/home/sandbox:/bin/sh\n",
    )
    .unwrap();
    std::fs::write(dir.join("etc/group"), "root:x:0:\nsandbox:x:1000:\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.join("tmp"), std::fs::Permissions::from_mode(0o1777)).unwrap();
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
            busybox_rootfs(&rootfs);
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
            let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
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
    builder.build().unwrap()
}

/// Test containers still on the engine (the leak check).
pub(crate) async fn leftovers(backend: &DockerBackend) -> Vec<String> {
    let selector = sandcell::LabelSelector::new().with(TEST_LABEL.0, TEST_LABEL.1);
    backend
        .list(&selector)
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.id.to_string())
        .collect()
}
