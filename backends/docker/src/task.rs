//! Multi-container sandboxes: service containers on a private network of their sandbox,
//! created in parallel with it and torn down with it; and clones of whole sandboxes.

use std::collections::HashMap;

use bollard::models::{ContainerCreateBody, HostConfig};
use bollard::query_parameters::{
    CommitContainerOptions, CreateContainerOptions, ListContainersOptions, RemoveContainerOptions,
    RemoveImageOptions,
};
use bollard::Docker;
use sandcell::{Result, SandboxId};

use crate::config::SidecarSpec;
use crate::error::{engine, is_not_found};
use crate::task_network::{network_name, TaskNetwork};

/// On service containers and task networks: the sandbox they belong to.
pub(crate) const LABEL_TASK: &str = "sandcell.docker.task";
/// On service containers: the service's name.
const LABEL_SERVICE: &str = "sandcell.docker.service";
/// On clone images: the sandbox they were made for.
const CLONE_REPO: &str = "sandcell-clone";

fn service_container(id: &SandboxId, service: &str) -> String {
    format!("{id}-{service}")
}

/// Creates and starts service `index` of sandbox `id` from `image`.
pub(crate) async fn start_service(
    docker: &Docker,
    id: &SandboxId,
    network: &TaskNetwork,
    index: usize,
    service: &SidecarSpec,
    image: String,
    ulimits: Option<&[bollard::models::ResourcesUlimits]>,
) -> Result<()> {
    let name = service_container(id, &service.name);
    let body = ContainerCreateBody {
        image: Some(image),
        hostname: Some(service.host().to_owned()),
        cmd: service.cmd.clone(),
        env: Some(
            service
                .env
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect(),
        ),
        labels: Some(HashMap::from([
            (LABEL_TASK.to_owned(), id.to_string()),
            (LABEL_SERVICE.to_owned(), service.name.clone()),
        ])),
        // Services keep the engine's default capabilities (a database's entrypoint
        // changes owners and users) but raw sockets, with which a service a sandbox
        // took over could forge packets, and never gain more.
        host_config: Some(HostConfig {
            security_opt: Some(vec!["no-new-privileges".to_owned()]),
            cap_drop: Some(vec!["NET_RAW".to_owned()]),
            network_mode: Some(network.name.clone()),
            extra_hosts: Some(network.hosts()),
            dns: network.dns(),
            init: Some(true),
            ulimits: ulimits.map(<[_]>::to_vec),
            ..Default::default()
        }),
        networking_config: Some(
            network.service_endpoint(index, vec![service.host().to_owned(), service.name.clone()]),
        ),
        ..Default::default()
    };
    create_and_start(docker, &name, body)
        .await
        .map_err(|e| e.context(format_args!("service {} of sandbox {id}", service.name)))
}

async fn create_and_start(docker: &Docker, name: &str, body: ContainerCreateBody) -> Result<()> {
    docker
        .create_container(
            Some(CreateContainerOptions {
                name: Some(name.to_owned()),
                ..Default::default()
            }),
            body,
        )
        .await
        .map_err(|e| engine(format_args!("creating container {name}"), e))?;
    docker
        .start_container(name, None)
        .await
        .map_err(|e| engine(format_args!("starting container {name}"), e))
}

/// Removes the services, the network and the clone images of sandbox `id`; whatever is
/// already gone is fine.
pub(crate) async fn teardown(docker: &Docker, id: &SandboxId) -> Result<()> {
    let services = docker
        .list_containers(Some(ListContainersOptions {
            all: true,
            filters: Some(HashMap::from([(
                "label".to_owned(),
                vec![format!("{LABEL_TASK}={id}")],
            )])),
            ..Default::default()
        }))
        .await
        .map_err(|e| engine(format_args!("listing the services of sandbox {id}"), e))?;
    let removals = services
        .into_iter()
        .filter_map(|c| c.id)
        .map(|cid| async move {
            match docker
                .remove_container(
                    &cid,
                    Some(RemoveContainerOptions {
                        force: true,
                        v: true,
                        ..Default::default()
                    }),
                )
                .await
            {
                Err(e) if !is_not_found(&e) => Err(engine("removing a service container", e)),
                _ => Ok(()),
            }
        });
    futures::future::try_join_all(removals).await?;
    match docker.remove_network(&network_name(id)).await {
        Err(e) if !is_not_found(&e) => {
            return Err(engine(
                format_args!("removing the network of sandbox {id}"),
                e,
            ))
        }
        Err(_) => {}
        Ok(()) => {
            let bridge = crate::firewall::bridge_name(id);
            let _ = tokio::task::spawn_blocking(move || crate::firewall::release(&bridge)).await;
        }
    }
    // Clone images: one per container of a cloned sandbox; in use by nothing now.
    let images = docker
        .list_images(Some(bollard::query_parameters::ListImagesOptions {
            filters: Some(HashMap::from([(
                "reference".to_owned(),
                vec![format!("{CLONE_REPO}:{id}*")],
            )])),
            ..Default::default()
        }))
        .await
        .map_err(|e| engine("listing clone images", e))?;
    for image in images {
        for tag in image.repo_tags {
            let _ = docker
                .remove_image(&tag, None::<RemoveImageOptions>, None)
                .await;
        }
    }
    Ok(())
}

