//! The networks this host is directly on, read from the kernel's routing tables: a
//! sandbox's way out must not reach the host's neighbours, whatever their addresses
//! (a LAN on public addresses, IPv6 with global ones). ADVERSARIAL 38.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// A route's flags: usable, and through a gateway (not directly connected).
const RTF_UP: u32 = 0x1;
const RTF_GATEWAY: u32 = 0x2;

/// The networks (address and prefix length) this host reaches without a gateway, on
/// any interface but loopback, IPv4 and IPv6, and those of its interfaces' addresses
/// whatever table routes them. Read on each call (two small `/proc` files; the
/// interfaces from `ip` at most every two seconds), so an interface added since is
/// seen; empty where none can be read.
pub fn host_networks() -> Vec<(IpAddr, u8)> {
    let v4 = std::fs::read_to_string("/proc/net/route").unwrap_or_default();
    let v6 = std::fs::read_to_string("/proc/net/ipv6_route").unwrap_or_default();
    let mut networks = parse_v4(&v4);
    networks.extend(parse_v6(&v6));
    networks.extend(interface_networks());
    networks
}

/// How long the interfaces' networks are reused before `ip` is asked again.
const INTERFACES_FRESH: std::time::Duration = std::time::Duration::from_secs(2);

/// The IPv4 networks of this host's interface addresses, whatever routing table
/// routes them (`/proc/net/route` shows the main one only: policy routing, VRFs and
/// VPN clients keep theirs elsewhere), from `ip`, asked at most every
/// [`INTERFACES_FRESH`].
fn interface_networks() -> Vec<(IpAddr, u8)> {
    type Read = Option<(std::time::Instant, Vec<(IpAddr, u8)>)>;
    static LAST: std::sync::Mutex<Read> = std::sync::Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((at, networks)) = &*last {
        if at.elapsed() < INTERFACES_FRESH {
            return networks.clone();
        }
    }
    let networks: Vec<(IpAddr, u8)> = crate::raw::host_tool::connected_networks(&[])
        .iter()
        .filter_map(|network| {
            let (addr, prefix) = network.split_once('/')?;
            Some((addr.parse().ok()?, prefix.parse().ok()?))
        })
        .collect();
    *last = Some((std::time::Instant::now(), networks.clone()));
    networks
}

/// Whether `addr` is on one of [`host_networks`] (an IPv4-mapped address judged as
/// IPv4).
///
/// ```
/// use sandcell::egress::reaches_host;
/// use sandcell::raw::egress::on_host_network;
/// // Loopback is never one of them: it is this host itself, which `reaches_host`
/// // (and no rule at all) covers.
/// let loopback = "127.0.0.1".parse().unwrap();
/// assert!(!on_host_network(loopback) && reaches_host(loopback));
/// ```
pub fn on_host_network(addr: IpAddr) -> bool {
    on(&host_networks(), addr)
}

/// Whether `addr` is on one of `networks`; an IPv6 address carrying an IPv4 one
/// (mapped, compatible, NAT64, 6to4) is judged by that too.
fn on(networks: &[(IpAddr, u8)], addr: IpAddr) -> bool {
    let max = if addr.is_ipv4() { 32 } else { 128 };
    networks
        .iter()
        .any(|&(network, prefix)| overlaps(network, prefix, addr, max))
}

/// IPv6 blocks that carry IPv4 addresses: the block, its prefix length, and the bit
/// at which the IPv4 address starts.
const EMBEDDING: [(Ipv6Addr, u8, u8); 4] = [
    // IPv4-mapped, ::ffff:a.b.c.d
    (Ipv6Addr::new(0, 0, 0, 0, 0, 0xffff, 0, 0), 96, 96),
    // IPv4-compatible, ::a.b.c.d (deprecated, still routed by some stacks)
    (Ipv6Addr::new(0, 0, 0, 0, 0, 0, 0, 0), 96, 96),
    // NAT64, 64:ff9b::a.b.c.d: a gateway connects to the IPv4 address
    (Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0, 0), 96, 96),
    // 6to4, 2002:aabb:ccdd::/48: a relay reaches the IPv4 address
    (Ipv6Addr::new(0x2002, 0, 0, 0, 0, 0, 0, 0), 16, 16),
];

/// The IPv4 ranges an IPv6 range reaches through the blocks that carry IPv4
/// addresses; `0.0.0.0/0` where it covers a whole block.
fn embedded_v4(network: Ipv6Addr, prefix: u8) -> Vec<(IpAddr, u8)> {
    let bits = u128::from(network);
    EMBEDDING
        .iter()
        .filter_map(|&(block, block_prefix, start)| {
            let whole = IpAddr::V4(Ipv4Addr::UNSPECIFIED);
            if prefix <= block_prefix {
                return contains(IpAddr::V6(network), prefix, IpAddr::V6(block))
                    .then_some((whole, 0));
            }
            if !contains(IpAddr::V6(block), block_prefix, IpAddr::V6(network)) {
                return None;
            }
            let v4 = ((bits >> (128 - u32::from(start) - 32)) & 0xffff_ffff) as u32;
            Some((
                IpAddr::V4(Ipv4Addr::from(v4)),
                (prefix - block_prefix).min(32),
            ))
        })
        .collect()
}

/// What only an address rule the operator allowed may reach: private ranges and
/// `networks`, those this host is directly on (its neighbours, whatever their
/// addresses), read once per connection by the caller.
pub(super) fn private(addr: IpAddr, networks: &[(IpAddr, u8)]) -> bool {
    super::is_private(addr) || on(networks, addr)
}

