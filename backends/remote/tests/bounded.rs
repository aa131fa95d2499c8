//! Bounded work per request (issue 46, item 5), pinned to `../shared/ADVERSARIAL.md`:
//! case 40 (unbounded work per request: a huge listing depth, a huge sparse file, a
//! slow create of another tenant, sandboxes without limits), case 34 (an oversized
//! JSON body) and case 35 (a slow client holding a connection open).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sandcell::testing::MockBackend;
use sandcell::{
    ByteStream, Capabilities, DirEntry, ErrorKind, ExecRequest, FileInfo, LabelSelector, Process,
    SandboxBackend, SandboxBackendExt, SandboxId, SandboxInfo, SandboxPath, SandboxSpec,
};
use sandcell_remote::server::{serve, ServerConfig, Tenant};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A served backend; dropping it stops the server.
struct Served {
    url: String,
    addr: std::net::SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve_backend(backend: Arc<dyn SandboxBackend>, config: ServerConfig) -> Served {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let _ = serve(listener, backend, config, std::future::pending()).await;
    });
    Served {
        url: format!("http://{addr}"),
        addr,
        task,
    }
}

/// An E2B create as `token`'s tenant: the sandbox's id and envd access token.
async fn e2b_sandbox(http: &reqwest::Client, url: &str, token: &str) -> (String, String) {
    let response = http
        .post(format!("{url}/sandboxes"))
        .header("X-API-Key", token)
        .json(&json!({"templateID": "base"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    let created: Value = response.json().await.unwrap();
    let field = |name: &str| created[name].as_str().unwrap().to_owned();
    (field("sandboxID"), field("envdAccessToken"))
}

/// ADVERSARIAL 40: a `ListDir` a billion levels deep is refused at once (it spun a
/// runtime worker with no await point for 127 s in a debug build, then answered `200`).
#[tokio::test]
async fn case40_a_listing_deeper_than_the_cap_is_refused() {
    let served = serve_backend(
        Arc::new(MockBackend::new()),
        ServerConfig::new(common::TOKEN),
    )
    .await;
    let http = reqwest::Client::new();
    let (id, token) = e2b_sandbox(&http, &served.url, common::TOKEN).await;
    let list = |depth: u64| {
        http.post(format!("{}/filesystem.Filesystem/ListDir", served.url))
            .header("E2b-Sandbox-Id", &id)
            .header("X-Access-Token", &token)
            .json(&json!({"path": "/home/user", "depth": depth}))
            .send()
    };
    let refused = list(1_200_000_000).await.unwrap();
    assert_eq!(refused.status(), 400);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["code"], "invalid_argument", "{body}");
    assert!(body["message"].as_str().unwrap().contains("64"), "{body}");
    // The deepest allowed listing of a shallow tree ends with the tree.
    let deepest = list(64).await.unwrap();
    assert_eq!(deepest.status(), 200);
}

