//! Command cases: exec, missing programs, background processes.

use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;

use super::{assert_kind, eventually, p, shell_is_refused, spec, with_sandbox};
use crate::{ErrorKind, ExecRequest, Language, SandboxBackend, SandboxBackendExt};

/// Streams, exit codes, stdin, env, cwd, output caps, timeouts and kill, on backends
/// with a shell.
pub async fn exec_basics(b: &dyn SandboxBackend) {
    if !b.capabilities().shell {
        return shell_is_refused(b, "exec_basics").await;
    }
    let spec = spec()
        .env("FROM_SPEC", "spec")
        .limits(crate::Limits::new().output_bytes(4096));
    with_sandbox(b, spec, |id| async move {
        let out = b
            .run_shell(&id, "echo out; echo err >&2; exit 3")
            .await
            .unwrap();
        assert_eq!(
            (
                out.stdout_str().as_ref(),
                out.stderr_str().as_ref(),
                out.exit_code()
            ),
            ("out\n", "err\n", Some(3))
        );

        let out = b
            .run(&id, ExecRequest::new(["cat"]).stdin("fed via stdin"))
            .await
            .unwrap();
        assert_eq!(out.stdout_str(), "fed via stdin");

        let out = b
            .run(
                &id,
                ExecRequest::shell("echo \"$FROM_SPEC $FROM_REQ\"").env("FROM_REQ", "req"),
            )
            .await
            .unwrap();
        assert_eq!(out.stdout_str(), "spec req\n");
        if std::env::var_os("CARGO_MANIFEST_DIR").is_some() {
            let out = b
                .run_shell(&id, "echo \"[$CARGO_MANIFEST_DIR]\"")
                .await
                .unwrap();
            assert_eq!(
                out.stdout_str(),
                "[]\n",
                "host environment does not leak in"
            );
        }

        b.mkdir(&id, &p("ex/sub")).await.unwrap();
        let out = b
            .run(&id, ExecRequest::shell("pwd").cwd(p("ex/sub")))
            .await
            .unwrap();
        assert!(
            out.stdout_str().trim_end().ends_with("/ex/sub"),
            "cwd: {}",
            out.stdout_str()
        );
        assert_kind(
            b.run(&id, ExecRequest::new(["true"]).cwd(p("ex/none")))
                .await,
            ErrorKind::NotFound,
            "missing cwd",
        );

        let out = b
            .run(
                &id,
                ExecRequest::shell("head -c 100000 /dev/zero; echo done >&2").output_limit(1000),
            )
            .await
            .unwrap();
        assert_eq!(
            (out.stdout.len(), out.stdout_truncated, out.stderr_truncated),
            (1000, true, false)
        );
        assert!(
            out.success(),
            "the pipe kept draining, so the command finished normally"
        );
        let out = b.run_shell(&id, "head -c 100000 /dev/zero").await.unwrap();
        assert_eq!(
            (out.stdout.len(), out.stdout_truncated),
            (4096, true),
            "the spec's output cap applies when the request sets none"
        );

        let out = b
            .run(
                &id,
                ExecRequest::new(["sleep", "30"]).timeout(Duration::from_millis(500)),
            )
            .await
            .unwrap();
        assert!(
            out.status.timed_out && !out.success(),
            "timed out: {:?}",
            out.status
        );

        if b.capabilities().interactive_exec {
            let mut proc = b
                .exec(&id, ExecRequest::new(["sleep", "30"]))
                .await
                .unwrap();
            proc.kill().await.unwrap();
            let status = proc.wait().await.unwrap();
            assert!(!status.success() && !status.timed_out, "killed: {status:?}");
        }

        let out = b
            .execute_code(&id, Language::Sh, "x=4; echo $((x * 10))")
            .await
            .unwrap();
        assert_eq!(out.stdout_str(), "40\n");
        if b.capabilities().python {
            let out = b
                .execute_code(
                    &id,
                    Language::Python,
                    "import sys\nprint(sum(range(10)), file=sys.stdout)",
                )
                .await
                .unwrap();
            assert_eq!(out.stdout_str(), "45\n");
        }
        assert_kind(
            b.run(&id, ExecRequest::new(Vec::<String>::new())).await,
            ErrorKind::InvalidInput,
            "empty argv",
        );
    })
    .await;
}

/// A program missing from the sandbox's `PATH` is `NotFound`, not a process.
pub async fn exec_missing_program_is_not_found(b: &dyn SandboxBackend) {
    with_sandbox(b, spec(), |id| async move {
        let err = b
            .exec(&id, ExecRequest::new(["sandcell-no-such-program"]))
            .await
            .map(|_| ());
        assert_kind(err, ErrorKind::NotFound, "missing program");
    })
    .await;
}

