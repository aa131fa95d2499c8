//! `sandcell-server`'s HTTP surface: any [`SandboxBackend`] served as the Fly Machines
//! API subset sandcell's client uses, plus one upgrade to sandcell's wire protocol for
//! everything done inside a machine.
//!
//! | route (under `/v1`) | what |
//! |---|---|
//! | `POST /apps/{app}/machines` | create (`config.image` is the template; unique `name`) |
//! | `GET /apps/{app}/machines` | list the app's machines (`?metadata.{key}={value}` filters) |
//! | `GET/DELETE /apps/{app}/machines/{id}` | inspect, destroy (`404` once gone) |
//! | `GET .../wait?state=&timeout=` | wait for a state, `408` after `timeout` (≤ 60 s) |
//! | `POST .../suspend`, `.../stop`, `.../start`, `.../restart` | pause, pause, resume, reset |
//! | `POST .../exec` | a command, buffered (Fly's shape) |
//! | `GET .../sandcell/wire` | upgrades to sandcell's [wire protocol](sandcell::raw::wire): every per-machine operation (streamed commands with stdin and signals, files, archives, changes) on one connection |
//! | `GET /sandcell/capabilities` | the served backend and what it can do |
//!
//! Every route needs `Authorization: Bearer <token>` (or `FlyV1 <token>`); the token
//! names the [`Tenant`] the request speaks for, and a tenant sees only its own machines
//! (another tenant's answer `404` on every route). Errors are
//! `{"error": ..., "kind": ...}` with a status from [`sandcell_remote::protocol::status_for`].

mod command_slots;
mod config;
mod connection_shares;
mod e2b;
mod exec;
pub(crate) mod labels;
mod listen;
pub(crate) mod machines;
#[cfg(feature = "mcp")]
mod mcp;
#[cfg(feature = "mcp")]
mod mcp_quotas;
mod private_paths;
mod requests;
mod sandbox_locks;
mod tenants;
pub mod testing;
mod tls;
mod wire;

pub use config::{Face, HostPath, ServerConfig};
pub use tenants::{Tenant, TenantsFile, TENANT_LABEL};
pub use tls::Tls;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use sandcell::{Error, ErrorKind, SandboxBackend, SandboxId, SandboxInfo};

pub(crate) use labels::client_metadata;
use sandcell_remote::protocol::{status_for, ErrorBody};
pub(crate) use tenants::Caller;

/// Locks a mutex, recovering the data if a panicking holder poisoned it: every value kept
/// under these locks stays consistent between statements.
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The prefix of every label the server sets; a client's labels with it are refused
/// ([`labels::Reserved`]).
pub(crate) const SERVER_LABEL_PREFIX: &str = "sandcell.server.";

/// Label naming the app a machine belongs to.
pub(crate) const APP_LABEL: &str = "sandcell.server.app";
/// Label holding a machine's unique name.
pub(crate) const NAME_LABEL: &str = "sandcell.server.name";
/// Label holding a machine's region.
pub(crate) const REGION_LABEL: &str = "sandcell.server.region";

/// What every handler shares.
pub(crate) struct Shared {
    pub(crate) backend: Arc<dyn SandboxBackend>,
    pub(crate) config: ServerConfig,
    /// The tenants, shared with the requests that authenticate as them.
    pub(crate) tenants: Vec<Arc<Tenant>>,
    /// Machines stopped (rather than suspended): both are paused sandboxes.
    pub(crate) stopped: Mutex<HashSet<SandboxId>>,
    /// Each tenant's budget for files passing through whole
    /// ([`ServerConfig::max_transfer_bytes_per_tenant`]).
    transfers: std::collections::HashMap<String, sandcell::raw::budget::ByteBudget>,
    /// Each tenant's archive streams on the wire
    /// ([`ServerConfig::max_archive_streams_per_tenant`]).
    archive_streams: sandcell::raw::TenantSlots,
    /// Each tenant's file watches ([`ServerConfig::max_watches_per_tenant`]).
    watches: sandcell::raw::TenantSlots,
    /// What the E2B face keeps: processes, watchers, lifetimes.
    pub(crate) e2b: e2b::E2bState,
    /// The code interpreters of the sandboxes code ran in
    /// ([`ServerConfig::code_python`]).
    pub(crate) code: sandcell::code::Interpreters,
    /// Each tenant's streaming code runs ([`ServerConfig::max_code_runs_per_tenant`]).
    pub(crate) code_runs: sandcell::raw::TenantSlots,
    /// The labels no client may set or filter on.
    pub(crate) reserved: labels::Reserved,
    /// Lifecycle changes of one sandbox do not interleave.
    pub(crate) lifecycle: sandbox_locks::SandboxLocks,
    /// How many connections each tenant holds
    /// ([`ServerConfig::max_connections_per_tenant`]).
    connections: Arc<connection_shares::ConnectionShares>,
}

