//! Host-directory workspaces: a template's directory on this host as the shared
//! read-only lower layer of an overlay, a private upper layer per sandbox, and the
//! merged view bind-mounted at the container's workspace (seed 004's agents on one
//! project). The overlay lives on the host, so a container restart (reset) keeps the
//! upper layer, and the upper layer is the sandbox's change set for incremental
//! snapshots.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::mount::UnmountFlags;
use sandcell::{Error, ErrorKind, Result, SandboxId};

/// The file in a workspace's directory naming the engine whose container it serves.
const ENGINE_MARK: &str = "engine";

/// Marks a container whose workspace is a host overlay (`"overlay"`).
pub(crate) const LABEL_WORKSPACE: &str = "sandcell.docker.workspace";

/// The host side of one sandbox's workspace: `upper`, `work` and `merged` under
/// `<runtime dir>/workspaces/<id>`.
#[derive(Debug, Clone)]
pub(crate) struct HostWorkspace {
    root: PathBuf,
}

impl HostWorkspace {
    pub(crate) fn of(runtime_dir: &Path, id: &SandboxId) -> Self {
        HostWorkspace {
            root: runtime_dir.join("workspaces").join(id.as_str()),
        }
    }

    pub(crate) fn upper(&self) -> PathBuf {
        self.root.join("upper")
    }

    fn work(&self) -> PathBuf {
        self.root.join("work")
    }

    /// The merged view the container gets at its workspace.
    pub(crate) fn merged(&self) -> PathBuf {
        self.root.join("merged")
    }

    /// Mounts the overlay of `lower` and a fresh upper layer, owned (at its root) by
    /// the container's user, marked as `engine`'s (its data root), whose sweep alone may
    /// take it. A host that cannot mount an overlay is `Unsupported`, saying so;
    /// nothing is left behind on error.
    pub(crate) fn mount(
        &self,
        lower: &Path,
        owner: (u32, u32),
        engine: Option<&str>,
    ) -> Result<()> {
        let made = (|| {
            fs::create_dir_all(self.merged())
                .map_err(|e| Error::io(format_args!("creating {}", self.merged().display()), e))?;
            if let Some(engine) = engine {
                fs::write(self.root.join(ENGINE_MARK), engine)
                    .map_err(|e| Error::io("marking the workspace with its engine", e))?;
            }
            sandcell::raw::overlay::mount(lower, &self.upper(), &self.work(), &self.merged())
                .map_err(|e| {
                    Error::new(
                        e.kind(),
                        format!("a host-directory workspace needs an overlay mount on the engine's host: {e}"),
                    )
                })?;
            rustix::fs::chown(
                self.merged(),
                Some(rustix::fs::Uid::from_raw(owner.0)),
                Some(rustix::fs::Gid::from_raw(owner.1)),
            )
            .map_err(|e| Error::io("giving the workspace to the container's user", e.into()))
        })();
        if let Err(e) = made {
            let _ = self.remove();
            return Err(e);
        }
        Ok(())
    }

    /// Makes this (new) workspace a copy of `source`'s: its upper layer copied with
    /// owners, whiteouts and opaque marks, mounted over the same `lower`. The source
    /// should not change meanwhile (its container paused). Nothing is left behind on
    /// error.
    pub(crate) fn copy_of(
        &self,
        source: &HostWorkspace,
        lower: &Path,
        engine: Option<&str>,
    ) -> Result<()> {
        let made = (|| {
            fs::create_dir_all(&self.root)
                .map_err(|e| Error::io(format_args!("creating {}", self.root.display()), e))?;
            sandcell::raw::tree::copy_layer(&source.upper(), &self.upper())?;
            let owner = fs::metadata(source.merged())
                .map_err(|e| Error::io("reading the owner of the source's workspace", e))?;
            self.mount(lower, (owner.uid(), owner.gid()), engine)
        })();
        if let Err(e) = made {
            let _ = self.remove();
            return Err(e);
        }
        Ok(())
    }

    /// The bind that puts this workspace's merged view at `target` in a container.
    pub(crate) fn bind(&self, target: &str) -> String {
        format!("{}:{target}:rw", self.merged().display())
    }

    /// Unmounts the overlay and deletes the sandbox's layers. Gone already is fine; a
    /// view still mounted after unmounting is an error, and nothing is deleted then.
    pub(crate) fn remove(&self) -> Result<()> {
        if !self.root.exists() {
            return Ok(());
        }
        let merged = self.merged();
        if self.is_mounted() {
            if rustix::mount::unmount(&merged, UnmountFlags::empty()).is_err() {
                let _ = rustix::mount::unmount(&merged, UnmountFlags::DETACH);
            }
            if self.is_mounted() {
                return Err(Error::new(
                    ErrorKind::Backend,
                    format!("{} is still mounted; not deleting it", merged.display()),
                ));
            }
        }
        sandcell::raw::tree::remove_dir_all(&self.root)
            .map_err(|e| Error::io(format_args!("removing {}", self.root.display()), e))
    }

    /// Whether the merged view is a mount point (on another device than its parent).
    fn is_mounted(&self) -> bool {
        match (fs::metadata(self.merged()), fs::metadata(&self.root)) {
            (Ok(merged), Ok(root)) => merged.dev() != root.dev(),
            _ => false,
        }
    }
}

/// How old a workspace without a container must be before a sweep removes it: a
/// create in flight (in any process) mounts it moments before it makes the container.
const SWEEP_GRACE: Duration = Duration::from_secs(60);

/// The host workspaces under `runtime_dir` older than the sweep's grace period and
/// marked as `engine`'s, with their sandbox ids: candidates for
/// [`HostWorkspace::remove`] once their container is known to be gone from it.
/// Unmarked ones (made by an earlier version) are left alone.
pub(crate) fn sweep_candidates(
    runtime_dir: &Path,
    engine: &str,
) -> Vec<(SandboxId, HostWorkspace)> {
    let Ok(entries) = fs::read_dir(runtime_dir.join("workspaces")) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| {
            e.metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > SWEEP_GRACE)
        })
        .filter_map(|e| {
            let id = SandboxId::new(e.file_name().to_str()?).ok()?;
            let ws = HostWorkspace::of(runtime_dir, &id);
            let mark = fs::read_to_string(ws.root.join(ENGINE_MARK)).ok()?;
            (mark == engine).then_some((id, ws))
        })
        .collect()
}
