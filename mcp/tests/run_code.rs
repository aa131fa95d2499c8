//! The `run_code` tool through rmcp's own client, on a local backend, with real Jupyter
//! kernels: the Python named by `SANDCELL_KERNEL_PYTHON` (a virtual environment under
//! `/opt` with `jupyter-client` and `ipykernel`, which `.ci/run` builds). Without it
//! the test returns early, unless `SANDCELL_REQUIRE_KERNELS=1` (set in CI).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::ServiceExt;
use sandcell::SandboxBackend;
use sandcell_mcp::{SandboxTools, ToolSettings};

fn kernel_python() -> Option<String> {
    match std::env::var("SANDCELL_KERNEL_PYTHON") {
        Ok(python) => Some(python),
        Err(_) if std::env::var("SANDCELL_REQUIRE_KERNELS").as_deref() == Ok("1") => {
            panic!("SANDCELL_REQUIRE_KERNELS=1 but SANDCELL_KERNEL_PYTHON is not set")
        }
        Err(_) => None,
    }
}

fn text(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect()
}

fn call(arguments: serde_json::Value) -> CallToolRequestParams {
    CallToolRequestParams::new("run_code").with_arguments(arguments.as_object().unwrap().clone())
}

/// A 1x1 PNG, displayed through IPython.
const SHOW_PNG: &str = "import base64\nfrom IPython.display import Image, display\n\
    display(Image(data=base64.b64decode('iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==')))";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_code_keeps_state_and_answers_values_images_and_errors() {
    let Some(python) = kernel_python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let local = sandcell_local::LocalBackend::builder()
        .root(dir.path().join("local"))
        .build()
        .unwrap();
    let backend: Box<dyn SandboxBackend> = Box::new(local);
    let manager = sandcell::SandboxManager::builder(backend)
        .data_dir(dir.path().join("data"))
        .build()
        .await
        .unwrap();
    let mut settings = ToolSettings::default();
    settings.code_python = python;
    let tools = SandboxTools::new(Arc::new(manager), "agent", settings);
    let (server_end, client_end) = tokio::io::duplex(64 * 1024);
    let server = tokio::spawn(async move {
        let running = tools.serve(server_end).await.unwrap();
        let _ = running.waiting().await;
    });
    let client = ().serve(client_end).await.unwrap();
    let run =
        |code: &str| client.call_tool(call(serde_json::json!({"session": "nb", "code": code})));

    let first = run("import math\nr = 2\nprint('radius', r)").await.unwrap();
    assert_eq!(first.is_error, Some(false), "{}", text(&first));
    assert_eq!(text(&first), "[stdout]\nradius 2\n\n");
    // The state of the first call is there in the second.
    let second = run("round(math.pi * r * r, 2)").await.unwrap();
    assert_eq!(text(&second), "[value]\n12.57\n");
    let shown = run(SHOW_PNG).await.unwrap();
    let image = shown
        .content
        .iter()
        .find_map(|c| c.as_image())
        .expect("an image");
    assert_eq!(image.mime_type, "image/png");
    assert!(image.data.starts_with("iVBORw0KGgo"), "{}", image.data);
    let failed = run("1 / 0").await.unwrap();
    assert_eq!(failed.is_error, Some(true));
    let told = text(&failed);
    assert!(
        told.starts_with("[error] ZeroDivisionError: division by zero"),
        "{told}"
    );
    assert!(
        !told.contains('\u{1b}'),
        "colour codes reach the model: {told:?}"
    );
    let slow = client
        .call_tool(call(serde_json::json!({
            "session": "nb", "code": "import time; time.sleep(30)", "timeout_secs": 1
        })))
        .await
        .unwrap();
    assert_eq!(slow.is_error, Some(true));
    assert!(text(&slow).starts_with("Timeout:"), "{}", text(&slow));
    assert_eq!(text(&run("r").await.unwrap()), "[value]\n2\n");
    let unknown = client
        .call_tool(call(
            serde_json::json!({"session": "nb", "code": "1", "language": "cobol"}),
        ))
        .await
        .unwrap();
    assert_eq!(unknown.is_error, Some(true));
    assert!(
        text(&unknown).contains("no code language \"cobol\""),
        "{}",
        text(&unknown)
    );
    // The session goes with its sandbox: nothing is left mounted or running.
    let release = serde_json::json!({"session": "nb", "mode": "destroy"});
    let released = client
        .call_tool(
            CallToolRequestParams::new("release")
                .with_arguments(release.as_object().unwrap().clone()),
        )
        .await
        .unwrap();
    assert_eq!(released.is_error, Some(false), "{}", text(&released));
    let left = std::fs::read_dir(dir.path().join("local/sandboxes"))
        .unwrap()
        .count();
    assert_eq!(left, 0, "sandboxes left behind");
    client.cancel().await.unwrap();
    server.await.unwrap();
}
