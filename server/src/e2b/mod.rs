//! sandcell-server's E2B face: E2B's control plane and envd, the in-sandbox daemon,
//! over whatever backend the server serves, so E2B's own SDKs run against it.
//!
//! | routes | what |
//! |---|---|
//! | `POST /sandboxes`, `POST /v2/sandboxes` | create (`templateID` `base` is the server's [base template](super::ServerConfig::e2b_base_template)) |
//! | `GET /sandboxes`, `GET /v2/sandboxes` | list, filtered by `metadata` and `state`, paged by `x-next-token` |
//! | `GET`/`DELETE /sandboxes/{id}` | inspect, kill |
//! | `POST /sandboxes/{id}/timeout`, `.../pause`, `.../connect`, `.../resume`, `/v2/sandboxes/{id}/connect` | lifetime, pause, resume |
//! | `GET /sandboxes/{id}/metrics` | one reading of CPU, memory and disk |
//! | `POST /process.Process/*`, `POST /filesystem.Filesystem/*`, `GET`/`POST /files`, `GET /health` | envd, for the sandbox the `E2b-Sandbox-Id` header names |
//! | `POST /execute`, `GET`/`POST /contexts`, `DELETE /contexts/{id}`, `POST /contexts/{id}/restart` | the code interpreter (E2B's port 49999), for the same sandbox: [`code`] |
//!
//! Control-plane calls authenticate with a tenant's token as `X-API-KEY` (or
//! `Authorization: Bearer`). envd calls carry the `envdAccessToken` the create
//! answered as `X-Access-Token`: an HMAC of the sandbox id under its tenant's token, so
//! it survives a server restart and opens that sandbox alone.
//!
//! Paths: the E2B user's home, `/home/user`, is the sandbox's workspace, and commands
//! start there. Relative paths and paths beneath the home name workspace paths; any
//! other absolute path is refused as `invalid_argument` (a command can still read the
//! sandbox's own root where its isolation shows one). The per-call user
//! (`Authorization: Basic`) is accepted and not switched to: every command runs as the
//! sandbox's user.

mod code;
mod control;
mod filesystem;
mod paths;
mod process;
mod rpc;
mod transfer;
mod watchers;

pub(crate) use control::start_reaper;

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use sandcell::{Error, ErrorKind, SandboxId, SandboxInfo, SandboxStatus};

use super::{tenants, AppState, Caller, APP_LABEL};
use sandcell_remote::e2b::api;

/// The app every E2B sandbox belongs to (the Fly face lists them under it).
pub(crate) const E2B_APP: &str = "e2b";

/// What the E2B face keeps between calls.
#[derive(Default)]
pub(crate) struct E2bState {
    processes: process::Processes,
    watchers: watchers::Watchers,
    lifetimes: control::Lifetimes,
}

/// The E2B routes: the control plane behind API-key authentication and envd behind
/// access-token authentication.
pub(super) fn routes(state: &AppState) -> Router<AppState> {
    let control = Router::new()
        .route("/sandboxes", post(control::create).get(control::list_v1))
        .route("/v2/sandboxes", post(control::create).get(control::list_v2))
        .route("/sandboxes/{id}", get(control::get).delete(control::kill))
        .route("/sandboxes/{id}/timeout", post(control::set_timeout))
        .route("/sandboxes/{id}/pause", post(control::pause))
        .route("/sandboxes/{id}/network", put(control::set_network))
        .route("/sandboxes/{id}/connect", post(control::connect))
        .route("/v2/sandboxes/{id}/connect", post(control::connect))
        .route("/sandboxes/{id}/resume", post(control::connect))
        .route("/sandboxes/{id}/metrics", get(control::metrics))
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(state),
            authorize_api,
        ));
    let envd = Router::new()
        .route("/process.Process/{method}", post(process::call))
        .route("/filesystem.Filesystem/{method}", post(filesystem::call))
        .route(
            "/files",
            get(transfer::download).post(transfer::upload).layer(
                axum::extract::DefaultBodyLimit::max(state.config.max_file_bytes),
            ),
        )
        .route("/health", get(|| async { StatusCode::NO_CONTENT }))
        .route("/execute", post(code::execute))
        .route(
            "/contexts",
            post(code::create_context).get(code::list_contexts),
        )
        .route(
            "/contexts/{id}",
            axum::routing::delete(code::remove_context),
        )
        .route("/contexts/{id}/restart", post(code::restart_context))
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(state),
            authorize_envd,
        ));
    control.merge(envd)
}

/// An error as E2B's control plane answers it: `{"code": status, "message": ...}`.
pub(crate) struct E2bError(pub(crate) Error);

impl From<Error> for E2bError {
    fn from(e: Error) -> Self {
        E2bError(e)
    }
}

impl E2bError {
    pub(super) fn with_status(status: StatusCode, message: impl Into<String>) -> Response {
        let body = api::ApiError {
            code: status.as_u16(),
            message: message.into(),
        };
        (status, Json(body)).into_response()
    }
}

impl IntoResponse for E2bError {
    fn into_response(self) -> Response {
        // A quota is `429`, as E2B answers a team over its concurrent sandboxes.
        let status = match self.0.kind() {
            ErrorKind::LimitExceeded => StatusCode::TOO_MANY_REQUESTS,
            kind => StatusCode::from_u16(sandcell_remote::protocol::status_for(kind))
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        };
        E2bError::with_status(status, crate::public_message(&self.0))
    }
}

pub(crate) type E2bResult<T> = Result<T, E2bError>;

