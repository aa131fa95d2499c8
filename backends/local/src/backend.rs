//! `LocalBackend`: the `SandboxBackend` implementation over directories and process groups.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use rustix::process::Signal;
use sandcell::archive::ImportOptions;
use sandcell::{
    ByteStream, Capabilities, Changes, DirEntry, Error, ErrorKind, ExecRequest, FileInfo,
    LabelSelector, Process, Result, SandboxBackend, SandboxId, SandboxInfo, SandboxMetrics,
    SandboxPath, SandboxSpec, SandboxStatus, WatchOptions, WatchStream,
};

use crate::cgroup::CgroupRoots;
use crate::config::{Isolation, LocalBackendBuilder, LocalConfig};
use crate::contained::Workspace;
use crate::layout::{SandboxDir, SandboxMeta};
use crate::materialize;
use crate::process;

// Jobs of their own; child modules, so they see this one's privates.
#[path = "capabilities.rs"]
mod capabilities;
#[path = "exec.rs"]
mod exec;
#[path = "inner.rs"]
mod inner;
#[path = "provision.rs"]
mod provision;
#[path = "teardown.rs"]
mod teardown;

pub(crate) use inner::blocking;

/// Sandboxes as directories under a root, with processes in their own process groups.
///
/// Everything about a sandbox is on disk (`<root>/sandboxes/<id>`), so a new process
/// with the same root can inspect, list, use and destroy what an earlier one created.
///
/// ```no_run
/// # async fn demo() -> sandcell::Result<()> {
/// use sandcell::{SandboxBackend, SandboxBackendExt, SandboxSpec};
/// use sandcell_local::LocalBackend;
///
/// let backend = LocalBackend::builder()
///     .root("/var/lib/sandcell")
///     .template("python", "/srv/templates/python")
///     .build()?;
/// let sb = backend.create(&SandboxSpec::new("python")).await?;
/// let out = backend.run_shell(&sb.id, "python3 --version").await?;
/// println!("{}", out.stdout_str());
/// backend.destroy(&sb.id).await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct LocalBackend {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: LocalConfig,
    grace: Duration,
    capabilities: Capabilities,
    cgroups: CgroupRoots,
    probed: Probed,
    /// Landlock rulesets by sandbox, with the generation of the workspace mount they
    /// were built for (see `mount_generation`): built on first exec, enforced by every
    /// child.
    rulesets: std::sync::Mutex<HashMap<SandboxId, (u64, Arc<OwnedFd>)>>,
    /// Held (shared) while this process opens a workspace, and (exclusive) while a
    /// clone remounts one (`crate::layers`), so no operation here ever opens the bare
    /// mount point between the two. Once open, a workspace pins its mount.
    workspace_gate: std::sync::RwLock<()>,
    /// The egress proxies this process serves for allowlisted sandboxes.
    egress: sandcell::raw::egress::ServedProxies,
}

/// What `build()` found out about the host for the chosen isolation level.
#[derive(Debug, Default)]
pub(crate) struct Probed {
    pub(crate) landlock_abi: Option<u32>,
    pub(crate) read_rules: crate::landlock::ReadRules,
    pub(crate) namespace_tools: Option<crate::namespace::Tools>,
    /// Who owns and runs the sandboxes when this process is root (see
    /// [`crate::owner`]).
    pub(crate) owner: Option<Arc<crate::owner::SandboxOwner>>,
    /// At `Isolation::Landlock` with an owner: each sandbox's group of its own.
    pub(crate) sandbox_groups: Option<Arc<crate::sandbox_group::SandboxGroups>>,
}

impl LocalBackend {
    /// A builder with default settings.
    pub fn builder() -> LocalBackendBuilder {
        LocalBackendBuilder::new()
    }

    /// A factory for [`sandcell::BackendRegistry`]: the options are a [`LocalConfig`]
    /// (unknown keys are an error).
    ///
    /// ```
    /// let registry = sandcell::BackendRegistry::new()
    ///     .register("local", sandcell_local::LocalBackend::from_options);
    /// assert_eq!(registry.types().collect::<Vec<_>>(), ["local"]);
    /// ```
    pub fn from_options(options: serde_json::Value) -> Result<Box<dyn SandboxBackend>> {
        let config: crate::LocalConfig = sandcell::config::backend_options("local", options)?;
        Ok(Box::new(config.build()?))
    }

