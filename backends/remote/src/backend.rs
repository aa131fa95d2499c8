//! `RemoteBackend`: sandboxes as machines behind a Fly-Machines-style API.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use reqwest::Method;
use sandcell::archive::{ImportMode, ImportOptions};
use sandcell::{
    ByteStream, Capabilities, DirEntry, Error, ErrorKind, ExecRequest, ExitStatus, FileInfo,
    LabelSelector, Network, Process, Result, SandboxBackend, SandboxId, SandboxInfo, SandboxPath,
    SandboxSpec,
};
use serde::{Deserialize, Serialize};

use crate::exec_files::ExecFiles;
use crate::fly::{ControlPlane, FlyMachines};
use crate::http::{api_error, transport_error, Body, Call, Http, RateLimits, RetryPolicy};
use crate::protocol::{
    CreateMachineRequest, ExecBody, Guest, Init, Machine, MachineConfig, PathBody, ServerInfo,
    SPEC_METADATA,
};
use crate::state::MachineState;

/// Where the API is and how to talk to it.
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct RemoteConfig {
    /// The API's base URL, without `/v1` (`https://api.machines.dev`,
    /// `http://127.0.0.1:7711` for a sandcell-server).
    pub url: String,
    /// The API token (`FlyV1 ...` tokens keep their scheme; others go as a bearer).
    pub token: String,
    /// The app machines are created in.
    #[serde(default = "default_app")]
    pub app: String,
    /// The region to launch in; the API picks when unset.
    #[serde(default)]
    pub region: Option<String>,
    /// The command each machine keeps running (`config.init.cmd`).
    #[serde(default = "default_keep_alive")]
    pub keep_alive: Vec<String>,
    /// `config.auto_destroy`: the provider destroys a machine whose command exits.
    #[serde(default)]
    pub auto_destroy: bool,
    /// Retries of calls that are safe to repeat.
    #[serde(default)]
    pub retry: RetryPolicy,
    /// The client-side rate limits.
    #[serde(default)]
    pub rate_limits: RateLimits,
    /// The deadline of one call, retries included (default 60 s).
    #[serde(default = "default_call_timeout", with = "secs")]
    pub call_timeout: Duration,
    /// How long a new machine may take to start (default 5 min).
    #[serde(default = "default_start_timeout", with = "secs")]
    pub start_timeout: Duration,
    /// On a plain Fly Machines endpoint, the directory on the machine that file paths
    /// are relative to; unset, the directory commands start in.
    #[serde(default)]
    pub workspace: Option<String>,
}

fn default_app() -> String {
    "sandcell".to_owned()
}

fn default_keep_alive() -> Vec<String> {
    vec!["sleep".to_owned(), "infinity".to_owned()]
}

fn default_call_timeout() -> Duration {
    Duration::from_secs(60)
}

fn default_start_timeout() -> Duration {
    Duration::from_secs(300)
}

impl std::fmt::Debug for RemoteConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteConfig")
            .field("url", &self.url)
            .field("token", &"<redacted>")
            .field("app", &self.app)
            .field("region", &self.region)
            .field("retry", &self.retry)
            .field("rate_limits", &self.rate_limits)
            .finish_non_exhaustive()
    }
}

impl RemoteConfig {
    /// The API at `url` with `token`; every other setting at its default.
    pub fn new(url: impl Into<String>, token: impl Into<String>) -> Self {
        RemoteConfig {
            url: url.into(),
            token: token.into(),
            app: default_app(),
            region: None,
            keep_alive: default_keep_alive(),
            auto_destroy: false,
            retry: RetryPolicy::default(),
            rate_limits: RateLimits::default(),
            call_timeout: default_call_timeout(),
            start_timeout: default_start_timeout(),
            workspace: None,
        }
    }

    /// Sets the app.
    pub fn app(mut self, app: impl Into<String>) -> Self {
        self.app = app.into();
        self
    }

