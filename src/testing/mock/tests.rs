//! The mock's own tests: path resolution, archives, scripted processes.

use futures::StreamExt;

use super::tree::resolve;
use super::*;
use crate::{ErrorKind, ExecRequest, SandboxBackend, SandboxBackendExt};

fn p(s: &str) -> SandboxPath {
    SandboxPath::new(s).unwrap()
}

#[test]
fn resolve_follows_inner_links_and_refuses_escapes() {
    let mut tree = Tree::new();
    tree.insert(p("sub"), Node::Dir { mode: 0o755 });
    tree.insert(p("in"), Node::Symlink("sub".into()));
    tree.insert(p("sub/up"), Node::Symlink("..".into()));
    tree.insert(p("out"), Node::Symlink("../x".into()));
    tree.insert(p("abs"), Node::Symlink("/etc".into()));
    tree.insert(p("loop"), Node::Symlink("loop".into()));
    assert_eq!(resolve(&tree, &p("in/f"), true).unwrap(), p("sub/f"));
    assert_eq!(resolve(&tree, &p("in/up/in"), true).unwrap(), p("sub"));
    assert_eq!(resolve(&tree, &p("in"), false).unwrap(), p("in"));
    for bad in ["out/f", "abs/passwd", "in/up/out"] {
        assert_eq!(
            resolve(&tree, &p(bad), true).unwrap_err().kind(),
            ErrorKind::PermissionDenied,
            "{bad}"
        );
    }
    assert_eq!(
        resolve(&tree, &p("loop"), true).unwrap_err().kind(),
        ErrorKind::InvalidInput
    );
}

#[tokio::test]
async fn exec_handlers_see_env_stdin_and_cwd() {
    let b = MockBackend::new().on_exec("probe", |call| {
        MockReply::stdout(format!(
            "{}|{}|{}",
            call.env.get("A").cloned().unwrap_or_default(),
            String::from_utf8_lossy(&call.stdin),
            call.cwd
        ))
        .stderr("warn")
        .exit_code(4)
    });
    let sb = b
        .create(&SandboxSpec::default().env("A", "spec"))
        .await
        .unwrap();
    b.mkdir(&sb.id, &p("w")).await.unwrap();
    let out = b
        .run(&sb.id, ExecRequest::new(["probe"]).stdin("in").cwd(p("w")))
        .await
        .unwrap();
    assert_eq!(out.stdout_str(), "spec|in|w");
    assert_eq!(out.stderr_str(), "warn");
    assert_eq!(out.exit_code(), Some(4));
    let missing = b.run(&sb.id, ExecRequest::new(["nope"])).await.unwrap_err();
    assert_eq!(missing.kind(), ErrorKind::NotFound);
}

#[tokio::test]
async fn exec_stdin_writer_timeout_and_kill() {
    use tokio::io::AsyncWriteExt;
    let b = MockBackend::new()
        .on_exec("cat", |call| MockReply::stdout(call.stdin.clone()))
        .on_exec("sleep", |_| {
            MockReply::default().delay(Duration::from_secs(3600))
        });
    let sb = b.create(&SandboxSpec::default()).await.unwrap();

    let mut proc = b.exec(&sb.id, ExecRequest::new(["cat"])).await.unwrap();
    let mut stdin = proc.take_stdin().unwrap();
    stdin.write_all(b"streamed").await.unwrap();
    drop(stdin);
    let out = proc.collect(1024).await.unwrap();
    assert_eq!(&out.stdout[..], b"streamed");

    let timed = b
        .run(
            &sb.id,
            ExecRequest::new(["sleep"]).timeout(Duration::from_millis(20)),
        )
        .await
        .unwrap();
    assert!(timed.status.timed_out);
    assert!(!timed.success());

    let mut proc = b.exec(&sb.id, ExecRequest::new(["sleep"])).await.unwrap();
    proc.kill().await.unwrap();
    let status = proc.wait().await.unwrap();
    assert_eq!(status.signal, Some(9));
    assert!(!status.timed_out);
}

#[tokio::test]
async fn changes_cover_edits_deletions_and_kind_changes() {
    let b = MockBackend::new()
        .template(
            "t",
            [
                ("keep.txt", &b"same"[..]),
                ("edit.txt", b"old"),
                ("gone/a.txt", b"a"),
                ("gone/b.txt", b"b"),
                ("was_file", b"f"),
            ],
        )
        .unwrap();
    let sb = b.create(&SandboxSpec::new("t")).await.unwrap();
    b.write(&sb.id, &p("edit.txt"), Bytes::from_static(b"new"))
        .await
        .unwrap();
    b.remove(&sb.id, &p("gone"), true).await.unwrap();
    b.remove(&sb.id, &p("was_file"), false).await.unwrap();
    b.mkdir(&sb.id, &p("was_file")).await.unwrap();
    let changes = b.export_changes(&sb.id).await.unwrap();
    assert_eq!(changes.deleted, vec![p("gone"), p("was_file")]);
    let tar: Vec<u8> = changes.tar.map(|c| c.unwrap().to_vec()).concat().await;
    let mut names = Vec::new();
    for entry in tar::Archive::new(&tar[..]).entries().unwrap() {
        names.push(entry.unwrap().path().unwrap().display().to_string());
    }
    assert_eq!(
        names,
        ["edit.txt", "was_file"],
        "unchanged files are not exported"
    );
}

#[tokio::test]
async fn paused_sandboxes_refuse_exec() {
    let b = MockBackend::new();
    let sb = b.create(&SandboxSpec::default()).await.unwrap();
    b.pause(&sb.id).await.unwrap();
    let err = b.exec(&sb.id, ExecRequest::new(["x"])).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidState);
}
