//! [`WireClient`]: the calling side, one connection to an agent serving one sandbox.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use tokio::io::{AsyncRead, AsyncWrite};

use super::frame::{self, Frame, Kind, MAIN};
use super::mux::{Inbound, Mux};
use super::proto::{self, Call, Reply, WireError};
use crate::archive::ImportOptions;
use crate::backend::{ByteStream, Changes};
use crate::error::{Error, Result};
use crate::exec::ExecRequest;
use crate::fs::{DirEntry, FileInfo};
use crate::metrics::SandboxMetrics;
use crate::path::SandboxPath;
use crate::process::Process;
use crate::watch::{WatchEvent, WatchOptions, WatchStream};

mod process;

/// The calling side of the wire protocol: every per-sandbox operation of
/// [`SandboxBackend`](crate::SandboxBackend), sent over one connection to an agent that
/// [`serve`](super::serve)s the sandbox. Cheap to clone; calls run concurrently.
///
/// The connection closes when the last clone and the last [`Process`] it started are
/// dropped. Once it has ended (the agent exited, the stream broke, the agent broke the
/// protocol) every call fails with [`ErrorKind::Unavailable`](crate::ErrorKind::Unavailable);
/// open a new client.
#[derive(Debug, Clone)]
pub struct WireClient {
    mux: Arc<Mux>,
    next_id: Arc<AtomicU64>,
}

impl WireClient {
    /// Starts a client over a connection (a socket, a pipe pair, an attached exec).
    /// Must be called inside a tokio runtime.
    pub fn new<R, W>(reader: R, writer: W) -> Self
    where
        R: AsyncRead + Send + Unpin + 'static,
        W: AsyncWrite + Send + Unpin + 'static,
    {
        WireClient {
            mux: Mux::start(reader, writer, None),
            next_id: Arc::new(AtomicU64::new(1)),
        }
    }

    /// Why the connection ended, if it has.
    pub fn closed(&self) -> Option<String> {
        self.mux.closed()
    }

