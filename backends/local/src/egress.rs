//! The way out of a sandbox with `Network::Allowlist`: a listener this process serves
//! with the sandbox's [`EgressProxy`], and the only address the sandbox can reach.
//!
//! - At `Isolation::Namespaces` the listener is inside the sandbox's network namespace,
//!   which has loopback only. It is opened by a short-lived child that joins the
//!   namespace and hands the socket back over a Unix socket pair: this process keeps its
//!   own network, and the sandbox never holds the socket.
//! - At `Isolation::Landlock` the sandbox shares the host's network, so the listener is
//!   on the host's loopback at a port of its own, and the kernel narrows the sandbox to
//!   it three ways: a seccomp filter allows IPv4 and IPv6 only as TCP, Landlock allows
//!   TCP connections to that port only, and a BPF filter on the sandbox's cgroup allows
//!   `connect` to `127.0.0.1:port` only (Landlock's rules know ports, not addresses).

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::os::fd::AsFd;
use std::path::Path;

use sandcell::egress::Allowlist;
use sandcell::raw::egress::{EgressProxy, ServedProxies};
use sandcell::{Error, Network, Result, SandboxId};

/// Where the proxy listens inside a sandbox's network namespace.
const NAMESPACE_PORT: u16 = 3128;

/// Where a sandbox's listener is.
#[derive(Debug)]
pub(crate) enum Listener<'a> {
    /// In the network namespace of `init` (entered through its user namespace when
    /// `join_user_ns`), at [`NAMESPACE_PORT`]; `noop` is the program the helper that
    /// opens it execs when done. Held, `init` cannot be another process by the time
    /// its namespaces are opened.
    Namespace {
        init: crate::pinned::PinnedInit,
        join_user_ns: bool,
        noop: &'a Path,
    },
    /// On the host's loopback at this port.
    HostPort(u16),
}

impl Listener<'_> {
    /// The proxy address the sandbox's tools are given.
    pub(crate) fn proxy_addr(&self) -> String {
        match self {
            Listener::Namespace { .. } => format!("127.0.0.1:{NAMESPACE_PORT}"),
            Listener::HostPort(port) => format!("127.0.0.1:{port}"),
        }
    }

    fn open(&self) -> std::io::Result<TcpListener> {
        match self {
            Listener::Namespace {
                init,
                join_user_ns,
                noop,
            } => {
                let open =
                    |kind: &str| init.open_at(&format!("ns/{kind}"), rustix::fs::OFlags::RDONLY);
                let user_ns = if *join_user_ns {
                    Some(open("user")?)
                } else {
                    None
                };
                let net_ns = open("net")?;
                crate::sys::listen_in_namespace(user_ns.as_ref(), &net_ns, NAMESPACE_PORT, noop)
            }
            Listener::HostPort(port) => {
                TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, *port)))
            }
        }
    }
}

/// Serves the egress of sandbox `id` on `listener`, unless this process already does.
/// Another process serving it (the listener's port is taken) is fine: the sandbox has
/// its way out.
pub(crate) fn ensure(
    proxies: &ServedProxies,
    id: &SandboxId,
    network: &Network,
    listener: Listener<'_>,
    config: &crate::LocalConfig,
) -> Result<()> {
    let Network::Allowlist(entries) = network else {
        return Ok(());
    };
    if proxies.serves(id) {
        return Ok(());
    }
    let listener = match listener.open() {
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
    serve(proxies, id, entries, listener, config)
}

/// At `Isolation::Landlock`: opens a listener on a free port of the host's loopback,
/// narrows every process of the cgroup v2 directory `cgroup` to connecting there, and
/// serves it. Answers the port, for the sandbox's record.
pub(crate) fn start_on_host(
    proxies: &ServedProxies,
    id: &SandboxId,
    network: &Network,
    cgroup: &Path,
    config: &crate::LocalConfig,
) -> Result<u16> {
    let Network::Allowlist(entries) = network else {
        return Err(Error::invalid_input(
            "an egress listener needs an allowlist",
        ));
    };
    let listener = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
        .map_err(|e| Error::io("opening an egress listener on loopback", e))?;
    let port = listener
        .local_addr()
        .map_err(|e| Error::io("reading the egress listener's port", e))?
        .port();
    let dir = std::fs::File::open(cgroup)
        .map_err(|e| Error::io(format_args!("opening cgroup {}", cgroup.display()), e))?;
    crate::sys::restrict_connect(dir.as_fd(), port).map_err(|e| {
        Error::io(
            format_args!(
                "attaching the connect filter to cgroup {}",
                cgroup.display()
            ),
            e.into(),
        )
    })?;
    serve(proxies, id, entries, listener, config)?;
    Ok(port)
}

fn serve(
    proxies: &ServedProxies,
    id: &SandboxId,
    entries: &[String],
    listener: TcpListener,
    config: &crate::LocalConfig,
) -> Result<()> {
    listener
        .set_nonblocking(true)
        .map_err(|e| Error::io("preparing the egress listener", e))?;
    let listener = tokio::net::TcpListener::from_std(listener)
        .map_err(|e| Error::io("preparing the egress listener", e))?;
    let proxy = EgressProxy::with_hosts(accepted(entries, config)?, config.egress_hosts.clone());
    proxy.allow_private_ranges(config.egress_private_ranges);
    let task = proxy.spawn_listener(listener);
    proxies.insert(id.clone(), proxy, task);
    Ok(())
}

/// `entries` parsed, with a rule naming a private range refused unless the operator
/// allows them ([`LocalConfig::egress_private_ranges`](crate::LocalConfig)): checked
/// when a sandbox is created or its network set, and again when its proxy starts
/// (ADVERSARIAL 38).
pub(crate) fn accepted(entries: &[String], config: &crate::LocalConfig) -> Result<Allowlist> {
    let allowlist = Allowlist::parse(entries)?;
    allowlist.refuse_private(config.egress_private_ranges, "egress_private_ranges")?;
    Ok(allowlist)
}
