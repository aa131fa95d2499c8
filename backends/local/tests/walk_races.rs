//! ADVERSARIAL 42 and 43 on the local backend, driven from inside the sandbox: while a
//! sandboxed process swaps its files and the import's staging directories for symlinks
//! to host paths (python's `os` calls, no fork per swap), the host takes incremental
//! snapshots and imports archives, round after round. No host file may reach a
//! snapshot and no import may write outside the workspace, at every isolation level.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use futures::StreamExt;
use sandcell::archive::ImportOptions;
use sandcell::{ExecRequest, SandboxBackend, SandboxSpec};
use sandcell_local::{Isolation, LocalBackend, WorkspaceStrategy};

mod common;

/// As long as the files the sandbox swaps it with ("ordinary"): a pack that follows a
/// swapped-in link reads as many bytes as the entry's header declared.
const SECRET: &str = "Zq9-SeKr";

fn backend(root: &Path, isolation: Isolation) -> Option<LocalBackend> {
    let builder = LocalBackend::builder()
        .root(root)
        .workspace(WorkspaceStrategy::Overlay);
    common::build_at(builder, isolation)
}

/// Exchanges `f0`..`f19` (files) with `l0`..`l19` (symlinks to the host secret), and
/// directory `d` with `dl` (a symlink to the secret's directory), atomically with
/// `renameat2(RENAME_EXCHANGE)`, forever.
const SWAP_FILES: &str = r#"
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
for i in range(20):
    open(f"f{i}", "w").write("ordinary")
    os.symlink(sys.argv[1], f"l{i}")
# A directory, and beside it a link to the secret's directory.
os.mkdir("d")
open("d/inner", "w").write("ordinary")
os.symlink(os.path.dirname(sys.argv[1]), "dl")
names = [(f"f{i}".encode(), f"l{i}".encode()) for i in range(20)] + [(b"d", b"dl")]
open("swapping", "w").close()
while True:
    for a, b in names:
        libc.renameat2(-100, a, -100, b, 2)
"#;

/// Swaps every directory an import stages in the workspace for a symlink to `outside`.
const SWAP_STAGING: &str = r#"
import os, sys
outside = sys.argv[1]
n = 0
open("swapping-staging", "w").close()
while True:
    for name in os.listdir("."):
        if not name.startswith(".sandcell-"):
            continue
        for d in range(4):
            sub = f"{name}/sub{d}"
            try:
                os.rename(sub, f"{name}/moved{n}")
                n += 1
                os.symlink(outside, sub)
            except OSError:
                pass
"#;

/// An archive of four directories of a hundred files.
fn archive() -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for d in 0..4 {
        for f in 0..100 {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Regular);
            h.set_mode(0o644);
            h.set_size(4);
            builder
                .append_data(&mut h, format!("sub{d}/f{f}"), &b"data"[..])
                .unwrap();
        }
    }
    builder.into_inner().unwrap()
}

