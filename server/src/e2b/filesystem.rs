//! envd's `filesystem.Filesystem` service over the backend's file operations: stat,
//! list, make, move and remove here, the watches in [`super::watchers`].

use axum::extract::{Extension, Path, Request, State};
use axum::response::Response;
use sandcell::{Error, ErrorKind, FileInfo, FileKind, SandboxBackend, SandboxId, SandboxPath};

use super::rpc::{self, RpcResult, StreamTiming};
use super::{paths, watchers, Envd};
use crate::AppState;
use sandcell_remote::e2b::envd::{
    file_type, EntryInfo, EntryResponse, ListDirRequest, MoveRequest, PathRequest,
};

/// Most entries one `ListDir` answers, however deep it goes; past it the call is
/// refused (`LimitExceeded`), never cut short silently.
pub(crate) const MAX_LISTED: usize = 100_000;
/// Most bytes one `ListDir` answer holds, each entry counted as its path, name and
/// link target as JSON escapes them plus [`ENTRY_OVERHEAD`]; past it the call is
/// refused (`LimitExceeded`). What it holds is reserved from the tenant's transfer
/// budget as it grows, and held until the answer is sent.
pub(crate) const MAX_LISTED_BYTES: u64 = 64 << 20;
/// What an entry's other fields (kind, mode, owner, time) and their JSON cost.
const ENTRY_OVERHEAD: u64 = 256;
/// What reading one directory may hold before its entries can be counted: the
/// backend's listing of up to `MAX_LISTING_BYTES` of names, with each entry's own
/// fields. Reserved from the budget (at most all of it) for the read, and given back
/// down to what was counted once the directory is done.
const DIRECTORY_HOLD: u64 = 64 << 20;
/// Deepest `ListDir` answers. E2B's SDKs ask for 1 unless told otherwise; a deeper
/// request is refused as invalid (`400`), not clamped, so a client never takes a
/// partial tree for the whole one.
pub(crate) const MAX_DEPTH: u32 = 64;
/// `POST /filesystem.Filesystem/{method}`.
pub(super) async fn call(
    State(state): State<AppState>,
    Extension(envd): Extension<Envd>,
    Path(method): Path<String>,
    request: Request,
) -> Response {
    let timing = StreamTiming::of(request.headers());
    let backend = state.backend.as_ref();
    let id = envd.id();
    let answer = match method.as_str() {
        "Stat" => stat(backend, id, rpc::message(request).await).await,
        "ListDir" => list_dir(&state, &envd, rpc::message(request).await).await,
        "MakeDir" => make_dir(backend, id, rpc::message(request).await).await,
        "Move" => rename(backend, id, rpc::message(request).await).await,
        "Remove" => remove(backend, id, rpc::message(request).await).await,
        "WatchDir" => {
            let watching =
                watchers::watch_dir(&state, &envd, rpc::message(request).await, timing).await;
            Ok(watching.unwrap_or_else(|e| rpc::stream_error(&e.0)))
        }
        "CreateWatcher" => {
            watchers::create_watcher(&state, &envd, rpc::message(request).await).await
        }
        "GetWatcherEvents" => watchers::watcher_events(&state, id, rpc::message(request).await),
        "RemoveWatcher" => watchers::remove_watcher(&state, id, rpc::message(request).await),
        other => Err(rpc::unknown_method("filesystem.Filesystem", other)),
    };
    answer.unwrap_or_else(axum::response::IntoResponse::into_response)
}

/// The entry envd reports for a file.
pub(crate) fn entry_of(info: &FileInfo) -> EntryInfo {
    let (kind_type, kind_char) = match info.kind {
        FileKind::Dir => (file_type::DIRECTORY, 'd'),
        FileKind::Symlink => (file_type::SYMLINK, 'l'),
        _ => (file_type::FILE, '-'),
    };
    EntryInfo {
        name: info
            .path
            .file_name()
            .map_or_else(|| "user".to_owned(), str::to_owned),
        file_type: kind_type.to_owned(),
        path: paths::to_e2b(&info.path),
        size: i64::try_from(info.size).unwrap_or(i64::MAX),
        mode: info.mode & 0o7777,
        permissions: permissions(kind_char, info.mode),
        owner: "user".to_owned(),
        group: "user".to_owned(),
        modified_time: info
            .modified
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Nanos, true)),
        symlink_target: info.symlink_target.clone(),
    }
}

