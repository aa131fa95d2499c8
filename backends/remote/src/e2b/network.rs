//! Network policies in E2B's terms, both ways: `Network::None` is
//! `allow_internet_access: false`, `Network::Full` is no rule, and
//! `Network::Allowlist` is its entries as `allowOut` with everything else denied
//! (`denyOut: ["0.0.0.0/0"]`; allowed destinations win over denied ones).
//!
//! E2B's entries have no ports and its deny lists can be narrower than everything;
//! neither maps onto sandcell's allowlists, so each is refused rather than widened.

use sandcell::egress::Allowlist;
use sandcell::{Error, Network, Result};

use super::api::NetworkConfig;

/// The `denyOut` entry that denies every destination.
const EVERYWHERE: &str = "0.0.0.0/0";
/// The same for IPv6.
const EVERYWHERE_V6: &str = "::/0";

/// What a create sends for `network`: `allow_internet_access` and the egress rules.
pub fn to_e2b(network: &Network) -> Result<(bool, Option<NetworkConfig>)> {
    match network {
        Network::None => Ok((false, None)),
        Network::Allowlist(entries) => {
            let rules = Allowlist::parse(entries)?;
            if let Some(rule) = rules.rules().iter().find(|r| r.port().is_some()) {
                return Err(Error::unsupported(format!(
                    "E2B's allowOut has no ports: allowlist entry {rule} cannot be enforced \
                     there; drop the port or use another backend"
                )));
            }
            Ok((
                true,
                Some(NetworkConfig {
                    allow_out: Some(entries.clone()),
                    deny_out: Some(vec![EVERYWHERE.to_owned()]),
                    ..NetworkConfig::default()
                }),
            ))
        }
        Network::Full => Ok((true, None)),
        // A kind of network this mapping does not know is refused, not made full.
        other => Err(Error::unsupported(format!(
            "network {:?} has no E2B equivalent",
            other.mode()
        ))),
    }
}

/// The network an E2B create or network update asks for, or why sandcell cannot give
/// it: a deny list narrower than everything, an egress proxy, a host mask or request
/// transforms.
pub fn from_e2b(
    allow_internet_access: Option<bool>,
    config: Option<&NetworkConfig>,
) -> Result<Network> {
    let empty = NetworkConfig::default();
    let config = config.unwrap_or(&empty);
    for (set, field) in [
        (config.egress_proxy.is_some(), "egressProxy"),
        (config.mask_request_host.is_some(), "maskRequestHost"),
        (config.rules.is_some(), "rules"),
    ] {
        if set {
            return Err(Error::unsupported(format!(
                "sandcell-server does not support network.{field}"
            )));
        }
    }
    let deny = config.deny_out.as_deref().unwrap_or(&[]);
    let denies_all = allow_internet_access.or(config.allow_internet_access) == Some(false)
        || deny.iter().any(|d| d == EVERYWHERE);
    if let Some(partial) = deny
        .iter()
        .find(|d| *d != EVERYWHERE && *d != EVERYWHERE_V6)
    {
        return Err(Error::unsupported(format!(
            "sandcell-server enforces allow lists, not deny lists: denyOut entry {partial:?} \
             would need everything else allowed; deny {EVERYWHERE} and list what is allowed \
             in allowOut"
        )));
    }
    let allow = config.allow_out.clone().unwrap_or_default();
    Ok(match (denies_all, allow.is_empty()) {
        (false, _) => Network::Full,
        (true, true) => Network::None,
        (true, false) => {
            Allowlist::parse(&allow)?;
            Network::Allowlist(allow)
        }
    })
}

/// What a sandbox's view reports of `network` (nothing for the full network): the
/// server's answer.
pub fn view_of(network: &Network) -> Option<NetworkConfig> {
    match network {
        Network::None => Some(NetworkConfig {
            deny_out: Some(vec![EVERYWHERE.to_owned()]),
            ..NetworkConfig::default()
        }),
        Network::Allowlist(entries) => Some(NetworkConfig {
            allow_out: Some(entries.clone()),
            deny_out: Some(vec![EVERYWHERE.to_owned()]),
            ..NetworkConfig::default()
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use sandcell::ErrorKind;

    fn allowlist(entries: &[&str]) -> Network {
        Network::Allowlist(entries.iter().map(|e| (*e).to_owned()).collect())
    }

    #[test]
    fn policies_go_there_and_back() {
        for network in [
            Network::None,
            Network::Full,
            allowlist(&["pypi.org", "*.pythonhosted.org", "10.0.0.0/8"]),
        ] {
            let (internet, config) = to_e2b(&network).unwrap();
            assert_eq!(from_e2b(Some(internet), config.as_ref()).unwrap(), network);
            assert_eq!(from_e2b(None, view_of(&network).as_ref()).unwrap(), network);
        }
    }

    #[test]
    fn what_cannot_be_enforced_is_refused() {
        let err = to_e2b(&allowlist(&["pypi.org:443"])).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
        let partial = NetworkConfig {
            deny_out: Some(vec!["10.0.0.0/8".to_owned()]),
            ..NetworkConfig::default()
        };
        let err = from_e2b(None, Some(&partial)).unwrap_err();
        assert!(err.to_string().contains("deny lists"), "{err}");
        let transforms = NetworkConfig {
            rules: Some(serde_json::json!({"a.test": []})),
            ..NetworkConfig::default()
        };
        assert_eq!(
            from_e2b(None, Some(&transforms)).unwrap_err().kind(),
            ErrorKind::Unsupported
        );
        let bad = NetworkConfig {
            allow_out: Some(vec!["*.org/8".to_owned()]),
            deny_out: Some(vec![EVERYWHERE.to_owned()]),
            ..NetworkConfig::default()
        };
        assert_eq!(
            from_e2b(None, Some(&bad)).unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
        // Allowed entries with nothing denied leave the network whole.
        let open = NetworkConfig {
            allow_out: Some(vec!["a.test".to_owned()]),
            ..NetworkConfig::default()
        };
        assert_eq!(from_e2b(None, Some(&open)).unwrap(), Network::Full);
    }
}
