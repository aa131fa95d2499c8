//! Running commands: a process group per exec (and a cgroup of its own where the
//! sandbox has cgroups), a clean environment, timeouts and kills that take the whole
//! tree (SIGTERM, grace period, SIGKILL) — what left the group with `setsid`, `nohup` or
//! a double fork included, through the command's cgroup or, without one, because the
//! command is a child subreaper that orphans stay beneath — and output that drains.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use rustix::process::{Pid, Signal};
use sandcell::raw::ProcessControl;
use sandcell::{Error, ErrorKind, ExitStatus, Process, Result};
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, watch};

mod output;
mod procfs;
use output::{pump, DRAIN_AFTER_EXIT};
use procfs::{child_groups, living_descendants, proc_stat};
pub(crate) use procfs::{group_alive, group_members, signal_group};

/// The minimal PATH every sandbox process gets.
pub(crate) const DEFAULT_PATH: &str = sandcell::raw::host_tool::PATH;

/// Everything needed to start one command.
#[derive(Debug)]
pub(crate) struct Launch {
    /// The sandbox's init when the leader is a wrapper (`nsenter`) around the command:
    /// signals must pass the wrapper by (it would die of them rather than report the
    /// command's exit), and it enters through the init, held until it is reaped.
    pub(crate) wrapped: Option<crate::pinned::PinnedInit>,
    /// The sandbox the command runs in, read should a wrapped command exit with an
    /// error: a destroy under way may have ended its namespaces as it started.
    pub(crate) sandbox: (crate::layout::SandboxDir, sandcell::SandboxId),
    pub(crate) argv: Vec<String>,
    pub(crate) env: BTreeMap<String, String>,
    pub(crate) cwd: PathBuf,
    pub(crate) stdin: Option<Bytes>,
    /// Run on a terminal of this size (stdin, stdout and stderr all the terminal).
    pub(crate) terminal: Option<sandcell::TerminalSize>,
    /// The root directory of the sandbox whose multiplexer a terminal comes from,
    /// where not the host's (see [`crate::terminal::open`]).
    pub(crate) ptmx: Option<std::os::fd::OwnedFd>,
    pub(crate) timeout: Option<Duration>,
    pub(crate) grace: Duration,
    /// What the child does before it execs (cgroups, Landlock).
    pub(crate) setup: crate::child::ChildSetup,
    /// The command's own cgroup, which `setup` joins: a timeout or kill ends all of
    /// it, whatever left the process group.
    pub(crate) cgroup: Option<crate::cgroup::CommandCgroup>,
    /// Where the command's group is recorded while its leader lives, for a sandbox
    /// without cgroups (see `crate::groups`).
    pub(crate) groups: Option<crate::groups::Groups>,
}

