//! What the backend reports: its capabilities, a sandbox's info (one, or every one a
//! selector matches) and its metrics.

use std::collections::{BTreeMap, HashMap};

use bollard::query_parameters::ListContainersOptions;
use sandcell::{
    Capabilities, Error, ErrorKind, LabelSelector, Result, SandboxId, SandboxInfo, SandboxStatus,
};

use super::{lock, DockerBackend};
use crate::error::engine;
use crate::hardening::{info_of, LABEL_EXEC, LABEL_TEMPLATE};

impl DockerBackend {
    /// See [`sandcell::SandboxBackend::capabilities`].
    pub(super) fn capabilities_now(&self) -> Capabilities {
        let mut caps = Capabilities::none();
        caps.shell = true;
        caps.pause = true;
        caps.reset = true;
        // Only a host-directory workspace has a change set; claimed when every template
        // has one (a sandbox of another template answers `Unsupported`).
        let config = &self.inner.config;
        caps.incremental_snapshot = !config.templates.is_empty()
            && config
                .templates
                .keys()
                .all(|t| config.host_workspaces.contains_key(t));
        caps.host_mounts = true;
        caps.read_only_mounts_enforced = true;
        caps.network_isolation = true;
        // A network of the sandbox's own needs the host's rules (`crate::firewall`);
        // without them only an operator's named network to share.
        caps.network_full =
            config.network.is_some() || (self.inner.local_engine && crate::firewall::available());
        // The agent relays to the egress proxy through a socket mounted from this host.
        caps.network_allowlist = self.inner.config.agent.is_some() && self.inner.local_engine;
        caps.network_update = caps.network_allowlist;
        caps.cpu_limit = true;
        caps.memory_limit = true;
        caps.pids_limit = true;
        caps.choose_user = true;
        caps.symlinks = true;
        // A paused container's agent is frozen: file operations need it running, so
        // the manager thaws a paused session around its snapshots.
        caps.files_while_paused = false;
        caps.interactive_exec = true;
        caps.port_exposure = true;
        caps.clone = true;
        // On a terminal the agent allocates inside the container, or the engine's TTY exec.
        caps.pty = true;
        // Watches and the workspace's bytes come from the agent.
        caps.watch = self.inner.config.agent.is_some();
        caps.metrics = self.inner.config.agent.is_some();
        // Known once every template's image is prepared (`prepare_images`, or the
        // creates that needed them): true when each has python3 on its PATH.
        let python = lock(&self.inner.python);
        caps.python = !self.inner.config.templates.is_empty()
            && self
                .inner
                .config
                .templates
                .keys()
                .all(|t| python.get(t) == Some(&true));
        caps
    }

    /// Sandbox `id` as the engine describes it; a container not of this backend is
    /// `NotFound`.
    pub(super) async fn describe(&self, id: &SandboxId) -> Result<SandboxInfo> {
        let container = self
            .inner
            .docker
            .inspect_container(id.as_str(), None)
            .await
            .map_err(|e| engine(format_args!("inspecting sandbox {id}"), e))?;
        let labels = container
            .config
            .as_ref()
            .and_then(|c| c.labels.clone())
            .unwrap_or_default();
        if !labels.contains_key(LABEL_TEMPLATE) {
            return Err(Error::not_found(format!(
                "container {id} is not a sandbox of this backend"
            )));
        }
        let state = container.state.as_ref();
        let status = status_of(
            state
                .and_then(|s| s.status)
                .map(|s| s.to_string())
                .as_deref(),
            state.and_then(|s| s.paused).unwrap_or(false),
        );
        let created_at = container
            .created
            .as_deref()
            .and_then(|c| chrono::DateTime::parse_from_rfc3339(c).ok())
            .map(|c| c.with_timezone(&chrono::Utc));
        let mut details = BTreeMap::new();
        if let Some(cid) = container.id {
            details.insert("container_id".to_owned(), cid);
        }
        if let Some(image) = container.config.and_then(|c| c.image) {
            details.insert("image".to_owned(), image);
        }
        details.insert(
            "exec".to_owned(),
            labels.get(LABEL_EXEC).cloned().unwrap_or_default(),
        );
        details.insert(
            "workspace".to_owned(),
            labels
                .get(crate::host_workspace::LABEL_WORKSPACE)
                .cloned()
                .unwrap_or_else(|| "image".to_owned()),
        );
        Ok(self.with_allowlist(info_of(id.clone(), labels, status, created_at, details)))
    }

