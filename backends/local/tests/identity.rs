//! ADVERSARIAL 37, sandbox identity: at every isolation level that claims a boundary, a
//! sandbox's process holds no capability and cannot signal a host process, even when
//! the backend runs as root. When it does, a sandbox's processes are never the host's
//! root either, at `Landlock` as at `Namespaces`: they run as the backend's owner uid,
//! so root-only files under the system directories they may read stay unreadable
//! (made after the backend was built, and under `/usr` too), and what the host writes
//! for a sandbox and what it makes itself are the owner's on disk. At `Namespaces` its
//! view of its own namespaces names no host path.

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

/// The uid and gid a root backend's sandboxes run as by default.
const OWNER: u32 = 1_000_000_000;

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
    let mut checked = 0;
    for isolation in [Isolation::Landlock, Isolation::Namespaces] {
        let root = tempfile::tempdir().unwrap();
        let Some(backend) = backend(root.path(), isolation) else {
            continue;
        };
        // Made after the backend was built, so nothing it worked out at `build` can
        // know of them; `/usr` holds programs, not secrets, but nothing stops a host
        // from putting one there.
        let secrets = [
            Secret::place(Path::new("/etc")),
            Secret::place(&Path::new("/opt").join("sandcell-adversarial-37")),
            Secret::place(&Path::new("/usr").join("local")),
        ];
        let root_path = root.path().to_path_buf();
        let in_host_root = rustix::process::geteuid().is_root();
        let paths: Vec<PathBuf> = secrets.iter().map(|s| s.0.clone()).collect();
        conformance::with_sandbox(&backend, SandboxSpec::default(), |id| {
            let backend = &backend;
            async move {
                // A root backend's sandboxes run as its owner at both levels. Every
                // breach is listed before the test fails: one hides no other.
                let owned = in_host_root;
                let mut breaches = Vec::new();
                for secret in &paths {
                    let out = backend
                        .run_shell(&id, &format!("cat {}", secret.display()))
                        .await
                        .unwrap();
                    if out.stdout_str().contains("sandcell-host-secret") {
                        breaches.push(format!("it read the root-only {}", secret.display()));
                    }
                }
                if owned && isolation == Isolation::Landlock {
                    // Without namespaces the command's ids are the host's: the owner's.
                    let ids = backend.run_shell(&id, "id -u; id -g").await.unwrap();
                    if ids.stdout_str() != format!("{OWNER}\n{OWNER}\n") {
                        breaches.push(format!(
                            "its command's uid and gid are {:?}",
                            ids.stdout_str()
                        ));
                    }
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
                if owned && uids.iter().any(|uid| *uid != OWNER) {
                    breaches.push(format!("its processes are uids {uids:?} on the host"));
                }
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
                        "echo more >> host.txt && echo more >> imported/host.txt && mkdir imported/sub && echo made > made.txt && echo ok",
                    )
                    .await
                    .unwrap();
                assert_eq!(
                    changed.stdout_str(),
                    "ok\n",
                    "at {isolation:?} the sandbox could not change what the host wrote for it: {}",
                    changed.stderr_str()
                );
                if owned {
                    // Written by the host (an upload, an import), and by the command.
                    for name in ["host.txt", "made.txt"] {
                        let owners = owners_of(&root_path, name);
                        if owners.is_empty() || owners.iter().any(|uid| *uid != OWNER) {
                            breaches.push(format!("its {name} is uid {owners:?}'s on disk"));
                        }
                    }
                }
                assert!(
                    breaches.is_empty(),
                    "ADVERSARIAL 37 at {isolation:?}: a sandbox is not its owner: {breaches:#?}"
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
        drop(secrets);
        checked += 1;
    }
    assert!(checked > 0 || std::env::var_os("SANDCELL_REQUIRE_NAMESPACES").is_none());
}

/// A read-write host mount under a root backend, at `Landlock` as at `Namespaces`:
/// refused for a directory root owns (the owner could not write in it, and through a
/// view what the sandbox made there would be root's on the host, a setuid program
/// among them); for another user's directory, what the sandbox makes is that user's
/// on disk, and no setuid bit takes effect through the mount.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writable_host_mounts_never_make_root_files() {
    use std::os::unix::fs::MetadataExt;
    if !rustix::process::geteuid().is_root() {
        return;
    }
    for isolation in [Isolation::Landlock, Isolation::Namespaces] {
        let root = tempfile::tempdir().unwrap();
        let Some(backend) = backend(root.path(), isolation) else {
            continue;
        };
        let rooted = tempfile::tempdir().unwrap();
        let spec = SandboxSpec::default().mount(sandcell::Mount::read_write(
            rooted.path(),
            "shared".parse().unwrap(),
        ));
        match backend.create(&spec).await {
            Err(err) => assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err}"),
            Ok(info) => {
                backend.destroy(&info.id).await.unwrap();
                panic!("at {isolation:?} a writable mount of a directory root owns was accepted");
            }
        }
        assert_eq!(
            std::fs::read_dir(root.path().join("sandboxes"))
                .unwrap()
                .count(),
            0,
            "a refused create leaves nothing"
        );

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
                assert_eq!(
                    out.stdout_str(),
                    "made\n",
                    "at {isolation:?}: {}",
                    out.stderr_str()
                );
            }
        })
        .await;
        let made = std::fs::metadata(users.path().join("suid")).unwrap();
        assert_eq!(
            (made.uid(), made.gid()),
            (4242, 4242),
            "ADVERSARIAL 37 at {isolation:?}: a sandbox's file in a host mount belongs to \
             the mount's owner"
        );
    }
}

