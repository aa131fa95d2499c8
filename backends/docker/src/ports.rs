//! Published ports: a listener on this host's loopback per (sandbox, port) that forwards
//! each connection to the same port at the container's address on its network.
//!
//! The engine binds host ports only when it creates a container, and services are given
//! their ports later, so the backend does here what the engine's userland proxy does
//! for ports published at create.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Mutex;

use bollard::Docker;
use sandcell::{Error, ErrorKind, Result, SandboxId};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::error::engine;
use crate::lock;

/// The forwarders this backend runs, by sandbox and port.
#[derive(Default)]
pub(crate) struct Forwarders {
    running: Mutex<HashMap<(SandboxId, u16), JoinHandle<()>>>,
}

impl Forwarders {
    /// Listens on `127.0.0.1:port` and forwards to the container `id`.
    pub(crate) async fn publish(&self, docker: &Docker, id: &SandboxId, port: u16) -> Result<()> {
        if lock(&self.running).contains_key(&(id.clone(), port)) {
            return Ok(());
        }
        // Checked now so that a sandbox without a network fails here, not per connection.
        container_address(docker, id).await?;
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, port))
            .await
            .map_err(|e| {
                Error::with_source(
                    ErrorKind::AlreadyExists,
                    format!("publishing port {port} of sandbox {id}: 127.0.0.1:{port} is taken"),
                    e,
                )
            })?;
        let task = tokio::spawn(accept(listener, docker.clone(), id.clone(), port));
        let mut running = lock(&self.running);
        if let Some(previous) = running.insert((id.clone(), port), task) {
            // A concurrent publish of the same port lost the bind race; keep one.
            previous.abort();
        }
        Ok(())
    }

    /// Stops forwarding `port` of `id`; open connections close with it.
    pub(crate) fn unpublish(&self, id: &SandboxId, port: u16) {
        if let Some(task) = lock(&self.running).remove(&(id.clone(), port)) {
            task.abort();
        }
    }

    /// Stops every forwarder of `id`.
    pub(crate) fn forget(&self, id: &SandboxId) {
        lock(&self.running).retain(|(sandbox, _), task| {
            let keep = sandbox != id;
            if !keep {
                task.abort();
            }
            keep
        });
    }
}

impl Drop for Forwarders {
    fn drop(&mut self) {
        for task in lock(&self.running).values() {
            task.abort();
        }
    }
}

/// Accepts until aborted; the connections live in a set so they end with it.
async fn accept(listener: TcpListener, docker: Docker, id: SandboxId, port: u16) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((client, _)) = accepted else { continue };
                connections.spawn(forward(client, docker.clone(), id.clone(), port));
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// One connection. The address is looked up each time: a reset may give the container
/// a new one.
async fn forward(mut client: TcpStream, docker: Docker, id: SandboxId, port: u16) {
    let Ok(ip) = container_address(&docker, &id).await else {
        return;
    };
    let Ok(mut upstream) = TcpStream::connect(SocketAddr::new(ip, port)).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
}

/// The container's address on its first network that gave it one.
async fn container_address(docker: &Docker, id: &SandboxId) -> Result<IpAddr> {
    let container = docker
        .inspect_container(id.as_str(), None)
        .await
        .map_err(|e| engine(format_args!("inspecting sandbox {id}"), e))?;
    container
        .network_settings
        .and_then(|n| n.networks)
        .into_iter()
        .flat_map(|networks| networks.into_values())
        .filter_map(|endpoint| endpoint.ip_address)
        .find_map(|ip| ip.parse::<IpAddr>().ok())
        .ok_or_else(|| {
            Error::unsupported(format!(
                "sandbox {id} has no network (Network::None): nothing on this host can reach its ports"
            ))
        })
}
