//! sandcell-server's E2B face against E2B's published contracts: every control-plane
//! body it answers (and the bodies a client sends it) validated against `openapi.yml`,
//! and every envd message it answers checked field by field against the two `.proto`
//! files, in protobuf's JSON names. Both are read from `../shared/specs/e2b` at run time.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::openapi::{load_e2b_spec, read_shared, OpenApi};
use sandcell_remote::e2b::envd;
use sandcell_server::ServerConfig;
use serde_json::{json, Value};

/// Each message of a `.proto` file (nested ones by their own name) and its fields'
/// JSON names (lowerCamelCase).
fn proto_messages(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut messages: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut stack: Vec<Option<String>> = Vec::new();
    for raw in text.lines() {
        let line = raw.split("//").next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.first() == Some(&"message") && line.ends_with("{}") {
            messages
                .entry(words[1].trim_end_matches("{}").to_owned())
                .or_default();
            continue;
        }
        if line.ends_with('{') {
            let name = match words.first() {
                Some(&"message") => words.get(1).map(|n| (*n).to_owned()),
                _ => None,
            };
            if let Some(name) = &name {
                messages.entry(name.clone()).or_default();
            }
            // A oneof's fields belong to the message around it.
            let inherited = if words.first() == Some(&"oneof") {
                stack.last().cloned().flatten()
            } else {
                name
            };
            stack.push(inherited);
            continue;
        }
        if line.starts_with('}') {
            stack.pop();
            continue;
        }
        let Some(Some(current)) = stack.last() else {
            continue;
        };
        if let Some(eq) = words.iter().position(|w| *w == "=") {
            if eq >= 1 && !matches!(words[0], "option" | "reserved") {
                let field = words[eq - 1];
                messages.get_mut(current).unwrap().insert(camel(field));
            }
        }
    }
    messages
}