/// Starts the command in its own process group (on a terminal: its own session) and
/// returns its handle.
pub(crate) fn spawn(mut launch: Launch) -> Result<Process> {
    let pipe = || {
        rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .map_err(|e| Error::io("making a pipe for a command", e.into()))
    };
    // The child's stdin, stdout and stderr; the parent's ends are in `terminal` or
    // `pipes`.
    let (terminal, pipes, child_ends) = match launch.terminal {
        Some(size) => {
            let (terminal, slave) = crate::terminal::open(size, launch.ptmx.as_ref())?;
            let dup = |fd: &std::os::fd::OwnedFd| {
                fd.try_clone()
                    .map_err(|e| Error::io("duplicating a terminal descriptor", e))
            };
            // A session of its own: setsid(2) makes its process group too, so the group
            // id is its pid as with a process group of its own. Wrapped, the command
            // takes the terminal inside (see `namespace::enter`) and the wrapper stays
            // without one.
            launch.setup.new_session = true;
            launch.setup.controlling_terminal = launch.wrapped.is_none();
            (Some(terminal), None, [dup(&slave)?, dup(&slave)?, slave])
        }
        None => {
            // A session of its own here too, with no controlling terminal: the caller's
            // terminal (the shell that ran the CLI, an MCP host) is not the command's
            // to type into (ADVERSARIAL 43).
            launch.setup.new_session = true;
            let (stdin_read, stdin_write) = pipe()?;
            let (stdout_read, stdout_write) = pipe()?;
            let (stderr_read, stderr_write) = pipe()?;
            (
                None,
                Some((stdin_write, stdout_read, stderr_read)),
                [stdin_read, stdout_write, stderr_write],
            )
        }
    };
    let subreaper = launch.setup.subreaper;
    let spawned = crate::spawn::spawn(&crate::spawn::Command {
        argv: &launch.argv,
        env: &launch.env,
        cwd: &launch.cwd,
        stdio: [&child_ends[0], &child_ends[1], &child_ends[2]],
        process_group: true,
        setup: &launch.setup,
    });
    // The command has its own copies now: its output ends (EOF on the pipes, EIO on
    // the terminal's master) once those are closed.
    drop(child_ends);
    let child = spawned.map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::not_found(format!(
            "program {:?} was not found on the sandbox's PATH",
            launch.argv[0]
        )),
        std::io::ErrorKind::PermissionDenied => {
            Error::permission_denied(format!("program {:?} is not executable", launch.argv[0]))
        }
        std::io::ErrorKind::Unsupported => Error::unsupported(e.to_string()),
        std::io::ErrorKind::InvalidInput => Error::invalid_input(format!(
            "the command {:?} holds a NUL byte or is empty",
            launch.argv
        )),
        _ => Error::io(format_args!("starting {:?}", launch.argv[0]), e),
    })?;
    let pgid = child.id();
    // Recorded before the supervisor can reap the leader, and forgotten by it once it
    // has: an entry never outlives the process it names.
    let recorded = match &launch.groups {
        Some(groups) => match groups.add(pgid) {
            Ok(leader) => leader.map(|leader| (groups.clone(), leader)),
            Err(e) => {
                // Unrecorded, nothing could reach the command from another process;
                // it is still ours to end (not reaped), and `child` reaps it.
                signal_group(pgid, Signal::KILL);
                return Err(e);
            }
        },
        None => None,
    };
    let pipes = match pipes {
        Some((stdin, stdout, stderr)) => {
            let io = |e| Error::io("watching a command's pipes", e);
            Some((
                tokio::net::unix::pipe::Sender::from_owned_fd(stdin).map_err(io)?,
                tokio::net::unix::pipe::Receiver::from_owned_fd(stdout).map_err(io)?,
                tokio::net::unix::pipe::Receiver::from_owned_fd(stderr).map_err(io)?,
            ))
        }
        None => None,
    };

    let (close_tx, close_rx) = watch::channel(false);
    // A wrapped command's stderr may begin with `nsenter`'s own word (output::pump).
    let (verdict_tx, verdict_rx) = watch::channel(None);
    let verdict = launch.wrapped.is_some().then_some(verdict_rx);
    let (stdin_writer, (out_stream, out_done), (err_stream, err_done)) = match &terminal {
        Some(terminal) => {
            let writer: Option<sandcell::ProcessStdin> = match launch.stdin {
                Some(data) => {
                    let mut typed = terminal.clone();
                    tokio::spawn(async move {
                        let _ = typed.write_all(&data).await;
                    });
                    None
                }
                None => Some(Box::pin(terminal.clone())),
            };
            (
                writer,
                pump(Some(terminal.clone()), close_rx.clone(), None),
                // Everything is on the terminal; stderr ends at once.
                pump(None::<crate::terminal::Terminal>, close_rx, None),
            )
        }
        None => {
            let (stdin, stdout, stderr) = match pipes {
                Some((stdin, stdout, stderr)) => (Some(stdin), Some(stdout), Some(stderr)),
                None => (None, None, None),
            };
            let writer: Option<sandcell::ProcessStdin> = match (stdin, launch.stdin) {
                (Some(mut pipe), Some(data)) => {
                    tokio::spawn(async move {
                        // A command that exits without reading its input is not an error.
                        let _ = pipe.write_all(&data).await;
                    });
                    None
                }
                (Some(pipe), None) => Some(Box::pin(pipe)),
                (None, _) => None,
            };
            (
                writer,
                pump(stdout, close_rx.clone(), None),
                pump(stderr, close_rx, verdict),
            )
        }
    };
    let (kill_tx, kill_rx) = mpsc::channel::<()>(1);
    let (status_tx, status_rx) =
        watch::channel::<Option<Result<ExitStatus, (ErrorKind, String)>>>(None);

    let wrapped = launch.wrapped.is_some();
    let wrapped_session = wrapped && terminal.is_some();
    tokio::spawn(supervise(
        child,
        Tree {
            pgid,
            subreaper,
            wrapped_session,
            _init: launch.wrapped,
            sandbox: launch.sandbox,
            cgroup: launch.cgroup.map(std::sync::Arc::new),
            recorded,
        },
        launch.timeout,
        launch.grace,
        kill_rx,
        (out_done, err_done, close_tx, verdict_tx),
        status_tx,
    ));

    let control = LocalControl {
        kill: kill_tx,
        status: status_rx,
        pgid,
        wrapped,
        terminal,
    };
    Ok(sandcell::raw::process(
        Box::new(control),
        stdin_writer,
        out_stream,
        err_stream,
    ))
}

