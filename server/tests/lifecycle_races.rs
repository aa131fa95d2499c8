//! Lifecycle calls of one sandbox racing on the server: each face looks at a
//! sandbox's state and then acts on it, so a `connect` that looked while a pause was
//! on its way answered "resumed" and left the sandbox paused (a flake of the E2B
//! client's own tests, under load, before one lock per sandbox).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use sandcell::testing::MockBackend;
use sandcell::{SandboxBackend, SandboxId, SandboxStatus};
use sandcell_server::ServerConfig;
use serde_json::json;

/// How long the backend takes over a pause: long enough that the `connect` sent a
/// quarter of it later lands while it is under way, even on a loaded machine.
const PAUSING: Duration = Duration::from_millis(1500);

async fn post(http: &reqwest::Client, url: String) -> u16 {
    let response = http
        .post(url)
        .header("X-API-Key", common::TOKEN)
        .json(&json!({"timeout": 300}))
        .send()
        .await
        .unwrap();
    response.status().as_u16()
}

#[tokio::test]
async fn a_connect_during_a_pause_resumes_the_sandbox_it_leaves() {
    let mock = MockBackend::new().pause_delay(PAUSING);
    let served = common::serve_backend(
        Arc::new(mock.clone()) as Arc<dyn SandboxBackend>,
        ServerConfig::new(common::TOKEN),
    )
    .await;
    let http = reqwest::Client::new();
    let created: serde_json::Value = http
        .post(format!("{}/sandboxes", served.url))
        .header("X-API-Key", common::TOKEN)
        .json(&json!({"templateID": "base"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created["sandboxID"].as_str().unwrap().to_owned();

    let pausing = tokio::spawn({
        let (http, url) = (http.clone(), format!("{}/sandboxes/{id}/pause", served.url));
        async move { post(&http, url).await }
    });
    tokio::time::sleep(PAUSING / 4).await;
    let connected = post(&http, format!("{}/sandboxes/{id}/connect", served.url)).await;
    assert_eq!(pausing.await.unwrap(), 204);
    assert_eq!(
        connected, 201,
        "the connect waited for the pause and resumed"
    );
    let status = mock
        .inspect(&SandboxId::new(&id).unwrap())
        .await
        .unwrap()
        .status;
    assert_eq!(
        status,
        SandboxStatus::Running,
        "the connect was the last word"
    );
}
