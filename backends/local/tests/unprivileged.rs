//! The local backend run by an unprivileged user (as uid 65534 when the tests run as
//! root): sandboxes without cgroups, whose commands are known by their process groups,
//! and namespaced sandboxes.

// Test helpers outside #[test] fns report failures by panicking too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::time::Duration;

use sandcell::{ExecRequest, SandboxBackend, SandboxBackendExt, SandboxSpec};
use sandcell_local::{Isolation, LocalBackend};

mod common;

/// The process groups recorded in sandbox directory `dir`, in any format a version of
/// the backend wrote: the `groups` file's lines (bare ids, up to now) and the entries of
/// `process-groups/`.
fn recorded(dir: &Path) -> Vec<String> {
    let mut found: Vec<String> = std::fs::read_to_string(dir.join("groups"))
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_owned)
        .collect();
    if let Ok(entries) = std::fs::read_dir(dir.join("process-groups")) {
        found.extend(entries.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()));
    }
    found
}

/// `(session, start time)` of process `pid`, from `/proc/<pid>/stat` (fields 6 and 22).
fn identity(pid: u32) -> (i32, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 1..]
        .split_whitespace()
        .collect();
    (fields[3].parse().unwrap(), fields[19].parse().unwrap())
}

/// Records, in the way each version of the backend would find them, groups that are
/// not the sandbox's: `stranger`'s by its id alone (as versions before this one
/// recorded every group), by its id with another start time (its pid reused since),
/// and group 1 with its leader's true identity (which `kill(-1)` would mean).
/// (`<pgid>-<pid>-<session>-<start>` is this version's entry.)
fn record_strangers(dir: &Path, stranger: u32) {
    use std::io::Write;
    let mut groups = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("groups"))
        .unwrap();
    writeln!(groups, "{stranger}").unwrap();
    let entries = dir.join("process-groups");
    std::fs::create_dir_all(&entries).unwrap();
    let (session, start) = identity(stranger);
    let (init_session, init_start) = identity(1);
    for name in [
        format!("{stranger}-{stranger}-{session}-{}", start + 1),
        format!("1-1-{init_session}-{init_start}"),
    ] {
        std::fs::write(entries.join(name), "").unwrap();
    }
}

/// A process of the test's, in a group of its own, that is not the sandbox's; killed
/// when dropped, so a failing test leaves it behind neither.
struct Stranger(std::process::Child);

impl Stranger {
    fn start() -> Stranger {
        let child = std::process::Command::new("sleep")
            .arg("300")
            .process_group(0)
            .spawn()
            .unwrap();
        Stranger(child)
    }

    /// Whether it still runs, after giving a signal sent to it time to land.
    async fn still_runs(&mut self) -> bool {
        tokio::time::sleep(Duration::from_millis(200)).await;
        self.0.try_wait().unwrap().is_none()
    }
}

