//! `Network::Full` at `Isolation::Namespaces`: a network namespace of the sandbox's own
//! with a way out to the world, and none to the host or to other sandboxes
//! (ADVERSARIAL 38).
//!
//! Each sandbox gets a veth pair: one end (`eth0`) in its network namespace, the other
//! (`scn<n>`) on the host, a /31 from [`POOL`] between them, and the host's end as its
//! default route. One nftables table for every sandbox ([`RULES`]) masquerades what
//! leaves, drops everything a sandbox sends to the host itself (the input hook: every
//! address of the host's, loopback included) and everything between sandboxes (the
//! forward hook), and what it sends to a private, shared or link-local address the
//! host routes to, and lets only replies in. It also drops what a sandbox sends from an
//! address that is not its own (a strict reverse-path check) and past 2048 tracked
//! flows, so no sandbox fills the host's connection tracking.
//!
//! Why not `pasta` or `slirp4netns`: they connect out from the host, as a host process,
//! so a sandbox reaches whatever the host reaches, its own non-loopback addresses
//! included (their options keep the gateway from mapping to the host's loopback, not
//! the host's addresses from being dialled). Closing that takes nftables rules on the
//! host, hence root, anyway; with root a routed veth is the plainer path, kept by
//! the kernel. Without root the backend refuses `Network::Full` at this level (its
//! `network_full` capability is off).
//!
//! Nothing outlives the sandbox: the pair goes with its namespace (the kernel deletes a
//! veth whose peer's namespace is gone), is deleted explicitly at destroy and reset,
//! and the table (and the accept rules a Docker host's `DOCKER-USER` chain needs) is
//! removed when the last sandbox's veth is. Every step runs under one host-wide lock.
//! The helpers (`ip`, `nft`, `nsenter`, `iptables`) start with an environment built
//! here, never a client's.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use sandcell::raw::host_tool::{output, run, HostLock};
use sandcell::{Error, ErrorKind, Result};

/// The nftables table, loaded whole (it replaces itself) before each sandbox's veth.
const RULES: &str = include_str!("network.nft");
/// The table's name in [`RULES`].
const TABLE: &str = "sandcell_net";
/// Host-side veth names: `scn` and a number.
const PREFIX: &str = "scn";
/// The addresses sandboxes' veths are numbered from, as /31 pairs (host, sandbox): the
/// top /16 of the shared address space (RFC 6598), rarely a host's own network.
const POOL: (Ipv4Addr, u32) = (Ipv4Addr::new(100, 127, 0, 0), 1 << 15);
/// Serialises every change to sandbox networking on this host, across processes.
const LOCK: &str = "/run/sandcell-network.lock";
/// Marks the rules added to a Docker host's `DOCKER-USER` chain.
const DOCKER_COMMENT: &str = "sandcell Network::Full";

/// The programs this module runs.
struct Tools {
    ip: PathBuf,
    nft: PathBuf,
    nsenter: PathBuf,
}

fn tools() -> Result<Tools> {
    let find = |program: &str, package: &str| {
        crate::namespace::find(program).ok_or_else(|| {
            Error::unsupported(format!(
                "Network::Full at Isolation::Namespaces needs {program}: install {package}"
            ))
        })
    };
    Ok(Tools {
        ip: find("ip", "iproute2")?,
        nft: find("nft", "nftables")?,
        nsenter: find("nsenter", "util-linux")?,
    })
}

/// Whether this process can give sandboxes a full network at `Isolation::Namespaces`:
/// the veth and the host's rules need root.
pub(crate) fn full_available() -> bool {
    rustix::process::geteuid().is_root()
}

/// The host-wide lock, held while it lives.
fn lock() -> Result<HostLock> {
    HostLock::acquire(Path::new(LOCK))
}

