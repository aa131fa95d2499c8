//! The control plane: the [`ControlPlane`] trait a remote backend drives, and its Fly
//! Machines implementation.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use reqwest::Method;
use sandcell::{Error, ErrorKind, Result};

use super::state::MachineState;
use crate::http::{Body, Call, Class, Http};
use crate::protocol::{
    CloneMachineRequest, CreateMachineRequest, ExecBody, ExecResponse, Machine, StopBody,
};

/// The machine lifecycle calls a remote backend needs from a provider.
///
/// One implementation today, [`FlyMachines`]. It stays a trait for two reasons:
/// [`FlyBackend::control_plane`](super::FlyBackend::control_plane) hands it out for the
/// machine-level calls a caller may need beyond `SandboxBackend` (waiting for a state,
/// stopping without suspending), and the exec-based file layer and a provider with the
/// same lifecycle behind another API take it as `dyn`, not as Fly's client.
///
/// # Behavior
/// - `create` makes at most one machine per call, whatever fails on the way: an answer
///   that is lost is resolved by looking the machine up by its name.
/// - `get` of a destroyed machine is `NotFound`; `destroy` of one succeeds.
/// - `wait` returns once the machine is in `state`, `Timeout` at `deadline`.
#[async_trait]
pub trait ControlPlane: Send + Sync + std::fmt::Debug + 'static {
    /// Creates a machine; `request.name` must be set and unique.
    async fn create(&self, request: &CreateMachineRequest) -> Result<Machine>;
    /// One machine.
    async fn get(&self, id: &str) -> Result<Machine>;
    /// Every machine of the app.
    async fn list(&self) -> Result<Vec<Machine>>;
    /// Waits until the machine is in `state` (or, for `Destroyed`, gone).
    async fn wait(
        &self,
        id: &str,
        state: MachineState,
        version: Option<&str>,
        deadline: Instant,
    ) -> Result<()>;
    /// Suspends it (memory kept).
    async fn suspend(&self, id: &str) -> Result<()>;
    /// Starts (or resumes) it.
    async fn start(&self, id: &str) -> Result<()>;
    /// Stops it.
    async fn stop(&self, id: &str) -> Result<()>;
    /// Restarts it.
    async fn restart(&self, id: &str) -> Result<()>;
    /// Destroys it, forcibly if running; a machine already gone succeeds.
    async fn destroy(&self, id: &str) -> Result<()>;
    /// Runs a command to the end.
    async fn exec(&self, id: &str, request: &ExecBody) -> Result<ExecResponse>;
    /// Clones a running machine into a new one; `request.name` must be set and unique.
    /// `Unsupported` where the provider cannot (the default).
    async fn clone_machine(&self, id: &str, request: &CloneMachineRequest) -> Result<Machine> {
        let _ = request;
        Err(Error::unsupported(format!(
            "this control plane cannot clone machine {id}"
        )))
    }
}

/// The Fly Machines API (or anything that speaks it, like `sandcell-server`).
#[derive(Debug, Clone)]
pub struct FlyMachines {
    http: Arc<Http>,
    app: String,
}

/// The longest single `wait` call, as the API caps it.
const WAIT_CAP: Duration = Duration::from_secs(60);

impl FlyMachines {
    pub(crate) fn new(http: Arc<Http>, app: impl Into<String>) -> Self {
        FlyMachines {
            http,
            app: app.into(),
        }
    }

    fn machines(&self) -> String {
        format!("/v1/apps/{}/machines", self.app)
    }

    fn machine(&self, id: &str, tail: &str) -> String {
        format!("/v1/apps/{}/machines/{id}{tail}", self.app)
    }

    fn call<'a>(
        &self,
        method: Method,
        path: String,
        class: Class,
        action: &'static str,
        scope: &str,
    ) -> Call<'a> {
        // Reads and deletes repeat safely; so do start/stop/suspend/restart, which
        // leave the same state however often they land.
        let idempotent = !matches!(action, "create" | "clone" | "exec");
        Call {
            method,
            path,
            body: Body::None,
            idempotent,
            class,
            action,
            scope: scope.to_owned(),
        }
    }

    /// The machine named `name`, if any.
    async fn find_by_name(&self, name: &str) -> Result<Option<Machine>> {
        Ok(self
            .list()
            .await?
            .into_iter()
            .find(|m| m.name == name && m.state != MachineState::Destroyed.as_str()))
    }

    /// Posts `body` to `path` to make machine `name`, at most once whatever fails on
    /// the way: an answer that is lost is resolved by looking the name up.
    async fn create_named(
        &self,
        name: Option<&str>,
        path: String,
        body: &serde_json::Value,
        action: &'static str,
        scope: &str,
    ) -> Result<Machine> {
        let name = name.filter(|n| !n.is_empty()).ok_or_else(|| {
            Error::invalid_input(format!("a {action} needs a unique machine name"))
        })?;
        let mut attempt = 0u32;
        loop {
            let mut call = self.call(Method::POST, path.clone(), Class::Mutation, action, scope);
            call.body = Body::Json(body);
            let error = match self.http.json::<Machine>(call).await {
                Ok(machine) => return Ok(machine),
                // Our own earlier attempt may have made it: the name says.
                Err(e) if e.kind() == ErrorKind::AlreadyExists && attempt > 0 => e,
                Err(e) if !e.is_temporary() => return Err(e),
                Err(e) => e,
            };
            // The call may or may not have happened: look before trying again, so at
            // most one machine carries this name.
            tracing::debug!(%name, error = %error, "resolving an ambiguous {action}");
            if let Some(machine) = self.find_by_name(name).await? {
                return Ok(machine);
            }
            if attempt >= self.http.retry.retries {
                return Err(error.context(format_args!("{action} of machine {name}")));
            }
            tokio::time::sleep(self.http.retry.backoff(attempt)).await;
            attempt += 1;
        }
    }

    async fn post_action(&self, id: &str, action: &'static str) -> Result<()> {
        self.http
            .send(self.call(
                Method::POST,
                self.machine(id, &format!("/{action}")),
                Class::Mutation,
                action,
                id,
            ))
            .await
            .map(drop)
    }
}

