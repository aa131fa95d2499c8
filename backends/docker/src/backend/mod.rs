//! `DockerBackend`: sandboxes as hardened containers, reached through the in-container
//! agent (or the engine's exec API where no agent is configured).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bollard::query_parameters::RestartContainerOptions;
use bollard::{ClientVersion, Docker};
use bytes::Bytes;
use sandcell::archive::ImportOptions;
use sandcell::raw::wire::WireClient;
use sandcell::{
    ByteStream, Capabilities, Changes, DirEntry, Error, ErrorKind, ExecRequest, FileInfo,
    LabelSelector, Process, Result, SandboxBackend, SandboxId, SandboxInfo, SandboxPath,
    SandboxSpec, SandboxStatus,
};

use crate::config::{DockerBackendBuilder, DockerConfig};
use crate::error::engine;
use crate::hardening::ContainerSettings;
use crate::image::Images;

mod clone;
mod containers;
mod describe;

/// The API version requested: old enough for Debian's engine (20.10), accepted by new ones.
const API_VERSION: ClientVersion = ClientVersion {
    major_version: 1,
    minor_version: 41,
};
const DEFAULT_SOCKET: &str = "/var/run/docker.sock";

/// Sandboxes as Docker containers, hardened by default.
///
/// Each container runs `sandcell-agent` (when configured) as its keep-alive process;
/// commands and file operations go to it over one persistent connection per container,
/// opened through a single engine exec. Without an agent, commands use the engine's exec
/// API and file operations are `Unsupported`.
///
/// ```no_run
/// # async fn demo() -> sandcell::Result<()> {
/// use sandcell::{ExecRequest, SandboxBackend, SandboxBackendExt, SandboxSpec};
/// use sandcell_docker::{DockerBackend, ImageSpec};
///
/// let backend = DockerBackend::builder()
///     .template("python", ImageSpec::pull("python:3.12-slim"))
///     .agent("target/agent/x86_64-unknown-linux-gnu/release/sandcell-agent")
///     .build()?;
/// let sandbox = backend.create(&SandboxSpec::new("python")).await?;
/// let out = backend.run(&sandbox.id, ExecRequest::new(["python3", "-c", "print(6*7)"])).await?;
/// assert_eq!(out.stdout_str(), "42\n");
/// backend.destroy(&sandbox.id).await
/// # }
/// ```
#[derive(Clone)]
pub struct DockerBackend {
    inner: Arc<Inner>,
}

struct Inner {
    docker: Docker,
    config: DockerConfig,
    images: Images,
    /// sha256 of the agent binary, naming the image layer that carries it.
    agent_hash: Option<String>,
    /// One agent connection per container, opened on first use.
    clients: Mutex<HashMap<SandboxId, Arc<tokio::sync::Mutex<Option<WireClient>>>>>,
    /// Per-container settings read from its labels, cached.
    settings: Mutex<HashMap<SandboxId, ContainerSettings>>,
    /// Containers this backend paused: calls into a frozen agent would hang.
    paused: Mutex<HashSet<SandboxId>>,
    /// Ports published to this host's loopback.
    ports: crate::ports::Forwarders,
    /// Per template whose image is prepared: whether `python3` is on its `PATH`.
    python: Mutex<HashMap<String, bool>>,
    /// The egress proxies of allowlisted sandboxes this process serves.
    egress: sandcell::egress::ServedProxies,
    /// Whether the engine runs on this host, where a socket can be mounted into a
    /// container (not over TCP).
    local_engine: bool,
    /// The engine's socket when it runs on this host.
    socket: Option<std::path::PathBuf>,
    /// The resource limits containers are created with, read once (`crate::ulimits`).
    ulimits: tokio::sync::OnceCell<Option<Vec<bollard::models::ResourcesUlimits>>>,
    /// Set once this process swept host workspaces a crash left without a container.
    swept: tokio::sync::OnceCell<()>,
    /// What tells the engine from others on this host (its data root), read once: host
    /// workspaces are marked with it, so a sweep never takes another engine's.
    engine_id: tokio::sync::OnceCell<Option<String>>,
    /// Whether the engine serves names on a network's bridge address (Podman), read
    /// once.
    names_on_bridge: tokio::sync::OnceCell<bool>,
    /// Whether a container's root may be the host's (`crate::user`).
    root: crate::user::RootGuard,
}

impl std::fmt::Debug for DockerBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DockerBackend")
            .field("templates", &self.inner.config.templates.keys())
            .field("agent", &self.inner.config.agent)
            .finish_non_exhaustive()
    }
}