/// Lets requests carrying a tenant's token (`X-API-KEY`, or `Authorization: Bearer`)
/// through as that tenant; answers the others `401` in E2B's shape.
async fn authorize_api(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Response {
    let headers = request.headers();
    let given = headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .or_else(|| {
            headers
                .get(axum::http::header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
        });
    match given.and_then(|t| tenants::authenticate(&state.tenants, t.as_bytes())) {
        Some(tenant) => {
            if let Err(e) = state.claim_connection(&request, &tenant.name) {
                return crate::requests::closing(E2bError(e).into_response());
            }
            request.extensions_mut().insert(Caller(tenant));
            next.run(request).await
        }
        None => E2bError::with_status(
            StatusCode::UNAUTHORIZED,
            "Invalid API key: a tenant's token is required as `X-API-KEY`",
        ),
    }
}

/// The sandbox an envd call is for, authenticated by its access token.
#[derive(Clone)]
pub(crate) struct Envd {
    pub(crate) info: SandboxInfo,
}

impl Envd {
    pub(crate) fn id(&self) -> &SandboxId {
        &self.info.id
    }
}

/// Lets envd calls through for the sandbox `E2b-Sandbox-Id` names when
/// `X-Access-Token` is its token. The token is checked before the sandbox is looked
/// up (it is an HMAC of the id under a tenant's token, so it names its tenant): without
/// a valid one every id answers the same `401`, whether it exists or not (ADVERSARIAL
/// case 41). With one, a sandbox that is gone, was never an E2B one, or is another
/// tenant's answers `502` "... was not found", as E2B's proxy does, which the SDKs turn
/// into their sandbox-not-running error; a paused one `502` too.
async fn authorize_envd(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Response {
    let rpc = request.uri().path().contains('.');
    let answer = |status: StatusCode, message: String| {
        if rpc {
            rpc::error_response(status, &message)
        } else {
            E2bError::with_status(status, message)
        }
    };
    let headers = request.headers();
    let Some(id) = header_str(headers, "e2b-sandbox-id") else {
        return answer(
            StatusCode::BAD_REQUEST,
            "envd calls name their sandbox in the `E2b-Sandbox-Id` header".to_owned(),
        );
    };
    let token = header_str(headers, "x-access-token").unwrap_or_default();
    let tenant = SandboxId::new(id).ok().and_then(|sandbox| {
        // Every tenant is tried, so the time taken does not tell which one matched.
        let mut found = None;
        for tenant in &state.tenants {
            if access_token_matches(&tenant.token, &sandbox, token) {
                found = Some((Arc::clone(tenant), sandbox.clone()));
            }
        }
        found
    });
    let Some((tenant, sandbox)) = tenant else {
        return answer(
            StatusCode::UNAUTHORIZED,
            "a valid `X-Access-Token` for the sandbox `E2b-Sandbox-Id` names is required"
                .to_owned(),
        );
    };
    if let Err(e) = state.claim_connection(&request, &tenant.name) {
        return crate::requests::closing(answer(
            StatusCode::TOO_MANY_REQUESTS,
            crate::public_message(&e),
        ));
    }
    let gone = || {
        answer(
            StatusCode::BAD_GATEWAY,
            format!("The sandbox {id} was not found"),
        )
    };
    let info = match state.backend.inspect(&sandbox).await {
        Ok(info) => info,
        Err(e) if e.kind() == ErrorKind::NotFound => return gone(),
        Err(e) => {
            tracing::warn!(sandbox = %sandbox, error = %e, "inspecting an envd call's sandbox");
            return answer(
                StatusCode::BAD_GATEWAY,
                format!("The sandbox {id} could not be reached"),
            );
        }
    };
    let owned = info.labels.get(APP_LABEL).map(String::as_str) == Some(E2B_APP)
        && info.labels.get(tenants::TENANT_LABEL) == Some(&tenant.name);
    if !owned {
        return gone();
    }
    if info.status == SandboxStatus::Paused {
        return answer(
            StatusCode::BAD_GATEWAY,
            format!("The sandbox {id} is paused: connect to it to resume it"),
        );
    }
    request.extensions_mut().insert(Envd { info });
    next.run(request).await
}

fn header_str<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// The envd access token of `sandbox`: HMAC-SHA256 of its id under its tenant's token.
pub(crate) fn access_token(tenant_token: &str, sandbox: &SandboxId) -> String {
    use std::fmt::Write as _;
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, tenant_token.as_bytes());
    let tag = ring::hmac::sign(&key, access_message(sandbox).as_bytes());
    tag.as_ref().iter().fold(String::new(), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}

/// Whether `given` is `sandbox`'s access token, compared in constant time.
fn access_token_matches(tenant_token: &str, sandbox: &SandboxId, given: &str) -> bool {
    let Some(tag) = decode_hex(given) else {
        return false;
    };
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, tenant_token.as_bytes());
    ring::hmac::verify(&key, access_message(sandbox).as_bytes(), &tag).is_ok()
}

fn access_message(sandbox: &SandboxId) -> String {
    format!("sandcell envd access {sandbox}")
}

fn decode_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_tokens_open_one_sandbox_under_one_tenant() {
        let a = SandboxId::new("sbx-a").unwrap();
        let b = SandboxId::new("sbx-b").unwrap();
        let token = access_token("secret", &a);
        assert_eq!(token.len(), 64);
        assert!(access_token_matches("secret", &a, &token));
        assert!(!access_token_matches("secret", &b, &token));
        assert!(!access_token_matches("other", &a, &token));
        assert!(!access_token_matches("secret", &a, ""));
        assert!(!access_token_matches("secret", &a, "zz"));
        assert!(!access_token_matches("secret", &a, &token[..63]));
    }
}