/// Mode bits as `ls -l` shows them, e.g. `-rw-r--r--`.
fn permissions(kind: char, mode: u32) -> String {
    let mut out = String::with_capacity(10);
    out.push(kind);
    for shift in [6, 3, 0] {
        let bits = (mode >> shift) & 0o7;
        out.push(if bits & 4 != 0 { 'r' } else { '-' });
        out.push(if bits & 2 != 0 { 'w' } else { '-' });
        out.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    out
}

async fn entry(
    backend: &dyn SandboxBackend,
    id: &SandboxId,
    path: &SandboxPath,
) -> RpcResult<EntryInfo> {
    Ok(entry_of(&backend.stat(id, path).await?))
}

async fn stat(
    backend: &dyn SandboxBackend,
    id: &SandboxId,
    request: RpcResult<PathRequest>,
) -> RpcResult<Response> {
    let path = paths::to_workspace(&request?.path)?;
    let entry = entry(backend, id, &path).await?;
    Ok(rpc::reply(&EntryResponse { entry }))
}

/// `ListDir`: the directory's entries, `depth` levels deep, breadth first. The walk
/// ends at the deepest level that has directories, gives the runtime back between
/// directories, and stops at [`MAX_LISTED`] entries.
async fn list_dir(
    state: &AppState,
    envd: &Envd,
    request: RpcResult<ListDirRequest>,
) -> RpcResult<Response> {
    let (backend, id) = (state.backend.as_ref(), envd.id());
    let request = request?;
    let root = paths::to_workspace(&request.path)?;
    if request.depth > MAX_DEPTH {
        return Err(Error::invalid_input(format!(
            "depth {} is deeper than the {MAX_DEPTH} levels this server lists at once: \
             list a subdirectory instead",
            request.depth
        ))
        .into());
    }
    let depth = request.depth.max(1);
    let budget = super::transfer::transfers(state, envd);
    let mut listed = Listed {
        held: budget.try_reserve(RESERVE_STEP)?,
        reserved: RESERVE_STEP,
        used: 0,
        directory_hold: DIRECTORY_HOLD.min(budget.bytes()),
    };
    // Encoded as the walk goes (the shape of `ListDirResponse`): only the answer is
    // held, never the entries beside it.
    let mut json = b"{\"entries\":[".to_vec();
    let mut listed_entries = 0usize;
    let mut level = vec![root];
    for _ in 0..depth {
        if level.is_empty() {
            break;
        }
        let mut next = Vec::new();
        for dir in level {
            // A backend answering from memory never yields on its own.
            tokio::task::consume_budget().await;
            listed.before_directory(&budget)?;
            for item in backend.list_dir(id, &dir).await? {
                if listed_entries >= MAX_LISTED {
                    return Err(Error::limit_exceeded(format!(
                        "the listing holds more than {MAX_LISTED} entries: list less deep"
                    ))
                    .into());
                }
                let info = backend.stat(id, &item.path).await?;
                if info.kind == FileKind::Dir {
                    next.push(item.path.clone());
                }
                let entry = entry_of(&info);
                listed.count(&entry, &budget)?;
                // Grown a step at a time, never doubled past what was counted.
                if json.capacity() - json.len() < (64 << 10) {
                    json.reserve_exact(RESERVE_STEP as usize);
                }
                if listed_entries > 0 {
                    json.push(b',');
                }
                serde_json::to_writer(&mut json, &entry).map_err(|e| {
                    Error::new(ErrorKind::Backend, format!("encoding a listing: {e}"))
                })?;
                listed_entries += 1;
            }
            listed.after_directory();
        }
        level = next;
    }
    json.extend_from_slice(b"]}");
    let stall = state.config.held_response_timeout;
    let body = super::transfer::copied_chunks(json.into(), listed.held, stall);
    let mut response = Response::new(axum::body::Body::from_stream(body));
    response.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/json"),
    );
    Ok(response)
}

