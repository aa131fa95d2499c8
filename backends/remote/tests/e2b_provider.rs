//! The E2B provider when things go wrong: an unreachable endpoint, lost answers to a
//! create, a sandbox killed or paused behind its back, a bad key.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::proxy::{Fault, FaultProxy};
use sandcell::{
    ErrorKind, ExecRequest, LabelSelector, SandboxBackend, SandboxBackendExt, SandboxPath,
    SandboxSpec,
};
use sandcell_remote::e2b::{E2bBackend, E2bConfig};

fn p(s: &str) -> SandboxPath {
    SandboxPath::new(s).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_endpoint_is_unavailable() {
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = E2bConfig::self_hosted(format!("http://127.0.0.1:{port}"), "k")
        .retry(common::fast_retries());
    let backend = E2bBackend::connect(config).await.unwrap();
    let err = backend
        .create(&SandboxSpec::new("default"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    let err = backend
        .inspect(&sandcell::SandboxId::new("x1").unwrap())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
}

/// ADVERSARIAL 26: a create whose answer is lost leaves at most one sandbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_whose_answer_is_lost_makes_one_sandbox() {
    let server = common::serve_local().await;
    let proxy = FaultProxy::start(&server.url).await;
    let backend = common::e2b_client(&proxy.url()).await;
    // The first create reaches the server, which makes the sandbox; its answer is lost.
    proxy.inject("POST", "/sandboxes", vec![Fault::ResetAfterForward]);
    let info = backend
        .create(&SandboxSpec::new("default").label("case", "lost"))
        .await
        .unwrap();
    let all = backend
        .list(&LabelSelector::new().label("case", "lost"))
        .await
        .unwrap();
    assert_eq!(all.len(), 1, "one create, one sandbox: {all:?}");
    assert_eq!(all[0].id, info.id);
    let posts = proxy
        .requests()
        .into_iter()
        .filter(|r| r.method == "POST" && r.path == "/sandboxes")
        .count();
    assert_eq!(posts, 1, "the lost create was looked up, not repeated");
    // And the sandbox works.
    let out = backend.run_shell(&info.id, "echo ok").await.unwrap();
    assert_eq!(out.stdout_str(), "ok\n");
    backend.destroy(&info.id).await.unwrap();
    // A create the server refused outright (a 4xx) is not retried at all.
    proxy.inject("POST", "/sandboxes", vec![Fault::Status(400)]);
    let err = backend
        .create(&SandboxSpec::new("default"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_gone_or_paused_behind_its_back_gives_typed_errors() {
    let server = common::serve_local().await;
    let backend = common::e2b_client(&server.url).await;
    let other = common::e2b_client(&server.url).await;
    let info = backend.create(&SandboxSpec::new("default")).await.unwrap();
    backend.write(&info.id, &p("f"), "x".into()).await.unwrap();

    // Paused by another client: this one's envd calls say so.
    other.pause(&info.id).await.unwrap();
    let err = backend.read(&info.id, &p("f")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidState, "{err}");
    other.resume(&info.id).await.unwrap();
    assert_eq!(backend.read(&info.id, &p("f")).await.unwrap(), "x");

    // Killed by another client: gone, for files and commands alike.
    other.destroy(&info.id).await.unwrap();
    let err = backend.read(&info.id, &p("f")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    let err = backend
        .exec(&info.id, ExecRequest::new(["true"]))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    assert_eq!(
        backend.inspect(&info.id).await.unwrap_err().kind(),
        ErrorKind::NotFound
    );
    backend.destroy(&info.id).await.unwrap();
    assert!(server
        .local
        .list(&LabelSelector::new())
        .await
        .unwrap()
        .is_empty());
}
