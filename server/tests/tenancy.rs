//! Two tenants on one sandcell-server, attacking each other through the E2B and Fly
//! faces with plain HTTP: filter and label injection (ADVERSARIAL case 39), oracles
//! and leaks (case 41), and the status codes of oversized or impossible requests
//! (case 34).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use sandcell_remote::e2b::envd;
use sandcell_server::{ServerConfig, Tenant};
use serde_json::{json, Value};

const ALICE: &str = "token-alice";
const BOB: &str = "token-bob";
const SECRET: &str = "hunter2-do-not-echo";
const MACHINES: &str = "/v1/apps/sandcell/machines";

fn two_tenants() -> ServerConfig {
    ServerConfig::with_tenants([
        Tenant::new("alice", ALICE),
        Tenant::new("bob", BOB).max_sandboxes(1),
    ])
    .unwrap()
}

/// One HTTP call with `token` as both faces take it; the status and the JSON body.
async fn call(
    url: &str,
    token: &str,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut request = reqwest::Client::new()
        .request(method, format!("{url}{path}"))
        .header("X-API-Key", token)
        .bearer_auth(token);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

async fn get(url: &str, token: &str, path: &str) -> (u16, Value) {
    call(url, token, reqwest::Method::GET, path, None).await
}

/// An E2B create by `token`: the sandbox id and its envd access token.
async fn e2b_sandbox(url: &str, token: &str, body: Value) -> (String, String) {
    let (status, created) = call(url, token, reqwest::Method::POST, "/sandboxes", Some(body)).await;
    assert_eq!(status, 201, "{created}");
    let field = |name: &str| created[name].as_str().unwrap().to_owned();
    (field("sandboxID"), field("envdAccessToken"))
}

/// Destroys every sandbox the server's backend holds, so no mount or process outlives
/// the test.
async fn clean(server: &common::TestServer) {
    use sandcell::SandboxBackend;
    for sandbox in server.local.list(&Default::default()).await.unwrap() {
        server.local.destroy(&sandbox.id).await.unwrap();
    }
}

fn ids(listed: &Value) -> Vec<String> {
    listed
        .as_array()
        .unwrap_or_else(|| panic!("not a list: {listed}"))
        .iter()
        .map(|s| {
            s.get("sandboxID")
                .or_else(|| s.get("id"))
                .and_then(Value::as_str)
                .unwrap()
                .to_owned()
        })
        .collect()
}

/// ADVERSARIAL case 39 on the E2B face: bob's `metadata` filter naming the server's
/// tenant label is refused (it once replaced bob's scope and listed alice's
/// sandboxes), a plain filter stays within bob's scope, a create cannot set the
/// server's labels, and alice's env is not echoed in her sandbox's metadata.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adversarial_39_e2b_list_filters_cannot_widen_the_tenant_scope() {
    let server = common::serve_local_with(two_tenants()).await;
    let url = &server.url;
    let spec = json!({"template": "default", "env": {"DB_PASSWORD": SECRET}}).to_string();
    let (alice_id, _) = e2b_sandbox(
        url,
        ALICE,
        json!({
            "templateID": "base",
            "envVars": {"DB_PASSWORD": SECRET},
            "metadata": {"team": "red", "sandcell.spec": spec},
        }),
    )
    .await;
    for path in [
        "/v2/sandboxes?metadata=sandcell.server.tenant%3Dalice",
        "/v2/sandboxes?metadata=team%3Dred%26sandcell.server.tenant%3Dalice",
        "/sandboxes?metadata=sandcell.server.tenant%3Dalice",
        "/v2/sandboxes?metadata=sandcell.server.app%3De2b",
    ] {
        let (status, body) = get(url, BOB, path).await;
        assert_eq!(status, 400, "{path}: {body}");
        assert_eq!(body["code"], 400, "E2B's error shape: {body}");
        assert!(
            body["message"].as_str().unwrap().contains("reserved"),
            "{body}"
        );
    }
    let (status, listed) = get(url, BOB, "/v2/sandboxes?metadata=team%3Dred").await;
    assert_eq!((status, ids(&listed)), (200, vec![]), "{listed}");
    let (_, listed) = get(url, ALICE, "/v2/sandboxes?metadata=team%3Dred").await;
    assert_eq!(ids(&listed), vec![alice_id.clone()]);

    // A create naming the server's labels is refused, not quietly relabelled.
    let (status, body) = call(
        url,
        BOB,
        reqwest::Method::POST,
        "/sandboxes",
        Some(json!({"templateID": "base", "metadata": {"sandcell.server.tenant": "alice"}})),
    )
    .await;
    assert_eq!(status, 400, "{body}");

    // Alice's own view of her sandbox carries her metadata, not her env.
    for path in [format!("/sandboxes/{alice_id}"), "/v2/sandboxes".to_owned()] {
        let (status, body) = get(url, ALICE, &path).await;
        assert_eq!(status, 200);
        assert!(
            !body.to_string().contains(SECRET),
            "{path} echoed the env: {body}"
        );
        assert!(body.to_string().contains("red"), "{body}");
    }
    clean(&server).await;
}

