//! E2B's control plane over the backend: create, list, get, kill, timeouts, pause and
//! resume (connect), metrics; and the reaper that ends sandboxes whose time is up.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use axum::extract::{Extension, FromRequest, Request, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, Utc};
use sandcell::{
    Error, ErrorKind, LabelSelector, SandboxId, SandboxInfo, SandboxSpec, SandboxStatus,
};

use super::{access_token, E2bError, E2bResult, E2B_APP};
use crate::lock;
use crate::{machine, machine_held, machines, tenants, AppState, Caller, PathParams, Shared};
use crate::{APP_LABEL, NAME_LABEL};
use sandcell_remote::e2b::api::{
    NetworkConfig, NewSandbox, Sandbox, SandboxDetail, SandboxMetric, SandboxTimeout, ENVD_VERSION,
};

/// Label holding when a sandbox's time is up (RFC 3339), as its create set it.
const END_LABEL: &str = "sandcell.server.e2b.end_at";
/// Label marking a sandbox that pauses rather than ends when its time is up.
const AUTO_PAUSE_LABEL: &str = "sandcell.server.e2b.auto_pause";
/// Label holding the template id the create asked for (`base`, say).
const TEMPLATE_LABEL: &str = "sandcell.server.e2b.template";
/// A create's lifetime when it names none, in seconds: the 5 minutes E2B's SDKs
/// document (the current Python SDK leaves the field out; the schema's default is 15).
const DEFAULT_TIMEOUT: u32 = 300;
/// How often the reaper looks for sandboxes whose time is up.
const REAP_EVERY: Duration = Duration::from_secs(1);
/// Most sandboxes one page of `GET /v2/sandboxes` answers.
const MAX_PAGE: usize = 100;

/// When each sandbox's time is up, once changed since its create (the label holds the
/// create's), and whether the reaper runs.
#[derive(Default)]
pub(crate) struct Lifetimes {
    ends: std::sync::Mutex<HashMap<SandboxId, DateTime<Utc>>>,
    reaper: std::sync::OnceLock<()>,
}

impl Lifetimes {
    fn end_of(&self, info: &SandboxInfo) -> Option<DateTime<Utc>> {
        lock(&self.ends).get(&info.id).copied().or_else(|| {
            info.labels
                .get(END_LABEL)
                .and_then(|v| DateTime::parse_from_rfc3339(v).ok())
                .map(|t| t.with_timezone(&Utc))
        })
    }

    fn set(&self, id: &SandboxId, end: DateTime<Utc>) {
        lock(&self.ends).insert(id.clone(), end);
    }
}

/// Starts the reaper once, on the runtime serving the router; it stops with the server.
pub(crate) fn start_reaper(state: &AppState) {
    if tokio::runtime::Handle::try_current().is_err() {
        return;
    }
    let weak: Weak<Shared> = Arc::downgrade(state);
    state.e2b.lifetimes.reaper.get_or_init(|| {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(REAP_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(state) = weak.upgrade() else { return };
                reap(&state).await;
            }
        });
    });
}

/// Ends (or, when asked, pauses) every running E2B sandbox whose time is up.
async fn reap(state: &Shared) {
    let selector = LabelSelector::new().label(APP_LABEL, E2B_APP);
    let Ok(sandboxes) = state.backend.list(&selector).await else {
        return;
    };
    let due = |info: &SandboxInfo| {
        info.status == SandboxStatus::Running
            && state
                .e2b
                .lifetimes
                .end_of(info)
                .is_some_and(|end| end <= Utc::now())
    };
    for info in sandboxes {
        if !due(&info) {
            continue;
        }
        // Looked at again under the lock: a `connect` may have given it more time.
        let _held = state.lifecycle.hold(&info.id).await;
        let info = match state.backend.inspect(&info.id).await {
            Ok(info) if due(&info) => info,
            _ => continue,
        };
        let result = if info.labels.contains_key(AUTO_PAUSE_LABEL) {
            state.backend.pause(&info.id).await
        } else {
            end(state, &info.id).await
        };
        if let Err(e) = result {
            tracing::warn!(sandbox = %info.id, error = %e, "could not end an expired E2B sandbox");
        }
    }
}

