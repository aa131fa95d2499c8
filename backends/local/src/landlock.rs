//! Landlock rulesets for `Isolation::Landlock`: what a sandbox process may read, write
//! and execute, built in the parent and enforced by the child before it execs.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};
use sandcell::{Error, Result};

use crate::sys;

// Access rights from <linux/landlock.h>.
const EXECUTE: u64 = 1 << 0;
const WRITE_FILE: u64 = 1 << 1;
const READ_FILE: u64 = 1 << 2;
const READ_DIR: u64 = 1 << 3;
/// Every right of ABI 1 (bits 0 to 12: remove, make dir/file/link/device ...).
const ABI1_ALL: u64 = (1 << 13) - 1;
const REFER: u64 = 1 << 13;
const TRUNCATE: u64 = 1 << 14;
/// `LANDLOCK_ACCESS_NET_CONNECT_TCP` (ABI 4).
const CONNECT_TCP: u64 = 1 << 1;

/// Device files every program expects to open for writing.
const WRITABLE_DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/tty",
    "/dev/random",
    "/dev/urandom",
];

/// `LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET` (ABI 6): no connecting to abstract Unix
/// sockets made outside the sandbox process's own domain.
const SCOPE_ABSTRACT_UNIX_SOCKET: u64 = 1 << 0;
/// `LANDLOCK_SCOPE_SIGNAL` (ABI 6): no signals to processes outside the sandbox
/// process's own domain, another sandbox's (the same uid) included.
const SCOPE_SIGNAL: u64 = 1 << 1;

/// Where a default sandbox may read and execute: the system's programs, libraries and
/// configuration, and `/proc`. Not `/home`, `/root`, `/tmp`, `/var`, `/srv`, `/mnt`,
/// `/dev` or `/sys`. Paths a host lacks are skipped.
pub const SYSTEM_READABLE: &[&str] = &[
    "/bin",
    "/sbin",
    "/usr",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/opt",
    "/etc",
    "/proc",
    "/nix/store",
];

/// What stays unreadable beneath [`SYSTEM_READABLE`]: password hashes, sudo rules, the
/// host's SSH keys and TLS private keys, Kerberos keys.
pub const SYSTEM_HIDDEN: &[&str] = &[
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/ssh",
    "/etc/ssl/private",
    "/etc/security/opasswd",
    "/etc/krb5.keytab",
];

/// The kernel's Landlock ABI version, or why there is none.
pub(crate) fn abi() -> Result<u32> {
    sys::landlock_abi().map_err(|errno| {
        Error::unsupported(format!(
            "isolation level Landlock (the local backend's default) is not available: the \
             kernel answered {errno} (Landlock needs Linux 5.13 or newer with \"landlock\" in \
             its lsm= list); choose Isolation::Namespaces where bubblewrap is installed, or \
             opt out explicitly with Isolation::None (\"isolation\": \"none\"), which lets \
             sandbox processes read and write whatever this user can"
        ))
    })
}

/// What a sandbox may read: `readable` without `hidden`, worked out once per backend.
#[derive(Debug, Default, Clone)]
pub(crate) struct ReadRules {
    /// Read and execute beneath each.
    pub(crate) read: Vec<PathBuf>,
    /// List only (something beneath is hidden; what is not is in `read`).
    pub(crate) list: Vec<PathBuf>,
}

impl ReadRules {
    /// `readable` (links resolved; missing paths skipped) less everything at or beneath
    /// a `hidden` path: a readable directory with something hidden beneath it is split
    /// into its entries, recursively, and itself only listed.
    pub(crate) fn new(readable: &[PathBuf], hidden: &[PathBuf]) -> Self {
        let hidden: Vec<PathBuf> = hidden
            .iter()
            .filter_map(|h| std::fs::canonicalize(h).ok())
            .collect();
        let mut rules = ReadRules::default();
        for path in readable {
            if let Ok(real) = std::fs::canonicalize(path) {
                rules.add(real, &hidden);
            }
        }
        rules
    }

    fn add(&mut self, path: PathBuf, hidden: &[PathBuf]) {
        if hidden.iter().any(|h| path.starts_with(h)) {
            return;
        }
        if !hidden.iter().any(|h| h.starts_with(&path)) {
            self.read.push(path);
            return;
        }
        // Something beneath is hidden: grant the rest entry by entry. Only real
        // directories are descended into; a link is granted as its target, unless
        // something hidden lies at or beneath that.
        let Ok(entries) = std::fs::read_dir(&path) else {
            return;
        };
        self.list.push(path);
        for entry in entries.flatten() {
            let is_link = entry.file_type().is_ok_and(|t| t.is_symlink());
            let Ok(real) = std::fs::canonicalize(entry.path()) else {
                continue;
            };
            if is_link {
                if !hidden
                    .iter()
                    .any(|h| h.starts_with(&real) || real.starts_with(h))
                {
                    self.read.push(real);
                }
            } else {
                self.add(real, hidden);
            }
        }
    }
}

