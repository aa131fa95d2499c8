//! Who a root backend's sandbox is on the host: an unprivileged uid and gid that own
//! its files and run its processes, at `Isolation::Landlock` and `Isolation::Namespaces`
//! alike; at `Namespaces`, the user namespace that maps the sandbox's root to them; and
//! the idmapped views that show the root-owned trees a sandbox is given (its template,
//! its host mounts) as its own.
//!
//! Without this a sandbox's processes would be the host's root (without capabilities,
//! but still the owner of every root-owned file), and every root-only file under the
//! system directories they may read (`/etc`, `/opt`, `/usr`) readable by them
//! (ADVERSARIAL 37). With it, the sandbox's processes are the owner's uid, with no
//! capability in the host's user namespace, and the kernel's own permission checks
//! keep them out of what other users may not read; the files the host writes for the
//! sandbox (uploads, imports, copies) are made as the owner too, on the thread that
//! writes them ([`SandboxOwner::assume`]), so the sandbox can change them and nothing
//! else.
//!
//! Every sandbox of a backend has the same owner: what keeps one sandbox out of
//! another's files is its namespaces (`Namespaces`) or its Landlock ruleset
//! (`Landlock`), not the uid.

#![allow(unsafe_code)]

use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::Path;

use rustix::mount::{MoveMountFlags, OpenTreeFlags};
use sandcell::{Error, Result};

/// The uid and gid a sandbox runs as unless configured otherwise: past the
/// subordinate ranges Debian's `adduser` hands out (100000 to 600100000), so no
/// account's containers share it.
pub(crate) const DEFAULT_ID: u32 = 1_000_000_000;

/// The owner of a root backend's sandboxes.
#[derive(Debug)]
pub(crate) struct SandboxOwner {
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    /// `sleep`, which the child that makes a user namespace runs.
    sleep: std::path::PathBuf,
    /// User namespaces mapping a directory's owner (uid, gid) to this owner: the
    /// idmappings of the views, made as views need them.
    mappings: std::sync::Mutex<std::collections::HashMap<(u32, u32), std::sync::Arc<OwnedFd>>>,
}

impl SandboxOwner {
    /// The owner a backend at `isolation` needs: one at `Isolation::Landlock` and
    /// `Isolation::Namespaces` when this process is root (`uid` for both ids), none
    /// otherwise (an unprivileged backend's sandboxes are its own user; at
    /// `Isolation::None` a root backend's commands are root, as that level says).
    ///
    /// At `Namespaces` the user namespaces its views need are made at once, so a host
    /// without them fails here. At `Landlock` they are made when a view is first
    /// needed: where they cannot be, an overlay workspace falls back to a copy
    /// (`WorkspaceStrategy::Auto`) or fails its create, and so does a host mount, but
    /// commands still run as the owner. There the owner's ids must exist in this
    /// process's user namespace, or no command could become them.
    pub(crate) fn for_backend(
        isolation: crate::Isolation,
        uid: u32,
    ) -> Result<Option<std::sync::Arc<SandboxOwner>>> {
        if isolation == crate::Isolation::None || !rustix::process::geteuid().is_root() {
            return Ok(None);
        }
        let sleep = crate::namespace::find("sleep").ok_or_else(|| {
            Error::unsupported("running sandboxes as an unprivileged owner needs `sleep`")
        })?;
        let owner = if isolation == crate::Isolation::Namespaces {
            SandboxOwner::new(uid, uid, &sleep)?
        } else {
            for (map, id) in [("uid_map", uid), ("gid_map", uid)] {
                if !range_is_mapped(map, id, id) {
                    return Err(Error::unsupported(format!(
                        "a root backend at Isolation::Landlock runs its sandboxes as uid and \
                         gid {id}, which this process's user namespace does not map (see \
                         /proc/self/{map}); set LocalConfig::sandbox_uid to an id it maps \
                         that no account uses"
                    )));
                }
            }
            SandboxOwner::unprobed(uid, uid, &sleep)?
        };
        Ok(Some(std::sync::Arc::new(owner)))
    }

