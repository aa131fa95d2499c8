//! Bounded work per request (issue 46, item 5), pinned to `../shared/ADVERSARIAL.md`:
//! case 40 (unbounded work per request: a huge listing depth, a huge sparse file, a
//! slow create of another tenant, sandboxes without limits), case 34 (an oversized
//! JSON body) and case 35 (a slow client holding a connection open).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use common::serve_backend;
use sandcell::testing::MockBackend;
use sandcell::{
    ByteStream, Capabilities, DirEntry, ErrorKind, ExecRequest, FileInfo, LabelSelector, Process,
    SandboxBackend, SandboxBackendExt, SandboxId, SandboxInfo, SandboxPath, SandboxSpec,
};
use sandcell_server::{ServerConfig, Tenant};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The mock's capabilities with CPU, memory, process and disk limits enforced.
fn limits_enforced() -> Capabilities {
    let mut caps = MockBackend::new().capabilities();
    caps.cpu_limit = true;
    caps.memory_limit = true;
    caps.pids_limit = true;
    caps.disk_limit = true;
    caps
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

/// ADVERSARIAL 40: a `ListDir` whose answer would hold more than the server's cap of
/// entries (100000) is refused with `LimitExceeded`, not built whole; one level of the
/// same tree still lists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case40_a_listing_wider_than_the_cap_is_refused() {
    let server = common::serve_local_with(ServerConfig::new(common::TOKEN)).await;
    let http = reqwest::Client::new();
    let (id, token) = e2b_sandbox(&http, &server.url, common::TOKEN).await;
    let sandbox = SandboxId::new(&id).unwrap();
    // 400 directories of 251 files: 100400 entries two levels down.
    let made = server
        .local
        .run_shell(
            &sandbox,
            "for d in $(seq 400); do mkdir -p wide/d$d && (cd wide/d$d && seq 251 | xargs touch) \
             || exit 1; done",
        )
        .await
        .unwrap();
    assert_eq!(made.status.code, Some(0), "{}", made.stderr_str());
    let list = |depth: u64| {
        http.post(format!("{}/filesystem.Filesystem/ListDir", server.url))
            .header("E2b-Sandbox-Id", &id)
            .header("X-Access-Token", &token)
            .json(&json!({"path": "wide", "depth": depth}))
            .send()
    };
    let refused = list(2).await.unwrap();
    let status = refused.status();
    let body: Value = refused.json().await.unwrap();
    assert!(status.is_client_error(), "{status}: {body}");
    assert!(
        body["message"].as_str().unwrap().contains("100000"),
        "{body}"
    );
    let shallow = list(1).await.unwrap();
    assert_eq!(shallow.status(), 200);
    let listed: Value = shallow.json().await.unwrap();
    assert_eq!(listed["entries"].as_array().unwrap().len(), 400);
    server.local.destroy(&sandbox).await.unwrap();
}

/// ADVERSARIAL 40: a `ListDir` answer is counted in bytes, link targets included, and
/// held within the tenant's transfer budget: 5000 links of 4000-byte targets (20 MB of
/// answer in a listing of 60 KB of names) are refused against a 16 MiB budget, where
/// one call made the server hold 870 MB for 100,000 such links; a small listing is
/// served after, the refusal having held nothing back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case40_a_listing_of_long_link_targets_is_held_within_the_budget() {
    let mut config = ServerConfig::new(common::TOKEN);
    config.max_file_bytes = 8 << 20;
    config.max_transfer_bytes_per_tenant = 16 << 20;
    let server = common::serve_local_with(config).await;
    let http = reqwest::Client::new();
    let (id, token) = e2b_sandbox(&http, &server.url, common::TOKEN).await;
    let sandbox = SandboxId::new(&id).unwrap();
    let made = server
        .local
        .run_shell(
            &sandbox,
            "mkdir links small escaped && touch small/a && t=$(head -c 4000 /dev/zero | tr '\\0' a) \
             && i=0 && while [ $i -lt 5000 ]; do ln -s $t links/$i || exit 1; i=$((i+1)); done \
             && t=$(head -c 4000 /dev/zero | tr '\\0' '\\001') \
             && i=0 && while [ $i -lt 800 ]; do ln -s \"$t\" escaped/$i || exit 1; i=$((i+1)); done",
        )
        .await
        .unwrap();
    assert_eq!(made.status.code, Some(0), "{}", made.stderr_str());
    let list = |path: &'static str| {
        http.post(format!("{}/filesystem.Filesystem/ListDir", server.url))
            .header("E2b-Sandbox-Id", &id)
            .header("X-Access-Token", &token)
            .json(&json!({"path": path, "depth": 1}))
            .send()
    };
    let refused = list("links").await.unwrap();
    let status = refused.status();
    let body = refused.text().await.unwrap();
    let head: String = body.chars().take(300).collect();
    assert!(
        status.is_client_error(),
        "{status}, {} bytes: {head}",
        body.len()
    );
    // 3.2 MB of link targets, 19 MB as JSON escapes them: counted as JSON.
    let escaped = list("escaped").await.unwrap();
    assert_eq!(
        escaped.status(),
        429,
        "{} bytes",
        escaped.text().await.unwrap().len()
    );
    let small = list("small").await.unwrap();
    assert_eq!(small.status(), 200);
    let listed: Value = small.json().await.unwrap();
    assert_eq!(listed["entries"].as_array().unwrap().len(), 1, "{listed}");
    server.local.destroy(&sandbox).await.unwrap();
}

/// ADVERSARIAL 40: a listing reads a directory whole before it can count its entries,
/// so it takes room for a whole directory from the budget first (all of a budget under
/// 64 MiB): with a stalled 8 MiB download holding part of a 16 MiB budget, a listing
/// of one file is refused (`429`); once the download goes, it is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case40_a_listing_is_read_only_with_room_for_a_whole_directory() {
    let mut config = ServerConfig::new(common::TOKEN);
    config.max_file_bytes = 16 << 20;
    config.max_transfer_bytes_per_tenant = 16 << 20;
    let server = common::serve_local_with(config).await;
    let http = reqwest::Client::new();
    let (id, access) = e2b_sandbox(&http, &server.url, common::TOKEN).await;
    let sandbox = SandboxId::new(&id).unwrap();
    let made = server
        .local
        .run_shell(
            &sandbox,
            "head -c 8388608 /dev/zero > f.bin && mkdir small && touch small/a",
        )
        .await
        .unwrap();
    assert!(made.success(), "{}", made.stderr_str());
    let list = || {
        http.post(format!("{}/filesystem.Filesystem/ListDir", server.url))
            .header("E2b-Sandbox-Id", &id)
            .header("X-Access-Token", &access)
            .json(&json!({"path": "small", "depth": 1}))
            .send()
    };
    let stalled = stalled_download(&server.url, &id, &access).await;
    assert_eq!(
        list().await.unwrap().status(),
        429,
        "no room for a directory"
    );
    drop(stalled);
    let mut status = 0;
    for _ in 0..50 {
        status = list().await.unwrap().status().as_u16();
        if status == 200 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(status, 200, "served once the download went");
    server.local.destroy(&sandbox).await.unwrap();
}

