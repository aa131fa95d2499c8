//! The Fly Machines routes: create, list, get, wait, suspend/stop/start/restart, destroy.

use std::time::{Duration, Instant};

use axum::extract::{Extension, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use sandcell::{Error, ErrorKind, SandboxInfo, SandboxSpec, SandboxStatus};
use serde::Deserialize;

use super::{
    machine, machine_held, tenants, ApiError, ApiResult, AppState, Caller, JsonBody, PathParams,
    Shared, APP_LABEL, NAME_LABEL, REGION_LABEL,
};
use sandcell_remote::protocol::{
    CloneMachineRequest, CreateMachineRequest, Machine, MachineConfig, ServerInfo, StopBody,
    WaitResponse, SPEC_METADATA,
};
use sandcell_remote::MachineState;

/// The longest a `wait` blocks, as Fly's.
const MAX_WAIT: Duration = Duration::from_secs(60);

pub(super) async fn server_info(State(state): State<AppState>) -> Json<ServerInfo> {
    Json(ServerInfo {
        backend: state.backend.name().to_owned(),
        capabilities: served_capabilities(&state),
    })
}

/// What a client gets: port publishing has no route, and host mounts need a host
/// directory the operator allowed.
pub(crate) fn served_capabilities(state: &Shared) -> sandcell::Capabilities {
    let mut caps = state.backend.capabilities();
    caps.port_exposure = false;
    caps.host_mounts &= !state.config.host_paths.is_empty();
    caps
}

/// Refuses a spec's host mount unless it resolves beneath a directory the operator
/// allowed (links followed, so `..` and symbolic links cannot lead out), and is
/// read-only unless that directory allows writes.
fn check_host_mounts(spec: &SandboxSpec, allowed: &[super::HostPath]) -> Result<(), ApiError> {
    for mount in &spec.mounts {
        let refused = |why: String| {
            ApiError(Error::new(
                ErrorKind::PermissionDenied,
                format!("host mount of {}: {why}", mount.host.display()),
            ))
        };
        if allowed.is_empty() {
            return Err(refused(
                "this server allows no host mounts (its operator can allow directories \
                 with --allow-host-path)"
                    .to_owned(),
            ));
        }
        let real = std::fs::canonicalize(&mount.host)
            .map_err(|e| refused(format!("it cannot be resolved on the server ({e})")))?;
        let rule = allowed.iter().find(|rule| {
            std::fs::canonicalize(&rule.dir).is_ok_and(|dir| real.starts_with(dir))
                && (mount.read_only || rule.writable)
        });
        if rule.is_none() {
            let writable = if mount.read_only { "" } else { " writable" };
            return Err(refused(format!(
                "it is not beneath a{writable} host directory this server allows"
            )));
        }
    }
    Ok(())
}

pub(super) async fn create(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    PathParams(app): PathParams<String>,
    JsonBody(request): JsonBody<CreateMachineRequest>,
) -> ApiResult<Response> {
    let mut spec = spec_from(&request)?;
    check_host_mounts(&spec, &state.config.host_paths)?;
    tenants::claim(&mut spec, &caller.0, &state)?;
    label_machine(&mut spec, &app, &request);
    // One create at a time per tenant: its name check, quota count and create must
    // not interleave (another tenant's slow create holds up none of them).
    let _creating = state.creating(&caller).await;
    if let Err(refused) = admit(&state, &caller, &app, &spec).await {
        return fly_refusal(refused);
    }
    let info = state.backend.create(&spec).await?;
    Ok(Json(machine_of(&state, &info)).into_response())
}

/// Whether the caller may add `spec`'s machine (named by its [`NAME_LABEL`]) to `app`:
/// a name the caller already uses there is `AlreadyExists`; a quota it would exceed is
/// `LimitExceeded`. Callers hold the tenant's create lock.
pub(super) async fn admit(
    state: &Shared,
    caller: &Caller,
    app: &str,
    spec: &SandboxSpec,
) -> sandcell::Result<()> {
    let name = spec.labels.get(NAME_LABEL).cloned().unwrap_or_default();
    let selector = tenants::selector(&caller.0)
        .label(APP_LABEL, app)
        .label(NAME_LABEL, &name);
    if !state.backend.list(&selector).await?.is_empty() {
        return Err(Error::new(
            ErrorKind::AlreadyExists,
            format!("a machine named {name:?} already exists in app {app}"),
        ));
    }
    tenants::check_quota(state.backend.as_ref(), &caller.0, spec).await
}

/// An admission refused, as the Fly face answers it: a quota is `403`.
fn fly_refusal(refused: Error) -> ApiResult<Response> {
    if refused.kind() == ErrorKind::LimitExceeded {
        return Ok(tenants::refusal_response(&refused));
    }
    Err(ApiError(refused))
}

/// A clone of a running machine into a new one of the same app (and region), under
/// the caller's quotas like a create.
pub(super) async fn clone(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    PathParams((app, id)): PathParams<(String, String)>,
    JsonBody(request): JsonBody<CloneMachineRequest>,
) -> ApiResult<Response> {
    let source = machine(&state, &caller, &app, &id).await?;
    let mut labels = request.metadata;
    tenants::claim_clone(&mut labels, &caller.0, &source, &state.reserved)?;
    let name = request
        .name
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| format!("machine-{}", uuid::Uuid::new_v4().simple()));
    labels.insert(APP_LABEL.to_owned(), app.clone());
    labels.insert(NAME_LABEL.to_owned(), name);
    if let Some(region) = source.labels.get(REGION_LABEL) {
        labels.insert(REGION_LABEL.to_owned(), region.clone());
    }
    let mut counted = SandboxSpec::new(source.template.clone());
    counted.labels = labels.clone();
    let _creating = state.creating(&caller).await;
    if let Err(refused) = admit(&state, &caller, &app, &counted).await {
        return fly_refusal(refused);
    }
    let info = state.backend.clone_sandbox(&source.id, labels).await?;
    Ok(Json(machine_of(&state, &info)).into_response())
}

