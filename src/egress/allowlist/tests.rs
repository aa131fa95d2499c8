//! The allowlist's syntax, matching and private ranges.

use super::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn entries_parse_with_and_without_ports() {
    let list = Allowlist::parse([
        "A.Test",
        "b.test:8080",
        "*.pkg.test:443",
        "192.0.2.1",
        "198.51.100.0/24:22",
        "[2001:db8::1]:443",
        "2001:db8:1::/48",
        "::ffff:203.0.113.9",
    ])
    .unwrap();
    assert!(list.allows_name("a.test", 1).is_some());
    assert!(list.allows_name("A.TEST.", 65535).is_some());
    assert!(list.allows_name("b.test", 8080).is_some());
    assert!(list.allows_name("b.test", 80).is_none());
    assert!(list.allows_name("x.y.pkg.test", 443).is_some());
    assert!(list.allows_name("pkg.test", 443).is_none());
    assert!(list.allows_name("evilpkg.test", 443).is_none());
    assert!(list.allows_name("c.test", 80).is_none());
    assert!(list.allows_addr(ip("192.0.2.1"), 9).is_some());
    assert!(list.allows_addr(ip("::ffff:192.0.2.1"), 9).is_some());
    assert!(list.allows_addr(ip("192.0.2.2"), 9).is_none());
    assert!(list.allows_addr(ip("198.51.100.77"), 22).is_some());
    assert!(list.allows_addr(ip("198.51.100.77"), 23).is_none());
    assert!(list.allows_addr(ip("2001:db8::1"), 443).is_some());
    assert!(list.allows_addr(ip("2001:db8::1"), 80).is_none());
    assert!(list.allows_addr(ip("2001:db8:1:ffff::5"), 1).is_some());
    assert!(list.allows_addr(ip("203.0.113.9"), 1).is_some());
    assert_eq!(
        list.allows_name("b.test", 8080).unwrap().to_string(),
        "b.test:8080"
    );
}

#[test]
fn a_name_rule_never_allows_an_address_and_an_address_is_not_a_name() {
    let list = Allowlist::parse(["a.test", "10.0.0.0/8"]).unwrap();
    assert!(list.allows_name("10.1.1.1", 80).is_none());
    assert!(list.allows_addr(ip("10.1.1.1"), 80).is_some());
    assert!(list.allows_name("127.1", 80).is_none());
}

#[test]
fn malformed_entries_are_refused_by_name() {
    for bad in [
        "",
        "  ",
        "a.test:0",
        "a.test:65536",
        "a.test:http",
        "*.",
        "*",
        "a..test",
        "a test",
        "10.0.0.0/33",
        "10.0.0.0/x",
        "name/8",
        "[::1",
        "[::1]x",
        "a.test:80:90x",
        "-bad-/",
    ] {
        let err = Allowlist::parse([bad]).unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::InvalidInput, "{bad:?}");
        assert!(err.to_string().contains("allowlist entry"), "{err}");
    }
}

/// ADVERSARIAL 38: a rule naming or covering loopback, link-local or unspecified
/// addresses is refused when it is accepted, in every spelling.
#[test]
fn adversarial_38_rules_reaching_the_host_are_refused() {
    for bad in [
        "127.0.0.1",
        "127.0.0.1:8080",
        "127.1.2.3/32",
        "126.0.0.0/7",
        "0.0.0.0/0",
        "0.0.0.0",
        "169.254.169.254",
        "169.0.0.0/8",
        "::1",
        "[::1]:22",
        "::",
        "::/0",
        "::ffff:127.0.0.1",
        "::ffff:0:0/96",
        "::127.0.0.1",
        "fe80::1",
        "[fe80::/10]:443",
        "64:ff9b::7f00:1",
    ] {
        let err = Allowlist::parse([bad]).unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::InvalidInput, "{bad:?}");
        assert!(err.to_string().contains("reach the host"), "{bad:?}: {err}");
    }
    for reaching in [
        "127.0.0.1",
        "::1",
        "::ffff:127.0.0.2",
        "169.254.1.1",
        "fe80::2",
    ] {
        assert!(reaches_host(ip(reaching)), "{reaching}");
    }
    for fine in ["10.0.0.0/8", "172.0.0.0/8", "2001:db8::/32", "192.0.2.1"] {
        assert!(Allowlist::parse([fine]).is_ok(), "{fine}");
    }
    assert!(!reaches_host(ip("10.0.0.1")));
}

#[test]
fn private_addresses_are_the_ones_that_reach_the_host_or_its_networks() {
    for private in [
        "127.0.0.1",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",
        "100.64.0.1",
        "0.0.0.0",
        "0.1.2.3",
        "224.0.0.1",
        "255.255.255.255",
        "::1",
        "::",
        "fd00::1",
        "fe80::1",
        "ff02::1",
        "::ffff:127.0.0.1",
        "64:ff9b::a00:1",
    ] {
        assert!(is_private(ip(private)), "{private}");
    }
    for public in [
        "8.8.8.8",
        "192.0.2.1",
        "2606:4700::1111",
        "64:ff9b::808:808",
    ] {
        assert!(!is_private(ip(public)), "{public}");
    }
}
