//! Starting a sandbox's command: where it runs (a host directory, or the sandbox's
//! namespaces through `crate::namespace::enter`), with what environment, and under
//! which restrictions (`crate::child::ChildSetup`), among them the Landlock ruleset
//! cached per sandbox and per mount of its workspace.

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sandcell::{
    Error, ErrorKind, ExecRequest, Process, Result, SandboxBackend, SandboxId, SandboxPath,
    SandboxStatus,
};

use super::LocalBackend;
use crate::config::Isolation;
use crate::layout::SandboxDir;
use crate::pinned::PinnedInit;
use crate::process::{self, Launch, DEFAULT_PATH};
use crate::sys::SocketFilter;

impl LocalBackend {
    /// `SandboxBackend::exec`: the command wrapped for its isolation level, its
    /// environment, cgroup, Landlock ruleset, socket filter and identity, started.
    pub(crate) fn start_command(&self, id: &SandboxId, request: ExecRequest) -> Result<Process> {
        request.check_supported(&self.capabilities())?;
        let (dir, meta) = self.meta(id)?;
        if meta.status == SandboxStatus::Paused {
            return Err(Error::new(
                ErrorKind::InvalidState,
                format!("sandbox {id} is paused; resume it first"),
            ));
        }
        if meta.status == SandboxStatus::Terminated {
            return Err(Error::not_found(format!("sandbox {id} is being destroyed")));
        }
        if request.user.is_some() {
            return Err(Error::unsupported(
                "backend local does not run commands as another user yet",
            ));
        }
        let cwd_path = request
            .cwd
            .clone()
            .unwrap_or_else(|| meta.spec.workdir.clone());
        // A handful of syscalls: cheaper inline than a hop to the blocking pool. Held
        // open until the command has its working directory, so the mount cannot be
        // swapped from under it by a clone meanwhile.
        let workspace = self.inner.open_workspace(&dir)?;
        let mut cwd = workspace.resolve_dir(&cwd_path)?;
        let mut argv = request.argv;
        let (home, tmp) = match meta.ns_init {
            Some(_) => (crate::namespace::WORKSPACE.to_owned(), "/tmp".to_owned()),
            None => (
                dir.workspace().display().to_string(),
                dir.tmp().display().to_string(),
            ),
        };
        // Another process may have made the sandbox: serve its way out here too.
        self.serve_egress(&meta)?;
        let mut env = BTreeMap::new();
        env.insert("PATH".to_owned(), DEFAULT_PATH.to_owned());
        env.insert("HOME".to_owned(), home);
        env.insert("TMPDIR".to_owned(), tmp);
        env.insert("LANG".to_owned(), "C.UTF-8".to_owned());
        if let Some(listener) = self.egress_listener(&meta)? {
            env.extend(sandcell::raw::egress::proxy_env(&listener.proxy_addr()));
        }
        env.extend(meta.spec.env.clone());
        env.extend(request.env.clone());
        // Held from here until the command's wrapper is reaped: everything below
        // reaches the namespaces through it, never through the recorded pid.
        let init = match meta.ns_init {
            Some(pid) => Some(PinnedInit::pin(id, pid, meta.ns_init_start)?),
            None => None,
        };
        if let Some(init) = &init {
            let rel = cwd.strip_prefix(dir.workspace()).unwrap_or(Path::new(""));
            let rel = SandboxPath::new(&rel.to_string_lossy())?;
            crate::namespace::program_exists(init, &argv[0], &rel)?;
            let tools = self.namespace_tools()?;
            // The command's environment goes in through `env` at the end of the
            // wrapper; the wrapper itself, started on the host, gets only ours.
            argv = crate::namespace::enter(
                tools,
                init,
                meta.ns_user,
                &rel,
                request.pty.is_some(),
                &env,
                argv,
            )?;
            env = crate::namespace::host_env();
            // --wdns sets the directory inside; the launcher itself needs none.
            cwd = PathBuf::from("/");
        }
        // A cgroup per command, so a timeout or kill reaches what left its group.
        let command_cgroup = match &meta.cgroups {
            Some(cg) => Some(cg.command()?),
            None => None,
        };
        let cgroup_procs = match (&meta.cgroups, &command_cgroup) {
            (Some(cg), Some(command)) => cg.join_fds_for(command)?,
            _ => Vec::new(),
        };
        let landlock = match self.inner.probed.landlock_abi {
            Some(abi) => Some(self.ruleset(id, abi, &dir, meta.egress_port)?),
            None => None,
        };
        // Namespaced sandboxes have a network namespace of their own instead.
        let sockets = match (&meta.spec.network, meta.ns_init) {
            (_, Some(_)) => SocketFilter::Any,
            (sandcell::Network::None, None) => SocketFilter::NoNetwork,
            (sandcell::Network::Allowlist(_), None) => SocketFilter::TcpOnly,
            (sandcell::Network::Full, None) => SocketFilter::Any,
            // A kind of network this backend does not know yet gets none.
            (_, None) => SocketFilter::NoNetwork,
        };
        // The root its terminal's multiplexer is looked up beneath, opened through the
        // held init.
        let ptmx = match (&init, request.pty) {
            (Some(init), Some(_)) => Some(
                init.open_at(
                    "root",
                    rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY,
                )
                .map_err(|e| Error::io("opening the sandbox's root", e))?,
            ),
            _ => None,
        };
        let process = process::spawn(Launch {
            ptmx,
            wrapped: init,
            sandbox: (dir.clone(), id.clone()),
            argv,
            env,
            cwd,
            stdin: request.stdin,
            terminal: request.pty,
            timeout: request.timeout.or(meta.spec.command_timeout),
            grace: self.inner.grace,
            setup: crate::child::ChildSetup {
                cgroup_procs,
                landlock,
                max_file_bytes: meta.spec.limits.disk_bytes,
                sockets,
                // Without a cgroup, what leaves the group stays beneath the command.
                subreaper: meta.cgroups.is_none() && meta.ns_init.is_none(),
                confined: self.inner.config.isolation != Isolation::None,
                // The namespaces' helper needs its capabilities to join them, and
                // drops them itself before the command.
                drop_capabilities: self.inner.config.isolation != Isolation::None
                    && meta.ns_init.is_none(),
                // Sandboxes sharing the owner uid outside namespaces share no IPC
                // (those an earlier version made, without a group, included).
                ipc_namespace: self.inner.owner().is_some() && meta.ns_init.is_none(),
                // The namespaces' helper becomes the owner itself, inside them.
                run_as: self
                    .inner
                    .owner()
                    .filter(|_| meta.ns_init.is_none())
                    .map(|owner| crate::child::RunAs {
                        uid: owner.uid,
                        gid: owner.gid,
                        group: meta.group,
                    }),
                // `process::spawn` sets the session up.
                ..Default::default()
            },
            cgroup: command_cgroup,
            // The cgroup already tracks every process; the group list is for hosts
            // without.
            groups: meta.cgroups.is_none().then(|| dir.groups()),
        })?;
        // The command has its working directory: the mount may be swapped from here.
        drop(workspace);
        Ok(sandcell::raw::limit_output(
            process,
            meta.spec.limits.output_bytes,
        ))
    }

