//! Services with ports and readiness on the local backend (python3's http.server), and
//! their health folded into the manager's reaper.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::Duration;

use sandcell::background::Background;
use sandcell::services::{PortRange, RestartPolicy, ServiceSpec, ServiceStatus, Services};
use sandcell::{
    ErrorKind, ExecRequest, ManagerSettings, SandboxBackend, SandboxManager, SandboxSpec,
    SandboxStatus, SessionKey,
};
use sandcell_local::LocalBackend;

mod common;

/// A web server on the service's port, with a marker on its command line.
fn http_server(name: &str, marker: &str) -> ServiceSpec {
    ServiceSpec::new(
        name,
        ExecRequest::new([
            "python3",
            "-m",
            "http.server",
            "{port}",
            "--bind",
            "127.0.0.1",
        ])
        .env("MARKER", marker),
    )
    .ready_timeout(Duration::from_secs(20))
}

/// A sandbox that may listen on the host's ports (the default has no network).
fn online() -> SandboxSpec {
    SandboxSpec::new("default").network(sandcell::Network::Full)
}

/// GETs `url` with a raw request; returns the status line.
fn get(url: &str) -> String {
    let addr = url.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .write_all(format!("GET / HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .unwrap();
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response.lines().next().unwrap_or("").to_owned()
}

/// Host processes listening on `port` per /proc/net/tcp (state 0A).
fn listening(port: u16) -> bool {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let needle = format!(":{port:04X} ");
    table
        .lines()
        .any(|l| l.contains(&needle) && l.split_whitespace().nth(3) == Some("0A"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_gets_a_port_becomes_ready_and_stops_cleanly() {
    if !common::python_available() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let backend: Arc<dyn SandboxBackend> =
        Arc::new(LocalBackend::builder().root(root.path()).build().unwrap());
    let sandbox = backend.create(&online()).await.unwrap();
    let services = Services::new(PortRange::new(21100, 21109).unwrap(), Background::new());
    let web = services
        .start(
            Arc::clone(&backend),
            &sandbox.id,
            http_server("web", "svc-a"),
        )
        .await
        .unwrap();
    assert_eq!(web.status, ServiceStatus::Ready);
    assert!((21100..=21109).contains(&web.port));
    assert_eq!(web.url, format!("http://127.0.0.1:{}", web.port));
    assert!(
        get(&web.url).starts_with("HTTP/1.0 200"),
        "{}",
        get(&web.url)
    );
    // A second service never gets the same port; a duplicate name is refused.
    let api = services
        .start(
            Arc::clone(&backend),
            &sandbox.id,
            http_server("api", "svc-b"),
        )
        .await
        .unwrap();
    assert_ne!(api.port, web.port);
    let err = services
        .start(
            Arc::clone(&backend),
            &sandbox.id,
            http_server("web", "svc-c"),
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::AlreadyExists);

    services.stop(&sandbox.id, "web").await.unwrap();
    assert!(!listening(web.port), "stopped service still listens");
    assert_eq!(services.list(Some(&sandbox.id)).len(), 1);
    // Its port is free again.
    let again = services
        .start(
            Arc::clone(&backend),
            &sandbox.id,
            http_server("web2", "svc-d"),
        )
        .await
        .unwrap();
    assert_eq!(again.port, web.port);
    backend.destroy(&sandbox.id).await.unwrap();
    services.forget_sandbox(&sandbox.id);
    assert!(services.list(None).is_empty());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while listening(api.port) || listening(again.port) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "destroy left a server"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ports_run_out_with_limit_exceeded_and_come_back_with_the_sandbox() {
    if !common::python_available() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let backend: Arc<dyn SandboxBackend> =
        Arc::new(LocalBackend::builder().root(root.path()).build().unwrap());
    let services = Services::new(PortRange::new(21120, 21120).unwrap(), Background::new());
    let first = backend.create(&online()).await.unwrap();
    let second = backend.create(&online()).await.unwrap();
    let taken = services
        .start(Arc::clone(&backend), &first.id, http_server("web", "svc-e"))
        .await
        .unwrap();
    let err = services
        .start(
            Arc::clone(&backend),
            &second.id,
            http_server("web", "svc-f"),
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LimitExceeded, "{err}");
    // Destroying the sandbox ends its server and frees the port.
    backend.destroy(&first.id).await.unwrap();
    services.forget_sandbox(&first.id);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while listening(taken.port) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the server outlived its sandbox"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let now = services
        .start(
            Arc::clone(&backend),
            &second.id,
            http_server("web", "svc-g"),
        )
        .await
        .unwrap();
    assert_eq!(now.port, taken.port);
    backend.destroy(&second.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_that_never_answers_times_out_and_leaves_nothing() {
    let root = tempfile::tempdir().unwrap();
    let backend: Arc<dyn SandboxBackend> =
        Arc::new(LocalBackend::builder().root(root.path()).build().unwrap());
    let sandbox = backend.create(&online()).await.unwrap();
    let background = Background::new();
    let services = Services::new(PortRange::new(21130, 21130).unwrap(), background.clone());
    let silent = ServiceSpec::new("silent", ExecRequest::new(["sleep", "300"]))
        .ready_timeout(Duration::from_millis(500));
    let err = services
        .start(Arc::clone(&backend), &sandbox.id, silent)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    assert!(services.list(None).is_empty());
    // The port went back: the next start gets it.
    let exits = ServiceSpec::new("exits", ExecRequest::new(["false"]));
    let err = services
        .start(Arc::clone(&backend), &sandbox.id, exits)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("ended before answering"), "{err}");
    let running: Vec<_> = background
        .list(None)
        .into_iter()
        .filter(|p| p.status.is_none())
        .collect();
    assert!(running.is_empty(), "a failed start left {running:?}");
    backend.destroy(&sandbox.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarts_follow_the_policy_and_an_unhealthy_service_fails_its_sandbox() {
    if !common::python_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut settings = ManagerSettings::default();
    settings.service_ports = PortRange::new(21140, 21149).unwrap();
    let manager = SandboxManager::builder(
        LocalBackend::builder()
            .root(dir.path().join("local"))
            .build()
            .unwrap(),
    )
    .data_dir(dir.path().join("data"))
    .settings(settings)
    .build()
    .await
    .unwrap();
    let key = SessionKey::new("acme", "preview").unwrap();
    let handle = manager.acquire(&key, &online()).await.unwrap();

    // Restarted once on the same port, then unhealthy.
    let web = handle
        .start_service(http_server("web", "svc-h").restart(RestartPolicy::OnFailure { max: 1 }))
        .await
        .unwrap();
    let kill_current = |name: &'static str| {
        let info = handle
            .services()
            .into_iter()
            .find(|s| s.name == name)
            .unwrap();
        manager
            .background()
            .kill(info.process.as_ref().unwrap())
            .unwrap();
    };
    kill_current("web");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let info = handle
            .services()
            .into_iter()
            .find(|s| s.name == "web")
            .unwrap();
        if info.status == ServiceStatus::Ready && info.restarts == 1 {
            assert_eq!(info.port, web.port, "a restart keeps the port");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never came back: {info:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(get(&web.url).starts_with("HTTP/1.0 200"));
    kill_current("web");
    loop {
        let info = handle
            .services()
            .into_iter()
            .find(|s| s.name == "web")
            .unwrap();
        if info.status == ServiceStatus::Unhealthy {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never unhealthy: {info:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The reaper fails the sandbox; its ports go back.
    let report = manager.reap_once().await.unwrap();
    assert_eq!(report.failed, vec![key.clone()]);
    let record = manager.session(&key).await.unwrap().unwrap();
    assert_eq!(record.status, SandboxStatus::Failed);
    assert!(manager.services().list(None).is_empty());
    while listening(web.port) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the failed sandbox's server lives on"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    manager.shutdown().await;
}