use crate::lock;

impl DockerBackend {
    /// A builder: templates, limits, network, user, runtime, agent.
    pub fn builder() -> DockerBackendBuilder {
        DockerBackendBuilder::new()
    }

    /// The factory for [`sandcell::BackendRegistry`]: options are a [`DockerConfig`].
    pub fn from_options(options: serde_json::Value) -> Result<Box<dyn SandboxBackend>> {
        let config: DockerConfig = sandcell::config::backend_options("docker", options)?;
        Ok(Box::new(config.build()?))
    }

    pub(crate) fn connect(builder: DockerBackendBuilder) -> Result<Self> {
        let DockerBackendBuilder { config, progress } = builder;
        let host = config
            .host
            .clone()
            .or_else(|| std::env::var("DOCKER_HOST").ok().filter(|h| !h.is_empty()))
            .unwrap_or_else(|| format!("unix://{DEFAULT_SOCKET}"));
        // Long enough for image builds and pulls, which are single requests.
        let timeout = 3600;
        let local_engine = host.starts_with("unix://") || host.starts_with('/');
        let docker = if local_engine {
            Docker::connect_with_unix(&host, timeout, &API_VERSION)
        } else if host.starts_with("tcp://") || host.starts_with("http://") {
            Docker::connect_with_http(&host, timeout, &API_VERSION)
        } else {
            return Err(Error::invalid_input(format!(
                "docker host {host:?}: expected unix://PATH or tcp://HOST:PORT"
            )));
        }
        .map_err(|e| engine(format_args!("connecting to {host}"), e))?;
        let socket = local_engine
            .then(|| std::path::PathBuf::from(host.strip_prefix("unix://").unwrap_or(&host)));
        let root = crate::user::RootGuard::new(config.allow_host_root);
        let agent_hash = match &config.agent {
            Some(agent) => Some(crate::agent::file_sha256(agent)?),
            None => None,
        };
        Ok(DockerBackend {
            inner: Arc::new(Inner {
                images: Images::new(docker.clone(), progress),
                docker,
                config,
                agent_hash,
                clients: Mutex::new(HashMap::new()),
                settings: Mutex::new(HashMap::new()),
                paused: Mutex::new(HashSet::new()),
                ports: crate::ports::Forwarders::default(),
                python: Mutex::new(HashMap::new()),
                egress: sandcell::egress::ServedProxies::default(),
                local_engine,
                socket,
                ulimits: tokio::sync::OnceCell::new(),
                swept: tokio::sync::OnceCell::new(),
                engine_id: tokio::sync::OnceCell::new(),
                names_on_bridge: tokio::sync::OnceCell::new(),
                root,
            }),
        })
    }

    /// The engine client, for what this backend does not cover.
    pub fn docker(&self) -> &Docker {
        &self.inner.docker
    }

    /// Checks the engine answers.
    pub async fn ping(&self) -> Result<()> {
        self.inner
            .docker
            .ping()
            .await
            .map(|_| ())
            .map_err(|e| engine("pinging the Docker engine", e))
    }

    /// Prepares every template's image now (pull, build, import, agent layer) instead of
    /// at the first `create` that needs it: a batch's setup step.
    pub async fn prepare_images(&self) -> Result<()> {
        let names: Vec<String> = self.inner.config.templates.keys().cloned().collect();
        let jobs = names.iter().map(|name| self.image_for(name));
        futures::future::try_join_all(jobs).await.map(|_| ())
    }

    /// The image a template's containers are created from (with the agent layer).
    async fn image_for(&self, template: &str) -> Result<String> {
        let spec = self.inner.config.templates.get(template).ok_or_else(|| {
            Error::not_found(format!(
                "template {template:?} is not registered with the docker backend"
            ))
        })?;
        let image = self.inner.images.prepare(spec).await?;
        let config = &self.inner.config;
        let (docker, configured) = (&self.inner.docker, config.user.as_deref());
        let layer = crate::image::Layer {
            agent: config.agent.clone().zip(self.inner.agent_hash.clone()),
            user: self
                .inner
                .root
                .default_user(docker, &image, configured)
                .await?,
            workspace: config.workspace.clone(),
        };
        let prepared = self.inner.images.derive(&image, &layer).await?;
        if !lock(&self.inner.python).contains_key(template) {
            let python = crate::probe::has_python(&self.inner.docker, &prepared).await?;
            lock(&self.inner.python).insert(template.to_owned(), python);
        }
        Ok(prepared)
    }