type Drains = (
    tokio::sync::oneshot::Receiver<()>,
    tokio::sync::oneshot::Receiver<()>,
    watch::Sender<bool>,
    watch::Sender<Option<bool>>,
);

/// Everything one command started: its process group, and its cgroup where there is
/// one (which holds what left the group too), else the leader's descendants (the
/// leader, a subreaper, keeps what its children orphan).
struct Tree {
    /// The group, whose leader is the command's first process.
    pgid: i32,
    /// Whether the leader is a child subreaper.
    subreaper: bool,
    /// Whether the leader is a wrapper whose command runs in a session of its own (a
    /// terminal inside the namespaces): its jobs are in groups of their own.
    wrapped_session: bool,
    /// What the wrapper enters through, held until it is reaped ([`Launch::wrapped`]).
    _init: Option<crate::pinned::PinnedInit>,
    /// See [`Launch::sandbox`].
    sandbox: (crate::layout::SandboxDir, sandcell::SandboxId),
    cgroup: Option<std::sync::Arc<crate::cgroup::CommandCgroup>>,
    /// The group's entry where the sandbox records its groups, forgotten once the
    /// leader is reaped.
    recorded: Option<(crate::groups::Groups, crate::groups::Member)>,
}

async fn supervise(
    mut child: crate::spawn::Leader,
    tree: Tree,
    timeout: Option<Duration>,
    grace: Duration,
    mut kill_rx: mpsc::Receiver<()>,
    (out_done, err_done, close, verdict): Drains,
    status_tx: watch::Sender<Option<Result<ExitStatus, (ErrorKind, String)>>>,
) {
    let deadline = async {
        match timeout {
            Some(t) => tokio::time::sleep(t).await,
            None => futures::future::pending().await,
        }
    };
    let (waited, timed_out) = tokio::select! {
        status = child.wait() => (status, false),
        _ = deadline => {
            kill_tree(&tree, grace, &mut child).await;
            (child.wait().await, true)
        }
        Some(()) = kill_rx.recv() => {
            kill_tree(&tree, grace, &mut child).await;
            (child.wait().await, false)
        }
    };
    // The leader is reaped: its pid, and the group's id once the group is empty, may
    // be another process's from here on, so the group is recorded by what is left in it
    // or not at all. (Should waiting have failed, the entry stays: it lets destroy
    // reach a leader nothing supervises, and fails its check once the leader is gone.)
    if let (Some((groups, leader)), Ok(_)) = (&tree.recorded, &waited) {
        groups.leader_reaped(leader);
    }
    // A wrapped command that exited with an error as its sandbox was being destroyed
    // (or once its namespaces' init had gone) may never have started: `nsenter` found
    // no namespaces to enter, and its exit is the sandbox's answer, not the command's
    // (ADVERSARIAL 36). A command the destroy killed keeps its status (a signal). The
    // init alone does not tell: it may not be a zombie yet when its namespaces are gone.
    let sandbox_gone = matches!(&waited, Ok(status) if status.code.is_some_and(|code| code != 0))
        && tree._init.as_ref().is_some_and(|init| {
            let (dir, id) = &tree.sandbox;
            !init.is_running()
                || dir.read_meta(id).map_or(true, |meta| {
                    meta.status == sandcell::SandboxStatus::Terminated
                })
        });
    // Before the drain: stderr held back waits for it.
    let _ = verdict.send(Some(sandbox_gone));
    // The command's cgroup goes with `tree` if it is empty; background processes of a
    // command that exited on its own keep it (and run on) until reset or destroy.
    drop(tree);
    // Let output already written arrive, but never wait on a pipe a background
    // process holds open.
    let _ = tokio::time::timeout(DRAIN_AFTER_EXIT, async {
        let _ = out_done.await;
        let _ = err_done.await;
    })
    .await;
    let _ = close.send(true);
    let status = match waited {
        _ if sandbox_gone => Err((
            ErrorKind::NotFound,
            "the sandbox was destroyed, or its namespaces ended, as the command started".into(),
        )),
        Ok(status) => Ok(status.timed_out(timed_out)),
        Err(e) => Err((
            ErrorKind::Backend,
            format!("waiting for the process failed: {e}"),
        )),
    };
    let _ = status_tx.send(Some(status));
}

