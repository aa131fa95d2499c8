//! Property test of the server's request parsing: any create body, path and method a
//! client sends gets an answer in the API's shape (a 2xx, or a 4xx with the error JSON),
//! never a 5xx, and the server keeps serving (ADVERSARIAL.md 34).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use proptest::prelude::*;
use sandcell::SandboxBackend;

/// Create bodies: malformed JSON, wrong types, hostile specs, huge numbers.
fn body() -> impl Strategy<Value = String> {
    prop_oneof![
        "\\PC{0,80}",
        Just("{}".to_owned()),
        Just(r#"{"config":{}}"#.to_owned()),
        Just(r#"{"config":{"image":7}}"#.to_owned()),
        Just(r#"{"config":{"image":"default","guest":{"cpus":4294967295,"memory_mb":18446744073709551615}}}"#.to_owned()),
        Just(r#"{"config":{"image":"default","metadata":{"sandcell.spec":"{\"template\":\"default\",\"workdir\":\"../..\"}"}}}"#.to_owned()),
        Just(r#"{"config":{"image":"default","metadata":{"sandcell.spec":"not json"}}}"#.to_owned()),
        Just(r#"{"config":{"image":"../../etc"}}"#.to_owned()),
        Just(r#"{"config":{"image":"default","env":{"":"x","A\u0000":"y"}}}"#.to_owned()),
        Just(r#"{"name":"\u0000","config":{"image":"default"}}"#.to_owned()),
        Just("[".repeat(10_000)),
        (
            "[a-z_]{1,12}",
            prop_oneof![
                Just("null".to_owned()),
                Just("-1".to_owned()),
                Just("1e400".to_owned()),
                "\"\\PC{0,20}\"",
            ],
        )
            .prop_map(|(key, value)| format!(r#"{{"config":{{"image":"default","{key}":{value}}}}}"#)),
    ]
}

fn route() -> impl Strategy<Value = (String, String)> {
    let method = prop::sample::select(vec!["GET", "POST", "DELETE", "PUT"]);
    let path = prop_oneof![
        Just("/v1/apps/fuzz/machines".to_owned()),
        "/v1/apps/[a-z%./]{0,12}/machines(/[a-z0-9%.-]{0,20}){0,3}",
        Just("/v1/apps/fuzz/machines/../../sandcell/capabilities".to_owned()),
        Just("/v1/apps/fuzz/machines/%00/exec".to_owned()),
        // Percent-encoding that decodes to invalid UTF-8, in each path parameter.
        Just("/v1/apps//machines/%a0".to_owned()),
        Just("/v1/apps/%ff/machines".to_owned()),
        Just("/v1/apps/fuzz/machines/%c3%28/exec".to_owned()),
        "/\\PC{0,30}",
    ];
    (method.prop_map(str::to_owned), path)
}

#[test]
fn any_request_gets_an_answer_in_the_apis_shape() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server = runtime.block_on(common::serve_local());
    let client = reqwest::Client::new();
    let mut config = ProptestConfig::default();
    config.cases = config.cases.min(128);
    // Cases create machines in any app; whatever they left is destroyed below, even
    // when a case fails, so no workspace mount or cgroup outlives the test.
    let cases = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        proptest!(config, |((method, path) in route(), body in body())| {
            let (status, text) = runtime.block_on(async {
                let url = format!("{}{}", server.url, path);
                let Ok(method) = reqwest::Method::from_bytes(method.as_bytes()) else {
                    return (200, String::new());
                };
                let Ok(response) = client
                    .request(method, &url)
                    .bearer_auth(common::TOKEN)
                    .header("content-type", "application/json")
                    .body(body.clone())
                    .send()
                    .await
                else {
                    // A URL reqwest itself refuses never reached the server.
                    return (200, String::new());
                };
                let status = response.status().as_u16();
                (status, response.text().await.unwrap_or_default())
            });
            prop_assert!(status < 500, "{status} for {path}: {text}");
            if status >= 400 {
                let json: serde_json::Value = serde_json::from_str(&text)
                    .map_err(|e| TestCaseError::fail(format!("{status} without JSON ({e}): {text}")))?;
                prop_assert!(json["error"].is_string(), "{text}");
            }
        });
    }));
    let left = runtime.block_on(async {
        for sandbox in server.local.list(&Default::default()).await.unwrap() {
            server.local.destroy(&sandbox.id).await.unwrap();
        }
        server.local.list(&Default::default()).await.unwrap()
    });
    if let Err(panic) = cases {
        std::panic::resume_unwind(panic);
    }
    assert!(left.is_empty(), "{left:?}");
    // Still serving, and every machine a case created can go.
    runtime.block_on(async {
        let list = client
            .get(format!("{}/v1/apps/fuzz/machines", server.url))
            .bearer_auth(common::TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(list.status(), 200);
        let machines: Vec<serde_json::Value> = list.json().await.unwrap();
        for machine in machines {
            let id = machine["id"].as_str().unwrap();
            let gone = client
                .delete(format!("{}/v1/apps/fuzz/machines/{id}", server.url))
                .bearer_auth(common::TOKEN)
                .send()
                .await
                .unwrap();
            assert_eq!(gone.status(), 200);
        }
    });
}
