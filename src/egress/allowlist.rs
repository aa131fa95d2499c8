//! The rules of a [`Network::Allowlist`](crate::Network::Allowlist), parsed: which host
//! names, addresses and ports a sandbox may connect to.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::{Error, Result};

/// A parsed allowlist: a connection is allowed when one rule matches it.
///
/// Each entry of `Network::Allowlist` is one rule, optionally ending in `:PORT`:
///
/// | entry | allows |
/// |---|---|
/// | `pypi.org` | that name, any port |
/// | `pypi.org:443` | that name, port 443 |
/// | `*.pythonhosted.org` | every name beneath it (not the name itself) |
/// | `203.0.113.7`, `[2001:db8::7]:22` | that address |
/// | `10.0.0.0/8`, `[fd00::/8]:443` | every address in the range |
///
/// A name rule never allows a connection to a raw address, and an address a name
/// resolves to must itself be public unless an address rule allows it (see
/// [`is_private`]; the proxy honours such a rule only where the operator allows
/// private ranges): a name cannot be pointed at this host or its network. No rule may
/// name or cover loopback, link-local or unspecified addresses ([`reaches_host`]).
///
/// ```
/// use sandcell::egress::Allowlist;
/// let rules = Allowlist::parse(["pypi.org:443", "*.pythonhosted.org", "10.1.0.0/16"]).unwrap();
/// assert!(rules.allows_name("pypi.org", 443).is_some());
/// assert!(rules.allows_name("pypi.org", 80).is_none());
/// assert!(rules.allows_name("files.pythonhosted.org", 443).is_some());
/// assert!(rules.allows_name("pythonhosted.org", 443).is_none());
/// assert!(rules.allows_addr("10.1.2.3".parse().unwrap(), 5432).is_some());
/// assert!(Allowlist::parse(["*.org/8"]).is_err());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allowlist {
    rules: Vec<Rule>,
}

/// One allowlist entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    target: Target,
    port: Option<u16>,
    text: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    /// An exact, lowercase name without a trailing dot.
    Name(String),
    /// `*.suffix`: the suffix with its leading dot, lowercase.
    Beneath(String),
    /// An address range (a single address is a full-length prefix).
    Range { network: IpAddr, prefix: u8 },
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl Rule {
    /// The port the rule is limited to, if any.
    pub fn port(&self) -> Option<u16> {
        self.port
    }
}

impl Allowlist {
    /// Parses the entries of a `Network::Allowlist`; a malformed one is
    /// `InvalidInput`, naming it.
    pub fn parse<I, S>(entries: I) -> Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let rules = entries
            .into_iter()
            .map(|entry| Rule::parse(entry.as_ref()))
            .collect::<Result<_>>()?;
        Ok(Allowlist { rules })
    }

    /// The rules, in the order given.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// The first rule that allows connecting to host name `name` on `port`. `name` is
    /// compared without case and without a trailing dot; an address written as a name
    /// matches no name rule.
    pub fn allows_name(&self, name: &str, port: u16) -> Option<&Rule> {
        let name = normalize_name(name)?;
        self.rules.iter().find(|rule| {
            rule.port_matches(port)
                && match &rule.target {
                    Target::Name(exact) => *exact == name,
                    Target::Beneath(suffix) => {
                        name.len() > suffix.len() && name.ends_with(suffix.as_str())
                    }
                    Target::Range { .. } => false,
                }
        })
    }

    /// The first address rule that names or covers a private address ([`is_private`]:
    /// this host's networks, shared, multicast and reserved ranges), which only an
    /// operator may allow (ADVERSARIAL 38).
    ///
    /// ```
    /// use sandcell::egress::Allowlist;
    /// assert!(Allowlist::parse(["10.1.0.0/16"]).unwrap().private_rule().is_some());
    /// assert!(Allowlist::parse(["172.0.0.0/8"]).unwrap().private_rule().is_some());
    /// assert!(Allowlist::parse(["192.0.2.0/24", "a.test"]).unwrap().private_rule().is_none());
    /// ```
    pub fn private_rule(&self) -> Option<&Rule> {
        self.rules.iter().find(|rule| match rule.target {
            Target::Range { network, prefix } => PRIVATE_BLOCKS.iter().any(|&(block, size)| {
                network.is_ipv4() == block.is_ipv4() && in_range(network, block, prefix.min(size))
            }),
            _ => false,
        })
    }

    /// The first address rule that names or covers part of a network this host is
    /// directly on ([`host_networks`](crate::raw::egress::host_networks)): its neighbours, whatever
    /// their addresses, which only an operator may allow (ADVERSARIAL 38).
    pub fn host_network_rule(&self) -> Option<&Rule> {
        let networks = super::host_networks::host_networks();
        self.rules.iter().find(|rule| match rule.target {
            Target::Range { network, prefix } => networks
                .iter()
                .any(|&(n, p)| super::host_networks::overlaps(network, prefix, n, p)),
            _ => false,
        })
    }

    /// Refuses (`InvalidInput`) an address rule for a private range or a network this
    /// host is directly on ([`private_rule`](Self::private_rule),
    /// [`host_network_rule`](Self::host_network_rule)), unless the operator allowed
    /// them (`allowed`; `how` says how, for the message).
    pub fn refuse_private(&self, allowed: bool, how: &str) -> crate::Result<()> {
        if allowed {
            return Ok(());
        }
        match self.private_rule().or_else(|| self.host_network_rule()) {
            Some(rule) => Err(crate::Error::invalid_input(format!(
                "network allowlist entry {:?} names a private range or a network this \
                 host is on, which the operator has not allowed ({how})",
                rule.to_string()
            ))),
            None => Ok(()),
        }
    }

    /// The first address rule that allows connecting to `addr` on `port`.
    pub fn allows_addr(&self, addr: IpAddr, port: u16) -> Option<&Rule> {
        let addr = canonical(addr);
        self.rules.iter().find(|rule| {
            rule.port_matches(port)
                && match rule.target {
                    Target::Range { network, prefix } => in_range(addr, network, prefix),
                    _ => false,
                }
        })
    }
}

