//! The way out of a sandbox with `Network::Allowlist`: a listener inside the sandbox's
//! network namespace, made from outside it, that this process serves with the
//! sandbox's [`EgressProxy`].
//!
//! The namespace has loopback only, so the listener is the one address that leads
//! anywhere. It is opened by a short-lived child that joins the namespace and hands
//! the socket back over a Unix socket pair: this process keeps its own network, and
//! the sandbox never holds the socket.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::Mutex;

use sandcell::egress::{Allowlist, EgressCount, EgressProxy};
use sandcell::{Error, Network, Result, SandboxId};

/// Where the proxy listens inside a sandbox's network namespace.
pub(crate) const LISTEN_PORT: u16 = 3128;
/// The proxy address a sandbox's tools are given.
pub(crate) const PROXY_ADDR: &str = "127.0.0.1:3128";

/// The proxies this process serves, by sandbox.
#[derive(Debug, Default)]
pub(crate) struct Proxies {
    running: Mutex<HashMap<SandboxId, Running>>,
}

#[derive(Debug)]
struct Running {
    proxy: EgressProxy,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Proxies {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SandboxId, Running>> {
        // Whole entries are inserted and removed at once: a poisoned map is intact.
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Serves the egress of sandbox `id`, whose namespaces' pid 1 is `init`, unless
    /// this process already does. Another process serving it (the listener's port is
    /// taken) is fine: the sandbox has its way out.
    pub(crate) fn ensure(
        &self,
        id: &SandboxId,
        network: &Network,
        init: i32,
        join_user_ns: bool,
        noop: &Path,
        hosts: &BTreeMap<String, Vec<IpAddr>>,
    ) -> Result<()> {
        let Network::Allowlist(entries) = network else {
            return Ok(());
        };
        if self.lock().contains_key(id) {
            return Ok(());
        }
        let listener = match listen_in(init, join_user_ns, noop) {
            Ok(listener) => listener,
            Err(e) if e.raw_os_error() == Some(libc::EADDRINUSE) => {
                tracing::debug!(sandbox = %id, "another process serves this sandbox's egress");
                return Ok(());
            }
            Err(e) => {
                return Err(Error::io(
                    format_args!("opening the egress listener of sandbox {id}"),
                    e,
                ))
            }
        };
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::io("preparing the egress listener", e))?;
        let listener = tokio::net::TcpListener::from_std(listener)
            .map_err(|e| Error::io("preparing the egress listener", e))?;
        let proxy = EgressProxy::with_hosts(Allowlist::parse(entries)?, hosts.clone());
        let task = proxy.spawn_listener(listener);
        self.lock().insert(id.clone(), Running { proxy, task });
        Ok(())
    }

    /// Stops serving `id`; its open connections close.
    pub(crate) fn forget(&self, id: &SandboxId) {
        self.lock().remove(id);
    }

    /// Replaces the allowlist of a sandbox this process serves; `false` if it serves
    /// none for `id`.
    pub(crate) fn set_allowlist(&self, id: &SandboxId, allowlist: Allowlist) -> bool {
        match self.lock().get(id) {
            Some(running) => {
                running.proxy.set_allowlist(allowlist);
                true
            }
            None => false,
        }
    }

    /// Connections allowed and denied so far by this process's proxy for `id`.
    pub(crate) fn counts(&self, id: &SandboxId) -> Vec<EgressCount> {
        self.lock()
            .get(id)
            .map(|running| running.proxy.counts())
            .unwrap_or_default()
    }
}

/// A TCP listener on `127.0.0.1:LISTEN_PORT` in the network namespace of `init`
/// ([`crate::sys::listen_in_namespace`]).
fn listen_in(init: i32, join_user_ns: bool, noop: &Path) -> std::io::Result<std::net::TcpListener> {
    let open =
        |kind: &str| std::fs::File::open(format!("/proc/{init}/ns/{kind}")).map(OwnedFd::from);
    let user_ns = if join_user_ns {
        Some(open("user")?)
    } else {
        None
    };
    let net_ns = open("net")?;
    crate::sys::listen_in_namespace(user_ns.as_ref(), &net_ns, LISTEN_PORT, noop)
}