/// Gives the network namespace at `netns` (a sandbox's own, with only loopback in it)
/// a veth to the host; returns the host-side end as `name@ifindex`, to give [`detach`]
/// at destroy or reset. Leaves nothing behind when it fails.
///
/// `netns` is a path through the sandbox's held init (see `crate::pinned`), never
/// `/proc/<pid>`, which could name another process's namespace by the time `ip` opens
/// it.
pub(crate) fn attach(netns: &str) -> Result<String> {
    let tools = tools()?;
    let _lock = lock()?;
    ensure_host(&tools)?;
    let index = free_index(&tools)?;
    let name = format!("{PREFIX}{index}");
    let (host, sandbox) = addresses(index);
    let result = (|| {
        run(
            &tools.ip,
            &["-batch", "-"],
            Some(&format!(
                "link add {name} type veth peer name eth0 netns {netns}\n\
                 addr add {host}/31 dev {name}\n\
                 link set {name} up\n"
            )),
            "making the sandbox's veth",
        )?;
        // A sandbox's packets come from its own address or are dropped.
        std::fs::write(format!("/proc/sys/net/ipv4/conf/{name}/rp_filter"), "1")
            .map_err(|e| Error::io("setting the veth's reverse-path filter", e))?;
        let ifindex = std::fs::read_to_string(format!("/sys/class/net/{name}/ifindex"))
            .map_err(|e| Error::io("reading the veth's interface index", e))?;
        let ip = tools.ip.display().to_string();
        run(
            &tools.nsenter,
            &[&format!("--net={netns}"), "--", &ip, "-batch", "-"],
            Some(&format!(
                "addr add {sandbox}/31 dev eth0\n\
                 link set eth0 up\n\
                 route add default via {host}\n"
            )),
            "configuring the sandbox's network",
        )?;
        Ok(format!("{name}@{}", ifindex.trim()))
    })();
    if result.is_err() {
        // Made under this lock: no other sandbox's.
        remove_link(&tools, &name, None);
        remove_rules_if_unused(&tools);
    }
    result
}

/// Removes what [`attach`] made for one sandbox (`link`, as it returned it), and the
/// host's rules with the last.
pub(crate) fn detach(link: &str) {
    let Ok(tools) = tools() else { return };
    let Ok(_lock) = lock() else {
        tracing::warn!(
            veth = link,
            "could not lock sandbox networking to remove a veth"
        );
        return;
    };
    // Recorded without its index (by an earlier version), the name alone may be
    // another sandbox's by now: that veth is left to the kernel, which deletes it with
    // the sandbox's namespace.
    if let Some((name, ifindex)) = link.split_once('@') {
        remove_link(&tools, name, Some(ifindex));
    }
    remove_rules_if_unused(&tools);
}

/// Deletes veth `name` if its interface index is still `ifindex` (when given): a
/// sandbox's namespace can end before it is destroyed (its processes can make
/// bubblewrap's init exit), the kernel deletes the veth with it, and [`free_index`]
/// hands the name to the next sandbox, whose veth this must not delete
/// (ADVERSARIAL 47). The kernel hands out interface indexes in turn, never one just
/// freed, so an index names one veth however its name is reused.
fn remove_link(tools: &Tools, name: &str, ifindex: Option<&str>) {
    // Gone already where the namespace went first.
    let Ok(current) =
        std::fs::read_to_string(Path::new("/sys/class/net").join(name).join("ifindex"))
    else {
        return;
    };
    if ifindex.is_some_and(|ifindex| ifindex != current.trim()) {
        return;
    }
    if let Err(e) = run(&tools.ip, &["link", "del", name], None, "removing a veth") {
        tracing::warn!(veth = name, error = %e, "could not remove a sandbox's veth");
    }
}

/// The host-side (even) and sandbox-side addresses of pair `index`.
fn addresses(index: u32) -> (Ipv4Addr, Ipv4Addr) {
    let base = u32::from(POOL.0) + 2 * index;
    (Ipv4Addr::from(base), Ipv4Addr::from(base + 1))
}

/// The first pair whose host address no interface holds and whose name is free (a
/// veth of a namespace still being torn down keeps both a while).
fn free_index(tools: &Tools) -> Result<u32> {
    let held = output(&tools.ip, &["-4", "-o", "addr", "show"]).ok_or_else(|| {
        Error::new(
            ErrorKind::Backend,
            "listing the host's addresses with ip failed",
        )
    })?;
    let held: std::collections::HashSet<&str> = held
        .split_whitespace()
        .filter_map(|word| word.split_once('/').map(|(addr, _)| addr))
        .collect();
    (0..POOL.1)
        .find(|&index| {
            let (host, _) = addresses(index);
            !held.contains(host.to_string().as_str())
                && !Path::new("/sys/class/net")
                    .join(format!("{PREFIX}{index}"))
                    .exists()
        })
        .ok_or_else(|| {
            Error::new(
                ErrorKind::LimitExceeded,
                "every address for sandboxes' networks is in use",
            )
        })
}