/// Whether the range `network/prefix` (this host's) and the one `other/other_prefix`
/// overlap, the IPv4 ranges `other` carries (an IPv6 range of NAT64 or 6to4
/// addresses) included.
pub(crate) fn overlaps(network: IpAddr, prefix: u8, other: IpAddr, other_prefix: u8) -> bool {
    let direct = |other: IpAddr, other_prefix: u8| {
        contains(network, prefix, other) || contains(other, other_prefix, network)
    };
    direct(other, other_prefix)
        || match (network, other) {
            (IpAddr::V4(_), IpAddr::V6(v6)) => embedded_v4(v6, other_prefix)
                .into_iter()
                .any(|(v4, p)| direct(v4, p)),
            _ => false,
        }
}

fn contains(network: IpAddr, prefix: u8, addr: IpAddr) -> bool {
    super::allowlist::in_range(addr, network, prefix)
}

/// `/proc/net/route`: interface, destination, gateway, flags, ..., mask; addresses as
/// the kernel's in-memory words in hex.
fn parse_v4(table: &str) -> Vec<(IpAddr, u8)> {
    let word = |hex: &str| u32::from_str_radix(hex, 16).ok();
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (iface, dest, flags, mask) = (
                *fields.first()?,
                word(fields.get(1)?)?,
                word(fields.get(3)?)?,
                word(fields.get(7)?)?,
            );
            let connected = flags & RTF_UP != 0 && flags & RTF_GATEWAY == 0;
            (connected && iface != "lo" && mask != 0).then(|| {
                let network = Ipv4Addr::from(dest.to_ne_bytes());
                (IpAddr::V4(network), mask.count_ones() as u8)
            })
        })
        .collect()
}

/// `/proc/net/ipv6_route`: destination, its prefix length, source, its length, next
/// hop, metric, references, use, flags, interface; in hex.
fn parse_v6(table: &str) -> Vec<(IpAddr, u8)> {
    table
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let dest = u128::from_str_radix(fields.first()?, 16).ok()?;
            let prefix = u8::from_str_radix(fields.get(1)?, 16).ok()?;
            let flags = u32::from_str_radix(fields.get(8)?, 16).ok()?;
            let iface = *fields.get(9)?;
            let connected = flags & RTF_UP != 0 && flags & RTF_GATEWAY == 0;
            (connected && iface != "lo" && prefix > 0 && prefix <= 128)
                .then(|| (IpAddr::V6(Ipv6Addr::from(dest)), prefix))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connected_routes_are_read_and_gateways_and_loopback_are_not() {
        let v4 =
            "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
                  eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
                  eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n\
                  wan\t007100CB\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n\
                  eth1\t0000A8C0\t0100A8C0\t0003\t0\t0\t0\t0000FFFF\t0\t0\t0\n\
                  lo\t0000007F\t00000000\t0001\t0\t0\t0\t000000FF\t0\t0\t0\n";
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(
            parse_v4(v4),
            [(ip("192.0.2.0"), 24), (ip("203.0.113.0"), 24)],
            "no default route, no route through a gateway, no loopback"
        );
        let v6 = "20010db8000000010000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001     eth0\n\
                  00000000000000000000000000000000 00 00000000000000000000000000000000 00 fd000000000000000000000000000001 00000400 00000003 00000000 00000003     eth0\n\
                  00000000000000000000000000000001 80 00000000000000000000000000000000 00 00000000000000000000000000000000 00000000 00000002 00000000 80200001       lo\n";
        assert_eq!(parse_v6(v6), [(ip("2001:db8:0:1::"), 64)]);
        assert!(contains(ip("203.0.113.0"), 24, ip("203.0.113.9")));
        assert!(!contains(ip("203.0.113.0"), 24, ip("203.0.114.9")));
        assert!(overlaps(ip("203.0.0.0"), 16, ip("203.0.113.0"), 24));
        assert!(!overlaps(ip("2001:db8:0:1::"), 64, ip("203.0.113.0"), 24));
    }

    /// An IPv6 address or range that carries an IPv4 one reaches that network through
    /// a NAT64 gateway or a 6to4 relay: it is on the host's network as that is.
    #[test]
    fn ipv6_forms_of_a_host_network_are_on_it() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let host = [(ip("192.0.2.0"), 24)];
        for on_it in ["::ffff:192.0.2.7", "64:ff9b::c000:207", "2002:c000:207::1"] {
            assert!(on(&host, ip(on_it)), "{on_it}");
        }
        for off in ["64:ff9b::cb00:7107", "2002:cb00:7107::1", "2001:db8::1"] {
            assert!(!on(&host, ip(off)), "{off}");
        }
        let (net, p) = host[0];
        assert!(
            overlaps(net, p, ip("64:ff9b::c000:200"), 120),
            "NAT64 range"
        );
        assert!(overlaps(net, p, ip("2002:c000:200::"), 40), "6to4 range");
        assert!(overlaps(net, p, ip("64:ff9b::"), 64), "all of NAT64");
        assert!(overlaps(net, p, ip("2002::"), 16), "all of 6to4");
        assert!(
            !overlaps(net, p, ip("2002:cb00::"), 24),
            "6to4 of another network"
        );
        assert!(!overlaps(net, p, ip("2001:db8::"), 32), "no IPv4 inside");
    }
}
