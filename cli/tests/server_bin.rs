//! The `sandcell-server` binary, started as the README says, answers a RemoteBackend.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sandcell::{ExecRequest, SandboxBackend, SandboxBackendExt, SandboxSpec};
use sandcell_remote::{RemoteBackend, RemoteConfig};

/// The token the server is started with.
const TOKEN: &str = "test-token";

/// Kills the server when the test ends, however it ends.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts the binary over the local backend with `extra` flags; answers it and its URL
/// once it listens.
async fn start(root: &std::path::Path, extra: &[&str]) -> (Server, String) {
    let port = free_port();
    let server = Server(
        Command::new(env!("CARGO_BIN_EXE_sandcell-server"))
            .args([
                "--backend",
                "local",
                "--listen",
                &format!("127.0.0.1:{port}"),
            ])
            .args(extra)
            .arg("--root")
            .arg(root)
            .env("SANDCELL_SERVER_TOKEN", TOKEN)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "the server never listened");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (server, format!("http://127.0.0.1:{port}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_serves_the_local_backend_on_loopback() {
    let root = tempfile::tempdir().unwrap();
    let (server, url) = start(root.path(), &[]).await;
    let backend = RemoteBackend::connect(RemoteConfig::new(&url, TOKEN))
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
    let backend = RemoteBackend::connect(RemoteConfig::new(&url, TOKEN))
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
    let backend = RemoteBackend::connect(RemoteConfig::new(&url, TOKEN))
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
    let backend = RemoteBackend::connect(RemoteConfig::new(&url, TOKEN))
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
    let backend = RemoteBackend::connect(RemoteConfig::new(&url, TOKEN))
        .await
        .unwrap();
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
    let backend = RemoteBackend::connect(RemoteConfig::new(&url, TOKEN))
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
    let backend = RemoteBackend::connect(RemoteConfig::new(&url, TOKEN))
        .await
        .unwrap();
    let sandbox = backend.create(&SandboxSpec::new("default")).await.unwrap();
    let out = backend.run_shell(&sandbox.id, &read_secret).await.unwrap();
    assert_eq!(out.stdout_str(), "host secret");
    backend.destroy(&sandbox.id).await.unwrap();
    drop(server);
}