/// A command starts with no signal blocked and none ignored, whatever the process
/// running the backend blocks or ignores (a server started under `nohup` ignores
/// `SIGHUP`, and a child would inherit that): read from `/proc/self/status` of the
/// command itself, on backends with a shell (real processes).
pub async fn commands_start_with_default_signals(b: &dyn SandboxBackend) {
    if !b.capabilities().shell {
        return shell_is_refused(b, "commands_start_with_default_signals").await;
    }
    with_sandbox(b, spec(), |id| async move {
        let out = b
            .run(&id, ExecRequest::new(["cat", "/proc/self/status"]))
            .await
            .unwrap();
        assert!(out.success(), "{out:?}");
        let status = out.stdout_str();
        for field in ["SigBlk", "SigIgn"] {
            let mask = status
                .lines()
                .find_map(|line| line.strip_prefix(&format!("{field}:")))
                .unwrap_or_else(|| panic!("no {field} in /proc/self/status: {status}"))
                .trim();
            assert!(
                u64::from_str_radix(mask, 16) == Ok(0),
                "{field} of a command is {mask}, not empty"
            );
        }
    })
    .await;
}

/// A process left running in the background by one command is still there for the
/// next one, and `reset` ends it (backends with a shell and reset).
pub async fn background_processes_live_until_reset(b: &dyn SandboxBackend) {
    if !b.capabilities().shell {
        return shell_is_refused(b, "background_processes_live_until_reset").await;
    }
    if !b.capabilities().reset {
        return with_sandbox(b, spec(), |id| async move {
            assert_kind(
                b.reset(&id).await,
                ErrorKind::Unsupported,
                "reset without the capability",
            );
        })
        .await;
    }
    let marker = format!("sandcell-bg-{}", uuid::Uuid::new_v4().simple());
    with_sandbox(b, spec(), |id| {
        let marker = marker.clone();
        async move {
            // `$0` of the idle shell is the marker, one NUL-separated argument of its own,
            // so it matches a whole line below while the checking script's text never does.
            let count = format!(
                "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\000' '\\n' | grep -c '^{marker}$'"
            );
            let running = |want: &'static str| {
                let count = count.clone();
                let id = id.clone();
                move || {
                    let count = count.clone();
                    let id = id.clone();
                    async move {
                        b.run_shell(&id, &count)
                            .await
                            .is_ok_and(|out| out.stdout_str().trim() == want)
                    }
                }
            };
            let start = format!("sh -c 'sleep 1000; :' {marker} >/dev/null 2>&1 </dev/null &");
            assert!(b.run_shell(&id, &start).await.unwrap().success());
            assert!(
                eventually(running("1")).await,
                "the background process outlives its command"
            );
            b.reset(&id).await.expect("reset");
            assert!(eventually(running("0")).await, "reset ends it");
        }
    })
    .await;
}

