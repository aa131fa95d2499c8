//! `WireLoop`: a backend whose per-sandbox operations cross the wire protocol, for
//! running the conformance suite against it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::backend::SandboxBackend;
use crate::error::Result;
use crate::lock_unpoisoned as lock;
use crate::raw::wire::{serve, WireClient};
use crate::sandbox::SandboxId;

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

// A forwarder: a trait method left to its default would answer for the inner backend
// (the macro denies `missing_trait_methods`).
crate::raw::forward_backend! {
    impl SandboxBackend for WireLoop {
        forward {
            [files, exec, read, read_limited, export_changes, metrics, set_network] => wire live;
            [info, create, inspect, list, pause, resume, reset, ports, clone_sandbox]
                => field inner;
        }

        async fn destroy(&self, id: &SandboxId) -> Result<()> {
            self.disconnect(id);
            self.inner.destroy(id).await
        }
    }
}
