//! The `sandcell-server` binary, started as the README says, answers a FlyBackend.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{free_port, Server};
use sandcell::{ExecRequest, SandboxBackend, SandboxBackendExt, SandboxSpec};
use sandcell_remote::{FlyBackend, FlyConfig};

/// The token the server is started with.
const TOKEN: &str = "test-token";

/// Starts the binary over the local backend with `extra` flags and [`TOKEN`]; answers
/// it and its URL once it listens.
async fn start(root: &std::path::Path, extra: &[&str]) -> (Server, String) {
    start_with_token(root, extra, Some(TOKEN)).await
}

/// Starts the binary with `extra` flags and `token` (none: `extra` names the tenants).
async fn start_with_token(
    root: &std::path::Path,
    extra: &[&str],
    token: Option<&str>,
) -> (Server, String) {
    let port = free_port();
    let mut command = Command::new(env!("CARGO_BIN_EXE_sandcell-server"));
    command
        .args([
            "--backend",
            "local",
            "--listen",
            &format!("127.0.0.1:{port}"),
        ])
        .args(extra)
        .arg("--root")
        .arg(root)
        .env_remove("SANDCELL_SERVER_TOKEN")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if let Some(token) = token {
        command.env("SANDCELL_SERVER_TOKEN", token);
    }
    let server = Server(command.spawn().unwrap());
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "the server never listened");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (server, format!("http://127.0.0.1:{port}"))
}

