//! A sandbox on disk: its directory layout and the metadata file that lets a new process
//! inspect, list and destroy what an earlier one created.
//!
//! ```text
//! <root>/sandboxes/<id>/
//!     meta.json     SandboxMeta, rewritten atomically (temp file + rename)
//!     process-groups/
//!                   one entry per running command's process group (see `crate::groups`)
//!     workspace/    what the sandbox sees (overlay mount point, or the copy)
//!     upper/ work/  overlay layers (overlay strategy only)
//!     layers        the frozen layers beneath upper/, top first (see `crate::layers`)
//!     upper.<layer>/ work.<layer>/
//!                   left by a freeze until its old overlay is torn down
//!     watching      flock'ed shared by every live watch, so no clone freezes beneath it
//!     tmp/          TMPDIR for sandbox processes
//!     disk.img      a sandbox with a disk limit: its file system's image (`crate::quota`)
//!     disk/         where that file system is mounted; workspace/, upper/, work/ and
//!                   tmp/ are then in here, so everything the sandbox writes is on it
//! ```

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use sandcell::{Error, Result, SandboxId, SandboxInfo, SandboxSpec, SandboxStatus};
use serde::{Deserialize, Serialize};

/// The name of a sandbox's list of frozen layers, in its directory.
pub(crate) const LAYERS_FILE: &str = "layers";

/// What is stored in `meta.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct SandboxMeta {
    pub(crate) id: SandboxId,
    pub(crate) spec: SandboxSpec,
    pub(crate) status: SandboxStatus,
    pub(crate) created_at: DateTime<Utc>,
    /// "overlay" or "copy".
    pub(crate) workspace: String,
    /// The sandbox's control groups, where the host has them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) cgroups: Option<crate::cgroup::SandboxCgroups>,
    /// At `Isolation::Namespaces`: host pid of the namespaces' pid 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) ns_init: Option<i32>,
    /// When that pid 1 started (clock ticks after boot, `/proc/<pid>/stat`), so a
    /// process that later got its pid, in another sandbox, is never taken for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) ns_init_start: Option<u64>,
    /// Whether those namespaces include a user namespace of their own to join.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) ns_user: bool,
    /// At `Isolation::Landlock` with an allowlist: the port of the egress listener on
    /// the host's loopback, the one place the sandbox may connect to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) egress_port: Option<u16>,
    /// At `Isolation::Namespaces` with `Network::Full`: the host-side end of the
    /// sandbox's veth, `name@ifindex` (see `crate::network`), removed at destroy and
    /// reset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) net_link: Option<String>,
    /// Where the sandbox has a disk limit: the size of the file system of its own that
    /// holds everything it writes (`crate::quota`), mounted at `disk/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) disk_bytes: Option<u64>,
    /// At `Isolation::Landlock` under root: the sandbox's own group, the only one that
    /// may pass through its directory (`crate::sandbox_group`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) group: Option<u32>,
}

impl SandboxMeta {
    pub(crate) fn info(&self, dir: &SandboxDir) -> SandboxInfo {
        let dir = dir.for_meta(self);
        let mut info = SandboxInfo::new(self.id.clone(), "local", &self.spec, self.status);
        info.created_at = self.created_at;
        let mut details = BTreeMap::new();
        details.insert("workspace".to_owned(), self.workspace.clone());
        details.insert(
            "host_path".to_owned(),
            dir.workspace().display().to_string(),
        );
        if let Some(cg) = &self.cgroups {
            details.insert("cgroup".to_owned(), cg.unified.display().to_string());
            if let Some(pids) = &cg.pids {
                details.insert("cgroup_pids".to_owned(), pids.display().to_string());
            }
        }
        info.details = details;
        info
    }
}

/// Paths of one sandbox's directory.
#[derive(Debug, Clone)]
pub(crate) struct SandboxDir {
    path: PathBuf,
    /// Where what the sandbox writes lives: `path`, or `path/disk` for a sandbox with a
    /// file system of its own (see [`SandboxDir::with_disk`]).
    writable: PathBuf,
}