    fn workspace(&self) -> &str {
        &self.inner.config.workspace
    }

    /// How commands run in container `id` (from its labels, cached).
    async fn settings(&self, id: &SandboxId) -> Result<ContainerSettings> {
        if let Some(s) = lock(&self.inner.settings).get(id) {
            return Ok(*s);
        }
        let container = self
            .inner
            .docker
            .inspect_container(id.as_str(), None)
            .await
            .map_err(|e| engine(format_args!("inspecting sandbox {id}"), e))?;
        let labels = container.config.and_then(|c| c.labels).unwrap_or_default();
        let settings = ContainerSettings::from_labels(&labels).ok_or_else(|| {
            Error::not_found(format!("container {id} is not a sandbox of this backend"))
        })?;
        lock(&self.inner.settings).insert(id.clone(), settings);
        Ok(settings)
    }

    fn check_not_paused(&self, id: &SandboxId) -> Result<()> {
        if lock(&self.inner.paused).contains(id) {
            return Err(Error::new(
                ErrorKind::InvalidState,
                format!("sandbox {id} is paused; resume it first"),
            ));
        }
        Ok(())
    }

    /// The resource limits every container is created with (`crate::ulimits`), read
    /// from the engine once.
    pub(crate) async fn ulimits(&self) -> Option<&[bollard::models::ResourcesUlimits]> {
        self.inner
            .ulimits
            .get_or_init(|| crate::ulimits::for_engine(self.inner.socket.as_deref()))
            .await
            .as_deref()
    }

    /// The agent connection of container `id`, opened on first use.
    async fn client(&self, id: &SandboxId) -> Result<WireClient> {
        let settings = self.settings(id).await?;
        if !settings.agent {
            return Err(Error::unsupported(format!(
                "sandbox {id} runs without sandcell-agent, so file operations are not available; configure DockerBackend::builder().agent(..)"
            )));
        }
        self.check_not_paused(id)?;
        let cell = Arc::clone(lock(&self.inner.clients).entry(id.clone()).or_default());
        let mut slot = cell.lock().await;
        if let Some(client) = slot.as_ref().filter(|c| c.closed().is_none()) {
            return Ok(client.clone());
        }
        let client = crate::agent::connect(&self.inner.docker, id).await?;
        *slot = Some(client.clone());
        Ok(client)
    }

    /// `info` with the allowlist in force, which the container's labels cannot carry
    /// (it may change after create).
    fn with_allowlist(&self, mut info: SandboxInfo) -> SandboxInfo {
        if let sandcell::Network::Allowlist(entries) = &mut info.network {
            *entries = crate::egress::entries(&self.inner.config.runtime_dir, &info.id)
                .unwrap_or_default();
        }
        info
    }

    /// Serves the way out of an allowlisted sandbox made by a backend in another
    /// (earlier) process, unless this one already does.
    fn adopt_egress(&self, id: &SandboxId) -> Result<()> {
        let config = &self.inner.config;
        crate::egress::adopt(
            &self.inner.egress,
            &config.runtime_dir,
            id,
            &config.egress_hosts,
        )
    }

    fn forget(&self, id: &SandboxId) {
        lock(&self.inner.clients).remove(id);
        lock(&self.inner.settings).remove(id);
        lock(&self.inner.paused).remove(id);
        self.inner.ports.forget(id);
    }
}

#[async_trait]
impl SandboxBackend for DockerBackend {
    fn name(&self) -> &str {
        "docker"
    }

    fn capabilities(&self) -> Capabilities {
        self.capabilities_now()
    }

