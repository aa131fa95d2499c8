//! What the binaries' tests share: a server process that dies with the test, a free
//! loopback port, the wait until it listens, and the probe for a Python SDK.

#![allow(dead_code)]

use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// Kills the server when the test ends, however it ends.
pub(crate) struct Server(pub(crate) Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A loopback port nothing listens on (now).
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits until something listens on loopback `port`; panics after `limit`.
pub(crate) fn wait_listening(port: u16, limit: Duration) {
    let deadline = Instant::now() + limit;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "the server never listened");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The Python interpreter in environment variable `var` (else `python3`) when it can
/// import `modules`; `None` (after saying why) when it cannot, which fails the test
/// instead under `SANDCELL_REQUIRE_{need}=1`.
pub(crate) fn python_with(var: &str, need: &str, what: &str, modules: &str) -> Option<String> {
    let python = std::env::var(var)
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "python3".to_owned());
    let probe = Command::new(&python)
        .args(["-c", &format!("import {modules}")])
        .output()
        .map_err(|e| e.to_string())
        .and_then(|out| {
            if out.status.success() {
                Ok(())
            } else {
                Err(String::from_utf8_lossy(&out.stderr).into_owned())
            }
        });
    sandcell::testing::require_or_skip(need, what, probe).then_some(python)
}