impl SandboxDir {
    /// The directory of sandbox `id`, as one without a disk of its own sees it: the
    /// paths every sandbox has (its metadata, its process groups) are right, and
    /// [`SandboxDir::for_meta`] gives the rest.
    pub(crate) fn new(root: &Path, id: &SandboxId) -> Self {
        let path = root.join("sandboxes").join(id.as_str());
        SandboxDir {
            writable: path.clone(),
            path,
        }
    }

    /// The same directory, with its workspace, layers and tmp on the sandbox's own
    /// file system where `disk` says it has one.
    pub(crate) fn with_disk(mut self, disk: bool) -> Self {
        self.writable = if disk { self.disk() } else { self.path.clone() };
        self
    }

    /// The same directory, laid out as `meta` says.
    pub(crate) fn for_meta(&self, meta: &SandboxMeta) -> Self {
        self.clone().with_disk(meta.disk_bytes.is_some())
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
    pub(crate) fn workspace(&self) -> PathBuf {
        self.writable.join("workspace")
    }
    pub(crate) fn upper(&self) -> PathBuf {
        self.writable.join("upper")
    }
    pub(crate) fn work(&self) -> PathBuf {
        self.writable.join("work")
    }
    /// Where the sandbox's own file system is mounted, if it has one.
    pub(crate) fn disk(&self) -> PathBuf {
        self.path.join("disk")
    }
    /// The image that file system lives in.
    pub(crate) fn disk_image(&self) -> PathBuf {
        self.path.join("disk.img")
    }
    /// The list of the sandbox's frozen layers (`crate::layers`).
    pub(crate) fn layers(&self) -> PathBuf {
        self.path.join(LAYERS_FILE)
    }
    /// The file every live watch of the sandbox holds a shared lock on.
    pub(crate) fn watching(&self) -> PathBuf {
        self.path.join("watching")
    }
    pub(crate) fn tmp(&self) -> PathBuf {
        self.writable.join("tmp")
    }
    fn meta_path(&self) -> PathBuf {
        self.path.join("meta.json")
    }

    pub(crate) fn read_meta(&self, id: &SandboxId) -> Result<SandboxMeta> {
        let text = match std::fs::read_to_string(self.meta_path()) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::not_found(format!("sandbox {id} does not exist")))
            }
            Err(e) => {
                return Err(Error::io(
                    format_args!("reading metadata of sandbox {id}"),
                    e,
                ))
            }
        };
        serde_json::from_str(&text)
            .map_err(|e| Error::corrupt(format!("metadata of sandbox {id} is unreadable: {e}")))
    }

    /// Writes `meta.json` atomically, so a crash never leaves half a file.
    pub(crate) fn write_meta(&self, meta: &SandboxMeta) -> Result<()> {
        let json = serde_json::to_vec_pretty(meta).map_err(|e| {
            Error::new(
                sandcell::ErrorKind::Backend,
                format!("encoding metadata: {e}"),
            )
        })?;
        self.write_atomically(&self.meta_path(), &json, "writing sandbox metadata")
    }

    /// Replaces the file at `path`, in this directory, with `bytes` at once (a temp
    /// file renamed over it), so a crash never leaves half a file.
    pub(crate) fn write_atomically(&self, path: &Path, bytes: &[u8], what: &str) -> Result<()> {
        let mut tmp =
            tempfile::NamedTempFile::new_in(&self.path).map_err(|e| Error::io(what, e))?;
        tmp.write_all(bytes).map_err(|e| Error::io(what, e))?;
        tmp.persist(path).map_err(|e| Error::io(what, e.error))?;
        Ok(())
    }

    /// The process groups recorded for this sandbox (where it has no cgroups).
    pub(crate) fn groups(&self) -> crate::groups::Groups {
        crate::groups::Groups::new(&self.path)
    }
}
