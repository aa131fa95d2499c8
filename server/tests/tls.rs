//! sandcell-server over TLS: a client trusting the server's certificate does
//! everything (the wire protocol's upgrade included); one that does not, or that
//! speaks plain HTTP, gets nowhere.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;

use sandcell::{ExecRequest, SandboxBackend, SandboxBackendExt, SandboxPath, SandboxSpec};
use sandcell_local::LocalBackend;
use sandcell_remote::{FlyBackend, FlyConfig};
use sandcell_server::{serve_tls, ServerConfig, Tls};

/// A self-signed certificate for `localhost` and 127.0.0.1: (certificate, key) PEM.
fn self_signed() -> (String, String) {
    let cert =
        rcgen::generate_simple_self_signed(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
            .unwrap();
    (cert.cert.pem(), cert.key_pair.serialize_pem())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_trusting_the_certificate_works_over_tls_and_others_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = self_signed();
    let cert_file = dir.path().join("cert.pem");
    let key_file = dir.path().join("key.pem");
    std::fs::write(&cert_file, &cert).unwrap();
    std::fs::write(&key_file, &key).unwrap();
    // A key every user may read is refused: sandboxes would read it too.
    let err = Tls::from_pem_files(&cert_file, &key_file).unwrap_err();
    assert_eq!(err.kind(), sandcell::ErrorKind::PermissionDenied, "{err}");
    std::fs::set_permissions(
        &key_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let tls = Tls::from_pem_files(&cert_file, &key_file).unwrap();

    let local = LocalBackend::builder()
        .root(dir.path().join("data"))
        .build()
        .unwrap();
    let backend: Arc<dyn SandboxBackend> = Arc::new(local);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let config = ServerConfig::new(common::TOKEN);
    let server = tokio::spawn(serve_tls(
        listener,
        tls,
        backend,
        config,
        std::future::pending(),
    ));

    // A client that says nothing does not hold up the others' handshakes.
    let _silent = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();

    let url = format!("https://localhost:{port}");
    let client =
        FlyBackend::connect(FlyConfig::new(&url, common::TOKEN).ca_certificate(&cert_file))
            .await
            .unwrap();
    assert!(client.has_extensions());
    let sandbox = client.create(&SandboxSpec::new("default")).await.unwrap();
    let out = client
        .run(&sandbox.id, ExecRequest::new(["echo", "over tls"]))
        .await
        .unwrap();
    assert_eq!(out.stdout_str(), "over tls\n");
    let path = SandboxPath::new("secret.txt").unwrap();
    client
        .write(&sandbox.id, &path, bytes::Bytes::from_static(b"sealed"))
        .await
        .unwrap();
    assert_eq!(
        &client.read(&sandbox.id, &path).await.unwrap()[..],
        b"sealed"
    );

    // Without the certificate trusted, the handshake fails.
    let untrusting =
        FlyBackend::connect(FlyConfig::new(&url, common::TOKEN).retry(common::fast_retries()))
            .await;
    assert!(untrusting.is_err(), "an unknown certificate was trusted");
    // Plain HTTP to the TLS port gets no answer an HTTP client accepts.
    let plain = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{port}/v1/sandcell/capabilities"))
        .bearer_auth(common::TOKEN)
        .send()
        .await;
    assert!(
        plain.is_err() || !plain.unwrap().status().is_success(),
        "plain HTTP was served"
    );

    client.destroy(&sandbox.id).await.unwrap();
    server.abort();
}

#[test]
fn unusable_certificates_and_keys_are_refused_naming_the_problem() {
    let (cert, key) = self_signed();
    let (other_cert, _) = self_signed();
    let err = Tls::from_pem(b"not pem", key.as_bytes()).unwrap_err();
    assert_eq!(err.kind(), sandcell::ErrorKind::InvalidInput);
    let err = Tls::from_pem(cert.as_bytes(), b"").unwrap_err();
    assert!(err.to_string().contains("private key"), "{err}");
    let err = Tls::from_pem(other_cert.as_bytes(), key.as_bytes()).unwrap_err();
    assert!(err.to_string().contains("do not go together"), "{err}");
    let err = Tls::from_pem_files("/nonexistent/cert.pem", "/nonexistent/key.pem").unwrap_err();
    assert!(err.to_string().contains("/nonexistent/cert.pem"), "{err}");
    Tls::from_pem(cert.as_bytes(), key.as_bytes()).unwrap();

    let missing = FlyConfig::new("https://localhost:1", "t").ca_certificate("/nonexistent.pem");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let err = runtime.block_on(FlyBackend::connect(missing)).unwrap_err();
    assert_eq!(err.kind(), sandcell::ErrorKind::InvalidInput, "{err}");
    assert!(err.to_string().contains("ca_certificate"), "{err}");
}

/// The E2B provider the way it reaches E2B's cloud: the control plane at
/// `https://api.{domain}` and each sandbox's envd at `https://49983-{id}.{domain}`, over
/// TLS; the domain's hosts resolved by `domain_ip`, as on a deployment without wildcard
/// DNS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_e2b_provider_reaches_sandboxes_by_their_own_host_names_over_tls() {
    use sandcell_remote::e2b::{E2bBackend, E2bConfig};

    let dir = tempfile::tempdir().unwrap();
    let cert = rcgen::generate_simple_self_signed(vec!["*.sandcell.test".to_owned()]).unwrap();
    let cert_file = dir.path().join("cert.pem");
    let key_file = dir.path().join("key.pem");
    std::fs::write(&cert_file, cert.cert.pem()).unwrap();
    std::fs::write(&key_file, cert.key_pair.serialize_pem()).unwrap();
    std::fs::set_permissions(
        &key_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let tls = Tls::from_pem_files(&cert_file, &key_file).unwrap();
    let local = LocalBackend::builder()
        .root(dir.path().join("data"))
        .build()
        .unwrap();
    let backend: Arc<dyn SandboxBackend> = Arc::new(local.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = tokio::spawn(serve_tls(
        listener,
        tls,
        backend,
        ServerConfig::new(common::TOKEN),
        std::future::pending(),
    ));

    let mut config = E2bConfig::new(common::TOKEN);
    config.domain = format!("sandcell.test:{port}");
    config.domain_ip = Some("127.0.0.1".parse().unwrap());
    config.ca_certificate = Some(cert_file.clone());
    let e2b = E2bBackend::connect(config).await.unwrap();
    let sandbox = e2b.create(&SandboxSpec::new("default")).await.unwrap();
    let out = e2b
        .run(&sandbox.id, ExecRequest::new(["echo", "by host name"]))
        .await
        .unwrap();
    assert_eq!(out.stdout_str(), "by host name\n");
    let path = SandboxPath::new("f.txt").unwrap();
    e2b.write(&sandbox.id, &path, "over tls".into())
        .await
        .unwrap();
    assert_eq!(e2b.read(&sandbox.id, &path).await.unwrap(), "over tls");
    e2b.destroy(&sandbox.id).await.unwrap();
    assert!(local.list(&Default::default()).await.unwrap().is_empty());

    // Without the certificate trusted, nothing goes through.
    let mut untrusting = E2bConfig::new(common::TOKEN).retry(common::fast_retries());
    untrusting.domain = format!("sandcell.test:{port}");
    untrusting.domain_ip = Some("127.0.0.1".parse().unwrap());
    let e2b = E2bBackend::connect(untrusting).await.unwrap();
    let err = e2b.create(&SandboxSpec::new("default")).await.unwrap_err();
    assert_eq!(err.kind(), sandcell::ErrorKind::Unavailable, "{err}");
    server.abort();
}