/// How much of the tenant's budget a `ListDir` reserves at a time.
const RESERVE_STEP: u64 = 1 << 20;

/// What a `ListDir` answer holds so far, and what it reserved for it.
struct Listed {
    held: sandcell::raw::budget::Reservation,
    reserved: u64,
    used: u64,
    /// [`DIRECTORY_HOLD`], or the whole budget where that is smaller.
    directory_hold: u64,
}

impl Listed {
    /// Reserves room for reading one directory whole (see [`DIRECTORY_HOLD`]).
    fn before_directory(
        &mut self,
        budget: &sandcell::raw::budget::ByteBudget,
    ) -> sandcell::Result<()> {
        let wanted = self.used + self.directory_hold;
        if wanted > self.reserved {
            self.held.grow(budget, wanted - self.reserved)?;
            self.reserved = wanted;
        }
        Ok(())
    }

    /// Gives back what reading a directory reserved beyond what its entries counted.
    fn after_directory(&mut self) {
        let keep = self.used.div_ceil(RESERVE_STEP).max(1) * RESERVE_STEP;
        if keep < self.reserved {
            self.held.shrink_to(keep);
            self.reserved = keep;
        }
    }

    /// Counts `entry`: `LimitExceeded` past [`MAX_LISTED_BYTES`] or the tenant's budget.
    fn count(
        &mut self,
        entry: &EntryInfo,
        budget: &sandcell::raw::budget::ByteBudget,
    ) -> sandcell::Result<()> {
        let text = json_len(&entry.path)
            + json_len(&entry.name)
            + entry.symlink_target.as_deref().map_or(0, json_len);
        self.used += text + ENTRY_OVERHEAD;
        if self.used > MAX_LISTED_BYTES {
            return Err(Error::limit_exceeded(format!(
                "the listing holds more than {MAX_LISTED_BYTES} bytes: list less deep"
            )));
        }
        if self.used > self.reserved {
            self.held.grow(budget, RESERVE_STEP)?;
            self.reserved += RESERVE_STEP;
        }
        Ok(())
    }
}

/// The most bytes `text` takes as a JSON string's contents: a control character is
/// escaped to six, a quote or backslash to two.
fn json_len(text: &str) -> u64 {
    text.bytes()
        .map(|b| match b {
            b'"' | b'\\' => 2,
            0..=0x1f => 6,
            _ => 1,
        })
        .sum()
}

async fn make_dir(
    backend: &dyn SandboxBackend,
    id: &SandboxId,
    request: RpcResult<PathRequest>,
) -> RpcResult<Response> {
    let path = paths::to_workspace(&request?.path)?;
    match backend.stat(id, &path).await {
        Ok(_) => {
            return Err(Error::new(
                ErrorKind::AlreadyExists,
                format!("{} already exists", paths::to_e2b(&path)),
            )
            .into())
        }
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(e.into()),
    }
    backend.mkdir(id, &path).await?;
    let entry = entry(backend, id, &path).await?;
    Ok(rpc::reply(&EntryResponse { entry }))
}

async fn rename(
    backend: &dyn SandboxBackend,
    id: &SandboxId,
    request: RpcResult<MoveRequest>,
) -> RpcResult<Response> {
    let request = request?;
    let from = paths::to_workspace(&request.source)?;
    let to = paths::to_workspace(&request.destination)?;
    backend.rename(id, &from, &to).await?;
    let entry = entry(backend, id, &to).await?;
    Ok(rpc::reply(&EntryResponse { entry }))
}

async fn remove(
    backend: &dyn SandboxBackend,
    id: &SandboxId,
    request: RpcResult<PathRequest>,
) -> RpcResult<Response> {
    let path = paths::to_workspace(&request?.path)?;
    backend.remove(id, &path, true).await?;
    Ok(rpc::reply(&serde_json::json!({})))
}
