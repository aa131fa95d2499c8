//! Core services (`sandcell::services`) in Docker sandboxes: the port is published to
//! this host's loopback, probed, stopped and freed with the sandbox.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::Duration;

use sandcell::background::Background;
use sandcell::services::{PortRange, ServiceSpec, ServiceStatus, Services};
use sandcell::{
    ErrorKind, ExecRequest, Network, SandboxBackend, SandboxBackendExt, SandboxPath, SandboxSpec,
};

/// busybox httpd serving the workspace's `www` on the service's port, all addresses.
fn httpd(name: &str) -> ServiceSpec {
    ServiceSpec::new(
        name,
        ExecRequest::new(["httpd", "-f", "-p", "{port}", "-h", "/workspace/www"]),
    )
    .ready_timeout(Duration::from_secs(20))
}

/// GETs `path` from `url` on this host; the whole response.
fn get(url: &str, path: &str) -> std::io::Result<String> {
    let addr = url.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    Ok(response)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_port_is_published_to_the_host_and_freed_with_the_sandbox() {
    if !common::engine_available().await {
        return;
    }
    let docker = common::backend(true).await;
    assert!(docker.capabilities().port_exposure);
    let backend: Arc<dyn SandboxBackend> = Arc::new(docker.clone());
    let spec = SandboxSpec::new("default").label(common::TEST_LABEL.0, "services");
    let online = backend
        .create(&spec.clone().network(Network::Full))
        .await
        .unwrap();
    let _online_guard = common::Guard::new(&docker, &online.id);
    let offline = backend.create(&spec).await.unwrap();
    let _offline_guard = common::Guard::new(&docker, &offline.id);
    backend
        .write_string(
            &online.id,
            &SandboxPath::new("www/index.html").unwrap(),
            "hello-from-the-container\n",
        )
        .await
        .unwrap();

    let services = Services::new(PortRange::new(21200, 21209).unwrap(), Background::new());
    let web = services
        .start(Arc::clone(&backend), &online.id, httpd("web"))
        .await
        .unwrap();
    assert_eq!(web.status, ServiceStatus::Ready);
    assert_eq!(web.port, 21200);
    assert_eq!(web.url, "http://127.0.0.1:21200");
    let page = get(&web.url, "/index.html").unwrap();
    assert!(
        page.starts_with("HTTP/1.") && page.contains(" 200 "),
        "{page}"
    );
    assert!(page.ends_with("hello-from-the-container\n"), "{page}");

    // A sandbox without a network has no address to publish to; its port goes back.
    let err = services
        .start(Arc::clone(&backend), &offline.id, httpd("web"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    let second = services
        .start(Arc::clone(&backend), &online.id, httpd("second"))
        .await
        .unwrap();
    assert_eq!(second.port, 21201, "the refused start released its port");

    // Stopping unpublishes: nothing listens on the host port any more.
    services.stop(&online.id, "web").await.unwrap();
    assert!(get(&web.url, "/").is_err(), "port 21200 still answers");
    assert!(get(&second.url, "/index.html").unwrap().contains(" 200 "));

    // Destroying the sandbox closes the rest.
    backend.destroy(&online.id).await.unwrap();
    services.forget_sandbox(&online.id);
    assert!(
        get(&second.url, "/").is_err(),
        "port 21201 outlived its sandbox"
    );
    assert!(services.list(None).is_empty());
    std::net::TcpListener::bind(("127.0.0.1", 21200)).expect("port 21200 is free");
    std::net::TcpListener::bind(("127.0.0.1", 21201)).expect("port 21201 is free");
}