    /// Sets the region.
    pub fn region(mut self, region: impl Into<String>) -> Self {
        self.region = Some(region.into());
        self
    }

    /// Sets the retry policy.
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Sets the rate limits.
    pub fn rate_limits(mut self, limits: RateLimits) -> Self {
        self.rate_limits = limits;
        self
    }

    /// Sets the deadline of one call.
    pub fn call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// Sets the workspace directory files over exec are relative to (plain endpoints).
    pub fn workspace(mut self, dir: impl Into<String>) -> Self {
        self.workspace = Some(dir.into());
        self
    }
}

/// Sandboxes as remote machines: lifecycle over the Fly Machines API; commands and
/// files over sandcell-server's extensions where the server offers them, and over the
/// buffered `exec` (shell scripts moving base64 chunks) on a plain Fly endpoint.
///
/// ```no_run
/// # async fn demo() -> sandcell::Result<()> {
/// use sandcell::{ExecRequest, SandboxBackend, SandboxBackendExt, SandboxSpec};
/// use sandcell_remote::{RemoteBackend, RemoteConfig};
///
/// let backend = RemoteBackend::connect(RemoteConfig::new("http://127.0.0.1:7711", "secret")).await?;
/// let sandbox = backend.create(&SandboxSpec::new("default")).await?;
/// let out = backend.run(&sandbox.id, ExecRequest::new(["echo", "hi"])).await?;
/// assert_eq!(out.stdout_str(), "hi\n");
/// backend.destroy(&sandbox.id).await
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct RemoteBackend {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: RemoteConfig,
    http: Arc<Http>,
    control: Arc<dyn ControlPlane>,
    /// The sandcell server's description; `None` on a plain Fly Machines endpoint.
    server: Option<ServerInfo>,
    /// Files over `exec`, for a plain endpoint.
    files: ExecFiles,
    /// Each sandbox's spec, for exec on a plain endpoint: its workdir, command timeout
    /// and output cap are applied by this client.
    specs: std::sync::Mutex<std::collections::HashMap<SandboxId, Arc<SandboxSpec>>>,
}

impl RemoteBackend {
    /// Connects: asks the server what it offers (`Unavailable` if it cannot be reached).
    pub async fn connect(config: RemoteConfig) -> Result<Self> {
        if config.url.trim().is_empty() {
            return Err(Error::invalid_input("the remote backend needs a URL"));
        }
        if !config.url.starts_with("http://") && !config.url.starts_with("https://") {
            return Err(Error::invalid_input(format!(
                "the remote URL {:?} is not http(s)",
                config.url
            )));
        }
        crate::check_name("app", &config.app)?;
        let http = Arc::new(Http::new(
            &config.url,
            &config.token,
            config.retry,
            config.rate_limits,
            config.call_timeout,
        )?);
        let call = Call::extension(
            Method::GET,
            "/v1/sandcell/capabilities".to_owned(),
            Body::None,
        );
        let server = match http.json::<ServerInfo>(call).await {
            Ok(info) => Some(info),
            // A plain Fly Machines endpoint has no such route.
            Err(e) if e.kind() == ErrorKind::NotFound => None,
            Err(e) => return Err(e.context(format_args!("connecting to {}", config.url))),
        };
        let control: Arc<dyn ControlPlane> =
            Arc::new(FlyMachines::new(Arc::clone(&http), config.app.clone()));
        let files = ExecFiles::new(
            Arc::clone(&control),
            config.workspace.clone().unwrap_or_default(),
        );
        Ok(RemoteBackend {
            inner: Arc::new(Inner {
                config,
                http,
                control,
                server,
                files,
                specs: Default::default(),
            }),
        })
    }

    /// The control plane, for calls the backend trait has no method for.
    pub fn control_plane(&self) -> &dyn ControlPlane {
        &*self.inner.control
    }