    async fn create(&self, spec: &SandboxSpec) -> Result<SandboxInfo> {
        let caps = self.capabilities();
        let mut spec = spec.prepare(&caps)?;
        crate::hardening::refuse_internal_labels(spec.labels.keys())?;
        spec.limits = spec.limits.with_defaults(&self.inner.config.default_limits);
        // The defaults are held to the capabilities too: none is quietly not enforced.
        spec.check_supported(&caps)
            .map_err(|e| e.context("with the backend's default_limits"))?;
        self.sweep_host_workspaces().await;
        let image = self.image_for(&spec.template).await?;
        let id = SandboxId::generate("docker");
        let services = self
            .inner
            .config
            .sidecars
            .get(&spec.template)
            .cloned()
            .unwrap_or_default();
        // A full network is the sandbox's own unless the operator named one to share.
        let own_network =
            matches!(spec.network, sandcell::Network::Full) && self.inner.config.network.is_none();
        if services.is_empty() && !own_network {
            self.create_container(&id, &spec, image, None).await?;
        } else {
            self.create_task(&id, &spec, image, &services).await?;
        }
        tracing::debug!(sandbox = %id, template = %spec.template, "created docker sandbox");
        let mut info = SandboxInfo::new(id, "docker", &spec, SandboxStatus::Running);
        info.details.insert(
            "exec".to_owned(),
            if self.inner.config.agent.is_some() {
                "agent"
            } else {
                "engine"
            }
            .to_owned(),
        );
        let workspace = if self
            .inner
            .config
            .host_workspaces
            .contains_key(&spec.template)
        {
            "overlay"
        } else {
            "image"
        };
        info.details
            .insert("workspace".to_owned(), workspace.to_owned());
        Ok(info)
    }

    async fn inspect(&self, id: &SandboxId) -> Result<SandboxInfo> {
        self.describe(id).await
    }

    async fn list(&self, selector: &LabelSelector) -> Result<Vec<SandboxInfo>> {
        self.list_matching(selector).await
    }

    async fn destroy(&self, id: &SandboxId) -> Result<()> {
        self.forget(id);
        self.remove_container(id.as_str()).await?;
        crate::egress::remove(&self.inner.egress, &self.inner.config.runtime_dir, id);
        // After the container: the engine unbinds the view before it is unmounted.
        crate::host_workspace::HostWorkspace::of(&self.inner.config.runtime_dir, id).remove()?;
        crate::task::teardown(&self.inner.docker, id).await
    }

    async fn pause(&self, id: &SandboxId) -> Result<()> {
        self.settings(id).await?;
        self.inner
            .docker
            .pause_container(id.as_str())
            .await
            .map_err(|e| engine(format_args!("pausing sandbox {id}"), e))?;
        lock(&self.inner.paused).insert(id.clone());
        Ok(())
    }

    async fn resume(&self, id: &SandboxId) -> Result<()> {
        self.settings(id).await?;
        match self.inner.docker.unpause_container(id.as_str()).await {
            Ok(()) => {}
            // Resuming a running sandbox succeeds.
            Err(e) if e.to_string().contains("is not paused") => {}
            Err(e) => return Err(engine(format_args!("resuming sandbox {id}"), e)),
        }
        lock(&self.inner.paused).remove(id);
        Ok(())
    }

    /// A forwarder on this host's loopback to the container's address: the engine binds
    /// host ports only at create. A sandbox without a network is `Unsupported`.
    async fn publish_port(&self, id: &SandboxId, port: u16) -> Result<()> {
        self.settings(id).await?;
        self.inner.ports.publish(&self.inner.docker, id, port).await
    }

    async fn unpublish_port(&self, id: &SandboxId, port: u16) -> Result<()> {
        self.inner.ports.unpublish(id, port);
        Ok(())
    }

    async fn reset(&self, id: &SandboxId) -> Result<()> {
        self.settings(id).await?;
        lock(&self.inner.clients).remove(id);
        lock(&self.inner.paused).remove(id);
        self.guard_again(id).await?;
        // A restart kills every process (the agent too) and starts the agent afresh;
        // the workspace lives in the container's file system and stays.
        self.inner
            .docker
            .restart_container(
                id.as_str(),
                Some(RestartContainerOptions {
                    t: Some(0),
                    ..Default::default()
                }),
            )
            .await
            .map_err(|e| engine(format_args!("resetting sandbox {id}"), e))
    }

    async fn exec(&self, id: &SandboxId, mut request: ExecRequest) -> Result<Process> {
        request.check_supported(&self.capabilities())?;
        let settings = self.settings(id).await?;
        self.check_not_paused(id)?;
        // From the cached labels: no file is read on the exec path of other sandboxes.
        if settings.allowlist {
            self.adopt_egress(id)?;
        }
        if request.timeout.is_none() {
            request.timeout = settings.command_timeout;
        }
        if let Some(user) = request.user.take() {
            let docker = &self.inner.docker;
            request.user = self
                .inner
                .root
                .check(docker, id.as_str(), Some(&user))
                .await?;
        }
        let process = if settings.agent && request.user.is_none() {
            self.client(id).await?.exec(request).await?
        } else {
            crate::engine::exec(&self.inner.docker, id, self.workspace(), request).await?
        };
        Ok(match settings.output_bytes {
            Some(limit) => sandcell::raw::limit_output(process, Some(limit)),
            None => process,
        })
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
        let settings = self.settings(id).await?;
        // Refused while paused like every file operation (`files_while_paused` is not
        // claimed): one read working would not make snapshots of a paused sandbox work.
        self.check_not_paused(id)?;
        if !settings.agent {
            return crate::archive::read_file(
                &self.inner.docker,
                id.as_str(),
                self.workspace(),
                path,
                max_bytes,
            )
            .await;
        }
        self.client(id).await?.read_limited(path, max_bytes).await
    }

