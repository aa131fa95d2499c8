//! Contract tests: every Fly Machines request the client sends — route, query
//! parameters, JSON body — is checked against the published OpenAPI document read from
//! `../shared/specs/fly/` (never copied here), and the server's machine answers against
//! its `Machine` schema.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;

use common::openapi::{load_fly_spec, OpenApi};
use common::proxy::FaultProxy;
use sandcell::{ExecRequest, Limits, SandboxBackend, SandboxBackendExt, SandboxSpec};
use sandcell_remote::protocol::ExecBody;
use sandcell_remote::{FlyBackend, FlyConfig};
use serde_json::Value;

/// Routes that are sandcell-server's own extensions, not Fly's.
fn is_extension(path: &str) -> bool {
    path.starts_with("/v1/sandcell/") || path.contains("/sandcell/")
}

/// Checks one recorded request against the spec; answers its templated route.
fn check_request(spec: &OpenApi, method: &str, path: &str, body: &[u8]) -> String {
    let route = spec
        .match_path(method, path)
        .unwrap_or_else(|| panic!("{method} {path} is not an operation of the Fly Machines API"));
    if let Some((_, query)) = path.split_once('?') {
        let declared = spec.query_parameters(method, &route).unwrap_or_default();
        for pair in query.split('&') {
            let name = pair.split('=').next().unwrap_or_default();
            assert!(
                declared.iter().any(|d| d == name),
                "{method} {route}: query parameter {name:?} is not declared (declared: {declared:?})"
            );
        }
    }
    if !body.is_empty() {
        let value: Value = serde_json::from_slice(body).expect("request bodies are JSON");
        if let Err(violations) = spec.validate_request(method, &route, &value) {
            panic!("{method} {route}: the body breaks the schema: {violations:#?}\n{value:#}");
        }
    }
    route
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_fly_request_matches_the_published_spec() {
    let Some(spec) = load_fly_spec() else { return };
    // The checker must be able to fail: an undeclared field is refused.
    assert!(spec
        .validate_request(
            "post",
            "/apps/{app_name}/machines",
            &serde_json::json!({"config": {"image": "x"}, "sandcell": true}),
        )
        .is_err());

    let server = common::serve_local().await;
    let proxy = FaultProxy::start(&server.url).await;
    let config = FlyConfig::new(proxy.url(), common::TOKEN)
        .app("contract")
        .region("ord")
        .retry(common::fast_retries());
    let backend = FlyBackend::connect(config).await.unwrap();

    let mut limits = Limits::new();
    limits.cpu_millis = Some(1500);
    limits.memory_bytes = Some(256 << 20);
    let mut spec_in = SandboxSpec::new("default")
        .label("sandcell.tenant", "acme")
        .env("GREETING", "hi");
    spec_in.limits = limits;
    let sandbox = backend.create(&spec_in).await.unwrap();
    backend.inspect(&sandbox.id).await.unwrap();
    backend.list(&sandcell::LabelSelector::new()).await.unwrap();
    backend.pause(&sandbox.id).await.unwrap();
    backend.resume(&sandbox.id).await.unwrap();
    backend.reset(&sandbox.id).await.unwrap();
    let out = backend
        .run(
            &sandbox.id,
            ExecRequest::new(["sh", "-c", "echo $GREETING"]),
        )
        .await
        .unwrap();
    assert_eq!(out.stdout_str(), "hi\n");
    // The plain-Fly calls the backend makes only on endpoints without extensions.
    let control = backend.control_plane();
    let answer = control
        .exec(
            sandbox.id.as_str(),
            &ExecBody {
                command: vec!["cat".into()],
                stdin: Some("piped".into()),
                timeout: Some(5),
            },
        )
        .await
        .unwrap();
    assert_eq!(
        (answer.exit_code, answer.stdout.as_str()),
        (Some(0), "piped")
    );
    control.stop(sandbox.id.as_str()).await.unwrap();
    control.start(sandbox.id.as_str()).await.unwrap();

    // The server's own answers follow the spec's Machine schema.
    let machine: Value = reqwest::Client::new()
        .get(format!(
            "{}/v1/apps/contract/machines/{}",
            server.url, sandbox.id
        ))
        .bearer_auth(common::TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    spec.validate_schema("Machine", &machine)
        .unwrap_or_else(|v| panic!("a machine answer breaks the schema: {v:#?}"));
    assert_eq!(machine["region"], "ord");
    assert_eq!(machine["state"], "started");

    backend.destroy(&sandbox.id).await.unwrap();
    backend.destroy(&sandbox.id).await.unwrap();

    let mut routes = BTreeSet::new();
    for request in proxy.requests() {
        if is_extension(&request.path) {
            continue;
        }
        let route = check_request(&spec, &request.method, &request.path, &request.body);
        routes.insert(format!("{} {route}", request.method));
    }
    let expected = [
        "POST /apps/{app_name}/machines",
        "GET /apps/{app_name}/machines",
        "GET /apps/{app_name}/machines/{machine_id}",
        "DELETE /apps/{app_name}/machines/{machine_id}",
        "GET /apps/{app_name}/machines/{machine_id}/wait",
        "POST /apps/{app_name}/machines/{machine_id}/suspend",
        "POST /apps/{app_name}/machines/{machine_id}/start",
        "POST /apps/{app_name}/machines/{machine_id}/stop",
        "POST /apps/{app_name}/machines/{machine_id}/restart",
        "POST /apps/{app_name}/machines/{machine_id}/exec",
    ];
    for route in expected {
        assert!(
            routes.contains(route),
            "{route} was never exercised: {routes:#?}"
        );
    }

    // What the create carried: Fly's fields from the spec, labels as metadata.
    let create = proxy
        .requests()
        .into_iter()
        .find(|r| r.method == "POST" && r.path == "/v1/apps/contract/machines")
        .unwrap();
    let body: Value = serde_json::from_slice(&create.body).unwrap();
    assert_eq!(body["config"]["image"], "default");
    assert_eq!(body["config"]["guest"]["cpus"], 2);
    assert_eq!(body["config"]["guest"]["memory_mb"], 256);
    assert_eq!(body["config"]["env"]["GREETING"], "hi");
    assert_eq!(body["config"]["metadata"]["sandcell.tenant"], "acme");
    assert_eq!(body["region"], "ord");
    assert!(body["name"].as_str().unwrap().starts_with("sandcell-"));
}