    /// Whether the server offers sandcell's extensions (streamed exec, files).
    pub fn has_extensions(&self) -> bool {
        self.inner.server.is_some()
    }

    fn machine_path(&self, id: &SandboxId) -> String {
        format!("/v1/apps/{}/machines/{id}", self.inner.config.app)
    }

    /// Files over `exec`, when the endpoint has no sandcell extensions.
    fn over_exec(&self) -> Option<&ExecFiles> {
        self.inner.server.is_none().then_some(&self.inner.files)
    }

    /// A call to one of the extension routes of machine `id`.
    fn extension<'a>(
        &self,
        method: Method,
        id: &SandboxId,
        tail: &str,
        body: Body<'a>,
    ) -> Call<'a> {
        Call::extension(method, format!("{}{tail}", self.machine_path(id)), body)
    }

    async fn filesystem<T: serde::de::DeserializeOwned>(
        &self,
        id: &SandboxId,
        call: &str,
        body: PathBody,
    ) -> Result<T> {
        let value = serde_json::to_value(&body)
            .map_err(|e| Error::with_source(ErrorKind::Backend, "encoding a path", e))?;
        let mut request = self.extension(
            Method::POST,
            id,
            &format!("/filesystem.Filesystem/{call}"),
            Body::Json(&value),
        );
        // Stat and ListDir only read.
        request.idempotent = matches!(call, "Stat" | "ListDir");
        self.inner.http.json(request).await
    }

    fn path_body(path: &SandboxPath) -> PathBody {
        PathBody {
            path: path.clone(),
            destination: None,
            recursive: false,
        }
    }

    /// The spec of sandbox `id` (plain endpoints, whose exec cannot carry a workdir,
    /// default timeout or output cap): remembered from the create, or read once from
    /// the machine's metadata for a machine this client did not create (one without a
    /// sandcell spec gets the defaults).
    async fn spec_of(&self, id: &SandboxId) -> Result<Arc<SandboxSpec>> {
        if let Some(spec) = crate::lock(&self.inner.specs).get(id) {
            return Ok(Arc::clone(spec));
        }
        let machine = self.inner.control.get(id.as_str()).await?;
        let spec = Arc::new(
            machine
                .config
                .as_ref()
                .and_then(|c| c.metadata.get(SPEC_METADATA))
                .and_then(|json| serde_json::from_str::<SandboxSpec>(json).ok())
                .unwrap_or_default(),
        );
        crate::lock(&self.inner.specs).insert(id.clone(), Arc::clone(&spec));
        Ok(spec)
    }

    async fn wait_for(
        &self,
        id: &SandboxId,
        state: MachineState,
        version: Option<&str>,
    ) -> Result<()> {
        let deadline = Instant::now() + self.inner.config.start_timeout;
        self.inner
            .control
            .wait(id.as_str(), state, version, deadline)
            .await
    }
}

/// A query value, percent-encoded.
fn encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~/".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// What sandcell knows of a machine.
fn info_of(machine: &Machine) -> Result<SandboxInfo> {
    let id = SandboxId::new(machine.id.clone()).map_err(|_| {
        Error::new(
            ErrorKind::Backend,
            format!(
                "the API reported a machine id sandcell cannot use: {:?}",
                machine.id
            ),
        )
    })?;
    let config = machine.config.clone().unwrap_or_default();
    let status = MachineState::parse(&machine.state)
        .map(MachineState::status)
        .unwrap_or(sandcell::SandboxStatus::Failed);
    // The spec sandcell stored at create says the network the machine has; a machine
    // made by something else has Fly's default, the network.
    let mut spec = SandboxSpec::new(config.image);
    spec.network = config
        .metadata
        .get(SPEC_METADATA)
        .and_then(|json| serde_json::from_str::<SandboxSpec>(json).ok())
        .map_or(Network::Full, |s| s.network);
    let mut info = SandboxInfo::new(id, "remote", &spec, status);
    info.labels = config
        .metadata
        .into_iter()
        .filter(|(k, _)| k != SPEC_METADATA)
        .collect();
    if let Ok(created) = chrono::DateTime::parse_from_rfc3339(&machine.created_at) {
        info.created_at = created.with_timezone(&chrono::Utc);
    }
    let details = [
        ("name", &machine.name),
        ("region", &machine.region),
        ("state", &machine.state),
        ("version", &machine.instance_id),
    ];
    info.details = details
        .into_iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| (k.to_owned(), v.clone()))
        .collect::<BTreeMap<_, _>>();
    Ok(info)
}