/// A client of the server at `url`, with the test's token.
async fn client(url: &str) -> FlyBackend {
    FlyBackend::connect(FlyConfig::new(url, TOKEN))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_serves_the_local_backend_on_loopback() {
    let root = tempfile::tempdir().unwrap();
    let (server, url) = start(root.path(), &[]).await;
    let backend = FlyBackend::connect(FlyConfig::new(&url, TOKEN))
        .await
        .unwrap();
    assert_eq!(backend.name(), "remote");
    assert!(backend.has_extensions());
    let sandbox = backend.create(&SandboxSpec::new("default")).await.unwrap();
    let out = backend
        .run(&sandbox.id, ExecRequest::new(["echo", "served"]))
        .await
        .unwrap();
    assert_eq!(out.stdout_str(), "served\n");
    backend.destroy(&sandbox.id).await.unwrap();
    drop(server);
}

#[test]
fn an_empty_token_is_refused() {
    let status = Command::new(env!("CARGO_BIN_EXE_sandcell-server"))
        .env("SANDCELL_SERVER_TOKEN", " ")
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fly_only_serves_a_plain_endpoint_whose_files_move_over_exec() {
    let root = tempfile::tempdir().unwrap();
    let (server, url) = start(root.path(), &["--fly-only"]).await;
    let backend = FlyBackend::connect(FlyConfig::new(&url, TOKEN))
        .await
        .unwrap();
    assert!(!backend.has_extensions(), "no sandcell routes");
    let sandbox = backend.create(&SandboxSpec::new("default")).await.unwrap();
    let path = sandcell::SandboxPath::new("over/exec.txt").unwrap();
    backend
        .write(&sandbox.id, &path, bytes::Bytes::from_static(b"plain"))
        .await
        .unwrap();
    let out = backend
        .run_shell(&sandbox.id, "cat over/exec.txt")
        .await
        .unwrap();
    assert_eq!(out.stdout_str(), "plain");
    assert_eq!(
        &backend.read(&sandbox.id, &path).await.unwrap()[..],
        b"plain"
    );
    backend.destroy(&sandbox.id).await.unwrap();
    drop(server);
}

/// Host mounts are refused by default and allowed read-only beneath
/// `--allow-host-path DIR` (read-write with `DIR:rw`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_mounts_need_allow_host_path() {
    use sandcell::{Mount, SandboxPath};
    let root = tempfile::tempdir().unwrap();
    let host = tempfile::tempdir().unwrap();
    std::fs::write(host.path().join("facts.md"), "fact").unwrap();
    let spec = |read_only: bool| {
        let target = SandboxPath::new("mnt").unwrap();
        SandboxSpec::new("default").mount(if read_only {
            Mount::read_only(host.path(), target)
        } else {
            Mount::read_write(host.path(), target)
        })
    };

    let (server, url) = start(root.path(), &[]).await;
    let backend = FlyBackend::connect(FlyConfig::new(&url, TOKEN))
        .await
        .unwrap();
    assert!(
        !backend.capabilities().host_mounts,
        "none allowed by default"
    );
    assert!(backend.create(&spec(true)).await.is_err());
    drop(server);

    let allowed = host.path().to_str().unwrap().to_owned();
    let (server, url) = start(root.path(), &["--allow-host-path", &allowed]).await;
    let backend = FlyBackend::connect(FlyConfig::new(&url, TOKEN))
        .await
        .unwrap();
    let sandbox = backend.create(&spec(true)).await.unwrap();
    let facts = SandboxPath::new("mnt/facts.md").unwrap();
    assert_eq!(
        &backend.read(&sandbox.id, &facts).await.unwrap()[..],
        b"fact"
    );
    backend.destroy(&sandbox.id).await.unwrap();
    let err = backend.create(&spec(false)).await.unwrap_err();
    assert_eq!(err.kind(), sandcell::ErrorKind::PermissionDenied, "{err}");
    drop(server);

    let writable = format!("{allowed}:rw");
    let (server, url) = start(root.path(), &["--allow-host-path", &writable]).await;
    let backend = FlyBackend::connect(FlyConfig::new(&url, TOKEN))
        .await
        .unwrap();
    if rustix::process::geteuid().is_root() {
        // A root server's sandboxes may not write in a directory root owns (what they
        // made there would be root's on the host): an operator's shared directory
        // belongs to another user.
        let err = backend.create(&spec(false)).await.unwrap_err();
        assert_eq!(err.kind(), sandcell::ErrorKind::PermissionDenied, "{err}");
        std::os::unix::fs::chown(host.path(), Some(4242), Some(4242)).unwrap();
    }
    let sandbox = backend.create(&spec(false)).await.unwrap();
    backend.destroy(&sandbox.id).await.unwrap();
    drop(server);
}

/// The server serves the local backend isolated by default (here: namespaces, as CI
/// installs bubblewrap), so a client's command cannot read a host file outside its
/// sandbox; no isolation only with `--unsafe-no-isolation` (ADVERSARIAL.md 33).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_local_backend_is_served_isolated_unless_the_operator_opts_out() {
    let bwrap = Command::new("bwrap")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .map_err(|e| format!("bubblewrap is not installed ({e})"))
        .and_then(|s| {
            s.success()
                .then_some(())
                .ok_or_else(|| "bwrap failed".to_owned())
        });
    if !sandcell::testing::require_or_skip("NAMESPACES", "bubblewrap", bwrap) {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let host = tempfile::tempdir().unwrap();
    let secret = host.path().join("secret.txt");
    std::fs::write(&secret, "host secret").unwrap();
    let read_secret = format!("cat {}", secret.display());

    let (server, url) = start(root.path(), &[]).await;
    let backend = FlyBackend::connect(FlyConfig::new(&url, TOKEN))
        .await
        .unwrap();
    let sandbox = backend.create(&SandboxSpec::new("default")).await.unwrap();
    let out = backend.run_shell(&sandbox.id, &read_secret).await.unwrap();
    assert!(
        !out.success(),
        "a host file is out of reach: {}",
        out.stdout_str()
    );
    assert!(!out.stdout_str().contains("host secret"));
    // Nor /etc/shadow, the server's data dir, the host's loopback services, or the
    // host's processes (the server's own among them).
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    tcp.set_nonblocking(true).unwrap();
    let port = tcp.local_addr().unwrap().port();
    let server_pid = server.0.id();
    for (what, attack) in [
        ("/etc/shadow", "cat /etc/shadow".to_owned()),
        ("the data dir", format!("ls {}", root.path().display())),
        (
            "host loopback",
            format!("bash -c 'echo hi > /dev/tcp/127.0.0.1/{port}'"),
        ),
        (
            "the server's process",
            format!("cat /proc/{server_pid}/cmdline"),
        ),
    ] {
        let out = backend.run_shell(&sandbox.id, &attack).await.unwrap();
        assert!(
            !out.success(),
            "a served sandbox reached {what}: {}",
            out.stdout_str()
        );
    }
    assert!(
        tcp.accept().is_err(),
        "nothing connected to the host's loopback"
    );
    backend.destroy(&sandbox.id).await.unwrap();
    drop(server);

    // Asking for none is refused at start (status 2) without the opt-out...
    let none = serde_json::json!({"root": root.path(), "isolation": "none"}).to_string();
    let status = Command::new(env!("CARGO_BIN_EXE_sandcell-server"))
        .args([
            "--backend",
            "local",
            "--listen",
            "127.0.0.1:0",
            "--options",
            &none,
        ])
        .env("SANDCELL_SERVER_TOKEN", TOKEN)
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(2));

    // ...and served with it, where the host file is readable: the opt-out means it.
    let (server, url) = start(root.path(), &["--options", &none, "--unsafe-no-isolation"]).await;
    let backend = FlyBackend::connect(FlyConfig::new(&url, TOKEN))
        .await
        .unwrap();
    let sandbox = backend.create(&SandboxSpec::new("default")).await.unwrap();
    let out = backend.run_shell(&sandbox.id, &read_secret).await.unwrap();
    assert_eq!(out.stdout_str(), "host secret");
    backend.destroy(&sandbox.id).await.unwrap();
    drop(server);
}

