//! [`E2bBackend`]: sandboxes on E2B (or anything speaking its APIs, like
//! sandcell-server): lifecycle over the control plane, commands and files over envd.

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use sandcell::archive::ImportOptions;
use sandcell::{
    ByteStream, Capabilities, DirEntry, Error, ErrorKind, ExecRequest, FileInfo, FileKind,
    LabelSelector, Network, Process, Result, SandboxBackend, SandboxId, SandboxInfo,
    SandboxMetrics, SandboxPath, SandboxSpec, WatchEvent, WatchEventKind, WatchOptions,
    WatchStream,
};

use super::api::NewSandbox;
use super::api_client::{ApiClient, REQUEST_METADATA};
use super::config::E2bConfig;
use super::envd::{
    event_type, EntryInfo, EntryResponse, ListDirRequest, ListDirResponse, MoveRequest,
    PathRequest, WatchDirMessage, WatchDirRequest,
};
use super::envd_client::EnvdClient;
use super::exec::{BufferedEnvd, EnvdLookup};
use super::known::{file_info, info_of, Sandboxes};
use crate::exec_files::ExecFiles;
use crate::http::{Http, Settings};
use crate::protocol::SPEC_METADATA;

/// Sandboxes on E2B: created from a template with a timeout, metadata (the spec's
/// labels) and environment; listed by metadata; paused, resumed and killed through the
/// control plane. Commands run through envd's process service (streamed output, stdin,
/// signals, terminals); files go through envd's file calls, archives through `tar` in
/// the sandbox (checked on this side before any byte goes in).
///
/// The workspace is [`E2bConfig::workspace`] (`/home/user`). The sandbox is E2B's
/// whole VM, its isolation boundary: paths are confined beneath the workspace by
/// name, and symlinks within it are the sandbox's own business (a self-hosted
/// sandcell-server refuses the ones that lead out, as its backend does).
///
/// A spec's `workdir`, `command_timeout` and `output_bytes` are kept in the sandbox's
/// metadata and applied by this client; E2B sets CPU, memory and disk by template.
///
/// ```no_run
/// # async fn demo() -> sandcell::Result<()> {
/// use sandcell::{ExecRequest, SandboxBackend, SandboxBackendExt, SandboxSpec};
/// use sandcell_remote::e2b::{E2bBackend, E2bConfig};
///
/// let key = std::env::var("E2B_API_KEY").unwrap_or_default();
/// let backend = E2bBackend::connect(E2bConfig::new(key)).await?;
/// let sandbox = backend.create(&SandboxSpec::new("default")).await?;
/// let out = backend.run(&sandbox.id, ExecRequest::new(["echo", "hi"])).await?;
/// assert_eq!(out.stdout_str(), "hi\n");
/// backend.destroy(&sandbox.id).await
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct E2bBackend {
    inner: Arc<Sandboxes>,
    files: ExecFiles,
}

impl E2bBackend {
    /// An async factory for [`sandcell::BackendRegistry::register_async`]: the options
    /// are an [`E2bConfig`], except that the key may instead be named by `api_key_env`,
    /// an environment variable holding it (`E2B_API_KEY` when neither is given).
    ///
    /// ```
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let registry = sandcell::BackendRegistry::new()
    ///     .register_async("e2b", sandcell_remote::e2b::E2bBackend::from_options);
    /// let options = serde_json::json!({"api_key_env": "NO_SUCH_VAR_SET", "template": "base"});
    /// let err = registry.build_async("e2b", options).await.unwrap_err();
    /// assert_eq!(err.kind(), sandcell::ErrorKind::InvalidInput);
    /// assert!(err.to_string().contains("NO_SUCH_VAR_SET"), "{err}");
    /// # });
    /// ```
    pub fn from_options(options: serde_json::Value) -> sandcell::config::BackendFuture {
        Box::pin(async move {
            let mut options = options;
            crate::secret_from_env(&mut options, "e2b", "api_key", Some("E2B_API_KEY"))?;
            let config: E2bConfig = sandcell::config::backend_options("e2b", options)?;
            let backend: Box<dyn SandboxBackend> = Box::new(E2bBackend::connect(config).await?);
            Ok(backend)
        })
    }