    /// Every sandbox of this backend `selector` matches, by id.
    pub(super) async fn list_matching(&self, selector: &LabelSelector) -> Result<Vec<SandboxInfo>> {
        self.sweep_host_workspaces().await;
        let mut label_filters = vec![LABEL_TEMPLATE.to_owned()];
        label_filters.extend(selector.equals.iter().map(|(k, v)| format!("{k}={v}")));
        label_filters.extend(selector.exists.iter().cloned());
        let options = ListContainersOptions {
            all: true,
            filters: Some(HashMap::from([("label".to_owned(), label_filters)])),
            ..Default::default()
        };
        let containers = self
            .inner
            .docker
            .list_containers(Some(options))
            .await
            .map_err(|e| engine("listing sandboxes", e))?;
        let mut out = Vec::new();
        for c in containers {
            let Some(name) = c.names.as_ref().and_then(|n| n.first()) else {
                continue;
            };
            let Ok(id) = SandboxId::new(name.trim_start_matches('/')) else {
                continue;
            };
            let labels = c.labels.clone().unwrap_or_default();
            if !selector.matches(&labels.clone().into_iter().collect()) {
                continue;
            }
            let state = c.state.map(|s| s.to_string());
            let status = status_of(state.as_deref(), false);
            let created_at = c
                .created
                .and_then(|secs| chrono::DateTime::from_timestamp(secs, 0));
            let mut details = BTreeMap::new();
            if let Some(cid) = c.id {
                details.insert("container_id".to_owned(), cid);
            }
            out.push(self.with_allowlist(info_of(id, labels, status, created_at, details)));
        }
        out.sort_by(|a, b| a.id.as_str().cmp(b.id.as_str()));
        Ok(out)
    }

    /// See [`sandcell::SandboxBackend::metrics`] on [`DockerBackend`].
    pub(super) async fn measure(&self, id: &SandboxId) -> Result<sandcell::SandboxMetrics> {
        let client = self.client(id).await?;
        let docker = &self.inner.docker;
        let options = bollard::query_parameters::StatsOptions {
            stream: false,
            one_shot: true,
        };
        let stats = futures::StreamExt::next(&mut docker.stats(id.as_str(), Some(options)))
            .await
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Backend,
                    format!("the engine sent no stats for {id}"),
                )
            })?
            .map_err(|e| engine(format_args!("reading the stats of {id}"), e))?;
        let host = docker
            .inspect_container(id.as_str(), None)
            .await
            .map_err(|e| engine(format_args!("inspecting sandbox {id}"), e))?
            .host_config;
        let mut metrics = client.metrics().await?;
        metrics.egress = self.inner.egress.counts(id);
        metrics.cpu_time = stats
            .cpu_stats
            .and_then(|c| c.cpu_usage)
            .and_then(|u| u.total_usage)
            .map(std::time::Duration::from_nanos);
        metrics.memory_bytes = stats.memory_stats.and_then(|m| m.usage);
        metrics.processes = stats.pids_stats.and_then(|p| p.current);
        metrics.memory_limit_bytes = host
            .and_then(|h| h.memory)
            .filter(|m| *m > 0)
            .and_then(|m| u64::try_from(m).ok());
        Ok(metrics)
    }
}

fn status_of(state: Option<&str>, paused: bool) -> SandboxStatus {
    match state {
        _ if paused => SandboxStatus::Paused,
        Some("paused") => SandboxStatus::Paused,
        Some("running") | Some("restarting") | Some("created") => SandboxStatus::Running,
        _ => SandboxStatus::Failed,
    }
}