/// Two tenants from `--tenants FILE`, through real HTTP: each sees and touches only its
/// own machines (another's id answers 404 on every route, the wire upgrade included),
/// a client cannot claim another tenant by label (refused `400`), and quotas refuse
/// with 403 naming the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tenants_are_kept_apart_and_held_to_their_quotas() {
    use sandcell::{ErrorKind, LabelSelector, SandboxPath};
    let root = tempfile::tempdir().unwrap();
    let file = root.path().join("tenants.yaml");
    std::fs::write(
        &file,
        "tenants:\n\
         \x20 - {name: alpha, token: token-alpha, max_sandboxes: 2}\n\
         \x20 - {name: beta, token: token-beta, max_memory_mb: 768}\n",
    )
    .unwrap();
    // A secret file every user may read is refused: sandboxes would read it too.
    let out = Command::new(env!("CARGO_BIN_EXE_sandcell-server"))
        .arg("--tenants")
        .arg(&file)
        .env_remove("SANDCELL_SERVER_TOKEN")
        .output()
        .unwrap();
    assert!(!out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("chmod o-r"),
        "{out:?}"
    );
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let data = root.path().join("data");
    let (server, url) = start_with_token(&data, &["--tenants", file.to_str().unwrap()], None).await;
    let alpha = FlyBackend::connect(FlyConfig::new(&url, "token-alpha"))
        .await
        .unwrap();
    let beta = FlyBackend::connect(FlyConfig::new(&url, "token-beta"))
        .await
        .unwrap();
    let a = alpha.create(&SandboxSpec::new("default")).await.unwrap();
    let b = beta.create(&SandboxSpec::new("default")).await.unwrap();

    // Lists show only the caller's own.
    let ids = |infos: Vec<sandcell::SandboxInfo>| -> Vec<String> {
        infos.into_iter().map(|i| i.id.to_string()).collect()
    };
    let all = LabelSelector::new();
    assert_eq!(ids(alpha.list(&all).await.unwrap()), [a.id.to_string()]);
    assert_eq!(ids(beta.list(&all).await.unwrap()), [b.id.to_string()]);

    // Through the client, every operation on the other's sandbox is NotFound.
    let path = SandboxPath::new("x.txt").unwrap();
    assert_eq!(
        beta.inspect(&a.id).await.unwrap_err().kind(),
        ErrorKind::NotFound
    );
    let run = beta.run(&a.id, ExecRequest::new(["true"])).await;
    assert_eq!(run.unwrap_err().kind(), ErrorKind::NotFound);
    let write = beta
        .write(&a.id, &path, bytes::Bytes::from_static(b"x"))
        .await;
    assert_eq!(write.unwrap_err().kind(), ErrorKind::NotFound);
    assert_eq!(
        beta.pause(&a.id).await.unwrap_err().kind(),
        ErrorKind::NotFound
    );
    // Destroy is idempotent (a missing sandbox is already destroyed): it answers Ok,
    // and alpha's sandbox lives on.
    beta.destroy(&a.id).await.unwrap();
    assert_eq!(alpha.inspect(&a.id).await.unwrap().id, a.id);

    // Raw HTTP, route by route, as beta on alpha's machine.
    let http = reqwest::Client::new();
    let machine = format!("{url}/v1/apps/sandcell/machines/{}", a.id);
    let as_beta = |r: reqwest::RequestBuilder| r.bearer_auth("token-beta");
    let routes = [
        as_beta(http.get(&machine)),
        as_beta(http.delete(&machine)),
        as_beta(http.get(format!("{machine}/wait?state=started&timeout=1"))),
        as_beta(http.post(format!("{machine}/stop"))),
        as_beta(http.post(format!("{machine}/suspend"))),
        as_beta(http.post(format!("{machine}/start"))),
        as_beta(http.post(format!("{machine}/restart"))),
        as_beta(
            http.post(format!("{machine}/exec"))
                .json(&serde_json::json!({
                    "command": ["touch", "/tmp/beta-was-here"]
                })),
        ),
        as_beta(
            http.get(format!("{machine}/sandcell/wire"))
                .header("connection", "upgrade")
                .header("upgrade", "sandcell-wire"),
        ),
        as_beta(
            http.post(format!("{machine}/sandcell/clone"))
                .json(&serde_json::json!({"name": "beta-copy"})),
        ),
    ];
    for request in routes {
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 404, "{:?}", response.url());
    }
    let unknown = http
        .get(format!("{url}/v1/apps/sandcell/machines"))
        .bearer_auth("token-gamma")
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 401);
    // Alpha's machine is untouched: running, and nothing ran in it.
    let out = alpha
        .run_shell(&a.id, "ls /tmp/beta-was-here 2>/dev/null; echo alive")
        .await
        .unwrap();
    assert_eq!(out.stdout_str(), "alive\n");

    // A client's own server labels are refused (ADVERSARIAL case 39): beta cannot
    // claim alpha's tenancy, quota or not.
    let create_as_beta = |metadata: serde_json::Value| {
        let http = http.clone();
        let url = url.clone();
        async move {
            http.post(format!("{url}/v1/apps/sandcell/machines"))
                .bearer_auth("token-beta")
                .json(&serde_json::json!({"config": {"image": "default", "metadata": metadata}}))
                .send()
                .await
                .unwrap()
        }
    };
    let claim = serde_json::json!({"sandcell.server.tenant": "alpha"});
    let claimed = create_as_beta(claim.clone()).await;
    assert_eq!(claimed.status(), 400);
    let body: serde_json::Value = claimed.json().await.unwrap();
    assert_eq!(body["kind"], "invalid_input");
    assert!(
        body["error"].as_str().unwrap().contains("reserved"),
        "{body}"
    );
    let plain = create_as_beta(serde_json::json!({})).await;
    assert_eq!(plain.status(), 403, "beta's memory quota (768 MiB) is full");
    let body: serde_json::Value = plain.json().await.unwrap();
    assert_eq!(body["kind"], "limit_exceeded");
    assert!(
        body["error"].as_str().unwrap().contains("max_memory_mb"),
        "{body}"
    );
    assert_eq!(
        alpha.list(&all).await.unwrap().len(),
        1,
        "nothing landed in alpha"
    );
    beta.destroy(&b.id).await.unwrap();
    assert_eq!(create_as_beta(claim).await.status(), 400);
    assert_eq!(create_as_beta(serde_json::json!({})).await.status(), 200);
    assert_eq!(
        alpha.list(&all).await.unwrap().len(),
        1,
        "still alpha's one"
    );
    assert_eq!(beta.list(&all).await.unwrap().len(), 1, "beta's own");

    // Alpha's sandbox quota: a second (a clone) is fine, a third (created or cloned) is
    // refused naming the limit.
    let a2 = alpha
        .clone_sandbox(&a.id, Default::default())
        .await
        .unwrap();
    let err = alpha
        .create(&SandboxSpec::new("default"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LimitExceeded, "{err}");
    assert!(err.to_string().contains("max_sandboxes (2)"), "{err}");
    let err = alpha
        .clone_sandbox(&a.id, Default::default())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LimitExceeded, "{err}");
    assert_eq!(alpha.list(&all).await.unwrap().len(), 2);
    alpha.destroy(&a2.id).await.unwrap();
    let a3 = alpha.create(&SandboxSpec::new("default")).await.unwrap();

    for id in [&a.id, &a3.id] {
        alpha.destroy(id).await.unwrap();
    }
    for info in beta.list(&all).await.unwrap() {
        beta.destroy(&info.id).await.unwrap();
    }
    drop(server);
    let left: Vec<_> = std::fs::read_dir(data.join("sandboxes"))
        .map(|dir| dir.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "sandbox directories were left: {left:?}");
}

