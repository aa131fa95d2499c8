//! `JsonLinesSession` against a real process: a small Python agent (tests/fixtures) run
//! by the sandbox's own interpreter on the local backend.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use sandcell::json_lines::{JsonLinesOptions, JsonLinesSession};
use sandcell::{ErrorKind, ExecRequest, SandboxBackend, SandboxBackendExt, SandboxSpec};
use sandcell_local::LocalBackend;
use serde_json::{json, Value};

mod common;

const AGENT: &str = include_str!("fixtures/json_agent.py");

/// Every step must end on its own: a hang is the failure this helper exists to prevent.
async fn bounded<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), f)
        .await
        .unwrap_or_else(|_| panic!("{what} hung"))
}

async fn reply(session: &JsonLinesSession, message: Value) -> Vec<sandcell::Result<Value>> {
    bounded("a reply", async {
        session.request(&message).await.unwrap().collect().await
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_lines_agent_replies_crashes_garbles_and_comes_back() {
    if !common::python_available() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let backend: Arc<dyn SandboxBackend> =
        Arc::new(LocalBackend::builder().root(root.path()).build().unwrap());
    let sandbox = backend.create(&SandboxSpec::new("default")).await.unwrap();
    backend
        .write_string(&sandbox.id, &"agent.py".parse().unwrap(), AGENT)
        .await
        .unwrap();
    let session = JsonLinesSession::start(
        Arc::clone(&backend),
        &sandbox.id,
        ExecRequest::new(["python3", "agent.py"]),
        JsonLinesOptions::default(),
    )
    .await
    .unwrap();

    let packets: Vec<Value> = reply(&session, json!({"type": "ask", "text": "hello big world"}))
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        packets,
        vec![
            json!({"type": "chunk", "text": "hello"}),
            json!({"type": "chunk", "text": "big"}),
            json!({"type": "chunk", "text": "world"}),
            json!({"type": "done", "words": 3}),
        ]
    );
    bounded("a ping", session.ping(Duration::from_secs(10)))
        .await
        .unwrap();

    // Dies mid-reply: the packets so far, then an error that says how it ended.
    let crashed = reply(&session, json!({"type": "crash"})).await;
    assert_eq!(crashed.len(), 2, "{crashed:?}");
    assert_eq!(crashed[0].as_ref().unwrap()["text"], "partial");
    let err = crashed[1].as_ref().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.to_string().contains("exit code 3"), "{err}");
    // The next request restarts it.
    let again = reply(&session, json!({"type": "ask", "text": "back"})).await;
    assert_eq!(again.len(), 2);
    assert_eq!(session.restarts().await, 1);

    // Writes garbage: a clear error, and a fresh process afterwards.
    let garbled = reply(&session, json!({"type": "garbage"})).await;
    let err = garbled.last().unwrap().as_ref().unwrap_err();
    assert!(err.to_string().contains("not JSON"), "{err}");
    assert_eq!(
        reply(&session, json!({"type": "ask", "text": "ok"}))
            .await
            .len(),
        2
    );
    assert_eq!(session.restarts().await, 2);

    // Stops answering pings: Timeout within the deadline, then a new process answers.
    assert_eq!(reply(&session, json!({"type": "mute"})).await.len(), 1);
    let err = bounded("a ping", session.ping(Duration::from_millis(500)))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout);
    bounded("a ping", session.ping(Duration::from_secs(10)))
        .await
        .unwrap();
    assert_eq!(session.restarts().await, 3);

    session.close().await.unwrap();
    backend.destroy(&sandbox.id).await.unwrap();
}

#[cfg(feature = "testing")]
#[tokio::test]
async fn a_request_with_its_own_stdin_is_refused() {
    let backend: Arc<dyn SandboxBackend> = Arc::new(sandcell::testing::MockBackend::new());
    let sandbox = backend.create(&SandboxSpec::new("default")).await.unwrap();
    let err = JsonLinesSession::start(
        Arc::clone(&backend),
        &sandbox.id,
        ExecRequest::new(["agent"]).stdin("x"),
        JsonLinesOptions::default(),
    )
    .await
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
}

#[cfg(feature = "testing")]
#[tokio::test]
async fn a_backend_without_interactive_exec_is_refused_before_anything_runs() {
    let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = Arc::clone(&ran);
    let mock = sandcell::testing::MockBackend::new().on_exec("agent", move |_| {
        seen.store(true, std::sync::atomic::Ordering::SeqCst);
        sandcell::testing::MockReply::stdout("")
    });
    let mut caps = mock.capabilities();
    caps.interactive_exec = false;
    let mock = mock.set_capabilities(caps);
    let backend: Arc<dyn SandboxBackend> = Arc::new(mock.clone());
    let sandbox = backend.create(&SandboxSpec::new("default")).await.unwrap();
    let err = JsonLinesSession::start(
        Arc::clone(&backend),
        &sandbox.id,
        ExecRequest::new(["agent"]),
        JsonLinesOptions::default(),
    )
    .await
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    assert!(
        !ran.load(std::sync::atomic::Ordering::SeqCst),
        "nothing ran"
    );
    backend.destroy(&sandbox.id).await.unwrap();
}