impl Rule {
    fn parse(entry: &str) -> Result<Rule> {
        let bad = |why: &str| {
            Error::invalid_input(format!(
                "network allowlist entry {entry:?} is not valid: {why}"
            ))
        };
        let text = entry.trim();
        if text.is_empty() {
            return Err(bad("it is empty"));
        }
        let (host, port) = split_port(text).map_err(|why| bad(&why))?;
        let target = if let Some((addr, prefix)) = host.split_once('/') {
            let network: IpAddr = addr
                .parse()
                .map_err(|_| bad("a range must be ADDRESS/PREFIX"))?;
            let max = if network.is_ipv4() { 32 } else { 128 };
            let prefix: u8 = prefix
                .parse()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| bad(&format!("the prefix must be 0 to {max}")))?;
            // An IPv4-mapped range (`::ffff:0:0/96`) is the IPv4 range it maps.
            let (network, prefix) = match network {
                IpAddr::V6(v6) if prefix >= 96 => match v6.to_ipv4_mapped() {
                    Some(v4) => (IpAddr::V4(v4), prefix - 96),
                    None => (network, prefix),
                },
                _ => (network, prefix),
            };
            refuse_host_blocks(network, prefix).map_err(|why| bad(&why))?;
            Target::Range { network, prefix }
        } else if let Ok(addr) = host.parse::<IpAddr>() {
            let addr = canonical(addr);
            let prefix = if addr.is_ipv4() { 32 } else { 128 };
            refuse_host_blocks(addr, prefix).map_err(|why| bad(&why))?;
            Target::Range {
                network: addr,
                prefix,
            }
        } else if let Some(suffix) = host.strip_prefix("*.") {
            let suffix = normalize_name(suffix)
                .ok_or_else(|| bad("a wildcard must be `*.` followed by a host name"))?;
            Target::Beneath(format!(".{suffix}"))
        } else {
            let name = normalize_name(host).ok_or_else(|| {
                bad("expected a host name, `*.suffix`, an address or an ADDRESS/PREFIX range")
            })?;
            Target::Name(name)
        };
        Ok(Rule {
            target,
            port,
            text: text.to_owned(),
        })
    }

    fn port_matches(&self, port: u16) -> bool {
        self.port.is_none_or(|p| p == port)
    }
}