/// A tenants file that would let someone in without a real token is refused at start.
#[test]
fn a_tenants_file_with_a_shared_or_empty_token_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    for body in [
        "tenants:\n  - {name: a, token: same}\n  - {name: b, token: same}\n",
        "tenants:\n  - {name: a, token: \"\"}\n",
        "tenants: []\n",
        "tenants:\n  - {name: a, tokn: typo}\n",
    ] {
        let file = dir.path().join("tenants.yaml");
        std::fs::write(&file, body).unwrap();
        std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_sandcell-server"))
            .arg("--tenants")
            .arg(&file)
            .env_remove("SANDCELL_SERVER_TOKEN")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{body}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("--tenants"), "{stderr}");
        assert!(!stderr.contains("same"), "a token leaked: {stderr}");
    }
}

/// `--tls-cert` and `--tls-key` serve HTTPS; a client trusting the certificate works,
/// the wire protocol's upgrade included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_flags_serve_https() {
    let root = tempfile::tempdir().unwrap();
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let cert_file = root.path().join("cert.pem");
    let key_file = root.path().join("key.pem");
    std::fs::write(&cert_file, cert.cert.pem()).unwrap();
    std::fs::write(&key_file, cert.key_pair.serialize_pem()).unwrap();
    std::fs::set_permissions(
        &key_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let (server, url) = start(
        &root.path().join("data"),
        &[
            "--tls-cert",
            cert_file.to_str().unwrap(),
            "--tls-key",
            key_file.to_str().unwrap(),
        ],
    )
    .await;
    let url = url.replace("http://127.0.0.1", "https://localhost");
    let backend = FlyBackend::connect(FlyConfig::new(&url, TOKEN).ca_certificate(&cert_file))
        .await
        .unwrap();
    let sandbox = backend.create(&SandboxSpec::new("default")).await.unwrap();
    let out = backend.run_shell(&sandbox.id, "echo secure").await.unwrap();
    assert_eq!(out.stdout_str(), "secure\n");
    backend.destroy(&sandbox.id).await.unwrap();
    drop(server);

    // A key without its certificate is a usage error, before anything listens.
    let status = Command::new(env!("CARGO_BIN_EXE_sandcell-server"))
        .args(["--tls-key", key_file.to_str().unwrap()])
        .env("SANDCELL_SERVER_TOKEN", TOKEN)
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(2));
}