    /// The sandbox's Landlock ruleset, built on first use: one ruleset can be enforced
    /// by any number of children. Its rules hold the directories they name, so a
    /// workspace remounted by a clone gets a new one.
    fn ruleset(
        &self,
        id: &SandboxId,
        abi: u32,
        dir: &SandboxDir,
        egress_port: Option<u16>,
    ) -> Result<Arc<OwnedFd>> {
        let generation = mount_generation(dir);
        if let Some((built_for, fd)) = self.inner.lock_rulesets().get(id) {
            if *built_for == generation {
                return Ok(fd.clone());
            }
        }
        let fd = Arc::new(crate::landlock::ruleset(
            abi,
            &self.inner.probed.read_rules,
            &[dir.workspace(), dir.tmp()],
            egress_port,
        )?);
        self.inner
            .lock_rulesets()
            .insert(id.clone(), (generation, fd.clone()));
        Ok(fd)
    }
}

/// Which mount of its workspace a sandbox is on, so a ruleset cached for an earlier
/// one is rebuilt: a clone that freezes the workspace remounts it, in this process or
/// another. The kernel's unique mount id where it has one (6.8); before, the inode of
/// the upper layer (a new directory at each remount, made while the old one still
/// exists, so never the number of the mount just replaced). Not the mount's device:
/// the kernel hands the new mount the number the old one freed. Copied workspaces,
/// never remounted, are on the mount they are on.
fn mount_generation(dir: &SandboxDir) -> u64 {
    use std::os::unix::fs::MetadataExt;
    /// `STATX_MNT_ID_UNIQUE`, which rustix does not name.
    const MNT_ID_UNIQUE: u32 = 0x4000;
    let unique = rustix::fs::StatxFlags::from_bits_retain(MNT_ID_UNIQUE);
    if let Ok(stat) = rustix::fs::statx(
        rustix::fs::CWD,
        dir.workspace(),
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW | rustix::fs::AtFlags::STATX_DONT_SYNC,
        unique,
    ) {
        if stat.stx_mask & MNT_ID_UNIQUE != 0 {
            return stat.stx_mnt_id;
        }
    }
    std::fs::symlink_metadata(dir.upper()).map_or(0, |m| m.ino())
}
