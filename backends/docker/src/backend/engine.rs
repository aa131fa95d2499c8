//! The Docker backend's state: how it reaches the engine, the images it prepares,
//! and each container's settings and agent connection.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use bollard::{ClientVersion, Docker};
use sandcell::raw::wire::WireClient;
use sandcell::{Error, ErrorKind, Result, SandboxId, SandboxInfo};

use super::DockerBackend;
use crate::config::{DockerBackendBuilder, DockerConfig};
use crate::error::engine;
use crate::hardening::ContainerSettings;
use crate::image::Images;
use crate::lock;

/// The API version requested: old enough for Debian's engine (20.10), accepted by new ones.
const API_VERSION: ClientVersion = ClientVersion {
    major_version: 1,
    minor_version: 41,
};
const DEFAULT_SOCKET: &str = "/var/run/docker.sock";

/// What every clone of a [`DockerBackend`] shares.
pub(super) struct Inner {
    pub(super) docker: Docker,
    pub(super) config: DockerConfig,
    pub(super) images: Images,
    /// sha256 of the agent binary, naming the image layer that carries it.
    pub(super) agent_hash: Option<String>,
    /// One agent connection per container, opened on first use.
    pub(super) clients: Mutex<HashMap<SandboxId, Arc<tokio::sync::Mutex<Option<WireClient>>>>>,
    /// Per-container settings read from its labels, cached.
    pub(super) settings: Mutex<HashMap<SandboxId, ContainerSettings>>,
    /// Containers this backend paused: calls into a frozen agent would hang.
    pub(super) paused: Mutex<HashSet<SandboxId>>,
    /// Ports published to this host's loopback.
    pub(super) ports: crate::ports::Forwarders,
    /// Per template whose image is prepared: whether `python3` is on its `PATH`.
    pub(super) python: Mutex<HashMap<String, bool>>,
    /// The egress proxies of allowlisted sandboxes this process serves.
    pub(super) egress: sandcell::raw::egress::ServedProxies,
    /// Whether the engine runs on this host, where a socket can be mounted into a
    /// container (not over TCP).
    pub(super) local_engine: bool,
    /// The engine's socket when it runs on this host.
    pub(super) socket: Option<std::path::PathBuf>,
    /// The resource limits containers are created with, read once (`crate::ulimits`).
    pub(super) ulimits: tokio::sync::OnceCell<Option<Vec<bollard::models::ResourcesUlimits>>>,
    /// Set once this process swept host workspaces a crash left without a container.
    pub(super) swept: tokio::sync::OnceCell<()>,
    /// What tells the engine from others on this host (its data root), read once: host
    /// workspaces are marked with it, so a sweep never takes another engine's.
    pub(super) engine_id: tokio::sync::OnceCell<Option<String>>,
    /// Whether the engine serves names on a network's bridge address (Podman), read
    /// once.
    pub(super) names_on_bridge: tokio::sync::OnceCell<bool>,
    /// Whether a container's root may be the host's (`crate::user`).
    pub(super) root: crate::user::RootGuard,
}

impl DockerBackend {
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
                egress: sandcell::raw::egress::ServedProxies::default(),
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

    /// The image a template's containers are created from (with the agent layer).
    pub(super) async fn image_for(&self, template: &str) -> Result<String> {
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

    pub(super) fn workspace(&self) -> &str {
        &self.inner.config.workspace
    }

    /// How commands run in container `id` (from its labels, cached).
    pub(super) async fn settings(&self, id: &SandboxId) -> Result<ContainerSettings> {
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

    pub(super) fn check_not_paused(&self, id: &SandboxId) -> Result<()> {
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
    pub(super) async fn client(&self, id: &SandboxId) -> Result<WireClient> {
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
    pub(super) fn with_allowlist(&self, mut info: SandboxInfo) -> SandboxInfo {
        if let sandcell::Network::Allowlist(entries) = &mut info.network {
            *entries = crate::egress::entries(&self.inner.config.runtime_dir, &info.id)
                .unwrap_or_default();
        }
        info
    }

    /// Serves the way out of an allowlisted sandbox made by a backend in another
    /// (earlier) process, unless this one already does.
    pub(super) fn adopt_egress(&self, id: &SandboxId) -> Result<()> {
        let config = &self.inner.config;
        crate::egress::adopt(
            &self.inner.egress,
            &config.runtime_dir,
            id,
            &config.egress_hosts,
        )
    }

    pub(super) fn forget(&self, id: &SandboxId) {
        lock(&self.inner.clients).remove(id);
        lock(&self.inner.settings).remove(id);
        lock(&self.inner.paused).remove(id);
        self.inner.ports.forget(id);
    }
}
