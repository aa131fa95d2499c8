//! `DockerBackend`: sandboxes as hardened containers, reached through the in-container
//! agent (or the engine's exec API where no agent is configured).

use std::collections::BTreeMap;
use std::sync::Arc;

use bollard::query_parameters::RestartContainerOptions;
use bollard::Docker;
use bytes::Bytes;
use sandcell::{
    Capabilities, Changes, Error, ExecRequest, LabelSelector, Process, Result, SandboxBackend,
    SandboxId, SandboxInfo, SandboxPath, SandboxSpec, SandboxStatus,
};

use crate::config::{DockerBackendBuilder, DockerConfig};
use crate::error::engine;
use crate::lock;

mod clone;
mod containers;
mod describe;
mod engine;

use engine::Inner;

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

impl std::fmt::Debug for DockerBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DockerBackend")
            .field("templates", &self.inner.config.templates.keys())
            .field("agent", &self.inner.config.agent)
            .finish_non_exhaustive()
    }
}

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
}

sandcell::raw::forward_backend! {
    impl SandboxBackend for DockerBackend {
        forward {
            // Through the agent (which watches with inotify inside the container).
            [files] => wire client;
        }

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

        /// CPU time, memory and processes from the engine's one-shot stats (the
        /// container's own keep-alive process, the agent, is counted), the memory limit
        /// from its host config, and the workspace's bytes from the agent.
        async fn metrics(&self, id: &SandboxId) -> Result<sandcell::SandboxMetrics> {
            self.measure(id).await
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
}
