//! A sandbox's own network: created on a bridge the host's rules guard, with a fixed
//! address for each of its containers, so they find each other by name from their
//! hosts files and need no resolver.
//!
//! Why no resolver: Podman's (aardvark-dns, on the host) forwards every name it does
//! not know upstream, internal network or not, so a sandbox without a network could
//! still send data out in its queries. The host's rules let a sandbox ask a resolver
//! on its bridge only where its network is full; everywhere else names come from
//! `/etc/hosts`, which both engines write from `ExtraHosts`.

use std::collections::HashMap;
use std::net::Ipv4Addr;

use bollard::models::{
    EndpointIpamConfig, EndpointSettings, Ipam, IpamConfig, NetworkCreateRequest, NetworkingConfig,
};
use bollard::Docker;
use sandcell::{Error, Result, SandboxId};

use crate::error::engine;
use crate::task::{teardown, LABEL_TASK};

/// The engines' option naming a bridge network's host interface.
const BRIDGE_NAME_OPTION: &str = "com.docker.network.bridge.name";

/// The most services a sandbox may have: its /28 holds the gateway, the sandbox and
/// these.
pub(crate) const MAX_SERVICES: usize = 12;

/// How many subnets a network's create tries before it gives up.
const SUBNET_ATTEMPTS: u32 = 16;

/// The private network of a sandbox with services or a full network.
pub(crate) fn network_name(id: &SandboxId) -> String {
    format!("{id}-net")
}

/// A sandbox's network as created: its name and where its containers sit (the
/// sandbox at the subnet's third address, service `i` at `i` after it).
#[derive(Debug, Clone)]
pub(crate) struct TaskNetwork {
    pub(crate) name: String,
    subnet: Ipv4Addr,
    /// `ExtraHosts` entries (`name:address`) naming every service, for every
    /// container on the network.
    hosts: Vec<String>,
    /// Whether it has no route out.
    internal: bool,
}

/// The name server an internal network's containers are given: TEST-NET-1, which
/// nothing answers and the host's rules drop.
const UNREACHABLE_DNS: &str = "192.0.2.1";

impl TaskNetwork {
    /// Every container on it will find `services` (each a host name and a service
    /// name, in the order their containers take their addresses) by name.
    pub(crate) fn with_services<'a>(
        mut self,
        services: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<TaskNetwork> {
        self.hosts.clear();
        for (slot, (host, service)) in services.into_iter().enumerate() {
            if slot >= MAX_SERVICES {
                return Err(Error::invalid_input(format!(
                    "a sandbox has at most {MAX_SERVICES} services"
                )));
            }
            let address = self.address(slot + 1);
            self.hosts.push(format!("{host}:{address}"));
            if service != host {
                self.hosts.push(format!("{service}:{address}"));
            }
        }
        Ok(self)
    }