/// ADVERSARIAL 40: downloads a client asks for and never reads hold no more than its
/// tenant's transfer budget (the server held a whole file per request: thirty such
/// requests took 2 GB). With one 12 MiB download stalled, another is `429`, and so is
/// an 8 MiB upload; another tenant's download is served; once the stalled connection
/// closes, the file is served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case40_downloads_nobody_reads_hold_a_bounded_budget() {
    const OTHER: &str = "second-tenant-token";
    let mut config = ServerConfig::with_tenants([
        Tenant::new("first", common::TOKEN),
        Tenant::new("second", OTHER),
    ])
    .unwrap();
    config.max_file_bytes = 16 << 20;
    config.max_transfer_bytes_per_tenant = 16 << 20;
    let server = common::serve_local_with(config).await;
    let http = reqwest::Client::new();
    let mut sandboxes = Vec::new();
    for token in [common::TOKEN, OTHER] {
        let (id, access) = e2b_sandbox(&http, &server.url, token).await;
        let sandbox = SandboxId::new(&id).unwrap();
        let made = server
            .local
            .run_shell(&sandbox, "head -c 12582912 /dev/zero > f.bin")
            .await
            .unwrap();
        assert!(made.success(), "{}", made.stderr_str());
        sandboxes.push((id, access));
    }
    let get = |(id, access): &(String, String)| {
        http.get(format!("{}/files", server.url))
            .query(&[("path", "f.bin")])
            .header("E2b-Sandbox-Id", id)
            .header("X-Access-Token", access)
            .send()
    };

    let (id, access) = &sandboxes[0];
    let stalled = stalled_download(&server.url, id, access).await;

    let refused = get(&sandboxes[0]).await.unwrap();
    assert_eq!(
        refused.status(),
        429,
        "a second download while the first is held"
    );
    let upload = http
        .post(format!("{}/files", server.url))
        .query(&[("path", "up.bin")])
        .header("E2b-Sandbox-Id", id)
        .header("X-Access-Token", access)
        .header("Content-Type", "application/octet-stream")
        .body(vec![7u8; 8 << 20])
        .send()
        .await;
    // Refused from its Content-Length, before the body is read: a client still
    // writing may see the connection close rather than the 429 (a loaded machine).
    match upload {
        Ok(upload) => assert_eq!(upload.status(), 429, "an upload the budget cannot hold"),
        Err(e) => assert!(e.is_request(), "an upload refused mid-body: {e}"),
    }
    let nothing = server
        .local
        .stat(&SandboxId::new(id).unwrap(), &"up.bin".parse().unwrap())
        .await;
    assert_eq!(
        nothing.map(|_| ()).unwrap_err().kind(),
        ErrorKind::NotFound,
        "nothing of the refused upload written"
    );
    let other = get(&sandboxes[1]).await.unwrap();
    assert_eq!(other.status(), 200);
    assert_eq!(other.bytes().await.unwrap().len(), 12 << 20);

    drop(stalled);
    let mut served = None;
    for _ in 0..50 {
        let answer = get(&sandboxes[0]).await.unwrap();
        if answer.status() == 200 {
            served = Some(answer.bytes().await.unwrap().len());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        served,
        Some(12 << 20),
        "the budget came back once the client left"
    );
    for (id, _) in &sandboxes {
        server
            .local
            .destroy(&SandboxId::new(id).unwrap())
            .await
            .unwrap();
    }
}

