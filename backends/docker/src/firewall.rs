//! The host's rules for the networks of Docker sandboxes: a sandbox with a network of
//! its own (`Network::Full`, or services beside it) reaches the world through the
//! engine's NAT, its own services on its bridge, and nothing else of this host's: no
//! address of the host's, no other sandbox, no other network of the engines', no
//! link-local service (ADVERSARIAL 38).
//!
//! Each such network is a bridge of the sandbox's own, named [`bridge_name`] (`scd…`,
//! which both Docker and Podman take from `com.docker.network.bridge.name`). One
//! nftables table ([`RULES`]) matches the prefix; its one set pairs each bridge with
//! itself, so traffic between a sandbox and its services passes. The table is made
//! when absent, each bridge's element added after its network is made and before
//! any container joins it, and the table removed with the last element, all under
//! one host-wide lock. The rules are this host's: they guard an engine whose bridges
//! are in this host's network namespace (a rootful engine here), which
//! [`check_bridge`] verifies once a sandbox has started.

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

/// Adds bridge `bridge` to the rules, making the table first if it is absent.
pub(crate) fn guard(bridge: &str) -> Result<()> {
    let nft = nft().ok_or_else(unavailable)?;
    let _lock = HostLock::acquire(Path::new(LOCK))?;
    if host_tool::output(&nft, &["list", "table", "inet", TABLE]).is_none() {
        host_tool::run(
            &nft,
            &["-f", "-"],
            Some(RULES),
            "loading the sandbox network rules",
        )?;
    }
    host_tool::run(
        &nft,
        &[
            "add",
            "element",
            "inet",
            TABLE,
            "own",
            &format!("{{ {bridge} . {bridge} }}"),
        ],
        None,
        "admitting a sandbox network to the host's rules",
    )
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
    Err(Error::unsupported(format!(
        "the engine made the sandbox's bridge {bridge} outside this host's network namespace \
         (a rootless engine?), where this host's rules do not reach it; set \
         DockerConfig::network to let Network::Full sandboxes share a network of the \
         operator's instead"
    )))
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
        assert!(RULES.contains("iifname \"scd*\" drop"));
        assert!(RULES.contains(&format!("table inet {TABLE}")));
    }
}
