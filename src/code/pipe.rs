//! The helper's pipes: requests written whole by a task of their own, answer lines
//! read, sized and handed to the requests that wait for them, and the helper given up
//! when it stops keeping to that.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use crate::error::{Error, ErrorKind};
use crate::json_lines::Lines;
use crate::process::{Process, ProcessStdin};

/// How long writing a request may take: a helper that stopped reading (its pipe full)
/// is given up, or a caller, and the interrupt a dropped run sends, would wait for ever.
pub(super) const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Who waits for which answer, and why the helper ended once it has.
#[derive(Default)]
pub(super) struct Routes {
    pub(super) open: HashMap<u64, mpsc::Sender<Queued>>,
    pub(super) ended: Option<String>,
}

pub(super) type SharedRoutes = Arc<Mutex<Routes>>;

/// The helper's process, killed when it is given up.
pub(super) type SharedProcess = Arc<Mutex<Option<Process>>>;

/// An answer line as read, holding its bytes' share of `max_queued` until parsed.
pub(super) struct Queued {
    pub(super) line: bytes::Bytes,
    _held: tokio::sync::OwnedSemaphorePermit,
}

/// A request's place among the routes, given up when dropped: a caller that goes
/// away leaves nothing behind (FINDINGS12 M1).
pub(super) struct Route {
    pub(super) routes: SharedRoutes,
    pub(super) id: u64,
}

impl Drop for Route {
    fn drop(&mut self) {
        routes(&self.routes).open.remove(&self.id);
    }
}

/// What the reader and the callers read of a line: small fields, the rest skipped
/// without being built (a line of a million numbers is not a million values).
#[derive(serde::Deserialize)]
struct Head<'a> {
    #[serde(default)]
    id: Option<u64>,
    #[serde(rename = "type", borrow, default)]
    kind: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default)]
    message: Option<std::borrow::Cow<'a, str>>,
    #[serde(rename = "kind", borrow, default)]
    failure: Option<std::borrow::Cow<'a, str>>,
}

/// Gives the helper up: every waiting request learns `why`, later ones are
/// `Unavailable`, and the helper is killed with its kernels.
pub(super) fn give_up(shared: &SharedRoutes, process: &SharedProcess, why: &str) {
    {
        let mut routes = routes(shared);
        routes.ended.get_or_insert_with(|| why.to_owned());
        routes.open.clear();
    }
    let process = process
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take();
    if let (Some(mut process), Ok(runtime)) = (process, tokio::runtime::Handle::try_current()) {
        runtime.spawn(async move {
            let _ = process.kill().await;
        });
    }
}

pub(super) fn routes(shared: &SharedRoutes) -> std::sync::MutexGuard<'_, Routes> {
    shared
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The error an answer line reports, if it is one (`failed`, `timeout`).
pub(super) fn failure(line: &[u8]) -> Option<Error> {
    let head = serde_json::from_slice::<Head<'_>>(line).ok()?;
    let message = head.message.unwrap_or_default().into_owned();
    match head.kind.as_deref() {
        Some("timeout") => Some(Error::new(ErrorKind::Timeout, message)),
        Some("failed") => {
            let kind = match head.failure.as_deref() {
                Some("unsupported") => ErrorKind::Unsupported,
                Some("not_found") => ErrorKind::NotFound,
                Some("invalid_input") => ErrorKind::InvalidInput,
                _ => ErrorKind::Backend,
            };
            Some(Error::new(kind, message))
        }
        _ => None,
    }
}

/// Reads the helper's lines and hands each to the request it answers; when the
/// helper ends, every open request learns why.
pub(super) async fn read_answers(
    mut lines: Lines,
    shared: SharedRoutes,
    queued: Arc<tokio::sync::Semaphore>,
    queued_cap: usize,
    ready: tokio::sync::oneshot::Sender<std::result::Result<(), String>>,
    said: tokio::task::JoinHandle<Option<String>>,
) {
    let mut ready = Some(ready);
    let why = loop {
        let line = match lines.next().await {
            Ok(Some(line)) => line,
            Ok(None) => break "its output closed".to_owned(),
            Err(e) => break e.to_string(),
        };
        let Ok(head) = serde_json::from_slice::<Head<'_>>(&line) else {
            continue;
        };
        match head.kind.as_deref() {
            Some("ready") => {
                if let Some(ready) = ready.take() {
                    let _ = ready.send(Ok(()));
                }
                continue;
            }
            Some("fatal") => {
                let message = head
                    .message
                    .map_or_else(|| "the code helper failed".to_owned(), |m| m.into_owned());
                if let Some(ready) = ready.take() {
                    let _ = ready.send(Err(message.clone()));
                }
                break message;
            }
            _ => {}
        }
        let Some(id) = head.id else {
            continue;
        };
        let route = routes(&shared).open.get(&id).cloned();
        if let Some(route) = route {
            // Lines waiting for their callers hold at most `max_queued` bytes: past
            // it the reader waits, and so does the helper.
            let want = line.len().clamp(1, queued_cap);
            let want = u32::try_from(want).unwrap_or(u32::MAX);
            let Ok(held) = Arc::clone(&queued).acquire_many_owned(want).await else {
                break "its answers could not be queued".to_owned();
            };
            let _ = route.send(Queued { line, _held: held }).await;
        }
    };
    let why = match tokio::time::timeout(Duration::from_secs(1), said).await {
        Ok(Ok(Some(said))) => format!("{why}; it last said: {said}"),
        _ => why,
    };
    let mut routes = routes(&shared);
    routes.ended = Some(why);
    routes.open.clear();
}

/// Writes whole request lines to the helper's input, each within `WRITE_TIMEOUT`: a
/// helper that stops reading is given up. Its input closes when the interpreter goes.
pub(super) async fn write_requests(
    mut stdin: ProcessStdin,
    mut lines: mpsc::Receiver<Vec<u8>>,
    shared: SharedRoutes,
    process: SharedProcess,
) {
    while let Some(line) = lines.recv().await {
        let written = tokio::time::timeout(WRITE_TIMEOUT, async {
            stdin.write_all(&line).await?;
            stdin.flush().await
        })
        .await;
        match written {
            Ok(Ok(())) => {}
            Ok(Err(_)) => {
                give_up(&shared, &process, "its input closed");
                return;
            }
            Err(_) => {
                give_up(&shared, &process, "it stopped reading its requests");
                return;
            }
        }
    }
}

/// Reads the helper's stderr to its end; answers the last line it said.
pub(super) async fn last_words(mut stderr: crate::backend::ByteStream) -> Option<String> {
    let mut last = Vec::new();
    while let Some(Ok(chunk)) = stderr.next().await {
        last.extend_from_slice(&chunk);
        if last.len() > 4096 {
            last.drain(..last.len() - 4096);
        }
    }
    let said = String::from_utf8_lossy(&last);
    said.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .map(|l| l.trim().to_owned())
}
