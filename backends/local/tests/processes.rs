//! Process trees on the local backend: timeouts and kills take the whole group, output
//! caps keep draining, background processes live until destroy, pause freezes.

// Test helpers outside #[test] fns report failures by panicking too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use sandcell::{ExecRequest, SandboxBackend, SandboxBackendExt, SandboxId, SandboxSpec};
use sandcell_local::LocalBackend;

mod common;

struct Fixture {
    _root: tempfile::TempDir,
    backend: LocalBackend,
    id: SandboxId,
    workspace: PathBuf,
}

async fn fixture() -> Fixture {
    let root = tempfile::tempdir().unwrap();
    let backend = LocalBackend::builder()
        .root(root.path())
        .kill_grace(Duration::from_millis(300))
        .build()
        .unwrap();
    let info = backend.create(&SandboxSpec::default()).await.unwrap();
    let workspace = PathBuf::from(&info.details["host_path"]);
    Fixture {
        _root: root,
        backend,
        id: info.id,
        workspace,
    }
}

/// Destroys the sandbox even when a test fails half-way (destroy is idempotent, so
/// tests that destroy it themselves are unaffected).
impl Drop for Fixture {
    fn drop(&mut self) {
        let (backend, id) = (self.backend.clone(), self.id.clone());
        std::thread::spawn(move || {
            if let Ok(rt) = tokio::runtime::Runtime::new() {
                let _ = rt.block_on(backend.destroy(&id));
            }
        })
        .join()
        .ok();
    }
}