/// The host's side, made (again) before each veth: IPv4 forwarding on, the table
/// loaded, and on a host whose `FORWARD` chain Docker set to drop, accept rules for
/// sandboxes in its `DOCKER-USER` chain (kept in iptables, where Docker keeps its own).
fn ensure_host(tools: &Tools) -> Result<()> {
    let forward = "/proc/sys/net/ipv4/ip_forward";
    if std::fs::read_to_string(forward).map_or(true, |v| v.trim() != "1") {
        tracing::info!("turning on IPv4 forwarding for sandboxes with Network::Full");
        std::fs::write(forward, "1").map_err(|e| Error::io("turning on IPv4 forwarding", e))?;
    }
    let mut rules = RULES.to_owned();
    let connected = sandcell::raw::host_tool::connected_networks(&[PREFIX]);
    if !connected.is_empty() {
        rules.push_str(&format!(
            "add element inet {TABLE} connected {{ {} }}\n",
            connected.join(", ")
        ));
    }
    run(
        &tools.nft,
        &["-f", "-"],
        Some(&rules),
        "loading the host's rules for sandboxes",
    )?;
    if let Some(iptables) = crate::namespace::find("iptables") {
        if output(&iptables, &["-S", "DOCKER-USER"]).is_some() {
            for rule in docker_rules() {
                let mut check = vec!["-C", "DOCKER-USER"];
                check.extend(&rule);
                if output(&iptables, &check).is_none() {
                    let mut insert = vec!["-I", "DOCKER-USER"];
                    insert.extend(&rule);
                    run(
                        &iptables,
                        &insert,
                        None,
                        "letting sandboxes through Docker's FORWARD chain",
                    )?;
                }
            }
        }
    }
    Ok(())
}

/// The `DOCKER-USER` rules: out from a sandbox, replies in. The table's own forward
/// chain drops what a sandbox may not reach before these are consulted.
fn docker_rules() -> [Vec<&'static str>; 2] {
    let tail = ["-m", "comment", "--comment", DOCKER_COMMENT, "-j", "ACCEPT"];
    let mut out = vec!["-i", "scn+"];
    out.extend(tail);
    let mut back = vec![
        "-o",
        "scn+",
        "-m",
        "conntrack",
        "--ctstate",
        "ESTABLISHED,RELATED",
    ];
    back.extend(tail);
    [out, back]
}

/// Removes the table and the `DOCKER-USER` rules when no sandbox's veth is left.
fn remove_rules_if_unused(tools: &Tools) {
    let in_use = std::fs::read_dir("/sys/class/net").is_ok_and(|entries| {
        entries
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with(PREFIX))
    });
    if in_use {
        return;
    }
    if output(&tools.nft, &["list", "table", "inet", TABLE]).is_some() {
        if let Err(e) = run(
            &tools.nft,
            &["delete", "table", "inet", TABLE],
            None,
            "removing the host's rules",
        ) {
            tracing::warn!(error = %e, "could not remove the host's rules for sandboxes");
        }
    }
    if let Some(iptables) = crate::namespace::find("iptables") {
        for rule in docker_rules() {
            let mut delete = vec!["-D", "DOCKER-USER"];
            delete.extend(&rule);
            while output(&iptables, &delete).is_some() {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_are_distinct_slash_31s_in_the_pool() {
        assert_eq!(
            addresses(0),
            (Ipv4Addr::new(100, 127, 0, 0), Ipv4Addr::new(100, 127, 0, 1))
        );
        assert_eq!(
            addresses(POOL.1 - 1),
            (
                Ipv4Addr::new(100, 127, 255, 254),
                Ipv4Addr::new(100, 127, 255, 255)
            )
        );
        assert!(
            format!("{PREFIX}{}", POOL.1 - 1).len() <= 15,
            "an interface name's limit"
        );
    }
}
