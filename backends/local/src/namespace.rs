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

use std::path::{Path, PathBuf};
use std::time::Duration;

use sandcell::{Error, ErrorKind, Network, Result, SandboxPath};

use crate::layout::SandboxDir;
use crate::process::DEFAULT_PATH;

/// Where the workspace appears inside the namespaces.
pub(crate) const WORKSPACE: &str = "/workspace";

fn find(program: &str) -> Option<PathBuf> {
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
    /// `true`, which the helper that opens an egress listener execs when done.
    pub(crate) noop: PathBuf,
    /// What stays unreadable beneath the bound system directories
    /// ([`LocalConfig::hidden`](crate::LocalConfig::hidden)).
    hidden: Vec<PathBuf>,
}

/// Finds the tools this level needs and checks that bubblewrap can create user, pid
/// and network namespaces on this kernel.
pub(crate) fn probe(hidden: &[PathBuf]) -> Result<Tools> {
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
        noop: find("true").ok_or_else(|| {
            Error::unsupported("isolation level Namespaces needs `true` from coreutils")
        })?,
        bwrap,
        hidden: hidden.to_vec(),
    };
    // Only the system directories, as a sandbox sees them: binding all of `/` would copy
    // every mount on the host, and one that disappears meanwhile (another sandbox's
    // workspace being destroyed) fails the probe.
    let mut args = vec!["--unshare-all".to_owned()];
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
    Ok(tools)
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
    let mut args: Vec<String> = vec!["--unshare-all".into()];
    match network {
        // An allowlist's only way out is the egress listener made in the namespace.
        Network::None | Network::Allowlist(_) => {}
        Network::Full => args.push("--share-net".into()),
        // `SandboxSpec::prepare` resolved `Default` and refused what is not claimed.
        other => {
            return Err(Error::unsupported(format!(
                "backend local cannot enforce network policy {:?}",
                other.mode()
            )))
        }
    }
    args.extend(system_binds(&tools.hidden));
    args.extend([
        "--proc".into(),
        "/proc".into(),
        "--dev".into(),
        "/dev".into(),
        "--bind".into(),
        dir.tmp().display().to_string(),
        "/tmp".into(),
        "--bind".into(),
        dir.workspace().display().to_string(),
        WORKSPACE.into(),
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

/// The host pid of the idle `sleep infinity` inside the finished namespaces. Joining
/// bubblewrap's own child instead would race its setup (it is still building the new
/// root before `pivot_root`), so this waits for the command it runs last.
pub(crate) async fn find_init(bwrap_pid: u32) -> Result<i32> {
    for _ in 0..400 {
        let mut queue = vec![bwrap_pid.to_string()];
        while let Some(pid) = queue.pop() {
            if std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c == b"sleep\x00infinity\x00")
            {
                if let Ok(pid) = pid.parse() {
                    return Ok(pid);
                }
            }
            if let Ok(children) =
                std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
            {
                queue.extend(children.split_whitespace().map(str::to_owned));
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Err(Error::new(
        ErrorKind::Backend,
        "bubblewrap did not finish setting up the sandbox's namespaces in time",
    ))
}

/// Whether the namespaces' idle process is still there.
pub(crate) fn alive(init: i32) -> bool {
    std::path::Path::new(&format!("/proc/{init}/ns/pid")).exists()
}

/// Whether `init` has a user namespace of its own to join. Bubblewrap running as root
/// may share ours, and joining one's own user namespace again fails.
pub(crate) fn has_own_user_ns(init: i32) -> bool {
    let own = std::fs::read_link("/proc/self/ns/user").ok();
    let theirs = std::fs::read_link(format!("/proc/{init}/ns/user")).ok();
    own != theirs
}

/// `argv` wrapped so it runs inside the namespaces of `init`, in `cwd`.
pub(crate) fn enter(
    tools: &Tools,
    init: i32,
    join_user_ns: bool,
    cwd: &SandboxPath,
    terminal: bool,
    argv: Vec<String>,
) -> Vec<String> {
    let inside = if cwd.is_root() {
        WORKSPACE.to_owned()
    } else {
        format!("{WORKSPACE}/{cwd}")
    };
    let mut out = vec![
        tools.nsenter.display().to_string(),
        format!("--target={init}"),
    ];
    if join_user_ns {
        out.push("--user".into());
    }
    out.extend([
        "--mount".into(),
        "--uts".into(),
        "--ipc".into(),
        "--net".into(),
        "--pid".into(),
        "--preserve-credentials".into(),
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
    out.extend(argv);
    out
}
