//! ADVERSARIAL 37, sandbox identity: at every isolation level that claims a boundary, a
//! sandbox's process holds no capability and cannot signal a host process, even when
//! the backend runs as root. At `Isolation::Namespaces` it is never the host's root
//! either, so root-only files under the system directories it sees stay unreadable,
//! and its view of its own namespaces names no host path. (At `Landlock` a root
//! backend's commands keep root's uid; its ruleset hides the root-only files under
//! `/etc` and `/opt` instead.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use sandcell::testing::conformance;
use sandcell::{ErrorKind, SandboxBackend, SandboxBackendExt, SandboxSpec};
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
    common::build_at(LocalBackend::builder().root(root), isolation)
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

/// Adds a key to the caller's user keyring (`add_key(2)` through ctypes), printing
/// whether the kernel refused.
const KEYRING_PROBE: &str = r#"
import ctypes, platform
nr = {"x86_64": 248, "aarch64": 217}[platform.machine()]
libc = ctypes.CDLL(None, use_errno=True)
r = libc.syscall(nr, b"user", b"sandcell-adversarial-37", b"secret", 6, -4)
print("refused" if r < 0 else "added")
"#;

/// The owners of every file called `name` beneath `dir`.
fn owners_of(dir: &Path, name: &str) -> Vec<u32> {
    use std::os::unix::fs::MetadataExt;
    let mut owners = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&path) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(meta) = entry.path().symlink_metadata() else {
                continue;
            };
            if meta.is_dir() {
                stack.push(entry.path());
            } else if entry.file_name() == name {
                owners.push(meta.uid());
            }
        }
    }
    owners
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
        let in_host_root = rustix::process::geteuid().is_root();
        let (etc, opt) = (in_etc.0.clone(), in_opt.0.clone());
        conformance::with_sandbox(&backend, SandboxSpec::default(), |id| {
            let backend = &backend;
            async move {
                // At Landlock a root backend's commands keep root's uid (without any
                // capability), so its ruleset hides what only root may read.
                let owned = isolation == Isolation::Namespaces;
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
                // The kernel's keyrings are per uid: a sandbox gets none of them.
                let keys = backend
                    .run(
                        &id,
                        sandcell::ExecRequest::new(["python3", "-c", KEYRING_PROBE]),
                    )
                    .await
                    .unwrap();
                assert_eq!(
                    keys.stdout_str().trim(),
                    "refused",
                    "ADVERSARIAL 37 at {isolation:?}: a sandbox used a kernel keyring: {}",
                    keys.stderr_str()
                );
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
                    !owned || !uids.contains(&0),
                    "ADVERSARIAL 37 at {isolation:?}: a sandbox process is host root: {uids:?}"
                );
                // What the host writes for the sandbox is the sandbox's to change.
                backend
                    .write(&id, &"host.txt".parse().unwrap(), "host\n".into())
                    .await
                    .unwrap();
                backend
                    .write(&id, &"dir/host.txt".parse().unwrap(), "host\n".into())
                    .await
                    .unwrap();
                let tar = backend
                    .export_tar(&id, &"dir".parse().unwrap())
                    .await
                    .unwrap();
                backend
                    .import_tar(
                        &id,
                        &"imported".parse().unwrap(),
                        tar,
                        sandcell::archive::ImportOptions::default(),
                    )
                    .await
                    .unwrap();
                let changed = backend
                    .run_shell(
                        &id,
                        "echo more >> host.txt && echo more >> imported/host.txt && mkdir imported/sub && echo ok",
                    )
                    .await
                    .unwrap();
                assert_eq!(
                    changed.stdout_str(),
                    "ok\n",
                    "at {isolation:?} the sandbox could not change what the host wrote for it: {}",
                    changed.stderr_str()
                );
                if in_host_root && owned {
                    let owners = owners_of(&root_path, "host.txt");
                    assert!(
                        !owners.is_empty() && !owners.contains(&0),
                        "at {isolation:?} files the host wrote for a sandbox are root's: {owners:?}"
                    );
                }
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

/// A read-write host mount at `Isolation::Namespaces` under a root backend: refused
/// for a directory root owns (what the sandbox made there would be root's on the host,
/// a setuid program among them); for another user's directory, what the sandbox makes
/// is that user's on disk, and no setuid bit takes effect through the mount.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writable_host_mounts_never_make_root_files() {
    use std::os::unix::fs::MetadataExt;
    if !rustix::process::geteuid().is_root() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let Some(backend) = backend(root.path(), Isolation::Namespaces) else {
        return;
    };
    let rooted = tempfile::tempdir().unwrap();
    let spec = SandboxSpec::default().mount(sandcell::Mount::read_write(
        rooted.path(),
        "shared".parse().unwrap(),
    ));
    let err = backend.create(&spec).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err}");

    let users = tempfile::tempdir().unwrap();
    std::os::unix::fs::chown(users.path(), Some(4242), Some(4242)).unwrap();
    let spec = SandboxSpec::default().mount(sandcell::Mount::read_write(
        users.path(),
        "shared".parse().unwrap(),
    ));
    conformance::with_sandbox(&backend, spec, |id| {
        let backend = &backend;
        async move {
            let out = backend
                .run_shell(
                    &id,
                    "cp /bin/true shared/suid && chmod 6755 shared/suid && echo made",
                )
                .await
                .unwrap();
            assert_eq!(out.stdout_str(), "made\n", "{}", out.stderr_str());
        }
    })
    .await;
    let made = std::fs::metadata(users.path().join("suid")).unwrap();
    assert_eq!(
        (made.uid(), made.gid()),
        (4242, 4242),
        "ADVERSARIAL 37: a sandbox's file in a host mount belongs to the mount's owner"
    );
}