#[async_trait]
impl SandboxBackend for RemoteBackend {
    fn name(&self) -> &str {
        "remote"
    }

    fn capabilities(&self) -> Capabilities {
        match &self.inner.server {
            Some(server) => server.capabilities,
            None => {
                // A plain Fly Machines endpoint: machines have the network, a guest
                // size, and nothing else a spec can ask for.
                let mut caps = Capabilities::none();
                caps.pause = true;
                caps.reset = true;
                caps.cpu_limit = true;
                caps.memory_limit = true;
                caps.network_full = true;
                caps.shell = true;
                caps.symlinks = true;
                caps
            }
        }
    }

    async fn create(&self, spec: &SandboxSpec) -> Result<SandboxInfo> {
        let spec = &spec.prepare(&self.capabilities())?;
        let spec_json = serde_json::to_string(spec)
            .map_err(|e| Error::with_source(ErrorKind::Backend, "encoding the spec", e))?;
        let mut metadata = spec.labels.clone();
        metadata.insert(SPEC_METADATA.to_owned(), spec_json);
        let limits = &spec.limits;
        let guest = (limits.cpu_millis.is_some() || limits.memory_bytes.is_some()).then(|| Guest {
            cpu_kind: None,
            cpus: limits.cpu_millis.map(|m| m.div_ceil(1000).max(1)),
            memory_mb: limits.memory_bytes.map(|b| b.div_ceil(1 << 20)),
        });
        let request = CreateMachineRequest {
            name: Some(format!("sandcell-{}", uuid::Uuid::new_v4().simple())),
            region: self.inner.config.region.clone(),
            config: MachineConfig {
                image: spec.template.clone(),
                env: spec.env.clone(),
                guest,
                init: Some(Init {
                    cmd: self.inner.config.keep_alive.clone(),
                }),
                metadata,
                auto_destroy: Some(self.inner.config.auto_destroy),
            },
        };
        let machine = self.inner.control.create(&request).await?;
        let info = info_of(&machine)?;
        if machine.state != MachineState::Started.as_str() {
            let version = Some(machine.instance_id.as_str());
            if let Err(e) = self
                .wait_for(&info.id, MachineState::Started, version)
                .await
            {
                // Nothing left behind: a machine that never started is destroyed.
                let _ = self.inner.control.destroy(machine.id.as_str()).await;
                return Err(e.context(format_args!("starting machine {}", machine.id)));
            }
        }
        // Known now; exec on a plain endpoint need not ask the machine for it later.
        crate::lock(&self.inner.specs).insert(info.id.clone(), Arc::new(spec.clone()));
        self.inspect(&info.id).await
    }

    async fn inspect(&self, id: &SandboxId) -> Result<SandboxInfo> {
        info_of(&self.inner.control.get(id.as_str()).await?)
    }

    async fn list(&self, selector: &LabelSelector) -> Result<Vec<SandboxInfo>> {
        let mut out = Vec::new();
        for machine in self.inner.control.list().await? {
            if machine.state == MachineState::Destroyed.as_str() {
                continue;
            }
            let info = info_of(&machine)?;
            if selector.matches(&info.labels) {
                out.push(info);
            }
        }
        Ok(out)
    }

    async fn destroy(&self, id: &SandboxId) -> Result<()> {
        self.inner.control.destroy(id.as_str()).await?;
        crate::lock(&self.inner.specs).remove(id);
        Ok(())
    }