/// At `Isolation::Landlock` a full network would be this host's, shared by every
/// client's sandboxes: the server refuses it (ADVERSARIAL 38), and a sandbox without
/// one reaches no loopback service of the host's; `--options` may say otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_landlock_server_never_shares_the_hosts_network() {
    let root = tempfile::tempdir().unwrap();
    let landlock = serde_json::json!({"root": root.path(), "isolation": "landlock"}).to_string();
    let (server, url) = start(root.path(), &["--options", &landlock]).await;
    let backend = client(&url).await;
    let full = SandboxSpec::new("default").network(sandcell::Network::Full);
    let refused = backend.create(&full).await.unwrap_err();
    assert_eq!(
        refused.kind(),
        sandcell::ErrorKind::Unsupported,
        "{refused}"
    );
    let sandbox = backend.create(&SandboxSpec::new("default")).await.unwrap();
    assert_eq!(sandbox.network, sandcell::Network::None);
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    tcp.set_nonblocking(true).unwrap();
    let port = tcp.local_addr().unwrap().port();
    let out = backend
        .run_shell(
            &sandbox.id,
            &format!("bash -c 'echo hi > /dev/tcp/127.0.0.1/{port}'"),
        )
        .await
        .unwrap();
    assert!(!out.success(), "reached the host's loopback: {out:?}");
    assert!(
        tcp.accept().is_err(),
        "nothing connected to the host's loopback"
    );
    backend.destroy(&sandbox.id).await.unwrap();
    drop(server);

    let shared = serde_json::json!({
        "root": root.path(), "isolation": "landlock", "share_host_network": true
    })
    .to_string();
    let (server, url) = start(root.path(), &["--options", &shared]).await;
    let backend = client(&url).await;
    let sandbox = backend.create(&full).await.unwrap();
    assert_eq!(sandbox.network, sandcell::Network::Full);
    backend.destroy(&sandbox.id).await.unwrap();
    drop(server);
}

/// ADVERSARIAL 36 through the binary as operators run it (here at namespaces, as CI
/// installs bubblewrap): loader variables a client sets on a command reach the command
/// and no helper the server starts on the host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_served_command_s_loader_variables_reach_no_host_helper() {
    let root = tempfile::tempdir().unwrap();
    let (server, url) = start(root.path(), &[]).await;
    let backend = client(&url).await;
    sandcell::testing::conformance::host_helpers_ignore_loader_variables(&backend).await;
    drop(server);
}