/// A timeout ends everything its command started, including what left the command's
/// process group: a `setsid` child (where the sandbox has `setsid`), a `nohup` one and
/// a double fork's orphan. (A command that exits on its own may leave background
/// processes running: [`background_processes_live_until_reset`] pins that half.)
/// Needs a shell.
pub async fn timeouts_end_every_descendant(b: &dyn SandboxBackend) {
    if !b.capabilities().shell {
        return shell_is_refused(b, "timeouts_end_every_descendant").await;
    }
    let marker = format!("sandcell-esc-{}", uuid::Uuid::new_v4().simple());
    with_sandbox(b, spec(), |id| {
        let marker = marker.clone();
        async move {
            // Each escapee's `$0` is the marker, a whole NUL-separated argument, so it
            // matches a line below while the checking script's own text never does.
            let idle = format!("sh -c 'sleep 1000; :' {marker} >/dev/null 2>&1 </dev/null");
            let script = format!(
                "if command -v setsid >/dev/null; then setsid {idle} & fi; \
                 nohup {idle} & ({idle} &); sleep 1000"
            );
            let count = format!(
                "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\000' '\\n' | grep -c '^{marker}$'"
            );
            let request = ExecRequest::shell(script).timeout(Duration::from_secs(2));
            let out = b.run(&id, request).await.expect("the command runs");
            assert!(
                out.status.timed_out,
                "the command timed out: {:?}",
                out.status
            );
            let mut left = String::new();
            for _ in 0..100 {
                left = b
                    .run_shell(&id, &count)
                    .await
                    .map(|o| o.stdout_str().trim().to_owned())
                    .unwrap_or_default();
                if left == "0" {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            if left != "0" {
                let ps = b
                    .run_shell(&id, "for s in /proc/[0-9]*/stat; do cat $s; echo; done")
                    .await
                    .map(|o| o.stdout_str().to_string())
                    .unwrap_or_default();
                panic!("escapees outlived the timeout of their command ({left} left):\n{ps}");
            }
        }
    })
    .await;
}

/// Background processes by id ([`crate::background::Background`]): output so far and
/// then live, input, signals (where the backend has them), kill, wait, a late attach that
/// replays everything, and processes ending with their sandbox. Needs a shell.
pub async fn background_processes_by_id(b: &dyn SandboxBackend) {
    use crate::background::Background;
    use crate::ProcessEvent;
    if !b.capabilities().shell {
        return shell_is_refused(b, "background_processes_by_id").await;
    }
    if !b.capabilities().interactive_exec {
        return with_sandbox(b, spec(), |id| async move {
            assert_kind(
                Background::new()
                    .start(b, &id, ExecRequest::new(["true"]))
                    .await,
                ErrorKind::Unsupported,
                "a background process without interactive exec",
            );
        })
        .await;
    }
    /// Reads events until the stdout seen so far contains `want`.
    async fn until(
        events: &mut futures::stream::BoxStream<'static, ProcessEvent>,
        seen: &mut String,
        want: &str,
    ) {
        let found = tokio::time::timeout(Duration::from_secs(30), async {
            while !seen.contains(want) {
                match events.next().await {
                    Some(ProcessEvent::Stdout(b)) => seen.push_str(&String::from_utf8_lossy(&b)),
                    Some(_) => {}
                    None => break,
                }
            }
        })
        .await;
        assert!(
            found.is_ok() && seen.contains(want),
            "never saw {want:?} in {seen:?}"
        );
    }
    let table = Background::new();
    with_sandbox(b, spec(), |id| {
        let table = table.clone();
        async move {
            let echo = table
                .start(
                    b,
                    &id,
                    ExecRequest::shell(
                        "echo started; while read line; do echo \"got $line\"; [ \"$line\" = quit ] && exit 4; done",
                    ),
                )
                .await
                .unwrap();
            let mut events = table.attach(&echo).unwrap();
            let mut seen = String::new();
            until(&mut events, &mut seen, "started\n").await;
            table.send_input(&echo, Bytes::from_static(b"hello\n")).await.unwrap();
            until(&mut events, &mut seen, "got hello\n").await;
            let info = table.info(&echo).unwrap();
            assert_eq!((info.status, &info.sandbox), (None, &id));
            assert!(table.list(Some(&id)).iter().any(|p| p.id == echo));
            table.send_input(&echo, Bytes::from_static(b"quit\n")).await.unwrap();
            assert_eq!(table.wait(&echo).await.unwrap().code, Some(4));
            // A late attach replays what was kept, then the exit.
            let all: Vec<ProcessEvent> = table.attach(&echo).unwrap().collect().await;
            let text: String = all
                .iter()
                .filter_map(|e| match e {
                    ProcessEvent::Stdout(b) => Some(String::from_utf8_lossy(b).into_owned()),
                    _ => None,
                })
                .collect();
            assert_eq!(text, "started\ngot hello\ngot quit\n");
            assert!(matches!(all.last(), Some(ProcessEvent::Exit(s)) if s.code == Some(4)));
            table.forget(&echo).unwrap();
            assert_kind(table.info(&echo).map(|_| ()), ErrorKind::NotFound, "forgotten");

            let trapper = table
                .start(
                    b,
                    &id,
                    ExecRequest::shell(
                        "trap 'echo term; exit 7' TERM; echo ready; while :; do sleep 0.1; done",
                    ),
                )
                .await
                .unwrap();
            let mut events = table.attach(&trapper).unwrap();
            let mut seen = String::new();
            until(&mut events, &mut seen, "ready\n").await;
            match table.signal(&trapper, 15).await {
                Ok(()) => {
                    until(&mut events, &mut seen, "term\n").await;
                    assert_eq!(table.wait(&trapper).await.unwrap().code, Some(7));
                }
                Err(e) => {
                    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
                    table.kill(&trapper).unwrap();
                    assert!(!table.wait(&trapper).await.unwrap().success());
                }
            }
            let sleeper = table
                .start(b, &id, ExecRequest::new(["sleep", "30"]))
                .await
                .unwrap();
            table.kill(&sleeper).unwrap();
            assert!(!table.wait(&sleeper).await.unwrap().success());
        }
    })
    .await;
    // A process still running when its sandbox goes ends with it.
    let info = b.create(&spec()).await.unwrap();
    let orphan = table
        .start(b, &info.id, ExecRequest::new(["sleep", "300"]))
        .await
        .unwrap();
    b.destroy(&info.id).await.unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(30), table.wait(&orphan)).await;
    assert!(ended.is_ok(), "a background process outlived its sandbox");
    table.forget_sandbox(&info.id);
    assert!(table.list(None).iter().all(|p| p.sandbox != info.id));
}
