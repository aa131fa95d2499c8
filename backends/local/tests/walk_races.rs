//! ADVERSARIAL 42 on the local backend, beyond the swapping races every backend runs
//! (`walks_never_follow_a_racing_sandbox_out` in the conformance suite): a sandbox's
//! own file leases must not hold a snapshot up.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use futures::StreamExt;
use sandcell::{ExecRequest, SandboxBackend, SandboxSpec};
use sandcell_local::{Isolation, LocalBackend, WorkspaceStrategy};

mod common;

fn backend(root: &Path, isolation: Isolation) -> Option<LocalBackend> {
    let builder = LocalBackend::builder()
        .root(root)
        .workspace(WorkspaceStrategy::Overlay);
    common::build_at(builder, isolation)
}

/// Waits until the sandbox says, by making `marker`, that its program runs.
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