/// One wire frame: length (of what follows it), kind, request id, payload.
fn wire_frame(kind: u8, id: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = ((9 + payload.len()) as u32).to_be_bytes().to_vec();
    out.push(kind);
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// ADVERSARIAL 40 on the wire protocol: a client that grants itself all the credit it
/// likes and reads nothing has the server hold no more than its tenant's budget
/// (each 16 MiB read held its file's 16 MiB in the connection's queue after the
/// budget let it go: twelve such reads took 240 MB). With a 32 MiB budget, the third
/// read is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case40_wire_reads_nobody_reads_hold_a_bounded_budget() {
    let mut config = ServerConfig::new(common::TOKEN);
    config.max_file_bytes = 16 << 20;
    config.max_transfer_bytes_per_tenant = 32 << 20;
    let server = common::serve_local_with(config).await;
    let client = common::client(&server.url).await;
    let sandbox = client.create(&SandboxSpec::new("default")).await.unwrap();
    let made = client
        .run_shell(&sandbox.id, "head -c 16777216 /dev/zero > big")
        .await
        .unwrap();
    assert!(made.success(), "{}", made.stderr_str());

    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let addr = server.url.trim_start_matches("http://").parse().unwrap();
    let mut wire = socket.connect(addr).await.unwrap();
    let upgrade = format!(
        "GET /v1/apps/sandcell/machines/{}/sandcell/wire HTTP/1.1\r\nHost: x\r\n\
         Authorization: Bearer {}\r\nConnection: upgrade\r\nUpgrade: sandcell-wire\r\n\r\n",
        sandbox.id,
        common::TOKEN
    );
    wire.write_all(upgrade.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        head.push(wire.read_u8().await.unwrap());
    }
    assert!(
        head.starts_with(b"HTTP/1.1 101"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    for id in 1..=3u64 {
        let call = wire_frame(1, id, br#"{"op":"read","path":"big"}"#);
        let credit = wire_frame(8, id, &[0, 0x7f, 0xff, 0xff, 0xff]);
        wire.write_all(&[call, credit].concat()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // Now read, looking for request 3's reply among the queued data.
    let reply = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let len = wire.read_u32().await.unwrap() as usize;
            let kind = wire.read_u8().await.unwrap();
            let id = wire.read_u64().await.unwrap();
            let mut payload = vec![0u8; len - 9];
            wire.read_exact(&mut payload).await.unwrap();
            if kind == 5 && id == 3 {
                return String::from_utf8(payload).unwrap();
            }
        }
    })
    .await
    .expect("request 3 was answered");
    assert!(
        reply.contains("limit_exceeded") && reply.contains("in flight"),
        "{reply}"
    );
    drop(wire);
    client.destroy(&sandbox.id).await.unwrap();
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

    // The wire protocol's read (FlyBackend).
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
    // Left behind, it would keep its mounts (and, as root, its disk's loop device).
    server.local.destroy(&sandbox_id).await.unwrap();
}

/// A backend whose creates for tenant `a` wait until the test lets them go.
struct Gated {
    inner: MockBackend,
    gate: Arc<tokio::sync::Semaphore>,
    entered: Arc<tokio::sync::Notify>,
}

#[async_trait]
impl SandboxBackend for Gated {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn create(&self, spec: &SandboxSpec) -> sandcell::Result<SandboxInfo> {
        if spec
            .labels
            .get("sandcell.server.tenant")
            .map(String::as_str)
            == Some("a")
        {
            self.entered.notify_one();
            let _permit = self.gate.acquire().await;
        }
        self.inner.create(spec).await
    }
    async fn inspect(&self, id: &SandboxId) -> sandcell::Result<SandboxInfo> {
        self.inner.inspect(id).await
    }
    async fn list(&self, selector: &LabelSelector) -> sandcell::Result<Vec<SandboxInfo>> {
        self.inner.list(selector).await
    }
    async fn destroy(&self, id: &SandboxId) -> sandcell::Result<()> {
        self.inner.destroy(id).await
    }
    async fn exec(&self, id: &SandboxId, request: ExecRequest) -> sandcell::Result<Process> {
        self.inner.exec(id, request).await
    }
    async fn read(&self, id: &SandboxId, path: &SandboxPath) -> sandcell::Result<bytes::Bytes> {
        self.inner.read(id, path).await
    }
    async fn write(
        &self,
        id: &SandboxId,
        path: &SandboxPath,
        data: bytes::Bytes,
    ) -> sandcell::Result<()> {
        self.inner.write(id, path, data).await
    }
    async fn stat(&self, id: &SandboxId, path: &SandboxPath) -> sandcell::Result<FileInfo> {
        self.inner.stat(id, path).await
    }
    async fn list_dir(
        &self,
        id: &SandboxId,
        path: &SandboxPath,
    ) -> sandcell::Result<Vec<DirEntry>> {
        self.inner.list_dir(id, path).await
    }
    async fn remove(
        &self,
        id: &SandboxId,
        path: &SandboxPath,
        recursive: bool,
    ) -> sandcell::Result<()> {
        self.inner.remove(id, path, recursive).await
    }
    async fn mkdir(&self, id: &SandboxId, path: &SandboxPath) -> sandcell::Result<()> {
        self.inner.mkdir(id, path).await
    }
    async fn rename(
        &self,
        id: &SandboxId,
        from: &SandboxPath,
        to: &SandboxPath,
    ) -> sandcell::Result<()> {
        self.inner.rename(id, from, to).await
    }
    async fn export_tar(&self, id: &SandboxId, path: &SandboxPath) -> sandcell::Result<ByteStream> {
        self.inner.export_tar(id, path).await
    }
    async fn import_tar(
        &self,
        id: &SandboxId,
        path: &SandboxPath,
        tar: ByteStream,
        options: sandcell::archive::ImportOptions,
    ) -> sandcell::Result<()> {
        self.inner.import_tar(id, path, tar, options).await
    }
}

/// ADVERSARIAL 40: while tenant a's create hangs in the backend, tenant b's creates
/// (Fly and E2B) complete: creates are serialised per tenant, never across tenants.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case40_a_hung_create_holds_up_no_other_tenant() {
    let gated = Arc::new(Gated {
        inner: MockBackend::new(),
        gate: Arc::new(tokio::sync::Semaphore::new(0)),
        entered: Arc::new(tokio::sync::Notify::new()),
    });
    let config = ServerConfig::with_tenants([
        Tenant::new("a", "token-a").max_sandboxes(5),
        Tenant::new("b", "token-b").max_sandboxes(5),
    ])
    .unwrap();
    let served = serve_backend(Arc::clone(&gated) as Arc<dyn SandboxBackend>, config).await;
    let http = reqwest::Client::new();
    let fly_create = |token: &'static str| {
        http.post(format!("{}/v1/apps/app/machines", served.url))
            .bearer_auth(token)
            .json(&json!({"config": {"image": "default"}}))
            .send()
    };
    let hung = tokio::spawn(fly_create("token-a"));
    tokio::time::timeout(Duration::from_secs(10), gated.entered.notified())
        .await
        .expect("tenant a's create reached the backend");

    let other = tokio::time::timeout(Duration::from_secs(10), fly_create("token-b"))
        .await
        .expect("tenant b's Fly create waited on tenant a's")
        .unwrap();
    assert_eq!(other.status(), 200);
    let e2b = tokio::time::timeout(
        Duration::from_secs(10),
        e2b_sandbox(&http, &served.url, "token-b"),
    )
    .await
    .expect("tenant b's E2B create waited on tenant a's");
    assert!(!e2b.0.is_empty());
    assert!(
        !hung.is_finished(),
        "tenant a's create should still be held"
    );

    gated.gate.add_permits(1);
    let released = tokio::time::timeout(Duration::from_secs(10), hung)
        .await
        .expect("tenant a's create finished once let go")
        .unwrap()
        .unwrap();
    assert_eq!(released.status(), 200);
}

