//! The official Python MCP SDK (PyPI `mcp`) as a real client of `sandcell mcp` over
//! stdio: the pytest scripts in `cli/tests/mcp` list the tools, call each one, check
//! results and errors, restart the server between calls, and send hostile input.
//!
//! The interpreter is `SANDCELL_MCP_PYTHON` (`.ci/run` makes a virtual environment with
//! `mcp==2.3.0` and `pytest`), else `python3`; without the SDK the test skips, and fails
//! instead under `SANDCELL_REQUIRE_MCP_SDK=1`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;

fn python() -> String {
    std::env::var("SANDCELL_MCP_PYTHON")
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "python3".to_owned())
}

fn sdk_available() -> bool {
    let probe = Command::new(python())
        .args(["-c", "import mcp, pytest, anyio"])
        .output()
        .map_err(|e| e.to_string())
        .and_then(|out| {
            if out.status.success() {
                Ok(())
            } else {
                Err(String::from_utf8_lossy(&out.stderr).into_owned())
            }
        });
    sandcell::testing::require_or_skip("MCP_SDK", "the Python MCP SDK and pytest", probe)
}

#[test]
fn the_python_mcp_sdk_drives_sandcell_mcp_over_stdio() {
    if !sdk_available() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let suite = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp");
    let output = Command::new(python())
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp"])
        .arg(work.path().join("pytest"))
        .args(["-o", "console_output_style=classic"])
        .arg(&suite)
        .env("SANDCELL_BIN", env!("CARGO_BIN_EXE_sandcell"))
        .env_remove("SANDCELL_LOG")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!("{stdout}");
    assert!(
        output.status.success(),
        "the MCP SDK suite failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains(" passed"), "pytest ran nothing:\n{stdout}");
    assert!(!stdout.contains(" skipped"), "a test skipped:\n{stdout}");
}
