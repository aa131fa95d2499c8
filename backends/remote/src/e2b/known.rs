//! What an [`E2bBackend`](super::E2bBackend) knows of its sandboxes: the control
//! plane, each sandbox's envd client and spec (kept alive while in use), the mapping
//! between workspace paths and the VM's, and records made from the APIs' answers.

use std::collections::HashMap;
use std::sync::Arc;

use sandcell::{
    Error, ErrorKind, FileInfo, FileKind, Network, Result, SandboxId, SandboxInfo, SandboxPath,
    SandboxSpec, SandboxStatus,
};

use super::api::SandboxDetail;
use super::api_client::{ApiClient, REQUEST_METADATA};
use super::config::E2bConfig;
use super::envd::{file_type, EntryInfo};
use super::envd_client::EnvdClient;
use super::exec::EnvdLookup;
use crate::protocol::SPEC_METADATA;

/// What the backend knows: the control plane, and each sandbox's envd client and spec.
#[derive(Debug)]
pub(super) struct Sandboxes {
    pub(super) config: E2bConfig,
    pub(super) api: ApiClient,
    pub(super) client: reqwest::Client,
    pub(super) known: std::sync::Mutex<HashMap<SandboxId, Arc<Known>>>,
}

/// One sandbox as this client reaches it.
#[derive(Debug)]
pub(super) struct Known {
    pub(super) envd: EnvdClient,
    pub(super) spec: SandboxSpec,
    /// When this client last extended the sandbox's time.
    extended: std::sync::Mutex<std::time::Instant>,
}

impl Sandboxes {
    /// The envd client and spec of sandbox `id`: remembered, or looked up once.
    pub(super) async fn known(&self, id: &SandboxId) -> Result<Arc<Known>> {
        let cached = crate::lock(&self.known).get(id).cloned();
        if let Some(known) = cached {
            self.keep_alive(id, &known);
            return Ok(known);
        }
        let detail = self.api.get(id.as_str()).await?;
        self.remember(
            id,
            detail.envd_access_token.as_deref(),
            None,
            spec_of(&detail),
        )
    }

    /// A sandbox in use lives on: once half its time has passed since this client last
    /// set it, its timeout is set afresh (in the background, so no call waits on it).
    /// One left alone ends when its time is up, as E2B's own clients see it.
    pub(super) fn keep_alive(&self, id: &SandboxId, known: &Known) {
        let timeout = self.config.timeout;
        {
            let mut extended = crate::lock(&known.extended);
            if extended.elapsed() < timeout / 2 {
                return;
            }
            *extended = std::time::Instant::now();
        }
        let api = self.api.clone();
        let id = id.clone();
        let seconds = u32::try_from(timeout.as_secs()).unwrap_or(u32::MAX);
        tokio::spawn(async move {
            if let Err(e) = api.set_timeout(id.as_str(), seconds).await {
                tracing::debug!(sandbox = %id, error = %e, "extending an E2B sandbox's time");
            }
        });
    }

    pub(super) fn remember(
        &self,
        id: &SandboxId,
        token: Option<&str>,
        domain: Option<&str>,
        spec: SandboxSpec,
    ) -> Result<Arc<Known>> {
        let base = match &self.config.sandbox_url {
            Some(url) => url.clone(),
            None => format!(
                "https://{}-{id}.{}",
                super::envd::ENVD_PORT,
                domain.unwrap_or(&self.config.domain)
            ),
        };
        let envd = EnvdClient::new(
            self.client.clone(),
            base,
            id.clone(),
            token,
            &self.config.user,
            self.config.call_timeout,
        )?;
        let known = Arc::new(Known {
            envd,
            spec,
            extended: std::sync::Mutex::new(std::time::Instant::now()),
        });
        crate::lock(&self.known).insert(id.clone(), Arc::clone(&known));
        Ok(known)
    }

    pub(super) fn forget(&self, id: &SandboxId) {
        crate::lock(&self.known).remove(id);
    }

    /// The sandbox path of a workspace path.
    pub(super) fn path(&self, path: &SandboxPath) -> String {
        let root = self.config.workspace.trim_end_matches('/');
        if path.is_root() {
            root.to_owned()
        } else {
            format!("{root}/{}", path.as_str())
        }
    }

    /// The workspace path of a sandbox path envd reported.
    pub(super) fn workspace_path(&self, path: &str) -> Result<SandboxPath> {
        let root = self.config.workspace.trim_end_matches('/');
        let relative = path
            .strip_prefix(root)
            .filter(|rest| rest.is_empty() || rest.starts_with('/'))
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Backend,
                    format!("envd reported {path:?}, outside the workspace {root}"),
                )
            })?;
        SandboxPath::new(relative.trim_start_matches('/'))
    }
}

#[async_trait::async_trait]
impl EnvdLookup for Sandboxes {
    async fn envd_of(&self, id: &str) -> Result<(EnvdClient, String)> {
        let id = SandboxId::new(id)?;
        let known = self.known(&id).await?;
        Ok((known.envd.clone(), self.config.workspace.clone()))
    }
}

