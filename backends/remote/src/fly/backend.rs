//! `FlyBackend`: sandboxes as machines behind a Fly-Machines-style API.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use reqwest::Method;
use sandcell::raw::Routed;
use sandcell::{
    Capabilities, Changes, Error, ErrorKind, ExecRequest, ExitStatus, LabelSelector, Network,
    Process, Result, SandboxBackend, SandboxId, SandboxInfo, SandboxPath, SandboxSpec,
};

use super::config::FlyConfig;
use super::machines::{ControlPlane, FlyMachines};
use super::state::MachineState;
use super::wires::Wires;
use crate::exec_files::ExecFiles;
use crate::http::{Body, Call, Http, RateLimits};
use crate::protocol::{
    CloneMachineRequest, CreateMachineRequest, ExecBody, Guest, Init, MachineConfig, ServerInfo,
    SPEC_METADATA,
};

/// Sandboxes as remote machines: lifecycle over the Fly Machines API; commands and
/// files over sandcell-server's extensions where the server offers them, and over the
/// buffered `exec` (shell scripts moving base64 chunks) on a plain Fly endpoint.
///
/// ```no_run
/// # async fn demo() -> sandcell::Result<()> {
/// use sandcell::{ExecRequest, SandboxBackend, SandboxBackendExt, SandboxSpec};
/// use sandcell_remote::{FlyBackend, FlyConfig};
///
/// let backend = FlyBackend::connect(FlyConfig::new("http://127.0.0.1:7711", "secret")).await?;
/// let sandbox = backend.create(&SandboxSpec::new("default")).await?;
/// let out = backend.run(&sandbox.id, ExecRequest::new(["echo", "hi"])).await?;
/// assert_eq!(out.stdout_str(), "hi\n");
/// backend.destroy(&sandbox.id).await
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct FlyBackend {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: FlyConfig,
    control: Arc<dyn ControlPlane>,
    /// The sandcell server's description; `None` on a plain Fly Machines endpoint.
    server: Option<ServerInfo>,
    /// Each machine's wire connection, on a sandcell server.
    wires: Wires,
    /// The client-side rate limits in force.
    limits: RateLimits,
    /// Files over `exec`, for a plain endpoint.
    files: ExecFiles,
    /// Each sandbox's spec, for exec on a plain endpoint: its workdir, command timeout
    /// and output cap are applied by this client.
    specs: std::sync::Mutex<std::collections::HashMap<SandboxId, Arc<SandboxSpec>>>,
}

impl FlyBackend {
    /// An async factory for [`sandcell::BackendRegistry::register_async`] (it connects
    /// before it answers): the options are a [`FlyConfig`], except that the token may
    /// instead be named by `token_env`, an environment variable holding it, so a config
    /// file need not carry the secret.
    ///
    /// ```
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let registry = sandcell::BackendRegistry::new()
    ///     .register_async("remote", sandcell_remote::FlyBackend::from_options);
    /// let options = serde_json::json!({"url": "http://127.0.0.1:9", "token_env": "NO_SUCH_VAR_SET"});
    /// let err = registry.build_async("remote", options).await.unwrap_err();
    /// assert_eq!(err.kind(), sandcell::ErrorKind::InvalidInput);
    /// assert!(err.to_string().contains("NO_SUCH_VAR_SET"), "{err}");
    /// # });
    /// ```
    pub fn from_options(options: serde_json::Value) -> sandcell::config::BackendFuture {
        Box::pin(async move {
            let mut options = options;
            crate::secret_from_env(&mut options, "remote", "token", None)?;
            let config: FlyConfig = sandcell::config::backend_options("remote", options)?;
            let backend: Box<dyn SandboxBackend> = Box::new(FlyBackend::connect(config).await?);
            Ok(backend)
        })
    }

