//! `sandcell shell` on a real terminal: the built binary is started on a pseudo-terminal
//! as a user's terminal emulator would start it, and driven by typing at it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rustix::pty::OpenptFlags;
use rustix::termios::{LocalModes, Winsize};

fn sandcell(data: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_sandcell"));
    command.arg("--data-dir").arg(data);
    command
}

/// What the terminal showed so far, fed by a thread reading its master side.
struct Screen {
    chunks: mpsc::Receiver<Vec<u8>>,
    seen: String,
}

impl Screen {
    fn new(master: File) -> Self {
        let (tx, chunks) = mpsc::channel();
        std::thread::spawn(move || {
            let mut master = master;
            let mut buf = [0u8; 4096];
            while let Ok(n) = master.read(&mut buf) {
                if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                    break;
                }
            }
        });
        Screen {
            chunks,
            seen: String::new(),
        }
    }

    /// Whether `needle` shows up within `wait`; what was seen up to it is consumed.
    fn shows(&mut self, needle: &str, wait: Duration) -> bool {
        let deadline = Instant::now() + wait;
        loop {
            if let Some(at) = self.seen.find(needle) {
                self.seen.drain(..at + needle.len());
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.chunks.recv_timeout(left) {
                Ok(chunk) => self.seen.push_str(&String::from_utf8_lossy(&chunk)),
                Err(_) => return false,
            }
        }
    }

    fn expect(&mut self, needle: &str) {
        assert!(
            self.shows(needle, Duration::from_secs(30)),
            "the terminal never showed {needle:?}; after the last match it showed {:?}",
            self.seen
        );
    }
}

/// A terminal of 30 rows by 90 columns: its master, and its slave.
fn terminal() -> (OwnedFd, OwnedFd) {
    let master = rustix::pty::openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY).unwrap();
    rustix::pty::grantpt(&master).unwrap();
    rustix::pty::unlockpt(&master).unwrap();
    let slave =
        rustix::pty::ioctl_tiocgptpeer(&master, OpenptFlags::RDWR | OpenptFlags::NOCTTY).unwrap();
    resize(&master, 30, 90);
    (master, slave)
}

fn resize(master: &OwnedFd, rows: u16, cols: u16) {
    let size = Winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    rustix::termios::tcsetwinsize(master, size).unwrap();
}

/// Starts `command` as the leader of a session whose controlling terminal is `slave`.
fn start_on(mut command: Command, slave: &OwnedFd) -> Child {
    command
        .stdin(slave.try_clone().unwrap())
        .stdout(slave.try_clone().unwrap())
        .stderr(slave.try_clone().unwrap());
    // SAFETY: setsid(2) and ioctl(2) on fd 0 only, between fork and exec.
    unsafe {
        command.pre_exec(|| {
            rustix::process::setsid()?;
            rustix::process::ioctl_tiocsctty(BorrowedFd::borrow_raw(0))?;
            Ok(())
        });
    }
    command.spawn().unwrap()
}

fn wait_with_deadline(child: &mut Child, wait: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + wait;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("sandcell shell did not end");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn shell_is_an_interactive_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let acquired = sandcell(&data).args(["acquire", "demo"]).output().unwrap();
    assert!(acquired.status.success(), "{acquired:?}");
    let (master, slave) = terminal();
    let mut shell = sandcell(&data);
    shell.args(["shell", "demo"]);
    let mut child = start_on(shell, &slave);
    let mut screen = Screen::new(File::from(master.try_clone().unwrap()));
    let mut keys = File::from(master.try_clone().unwrap());

    // The sandbox's terminal has our size, and is a terminal.
    keys.write_all(b"stty size; tty >/dev/null && echo on-a-$((6*7))\n")
        .unwrap();
    screen.expect("30 90");
    screen.expect("on-a-42");

    // Our terminal is raw: Ctrl-C reaches the sandbox's foreground job, not the CLI.
    keys.write_all(b"sleep 30; echo not-$((1+1))\n").unwrap();
    std::thread::sleep(Duration::from_millis(500));
    keys.write_all(&[0x03]).unwrap();
    keys.write_all(b"echo still-$((2+3))\n").unwrap();
    screen.expect("still-5");
    assert!(!screen.seen.contains("not-2"), "{:?}", screen.seen);
    assert!(child.try_wait().unwrap().is_none(), "Ctrl-C ended the CLI");

    // A resize of our terminal is forwarded (the CLI hears SIGWINCH as the session's
    // foreground job; typed again until it is through).
    resize(&master, 50, 132);
    let forwarded = (0..40).any(|_| {
        keys.write_all(b"stty size\n").unwrap();
        screen.shows("50 132", Duration::from_millis(500))
    });
    assert!(
        forwarded,
        "the new size never reached the sandbox: {:?}",
        screen.seen
    );

    // The shell's exit status is ours, and our terminal is as it was.
    keys.write_all(b"exit 7\n").unwrap();
    let status = wait_with_deadline(&mut child, Duration::from_secs(30));
    assert_eq!(status.code(), Some(7), "{:?}", screen.seen);
    let modes = rustix::termios::tcgetattr(slave.as_fd())
        .unwrap()
        .local_modes;
    assert!(
        modes.contains(LocalModes::ICANON | LocalModes::ECHO | LocalModes::ISIG),
        "the terminal was left raw: {modes:?}"
    );

    let purged = sandcell(&data)
        .args(["release", "demo", "--purge"])
        .output()
        .unwrap();
    assert!(purged.status.success(), "{purged:?}");
}

#[test]
fn shell_without_a_terminal_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let out = sandcell(&dir.path().join("data"))
        .args(["shell", "demo"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("needs a terminal"), "{stderr}");
}