/// SIGTERM to everything the command started, up to `grace` for it to go, then
/// SIGKILL: the process group, and the command's cgroup (what left the group) or,
/// without one, the subreaper leader's descendants.
async fn kill_tree(tree: &Tree, grace: Duration, child: &mut crate::spawn::Leader) {
    if tree.cgroup.is_none() && tree.subreaper {
        return kill_descendants(tree.pgid, grace, child).await;
    }
    // Found before the wrapper goes: its command is then no longer its child.
    let sessions = if tree.wrapped_session {
        child_groups(tree.pgid)
    } else {
        Vec::new()
    };
    for group in &sessions {
        signal_group(*group, Signal::TERM);
    }
    signal_group(tree.pgid, Signal::TERM);
    if let Some(cgroup) = &tree.cgroup {
        cgroup.signal_all(Signal::TERM);
    }
    let _ = tokio::time::timeout(grace, async {
        let _ = child.wait().await;
        // The leader is gone; wait for the rest of its tree too.
        while group_alive(tree.pgid) || tree.cgroup.as_ref().is_some_and(|c| !c.is_empty()) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    for group in &sessions {
        signal_group(*group, Signal::KILL);
    }
    signal_group(tree.pgid, Signal::KILL);
    if let Some(cgroup) = tree.cgroup.clone() {
        let _ = tokio::task::spawn_blocking(move || cgroup.kill_all(Duration::from_secs(5))).await;
    }
}

/// [`kill_tree`] without a cgroup. The leader is stopped first and kept stopped while
/// its descendants are signalled: a stopped subreaper cannot exit, so everything its
/// tree orphans stays beneath it, where the next scan of `/proc` finds it. Its own
/// SIGTERM waits (pending) until its descendants are gone or the grace period is over.
async fn kill_descendants(leader: i32, grace: Duration, child: &mut crate::spawn::Leader) {
    let deadline = tokio::time::Instant::now() + grace;
    let signal = |pid: i32, signal: Signal| {
        if let Some(pid) = Pid::from_raw(pid) {
            let _ = rustix::process::kill_process(pid, signal);
        }
    };
    // Stopped before anything else reaches it: a pending SIGTERM would be taken before
    // the SIGSTOP (lower numbers first), and its orphans would go up to init.
    signal(leader, Signal::STOP);
    stopped(leader).await;
    signal_group(leader, Signal::TERM);
    for pid in living_descendants(leader) {
        signal(pid, Signal::TERM);
    }
    let _ = tokio::time::timeout_at(deadline, async {
        while !living_descendants(leader).is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Nothing left beneath it: the leader may take its SIGTERM now.
        signal(leader, Signal::CONT);
        let _ = child.wait().await;
    })
    .await;
    // Whatever is left (the leader stopped again, so it cannot orphan anything), killed
    // scan by scan until a scan finds nothing: a process may fork between two.
    signal(leader, Signal::STOP);
    stopped(leader).await;
    for _ in 0..100 {
        let left = living_descendants(leader);
        if left.is_empty() {
            break;
        }
        for pid in left {
            signal(pid, Signal::KILL);
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    signal(leader, Signal::KILL);
    signal_group(leader, Signal::KILL);
}

/// Waits (up to a second) until `pid` is stopped, or gone.
async fn stopped(pid: i32) {
    for _ in 0..1000 {
        match proc_stat(pid).map(|s| s.state) {
            None | Some('T' | 't' | 'Z' | 'X') => return,
            Some(_) => tokio::time::sleep(Duration::from_millis(1)).await,
        }
    }
}

struct LocalControl {
    kill: mpsc::Sender<()>,
    status: watch::Receiver<Option<Result<ExitStatus, (ErrorKind, String)>>>,
    /// The process group every process of the command is in.
    pgid: i32,
    /// See [`Launch::wrapped`].
    wrapped: bool,
    /// The command's terminal, where it has one.
    terminal: Option<crate::terminal::Terminal>,
}

#[async_trait]
impl ProcessControl for LocalControl {
    async fn wait(&mut self) -> Result<ExitStatus> {
        let status = self.status.wait_for(Option::is_some).await.map_err(|_| {
            Error::new(
                ErrorKind::Backend,
                "the process supervisor stopped without a status",
            )
        })?;
        match status.as_ref() {
            Some(Ok(status)) => Ok(*status),
            Some(Err((kind, message))) => Err(Error::new(*kind, message.clone())),
            None => Err(Error::new(ErrorKind::Backend, "no exit status")),
        }
    }

    async fn kill(&mut self) -> Result<()> {
        // A full channel means a kill is already on its way; a closed one means it ended.
        let _ = self.kill.try_send(());
        Ok(())
    }

    async fn signal(&mut self, signal: i32) -> Result<()> {
        let signal = Signal::from_named_raw(signal)
            .ok_or_else(|| Error::invalid_input(format!("{signal} is not a signal")))?;
        // An ended group is not an error; its pgid is not reused while the supervisor
        // has not reaped the leader, and afterwards the status says it ended.
        if self.status.borrow().is_none() {
            if self.wrapped && self.terminal.is_some() {
                // The command is the session (and group) leader beneath the wrapper.
                for group in child_groups(self.pgid) {
                    signal_group(group, signal);
                }
            } else if self.wrapped {
                for pid in group_members(self.pgid)
                    .into_iter()
                    .filter(|p| *p != self.pgid)
                {
                    if let Some(pid) = Pid::from_raw(pid) {
                        let _ = rustix::process::kill_process(pid, signal);
                    }
                }
            } else {
                signal_group(self.pgid, signal);
            }
        }
        Ok(())
    }

    async fn resize(&mut self, size: sandcell::TerminalSize) -> Result<()> {
        match &self.terminal {
            Some(terminal) => terminal.resize(size),
            None => Err(Error::invalid_input(
                "the process has no terminal: exec it with ExecRequest::pty",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    /// Output written before the command exited arrives even when the reader task had
    /// not run before the drain window closed (a loaded machine): on a single-threaded
    /// runtime the pump first runs after `close` is already sent.
    #[test]
    fn output_written_before_the_window_closed_is_not_dropped() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let (read, write) = rustix::pipe::pipe().unwrap();
            rustix::io::write(&write, b"written before exit").unwrap();
            drop(write);
            let read = tokio::net::unix::pipe::Receiver::from_owned_fd(read).unwrap();
            let (close_tx, close_rx) = watch::channel(false);
            let (stream, done) = pump(Some(read), close_rx, None);
            close_tx.send(true).unwrap();
            let chunks: Vec<_> = stream.collect().await;
            done.await.unwrap();
            let text: Vec<u8> = chunks.into_iter().flat_map(|c| c.unwrap()).collect();
            assert_eq!(text, b"written before exit");
        });
    }
}
