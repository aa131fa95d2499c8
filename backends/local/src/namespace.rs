//! `Isolation::Namespaces`: one long-lived set of namespaces per sandbox, made by
//! bubblewrap at create, which every exec joins with `nsenter`.
//!
//! Inside, the sandbox sees its workspace at `/workspace`, its own `/tmp`, read-only
//! system directories, fresh `/proc` and `/dev`, and no network unless the spec asks
//! for it. The namespaces' pid 1 (bubblewrap's init, waiting on `sleep infinity`)
//! keeps them alive between commands, so background processes live on until reset or
//! destroy, and reaps orphans.
//!
//! Namespace setup is delegated to bubblewrap instead of being done in a `pre_exec`
//! hook: doing it right (allocation-free setup between fork and exec, a reaping pid 1,
//! pivoting the root) is exactly what that tool exists for.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sandcell::{Error, ErrorKind, Network, Result, SandboxPath};

use crate::layout::SandboxDir;
use crate::owner::SandboxOwner;
use crate::pinned::PinnedInit;
use crate::process::DEFAULT_PATH;

/// Where the workspace appears inside the namespaces.
pub(crate) const WORKSPACE: &str = "/workspace";

/// `program` in the sandbox's default `PATH`, on the host.
pub(crate) fn find(program: &str) -> Option<PathBuf> {
    DEFAULT_PATH
        .split(':')
        .map(|dir| Path::new(dir).join(program))
        .find(|p| p.is_file())
}

/// The programs this level runs, found once at `build()`.
#[derive(Debug, Clone)]
pub(crate) struct Tools {
    bwrap: PathBuf,
    nsenter: PathBuf,
    setpriv: PathBuf,
    setsid: PathBuf,
    /// `env`, which applies the command's environment inside, as the last step before
    /// the command itself: nothing of the client's reaches the helpers before it.
    env: PathBuf,
    /// `true`, which the helper that opens an egress listener execs when done.
    pub(crate) noop: PathBuf,
    /// What stays unreadable beneath the bound system directories
    /// ([`LocalConfig::hidden`](crate::LocalConfig::hidden)).
    hidden: Vec<PathBuf>,
    /// Who the sandboxes are on the host when this process is root; `None` when it is
    /// not, and the sandboxes are its own user.
    pub(crate) owner: Option<Arc<SandboxOwner>>,
}