#[async_trait]
impl ControlPlane for FlyMachines {
    async fn create(&self, request: &CreateMachineRequest) -> Result<Machine> {
        let body = serde_json::to_value(request)
            .map_err(|e| Error::with_source(ErrorKind::Backend, "encoding a create", e))?;
        self.create_named(
            request.name.as_deref(),
            self.machines(),
            &body,
            "create",
            &self.app,
        )
        .await
    }

    async fn get(&self, id: &str) -> Result<Machine> {
        let machine: Machine = self
            .http
            .json(self.call(Method::GET, self.machine(id, ""), Class::Read, "get", id))
            .await?;
        if machine.state == MachineState::Destroyed.as_str() {
            return Err(Error::not_found(format!("machine {id} is destroyed")));
        }
        Ok(machine)
    }

    async fn list(&self) -> Result<Vec<Machine>> {
        self.http
            .json(self.call(Method::GET, self.machines(), Class::Read, "list", &self.app))
            .await
    }

    async fn wait(
        &self,
        id: &str,
        state: MachineState,
        version: Option<&str>,
        deadline: Instant,
    ) -> Result<()> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::new(
                    ErrorKind::Timeout,
                    format!("machine {id} did not reach state {}", state.as_str()),
                ));
            }
            let seconds = left.min(WAIT_CAP).as_secs().max(1);
            let mut path = self.machine(
                id,
                &format!("/wait?state={}&timeout={seconds}", state.as_str()),
            );
            if let Some(version) = version.filter(|v| !v.is_empty()) {
                path.push_str(&format!("&version={version}"));
            }
            match self
                .http
                .send(self.call(Method::GET, path, Class::Read, "wait", id))
                .await
            {
                Ok(_) => return Ok(()),
                // 408: the API's own cap passed; ask again until ours does.
                Err(e) if e.kind() == ErrorKind::Timeout => continue,
                Err(e) if e.kind() == ErrorKind::NotFound && state == MachineState::Destroyed => {
                    return Ok(())
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn suspend(&self, id: &str) -> Result<()> {
        self.post_action(id, "suspend").await
    }

    async fn start(&self, id: &str) -> Result<()> {
        self.post_action(id, "start").await
    }

    async fn stop(&self, id: &str) -> Result<()> {
        let body = serde_json::to_value(StopBody {
            signal: Some("SIGKILL".to_owned()),
            timeout: None,
        })
        .map_err(|e| Error::with_source(ErrorKind::Backend, "encoding a stop", e))?;
        let mut call = self.call(
            Method::POST,
            self.machine(id, "/stop"),
            Class::Mutation,
            "stop",
            id,
        );
        call.body = Body::Json(&body);
        self.http.send(call).await.map(drop)
    }

    async fn restart(&self, id: &str) -> Result<()> {
        self.post_action(id, "restart").await
    }

    async fn destroy(&self, id: &str) -> Result<()> {
        let call = self.call(
            Method::DELETE,
            self.machine(id, "?force=true"),
            Class::Mutation,
            "destroy",
            id,
        );
        match self.http.send(call).await {
            Ok(_) => Ok(()),
            // Gone already (or by an earlier attempt whose answer was lost): destroyed.
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn exec(&self, id: &str, request: &ExecBody) -> Result<ExecResponse> {
        let body = serde_json::to_value(request)
            .map_err(|e| Error::with_source(ErrorKind::Backend, "encoding an exec", e))?;
        let mut call = self.call(
            Method::POST,
            self.machine(id, "/exec"),
            Class::Mutation,
            "exec",
            id,
        );
        call.body = Body::Json(&body);
        self.http.json(call).await
    }

    /// sandcell-server's extension route; a plain Fly endpoint answers 404 there, which
    /// the backend never reaches (it claims `clone` only against a sandcell-server).
    async fn clone_machine(&self, id: &str, request: &CloneMachineRequest) -> Result<Machine> {
        let body = serde_json::to_value(request)
            .map_err(|e| Error::with_source(ErrorKind::Backend, "encoding a clone", e))?;
        self.create_named(
            request.name.as_deref(),
            self.machine(id, "/sandcell/clone"),
            &body,
            "clone",
            id,
        )
        .await
    }
}
