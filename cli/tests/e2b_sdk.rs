//! E2B's own Python SDK (PyPI `e2b`) as a real client of the `sandcell-server` binary:
//! the pytest scripts in `server/tests/e2b_sdk` drive it over the local
//! backend and over Docker, as a user of E2B would, with only `E2B_API_KEY`,
//! `E2B_API_URL` and `E2B_SANDBOX_URL` pointing at it.
//!
//! The interpreter is `SANDCELL_E2B_PYTHON` (`.ci/run` makes a virtual environment
//! with `e2b==2.63.0`, `e2b-code-interpreter==2.11.5` and `pytest`), else `python3`; without the SDK the tests skip,
//! and fail instead under `SANDCELL_REQUIRE_E2B_SDK=1`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{free_port, Server};
use sandcell::{LabelSelector, SandboxBackend};

/// The two tenants' keys, shaped as E2B's (`e2b_` and hex).
const KEY: &str = "e2b_53616e6463656c6c20746573742031";
const OTHER_KEY: &str = "e2b_1111111111111111111111111111111111111111";

/// The interpreter with E2B's SDK and pytest, if there is one.
fn sdk() -> Option<String> {
    common::python_with(
        "SANDCELL_E2B_PYTHON",
        "E2B_SDK",
        "E2B's Python SDK and pytest",
        "e2b, pytest",
    )
}

fn suite_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../server/tests/e2b_sdk")
}

