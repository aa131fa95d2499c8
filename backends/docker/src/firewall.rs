//! The host's rules for the networks of Docker sandboxes: a sandbox with a network of
//! its own (`Network::Full`, or services beside it) reaches the world through the
//! engine's NAT, its own services on its bridge, and nothing else of this host's: no
//! address of the host's, no other sandbox, no other network of the engines', no
//! link-local service (ADVERSARIAL 38).
//!
//! Each such network is a bridge of the sandbox's own, named [`bridge_name`] (`scd…`,
//! which both Docker and Podman take from `com.docker.network.bridge.name`), on a
//! subnet from [`subnet`]'s pool. One nftables table ([`RULES`]) matches the prefix;
//! its sets pair each bridge with itself (traffic between a sandbox and its services
//! passes) and name the bridges whose engine serves names on the bridge's address
//! (Podman; Docker's resolver lives in the container's own namespace). The table is
//! loaded again after each network is made and before any container joins it, and
//! removed with the last bridge, all under one host-wide lock. The rules are this
//! host's: they guard an engine whose bridges are in this host's network namespace
//! (a rootful engine here), which [`check_bridge`] verifies once a sandbox has
//! started.

use std::path::{Path, PathBuf};

use sandcell::raw::host_tool::{self, HostLock};
use sandcell::{Error, Result, SandboxId};

/// The nftables table, loaded when absent.
const RULES: &str = include_str!("firewall.nft");
/// The table's name in [`RULES`].
const TABLE: &str = "sandcell_docker";
/// Serialises every change to the table on this host, across processes.
const LOCK: &str = "/run/sandcell-docker-network.lock";

/// The bridge of sandbox `id`'s network: `scd` and 12 hex digits of the id's hash
/// (an interface name holds 15 bytes).
pub(crate) fn bridge_name(id: &SandboxId) -> String {
    use sha2::{Digest, Sha256};
    let digest = hex::encode(Sha256::digest(id.as_str().as_bytes()));
    format!("scd{}", &digest[..12])
}

/// `nft`, where this process can change the host's rules with it (root).
fn nft() -> Option<PathBuf> {
    rustix::process::geteuid()
        .is_root()
        .then(|| host_tool::find("nft"))
        .flatten()
}

/// The subnets sandbox networks are numbered from, as /28s (a sandbox and up to 12
/// services): the second-to-top /16 of the shared address space (RFC 6598), beside
/// the local backend's, and not the engines' default pools, which hold some 30
/// networks.
const POOL: (std::net::Ipv4Addr, u32) = (std::net::Ipv4Addr::new(100, 126, 0, 0), 1 << 12);

/// Candidate `attempt` for sandbox `id`'s subnet, as its first address (the /28's
/// network; the gateway is the next): spread by the id's hash, so two processes
/// making networks at once rarely try the same one first.
pub(crate) fn subnet(id: &SandboxId, attempt: u32) -> std::net::Ipv4Addr {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(id.as_str().as_bytes());
    let start = u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]);
    let index = start.wrapping_add(attempt.wrapping_mul(7919)) % POOL.1;
    std::net::Ipv4Addr::from(u32::from(POOL.0) + 16 * index)
}

/// Whether this process can guard sandbox networks: root, with `nft`.
pub(crate) fn available() -> bool {
    nft().is_some()
}

/// Fails, saying what is missing and what the opt-out is, unless [`available`].
pub(crate) fn require() -> Result<()> {
    match available() {
        true => Ok(()),
        false => Err(unavailable()),
    }
}

fn unavailable() -> Error {
    Error::unsupported(
        "a Docker sandbox with a network of its own (Network::Full, or services) needs the \
         host's rules that keep it from the host and other sandboxes: run as root on the \
         engine's host with nft (nftables) installed, or set DockerConfig::network to let \
         Network::Full sandboxes share a network of the operator's instead",
    )
}

/// Adds bridge `bridge` to the rules, with the engine's name server on its own
/// address where `dns`. The whole table is loaded again first (its rules replaced,
/// its elements kept), so rules flushed from the host or left by an older version are
/// put right; every sandbox bridge on the host is added back to `own` with it.
pub(crate) fn guard(bridge: &str, dns: bool) -> Result<()> {
    let nft = nft().ok_or_else(unavailable)?;
    let _lock = HostLock::acquire(Path::new(LOCK))?;
    let mut bridges = sandbox_bridges();
    bridges.push(bridge.to_owned());
    bridges.sort();
    bridges.dedup();
    let mut script = RULES.to_owned();
    let pairs: Vec<String> = bridges.iter().map(|b| format!("{b} . {b}")).collect();
    script.push_str(&format!(
        "add element inet {TABLE} own {{ {} }}\n",
        pairs.join(", ")
    ));
    script.push_str(&format!("add element inet {TABLE} dns {{ {bridge} }}\n"));
    if !dns {
        // Added first so that the delete finds it: kept elements may include this
        // bridge's from an older version, which let internal networks ask too.
        script.push_str(&format!("delete element inet {TABLE} dns {{ {bridge} }}\n"));
    }
    let connected = host_tool::connected_networks(&["scd"]);
    if !connected.is_empty() {
        script.push_str(&format!(
            "add element inet {TABLE} connected {{ {} }}\n",
            connected.join(", ")
        ));
    }
    host_tool::run(
        &nft,
        &["-f", "-"],
        Some(&script),
        "loading the sandbox network rules",
    )
}