/// The spec sandcell stored in a sandbox's metadata (the defaults for one it did not
/// make).
pub(super) fn spec_of(detail: &SandboxDetail) -> SandboxSpec {
    let metadata = detail.metadata.clone().unwrap_or_default();
    match metadata
        .get(SPEC_METADATA)
        .and_then(|json| serde_json::from_str::<SandboxSpec>(json).ok())
    {
        Some(spec) => spec,
        None => {
            let mut spec = SandboxSpec::new(detail.template_id.clone());
            spec.network = Network::Full;
            spec
        }
    }
}

/// What sandcell knows of a sandbox from its detail.
pub(super) fn info_of(detail: &SandboxDetail) -> Result<SandboxInfo> {
    let id = SandboxId::new(detail.sandbox_id.clone()).map_err(|_| {
        Error::new(
            ErrorKind::Backend,
            format!(
                "E2B reported a sandbox id sandcell cannot use: {:?}",
                detail.sandbox_id
            ),
        )
    })?;
    let status = match detail.state.as_str() {
        "paused" => SandboxStatus::Paused,
        _ => SandboxStatus::Running,
    };
    let mut spec = spec_of(detail);
    // The rules in force, where the API reports them (a network update changes them,
    // not the metadata).
    if let Some(network) = &detail.network {
        if let Ok(now) = super::network::from_e2b(None, Some(network)) {
            spec.network = now;
        }
    }
    let mut info = SandboxInfo::new(id, "e2b", &spec, status);
    info.labels = detail
        .metadata
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, _)| k != SPEC_METADATA && k != REQUEST_METADATA)
        .collect();
    if let Ok(started) = chrono::DateTime::parse_from_rfc3339(&detail.started_at) {
        info.created_at = started.with_timezone(&chrono::Utc);
    }
    info.details = crate::details_of(&[
        ("template", &detail.template_id),
        ("end_at", &detail.end_at),
        ("envd_version", &detail.envd_version),
        ("state", &detail.state),
    ]);
    Ok(info)
}

/// A file's record from envd's entry.
pub(super) fn file_info(path: SandboxPath, entry: &EntryInfo) -> FileInfo {
    let kind = match entry.file_type.as_str() {
        file_type::DIRECTORY => FileKind::Dir,
        file_type::SYMLINK => FileKind::Symlink,
        file_type::FILE => FileKind::File,
        _ => FileKind::Other,
    };
    let size = if kind == FileKind::Dir {
        0
    } else {
        u64::try_from(entry.size).unwrap_or(0)
    };
    let mut info = FileInfo::new(path, kind, size, entry.mode);
    info.modified = entry
        .modified_time
        .as_deref()
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .map(|t| t.with_timezone(&chrono::Utc));
    info.symlink_target = entry.symlink_target.clone().filter(|t| !t.is_empty());
    info
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::{Http, Settings};

    #[test]
    fn workspace_paths_map_beneath_the_configured_home_and_nowhere_else() {
        let client = crate::http::client(None, None).unwrap();
        let sandboxes = Sandboxes {
            config: E2bConfig::new("k"),
            api: ApiClient::new(Arc::new(
                Http::with_auth(
                    "http://127.0.0.1:9",
                    (reqwest::header::HeaderName::from_static("x-api-key"), "k"),
                    Settings {
                        retry: crate::RetryPolicy::default(),
                        limits: crate::RateLimits::default(),
                        deadline: std::time::Duration::from_secs(1),
                        ca_certificate: None,
                        resolver: None,
                    },
                )
                .unwrap(),
            )),
            client,
            known: Default::default(),
        };
        let p = |s: &str| SandboxPath::new(s).unwrap();
        assert_eq!(sandboxes.path(&SandboxPath::root()), "/home/user");
        assert_eq!(sandboxes.path(&p("a/b")), "/home/user/a/b");
        assert_eq!(
            sandboxes.workspace_path("/home/user/a/b").unwrap(),
            p("a/b")
        );
        assert!(sandboxes.workspace_path("/home/user").unwrap().is_root());
        for outside in ["/home/userx/a", "/etc/passwd", "/home/user/../x"] {
            assert!(sandboxes.workspace_path(outside).is_err(), "{outside}");
        }
    }

    #[test]
    fn envd_entries_become_file_records() {
        let entry = EntryInfo {
            name: "l".to_owned(),
            file_type: file_type::SYMLINK.to_owned(),
            path: "/home/user/l".to_owned(),
            size: 4,
            mode: 0o120777,
            modified_time: Some("2026-01-02T03:04:05.5Z".to_owned()),
            symlink_target: Some("t".to_owned()),
            ..EntryInfo::default()
        };
        let info = file_info(SandboxPath::new("l").unwrap(), &entry);
        assert_eq!(info.kind, FileKind::Symlink);
        assert_eq!(info.mode, 0o777);
        assert_eq!(info.symlink_target.as_deref(), Some("t"));
        assert!(info.modified.is_some());
        let dir = EntryInfo {
            file_type: file_type::DIRECTORY.to_owned(),
            size: 4096,
            ..EntryInfo::default()
        };
        assert_eq!(file_info(SandboxPath::root(), &dir).size, 0);
    }
}