/// The sandcell spec a create asks for: [`SPEC_METADATA`] when given, with the Fly
/// config's image, env and guest on top.
fn spec_from(request: &CreateMachineRequest) -> Result<SandboxSpec, ApiError> {
    let config = &request.config;
    let mut spec = match config.metadata.get(SPEC_METADATA) {
        Some(json) => serde_json::from_str::<SandboxSpec>(json).map_err(|e| {
            ApiError(Error::invalid_input(format!(
                "metadata {SPEC_METADATA} is not a sandcell spec: {e}"
            )))
        })?,
        None => SandboxSpec::new(config.image.clone()),
    };
    if !config.image.is_empty() {
        spec.template = config.image.clone();
    }
    spec.env.extend(config.env.clone());
    if let Some(guest) = &config.guest {
        if let Some(cpus) = guest.cpus {
            spec.limits
                .cpu_millis
                .get_or_insert(cpus.saturating_mul(1000));
        }
        if let Some(mb) = guest.memory_mb {
            spec.limits
                .memory_bytes
                .get_or_insert(mb.saturating_mul(1 << 20));
        }
    }
    // Every metadata entry is kept, the spec too, so the machine answers its metadata
    // as given, as Fly does.
    for (key, value) in &config.metadata {
        spec.labels.insert(key.clone(), value.clone());
    }
    Ok(spec)
}

/// The server's labels of a machine: its app, name and region (set after the
/// client's labels are [`tenants::claim`]ed, so no client can set them).
fn label_machine(spec: &mut SandboxSpec, app: &str, request: &CreateMachineRequest) {
    let name = request
        .name
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| format!("machine-{}", uuid::Uuid::new_v4().simple()));
    spec.labels.insert(APP_LABEL.to_owned(), app.to_owned());
    spec.labels.insert(NAME_LABEL.to_owned(), name);
    if let Some(region) = &request.region {
        spec.labels.insert(REGION_LABEL.to_owned(), region.clone());
    }
}

/// The API's view of a sandbox.
fn machine_of(state: &Shared, info: &SandboxInfo) -> Machine {
    let stopped = crate::lock(&state.stopped).contains(&info.id);
    let machine_state = MachineState::of(info.status, stopped);
    let metadata = super::client_metadata(info);
    let created = info.created_at.to_rfc3339();
    Machine {
        id: info.id.to_string(),
        name: info.labels.get(NAME_LABEL).cloned().unwrap_or_default(),
        state: machine_state.as_str().to_owned(),
        region: info.labels.get(REGION_LABEL).cloned().unwrap_or_default(),
        // One version per machine: sandcell never updates a machine's config.
        instance_id: version_of(info),
        config: Some(MachineConfig {
            image: info.template.clone(),
            metadata,
            ..MachineConfig::default()
        }),
        created_at: created.clone(),
        updated_at: created,
    }
}

/// One version per machine (sandcell never updates a machine's config): 26 characters
/// derived from the id, as Fly's versions are 26 characters long.
fn version_of(info: &SandboxInfo) -> String {
    let digits: String = info
        .id
        .as_str()
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_uppercase())
        .collect();
    let padded = format!("{digits:0>26}");
    padded[padded.len() - 26..].to_owned()
}

/// `GET /apps/{app}/machines`, filtered by `metadata.{key}={value}` query pairs
/// (sandcell-server's extension; Fly documents no such filter, and other parameters
/// are ignored): the client's filter AND the caller's scope, a reserved key refused.
pub(super) async fn list(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    PathParams(app): PathParams<String>,
    Query(query): Query<Vec<(String, String)>>,
) -> ApiResult<Json<Vec<Machine>>> {
    let filter: Vec<(String, String)> = query
        .into_iter()
        .filter_map(|(k, v)| Some((k.strip_prefix("metadata.")?.to_owned(), v)))
        .collect();
    state
        .reserved
        .check(filter.iter().map(|(k, v)| (k, v)), "metadata filter")?;
    let scope = tenants::selector(&caller.0).label(APP_LABEL, &app);
    let selector = super::labels::scoped(&filter, scope);
    let infos = state.backend.list(&selector).await?;
    Ok(Json(infos.iter().map(|i| machine_of(&state, i)).collect()))
}

