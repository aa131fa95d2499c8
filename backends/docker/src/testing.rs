//! Helpers for tests and examples on machines without a registry (feature `testing`):
//! an image built from this host's static busybox, the engine probe every Docker test
//! starts with, and the static agent binary.

use std::path::{Path, PathBuf};

use sandcell::{Error, Result};

/// Where a statically linked busybox usually is (Debian's `busybox-static`).
const BUSYBOX: [&str; 2] = ["/bin/busybox", "/usr/bin/busybox"];

/// The host's busybox binary, if there is one.
pub fn host_busybox() -> Option<PathBuf> {
    BUSYBOX.iter().map(PathBuf::from).find(|p| p.is_file())
}

/// Writes a root file system into `dir`: busybox and a link per applet in `/bin`, a
/// `sandbox` user (uid and gid 1000) beside root, a world-writable `/tmp`. Import it
/// with [`ImageSpec::import`](crate::ImageSpec::import). The busybox must be statically
/// linked (`apt-get install busybox-static`), as the image has no libc.
pub fn busybox_rootfs(busybox: &Path, dir: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let io = |what: &str, e| {
        Error::io(
            format_args!("writing the busybox root file system ({what})"),
            e,
        )
    };
    for d in ["bin", "etc", "tmp", "home/sandbox"] {
        std::fs::create_dir_all(dir.join(d)).map_err(|e| io(d, e))?;
    }
    std::fs::copy(busybox, dir.join("bin/busybox")).map_err(|e| io("bin/busybox", e))?;
    let applets = std::process::Command::new(busybox)
        .arg("--list")
        .output()
        .map_err(|e| io("busybox --list", e))?;
    for applet in String::from_utf8_lossy(&applets.stdout).lines() {
        if !applet.is_empty() && applet != "busybox" && !applet.contains('/') {
            let link = dir.join("bin").join(applet);
            if !link.exists() {
                std::os::unix::fs::symlink("busybox", &link).map_err(|e| io(applet, e))?;
            }
        }
    }
    std::fs::write(
        dir.join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/sh\nsandbox:x:1000:1000:sandbox:/home/sandbox:/bin/sh\n",
    )
    .map_err(|e| io("etc/passwd", e))?;
    std::fs::write(dir.join("etc/group"), "root:x:0:\nsandbox:x:1000:\n")
        .map_err(|e| io("etc/group", e))?;
    std::fs::set_permissions(dir.join("tmp"), std::fs::Permissions::from_mode(0o1777))
        .map_err(|e| io("tmp", e))?;
    std::fs::set_permissions(
        dir.join("home/sandbox"),
        std::fs::Permissions::from_mode(0o777),
    )
    .map_err(|e| io("home/sandbox", e))?;
    Ok(())
}

/// Copies the host's `program` into `rootfs/bin`, and every library `ldd` names for it
/// at its own path, so a dynamically linked tool (such as `curl`) runs in an image built
/// from `rootfs`.
pub fn copy_host_program(program: &Path, rootfs: &Path) -> Result<()> {
    let io = |what: &Path, e| {
        Error::io(
            format_args!("copying {} into the root file system", what.display()),
            e,
        )
    };
    let ldd = std::process::Command::new("ldd")
        .arg(program)
        .output()
        .map_err(|e| io(program, e))?;
    let mut libraries = Vec::new();
    for line in String::from_utf8_lossy(&ldd.stdout).lines() {
        // `libz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x...)`, or the loader's
        // `/lib64/ld-linux-x86-64.so.2 (0x...)`.
        if let Some(path) = line
            .split("=>")
            .last()
            .and_then(|rest| rest.split_whitespace().next())
            .filter(|p| p.starts_with('/'))
        {
            libraries.push(PathBuf::from(path));
        }
    }
    for library in libraries {
        let target = rootfs.join(library.strip_prefix("/").unwrap_or(&library));
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(|e| io(&library, e))?;
        }
        // The file itself, under the name it is linked by.
        std::fs::copy(&library, &target).map_err(|e| io(&library, e))?;
    }
    let name = program.file_name().unwrap_or(program.as_os_str());
    std::fs::create_dir_all(rootfs.join("bin")).map_err(|e| io(program, e))?;
    std::fs::copy(program, rootfs.join("bin").join(name)).map_err(|e| io(program, e))?;
    Ok(())
}

