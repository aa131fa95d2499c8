//! The official Python MCP SDK (PyPI `mcp`) as a real client of `sandcell mcp` over
//! stdio and of sandcell-server's `/mcp` over streamable HTTP: the pytest scripts in
//! `cli/tests/mcp` list the tools, call each one, check results and errors, restart the
//! stdio server between calls, keep two tenants apart, and send hostile input.
//!
//! The interpreter is `SANDCELL_MCP_PYTHON` (`.ci/run` makes a virtual environment with
//! `mcp==2.3.0` and `pytest`), else `python3`; without the SDK the test skips, and fails
//! instead under `SANDCELL_REQUIRE_MCP_SDK=1`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::Command;

use common::Server;

const TOKEN_A: &str = "mcp-tenant-a-token";
const TOKEN_B: &str = "mcp-tenant-b-token";

/// sandcell-server over the local backend with two tenants and `/mcp`; answers once it
/// listens.
fn start_server(work: &Path) -> (Server, String) {
    let tenants = work.join("tenants.yaml");
    std::fs::write(
        &tenants,
        format!("tenants:\n  - name: a\n    token: {TOKEN_A}\n  - name: b\n    token: {TOKEN_B}\n"),
    )
    .unwrap();
    std::fs::set_permissions(
        &tenants,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let port = common::free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_sandcell-server"))
        .args(["--listen", &format!("127.0.0.1:{port}"), "--tenants"])
        .arg(&tenants)
        .arg("--root")
        .arg(work.join("root"))
        .arg("--mcp-data-dir")
        .arg(work.join("mcp"))
        .args(["--mcp-max-sandboxes", "2"])
        .env_remove("SANDCELL_SERVER_TOKEN")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(work.join("server.log")).unwrap())
        .spawn()
        .unwrap();
    let server = Server(child);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "the server never listened"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    (server, format!("http://127.0.0.1:{port}/mcp"))
}

#[test]
fn the_python_mcp_sdk_drives_sandcell_mcp_over_stdio_and_http() {
    let Some(python) = common::python_with(
        "SANDCELL_MCP_PYTHON",
        "MCP_SDK",
        "the Python MCP SDK and pytest",
        "mcp, pytest, anyio",
    ) else {
        return;
    };
    let work = tempfile::tempdir().unwrap();
    let (server, url) = start_server(work.path());
    let suite = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp");
    // ADVERSARIAL 36: a test hands it to `run_command`'s `env`.
    let payload = sandcell::testing::conformance::LoaderPayload::build();
    let output = Command::new(python)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp"])
        .arg(work.path().join("pytest"))
        .args(["-o", "console_output_style=classic"])
        .arg(&suite)
        .env("SANDCELL_BIN", env!("CARGO_BIN_EXE_sandcell"))
        .env("SANDCELL_MCP_URL", &url)
        .env("SANDCELL_MCP_TOKEN_A", TOKEN_A)
        .env("SANDCELL_MCP_TOKEN_B", TOKEN_B)
        .env("SANDCELL_ADV36_PAYLOAD", payload.path())
        .env("SANDCELL_ADV36_MARKERS", payload.marker_dir())
        .env_remove("SANDCELL_LOG")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!("{stdout}");
    drop(server);
    let log = std::fs::read_to_string(work.path().join("server.log")).unwrap_or_default();
    assert!(
        output.status.success(),
        "the MCP SDK suite failed:\n{stdout}\n{stderr}\nserver log:\n{log}"
    );
    assert!(stdout.contains(" passed"), "pytest ran nothing:\n{stdout}");
    // The fixtures purged every session: nothing of the sandboxes stays mounted.
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let work_dir = work.path().display().to_string();
    let left: Vec<&str> = mounts.lines().filter(|l| l.contains(&work_dir)).collect();
    assert!(left.is_empty(), "mounts left behind: {left:?}");
    assert!(!stdout.contains(" skipped"), "a test skipped:\n{stdout}");
    assert_eq!(
        payload.markers(),
        Vec::<String>::new(),
        "ADVERSARIAL 36: code a client chose ran on the host (named by the program)"
    );
}
