//! What a client's failures are counted by, for every limiter that counts
//! them (the API's failed keys, the dashboard's sign-ins and sign-ups): one
//! rule, so that a host cannot be one client to one limiter and thousands
//! to another.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr};

/// A client as the failure limits see it: its IPv4 address, or the /64 of
/// its IPv6 address. One host usually holds a whole /64 (SLAAC, privacy
/// addresses, a VPS's routed prefix), so counting single IPv6 addresses
/// would give it 2^64 fresh starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ClientKey {
    V4(Ipv4Addr),
    /// The first four 16-bit groups of the address.
    V6Net([u16; 4]),
}

/// The client key of `address`. An IPv4-mapped IPv6 address (a dual-stack
/// listener's view of an IPv4 peer) is its IPv4 address.
pub fn client_key(address: IpAddr) -> ClientKey {
    match address {
        IpAddr::V4(v4) => ClientKey::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => ClientKey::V4(v4),
            None => {
                let s = v6.segments();
                ClientKey::V6Net([s[0], s[1], s[2], s[3]])
            }
        },
    }
}

/// `203.0.113.7` or `2001:db8:1:2::/64`: how the dashboard stores it.
impl fmt::Display for ClientKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientKey::V4(v4) => write!(f, "{v4}"),
            ClientKey::V6Net(s) => write!(f, "{:x}:{:x}:{:x}:{:x}::/64", s[0], s[1], s[2], s[3]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_clients_are_counted_by_their_64() {
        let key = |s: &str| client_key(s.parse().unwrap());
        assert_eq!(key("2001:db8:1:2:aaaa::1"), key("2001:db8:1:2:bbbb::9"));
        assert_ne!(key("2001:db8:1:2::1"), key("2001:db8:1:3::1"));
        assert_eq!(key("2001:db8:1:2:aaaa::1").to_string(), "2001:db8:1:2::/64");
        assert_eq!(key("203.0.113.7").to_string(), "203.0.113.7");
        assert_eq!(key("::ffff:203.0.113.7"), key("203.0.113.7"));
        assert_ne!(key("203.0.113.7"), key("203.0.113.8"));
    }
}