impl Shared {
    /// Holds `caller`'s create lock: the name check, the quota count and the create
    /// of one tenant do not interleave, and no other tenant waits on them.
    pub(crate) async fn creating(&self, caller: &Caller) -> tokio::sync::OwnedMutexGuard<()> {
        self.config.create_locks.hold(&caller.0.name).await
    }
}

impl Shared {
    /// The budget `tenant`'s whole-file transfers share (a tenant the server does not
    /// have gets none).
    pub(crate) fn transfers(&self, tenant: &str) -> sandcell::raw::budget::ByteBudget {
        self.transfers
            .get(tenant)
            .cloned()
            .unwrap_or_else(|| sandcell::raw::budget::ByteBudget::new(0))
    }
}

impl Shared {
    /// Counts the connection `request` came on against `tenant`
    /// ([`ServerConfig::max_connections_per_tenant`]); a request served other than
    /// through [`serve`] or [`serve_tls`] has no connection to count.
    pub(crate) fn claim_connection(&self, request: &Request, tenant: &str) -> sandcell::Result<()> {
        match request
            .extensions()
            .get::<connection_shares::ConnectionClaim>()
        {
            Some(owner) => owner.claim(
                &self.connections,
                tenant,
                self.config.max_connections_per_tenant,
            ),
            None => Ok(()),
        }
    }
}

impl Shared {
    /// The file watches `tenant` may hold.
    pub(crate) fn watches(&self, tenant: &str) -> Arc<tokio::sync::Semaphore> {
        self.watches.semaphore(tenant)
    }

    /// A place among `tenant`'s file watches, held for as long as the watch lives.
    pub(crate) fn watch_slot(
        &self,
        tenant: &str,
    ) -> sandcell::Result<tokio::sync::OwnedSemaphorePermit> {
        self.watches.slot(tenant)
    }

    /// The archive streams `tenant`'s wire connections share.
    pub(crate) fn archive_streams(&self, tenant: &str) -> Arc<tokio::sync::Semaphore> {
        self.archive_streams.semaphore(tenant)
    }
}

pub(crate) type AppState = Arc<Shared>;

