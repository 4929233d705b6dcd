//! The address rule of remote image fetching: the server connects only to
//! public unicast addresses, so that a client cannot use it to reach the
//! operator's own network (loopback, private ranges, the cloud metadata
//! service at 169.254.169.254, ...): server-side request forgery.
//!
//! IPv6 is judged by an allow-list (global unicast, 2000::/3, less its
//! special ranges), IPv4 by the IANA special-purpose registry. IPv6 forms
//! that carry an IPv4 address to connect to (IPv4-mapped, NAT64, 6to4) are
//! judged by that IPv4 address.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Whether the server may connect to `address` to fetch an image.
pub fn is_public(address: IpAddr) -> bool {
    match address {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

/// IPv4 blocks that are not public unicast, as (first octets, prefix length).
const REFUSED_V4: [([u8; 4], u8); 15] = [
    ([0, 0, 0, 0], 8),       // "this network"
    ([10, 0, 0, 0], 8),      // private
    ([100, 64, 0, 0], 10),   // carrier-grade NAT (shared address space)
    ([127, 0, 0, 0], 8),     // loopback
    ([169, 254, 0, 0], 16),  // link-local, and the cloud metadata service
    ([172, 16, 0, 0], 12),   // private
    ([192, 0, 0, 0], 24),    // IETF protocol assignments
    ([192, 0, 2, 0], 24),    // documentation (TEST-NET-1)
    ([192, 88, 99, 0], 24),  // 6to4 relay anycast (deprecated)
    ([192, 168, 0, 0], 16),  // private
    ([198, 18, 0, 0], 15),   // benchmarking
    ([198, 51, 100, 0], 24), // documentation (TEST-NET-2)
    ([203, 0, 113, 0], 24),  // documentation (TEST-NET-3)
    ([224, 0, 0, 0], 4),     // multicast
    ([240, 0, 0, 0], 4),     // reserved, and the broadcast 255.255.255.255
];

fn is_public_v4(address: Ipv4Addr) -> bool {
    let bits = u32::from(address);
    !REFUSED_V4.iter().any(|(network, prefix)| {
        let mask = u32::MAX << (32 - u32::from(*prefix));
        bits & mask == u32::from_be_bytes(*network)
    })
}

/// Special ranges inside global unicast 2000::/3 that are not public, as
/// (leading 16-bit groups, prefix length).
const REFUSED_V6: [([u16; 3], u8); 6] = [
    ([0x2001, 0x0000, 0], 32), // Teredo: wraps an IPv4 address we cannot judge
    ([0x2001, 0x0002, 0], 48), // benchmarking
    ([0x2001, 0x0010, 0], 28), // ORCHID (deprecated)
    ([0x2001, 0x0020, 0], 28), // ORCHIDv2
    ([0x2001, 0x0db8, 0], 32), // documentation
    ([0x3fff, 0x0000, 0], 20), // documentation (RFC 9637)
];

fn is_public_v6(address: Ipv6Addr) -> bool {
    if let Some(v4) = embedded_ipv4(address) {
        return is_public_v4(v4);
    }
    let bits = u128::from(address);
    // Everything outside global unicast: ::, ::1, IPv4-compatible (::/96,
    // deprecated), 64:ff9b:1::/48 (local-use NAT64), 100::/64 (discard),
    // fc00::/7 (unique local), fe80::/10 (link-local), fec0::/10
    // (site-local), ff00::/8 (multicast).
    let global_unicast = bits >> 125 == 0b001;
    global_unicast
        && !REFUSED_V6.iter().any(|(groups, prefix)| {
            let network = (u128::from(groups[0]) << 112)
                | (u128::from(groups[1]) << 96)
                | (u128::from(groups[2]) << 80);
            let mask = u128::MAX << (128 - u32::from(*prefix));
            bits & mask == network
        })
}

/// The IPv4 address a connection to `address` really goes to, for the forms
/// that carry one: IPv4-mapped (::ffff:a.b.c.d), NAT64 (64:ff9b::a.b.c.d)
/// and 6to4 (2002:aabb:ccdd::/48).
fn embedded_ipv4(address: Ipv6Addr) -> Option<Ipv4Addr> {
    if let Some(v4) = address.to_ipv4_mapped() {
        return Some(v4);
    }
    let segments = address.segments();
    let octets = address.octets();
    if segments[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return Some(Ipv4Addr::new(
            octets[12], octets[13], octets[14], octets[15],
        ));
    }
    if segments[0] == 0x2002 {
        return Some(Ipv4Addr::new(octets[2], octets[3], octets[4], octets[5]));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn public(address: &str) -> bool {
        is_public(address.parse().unwrap_or_else(|_| panic!("{address}")))
    }

    #[test]
    fn public_addresses_pass() {
        for address in [
            "8.8.8.8",
            "1.1.1.1",
            "93.184.216.34",
            "100.63.255.255", // just below CGNAT
            "100.128.0.0",    // just above it
            "172.15.255.255",
            "172.32.0.0",
            "192.0.1.1",
            "198.17.255.255",
            "198.20.0.0",
            "223.255.255.255",
            "2606:4700:4700::1111",
            "2a00:1450:4001:80b::200e",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808", // NAT64 of 8.8.8.8
            "2002:808:808::1",  // 6to4 of 8.8.8.8
        ] {
            assert!(public(address), "{address} should be public");
        }
    }

    #[test]
    fn every_refused_ipv4_range_is_refused_at_both_ends() {
        for (first, last) in [
            ("0.0.0.0", "0.255.255.255"),
            ("10.0.0.0", "10.255.255.255"),
            ("100.64.0.0", "100.127.255.255"),
            ("127.0.0.1", "127.255.255.255"),
            ("169.254.0.0", "169.254.255.255"),
            ("169.254.169.254", "169.254.169.254"),
            ("172.16.0.0", "172.31.255.255"),
            ("192.0.0.0", "192.0.0.255"),
            ("192.0.2.0", "192.0.2.255"),
            ("192.88.99.0", "192.88.99.255"),
            ("192.168.0.0", "192.168.255.255"),
            ("198.18.0.0", "198.19.255.255"),
            ("198.51.100.0", "198.51.100.255"),
            ("203.0.113.0", "203.0.113.255"),
            ("224.0.0.0", "239.255.255.255"),
            ("240.0.0.0", "255.255.255.254"),
            ("255.255.255.255", "255.255.255.255"),
        ] {
            assert!(!public(first), "{first} should be refused");
            assert!(!public(last), "{last} should be refused");
        }
    }

    #[test]
    fn every_refused_ipv6_range_is_refused() {
        for address in [
            "::",
            "::1",
            "fc00::1",
            "fdff:ffff::1",
            "fe80::1",
            "febf:ffff::1",
            "fec0::1",
            "feff::1",
            "ff02::1",
            "ff0e::1",
            "100::1",
            "2001:db8::1",
            "2001::1",      // Teredo
            "2001:2::1",    // benchmarking
            "2001:10::1",   // ORCHID
            "2001:20::1",   // ORCHIDv2
            "3fff::1",      // documentation
            "64:ff9b:1::1", // local-use NAT64
            "::8.8.8.8",    // IPv4-compatible (deprecated)
            "::127.0.0.1",
        ] {
            assert!(!public(address), "{address} should be refused");
        }
    }

    #[test]
    fn ipv6_forms_wrapping_a_refused_ipv4_are_refused() {
        for v4 in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "224.0.0.1",
            "255.255.255.255",
        ] {
            let v4: Ipv4Addr = v4.parse().unwrap();
            let [a, b, c, d] = v4.octets();
            let (high, low) = (u16::from_be_bytes([a, b]), u16::from_be_bytes([c, d]));
            for wrapped in [
                format!("::ffff:{v4}"),
                format!("64:ff9b::{v4}"),
                format!("2002:{high:x}:{low:x}::1"),
                format!("::{v4}"),
            ] {
                assert!(!public(&wrapped), "{wrapped} wraps {v4}");
            }
        }
    }
}