/// At `Landlock` a root backend's commands reach their workspace by host path, as the
/// owner with the sandbox's own group: the owner may pass through the root, but list
/// nothing there, and only with that group into the sandbox's directory; no other user
/// may pass at all. A root the owner cannot reach is refused at `build`, naming the
/// directory in the way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owner_passes_through_the_root_and_sees_nothing_else() {
    use std::os::unix::fs::MetadataExt;
    if !rustix::process::geteuid().is_root() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let Some(backend) = backend(root.path(), Isolation::Landlock) else {
        return;
    };
    // `setpriv` (util-linux, which namespaces need too) sets the supplementary groups.
    let as_ids = |uid: u32, groups: &[u32], script: &str| {
        let groups: Vec<String> = groups.iter().map(u32::to_string).collect();
        let groups = match groups.is_empty() {
            true => "--clear-groups".to_owned(),
            false => format!("--groups={}", groups.join(",")),
        };
        std::process::Command::new("setpriv")
            .args([format!("--reuid={uid}"), format!("--regid={uid}"), groups])
            .args(["sh", "-c", script])
            .current_dir("/")
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .output()
            .unwrap()
    };
    let as_uid = |uid: u32, script: &str| as_ids(uid, &[], script);
    conformance::with_sandbox(&backend, SandboxSpec::default(), |id| {
        let backend = &backend;
        let root = root.path().to_path_buf();
        async move {
            backend
                .write(&id, &"mine.txt".parse().unwrap(), "mine\n".into())
                .await
                .unwrap();
            let sandbox = root.join("sandboxes").join(id.as_str());
            let workspace = backend.inspect(&id).await.unwrap().details["host_path"].clone();
            // Outside any sandbox (no Landlock): only the file modes answer.
            let group = std::fs::metadata(&sandbox).unwrap().gid();
            assert!(
                group > OWNER && group <= OWNER + 65_536,
                "the sandbox's directory has group {group}, not one of its own"
            );
            let out = as_ids(OWNER, &[group], &format!("cat {workspace}/mine.txt"));
            assert_eq!(out.stdout, b"mine\n", "{out:?}");
            let out = as_uid(OWNER, &format!("cat {workspace}/mine.txt"));
            assert!(
                !out.status.success(),
                "the owner without the sandbox's group (another sandbox) read its file"
            );
            for (dir, gid) in [
                (&root, OWNER),
                (&root.join("sandboxes"), OWNER),
                (&sandbox, group),
            ] {
                let out = as_ids(OWNER, &[group], &format!("ls {}", dir.display()));
                assert!(!out.status.success(), "the owner listed {}", dir.display());
                let meta = std::fs::metadata(dir).unwrap();
                assert_eq!(
                    (meta.mode() & 0o7777, meta.gid()),
                    (0o710, gid),
                    "{}",
                    dir.display()
                );
            }
            for private in ["templates", "sandboxes/../templates/default"] {
                let out = as_uid(OWNER, &format!("ls {}", root.join(private).display()));
                assert!(!out.status.success(), "the owner listed {private}");
            }
            let out = as_uid(common::NOBODY, &format!("cat {workspace}/mine.txt"));
            assert!(!out.status.success(), "another user read a workspace");
        }
    })
    .await;

    let scratch = tempfile::tempdir().unwrap();
    std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let nested = scratch.path().join("root");
    let err = LocalBackend::builder()
        .root(&nested)
        .isolation(Isolation::Landlock)
        .build()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err}");
    assert!(
        err.to_string()
            .contains(&format!("pass through {}", scratch.path().display())),
        "{err}"
    );
    std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    LocalBackend::builder()
        .root(&nested)
        .isolation(Isolation::Landlock)
        .build()
        .unwrap();
}

