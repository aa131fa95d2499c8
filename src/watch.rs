//! File watching: what [`SandboxBackend::watch`](crate::SandboxBackend::watch) reports.

use futures::stream::BoxStream;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::path::SandboxPath;

/// The events of one watch, in the order they happened. Dropping the stream ends the
/// watch and frees what the backend held for it (kernel watches included).
pub type WatchStream = BoxStream<'static, Result<WatchEvent>>;

/// How many events a backend keeps for a consumer that does not read; past that it
/// drops them and sends one [`WatchEventKind::Overflow`] instead.
pub const WATCH_BUFFER: usize = 4096;

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum WatchEventKind {
    /// A file, directory or link appeared (moved in from outside the watch included).
    Created,
    /// A file's content changed.
    Modified,
    /// An entry went away (moved out of the watch included).
    Removed,
    /// An entry moved within the watch: from [`WatchEvent::from`] to
    /// [`WatchEvent::path`].
    Renamed,
    /// Mode, owner or times changed.
    Attributes,
    /// Events were lost: the consumer fell behind or the kernel's queue filled. What
    /// changed since is unknown; rescan what matters. `path` is the watched directory.
    Overflow,
}

/// One change beneath a watched directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct WatchEvent {
    /// What happened.
    pub kind: WatchEventKind,
    /// The entry, relative to the workspace root.
    pub path: SandboxPath,
    /// For [`WatchEventKind::Renamed`]: where the entry was before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<SandboxPath>,
}

impl WatchEvent {
    /// An event of `kind` on `path`.
    pub fn new(kind: WatchEventKind, path: SandboxPath) -> Self {
        WatchEvent {
            kind,
            path,
            from: None,
        }
    }

    /// A rename from `from` to `to`.
    pub fn renamed(from: SandboxPath, to: SandboxPath) -> Self {
        WatchEvent {
            kind: WatchEventKind::Renamed,
            path: to,
            from: Some(from),
        }
    }
}

/// What to watch.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct WatchOptions {
    /// Also watch every directory beneath, including ones created while watching.
    #[serde(default)]
    pub recursive: bool,
}

impl WatchOptions {
    /// Watch the directory itself only.
    pub fn new() -> Self {
        WatchOptions::default()
    }

    /// Watch every directory beneath it too.
    pub fn recursive(mut self, recursive: bool) -> Self {
        self.recursive = recursive;
        self
    }
}

/// The backend side of a [`WatchStream`] ([`raw::watch_channel`](crate::raw::watch_channel)):
/// events in, at most [`WATCH_BUFFER`] held for the consumer, and one `Overflow` in
/// place of whatever did not fit.
#[derive(Debug)]
pub struct WatchSender {
    tx: tokio::sync::mpsc::Sender<Result<WatchEvent>>,
    /// The watched directory, which an `Overflow` names.
    root: SandboxPath,
    /// Events were dropped and the consumer has not been told yet.
    lost: bool,
}

impl WatchSender {
    /// Queues `event` for the consumer without waiting. When the buffer is full the
    /// event is dropped and an `Overflow` is queued once there is room again. Returns
    /// `false` once the consumer dropped the stream: the watch should end.
    pub fn send(&mut self, event: WatchEvent) -> bool {
        use tokio::sync::mpsc::error::TrySendError;
        if !self.send_pending() {
            return false;
        }
        if self.lost {
            // Still no room for the overflow marker: this event is lost too.
            return true;
        }
        match self.tx.try_send(Ok(event)) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) => {
                self.lost = true;
                true
            }
            Err(TrySendError::Closed(_)) => false,
        }
    }

    /// Reports that events were lost on the backend's side (a kernel queue overflowed).
    pub fn overflowed(&mut self) -> bool {
        self.lost = true;
        self.send_pending()
    }

    /// Queues a pending `Overflow` if there is room now; `false` once the consumer is
    /// gone.
    pub fn send_pending(&mut self) -> bool {
        if !self.lost {
            return !self.tx.is_closed();
        }
        use tokio::sync::mpsc::error::TrySendError;
        let overflow = WatchEvent::new(WatchEventKind::Overflow, self.root.clone());
        match self.tx.try_send(Ok(overflow)) {
            Ok(()) => {
                self.lost = false;
                true
            }
            Err(TrySendError::Full(_)) => true,
            Err(TrySendError::Closed(_)) => false,
        }
    }

    /// Whether events were lost and the consumer has not been told yet.
    pub fn has_pending(&self) -> bool {
        self.lost
    }

    /// Waits for room, then queues the pending `Overflow` (at once if none is
    /// pending): a backend with nothing more to report still tells a consumer that
    /// caught up what it missed. `false` once the consumer is gone.
    pub async fn flush(&mut self) -> bool {
        if !self.lost {
            return !self.tx.is_closed();
        }
        match self.tx.reserve().await {
            Ok(permit) => {
                permit.send(Ok(WatchEvent::new(
                    WatchEventKind::Overflow,
                    self.root.clone(),
                )));
                self.lost = false;
                true
            }
            Err(_) => false,
        }
    }

    /// Ends the stream with `error` (waiting for room, so it is not lost).
    pub async fn fail(self, error: crate::Error) {
        let _ = self.tx.send(Err(error)).await;
    }

    /// Whether the consumer dropped the stream.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// Completes when the consumer drops the stream.
    pub async fn closed(&self) {
        self.tx.closed().await
    }
}

/// A watch's two ends: the sender a backend feeds and the stream its caller reads.
/// `root` is the watched directory, named by `Overflow` events.
pub(crate) fn channel(root: SandboxPath) -> (WatchSender, WatchStream) {
    let (tx, rx) = tokio::sync::mpsc::channel(WATCH_BUFFER);
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    (
        WatchSender {
            tx,
            root,
            lost: false,
        },
        Box::pin(stream),
    )
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::*;

    fn event(n: usize) -> WatchEvent {
        WatchEvent::new(
            WatchEventKind::Created,
            SandboxPath::new(&format!("f{n}")).unwrap(),
        )
    }

    #[tokio::test]
    async fn a_consumer_that_falls_behind_gets_one_overflow_and_bounded_memory() {
        let (mut tx, mut stream) = channel(SandboxPath::root());
        for n in 0..WATCH_BUFFER + 1000 {
            assert!(tx.send(event(n)));
        }
        // The buffer holds the first WATCH_BUFFER events; the rest were dropped.
        for n in 0..WATCH_BUFFER {
            assert_eq!(stream.next().await.unwrap().unwrap(), event(n));
        }
        // The next event sent is preceded by the overflow marker.
        assert!(tx.send(event(99_999)));
        let overflow = stream.next().await.unwrap().unwrap();
        assert_eq!(overflow.kind, WatchEventKind::Overflow);
        assert_eq!(stream.next().await.unwrap().unwrap(), event(99_999));
        drop(stream);
        assert!(!tx.send(event(0)), "the consumer is gone");
        assert!(tx.is_closed());
    }
}
