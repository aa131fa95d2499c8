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

/// ADVERSARIAL 40: a huge sparse file (and a link to it) is refused by the wire
/// protocol's read and the E2B face's `/files` before it is read, with a typed
/// `LimitExceeded` / `413`; a small file still reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case40_a_huge_sparse_file_is_refused_not_buffered() {
    let mut config = ServerConfig::new(common::TOKEN);
    config.max_file_bytes = 1 << 20;
    let server = common::serve_local_with(config).await;
    let client = common::client(&server.url).await;
    let make_files = "truncate -s 256M big.bin && ln -s big.bin link && echo hi > small.txt";

    // The wire protocol's read (RemoteBackend).
    let sandbox = client.create(&SandboxSpec::new("default")).await.unwrap();
    let made = client.run_shell(&sandbox.id, make_files).await.unwrap();
    assert_eq!(made.status.code, Some(0), "{}", made.stderr_str());
    for name in ["big.bin", "link"] {
        let path = SandboxPath::new(name).unwrap();
        let err = client.read(&sandbox.id, &path).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::LimitExceeded, "{name}: {err}");
        assert!(err.to_string().contains("268435456 bytes"), "{err}");
    }
    let small = SandboxPath::new("small.txt").unwrap();
    assert_eq!(
        &client.read(&sandbox.id, &small).await.unwrap()[..],
        b"hi\n"
    );
    client.destroy(&sandbox.id).await.unwrap();

    // The E2B face's `/files`.
    let http = reqwest::Client::new();
    let (id, token) = e2b_sandbox(&http, &server.url, common::TOKEN).await;
    let sandbox_id = SandboxId::new(&id).unwrap();
    let made = server
        .local
        .run_shell(&sandbox_id, make_files)
        .await
        .unwrap();
    assert_eq!(made.status.code, Some(0), "{}", made.stderr_str());
    for name in ["big.bin", "link", "small.txt"] {
        let response = http
            .get(format!("{}/files", server.url))
            .query(&[("path", name)])
            .header("E2b-Sandbox-Id", &id)
            .header("X-Access-Token", &token)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let body = response.bytes().await.unwrap();
        if name == "small.txt" {
            assert_eq!((status, &body[..]), (200, &b"hi\n"[..]));
        } else {
            assert_eq!(status, 413, "{name}");
            assert!(body.len() < 4096, "{name}: {} bytes answered", body.len());
        }
    }
}