/// Commits container `name` to a clone image `sandcell-clone:<new>[-<suffix>]`.
pub(crate) async fn commit(
    docker: &Docker,
    name: &str,
    new: &SandboxId,
    suffix: Option<&str>,
) -> Result<String> {
    let tag = match suffix {
        Some(s) => format!("{new}-{s}"),
        None => new.to_string(),
    };
    let mut attempt = 0;
    loop {
        let committed = docker
            .commit_container(
                CommitContainerOptions {
                    container: Some(name.to_owned()),
                    repo: Some(CLONE_REPO.to_owned()),
                    tag: Some(tag.clone()),
                    pause: true,
                    ..Default::default()
                },
                bollard::models::ContainerConfig::default(),
            )
            .await;
        match committed {
            Ok(_) => return Ok(format!("{CLONE_REPO}:{tag}")),
            // The runtime's freezer can fail to pause a busy container in time (runc
            // under Podman on a loaded cgroup v1 host); nothing was committed then.
            Err(e) if attempt < 2 && e.to_string().contains("pausing container") => {
                attempt += 1;
                tokio::time::sleep(std::time::Duration::from_millis(250 * attempt)).await;
            }
            Err(e) => return Err(engine(format_args!("committing {name}"), e)),
        }
    }
}

/// The create body that recreates container `name` from `image` under the new name,
/// on `network` when the sandbox has one.
pub(crate) async fn recreate_body(
    docker: &Docker,
    name: &str,
    image: String,
    network: Option<&TaskNetwork>,
    labels: HashMap<String, String>,
) -> Result<ContainerCreateBody> {
    let c = docker
        .inspect_container(name, None)
        .await
        .map_err(|e| engine(format_args!("inspecting {name}"), e))?;
    let config = c.config.unwrap_or_default();
    let mut host = c.host_config.unwrap_or_default();
    host.ulimits = host.ulimits.map(crate::ulimits::as_create_takes);
    if let Some(network) = network {
        host.network_mode = Some(network.name.clone());
        host.extra_hosts = Some(network.hosts());
        host.dns = network.dns();
    }
    Ok(ContainerCreateBody {
        image: Some(image),
        hostname: config.hostname.filter(|_| network.is_some()),
        cmd: config.cmd,
        entrypoint: Some(config.entrypoint.unwrap_or_default()),
        env: config.env,
        user: config.user,
        working_dir: config.working_dir,
        labels: Some(labels),
        host_config: Some(host),
        ..Default::default()
    })
}

/// Creates and starts a clone container.
pub(crate) async fn start_clone(
    docker: &Docker,
    name: &str,
    body: ContainerCreateBody,
) -> Result<()> {
    create_and_start(docker, name, body).await
}

/// The services of sandbox `id`: (container name, service name, host name).
pub(crate) async fn services_of(
    docker: &Docker,
    id: &SandboxId,
) -> Result<Vec<(String, String, String)>> {
    let list = docker
        .list_containers(Some(ListContainersOptions {
            all: true,
            filters: Some(HashMap::from([(
                "label".to_owned(),
                vec![format!("{LABEL_TASK}={id}")],
            )])),
            ..Default::default()
        }))
        .await
        .map_err(|e| engine(format_args!("listing the services of sandbox {id}"), e))?;
    let mut out = Vec::new();
    for c in list {
        let labels = c.labels.unwrap_or_default();
        let Some(service) = labels.get(LABEL_SERVICE) else {
            continue;
        };
        let name = c
            .names
            .and_then(|n| n.first().cloned())
            .unwrap_or_default()
            .trim_start_matches('/')
            .to_owned();
        let host = docker
            .inspect_container(&name, None)
            .await
            .ok()
            .and_then(|i| i.config)
            .and_then(|c| c.hostname)
            .unwrap_or_else(|| service.clone());
        out.push((name, service.clone(), host));
    }
    Ok(out)
}

/// The labels of a clone's service container.
pub(crate) fn service_labels(new: &SandboxId, service: &str) -> HashMap<String, String> {
    HashMap::from([
        (LABEL_TASK.to_owned(), new.to_string()),
        (LABEL_SERVICE.to_owned(), service.to_owned()),
    ])
}

/// The name of a clone's service container.
pub(crate) fn clone_service_container(new: &SandboxId, service: &str) -> String {
    service_container(new, service)
}
