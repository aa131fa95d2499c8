//! envd's file watches: streamed (`WatchDir`) and polled (`CreateWatcher`,
//! `GetWatcherEvents`, `RemoveWatcher`), each holding a place among its tenant's
//! watches, a polled watcher's unread events bounded in number and bytes.

use std::collections::HashMap;
use std::sync::Arc;

use futures::stream::StreamExt;
use sandcell::{
    Error, SandboxBackend, SandboxId, SandboxPath, WatchEvent, WatchEventKind, WatchOptions,
};

use super::filesystem::entry_of;
use super::rpc::{self, RpcResult, StreamTiming};
use super::{paths, Envd};
use crate::lock;
use crate::AppState;
use axum::response::Response;
use sandcell_remote::e2b::envd::{
    event_type, FilesystemEvent, WatchDirMessage, WatchDirRequest, WatcherEvents, WatcherId,
};

/// Most polled watchers one sandbox has at once.
const MAX_WATCHERS: usize = 64;
/// Most events a polled watcher keeps between two polls; older ones are dropped.
const MAX_PENDING: usize = 10_000;
/// Most bytes of events (about what they take in memory) a polled watcher keeps
/// between two polls; older ones are dropped. Events of a deep tree name paths of
/// kilobytes: counted only by number, one never-polled watcher held 28 MB (FINDINGS7
/// S7).
const MAX_PENDING_BYTES: usize = 1 << 20;

/// The polled watchers, by id.
#[derive(Default)]
pub(crate) struct Watchers {
    by_id: std::sync::Mutex<HashMap<String, Arc<Watcher>>>,
}

struct Watcher {
    sandbox: SandboxId,
    /// Its place among the tenant's watches.
    _slot: tokio::sync::OwnedSemaphorePermit,
    /// Filled by `task`, emptied by each poll.
    pending: Arc<std::sync::Mutex<Pending>>,
    task: tokio::task::JoinHandle<()>,
}

/// The events a polled watcher holds until its next poll, oldest first, within
/// [`MAX_PENDING`] and [`MAX_PENDING_BYTES`].
#[derive(Default)]
struct Pending {
    events: std::collections::VecDeque<(usize, FilesystemEvent)>,
    bytes: usize,
}

impl Pending {
    fn push(&mut self, event: FilesystemEvent) {
        let weight = weight(&event);
        self.bytes += weight;
        self.events.push_back((weight, event));
        while self.events.len() > MAX_PENDING || self.bytes > MAX_PENDING_BYTES {
            let Some((weight, _)) = self.events.pop_front() else {
                break;
            };
            self.bytes -= weight;
        }
    }

    fn take(&mut self) -> Vec<FilesystemEvent> {
        self.bytes = 0;
        self.events.drain(..).map(|(_, event)| event).collect()
    }
}