    async fn pause(&self, id: &SandboxId) -> Result<()> {
        self.inner.control.suspend(id.as_str()).await?;
        self.wait_for(id, MachineState::Suspended, None).await
    }

    async fn resume(&self, id: &SandboxId) -> Result<()> {
        self.inner.control.start(id.as_str()).await?;
        self.wait_for(id, MachineState::Started, None).await
    }

    async fn reset(&self, id: &SandboxId) -> Result<()> {
        self.inner.control.restart(id.as_str()).await?;
        self.wait_for(id, MachineState::Started, None).await
    }

    async fn exec(&self, id: &SandboxId, request: ExecRequest) -> Result<Process> {
        request.validate()?;
        if self.inner.server.is_some() {
            return crate::process::start(
                Arc::clone(&self.inner.http),
                self.machine_path(id),
                request,
            )
            .await;
        }
        // A plain endpoint runs the command to its end and answers text. Its exec has
        // no cwd or env and cannot tell a missing program: a wrapper does those, and
        // this client applies the spec's workdir, default timeout and output cap.
        let spec = self.spec_of(id).await?;
        let mut request = request;
        if request.cwd.is_none() && !spec.workdir.is_root() {
            request.cwd = Some(spec.workdir.clone());
        }
        request.timeout = request.timeout.or(spec.command_timeout);
        let workspace = self.inner.config.workspace.as_deref().unwrap_or("");
        let (command, marker) = crate::plain_exec::wrap_command(&request, workspace);
        let body = ExecBody {
            command,
            stdin: request
                .stdin
                .as_ref()
                .map(|b| String::from_utf8_lossy(b).into_owned()),
            // The API counts whole seconds.
            timeout: request
                .timeout
                .map(|t| t.as_secs() + u64::from(t.subsec_nanos() > 0)),
        };
        let output_limit = spec.limits.output_bytes;
        let started = Instant::now();
        let answer = self.inner.control.exec(id.as_str(), &body).await?;
        let what = format!("running {:?}", request.argv[0]);
        if let Some(e) =
            crate::plain_exec::typed_failure(answer.exit_code, &answer.stderr, &marker, &what)
        {
            return Err(e);
        }
        let status = match (answer.exit_signal.filter(|s| *s > 0), answer.exit_code) {
            (Some(signal), _) => ExitStatus::signaled(signal),
            (None, Some(code)) => ExitStatus::exited(code),
            (None, None) => ExitStatus::signaled(9),
        };
        // The answer does not say why a command was killed: one killed once its
        // timeout had passed is taken to have timed out.
        let timed_out =
            status.code.is_none() && request.timeout.is_some_and(|t| started.elapsed() >= t);
        Ok(crate::process::finished(
            Bytes::from(answer.stdout),
            Bytes::from(answer.stderr),
            status.with_timed_out(timed_out),
        )
        .with_output_limit(output_limit))
    }

    async fn read(&self, id: &SandboxId, path: &SandboxPath) -> Result<Bytes> {
        if let Some(files) = self.over_exec() {
            return files.read(id, path).await;
        }
        let call = self.extension(
            Method::GET,
            id,
            &format!("/files?path={}", encode(path.as_str())),
            Body::None,
        );
        let response = self.inner.http.send(call).await?;
        response
            .bytes()
            .await
            .map_err(|e| transport_error(&format!("reading {path}"), &e))
    }

    async fn write(&self, id: &SandboxId, path: &SandboxPath, data: Bytes) -> Result<()> {
        if let Some(files) = self.over_exec() {
            return files.write(id, path, data).await;
        }
        let call = self.extension(
            Method::POST,
            id,
            &format!("/files?path={}", encode(path.as_str())),
            Body::Bytes(data),
        );
        self.inner.http.send(call).await.map(drop)
    }

