//! Making and removing a sandbox's container: its body as the hardening decides it,
//! the user it runs as (never host root unless allowed), its host workspace and
//! egress proxy, all undone when any step fails; and host workspaces whose container
//! is gone.

use std::sync::Arc;

use bollard::query_parameters::{
    CreateContainerOptions, RemoveContainerOptions, UploadToContainerOptions,
};
use sandcell::{Error, ErrorKind, Result, SandboxId, SandboxSpec};

use super::{lock, DockerBackend};
use crate::error::{engine, is_not_found};

impl DockerBackend {
    /// Removes a container and whatever it holds; gone already is fine.
    pub(super) async fn remove_container(&self, id: &str) -> Result<()> {
        match self
            .inner
            .docker
            .remove_container(
                id,
                Some(RemoveContainerOptions {
                    force: true,
                    v: true,
                    ..Default::default()
                }),
            )
            .await
        {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) if e.to_string().contains("already in progress") => Ok(()),
            Err(e) => Err(engine(format_args!("removing sandbox {id}"), e)),
        }
    }

    /// Makes the workspace directory, owned by the container's user, before start.
    pub(super) async fn prepare_workspace(&self, id: &SandboxId, user: Option<&str>) -> Result<()> {
        let owner = crate::user::resolve(&self.inner.docker, id.as_str(), user).await?;
        let layer = crate::image::Layer {
            agent: None,
            user: user.map(str::to_owned),
            workspace: self.workspace().to_owned(),
        };
        let tar = crate::image::layer_tar(&layer, owner)?;
        self.inner
            .docker
            .upload_to_container(
                id.as_str(),
                Some(UploadToContainerOptions {
                    path: "/".to_owned(),
                    ..Default::default()
                }),
                bollard::body_full(tar.into()),
            )
            .await
            .map_err(|e| engine("creating the workspace", e))
    }

    pub(super) async fn create_container(
        &self,
        id: &SandboxId,
        spec: &SandboxSpec,
        image: String,
        task_network: Option<&crate::task_network::TaskNetwork>,
    ) -> Result<()> {
        let config = &self.inner.config;
        let agent = config.agent.is_some();
        let egress_dir = match &spec.network {
            sandcell::Network::Allowlist(entries) => {
                crate::egress::serve(
                    &self.inner.egress,
                    &config.runtime_dir,
                    id,
                    entries,
                    &config.egress_hosts,
                )?;
                Some(crate::egress::host_dir(&config.runtime_dir, id))
            }
            _ => None,
        };
        let ulimits = self.ulimits().await;
        let body = crate::hardening::container_body(
            spec,
            config,
            image,
            task_network,
            egress_dir.as_deref(),
            ulimits,
        );
        let mut body = body;
        if body.user.is_none() {
            let docker = &self.inner.docker;
            body.user = self
                .inner
                .root
                .default_user(docker, &body.image.clone().unwrap_or_default(), None)
                .await?;
        }
        // The user the container runs as, as the hardening chose it.
        let user = body.user.clone();
        let host_workspace = match config.host_workspaces.get(&spec.template) {
            Some(_) if !self.inner.local_engine => {
                crate::egress::remove(&self.inner.egress, &config.runtime_dir, id);
                return Err(Error::unsupported(format!(
                    "template {:?} has a host-directory workspace, which needs the engine on this host (a unix socket), not over TCP",
                    spec.template
                )));
            }
            Some(lower) => {
                let ws = crate::host_workspace::HostWorkspace::of(&config.runtime_dir, id);
                if let Err(e) = std::fs::create_dir_all(ws.merged()) {
                    crate::egress::remove(&self.inner.egress, &config.runtime_dir, id);
                    return Err(Error::io("creating the workspace's mount point", e));
                }
                if let Some(labels) = body.labels.as_mut() {
                    labels.insert(
                        crate::host_workspace::LABEL_WORKSPACE.to_owned(),
                        "overlay".to_owned(),
                    );
                }
                if let Some(host) = body.host_config.as_mut() {
                    host.binds
                        .get_or_insert_with(Vec::new)
                        .push(ws.bind(&config.workspace));
                }
                Some((ws, lower.clone()))
            }
            None => None,
        };
        let created = self
            .inner
            .docker
            .create_container(
                Some(CreateContainerOptions {
                    name: Some(id.as_str().to_owned()),
                    ..Default::default()
                }),
                body,
            )
            .await
            .map_err(|e| engine(format_args!("creating sandbox {id}"), e));
        if let Err(e) = created {
            crate::egress::remove(&self.inner.egress, &config.runtime_dir, id);
            if let Some((ws, _)) = &host_workspace {
                let _ = ws.remove();
            }
            return Err(e);
        }
        let started = async {
            // As created (the image's files, no command has run yet): the user's ids.
            let docker = &self.inner.docker;
            self.inner
                .root
                .check(docker, id.as_str(), user.as_deref())
                .await?;
            // The overlay goes on the mount point before start, which binds it.
            if let Some((ws, lower)) = &host_workspace {
                let owner =
                    crate::user::resolve(&self.inner.docker, id.as_str(), user.as_deref()).await?;
                let (ws, lower) = (ws.clone(), lower.clone());
                let engine = self.engine_id().await;
                tokio::task::spawn_blocking(move || ws.mount(&lower, owner, engine.as_deref()))
                    .await
                    .map_err(|e| {
                        Error::with_source(ErrorKind::Backend, "mounting the workspace failed", e)
                    })??;
            }
            // The image's layer made the workspace for the configured user; a spec
            // asking for another user gets it re-owned before start.
            if spec.user.is_some() && spec.user != config.user {
                self.prepare_workspace(id, user.as_deref()).await?;
            }
            // Attach before start, never beside it: Podman readies a created container
            // for an attach itself, and a start racing that fails with "container state
            // improper". The protocol is client-first, so nothing is missed meanwhile.
            let attached = match agent {
                true => Some(crate::agent::attach(&self.inner.docker, id).await?),
                false => None,
            };
            self.inner
                .docker
                .start_container(id.as_str(), None)
                .await
                .map_err(|e| engine(format_args!("starting sandbox {id}"), e))?;
            if let Some(client) = attached {
                let cell = Arc::new(tokio::sync::Mutex::new(Some(client)));
                lock(&self.inner.clients).insert(id.clone(), cell);
            }
            Ok(())
        }
        .await;
        if let Err(e) = started {
            let _ = self.remove_container(id.as_str()).await;
            crate::egress::remove(&self.inner.egress, &config.runtime_dir, id);
            if let Some((ws, _)) = &host_workspace {
                let _ = ws.remove();
            }
            return Err(e);
        }
        Ok(())
    }

    /// Once per process, at its first create or list: removes the host workspaces of
    /// containers that no longer exist (a crash between mount and create, or a
    /// container removed behind this backend's back). Failures are logged; the next
    /// process tries again.
    ///
    /// Only this engine's workspaces (marked with its id at mount): another program
    /// on another engine may share the runtime directory, and its containers are not
    /// this engine's to find.
    pub(super) async fn sweep_host_workspaces(&self) {
        self.inner
            .swept
            .get_or_init(|| async {
                let Some(engine) = self.engine_id().await else {
                    return;
                };
                let runtime = self.inner.config.runtime_dir.clone();
                for (id, ws) in crate::host_workspace::sweep_candidates(&runtime, &engine) {
                    match self.inner.docker.inspect_container(id.as_str(), None).await {
                        Err(e) if is_not_found(&e) => {
                            if let Err(e) = ws.remove() {
                                tracing::warn!(sandbox = %id, error = %e, "could not remove a stale host workspace");
                            } else {
                                tracing::info!(sandbox = %id, "removed a host workspace whose container is gone");
                            }
                        }
                        _ => {}
                    }
                }
            })
            .await;
    }

    /// What tells this engine from another on this host, read once: its data root
    /// (Podman's `info` id changes at every call; Docker's root is as much its own).
    /// `None` where it gives none.
    pub(super) async fn engine_id(&self) -> Option<String> {
        self.inner
            .engine_id
            .get_or_init(|| async {
                let info = self.inner.docker.info().await.ok()?;
                info.docker_root_dir.filter(|root| !root.is_empty())
            })
            .await
            .clone()
    }
}
