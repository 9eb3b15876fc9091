//! IP-address identifiers (RFC 8738): how a configured name that is an address is written,
//! proven and counted. An address is ordered as an `ip` identifier, proven by HTTP-01 (`Host:
//! 192.0.2.7`, `Host: [2001:db8::7]`) or TLS-ALPN-01 (the CA's handshake names the address's
//! reverse-mapping name in its SNI, and the challenge certificate carries the address), never by
//! DNS-01; the weekly budget counts it as Let's Encrypt does (per IPv4 address, per IPv6 /64).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The address `name` is, if it is one.
pub(crate) fn address(name: &str) -> Option<IpAddr> {
    name.parse().ok()
}

/// A configured name as it is kept: an address in its canonical text (`[::1]` and `0::1` are
/// `::1`), anything else lower-case.
pub(crate) fn normalize(name: &str) -> String {
    let bare = name
        .strip_prefix('[')
        .and_then(|n| n.strip_suffix(']'))
        .unwrap_or(name);
    match bare.parse::<IpAddr>() {
        Ok(ip) => ip.to_string(),
        Err(_) => name.to_ascii_lowercase(),
    }
}

/// The reverse-mapping name of `ip` (RFC 8738 §6): what a TLS-ALPN-01 validation of it sends as
/// its server name. `7.2.0.192.in-addr.arpa`; for IPv6 the 32 nibbles, last first, under
/// `ip6.arpa`.
pub(crate) fn reverse_name(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, c, d] = v4.octets();
            format!("{d}.{c}.{b}.{a}.in-addr.arpa")
        }
        IpAddr::V6(v6) => {
            let mut name = String::with_capacity(72);
            for byte in v6.octets().iter().rev() {
                name.push(char::from_digit(u32::from(byte & 0xf), 16).unwrap_or('0'));
                name.push('.');
                name.push(char::from_digit(u32::from(byte >> 4), 16).unwrap_or('0'));
                name.push('.');
            }
            name.push_str("ip6.arpa");
            name
        }
    }
}

/// The address whose reverse-mapping name `name` is (lower-case, a trailing dot allowed), if it
/// is one: the inverse of [`reverse_name`].
pub(crate) fn from_reverse_name(name: &str) -> Option<IpAddr> {
    let name = name.strip_suffix('.').unwrap_or(name);
    if let Some(v4) = name.strip_suffix(".in-addr.arpa") {
        let mut octets = [0u8; 4];
        let mut parts = v4.split('.');
        for octet in octets.iter_mut().rev() {
            let part = parts.next()?;
            if part.len() > 1 && part.starts_with('0') {
                return None;
            }
            *octet = part.parse().ok()?;
        }
        return parts
            .next()
            .is_none()
            .then(|| IpAddr::V4(Ipv4Addr::from(octets)));
    }
    let v6 = name.strip_suffix(".ip6.arpa")?;
    let mut bits = 0u128;
    let mut count = 0;
    for (i, nibble) in v6.split('.').enumerate() {
        let [digit] = nibble.as_bytes() else {
            return None;
        };
        let value = char::from(*digit).to_digit(16)?;
        if i >= 32 || digit.is_ascii_uppercase() {
            return None;
        }
        bits |= u128::from(value) << (4 * i);
        count += 1;
    }
    (count == 32).then(|| IpAddr::V6(Ipv6Addr::from(bits)))
}

/// What the weekly budget counts `ip` under, as Let's Encrypt's limits do: an IPv4 address
/// alone, an IPv6 address by its /64 (`2001:db8::/64`).
pub(crate) fn budget_key(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => {
            let prefix = u128::from(v6) & !u128::from(u64::MAX);
            format!("{}/64", Ipv6Addr::from(prefix))
        }
    }
}

/// `ip` as part of a Kubernetes object name (lower-case letters, digits, `-` and `.`): an IPv4
/// address as it is, an IPv6 address as its eight groups written in full, joined by `-` (one
/// spelling per address; no DNS name a CA issues for looks like it: those have a dot).
#[cfg(any(feature = "k8s", test))]
pub(crate) fn object_name(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => v6
            .segments()
            .iter()
            .map(|s| format!("{s:04x}"))
            .collect::<Vec<_>>()
            .join("-"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn addresses_are_kept_in_their_canonical_text_and_names_in_lower_case() {
        assert_eq!(normalize("[::1]"), "::1");
        assert_eq!(normalize("2001:DB8:0:0::7"), "2001:db8::7");
        assert_eq!(normalize("192.0.2.7"), "192.0.2.7");
        assert_eq!(normalize("A.Example.com"), "a.example.com");
        assert_eq!(normalize("[a.example.com]"), "[a.example.com]");
        assert_eq!(address("2001:db8::7"), Some(ip("2001:db8::7")));
        assert_eq!(address("a.example.com"), None);
    }

    #[test]
    fn reverse_names_are_rfc_8738s_and_read_back() {
        assert_eq!(reverse_name(ip("192.0.2.7")), "7.2.0.192.in-addr.arpa");
        // RFC 8738 §6's own example.
        assert_eq!(
            reverse_name(ip("2001:db8::1")),
            "1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.8.b.d.0.1.0.0.2.ip6.arpa"
        );
        for text in [
            "192.0.2.7",
            "0.0.0.0",
            "255.255.255.255",
            "::1",
            "2001:db8::7",
        ] {
            let name = reverse_name(ip(text));
            assert_eq!(from_reverse_name(&name), Some(ip(text)), "{name}");
            assert_eq!(from_reverse_name(&format!("{name}.")), Some(ip(text)));
        }
        for not in [
            "a.example.com",
            "7.2.0.in-addr.arpa",
            "7.2.0.192.1.in-addr.arpa",
            "07.2.0.192.in-addr.arpa",
            "256.2.0.192.in-addr.arpa",
            "1.0.ip6.arpa",
            "10.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.8.b.d.0.1.0.0.2.ip6.arpa",
            "g.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.8.b.d.0.1.0.0.2.ip6.arpa",
        ] {
            assert_eq!(from_reverse_name(not), None, "{not}");
        }
    }

    #[test]
    fn the_budget_counts_an_ipv4_address_alone_and_ipv6_by_its_64() {
        assert_eq!(budget_key(ip("192.0.2.7")), "192.0.2.7");
        assert_eq!(budget_key(ip("2001:db8::7")), "2001:db8::/64");
        assert_eq!(
            budget_key(ip("2001:db8::7")),
            budget_key(ip("2001:db8:0:0:ffff:ffff:ffff:ffff"))
        );
        assert_ne!(
            budget_key(ip("2001:db8::7")),
            budget_key(ip("2001:db8:0:1::7"))
        );
    }

    #[test]
    fn object_names_are_valid_kubernetes_names_one_per_address() {
        assert_eq!(object_name(ip("192.0.2.7")), "192.0.2.7");
        assert_eq!(
            object_name(ip("2001:db8::7")),
            "2001-0db8-0000-0000-0000-0000-0000-0007"
        );
        assert_eq!(
            object_name(ip("::1")),
            "0000-0000-0000-0000-0000-0000-0000-0001"
        );
    }
}
