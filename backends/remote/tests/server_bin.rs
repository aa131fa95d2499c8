//! The `sandcell-server` binary, started as the README says, answers a RemoteBackend.
#![cfg(feature = "server")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sandcell::{ExecRequest, SandboxBackend, SandboxBackendExt, SandboxSpec};
use sandcell_remote::{RemoteBackend, RemoteConfig};

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_serves_the_local_backend_on_loopback() {
    let root = tempfile::tempdir().unwrap();
    let port = free_port();
    let server = Server(
        Command::new(env!("CARGO_BIN_EXE_sandcell-server"))
            .args([
                "--backend",
                "local",
                "--listen",
                &format!("127.0.0.1:{port}"),
            ])
            .arg("--root")
            .arg(root.path())
            .env("SANDCELL_SERVER_TOKEN", common::TOKEN)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let url = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "the server never listened");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let backend = RemoteBackend::connect(RemoteConfig::new(&url, common::TOKEN))
        .await
        .unwrap();
    assert_eq!(backend.name(), "remote");
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
