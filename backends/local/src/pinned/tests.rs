//! A held init names its process and no other: once it has ended, nothing is entered or
//! opened through it, even after its pid went to another process (ADVERSARIAL 47).

use super::*;
use sandcell::{ExecRequest, SandboxBackend, SandboxPath, SandboxSpec};
use std::collections::BTreeMap;

/// A host process started by the test, killed and reaped when dropped.
struct Started(std::process::Child);

impl Started {
    fn sleep() -> Started {
        Started(
            std::process::Command::new("sleep")
                .arg("300")
                .spawn()
                .unwrap(),
        )
    }

    /// A process in user and mount namespaces of its own with a root like a sandbox's
    /// (`/usr`, `/proc`, an empty `/workspace`), as another sandbox's is. The same
    /// process throughout: `unshare` execs the script, which execs `sleep`.
    fn elsewhere() -> Started {
        const ROOT: &str = "set -e
            mount -t tmpfs tmpfs /tmp
            cd /tmp
            mkdir usr proc workspace old
            mount --rbind /usr usr
            mount --rbind /proc proc
            for d in bin sbin lib lib64; do ln -s usr/$d $d; done
            pivot_root . old
            exec sleep 300";
        Started(
            std::process::Command::new("unshare")
                .args([
                    "--user",
                    "--map-root-user",
                    "--mount",
                    "--",
                    "sh",
                    "-c",
                    ROOT,
                ])
                .spawn()
                .unwrap(),
        )
    }

    fn pid(&self) -> i32 {
        self.0.id() as i32
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts a process in namespaces of its own with pid `pid`, which must be free, by
/// making the kernel hand that pid out next (`ns_last_pid`); retried when another
/// process takes it first. `None` where this process may not steer pids (not root, or
/// not in the initial pid namespace).
fn reuse(pid: i32) -> Option<Started> {
    for _ in 0..200 {
        std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string()).ok()?;
        let started = Started::elsewhere();
        if started.pid() == pid {
            return Some(started);
        }
    }
    None
}

fn id() -> SandboxId {
    SandboxId::new("sb-pinned-test").unwrap()
}

#[test]
fn an_ended_process_is_not_pinned() {
    let started = Started::sleep();
    let pid = started.pid();
    let pinned = PinnedInit::open(pid).unwrap().unwrap();
    assert!(pinned.is_running());
    let start = Some(pinned.start());
    assert!(PinnedInit::pin(&id(), pid, start).is_ok());
    let wrong = PinnedInit::pin(&id(), pid, Some(pinned.start() + 1)).unwrap_err();
    assert_eq!(wrong.kind(), ErrorKind::InvalidState, "{wrong}");
    let older = PinnedInit::pin(&id(), pid, None).unwrap_err();
    assert_eq!(older.kind(), ErrorKind::InvalidState, "{older}");

    drop(started);
    assert!(!pinned.is_running());
    assert!(pinned.open_at("ns/mnt", OFlags::RDONLY).is_err());
    assert!(std::fs::read_link(pinned.path("ns/mnt")).is_err());
    let gone = PinnedInit::pin(&id(), pid, start).unwrap_err();
    assert_eq!(gone.kind(), ErrorKind::InvalidState, "{gone}");
    assert!(PinnedInit::open(0).unwrap().is_none());
    assert!(PinnedInit::open(-1).unwrap().is_none());
}

/// The window the pin closes: a command's wrapper is built while the sandbox's init is
/// verified, the init then ends and its pid goes to another sandbox's process before the
/// wrapper runs. Entering by pid (`nsenter --target`) would put the command in that
/// process's namespaces; entering through the held init fails instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrapper_never_enters_a_process_that_took_the_init_s_pid() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: steering pids to simulate reuse needs root");
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let backend = match crate::LocalBackend::builder()
        .root(root.path())
        .isolation(crate::Isolation::Namespaces)
        .build()
    {
        Ok(backend) => backend,
        Err(e) => {
            sandcell::testing::require_or_skip("NAMESPACES", "namespaces", Err(e.to_string()));
            return;
        }
    };
    let backend = &backend;
    sandcell::testing::conformance::with_sandbox(
        backend,
        SandboxSpec::default(),
        |id| async move {
            enter_after_reuse(backend, &id).await;
        },
    )
    .await;
}

async fn enter_after_reuse(backend: &crate::LocalBackend, id: &SandboxId) {
    let (_, meta) = backend.meta(id).unwrap();
    let init = meta.ns_init.unwrap();
    let pinned = PinnedInit::pin(id, init, meta.ns_init_start).unwrap();
    let tools = backend.namespace_tools().unwrap();
    let wrapper = crate::namespace::enter(
        tools,
        &pinned,
        meta.ns_user,
        &SandboxPath::root(),
        false,
        &BTreeMap::new(),
        vec!["readlink".into(), "/proc/self/ns/mnt".into()],
    )
    .unwrap();
    let run = || {
        std::process::Command::new(&wrapper[0])
            .args(&wrapper[1..])
            .env_clear()
            .envs(crate::namespace::host_env())
            .output()
            .unwrap()
    };
    let host_mnt = std::fs::read_link("/proc/self/ns/mnt").unwrap();
    let sandbox_mnt = std::fs::read_link(pinned.path("ns/mnt")).unwrap();
    assert_ne!(host_mnt, sandbox_mnt);
    let entered = run();
    assert!(entered.status.success(), "{entered:?}");
    assert_eq!(
        String::from_utf8_lossy(&entered.stdout).trim(),
        sandbox_mnt.to_string_lossy(),
        "the wrapper enters the sandbox's namespaces"
    );

    // The init ends (a sandbox can end its own) and, once reaped, its pid is free.
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(init).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    for _ in 0..500 {
        if !std::path::Path::new(&format!("/proc/{init}")).exists() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let reuser =
        reuse(init).unwrap_or_else(|| panic!("could not give pid {init} to another process"));
    assert_eq!(reuser.pid(), init);
    // Once `unshare` has made its namespaces (it execs `sleep` when done).
    for _ in 0..500 {
        if std::fs::read(format!("/proc/{init}/cmdline")).is_ok_and(|c| c.starts_with(b"sleep")) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let reuser_mnt = std::fs::read_link(format!("/proc/{init}/ns/mnt")).unwrap();
    assert!(
        reuser_mnt != host_mnt && reuser_mnt != sandbox_mnt,
        "the pid is another process's now: `--target {init}` would enter its namespaces"
    );

    let late = run();
    assert!(
        !late.status.success(),
        "a wrapper built before the init ended must not run the command: {late:?}"
    );
    assert!(late.stdout.is_empty(), "{late:?}");

    // A command asked for now is refused before anything starts.
    let refused = backend
        .exec(id, ExecRequest::new(["true"]))
        .await
        .map(|_| ())
        .unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::InvalidState, "{refused}");
    drop(reuser);
}