    /// Connects: asks the server what it offers (`Unavailable` if it cannot be reached).
    pub async fn connect(config: FlyConfig) -> Result<Self> {
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
        let mut http = Http::new(&config)?;
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
        // Fly's limits are Fly's: sandcell-server has none to keep to (a warm pool
        // refilling against it was held to one create a second).
        let limits = match (config.rate_limits, &server) {
            (Some(limits), _) => limits,
            (None, Some(_)) => RateLimits::none(),
            (None, None) => RateLimits::default(),
        };
        http.set_limits(limits);
        let http = Arc::new(http);
        let control: Arc<dyn ControlPlane> =
            Arc::new(FlyMachines::new(Arc::clone(&http), config.app.clone()));
        let files = ExecFiles::new(
            Arc::new(Arc::clone(&control)),
            config.workspace.clone().unwrap_or_default(),
        );
        let wires = Wires::new(Arc::clone(&http), config.app.clone(), config.call_timeout);
        Ok(FlyBackend {
            inner: Arc::new(Inner {
                config,
                control,
                server,
                wires,
                limits,
                files,
                specs: Default::default(),
            }),
        })
    }

    /// The control plane, for calls the backend trait has no method for.
    pub fn control_plane(&self) -> &dyn ControlPlane {
        &*self.inner.control
    }

    /// The client-side rate limits in force: [`FlyConfig::rate_limits`] when set,
    /// else Fly's documented limits on a plain endpoint and none on sandcell-server.
    pub fn rate_limits(&self) -> RateLimits {
        self.inner.limits
    }

    /// Whether the server offers sandcell's extensions (streamed exec, files).
    pub fn has_extensions(&self) -> bool {
        self.inner.server.is_some()
    }