/// The router serving `backend`; hand it to `axum::serve`.
pub fn router(backend: Arc<dyn SandboxBackend>, config: ServerConfig) -> Router {
    let json_limit = config.max_json_bytes;
    let faces = config.faces.clone();
    private_paths::register(&config.private_paths);
    config.commands.set_cap(config.max_commands_per_tenant);
    // An empty token never authenticates anyone.
    let tenants: Vec<Arc<Tenant>> = config
        .tenants
        .iter()
        .filter(|t| !t.token.is_empty())
        .cloned()
        .map(Arc::new)
        .collect();
    let reserved = labels::Reserved {
        #[cfg(feature = "mcp")]
        manager_id: config
            .mcp
            .as_ref()
            .map(|manager| manager.manager_id().to_owned()),
        #[cfg(not(feature = "mcp"))]
        manager_id: None,
        #[cfg(feature = "mcp")]
        store_id: config
            .mcp
            .as_ref()
            .map(|manager| manager.store_id().to_owned()),
        #[cfg(not(feature = "mcp"))]
        store_id: None,
    };
    let transfer_bytes = (config.max_file_bytes as u64).max(config.max_transfer_bytes_per_tenant);
    let streams = config.max_archive_streams_per_tenant;
    let watches = config.max_watches_per_tenant;
    let code_python = config.code_python.clone();
    let code_runs = config.max_code_runs_per_tenant;
    let state = Arc::new(Shared {
        backend,
        config,
        transfers: tenants
            .iter()
            .map(|t| {
                (
                    t.name.clone(),
                    sandcell::raw::budget::ByteBudget::new(transfer_bytes),
                )
            })
            .collect(),
        archive_streams: sandcell::raw::TenantSlots::new(
            streams,
            "archive streams open",
            "end one first",
        ),
        watches: sandcell::raw::TenantSlots::new(watches, "file watches", "end one first"),
        code: sandcell::code::Interpreters::new(
            sandcell::code::CodeInterpreterOptions::new().python(&code_python),
        ),
        code_runs: sandcell::raw::TenantSlots::new(
            code_runs,
            "code runs streaming",
            "wait for one to end",
        ),
        tenants,
        reserved,
        lifecycle: Default::default(),
        connections: Default::default(),
        stopped: Mutex::new(HashSet::new()),
        e2b: e2b::E2bState::default(),
    });
    // The Fly face and sandcell's extensions authenticate with `Authorization`; the
    // E2B face has its own two schemes (API key, envd access token), MCP the first.
    let mut routes = Router::new();
    if faces.contains(&Face::Fly) {
        routes = routes.merge(fly_routes());
    }
    if faces.contains(&Face::Wire) {
        routes = routes.merge(wire_routes());
    }
    let mut routes = routes.layer(axum::middleware::from_fn_with_state(
        Arc::clone(&state),
        authorize,
    ));
    if faces.contains(&Face::E2b) {
        e2b::start_reaper(&state);
        routes = routes.merge(e2b::routes(&state));
    }
    #[cfg(feature = "mcp")]
    if let (true, Some(manager)) = (faces.contains(&Face::Mcp), &state.config.mcp) {
        routes = routes.merge(mcp::routes(&state, Arc::clone(manager)));
    }
    routes
        .fallback(|| async { ApiError(Error::not_found("no such route")) })
        .method_not_allowed_fallback(|| async {
            let mut response =
                ApiError(Error::invalid_input("this route does not take that method"))
                    .into_response();
            *response.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
            response
        })
        .layer(DefaultBodyLimit::max(json_limit))
        .with_state(state)
}

/// The Fly Machines API subset.
fn fly_routes() -> Router<AppState> {
    let machine = "/v1/apps/{app}/machines/{id}";
    Router::new()
        .route(
            "/v1/apps/{app}/machines",
            post(machines::create).get(machines::list),
        )
        .route(machine, get(machines::get).delete(machines::destroy))
        .route(&format!("{machine}/wait"), get(machines::wait))
        .route(&format!("{machine}/suspend"), post(machines::suspend))
        .route(&format!("{machine}/stop"), post(machines::stop))
        .route(&format!("{machine}/start"), post(machines::start))
        .route(&format!("{machine}/restart"), post(machines::restart))
        .route(&format!("{machine}/exec"), post(exec::buffered))
}

/// sandcell's extensions of the Fly face: capabilities, the wire upgrade, clones.
fn wire_routes() -> Router<AppState> {
    let machine = "/v1/apps/{app}/machines/{id}";
    Router::new()
        .route("/v1/sandcell/capabilities", get(machines::server_info))
        .route(&format!("{machine}/sandcell/wire"), get(wire::upgrade))
        .route(&format!("{machine}/sandcell/clone"), post(machines::clone))
}

/// Serves `backend` on `listener` until `shutdown` resolves, then waits for the
/// connections it has to finish their requests. At most
/// [`ServerConfig::max_connections`] are served at once (one tenant's at most
/// [`ServerConfig::max_connections_per_tenant`]), and one is closed whose
/// request head takes longer than [`ServerConfig::header_read_timeout`], whose
/// request body stalls for [`ServerConfig::body_read_timeout`], or that has no request
/// in flight for [`ServerConfig::idle_timeout`].
pub async fn serve(
    listener: tokio::net::TcpListener,
    backend: Arc<dyn SandboxBackend>,
    config: ServerConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (bounds, admission) = listen::bounds_of(&config)?;
    listen::run(
        listener,
        admission,
        bounds,
        router(backend, config),
        shutdown,
    )
    .await;
    Ok(())
}