    async fn write(&self, id: &SandboxId, path: &SandboxPath, data: Bytes) -> Result<()> {
        self.client(id).await?.write(path, data).await
    }

    async fn stat(&self, id: &SandboxId, path: &SandboxPath) -> Result<FileInfo> {
        self.client(id).await?.stat(path).await
    }

    async fn list_dir(&self, id: &SandboxId, path: &SandboxPath) -> Result<Vec<DirEntry>> {
        self.client(id).await?.list_dir(path).await
    }

    async fn remove(&self, id: &SandboxId, path: &SandboxPath, recursive: bool) -> Result<()> {
        self.client(id).await?.remove(path, recursive).await
    }

    async fn mkdir(&self, id: &SandboxId, path: &SandboxPath) -> Result<()> {
        self.client(id).await?.mkdir(path).await
    }

    async fn rename(&self, id: &SandboxId, from: &SandboxPath, to: &SandboxPath) -> Result<()> {
        self.client(id).await?.rename(from, to).await
    }

    async fn export_tar(&self, id: &SandboxId, path: &SandboxPath) -> Result<ByteStream> {
        self.client(id).await?.export_tar(path).await
    }

    /// A host-directory workspace's upper layer is its change set; an image's
    /// workspace has none to offer.
    async fn export_changes(&self, id: &SandboxId) -> Result<Changes> {
        if !self.settings(id).await?.host_workspace {
            return Err(Error::unsupported(format!(
                "sandbox {id} has its image's workspace; incremental snapshots need a host-directory workspace (DockerBackendBuilder::host_workspace)"
            )));
        }
        let ws = crate::host_workspace::HostWorkspace::of(&self.inner.config.runtime_dir, id);
        sandcell::raw::overlay::changes(ws.upper()).await
    }

    async fn clone_sandbox(
        &self,
        id: &SandboxId,
        labels: BTreeMap<String, String>,
    ) -> Result<SandboxInfo> {
        crate::hardening::refuse_internal_labels(labels.keys())?;
        self.clone_task(id, labels).await
    }

    /// Through the agent, which watches with inotify inside the container.
    async fn watch(
        &self,
        id: &SandboxId,
        path: &SandboxPath,
        options: sandcell::WatchOptions,
    ) -> Result<sandcell::WatchStream> {
        self.client(id).await?.watch(path, options).await
    }

    /// CPU time, memory and processes from the engine's one-shot stats (the
    /// container's own keep-alive process, the agent, is counted), the memory limit
    /// from its host config, and the workspace's bytes from the agent.
    async fn metrics(&self, id: &SandboxId) -> Result<sandcell::SandboxMetrics> {
        self.measure(id).await
    }

    async fn import_tar(
        &self,
        id: &SandboxId,
        path: &SandboxPath,
        tar: ByteStream,
        options: ImportOptions,
    ) -> Result<()> {
        self.client(id).await?.import_tar(path, tar, options).await
    }

    async fn set_network(&self, id: &SandboxId, network: &sandcell::Network) -> Result<()> {
        if !self.capabilities().network_update {
            return Err(Error::unsupported(
                "backend docker changes allowlists only with the agent and an engine on this host",
            ));
        }
        let sandcell::Network::Allowlist(entries) = network else {
            return Err(Error::unsupported(format!(
                "set_network takes an allowlist, not network {:?}",
                network.mode()
            )));
        };
        sandcell::egress::Allowlist::parse(entries)?;
        self.settings(id).await?;
        let config = &self.inner.config;
        if crate::egress::entries(&config.runtime_dir, id).is_none() {
            return Err(Error::unsupported(format!(
                "sandbox {id} was not created with an allowlist; only such a sandbox can change it"
            )));
        }
        self.adopt_egress(id)?;
        crate::egress::update(&self.inner.egress, &config.runtime_dir, id, entries)
    }
}
