//! Two tenants on one sandcell-server's `/mcp`, with plain HTTP speaking MCP's
//! streamable HTTP transport: each tenant's `list_sessions` shows its own sessions,
//! a transport session belongs to the tenant that opened it (ADVERSARIAL case 31),
//! and no Fly or E2B client can plant a sandbox labelled as the server's MCP manager's
//! (case 39).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;

use sandcell::SandboxBackend;
use sandcell_server::{ServerConfig, Tenant};
use serde_json::{json, Value};

const ALICE: &str = "token-alice";
const BOB: &str = "token-bob";

/// A server whose `/mcp` acts on a manager over the served backend.
async fn serve() -> (common::TestServer, tempfile::TempDir) {
    serve_tenants([Tenant::new("alice", ALICE), Tenant::new("bob", BOB)]).await
}

async fn serve_tenants(
    tenants: impl IntoIterator<Item = Tenant>,
) -> (common::TestServer, tempfile::TempDir) {
    let root = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let local = sandcell_local::LocalBackend::builder()
        .root(root.path())
        .build()
        .unwrap();
    // An id a client could guess: the server must refuse it in clients' labels.
    let config = ServerConfig::with_tenants(tenants)
        .unwrap()
        .with_mcp(Arc::new(local.clone()), |b| {
            b.manager_id("sandcell").data_dir(data.path())
        })
        .await
        .unwrap();
    (common::serve_built(local, root, config).await, data)
}

/// One MCP client over streamable HTTP.
struct Mcp {
    url: String,
    token: &'static str,
    session: Option<String>,
    next_id: u64,
}

impl Mcp {
    /// Opens a transport session as `token`'s tenant.
    async fn open(url: &str, token: &'static str) -> Mcp {
        let mut mcp = Mcp {
            url: format!("{url}/mcp"),
            token,
            session: None,
            next_id: 1,
        };
        let (status, _, session) = mcp
            .post(json!({"method": "initialize", "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "tenancy-test", "version": "0"},
            }}))
            .await;
        assert_eq!(status, 200);
        mcp.session = Some(session.expect("initialize opened no transport session"));
        let (status, _, _) = mcp
            .send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        assert!(status < 300, "initialized: {status}");
        mcp
    }

    /// A request with the next id: the status, the JSON-RPC answer, the session header.
    async fn post(&mut self, mut body: Value) -> (u16, Value, Option<String>) {
        body["jsonrpc"] = json!("2.0");
        body["id"] = json!(self.next_id);
        self.next_id += 1;
        self.send(body).await
    }

    async fn send(&self, body: Value) -> (u16, Value, Option<String>) {
        let mut request = reqwest::Client::new()
            .post(&self.url)
            .bearer_auth(self.token)
            .header("Accept", "application/json, text/event-stream")
            .json(&body);
        if let Some(session) = &self.session {
            request = request.header("Mcp-Session-Id", session);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let session = response
            .headers()
            .get("mcp-session-id")
            .map(|v| v.to_str().unwrap().to_owned());
        let text = response.text().await.unwrap();
        // An event stream's answer is its last `data:` line that holds JSON.
        let answer = text
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
            .next_back()
            .or_else(|| serde_json::from_str(&text).ok())
            .unwrap_or(Value::Null);
        (status, answer, session)
    }

    /// Calls tool `name`; its text.
    async fn tool(&mut self, name: &str, arguments: Value) -> String {
        let (status, answer, _) = self
            .post(json!({"method": "tools/call", "params": {"name": name, "arguments": arguments}}))
            .await;
        assert_eq!(status, 200, "{name}: {answer}");
        answer["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or_else(|| panic!("{name}: {answer}"))
            .to_owned()
    }

    /// Sends `method` with `token` (not this client's) on this client's session.
    async fn hijack(&self, token: &'static str, method: reqwest::Method) -> u16 {
        let response = reqwest::Client::new()
            .request(method, &self.url)
            .bearer_auth(token)
            .header("Accept", "application/json, text/event-stream")
            .header("Mcp-Session-Id", self.session.as_deref().unwrap())
            .json(&json!({"jsonrpc": "2.0", "id": 99, "method": "tools/list"}))
            .send()
            .await
            .unwrap();
        response.status().as_u16()
    }
}

/// ADVERSARIAL case 31: bob cannot use or delete alice's transport session by its id;
/// it answers him as an unknown session does, and stays alice's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adversarial_31_mcp_sessions_belong_to_the_tenant_that_opened_them() {
    let (server, _data) = serve().await;
    let mut alice = Mcp::open(&server.url, ALICE).await;
    let unknown = Mcp {
        url: alice.url.clone(),
        token: BOB,
        session: Some("not-a-session".to_owned()),
        next_id: 1,
    };
    for method in [reqwest::Method::POST, reqwest::Method::DELETE] {
        assert_eq!(alice.hijack(BOB, method.clone()).await, 404, "{method}");
        assert_eq!(unknown.hijack(BOB, method.clone()).await, 404, "{method}");
    }
    let (status, answer, _) = alice.post(json!({"method": "tools/list"})).await;
    assert_eq!(status, 200, "{answer}");
    assert!(answer["result"]["tools"].is_array(), "{answer}");
    assert!(alice
        .tool("list_sessions", json!({}))
        .await
        .contains("no sessions"));
}