/// Waits until the sandbox's swapper says it is running.
async fn wait_for(
    backend: &LocalBackend,
    id: &sandcell::SandboxId,
    marker: &str,
) -> Result<(), String> {
    let path = marker.parse().unwrap();
    for _ in 0..500 {
        if backend.stat(id, &path).await.is_ok() {
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    Err(format!("the sandbox's swapper did not start ({marker})"))
}

async fn collect(stream: sandcell::ByteStream) -> Vec<u8> {
    let mut out = Vec::new();
    let mut stream = stream;
    while let Some(Ok(chunk)) = stream.next().await {
        out.extend_from_slice(&chunk);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_and_imports_never_reach_host_files_while_the_sandbox_swaps() {
    let Some(python) = common::python_available().then_some("python3") else {
        return;
    };
    for isolation in [Isolation::Landlock, Isolation::Namespaces] {
        let root = tempfile::tempdir().unwrap();
        let Some(backend) = backend(root.path(), isolation) else {
            continue;
        };
        // Host paths the sandbox names in its links: a root-only secret and a
        // directory anyone could write (so only the walk's own care keeps it empty).
        let host = tempfile::tempdir().unwrap();
        std::fs::set_permissions(host.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let secret = host.path().join("secret");
        std::fs::write(&secret, SECRET).unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        let outside = host.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o777)).unwrap();

        let sb = backend.create(&SandboxSpec::default()).await.unwrap();
        // Destroyed before any verdict, so a failing round leaves no swapper running.
        let verdict = attack(&backend, &sb.id, python, &secret, &outside).await;
        backend.destroy(&sb.id).await.unwrap();
        if let Err(failure) = verdict {
            panic!("at {isolation:?}, {failure}");
        }
    }
}

/// Snapshots, then imports, each while a swapper of the sandbox's own runs.
async fn attack(
    backend: &LocalBackend,
    id: &sandcell::SandboxId,
    python: &str,
    secret: &Path,
    outside: &Path,
) -> Result<(), String> {
    let mut swap_files = backend
        .exec(
            id,
            ExecRequest::new([python, "-c", SWAP_FILES, secret.to_str().unwrap()]),
        )
        .await
        .unwrap();
    wait_for(backend, id, "swapping").await?;
    let mut snapshots = 0;
    for round in 0..200 {
        let Ok(changes) = backend.export_changes(id).await else {
            continue;
        };
        let tar = collect(changes.tar).await;
        snapshots += 1;
        if String::from_utf8_lossy(&tar).contains(SECRET) {
            return Err(format!("round {round}: a snapshot read the host's secret"));
        }
    }
    if snapshots == 0 {
        return Err("no snapshot succeeded".into());
    }
    swap_files.kill().await.unwrap();

    let mut swap_staging = backend
        .exec(
            id,
            ExecRequest::new([python, "-c", SWAP_STAGING, outside.to_str().unwrap()]),
        )
        .await
        .unwrap();
    wait_for(backend, id, "swapping-staging").await?;
    let archive = archive();
    for round in 0..60 {
        let tar = futures::stream::once(futures::future::ready(Ok(archive.clone().into())));
        let _ = backend
            .import_tar(
                id,
                &"imported".parse().unwrap(),
                tar.boxed(),
                if round % 2 == 0 {
                    ImportOptions::merge()
                } else {
                    ImportOptions::replace()
                },
            )
            .await;
        let written = std::fs::read_dir(outside).unwrap().count();
        if written > 0 {
            return Err(format!(
                "round {round}: an import wrote {written} entries outside the workspace"
            ));
        }
    }
    swap_staging.kill().await.unwrap();
    Ok(())
}

/// Takes a write lease on each of ten files of its own and ignores the kernel's
/// requests to give them up: every open of one for reading, by anyone, then waits
/// `/proc/sys/fs/lease-break-time` (45 s by default) unless it will not wait.
const HOLD_LEASES: &str = r#"
import fcntl, os, signal, time
signal.signal(signal.SIGIO, signal.SIG_IGN)
fds = []
for i in range(10):
    open(f"leased{i}", "w").write("leased")
    fd = os.open(f"leased{i}", os.O_RDONLY)
    fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
    fds.append(fd)
open("leasing", "w").close()
time.sleep(600)
"#;

/// An incremental snapshot reads the sandbox's files through descriptors it opens
/// without `O_NONBLOCK`: a lease the sandbox holds (and never gives up) held each open
/// for the kernel's lease-break time, 45 s a file, with the snapshot's thread (and a
/// suspend's) waiting all that while. It must answer at once, an error at worst.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_the_sandbox_holds_does_not_hold_a_snapshot_up() {
    let Some(python) = common::python_available().then_some("python3") else {
        return;
    };
    for isolation in [Isolation::Landlock, Isolation::Namespaces] {
        let root = tempfile::tempdir().unwrap();
        let Some(backend) = backend(root.path(), isolation) else {
            continue;
        };
        let sb = backend.create(&SandboxSpec::default()).await.unwrap();
        let verdict = async {
            let _holder = backend
                .exec(&sb.id, ExecRequest::new([python, "-c", HOLD_LEASES]))
                .await
                .map_err(|e| e.to_string())?;
            wait_for(&backend, &sb.id, "leasing").await?;
            let started = std::time::Instant::now();
            if let Ok(changes) = backend.export_changes(&sb.id).await {
                let _ = collect(changes.tar).await;
            }
            let took = started.elapsed();
            if took > std::time::Duration::from_secs(20) {
                return Err(format!(
                    "the snapshot waited {took:?} on the sandbox's leases"
                ));
            }
            Ok::<(), String>(())
        }
        .await;
        backend.destroy(&sb.id).await.unwrap();
        if let Err(failure) = verdict {
            panic!("at {isolation:?}, {failure}");
        }
    }
}