    /// The owner `uid`:`gid`; fails where this host cannot make the user namespaces
    /// its views need.
    pub(crate) fn new(uid: u32, gid: u32, sleep: &Path) -> Result<SandboxOwner> {
        let owner = SandboxOwner::unprobed(uid, gid, sleep)?;
        owner.mapping(0, 0)?;
        Ok(owner)
    }

    /// The owner `uid`:`gid`, its user namespaces left to be made when a view first
    /// needs one.
    fn unprobed(uid: u32, gid: u32, sleep: &Path) -> Result<SandboxOwner> {
        if uid == 0 || gid == 0 {
            return Err(Error::invalid_input(
                "a sandbox's owner cannot be uid or gid 0: that is the host's root",
            ));
        }
        Ok(SandboxOwner {
            uid,
            gid,
            sleep: sleep.to_path_buf(),
            mappings: Default::default(),
        })
    }

    /// The user namespace that maps `from_uid`:`from_gid` to the owner, made by a
    /// short-lived child the first time it is asked for.
    fn mapping(&self, from_uid: u32, from_gid: u32) -> Result<std::sync::Arc<OwnedFd>> {
        let mut mappings = self.mappings.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(userns) = mappings.get(&(from_uid, from_gid)) {
            return Ok(userns.clone());
        }
        let (uid, gid, sleep) = (self.uid, self.gid, &self.sleep);
        let failed = |e: std::io::Error| {
            Error::unsupported(format!(
                "making the user namespace that maps a sandbox's root to uid {uid} failed ({e}); \
                 a root backend needs user namespaces for the idmapped views that show a \
                 sandbox its template and host mounts as its own (at Isolation::Landlock, \
                 WorkspaceStrategy::Copy needs no view)"
            ))
        };
        let mut cmd = std::process::Command::new(sleep);
        cmd.arg("infinity")
            .env_clear()
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        // SAFETY: unshare(2) only, between fork and exec; a new user namespace changes
        // nothing the child shares with this process.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWUSER)
                    .map_err(Into::into)
            });
        }
        let mut child = cmd.spawn().map_err(failed)?;
        let pid = child.id();
        let made = (|| {
            std::fs::write(
                format!("/proc/{pid}/uid_map"),
                format!("{from_uid} {uid} 1"),
            )?;
            std::fs::write(
                format!("/proc/{pid}/gid_map"),
                format!("{from_gid} {gid} 1"),
            )?;
            std::fs::File::open(format!("/proc/{pid}/ns/user")).map(OwnedFd::from)
        })();
        let _ = child.kill();
        let _ = child.wait();
        let userns = std::sync::Arc::new(made.map_err(failed)?);
        mappings.insert((from_uid, from_gid), userns.clone());
        Ok(userns)
    }

    /// Gives `path` itself (not what it holds) to the owner.
    pub(crate) fn chown(&self, path: &Path) -> Result<()> {
        std::os::unix::fs::lchown(path, Some(self.uid), Some(self.gid))
            .map_err(|e| Error::io("giving a sandbox directory to its owner", e))
    }

    /// Gives everything beneath `root`, itself included, to the owner. Only for a
    /// tree no sandbox process can reach yet (a workspace being made): symlinks are
    /// changed, never followed, and a walk of a live tree could be raced.
    pub(crate) fn chown_tree(&self, root: &Path) -> Result<()> {
        let mut stack = vec![root.to_path_buf()];
        while let Some(path) = stack.pop() {
            self.chown(&path)?;
            let meta = std::fs::symlink_metadata(&path)
                .map_err(|e| Error::io("giving a workspace to its owner", e))?;
            if meta.is_dir() {
                for entry in std::fs::read_dir(&path)
                    .map_err(|e| Error::io("giving a workspace to its owner", e))?
                {
                    let entry =
                        entry.map_err(|e| Error::io("giving a workspace to its owner", e))?;
                    stack.push(entry.path());
                }
            }
        }
        Ok(())
    }

    /// Makes the calling thread's file system identity the owner's until the guard
    /// drops: what it creates is the owner's, and it can open only what the owner can.
    /// With a `group` (a sandbox's own, `crate::sandbox_group`) it is the thread's one
    /// supplementary group meanwhile, as it is its commands', so the thread passes
    /// through that sandbox's directory and no other.
    pub(crate) fn assume(&self, group: Option<u32>) -> Assumed {
        // SAFETY: getgroups(2) into a buffer of its length, setgroups(2) with a list of
        // its length, setfsuid(2)/setfsgid(2) with integers: all change this thread's
        // credentials only (raw calls: no library broadcasts them to other threads);
        // the guard puts the previous ones back.
        let groups = group.and_then(|group| unsafe {
            let mut saved = vec![0 as libc::gid_t; 256];
            let n = libc::syscall(libc::SYS_getgroups, saved.len(), saved.as_mut_ptr());
            if n < 0 || libc::syscall(libc::SYS_setgroups, 1, &group as *const u32) < 0 {
                // Without it the thread is the owner alone: it passes through no
                // sandbox's directory, and the operation fails, as it should.
                return None;
            }
            saved.truncate(n as usize);
            Some(saved)
        });
        // SAFETY: as above.
        let (gid, uid) = unsafe {
            let gid = libc::syscall(libc::SYS_setfsgid, self.gid) as u32;
            let uid = libc::syscall(libc::SYS_setfsuid, self.uid) as u32;
            (gid, uid)
        };
        Assumed {
            uid,
            gid,
            groups,
            _thread: std::marker::PhantomData,
        }
    }

    /// Mounts an idmapped view of the directory `source` at the empty directory `at`:
    /// through it, what `source`'s owner owns is the sandbox owner's, and what the
    /// sandbox makes there is `source`'s owner's on disk. The view is `nosuid` and
    /// `nodev`; nothing changes on disk.
    ///
    /// A `writable` view of a directory root owns, or root's group, is refused: what
    /// the sandbox made in it would be root's (or root's group's) on the host, a
    /// setuid or setgid program among them.
    pub(crate) fn view(&self, source: &Path, at: &Path, writable: bool) -> Result<()> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(source)
            .map_err(|e| Error::io(format_args!("inspecting {}", source.display()), e))?;
        if writable && (meta.uid() == 0 || meta.gid() == 0) {
            return Err(Error::permission_denied(format!(
                "refusing to let a sandbox write in {}, which root or root's group owns: \
                 what it made there would be theirs on this host; give the directory to \
                 another user and group (such as {}) or mount it read-only",
                source.display(),
                self.uid
            )));
        }
        let userns = self.mapping(meta.uid(), meta.gid())?;
        let failed = |step: &str, e: rustix::io::Errno| {
            Error::io(
                format_args!("showing a directory to a sandbox as its own ({step})"),
                e.into(),
            )
        };
        let tree = rustix::mount::open_tree(
            rustix::fs::CWD,
            source,
            OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC,
        )
        .map_err(|e| failed("open_tree", e))?;
        set_mount_attributes(
            &tree,
            MOUNT_ATTR_IDMAP | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
            Some(&userns),
            false,
        )
        .map_err(|e| failed("mount_setattr", e))?;
        rustix::mount::move_mount(
            tree.as_fd(),
            "",
            rustix::fs::CWD,
            at,
            MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
        )
        .map_err(|e| failed("move_mount", e))
    }
}