/// ADVERSARIAL case 39 on the Fly face: a `metadata.` filter or a create naming the
/// server's labels is refused, a plain filter stays within the caller's scope, and a
/// machine's `sandcell.spec` metadata shows no env.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adversarial_39_fly_list_filters_cannot_widen_the_tenant_scope() {
    let server = common::serve_local_with(two_tenants()).await;
    let url = &server.url;
    let machines = MACHINES;
    let spec = json!({"template": "default", "env": {"DB_PASSWORD": SECRET}}).to_string();
    let create = json!({"config": {
        "image": "default",
        "env": {"API_KEY": SECRET},
        "metadata": {"team": "red", "sandcell.spec": spec},
    }});
    let (status, machine) = call(url, ALICE, reqwest::Method::POST, machines, Some(create)).await;
    assert_eq!(status, 200, "{machine}");
    let alice_id = machine["id"].as_str().unwrap().to_owned();
    assert!(!machine.to_string().contains(SECRET), "{machine}");

    for path in [
        format!("{machines}?metadata.sandcell.server.tenant=alice"),
        format!("{machines}?metadata.team=red&metadata.sandcell.server.tenant=alice"),
    ] {
        let (status, body) = get(url, BOB, &path).await;
        assert_eq!(status, 400, "{path}: {body}");
        assert_eq!(body["kind"], "invalid_input", "{body}");
    }
    let (status, listed) = get(url, BOB, &format!("{machines}?metadata.team=red")).await;
    assert_eq!((status, ids(&listed)), (200, vec![]), "{listed}");
    let (_, listed) = get(url, ALICE, &format!("{machines}?metadata.team=red")).await;
    assert_eq!(ids(&listed), vec![alice_id.clone()]);
    let (_, listed) = get(url, ALICE, &format!("{machines}?metadata.team=blue")).await;
    assert_eq!(ids(&listed), Vec::<String>::new());

    let (status, body) = call(
        url,
        BOB,
        reqwest::Method::POST,
        machines,
        Some(json!({"config": {"image": "default", "metadata": {"sandcell.server.tenant": "alice"}}})),
    )
    .await;
    assert_eq!(status, 400, "{body}");

    // Alice's machine, got and listed, shows its spec without the env.
    for path in [format!("{machines}/{alice_id}"), machines.to_owned()] {
        let (status, body) = get(url, ALICE, &path).await;
        assert_eq!(status, 200);
        assert!(
            !body.to_string().contains(SECRET),
            "{path} echoed the env: {body}"
        );
        assert!(body.to_string().contains("sandcell.spec"), "{body}");
    }
    clean(&server).await;
}

/// ADVERSARIAL case 41: envd's routes authenticate before they look the sandbox up, so
/// without a valid token an id that does not exist and another tenant's existing one
/// answer alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adversarial_41_envd_answers_alike_for_unknown_and_others_sandboxes() {
    let server = common::serve_local_with(two_tenants()).await;
    let url = &server.url;
    let (alice_id, _) = e2b_sandbox(url, ALICE, json!({"templateID": "base"})).await;
    let (_, bob_token) = e2b_sandbox(url, BOB, json!({"templateID": "base"})).await;
    let http = reqwest::Client::new();
    let answer = |method: reqwest::Method, path: &str, id: &str, token: Option<&str>| {
        let mut request = http
            .request(method, format!("{url}{path}"))
            .header("E2b-Sandbox-Id", id)
            .header("Content-Type", "application/json")
            .body("{}");
        if let Some(token) = token {
            request = request.header("X-Access-Token", token);
        }
        async move {
            let response = request.send().await.unwrap();
            (response.status().as_u16(), response.text().await.unwrap())
        }
    };
    for (method, path) in [
        (reqwest::Method::GET, "/health"),
        (reqwest::Method::POST, "/filesystem.Filesystem/Stat"),
        (reqwest::Method::POST, "/process.Process/List"),
        (reqwest::Method::GET, "/files?path=x"),
    ] {
        for token in [None, Some("00"), Some(bob_token.as_str())] {
            let existing = answer(method.clone(), path, &alice_id, token).await;
            let unknown = answer(method.clone(), path, "sbx-never-made", token).await;
            assert_eq!(existing, unknown, "{path} with {token:?}");
            assert_eq!(existing.0, 401, "{path} with {token:?}: {}", existing.1);
        }
    }
    clean(&server).await;
}

