//! Background processes on the local backend: following from now, and resizing a
//! process's terminal.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use futures::StreamExt;
use sandcell::background::Background;
use sandcell::{ErrorKind, ExecRequest, ProcessEvent, SandboxBackend, SandboxSpec, TerminalSize};
use sandcell_local::LocalBackend;

async fn sandbox() -> (tempfile::TempDir, LocalBackend, sandcell::SandboxId) {
    let root = tempfile::tempdir().unwrap();
    let backend = LocalBackend::builder().root(root.path()).build().unwrap();
    let info = backend.create(&SandboxSpec::new("default")).await.unwrap();
    (root, backend, info.id)
}

fn stdout_of(events: &[ProcessEvent]) -> String {
    events
        .iter()
        .filter_map(|e| match e {
            ProcessEvent::Stdout(b) => Some(String::from_utf8_lossy(b).into_owned()),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn follow_skips_what_was_printed_and_ends_with_the_exit() {
    let (_root, backend, id) = sandbox().await;
    let table = Background::new();
    let process = table
        .start(
            &backend,
            &id,
            ExecRequest::new(["sh", "-c", "echo before; read x; echo after"]),
        )
        .await
        .unwrap();
    // Wait until the first line is in the log, then follow.
    let mut replay = table.attach(&process).unwrap();
    assert_eq!(
        replay.next().await,
        Some(ProcessEvent::Stdout("before\n".into()))
    );
    let followed = table.follow(&process).unwrap();
    table.send_input(&process, "go\n".into()).await.unwrap();
    let events: Vec<ProcessEvent> =
        tokio::time::timeout(Duration::from_secs(10), followed.collect())
            .await
            .unwrap();
    assert_eq!(stdout_of(&events), "after\n");
    assert!(matches!(events.last(), Some(ProcessEvent::Exit(s)) if s.success()));
    // After the end, following answers the exit alone.
    let late: Vec<ProcessEvent> = table.follow(&process).unwrap().collect().await;
    assert!(
        matches!(late.as_slice(), [ProcessEvent::Exit(_)]),
        "{late:?}"
    );
    backend.destroy(&id).await.unwrap();
}

#[tokio::test]
async fn a_terminal_is_resized_and_a_plain_process_refuses_it() {
    let (_root, backend, id) = sandbox().await;
    assert!(
        backend.capabilities().pty,
        "the local backend claims a terminal"
    );
    let table = Background::new();
    let shell = table
        .start(
            &backend,
            &id,
            ExecRequest::new(["sh"]).pty(TerminalSize::new(24, 80)),
        )
        .await
        .unwrap();
    table
        .resize(&shell, TerminalSize::new(40, 120))
        .await
        .unwrap();
    table
        .send_input(&shell, "stty size; exit\n".into())
        .await
        .unwrap();
    let events: Vec<ProcessEvent> = tokio::time::timeout(
        Duration::from_secs(10),
        table.attach(&shell).unwrap().collect(),
    )
    .await
    .unwrap();
    assert!(stdout_of(&events).contains("40 120"), "{events:?}");

    let plain = table
        .start(&backend, &id, ExecRequest::new(["sleep", "5"]))
        .await
        .unwrap();
    let err = table
        .resize(&plain, TerminalSize::new(40, 120))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    table.kill(&plain).unwrap();
    table.wait(&plain).await.unwrap();
    backend.destroy(&id).await.unwrap();
}