/// A ruleset for one sandbox process: read and execute per `read`, everything beneath
/// `writable`, read and write on the usual device files; on ABI 6 and later, no
/// abstract Unix sockets from outside (the host's services that listen on one). With
/// `connect_only_to` (ABI 4 and later), TCP connections to that port alone.
pub(crate) fn ruleset(
    abi: u32,
    read: &ReadRules,
    writable: &[PathBuf],
    connect_only_to: Option<u16>,
) -> Result<OwnedFd> {
    let mut handled = ABI1_ALL;
    if abi >= 2 {
        handled |= REFER;
    }
    if abi >= 3 {
        handled |= TRUNCATE;
    }
    let scoped = if abi >= 6 {
        SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL
    } else {
        0
    };
    let file_write = WRITE_FILE | READ_FILE | (handled & TRUNCATE);
    let handled_net = if connect_only_to.is_some() {
        CONNECT_TCP
    } else {
        0
    };
    let fd = sys::landlock_create_ruleset(handled, handled_net, scoped)
        .map_err(|e| Error::io("creating a Landlock ruleset", e.into()))?;
    if let Some(port) = connect_only_to {
        sys::landlock_add_port_rule(fd.as_fd(), port, CONNECT_TCP).map_err(|e| {
            Error::io(
                format_args!("adding a Landlock rule for TCP port {port}"),
                e.into(),
            )
        })?;
    }
    // Read rules were worked out when the backend was built: one whose path has gone
    // since grants nothing, and is skipped.
    for path in &read.list {
        add_if_present(&fd, path, READ_DIR)?;
    }
    for path in &read.read {
        add_if_present(&fd, path, READ_FILE | READ_DIR | EXECUTE)?;
    }
    for path in writable {
        add(&fd, path, handled)?;
    }
    for device in WRITABLE_DEVICES {
        let device = Path::new(device);
        if device.exists() {
            add(&fd, device, file_write)?;
        }
    }
    Ok(fd)
}

fn add_if_present(ruleset: &OwnedFd, path: &Path, access: u64) -> Result<()> {
    match add(ruleset, path, access) {
        Err(e) if e.kind() == sandcell::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

fn add(ruleset: &OwnedFd, path: &Path, mut access: u64) -> Result<()> {
    let target =
        rustix::fs::open(path, OFlags::PATH | OFlags::CLOEXEC, Mode::empty()).map_err(|e| {
            Error::io(
                format_args!("opening {} for a Landlock rule", path.display()),
                e.into(),
            )
        })?;
    let is_dir = rustix::fs::fstat(&target)
        .map(|st| {
            rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Directory
        })
        .unwrap_or(false);
    if !is_dir {
        // Rules on files may only carry rights that apply to files.
        access &= EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE;
    }
    sys::landlock_add_path_rule(ruleset.as_fd(), target.as_fd(), access).map_err(|e| {
        Error::io(
            format_args!("adding a Landlock rule for {}", path.display()),
            e.into(),
        )
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn hidden_paths_split_a_readable_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().canonicalize().unwrap();
        let etc = root.join("etc");
        std::fs::create_dir_all(etc.join("ssl/private")).unwrap();
        std::fs::create_dir_all(etc.join("ssl/certs")).unwrap();
        std::fs::write(etc.join("hostname"), "h").unwrap();
        std::fs::write(etc.join("shadow"), "s").unwrap();
        std::fs::create_dir_all(root.join("usr")).unwrap();
        // A link to a hidden file is not a way around it; a link elsewhere is its target.
        std::os::unix::fs::symlink(etc.join("shadow"), etc.join("alias")).unwrap();
        std::os::unix::fs::symlink(root.join("usr"), etc.join("to-usr")).unwrap();

        let rules = ReadRules::new(
            &[etc.clone(), root.join("usr"), root.join("missing")],
            &[
                etc.join("shadow"),
                etc.join("ssl/private"),
                root.join("gone"),
            ],
        );
        let mut read = rules.read.clone();
        read.sort();
        let mut want = vec![
            etc.join("hostname"),
            etc.join("ssl/certs"),
            root.join("usr"),
            root.join("usr"),
        ];
        want.sort();
        assert_eq!(read, want);
        let mut list = rules.list.clone();
        list.sort();
        assert_eq!(list, [etc.clone(), etc.join("ssl")]);
    }
}