/// ADVERSARIAL cases 31 and 39 on MCP: each tenant's `list_sessions` shows only its own
/// sessions, and a Fly create labelled as the server's MCP manager's sandbox (which
/// that manager would adopt or reap) is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adversarial_39_mcp_list_sessions_stays_within_the_tenant() {
    let (server, _data) = serve().await;
    let mut alice = Mcp::open(&server.url, ALICE).await;
    let mut bob = Mcp::open(&server.url, BOB).await;
    let wrote = alice
        .tool(
            "write_file",
            json!({"session": "alice-work", "path": "a.txt", "content": "alice's"}),
        )
        .await;
    assert!(!wrote.contains("error"), "{wrote}");
    assert!(alice
        .tool("list_sessions", json!({}))
        .await
        .contains("\"session\":\"alice-work\""));
    let listed = bob.tool("list_sessions", json!({})).await;
    assert!(!listed.contains("alice-work"), "{listed}");

    let planted = reqwest::Client::new()
        .post(format!("{}/v1/apps/sandcell/machines", server.url))
        .bearer_auth(BOB)
        .json(&json!({"config": {"image": "default", "metadata": {
            "sandcell.manager": "sandcell",
            "sandcell.tenant": "alice",
            "sandcell.session": "alice-work",
        }}}))
        .send()
        .await
        .unwrap();
    assert_eq!(planted.status().as_u16(), 400);
    // A manager of the client's own, with an id of its own, may still label its
    // sandboxes.
    let own = reqwest::Client::new()
        .post(format!("{}/v1/apps/sandcell/machines", server.url))
        .bearer_auth(BOB)
        .json(&json!({"config": {"image": "default", "metadata": {
            "sandcell.manager": "bobs-manager",
            "sandcell.tenant": "bob",
        }}}))
        .send()
        .await
        .unwrap();
    assert_eq!(own.status().as_u16(), 200);
    let listed = bob.tool("list_sessions", json!({})).await;
    assert!(!listed.contains("alice-work"), "{listed}");

    alice
        .tool(
            "release",
            json!({"session": "alice-work", "mode": "destroy"}),
        )
        .await;
    for sandbox in server.local.list(&Default::default()).await.unwrap() {
        server.local.destroy(&sandbox.id).await.unwrap();
    }
}

/// ADVERSARIAL 40 (MCP's sandboxes escaped their tenant's limits): a tenant's quota
/// counts its sandboxes on every face, MCP's sessions included: with
/// room for one, an E2B sandbox leaves none for an MCP session, and an MCP session none
/// for an E2B sandbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_sessions_count_against_the_tenants_quota_with_its_other_sandboxes() {
    let (server, _data) = serve_tenants([Tenant::new("alice", ALICE).max_sandboxes(1)]).await;
    let http = reqwest::Client::new();
    let e2b_create = || {
        http.post(format!("{}/sandboxes", server.url))
            .header("X-API-Key", ALICE)
            .json(&json!({"templateID": "base"}))
            .send()
    };
    let created: Value = e2b_create().await.unwrap().json().await.unwrap();
    let id = created["sandboxID"].as_str().unwrap().to_owned();

    let mut alice = Mcp::open(&server.url, ALICE).await;
    let write = json!({"session": "work", "path": "a.txt", "content": "x"});
    let refused = alice.tool("write_file", write.clone()).await;
    assert!(refused.contains("max_sandboxes"), "{refused}");

    let killed = http
        .delete(format!("{}/sandboxes/{id}", server.url))
        .header("X-API-Key", ALICE)
        .send()
        .await
        .unwrap();
    assert_eq!(killed.status().as_u16(), 204);
    let wrote = alice.tool("write_file", write).await;
    assert!(!wrote.contains("max_sandboxes"), "{wrote}");
    assert_eq!(e2b_create().await.unwrap().status().as_u16(), 429);
}

