//! The way out of a sandbox with `Network::Allowlist`: a listener inside the sandbox's
//! network namespace, made from outside it, that this process serves with the
//! sandbox's [`EgressProxy`].
//!
//! The namespace has loopback only, so the listener is the one address that leads
//! anywhere. It is opened by a short-lived child that joins the namespace and hands
//! the socket back over a Unix socket pair: this process keeps its own network, and
//! the sandbox never holds the socket.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::os::fd::OwnedFd;
use std::path::Path;

use sandcell::egress::{Allowlist, EgressProxy, ServedProxies};
use sandcell::{Error, Network, Result, SandboxId};

/// Where the proxy listens inside a sandbox's network namespace.
pub(crate) const LISTEN_PORT: u16 = 3128;
/// The proxy address a sandbox's tools are given.
pub(crate) const PROXY_ADDR: &str = "127.0.0.1:3128";

/// Serves the egress of sandbox `id`, whose namespaces' pid 1 is `init`, unless this
/// process already does. Another process serving it (the listener's port is taken) is
/// fine: the sandbox has its way out.
pub(crate) fn ensure(
    proxies: &ServedProxies,
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
    if proxies.serves(id) {
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
    proxies.insert(id.clone(), proxy, task);
    Ok(())
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