    pub(crate) fn from_config(config: LocalConfig, probed: Probed) -> Self {
        let cgroups = CgroupRoots::detect();
        let capabilities = capabilities::of(&config, &probed, &cgroups);
        LocalBackend {
            inner: Arc::new(Inner {
                grace: config.kill_grace,
                config,
                capabilities,
                cgroups,
                probed,
                rulesets: std::sync::Mutex::new(HashMap::new()),
                workspace_gate: std::sync::RwLock::new(()),
                egress: sandcell::raw::egress::ServedProxies::default(),
            }),
        }
    }

    /// The configuration in effect (paths canonicalized, `"default"` template filled in).
    pub fn config(&self) -> &LocalConfig {
        &self.inner.config
    }

    fn dir(&self, id: &SandboxId) -> SandboxDir {
        SandboxDir::new(&self.inner.config.root, id)
    }

    /// The sandbox's metadata, or `NotFound`.
    pub(crate) fn meta(&self, id: &SandboxId) -> Result<(SandboxDir, SandboxMeta)> {
        let dir = self.dir(id);
        let meta = dir.read_meta(id)?;
        Ok((dir.for_meta(&meta), meta))
    }

    /// Runs a blocking file operation against the sandbox's contained workspace.
    async fn with_workspace<T, F>(&self, id: &SandboxId, op: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Workspace) -> Result<T> + Send + 'static,
    {
        let (dir, meta) = self.meta(id)?;
        let inner = self.inner.clone();
        blocking(move || {
            let workspace = inner.open_workspace(&dir)?;
            // What the host writes for the sandbox is the sandbox's.
            let _owner = inner.owner().map(|owner| owner.assume(meta.group));
            op(&workspace).map_err(|e| crate::quota::full_disk(e, meta.disk_bytes, None))
        })
        .await
    }

    pub(crate) fn namespace_tools(&self) -> Result<&crate::namespace::Tools> {
        self.inner
            .probed
            .namespace_tools
            .as_ref()
            .ok_or_else(|| Error::new(ErrorKind::Backend, "namespace tools were not probed"))
    }

    fn set_status(&self, id: &SandboxId, status: SandboxStatus) -> Result<()> {
        let (dir, mut meta) = self.meta(id)?;
        meta.status = status;
        dir.write_meta(&meta)
    }
}

