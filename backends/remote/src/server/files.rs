//! Files: whole-file read and write (raw bodies, in the style of E2B envd's `/files`),
//! tar export and import, and the file-system calls.

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::StreamExt;
use sandcell::archive::{ArchiveLimits, ImportOptions};
use sandcell::{Error, ErrorKind, SandboxPath};
use serde::Deserialize;

use super::{machine, ApiError, ApiResult, AppState, JsonBody};
use crate::protocol::PathBody;

#[derive(Debug, Deserialize)]
pub(super) struct PathQuery {
    path: String,
    #[serde(default)]
    mode: Option<String>,
    #[serde(default)]
    max_bytes: Option<u64>,
    #[serde(default)]
    max_entries: Option<u64>,
    #[serde(default)]
    max_depth: Option<usize>,
    #[serde(default)]
    max_name_len: Option<usize>,
}

impl PathQuery {
    /// The client's archive limits, never above this server's defaults.
    fn limits(&self) -> ArchiveLimits {
        let mut limits = ArchiveLimits::default();
        limits.max_bytes = self
            .max_bytes
            .map_or(limits.max_bytes, |v| v.min(limits.max_bytes));
        limits.max_entries = self
            .max_entries
            .map_or(limits.max_entries, |v| v.min(limits.max_entries));
        limits.max_depth = self
            .max_depth
            .map_or(limits.max_depth, |v| v.min(limits.max_depth));
        limits.max_name_len = self
            .max_name_len
            .map_or(limits.max_name_len, |v| v.min(limits.max_name_len));
        limits
    }
}

fn sandbox_path(raw: &str) -> ApiResult<SandboxPath> {
    Ok(SandboxPath::new(raw)?)
}

pub(super) async fn read(
    State(state): State<AppState>,
    Path((app, id)): Path<(String, String)>,
    Query(query): Query<PathQuery>,
) -> ApiResult<Response> {
    let info = machine(&state, &app, &id).await?;
    let data = state
        .backend
        .read(&info.id, &sandbox_path(&query.path)?)
        .await?;
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], data).into_response())
}

pub(super) async fn write(
    State(state): State<AppState>,
    Path((app, id)): Path<(String, String)>,
    Query(query): Query<PathQuery>,
    body: Body,
) -> ApiResult<Json<serde_json::Value>> {
    let info = machine(&state, &app, &id).await?;
    let path = sandbox_path(&query.path)?;
    let limit = state.config.max_file_bytes;
    let data = axum::body::to_bytes(body, limit).await.map_err(|e| {
        ApiError(Error::new(
            ErrorKind::LimitExceeded,
            format!("the file is larger than this server's {limit} byte limit ({e})"),
        ))
    })?;
    state.backend.write(&info.id, &path, data).await?;
    Ok(super::ok())
}

pub(super) async fn export(
    State(state): State<AppState>,
    Path((app, id)): Path<(String, String)>,
    Query(query): Query<PathQuery>,
) -> ApiResult<Response> {
    let info = machine(&state, &app, &id).await?;
    let tar = state
        .backend
        .export_tar(&info.id, &sandbox_path(&query.path)?)
        .await?;
    // An error mid-stream aborts the body, so the client sees a truncated transfer
    // rather than a short archive that looks whole.
    let body = Body::from_stream(tar.map(|chunk| chunk.map_err(std::io::Error::other)));
    Ok(([(header::CONTENT_TYPE, "application/x-tar")], body).into_response())
}

pub(super) async fn import(
    State(state): State<AppState>,
    Path((app, id)): Path<(String, String)>,
    Query(query): Query<PathQuery>,
    body: Body,
) -> ApiResult<Json<serde_json::Value>> {
    let info = machine(&state, &app, &id).await?;
    let path = sandbox_path(&query.path)?;
    let mut options = match query.mode.as_deref() {
        None | Some("merge") => ImportOptions::merge(),
        Some("replace") => ImportOptions::replace(),
        Some(other) => {
            return Err(ApiError(Error::invalid_input(format!(
                "mode must be merge or replace, not {other:?}"
            ))))
        }
    };
    options.limits = query.limits();
    let limit = state.config.max_archive_bytes;
    // A feeder reads the body, so that when the import stops early (a hostile entry, a
    // limit) the rest can still be read and dropped: a client still sending would
    // otherwise see its connection reset instead of this answer.
    let (chunks, tar) = futures::channel::mpsc::channel::<sandcell::Result<Bytes>>(4);
    let feeder = tokio::spawn(feed(body, chunks, limit));
    let result = state
        .backend
        .import_tar(&info.id, &path, tar.boxed(), options)
        .await;
    if result.is_err() {
        let _ = tokio::time::timeout(DRAIN_TIME, feeder).await;
    }
    result?;
    Ok(super::ok())
}

/// How long a failed import keeps reading (and dropping) what the client still sends.
const DRAIN_TIME: std::time::Duration = std::time::Duration::from_secs(10);

/// Forwards the body to the import, at most `limit` bytes; once the import stops
/// listening, reads the rest and drops it.
async fn feed(
    body: Body,
    mut chunks: futures::channel::mpsc::Sender<sandcell::Result<Bytes>>,
    limit: u64,
) {
    use futures::SinkExt;
    let mut body = body.into_data_stream();
    let mut seen = 0u64;
    let mut listening = true;
    while let Some(chunk) = body.next().await {
        let item = match chunk {
            Ok(chunk) => {
                seen += chunk.len() as u64;
                if seen > limit {
                    let _ = chunks
                        .send(Err(Error::new(
                            ErrorKind::LimitExceeded,
                            format!("the archive is larger than this server's {limit} byte limit"),
                        )))
                        .await;
                    return;
                }
                Ok(chunk)
            }
            Err(e) => Err(Error::invalid_input(format!("reading the archive: {e}"))),
        };
        let failed = item.is_err();
        if listening && chunks.send(item).await.is_err() {
            listening = false;
        }
        if failed {
            return;
        }
    }
}

/// `POST .../filesystem.Filesystem/{call}`.
pub(super) async fn filesystem(
    State(state): State<AppState>,
    Path((app, id, call)): Path<(String, String, String)>,
    JsonBody(body): JsonBody<PathBody>,
) -> ApiResult<Response> {
    let info = machine(&state, &app, &id).await?;
    let backend = &state.backend;
    let ok = || super::ok().into_response();
    Ok(match call.as_str() {
        "Stat" => Json(backend.stat(&info.id, &body.path).await?).into_response(),
        "ListDir" => Json(backend.list_dir(&info.id, &body.path).await?).into_response(),
        "MakeDir" => {
            backend.mkdir(&info.id, &body.path).await?;
            ok()
        }
        "Remove" => {
            backend.remove(&info.id, &body.path, body.recursive).await?;
            ok()
        }
        "Move" => {
            let to = body
                .destination
                .ok_or_else(|| ApiError(Error::invalid_input("Move needs a destination")))?;
            backend.rename(&info.id, &body.path, &to).await?;
            ok()
        }
        other => {
            return Err(ApiError(Error::not_found(format!(
                "no file-system call {other:?}"
            ))))
        }
    })
}
