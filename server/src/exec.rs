//! Fly's buffered exec: a command run to its end, answered at once.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Extension, State};
use axum::Json;
use sandcell::ExecRequest;

use super::{machine, ApiResult, AppState, Caller, JsonBody, PathParams};
use sandcell_remote::protocol::{ExecBody, ExecResponse};

/// `POST .../exec`: runs to the end and answers everything at once.
pub(super) async fn buffered(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    PathParams((app, id)): PathParams<(String, String)>,
    JsonBody(body): JsonBody<ExecBody>,
) -> ApiResult<Json<ExecResponse>> {
    let info = machine(&state, &caller, &app, &id).await?;
    let mut request = ExecRequest::new(body.command);
    request.stdin = Some(Bytes::from(body.stdin.unwrap_or_default()));
    if let Some(seconds) = body.timeout.filter(|s| *s > 0) {
        request.timeout = Some(Duration::from_secs(seconds));
    }
    let output = state
        .config
        .commands
        .run(&caller.0.name, state.backend.exec(&info.id, request))
        .await?
        .collect(sandcell::DEFAULT_OUTPUT_LIMIT)
        .await?;
    Ok(Json(ExecResponse {
        exit_code: output.status.code,
        exit_signal: output.status.signal,
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }))
}