    /// Where machine `id`'s commands and files go.
    async fn route(&self, id: &SandboxId) -> Result<Route<'_>> {
        match &self.inner.server {
            Some(_) => Ok(Routed::Wire(self.inner.wires.get(id).await?)),
            None => Ok(Routed::Own(&self.inner.files)),
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

/// Where a machine's commands and files go: sandcell-server's wire connection to the
/// machine, or (a plain Fly endpoint) shell scripts over the buffered `exec`.
type Route<'a> = Routed<&'a ExecFiles>;

// A method added to the trait joins a group of `forward` or is written out here: it
// cannot answer with its default (`Unsupported`) unnoticed.
sandcell::raw::forward_backend! {
    impl SandboxBackend for FlyBackend {
        forward {
            [files] => routed route;
        }

        fn name(&self) -> &str {
            "remote"
        }

        fn capabilities(&self) -> Capabilities {
            match &self.inner.server {
                // The served backend's: the spec travels whole, and every per-sandbox
                // operation (a new allowlist included) crosses the wire.
                Some(server) => server.capabilities,
                None => {
                    // A plain Fly Machines endpoint: machines have the network, a guest
                    // size, and nothing else a spec can ask for. Its restart wipes the root
                    // file system, so reset keeps the workspace only on a volume.
                    let mut caps = Capabilities::none();
                    caps.pause = true;
                    caps.reset = self.inner.config.workspace_survives_restart;
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
            let info = super::state::info_of(&machine)?;
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
            super::state::info_of(&self.inner.control.get(id.as_str()).await?)
        }

        async fn list(&self, selector: &LabelSelector) -> Result<Vec<SandboxInfo>> {
            let mut out = Vec::new();
            for machine in self.inner.control.list().await? {
                if machine.state == MachineState::Destroyed.as_str() {
                    continue;
                }
                let info = super::state::info_of(&machine)?;
                if selector.matches(&info.labels) {
                    out.push(info);
                }
            }
            Ok(out)
        }

        async fn destroy(&self, id: &SandboxId) -> Result<()> {
            self.inner.control.destroy(id.as_str()).await?;
            self.inner.wires.forget(id);
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
            if !self.capabilities().reset {
                return Err(Error::unsupported(
                    "reset on a plain Fly endpoint: a restart recreates the machine's root \
                     file system, so the workspace would be lost (set \
                     `workspace_survives_restart` when it lives on a volume)",
                ));
            }
            self.inner.control.restart(id.as_str()).await?;
            self.wait_for(id, MachineState::Started, None).await
        }

        async fn exec(&self, id: &SandboxId, request: ExecRequest) -> Result<Process> {
            request.check_supported(&self.capabilities())?;
            if let Routed::Wire(wire) = self.route(id).await? {
                return wire.exec(request).await;
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
            let wrapped = crate::plain_exec::wrap_command(&request, workspace);
            let body = ExecBody {
                command: wrapped.argv,
                stdin: wrapped.stdin,
                // The API counts whole seconds.
                timeout: request
                    .timeout
                    .map(|t| t.as_secs() + u64::from(t.subsec_nanos() > 0)),
            };
            let output_limit = spec.limits.output_bytes;
            let started = Instant::now();
            let answer = self.inner.control.exec(id.as_str(), &body).await?;
            let what = format!("running {:?}", request.argv[0]);
            if let Some(e) = crate::plain_exec::typed_failure(
                answer.exit_code,
                &answer.stderr,
                &wrapped.marker,
                &what,
            ) {
                return Err(e);
            }
            crate::plain_exec::check_text_output(&answer.stdout, &answer.stderr, &what)?;
            let status = match (answer.exit_signal.filter(|s| *s > 0), answer.exit_code) {
                (Some(signal), _) => ExitStatus::signaled(signal),
                (None, Some(code)) => ExitStatus::exited(code),
                (None, None) => ExitStatus::signaled(9),
            };
            // The answer does not say why a command was killed: one killed once its
            // timeout had passed is taken to have timed out.
            let timed_out =
                status.code.is_none() && request.timeout.is_some_and(|t| started.elapsed() >= t);
            let process = sandcell::raw::finished_process(
                Bytes::from(answer.stdout),
                Bytes::from(answer.stderr),
                status.timed_out(timed_out),
            );
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
            match self.route(id).await? {
                Routed::Wire(wire) => wire.read_limited(path, max_bytes).await,
                Routed::Own(files) => files.read(id, path, max_bytes).await,
            }
        }

        async fn export_changes(&self, id: &SandboxId) -> Result<Changes> {
            match self.route(id).await? {
                // Whether the served backend can is in its capabilities; the wire answers
                // `Unsupported` where it cannot.
                Routed::Wire(wire) => wire.export_changes().await,
                Routed::Own(_) => Err(Error::unsupported(
                    "a plain Fly endpoint cannot list a machine's changes",
                )),
            }
        }

        async fn clone_sandbox(
            &self,
            id: &SandboxId,
            labels: std::collections::BTreeMap<String, String>,
        ) -> Result<SandboxInfo> {
            if !self.capabilities().clone {
                return Err(Error::unsupported(
                    "cloning a machine needs a sandcell-server whose backend can clone",
                ));
            }
            // The clone is made by the server; its spec is the source's, with new labels,
            // recorded in its metadata as a create records it.
            let mut spec = (*self.spec_of(id).await?).clone();
            spec.labels = labels;
            let spec_json = serde_json::to_string(&spec)
                .map_err(|e| Error::with_source(ErrorKind::Backend, "encoding the spec", e))?;
            let mut metadata = spec.labels.clone();
            metadata.insert(SPEC_METADATA.to_owned(), spec_json);
            let request = CloneMachineRequest {
                name: Some(format!("sandcell-{}", uuid::Uuid::new_v4().simple())),
                metadata,
            };
            let machine = self
                .inner
                .control
                .clone_machine(id.as_str(), &request)
                .await?;
            let info = super::state::info_of(&machine)?;
            crate::lock(&self.inner.specs).insert(info.id.clone(), Arc::new(spec));
            Ok(info)
        }

        async fn set_network(&self, id: &SandboxId, network: &Network) -> Result<()> {
            match self.route(id).await? {
                Routed::Wire(wire) => wire.set_network(network).await?,
                Routed::Own(_) => {
                    return Err(Error::unsupported(
                        "a plain Fly endpoint cannot change a machine's network",
                    ))
                }
            }
            // The spec this client knows follows.
            if let Some(spec) = crate::lock(&self.inner.specs).get_mut(id) {
                Arc::make_mut(spec).network = network.clone();
            }
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

        async fn metrics(&self, id: &SandboxId) -> Result<sandcell::SandboxMetrics> {
            match self.route(id).await? {
                Routed::Wire(wire) => wire.metrics().await,
                Routed::Own(_) => Err(Error::unsupported(
                    "a plain Fly endpoint does not report a machine's metrics",
                )),
            }
        }
    }
}