/// Finds the tools this level needs and checks that bubblewrap can create user, pid
/// and network namespaces on this kernel.
pub(crate) fn probe(hidden: &[PathBuf], owner: Option<Arc<SandboxOwner>>) -> Result<Tools> {
    let bwrap = find("bwrap").ok_or_else(|| {
        Error::unsupported(
            "isolation level Namespaces needs bubblewrap: install it (apt-get install bubblewrap)",
        )
    })?;
    let util_linux = |tool: &str| {
        find(tool).ok_or_else(|| {
            Error::unsupported(format!(
                "isolation level Namespaces needs {tool} from util-linux"
            ))
        })
    };
    let tools = Tools {
        nsenter: util_linux("nsenter")?,
        setpriv: util_linux("setpriv")?,
        setsid: util_linux("setsid")?,
        env: find("env").ok_or_else(|| {
            Error::unsupported("isolation level Namespaces needs `env` from coreutils")
        })?,
        noop: find("true").ok_or_else(|| {
            Error::unsupported("isolation level Namespaces needs `true` from coreutils")
        })?,
        bwrap,
        hidden: hidden.to_vec(),
        owner: None,
    };
    // Only the system directories, as a sandbox sees them: binding all of `/` would copy
    // every mount on the host, and one that disappears meanwhile (another sandbox's
    // workspace being destroyed) fails the probe.
    // Mapped to root inside, as every sandbox is (see `init_command`).
    let mut args: Vec<String> = [
        "--unshare-all",
        "--unshare-user",
        "--uid",
        "0",
        "--gid",
        "0",
    ]
    .map(String::from)
    .into();
    args.extend(system_binds(&tools.hidden));
    args.extend(["--proc", "/proc", "--dev", "/dev", "--", "true"].map(String::from));
    let out = std::process::Command::new(&tools.bwrap)
        .args(args)
        .env_clear()
        .env("PATH", DEFAULT_PATH)
        .output()
        .map_err(|e| Error::io("probing bubblewrap", e))?;
    if !out.status.success() {
        return Err(Error::unsupported(format!(
            "isolation level Namespaces is not available: bubblewrap could not create namespaces ({}); user namespaces may be disabled",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(Tools { owner, ..tools })
}

/// The system directories a namespaced sandbox sees, read-only.
const SYSTEM_BINDS: [&str; 3] = ["/usr", "/etc", "/opt"];

/// bubblewrap arguments that give a sandbox the host's system directories, read-only,
/// with each `hidden` path beneath them covered: a file by an empty one (`/dev/null`),
/// a directory by an empty read-only tmpfs.
fn system_binds(hidden: &[PathBuf]) -> Vec<String> {
    let mut args: Vec<String> = Vec::new();
    for system in SYSTEM_BINDS {
        if Path::new(system).is_dir() {
            args.extend(["--ro-bind".into(), system.into(), system.into()]);
        }
    }
    for path in hidden {
        if !SYSTEM_BINDS.iter().any(|dir| path.starts_with(dir)) {
            continue;
        }
        let shown = path.display().to_string();
        match std::fs::symlink_metadata(path) {
            Ok(meta) if meta.is_dir() => args.extend([
                "--tmpfs".into(),
                shown.clone(),
                "--remount-ro".into(),
                shown,
            ]),
            Ok(meta) if meta.is_file() => {
                args.extend(["--ro-bind".into(), "/dev/null".into(), shown])
            }
            _ => {}
        }
    }
    for top in ["/bin", "/sbin", "/lib", "/lib32", "/lib64"] {
        let path = Path::new(top);
        match std::fs::read_link(path) {
            Ok(target) => {
                args.extend(["--symlink".into(), target.display().to_string(), top.into()])
            }
            Err(_) if path.is_dir() => args.extend(["--ro-bind".into(), top.into(), top.into()]),
            Err(_) => {}
        }
    }
    args
}

/// The bubblewrap command that creates a sandbox's namespaces and then idles.
pub(crate) fn init_command(
    tools: &Tools,
    dir: &SandboxDir,
    network: &Network,
) -> Result<tokio::process::Command> {
    // Run as the owner (see `ChildSetup::run_as`) when root, else as this user, whom a
    // user namespace of the sandbox's own makes its root. Mapped to root inside, an
    // unprivileged bubblewrap stays in the one user namespace it made the others in:
    // asked for any other uid, it would make a second, nested one to map it (having
    // been root in the first to mount `/dev`'s devpts), and `nsenter`, joining that one,
    // could then join none of the others (`reassociate to namespace 'ns/ipc' failed`).
    let mut args: Vec<String> = vec!["--unshare-all".into()];
    args.extend(["--unshare-user", "--uid", "0", "--gid", "0"].map(String::from));
    match network {
        // An allowlist's only way out is the egress listener made in the namespace;
        // a full network's is the veth `crate::network` adds, never the host's own
        // network, which would reach its loopback and other sandboxes (ADVERSARIAL 38).
        Network::None | Network::Allowlist(_) | Network::Full => {}
        // `SandboxSpec::prepare` resolved `Default` and refused what is not claimed.
        other => {
            return Err(Error::unsupported(format!(
                "backend local cannot enforce network policy {:?}",
                other.mode()
            )))
        }
    }
    args.extend(system_binds(&tools.hidden));
    args.extend(["--proc", "/proc", "--dev", "/dev"].map(String::from));
    if tools.owner.is_some() {
        // Mounted in by `attach_workspace` once the namespaces exist: the owner
        // cannot reach the sandbox directory, and its path stays out of the
        // sandbox's view of bubblewrap's command line.
        args.extend(["--dir", "/tmp", "--dir", WORKSPACE].map(String::from));
    } else {
        args.extend([
            "--bind".into(),
            dir.tmp().display().to_string(),
            "/tmp".into(),
            "--bind".into(),
            dir.workspace().display().to_string(),
            WORKSPACE.into(),
        ]);
    }
    args.extend([
        "--chdir".into(),
        WORKSPACE.into(),
        "--hostname".into(),
        "sandcell".into(),
        "--".into(),
        "sleep".into(),
        "infinity".into(),
    ]);
    let mut cmd = tokio::process::Command::new(&tools.bwrap);
    cmd.args(args)
        .env_clear()
        .env("PATH", DEFAULT_PATH)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .kill_on_drop(false);
    Ok(cmd)
}

/// The idle `sleep infinity` inside the finished namespaces, held (see
/// [`PinnedInit`]). Joining bubblewrap's own child instead would race its setup (it is
/// still building the new root before `pivot_root`), so this waits for the command it
/// runs last. Each process looked at is held first, and counts as a child only if its
/// parent is still running after that: a pid reused meanwhile is never taken for the
/// init.
pub(crate) async fn find_init(bwrap_pid: u32) -> Result<PinnedInit> {
    let bwrap = i32::try_from(bwrap_pid).unwrap_or(0);
    for _ in 0..400 {
        let mut queue: Vec<PinnedInit> = PinnedInit::open(bwrap)?.into_iter().collect();
        while let Some(parent) = queue.pop() {
            for pid in parent.children() {
                let Some(child) = PinnedInit::open(pid)? else {
                    continue;
                };
                if child.parent() != Some(parent.pid()) || !parent.is_running() {
                    continue;
                }
                if child
                    .cmdline()
                    .is_some_and(|c| c == b"sleep\x00infinity\x00")
                {
                    return Ok(child);
                }
                queue.push(child);
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Err(Error::new(
        ErrorKind::Backend,
        "bubblewrap did not finish setting up the sandbox's namespaces in time",
    ))
}

/// `argv` wrapped so it runs inside the namespaces of `init`, in `cwd`, with `env` as
/// its whole environment.
///
/// `nsenter` opens the namespaces through `init`'s `/proc` directory, held by this
/// process (see [`PinnedInit`]), never through a pid: `init` must be held until it has
/// (the command's leader is `nsenter`, so until the leader is reaped). Should the init
/// have ended meanwhile, `nsenter` finds nothing to open and fails; it cannot enter the
/// namespaces of a process given the init's pid since.
///
/// The helpers in front of the command (`nsenter`, which starts on the host with every
/// capability, then `setpriv` and `setsid`) are started with the environment the
/// backend gives [`host_env`], never the command's: a dynamic loader variable such as
/// `LD_PRELOAD` naming a file the sandbox wrote would otherwise run that file in
/// them, on the host (ADVERSARIAL 36). `env -i` applies the command's environment
/// last, inside every namespace and restriction.
///
/// Fails for a program whose name holds `=`, which `env` would take for a variable.
pub(crate) fn enter(
    tools: &Tools,
    init: &PinnedInit,
    join_user_ns: bool,
    cwd: &SandboxPath,
    terminal: bool,
    env: &BTreeMap<String, String>,
    argv: Vec<String>,
) -> Result<Vec<String>> {
    if argv.first().is_some_and(|program| program.contains('=')) {
        return Err(Error::invalid_input(format!(
            "program {:?}: under Isolation::Namespaces a program's name cannot hold '='",
            argv[0]
        )));
    }
    let inside = if cwd.is_root() {
        WORKSPACE.to_owned()
    } else {
        format!("{WORKSPACE}/{cwd}")
    };
    let mut out = vec![tools.nsenter.display().to_string()];
    if join_user_ns {
        out.push(format!("--user={}", init.child_path("ns/user")));
    }
    // The namespaces `--target` would join (the cgroup namespace stays the host's, as
    // it always has: each command has a cgroup of its own there).
    for (option, ns) in [
        ("--mount", "mnt"),
        ("--uts", "uts"),
        ("--ipc", "ipc"),
        ("--net", "net"),
        ("--pid", "pid"),
    ] {
        out.push(format!("{option}={}", init.child_path(&format!("ns/{ns}"))));
    }
    if tools.owner.is_none() || !join_user_ns {
        // An unprivileged process keeps its credentials (it could not set others);
        // root becomes the owner, the user namespace's root.
        out.push("--preserve-credentials".into());
    }
    out.extend([
        format!("--wdns={inside}"),
        "--".into(),
        // No capabilities inside: a root process cannot remount, mount or escape.
        tools.setpriv.display().to_string(),
        "--bounding-set=-all".into(),
        "--inh-caps=-all".into(),
        "--no-new-privs".into(),
        "--".into(),
    ]);
    if terminal {
        // The command's own session, with the terminal as its controlling one, so
        // Ctrl-C and SIGWINCH reach its jobs and never `nsenter` (which would die of
        // them instead of reporting the command's exit). `--wait` keeps the exit status
        // should setsid(1) have to fork.
        out.extend([
            tools.setsid.display().to_string(),
            "--ctty".into(),
            "--wait".into(),
            "--".into(),
        ]);
    }
    out.push(tools.env.display().to_string());
    out.push("-i".into());
    out.push("--".into());
    out.extend(env.iter().map(|(key, value)| format!("{key}={value}")));
    out.extend(argv);
    Ok(out)
}

/// The whole environment of the helpers that put a command into a sandbox's
/// namespaces: built here, nothing from the spec or the request.
pub(crate) fn host_env() -> BTreeMap<String, String> {
    BTreeMap::from([("PATH".to_owned(), DEFAULT_PATH.to_owned())])
}

/// Whether `program` can be found the way the command will look for it inside the
/// namespaces of `init`, from `cwd` beneath the workspace, so a missing one is
/// `NotFound` (as on every backend) rather than a 127 from inside.
///
/// Looked up in the sandbox's own view of the file system (its root, with symlinks
/// resolved inside it), never the host's: otherwise whether `/root/.bashrc` exists on
/// the host would show in the answer (ADVERSARIAL 41).
pub(crate) fn program_exists(init: &PinnedInit, program: &str, cwd: &SandboxPath) -> Result<()> {
    use rustix::fs::{FileType, Mode, OFlags, ResolveFlags};
    let root = init
        .open_at("root", OFlags::PATH | OFlags::DIRECTORY)
        .map_err(|e| Error::io("opening the sandbox's root", e))?;
    let is_file = |path: &str| {
        rustix::fs::openat2(
            &root,
            path,
            OFlags::PATH | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
        )
        .and_then(|fd| rustix::fs::fstat(&fd))
        .is_ok_and(|stat| FileType::from_raw_mode(stat.st_mode) == FileType::RegularFile)
    };
    let found = if program.starts_with('/') {
        is_file(program)
    } else if program.contains('/') {
        let inside = if cwd.is_root() {
            WORKSPACE.to_owned()
        } else {
            format!("{WORKSPACE}/{cwd}")
        };
        is_file(&format!("{inside}/{program}"))
    } else {
        DEFAULT_PATH
            .split(':')
            .any(|dir| is_file(&format!("{dir}/{program}")))
    };
    if found {
        Ok(())
    } else {
        Err(Error::not_found(format!(
            "program {program:?} was not found on the sandbox's PATH"
        )))
    }
}

/// Mounts the sandbox's workspace and tmp into the namespaces of `init` (made by a
/// bubblewrap running as the owner, who cannot reach the sandbox directory): each is a
/// detached copy of the host's mount, `nosuid` and `nodev`, moved in by a short-lived
/// child that joins the namespaces' mount namespace. The child execs `noop` when
/// done, having made plain system calls only on descriptors opened before it existed.
pub(crate) fn attach_workspace(tools: &Tools, init: &PinnedInit, dir: &SandboxDir) -> Result<()> {
    use rustix::mount::OpenTreeFlags;
    let failed = |step: &str, e: std::io::Error| {
        Error::io(
            format_args!("mounting the workspace into the sandbox ({step})"),
            e,
        )
    };
    let tree = |source: &Path| {
        let tree = rustix::mount::open_tree(
            rustix::fs::CWD,
            source,
            OpenTreeFlags::OPEN_TREE_CLONE
                | OpenTreeFlags::OPEN_TREE_CLOEXEC
                | OpenTreeFlags::AT_RECURSIVE,
        )
        .map_err(|e| failed("open_tree", e.into()))?;
        crate::owner::restrict_mount(&tree).map_err(|e| failed("mount_setattr", e.into()))?;
        Ok::<_, Error>(tree)
    };
    let workspace = tree(&dir.workspace())?;
    let tmp = tree(&dir.tmp())?;
    let mnt_ns = init
        .open_at("ns/mnt", rustix::fs::OFlags::RDONLY)
        .map_err(|e| failed("opening the mount namespace", e))?;
    let status = crate::owner::move_into_namespace(
        &tools.noop,
        &mnt_ns,
        &[(&workspace, c"/workspace"), (&tmp, c"/tmp")],
    )
    .map_err(|e| failed("starting the helper", e))?;
    if !status.success() {
        return Err(failed(
            "the helper",
            std::io::Error::other(format!("it exited with {status}")),
        ));
    }
    Ok(())
}

/// Starts the sandbox's namespaces (bubblewrap, idling) inside its cgroup and records
/// their init, which everything after this step reaches through a [`PinnedInit`].
pub(crate) async fn start(
    tools: &Tools,
    dir: &SandboxDir,
    meta: &mut crate::layout::SandboxMeta,
) -> Result<()> {
    let mut cmd = init_command(tools, dir, &meta.spec.network)?;
    let cgroup_procs = match &meta.cgroups {
        Some(cg) => cg.join_fds()?,
        None => Vec::new(),
    };
    crate::child::before_exec(
        &mut cmd,
        crate::child::ChildSetup {
            cgroup_procs,
            landlock: None,
            max_file_bytes: None,
            run_as: tools.owner.as_ref().map(|owner| crate::child::RunAs {
                uid: owner.uid,
                gid: owner.gid,
                group: None,
            }),
            // Its pid 1 and idle process are the sandbox's too (it can trace them).
            confined: true,
            ..Default::default()
        },
    );
    let mut child = cmd
        .spawn()
        .map_err(|e| Error::io("starting bubblewrap", e))?;
    let pid = child
        .id()
        .ok_or_else(|| Error::new(ErrorKind::Backend, "bubblewrap exited at once"))?;
    // Recorded until it is reaped (`crate::groups`).
    let groups = dir.groups();
    let leader = groups.add(pid as i32)?;
    let init = find_init(pid).await;
    // Reap bubblewrap whenever it ends (destroy or reset kills it).
    tokio::spawn(async move {
        if child.wait().await.is_ok() {
            if let Some(leader) = leader {
                groups.leader_reaped(&leader);
            }
        }
    });
    let init = init?;
    if tools.owner.is_some() {
        attach_workspace(tools, &init, dir)?;
    }
    if meta.spec.network == Network::Full {
        // A path through `init`, which stays held until the helpers are done.
        let netns = init.child_path("ns/net");
        meta.net_link =
            Some(crate::backend::blocking(move || crate::network::attach(&netns)).await?);
    }
    meta.ns_init = Some(init.pid());
    meta.ns_init_start = Some(init.start());
    meta.ns_user = init.has_own_user_ns();
    let written = dir.write_meta(meta);
    if written.is_err() {
        // Unrecorded, the veth would be left to the kernel and the host's rules to the
        // next sandbox's destroy.
        if let Some(link) = meta.net_link.take() {
            crate::network::detach(&link);
        }
    }
    written
}
