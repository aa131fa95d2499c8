//! The local backend served over the wire protocol: what a lost connection does to
//! running commands, and flow control with real processes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use futures::StreamExt;
use sandcell::testing::WireLoop;
use sandcell::{ExecRequest, SandboxBackend, SandboxBackendExt, SandboxSpec};
use sandcell_local::{LocalBackend, WorkspaceStrategy};

fn looped(root: &std::path::Path) -> WireLoop {
    WireLoop::new(
        LocalBackend::builder()
            .root(root)
            .workspace(WorkspaceStrategy::Copy)
            .build()
            .unwrap(),
    )
}

fn processes_mentioning(needle: &str) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read(e.path().join("cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(needle))
                .unwrap_or(false)
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_connection_kills_the_commands_it_started() {
    let root = tempfile::tempdir().unwrap();
    let backend = looped(root.path());
    let sandbox = backend.create(&SandboxSpec::new("default")).await.unwrap();
    let marker = format!("4{}.25", std::process::id() % 10000);
    let mut process = backend
        .exec(
            &sandbox.id,
            ExecRequest::new(["sh", "-c", &format!("sleep {marker} & sleep {marker}")]),
        )
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while processes_mentioning(&marker) < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the command never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    backend.disconnect(&sandbox.id);
    let err = tokio::time::timeout(Duration::from_secs(20), process.wait())
        .await
        .expect("wait returned after the cut")
        .expect_err("no exit status crosses a cut connection");
    assert_eq!(err.kind(), sandcell::ErrorKind::Unavailable, "{err}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while processes_mentioning(&marker) > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the command outlived its connection"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    backend.destroy(&sandbox.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unread_output_stream_does_not_block_other_requests() {
    let root = tempfile::tempdir().unwrap();
    let backend = looped(root.path());
    let sandbox = backend.create(&SandboxSpec::new("default")).await.unwrap();
    backend
        .write_string(&sandbox.id, &"note.txt".parse().unwrap(), "still here")
        .await
        .unwrap();
    // 64 MiB of output nobody reads yet: far beyond the flow-control window.
    let mut process = backend
        .exec(
            &sandbox.id,
            ExecRequest::new(["sh", "-c", "head -c 67108864 /dev/zero"]),
        )
        .await
        .unwrap();
    let mut stdout = process.take_stdout().unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let text = tokio::time::timeout(
        Duration::from_secs(10),
        backend.read_to_string(&sandbox.id, &"note.txt".parse().unwrap()),
    )
    .await
    .expect("a read behind a blocked stream finished")
    .unwrap();
    assert_eq!(text, "still here");
    let mut total = 0usize;
    while let Some(chunk) = stdout.next().await {
        total += chunk.unwrap().len();
    }
    assert_eq!(total, 64 << 20);
    assert!(process.wait().await.unwrap().success());
    backend.destroy(&sandbox.id).await.unwrap();
}