/// `host[:port]`, where an IPv6 host with a port is bracketed (`[::1]:443`) and one
/// without may be bare (`::1`, `fd00::/8`).
fn split_port(text: &str) -> std::result::Result<(&str, Option<u16>), String> {
    let parse_port = |p: &str| {
        p.parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .map(Some)
            .ok_or_else(|| format!("the port {p:?} must be 1 to 65535"))
    };
    if let Some(rest) = text.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or_else(|| "a `[` needs its `]`".to_owned())?;
        return match after {
            "" => Ok((host, None)),
            _ => match after.strip_prefix(':') {
                Some(port) => Ok((host, parse_port(port)?)),
                None => Err("expected `:PORT` after `]`".to_owned()),
            },
        };
    }
    match text.matches(':').count() {
        0 => Ok((text, None)),
        1 => {
            let (host, port) = text.split_once(':').unwrap_or((text, ""));
            Ok((host, parse_port(port)?))
        }
        // A bare IPv6 address or range: no port.
        _ => Ok((text, None)),
    }
}

/// A host name in lowercase without its trailing dot, or `None` if it is not one
/// (labels of letters, digits, `-` and `_`, each 1 to 63 bytes, 253 in all; not an
/// address).
pub(crate) fn normalize_name(name: &str) -> Option<String> {
    let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
    let valid = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
        && name.parse::<IpAddr>().is_err()
        // `1.2.3` and friends: all-numeric names are addresses to some resolvers.
        && !name.split('.').all(|l| l.bytes().all(|b| b.is_ascii_digit()));
    valid.then_some(name)
}

/// An IPv4 address written as IPv6 (`::ffff:10.0.0.1`) is the IPv4 address.
fn canonical(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => addr,
        },
        v4 => v4,
    }
}

pub(super) fn in_range(addr: IpAddr, network: IpAddr, prefix: u8) -> bool {
    match (addr, network) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

/// The blocks no rule may name or cover, whatever the operator allows: loopback, the
/// unspecified address and "this network" reach this host itself; link-local reaches
/// what sits beside it (a cloud's metadata service). With their IPv4-compatible and
/// NAT64 forms (IPv4-mapped ones are IPv4 here). ADVERSARIAL 38.
const HOST_BLOCKS: [(IpAddr, u8); 10] = [
    (IpAddr::V4(Ipv4Addr::new(0, 0, 0, 0)), 8),
    (IpAddr::V4(Ipv4Addr::new(127, 0, 0, 0)), 8),
    (IpAddr::V4(Ipv4Addr::new(169, 254, 0, 0)), 16),
    // `::`, `::1` and every IPv4-compatible `::a.b.c.d` whose first octet is 0.
    (IpAddr::V6(Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 0)), 104),
    (IpAddr::V6(Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0x7f00, 0)), 104),
    (IpAddr::V6(Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0xa9fe, 0)), 112),
    (IpAddr::V6(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0)), 10),
    (
        IpAddr::V6(Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0, 0)),
        104,
    ),
    (
        IpAddr::V6(Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0x7f00, 0)),
        104,
    ),
    (
        IpAddr::V6(Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0xa9fe, 0)),
        112,
    ),
];

/// The ranges [`is_private`] holds beyond [`HOST_BLOCKS`], as blocks (IPv4-compatible
/// and NAT64 forms of IPv4 ones included).
const PRIVATE_BLOCKS: [(IpAddr, u8); 16] = [
    (IpAddr::V4(Ipv4Addr::new(10, 0, 0, 0)), 8),
    (IpAddr::V4(Ipv4Addr::new(172, 16, 0, 0)), 12),
    (IpAddr::V4(Ipv4Addr::new(192, 168, 0, 0)), 16),
    (IpAddr::V4(Ipv4Addr::new(100, 64, 0, 0)), 10),
    (IpAddr::V4(Ipv4Addr::new(224, 0, 0, 0)), 4),
    (IpAddr::V4(Ipv4Addr::new(240, 0, 0, 0)), 4),
    (IpAddr::V6(Ipv6Addr::new(0xfc00, 0, 0, 0, 0, 0, 0, 0)), 7),
    (IpAddr::V6(Ipv6Addr::new(0xfec0, 0, 0, 0, 0, 0, 0, 0)), 10),
    (IpAddr::V6(Ipv6Addr::new(0xff00, 0, 0, 0, 0, 0, 0, 0)), 8),
    // IPv4-compatible `::a.b.c.d` of every IPv4 address: is_private judges the IPv4.
    (IpAddr::V6(Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 0)), 96),
    (
        IpAddr::V6(Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0x0a00, 0)),
        104,
    ),
    (
        IpAddr::V6(Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0xac10, 0)),
        108,
    ),
    (
        IpAddr::V6(Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0xc0a8, 0)),
        112,
    ),
    (
        IpAddr::V6(Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0x6440, 0)),
        106,
    ),
    (
        IpAddr::V6(Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0xe000, 0)),
        100,
    ),
    (
        IpAddr::V6(Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0xf000, 0)),
        100,
    ),
];