/// The pid envd's `Start` answers for a command in sandbox `id`.
async fn start_pid(url: &str, id: &str, token: &str) -> u64 {
    let body = json!({"process": {"cmd": "true"}});
    let response = reqwest::Client::new()
        .post(format!("{url}/process.Process/Start"))
        .header("E2b-Sandbox-Id", id)
        .header("X-Access-Token", token)
        .header("Content-Type", envd::STREAM_CONTENT_TYPE)
        .body(envd::frame(0, &serde_json::to_vec(&body).unwrap()).to_vec())
        .send()
        .await
        .unwrap();
    let bytes = response.bytes().await.unwrap();
    let mut decoder = envd::FrameDecoder::default();
    decoder.push(&bytes);
    let (_, first) = decoder.next_frame().unwrap().unwrap();
    let first: Value = serde_json::from_slice(&first).unwrap();
    first["event"]["start"]["pid"]
        .as_u64()
        .unwrap_or_else(|| panic!("no pid in {first}"))
}

/// ADVERSARIAL case 41: envd pids are counted per sandbox, so alice's commands do not
/// move the pids bob sees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adversarial_41_envd_pids_are_counted_per_sandbox() {
    let server = common::serve_local_with(two_tenants()).await;
    let url = &server.url;
    let (alice_id, alice_token) = e2b_sandbox(url, ALICE, json!({"templateID": "base"})).await;
    let (bob_id, bob_token) = e2b_sandbox(url, BOB, json!({"templateID": "base"})).await;
    let first = start_pid(url, &alice_id, &alice_token).await;
    for _ in 0..3 {
        start_pid(url, &alice_id, &alice_token).await;
    }
    assert_eq!(start_pid(url, &bob_id, &bob_token).await, first);
    assert_eq!(start_pid(url, &bob_id, &bob_token).await, first + 1);
    assert_eq!(start_pid(url, &alice_id, &alice_token).await, first + 4);
    clean(&server).await;
}

/// A server with small body limits: 4 KiB of JSON, 1 KiB files.
async fn small_limits() -> common::TestServer {
    let mut config = two_tenants();
    config.max_json_bytes = 4096;
    config.max_file_bytes = 1024;
    common::serve_local_with(config).await
}

/// ADVERSARIAL case 34: a JSON body over the limit is `413` on both faces (the Fly
/// face once answered `422`, the E2B face `400`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adversarial_34_json_bodies_over_the_limit_are_413() {
    let server = small_limits().await;
    let url = &server.url;
    let padding = "x".repeat(8192);
    let big = json!({"config": {"image": "default", "metadata": {"pad": padding}}});
    let (status, body) = call(url, ALICE, reqwest::Method::POST, MACHINES, Some(big)).await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(body["kind"], "limit_exceeded", "{body}");
    let big = json!({"templateID": "base", "metadata": {"pad": padding}});
    let (status, body) = call(url, ALICE, reqwest::Method::POST, "/sandboxes", Some(big)).await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(body["code"], 413, "{body}");
}

/// ADVERSARIAL case 34: a multipart upload over the file limit is `413`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adversarial_34_a_multipart_upload_over_the_limit_is_413() {
    let server = small_limits().await;
    let url = &server.url;
    let (id, token) = e2b_sandbox(url, ALICE, json!({"templateID": "base"})).await;
    let part = reqwest::multipart::Part::bytes(vec![b'y'; 4096]).file_name("big.bin");
    let response = reqwest::Client::new()
        .post(format!("{url}/files"))
        .header("E2b-Sandbox-Id", &id)
        .header("X-Access-Token", &token)
        .multipart(reqwest::multipart::Form::new().part("file", part))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let body = response.text().await.unwrap();
    assert_eq!(status, 413, "{body}");
    clean(&server).await;
}

/// An E2B create over the tenant's quota is `429`, as E2B answers a team over its
/// concurrent sandboxes (it was `403`), naming the limit; sandcell's own E2B client
/// reads it as `LimitExceeded`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_e2b_create_over_the_quota_is_429() {
    let server = common::serve_local_with(two_tenants()).await;
    let url = &server.url;
    e2b_sandbox(url, BOB, json!({"templateID": "base"})).await;
    let (status, body) = call(
        url,
        BOB,
        reqwest::Method::POST,
        "/sandboxes",
        Some(json!({"templateID": "base"})),
    )
    .await;
    assert_eq!(status, 429, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("max_sandboxes"),
        "{body}"
    );
    let config =
        sandcell_remote::e2b::E2bConfig::self_hosted(url, BOB).retry(common::fast_retries());
    let client = sandcell_remote::e2b::E2bBackend::connect(config)
        .await
        .unwrap();
    use sandcell::SandboxBackend;
    let err = client
        .create(&sandcell::SandboxSpec::new("default"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), sandcell::ErrorKind::LimitExceeded, "{err}");
    clean(&server).await;
}