/// As [`serve`], over TLS with `tls`'s certificate: what to expose beyond loopback.
///
/// ```no_run
/// use std::sync::Arc;
/// use sandcell_server::{serve_tls, ServerConfig, Tls};
///
/// # async fn demo(backend: Arc<dyn sandcell::SandboxBackend>) -> Result<(), Box<dyn std::error::Error>> {
/// let tls = Tls::from_pem_files("/etc/sandcell/cert.pem", "/etc/sandcell/key.pem")?;
/// let listener = tokio::net::TcpListener::bind("0.0.0.0:7711").await?;
/// let config = ServerConfig::new("a-long-random-secret");
/// serve_tls(listener, tls, backend, config, std::future::pending()).await?;
/// # Ok(())
/// # }
/// ```
pub async fn serve_tls(
    listener: tokio::net::TcpListener,
    tls: Tls,
    backend: Arc<dyn SandboxBackend>,
    config: ServerConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (bounds, admission) = listen::bounds_of(&config)?;
    let listener = tls::TlsListener::new(listener, &tls, admission.clone());
    listen::run(
        listener,
        admission,
        bounds,
        router(backend, config),
        shutdown,
    )
    .await;
    Ok(())
}

/// Refuses requests without a tenant's token (before any body is read); lets the
/// others through carrying their [`tenants::Caller`].
async fn authorize(State(state): State<AppState>, mut request: Request, next: Next) -> Response {
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("FlyV1 "))
        });
    match given.and_then(|t| tenants::authenticate(&state.tenants, t.as_bytes())) {
        Some(tenant) => {
            if let Err(e) = state.claim_connection(&request, &tenant.name) {
                let mut response = ApiError(e).into_response();
                *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
                return requests::closing(response);
            }
            request.extensions_mut().insert(tenants::Caller(tenant));
            next.run(request).await
        }
        None => {
            let mut response = ApiError(Error::new(
                ErrorKind::PermissionDenied,
                "a valid `Authorization: Bearer <token>` header is required",
            ))
            .into_response();
            *response.status_mut() = StatusCode::UNAUTHORIZED;
            response
        }
    }
}

/// The answer of a call that only acts.
pub(crate) fn ok() -> Json<serde_json::Value> {
    Json(serde_json::json!({"ok": true}))
}

/// An error as the API answers it.
pub(crate) struct ApiError(pub(crate) Error);

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        ApiError(e)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(status_for(self.0.kind()))
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = ErrorBody {
            error: public_message(&self.0),
            kind: Some(self.0.kind().name().to_owned()),
        };
        (status, Json(body)).into_response()
    }
}

/// What a client is told of `error`, at every face's boundary (ADVERSARIAL case 41):
/// a `Backend` error is the server's own failure, whose message may name host paths
/// (a cgroup directory, the backend's root), so it is logged in full under a reference
/// and answered with that reference alone. The other kinds describe what the client
/// asked for and pass, with any mention of a private host directory
/// ([`ServerConfig::private_paths`]) or of a process's descriptors (`/proc/.../fd/...`)
/// cut out: a call racing its sandbox's destroy, say, fails `NotFound` on a host path.
pub(crate) fn public_message(error: &Error) -> String {
    if error.kind() != ErrorKind::Backend {
        return private_paths::scrub(&error.to_string());
    }
    let reference = uuid::Uuid::new_v4().simple().to_string();
    let reference = &reference[..12];
    tracing::warn!(reference, error = %format_args!("{error:#}"), "a backend error, answered without its details");
    format!("the server's backend failed (reference {reference}; the server's log has the details)")
}

pub(crate) type ApiResult<T> = Result<T, ApiError>;

/// A JSON body, with malformed ones answered as `InvalidInput` in the API's shape.
pub(crate) struct JsonBody<T>(pub(crate) T);