    /// Opens a request: registers its id, then sends the call.
    fn call(&self, call: &Call) -> Result<Request> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let rx = self.mux.open(id)?;
        let request = Request {
            mux: Arc::clone(&self.mux),
            id,
            rx,
            streaming: false,
        };
        self.mux
            .send(Frame::new(Kind::Call, id, proto::encode(call)))?;
        Ok(request)
    }

    /// A call without bulk data either way.
    async fn simple<T: serde::de::DeserializeOwned>(&self, call: Call) -> Result<T> {
        let mut request = self.call(&call)?;
        request.reply().await?.into_result()
    }

    /// Starts a command; see [`SandboxBackend::exec`](crate::SandboxBackend::exec).
    pub async fn exec(&self, mut request: ExecRequest) -> Result<Process> {
        request.validate()?;
        let pty = request.pty.is_some();
        let stdin_bytes = request.stdin.take();
        let mut req = self.call(&Call::Exec { request })?;
        let output_limit: Option<usize> = req.reply().await?.into_result()?;
        Ok(process::assemble(req, stdin_bytes, pty, output_limit))
    }

    /// Reads a whole file.
    pub async fn read(&self, path: &SandboxPath) -> Result<Bytes> {
        self.read_limited(path, u64::MAX).await
    }

    /// Reads a whole file of at most `max_bytes`; see
    /// [`SandboxBackend::read_limited`](crate::SandboxBackend::read_limited). The agent is
    /// not trusted: reading stops, and the call ends, at the first byte past `max_bytes`.
    pub async fn read_limited(&self, path: &SandboxPath, max_bytes: u64) -> Result<Bytes> {
        let mut request = self.call(&Call::Read { path: path.clone() })?;
        request.reply().await?.into_result::<()>()?;
        let mut data = BytesMut::new();
        while let Some(chunk) = request.next_data().await? {
            crate::backend::check_read_limit(path, (data.len() + chunk.len()) as u64, max_bytes)?;
            data.extend_from_slice(&chunk);
        }
        Ok(data.freeze())
    }

    /// Writes a whole file.
    pub async fn write(&self, path: &SandboxPath, data: Bytes) -> Result<()> {
        let request = self.call(&Call::Write { path: path.clone() })?;
        let body = futures::stream::once(async move { Ok(data) }).boxed();
        request.upload(body).await
    }

    /// Metadata of a path, not following a final symlink.
    pub async fn stat(&self, path: &SandboxPath) -> Result<FileInfo> {
        self.simple(Call::Stat { path: path.clone() }).await
    }

    /// Lists a directory, sorted by name.
    ///
    /// The agent is not trusted: a listing over
    /// [`MAX_DIR_ENTRIES`](crate::MAX_DIR_ENTRIES) entries, or over twice
    /// [`MAX_LISTING_BYTES`](crate::MAX_LISTING_BYTES) on the wire, is `LimitExceeded`
    /// and is not read further.
    pub async fn list_dir(&self, path: &SandboxPath) -> Result<Vec<DirEntry>> {
        let what = format!("listing {path}");
        let mut request = self.call(&Call::ListDir { path: path.clone() })?;
        let entries: Vec<DirEntry> = match request.reply().await?.into_result()? {
            // An agent from before listings were streamed answers in the reply.
            serde_json::Value::Array(entries) => {
                serde_json::from_value(serde_json::Value::Array(entries))
                    .map_err(|e| frame::protocol(format_args!("a listing ({e})")))?
            }
            serde_json::Value::Null => {
                let mut data = BytesMut::new();
                while let Some(chunk) = request.next_data().await? {
                    if data.len() + chunk.len() > proto::MAX_LISTING_WIRE_BYTES {
                        return Err(Error::limit_exceeded(format!(
                            "{what}: over {} bytes on the wire",
                            proto::MAX_LISTING_WIRE_BYTES
                        )));
                    }
                    data.extend_from_slice(&chunk);
                }
                proto::decode(&data, "listing")?
            }
            other => {
                return Err(frame::protocol(format_args!(
                    "a listing reply of {}",
                    other.to_string().chars().take(40).collect::<String>()
                )))
            }
        };
        crate::raw::ListingLimit::new(what).admit_all(&entries)?;
        Ok(entries)
    }

    /// Removes a path.
    pub async fn remove(&self, path: &SandboxPath, recursive: bool) -> Result<()> {
        self.simple(Call::Remove {
            path: path.clone(),
            recursive,
        })
        .await
    }

    /// Creates a directory and its parents.
    pub async fn mkdir(&self, path: &SandboxPath) -> Result<()> {
        self.simple(Call::Mkdir { path: path.clone() }).await
    }

    /// Renames a path.
    pub async fn rename(&self, from: &SandboxPath, to: &SandboxPath) -> Result<()> {
        self.simple(Call::Rename {
            from: from.clone(),
            to: to.clone(),
        })
        .await
    }

    /// Exports a directory as an uncompressed tar stream.
    pub async fn export_tar(&self, path: &SandboxPath) -> Result<ByteStream> {
        let mut request = self.call(&Call::ExportTar { path: path.clone() })?;
        request.reply().await?.into_result::<()>()?;
        Ok(request.into_data_stream())
    }

    /// Imports an uncompressed tar stream into `path`.
    pub async fn import_tar(
        &self,
        path: &SandboxPath,
        tar: ByteStream,
        options: ImportOptions,
    ) -> Result<()> {
        let request = self.call(&Call::ImportTar {
            path: path.clone(),
            options,
        })?;
        request.upload(tar).await
    }

    /// The changes since the template.
    pub async fn export_changes(&self) -> Result<Changes> {
        let mut request = self.call(&Call::ExportChanges)?;
        let deleted: Vec<SandboxPath> = request.reply().await?.into_result()?;
        Ok(Changes::new(request.into_data_stream(), deleted))
    }

    /// Watches a directory; dropping the stream ends the watch on the agent.
    pub async fn watch(&self, path: &SandboxPath, options: WatchOptions) -> Result<WatchStream> {
        let mut request = self.call(&Call::Watch {
            path: path.clone(),
            options,
        })?;
        request.reply().await?.into_result::<()>()?;
        let guard = WatchGuard {
            mux: Arc::clone(&request.mux),
            id: request.id,
        };
        let lines = request.into_data_stream();
        // Events arrive as JSON lines, possibly split across frames.
        let events = futures::stream::unfold(
            (lines, BytesMut::new(), guard),
            |(mut lines, mut pending, guard)| async move {
                loop {
                    if let Some(end) = pending.iter().position(|b| *b == b'\n') {
                        let line = pending.split_to(end + 1);
                        let event = proto::decode::<WatchEvent>(&line[..end], "watch event");
                        return Some((event, (lines, pending, guard)));
                    }
                    match lines.next().await? {
                        Ok(chunk) if pending.len() + chunk.len() > frame::MAX_PAYLOAD => {
                            let e = frame::protocol("a watch event longer than a frame");
                            return Some((
                                Err(e),
                                (futures::stream::empty().boxed(), BytesMut::new(), guard),
                            ));
                        }
                        Ok(chunk) => pending.extend_from_slice(&chunk),
                        Err(e) => {
                            return Some((
                                Err(e),
                                (futures::stream::empty().boxed(), BytesMut::new(), guard),
                            ))
                        }
                    }
                }
            },
        );
        Ok(events.boxed())
    }

    /// A resource reading of the sandbox.
    pub async fn metrics(&self) -> Result<SandboxMetrics> {
        self.simple(Call::Metrics).await
    }

    /// Changes the sandbox's network allowlist (see
    /// [`SandboxBackend::set_network`](crate::SandboxBackend::set_network)).
    pub async fn set_network(&self, network: &crate::Network) -> Result<()> {
        self.simple(Call::SetNetwork {
            network: network.clone(),
        })
        .await
    }
}