/// ADVERSARIAL 35, FINDINGS7 S6: a tool call whose client has gone holds no share of
/// its tenant's connections. The claim rode in the request, which the tool kept until
/// it returned: a client that dropped its connections mid-call was refused (`429`) for
/// as long as its calls ran, up to an hour.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_call_whose_client_left_holds_no_connection_share() {
    use tokio::io::AsyncWriteExt;
    let root = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let local = sandcell_local::LocalBackend::builder()
        .root(root.path())
        .build()
        .unwrap();
    let mut config = ServerConfig::with_tenants([Tenant::new("alice", ALICE)])
        .unwrap()
        .with_mcp(Arc::new(local.clone()), |b| {
            b.manager_id("sandcell").data_dir(data.path())
        })
        .await
        .unwrap();
    config.max_connections_per_tenant = 1;
    let server = common::serve_built(local, root, config).await;
    // With a share of one connection, each request waits for the last one's
    // connection to be seen closed.
    let mut alice = Mcp {
        url: format!("{}/mcp", server.url),
        token: ALICE,
        session: None,
        next_id: 1,
    };
    let initialize = json!({"method": "initialize", "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "tenancy-test", "version": "0"},
    }});
    let (_, _, session) = served_within_share(&mut alice, initialize).await;
    alice.session = session;
    let initialized = json!({"method": "notifications/initialized"});
    let (status, _, _) = served_within_share(&mut alice, initialized).await;
    assert!(status < 300, "initialized: {status}");
    let warm = json!({"method": "tools/call", "params": {
        "name": "run_command",
        "arguments": {"session": "s", "command": "true"},
    }});
    served_within_share(&mut alice, warm).await;
    let addr = server.url.trim_start_matches("http://").to_owned();
    let body = json!({"jsonrpc": "2.0", "id": 50, "method": "tools/call", "params": {
        "name": "run_command",
        "arguments": {"session": "s", "command": "sleep 30", "timeout_secs": 60},
    }})
    .to_string();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ALICE}\r\n\
         Accept: application/json, text/event-stream\r\nContent-Type: application/json\r\n\
         Mcp-Session-Id: {}\r\nContent-Length: {}\r\n\r\n{body}",
        alice.session.as_deref().unwrap(),
        body.len()
    );
    let mut sent = false;
    for _ in 0..50 {
        let mut call = tokio::net::TcpStream::connect(&addr).await.unwrap();
        call.write_all(head.as_bytes()).await.unwrap();
        // Claimed (and running) unless refused at once for the share.
        let mut first = [0u8; 12];
        match tokio::time::timeout(
            std::time::Duration::from_secs(2),
            tokio::io::AsyncReadExt::read(&mut call, &mut first),
        )
        .await
        {
            Ok(Ok(n)) if first[..n].starts_with(b"HTTP/1.1 429") => {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            _ => {
                // The call is in flight: its client goes away.
                drop(call);
                sent = true;
                break;
            }
        }
    }
    assert!(sent, "the long call never got a connection");
    let started = std::time::Instant::now();
    let mut served = false;
    while started.elapsed() < std::time::Duration::from_secs(10) {
        let (status, _, _) = alice.post(json!({"method": "tools/list"})).await;
        if status == 200 {
            served = true;
            break;
        }
        assert_eq!(status, 429);
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert!(
        served,
        "the tenant was refused for as long as its abandoned call ran"
    );
}

/// `body` sent until it is not refused for the tenant's connection share (its last
/// request's connection not yet seen closed), for up to 5 s.
async fn served_within_share(mcp: &mut Mcp, body: Value) -> (u16, Value, Option<String>) {
    for _ in 0..50 {
        let answer = mcp.post(body.clone()).await;
        if answer.0 != 429 {
            return answer;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("refused for the share for 5 s: {body}");
}