impl<T, S> axum::extract::FromRequest<S> for JsonBody<T>
where
    T: serde::de::DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = Response;

    /// A body over [`ServerConfig::max_json_bytes`] is `413` (kind `limit_exceeded`),
    /// any other malformed one `400`.
    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        match Json::<T>::from_request(request, state).await {
            Ok(Json(value)) => Ok(JsonBody(value)),
            Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                let error = Error::new(ErrorKind::LimitExceeded, rejection.body_text());
                let mut response = ApiError(error).into_response();
                *response.status_mut() = StatusCode::PAYLOAD_TOO_LARGE;
                Err(response)
            }
            Err(rejection) => {
                Err(ApiError(Error::invalid_input(rejection.body_text())).into_response())
            }
        }
    }
}

/// Path parameters, with undecodable ones (bad percent-encoding, invalid UTF-8)
/// answered as `InvalidInput` in the API's shape rather than axum's plain text.
pub(crate) struct PathParams<T>(pub(crate) T);

impl<T, S> axum::extract::FromRequestParts<S> for PathParams<T>
where
    T: serde::de::DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(value)) => Ok(PathParams(value)),
            Err(rejection) => Err(ApiError(Error::invalid_input(rejection.body_text()))),
        }
    }
}

/// The sandbox behind `app`'s machine `id`; `NotFound` if it is another app's or
/// another tenant's, exactly as if it did not exist.
pub(crate) async fn machine(
    state: &Shared,
    caller: &Caller,
    app: &str,
    id: &str,
) -> ApiResult<SandboxInfo> {
    let missing = || ApiError(Error::not_found(format!("machine {id} not found")));
    let id = SandboxId::new(id).map_err(|_| missing())?;
    let info = match state.backend.inspect(&id).await {
        Err(e) if e.kind() == ErrorKind::NotFound => return Err(missing()),
        other => other?,
    };
    let owned = info.labels.get(APP_LABEL).map(String::as_str) == Some(app)
        && info.labels.get(tenants::TENANT_LABEL) == Some(&caller.0.name);
    if !owned {
        return Err(missing());
    }
    Ok(info)
}

/// As [`machine`], holding the sandbox's lifecycle lock: the state answered is the
/// state the caller acts on, with no other pause, resume or destroy of it between.
pub(crate) async fn machine_held(
    state: &Shared,
    caller: &Caller,
    app: &str,
    id: &str,
) -> ApiResult<(tokio::sync::OwnedMutexGuard<()>, SandboxInfo)> {
    // Owned first, so no one waits on (or learns of) another tenant's sandbox's lock.
    let info = machine(state, caller, app, id).await?;
    let held = state.lifecycle.hold(&info.id).await;
    Ok((held, machine(state, caller, app, id).await?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ADVERSARIAL case 41: a backend's own failure reaches no client with its host
    /// paths; what a client asked for keeps its message.
    #[test]
    fn backend_errors_are_answered_without_their_details() {
        let failed = Error::new(
            ErrorKind::Backend,
            "writing /sys/fs/cgroup/sandcell/sb-1/cpu.max: Invalid argument",
        );
        let told = public_message(&failed);
        assert!(!told.contains("/sys") && !told.contains("cgroup"), "{told}");
        assert!(told.contains("reference"), "{told}");
        let asked = Error::invalid_input("a cpu limit of 0 leaves the sandbox nothing");
        assert_eq!(public_message(&asked), asked.to_string());
    }

    /// ADVERSARIAL case 41: an error of a kind that passes (a call racing its
    /// sandbox's destroy is `NotFound`) still names no private host directory and no
    /// process's descriptors.
    #[test]
    fn private_host_paths_are_cut_out_of_every_answer() {
        private_paths::register(&[std::path::PathBuf::from("/srv/sandcell-private")]);
        let raced = Error::not_found(
            "opening workspace /srv/sandcell-private/sandboxes/local-1/disk/workspace: gone",
        );
        let told = public_message(&raced);
        assert!(!told.contains("/srv/sandcell-private"), "{told}");
        assert!(!told.contains("local-1/disk"), "{told}");
        assert!(
            told.starts_with("opening workspace <host path>: gone"),
            "{told}"
        );
        let fds = Error::not_found("cannot open /proc/9935/fd/28/ns/user: gone");
        let told = public_message(&fds);
        assert!(!told.contains("9935"), "{told}");
        let own = Error::not_found("src/main.rs does not exist");
        assert_eq!(
            public_message(&own),
            own.to_string(),
            "a sandbox path stays"
        );
    }
}
