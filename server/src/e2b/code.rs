//! The code interpreter's port (49999) of an E2B sandbox: `POST /execute`, streaming a
//! cell's output as newline-delimited JSON in the shape E2B's Code Interpreter SDKs
//! parse, and the contexts API (`/contexts`). Calls name their sandbox in
//! `E2b-Sandbox-Id` and, like envd's, carry its access token (`X-Access-Token`):
//! the SDKs send it with `/execute`; the contexts calls they send without it are
//! refused (`401`) rather than served to whoever knows a sandbox's id.
//!
//! The kernels run in the sandbox ([`sandcell::code`]) on the server's
//! [`code_python`](crate::ServerConfig::code_python); one interpreter per sandbox.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::{paths, E2bError, E2bResult, Envd};
use crate::AppState;
use sandcell::code::{CodeContext, CodeEvent, CodeLanguage, CodeResult, RunCode};
use sandcell::Error;

/// The body of `POST /execute`.
#[derive(Deserialize)]
pub(crate) struct Execute {
    code: String,
    #[serde(default)]
    context_id: Option<String>,
    #[serde(default)]
    language: Option<String>,
    #[serde(default)]
    env_vars: Option<std::collections::BTreeMap<String, String>>,
}

/// The body of `POST /contexts`.
#[derive(Deserialize)]
pub(crate) struct NewContext {
    #[serde(default)]
    language: Option<String>,
    #[serde(default)]
    cwd: Option<String>,
}

fn language(name: Option<&str>) -> sandcell::Result<Option<CodeLanguage>> {
    name.filter(|n| !n.is_empty()).map(str::parse).transpose()
}

async fn interpreter(
    state: &AppState,
    envd: &Envd,
) -> sandcell::Result<sandcell::code::CodeInterpreter> {
    state.code.get_or_start(&*state.backend, envd.id()).await
}

/// `POST /execute`: runs a cell, streaming its events; a client that goes away
/// interrupts the run.
pub(crate) async fn execute(
    State(state): State<AppState>,
    Extension(envd): Extension<Envd>,
    Json(body): Json<Execute>,
) -> E2bResult<Response> {
    let mut run = RunCode::new();
    run.context = body.context_id.filter(|c| !c.is_empty());
    run.language = language(body.language.as_deref())?;
    if run.context.is_some() && run.language.is_some() {
        return Err(Error::invalid_input("give a context or a language, not both").into());
    }
    run.env = body.env_vars.unwrap_or_default();
    // Each streaming run holds a place among its tenant's, until its stream ends:
    // an unread stream holds a line or two of the sandbox's output on this host.
    let tenant = envd.info.labels.get(crate::tenants::TENANT_LABEL);
    let slot = state.code_runs.slot(tenant.map_or("", String::as_str))?;
    let interpreter = interpreter(&state, &envd).await?;
    let mut events = interpreter.run(&body.code, run).await?;
    // A run refused outright (an unknown context, a language without its kernel) is
    // an HTTP error, which the SDKs raise; once it has begun, errors are events.
    let first = match events.next().await {
        Some(Err(e)) => return Err(e.into()),
        first => first,
    };
    let lines = futures::stream::iter(first)
        .chain(events)
        .map(move |event| {
            let _held = &slot;
            let line = match event {
                Ok(event) => e2b_event(event),
                // Mid-stream, an error is the SDK's error event: it ends the run.
                Err(e) => json!({
                    "type": "error",
                    "name": format!("{:?}", e.kind()),
                    "value": crate::public_message(&e),
                    "traceback": "",
                }),
            };
            let mut line = serde_json::to_vec(&line).unwrap_or_default();
            line.push(b'\n');
            Ok::<_, std::convert::Infallible>(bytes::Bytes::from(line))
        });
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(lines),
    )
        .into_response())
}

/// One event as E2B's SDKs parse it.
fn e2b_event(event: CodeEvent) -> Value {
    let now = chrono::Utc::now().to_rfc3339();
    match event {
        CodeEvent::ExecutionCount { count } => {
            json!({"type": "number_of_executions", "execution_count": count})
        }
        CodeEvent::Stdout { text } => json!({"type": "stdout", "text": text, "timestamp": now}),
        CodeEvent::Stderr { text } => json!({"type": "stderr", "text": text, "timestamp": now}),
        CodeEvent::Result(result) => e2b_result(&result),
        CodeEvent::Error(error) => json!({
            "type": "error",
            "name": error.name,
            "value": error.value,
            "traceback": error.traceback.join("\n"),
        }),
        _ => json!({"type": "end_of_execution"}),
    }
}

/// A MIME bundle under the names E2B's `Result` has.
fn e2b_result(result: &CodeResult) -> Value {
    const NAMES: [(&str, &str); 10] = [
        ("text/plain", "text"),
        ("text/html", "html"),
        ("text/markdown", "markdown"),
        ("image/svg+xml", "svg"),
        ("image/png", "png"),
        ("image/jpeg", "jpeg"),
        ("application/pdf", "pdf"),
        ("text/latex", "latex"),
        ("application/json", "json"),
        ("application/javascript", "javascript"),
    ];
    let mut out = Map::new();
    out.insert("type".into(), "result".into());
    out.insert("is_main_result".into(), result.is_main_result.into());
    let mut extra = Map::new();
    for (mime, value) in &result.data {
        match NAMES.iter().find(|(m, _)| m == mime) {
            Some((_, name)) => {
                out.insert((*name).into(), value.clone());
            }
            None => {
                extra.insert(mime.clone(), value.clone());
            }
        }
    }
    if !extra.is_empty() {
        out.insert("extra".into(), extra.into());
    }
    out.into()
}

fn e2b_context(context: CodeContext) -> Value {
    let cwd = if context.cwd.starts_with('/') {
        context.cwd
    } else {
        match context.cwd.parse() {
            Ok(path) => paths::to_e2b(&path),
            Err(_) => paths::HOME.to_owned(),
        }
    };
    json!({"id": context.id, "language": context.language, "cwd": cwd})
}

/// `POST /contexts`.
pub(crate) async fn create_context(
    State(state): State<AppState>,
    Extension(envd): Extension<Envd>,
    Json(body): Json<NewContext>,
) -> E2bResult<Json<Value>> {
    let language = language(body.language.as_deref())?.unwrap_or(CodeLanguage::Python);
    let cwd = body.cwd.as_deref().map(paths::to_workspace).transpose()?;
    let interpreter = interpreter(&state, &envd).await?;
    let made = interpreter.create_context(language, cwd.as_ref()).await?;
    Ok(Json(e2b_context(made)))
}

/// `GET /contexts`.
pub(crate) async fn list_contexts(
    State(state): State<AppState>,
    Extension(envd): Extension<Envd>,
) -> E2bResult<Json<Value>> {
    let interpreter = interpreter(&state, &envd).await?;
    let contexts = interpreter.contexts().await?;
    Ok(Json(contexts.into_iter().map(e2b_context).collect()))
}

/// `POST /contexts/{id}/restart`.
pub(crate) async fn restart_context(
    State(state): State<AppState>,
    Extension(envd): Extension<Envd>,
    Path(id): Path<String>,
) -> E2bResult<StatusCode> {
    let interpreter = interpreter(&state, &envd).await?;
    interpreter.restart_context(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `DELETE /contexts/{id}`.
pub(crate) async fn remove_context(
    State(state): State<AppState>,
    Extension(envd): Extension<Envd>,
    Path(id): Path<String>,
) -> Result<StatusCode, E2bError> {
    let interpreter = interpreter(&state, &envd).await?;
    interpreter.remove_context(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}