/// Destroys a sandbox and forgets what the E2B face kept for it.
async fn end(state: &Shared, id: &SandboxId) -> sandcell::Result<()> {
    let destroyed = state.backend.destroy(id).await;
    state.e2b.processes.forget_sandbox(id);
    state.e2b.watchers.forget_sandbox(id);
    lock(&state.e2b.lifetimes.ends).remove(id);
    match destroyed {
        Err(e) if e.kind() != ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// A JSON body, malformed ones answered `400` in E2B's shape (`413` when too large).
pub(super) struct Body<T>(T);

impl<T, S> FromRequest<S> for Body<T>
where
    T: serde::de::DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = Response;

    /// A body over the limit answers `413`, a malformed one `400`.
    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        match Json::<T>::from_request(request, state).await {
            Ok(Json(value)) => Ok(Body(value)),
            Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => Err(
                super::E2bError::with_status(StatusCode::PAYLOAD_TOO_LARGE, rejection.body_text()),
            ),
            Err(rejection) => {
                Err(E2bError(Error::invalid_input(rejection.body_text())).into_response())
            }
        }
    }
}

/// The caller's E2B sandbox `id`; `NotFound` for anyone else's, as if it did not exist.
async fn owned(state: &Shared, caller: &Caller, id: &str) -> E2bResult<SandboxInfo> {
    machine(state, caller, E2B_APP, id)
        .await
        .map_err(|e| E2bError(e.0))
}

/// As [`owned`], holding the sandbox's lifecycle lock ([`machine_held`]).
async fn owned_held(
    state: &Shared,
    caller: &Caller,
    id: &str,
) -> E2bResult<(tokio::sync::OwnedMutexGuard<()>, SandboxInfo)> {
    machine_held(state, caller, E2B_APP, id)
        .await
        .map_err(|e| E2bError(e.0))
}

fn seconds(n: u32) -> chrono::Duration {
    chrono::Duration::seconds(i64::from(n))
}