/// Starts the binary with two tenants and `args`; answers once it listens.
async fn start(work: &Path, args: &[String]) -> (Server, String) {
    let tenants = work.join("tenants.yaml");
    std::fs::write(
        &tenants,
        format!(
            "tenants:\n  - name: first\n    token: {KEY}\n  - name: second\n    token: {OTHER_KEY}\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        &tenants,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let port = free_port();
    let log = std::fs::File::create(work.join("server.log")).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_sandcell-server"))
        .args(["--listen", &format!("127.0.0.1:{port}"), "--tenants"])
        .arg(&tenants)
        .args(args)
        .env_remove("SANDCELL_SERVER_TOKEN")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let server = Server(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "the server never listened");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (server, format!("http://127.0.0.1:{port}"))
}

/// Runs the pytest suite against `url`; panics with its output unless every test passed,
/// or if ADVERSARIAL 36's payload (its test hands it to the SDK's `envs`) ran on the host.
fn run_suite(python: &str, url: &str, work: &Path) {
    let payload = sandcell::testing::conformance::LoaderPayload::build();
    let output = Command::new(python)
        .args([
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-o",
            "console_output_style=classic",
        ])
        .arg(suite_dir())
        .env("E2B_API_KEY", KEY)
        .env("E2B_API_URL", url)
        .env("E2B_SANDBOX_URL", url)
        .env("SANDCELL_ADV36_PAYLOAD", payload.path())
        .env("SANDCELL_ADV36_MARKERS", payload.marker_dir())
        .env_remove("E2B_DOMAIN")
        .env_remove("E2B_DEBUG")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!("{stdout}");
    let log = std::fs::read_to_string(work.join("server.log")).unwrap_or_default();
    assert!(
        output.status.success(),
        "the E2B SDK suite failed:\n{stdout}\n{stderr}\nserver log:\n{log}"
    );
    assert!(stdout.contains(" passed"), "pytest ran nothing:\n{stdout}");
    assert!(!stdout.contains(" skipped"), "a test skipped:\n{stdout}");
    assert_eq!(
        payload.markers(),
        Vec::<String>::new(),
        "ADVERSARIAL 36: code a client chose ran on the host (named by the program)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_e2b_sdk_drives_the_local_backend() {
    let Some(python) = sdk() else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let root = work.path().join("root");
    let (server, url) = start(work.path(), &["--root".into(), root.display().to_string()]).await;
    run_suite(&python, &url, work.path());
    drop(server);
    let left: Vec<_> = std::fs::read_dir(root.join("sandboxes")).unwrap().collect();
    assert!(left.is_empty(), "sandboxes left behind: {left:?}");
}

/// E2B's Code Interpreter SDK (`e2b-code-interpreter`, in the same environment) runs
/// cells against the server, whose kernels come from `SANDCELL_KERNEL_PYTHON` (a
/// virtual environment under `/opt` with jupyter-client, ipykernel and bash_kernel).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_code_interpreter_sdk_runs_cells() {
    let Some(python) = sdk() else {
        return;
    };
    let kernels = match std::env::var("SANDCELL_KERNEL_PYTHON") {
        Ok(kernels) => kernels,
        Err(_) if std::env::var("SANDCELL_REQUIRE_KERNELS").as_deref() == Ok("1") => {
            panic!("SANDCELL_REQUIRE_KERNELS=1 but SANDCELL_KERNEL_PYTHON is not set")
        }
        Err(_) => return,
    };
    let work = tempfile::tempdir().unwrap();
    let root = work.path().join("root");
    let args = [
        "--root".into(),
        root.display().to_string(),
        "--code-python".into(),
        kernels,
    ];
    let (server, url) = start(work.path(), &args).await;
    let suite = Path::new(env!("CARGO_MANIFEST_DIR")).join("../server/tests/e2b_code_interpreter");
    let output = Command::new(&python)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .arg(suite)
        .env("E2B_API_KEY", KEY)
        .env("E2B_API_URL", &url)
        .env("E2B_SANDBOX_URL", &url)
        .env_remove("E2B_DOMAIN")
        .env_remove("E2B_DEBUG")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let log = std::fs::read_to_string(work.path().join("server.log")).unwrap_or_default();
    assert!(
        output.status.success(),
        "the Code Interpreter SDK suite failed:\n{stdout}\n{}\nserver log:\n{log}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains(" passed") && !stdout.contains(" skipped"),
        "{stdout}"
    );
    drop(server);
    let left: Vec<_> = std::fs::read_dir(root.join("sandboxes")).unwrap().collect();
    assert!(left.is_empty(), "sandboxes left behind: {left:?}");
}

/// A root file system with busybox and bash as `/bin/bash`: E2B's SDKs run every command
/// with `/bin/bash -l -c`.
fn bash_rootfs(dir: &Path) -> Result<(), String> {
    let busybox = sandcell_docker::testing::host_busybox()
        .ok_or("busybox is not installed (apt-get install busybox-static)")?;
    let bash = ["/bin/bash-static", "/usr/bin/bash-static"]
        .into_iter()
        .map(Path::new)
        .find(|p| p.exists())
        .ok_or("bash-static is not installed (apt-get install bash-static)")?;
    sandcell_docker::testing::busybox_rootfs(&busybox, dir).map_err(|e| e.to_string())?;
    let target = dir.join("bin/bash");
    let _ = std::fs::remove_file(&target);
    std::fs::copy(bash, &target).map_err(|e| e.to_string())?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_e2b_sdk_drives_the_docker_backend() {
    let Some(python) = sdk() else {
        return;
    };
    let engine = sandcell_docker::DockerBackend::builder().build().unwrap();
    let ping = engine.ping().await.map_err(|e| e.to_string());
    if !sandcell::testing::require_or_skip("DOCKER", "a Docker engine", ping) {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let rootfs = work.path().join("rootfs");
    let made = bash_rootfs(&rootfs);
    if !sandcell::testing::require_or_skip("DOCKER", "a root file system with bash", made) {
        return;
    }
    let mut options = serde_json::json!({
        "templates": {"e2b-bash": {
            "kind": "import",
            "source": rootfs,
            "tag": "sandcell-test/e2b-bash:latest"
        }}
    });
    if let Some(agent) = std::env::var_os("SANDCELL_DOCKER_AGENT").filter(|a| !a.is_empty()) {
        options["agent"] = serde_json::json!(PathBuf::from(agent));
    }
    let args = [
        "--backend".to_owned(),
        "docker".to_owned(),
        "--options".to_owned(),
        options.to_string(),
        "--e2b-base-template".to_owned(),
        "e2b-bash".to_owned(),
    ];
    let (server, url) = start(work.path(), &args).await;
    run_suite(&python, &url, work.path());
    drop(server);
    let left = engine
        .list(&LabelSelector::new().label("sandcell.server.app", "e2b"))
        .await
        .unwrap();
    assert!(left.is_empty(), "containers left behind: {left:?}");
}