/// A host thread that writes for a sandbox holds its owner's identity, and threads the
/// blocking pool starts from it would keep that identity (and the sandbox's group) for
/// good: the client's stream an import reads is polled elsewhere, so work the stream
/// does on the blocking pool starts no thread from there, and every later file
/// operation, on any sandbox, runs as the host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_import_leaves_no_host_thread_as_the_sandbox() {
    use futures::StreamExt;
    if !rustix::process::geteuid().is_root() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let Some(backend) = backend(root.path(), Isolation::Landlock) else {
        return;
    };
    let a = backend.create(&SandboxSpec::default()).await.unwrap();
    let b = backend.create(&SandboxSpec::default()).await.unwrap();
    backend
        .write(&b.id, &"b.txt".parse().unwrap(), "b\n".into())
        .await
        .unwrap();
    let mut tar = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(2);
    header.set_mode(0o644);
    header.set_cksum();
    tar.append_data(&mut header, "a.txt", &b"a\n"[..]).unwrap();
    let tar = bytes::Bytes::from(tar.into_inner().unwrap());
    // As a stream reading a file through tokio::fs would: each chunk made on the
    // blocking pool, several at once, so the pool grows while the import reads.
    let chunks: Vec<bytes::Bytes> = tar.chunks(512).map(bytes::Bytes::copy_from_slice).collect();
    let stream = futures::stream::iter(chunks).then(|chunk| async move {
        let work = (0..4).map(|_| {
            tokio::task::spawn_blocking(|| std::thread::sleep(std::time::Duration::from_millis(5)))
        });
        futures::future::join_all(work).await;
        Ok(chunk)
    });
    backend
        .import_tar(
            &a.id,
            &sandcell::SandboxPath::root(),
            Box::pin(stream),
            sandcell::archive::ImportOptions::merge(),
        )
        .await
        .unwrap();
    let mut failed = Vec::new();
    for _ in 0..16 {
        if let Err(e) = backend.read(&b.id, &"b.txt".parse().unwrap()).await {
            failed.push(e.to_string());
        }
    }
    backend.destroy(&a.id).await.unwrap();
    backend.destroy(&b.id).await.unwrap();
    assert!(
        failed.is_empty(),
        "host threads kept sandbox {}'s identity: {failed:?}",
        a.id
    );
}