/// ADVERSARIAL 40: a Fly and an E2B create that ask for no limits get the server's
/// default CPU, memory, process and disk limits where the backend enforces them, and
/// an operator's own defaults replace them.
#[tokio::test]
async fn case40_fly_and_e2b_sandboxes_get_default_limits() {
    let mock = MockBackend::new().set_capabilities(limits_enforced());
    let mut config = ServerConfig::new(common::TOKEN);
    config.default_limits = sandcell::Limits::new()
        .cpu_millis(500)
        .memory_bytes(256 << 20)
        .pids(64);
    let served = serve_backend(Arc::new(mock.clone()), config).await;
    let http = reqwest::Client::new();
    let fly: Value = http
        .post(format!("{}/v1/apps/app/machines", served.url))
        .bearer_auth(common::TOKEN)
        .json(&json!({"config": {"image": "default"}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let (e2b, _) = e2b_sandbox(&http, &served.url, common::TOKEN).await;
    for id in [fly["id"].as_str().unwrap(), e2b.as_str()] {
        let spec = mock.spec_of(&SandboxId::new(id).unwrap()).unwrap();
        assert_eq!(spec.limits.cpu_millis, Some(500), "{id}");
        assert_eq!(spec.limits.memory_bytes, Some(256 << 20), "{id}");
        assert_eq!(spec.limits.pids, Some(64), "{id}");
        assert_eq!(
            spec.limits.disk_bytes, None,
            "{id}: the operator's defaults set none"
        );
    }
    // The server's own defaults include a disk limit.
    let served = serve_backend(Arc::new(mock.clone()), ServerConfig::new(common::TOKEN)).await;
    let (id, _) = e2b_sandbox(&http, &served.url, common::TOKEN).await;
    let spec = mock.spec_of(&SandboxId::new(&id).unwrap()).unwrap();
    assert_eq!(spec.limits.disk_bytes, Some(10 << 30));

    // Without the capabilities, nothing is asked for that the backend would refuse.
    let plain = MockBackend::new();
    let served = serve_backend(Arc::new(plain.clone()), ServerConfig::new(common::TOKEN)).await;
    let (id, _) = e2b_sandbox(&http, &served.url, common::TOKEN).await;
    let spec = plain.spec_of(&SandboxId::new(&id).unwrap()).unwrap();
    assert_eq!(spec.limits, sandcell::Limits::default());
}

/// ADVERSARIAL 34: a JSON body over the server's limit is `413` on the Fly and the
/// E2B face (it was `422` and `400`).
#[tokio::test]
async fn case34_a_json_body_over_the_limit_is_413() {
    let mut config = ServerConfig::new(common::TOKEN);
    config.max_json_bytes = 64 << 10;
    let served = serve_backend(Arc::new(MockBackend::new()), config).await;
    let http = reqwest::Client::new();
    let padding = "x".repeat(128 << 10);
    let fly = http
        .post(format!("{}/v1/apps/app/machines", served.url))
        .bearer_auth(common::TOKEN)
        .json(&json!({"config": {"image": "default", "env": {"PAD": padding}}}))
        .send()
        .await
        .unwrap();
    assert_eq!(fly.status(), 413);
    let body: Value = fly.json().await.unwrap();
    assert_eq!(body["kind"], "limit_exceeded", "{body}");
    let e2b = http
        .post(format!("{}/sandboxes", served.url))
        .header("X-API-Key", common::TOKEN)
        .json(&json!({"templateID": "base", "envVars": {"PAD": padding}}))
        .send()
        .await
        .unwrap();
    assert_eq!(e2b.status(), 413);
    let body: Value = e2b.json().await.unwrap();
    assert_eq!(body["code"], 413, "{body}");
}

/// Reads from `stream` until the server closes it (or `within` passes: `None`).
async fn closed_within(stream: &mut tokio::net::TcpStream, within: Duration) -> Option<Vec<u8>> {
    let mut answered = Vec::new();
    tokio::time::timeout(within, async {
        let mut buf = [0u8; 1024];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => answered.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .ok()?;
    Some(answered)
}

/// ADVERSARIAL 35: a connection that sends half a request head, or nothing, is closed
/// by the server once the header timeout passes (they stayed open indefinitely).
#[tokio::test]
async fn case35_a_half_sent_request_head_is_closed_after_the_header_timeout() {
    let mut config = ServerConfig::new(common::TOKEN);
    config.header_read_timeout = Duration::from_millis(300);
    let served = serve_backend(Arc::new(MockBackend::new()), config).await;
    let mut slow = tokio::net::TcpStream::connect(served.addr).await.unwrap();
    slow.write_all(b"GET /v1/sandcell/capabilities HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let answered = closed_within(&mut slow, Duration::from_secs(10)).await;
    assert!(
        answered.is_some(),
        "the half-sent request was still open after 10 s"
    );
    // So is one that sends nothing at all (it stayed open as long as the client liked).
    let mut silent = tokio::net::TcpStream::connect(served.addr).await.unwrap();
    assert!(
        closed_within(&mut silent, Duration::from_secs(10))
            .await
            .is_some(),
        "a connection that sent nothing was still open after 10 s"
    );
    // A whole request is still answered.
    let response = reqwest::Client::new()
        .get(format!("{}/v1/sandcell/capabilities", served.url))
        .bearer_auth(common::TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
}

/// ADVERSARIAL 35: past `max_connections` the server takes no more connections until
/// one closes; then the waiting one is served.
#[tokio::test]
async fn case35_connections_past_the_cap_wait_for_a_free_slot() {
    let mut config = ServerConfig::new(common::TOKEN);
    config.max_connections = 2;
    let served = serve_backend(Arc::new(MockBackend::new()), config).await;
    let request = format!(
        "GET /v1/sandcell/capabilities HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\
         Connection: close\r\n\r\n",
        common::TOKEN
    );
    let held = [
        tokio::net::TcpStream::connect(served.addr).await.unwrap(),
        tokio::net::TcpStream::connect(served.addr).await.unwrap(),
    ];
    let mut third = tokio::net::TcpStream::connect(served.addr).await.unwrap();
    third.write_all(request.as_bytes()).await.unwrap();
    assert!(
        closed_within(&mut third, Duration::from_millis(500))
            .await
            .is_none(),
        "a third connection was served past a cap of two"
    );
    drop(held);
    let answered = closed_within(&mut third, Duration::from_secs(10))
        .await
        .expect("the third connection was served once a slot was free");
    assert!(
        answered.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&answered)
    );
}

/// Sends `request` on `stream` and reads what comes back within half a second (the
/// whole of a small answer).
async fn ask(stream: &mut tokio::net::TcpStream, request: &str) -> String {
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answered = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(Ok(n)) =
        tokio::time::timeout(Duration::from_millis(500), stream.read(&mut buf)).await
    {
        if n == 0 {
            break;
        }
        answered.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&answered).into_owned()
}

/// ADVERSARIAL 35 across tenants: a tenant holds at most
/// `max_connections_per_tenant` of the server's connections, each counted from its
/// first authenticated request until it closes; past it a request on a new connection
/// is `429` on every face and the connection closes, while another tenant is served.
/// (One tenant's MCP calls left unanswered held every connection: another tenant's
/// list timed out.)
#[tokio::test]
async fn case35_a_tenant_holds_no_more_than_its_share_of_connections() {
    const OTHER: &str = "second-tenant-token";
    let mut config = ServerConfig::with_tenants([
        Tenant::new("first", common::TOKEN),
        Tenant::new("second", OTHER),
    ])
    .unwrap();
    config.max_connections = 8;
    config.max_connections_per_tenant = 2;
    let served = serve_backend(Arc::new(MockBackend::new()), config).await;
    let fly = |token: &str| {
        format!(
            "GET /v1/sandcell/capabilities HTTP/1.1\r\nHost: x\r\n\
             Authorization: Bearer {token}\r\n\r\n"
        )
    };
    let e2b = format!(
        "GET /sandboxes HTTP/1.1\r\nHost: x\r\nX-API-KEY: {}\r\n\r\n",
        common::TOKEN
    );
    let connect = || tokio::net::TcpStream::connect(served.addr);
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut kept = connect().await.unwrap();
        let answer = ask(&mut kept, &fly(common::TOKEN)).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        held.push(kept);
    }
    // Again on a held connection: no second share.
    let answer = ask(&mut held[0], &e2b).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    for request in [fly(common::TOKEN), e2b.clone()] {
        let mut third = connect().await.unwrap();
        third.write_all(request.as_bytes()).await.unwrap();
        let refused = closed_within(&mut third, Duration::from_secs(5))
            .await
            .expect("a connection past the tenant's share was closed");
        let refused = String::from_utf8_lossy(&refused);
        assert!(refused.starts_with("HTTP/1.1 429"), "{refused}");
        assert!(refused.contains("share"), "{refused}");
    }
    let mut other = connect().await.unwrap();
    let answer = ask(&mut other, &fly(OTHER)).await;
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "another tenant: {answer}"
    );
    // A closed connection gives its share back.
    drop(held.pop());
    let mut served_again = false;
    for _ in 0..50 {
        let mut next = connect().await.unwrap();
        if ask(&mut next, &fly(common::TOKEN))
            .await
            .starts_with("HTTP/1.1 200")
        {
            served_again = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(served_again, "a closed connection's share came back");
}

/// A connection upgraded to the wire protocol keeps its tenant's share until it closes:
/// it leaves `max_connections`' count and the idle timeout, and one tenant held 19,979
/// idle wire connections, until the server had no descriptors left for anyone.
#[tokio::test]
async fn case35_wire_connections_hold_their_tenant_s_share() {
    let mut config = ServerConfig::new(common::TOKEN);
    config.max_connections_per_tenant = 2;
    let served = serve_backend(Arc::new(MockBackend::new()), config).await;
    let url = format!("http://{}", served.addr);
    let client = common::client(&url).await;
    let sandbox = client.create(&SandboxSpec::new("default")).await.unwrap();
    drop(client);
    let upgrade = format!(
        "GET /v1/apps/sandcell/machines/{}/sandcell/wire HTTP/1.1\r\nHost: x\r\n\
         Authorization: Bearer {}\r\nConnection: upgrade\r\nUpgrade: sandcell-wire\r\n\r\n",
        sandbox.id,
        common::TOKEN
    );
    let capabilities = format!(
        "GET /v1/sandcell/capabilities HTTP/1.1\r\nHost: x\r\n\
         Authorization: Bearer {}\r\n\r\n",
        common::TOKEN
    );
    let connect = || tokio::net::TcpStream::connect(served.addr);
    // The client's own connections close with it; wait for their shares to come back.
    let mut wires = Vec::new();
    for _ in 0..50 {
        let mut wire = connect().await.unwrap();
        let answer = ask(&mut wire, &upgrade).await;
        if answer.starts_with("HTTP/1.1 101") {
            wires.push(wire);
            if wires.len() == 2 {
                break;
            }
        } else {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    assert_eq!(wires.len(), 2, "two wire connections within the share");
    let mut third = connect().await.unwrap();
    let refused = ask(&mut third, &capabilities).await;
    assert!(refused.starts_with("HTTP/1.1 429"), "{refused}");
    drop(wires.pop());
    let mut served_again = false;
    for _ in 0..50 {
        let mut next = connect().await.unwrap();
        if ask(&mut next, &capabilities)
            .await
            .starts_with("HTTP/1.1 200")
        {
            served_again = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(served_again, "a closed wire connection's share came back");
}

/// A Fly create's head, authenticated, announcing a body of `length` bytes.
fn create_head(length: usize) -> String {
    format!(
        "POST /v1/apps/app/machines HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n",
        common::TOKEN
    )
}

/// ADVERSARIAL 35: a request whose head announces 1000 bytes of body and sends 10,
/// then stalls, is answered `408` and its connection closed once the body timeout
/// passes (it stayed open for as long as the client liked); so is one that trickles
/// its body a byte at a time.
#[tokio::test]
async fn case35_a_stalled_or_trickled_body_is_closed_after_the_body_timeout() {
    let mut config = ServerConfig::new(common::TOKEN);
    config.body_read_timeout = Duration::from_millis(500);
    let served = serve_backend(Arc::new(MockBackend::new()), config).await;

    let mut stalled = tokio::net::TcpStream::connect(served.addr).await.unwrap();
    let started = std::time::Instant::now();
    stalled
        .write_all(format!("{}{{\"config\":", create_head(1000)).as_bytes())
        .await
        .unwrap();
    let answered = closed_within(&mut stalled, Duration::from_secs(10))
        .await
        .expect("a stalled body's connection was still open after 10 s");
    let elapsed = started.elapsed();
    assert!(
        answered.starts_with(b"HTTP/1.1 408"),
        "{}",
        String::from_utf8_lossy(&answered)
    );
    assert!(
        elapsed >= Duration::from_millis(450),
        "closed after {elapsed:?}"
    );

    // A byte every 100 ms never stalls for 500 ms, but never makes progress either.
    let mut trickled = tokio::net::TcpStream::connect(served.addr).await.unwrap();
    trickled
        .write_all(create_head(1000).as_bytes())
        .await
        .unwrap();
    let (mut reader, mut writer) = trickled.into_split();
    let trickling = tokio::spawn(async move {
        for _ in 0..100 {
            if writer.write_all(b" ").await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let answered = tokio::time::timeout(Duration::from_secs(8), async {
        let mut answered = Vec::new();
        let mut buf = [0u8; 1024];
        loop {
            match reader.read(&mut buf).await {
                Ok(0) | Err(_) => return answered,
                Ok(n) => answered.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .expect("a trickled body's connection was still open after 8 s");
    trickling.abort();
    assert!(
        answered.starts_with(b"HTTP/1.1 408"),
        "{}",
        String::from_utf8_lossy(&answered)
    );
}

/// A slow upload that keeps coming is not cut: a body sent a KiB at a time, with
/// pauses shorter than the body timeout but adding up to several times it, is served.
#[tokio::test]
async fn a_slow_steady_body_is_served() {
    let mut config = ServerConfig::new(common::TOKEN);
    config.body_read_timeout = Duration::from_millis(500);
    let served = serve_backend(Arc::new(MockBackend::new()), config).await;
    let body = json!({"config": {"image": "default", "env": {"PAD": "x".repeat(4000)}}})
        .to_string()
        .into_bytes();
    let mut slow = tokio::net::TcpStream::connect(served.addr).await.unwrap();
    slow.write_all(create_head(body.len()).as_bytes())
        .await
        .unwrap();
    for chunk in body.chunks(1024) {
        tokio::time::sleep(Duration::from_millis(300)).await;
        slow.write_all(chunk).await.unwrap();
    }
    let mut head = [0u8; 12];
    tokio::time::timeout(Duration::from_secs(10), slow.read_exact(&mut head))
        .await
        .expect("an answer")
        .unwrap();
    assert_eq!(&head, b"HTTP/1.1 200", "{}", String::from_utf8_lossy(&head));
}

/// ADVERSARIAL 35: a keep-alive connection idle after its request, and one that never
/// sends a byte, are closed once the idle timeout passes (the first stayed open until
/// the header timeout, the second for as long as the client liked); a request that
/// takes longer than the idle timeout is answered all the same.
#[tokio::test]
async fn case35_an_idle_connection_is_closed_after_the_idle_timeout() {
    let mut config = ServerConfig::new(common::TOKEN);
    config.header_read_timeout = Duration::from_secs(60);
    config.idle_timeout = Duration::from_millis(500);
    let served = serve_backend(Arc::new(MockBackend::new()), config).await;

    let mut kept = tokio::net::TcpStream::connect(served.addr).await.unwrap();
    let request = format!(
        "GET /v1/sandcell/capabilities HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\r\n",
        common::TOKEN
    );
    kept.write_all(request.as_bytes()).await.unwrap();
    let answered = closed_within(&mut kept, Duration::from_secs(10))
        .await
        .expect("an idle keep-alive connection was still open after 10 s");
    assert!(
        answered.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&answered)
    );

    let mut silent = tokio::net::TcpStream::connect(served.addr).await.unwrap();
    assert!(
        closed_within(&mut silent, Duration::from_secs(10))
            .await
            .is_some(),
        "a connection that sent nothing was still open after 10 s"
    );

    // A wait of 2 s, four times the idle timeout, is in flight throughout.
    let http = reqwest::Client::new();
    let machine: Value = http
        .post(format!("{}/v1/apps/app/machines", served.url))
        .bearer_auth(common::TOKEN)
        .json(&json!({"config": {"image": "default"}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let waited = http
        .get(format!(
            "{}/v1/apps/app/machines/{}/wait?state=stopped&timeout=2",
            served.url,
            machine["id"].as_str().unwrap()
        ))
        .bearer_auth(common::TOKEN)
        .send()
        .await
        .expect("a long request was answered, not cut as idle");
    assert_eq!(waited.status(), 408);
}

#[cfg(feature = "mcp")]
mod mcp {
    use super::*;

    /// One MCP JSON-RPC exchange over streamable HTTP: the session id the server
    /// answers with, and the reply whose id is `body`'s (none for a notification).
    async fn post(
        http: &reqwest::Client,
        url: &str,
        session: Option<&str>,
        body: Value,
    ) -> (Option<String>, Value) {
        let mut request = http
            .post(format!("{url}/mcp"))
            .bearer_auth(common::TOKEN)
            .header("Accept", "application/json, text/event-stream")
            .json(&body);
        if let Some(session) = session {
            request = request
                .header("Mcp-Session-Id", session)
                .header("Mcp-Protocol-Version", "2025-06-18");
        }
        let response = request.send().await.unwrap();
        assert!(response.status().is_success(), "{}", response.status());
        let session = response
            .headers()
            .get("mcp-session-id")
            .map(|v| v.to_str().unwrap().to_owned());
        let text = response.text().await.unwrap();
        let reply = text
            .lines()
            .filter_map(|line| line.strip_prefix("data:"))
            .filter_map(|data| serde_json::from_str::<Value>(data.trim()).ok())
            .find(|message| message.get("id").is_some() && message["id"] == body["id"])
            .unwrap_or(Value::Null);
        (session, reply)
    }

    /// A tool call's text and whether it is a tool error.
    async fn call_tool(
        http: &reqwest::Client,
        url: &str,
        session: &str,
        id: u64,
        name: &str,
        arguments: Value,
    ) -> (String, bool) {
        let body = json!({
            "jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": name, "arguments": arguments},
        });
        let (_, reply) = post(http, url, Some(session), body).await;
        let result = &reply["result"];
        let text = result["content"][0]["text"].as_str().unwrap_or_default();
        (text.to_owned(), result["isError"] == json!(true))
    }

    /// ADVERSARIAL 40 on MCP: a session's sandbox gets the server's default limits
    /// (MCP sandboxes got none), and `read_file` of a file over the server's read
    /// limit is a tool error naming the limit, not a read of the whole file.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn case40_mcp_sandboxes_get_default_limits_and_reads_are_capped() {
        let big = vec![b'x'; 2 << 20];
        let mock = MockBackend::new()
            .set_capabilities(limits_enforced())
            .template(
                "default",
                [("big.txt", &big[..]), ("small.txt", &b"hi"[..])],
            )
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut config = ServerConfig::new(common::TOKEN)
            .with_mcp(Arc::new(mock.clone()), |b| b.data_dir(dir.path()))
            .await
            .unwrap();
        config.max_file_bytes = 1 << 20;
        let served = serve_backend(Arc::new(mock.clone()), config).await;
        let http = reqwest::Client::new();
        let init = json!({
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "bounded-test", "version": "0"},
            },
        });
        let (session, reply) = post(&http, &served.url, None, init).await;
        assert!(reply["result"].is_object(), "{reply}");
        let session = session.expect("a session id");
        let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        post(&http, &served.url, Some(&session), initialized).await;

        let args = json!({"session": "s", "path": "small.txt"});
        let (text, failed) = call_tool(&http, &served.url, &session, 1, "read_file", args).await;
        assert_eq!((text.as_str(), failed), ("hi", false));
        let args = json!({"session": "s", "path": "big.txt"});
        let (text, failed) = call_tool(&http, &served.url, &session, 2, "read_file", args).await;
        let head: String = text.chars().take(200).collect();
        assert!(failed, "read_file answered: {head}");
        assert!(text.contains("1048576-byte limit"), "{head}");

        let live = mock.list(&LabelSelector::new()).await.unwrap();
        assert_eq!(live.len(), 1);
        let spec = mock.spec_of(&live[0].id).unwrap();
        assert_eq!(spec.limits.cpu_millis, Some(1000));
        assert_eq!(spec.limits.memory_bytes, Some(512 << 20));
        assert_eq!(spec.limits.pids, Some(1024));
        assert_eq!(spec.limits.disk_bytes, Some(10 << 30));
    }
}

/// ADVERSARIAL 40: a download whose client stops taking chunks is cut short after
/// `held_response_timeout`, and what it held goes back to the budget while the
/// connection is still open: before, a stalled reader held its share for as long as
/// its connection lived (130 s and more).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case40_a_stalled_download_lets_go_of_the_budget() {
    let mut config = ServerConfig::new(common::TOKEN);
    config.max_file_bytes = 16 << 20;
    config.max_transfer_bytes_per_tenant = 16 << 20;
    config.held_response_timeout = std::time::Duration::from_secs(2);
    let server = common::serve_local_with(config).await;
    let http = reqwest::Client::new();
    let (id, access) = e2b_sandbox(&http, &server.url, common::TOKEN).await;
    let sandbox = SandboxId::new(&id).unwrap();
    let made = server
        .local
        .run_shell(&sandbox, "head -c 12582912 /dev/zero > f.bin")
        .await
        .unwrap();
    assert!(made.success(), "{}", made.stderr_str());
    let get = || {
        http.get(format!("{}/files", server.url))
            .query(&[("path", "f.bin")])
            .header("E2b-Sandbox-Id", &id)
            .header("X-Access-Token", &access)
            .send()
    };
    let stalled = stalled_download(&server.url, &id, &access).await;
    assert_eq!(get().await.unwrap().status(), 429, "held while it is taken");
    tokio::time::sleep(std::time::Duration::from_secs(4)).await;
    let served = get().await.unwrap();
    assert_eq!(served.status(), 200, "let go after the stall");
    assert_eq!(served.bytes().await.unwrap().len(), 12 << 20);
    drop(stalled);
    server.local.destroy(&sandbox).await.unwrap();
}

/// A client with a tiny receive window that asks for sandbox `id`'s `f.bin` and,
/// once the answer has begun, reads nothing more: the server holds the download.
async fn stalled_download(url: &str, id: &str, access: &str) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let addr = url.trim_start_matches("http://").parse().unwrap();
    let mut stalled = socket.connect(addr).await.unwrap();
    let request = format!(
        "GET /files?path=f.bin HTTP/1.1\r\nHost: x\r\nE2b-Sandbox-Id: {id}\r\nX-Access-Token: {access}\r\n\r\n"
    );
    stalled.write_all(request.as_bytes()).await.unwrap();
    let mut first = [0u8; 16];
    stalled.read_exact(&mut first).await.unwrap();
    assert_eq!(&first[..12], b"HTTP/1.1 200");
    stalled
}

/// ADVERSARIAL 40: exports nobody reads hold one of the host's blocking threads each,
/// which every tenant's file work shares (520 of them took all 512 and stalled other
/// tenants' lists, creates and the E2B reaper). A tenant streams at most
/// `max_archive_streams_per_tenant` archives at once: past it an export is
/// `LimitExceeded` at once, another tenant's export is served, and once the held ones
/// are dropped the tenant exports again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case40_a_tenant_streams_a_bounded_number_of_archives() {
    const OTHER: &str = "second-tenant-token";
    let mut config = ServerConfig::with_tenants([
        Tenant::new("first", common::TOKEN),
        Tenant::new("second", OTHER),
    ])
    .unwrap();
    config.max_archive_streams_per_tenant = 3;
    let server = common::serve_local_with(config).await;
    let connect = |token: &str| {
        let config = sandcell_remote::FlyConfig::new(&server.url, token);
        sandcell_remote::FlyBackend::connect(config)
    };
    let (first, second) = (
        connect(common::TOKEN).await.unwrap(),
        connect(OTHER).await.unwrap(),
    );
    let mut sandboxes = Vec::new();
    for client in [&first, &second] {
        let sandbox = client.create(&SandboxSpec::new("default")).await.unwrap();
        let made = client
            .run_shell(
                &sandbox.id,
                "mkdir d && head -c 8388608 /dev/urandom > d/f.bin",
            )
            .await
            .unwrap();
        assert!(made.success(), "{}", made.stderr_str());
        sandboxes.push(sandbox.id);
    }
    let dir = SandboxPath::new("d").unwrap();
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(first.export_tar(&sandboxes[0], &dir).await.unwrap());
    }
    let refused = first
        .export_tar(&sandboxes[0], &dir)
        .await
        .map(drop)
        .unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::LimitExceeded, "{refused}");

    let other = second.export_tar(&sandboxes[1], &dir).await.unwrap();
    let read: Vec<_> = futures::StreamExt::collect::<Vec<_>>(other).await;
    let bytes: usize = read.into_iter().map(|chunk| chunk.unwrap().len()).sum();
    assert!(bytes > 8 << 20, "another tenant's export is whole: {bytes}");

    drop(held);
    let mut again = None;
    for _ in 0..50 {
        match first.export_tar(&sandboxes[0], &dir).await {
            Ok(tar) => {
                again = Some(tar);
                break;
            }
            Err(e) if e.kind() == ErrorKind::LimitExceeded => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert!(
        again.is_some(),
        "the dropped exports gave their places back"
    );
    drop(again);
    for (client, id) in [&first, &second].into_iter().zip(&sandboxes) {
        client.destroy(id).await.unwrap();
    }
}

/// A tenant holds at most `max_watches_per_tenant` file watches across the E2B and wire
/// faces; past it another is refused until one ends, and another tenant still
/// watches. (Each is an inotify instance, of which the server's user has 128: one
/// tenant's 127 watchers left every other tenant's watch failing.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case40_a_tenant_holds_a_bounded_number_of_watches() {
    const OTHER: &str = "second-tenant-token";
    let mut config = ServerConfig::with_tenants([
        Tenant::new("first", common::TOKEN),
        Tenant::new("second", OTHER),
    ])
    .unwrap();
    config.max_watches_per_tenant = 2;
    let server = common::serve_local_with(config).await;
    let http = reqwest::Client::new();
    let (id, access) = e2b_sandbox(&http, &server.url, common::TOKEN).await;
    let create = |id: &str, access: &str| {
        http.post(format!(
            "{}/filesystem.Filesystem/CreateWatcher",
            server.url
        ))
        .header("E2b-Sandbox-Id", id)
        .header("X-Access-Token", access)
        .json(&json!({"path": "/home/user", "recursive": false}))
        .send()
    };
    let first = create(&id, &access).await.unwrap();
    assert_eq!(first.status(), 200);
    let first: Value = first.json().await.unwrap();
    // The second through the wire, held open.
    let client = common::client(&server.url).await;
    let sandbox = client.create(&SandboxSpec::new("default")).await.unwrap();
    let held = client
        .watch(&sandbox.id, &SandboxPath::root(), Default::default())
        .await
        .unwrap();
    let refused = create(&id, &access).await.unwrap();
    assert_eq!(refused.status(), 429, "{}", refused.text().await.unwrap());
    let wire_refused = client
        .watch(&sandbox.id, &SandboxPath::root(), Default::default())
        .await
        .err()
        .expect("a third watch over the wire is refused");
    assert_eq!(
        wire_refused.kind(),
        ErrorKind::LimitExceeded,
        "{wire_refused}"
    );
    let (other_id, other_access) = e2b_sandbox(&http, &server.url, OTHER).await;
    let other = create(&other_id, &other_access).await.unwrap();
    assert_eq!(other.status(), 200, "another tenant still watches");
    // Removing one gives its place back.
    let removed = http
        .post(format!(
            "{}/filesystem.Filesystem/RemoveWatcher",
            server.url
        ))
        .header("E2b-Sandbox-Id", &id)
        .header("X-Access-Token", &access)
        .json(&json!({"watcherId": first["watcherId"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(removed.status(), 200);
    let again = create(&id, &access).await.unwrap();
    assert_eq!(again.status(), 200);
    drop(held);
}

/// A connection from `from` (any address on the loopback) to `to`.
async fn connect_from(from: &str, to: std::net::SocketAddr) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
    socket.connect(to).await.unwrap()
}

/// ADVERSARIAL 35, FINDINGS7 S3: connections nobody authenticates on hold none of the
/// server's places for long. One whose request did not authenticate is closed after
/// its answer, and one address holds at most `max_unauthenticated_per_address`
/// connections before any authenticates (the next is closed unserved), while another
/// address, and an authenticated connection, are served. (Forty connections sending a
/// request without a token every 4 s held every place: a tenant's requests timed out.)
#[tokio::test]
async fn case35_unauthenticated_connections_hold_a_bounded_number_of_places() {
    let mut config = ServerConfig::new(common::TOKEN);
    config.max_connections = 16;
    config.max_unauthenticated_per_address = 3;
    let served = serve_backend(Arc::new(MockBackend::new()), config).await;
    let authorized = format!(
        "GET /v1/sandcell/capabilities HTTP/1.1\r\nHost: x\r\n\
         Authorization: Bearer {}\r\n\r\n",
        common::TOKEN
    );
    let anonymous = "GET /v1/sandcell/capabilities HTTP/1.1\r\nHost: x\r\n\r\n";
    let wrong = "GET /v1/apps/a/machines HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer nope\r\n\r\n";
    for request in [anonymous, wrong, "GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n"] {
        let mut stream = connect_from("127.0.0.1", served.addr).await;
        stream.write_all(request.as_bytes()).await.unwrap();
        let answer = closed_within(&mut stream, Duration::from_secs(5))
            .await
            .unwrap_or_else(|| panic!("{request:?} left its connection open"));
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 4"), "{answer}");
    }
    // Three silent connections from one address: a fourth is closed unserved.
    let mut silent = Vec::new();
    for _ in 0..3 {
        silent.push(connect_from("127.0.0.1", served.addr).await);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut fourth = connect_from("127.0.0.1", served.addr).await;
    let _ = fourth.write_all(authorized.as_bytes()).await;
    let unserved = closed_within(&mut fourth, Duration::from_secs(5))
        .await
        .expect("a fourth unauthenticated connection from one address was kept");
    assert!(
        unserved.is_empty(),
        "{}",
        String::from_utf8_lossy(&unserved)
    );
    // Another address is served meanwhile.
    let mut other = connect_from("127.0.0.2", served.addr).await;
    let answer = ask(&mut other, &authorized).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // Authenticated, a connection leaves its address's count.
    let answer = ask(&mut silent[0], &authorized).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let mut fifth = connect_from("127.0.0.1", served.addr).await;
    let answer = ask(&mut fifth, &authorized).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

/// ADVERSARIAL 35, FINDINGS8 T2: an HTTP/2 connection nobody authenticates on is closed
/// outright soon after its answer, even when its client never opens its window for
/// the answer's body (the request stayed in flight, and the connection with its
/// place, for as long as the client liked).
#[tokio::test]
async fn case35_an_unauthenticated_http2_connection_that_never_reads_is_closed() {
    let mut config = ServerConfig::new(common::TOKEN);
    config.max_connections = 4;
    let served = serve_backend(Arc::new(MockBackend::new()), config).await;
    let tcp = tokio::net::TcpStream::connect(served.addr).await.unwrap();
    let (mut client, connection) = h2::client::Builder::new()
        .initial_window_size(0)
        .handshake::<_, bytes::Bytes>(tcp)
        .await
        .unwrap();
    let closed = tokio::spawn(async move {
        let started = std::time::Instant::now();
        let _ = connection.await;
        started.elapsed()
    });
    let request = http::Request::get(format!("http://{}/v1/apps/a/machines", served.addr))
        .body(())
        .unwrap();
    let (answer, _) = client.send_request(request, true).unwrap();
    let answer = answer.await.unwrap();
    assert_eq!(answer.status(), 401);
    // The body is never read: the window stays shut.
    let held_for = tokio::time::timeout(Duration::from_secs(20), closed)
        .await
        .expect("the connection was still open after 20 s")
        .unwrap();
    assert!(held_for < Duration::from_secs(15), "{held_for:?}");
    drop(answer);
}