// Every method written out: a method added to the trait cannot answer with its
// default (`Unsupported`) here unnoticed.
#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl SandboxBackend for LocalBackend {
    fn name(&self) -> &str {
        "local"
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities
    }

    async fn create(&self, spec: &SandboxSpec) -> Result<SandboxInfo> {
        // Unset limits take the backend's defaults; the stored spec shows what applies.
        let mut spec = spec.prepare(&self.inner.capabilities)?;
        if let sandcell::Network::Allowlist(entries) = &spec.network {
            crate::egress::accepted(entries, &self.inner.config)?;
        }
        let template = self
            .inner
            .config
            .templates
            .get(&spec.template)
            .cloned()
            .ok_or_else(|| {
                Error::not_found(format!(
                    "template {:?} is not registered with the local backend",
                    spec.template
                ))
            })?;
        spec.limits = spec.limits.with_defaults(&self.inner.config.default_limits);
        // The defaults are held to the capabilities too: none is quietly not enforced.
        spec.check_supported(&self.inner.capabilities)
            .map_err(|e| e.context("with the backend's default_limits"))?;
        let strategy = self.inner.config.workspace;
        let owner = self.inner.owner();
        let meta = self
            .provision(spec, move |dir| {
                materialize::materialize(dir, &template, strategy, owner.as_deref())
            })
            .await?;
        tracing::debug!(sandbox = %meta.id, workspace = %meta.workspace, "created local sandbox");
        Ok(meta.info(&self.dir(&meta.id)))
    }

    async fn inspect(&self, id: &SandboxId) -> Result<SandboxInfo> {
        let (dir, meta) = self.meta(id)?;
        Ok(meta.info(&dir))
    }

    /// Processes listen on the host's own ports: nothing to forward.
    async fn publish_port(&self, id: &SandboxId, port: u16) -> Result<()> {
        let _ = port;
        if !self.capabilities().port_exposure {
            return Err(Error::unsupported(
                "backend local cannot expose ports of a sandbox with its own network namespace",
            ));
        }
        let (_, meta) = self.meta(id)?;
        if meta.spec.network == sandcell::Network::None {
            return Err(Error::unsupported(
                "a sandbox without a network cannot listen on a port; create it with \
                 Network::Full to publish one",
            ));
        }
        Ok(())
    }

    /// Nothing was forwarded, so nothing is undone.
    async fn unpublish_port(&self, _id: &SandboxId, _port: u16) -> Result<()> {
        Ok(())
    }

    async fn list(&self, selector: &LabelSelector) -> Result<Vec<SandboxInfo>> {
        let root = self.inner.config.root.clone();
        let selector = selector.clone();
        blocking(move || {
            let mut out = Vec::new();
            let entries = std::fs::read_dir(root.join("sandboxes"))
                .map_err(|e| Error::io("listing sandboxes", e))?;
            for entry in entries.flatten() {
                let Some(id) = entry
                    .file_name()
                    .to_str()
                    .and_then(|n| SandboxId::new(n).ok())
                else {
                    continue;
                };
                let dir = SandboxDir::new(&root, &id);
                match dir.read_meta(&id) {
                    Ok(meta) if selector.matches(&meta.spec.labels) => out.push(meta.info(&dir)),
                    Ok(_) => {}
                    // Half-created or half-destroyed: not a live sandbox.
                    Err(e) => {
                        tracing::debug!(sandbox = %id, error = %e, "skipping unreadable sandbox")
                    }
                }
            }
            out.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
            Ok(out)
        })
        .await
    }

    async fn destroy(&self, id: &SandboxId) -> Result<()> {
        self.remove_sandbox(id).await
    }

    async fn pause(&self, id: &SandboxId) -> Result<()> {
        let (dir, meta) = self.meta(id)?;
        // The cgroup freezer reaches every process; signals only reach the groups.
        let frozen = match &meta.cgroups {
            Some(cg) => cg.freeze(true)?,
            None => false,
        };
        if !frozen {
            for pgid in dir.groups().live() {
                process::signal_group(pgid, Signal::STOP);
            }
        }
        self.set_status(id, SandboxStatus::Paused)
    }

    async fn resume(&self, id: &SandboxId) -> Result<()> {
        let (dir, meta) = self.meta(id)?;
        let thawed = match &meta.cgroups {
            Some(cg) => cg.freeze(false)?,
            None => false,
        };
        if !thawed {
            for pgid in dir.groups().live() {
                process::signal_group(pgid, Signal::CONT);
            }
        }
        self.set_status(id, SandboxStatus::Running)
    }

    async fn reset(&self, id: &SandboxId) -> Result<()> {
        let (dir, meta) = self.meta(id)?;
        blocking(move || {
            if let Some(cg) = &meta.cgroups {
                let _ = cg.freeze(false);
            }
            // As in destroy: the veth before the namespace it leads into.
            if let Some(link) = &meta.net_link {
                crate::network::detach(link);
            }
            teardown::kill_all(&dir, Some(&meta))?;
            Ok(())
        })
        .await?;
        if self.inner.config.isolation == Isolation::Namespaces {
            // Killing everything took the namespaces' pid 1 too; make fresh ones.
            let (dir, mut meta) = self.meta(id)?;
            meta.net_link = None;
            self.inner.egress.forget(id);
            crate::namespace::start(self.namespace_tools()?, &dir, &mut meta).await?;
            self.serve_egress(&meta)?;
        }
        self.set_status(id, SandboxStatus::Running)
    }

    /// An overlay workspace's clone shares the source's changes instead of copying
    /// them, where nothing holds the source open: its upper layer is frozen into a
    /// read-only layer beneath both (`crate::layers`, `crate::clone`). Otherwise (a
    /// running command, a watch, host mounts, `Isolation::Namespaces`) the upper layer
    /// is copied onto a new overlay over the same layers; a copied workspace is copied
    /// whole. The source's
    /// processes are frozen meanwhile where it has a cgroup, so the clone is one moment
    /// of it.
    async fn clone_sandbox(
        &self,
        id: &SandboxId,
        labels: BTreeMap<String, String>,
    ) -> Result<SandboxInfo> {
        self.clone_of(id, labels).await
    }

    async fn watch(
        &self,
        id: &SandboxId,
        path: &SandboxPath,
        options: WatchOptions,
    ) -> Result<WatchStream> {
        let (dir, meta) = self.meta(id)?;
        let group = crate::watch::budget_group(&self.inner.config, id, &meta.spec.labels);
        let (sender, stream) = sandcell::raw::watch_channel(path.clone());
        let path = path.clone();
        // The initial walk of a recursive watch reads directories: off the runtime.
        let inner = self.inner.clone();
        let watcher = blocking(move || {
            let holding = crate::layers::hold_for_watch(&dir)?;
            let workspace = inner.open_workspace(&dir)?;
            crate::watch::Watcher::start(
                &workspace,
                path,
                (options.recursive, group),
                sender,
                holding,
            )
        });
        // AsyncFd registers with the runtime of the task that made it, so it is made
        // on a blocking thread inside this runtime's context.
        let watcher = watcher.await?;
        tokio::spawn(watcher.run());
        Ok(stream)
    }

    /// The proxy this process serves takes the new list; one served by another
    /// process (which made the sandbox and still runs) cannot be reached from here.
    async fn set_network(&self, id: &SandboxId, network: &sandcell::Network) -> Result<()> {
        if !self.inner.capabilities.network_update {
            return Err(Error::unsupported(
                "backend local changes a sandbox's allowlist only where it enforces one \
                 (Isolation::Namespaces, or Landlock with TCP rules and cgroup v2)",
            ));
        }
        let sandcell::Network::Allowlist(entries) = network else {
            return Err(Error::unsupported(format!(
                "set_network takes an allowlist, not network {:?}",
                network.mode()
            )));
        };
        let allowlist = crate::egress::accepted(entries, &self.inner.config)?;
        let (dir, mut meta) = self.meta(id)?;
        if !matches!(meta.spec.network, sandcell::Network::Allowlist(_)) {
            return Err(Error::unsupported(format!(
                "sandbox {id} was created with network {:?}; only a sandbox created with an \
                 allowlist can change it",
                meta.spec.network.mode()
            )));
        }
        self.serve_egress(&meta)?;
        if !self.inner.egress.set_allowlist(id, allowlist) {
            return Err(Error::new(
                ErrorKind::InvalidState,
                format!(
                    "the egress proxy of sandbox {id} is served by another process; change \
                     its network there"
                ),
            ));
        }
        meta.spec.network = network.clone();
        dir.write_meta(&meta)
    }

    async fn metrics(&self, id: &SandboxId) -> Result<SandboxMetrics> {
        let (dir, meta) = self.meta(id)?;
        let egress = self.inner.egress.counts(id);
        let inner = self.inner.clone();
        blocking(move || {
            let mut metrics = SandboxMetrics::now();
            match &meta.cgroups {
                Some(cg) => {
                    let usage = cg.usage();
                    metrics.cpu_time = usage.cpu_time;
                    metrics.memory_bytes = usage.memory_bytes;
                    metrics.processes = Some(usage.processes);
                }
                // Without a cgroup the sandbox's processes are those of its recorded
                // groups (what left them with setsid is not counted).
                None => {
                    let members: usize = dir
                        .groups()
                        .live()
                        .into_iter()
                        .map(|g| process::group_members(g).len())
                        .sum();
                    metrics.processes = Some(members as u64);
                }
            }
            metrics.memory_limit_bytes = meta.spec.limits.memory_bytes;
            metrics.disk_limit_bytes = meta.disk_bytes;
            metrics.disk_bytes = Some(inner.open_workspace(&dir)?.disk_usage()?);
            metrics.egress = egress;
            Ok(metrics)
        })
        .await
    }

    async fn exec(&self, id: &SandboxId, request: ExecRequest) -> Result<Process> {
        self.start_command(id, request)
    }

    async fn read(&self, id: &SandboxId, path: &SandboxPath) -> Result<Bytes> {
        self.read_limited(id, path, u64::MAX).await
    }

    async fn read_limited(
        &self,
        id: &SandboxId,
        path: &SandboxPath,
        max_bytes: u64,
    ) -> Result<Bytes> {
        let path = path.clone();
        self.with_workspace(id, move |ws| ws.read(&path, max_bytes).map(Bytes::from))
            .await
    }

    async fn write(&self, id: &SandboxId, path: &SandboxPath, data: Bytes) -> Result<()> {
        let path = path.clone();
        self.with_workspace(id, move |ws| ws.write(&path, &data))
            .await
    }

    async fn stat(&self, id: &SandboxId, path: &SandboxPath) -> Result<FileInfo> {
        let path = path.clone();
        self.with_workspace(id, move |ws| ws.stat(&path)).await
    }

    async fn list_dir(&self, id: &SandboxId, path: &SandboxPath) -> Result<Vec<DirEntry>> {
        let path = path.clone();
        self.with_workspace(id, move |ws| ws.list_dir(&path)).await
    }

    async fn remove(&self, id: &SandboxId, path: &SandboxPath, recursive: bool) -> Result<()> {
        let path = path.clone();
        self.with_workspace(id, move |ws| ws.remove(&path, recursive))
            .await
    }

    async fn mkdir(&self, id: &SandboxId, path: &SandboxPath) -> Result<()> {
        let path = path.clone();
        self.with_workspace(id, move |ws| ws.mkdir(&path)).await
    }

    async fn rename(&self, id: &SandboxId, from: &SandboxPath, to: &SandboxPath) -> Result<()> {
        let (from, to) = (from.clone(), to.clone());
        self.with_workspace(id, move |ws| ws.rename(&from, &to))
            .await
    }

    async fn export_tar(&self, id: &SandboxId, path: &SandboxPath) -> Result<ByteStream> {
        let path = path.clone();
        let ws = self
            .with_workspace(id, {
                let path = path.clone();
                move |ws| {
                    ws.open_dir(&path)?;
                    Workspace::open(ws.root_path())
                }
            })
            .await?;
        Ok(sandcell::raw::stream::writer_to_stream(move |out| {
            ws.export_tar(&path, out).map(|_| ())
        }))
    }

    async fn export_changes(&self, id: &SandboxId) -> Result<Changes> {
        let (dir, meta) = self.meta(id)?;
        if meta.workspace != "overlay" {
            return Err(Error::unsupported(format!(
                "sandbox {id} has a copied workspace; incremental snapshots need an overlay workspace"
            )));
        }
        // Pinned first, so no clone freezes the upper layer between listing the layers
        // and reading them; held open (never remounted) while the tar is written.
        let merged = {
            let inner = self.inner.clone();
            let dir = dir.clone();
            blocking(move || inner.open_workspace(&dir)).await?
        };
        let root = &self.inner.config.root;
        let layers = std::iter::once(dir.upper())
            .chain(
                crate::layers::read(&dir)?
                    .iter()
                    .map(|name| crate::layers::layer_path(root, name)),
            )
            .collect();
        sandcell::raw::overlay::changes_of_layers(merged.into_fd(), layers).await
    }

    async fn import_tar(
        &self,
        id: &SandboxId,
        path: &SandboxPath,
        tar: ByteStream,
        options: ImportOptions,
    ) -> Result<()> {
        let (dir, meta) = self.meta(id)?;
        let path = path.clone();
        let reader = sandcell::raw::stream::stream_to_reader(tar);
        let inner = self.inner.clone();
        blocking(move || {
            // Open, the workspace pins its mount (see `Inner::workspace_gate`).
            let workspace = inner.open_workspace(&dir)?;
            let _owner = inner.owner().map(|owner| owner.assume(meta.group));
            crate::import::import(&workspace, &path, reader, options)
                .map_err(|e| crate::quota::full_disk(e, meta.disk_bytes, None))
        })
        .await
    }
}