fn camel(snake: &str) -> String {
    let mut out = String::new();
    let mut upper = false;
    for c in snake.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// Checks that `value`'s keys are fields of `message`, and recurses into the fields
/// `nested` names (field → message).
fn check_message(
    protos: &BTreeMap<String, BTreeSet<String>>,
    message: &str,
    value: &Value,
    nested: &[(&str, &str)],
) {
    let fields = protos
        .get(message)
        .unwrap_or_else(|| panic!("the .proto files declare no message {message}"));
    let object = value
        .as_object()
        .unwrap_or_else(|| panic!("{message} is not an object: {value}"));
    for (key, inner) in object {
        assert!(
            fields.contains(key),
            "{message} has no field {key:?} (fields: {fields:?}) in {value}"
        );
        if let Some((_, inner_message)) = nested.iter().find(|(field, _)| field == key) {
            if let Some(items) = inner.as_array() {
                for item in items {
                    check_message(protos, inner_message, item, nested);
                }
            } else {
                check_message(protos, inner_message, inner, nested);
            }
        }
    }
}

fn envd_protos() -> Option<BTreeMap<String, BTreeSet<String>>> {
    let process = read_shared("specs/e2b/envd_process.proto")?;
    let filesystem = read_shared("specs/e2b/envd_filesystem.proto")?;
    let mut all = proto_messages(&process);
    for (name, fields) in proto_messages(&filesystem) {
        all.entry(name).or_default().extend(fields);
    }
    Some(all)
}

fn valid(spec: &OpenApi, schema: &str, value: &Value) {
    if let Err(problems) = spec.validate_schema(schema, value) {
        panic!("{schema} does not match the spec: {problems:?}\n{value:#}");
    }
}

const KEY: &str = common::TOKEN;

struct Client {
    http: reqwest::Client,
    url: String,
}

impl Client {
    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.url))
            .header("X-API-Key", KEY);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    async fn envd(&self, id: &str, token: &str, method: &str, body: Value) -> (u16, Value) {
        let response = self
            .http
            .post(format!("{}/{method}", self.url))
            .header("E2b-Sandbox-Id", id)
            .header("X-Access-Token", token)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// A new sandbox's id and envd access token.
    async fn sandbox(&self) -> (String, String) {
        let body = json!({"templateID": "base"});
        let (status, created) = self
            .call(reqwest::Method::POST, "/sandboxes", Some(body))
            .await;
        assert_eq!(status, 201, "{created}");
        let field = |name: &str| created[name].as_str().unwrap().to_owned();
        (field("sandboxID"), field("envdAccessToken"))
    }

    /// A server-streaming call: every message, then the end frame's JSON.
    async fn envd_stream(
        &self,
        id: &str,
        token: &str,
        method: &str,
        body: Value,
    ) -> (Vec<Value>, Value) {
        let response = self
            .http
            .post(format!("{}/{method}", self.url))
            .header("E2b-Sandbox-Id", id)
            .header("X-Access-Token", token)
            .header("Content-Type", envd::STREAM_CONTENT_TYPE)
            .body(envd::frame(0, &serde_json::to_vec(&body).unwrap()).to_vec())
            .send()
            .await
            .unwrap();
        assert_eq!(
            response.headers()["content-type"],
            envd::STREAM_CONTENT_TYPE,
            "a stream's content type has no parameters"
        );
        let bytes = response.bytes().await.unwrap();
        let mut decoder = envd::FrameDecoder::default();
        decoder.push(&bytes);
        let mut messages = Vec::new();
        while let Some((flags, json)) = decoder.next_frame().unwrap() {
            let value: Value = serde_json::from_slice(&json).unwrap();
            if flags & envd::END_STREAM != 0 {
                assert!(!decoder.has_partial());
                return (messages, value);
            }
            messages.push(value);
        }
        panic!("the stream had no end frame: {messages:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_plane_bodies_match_the_openapi_document() {
    let Some(spec) = load_e2b_spec() else { return };
    let server = common::serve_local_with(ServerConfig::new(KEY)).await;
    let client = Client {
        http: reqwest::Client::new(),
        url: server.url.clone(),
    };
    let create = json!({
        "templateID": "base",
        "timeout": 120,
        "metadata": {"purpose": "contract"},
        "envVars": {"A": "1"},
        "secure": true,
        "allow_internet_access": false
    });
    valid(&spec, "NewSandbox", &create);
    let (status, created) = client
        .call(reqwest::Method::POST, "/v2/sandboxes", Some(create))
        .await;
    assert_eq!(status, 201, "{created}");
    valid(&spec, "Sandbox", &created);
    let id = created["sandboxID"].as_str().unwrap().to_owned();

    let (status, detail) = client
        .call(reqwest::Method::GET, &format!("/sandboxes/{id}"), None)
        .await;
    assert_eq!(status, 200);
    valid(&spec, "SandboxDetail", &detail);
    assert_eq!(detail["metadata"], json!({"purpose": "contract"}));
    // The server's default disk (10 GiB) where the backend gives sandboxes disks.
    let disk_mb = if sandcell::SandboxBackend::capabilities(&server.local).disk_limit {
        10u64 << 10
    } else {
        0
    };
    assert_eq!(detail["diskSizeMB"], json!(disk_mb), "{detail}");

    let (status, listed) = client
        .call(reqwest::Method::GET, "/v2/sandboxes?state=running", None)
        .await;
    assert_eq!(status, 200);
    let items = listed.as_array().unwrap();
    assert_eq!(items.len(), 1);
    for item in items {
        valid(&spec, "ListedSandbox", item);
    }
    let (_, legacy) = client.call(reqwest::Method::GET, "/sandboxes", None).await;
    for item in legacy.as_array().unwrap() {
        valid(&spec, "ListedSandbox", item);
    }

    let (status, metrics) = client
        .call(
            reqwest::Method::GET,
            &format!("/sandboxes/{id}/metrics"),
            None,
        )
        .await;
    assert_eq!(status, 200);
    for item in metrics.as_array().unwrap() {
        valid(&spec, "SandboxMetric", item);
        assert_eq!(item["diskTotal"], json!(disk_mb << 20), "{item}");
    }

    let timeout = json!({"timeout": 60});
    valid(&spec, "SandboxTimeoutRequest", &timeout);
    let (status, _) = client
        .call(
            reqwest::Method::POST,
            &format!("/sandboxes/{id}/timeout"),
            Some(timeout),
        )
        .await;
    assert_eq!(status, 204);
    let (status, _) = client
        .call(
            reqwest::Method::POST,
            &format!("/sandboxes/{id}/pause"),
            None,
        )
        .await;
    assert_eq!(status, 204);
    let (status, again) = client
        .call(
            reqwest::Method::POST,
            &format!("/sandboxes/{id}/pause"),
            None,
        )
        .await;
    assert_eq!(status, 409);
    valid(&spec, "Error", &again);
    let connect = json!({"timeout": 60});
    valid(&spec, "ConnectSandbox", &connect);
    let (status, resumed) = client
        .call(
            reqwest::Method::POST,
            &format!("/v2/sandboxes/{id}/connect"),
            Some(connect),
        )
        .await;
    assert_eq!(status, 201, "a paused sandbox is resumed");
    valid(&spec, "Sandbox", &resumed);

    let (status, _) = client
        .call(reqwest::Method::DELETE, &format!("/sandboxes/{id}"), None)
        .await;
    assert_eq!(status, 204);
    for (method, path, body, expected) in [
        (reqwest::Method::GET, format!("/sandboxes/{id}"), None, 404),
        (
            reqwest::Method::DELETE,
            format!("/sandboxes/{id}"),
            None,
            404,
        ),
        (
            reqwest::Method::POST,
            "/v2/sandboxes".to_owned(),
            Some(json!({"timeout": "x"})),
            400,
        ),
        (
            reqwest::Method::GET,
            "/v2/sandboxes?state=sleeping".to_owned(),
            None,
            400,
        ),
    ] {
        let (status, error) = client.call(method, &path, body).await;
        assert_eq!(status, expected, "{path}: {error}");
        valid(&spec, "Error", &error);
        assert_eq!(error["code"], json!(expected));
    }
    let unauthorized = reqwest::Client::new()
        .get(format!("{}/v2/sandboxes", server.url))
        .header("X-API-Key", "e2b_wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(unauthorized.status().as_u16(), 401);
    valid(&spec, "Error", &unauthorized.json().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envd_messages_match_the_proto_files() {
    let Some(protos) = envd_protos() else { return };
    let server = common::serve_local_with(ServerConfig::new(KEY)).await;
    let client = Client {
        http: reqwest::Client::new(),
        url: server.url.clone(),
    };
    let (id, token) = client.sandbox().await;

    let start = json!({"process": {"cmd": "sh", "args": ["-c", "echo out; echo err >&2; exit 3"]}});
    check_message(
        &protos,
        "StartRequest",
        &start,
        &[("process", "ProcessConfig")],
    );
    let (messages, end) = client
        .envd_stream(&id, &token, "process.Process/Start", start)
        .await;
    assert_eq!(end, json!({}), "the stream ends well");
    let nested = [
        ("event", "ProcessEvent"),
        ("start", "StartEvent"),
        ("data", "DataEvent"),
        ("end", "EndEvent"),
        ("keepalive", "KeepAlive"),
    ];
    for message in &messages {
        check_message(&protos, "StartResponse", message, &nested);
    }
    assert!(messages[0]["event"]["start"]["pid"].as_u64().is_some());
    let last = &messages.last().unwrap()["event"]["end"];
    assert_eq!(last["exitCode"], json!(3));
    assert_eq!(last["exited"], json!(true));

    let (status, written) = client
        .envd(
            &id,
            &token,
            "filesystem.Filesystem/MakeDir",
            json!({"path": "/home/user/d"}),
        )
        .await;
    assert_eq!(status, 200, "{written}");
    let entry_nested = [("entry", "EntryInfo"), ("entries", "EntryInfo")];
    check_message(&protos, "MakeDirResponse", &written, &entry_nested);
    for (method, body, response) in [
        ("Stat", json!({"path": "d"}), "StatResponse"),
        (
            "ListDir",
            json!({"path": "/home/user", "depth": 2}),
            "ListDirResponse",
        ),
        (
            "Move",
            json!({"source": "d", "destination": "e"}),
            "MoveResponse",
        ),
        ("Remove", json!({"path": "e"}), "RemoveResponse"),
    ] {
        let (status, answer) = client
            .envd(
                &id,
                &token,
                &format!("filesystem.Filesystem/{method}"),
                body,
            )
            .await;
        assert_eq!(status, 200, "{method}: {answer}");
        check_message(&protos, response, &answer, &entry_nested);
    }
    let (status, listing) = client
        .envd(&id, &token, "process.Process/List", json!({}))
        .await;
    assert_eq!(status, 200);
    check_message(
        &protos,
        "ListResponse",
        &listing,
        &[("processes", "ProcessInfo"), ("config", "ProcessConfig")],
    );

    // Errors: Connect's shape and codes; a wrong token and a gone sandbox.
    let (status, missing) = client
        .envd(
            &id,
            &token,
            "filesystem.Filesystem/Stat",
            json!({"path": "nope"}),
        )
        .await;
    assert_eq!((status, missing["code"].as_str()), (404, Some("not_found")));
    let (status, outside) = client
        .envd(
            &id,
            &token,
            "filesystem.Filesystem/Stat",
            json!({"path": "/etc/passwd"}),
        )
        .await;
    assert_eq!(
        (status, outside["code"].as_str()),
        (400, Some("invalid_argument"))
    );
    let (status, _) = client
        .envd(
            &id,
            "0".repeat(64).as_str(),
            "filesystem.Filesystem/Stat",
            json!({"path": "d"}),
        )
        .await;
    assert_eq!(status, 401);
    let (status, unknown) = client
        .envd(&id, &token, "filesystem.Filesystem/Teleport", json!({}))
        .await;
    assert_eq!(
        (status, unknown["code"].as_str()),
        (501, Some("unimplemented"))
    );
    client
        .call(reqwest::Method::DELETE, &format!("/sandboxes/{id}"), None)
        .await;
    let (status, gone) = client
        .envd(
            &id,
            &token,
            "filesystem.Filesystem/Stat",
            json!({"path": "d"}),
        )
        .await;
    assert_eq!(status, 502);
    assert!(
        gone["message"].as_str().unwrap().contains("was not found"),
        "{gone}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_cannot_make_envd_hold_unbounded_processes_or_watchers() {
    // The cap per sandbox, past the tenant's (which `sandcell-server`'s bounded tests
    // check).
    let mut config = ServerConfig::new(KEY);
    config.max_watches_per_tenant = 100;
    let server = common::serve_local_with(config).await;
    let client = Client {
        http: reqwest::Client::new(),
        url: server.url.clone(),
    };
    let (id, token) = client.sandbox().await;
    for n in 0..=64 {
        let (status, answer) = client
            .envd(
                &id,
                &token,
                "filesystem.Filesystem/CreateWatcher",
                json!({"path": ""}),
            )
            .await;
        if n < 64 {
            assert_eq!(status, 200, "watcher {n}: {answer}");
        } else {
            assert_eq!(
                (status, answer["code"].as_str()),
                (429, Some("resource_exhausted"))
            );
        }
    }
    let start = |http: reqwest::Client| {
        let (url, id, token) = (server.url.clone(), id.clone(), token.clone());
        async move {
            let body = json!({"process": {"cmd": "sleep", "args": ["60"]}});
            let response = http
                .post(format!("{url}/process.Process/Start"))
                .header("E2b-Sandbox-Id", id)
                .header("X-Access-Token", token)
                .header("Content-Type", envd::STREAM_CONTENT_TYPE)
                .body(envd::frame(0, &serde_json::to_vec(&body).unwrap()).to_vec())
                .send()
                .await
                .unwrap();
            // The first frame: a start, or (once full) the end frame with the refusal.
            let mut stream = response.bytes_stream();
            let mut decoder = envd::FrameDecoder::default();
            loop {
                if let Some((flags, json)) = decoder.next_frame().unwrap() {
                    return (flags, serde_json::from_slice::<Value>(&json).unwrap());
                }
                let chunk = futures::StreamExt::next(&mut stream)
                    .await
                    .unwrap()
                    .unwrap();
                decoder.push(&chunk);
            }
        }
    };
    for n in 0..256 {
        let (flags, first) = start(client.http.clone()).await;
        assert_eq!(flags, 0, "process {n}: {first}");
    }
    let (flags, refused) = start(client.http.clone()).await;
    assert_eq!(flags, envd::END_STREAM);
    assert_eq!(
        refused["error"]["code"],
        json!("resource_exhausted"),
        "{refused}"
    );
    let (status, _) = client
        .call(reqwest::Method::DELETE, &format!("/sandboxes/{id}"), None)
        .await;
    assert_eq!(status, 204);
}

/// ADVERSARIAL case 31 on the E2B face: tenant B's key on tenant A's sandbox answers
/// 404 on every control-plane route, B's envd token does not open A's sandbox, and B's
/// list shows none of A's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenants_sandbox_is_not_found_on_the_e2b_face() {
    use sandcell_server::Tenant;
    let config = ServerConfig::with_tenants([
        Tenant::new("a", KEY),
        Tenant::new("b", "e2b_tenant_b_token"),
    ])
    .unwrap();
    let server = common::serve_local_with(config).await;
    let a = Client {
        http: reqwest::Client::new(),
        url: server.url.clone(),
    };
    let (id, _) = a.sandbox().await;
    let b = |method: reqwest::Method, path: String| {
        reqwest::Client::new()
            .request(method, format!("{}{path}", server.url))
            .header("X-API-Key", "e2b_tenant_b_token")
            .json(&json!({"templateID": "base", "timeout": 30}))
            .send()
    };
    for (method, path) in [
        (reqwest::Method::GET, format!("/sandboxes/{id}")),
        (reqwest::Method::POST, format!("/sandboxes/{id}/timeout")),
        (reqwest::Method::POST, format!("/sandboxes/{id}/pause")),
        (reqwest::Method::POST, format!("/sandboxes/{id}/connect")),
        (reqwest::Method::POST, format!("/v2/sandboxes/{id}/connect")),
        (reqwest::Method::GET, format!("/sandboxes/{id}/metrics")),
        (reqwest::Method::DELETE, format!("/sandboxes/{id}")),
    ] {
        let response = b(method, path.clone()).await.unwrap();
        assert_eq!(response.status().as_u16(), 404, "{path}");
    }
    let listed: Value = b(reqwest::Method::GET, "/v2/sandboxes".to_owned())
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listed, json!([]));
    // B's own sandbox's token does not open A's.
    let b_client = Client {
        http: reqwest::Client::new(),
        url: server.url.clone(),
    };
    let created: Value = b(reqwest::Method::POST, "/sandboxes".to_owned())
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let b_token = created["envdAccessToken"].as_str().unwrap();
    let (status, _) = b_client
        .envd(
            &id,
            b_token,
            "filesystem.Filesystem/Stat",
            json!({"path": ""}),
        )
        .await;
    assert_eq!(status, 401);
    // A's sandbox is untouched.
    let (status, detail) = a
        .call(reqwest::Method::GET, &format!("/sandboxes/{id}"), None)
        .await;
    assert_eq!((status, detail["state"].as_str()), (200, Some("running")));
    // Both tenants' sandboxes go, so no workspace mount or process outlives the test.
    use sandcell::SandboxBackend;
    for sandbox in server.local.list(&Default::default()).await.unwrap() {
        server.local.destroy(&sandbox.id).await.unwrap();
    }
    assert!(server
        .local
        .list(&Default::default())
        .await
        .unwrap()
        .is_empty());
}

/// The `.proto` request message of an envd method, and which of its fields hold which
/// nested messages.
fn envd_request(method: &str) -> (&'static str, Vec<(&'static str, &'static str)>) {
    let selector = ("process", "ProcessSelector");
    let pty = [("pty", "PTY"), ("size", "Size")];
    match method {
        "process.Process/Start" => (
            "StartRequest",
            [("process", "ProcessConfig")]
                .into_iter()
                .chain(pty)
                .collect(),
        ),
        "process.Process/Update" => ("UpdateRequest", [selector].into_iter().chain(pty).collect()),
        "process.Process/SendInput" => (
            "SendInputRequest",
            vec![selector, ("input", "ProcessInput")],
        ),
        "process.Process/SendSignal" => ("SendSignalRequest", vec![selector]),
        "process.Process/CloseStdin" => ("CloseStdinRequest", vec![selector]),
        "filesystem.Filesystem/Stat" => ("StatRequest", vec![]),
        "filesystem.Filesystem/ListDir" => ("ListDirRequest", vec![]),
        "filesystem.Filesystem/MakeDir" => ("MakeDirRequest", vec![]),
        "filesystem.Filesystem/Move" => ("MoveRequest", vec![]),
        "filesystem.Filesystem/Remove" => ("RemoveRequest", vec![]),
        "filesystem.Filesystem/WatchDir" => ("WatchDirRequest", vec![]),
        other => panic!("the provider called envd method {other}, which this test does not know"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_the_e2b_provider_sends_matches_the_specs() {
    use futures::StreamExt;
    use sandcell::{
        ExecRequest, LabelSelector, Network, SandboxBackend, SandboxBackendExt, SandboxPath,
        SandboxSpec, TerminalSize, WatchOptions,
    };
    use sandcell_remote::e2b::{E2bBackend, E2bConfig};

    let (Some(spec), Some(protos)) = (load_e2b_spec(), envd_protos()) else {
        return;
    };
    let server = common::serve_local_with(ServerConfig::new(KEY)).await;
    let proxy = common::proxy::FaultProxy::start(&server.url).await;
    let backend =
        E2bBackend::connect(E2bConfig::self_hosted(proxy.url(), KEY).env("FROM", "config"))
            .await
            .unwrap();
    let p = |s: &str| SandboxPath::new(s).unwrap();

    // Everything the provider does, once.
    let sandbox = backend
        .create(
            &SandboxSpec::new("default")
                .label("team", "contract")
                .env("X", "1")
                .network(Network::None),
        )
        .await
        .unwrap();
    let id = &sandbox.id;
    let listed = backend
        .list(&LabelSelector::new().label("team", "contract"))
        .await
        .unwrap();
    assert_eq!(listed.len(), 1);
    let out = backend
        .run(id, ExecRequest::new(["cat"]).stdin("in"))
        .await
        .unwrap();
    assert_eq!(out.stdout_str(), "in");
    let mut shell = backend
        .exec(id, ExecRequest::new(["sh"]).pty(TerminalSize::new(24, 80)))
        .await
        .unwrap();
    shell.resize(TerminalSize::new(30, 100)).await.unwrap();
    shell.kill().await.unwrap();
    let _ = shell.wait().await;
    let mut interactive = backend.exec(id, ExecRequest::new(["cat"])).await.unwrap();
    drop(interactive.take_stdin());
    interactive.wait().await.unwrap();
    let mut watch = backend
        .watch(id, &SandboxPath::root(), WatchOptions::new())
        .await
        .unwrap();
    backend
        .write(id, &p("d/f.txt"), "data".into())
        .await
        .unwrap();
    assert!(watch.next().await.is_some());
    drop(watch);
    assert_eq!(backend.read(id, &p("d/f.txt")).await.unwrap(), "data");
    backend.stat(id, &p("d/f.txt")).await.unwrap();
    backend.list_dir(id, &p("d")).await.unwrap();
    backend.mkdir(id, &p("e")).await.unwrap();
    backend.rename(id, &p("e"), &p("g")).await.unwrap();
    backend.remove(id, &p("g"), false).await.unwrap();
    let tar = backend.export_tar(id, &p("d")).await.unwrap();
    backend
        .import_tar(id, &p("copy"), tar, Default::default())
        .await
        .unwrap();
    assert_eq!(backend.read(id, &p("copy/f.txt")).await.unwrap(), "data");
    backend.metrics(id).await.unwrap();
    backend.pause(id).await.unwrap();
    backend.resume(id).await.unwrap();
    backend
        .set_timeout(id, std::time::Duration::from_secs(120))
        .await
        .unwrap();
    backend.destroy(id).await.unwrap();

    // Every request, checked against the document that declares it.
    let mut control_routes = BTreeSet::new();
    let mut envd_methods = BTreeSet::new();
    for request in proxy.requests() {
        let path = request.path.as_str();
        let bare = path.split('?').next().unwrap_or_default();
        let query: Vec<&str> = path
            .split_once('?')
            .map(|(_, q)| {
                q.split('&')
                    .map(|kv| kv.split('=').next().unwrap_or_default())
                    .collect()
            })
            .unwrap_or_default();
        if bare.contains('.') {
            let method = bare.trim_start_matches('/');
            let streamed = request
                .content_type
                .as_deref()
                .is_some_and(|t| t.starts_with(envd::STREAM_CONTENT_TYPE));
            let json = if streamed {
                let mut decoder = envd::FrameDecoder::default();
                decoder.push(&request.body);
                let (flags, json) = decoder.next_frame().unwrap().expect("one whole frame");
                assert_eq!(flags, 0, "{method}: an uncompressed message");
                json.to_vec()
            } else {
                request.body.clone()
            };
            let value: Value = serde_json::from_slice(&json).expect("envd requests are JSON");
            let (message, nested) = envd_request(method);
            check_message(&protos, message, &value, &nested);
            envd_methods.insert(method.to_owned());
        } else if bare == "/files" {
            for name in &query {
                assert!(["path", "username"].contains(name), "/files?{name}");
            }
            envd_methods.insert(format!("{} /files", request.method));
        } else {
            let route = spec
                .match_path(&request.method, path)
                .unwrap_or_else(|| panic!("{} {path} is not in openapi.yml", request.method));
            let declared = spec
                .query_parameters(&request.method, &route)
                .unwrap_or_default();
            for name in &query {
                assert!(
                    declared.iter().any(|d| d == name),
                    "{} {route}: query parameter {name:?} is not declared ({declared:?})",
                    request.method
                );
            }
            if !request.body.is_empty() {
                let value: Value = serde_json::from_slice(&request.body).unwrap();
                if let Err(problems) = spec.validate_request(&request.method, &route, &value) {
                    panic!("{} {route}: {problems:#?}\n{value:#}", request.method);
                }
            }
            control_routes.insert(format!("{} {route}", request.method));
        }
    }
    // The checks above ran on every kind of call, not on a few.
    for route in [
        "POST /sandboxes",
        "GET /v2/sandboxes",
        "GET /sandboxes/{sandboxID}",
        "DELETE /sandboxes/{sandboxID}",
        "POST /sandboxes/{sandboxID}/pause",
        "POST /sandboxes/{sandboxID}/connect",
        "POST /sandboxes/{sandboxID}/timeout",
        "GET /sandboxes/{sandboxID}/metrics",
    ] {
        assert!(
            control_routes.contains(route),
            "{route} was not exercised: {control_routes:?}"
        );
    }
    for method in [
        "process.Process/Start",
        "process.Process/Update",
        "process.Process/SendSignal",
        "process.Process/CloseStdin",
        "process.Process/SendInput",
        "filesystem.Filesystem/Stat",
        "filesystem.Filesystem/ListDir",
        "filesystem.Filesystem/MakeDir",
        "filesystem.Filesystem/Move",
        "filesystem.Filesystem/Remove",
        "filesystem.Filesystem/WatchDir",
        "GET /files",
        "POST /files",
    ] {
        assert!(
            envd_methods.contains(method),
            "{method} was not exercised: {envd_methods:?}"
        );
    }
}
