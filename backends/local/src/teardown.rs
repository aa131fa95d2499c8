//! Ending a sandbox: its processes, its veth, its cgroups, its mounts, its directory
//! and the layers only it held, in that order.

use std::time::Duration;

use rustix::process::Signal;
use sandcell::{Error, Result, SandboxId, SandboxStatus};

use super::{blocking, LocalBackend};
use crate::layout::{SandboxDir, SandboxMeta};
use crate::{materialize, process};

impl LocalBackend {
    /// Destroys sandbox `id`; one already gone is no error.
    pub(super) async fn remove_sandbox(&self, id: &SandboxId) -> Result<()> {
        self.inner.forget_ruleset(id);
        self.inner.egress.forget(id);
        let dir = self.dir(id);
        let id = id.clone();
        let root = self.inner.config.root.clone();
        blocking(move || {
            if !dir.path().exists() {
                return Ok(());
            }
            let meta = dir.read_meta(&id).ok();
            // New commands are refused from here on; one that started meanwhile is in
            // the cgroup, which is killed again until it can be removed.
            if let Some(mut terminated) = meta.clone() {
                terminated.status = SandboxStatus::Terminated;
                let _ = dir.write_meta(&terminated);
            }
            if let Some(cg) = meta.as_ref().and_then(|m| m.cgroups.as_ref()) {
                // Frozen processes die on SIGKILL, but thaw so none lingers frozen.
                let _ = cg.freeze(false);
            }
            // The veth goes first, while its namespace lives: deleting it then takes
            // both ends at once, where a dying namespace's veth lingers in the kernel's
            // teardown and would keep the host's rules past the last sandbox.
            if let Some(link) = meta.as_ref().and_then(|m| m.net_link.as_deref()) {
                crate::network::detach(link);
            }
            kill_all(&dir, meta.as_ref())?;
            if let Some(cg) = meta.as_ref().and_then(|m| m.cgroups.as_ref()) {
                cg.remove();
            }
            // An overlay's layers are read, unmounted and released under the lock, so
            // a clone freezing this sandbox meanwhile is either done or not begun.
            let overlay = meta.as_ref().is_none_or(|m| m.workspace == "overlay");
            let _lock = overlay.then(|| crate::layers::lock(&root)).transpose()?;
            let names = crate::layers::read(&dir).unwrap_or_default();
            materialize::unmount_all(&dir)?;
            match sandcell::raw::tree::remove_dir_all(dir.path()) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(Error::io(
                        format_args!("removing {}", dir.path().display()),
                        e,
                    ))
                }
            }
            crate::layers::release(&root, &names)
        })
        .await
    }
}

/// Kills every process of the sandbox: its cgroup (which `setsid` cannot leave) where
/// there is one, and every recorded process group still verifiably its own.
pub(super) fn kill_all(dir: &SandboxDir, meta: Option<&SandboxMeta>) -> Result<()> {
    let groups = dir.groups();
    let recorded = groups.recorded();
    for member in recorded.iter().filter(|member| member.verified()) {
        process::signal_group(member.pgid, Signal::KILL);
    }
    if let Some(cg) = meta.and_then(|m| m.cgroups.as_ref()) {
        cg.kill_all(Duration::from_secs(5));
    }
    for member in &recorded {
        groups.forget(member);
    }
    Ok(())
}