impl Drop for Stranger {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Without cgroups a sandbox's commands are known by their process groups, each only
/// while a process recorded in it is still there: once a group is empty its id may be
/// anyone's. A group recorded but not verifiably the sandbox's (an older version's bare
/// id, a reused pid, group 1) is never signalled by reset or destroy; a running command
/// still is, and so is what an ended one left in its group.
#[tokio::test]
async fn only_groups_verifiably_the_sandboxs_are_signalled() {
    if !common::unprivileged("only_groups_verifiably_the_sandboxs_are_signalled") {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let b = LocalBackend::builder()
        .root(root.path().join("root"))
        .isolation(Isolation::None)
        .build()
        .unwrap();
    let info = b.create(&SandboxSpec::default()).await.unwrap();
    if info.details.contains_key("cgroup") {
        // A user with a delegated cgroup: the cgroup tracks the processes instead.
        eprintln!("SKIPPED: sandboxes get cgroups here, so no process group is recorded");
        b.destroy(&info.id).await.unwrap();
        return;
    }
    let dir = Path::new(&info.details["host_path"]).parent().unwrap();
    let id = &info.id;

    let out = b
        .run(id, ExecRequest::new(["sh", "-c", "exit 0"]))
        .await
        .unwrap();
    assert!(out.status.success());
    assert_eq!(
        recorded(dir),
        Vec::<String>::new(),
        "a finished command is forgotten"
    );

    // A command that ends leaving a job in its group: the group is known by the job.
    let script = "sleep 300 >/dev/null 2>&1 & echo $!";
    let out = b
        .run(id, ExecRequest::new(["sh", "-c", script]))
        .await
        .unwrap();
    let job: i32 = out.stdout_str().trim().parse().unwrap();
    assert_eq!(recorded(dir).len(), 1, "the group is recorded by its job");

    let mut stranger = Stranger::start();
    let mut running = b
        .exec(id, ExecRequest::new(["sleep", "300"]))
        .await
        .unwrap();
    assert_eq!(recorded(dir).len(), 2, "a running command is recorded");
    record_strangers(dir, stranger.0.id());
    b.reset(id).await.unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(5), running.wait()).await;
    assert!(
        !ended.unwrap().unwrap().success(),
        "reset ends the running command"
    );
    let job_gone = common::eventually(|| common::state(job).is_none_or(|s| s == 'Z')).await;
    assert!(job_gone, "reset ends what an ended command left running");
    assert!(stranger.still_runs().await, "reset spared the stranger");

    record_strangers(dir, stranger.0.id());
    b.destroy(id).await.unwrap();
    assert!(stranger.still_runs().await, "destroy spared the stranger");
}

/// `Isolation::Namespaces` works for an unprivileged user: bubblewrap's namespaces are
/// joined by every command (they used to be refused, `nsenter: reassociate to
/// namespace 'ns/ipc' failed`), and the sandbox's files are this user's on the host.
#[tokio::test]
async fn namespaces_work_for_an_unprivileged_user() {
    if !common::unprivileged("namespaces_work_for_an_unprivileged_user") {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let builder = LocalBackend::builder().root(root.path().join("root"));
    let Some(b) = common::build_at(builder, Isolation::Namespaces) else {
        return;
    };
    let info = b.create(&SandboxSpec::default()).await.unwrap();
    let out = b
        .run(
            &info.id,
            ExecRequest::new(["sh", "-c", "echo made > made.txt && pwd && id -u"]),
        )
        .await
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.stdout_str(), "/workspace\n0\n");
    let host = Path::new(&info.details["host_path"]).join("made.txt");
    assert_eq!(std::fs::read_to_string(&host).unwrap(), "made\n");
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        std::fs::metadata(&host).unwrap().uid(),
        rustix::process::geteuid().as_raw(),
        "the sandbox's root is this user on the host"
    );
    b.destroy(&info.id).await.unwrap();
}

/// What an unprivileged backend's Landlock sandboxes would share with each other and
/// with the user's own programs as one uid, and Landlock does not mediate: System V
/// IPC is refused (the host's segment stays out of reach), and `clone3`, which could
/// start a child in a cgroup of the user's delegated tree, answers `ENOSYS`.
#[tokio::test]
async fn landlock_sandboxes_share_no_ipc_and_pick_no_cgroup() {
    if !common::unprivileged("landlock_sandboxes_share_no_ipc_and_pick_no_cgroup")
        || !common::python_available()
    {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let builder = LocalBackend::builder().root(root.path().join("root"));
    let Some(b) = common::build_at(builder, Isolation::Landlock) else {
        return;
    };
    // A segment of the user's own, outside any sandbox.
    // SAFETY: shmget(2) with integer arguments.
    let shmid = unsafe { libc::shmget(libc::IPC_PRIVATE, 4096, libc::IPC_CREAT | 0o600) };
    assert!(shmid >= 0, "{}", std::io::Error::last_os_error());
    let info = b.create(&SandboxSpec::default()).await.unwrap();
    let script = r#"
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
def errno_of(r):
    return ctypes.get_errno() if r in (-1, ctypes.c_void_p(-1).value, None) else 0
print('shmget', errno_of(libc.shmget(0, 4096, 0o1000 | 0o600)))
print('shmat', errno_of(libc.shmat(int(sys.argv[1]), None, 0o10000)))
print('msgget', errno_of(libc.msgget(0, 0o1000 | 0o600)))
print('clone3', errno_of(libc.syscall(435, None, 0)))
"#;
    let out = b
        .run(
            &info.id,
            ExecRequest::new(["python3", "-c", script, &shmid.to_string()]),
        )
        .await
        .unwrap();
    b.destroy(&info.id).await.unwrap();
    // SAFETY: shmctl(2) IPC_RMID of the segment made above.
    unsafe { libc::shmctl(shmid, libc::IPC_RMID, std::ptr::null_mut()) };
    assert_eq!(
        out.stdout_str(),
        format!(
            "shmget {eperm}\nshmat {eperm}\nmsgget {eperm}\nclone3 {enosys}\n",
            eperm = libc::EPERM,
            enosys = libc::ENOSYS
        ),
        "{out:?}"
    );
}
