//! Commands on a terminal.

use std::time::Duration;

use futures::StreamExt;
use tokio::io::AsyncWriteExt;

use super::{assert_kind, spec, with_sandbox};
use crate::{ByteStream, ErrorKind, ExecRequest, SandboxBackend, SandboxBackendExt, TerminalSize};

/// Reads `output` into `seen` until it holds `needle` (10 s at most).
async fn read_until(output: &mut ByteStream, seen: &mut String, needle: &str) {
    let found = tokio::time::timeout(Duration::from_secs(10), async {
        while !seen.contains(needle) {
            match output.next().await {
                Some(Ok(chunk)) => seen.push_str(&String::from_utf8_lossy(&chunk)),
                Some(Err(e)) => panic!("terminal output failed: {e}"),
                None => break,
            }
        }
    })
    .await;
    assert!(
        found.is_ok() && seen.contains(needle),
        "the terminal never showed {needle:?}; it showed {seen:?}"
    );
}

/// A command on a terminal sees a TTY of the size asked for; output arrives as one
/// stream; typed input reaches it (a line read, `0x03` interrupting the foreground job);
/// a resize is seen (`stty size`, `SIGWINCH`); timeouts and kill work as for any exec.
pub async fn pty_terminal(b: &dyn SandboxBackend) {
    let caps = b.capabilities();
    if !caps.pty {
        return with_sandbox(b, spec(), |id| async move {
            assert_kind(
                b.exec(
                    &id,
                    ExecRequest::shell("true").pty(TerminalSize::new(24, 80)),
                )
                .await,
                ErrorKind::Unsupported,
                "a terminal without the pty capability",
            );
        })
        .await;
    }
    assert!(
        caps.shell && caps.interactive_exec,
        "the pty capability needs shell and interactive_exec"
    );
    with_sandbox(b, spec(), |id| async move {
        assert_kind(
            b.exec(
                &id,
                ExecRequest::shell("true").pty(TerminalSize::new(0, 80)),
            )
            .await,
            ErrorKind::InvalidInput,
            "a terminal of zero rows",
        );
        // A TTY of the size asked for; stderr goes to the terminal too.
        let out = b
            .run(
                &id,
                ExecRequest::shell(
                    "tty >/dev/null && echo is-a-tty; stty size; echo to-stderr >&2",
                )
                .pty(TerminalSize::new(40, 100)),
            )
            .await
            .unwrap();
        let text = out.stdout_str();
        assert!(out.success(), "{out:?}");
        assert!(
            text.contains("is-a-tty"),
            "tty succeeds on a terminal: {text:?}"
        );
        assert!(
            text.contains("40 100"),
            "stty size reports the size: {text:?}"
        );
        assert!(
            text.contains("to-stderr"),
            "stderr is the terminal: {text:?}"
        );
        assert!(out.stderr.is_empty(), "nothing on a separate stderr");
        let plain = b
            .run_shell(&id, "tty >/dev/null || echo no-tty")
            .await
            .unwrap();
        assert!(
            plain.stdout_str().contains("no-tty"),
            "without pty there is no terminal"
        );

        // An interactive session: a line typed and read, a resize seen, Ctrl-C.
        let script = "trap 'echo winch; stty size' WINCH; \
                      read line; echo \"got:$line\"; \
                      while :; do sleep 1; done";
        let mut process = b
            .exec(
                &id,
                ExecRequest::shell(script).pty(TerminalSize::new(24, 80)),
            )
            .await
            .unwrap();
        let mut input = process.take_stdin().expect("a terminal takes input");
        let mut output = process.take_stdout().expect("terminal output");
        let mut seen = String::new();
        input.write_all(b"hello\n").await.unwrap();
        input.flush().await.unwrap();
        read_until(&mut output, &mut seen, "got:hello").await;
        process.resize(TerminalSize::new(50, 132)).await.unwrap();
        read_until(&mut output, &mut seen, "50 132").await;
        assert!(seen.contains("winch"), "the process got SIGWINCH: {seen:?}");
        input.write_all(&[0x03]).await.unwrap();
        input.flush().await.unwrap();
        let status = tokio::time::timeout(Duration::from_secs(10), process.wait())
            .await
            .expect("Ctrl-C ends the foreground job")
            .unwrap();
        assert!(
            status.signal == Some(2) || status.code == Some(130),
            "ended by SIGINT: {status:?}"
        );
        assert!(!status.timed_out);
        drop(input);

        // Timeouts and kill.
        let started = std::time::Instant::now();
        let out = b
            .run(
                &id,
                ExecRequest::new(["sleep", "30"])
                    .pty(TerminalSize::default())
                    .timeout(Duration::from_secs(1)),
            )
            .await
            .unwrap();
        assert!(out.status.timed_out, "{out:?}");
        assert!(started.elapsed() < Duration::from_secs(20));
        let mut process = b
            .exec(
                &id,
                ExecRequest::new(["sleep", "30"]).pty(TerminalSize::default()),
            )
            .await
            .unwrap();
        process.kill().await.unwrap();
        let status = tokio::time::timeout(Duration::from_secs(20), process.wait())
            .await
            .expect("a killed terminal command ends")
            .unwrap();
        assert!(!status.success());
        // Resizing an ended process is no error; a process without a terminal refuses.
        process.resize(TerminalSize::new(10, 10)).await.unwrap();
        let mut plain = b
            .exec(&id, ExecRequest::new(["sleep", "30"]))
            .await
            .unwrap();
        assert_kind(
            plain.resize(TerminalSize::new(10, 10)).await,
            ErrorKind::InvalidInput,
            "resizing a process without a terminal",
        );
        plain.kill().await.unwrap();
        let _ = plain.wait().await;
    })
    .await;
}
