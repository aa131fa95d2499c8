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
    assert_eq!(listed.len(), 12);
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

/// A backend that enforces every resource limit.
fn limits_enforced() -> sandcell::testing::MockBackend {
    let mock = sandcell::testing::MockBackend::new();
    let mut caps = mock.capabilities();
    caps.cpu_limit = true;
    caps.memory_limit = true;
    caps.pids_limit = true;
    caps.disk_limit = true;
    mock.set_capabilities(caps)
}

/// Serves `tools` to rmcp's client and opens session `s` with one `write_file`.
async fn run_once(tools: SandboxTools) {
    let (server_end, client_end) = tokio::io::duplex(64 * 1024);
    let server = tokio::spawn(async move {
        let running = tools.serve(server_end).await.unwrap();
        let _ = running.waiting().await;
    });
    let client = ().serve(client_end).await.unwrap();
    let out = client
        .call_tool(call(
            "write_file",
            serde_json::json!({"session": "s", "path": "f", "content": "x"}),
        ))
        .await
        .unwrap();
    assert_eq!(out.is_error, Some(false), "{}", text(&out));
    client.cancel().await.unwrap();
    server.await.unwrap();
}

/// ADVERSARIAL 40 on `sandcell mcp`: a session's sandbox gets `Limits::recommended`
/// where the spec sets none (before, stdio sandboxes got no CPU, memory, process or
/// disk limit at all); a limit the spec sets is kept, and `Limits::new()` opts out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_get_the_recommended_limits_unless_told_otherwise() {
    let live_spec = |mock: &sandcell::testing::MockBackend| {
        let mock = mock.clone();
        async move {
            let live = mock.list(&sandcell::LabelSelector::new()).await.unwrap();
            assert_eq!(live.len(), 1);
            mock.spec_of(&live[0].id).unwrap()
        }
    };
    let manager_over = |mock: &sandcell::testing::MockBackend, dir: &std::path::Path| {
        let backend: Box<dyn SandboxBackend> = Box::new(mock.clone());
        let dir = dir.to_path_buf();
        async move {
            let manager = sandcell::SandboxManager::builder(backend)
                .data_dir(dir)
                .build()
                .await
                .unwrap();
            Arc::new(manager)
        }
    };

    let dir = tempfile::tempdir().unwrap();
    let mock = limits_enforced();
    let manager = manager_over(&mock, &dir.path().join("defaults")).await;
    let mut settings = ToolSettings::default();
    settings.spec.limits = sandcell::Limits::new().pids(64);
    run_once(SandboxTools::new(manager, "agent", settings)).await;
    let limits = live_spec(&mock).await.limits;
    assert_eq!(limits.pids, Some(64), "the spec's own limit is kept");
    assert_eq!(limits.cpu_millis, Some(1000));
    assert_eq!(limits.memory_bytes, Some(512 << 20));
    assert_eq!(limits.disk_bytes, Some(10 << 30));

    // A backend that enforces none gets none (its specs would otherwise be refused).
    let mock = sandcell::testing::MockBackend::new();
    let manager = manager_over(&mock, &dir.path().join("unenforced")).await;
    run_once(SandboxTools::new(manager, "agent", ToolSettings::default())).await;
    assert_eq!(live_spec(&mock).await.limits, sandcell::Limits::new());

    let mock = limits_enforced();
    let manager = manager_over(&mock, &dir.path().join("opted-out")).await;
    let mut settings = ToolSettings::default();
    settings.default_limits = sandcell::Limits::new();
    run_once(SandboxTools::new(manager, "agent", settings)).await;
    assert_eq!(live_spec(&mock).await.limits, sandcell::Limits::new());
}

/// ADVERSARIAL 41: a tool error is what `ToolSettings::public_errors` makes of it: a server facing
/// tenants rewrites it so that no host path reaches them (sandcell-server's MCP face
/// told a model its backend's root in every failed restore).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_errors_are_told_as_the_settings_rewrite_them() {
    let dir = tempfile::tempdir().unwrap();
    let backend: Box<dyn SandboxBackend> = Box::new(sandcell::testing::MockBackend::new());
    let manager = sandcell::SandboxManager::builder(backend)
        .data_dir(dir.path().join("data"))
        .build()
        .await
        .unwrap();
    let mut settings = ToolSettings::default();
    settings.public_errors = sandcell::raw::wire::PublicErrors::new(|e| {
        sandcell::Error::new(e.kind(), "rewritten for the client")
    });
    let tools = SandboxTools::new(Arc::new(manager), "agent", settings);
    let (server_end, client_end) = tokio::io::duplex(64 * 1024);
    let server = tokio::spawn(async move {
        let running = tools.serve(server_end).await.unwrap();
        let _ = running.waiting().await;
    });
    let client = ().serve(client_end).await.unwrap();
    let out = client
        .call_tool(call(
            "read_file",
            serde_json::json!({"session": "s", "path": "missing.txt"}),
        ))
        .await
        .unwrap();
    assert_eq!(out.is_error, Some(true));
    let told = text(&out);
    assert!(told.contains("rewritten for the client"), "{told}");
    assert!(!told.contains("missing.txt"), "{told}");
    client.cancel().await.unwrap();
    server.await.unwrap();
}

/// ADVERSARIAL 40, FINDINGS9 G1: a tenant has at most `ToolSettings::max_calls_per_tenant` calls in
/// flight (a call runs to its end after its client has gone, and may hold tens of MiB);
/// past it a call is a tool error naming the limit. With none allowed, every call is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_past_the_tenant_s_cap_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let backend: Box<dyn SandboxBackend> = Box::new(sandcell::testing::MockBackend::new());
    let manager = sandcell::SandboxManager::builder(backend)
        .data_dir(dir.path().join("data"))
        .build()
        .await
        .unwrap();
    let mut settings = ToolSettings::default();
    settings.max_calls_per_tenant = 0;
    let tools = SandboxTools::new(Arc::new(manager), "agent", settings);
    let (server_end, client_end) = tokio::io::duplex(64 * 1024);
    let server = tokio::spawn(async move {
        let running = tools.serve(server_end).await.unwrap();
        let _ = running.waiting().await;
    });
    let client = ().serve(client_end).await.unwrap();
    let out = client
        .call_tool(call(
            "glob",
            serde_json::json!({"session": "s", "pattern": "**/*"}),
        ))
        .await
        .unwrap();
    assert_eq!(out.is_error, Some(true));
    let told = text(&out);
    assert!(told.contains("tool calls running"), "{told}");
    client.cancel().await.unwrap();
    server.await.unwrap();
}