/// Whether this process's user namespace maps every id from `first` to `last`: one
/// line of `/proc/self/{map}` (`uid_map` or `gid_map`, lines of "inside outside
/// count") holds them all.
pub(crate) fn range_is_mapped(map: &str, first: u32, last: u32) -> bool {
    let Ok(text) = std::fs::read_to_string(format!("/proc/self/{map}")) else {
        return false;
    };
    text.lines().any(|line| {
        let mut fields = line.split_whitespace().map(str::parse::<u64>);
        match (fields.next(), fields.next(), fields.next()) {
            (Some(Ok(inside)), Some(Ok(_)), Some(Ok(count))) => {
                let mapped = inside..inside.saturating_add(count);
                mapped.contains(&u64::from(first)) && mapped.contains(&u64::from(last))
            }
            _ => false,
        }
    })
}

const MOUNT_ATTR_NOSUID: u64 = 0x0000_0002;
const MOUNT_ATTR_NODEV: u64 = 0x0000_0004;
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

/// Makes every mount of the detached tree `tree` `nosuid` and `nodev`.
pub(crate) fn restrict_mount(tree: &OwnedFd) -> rustix::io::Result<()> {
    set_mount_attributes(tree, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, None, true)
}

/// mount_setattr(2): sets `attributes` on the mount open as `tree` (and the mounts
/// beneath it when `recursive`), with `userns` as the idmapping where one is given.
fn set_mount_attributes(
    tree: &OwnedFd,
    attributes: u64,
    userns: Option<&OwnedFd>,
    recursive: bool,
) -> rustix::io::Result<()> {
    /// `struct mount_attr`.
    #[repr(C)]
    struct MountAttr {
        attr_set: u64,
        attr_clr: u64,
        propagation: u64,
        userns_fd: u64,
    }
    const AT_EMPTY_PATH: libc::c_uint = 0x1000;
    const AT_RECURSIVE: libc::c_uint = 0x8000;
    let attr = MountAttr {
        attr_set: attributes,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.map_or(0, |fd| fd.as_raw_fd() as u64),
    };
    let flags = AT_EMPTY_PATH | if recursive { AT_RECURSIVE } else { 0 };
    // SAFETY: mount_setattr(2) on a descriptor we own, reading `attr`, which outlives
    // the call and is as large as the size passed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if r < 0 {
        return Err(errno());
    }
    Ok(())
}

