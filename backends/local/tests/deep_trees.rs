//! A sandbox's directory chain tens of thousands of levels deep (`mkdir d; cd d` in a
//! loop, which any process can do: nothing limits depth but inodes) against every
//! host-side walk of the workspace. A walk that recurses overflows its thread's stack,
//! which aborts the whole host process with every other sandbox it manages (and the
//! reconciler's destroy after a restart would abort it again); one that holds a
//! descriptor per level runs the process out of them. Each walk must answer, an error
//! at worst, and destroy must still remove the sandbox.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use futures::StreamExt;
use sandcell::{ErrorKind, ExecRequest, SandboxBackend, SandboxId, SandboxSpec};
use sandcell_local::{Isolation, LocalBackend, WorkspaceStrategy};

mod common;

/// Deeper than a 2 MiB stack (tokio's blocking threads) takes a recursive walk through:
/// `std::fs::remove_dir_all` gave out between 10,000 and 20,000 levels.
const DEPTH: usize = 40_000;

/// Makes a chain of directories `argv[2]/d/d/.../d` `argv[1]` levels deep (a few more),
/// with a file at the bottom. Made as an attacker would make it fast: chains of a
/// thousand levels, each moved to the bottom of the next, so no call resolves a path
/// deeper than that (under Landlock every access walks its path up to the root).
const MAKE_CHAIN: &str = r#"
import os, sys
total, step = int(sys.argv[1]), 1000
top = os.open(".", os.O_RDONLY)
prev, k, made = None, 0, 0
while made < total:
    name = f".chain{k}"
    os.mkdir(name, dir_fd=top)
    fd = os.open(name, os.O_RDONLY, dir_fd=top); os.fchdir(fd); os.close(fd)
    n = min(step, total - made)
    for _ in range(n):
        os.mkdir("d"); os.chdir("d")
    if prev is None:
        open("bottom", "w").write("x")
    else:
        os.rename(prev, "d", src_dir_fd=top)
    made, prev, k = made + n, name, k + 1
    os.fchdir(top)
os.rename(prev, sys.argv[2], src_dir_fd=top, dst_dir_fd=top)
"#;

fn backend(root: &Path, isolation: Isolation) -> Option<LocalBackend> {
    match LocalBackend::builder()
        .root(root)
        .isolation(isolation)
        .workspace(WorkspaceStrategy::Overlay)
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

/// Runs the chain maker in the sandbox: the chain is `name` in its workspace.
async fn make_chain(backend: &LocalBackend, id: &SandboxId, name: &str) -> Result<(), String> {
    let out = backend
        .exec(
            id,
            ExecRequest::new(["python3", "-c", MAKE_CHAIN, &DEPTH.to_string(), name]),
        )
        .await
        .map_err(|e| e.to_string())?
        .collect(1 << 16)
        .await
        .map_err(|e| e.to_string())?;
    if !out.success() {
        return Err(format!("making the chain failed: {}", out.stderr_str()));
    }
    Ok(())
}

async fn drain(stream: sandcell::ByteStream) -> Result<u64, String> {
    let mut stream = stream;
    let mut n = 0;
    while let Some(chunk) = stream.next().await {
        n += chunk.map_err(|e| e.to_string())?.len() as u64;
    }
    Ok(n)
}

/// A sandbox at each isolation level whose workspace holds a deep chain at `tree`,
/// given to `attack`; destroyed whatever `attack` found, and its verdict then told.
async fn with_deep_chain<F, Fut>(attack: F)
where
    F: Fn(LocalBackend, SandboxId) -> Fut,
    Fut: std::future::Future<Output = (LocalBackend, Result<(), String>)>,
{
    if !common::python_available() || !common::overlay_available() {
        return;
    }
    for isolation in [Isolation::Landlock, Isolation::Namespaces] {
        let root = common::fast_tempdir();
        let Some(backend) = backend(root.path(), isolation) else {
            continue;
        };
        let sb = backend.create(&SandboxSpec::default()).await.unwrap();
        let made = make_chain(&backend, &sb.id, "tree").await;
        let (backend, verdict) = match made {
            Ok(()) => attack(backend, sb.id.clone()).await,
            Err(e) => (backend, Err(e)),
        };
        let destroyed = backend.destroy(&sb.id).await;
        if let Err(failure) = verdict {
            panic!("at {isolation:?}: {failure}");
        }
        destroyed.unwrap_or_else(|e| panic!("at {isolation:?}, destroy: {e}"));
        let left = std::fs::read_dir(root.path().join("sandboxes")).map_or(0, |d| d.count());
        assert_eq!(
            left, 0,
            "at {isolation:?}, destroy left a sandbox directory"
        );
    }
}

/// Destroy (the with_deep_chain around it) removes the chain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destroy_removes_a_deep_chain() {
    with_deep_chain(|backend, _| async move { (backend, Ok(())) }).await;
}

