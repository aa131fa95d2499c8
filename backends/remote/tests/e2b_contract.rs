//! sandcell-server's E2B face against E2B's published contracts: every control-plane
//! body it answers (and the bodies a client sends it) validated against `openapi.yml`,
//! and every envd message it answers checked field by field against the two `.proto`
//! files, in protobuf's JSON names. Both are read from `../shared/specs/e2b` at run time.
#![cfg(feature = "server")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::openapi::{load_e2b_spec, read_shared, OpenApi};
use sandcell_remote::e2b::envd;
use sandcell_remote::server::ServerConfig;
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
    let server = common::serve_local_with(ServerConfig::new(KEY)).await;
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
    use sandcell_remote::server::Tenant;
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
}
