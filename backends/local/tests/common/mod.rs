//! Shared helpers for the local backend's tests: kernel feature probes and a view of
//! which host processes belong to a sandbox.

#![allow(dead_code)]

use std::path::Path;

/// Whether overlay mounts work here. Without them the overlay tests skip loudly, unless
/// `SANDCELL_REQUIRE_OVERLAY=1` (set by CI), where a missing feature is a failure.
pub(crate) fn overlay_available() -> bool {
    let probe = tempfile::tempdir().unwrap();
    let backend = sandcell_local::LocalBackend::builder()
        .root(probe.path())
        .workspace(sandcell_local::WorkspaceStrategy::Overlay)
        .build()
        .unwrap();
    let rt = tokio::runtime::Handle::try_current();
    let result = match rt {
        Ok(_) => std::thread::scope(|s| {
            s.spawn(|| {
                tokio::runtime::Runtime::new()
                    .unwrap()
                    .block_on(probe_create(&backend))
            })
            .join()
            .unwrap()
        }),
        Err(_) => tokio::runtime::Runtime::new()
            .unwrap()
            .block_on(probe_create(&backend)),
    };
    sandcell::testing::require_or_skip("OVERLAY", "overlay mounts", result)
}

async fn probe_create(backend: &sandcell_local::LocalBackend) -> Result<(), String> {
    use sandcell::SandboxBackend;
    let sb = backend
        .create(&sandcell::SandboxSpec::default())
        .await
        .map_err(|e| e.to_string())?;
    backend.destroy(&sb.id).await.map_err(|e| e.to_string())
}

/// Host processes whose working directory is inside `workspace` (how the tests see a
/// sandbox's processes without trusting the backend's own bookkeeping).
pub(crate) fn processes_in(workspace: &Path) -> Vec<i32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        if let Ok(cwd) = std::fs::read_link(entry.path().join("cwd")) {
            if cwd.starts_with(workspace) && !is_zombie(pid) {
                pids.push(pid);
            }
        }
    }
    pids
}

/// The state letter from /proc/<pid>/stat (R, S, T, Z ...).
pub(crate) fn state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(") ").next()?.chars().next()
}

fn is_zombie(pid: i32) -> bool {
    state(pid) == Some('Z')
}

/// Polls `check` up to 200 times, 10 ms apart: bounds a wait for something the kernel
/// does asynchronously (reaping, freezing); it measures nothing.
pub(crate) async fn eventually(mut check: impl FnMut() -> bool) -> bool {
    for _ in 0..200 {
        if check() {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    false
}

/// Builds `builder` at `isolation`; where this host cannot isolate that way, `None`
/// (a skip said aloud), unless CI requires the level, where it is a failure.
pub(crate) fn build_at(
    builder: sandcell_local::LocalBackendBuilder,
    isolation: sandcell_local::Isolation,
) -> Option<sandcell_local::LocalBackend> {
    match builder.isolation(isolation).build() {
        Ok(b) => Some(b),
        Err(e) => {
            assert_eq!(e.kind(), sandcell::ErrorKind::Unsupported, "{e}");
            let feature = match isolation {
                sandcell_local::Isolation::Namespaces => "NAMESPACES",
                _ => "LANDLOCK",
            };
            sandcell::testing::require_or_skip(feature, "isolation", Err(e.to_string()));
            None
        }
    }
}

/// The uid and gid [`unprivileged`] runs a test as.
pub(crate) const NOBODY: u32 = 65534;

/// Whether the calling test's body is to run here, as an unprivileged user. It is when
/// this process is not root. When it is, `test` (the test's name, as `--exact` takes it)
/// is run again in a process of its own as uid and gid [`NOBODY`], with no
/// supplementary groups, and checked to pass there; the caller then returns.
pub(crate) fn unprivileged(test: &str) -> bool {
    use std::os::unix::process::CommandExt;
    if !rustix::process::geteuid().is_root() {
        return true;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .uid(NOBODY)
        .gid(NOBODY)
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    print!("{stdout}");
    eprint!("{stderr}");
    assert!(
        out.status.success(),
        "{test} failed as uid {NOBODY} ({})",
        out.status
    );
    assert!(
        stdout.contains("1 passed"),
        "{test} did not run as uid {NOBODY}"
    );
    false
}

/// Whether `python3` runs here (the tests' in-sandbox attackers are python scripts);
/// a skip said aloud unless CI requires it (`SANDCELL_REQUIRE_PYTHON`).
pub(crate) fn python_available() -> bool {
    let found = std::process::Command::new("python3")
        .arg("-c")
        .arg("pass")
        .status()
        .is_ok_and(|s| s.success());
    let probe = if found {
        Ok(())
    } else {
        Err("no python3".into())
    };
    sandcell::testing::require_or_skip("PYTHON", "python3", probe)
}

/// A temporary directory on tmpfs (`/dev/shm`) where this host has one, else in the
/// usual temporary directory. For tests that make tens of thousands of directories:
/// on a disk-backed file system that journals every `mkdir` and `rmdir` (CI's takes
/// about a millisecond each) they spend minutes on that alone.
pub(crate) fn fast_tempdir() -> tempfile::TempDir {
    const TMPFS_MAGIC: u64 = 0x0102_1994;
    let shm = Path::new("/dev/shm");
    let on_tmpfs = rustix::fs::statfs(shm).is_ok_and(|fs| fs.f_type as u64 == TMPFS_MAGIC);
    if on_tmpfs {
        if let Ok(dir) = tempfile::tempdir_in(shm) {
            return dir;
        }
    }
    tempfile::tempdir().unwrap()
}