/// One open request: its id and the frames arriving for it.
struct Request {
    mux: Arc<Mux>,
    id: u64,
    rx: Inbound,
    /// A stream of the server's still coming: dropped, it asks the server to stop.
    streaming: bool,
}

impl Drop for Request {
    fn drop(&mut self) {
        if self.streaming {
            // The server's producer (a thread of the host's, for an export) stops now,
            // not when its reader's credit runs dry. A server that does not know the
            // frame ignores it.
            let _ = self.mux.send(Frame::new(Kind::Kill, self.id, Bytes::new()));
        }
        self.mux.close(self.id);
    }
}

impl Request {
    fn lost(&self) -> Error {
        self.mux.ended_error()
    }

    /// Waits for the call's reply.
    async fn reply(&mut self) -> Result<Reply> {
        match self.rx.recv().await {
            Some(f) if f.kind == Kind::Reply => proto::decode(&f.payload, "reply"),
            Some(f) => Err(frame::protocol(format_args!(
                "{:?} frame before the reply",
                f.kind
            ))),
            None => Err(self.lost()),
        }
    }

    /// The next chunk of the main stream; `None` at its end.
    async fn next_data(&mut self) -> Result<Option<Bytes>> {
        match self.rx.recv().await {
            Some(f) if f.kind == Kind::Data => {
                self.mux.grant(self.id, MAIN, f.payload.len());
                Ok(Some(f.payload))
            }
            Some(f) if f.kind == Kind::End => {
                self.streaming = false;
                Ok(None)
            }
            Some(f) if f.kind == Kind::Abort => {
                self.streaming = false;
                Err(proto::decode::<WireError>(&f.payload, "abort")?.into())
            }
            Some(f) => Err(frame::protocol(format_args!(
                "{:?} frame in a data stream",
                f.kind
            ))),
            None => Err(self.lost()),
        }
    }

    fn into_data_stream(mut self) -> ByteStream {
        self.streaming = true;
        futures::stream::unfold(Some(self), |state| async move {
            let mut request = state?;
            match request.next_data().await {
                Ok(Some(chunk)) => Some((Ok(chunk), Some(request))),
                Ok(None) => None,
                Err(e) => Some((Err(e), None)),
            }
        })
        .boxed()
    }

    /// Sends `body` as the request's data, then waits for the reply. A reply that comes
    /// first (the server refused early) wins; an error in `body` aborts the request.
    async fn upload(mut self, mut body: ByteStream) -> Result<()> {
        let (mux, id) = (Arc::clone(&self.mux), self.id);
        let send = async {
            while let Some(chunk) = body.next().await {
                match chunk {
                    Ok(chunk) => mux.send_data(id, MAIN, chunk).await?,
                    Err(e) => {
                        mux.send(Frame::new(
                            Kind::Abort,
                            id,
                            proto::encode(&WireError::from(&e)),
                        ))?;
                        return Err(e);
                    }
                }
            }
            mux.send_end(id, MAIN)
        };
        tokio::select! {
            sent = send => {
                // Even after a local error, the server's reply tells what it did.
                let reply = self.reply().await;
                sent?;
                reply?.into_result()
            }
            reply = self.reply() => reply?.into_result(),
        }
    }
}

/// Routes a process's frames to its stdout, stderr and status.
/// Ends a watch on the agent when its stream is dropped.
struct WatchGuard {
    mux: Arc<Mux>,
    id: u64,
}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        let _ = self.mux.send(Frame::new(Kind::Kill, self.id, Bytes::new()));
    }
}
