//! Host programs a backend runs for itself (`ip`, `nft`, `iptables`): found on a fixed
//! `PATH`, started with an environment built here and never a caller's, serialised
//! across processes by a lock file only root can hold.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::error::{Error, ErrorKind, Result};

/// The `PATH` host programs are found on and started with.
pub const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Where `program` is on [`PATH`], if it is.
pub fn find(program: &str) -> Option<PathBuf> {
    PATH.split(':')
        .map(|dir| Path::new(dir).join(program))
        .find(|p| p.is_file())
}

/// Runs `program` with `args` (and `input` on its standard input); fails naming
/// `what`, with the program's error output.
pub fn run(program: &Path, args: &[&str], input: Option<&str>, what: &str) -> Result<()> {
    let mut child = command(program, args)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::io(format_args!("{what}: starting {}", program.display()), e))?;
    if let (Some(input), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin
            .write_all(input.as_bytes())
            .map_err(|e| Error::io(format_args!("{what}: writing to {}", program.display()), e))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| Error::io(format_args!("{what}: waiting for {}", program.display()), e))?;
    if out.status.success() {
        return Ok(());
    }
    Err(Error::new(
        ErrorKind::Backend,
        format!(
            "{what}: {} failed ({}): {}",
            program.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ),
    ))
}

/// The standard output of `program args`, or `None` when it fails.
pub fn output(program: &Path, args: &[&str]) -> Option<String> {
    let out = command(program, args)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The IPv4 networks this host is directly on (`10.1.2.0/24`, …), from `ip`, leaving
/// out loopback and every interface whose name starts with one of `skip` (sandboxes'
/// own links): what a sandbox must not reach beyond the host, whatever the addresses.
/// Empty when `ip` cannot be run.
pub fn connected_networks(skip: &[&str]) -> Vec<String> {
    let Some(ip) = find("ip") else {
        return Vec::new();
    };
    let listing = output(&ip, &["-4", "-o", "addr", "show"]).unwrap_or_default();
    let mut networks: Vec<String> = listing
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let name = fields.nth(1)?.trim_end_matches(':');
            let name = name.split('@').next()?;
            if name == "lo" || skip.iter().any(|prefix| name.starts_with(prefix)) {
                return None;
            }
            let (addr, prefix) = fields.nth(1)?.split_once('/')?;
            network_of(addr.parse().ok()?, prefix.parse().ok()?)
        })
        .collect();
    networks.sort();
    networks.dedup();
    networks
}

/// `addr/prefix` with the host bits cleared, or `None` for a prefix past 32.
fn network_of(addr: std::net::Ipv4Addr, prefix: u8) -> Option<String> {
    if prefix > 32 {
        return None;
    }
    let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
    let network = std::net::Ipv4Addr::from(u32::from(addr) & mask);
    Some(format!("{network}/{prefix}"))
}

fn command(program: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(program);
    command.args(args).env_clear().env("PATH", PATH);
    command
}

/// A host-wide lock on a file, held while this lives.
#[derive(Debug)]
pub struct HostLock {
    _file: File,
}

impl HostLock {
    /// Waits for the exclusive lock on `path`, made `0600` if it is not: whoever can
    /// open the file can hold the lock (a read-only descriptor suffices for `flock`)
    /// and keep every other holder waiting.
    pub fn acquire(path: &Path) -> Result<Self> {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| Error::io(format_args!("opening {}", path.display()), e))?;
        file.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(|e| Error::io(format_args!("making {} private", path.display()), e))?;
        rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive)
            .map_err(|e| Error::io(format_args!("locking {}", path.display()), e.into()))?;
        Ok(HostLock { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_sees_only_the_environment_built_here() {
        let env = find("env").expect("env on PATH");
        let out = output(&env, &[]).expect("env runs");
        assert_eq!(out.trim(), format!("PATH={PATH}"));
    }

    #[test]
    fn a_failure_names_what_and_the_error_output() {
        let sh = find("sh").expect("sh on PATH");
        let err = run(&sh, &["-c", "echo broken >&2; exit 3"], None, "probing").unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Backend);
        let text = err.to_string();
        assert!(
            text.contains("probing") && text.contains("broken"),
            "{text}"
        );
        assert!(output(&sh, &["-c", "exit 1"]).is_none());
    }

    #[test]
    fn input_reaches_the_program() {
        let sh = find("sh").expect("sh on PATH");
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("out");
        let script = format!("cat > {}", target.display());
        run(&sh, &["-c", &script], Some("given"), "writing").unwrap();
        assert_eq!(std::fs::read_to_string(target).unwrap(), "given");
    }

    #[test]
    fn networks_clear_their_host_bits() {
        let net = |a: &str, p| network_of(a.parse().unwrap(), p);
        assert_eq!(net("192.0.2.77", 24).as_deref(), Some("192.0.2.0/24"));
        assert_eq!(net("10.1.2.3", 32).as_deref(), Some("10.1.2.3/32"));
        assert_eq!(net("10.1.2.3", 0).as_deref(), Some("0.0.0.0/0"));
        assert_eq!(net("10.1.2.3", 33), None);
    }

    #[test]
    fn a_lock_file_is_made_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lock");
        std::fs::write(&path, "").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let _held = HostLock::acquire(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