/// Refuses a range that holds any address of [`HOST_BLOCKS`].
fn refuse_host_blocks(network: IpAddr, prefix: u8) -> std::result::Result<(), String> {
    for (block, size) in HOST_BLOCKS {
        if network.is_ipv4() == block.is_ipv4() && in_range(network, block, prefix.min(size)) {
            return Err(format!(
                "it covers {block}/{size} (loopback, link-local or unspecified addresses), \
                 which reach the host itself; no rule may allow them"
            ));
        }
    }
    Ok(())
}

/// Whether `addr` is one no rule can allow ([`Allowlist::parse`] refuses a rule that
/// names or covers one): loopback, unspecified, "this network" or link-local, which
/// reach the host itself or what sits beside it. The egress proxy refuses them
/// whatever its allowlist says.
///
/// ```
/// use sandcell::egress::{reaches_host, Allowlist};
/// assert!(reaches_host("127.0.0.1".parse().unwrap()));
/// assert!(reaches_host("::ffff:169.254.169.254".parse().unwrap()));
/// assert!(!reaches_host("10.0.0.1".parse().unwrap()));
/// assert!(Allowlist::parse(["127.0.0.1"]).is_err());
/// assert!(Allowlist::parse(["0.0.0.0/0"]).is_err());
/// assert!(Allowlist::parse(["[::1]:22"]).is_err());
/// ```
pub fn reaches_host(addr: IpAddr) -> bool {
    let addr = canonical(addr);
    HOST_BLOCKS
        .iter()
        .any(|&(block, size)| in_range(addr, block, size))
}

/// Whether `addr` reaches this host, its local networks, or no single host: loopback,
/// unspecified, private (RFC 1918, IPv6 unique-local), shared (100.64.0.0/10),
/// link-local (cloud metadata services live there), multicast and broadcast, and the
/// "this network" block. A name that resolves to such an address is refused unless an
/// address rule allows it, so DNS cannot point an allowed name at the host.
///
/// ```
/// use sandcell::egress::is_private;
/// assert!(is_private("127.0.0.1".parse().unwrap()));
/// assert!(is_private("169.254.169.254".parse().unwrap()));
/// assert!(is_private("::ffff:10.0.0.1".parse().unwrap()));
/// assert!(!is_private("151.101.0.223".parse().unwrap()));
/// ```
pub fn is_private(addr: IpAddr) -> bool {
    match canonical(addr) {
        IpAddr::V4(v4) => private_v4(v4),
        IpAddr::V6(v6) => private_v6(v6),
    }
}

fn private_v4(v4: Ipv4Addr) -> bool {
    let [a, b, ..] = v4.octets();
    v4.is_loopback()
        || v4.is_unspecified()
        || v4.is_private()
        || v4.is_link_local()
        || v4.is_multicast()
        || v4.is_broadcast()
        || a == 0
        || (a == 100 && (64..128).contains(&b))
        || a >= 240
}

fn private_v6(v6: Ipv6Addr) -> bool {
    let first = v6.segments()[0];
    v6.is_loopback()
        || v6.is_unspecified()
        || v6.is_multicast()
        || (first & 0xfe00) == 0xfc00 // unique local
        || (first & 0xffc0) == 0xfe80 // link local
        || (first & 0xffc0) == 0xfec0 // site local (deprecated)
        // IPv4-compatible (::a.b.c.d) and NAT64 (64:ff9b::/96) carry an IPv4 address.
        || v6.to_ipv4().is_some_and(private_v4)
        || (v6.segments()[..6] == [0x64, 0xff9b, 0, 0, 0, 0]
            && private_v4(Ipv4Addr::from((u128::from(v6) & 0xffff_ffff) as u32)))
}

#[cfg(test)]
mod tests;
