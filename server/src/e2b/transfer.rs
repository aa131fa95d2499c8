//! envd's `/files` routes: a file's bytes down, and files up as multipart parts (each
//! named by its path) or as one `application/octet-stream` body.

use axum::body::Body;
use axum::extract::{Extension, FromRequest, Multipart, Query, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use sandcell::{Error, ErrorKind, FileKind, SandboxPath};
use serde::Deserialize;

use super::{paths, AppState, Envd};
use crate::lock;
use sandcell_remote::e2b::envd::{FilesError, WrittenEntry};

/// The query of both routes.
#[derive(Debug, Deserialize)]
pub(super) struct FilesQuery {
    #[serde(default)]
    path: Option<String>,
}

/// An error as envd's `/files` answers it: `{"message", "code"}`.
pub(super) struct FilesFailure(Error);

impl From<Error> for FilesFailure {
    fn from(e: Error) -> Self {
        FilesFailure(e)
    }
}

impl IntoResponse for FilesFailure {
    fn into_response(self) -> Response {
        let status = match self.0.kind() {
            ErrorKind::NotFound => StatusCode::NOT_FOUND,
            ErrorKind::LimitExceeded => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorKind::PermissionDenied => StatusCode::FORBIDDEN,
            ErrorKind::InvalidInput | ErrorKind::AlreadyExists | ErrorKind::InvalidState => {
                StatusCode::BAD_REQUEST
            }
            ErrorKind::Unsupported => StatusCode::NOT_IMPLEMENTED,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let body = FilesError {
            message: crate::public_message(&self.0),
            code: status.as_u16(),
        };
        (status, Json(body)).into_response()
    }
}

fn required_path(query: &FilesQuery) -> Result<SandboxPath, FilesFailure> {
    let path = query
        .path
        .as_deref()
        .ok_or_else(|| Error::invalid_input("the `path` query parameter is required"))?;
    Ok(paths::to_workspace(path)?)
}

/// `GET /files?path=`: the file's bytes; `413` for a file over the server's
/// [`max_file_bytes`](crate::ServerConfig::max_file_bytes), before it is read.
pub(super) async fn download(
    State(state): State<AppState>,
    Extension(envd): Extension<Envd>,
    Query(query): Query<FilesQuery>,
) -> Result<Response, FilesFailure> {
    let path = required_path(&query)?;
    let info = state.backend.stat(envd.id(), &path).await?;
    if info.kind == FileKind::Dir {
        return Err(Error::invalid_input(format!(
            "{} is a directory, not a file",
            paths::to_e2b(&path)
        ))
        .into());
    }
    let limit = state.config.max_file_bytes as u64;
    let budget = transfers(&state, &envd);
    // Taken before the read and held until the last byte is handed over, so a client
    // that asks and never reads holds at most its tenant's budget.
    let read = sandcell::raw::read_within(state.backend.as_ref(), envd.id(), &path, limit, &budget);
    let (data, held) = match read.await {
        Ok(read) => read,
        Err(e) if sandcell::raw::budget::is_refusal(&e) => return Ok(busy(&e)),
        Err(e) => return Err(e.into()),
    };
    let stall = state.config.held_response_timeout;
    let mut response = Response::new(Body::from_stream(copied_chunks(data, held, stall)));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    Ok(response)
}

/// The budget the sandbox's tenant's whole-file transfers share.
pub(super) fn transfers(state: &AppState, envd: &Envd) -> sandcell::raw::budget::ByteBudget {
    let tenant = envd.info.labels.get(crate::tenants::TENANT_LABEL);
    state.transfers(tenant.map(String::as_str).unwrap_or_default())
}

/// `429` in envd's shape: the tenant's transfers in flight hold its whole budget.
fn busy(e: &Error) -> Response {
    let body = FilesError {
        message: crate::public_message(e),
        code: StatusCode::TOO_MANY_REQUESTS.as_u16(),
    };
    (StatusCode::TOO_MANY_REQUESTS, Json(body)).into_response()
}

/// The bytes of `data` as copied chunks, `held` until the last is taken: a slice
/// would keep all of `data` alive in the connection's buffers after the budget let
/// it go. A client that takes no chunk for `stall` has the answer cut short (an
/// error ends the body) and `data` and `held` let go at once.
pub(super) fn copied_chunks(
    data: Bytes,
    held: sandcell::raw::budget::Reservation,
    stall: std::time::Duration,
) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> + Send {
    const CHUNK: usize = 64 << 10;
    let holding = std::sync::Arc::new(std::sync::Mutex::new(Some((data, held))));
    let taken = std::sync::Arc::new(tokio::sync::Notify::new());
    let watched = std::sync::Arc::downgrade(&holding);
    let progress = std::sync::Arc::clone(&taken);
    tokio::spawn(async move {
        // A permit is stored when nobody waits: no chunk taken is missed.
        while tokio::time::timeout(stall, progress.notified())
            .await
            .is_ok()
        {
            if watched.strong_count() == 0 {
                return;
            }
        }
        if let Some(holding) = watched.upgrade() {
            lock(&holding).take();
        }
    });
    futures::stream::unfold((holding, taken, 0), |(holding, taken, offset)| async move {
        // Cut short: the error was the last item.
        if offset == usize::MAX {
            return None;
        }
        taken.notify_one();
        let chunk = {
            let mut slot = lock(&holding);
            let Some((data, _)) = slot.as_ref() else {
                return Some((
                    Err(std::io::Error::other(
                        "the client took nothing for too long",
                    )),
                    (
                        std::sync::Arc::clone(&holding),
                        std::sync::Arc::clone(&taken),
                        usize::MAX,
                    ),
                ));
            };
            if offset >= data.len() {
                slot.take();
                None
            } else {
                let end = (offset + CHUNK).min(data.len());
                Some((Bytes::copy_from_slice(&data[offset..end]), end))
            }
        };
        match chunk {
            Some((chunk, end)) => Some((Ok(chunk), (holding, taken, end))),
            None => {
                // Wakes the watch, which finds nothing held and ends.
                drop(holding);
                taken.notify_one();
                None
            }
        }
    })
}

/// `POST /files`: writes each file (parents made as needed) and answers what it wrote.
pub(super) async fn upload(
    State(state): State<AppState>,
    Extension(envd): Extension<Envd>,
    Query(query): Query<FilesQuery>,
    request: Request,
) -> Result<Response, FilesFailure> {
    let limit = state.config.max_file_bytes;
    let headers = request.headers();
    if headers
        .get(header::CONTENT_ENCODING)
        .is_some_and(|v| v.as_bytes() != b"identity")
    {
        return Err(Error::invalid_input(
            "compressed uploads (Content-Encoding) are not supported: send the bytes as they are",
        )
        .into());
    }
    // The body is held whole until written: what it says it holds (or the most it may
    // hold) is taken from the tenant's budget first.
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        .unwrap_or(limit as u64)
        .min(limit as u64);
    let _held = match transfers(&state, &envd).try_reserve(declared) {
        Ok(held) => held,
        Err(e) => return Ok(busy(&e)),
    };
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let mut files: Vec<(SandboxPath, Bytes)> = Vec::new();
    if content_type.starts_with("multipart/form-data") {
        let mut multipart = Multipart::from_request(request, &state)
            .await
            .map_err(|e| Error::invalid_input(format!("a malformed multipart body: {e}")))?;
        // Over the route's body limit is `413`, whichever part crosses it.
        let single = query.path.is_some();
        loop {
            let field = multipart
                .next_field()
                .await
                .map_err(|e| too_large_or_bad(&e))?;
            let Some(field) = field else { break };
            let named = field.file_name().map(str::to_owned);
            let data = field.bytes().await.map_err(|e| too_large_or_bad(&e))?;
            if data.len() > limit {
                return Err(over(limit).into());
            }
            let path = match (&query.path, named) {
                (Some(path), _) if single && files.is_empty() => paths::to_workspace(path)?,
                (_, Some(name)) => paths::to_workspace(&name)?,
                _ => {
                    return Err(
                        Error::invalid_input("each part needs its path as its filename").into(),
                    )
                }
            };
            files.push((path, data));
        }
    } else {
        let path = required_path(&query)?;
        let data = axum::body::to_bytes(request.into_body(), limit)
            .await
            .map_err(|_| over(limit))?;
        files.push((path, data));
    }
    let mut written = Vec::with_capacity(files.len());
    for (path, data) in files {
        if let Some(parent) = path.parent().filter(|p| !p.is_root()) {
            state.backend.mkdir(envd.id(), &parent).await?;
        }
        state.backend.write(envd.id(), &path, data).await?;
        written.push(WrittenEntry {
            name: path.file_name().unwrap_or_default().to_owned(),
            entry_type: "file".to_owned(),
            path: paths::to_e2b(&path),
        });
    }
    Ok(Json(written).into_response())
}

fn over(limit: usize) -> Error {
    Error::limit_exceeded(format!("a file over this server's {limit}-byte limit"))
}

fn too_large_or_bad(e: &axum::extract::multipart::MultipartError) -> Error {
    let text = e.body_text();
    if e.status() == StatusCode::PAYLOAD_TOO_LARGE || text.contains("limit") {
        Error::limit_exceeded(format!("the upload is too large: {text}"))
    } else {
        Error::invalid_input(format!("a malformed multipart body: {text}"))
    }
}
