//! Sandboxes with service containers: creating one on a private network, and cloning
//! one (its container and services committed to images and started afresh).

use std::collections::{BTreeMap, HashMap};

use sandcell::{Error, Network, Result, SandboxBackend, SandboxId, SandboxInfo, SandboxSpec};

use super::DockerBackend;
use crate::error::engine;
use crate::hardening::INTERNAL_PREFIX;

impl DockerBackend {
    /// Creates a sandbox with service containers: a private network, then the sandbox
    /// and every service in parallel. On failure nothing is left.
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
        let network = crate::task::create_network(docker, id, internal).await?;
        let ulimits = self.ulimits().await;
        let started = futures::future::try_join(
            self.create_container(id, spec, image, Some(&network)),
            futures::future::try_join_all(services.iter().zip(images).map(|(s, image)| {
                crate::task::start_service(docker, id, &network, s, image, ulimits)
            })),
        )
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
        if self.settings(id).await?.host_workspace {
            // A commit leaves bind mounts out, and the clone would get the source's
            // merged view bound in: never independent.
            return Err(Error::unsupported(format!(
                "sandbox {id} has a host-directory workspace, which clone does not copy yet"
            )));
        }
        self.check_not_paused(id)?;
        let docker = &self.inner.docker;
        let new = SandboxId::generate("docker");
        let services = crate::task::services_of(docker, id).await?;
        let result = async {
            let network = if services.is_empty() {
                None
            } else {
                let internal = docker
                    .inspect_network(
                        &crate::task::network_name(id),
                        None::<bollard::query_parameters::InspectNetworkOptions>,
                    )
                    .await
                    .map_err(|e| engine(format_args!("inspecting the network of {id}"), e))?
                    .internal
                    .unwrap_or(true);
                Some(crate::task::create_network(docker, &new, internal).await?)
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
            crate::hardening::record_label_keys(&mut new_labels, labels.keys());
            new_labels.extend(labels);
            let image = crate::task::commit(docker, id.as_str(), &new, None).await?;
            let mut body = crate::task::recreate_body(
                docker,
                id.as_str(),
                image,
                network.as_deref(),
                new_labels,
            )
            .await?;
            body.networking_config = network
                .as_deref()
                .map(|n| crate::task::endpoint(n, Vec::new()));
            let network = network.as_deref();
            let new = &new;
            let service_clones = services
                .iter()
                .map(|(container, service, host)| async move {
                    let image = crate::task::commit(docker, container, new, Some(service)).await?;
                    let mut body = crate::task::recreate_body(
                        docker,
                        container,
                        image,
                        network,
                        crate::task::service_labels(new, service),
                    )
                    .await?;
                    body.hostname = Some(host.clone());
                    body.networking_config = network
                        .map(|n| crate::task::endpoint(n, vec![host.clone(), service.clone()]));
                    crate::task::start_clone(
                        docker,
                        &crate::task::clone_service_container(new, service),
                        body,
                    )
                    .await
                });
            futures::future::try_join(
                crate::task::start_clone(docker, new.as_str(), body),
                futures::future::try_join_all(service_clones),
            )
            .await
            .map(|_| ())
        }
        .await;
        if let Err(e) = result {
            let _ = self.remove_container(new.as_str()).await;
            let _ = crate::task::teardown(docker, &new).await;
            return Err(e.context(format_args!("cloning sandbox {id}")));
        }
        self.inspect(&new).await
    }
}
