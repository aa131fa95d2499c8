//! The local backend's shared state as its operations use it: the workspace gate, the
//! cached Landlock rulesets, the sandbox owner, and the blocking pool its file work
//! runs on.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use sandcell::{Error, ErrorKind, Result, SandboxId};

use super::Inner;
use crate::contained::Workspace;
use crate::layout::SandboxDir;

/// Runs a file operation on the blocking pool.
pub(crate) async fn blocking<T, F>(op: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T> + Send + 'static,
{
    tokio::task::spawn_blocking(op)
        .await
        .map_err(|e| Error::with_source(ErrorKind::Backend, "a file operation task failed", e))?
}

impl Inner {
    /// Drops the Landlock ruleset cached for a sandbox that is gone, or whose
    /// workspace this process remounted.
    pub(super) fn forget_ruleset(&self, id: &SandboxId) {
        self.lock_rulesets().remove(id);
    }

    pub(super) fn lock_rulesets(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<SandboxId, (u64, Arc<OwnedFd>)>> {
        // Entries are whole values inserted or removed at once: a poisoned map is intact.
        self.rulesets.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Who owns and runs the sandboxes, where that is not this process's user (see
    /// [`crate::owner`]).
    pub(super) fn owner(&self) -> Option<Arc<crate::owner::SandboxOwner>> {
        self.probed.owner.clone()
    }

    /// Opens the workspace in `dir`, never while a clone remounts it.
    pub(super) fn open_workspace(&self, dir: &SandboxDir) -> Result<Workspace> {
        // The guard protects no data: a poisoned gate is as good as a sound one.
        let _open = self
            .workspace_gate
            .read()
            .unwrap_or_else(|p| p.into_inner());
        Workspace::open(&dir.workspace())
    }
}