    /// Slot 0 is the sandbox, slot `i + 1` service `i`.
    fn address(&self, slot: usize) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.subnet) + 2 + slot as u32)
    }

    /// The sandbox container's place on it.
    pub(crate) fn sandbox_endpoint(&self) -> NetworkingConfig {
        self.endpoint(0, Vec::new())
    }

    /// Service `index`'s place on it, under its names.
    pub(crate) fn service_endpoint(&self, index: usize, aliases: Vec<String>) -> NetworkingConfig {
        self.endpoint(index + 1, aliases)
    }

    fn endpoint(&self, slot: usize, aliases: Vec<String>) -> NetworkingConfig {
        NetworkingConfig {
            endpoints_config: Some(HashMap::from([(
                self.name.clone(),
                EndpointSettings {
                    aliases: Some(aliases),
                    ipam_config: Some(EndpointIpamConfig {
                        ipv4_address: Some(self.address(slot).to_string()),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            )])),
        }
    }

    /// The `ExtraHosts` of each container on it.
    pub(crate) fn hosts(&self) -> Vec<String> {
        self.hosts.clone()
    }

    /// The `Dns` of each container on it: none of the engine's choosing on an internal
    /// network. Docker's resolver, inside each container, forwards what it cannot
    /// answer upstream, and before 26.0.0 did so from the host's network namespace
    /// where the host's resolver is on loopback (CVE-2024-29018), so a sandbox without
    /// a network could send data out in its queries. A named upstream is asked from
    /// the container's own namespace, where an internal network has no way out.
    pub(crate) fn dns(&self) -> Option<Vec<String>> {
        self.internal.then(|| vec![UNREACHABLE_DNS.to_owned()])
    }
}

/// Creates the sandbox's network, on a bridge of its own that the host's rules guard
/// (`crate::firewall`), on a subnet from the rules' pool; internal (no route out)
/// unless the sandbox asked for one. The rules let the sandbox ask the engine's
/// resolver on the bridge (`engine_resolves`: Podman's) only when it is not internal.
/// On failure nothing is left.
pub(crate) async fn create(
    docker: &Docker,
    id: &SandboxId,
    internal: bool,
    engine_resolves: bool,
) -> Result<TaskNetwork> {
    crate::firewall::require()?;
    // A rootless engine's bridges are in a namespace of its own, out of the rules'
    // reach: refused before any container runs there.
    let info = docker
        .info()
        .await
        .map_err(|e| engine("asking the engine how it runs", e))?;
    if let Some(rootless) = info
        .security_options
        .unwrap_or_default()
        .into_iter()
        .find(|option| option.contains("rootless"))
    {
        return Err(crate::firewall::outside_this_host(&format!(
            "the engine runs rootless ({rootless})"
        )));
    }
    let name = network_name(id);
    let bridge = crate::firewall::bridge_name(id);
    // A subnet another network (of any process's) holds is refused: try the next.
    let mut attempt = 0;
    let subnet = loop {
        let subnet = crate::firewall::subnet(id, attempt);
        let created = docker
            .create_network(NetworkCreateRequest {
                name: name.clone(),
                driver: Some("bridge".to_owned()),
                internal: Some(internal),
                ipam: Some(Ipam {
                    config: Some(vec![IpamConfig {
                        subnet: Some(format!("{subnet}/28")),
                        gateway: Some(Ipv4Addr::from(u32::from(subnet) + 1).to_string()),
                        ..Default::default()
                    }]),
                    ..Default::default()
                }),
                options: Some(HashMap::from([(
                    BRIDGE_NAME_OPTION.to_owned(),
                    bridge.clone(),
                )])),
                labels: Some(HashMap::from([(LABEL_TASK.to_owned(), id.to_string())])),
                ..Default::default()
            })
            .await;
        match created {
            Ok(_) => break subnet,
            Err(e) if attempt < SUBNET_ATTEMPTS && subnet_taken(&e) => attempt += 1,
            Err(e) => {
                return Err(engine(
                    format_args!("creating the network of sandbox {id}"),
                    e,
                ))
            }
        }
    };
    // Guarded before any container joins it.
    let guarded = guard(id, internal, engine_resolves).await;
    if let Err(e) = guarded {
        let _ = teardown(docker, id).await;
        return Err(e);
    }
    Ok(TaskNetwork {
        name,
        subnet,
        hosts: Vec::new(),
        internal,
    })
}

/// Loads the host's rules for sandbox `id`'s network: its resolver (where
/// `engine_resolves`) answers it only where the network is not `internal`.
pub(crate) async fn guard(id: &SandboxId, internal: bool, engine_resolves: bool) -> Result<()> {
    crate::firewall::guard_sandbox(id, engine_resolves && !internal).await
}

/// Whether the engine refused a network's subnet as one another network holds
/// (Docker: "overlaps"; Podman: "already used" / "in use").
fn subnet_taken(e: &bollard::errors::Error) -> bool {
    let text = e.to_string();
    ["overlap", "already used", "in use"]
        .iter()
        .any(|what| text.contains(what))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn network() -> TaskNetwork {
        TaskNetwork {
            name: "n".to_owned(),
            subnet: Ipv4Addr::new(100, 126, 0, 16),
            hosts: Vec::new(),
            internal: true,
        }
    }

    #[test]
    fn each_container_has_an_address_of_its_own_and_every_name_is_known() {
        let net = network()
            .with_services([("web-host", "web"), ("db", "db")])
            .unwrap();
        assert_eq!(
            net.hosts(),
            [
                "web-host:100.126.0.19",
                "web:100.126.0.19",
                "db:100.126.0.20"
            ]
        );
        let address = |config: NetworkingConfig| {
            config.endpoints_config.unwrap()["n"]
                .ipam_config
                .clone()
                .unwrap()
                .ipv4_address
                .unwrap()
        };
        assert_eq!(address(net.sandbox_endpoint()), "100.126.0.18");
        assert_eq!(address(net.service_endpoint(1, Vec::new())), "100.126.0.20");
    }

    #[test]
    fn more_services_than_the_subnet_holds_are_refused() {
        let names: Vec<String> = (0..=MAX_SERVICES).map(|i| format!("s{i}")).collect();
        let refused = network().with_services(names.iter().map(|n| (n.as_str(), n.as_str())));
        assert_eq!(
            refused.unwrap_err().kind(),
            sandcell::ErrorKind::InvalidInput
        );
        let last = network().with_services(
            names[..MAX_SERVICES]
                .iter()
                .map(|n| (n.as_str(), n.as_str())),
        );
        assert_eq!(
            last.unwrap().address(MAX_SERVICES),
            Ipv4Addr::new(100, 126, 0, 30)
        );
    }
}
