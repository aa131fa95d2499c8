//! `LocalBackend`: the `SandboxBackend` implementation over directories and process groups.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
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
use crate::config::{Isolation, LocalBackendBuilder, LocalConfig, WorkspaceStrategy};
use crate::contained::Workspace;
use crate::egress::Listener;
use crate::layout::{SandboxDir, SandboxMeta};
use crate::materialize;
use crate::process::{self, DEFAULT_PATH};

// Starting commands, a job of its own; a child module, so it sees this one's privates.
#[path = "exec.rs"]
mod exec;

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
    egress: sandcell::egress::ServedProxies,
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
        let on_path = |program: &str| {
            DEFAULT_PATH
                .split(':')
                .any(|dir| Path::new(dir).join(program).is_file())
        };
        let mut capabilities = Capabilities::none();
        capabilities.shell = on_path("sh");
        capabilities.python = on_path("python3");
        capabilities.pause = true;
        capabilities.reset = true;
        // Processes share the host's network stack and can listen on its ports, unless
        // they have a network namespace of their own.
        capabilities.port_exposure = config.isolation != Isolation::Namespaces;
        capabilities.symlinks = true;
        capabilities.files_while_paused = true;
        capabilities.interactive_exec = true;
        capabilities.metrics = true;
        capabilities.watch = true;
        capabilities.pty = true;
        capabilities.clone = !matches!(config.workspace, WorkspaceStrategy::InPlace);
        // Bind mounts (like overlay mounts and cgroups) need root.
        capabilities.host_mounts = rustix::process::geteuid().is_root();
        // Landlocked or capability-less namespaced processes cannot mount or remount,
        // so a read-only mount stays so.
        capabilities.read_only_mounts_enforced = matches!(
            config.isolation,
            Isolation::Landlock | Isolation::Namespaces
        );
        // Namespaces give a sandbox a network of its own; Landlock's seccomp filter
        // keeps it from opening network sockets. Without isolation it has the host's.
        capabilities.network_isolation = config.isolation != Isolation::None;
        // At Namespaces a full network is a veth and host rules only root can make
        // (see `crate::network`); sharing the host's would reach its loopback and
        // every other sandbox (ADVERSARIAL 38).
        capabilities.network_full =
            config.isolation != Isolation::Namespaces || crate::network::full_available();
        // An allowlist needs a network of the sandbox's own whose only way out is the
        // egress proxy's listener, or at Landlock the kernel narrowing the host's to it:
        // Landlock's TCP rules (ABI 4) and a connect filter on the sandbox's cgroup.
        let cgroups = CgroupRoots::detect();
        capabilities.network_allowlist = match config.isolation {
            Isolation::Namespaces => true,
            Isolation::Landlock => {
                probed.landlock_abi.is_some_and(|abi| abi >= 4)
                    && cgroups.available()
                    && crate::sys::connect_filters_load().is_ok()
            }
            Isolation::None => false,
        };
        capabilities.network_update = capabilities.network_allowlist;
        capabilities.incremental_snapshot = !matches!(
            config.workspace,
            WorkspaceStrategy::Copy | WorkspaceStrategy::InPlace
        );
        let limits = cgroups.enforces_limits();
        capabilities.cpu_limit = limits;
        capabilities.memory_limit = limits;
        capabilities.pids_limit = limits;
        // A file system of the sandbox's own holds what it writes (`crate::quota`); an
        // in-place workspace is the template itself, which none can hold.
        capabilities.disk_limit = !matches!(config.workspace, WorkspaceStrategy::InPlace)
            && crate::quota::probe()
                .inspect_err(|why| tracing::debug!(%why, "no disk limits"))
                .is_ok();
        LocalBackend {
            inner: Arc::new(Inner {
                grace: config.kill_grace,
                config,
                capabilities,
                cgroups,
                probed,
                rulesets: std::sync::Mutex::new(HashMap::new()),
                workspace_gate: std::sync::RwLock::new(()),
                egress: sandcell::egress::ServedProxies::default(),
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

    pub(crate) fn namespace_tools(&self) -> Result<&crate::namespace::Tools> {
        self.inner
            .probed
            .namespace_tools
            .as_ref()
            .ok_or_else(|| Error::new(ErrorKind::Backend, "namespace tools were not probed"))
    }

    /// Makes a sandbox of `spec` (limits already resolved): its cgroups, its directory,
    /// a workspace from `fill` (which answers the strategy it used), the spec's host
    /// mounts, its metadata, and at `Isolation::Namespaces` its namespaces. On any
    /// failure nothing is left: no cgroup, no mount, no directory.
    async fn provision<F>(&self, spec: SandboxSpec, fill: F) -> Result<SandboxMeta>
    where
        F: FnOnce(&SandboxDir) -> Result<&'static str> + Send + 'static,
    {
        let id = SandboxId::generate("local");
        // With a disk limit, what the sandbox writes goes on a disk of its own.
        let disk_bytes = (spec.limits.disk_bytes).filter(|_| self.inner.capabilities.disk_limit);
        let dir = self.dir(&id).with_disk(disk_bytes.is_some());
        let roots = self.inner.cgroups.clone();
        let owner = self.inner.owner();
        let groups = self.inner.probed.sandbox_groups.clone();
        let (dir, mut meta) = blocking(move || {
            let mut cgroups = None;
            let result = (|| {
                cgroups = roots.create(&id, &spec.limits)?;
                if let Some(bytes) = disk_bytes {
                    crate::quota::make(&dir, bytes)?;
                }
                std::fs::create_dir_all(dir.tmp())
                    .map_err(|e| Error::io("creating the sandbox directory", e))?;
                // No other local user reads a sandbox's files through its directory. At
                // Landlock only the sandbox's own group may pass through it (no other
                // sandbox, though all share the owner); at Namespaces the owner's group
                // may (its namespaces mount the workspace; nothing else reaches it).
                let mut group = None;
                let private = match (&owner, &groups) {
                    (Some(owner), Some(groups)) => {
                        let sandboxes = dir.path().parent().unwrap_or(dir.path());
                        group = Some(groups.assign(&id, sandboxes, dir.path())?);
                        owner.chown(&dir.tmp())?;
                        0o710
                    }
                    (Some(owner), None) => {
                        std::os::unix::fs::chown(dir.path(), None, Some(owner.gid))
                            .map_err(|e| Error::io("making the sandbox directory private", e))?;
                        owner.chown(&dir.tmp())?;
                        0o710
                    }
                    (None, _) => 0o700,
                };
                std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(private))
                    .map_err(|e| Error::io("making the sandbox directory private", e))?;
                let used = fill(&dir).map_err(|e| {
                    let what = "the workspace does not fit on the sandbox's disk";
                    crate::quota::full_disk(e, disk_bytes, Some(what))
                })?;
                materialize::attach_mounts(&dir, &spec.mounts, owner.as_deref(), group)?;
                let meta = SandboxMeta {
                    id: id.clone(),
                    spec,
                    status: SandboxStatus::Running,
                    created_at: chrono::Utc::now(),
                    workspace: used.to_owned(),
                    cgroups: cgroups.clone(),
                    ns_init: None,
                    ns_init_start: None,
                    ns_user: false,
                    egress_port: None,
                    net_link: None,
                    disk_bytes,
                    group,
                };
                dir.write_meta(&meta)?;
                Ok((dir.clone(), meta))
            })();
            if result.is_err() {
                if let Some(cg) = &cgroups {
                    cg.remove();
                }
                if materialize::unmount_all(&dir).is_ok() {
                    let _ = sandcell::raw::tree::remove_dir_all(dir.path());
                }
            }
            result
        })
        .await?;
        let started = match self.inner.config.isolation {
            Isolation::Namespaces => {
                let tools = self.namespace_tools()?;
                match crate::namespace::start(tools, &dir, &mut meta).await {
                    Ok(()) => self.serve_egress(&meta),
                    Err(e) => Err(e),
                }
            }
            Isolation::Landlock if matches!(meta.spec.network, sandcell::Network::Allowlist(_)) => {
                self.start_host_egress(&dir, &mut meta)
            }
            _ => Ok(()),
        };
        if let Err(e) = started {
            let _ = self.destroy(&meta.id).await;
            return Err(e);
        }
        Ok(meta)
    }

    /// At `Isolation::Landlock`: the egress listener on the host's loopback, the
    /// sandbox's cgroup narrowed to it, its port recorded.
    fn start_host_egress(&self, dir: &SandboxDir, meta: &mut SandboxMeta) -> Result<()> {
        let cgroups = meta.cgroups.as_ref().ok_or_else(|| {
            Error::unsupported("an allowlist at Isolation::Landlock needs a cgroup v2 of its own")
        })?;
        let port = crate::egress::start_on_host(
            &self.inner.egress,
            &meta.id,
            &meta.spec.network,
            &cgroups.unified,
            &self.inner.config,
        )?;
        meta.egress_port = Some(port);
        dir.write_meta(meta)
    }

    /// Where the egress listener of an allowlisted sandbox is, if it has one.
    fn egress_listener<'a>(&'a self, meta: &SandboxMeta) -> Result<Option<Listener<'a>>> {
        if !matches!(meta.spec.network, sandcell::Network::Allowlist(_)) {
            return Ok(None);
        }
        Ok(match (meta.ns_init, meta.egress_port) {
            (Some(init), _) => Some(Listener::Namespace {
                init: crate::pinned::PinnedInit::pin(&meta.id, init, meta.ns_init_start)?,
                join_user_ns: meta.ns_user,
                noop: &self.namespace_tools()?.noop,
            }),
            (None, Some(port)) => Some(Listener::HostPort(port)),
            (None, None) => None,
        })
    }

    /// Serves the egress proxy of an allowlisted sandbox from this process, unless it
    /// already does (or another process does).
    fn serve_egress(&self, meta: &SandboxMeta) -> Result<()> {
        let Some(listener) = self.egress_listener(meta)? else {
            return Ok(());
        };
        crate::egress::ensure(
            &self.inner.egress,
            &meta.id,
            &meta.spec.network,
            listener,
            &self.inner.config,
        )
    }

    fn set_status(&self, id: &SandboxId, status: SandboxStatus) -> Result<()> {
        let (dir, mut meta) = self.meta(id)?;
        meta.status = status;
        dir.write_meta(&meta)
    }
}

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
    fn forget_ruleset(&self, id: &SandboxId) {
        self.lock_rulesets().remove(id);
    }

    fn lock_rulesets(&self) -> std::sync::MutexGuard<'_, HashMap<SandboxId, (u64, Arc<OwnedFd>)>> {
        // Entries are whole values inserted or removed at once: a poisoned map is intact.
        self.rulesets.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Opens the workspace in `dir`, never while a clone remounts it.
    /// Who owns and runs the sandboxes, where that is not this process's user (see
    /// [`crate::owner`]).
    fn owner(&self) -> Option<Arc<crate::owner::SandboxOwner>> {
        self.probed.owner.clone()
    }

    fn open_workspace(&self, dir: &SandboxDir) -> Result<Workspace> {
        // The guard protects no data: a poisoned gate is as good as a sound one.
        let _open = self
            .workspace_gate
            .read()
            .unwrap_or_else(|p| p.into_inner());
        Workspace::open(&dir.workspace())
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

/// Kills every process of the sandbox: its cgroup (which `setsid` cannot leave) where
/// there is one, and every recorded process group still verifiably its own.
fn kill_all(dir: &SandboxDir, meta: Option<&SandboxMeta>) -> Result<()> {
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
            kill_all(&dir, meta.as_ref())?;
            if let Some(link) = meta.as_ref().and_then(|m| m.net_link.as_deref()) {
                crate::network::detach(link);
            }
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
            kill_all(&dir, Some(&meta))?;
            if let Some(link) = &meta.net_link {
                crate::network::detach(link);
            }
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
        let (source_dir, source) = self.meta(id)?;
        let template = self
            .inner
            .config
            .templates
            .get(&source.spec.template)
            .cloned()
            .ok_or_else(|| {
                Error::not_found(format!(
                    "template {:?} of sandbox {id} is no longer registered",
                    source.spec.template
                ))
            })?;
        let strategy = source.workspace.clone();
        if strategy == "in_place" {
            return Err(Error::unsupported(format!(
                "sandbox {id} works in its template's directory; there is no copy of it to clone"
            )));
        }
        let mut spec = source.spec.clone();
        spec.labels = labels;
        // A paused source stays frozen as it is; a running one is frozen while read.
        let running = source.status == SandboxStatus::Running;
        let source_cgroups = source.cgroups.clone().filter(|_| running);
        let root = self.inner.config.root.clone();
        let owner = self.inner.owner();
        if strategy != "overlay" {
            let meta = self
                .provision(spec, move |dir| {
                    let _frozen = source_cgroups
                        .as_ref()
                        .and_then(|cg| cg.frozen_while_held());
                    crate::contained::copy_tree(&source_dir.workspace(), &dir.workspace())?;
                    // No process of the clone's can reach its copy yet.
                    match &owner {
                        Some(owner) => owner.chown_tree(&dir.workspace()),
                        None => Ok(()),
                    }
                    .map(|()| "copy")
                })
                .await?;
            return Ok(meta.info(&self.dir(&meta.id)));
        }
        // The source's upper layer is frozen (or found busy) on one thread while the
        // clone's cgroups and directory are made on another (`crate::clone`).
        let source = Arc::new(crate::clone::Source {
            id: id.clone(),
            dir: source_dir,
            template,
            cgroups: source_cgroups,
            // A layer frozen out of a sandbox's own disk would leave its limit.
            may_freeze: source.ns_init.is_none() && source.disk_bytes.is_none(),
            owner: owner.clone(),
        });
        let (plan, planned) = std::sync::mpsc::sync_channel(1);
        let (populated, is_populated) = std::sync::mpsc::sync_channel(1);
        {
            let (inner, source) = (self.inner.clone(), source.clone());
            tokio::task::spawn_blocking(move || {
                crate::clone::freeze_source(
                    &inner.config.root,
                    &inner.workspace_gate,
                    &source,
                    &is_populated,
                    || inner.forget_ruleset(&source.id),
                    plan,
                );
            });
        }
        // One small read of the cgroup file system, made before the clone's cgroups
        // are (see `freeze_source`).
        if let Some(cg) = &source.cgroups {
            let _ = populated.send(cg.is_populated());
        }
        let meta = self
            .provision(spec, move |dir| {
                crate::clone::fill(&root, &planned, &source, dir, owner.as_deref())
            })
            .await?;
        Ok(meta.info(&self.dir(&meta.id)))
    }

    async fn watch(
        &self,
        id: &SandboxId,
        path: &SandboxPath,
        options: WatchOptions,
    ) -> Result<WatchStream> {
        let (dir, _) = self.meta(id)?;
        let (sender, stream) = sandcell::raw::watch_channel(path.clone());
        let path = path.clone();
        // The initial walk of a recursive watch reads directories: off the runtime.
        let inner = self.inner.clone();
        let watcher = blocking(move || {
            let holding = crate::layers::hold_for_watch(&dir)?;
            let workspace = inner.open_workspace(&dir)?;
            crate::watch::Watcher::start(&workspace, path, options.recursive, sender, holding)
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
        let path = path.clone();
        self.with_workspace(id, move |ws| ws.read(&path).map(Bytes::from))
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
