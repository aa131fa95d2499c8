//! Services: named long-running commands in a sandbox (a dev server, a preview app),
//! each on its own port from a configured range, started, probed over HTTP until ready,
//! reported by URL, restarted by policy, and stopped — with their ports released.
//!
//! Ports are handed out by one [`Services`] table: two services (in one sandbox or in
//! two) never share a port, and a port freed by `stop` or by the sandbox's end is handed
//! out again. A service whose process ends is restarted on the same port as its
//! [`RestartPolicy`] allows; after that it is [`ServiceStatus::Unhealthy`], which the
//! session manager's reaper treats as a failed sandbox (seed 000's rule).
//!
//! A service listens on its port inside the sandbox, on all addresses, and is reached at
//! `http://127.0.0.1:PORT` from this host: the backend publishes the port
//! ([`SandboxBackend::publish_port`]) — a no-op where the sandbox shares the host's
//! network, a forwarder into a container on Docker. [`Capabilities::port_exposure`](crate::Capabilities)
//! says whether a backend can.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::backend::SandboxBackend;
use crate::background::{Background, BackgroundId};
use crate::error::{Error, ErrorKind, Result};
use crate::exec::ExecRequest;
use crate::lock_unpoisoned as lock;
use crate::sandbox::SandboxId;

/// An inclusive range of host ports services are given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortRange {
    /// The first port.
    pub first: u16,
    /// The last port (inclusive).
    pub last: u16,
}

impl PortRange {
    /// `first..=last`; `InvalidInput` if empty or starting at 0.
    pub fn new(first: u16, last: u16) -> Result<Self> {
        let range = PortRange { first, last };
        range.validate()?;
        Ok(range)
    }

    /// Checks the range.
    pub fn validate(&self) -> Result<()> {
        if self.first == 0 || self.first > self.last {
            return Err(Error::invalid_input(format!(
                "port range {}-{} is empty or starts at 0",
                self.first, self.last
            )));
        }
        Ok(())
    }

    fn len(&self) -> usize {
        usize::from(self.last - self.first) + 1
    }
}

impl Default for PortRange {
    fn default() -> Self {
        PortRange {
            first: 20000,
            last: 20999,
        }
    }
}

/// When a service whose process ended is started again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "when")]
#[non_exhaustive]
pub enum RestartPolicy {
    /// Never: it is unhealthy at once.
    Never,
    /// When it exits unsuccessfully, at most `max` times.
    OnFailure {
        /// Restarts allowed.
        max: u32,
    },
    /// Whenever it exits, at most `max` times.
    Always {
        /// Restarts allowed.
        max: u32,
    },
}

impl Default for RestartPolicy {
    fn default() -> Self {
        RestartPolicy::OnFailure { max: 3 }
    }
}

/// A service to start.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ServiceSpec {
    /// Unique within its sandbox.
    pub name: String,
    /// The command. `{port}` in its arguments becomes the port; `PORT` is set too.
    pub command: ExecRequest,
    /// The path the readiness probe requests (any HTTP answer means ready).
    pub ready_path: String,
    /// How long to wait for the first answer.
    pub ready_timeout: Duration,
    /// What happens when the process ends.
    pub restart: RestartPolicy,
}

impl ServiceSpec {
    /// A service `name` running `command`, probed at `/` for up to 30 s, restarted on
    /// failure up to 3 times.
    pub fn new(name: impl Into<String>, command: ExecRequest) -> Self {
        ServiceSpec {
            name: name.into(),
            command,
            ready_path: "/".to_owned(),
            ready_timeout: Duration::from_secs(30),
            restart: RestartPolicy::default(),
        }
    }

    /// Probes this path instead of `/`.
    pub fn ready_path(mut self, path: impl Into<String>) -> Self {
        self.ready_path = path.into();
        self
    }

    /// Waits this long for readiness.
    pub fn ready_timeout(mut self, timeout: Duration) -> Self {
        self.ready_timeout = timeout;
        self
    }

    /// Sets the restart policy.
    pub fn restart(mut self, policy: RestartPolicy) -> Self {
        self.restart = policy;
        self
    }
}

/// How a service is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ServiceStatus {
    /// Answering on its port.
    Ready,
    /// Its process ended and a new one is starting.
    Restarting,
    /// Its process ended and the policy allows no more restarts.
    Unhealthy,
}

/// A running (or failed) service.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct ServiceInfo {
    /// Its name.
    pub name: String,
    /// The sandbox it runs in.
    pub sandbox: SandboxId,
    /// Its port.
    pub port: u16,
    /// Where it answers.
    pub url: String,
    /// How it is doing.
    pub status: ServiceStatus,
    /// How often it was restarted.
    pub restarts: u32,
    /// Its current background process.
    pub process: Option<BackgroundId>,
}

/// The services of any number of sandboxes, with one port range between them.
#[derive(Clone)]
pub struct Services {
    inner: Arc<Inner>,
}

struct Inner {
    range: PortRange,
    background: Background,
    ports: Mutex<BTreeMap<u16, (SandboxId, String)>>,
    services: Mutex<HashMap<(SandboxId, String), Arc<Service>>>,
}