/// `POST /sandboxes` and `POST /v2/sandboxes`.
pub(super) async fn create(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Body(request): Body<NewSandbox>,
) -> E2bResult<Response> {
    let asked = if request.template_id.is_empty() {
        "base".to_owned()
    } else {
        request.template_id.clone()
    };
    // The code interpreter's kernels come from `code_python`: its sandbox is the base.
    const BASE: [&str; 3] = ["base", "code-interpreter-v1", "code-interpreter"];
    let template = if BASE.contains(&asked.as_str()) {
        state.config.e2b_base_template.clone()
    } else {
        asked.clone()
    };
    let mut spec = SandboxSpec::new(template);
    spec.env = request.env_vars.clone().unwrap_or_default();
    spec.labels = request.metadata.clone().unwrap_or_default();
    spec.network = sandcell_remote::e2b::network::from_e2b(
        request.allow_internet_access,
        request.network.as_ref(),
    )?;
    tenants::claim(&mut spec, &caller.0, &state)?;
    let end = Utc::now() + seconds(request.timeout.unwrap_or(DEFAULT_TIMEOUT));
    let labels = [
        (APP_LABEL, E2B_APP.to_owned()),
        (
            NAME_LABEL,
            format!("sandbox-{}", uuid::Uuid::new_v4().simple()),
        ),
        (END_LABEL, end.to_rfc3339()),
        (TEMPLATE_LABEL, asked.clone()),
    ];
    for (key, value) in labels {
        spec.labels.insert(key.to_owned(), value);
    }
    if request.auto_pause == Some(true) {
        spec.labels
            .insert(AUTO_PAUSE_LABEL.to_owned(), "true".to_owned());
    }
    let info = {
        let _creating = state.creating(&caller).await;
        machines::admit(&state, &caller, E2B_APP, &spec).await?;
        state.backend.create(&spec).await?
    };
    state.e2b.lifetimes.set(&info.id, end);
    let body = sandbox_of(&caller, &info);
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

fn sandbox_of(caller: &Caller, info: &SandboxInfo) -> Sandbox {
    Sandbox {
        template_id: template_of(info),
        sandbox_id: info.id.to_string(),
        client_id: "sandcell".to_owned(),
        envd_version: ENVD_VERSION.to_owned(),
        envd_access_token: Some(access_token(&caller.0.token, &info.id)),
        domain: None,
    }
}

fn template_of(info: &SandboxInfo) -> String {
    info.labels
        .get(TEMPLATE_LABEL)
        .cloned()
        .unwrap_or_else(|| info.template.clone())
}

fn detail_of(state: &Shared, info: &SandboxInfo, token: Option<String>) -> SandboxDetail {
    let number = |label: &str| -> u64 {
        info.labels
            .get(label)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let metadata = crate::client_metadata(info);
    let end = state.e2b.lifetimes.end_of(info).unwrap_or(info.created_at);
    SandboxDetail {
        template_id: template_of(info),
        sandbox_id: info.id.to_string(),
        client_id: "sandcell".to_owned(),
        started_at: info.created_at.to_rfc3339(),
        end_at: end.to_rfc3339(),
        envd_version: ENVD_VERSION.to_owned(),
        cpu_count: u32::try_from(number(tenants::CPU_LABEL).div_ceil(1000).max(1)).unwrap_or(1),
        memory_mb: number(tenants::MEMORY_LABEL) >> 20,
        disk_size_mb: number(tenants::DISK_LABEL) >> 20,
        state: state_of(info).to_owned(),
        metadata: Some(metadata),
        // Only a sandbox's own view has its rules (`SandboxDetail`; not a listing's).
        network: None,
        envd_access_token: token,
    }
}

fn state_of(info: &SandboxInfo) -> &'static str {
    match info.status {
        SandboxStatus::Paused => "paused",
        _ => "running",
    }
}

/// `GET /sandboxes/{id}`.
pub(super) async fn get(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    PathParams(id): PathParams<String>,
) -> E2bResult<Json<SandboxDetail>> {
    let info = owned(&state, &caller, &id).await?;
    let token = access_token(&caller.0.token, &info.id);
    let mut detail = detail_of(&state, &info, Some(token));
    detail.network = sandcell_remote::e2b::network::view_of(&info.network);
    Ok(Json(detail))
}

/// `DELETE /sandboxes/{id}`: `204`, and `404` once gone.
pub(super) async fn kill(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    PathParams(id): PathParams<String>,
) -> E2bResult<StatusCode> {
    let (_held, info) = owned_held(&state, &caller, &id).await?;
    end(&state, &info.id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /sandboxes/{id}/timeout`: the sandbox ends `timeout` seconds from now.
pub(super) async fn set_timeout(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    PathParams(id): PathParams<String>,
    Body(request): Body<SandboxTimeout>,
) -> E2bResult<StatusCode> {
    let info = owned(&state, &caller, &id).await?;
    state
        .e2b
        .lifetimes
        .set(&info.id, Utc::now() + seconds(request.timeout));
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /sandboxes/{id}/pause`: `204`, `409` when already paused.
pub(super) async fn pause(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    PathParams(id): PathParams<String>,
) -> E2bResult<Response> {
    let (_held, info) = owned_held(&state, &caller, &id).await?;
    if info.status == SandboxStatus::Paused {
        return Err(E2bError(Error::new(
            ErrorKind::AlreadyExists,
            format!("sandbox {id} is already paused"),
        )));
    }
    state.backend.pause(&info.id).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `PUT /sandboxes/{id}/network`: replaces a running sandbox's egress rules. Only an
/// allowlist can become another allowlist (what `set_network` promises); a change to
/// or from the full network, or to none, is refused.
pub(super) async fn set_network(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    PathParams(id): PathParams<String>,
    Body(request): Body<NetworkConfig>,
) -> E2bResult<Response> {
    let info = owned(&state, &caller, &id).await?;
    let network = sandcell_remote::e2b::network::from_e2b(None, Some(&request))?;
    state.backend.set_network(&info.id, &network).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `POST /sandboxes/{id}/connect` (and `/v2/...`, and the older `/resume`): resumes a
/// paused sandbox (`201`) or answers a running one (`200`); its time is extended to
/// at least `timeout` seconds from now.
pub(super) async fn connect(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    PathParams(id): PathParams<String>,
    request: Request,
) -> E2bResult<Response> {
    /// The schema requires `timeout`; SDKs send `{}` (or, to `/resume`, nothing)
    /// when their caller gave none, which means the default.
    #[derive(serde::Deserialize)]
    struct Lenient {
        timeout: Option<u32>,
    }
    let bytes = axum::body::to_bytes(request.into_body(), 1 << 16)
        .await
        .map_err(|e| Error::invalid_input(format!("unreadable body: {e}")))?;
    let timeout = if bytes.is_empty() {
        None
    } else {
        serde_json::from_slice::<Lenient>(&bytes)
            .map_err(|e| Error::invalid_input(format!("a malformed body: {e}")))?
            .timeout
    }
    .unwrap_or(DEFAULT_TIMEOUT);
    let (_held, info) = owned_held(&state, &caller, &id).await?;
    let resumed = info.status == SandboxStatus::Paused;
    if resumed {
        state.backend.resume(&info.id).await?;
    }
    let wanted = Utc::now() + seconds(timeout);
    let lifetimes = &state.e2b.lifetimes;
    if resumed || lifetimes.end_of(&info).is_none_or(|end| end < wanted) {
        lifetimes.set(&info.id, wanted);
    }
    let status = if resumed {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(sandbox_of(&caller, &info))).into_response())
}

/// `GET /sandboxes/{id}/metrics`: one reading, now.
pub(super) async fn metrics(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    PathParams(id): PathParams<String>,
) -> E2bResult<Json<Vec<SandboxMetric>>> {
    let info = owned(&state, &caller, &id).await?;
    let detail = detail_of(&state, &info, None);
    let reading = state.backend.metrics(&info.id).await?;
    let memory_total = reading.memory_limit_bytes.unwrap_or(detail.memory_mb << 20);
    Ok(Json(vec![SandboxMetric {
        timestamp: reading.at.to_rfc3339(),
        timestamp_unix: reading.at.timestamp(),
        cpu_count: detail.cpu_count,
        // One reading has no interval to spread CPU time over.
        cpu_used_pct: 0.0,
        mem_used: reading.memory_bytes.unwrap_or(0),
        mem_total: memory_total,
        mem_cache: 0,
        disk_used: reading.disk_bytes.unwrap_or(0),
        disk_total: reading
            .disk_limit_bytes
            .unwrap_or(detail.disk_size_mb << 20),
    }]))
}

/// The filters of a list: metadata pairs and states.
struct ListQuery {
    metadata: Vec<(String, String)>,
    states: Vec<String>,
    limit: usize,
    next: usize,
}

impl ListQuery {
    /// Reads the raw query. The SDKs percent-encode each metadata key and value, then
    /// the `k=v&...` string, then the parameter: the two inner layers are undone here.
    fn parse(raw: Option<&str>) -> E2bResult<Self> {
        let mut query = ListQuery {
            metadata: Vec::new(),
            states: Vec::new(),
            limit: MAX_PAGE,
            next: 0,
        };
        for pair in raw.unwrap_or_default().split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = decode(value, true);
            match decode(key, true).as_str() {
                "metadata" => {
                    for item in value.split('&').filter(|p| !p.is_empty()) {
                        let (k, v) = item.split_once('=').unwrap_or((item, ""));
                        let k = decode(&decode(k, true), false);
                        let v = decode(&decode(v, true), false);
                        query.metadata.push((k, v));
                    }
                }
                "state" => query
                    .states
                    .extend(value.split(',').map(str::trim).map(str::to_owned)),
                "limit" => {
                    query.limit = value
                        .parse::<usize>()
                        .map_err(|_| {
                            Error::invalid_input(format!("limit {value:?} is not a number"))
                        })?
                        .clamp(1, MAX_PAGE);
                }
                "nextToken" => {
                    query.next = value.parse().map_err(|_| {
                        Error::invalid_input(format!(
                            "nextToken {value:?} is not one this server gave"
                        ))
                    })?;
                }
                _ => {}
            }
        }
        for state in &query.states {
            if state != "running" && state != "paused" {
                return Err(E2bError(Error::invalid_input(format!(
                    "state {state:?} is not running or paused"
                ))));
            }
        }
        Ok(query)
    }
}

/// Percent-decoding (with `+` as a space when `plus` is set); malformed escapes stay.
fn decode(text: &str, plus: bool) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 3;
                    }
                    None => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' if plus => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

async fn listed(state: &Shared, caller: &Caller, query: &ListQuery) -> E2bResult<Vec<SandboxInfo>> {
    // The client's filter AND the caller's scope (ADVERSARIAL case 39): a reserved key
    // is refused, and the scope is applied last, so no pair can replace it.
    state.reserved.check(
        query.metadata.iter().map(|(k, v)| (k, v)),
        "metadata filter",
    )?;
    let scope = tenants::selector(&caller.0).label(APP_LABEL, E2B_APP);
    let selector = crate::labels::scoped(&query.metadata, scope);
    let mut infos = state.backend.list(&selector).await?;
    infos
        .retain(|info| query.states.is_empty() || query.states.iter().any(|s| s == state_of(info)));
    infos.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
    Ok(infos)
}

/// `GET /sandboxes`: the running sandboxes, filtered by metadata.
pub(super) async fn list_v1(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    request: Request,
) -> E2bResult<Json<Vec<SandboxDetail>>> {
    let mut query = ListQuery::parse(request.uri().query())?;
    if query.states.is_empty() {
        query.states.push("running".to_owned());
    }
    let infos = listed(&state, &caller, &query).await?;
    Ok(Json(
        infos.iter().map(|i| detail_of(&state, i, None)).collect(),
    ))
}

/// `GET /v2/sandboxes`: filtered by metadata and state, paged by `x-next-token`.
pub(super) async fn list_v2(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    request: Request,
) -> E2bResult<Response> {
    let query = ListQuery::parse(request.uri().query())?;
    let infos = listed(&state, &caller, &query).await?;
    let page: Vec<SandboxDetail> = infos
        .iter()
        .skip(query.next)
        .take(query.limit)
        .map(|i| detail_of(&state, i, None))
        .collect();
    let after = query.next + page.len();
    let mut response = Json(page).into_response();
    if after < infos.len() {
        if let Ok(value) = HeaderValue::from_str(&after.to_string()) {
            response.headers_mut().insert("x-next-token", value);
        }
    }
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_filters_are_decoded_through_every_layer() {
        // The query the SDK sends for {"user name": "a&b=c", "k": "v"}.
        let query = ListQuery::parse(Some(
            "metadata=user%252520name%3Da%252526b%25253Dc%26k%3Dv&state=running%2Cpaused&limit=5",
        ))
        .ok()
        .unwrap();
        assert_eq!(
            query.metadata,
            [
                ("user name".to_owned(), "a&b=c".to_owned()),
                ("k".to_owned(), "v".to_owned())
            ]
        );
        assert_eq!(query.states, ["running", "paused"]);
        assert_eq!(query.limit, 5);
        assert!(ListQuery::parse(Some("state=gone")).is_err());
        assert!(ListQuery::parse(Some("nextToken=x")).is_err());
        assert_eq!(decode("100%", false), "100%");
        assert_eq!(decode("%zz%4", false), "%zz%4");
    }
}