/// A clone of a busy source copies its upper layer (a namespaced source's always is):
/// it may fail, but must answer, and leave nothing of itself behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clone_of_a_deep_chain_answers() {
    with_deep_chain(|backend, id| async move {
        let verdict = async {
            let mut busy = backend
                .exec(&id, ExecRequest::new(["sleep", "60"]))
                .await
                .map_err(|e| e.to_string())?;
            let cloned = backend.clone_sandbox(&id, Default::default()).await;
            let _ = busy.kill().await;
            if let Ok(clone) = cloned {
                backend
                    .destroy(&clone.id)
                    .await
                    .map_err(|e| format!("destroying the clone: {e}"))?;
            }
            Ok(())
        }
        .await;
        (backend, verdict)
    })
    .await;
}

/// Makes `wide/0` .. `wide/24999`, with a one-byte file in every thousandth: more
/// directories side by side than the test process may hold descriptors.
const MAKE_WIDE: &str = r#"
import os
os.mkdir("wide")
for i in range(25000):
    os.mkdir(f"wide/{i}")
    if i % 1000 == 0:
        open(f"wide/{i}/f", "w").write("x")
"#;

/// Disk usage, the full export (downloads, full snapshots), the change set
/// (incremental snapshots) and the file API's recursive remove, of a deep chain and of
/// a wide directory: none may take the process down, nor need a descriptor per
/// directory (disk usage under-reported, and a remove failed with `EMFILE`, while every
/// other sandbox's calls failed with it too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn walks_of_a_deep_chain_answer() {
    with_deep_chain(|backend, id| async move {
        let verdict = async {
            let wide = backend
                .exec(&id, ExecRequest::new(["python3", "-c", MAKE_WIDE]))
                .await
                .map_err(|e| e.to_string())?
                .collect(1 << 16)
                .await
                .map_err(|e| e.to_string())?;
            if !wide.success() {
                return Err(format!("making wide/ failed: {}", wide.stderr_str()));
            }
            // The chain's file and wide/'s 25.
            let usage = backend.metrics(&id).await.map_err(|e| e.to_string())?;
            if usage.disk_bytes != Some(26) {
                return Err(format!("disk usage {:?}, not 26 bytes", usage.disk_bytes));
            }
            if let Ok(tar) = backend.export_tar(&id, &"tree".parse().unwrap()).await {
                let _ = drain(tar).await;
            }
            let wide_tar = backend
                .export_tar(&id, &"wide".parse().unwrap())
                .await
                .map_err(|e| e.to_string())?;
            drain(wide_tar)
                .await
                .map_err(|e| format!("exporting wide/: {e}"))?;
            if let Ok(changes) = backend.export_changes(&id).await {
                let _ = drain(changes.tar).await;
            }
            for dir in ["tree", "wide"] {
                backend
                    .remove(&id, &dir.parse().unwrap(), true)
                    .await
                    .map_err(|e| format!("removing {dir}: {e}"))?;
            }
            Ok(())
        }
        .await;
        (backend, verdict)
    })
    .await;
}