struct Service {
    spec: ServiceSpec,
    /// The backend that published the port, to unpublish it on `stop`.
    backend: Arc<dyn SandboxBackend>,
    info: Mutex<ServiceInfo>,
    /// Set by `stop`, so the monitor does not restart what was stopped on purpose.
    stopped: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Services {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Services")
            .field("range", &self.inner.range)
            .field("ports_in_use", &lock(&self.inner.ports).len())
            .finish()
    }
}

impl Services {
    /// A table handing out ports from `range`; service processes go into `background`.
    pub fn new(range: PortRange, background: Background) -> Self {
        Services {
            inner: Arc::new(Inner {
                range,
                background,
                ports: Mutex::new(BTreeMap::new()),
                services: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Starts a service and waits until it answers on its port. A port is taken from the
    /// range (`LimitExceeded` when all are in use) and released if the start fails: the
    /// process exits first (`Backend`, with its status) or does not answer within
    /// `ready_timeout` (`Timeout`, and it is killed).
    pub async fn start(
        &self,
        backend: Arc<dyn SandboxBackend>,
        sandbox: &SandboxId,
        spec: ServiceSpec,
    ) -> Result<ServiceInfo> {
        if !backend.capabilities().port_exposure {
            return Err(Error::unsupported(format!(
                "backend {} cannot expose ports to this host",
                backend.name()
            )));
        }
        crate::sandbox::validate_name("service name", &spec.name)?;
        let key = (sandbox.clone(), spec.name.clone());
        if lock(&self.inner.services).contains_key(&key) {
            return Err(Error::new(
                ErrorKind::AlreadyExists,
                format!("sandbox {sandbox} already runs a service {:?}", spec.name),
            ));
        }
        let port = self.allocate(sandbox, &spec.name)?;
        if let Err(e) = backend.publish_port(sandbox, port).await {
            lock(&self.inner.ports).remove(&port);
            return Err(e.context(format_args!("starting service {}", spec.name)));
        }
        let service = Arc::new(Service {
            info: Mutex::new(ServiceInfo {
                name: spec.name.clone(),
                sandbox: sandbox.clone(),
                port,
                url: format!("http://127.0.0.1:{port}"),
                status: ServiceStatus::Restarting,
                restarts: 0,
                process: None,
            }),
            spec,
            backend: Arc::clone(&backend),
            stopped: std::sync::atomic::AtomicBool::new(false),
        });
        lock(&self.inner.services).insert(key.clone(), Arc::clone(&service));
        match launch(&self.inner, &*backend, &service).await {
            Ok(()) => {}
            Err(e) => {
                lock(&self.inner.services).remove(&key);
                let _ = backend.unpublish_port(sandbox, port).await;
                lock(&self.inner.ports).remove(&port);
                return Err(e.context(format_args!("starting service {}", key.1)));
            }
        }
        tokio::spawn(monitor(Arc::clone(&self.inner), backend, service.clone()));
        let info = lock(&service.info).clone();
        Ok(info)
    }

    /// Takes the lowest free port of the range that nothing on this host listens on.
    fn allocate(&self, sandbox: &SandboxId, name: &str) -> Result<u16> {
        let mut ports = lock(&self.inner.ports);
        let range = self.inner.range;
        for port in range.first..=range.last {
            if ports.contains_key(&port) {
                continue;
            }
            // Something outside this table may hold it; skip rather than collide.
            if std::net::TcpListener::bind(("127.0.0.1", port)).is_err() {
                continue;
            }
            ports.insert(port, (sandbox.clone(), name.to_owned()));
            return Ok(port);
        }
        Err(Error::limit_exceeded(format!(
            "all {} ports of the service range {}-{} are in use",
            range.len(),
            range.first,
            range.last
        )))
    }

    /// The services of `sandbox` (or of all), by name.
    pub fn list(&self, sandbox: Option<&SandboxId>) -> Vec<ServiceInfo> {
        let mut out: Vec<ServiceInfo> = lock(&self.inner.services)
            .values()
            .map(|s| lock(&s.info).clone())
            .filter(|i| sandbox.is_none_or(|s| &i.sandbox == s))
            .collect();
        out.sort_by(|a, b| (&a.sandbox, &a.name).cmp(&(&b.sandbox, &b.name)));
        out
    }

    /// The services of `sandbox` that ended and may not be restarted.
    pub fn unhealthy(&self, sandbox: &SandboxId) -> Vec<ServiceInfo> {
        self.list(Some(sandbox))
            .into_iter()
            .filter(|s| s.status == ServiceStatus::Unhealthy)
            .collect()
    }

    /// Stops a service: kills its process and releases its port.
    pub async fn stop(&self, sandbox: &SandboxId, name: &str) -> Result<()> {
        let key = (sandbox.clone(), name.to_owned());
        let service = lock(&self.inner.services).remove(&key).ok_or_else(|| {
            Error::not_found(format!("sandbox {sandbox} runs no service {name:?}"))
        })?;
        service
            .stopped
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let (process, port) = {
            let info = lock(&service.info);
            (info.process.clone(), info.port)
        };
        if let Some(process) = process {
            let ended = self.inner.background.wait(&process);
            let _ = self.inner.background.kill(&process);
            let _ = tokio::time::timeout(Duration::from_secs(10), ended).await;
            let _ = self.inner.background.forget(&process);
        }
        let _ = service.backend.unpublish_port(sandbox, port).await;
        lock(&self.inner.ports).remove(&port);
        Ok(())
    }

    /// Forgets every service of `sandbox` once the sandbox is gone (their processes went
    /// with it) and releases their ports.
    pub fn forget_sandbox(&self, sandbox: &SandboxId) {
        let gone: Vec<Arc<Service>> = {
            let mut services = lock(&self.inner.services);
            let keys: Vec<_> = services
                .keys()
                .filter(|(s, _)| s == sandbox)
                .cloned()
                .collect();
            keys.iter().filter_map(|k| services.remove(k)).collect()
        };
        let mut ports = lock(&self.inner.ports);
        for service in gone {
            service
                .stopped
                .store(true, std::sync::atomic::Ordering::SeqCst);
            ports.remove(&lock(&service.info).port);
        }
    }
}

async fn launch(inner: &Inner, backend: &dyn SandboxBackend, service: &Service) -> Result<()> {
    let (sandbox, port) = {
        let info = lock(&service.info);
        (info.sandbox.clone(), info.port)
    };
    let mut command = service.spec.command.clone();
    for arg in &mut command.argv {
        *arg = arg.replace("{port}", &port.to_string());
    }
    command.env.insert("PORT".to_owned(), port.to_string());
    let process = inner.background.start(backend, &sandbox, command).await?;
    lock(&service.info).process = Some(process.clone());
    let deadline = Instant::now() + service.spec.ready_timeout;
    loop {
        if probe(port, &service.spec.ready_path).await {
            lock(&service.info).status = ServiceStatus::Ready;
            return Ok(());
        }
        if let Some(status) = inner.background.info(&process).ok().and_then(|i| i.status) {
            return Err(Error::new(
                ErrorKind::Backend,
                format!("its process ended before answering on port {port} ({status:?})"),
            ));
        }
        if Instant::now() >= deadline {
            // Killed and waited for (bounded, as `stop` does), so the failed start has
            // ended when it returns.
            let ended = inner.background.wait(&process);
            let _ = inner.background.kill(&process);
            let _ = tokio::time::timeout(Duration::from_secs(10), ended).await;
            return Err(Error::new(
                ErrorKind::Timeout,
                format!(
                    "nothing answered on port {port} within {:?}; the process was killed",
                    service.spec.ready_timeout
                ),
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Watches a service's process; restarts it as the policy allows, else marks it
/// unhealthy.
async fn monitor(inner: Arc<Inner>, backend: Arc<dyn SandboxBackend>, service: Arc<Service>) {
    use std::sync::atomic::Ordering;
    loop {
        let Some(process) = lock(&service.info).process.clone() else {
            return;
        };
        let status = inner.background.wait(&process).await;
        if service.stopped.load(Ordering::SeqCst) {
            return;
        }
        let _ = inner.background.forget(&process);
        let restarts = lock(&service.info).restarts;
        let allowed = match (service.spec.restart, &status) {
            (RestartPolicy::Never, _) => false,
            (RestartPolicy::OnFailure { max }, Ok(s)) => !s.success() && restarts < max,
            (RestartPolicy::OnFailure { max }, Err(_)) => restarts < max,
            (RestartPolicy::Always { max }, _) => restarts < max,
        };
        if !allowed {
            let mut info = lock(&service.info);
            info.status = ServiceStatus::Unhealthy;
            info.process = None;
            tracing::warn!(service = %info.name, sandbox = %info.sandbox, ?status, "service ended and may not restart");
            return;
        }
        // A sandbox that is going away takes its services with it: no restart.
        let sandbox = lock(&service.info).sandbox.clone();
        let alive = matches!(
            backend.inspect(&sandbox).await.map(|i| i.status),
            Ok(crate::SandboxStatus::Running)
        );
        if !alive || service.stopped.load(Ordering::SeqCst) {
            let mut info = lock(&service.info);
            info.status = ServiceStatus::Unhealthy;
            info.process = None;
            return;
        }
        {
            let mut info = lock(&service.info);
            info.status = ServiceStatus::Restarting;
            info.restarts += 1;
            info.process = None;
        }
        if let Err(e) = launch(&inner, &*backend, &service).await {
            tracing::warn!(error = %e, "restarting a service failed");
            if service.stopped.load(Ordering::SeqCst) {
                return;
            }
            // The failed launch counts as a run that ended; the loop decides again.
            if lock(&service.info).process.is_none() {
                lock(&service.info).status = ServiceStatus::Unhealthy;
                return;
            }
        }
    }
}

/// Whether something answers HTTP on `127.0.0.1:port` (any status line counts).
async fn probe(port: u16, path: &str) -> bool {
    let attempt = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        let request = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut head = [0u8; 5];
        stream.read_exact(&mut head).await.ok()?;
        Some(&head == b"HTTP/")
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(2), attempt).await,
        Ok(Some(true))
    )
}