/// [`guard`] for sandbox `id`'s bridge, off the runtime.
pub(crate) async fn guard_sandbox(id: &SandboxId, dns: bool) -> Result<()> {
    let bridge = bridge_name(id);
    tokio::task::spawn_blocking(move || guard(&bridge, dns))
        .await
        .map_err(|e| {
            Error::with_source(
                sandcell::ErrorKind::Backend,
                "guarding the network failed",
                e,
            )
        })?
}

/// The sandbox bridges on this host now (their names are made here, never a client's).
fn sandbox_bridges() -> Vec<String> {
    std::fs::read_dir("/sys/class/net")
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|name| {
                    name.len() == 15
                        && name.starts_with("scd")
                        && name.bytes().all(|c| c.is_ascii_alphanumeric())
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Removes bridge `bridge` from the rules, and the table with the last; what is gone
/// already is fine. Failures are logged: the rules left only refuse more.
pub(crate) fn release(bridge: &str) {
    let Some(nft) = nft() else { return };
    let _lock = match HostLock::acquire(Path::new(LOCK)) {
        Ok(lock) => lock,
        Err(e) => {
            tracing::warn!(error = %e, "could not lock the sandbox network rules");
            return;
        }
    };
    let element = format!("{{ {bridge} . {bridge} }}");
    let _ = host_tool::output(&nft, &["delete", "element", "inet", TABLE, "own", &element]);
    let element = format!("{{ {bridge} }}");
    let _ = host_tool::output(&nft, &["delete", "element", "inet", TABLE, "dns", &element]);
    let Some(set) = host_tool::output(&nft, &["list", "set", "inet", TABLE, "own"]) else {
        return;
    };
    if !set.contains("elements") {
        if let Err(e) = host_tool::run(
            &nft,
            &["delete", "table", "inet", TABLE],
            None,
            "removing the sandbox network rules",
        ) {
            tracing::warn!(error = %e, "could not remove the sandbox network rules");
        }
    }
}

/// Fails unless bridge `bridge` is in this host's network namespace once a container
/// has joined it: an engine whose bridges are elsewhere (rootless, or on another
/// machine) is not guarded by this host's rules.
pub(crate) fn check_bridge(bridge: &str) -> Result<()> {
    if Path::new("/sys/class/net").join(bridge).exists() {
        return Ok(());
    }
    Err(outside_this_host(&format!(
        "the engine made the sandbox's bridge {bridge} outside this host's network namespace"
    )))
}

/// The error for an engine whose bridges this host's rules cannot reach (`why`).
pub(crate) fn outside_this_host(why: &str) -> Error {
    Error::unsupported(format!(
        "{why}, where this host's rules do not guard its sandboxes; set \
         DockerConfig::network to let Network::Full sandboxes share a network of the \
         operator's instead"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bridge_names_fit_an_interface_name_and_match_the_rules() {
        let a = bridge_name(&SandboxId::new("docker-a").unwrap());
        let b = bridge_name(&SandboxId::new("docker-b").unwrap());
        assert_ne!(a, b);
        for name in [&a, &b] {
            assert_eq!(name.len(), 15, "{name}");
            assert!(name.starts_with("scd"), "{name}");
            assert!(name.bytes().all(|c| c.is_ascii_alphanumeric()), "{name}");
        }
    }

    #[test]
    fn subnets_are_slash_28s_in_the_pool_and_attempts_differ() {
        let id = SandboxId::new("docker-a").unwrap();
        let first = subnet(&id, 0);
        assert_ne!(first, subnet(&id, 1));
        for addr in [first, subnet(&id, 4095)] {
            assert_eq!(u32::from(addr) % 16, 0, "{addr}");
            assert_eq!(addr.octets()[..2], [100, 126], "{addr}");
        }
        assert!(RULES.contains("input iifname \"scd*\" drop"));
        assert!(RULES.contains(&format!("add table inet {TABLE}")));
    }
}