    async fn stat(&self, id: &SandboxId, path: &SandboxPath) -> Result<FileInfo> {
        if let Some(files) = self.over_exec() {
            return files.stat(id, path).await;
        }
        self.filesystem(id, "Stat", Self::path_body(path)).await
    }

    async fn list_dir(&self, id: &SandboxId, path: &SandboxPath) -> Result<Vec<DirEntry>> {
        if let Some(files) = self.over_exec() {
            return files.list_dir(id, path).await;
        }
        self.filesystem(id, "ListDir", Self::path_body(path)).await
    }

    async fn remove(&self, id: &SandboxId, path: &SandboxPath, recursive: bool) -> Result<()> {
        if let Some(files) = self.over_exec() {
            return files.remove(id, path, recursive).await;
        }
        let mut body = Self::path_body(path);
        body.recursive = recursive;
        self.filesystem::<serde_json::Value>(id, "Remove", body)
            .await
            .map(drop)
    }

    async fn mkdir(&self, id: &SandboxId, path: &SandboxPath) -> Result<()> {
        if let Some(files) = self.over_exec() {
            return files.mkdir(id, path).await;
        }
        self.filesystem::<serde_json::Value>(id, "MakeDir", Self::path_body(path))
            .await
            .map(drop)
    }

    async fn rename(&self, id: &SandboxId, from: &SandboxPath, to: &SandboxPath) -> Result<()> {
        if let Some(files) = self.over_exec() {
            return files.rename(id, from, to).await;
        }
        let mut body = Self::path_body(from);
        body.destination = Some(to.clone());
        self.filesystem::<serde_json::Value>(id, "Move", body)
            .await
            .map(drop)
    }

    async fn export_tar(&self, id: &SandboxId, path: &SandboxPath) -> Result<ByteStream> {
        if let Some(files) = self.over_exec() {
            return files.export_tar(id, path).await;
        }
        let call = self.extension(
            Method::GET,
            id,
            &format!("/archive?path={}", encode(path.as_str())),
            Body::None,
        );
        let response = self.inner.http.send(call).await?;
        let what = format!("exporting {path}");
        Ok(response
            .bytes_stream()
            .map(move |chunk| chunk.map_err(|e| transport_error(&what, &e)))
            .boxed())
    }

    async fn import_tar(
        &self,
        id: &SandboxId,
        path: &SandboxPath,
        tar: ByteStream,
        options: ImportOptions,
    ) -> Result<()> {
        if let Some(files) = self.over_exec() {
            return files.import_tar(id, path, tar, options).await;
        }
        let mode = match options.mode {
            ImportMode::Replace => "replace",
            _ => "merge",
        };
        let limits = options.limits;
        let route = format!(
            "{}/archive?path={}&mode={mode}&max_bytes={}&max_entries={}&max_depth={}&max_name_len={}",
            self.machine_path(id),
            encode(path.as_str()),
            limits.max_bytes,
            limits.max_entries,
            limits.max_depth,
            limits.max_name_len,
        );
        let what = format!("PUT {route}");
        // The caller's stream is spooled first: an error it raises then fails the import
        // before the upload starts. Aborting an upload half-way would return before the
        // server had cleaned up after its import, so a caller could see its staging.
        let mut spooled = crate::exec_files::spool(tar, limits.max_stream_bytes()).await?;
        std::io::Seek::rewind(&mut spooled)
            .map_err(|e| Error::io("rewinding the spooled archive", e))?;
        let body = sandcell::stream::reader_to_stream(spooled);
        // The body is read once, so this call is never retried.
        let response = self
            .inner
            .http
            .request(Method::PUT, &route)
            .body(reqwest::Body::wrap_stream(body))
            .send()
            .await
            .map_err(|e| transport_error(&what, &e))?;
        if response.status().is_success() {
            Ok(())
        } else {
            Err(api_error(&what, response).await)
        }
    }
}

mod secs {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_secs())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_secs)
    }
}
