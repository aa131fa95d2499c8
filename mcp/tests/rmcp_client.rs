//! `SandboxTools` driven by rmcp's own client over an in-memory transport, on a local
//! backend: the tools are listed with schemas, calls answer, sandbox errors are tool
//! errors, and an unknown tool is the protocol's error.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::ServiceExt;
use sandcell::SandboxBackend;
use sandcell_mcp::{SandboxTools, ToolSettings};

fn text(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect()
}

fn call(name: &'static str, arguments: serde_json::Value) -> CallToolRequestParams {
    CallToolRequestParams::new(name).with_arguments(arguments.as_object().unwrap().clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rmcps_client_lists_and_calls_the_tools() {
    let dir = tempfile::tempdir().unwrap();
    let local = sandcell_local::LocalBackend::builder()
        .root(dir.path().join("local"))
        .build()
        .unwrap();
    let backend: Box<dyn SandboxBackend> = Box::new(local.clone());
    let manager = sandcell::SandboxManager::builder(backend)
        .data_dir(dir.path().join("data"))
        .build()
        .await
        .unwrap();
    let manager = Arc::new(manager);
    let tools = SandboxTools::new(Arc::clone(&manager), "agent", ToolSettings::default());
    let (server_end, client_end) = tokio::io::duplex(64 * 1024);
    let server = tokio::spawn(async move {
        let running = tools.serve(server_end).await.unwrap();
        let _ = running.waiting().await;
    });
    let client = ().serve(client_end).await.unwrap();

    let listed = client.list_all_tools().await.unwrap();
    assert_eq!(listed.len(), 11);
    let run = listed.iter().find(|t| t.name == "run_command").unwrap();
    let required = run.input_schema.get("required").unwrap();
    assert_eq!(required, &serde_json::json!(["session", "command"]));

    let out = client
        .call_tool(call(
            "run_command",
            serde_json::json!({"session": "r", "command": "echo made > f.txt; cat f.txt"}),
        ))
        .await
        .unwrap();
    assert_eq!(out.is_error, Some(false));
    assert!(
        text(&out).contains("exit code: 0\n--- stdout ---\nmade\n"),
        "{}",
        text(&out)
    );
    let read = client
        .call_tool(call(
            "read_file",
            serde_json::json!({"session": "r", "path": "f.txt"}),
        ))
        .await
        .unwrap();
    assert_eq!(text(&read), "made\n");
    let missing = client
        .call_tool(call(
            "read_file",
            serde_json::json!({"session": "r", "path": "nope"}),
        ))
        .await
        .unwrap();
    assert_eq!(missing.is_error, Some(true));
    assert!(
        text(&missing).starts_with("not found:"),
        "{}",
        text(&missing)
    );
    // Every other tool, once.
    let steps = [
        (
            "write_file",
            serde_json::json!({"session": "r", "path": "d/a.txt", "content": "alpha\n"}),
        ),
        (
            "edit_file",
            serde_json::json!({"session": "r", "path": "d/a.txt", "old_text": "alpha", "new_text": "beta"}),
        ),
        (
            "list_directory",
            serde_json::json!({"session": "r", "path": "d"}),
        ),
        (
            "glob",
            serde_json::json!({"session": "r", "pattern": "d/*.txt"}),
        ),
        (
            "grep",
            serde_json::json!({"session": "r", "pattern": "^beta$"}),
        ),
        ("snapshot", serde_json::json!({"session": "r"})),
        ("list_sessions", serde_json::json!({})),
    ];
    let mut answers = Vec::new();
    for (tool, arguments) in steps {
        let out = client.call_tool(call(tool, arguments)).await.unwrap();
        assert_eq!(out.is_error, Some(false), "{tool}: {}", text(&out));
        answers.push(text(&out));
    }
    assert_eq!(answers[2], "a.txt\t5 bytes\n");
    assert_eq!(answers[3], "d/a.txt\n");
    assert_eq!(answers[4], "d/a.txt:1: beta\n");
    assert!(answers[6].contains("\"session\":\"r\""), "{}", answers[6]);
    let snapshot_id = answers[5].split_whitespace().nth(1).unwrap().to_owned();
    client
        .call_tool(call(
            "write_file",
            serde_json::json!({"session": "r", "path": "d/a.txt", "content": "gamma"}),
        ))
        .await
        .unwrap();
    let restored = client
        .call_tool(call(
            "restore_snapshot",
            serde_json::json!({"session": "r", "snapshot_id": snapshot_id}),
        ))
        .await
        .unwrap();
    assert_eq!(restored.is_error, Some(false), "{}", text(&restored));
    let read = client
        .call_tool(call(
            "read_file",
            serde_json::json!({"session": "r", "path": "d/a.txt"}),
        ))
        .await
        .unwrap();
    assert_eq!(text(&read), "beta\n");
    let released = client
        .call_tool(call(
            "release",
            serde_json::json!({"session": "r", "mode": "suspend"}),
        ))
        .await
        .unwrap();
    assert_eq!(released.is_error, Some(false), "{}", text(&released));

    let unknown = client
        .call_tool(call("teleport", serde_json::json!({})))
        .await;
    assert!(
        unknown.is_err(),
        "an unknown tool is a protocol error: {unknown:?}"
    );

    // The tenant's session is the manager's, under the tenant the tools act for.
    let sessions = manager.list(Some("agent")).await.unwrap();
    assert_eq!(sessions.len(), 1);
    drop(client);
    let _ = server.await;
    manager
        .release(&sessions[0].key, sandcell::ReleaseMode::Purge)
        .await
        .unwrap();
    manager.shutdown().await;
    assert!(local.list(&Default::default()).await.unwrap().is_empty());
}