pub(super) async fn get(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    PathParams((app, id)): PathParams<(String, String)>,
) -> ApiResult<Json<Machine>> {
    let info = machine(&state, &caller, &app, &id).await?;
    Ok(Json(machine_of(&state, &info)))
}

#[derive(Debug, Deserialize)]
pub(super) struct WaitQuery {
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    timeout: Option<u64>,
}

pub(super) async fn wait(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    PathParams((app, id)): PathParams<(String, String)>,
    Query(query): Query<WaitQuery>,
) -> ApiResult<Response> {
    let wanted: Vec<MachineState> = query
        .state
        .as_deref()
        .unwrap_or("started")
        .split(',')
        .map(|s| {
            MachineState::parse(s.trim())
                .ok_or_else(|| ApiError(Error::invalid_input(format!("unknown state {s:?}"))))
        })
        .collect::<Result<_, _>>()?;
    let timeout = query
        .timeout
        .map(Duration::from_secs)
        .unwrap_or(MAX_WAIT)
        .min(MAX_WAIT);
    let deadline = Instant::now() + timeout;
    loop {
        let now = match machine(&state, &caller, &app, &id).await {
            Ok(info) => {
                let stopped = crate::lock(&state.stopped).contains(&info.id);
                MachineState::of(info.status, stopped)
            }
            Err(ApiError(e)) if e.kind() == ErrorKind::NotFound => MachineState::Destroyed,
            Err(e) => return Err(e),
        };
        if wanted.contains(&now) || (wanted.contains(&MachineState::Settled) && now.is_settled()) {
            let body = WaitResponse {
                ok: true,
                state: Some(now.as_str().to_owned()),
            };
            return Ok(Json(body).into_response());
        }
        if now == MachineState::Destroyed {
            return Err(ApiError(Error::not_found(format!(
                "machine {id} not found"
            ))));
        }
        if Instant::now() >= deadline {
            let body = sandcell_remote::protocol::ErrorBody {
                error: format!("machine {id} did not reach {:?} in time", query.state),
                kind: Some(ErrorKind::Timeout.name().to_owned()),
            };
            return Ok((StatusCode::REQUEST_TIMEOUT, Json(body)).into_response());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub(super) async fn suspend(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    PathParams((app, id)): PathParams<(String, String)>,
) -> ApiResult<Json<serde_json::Value>> {
    let (_held, info) = machine_held(&state, &caller, &app, &id).await?;
    pause(&state, &info).await?;
    Ok(super::ok())
}

pub(super) async fn stop(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    PathParams((app, id)): PathParams<(String, String)>,
    body: axum::body::Bytes,
) -> ApiResult<Json<serde_json::Value>> {
    // The body is optional; a malformed one is still refused.
    if !body.is_empty() {
        serde_json::from_slice::<StopBody>(&body)
            .map_err(|e| ApiError(Error::invalid_input(format!("a malformed stop: {e}"))))?;
    }
    let (_held, info) = machine_held(&state, &caller, &app, &id).await?;
    pause(&state, &info).await?;
    crate::lock(&state.stopped).insert(info.id);
    Ok(super::ok())
}

async fn pause(state: &Shared, info: &SandboxInfo) -> ApiResult<()> {
    if info.status != SandboxStatus::Paused {
        state.backend.pause(&info.id).await?;
    }
    Ok(())
}

pub(super) async fn start(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    PathParams((app, id)): PathParams<(String, String)>,
) -> ApiResult<Json<serde_json::Value>> {
    let (_held, info) = machine_held(&state, &caller, &app, &id).await?;
    state.backend.resume(&info.id).await?;
    crate::lock(&state.stopped).remove(&info.id);
    Ok(super::ok())
}

pub(super) async fn restart(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    PathParams((app, id)): PathParams<(String, String)>,
) -> ApiResult<Json<serde_json::Value>> {
    let (_held, info) = machine_held(&state, &caller, &app, &id).await?;
    state.backend.reset(&info.id).await?;
    crate::lock(&state.stopped).remove(&info.id);
    Ok(super::ok())
}

pub(super) async fn destroy(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    PathParams((app, id)): PathParams<(String, String)>,
) -> ApiResult<Json<serde_json::Value>> {
    let (_held, info) = machine_held(&state, &caller, &app, &id).await?;
    state.backend.destroy(&info.id).await?;
    crate::lock(&state.stopped).remove(&info.id);
    Ok(super::ok())
}
