//! ADVERSARIAL 43: a command (not a PTY session) cannot type into the terminal of the
//! process that runs it, at any isolation level that claims a boundary.
//!
//! The test runs itself again as a child in a session of its own whose controlling
//! terminal is a pseudo-terminal the test holds, as a shell running `sandcell exec` or
//! an MCP host would be; the child runs a command that tries `TIOCSTI` on `/dev/tty`
//! and on the terminal's own path, then checks that nothing arrived in the terminal's
//! input queue.

#![allow(clippy::unwrap_used, clippy::expect_used, unsafe_code)]

mod common;

use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;

use sandcell::{ExecRequest, SandboxBackend, SandboxBackendExt, SandboxSpec};
use sandcell_local::{Isolation, LocalBackend};

/// Set in the child that owns the terminal.
const CHILD: &str = "SANDCELL_TEST_TIOCSTI_CHILD";

/// What the sandboxed command runs: type a line into whichever terminal it can open.
const TYPIST: &str = r#"
import fcntl, os, sys, termios
for path in ["/dev/tty", sys.argv[1]]:
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOCTTY)
    except OSError as e:
        print(path, "not opened:", e.strerror)
        continue
    try:
        for byte in b"echo sandcell-typed\n":
            fcntl.ioctl(fd, termios.TIOCSTI, bytes([byte]))
        print(path, "typed")
    except OSError as e:
        print(path, "refused:", e.strerror)
"#;

#[test]
fn commands_cannot_type_into_the_callers_terminal() {
    if std::env::var_os(CHILD).is_some() {
        return in_a_session_with_a_terminal();
    }
    let mut child = std::process::Command::new(std::env::current_exe().unwrap());
    child
        .args([
            "--exact",
            "commands_cannot_type_into_the_callers_terminal",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1");
    // SAFETY: setsid(2) only, between fork and exec.
    unsafe {
        child.pre_exec(|| rustix::process::setsid().map(drop).map_err(Into::into));
    }
    let status = child.status().unwrap();
    assert!(
        status.success(),
        "the child with the terminal failed: {status}"
    );
}

fn in_a_session_with_a_terminal() {
    use rustix::pty::OpenptFlags;
    // Closing the terminal at the end hangs the session up; this process is its leader.
    // SAFETY: signal(2) setting SIGHUP ignored; no handler runs.
    unsafe { libc::signal(libc::SIGHUP, libc::SIG_IGN) };
    let master = rustix::pty::openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY).unwrap();
    rustix::pty::grantpt(&master).unwrap();
    rustix::pty::unlockpt(&master).unwrap();
    let name = rustix::pty::ptsname(&master, Vec::new()).unwrap();
    let name = name.to_str().unwrap().to_owned();
    let slave = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&name)
        .unwrap();
    // The terminal becomes this session's controlling terminal, as a login shell's is.
    rustix::process::ioctl_tiocsctty(&slave).unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut checked = 0;
    for isolation in [Isolation::Landlock, Isolation::Namespaces] {
        let root = tempfile::tempdir().unwrap();
        let Some(backend) = common::build_at(LocalBackend::builder().root(root.path()), isolation)
        else {
            continue;
        };
        let out = runtime.block_on(async {
            let sb = backend.create(&SandboxSpec::new("default")).await.unwrap();
            let request = ExecRequest::new(["python3", "-c", TYPIST, name.as_str()]);
            let out = backend.run(&sb.id, request).await.unwrap();
            backend.destroy(&sb.id).await.unwrap();
            out
        });
        let mut queued: libc::c_int = 0;
        // SAFETY: FIONREAD writes one int.
        let r = unsafe { libc::ioctl(slave.as_raw_fd(), libc::FIONREAD, &mut queued) };
        assert_eq!(r, 0);
        assert_eq!(
            queued,
            0,
            "ADVERSARIAL 43 at {isolation:?}: a command typed into the caller's terminal: {}{}",
            out.stdout_str(),
            out.stderr_str()
        );
        assert!(
            !out.stdout_str().contains("typed"),
            "ADVERSARIAL 43 at {isolation:?}: {}",
            out.stdout_str()
        );
        checked += 1;
    }
    eprintln!("terminal injection checked at {checked} isolation levels");
}
