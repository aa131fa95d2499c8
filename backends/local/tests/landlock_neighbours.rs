//! Sandboxes of one root backend at `Isolation::Landlock` share the owner uid; each
//! sandbox's Landlock ruleset grants it its own workspace and temp directory, and its
//! directory's group of its own keeps every other sandbox from passing through it. A
//! ruleset alone does not mediate file metadata (chmod, utime, extended attributes,
//! stat, readlink) or connecting to a path-named Unix socket, which the shared uid
//! would then allow to a sandbox that learned a neighbour's id (the host's mount table
//! and every process's `/proc/<pid>/cgroup` list them) (ADVERSARIAL 37, 46). Nor does
//! it mediate System V IPC, which the shared uid would open to every sandbox: each
//! command has an IPC namespace of its own; nor the calls that change another
//! process's scheduling and limits by pid, which seccomp refuses.
//!
//! This checks that none of those reach a neighbour's files.

#![allow(clippy::unwrap_used)]

use sandcell::{ExecRequest, SandboxBackend, SandboxBackendExt, SandboxSpec};
use sandcell_local::{Isolation, LocalBackend};

mod common;

/// Run in the attacking sandbox with the victim's id: learns the victim's directory
/// from its own `HOME`, then tries what Landlock leaves to the file modes, printing one
/// line per way in that worked.
const NEIGHBOUR: &str = r#"
import os, re, socket, sys
victim = sys.argv[1]
known = set(re.findall(r'/sandboxes/([^/ ]+)/', open('/proc/self/mountinfo').read()))
if victim in known:
    print('learned: the mount table names the neighbour')
base = os.environ['HOME'].split('/sandboxes/')[0] + '/sandboxes/' + victim
ws, tmp = base + '/workspace', base + '/tmp'
def attempt(what, f):
    try:
        f()
        print('reached: ' + what)
    except OSError:
        pass
attempt('stat', lambda: os.stat(ws + '/secret.txt'))
attempt('readlink', lambda: os.readlink(ws + '/link'))
attempt('chmod', lambda: os.chmod(ws + '/secret.txt', 0))
attempt('chmod of tmp', lambda: os.chmod(tmp, 0))
attempt('utime', lambda: os.utime(ws + '/secret.txt', (0, 0)))
attempt('setxattr', lambda: os.setxattr(ws + '/secret.txt', 'user.neighbour', b'1'))
attempt('read', lambda: open(ws + '/secret.txt').read())
attempt('list', lambda: os.listdir(ws))
attempt('truncate', lambda: os.truncate(ws + '/secret.txt', 0))
def connect():
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(5)
    s.connect(base + '/workspace/sock')
    s.recv(16)
attempt('unix socket', connect)
def shared_memory():
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmat.restype = ctypes.c_void_p
    for line in open('/proc/sysvipc/shm').read().splitlines()[1:]:
        shmid = int(line.split()[1])
        at = libc.shmat(shmid, None, 0o10000)  # SHM_RDONLY
        if at not in (None, ctypes.c_void_p(-1).value) and ctypes.string_at(at, 6) == b'secret':
            return
    raise OSError('no neighbour segment attached')
attempt('sysv shared memory', shared_memory)
def neighbour_pid():
    marker = b'IPC_' + b'RMID'
    for name in os.listdir('/proc'):
        try:
            if name.isdigit() and marker in open('/proc/' + name + '/cmdline', 'rb').read():
                return int(name)
        except OSError:
            pass
pid = neighbour_pid()
if pid:
    print('found: a neighbour process')
    import resource
    attempt('setpriority', lambda: os.setpriority(os.PRIO_PROCESS, pid, 19))
    attempt('sched_setaffinity', lambda: os.sched_setaffinity(pid, {0}))
    attempt('prlimit', lambda: resource.prlimit(pid, resource.RLIMIT_CPU, (0, 0)))
attempt('setpriority of the whole uid', lambda: os.setpriority(os.PRIO_USER, 0, 19))
def clone3():
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(435, None, 0) == -1 and ctypes.get_errno() == 38:  # ENOSYS
        raise OSError('clone3 is not there')
attempt('clone3, which can pick a cgroup', clone3)
"#;

/// Holds a System V shared memory segment with a secret in it, as a server would.
const SHARE: &str = r#"
import ctypes, time
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
shmid = libc.shmget(0, 4096, 0o1000 | 0o600)  # IPC_PRIVATE, IPC_CREAT
at = libc.shmat(shmid, None, 0)
ctypes.memmove(at, b'secret', 6)
open('shared', 'w').write(str(shmid))
time.sleep(30)
libc.shmctl(shmid, 0, None)  # IPC_RMID
"#;

/// Listens on a Unix socket in the workspace, answering the first connection.
const LISTEN: &str = r#"
import socket
s = socket.socket(socket.AF_UNIX)
s.bind('sock')
s.listen(1)
s.settimeout(20)
c, _ = s.accept()
c.send(b'hello, neighbour')
"#;

/// Starts `script` in the background in sandbox `id`, waiting (five seconds at most)
/// until the `test` condition on what it makes holds.
async fn serve_in_background(
    backend: &LocalBackend,
    id: &sandcell::SandboxId,
    script: &str,
    test: &str,
) {
    let wait = format!(
        "python3 -c \"$0\" > /dev/null 2>&1 & \
         for i in $(seq 50); do [ {test} ] && exit 0; sleep 0.1; done; exit 1"
    );
    let started = backend
        .run(id, ExecRequest::new(["sh", "-c", &wait, script]))
        .await
        .unwrap();
    assert!(started.success(), "{script}: {started:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_cannot_read_or_change_a_neighbours_files_by_path() {
    if !rustix::process::geteuid().is_root() || !common::python_available() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let Some(backend) = common::build_at(
        LocalBackend::builder().root(root.path()),
        Isolation::Landlock,
    ) else {
        return;
    };
    let victim = backend.create(&SandboxSpec::default()).await.unwrap();
    let attacker = backend.create(&SandboxSpec::default()).await.unwrap();
    backend
        .run_shell(
            &victim.id,
            "echo mine > secret.txt && ln -s /the/victims/own/target link",
        )
        .await
        .unwrap();
    // Both outlive the command that starts them, as background servers would.
    serve_in_background(&backend, &victim.id, LISTEN, "-S sock").await;
    serve_in_background(&backend, &victim.id, SHARE, "-s shared").await;
    let out = backend
        .run(
            &attacker.id,
            ExecRequest::new(["python3", "-c", NEIGHBOUR, victim.id.as_str()]),
        )
        .await
        .unwrap();
    backend.destroy(&attacker.id).await.unwrap();
    backend.destroy(&victim.id).await.unwrap();
    let stdout = out.stdout_str();
    let reached: Vec<&str> = stdout
        .lines()
        .filter_map(|line| line.strip_prefix("reached: "))
        .collect();
    assert!(
        stdout.contains("learned: the mount table names the neighbour"),
        "the attack no longer learns its neighbour's id as the test assumes: {out:?}"
    );
    assert!(
        stdout.contains("found: a neighbour process"),
        "the attack no longer finds its neighbour's process as the test assumes: {out:?}"
    );
    assert!(
        reached.is_empty(),
        "a sandbox reached its neighbour's files: {reached:?} ({out:?})"
    );
}
