//! `WireLoop`: a backend whose per-sandbox operations cross the wire protocol, for
//! running the conformance suite against it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;

use crate::archive::ImportOptions;
use crate::backend::{ByteStream, Changes, SandboxBackend};
use crate::capabilities::Capabilities;
use crate::error::Result;
use crate::exec::ExecRequest;
use crate::fs::{DirEntry, FileInfo};
use crate::lock_unpoisoned as lock;
use crate::path::SandboxPath;
use crate::process::Process;
use crate::raw::wire::{serve, WireClient};
use crate::sandbox::{LabelSelector, SandboxId, SandboxInfo};
use crate::spec::SandboxSpec;

/// Wraps a backend: lifecycle calls go to it directly, every per-sandbox operation goes
/// through a [`WireClient`] talking to [`serve`] over an in-memory pipe, one connection
/// per sandbox. A backend that passes the conformance suite directly must pass it
/// through the loop too; that is what pins the protocol.
pub struct WireLoop {
    inner: Arc<dyn SandboxBackend>,
    clients: Mutex<HashMap<SandboxId, (WireClient, tokio::task::JoinHandle<()>)>>,
}

impl std::fmt::Debug for WireLoop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WireLoop")
            .field("inner", &self.inner.name())
            .finish_non_exhaustive()
    }
}

impl WireLoop {
    /// Loops every sandbox of `inner` through the wire protocol.
    pub fn new(inner: impl SandboxBackend + 'static) -> Self {
        WireLoop {
            inner: Arc::new(inner),
            clients: Mutex::new(HashMap::new()),
        }
    }

    /// The client of sandbox `id`, connecting on first use (sandboxes not created
    /// through this wrapper are reachable too).
    pub fn client(&self, id: &SandboxId) -> WireClient {
        let mut clients = lock(&self.clients);
        if let Some((client, _)) = clients.get(id).filter(|(c, _)| c.closed().is_none()) {
            return client.clone();
        }
        // agent <-> relay <-> caller: the relay is the "network", so disconnect can cut it.
        let (agent, agent_end) = tokio::io::duplex(256 * 1024);
        let (caller, caller_end) = tokio::io::duplex(256 * 1024);
        let relay = tokio::spawn(async move {
            let (mut agent_end, mut caller_end) = (agent_end, caller_end);
            let _ = tokio::io::copy_bidirectional(&mut agent_end, &mut caller_end).await;
        });
        let (agent_read, agent_write) = tokio::io::split(agent);
        tokio::spawn(serve(
            Arc::clone(&self.inner),
            id.clone(),
            agent_read,
            agent_write,
        ));
        let (read, write) = tokio::io::split(caller);
        let client = WireClient::new(read, write);
        if let Some((_, old)) = clients.insert(id.clone(), (client.clone(), relay)) {
            old.abort();
        }
        client
    }

    /// Cuts the connection of sandbox `id`, as an agent crash or a network cut would:
    /// both sides see it end.
    pub fn disconnect(&self, id: &SandboxId) {
        if let Some((_, relay)) = lock(&self.clients).remove(id) {
            relay.abort();
        }
    }

    /// Checks the sandbox exists, so unknown ids fail as the inner backend says.
    async fn live(&self, id: &SandboxId) -> Result<WireClient> {
        self.inner.inspect(id).await?;
        Ok(self.client(id))
    }
}

// A forwarder: a trait method left to its default would answer for the inner backend.
#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl SandboxBackend for WireLoop {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn create(&self, spec: &SandboxSpec) -> Result<SandboxInfo> {
        self.inner.create(spec).await
    }

    async fn inspect(&self, id: &SandboxId) -> Result<SandboxInfo> {
        self.inner.inspect(id).await
    }

    async fn list(&self, selector: &LabelSelector) -> Result<Vec<SandboxInfo>> {
        self.inner.list(selector).await
    }

    async fn destroy(&self, id: &SandboxId) -> Result<()> {
        self.disconnect(id);
        self.inner.destroy(id).await
    }

    async fn pause(&self, id: &SandboxId) -> Result<()> {
        self.inner.pause(id).await
    }

    async fn resume(&self, id: &SandboxId) -> Result<()> {
        self.inner.resume(id).await
    }

    async fn reset(&self, id: &SandboxId) -> Result<()> {
        self.inner.reset(id).await
    }

    async fn publish_port(&self, id: &SandboxId, port: u16) -> Result<()> {
        self.inner.publish_port(id, port).await
    }

    async fn unpublish_port(&self, id: &SandboxId, port: u16) -> Result<()> {
        self.inner.unpublish_port(id, port).await
    }

    async fn exec(&self, id: &SandboxId, request: ExecRequest) -> Result<Process> {
        self.live(id).await?.exec(request).await
    }

    async fn read(&self, id: &SandboxId, path: &SandboxPath) -> Result<Bytes> {
        self.live(id).await?.read(path).await
    }

    async fn read_limited(
        &self,
        id: &SandboxId,
        path: &SandboxPath,
        max_bytes: u64,
    ) -> Result<Bytes> {
        self.live(id).await?.read_limited(path, max_bytes).await
    }

    async fn write(&self, id: &SandboxId, path: &SandboxPath, data: Bytes) -> Result<()> {
        self.live(id).await?.write(path, data).await
    }

    async fn stat(&self, id: &SandboxId, path: &SandboxPath) -> Result<FileInfo> {
        self.live(id).await?.stat(path).await
    }

    async fn list_dir(&self, id: &SandboxId, path: &SandboxPath) -> Result<Vec<DirEntry>> {
        self.live(id).await?.list_dir(path).await
    }

    async fn remove(&self, id: &SandboxId, path: &SandboxPath, recursive: bool) -> Result<()> {
        self.live(id).await?.remove(path, recursive).await
    }

    async fn mkdir(&self, id: &SandboxId, path: &SandboxPath) -> Result<()> {
        self.live(id).await?.mkdir(path).await
    }

    async fn rename(&self, id: &SandboxId, from: &SandboxPath, to: &SandboxPath) -> Result<()> {
        self.live(id).await?.rename(from, to).await
    }

    async fn export_tar(&self, id: &SandboxId, path: &SandboxPath) -> Result<ByteStream> {
        self.live(id).await?.export_tar(path).await
    }

    async fn export_changes(&self, id: &SandboxId) -> Result<Changes> {
        self.live(id).await?.export_changes().await
    }

    async fn import_tar(
        &self,
        id: &SandboxId,
        path: &SandboxPath,
        tar: ByteStream,
        options: ImportOptions,
    ) -> Result<()> {
        self.live(id).await?.import_tar(path, tar, options).await
    }

    async fn watch(
        &self,
        id: &SandboxId,
        path: &SandboxPath,
        options: crate::WatchOptions,
    ) -> Result<crate::WatchStream> {
        self.live(id).await?.watch(path, options).await
    }

    async fn metrics(&self, id: &SandboxId) -> Result<crate::SandboxMetrics> {
        self.live(id).await?.metrics().await
    }

    async fn set_network(&self, id: &SandboxId, network: &crate::Network) -> Result<()> {
        self.live(id).await?.set_network(network).await
    }

    async fn clone_sandbox(
        &self,
        id: &SandboxId,
        labels: std::collections::BTreeMap<String, String>,
    ) -> Result<SandboxInfo> {
        self.inner.clone_sandbox(id, labels).await
    }
}