    /// A backend for `config`. Nothing is called yet: the first call finds out whether
    /// the endpoint answers.
    pub async fn connect(config: E2bConfig) -> Result<Self> {
        config.check()?;
        let resolver = config.domain_ip.map(|ip| {
            Arc::new(crate::http::DomainResolver {
                domain: config.domain_host().to_ascii_lowercase(),
                ip,
            })
        });
        let settings = Settings {
            retry: config.retry,
            limits: crate::RateLimits::default(),
            deadline: config.call_timeout,
            ca_certificate: config.ca_certificate.as_deref(),
            resolver,
        };
        let http = Arc::new(Http::with_auth(
            &config.api_base(),
            (
                reqwest::header::HeaderName::from_static("x-api-key"),
                &config.api_key,
            ),
            settings,
        )?);
        let inner = Arc::new(Sandboxes {
            client: http.client().clone(),
            api: ApiClient::new(http),
            config,
            known: Default::default(),
        });
        let lookup: Arc<dyn EnvdLookup> = Arc::clone(&inner) as Arc<dyn EnvdLookup>;
        let files = ExecFiles::new(Arc::new(BufferedEnvd { lookup }), String::new());
        Ok(E2bBackend { inner, files })
    }

    /// Sets sandbox `id` to end `timeout` from now (E2B counts whole seconds, at
    /// least one). The backend extends sandboxes in use by itself; this is for a
    /// caller that wants one to outlive a pause in its use.
    pub async fn set_timeout(&self, id: &SandboxId, timeout: std::time::Duration) -> Result<()> {
        let seconds = u32::try_from(timeout.as_secs().max(1)).unwrap_or(u32::MAX);
        self.inner.api.set_timeout(id.as_str(), seconds).await
    }

    async fn envd(&self, id: &SandboxId) -> Result<EnvdClient> {
        Ok(self.inner.known(id).await?.envd.clone())
    }

    async fn entry(&self, id: &SandboxId, path: &SandboxPath) -> Result<EntryInfo> {
        let request = PathRequest {
            path: self.inner.path(path),
        };
        let answer: EntryResponse = self
            .envd(id)
            .await?
            .unary("filesystem.Filesystem/Stat", &request)
            .await?;
        Ok(answer.entry)
    }

    /// The lifetime to give a sandbox, in E2B's whole seconds.
    fn timeout_seconds(&self) -> u32 {
        u32::try_from(self.inner.config.timeout.as_secs()).unwrap_or(u32::MAX)
    }
}

