//! `GET .../sandcell/wire`: one machine's operations (commands, files, archives,
//! changes) over sandcell's wire protocol, on the connection the request upgrades.
//!
//! Every per-sandbox operation a client needs travels this way, so a new operation of
//! the backend contract reaches remote clients through the wire protocol alone, with
//! no route of its own here.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Extension, Request, State};
use axum::http::{header, StatusCode};
use axum::response::Response;
use hyper_util::rt::TokioIo;
use sandcell::archive::ArchiveLimits;
use sandcell::raw::wire::ServeOptions;
use sandcell::{Error, ErrorKind};

use super::{machine, ApiError, ApiResult, AppState, Caller, PathParams};
use sandcell_remote::protocol::WIRE_UPGRADE;

/// Answers `101 Switching Protocols` and serves the machine on the upgraded connection
/// until the client closes it; a request without `Upgrade: sandcell-wire` is refused
/// with `426 Upgrade Required`.
pub(super) async fn upgrade(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    PathParams((app, id)): PathParams<(String, String)>,
    mut request: Request,
) -> ApiResult<Response> {
    let info = machine(&state, &caller, &app, &id).await?;
    let asks = request
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case(WIRE_UPGRADE));
    if !asks {
        let mut response = axum::response::IntoResponse::into_response(ApiError(Error::new(
            ErrorKind::InvalidInput,
            format!("this route needs `Connection: upgrade` and `Upgrade: {WIRE_UPGRADE}`"),
        )));
        *response.status_mut() = StatusCode::UPGRADE_REQUIRED;
        return Ok(response);
    }
    let on_upgrade = hyper::upgrade::on(&mut request);
    // The connection keeps counting against its tenant's share for as long as it
    // serves the machine: upgraded, it leaves `max_connections`' count and the idle
    // timeout, and a tenant could otherwise hold idle wire connections until the
    // server had no descriptors left for anyone.
    let share = request
        .extensions()
        .get::<crate::connection_shares::ConnectionClaim>()
        .and_then(crate::connection_shares::ConnectionClaim::keep);
    let options = ServeOptions::default()
        .max_file_bytes(state.config.max_file_bytes as u64)
        .budget(state.transfers(&caller.0.name))
        .archive_streams(state.archive_streams(&caller.0.name))
        .watches(state.watches(&caller.0.name))
        .commands(state.config.commands.semaphore(&caller.0.name))
        // As on every other face (ADVERSARIAL 41): a backend's own failure reaches
        // the client as a reference, its host paths only the server's log.
        .public_errors(|e| {
            Error::new(e.kind(), crate::public_message(e)).set_temporary(e.is_temporary())
        })
        .archive_limits(ArchiveLimits::default().max_bytes(state.config.max_archive_bytes));
    let backend = Arc::clone(&state.backend);
    tokio::spawn(async move {
        let _share = share;
        match on_upgrade.await {
            Ok(upgraded) => {
                let (read, write) = tokio::io::split(TokioIo::new(upgraded));
                let _ =
                    sandcell::raw::wire::serve_with(options, backend, info.id, read, write).await;
            }
            Err(e) => tracing::debug!(error = %e, "a wire upgrade did not complete"),
        }
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::CONNECTION, "upgrade")
        .header(header::UPGRADE, WIRE_UPGRADE)
        .body(Body::empty())
        .map_err(|e| {
            ApiError(Error::new(
                ErrorKind::Backend,
                format!("answering the upgrade: {e}"),
            ))
        })
}
