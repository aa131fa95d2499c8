//! The container a sandbox is, hardened: the labels that record its settings, its
//! keep-alive command, and a host configuration that drops every capability, forbids
//! new privileges, applies the spec's limits and network, and keeps the agent's protocol
//! stream out of the engine's logs.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use bollard::models::{ContainerCreateBody, HostConfig, ResourcesUlimits};
use sandcell::{Network, SandboxId, SandboxInfo, SandboxSpec, SandboxStatus};

use crate::config::DockerConfig;
use crate::image::{AGENT_PATH, AGENT_RUN_DIR};

/// Labels this backend puts on its containers (reported labels leave them out).
pub(crate) const INTERNAL_PREFIX: &str = "sandcell.docker.";
/// The template a container was made from; its presence marks containers of this backend.
pub(crate) const LABEL_TEMPLATE: &str = "sandcell.docker.template";
/// `agent` or `engine`: how commands reach the container.
pub(crate) const LABEL_EXEC: &str = "sandcell.docker.exec";
pub(crate) const LABEL_OUTPUT_BYTES: &str = "sandcell.docker.output_bytes";
pub(crate) const LABEL_COMMAND_TIMEOUT_MS: &str = "sandcell.docker.command_timeout_ms";
/// The sandbox's network policy (`Network::mode`), reported by `inspect`.
pub(crate) const LABEL_NETWORK: &str = "sandcell.docker.network";
/// The keys of the spec's labels, as a JSON array: a container's labels also hold its
/// image's (Podman's builds label every image), which are not the sandbox's.
pub(crate) const LABEL_KEYS: &str = "sandcell.docker.label_keys";

/// Refuses labels under [`INTERNAL_PREFIX`]: the backend reads its own settings from
/// them (the output cap, the host workspace's directory, the task a container belongs
/// to), so a spec's label there would be taken for the backend's own.
pub(crate) fn refuse_internal_labels<'a>(
    keys: impl IntoIterator<Item = &'a String>,
) -> sandcell::Result<()> {
    match keys.into_iter().find(|k| k.starts_with(INTERNAL_PREFIX)) {
        Some(key) => Err(sandcell::Error::invalid_input(format!(
            "label {key:?} is reserved: labels beginning with {INTERNAL_PREFIX:?} are the docker backend's own"
        ))),
        None => Ok(()),
    }
}

/// Records which of a container's labels are the sandbox's own.
pub(crate) fn record_label_keys<'a>(
    labels: &mut HashMap<String, String>,
    keys: impl IntoIterator<Item = &'a String>,
) {
    let keys: Vec<&String> = keys.into_iter().collect();
    let json = serde_json::to_string(&keys).unwrap_or_else(|_| "[]".to_owned());
    labels.insert(LABEL_KEYS.to_owned(), json);
}
/// What a container's labels say about how to run commands in it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ContainerSettings {
    pub(crate) agent: bool,
    pub(crate) output_bytes: Option<usize>,
    pub(crate) command_timeout: Option<Duration>,
    /// Created with `Network::Allowlist`: its way out is an egress proxy on this host.
    pub(crate) allowlist: bool,
    /// Its workspace is an overlay of a host directory (`crate::host_workspace`).
    pub(crate) host_workspace: bool,
}

impl ContainerSettings {
    /// The settings a container's labels record; `None` for a container this backend
    /// did not make.
    pub(crate) fn from_labels(labels: &HashMap<String, String>) -> Option<Self> {
        if !labels.contains_key(LABEL_TEMPLATE) {
            return None;
        }
        Some(ContainerSettings {
            agent: labels.get(LABEL_EXEC).map(String::as_str) == Some("agent"),
            output_bytes: labels.get(LABEL_OUTPUT_BYTES).and_then(|v| v.parse().ok()),
            command_timeout: labels
                .get(LABEL_COMMAND_TIMEOUT_MS)
                .and_then(|v| v.parse().ok())
                .map(Duration::from_millis),
            allowlist: labels.get(LABEL_NETWORK).map(String::as_str) == Some("allowlist"),
            host_workspace: labels
                .get(crate::host_workspace::LABEL_WORKSPACE)
                .map(String::as_str)
                == Some("overlay"),
        })
    }
}