// Every method written out: a method added to the trait cannot answer with its
// default (`Unsupported`) here unnoticed.
#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl SandboxBackend for E2bBackend {
    fn name(&self) -> &str {
        "e2b"
    }

    fn capabilities(&self) -> Capabilities {
        // E2B's sandboxes: a VM per template, with or without the internet; what a
        // spec can ask beyond that (CPU, memory, mounts) is the template's.
        let mut caps = Capabilities::none();
        caps.shell = true;
        caps.pause = true;
        caps.network_isolation = true;
        caps.network_full = true;
        // `network.allowOut` with everything else denied, changed by
        // `PUT /sandboxes/{id}/network`.
        caps.network_allowlist = true;
        caps.network_update = true;
        caps.symlinks = true;
        caps.interactive_exec = true;
        caps.pty = true;
        caps.watch = true;
        caps.metrics = true;
        caps
    }

    async fn create(&self, spec: &SandboxSpec) -> Result<SandboxInfo> {
        let spec = spec.prepare(&self.capabilities())?;
        let spec_json = serde_json::to_string(&spec)
            .map_err(|e| Error::with_source(ErrorKind::Backend, "encoding the spec", e))?;
        let mut metadata = self.inner.config.metadata.clone();
        metadata.extend(spec.labels.clone());
        metadata.insert(SPEC_METADATA.to_owned(), spec_json);
        metadata.insert(
            REQUEST_METADATA.to_owned(),
            uuid::Uuid::new_v4().simple().to_string(),
        );
        let mut envs = self.inner.config.envs.clone();
        envs.extend(spec.env.clone());
        let template = if spec.template == "default" {
            self.inner.config.template.clone()
        } else {
            spec.template.clone()
        };
        let (allow_internet_access, network) = super::network::to_e2b(&spec.network)?;
        let body = NewSandbox {
            template_id: template,
            timeout: Some(self.timeout_seconds()),
            auto_pause: self.inner.config.auto_pause.then_some(true),
            secure: Some(true),
            allow_internet_access: Some(allow_internet_access),
            network,
            metadata: Some(metadata),
            env_vars: (!envs.is_empty()).then_some(envs),
        };
        let sandbox = self.inner.api.create(&body).await?;
        let id = SandboxId::new(sandbox.sandbox_id.clone()).map_err(|_| {
            Error::new(
                ErrorKind::Backend,
                format!(
                    "E2B answered a sandbox id sandcell cannot use: {:?}",
                    sandbox.sandbox_id
                ),
            )
        })?;
        self.inner.remember(
            &id,
            sandbox.envd_access_token.as_deref(),
            sandbox.domain.as_deref(),
            spec,
        )?;
        match self.inspect(&id).await {
            Ok(info) => Ok(info),
            Err(e) => {
                // Nothing left behind: a sandbox this call cannot report is killed.
                let _ = self.destroy(&id).await;
                Err(e.context(format_args!("inspecting the new sandbox {id}")))
            }
        }
    }

    async fn inspect(&self, id: &SandboxId) -> Result<SandboxInfo> {
        info_of(&self.inner.api.get(id.as_str()).await?)
    }

    async fn list(&self, selector: &LabelSelector) -> Result<Vec<SandboxInfo>> {
        let mut out = Vec::new();
        for detail in self.inner.api.list(&selector.equals).await? {
            let info = info_of(&detail)?;
            if selector.matches(&info.labels) {
                out.push(info);
            }
        }
        Ok(out)
    }

    async fn destroy(&self, id: &SandboxId) -> Result<()> {
        self.inner.api.kill(id.as_str()).await?;
        self.inner.forget(id);
        Ok(())
    }

    /// A machine's ports are reached through its provider, never on this host.
    async fn publish_port(&self, _id: &SandboxId, port: u16) -> Result<()> {
        Err(Error::unsupported(format!(
            "backend {} cannot expose port {port} on this host: reach the sandbox's \
             ports through its provider",
            self.name()
        )))
    }

    async fn unpublish_port(&self, _id: &SandboxId, _port: u16) -> Result<()> {
        Ok(())
    }

    /// E2B has no way to put a sandbox back to its template in place.
    async fn reset(&self, id: &SandboxId) -> Result<()> {
        Err(Error::unsupported(format!(
            "backend e2b cannot reset sandbox {id} in place: destroy it and create another"
        )))
    }

    /// An E2B sandbox's workspace has no template layer to tell changes from.
    async fn export_changes(&self, id: &SandboxId) -> Result<sandcell::Changes> {
        Err(Error::unsupported(format!(
            "backend e2b cannot tell sandbox {id}'s changes from its template: take a full \
             snapshot"
        )))
    }

    async fn clone_sandbox(
        &self,
        id: &SandboxId,
        _labels: std::collections::BTreeMap<String, String>,
    ) -> Result<SandboxInfo> {
        Err(Error::unsupported(format!(
            "backend e2b cannot clone sandbox {id}"
        )))
    }

    async fn pause(&self, id: &SandboxId) -> Result<()> {
        self.inner.api.pause(id.as_str()).await
    }

    async fn set_network(&self, id: &SandboxId, network: &Network) -> Result<()> {
        let Network::Allowlist(_) = network else {
            return Err(Error::unsupported(format!(
                "set_network takes an allowlist, not network {:?}",
                network.mode()
            )));
        };
        let (_, Some(config)) = super::network::to_e2b(network)? else {
            return Err(Error::new(
                ErrorKind::Backend,
                "an allowlist maps to E2B network rules",
            ));
        };
        self.inner.api.set_network(id.as_str(), &config).await
    }

    async fn resume(&self, id: &SandboxId) -> Result<()> {
        let sandbox = self
            .inner
            .api
            .connect(id.as_str(), self.timeout_seconds())
            .await?;
        // A resumed sandbox may answer on another host: learn it afresh.
        let spec = self.inner.known(id).await?.spec.clone();
        self.inner.remember(
            id,
            sandbox.envd_access_token.as_deref(),
            sandbox.domain.as_deref(),
            spec,
        )?;
        Ok(())
    }

    async fn exec(&self, id: &SandboxId, request: ExecRequest) -> Result<Process> {
        request.check_supported(&self.capabilities())?;
        let known = self.inner.known(id).await?;
        let spec = &known.spec;
        let mut request = request;
        request.timeout = request.timeout.or(spec.command_timeout);
        let cwd = match request.cwd.take() {
            Some(cwd) => self.inner.path(&cwd),
            None => self.inner.path(&spec.workdir),
        };
        let output_limit = spec.limits.output_bytes;
        let process = super::exec::start(&known.envd, request, cwd).await?;
        Ok(sandcell::raw::limit_output(process, output_limit))
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
        let envd = self.envd(id).await?;
        envd.download(path, &self.inner.path(path), max_bytes).await
    }

    async fn write(&self, id: &SandboxId, path: &SandboxPath, data: Bytes) -> Result<()> {
        if path.is_root() {
            return Err(Error::invalid_input("cannot write to the workspace root"));
        }
        let envd = self.envd(id).await?;
        envd.upload(&self.inner.path(path), data).await
    }

    async fn stat(&self, id: &SandboxId, path: &SandboxPath) -> Result<FileInfo> {
        let entry = self.entry(id, path).await?;
        Ok(file_info(path.clone(), &entry))
    }

    async fn list_dir(&self, id: &SandboxId, path: &SandboxPath) -> Result<Vec<DirEntry>> {
        let request = ListDirRequest {
            path: self.inner.path(path),
            depth: 1,
        };
        let answer: ListDirResponse = self
            .envd(id)
            .await?
            .unary("filesystem.Filesystem/ListDir", &request)
            .await?;
        let mut limit = sandcell::raw::ListingLimit::new(format!("listing {path}"));
        let mut out = Vec::with_capacity(answer.entries.len());
        for entry in &answer.entries {
            let entry_path = self.inner.workspace_path(&entry.path)?;
            limit.admit(entry_path.as_str(), &entry.name)?;
            let info = file_info(entry_path.clone(), entry);
            out.push(DirEntry::new(entry_path, info.kind, info.size));
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    async fn remove(&self, id: &SandboxId, path: &SandboxPath, recursive: bool) -> Result<()> {
        if path.is_root() {
            return Err(Error::invalid_input("cannot remove the workspace root"));
        }
        // envd's Remove takes whole trees: a single removal checks first.
        if !recursive {
            let info = self.stat(id, path).await?;
            if info.kind == FileKind::Dir && !self.list_dir(id, path).await?.is_empty() {
                return Err(Error::invalid_input(format!(
                    "{path} is a directory that is not empty: remove it recursively"
                )));
            }
        }
        let request = PathRequest {
            path: self.inner.path(path),
        };
        self.envd(id)
            .await?
            .unary::<_, serde_json::Value>("filesystem.Filesystem/Remove", &request)
            .await
            .map(drop)
    }

    async fn mkdir(&self, id: &SandboxId, path: &SandboxPath) -> Result<()> {
        let request = PathRequest {
            path: self.inner.path(path),
        };
        match self
            .envd(id)
            .await?
            .unary::<_, serde_json::Value>("filesystem.Filesystem/MakeDir", &request)
            .await
        {
            Ok(_) => Ok(()),
            // Present already: fine when it is a directory.
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                match self.stat(id, path).await?.kind {
                    FileKind::Dir => Ok(()),
                    _ => Err(e),
                }
            }
            Err(e) => Err(e),
        }
    }

    async fn rename(&self, id: &SandboxId, from: &SandboxPath, to: &SandboxPath) -> Result<()> {
        let request = MoveRequest {
            source: self.inner.path(from),
            destination: self.inner.path(to),
        };
        self.envd(id)
            .await?
            .unary::<_, serde_json::Value>("filesystem.Filesystem/Move", &request)
            .await
            .map(drop)
    }

    async fn export_tar(&self, id: &SandboxId, path: &SandboxPath) -> Result<ByteStream> {
        self.files.export_tar(id, path).await
    }

    async fn import_tar(
        &self,
        id: &SandboxId,
        path: &SandboxPath,
        tar: ByteStream,
        options: ImportOptions,
    ) -> Result<()> {
        self.files.import_tar(id, path, tar, options).await
    }

    async fn watch(
        &self,
        id: &SandboxId,
        path: &SandboxPath,
        options: WatchOptions,
    ) -> Result<WatchStream> {
        let request = WatchDirRequest {
            path: self.inner.path(path),
            recursive: options.recursive,
            include_entry: false,
        };
        let envd = self.envd(id).await?;
        let mut frames = envd
            .stream("filesystem.Filesystem/WatchDir", &request, None)
            .await?;
        // The watch is on once envd says it started.
        loop {
            let frame = frames.next().await.ok_or_else(|| {
                Error::new(ErrorKind::Backend, "envd ended a watch before it started")
            })??;
            let message: WatchDirMessage = serde_json::from_slice(&frame).map_err(|e| {
                Error::with_source(ErrorKind::Backend, "envd sent a malformed watch event", e)
            })?;
            if message.start.is_some() {
                break;
            }
        }
        let (mut sender, stream) = sandcell::raw::watch_channel(path.clone());
        let root = path.clone();
        tokio::spawn(async move {
            // A rename arrives as the old name's RENAME, then the new name's CREATE.
            let mut renamed_from: Option<SandboxPath> = None;
            loop {
                let frame = tokio::select! {
                    frame = frames.next() => frame,
                    () = sender.closed() => return,
                };
                let json = match frame {
                    None => return,
                    Some(Ok(json)) => json,
                    Some(Err(e)) => return sender.fail(e).await,
                };
                let Ok(message) = serde_json::from_slice::<WatchDirMessage>(&json) else {
                    continue;
                };
                let Some(event) = message.filesystem else {
                    continue;
                };
                let Ok(path) = root.join(&event.name) else {
                    continue;
                };
                let out = match (event.event_type.as_str(), renamed_from.take()) {
                    (event_type::RENAME, _) => {
                        renamed_from = Some(path);
                        continue;
                    }
                    (event_type::CREATE, Some(from)) => WatchEvent::renamed(from, path),
                    (kind, moved_out) => {
                        if let Some(from) = moved_out {
                            // Renamed out of sight: gone from here.
                            if !sender.send(WatchEvent::new(WatchEventKind::Removed, from)) {
                                return;
                            }
                        }
                        let kind = match kind {
                            event_type::CREATE => WatchEventKind::Created,
                            event_type::WRITE => WatchEventKind::Modified,
                            event_type::REMOVE => WatchEventKind::Removed,
                            event_type::CHMOD => WatchEventKind::Attributes,
                            _ => continue,
                        };
                        WatchEvent::new(kind, path)
                    }
                };
                if !sender.send(out) {
                    return;
                }
            }
        });
        Ok(stream)
    }

    async fn metrics(&self, id: &SandboxId) -> Result<SandboxMetrics> {
        let readings = self.inner.api.metrics(id.as_str()).await?;
        let mut metrics = SandboxMetrics::now();
        if let Some(latest) = readings.iter().max_by_key(|r| r.timestamp_unix) {
            if let Some(at) = chrono::DateTime::from_timestamp(latest.timestamp_unix, 0) {
                metrics.at = at;
            }
            // A running sandbox never uses no memory: 0 is a reading its host lacks.
            metrics.memory_bytes = (latest.mem_used > 0).then_some(latest.mem_used);
            metrics.memory_limit_bytes = (latest.mem_total > 0).then_some(latest.mem_total);
            metrics.disk_bytes = Some(latest.disk_used);
            metrics.disk_limit_bytes = (latest.disk_total > 0).then_some(latest.disk_total);
        }
        Ok(metrics)
    }
}