/// ADVERSARIAL case 41: a zero CPU or memory limit is `400` at once (it was a `500`
/// after seconds, naming the host's cgroup directory).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adversarial_41_zero_limits_are_refused_at_once_naming_no_host_path() {
    let server = common::serve_local_with(two_tenants()).await;
    let url = &server.url;
    for guest in [json!({"cpus": 0}), json!({"memory_mb": 0})] {
        let started = Instant::now();
        let create = json!({"config": {"image": "default", "guest": guest}});
        let (status, body) = call(url, ALICE, reqwest::Method::POST, MACHINES, Some(create)).await;
        assert_eq!(status, 400, "{guest}: {body}");
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{guest} took {:?}",
            started.elapsed()
        );
        let text = body.to_string();
        assert!(
            !text.contains("/sys/") && !text.contains("cgroup"),
            "{text}"
        );
    }
    clean(&server).await;
}

/// `cmd` started through envd's `Start` in sandbox `id`, its stream left at once: the
/// pid, or what the server answered instead.
async fn start_detached(url: &str, id: &str, token: &str, cmd: &str) -> Result<u64, String> {
    let body = json!({"process": {"cmd": "/bin/sh", "args": ["-c", cmd]}});
    let response = reqwest::Client::new()
        .post(format!("{url}/process.Process/Start"))
        .header("E2b-Sandbox-Id", id)
        .header("X-Access-Token", token)
        .header("Content-Type", envd::STREAM_CONTENT_TYPE)
        .body(envd::frame(0, &serde_json::to_vec(&body).unwrap()).to_vec())
        .send()
        .await
        .unwrap();
    let status = response.status();
    let mut response = response;
    let mut decoder = envd::FrameDecoder::default();
    while let Ok(Some(chunk)) = response.chunk().await {
        decoder.push(&chunk);
        if let Ok(Some((_, first))) = decoder.next_frame() {
            let first: Value = serde_json::from_slice(&first).unwrap_or_default();
            // The stream is dropped here: the process runs on.
            return first["event"]["start"]["pid"]
                .as_u64()
                .ok_or_else(|| format!("{status} {first}"));
        }
    }
    Err(format!("{status} and no frame"))
}

/// ADVERSARIAL 35, FINDINGS8 T6 and T7: a tenant runs at most `max_commands_per_tenant`
/// commands at once, each counted until it ends, not until its request does. E2B
/// processes outlive their streams by design, and MCP tool calls their clients: one
/// tenant's detached commands held every descriptor of the server, and every other
/// tenant's creates failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adversarial_35_a_tenant_runs_a_bounded_number_of_commands() {
    let mut config = two_tenants();
    config.max_commands_per_tenant = 2;
    let server = common::serve_local_with(config).await;
    let url = &server.url;
    let (alice_id, alice_token) = e2b_sandbox(url, ALICE, json!({"templateID": "base"})).await;
    let (bob_id, bob_token) = e2b_sandbox(url, BOB, json!({"templateID": "base"})).await;
    for _ in 0..2 {
        start_detached(url, &alice_id, &alice_token, "sleep 3")
            .await
            .unwrap();
    }
    let refused = start_detached(url, &alice_id, &alice_token, "true")
        .await
        .expect_err("a third command while two run");
    assert!(refused.contains("commands running"), "{refused}");
    // The Fly face counts the same commands.
    let create = json!({"config": {"image": "default"}});
    let (status, machine) = call(url, ALICE, reqwest::Method::POST, MACHINES, Some(create)).await;
    assert_eq!(status, 200, "{machine}");
    let (status, body) = call(
        url,
        ALICE,
        reqwest::Method::POST,
        &format!("{MACHINES}/{}/exec", machine["id"].as_str().unwrap()),
        Some(json!({"command": ["true"]})),
    )
    .await;
    assert_eq!(body["kind"], "limit_exceeded", "{status} {body}");
    // Another tenant runs its own.
    start_detached(url, &bob_id, &bob_token, "true")
        .await
        .unwrap();
    // Ended, the commands give their places back.
    let mut again = Err(String::new());
    for _ in 0..100 {
        again = start_detached(url, &alice_id, &alice_token, "true").await;
        if again.is_ok() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    again.expect("the places came back once the commands ended");
    clean(&server).await;
}