/// The container for a sandbox from `spec` (already prepared: `Network::Default`
/// resolved, unclaimed fields refused) on `image`, joined to `task_network` when it has
/// service containers; `egress_dir` is the host directory of an allowlisted sandbox's
/// egress proxy, mounted in, with the agent told to relay to it; `ulimits` are the
/// resource limits set explicitly (see [`crate::ulimits`]).
pub(crate) fn container_body(
    spec: &SandboxSpec,
    config: &DockerConfig,
    image: String,
    task_network: Option<&crate::task_network::TaskNetwork>,
    egress_dir: Option<&std::path::Path>,
    ulimits: Option<&[ResourcesUlimits]>,
) -> ContainerCreateBody {
    let limits = &spec.limits;
    let mut labels: HashMap<String, String> = spec
        .labels
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    record_label_keys(&mut labels, spec.labels.keys());
    labels.insert(LABEL_TEMPLATE.to_owned(), spec.template.clone());
    let agent = config.agent.is_some();
    labels.insert(
        LABEL_EXEC.to_owned(),
        if agent { "agent" } else { "engine" }.to_owned(),
    );
    labels.insert(LABEL_NETWORK.to_owned(), spec.network.mode().to_owned());
    if let Some(n) = limits.output_bytes {
        labels.insert(LABEL_OUTPUT_BYTES.to_owned(), n.to_string());
    }
    if let Some(t) = spec.command_timeout {
        labels.insert(
            LABEL_COMMAND_TIMEOUT_MS.to_owned(),
            t.as_millis().to_string(),
        );
    }
    let cmd: Vec<String> = if agent {
        vec![
            AGENT_PATH.to_owned(),
            "serve".to_owned(),
            "--workspace".to_owned(),
            config.workspace.as_str().to_owned(),
            "--state".to_owned(),
            format!("{AGENT_RUN_DIR}/state"),
            "--socket".to_owned(),
            crate::agent::SOCKET.to_owned(),
            "--stdio".to_owned(),
        ]
        .into_iter()
        .chain(
            egress_dir
                .is_some()
                .then(|| ["--egress".to_owned(), crate::egress::agent_argument()])
                .into_iter()
                .flatten(),
        )
        .collect()
    } else {
        // Any image with a `sleep` stays up; the init process forwards SIGTERM.
        vec!["sleep".to_owned(), "2147483647".to_owned()]
    };
    // `SandboxSpec::prepare` resolved `Default` and refused what is not claimed.
    let network_mode = match (&spec.network, task_network) {
        (_, Some(network)) => network.name.clone(),
        // Only where the operator named a network to share: otherwise a full network
        // is the sandbox's own (`task_network`).
        (Network::Full, None) => config.network.clone().unwrap_or_else(|| "none".to_owned()),
        (_, None) => "none".to_owned(),
    };
    let mut binds: Vec<String> = spec
        .mounts
        .iter()
        .map(|m| {
            let target = format!("{}/{}", config.workspace.as_str(), m.target.as_str());
            let mode = if m.read_only { "ro" } else { "rw" };
            format!("{}:{target}:{mode}", m.host.display())
        })
        .collect();
    let mut env: Vec<String> = spec.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    if let Some(dir) = egress_dir {
        binds.push(format!(
            "{}:{}:ro",
            dir.display(),
            crate::egress::CONTAINER_DIR
        ));
        // The spec's own settings come later and win.
        let proxy = sandcell::raw::egress::proxy_env(crate::egress::LISTEN);
        env.splice(0..0, proxy.into_iter().map(|(k, v)| format!("{k}={v}")));
    }
    let user = spec.user.clone().or_else(|| config.user.clone());
    let host_config = HostConfig {
        cap_drop: Some(vec!["ALL".to_owned()]),
        security_opt: Some(vec!["no-new-privileges".to_owned()]),
        pids_limit: limits.pids.map(i64::from),
        memory: limits.memory_bytes.map(|m| m as i64),
        // No swap beyond the memory limit.
        memory_swap: limits.memory_bytes.map(|m| m as i64),
        nano_cpus: limits.cpu_millis.map(|m| i64::from(m) * 1_000_000),
        network_mode: Some(network_mode),
        extra_hosts: task_network.map(crate::task_network::TaskNetwork::hosts),
        dns: task_network.and_then(crate::task_network::TaskNetwork::dns),
        init: Some(true),
        runtime: config.runtime.clone(),
        ulimits: ulimits.map(<[ResourcesUlimits]>::to_vec),
        binds: (!binds.is_empty()).then_some(binds),
        // The agent's stdout is a protocol stream (files, archives): never log it.
        log_config: agent.then(|| bollard::models::HostConfigLogConfig {
            typ: Some("none".to_owned()),
            config: None,
        }),
        ..Default::default()
    };
    let body = ContainerCreateBody {
        image: Some(image),
        cmd: Some(cmd),
        entrypoint: Some(Vec::new()),
        working_dir: Some(config.workspace.as_str().to_owned()),
        user: user.clone(),
        env: Some(env),
        labels: Some(labels),
        host_config: Some(host_config),
        networking_config: task_network.map(crate::task_network::TaskNetwork::sandbox_endpoint),
        // The agent serves its stdin and stdout to whoever attaches first.
        open_stdin: Some(agent),
        stdin_once: Some(agent),
        ..Default::default()
    };
    body
}

/// A sandbox as its container's labels describe it (internal labels left out).
pub(crate) fn info_of(
    id: SandboxId,
    labels: HashMap<String, String>,
    status: SandboxStatus,
    created_at: Option<chrono::DateTime<chrono::Utc>>,
    details: BTreeMap<String, String>,
) -> SandboxInfo {
    let template = labels.get(LABEL_TEMPLATE).cloned().unwrap_or_default();
    let mut spec = SandboxSpec::new(template);
    spec.network = match labels.get(LABEL_NETWORK).map(String::as_str) {
        Some("full") => Network::Full,
        Some("none") => Network::None,
        Some("allowlist") => Network::Allowlist(Vec::new()),
        _ => Network::Default,
    };
    // Containers made before the keys were recorded report every label but ours.
    let own: Option<std::collections::HashSet<String>> = labels
        .get(LABEL_KEYS)
        .and_then(|keys| serde_json::from_str(keys).ok());
    spec.labels = labels
        .into_iter()
        .filter(|(k, _)| !k.starts_with(INTERNAL_PREFIX))
        .filter(|(k, _)| own.as_ref().is_none_or(|own| own.contains(k)))
        .collect();
    let mut info = SandboxInfo::new(id, "docker", &spec, status);
    if let Some(at) = created_at {
        info.created_at = at;
    }
    info.details = details;
    info
}