/// The imported busybox root file system, as the test suites name it.
pub const BASE_IMAGE: &str = "sandcell-test/busybox:latest";
/// [`BASE_IMAGE`] with a non-root `sandbox` user (built from it): the image the test
/// suites run their sandboxes from.
pub const USER_IMAGE: &str = "sandcell-test/busybox-user:latest";

/// Whether an engine answers. Without one a test prints why and skips, unless
/// `SANDCELL_REQUIRE_DOCKER=1` (set by CI), where a missing engine fails it.
pub async fn engine_available() -> bool {
    let ping = match crate::DockerBackend::builder().build() {
        Ok(probe) => probe.ping().await.map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    sandcell::testing::require_or_skip("DOCKER", "a Docker engine", ping)
}

/// Imports [`BASE_IMAGE`] from the host's busybox and builds [`USER_IMAGE`] from it,
/// once per process (nothing is done when the engine has the user image already).
pub async fn test_images() -> Result<()> {
    static READY: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    READY
        .get_or_try_init(|| async {
            let probe = crate::DockerBackend::builder().build()?;
            if probe.docker().inspect_image(USER_IMAGE).await.is_ok() {
                return Ok(());
            }
            let work = tempfile::tempdir().map_err(|e| Error::io("a scratch directory", e))?;
            let rootfs = work.path().join("rootfs");
            let busybox = host_busybox().ok_or_else(|| {
                Error::not_found("busybox is not installed (apt-get install busybox-static)")
            })?;
            busybox_rootfs(&busybox, &rootfs)?;
            let context = work.path().join("context");
            std::fs::create_dir_all(&context)
                .map_err(|e| Error::io("writing the build context", e))?;
            std::fs::write(
                context.join("Dockerfile"),
                format!("FROM {BASE_IMAGE}\nUSER sandbox\nENV PATH=/bin\n"),
            )
            .map_err(|e| Error::io("writing the build context", e))?;
            // Two backends, so the import finishes before the build that needs it.
            crate::DockerBackend::builder()
                .template("base", crate::ImageSpec::import(&rootfs, BASE_IMAGE))
                .build()?
                .prepare_images()
                .await?;
            crate::DockerBackend::builder()
                .template(
                    "user",
                    crate::ImageSpec::Build(crate::BuildStage::new(&context, USER_IMAGE)),
                )
                .build()?
                .prepare_images()
                .await
        })
        .await
        .map(|_| ())
}

/// The static agent binary: `SANDCELL_DOCKER_AGENT`, or built on demand (as `.ci/run`
/// does) into the workspace's `target/agent` with the `cargo` that built this crate.
pub fn agent_binary() -> Result<PathBuf> {
    static AGENT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    if let Some(path) = AGENT.get() {
        return Ok(path.clone());
    }
    if let Some(path) = std::env::var_os("SANDCELL_DOCKER_AGENT").filter(|p| !p.is_empty()) {
        return Ok(AGENT.get_or_init(|| PathBuf::from(path)).clone());
    }
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .find(|d| d.join("Cargo.lock").exists())
        .ok_or_else(|| Error::not_found("building the agent needs the sandcell workspace"))?
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
        .map_err(|e| Error::io("running cargo to build the agent", e))?;
    if !status.success() {
        return Err(Error::new(
            sandcell::ErrorKind::Backend,
            format!("building the static sandcell-agent failed ({status})"),
        ));
    }
    let built = target.join("x86_64-unknown-linux-gnu/release/sandcell-agent");
    Ok(AGENT.get_or_init(|| built).clone())
}