/// About what an event takes in memory: its strings and a fixed part.
fn weight(event: &FilesystemEvent) -> usize {
    let entry = event.entry.as_ref().map_or(0, |e| {
        128 + e.name.len()
            + e.path.len()
            + e.permissions.len()
            + e.owner.len()
            + e.group.len()
            + e.symlink_target.as_ref().map_or(0, String::len)
    });
    64 + event.name.len() + event.event_type.len() + entry
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Watchers {
    /// Ends every watcher of `sandbox` (it is gone).
    pub(crate) fn forget_sandbox(&self, sandbox: &SandboxId) {
        lock(&self.by_id).retain(|_, w| &w.sandbox != sandbox);
    }
}

/// The events envd reports for one change beneath `dir`: a rename is the old name's
/// `RENAME` then the new name's `CREATE`, as inotify-based watchers see it.
async fn events_of(
    backend: &dyn SandboxBackend,
    id: &SandboxId,
    dir: &SandboxPath,
    event: WatchEvent,
    include_entry: bool,
) -> Vec<FilesystemEvent> {
    let name = |path: &SandboxPath| {
        path.strip_prefix(dir)
            .map_or_else(|| path.as_str().to_owned(), |p| p.as_str().to_owned())
    };
    let one = |kind: &str, path: &SandboxPath| FilesystemEvent {
        name: name(path),
        event_type: kind.to_owned(),
        entry: None,
    };
    let mut out = match event.kind {
        WatchEventKind::Created => vec![one(event_type::CREATE, &event.path)],
        WatchEventKind::Modified => vec![one(event_type::WRITE, &event.path)],
        WatchEventKind::Removed => vec![one(event_type::REMOVE, &event.path)],
        WatchEventKind::Attributes => vec![one(event_type::CHMOD, &event.path)],
        WatchEventKind::Renamed => {
            let mut both = Vec::new();
            if let Some(from) = &event.from {
                both.push(one(event_type::RENAME, from));
            }
            both.push(one(event_type::CREATE, &event.path));
            both
        }
        // Lost events cannot be told apart; the watch goes on.
        _ => Vec::new(),
    };
    if include_entry {
        for item in out
            .iter_mut()
            .filter(|e| e.event_type != event_type::REMOVE)
        {
            if item.event_type == event_type::RENAME {
                continue;
            }
            if let Ok(path) = dir.join(&item.name) {
                item.entry = backend.stat(id, &path).await.ok().map(|i| entry_of(&i));
            }
        }
    }
    out
}

/// A watch of the sandbox's directory the request names, with its place among the
/// sandbox's tenant's watches ([`ServerConfig::max_watches_per_tenant`]).
///
/// [`ServerConfig::max_watches_per_tenant`]: crate::ServerConfig::max_watches_per_tenant
async fn open_watch(
    state: &AppState,
    envd: &Envd,
    request: &WatchDirRequest,
) -> sandcell::Result<(
    SandboxPath,
    sandcell::WatchStream,
    tokio::sync::OwnedSemaphorePermit,
)> {
    let dir = paths::to_workspace(&request.path)?;
    let tenant = envd
        .info
        .labels
        .get(crate::tenants::TENANT_LABEL)
        .map(String::as_str)
        .unwrap_or_default();
    let slot = state.watch_slot(tenant)?;
    let options = WatchOptions::new().recursive(request.recursive);
    let stream = state.backend.watch(envd.id(), &dir, options).await?;
    Ok((dir, stream, slot))
}

pub(super) async fn watch_dir(
    state: &AppState,
    envd: &Envd,
    request: RpcResult<WatchDirRequest>,
    timing: StreamTiming,
) -> RpcResult<Response> {
    let request = request?;
    let (dir, watch, slot) = open_watch(state, envd, &request).await?;
    // The slot goes with the stream.
    let watch = watch.map(move |event| {
        let _ = &slot;
        event
    });
    let backend = Arc::clone(&state.backend);
    let id = envd.id().clone();
    let include = request.include_entry;
    let changes = watch
        .then(move |event| {
            let (backend, id, dir) = (Arc::clone(&backend), id.clone(), dir.clone());
            async move {
                match event {
                    Ok(event) => events_of(backend.as_ref(), &id, &dir, event, include)
                        .await
                        .into_iter()
                        .map(|e| {
                            Ok(WatchDirMessage {
                                filesystem: Some(e),
                                ..WatchDirMessage::default()
                            })
                        })
                        .collect::<Vec<_>>(),
                    Err(e) => vec![Err(e)],
                }
            }
        })
        .flat_map(futures::stream::iter);
    let start = futures::stream::once(async {
        Ok(WatchDirMessage {
            start: Some(sandcell_remote::e2b::envd::Empty {}),
            ..WatchDirMessage::default()
        })
    });
    let keepalive = WatchDirMessage {
        keepalive: Some(sandcell_remote::e2b::envd::Empty {}),
        ..WatchDirMessage::default()
    };
    Ok(rpc::stream(start.chain(changes).boxed(), keepalive, timing))
}

pub(super) async fn create_watcher(
    state: &AppState,
    envd: &Envd,
    request: RpcResult<WatchDirRequest>,
) -> RpcResult<Response> {
    let request = request?;
    let id = envd.id();
    let watching = lock(&state.e2b.watchers.by_id)
        .values()
        .filter(|w| &w.sandbox == id)
        .count();
    if watching >= MAX_WATCHERS {
        return Err(Error::limit_exceeded(format!(
            "sandbox {id} already has {MAX_WATCHERS} watchers: remove one first"
        ))
        .into());
    }
    let (dir, mut watch, slot) = open_watch(state, envd, &request).await?;
    let watcher_id = format!("watcher-{}", uuid::Uuid::new_v4().simple());
    let pending = Arc::new(std::sync::Mutex::new(Pending::default()));
    let backend = Arc::clone(&state.backend);
    let sandbox = id.clone();
    let include = request.include_entry;
    let filled = Arc::clone(&pending);
    let task = tokio::spawn(async move {
        while let Some(Ok(event)) = watch.next().await {
            let events = events_of(backend.as_ref(), &sandbox, &dir, event, include).await;
            let mut pending = lock(&filled);
            for event in events {
                pending.push(event);
            }
        }
    });
    // Dropping the watcher (removed, or its sandbox gone) aborts the task.
    let watcher = Arc::new(Watcher {
        sandbox: id.clone(),
        _slot: slot,
        pending,
        task,
    });
    {
        // Counted again with the insert under one lock: concurrent creates each
        // passed the first count.
        let mut by_id = lock(&state.e2b.watchers.by_id);
        if by_id.values().filter(|w| &w.sandbox == id).count() >= MAX_WATCHERS {
            return Err(Error::limit_exceeded(format!(
                "sandbox {id} already has {MAX_WATCHERS} watchers: remove one first"
            ))
            .into());
        }
        by_id.insert(watcher_id.clone(), watcher);
    }
    Ok(rpc::reply(&WatcherId { watcher_id }))
}

fn watcher(state: &AppState, id: &SandboxId, watcher_id: &str) -> RpcResult<Arc<Watcher>> {
    lock(&state.e2b.watchers.by_id)
        .get(watcher_id)
        .filter(|w| &w.sandbox == id)
        .cloned()
        .ok_or_else(|| Error::not_found(format!("watcher {watcher_id} not found")).into())
}

pub(super) fn watcher_events(
    state: &AppState,
    id: &SandboxId,
    request: RpcResult<WatcherId>,
) -> RpcResult<Response> {
    let watcher = watcher(state, id, &request?.watcher_id)?;
    let events = lock(&watcher.pending).take();
    Ok(rpc::reply(&WatcherEvents { events }))
}

pub(super) fn remove_watcher(
    state: &AppState,
    id: &SandboxId,
    request: RpcResult<WatcherId>,
) -> RpcResult<Response> {
    let watcher_id = request?.watcher_id;
    watcher(state, id, &watcher_id)?;
    lock(&state.e2b.watchers.by_id).remove(&watcher_id);
    Ok(rpc::reply(&serde_json::json!({})))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(n: usize, name_len: usize) -> FilesystemEvent {
        FilesystemEvent {
            name: format!("{n}-{}", "d/".repeat(name_len / 2)),
            event_type: event_type::CREATE.to_owned(),
            entry: None,
        }
    }

    /// FINDINGS7 S7: events naming kilobyte-long paths, never polled, are held within
    /// the byte bound, the newest kept.
    #[test]
    fn a_never_polled_watcher_holds_a_bounded_number_of_bytes() {
        let mut pending = Pending::default();
        for n in 0..5_000 {
            pending.push(event(n, 2_000));
        }
        assert!(pending.bytes <= MAX_PENDING_BYTES, "{}", pending.bytes);
        let held: usize = pending.events.iter().map(|(_, e)| e.name.len()).sum();
        assert!(held <= MAX_PENDING_BYTES, "{held} bytes of names held");
        let kept = pending.take();
        assert!(kept.len() > 100 && kept.len() < 5_000, "{}", kept.len());
        assert!(kept.last().is_some_and(|e| e.name.starts_with("4999-")));
        assert_eq!(pending.bytes, 0);
        // Short events are bounded by number.
        for n in 0..MAX_PENDING + 10 {
            pending.push(event(n, 0));
        }
        assert_eq!(pending.take().len(), MAX_PENDING);
    }
}