/// Waits briefly for processes to disappear (a SIGKILLed process is reaped by its parent
/// shortly after, not instantly).
async fn settled(workspace: &std::path::Path) -> Vec<i32> {
    for _ in 0..100 {
        let left = common::processes_in(workspace);
        if left.is_empty() {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    common::processes_in(workspace)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_kills_the_whole_tree_promptly() {
    let f = fixture().await;
    let started = Instant::now();
    let out = f
        .backend
        .run(
            &f.id,
            ExecRequest::shell("sleep 1000 & sleep 1000").timeout(Duration::from_secs(2)),
        )
        .await
        .unwrap();
    assert!(out.status.timed_out, "{:?}", out.status);
    // Not a timing assertion on the implementation's speed: it only rules out a hang
    // (the commands would run for 1000 s).
    assert!(started.elapsed() < Duration::from_secs(60));
    assert_eq!(
        settled(&f.workspace).await,
        Vec::<i32>::new(),
        "no process of the sandbox is left"
    );
    f.backend.destroy(&f.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_ignoring_sigterm_is_killed() {
    let f = fixture().await;
    let out = f
        .backend
        .run(
            &f.id,
            ExecRequest::shell("trap '' TERM; sleep 1000 & wait")
                .timeout(Duration::from_millis(500)),
        )
        .await
        .unwrap();
    assert!(out.status.timed_out);
    assert_eq!(settled(&f.workspace).await, Vec::<i32>::new());
    f.backend.destroy(&f.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn yes_is_capped_and_still_times_out() {
    let f = fixture().await;
    let out = f
        .backend
        .run(
            &f.id,
            ExecRequest::new(["yes"])
                .output_limit(1000)
                .timeout(Duration::from_secs(1)),
        )
        .await
        .unwrap();
    assert_eq!(out.stdout.len(), 1000);
    assert!(out.stdout_truncated);
    assert!(out.status.timed_out);
    assert_eq!(settled(&f.workspace).await, Vec::<i32>::new());
    f.backend.destroy(&f.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grandchild_holding_stdout_cannot_hang_the_call() {
    let f = fixture().await;
    // The background sleep inherits stdout and keeps the pipe open.
    let out = f
        .backend
        .run(&f.id, ExecRequest::shell("sleep 1000 & echo started"))
        .await
        .unwrap();
    assert_eq!(out.stdout_str(), "started\n");
    assert!(out.success());
    let alive = common::processes_in(&f.workspace);
    assert_eq!(
        alive.len(),
        1,
        "the background process outlives the exec: {alive:?}"
    );

    f.backend.destroy(&f.id).await.unwrap();
    assert_eq!(
        settled(&f.workspace).await,
        Vec::<i32>::new(),
        "destroy kills it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_kills_everything_and_keeps_the_workspace() {
    let f = fixture().await;
    f.backend
        .run_shell(&f.id, "echo kept > file; sleep 1000 >/dev/null 2>&1 &")
        .await
        .unwrap();
    assert_eq!(common::processes_in(&f.workspace).len(), 1);
    f.backend.reset(&f.id).await.unwrap();
    assert_eq!(settled(&f.workspace).await, Vec::<i32>::new());
    assert_eq!(
        f.backend
            .read_to_string(&f.id, &"file".parse().unwrap())
            .await
            .unwrap(),
        "kept\n"
    );
    f.backend.destroy(&f.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_freezes_and_resume_thaws() {
    let f = fixture().await;
    f.backend
        .run_shell(&f.id, "sleep 1000 >/dev/null 2>&1 &")
        .await
        .unwrap();
    let pids = common::processes_in(&f.workspace);
    assert_eq!(pids.len(), 1);
    let info = f.backend.inspect(&f.id).await.unwrap();
    // With a cgroup the freezer pauses (it reaches every process); without, SIGSTOP.
    let frozen_flag = |want: &'static str| {
        let cgroup = info.details.get("cgroup").cloned();
        move || match &cgroup {
            Some(dir) => std::fs::read_to_string(format!("{dir}/cgroup.events"))
                .is_ok_and(|e| e.lines().any(|l| l == format!("frozen {want}"))),
            None => false,
        }
    };
    f.backend.pause(&f.id).await.unwrap();
    let stopped = if info.details.contains_key("cgroup") {
        common::eventually(frozen_flag("1")).await
    } else {
        common::eventually(|| common::state(pids[0]) == Some('T')).await
    };
    assert!(stopped, "paused processes are frozen");
    f.backend.resume(&f.id).await.unwrap();
    let running = if info.details.contains_key("cgroup") {
        common::eventually(frozen_flag("0")).await
    } else {
        common::eventually(|| common::state(pids[0]) == Some('S')).await
    };
    assert!(running, "resumed processes run again");
    f.backend.destroy(&f.id).await.unwrap();
    assert_eq!(settled(&f.workspace).await, Vec::<i32>::new());
}

/// Whether sandboxes get cgroups here; skips loudly unless `SANDCELL_REQUIRE_CGROUPS=1`.
fn has_cgroup(info: &sandcell::SandboxInfo) -> bool {
    let probe = match info.details.contains_key("cgroup") {
        true => Ok(()),
        false => Err("no writable cgroup v2 hierarchy here (run as root)".to_owned()),
    };
    sandcell::testing::require_or_skip("CGROUPS", "cgroups", probe)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_setsid_escapee_is_killed_on_destroy() {
    let f = fixture().await;
    let info = f.backend.inspect(&f.id).await.unwrap();
    if !has_cgroup(&info) {
        return;
    }
    let out = f
        .backend
        .run_shell(
            &f.id,
            "setsid sleep 1000 >/dev/null 2>&1 < /dev/null & echo ok",
        )
        .await
        .unwrap();
    assert!(out.success());
    assert!(
        common::eventually(|| common::processes_in(&f.workspace).len() == 1).await,
        "the escapee runs"
    );
    f.backend.destroy(&f.id).await.unwrap();
    assert_eq!(
        settled(&f.workspace).await,
        Vec::<i32>::new(),
        "destroy reached it through the cgroup"
    );
    assert!(
        !std::path::Path::new(&info.details["cgroup"]).exists(),
        "the cgroup is removed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_bomb_is_contained_and_destroy_leaves_nothing() {
    let root = tempfile::tempdir().unwrap();
    let backend = LocalBackend::builder()
        .root(root.path())
        .kill_grace(Duration::from_millis(200))
        .build()
        .unwrap();
    let spec = SandboxSpec::default().limits(sandcell::Limits::new().pids(64));
    let info = match backend.create(&spec).await {
        Ok(info) => info,
        Err(e) if e.kind() == sandcell::ErrorKind::Unsupported => {
            sandcell::testing::require_or_skip("CGROUPS", "pids limits", Err(e.to_string()));
            return;
        }
        Err(e) => panic!("{e}"),
    };
    // Never start a fork bomb unless the limit is verifiably in place.
    let pids_dir = info
        .details
        .get("cgroup_pids")
        .or(info.details.get("cgroup"))
        .cloned()
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(format!("{pids_dir}/pids.max"))
            .unwrap()
            .trim(),
        "64"
    );
    let workspace = PathBuf::from(&info.details["host_path"]);

    let out = backend
        .run(
            &info.id,
            ExecRequest::shell("b() { b | b & }; b; sleep 1000").timeout(Duration::from_secs(3)),
        )
        .await
        .unwrap();
    assert!(out.status.timed_out || !out.success());
    let peak: u64 = std::fs::read_to_string(format!("{pids_dir}/pids.peak"))
        .ok()
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or(0);
    assert!(peak <= 64, "the pids limit held: peak {peak}");

    backend.destroy(&info.id).await.unwrap();
    assert_eq!(
        settled(&workspace).await,
        Vec::<i32>::new(),
        "nothing of the bomb survives destroy"
    );
    assert!(!std::path::Path::new(&pids_dir).exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_environment_is_clean() {
    let f = fixture().await;
    let out = f.backend.run_shell(&f.id, "env | sort").await.unwrap();
    let text = out.stdout_str();
    let mut keys: Vec<String> = text
        .lines()
        .filter_map(|l| l.split_once('=').map(|(k, _)| k.to_owned()))
        .collect();
    keys.retain(|k| !matches!(k.as_str(), "PWD" | "SHLVL" | "_" | "OLDPWD"));
    assert_eq!(
        keys,
        ["HOME", "LANG", "PATH", "TMPDIR"],
        "only the minimal base: {text}"
    );
    f.backend.destroy(&f.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_program_is_not_found() {
    let f = fixture().await;
    let err = f
        .backend
        .exec(&f.id, ExecRequest::new(["no-such-program-xyz"]))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), sandcell::ErrorKind::NotFound, "{err}");
    f.backend.destroy(&f.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_and_disk_limits_apply() {
    let root = tempfile::tempdir().unwrap();
    // A default disk limit needs the capability (root and loop devices), as a spec's
    // does (tests/disk_quota.rs).
    let disk = LocalBackend::builder()
        .root(root.path())
        .build()
        .unwrap()
        .capabilities()
        .disk_limit;
    let mut defaults = sandcell::Limits::new().pids(128);
    if disk {
        defaults = defaults.disk_bytes(1 << 20);
    }
    let backend = LocalBackend::builder()
        .root(root.path())
        .default_limits(defaults)
        .build()
        .unwrap();
    let info = match backend.create(&SandboxSpec::default()).await {
        Ok(info) => info,
        Err(e) if e.kind() == sandcell::ErrorKind::Unsupported => {
            sandcell::testing::require_or_skip("CGROUPS", "cgroup limits", Err(e.to_string()));
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let pids_dir = info
        .details
        .get("cgroup_pids")
        .or(info.details.get("cgroup"))
        .cloned()
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(format!("{pids_dir}/pids.max"))
            .unwrap()
            .trim(),
        "128",
        "the default pids limit applied"
    );
    // The default disk limit: no file grows past it (a disk of that size, and
    // RLIMIT_FSIZE).
    if disk {
        let out = backend
            .run_shell(&info.id, "head -c 5000000 /dev/zero > big; wc -c < big")
            .await
            .unwrap();
        let size: u64 = out.stdout_str().trim().parse().unwrap();
        assert!(
            size <= 1 << 20,
            "a file stopped at the disk limit: {size} bytes"
        );
    }
    backend.destroy(&info.id).await.unwrap();
}

/// A timeout or a kill ends everything the command started, `setsid`, `nohup` and a
/// double fork included (each command has a cgroup of its own); a command that exits
/// on its own may leave background processes, which run until the sandbox goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeouts_and_kills_end_what_left_the_process_group() {
    let f = fixture().await;
    let info = f.backend.inspect(&f.id).await.unwrap();
    if !has_cgroup(&info) {
        return;
    }
    let escapees = "setsid sleep 1000 >/dev/null 2>&1 </dev/null & \
                    nohup setsid sleep 1000 >/dev/null 2>&1 </dev/null & \
                    (setsid sleep 1000 >/dev/null 2>&1 </dev/null &); ";
    let commands = || {
        std::fs::read_dir(&info.details["cgroup"])
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("cmd-"))
            .count()
    };

    let out = f
        .backend
        .run(
            &f.id,
            ExecRequest::shell(format!("{escapees} sleep 1000"))
                .timeout(Duration::from_millis(500)),
        )
        .await
        .unwrap();
    assert!(out.status.timed_out);
    assert_eq!(
        settled(&f.workspace).await,
        Vec::<i32>::new(),
        "the timeout ended every descendant"
    );
    assert!(
        common::eventually(|| commands() == 0).await,
        "its cgroup is gone"
    );

    let mut process = f
        .backend
        .exec(&f.id, ExecRequest::shell(format!("{escapees} sleep 1000")))
        .await
        .unwrap();
    assert!(
        common::eventually(|| common::processes_in(&f.workspace).len() >= 5).await,
        "the command and its escapees run"
    );
    process.kill().await.unwrap();
    process.wait().await.unwrap();
    assert_eq!(
        settled(&f.workspace).await,
        Vec::<i32>::new(),
        "the kill ended every descendant"
    );

    let out = f
        .backend
        .run_shell(&f.id, &format!("{escapees} echo ok"))
        .await
        .unwrap();
    assert_eq!(out.stdout_str(), "ok\n");
    assert!(
        common::eventually(|| common::processes_in(&f.workspace).len() == 3).await,
        "background processes of a command that exited run on"
    );
    assert_eq!(commands(), 1, "their cgroup stays while they run");
    f.backend.destroy(&f.id).await.unwrap();
    assert_eq!(settled(&f.workspace).await, Vec::<i32>::new());
    assert!(!std::path::Path::new(&info.details["cgroup"]).exists());
}

/// Metrics from the sandbox's cgroup: CPU time that grows with work (and stays after
/// the work ended), memory in use under the limit set, every process counted
/// (`setsid` ones too), and the workspace's bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_come_from_the_cgroup() {
    let root = tempfile::tempdir().unwrap();
    let backend = LocalBackend::builder().root(root.path()).build().unwrap();
    let limit = 512 << 20;
    let spec = SandboxSpec::default().limits(sandcell::Limits::new().memory_bytes(limit));
    let info = match backend.create(&spec).await {
        Ok(info) => info,
        Err(e) if e.kind() == sandcell::ErrorKind::Unsupported => {
            sandcell::testing::require_or_skip("CGROUPS", "cgroup limits", Err(e.to_string()));
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let id = info.id.clone();
    let idle = backend.metrics(&id).await.unwrap();
    assert_eq!(idle.processes, Some(0));
    assert_eq!(idle.memory_limit_bytes, Some(limit));
    let out = backend
        .run_shell(
            &id,
            "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; \
             head -c 300000 /dev/zero > data.bin; \
             setsid sleep 60 >/dev/null 2>&1 < /dev/null & sleep 60 >/dev/null 2>&1 & echo ok",
        )
        .await
        .unwrap();
    assert!(out.success(), "{out:?}");
    let busy = backend.metrics(&id).await.unwrap();
    let cpu = busy.cpu_time.expect("cpu.stat is read");
    assert!(
        cpu > idle.cpu_time.unwrap_or_default() + Duration::from_millis(20),
        "the loop's CPU time is counted after it ended: {cpu:?}"
    );
    assert_eq!(busy.processes, Some(2), "both sleepers, setsid or not");
    if let Some(memory) = busy.memory_bytes {
        assert!(memory > 0 && memory < limit, "memory in use: {memory}");
    }
    let disk = busy.disk_bytes.unwrap();
    assert!(
        (300_000..400_000).contains(&disk),
        "the workspace's bytes: {disk}"
    );
    backend.reset(&id).await.unwrap();
    assert_eq!(backend.metrics(&id).await.unwrap().processes, Some(0));
    backend.destroy(&id).await.unwrap();
    assert_eq!(
        backend.metrics(&id).await.unwrap_err().kind(),
        sandcell::ErrorKind::NotFound
    );
}

/// A command starts with every signal at its default: none blocked, none ignored
/// (this process ignores SIGPIPE, as Rust programs do, and SIGHUP when started under
/// `nohup`, as CI does; the command inherits neither).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_starts_with_no_signal_blocked_or_ignored() {
    let f = fixture().await;
    let out = f
        .backend
        .run(&f.id, ExecRequest::new(["cat", "/proc/self/status"]))
        .await
        .unwrap();
    let status = out.stdout_str();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
            .unwrap_or_else(|| panic!("{name} in {status}"))
            .to_owned()
    };
    assert_eq!(field("SigBlk:"), "0000000000000000", "blocked signals");
    assert_eq!(field("SigIgn:"), "0000000000000000", "ignored signals");
    f.backend.destroy(&f.id).await.unwrap();
}

/// What execvp(3) does, the command start does: a file without a `#!` line runs as a
/// shell script, one that is not executable is refused as such.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn programs_are_found_and_started_as_execvp_would() {
    use std::os::unix::fs::PermissionsExt;
    let f = fixture().await;
    let script = f.workspace.join("greet");
    std::fs::write(&script, "echo \"hello $1\"\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = f
        .backend
        .run(&f.id, ExecRequest::new(["./greet", "there"]))
        .await
        .unwrap();
    assert_eq!(out.stdout_str(), "hello there\n", "{out:?}");

    std::fs::write(f.workspace.join("notes.txt"), "not a program").unwrap();
    let err = f
        .backend
        .exec(&f.id, ExecRequest::new(["./notes.txt"]))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), sandcell::ErrorKind::PermissionDenied, "{err}");

    let err = f
        .backend
        .exec(&f.id, ExecRequest::new(["echo", "a\0b"]))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), sandcell::ErrorKind::InvalidInput, "{err}");
    f.backend.destroy(&f.id).await.unwrap();
}

/// A command is reaped by the time its status is reported, and one whose supervisor
/// went away (its runtime shut down) is reaped when it ends: no zombies either way.
#[test]
fn commands_leave_no_zombies() {
    let gone = |pid: &str| !std::path::Path::new(&format!("/proc/{pid}")).exists();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let f = runtime.block_on(fixture());
    let out = runtime
        .block_on(f.backend.run_shell(&f.id, "echo $$"))
        .unwrap();
    let waited = out.stdout_str().trim().to_owned();
    assert!(
        gone(&waited),
        "process {waited} reaped once its status is out"
    );

    // Left running when its runtime goes.
    let mut process = runtime
        .block_on(f.backend.exec(
            &f.id,
            ExecRequest::new(["sh", "-c", "echo $$; exec sleep 0.3"]),
        ))
        .unwrap();
    let mut stdout = process.take_stdout().unwrap();
    let first = runtime.block_on(futures::StreamExt::next(&mut stdout));
    let orphan = String::from_utf8_lossy(&first.unwrap().unwrap())
        .trim()
        .to_owned();
    drop((stdout, process));
    drop(runtime);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !gone(&orphan) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(gone(&orphan), "process {orphan} reaped after it ended");
}