fn errno() -> rustix::io::Errno {
    rustix::io::Errno::from_raw_os_error(
        std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EINVAL),
    )
}

/// Moves each detached tree onto its path in the mount namespace open as `mnt_ns`,
/// from a short-lived child that joins it (a process with threads cannot) and then
/// execs `noop`. Between fork and exec the child makes plain system calls only, on
/// descriptors opened before it existed and static strings.
pub(crate) fn move_into_namespace(
    noop: &Path,
    mnt_ns: &impl AsRawFd,
    trees: &[(&OwnedFd, &'static std::ffi::CStr)],
) -> std::io::Result<std::process::ExitStatus> {
    const MAX_TREES: usize = 4;
    if trees.len() > MAX_TREES {
        return Err(std::io::Error::other("too many mounts for one move"));
    }
    let mut raw: [(RawFd, &'static std::ffi::CStr); MAX_TREES] = [(-1, c""); MAX_TREES];
    for (slot, (tree, path)) in raw.iter_mut().zip(trees) {
        *slot = (tree.as_raw_fd(), *path);
    }
    let count = trees.len();
    let ns = mnt_ns.as_raw_fd();
    let mut cmd = std::process::Command::new(noop);
    cmd.env_clear()
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    // SAFETY: the closure makes plain system calls on descriptors this process holds
    // and on static, NUL-terminated strings, and allocates nothing.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
            if libc::setns(ns, libc::CLONE_NEWNS) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            for (tree, path) in &raw[..count] {
                const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x04;
                if libc::syscall(
                    libc::SYS_move_mount,
                    *tree,
                    c"".as_ptr(),
                    libc::AT_FDCWD,
                    path.as_ptr(),
                    MOVE_MOUNT_F_EMPTY_PATH,
                ) < 0
                {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    cmd.status()
}

/// The owner's file system identity on one thread; the previous one comes back on
/// drop.
#[derive(Debug)]
#[must_use = "the identity is the owner's only while the guard lives"]
pub(crate) struct Assumed {
    uid: u32,
    gid: u32,
    /// The thread's supplementary groups before, where they were changed.
    groups: Option<Vec<libc::gid_t>>,
    /// Not `Send`: the identity belongs to the thread that took it.
    _thread: std::marker::PhantomData<*const ()>,
}

impl Drop for Assumed {
    fn drop(&mut self) {
        // SAFETY: as in `SandboxOwner::assume`.
        unsafe {
            libc::syscall(libc::SYS_setfsuid, self.uid);
            libc::syscall(libc::SYS_setfsgid, self.gid);
            if let Some(groups) = &self.groups {
                libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr());
            }
        }
    }
}
