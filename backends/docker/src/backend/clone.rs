//! Sandboxes on a network of their own (services, or a full network): creating one,
//! and cloning one (its container and services committed to images and started
//! afresh).

use std::collections::{BTreeMap, HashMap};

use sandcell::{
    Error, ErrorKind, Network, Result, SandboxBackend, SandboxId, SandboxInfo, SandboxSpec,
};

use super::DockerBackend;
use crate::error::{engine, is_not_found};
use crate::hardening::{INTERNAL_PREFIX, LABEL_TEMPLATE};
use crate::host_workspace::HostWorkspace;

impl DockerBackend {
    /// Whether the engine serves names on a network's own bridge address (Podman's
    /// resolver; Docker's lives inside each container's namespace), which the host's
    /// rules then let its sandboxes ask (`crate::firewall`).
    async fn names_on_bridge(&self) -> bool {
        *self
            .inner
            .names_on_bridge
            .get_or_init(|| async {
                let version = self.inner.docker.version().await.ok();
                version
                    .and_then(|v| v.components)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.name.contains("Podman"))
            })
            .await
    }

    /// Loads the host's rules again for sandbox `id`'s own network, where it has one:
    /// before a restart, since a reboot or a flush of the host's ruleset may have
    /// removed them while the network stayed.
    pub(super) async fn guard_again(&self, id: &SandboxId) -> Result<()> {
        let docker = &self.inner.docker;
        let network = docker
            .inspect_network(
                &crate::task_network::network_name(id),
                None::<bollard::query_parameters::InspectNetworkOptions>,
            )
            .await;
        match network {
            Ok(network) => {
                let internal = network.internal.unwrap_or(true);
                let resolves = self.names_on_bridge().await;
                crate::task_network::guard(id, internal, resolves).await
            }
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(engine(format_args!("inspecting the network of {id}"), e)),
        }
    }

    /// Creates a sandbox on a network of its own (it has services, or a full network):
    /// the network, the sandbox, a check that the host's rules guard the network's
    /// bridge, then every service in parallel. On failure nothing is left.
    pub(super) async fn create_task(
        &self,
        id: &SandboxId,
        spec: &SandboxSpec,
        image: String,
        services: &[crate::config::SidecarSpec],
    ) -> Result<()> {
        let docker = &self.inner.docker;
        let images = futures::future::try_join_all(
            services.iter().map(|s| self.inner.images.prepare(&s.image)),
        )
        .await?;
        let internal = !matches!(spec.network, Network::Full);
        let resolves = self.names_on_bridge().await;
        let network = crate::task_network::create(docker, id, internal, resolves)
            .await?
            .with_services(services.iter().map(|s| (s.host(), s.name.as_str())));
        let network = match network {
            Ok(network) => network,
            Err(e) => {
                let _ = crate::task::teardown(docker, id).await;
                return Err(e);
            }
        };
        let ulimits = self.ulimits().await;
        let network = &network;
        // The sandbox's own container (which runs nothing of the client's until asked)
        // starts first: Podman makes a bridge only as a container joins it, and the
        // bridge is checked before any service (a client's image and command) runs.
        let started = async {
            self.create_container(id, spec, image, Some(network))
                .await?;
            crate::firewall::check_bridge(&crate::firewall::bridge_name(id))?;
            futures::future::try_join_all(services.iter().zip(images).enumerate().map(
                |(index, (s, image))| {
                    crate::task::start_service(docker, id, network, index, s, image, ulimits)
                },
            ))
            .await
        }
        .await;
        if let Err(e) = started {
            let _ = self.remove_container(id.as_str()).await;
            let _ = crate::task::teardown(docker, id).await;
            return Err(e);
        }
        Ok(())
    }

    /// An independent copy of a sandbox: its container (workspace and all) and its
    /// services are committed to images and started afresh, on a network of their own.
    /// Writes to either afterwards do not reach the other. The clone carries `labels`
    /// instead of the source's (so a manager's session labels are not copied by
    /// accident); destroying it removes its images too. [`SandboxBackend::clone_sandbox`].
    pub(super) async fn clone_task(
        &self,
        id: &SandboxId,
        labels: BTreeMap<String, String>,
    ) -> Result<SandboxInfo> {
        let host_workspace = self.settings(id).await?.host_workspace;
        self.check_not_paused(id)?;
        let docker = &self.inner.docker;
        let new = SandboxId::generate("docker");
        let services = crate::task::services_of(docker, id).await?;
        let result = async {
            // The clone gets a network of its own where the source has one (services,
            // or a full network of its own), internal where the source's is.
            let network = match docker
                .inspect_network(
                    &crate::task_network::network_name(id),
                    None::<bollard::query_parameters::InspectNetworkOptions>,
                )
                .await
            {
                Ok(source) => {
                    let internal = source.internal.unwrap_or(true);
                    let resolves = self.names_on_bridge().await;
                    let network =
                        crate::task_network::create(docker, &new, internal, resolves).await?;
                    let names = services
                        .iter()
                        .map(|(_, service, host)| (host.as_str(), service.as_str()));
                    Some(network.with_services(names)?)
                }
                Err(e) if is_not_found(&e) => None,
                Err(e) => return Err(engine(format_args!("inspecting the network of {id}"), e)),
            };
            let source_labels = docker
                .inspect_container(id.as_str(), None)
                .await
                .map_err(|e| engine(format_args!("inspecting sandbox {id}"), e))?
                .config
                .and_then(|c| c.labels)
                .unwrap_or_default();
            let mut new_labels: HashMap<String, String> = source_labels
                .into_iter()
                .filter(|(k, _)| k.starts_with(INTERNAL_PREFIX))
                .collect();
            let template = new_labels.get(LABEL_TEMPLATE).cloned().unwrap_or_default();
            crate::hardening::record_label_keys(&mut new_labels, labels.keys());
            new_labels.extend(labels);
            let image = crate::task::commit(docker, id.as_str(), &new, None).await?;
            let mut body = crate::task::recreate_body(
                docker,
                id.as_str(),
                image,
                network.as_ref(),
                new_labels,
            )
            .await?;
            if host_workspace {
                // A commit leaves bind mounts out: the clone gets a copy of the source's
                // upper layer over the same project directory, bound where the
                // source's was.
                let (source, copy) = self.copy_host_workspace(id, &new, &template).await?;
                let host = body.host_config.get_or_insert_with(Default::default);
                for bind in host.binds.iter_mut().flatten() {
                    if let Some(target) = bind
                        .strip_prefix(&format!("{}:", source.merged().display()))
                        .and_then(|rest| rest.split(':').next())
                    {
                        *bind = copy.bind(target);
                    }
                }
            }
            body.networking_config = network
                .as_ref()
                .map(crate::task_network::TaskNetwork::sandbox_endpoint);
            let network = network.as_ref();
            let new = &new;
            let service_clones =
                services
                    .iter()
                    .enumerate()
                    .map(|(index, (container, service, host))| async move {
                        let image =
                            crate::task::commit(docker, container, new, Some(service)).await?;
                        let mut body = crate::task::recreate_body(
                            docker,
                            container,
                            image,
                            network,
                            crate::task::service_labels(new, service),
                        )
                        .await?;
                        body.hostname = Some(host.clone());
                        body.networking_config = network.map(|n| {
                            n.service_endpoint(index, vec![host.clone(), service.clone()])
                        });
                        crate::task::start_clone(
                            docker,
                            &crate::task::clone_service_container(new, service),
                            body,
                        )
                        .await
                    });
            // As in a create: the bridge is checked before any service runs.
            crate::task::start_clone(docker, new.as_str(), body).await?;
            if network.is_some() {
                crate::firewall::check_bridge(&crate::firewall::bridge_name(new))?;
            }
            futures::future::try_join_all(service_clones)
                .await
                .map(drop)
        }
        .await;
        if let Err(e) = result {
            let _ = self.remove_container(new.as_str()).await;
            let _ = crate::task::teardown(docker, &new).await;
            let _ = HostWorkspace::of(&self.inner.config.runtime_dir, &new).remove();
            return Err(e.context(format_args!("cloning sandbox {id}")));
        }
        self.inspect(&new).await
    }

    /// Copies host workspace of sandbox `id` (template `template`) for its clone `new`,
    /// with the source's container paused meanwhile so the copy is one moment's
    /// state. Returns the source's and the copy's workspaces.
    async fn copy_host_workspace(
        &self,
        id: &SandboxId,
        new: &SandboxId,
        template: &str,
    ) -> Result<(HostWorkspace, HostWorkspace)> {
        let config = &self.inner.config;
        let lower = config.host_workspaces.get(template).cloned().ok_or_else(|| {
            Error::unsupported(format!(
                "sandbox {id} has a host-directory workspace of template {template:?}, which this backend has no directory for"
            ))
        })?;
        let source = HostWorkspace::of(&config.runtime_dir, id);
        let copy = HostWorkspace::of(&config.runtime_dir, new);
        let docker = &self.inner.docker;
        let running = docker
            .inspect_container(id.as_str(), None)
            .await
            .map_err(|e| engine(format_args!("inspecting sandbox {id}"), e))?
            .state
            .and_then(|s| s.running)
            .unwrap_or(false);
        if running {
            docker.pause_container(id.as_str()).await.map_err(|e| {
                engine(
                    format_args!("pausing sandbox {id} to copy its workspace"),
                    e,
                )
            })?;
        }
        let (from, to) = (source.clone(), copy.clone());
        let engine_id = self.engine_id().await;
        let copied =
            tokio::task::spawn_blocking(move || to.copy_of(&from, &lower, engine_id.as_deref()))
                .await
                .map_err(|e| {
                    Error::with_source(ErrorKind::Backend, "copying the workspace failed", e)
                });
        if running {
            let resumed = docker
                .unpause_container(id.as_str())
                .await
                .map_err(|e| engine(format_args!("resuming sandbox {id}"), e));
            if let Err(e) = resumed {
                let _ = copy.remove();
                return Err(e);
            }
        }
        copied??;
        Ok((source, copy))
    }
}
