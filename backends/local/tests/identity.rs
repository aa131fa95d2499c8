//! ADVERSARIAL 37, sandbox identity: at every isolation level that claims a boundary, a
//! sandbox's process is never the host's root and holds no capability, even when the
//! backend runs as root, so root-only files under the system directories a sandbox
//! sees stay unreadable, host processes cannot be signalled, and the sandbox's view of
//! its own namespaces names no host path.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use sandcell::testing::conformance;
use sandcell::{ErrorKind, SandboxBackendExt, SandboxSpec};
use sandcell_local::{Isolation, LocalBackend};

mod common;

/// A root-only (`0600`) file with a secret in it, removed on drop.
struct Secret(PathBuf);

impl Secret {
    fn place(dir: &Path) -> Secret {
        std::fs::create_dir_all(dir).unwrap();
        let path = dir.join(format!(
            "sandcell-adversarial-37-{}",
            sandcell::SandboxId::generate("s")
        ));
        std::fs::write(&path, "sandcell-host-secret").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        Secret(path)
    }
}

impl Drop for Secret {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn backend(root: &Path, isolation: Isolation) -> Option<LocalBackend> {
    match LocalBackend::builder()
        .root(root)
        .isolation(isolation)
        .build()
    {
        Ok(b) => Some(b),
        Err(e) => {
            assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
            let feature = match isolation {
                Isolation::Namespaces => "NAMESPACES",
                _ => "LANDLOCK",
            };
            sandcell::testing::require_or_skip(feature, "isolation", Err(e.to_string()));
            None
        }
    }
}

/// The host uids of the processes whose command line is exactly `cmdline`.
fn host_uids_of(cmdline: &[u8]) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter(|e| std::fs::read(e.path().join("cmdline")).is_ok_and(|c| c == cmdline))
        .filter_map(|e| {
            let status = std::fs::read_to_string(e.path().join("status")).ok()?;
            let line = status.lines().find(|l| l.starts_with("Uid:"))?;
            line.split_whitespace().nth(1)?.parse().ok()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_processes_are_never_host_root() {
    let in_etc = Secret::place(Path::new("/etc"));
    let in_opt = Secret::place(&Path::new("/opt").join("sandcell-adversarial-37"));
    let mut checked = 0;
    for isolation in [Isolation::Landlock, Isolation::Namespaces] {
        let root = tempfile::tempdir().unwrap();
        let Some(backend) = backend(root.path(), isolation) else {
            continue;
        };
        let root_path = root.path().to_path_buf();
        let (etc, opt) = (in_etc.0.clone(), in_opt.0.clone());
        conformance::with_sandbox(&backend, SandboxSpec::default(), |id| {
            let backend = &backend;
            async move {
                for secret in [&etc, &opt] {
                    let out = backend
                        .run_shell(&id, &format!("cat {}", secret.display()))
                        .await
                        .unwrap();
                    assert!(
                        !out.stdout_str().contains("sandcell-host-secret"),
                        "ADVERSARIAL 37 at {isolation:?}: a sandbox read the root-only {}",
                        secret.display()
                    );
                }
                let caps = backend
                    .run_shell(&id, "grep -E '^Cap(Eff|Prm|Bnd|Amb)' /proc/self/status")
                    .await
                    .unwrap();
                for line in caps.stdout_str().lines() {
                    assert!(
                        line.ends_with("0000000000000000"),
                        "ADVERSARIAL 37 at {isolation:?}: a capability inside: {line}"
                    );
                }
                let host_pid = std::process::id();
                let signal = backend
                    .run_shell(&id, &format!("kill -0 {host_pid}"))
                    .await
                    .unwrap();
                assert!(
                    !signal.success(),
                    "ADVERSARIAL 37 at {isolation:?}: a sandbox signalled a host process"
                );
                // A process left running, looked at from the host.
                let started = backend
                    .run_shell(&id, "sleep 987.37 >/dev/null 2>&1 &")
                    .await
                    .unwrap();
                assert!(started.success(), "{started:?}");
                let mut uids = Vec::new();
                assert!(
                    common::eventually(|| {
                        uids = host_uids_of(b"sleep\x00987.37\x00");
                        !uids.is_empty()
                    })
                    .await
                );
                assert!(
                    !uids.contains(&0),
                    "ADVERSARIAL 37 at {isolation:?}: a sandbox process is host root: {uids:?}"
                );
                if isolation == Isolation::Namespaces {
                    let seen = backend
                        .run_shell(&id, "tr '\\0' ' ' < /proc/1/cmdline")
                        .await
                        .unwrap();
                    assert!(
                        !seen.stdout_str().contains(&*root_path.to_string_lossy()),
                        "ADVERSARIAL 37: the sandbox's pid 1 names the host path: {}",
                        seen.stdout_str()
                    );
                }
            }
        })
        .await;
        checked += 1;
    }
    assert!(checked > 0 || std::env::var_os("SANDCELL_REQUIRE_NAMESPACES").is_none());
}
