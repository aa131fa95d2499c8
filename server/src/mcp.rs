//! `/mcp`: MCP's tools over streamable HTTP, behind the tenants' tokens; each request
//! carries its caller's tenant to the tools, and each transport session belongs to the
//! tenant that opened it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use sandcell::Error;

use super::{authorize, tenants, ApiError, AppState};

/// The header naming a streamable-HTTP transport session.
const SESSION_HEADER: &str = "mcp-session-id";

/// Which tenant opened each transport session.
#[derive(Default)]
struct Owners(Mutex<HashMap<String, String>>);

/// The routes serving `manager`'s sessions at `/mcp`.
pub(super) fn routes(state: &AppState, manager: Arc<sandcell_mcp::Manager>) -> Router<AppState> {
    // MCP's sessions get the server's default limits and read cap, as every face's
    // sandboxes do.
    let mut settings = sandcell_mcp::ToolSettings::default();
    settings.default_limits = state.config.default_limits.clone();
    settings.max_read_bytes = state.config.max_file_bytes as u64;
    settings.code_python = state.config.code_python.clone();
    // A model is told what a client of any other face is: no host path, and a backend's
    // own failure as a reference to the server's log.
    settings.public_errors = sandcell::raw::wire::PublicErrors::new(|e| {
        Error::new(e.kind(), crate::public_message(e)).set_temporary(e.is_temporary())
    });
    let service = sandcell_mcp::http_service(manager, settings);
    Router::new()
        .nest_service("/mcp", service)
        .layer(axum::middleware::from_fn(tenant_of_caller))
        .layer(axum::middleware::from_fn_with_state(
            Arc::new(Owners::default()),
            session_of_caller,
        ))
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(state),
            authorize,
        ))
}

/// Hands the caller's tenant to the tools.
async fn tenant_of_caller(mut request: Request, next: Next) -> Response {
    let tenant = request
        .extensions()
        .get::<tenants::Caller>()
        .map(|caller| sandcell_mcp::Tenant(caller.0.name.clone()));
    if let Some(tenant) = tenant {
        request.extensions_mut().insert(tenant);
    }
    next.run(request).await
}

/// Binds each transport session to the tenant whose request opened it: a request
/// naming a session another tenant opened (or one this layer never saw) answers `404`,
/// as an unknown session does, so a session id neither works nor tells anything across
/// tenants (ADVERSARIAL case 31). A session is forgotten once deleted or unknown to the
/// transport.
async fn session_of_caller(
    State(owners): State<Arc<Owners>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(tenant) = request
        .extensions()
        .get::<tenants::Caller>()
        .map(|caller| caller.0.name.clone())
    else {
        return not_found();
    };
    let session = request
        .headers()
        .get(SESSION_HEADER)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    if let Some(id) = &session {
        if crate::lock(&owners.0).get(id) != Some(&tenant) {
            return not_found();
        }
    }
    let deleting = request.method() == Method::DELETE;
    let response = next.run(request).await;
    match session {
        None => {
            if let Some(opened) = response.headers().get(SESSION_HEADER) {
                let opened = String::from_utf8_lossy(opened.as_bytes()).into_owned();
                crate::lock(&owners.0).insert(opened, tenant);
            }
        }
        Some(id) => {
            let ended = (deleting && response.status().is_success())
                || response.status() == StatusCode::NOT_FOUND;
            if ended {
                crate::lock(&owners.0).remove(&id);
            }
        }
    }
    response
}

fn not_found() -> Response {
    ApiError(Error::not_found(
        "no such MCP session: initialize a new one",
    ))
    .into_response()
}
