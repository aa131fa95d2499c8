//! Who a sandbox's process is on the host (ADVERSARIAL 37), looked at from the host.

use std::time::{Duration, Instant};

use super::{shell_is_refused, spec, with_sandbox};
use crate::{ExecRequest, SandboxBackend};

/// ADVERSARIAL 37: a sandbox's process is never the host's root. Seen from the host's
/// `/proc`, a command's shell has no id 0 among its real, effective, saved and file
/// system uids, and, where it is in the host's user namespace, no capability (in a
/// user namespace of its own it may hold some there, over nothing of the host's).
///
/// Needs the sandbox's processes on this host, as every backend's are when a test runs
/// it here (a remote face's included); where they are not (gVisor), the case skips
/// unless `SANDCELL_REQUIRE_HOST_PROCESSES=1`. Backends whose commands are not
/// isolated from the host (no network isolation claimed) have no boundary to check.
pub async fn processes_are_never_host_root(b: &dyn SandboxBackend) {
    if !b.capabilities().shell {
        return shell_is_refused(b, "processes_are_never_host_root").await;
    }
    if !b.capabilities().network_isolation {
        return;
    }
    with_sandbox(b, spec(), |id| async move {
        let marker = format!("adv37{}", std::process::id())
            + &crate::SandboxId::generate("m").as_str()[2..10];
        let script = format!("sleep 60; echo {marker}");
        let mut process = b
            .exec(&id, ExecRequest::new(["sh", "-c", &script]))
            .await
            .unwrap();
        let found = shell_with(&marker).await;
        let seen = crate::testing::require_or_skip(
            "HOST_PROCESSES",
            "a sandbox's processes seen from this host",
            found
                .map(|_| ())
                .ok_or_else(|| format!("no shell with {marker} in /proc")),
        );
        if let (true, Some(pid)) = (seen, found) {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
            let field = |name: &str| -> Vec<String> {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix(name))
                    .unwrap_or_default()
                    .split_whitespace()
                    .map(str::to_owned)
                    .collect()
            };
            let uids = field("Uid:");
            assert_eq!(uids.len(), 4, "{status}");
            assert!(
                uids.iter().all(|uid| uid != "0"),
                "ADVERSARIAL 37: a sandbox's process is the host's root (uids {uids:?})"
            );
            let namespace = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/user")).ok();
            let own = namespace(&pid.to_string());
            if own.is_some() && own == namespace("self") {
                for caps in ["CapEff:", "CapPrm:"] {
                    assert_eq!(
                        field(caps),
                        ["0000000000000000"],
                        "ADVERSARIAL 37: a sandbox's process holds capabilities in the \
                         host's user namespace ({caps})"
                    );
                }
            }
        }
        let _ = process.kill().await;
    })
    .await;
}

/// The pid of a shell (`argv[0]` named `sh`) whose command line holds `marker`, looked
/// for in this host's `/proc` for up to ten seconds.
async fn shell_with(marker: &str) -> Option<u32> {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(10) {
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
                continue;
            };
            let mut args = cmdline.split(|b| *b == 0);
            let program = args.next().unwrap_or_default();
            let is_shell = program == b"sh" || program.ends_with(b"/sh");
            if is_shell && args.any(|arg| arg.windows(marker.len()).any(|w| w == marker.as_bytes()))
            {
                return Some(pid);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}
