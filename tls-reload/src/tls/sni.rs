//! The SNI table: server names to certificate slots, looked up without allocating; and the
//! addresses of IP certificates, for handshakes without a server name.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use arc_swap::ArcSwapOption;
use foldhash::fast::RandomState;
use rustls::sign::CertifiedKey;

use crate::Error;

/// One route's certificate: stored by the reload task, loaded on every handshake.
pub(crate) type Slot = ArcSwapOption<CertifiedKey>;

/// The longest DNS name (RFC 1035): lookups of longer names find nothing.
const MAX_NAME: usize = 253;

/// A route's name: an exact DNS name or a one-label wildcard, lower-case, without a trailing
/// dot; or an IP address, served to handshakes without a server name (see `Table::lookup_addr`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum RouteName {
    /// `api.example.com`.
    Exact(String),
    /// `*.example.com`, kept as `example.com`.
    Wildcard(String),
    /// `192.0.2.7`, `2001:db8::7` (given also as `[2001:db8::7]`).
    Ip(IpAddr),
}

impl RouteName {
    /// Parses `api.example.com`, `*.example.com` or an IP address.
    pub(crate) fn parse(name: &str) -> Result<Self, Error> {
        let invalid = |reason| Error::InvalidRouteName {
            name: name.to_owned(),
            reason,
        };
        let bare = name
            .strip_prefix('[')
            .and_then(|n| n.strip_suffix(']'))
            .unwrap_or(name);
        if let Ok(ip) = bare.parse::<IpAddr>() {
            return Ok(Self::Ip(ip.to_canonical()));
        }
        let lower = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
        let (wildcard, rest) = match lower.strip_prefix("*.") {
            Some(rest) => (true, rest.to_owned()),
            None => (false, lower),
        };
        if rest.is_empty() || rest.len() > MAX_NAME {
            return Err(invalid("a DNS name is 1 to 253 characters"));
        }
        for label in rest.split('.') {
            if label.is_empty() || label.len() > 63 {
                return Err(invalid("every label is 1 to 63 characters"));
            }
            if !label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            {
                return Err(invalid(
                    "letters, digits, '-' and '_' only; a wildcard is a whole first label (*.example.com)",
                ));
            }
        }
        if wildcard && !rest.contains('.') {
            return Err(invalid(
                "a wildcard needs at least two labels after it (*.example.com)",
            ));
        }
        Ok(if wildcard {
            Self::Wildcard(rest)
        } else {
            Self::Exact(rest)
        })
    }
}

impl std::fmt::Display for RouteName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Exact(name) => f.write_str(name),
            Self::Wildcard(suffix) => write!(f, "*.{suffix}"),
            Self::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

/// An edit of the table: a name to the slot that serves it now (`None`: nothing).
pub(crate) type TableEdit = (RouteName, Option<Arc<Slot>>);

/// Exact names and wildcard suffixes to slots. Built whole when a route list is in, edited one
/// name at a time when a route's names change (see `CertResolver::edit_table`); a rotation of an
/// existing route only stores into its slot.
///
/// Hashed with foldhash (seeded per process): the standard `SipHash` would be a third of a
/// lookup, and only the reload task inserts, from validated certificates, so lookups of
/// untrusted names cannot be steered into collisions.
#[derive(Debug, Default, Clone)]
pub(crate) struct Table {
    exact: HashMap<Box<str>, Arc<Slot>, RandomState>,
    wildcard: HashMap<Box<str>, Arc<Slot>, RandomState>,
    /// The addresses IP certificates cover.
    ip: HashMap<IpAddr, Arc<Slot>, RandomState>,
    /// The slots of `ip` (by address in memory), each with how many addresses it serves: with
    /// one slot here there is one IP certificate. Kept per edit, so no edit scans the table.
    ip_slots: HashMap<usize, (Arc<Slot>, usize), RandomState>,
}

impl Table {
    /// Serves `name` from `slot`, or (`None`) no more.
    pub(crate) fn set(&mut self, name: &RouteName, slot: Option<&Arc<Slot>>) {
        let (map, key) = match name {
            RouteName::Exact(name) => (&mut self.exact, name),
            RouteName::Wildcard(suffix) => (&mut self.wildcard, suffix),
            RouteName::Ip(ip) => {
                let old = match slot {
                    Some(slot) => {
                        let count = &mut self
                            .ip_slots
                            .entry(Arc::as_ptr(slot) as usize)
                            .or_insert_with(|| (Arc::clone(slot), 0))
                            .1;
                        *count += 1;
                        self.ip.insert(*ip, Arc::clone(slot))
                    }
                    None => self.ip.remove(ip),
                };
                if let Some(old) = old {
                    let key = Arc::as_ptr(&old) as usize;
                    if let Some((_, count)) = self.ip_slots.get_mut(&key) {
                        *count -= 1;
                        if *count == 0 {
                            self.ip_slots.remove(&key);
                        }
                    }
                }
                return;
            }
        };
        match slot {
            Some(slot) => {
                if let Some(held) = map.get_mut(key.as_str()) {
                    *held = Arc::clone(slot);
                } else {
                    map.insert(key.as_str().into(), Arc::clone(slot));
                }
            }
            None => {
                map.remove(key.as_str());
            }
        }
    }

    /// Applies `edits` in order.
    pub(crate) fn edit(&mut self, edits: &[TableEdit]) {
        for (name, slot) in edits {
            self.set(name, slot.as_ref());
        }
    }

    /// The certificate for `server_name`: an exact route, else a wildcard covering its first
    /// label, else `None`. Case-insensitive, a trailing dot ignored, no allocation.
    #[inline]
    pub(crate) fn lookup(&self, server_name: &str) -> Option<Arc<CertifiedKey>> {
        let name = server_name.strip_suffix('.').unwrap_or(server_name);
        if let Some(found) = self.lookup_lower(name) {
            return Some(found);
        }
        // rustls lower-cases SNI already, so a hit never pays for this; other callers may not.
        if !name.bytes().any(|b| b.is_ascii_uppercase()) {
            return None;
        }
        let mut buf = [0u8; MAX_NAME];
        let buf = buf.get_mut(..name.len())?;
        buf.copy_from_slice(name.as_bytes());
        buf.make_ascii_lowercase();
        self.lookup_lower(std::str::from_utf8(buf).ok()?)
    }

    fn lookup_lower(&self, name: &str) -> Option<Arc<CertifiedKey>> {
        if let Some(found) = self.exact.get(name).and_then(|slot| slot.load_full()) {
            return Some(found);
        }
        let (label, parent) = name.split_once('.')?;
        if label.is_empty() || self.wildcard.is_empty() {
            return None;
        }
        self.wildcard.get(parent).and_then(|slot| slot.load_full())
    }

    /// The IP certificate for a handshake without a server name (or with an IP address as
    /// one, which rustls reports as none) that arrived on `local`.
    #[inline]
    pub(crate) fn lookup_addr(&self, local: IpAddr) -> Option<Arc<CertifiedKey>> {
        if self.ip.is_empty() {
            return None;
        }
        self.ip
            .get(&local.to_canonical())
            .and_then(|slot| slot.load_full())
    }

    /// The one IP certificate, if there is exactly one: it also serves the handshakes without a
    /// server name that arrived on another address, or on one not known (behind NAT the
    /// address a client reached is not the socket's).
    #[inline]
    pub(crate) fn sole_ip(&self) -> Option<Arc<CertifiedKey>> {
        match self.ip_slots.values().next() {
            Some((slot, _)) if self.ip_slots.len() == 1 => slot.load_full(),
            _ => None,
        }
    }

    /// How many names (and addresses) the table holds.
    pub(crate) fn len(&self) -> usize {
        self.exact.len() + self.wildcard.len() + self.ip.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_names_are_normalised_and_checked() {
        assert_eq!(
            RouteName::parse("API.Example.com.").unwrap(),
            RouteName::Exact("api.example.com".into())
        );
        assert_eq!(
            RouteName::parse("*.example.com").unwrap().to_string(),
            "*.example.com"
        );
        for bad in [
            "",
            "*.com",
            "a.*.example.com",
            "exa mple.com",
            "a..b",
            "*",
            "[a.example.com]",
        ] {
            let err = RouteName::parse(bad).unwrap_err().to_string();
            assert!(err.contains(&format!("{bad:?}")), "{err}");
        }
        for (address, canonical) in [
            ("192.0.2.7", "192.0.2.7"),
            ("[2001:DB8:0::7]", "2001:db8::7"),
            ("::ffff:192.0.2.7", "192.0.2.7"),
        ] {
            let name = RouteName::parse(address).unwrap();
            assert!(matches!(name, RouteName::Ip(_)), "{address}");
            assert_eq!(name.to_string(), canonical);
        }
    }

    /// A slot serving a certificate of its own, and that certificate.
    fn slot(name: &str) -> (Arc<Slot>, Arc<CertifiedKey>) {
        let bundle = crate::testing::bundle(&tls_test::TestCa::new("sni").leaf(&[name]), None);
        let key = crate::testing::provider()
            .key_provider
            .load_private_key(bundle.key().clone_key())
            .unwrap();
        let key = Arc::new(CertifiedKey::new(bundle.chain().to_vec(), key));
        (Arc::new(Slot::new(Some(Arc::clone(&key)))), key)
    }

    /// What a handshake without a server name that arrived on `local` gets from the routes.
    fn nameless(table: &Table, local: Option<IpAddr>) -> Option<Arc<CertifiedKey>> {
        local
            .and_then(|local| table.lookup_addr(local))
            .or_else(|| table.sole_ip())
    }

    #[test]
    fn without_a_server_name_the_local_address_picks_the_ip_certificate_or_the_only_one_does() {
        let ip = |text: &str| text.parse::<IpAddr>().unwrap();
        let name = |text: &str| RouteName::parse(text).unwrap();
        let mut table = Table::default();
        let (dns, _) = slot("a.example.com");
        table.set(&name("a.example.com"), Some(&dns));
        assert!(
            nameless(&table, Some(ip("127.0.0.2"))).is_none(),
            "no IP certificate"
        );

        // One IP certificate, for two addresses: every handshake without a name gets it.
        let (one, one_key) = slot("one.example.com");
        table.set(&name("127.0.0.2"), Some(&one));
        table.set(&name("::1"), Some(&one));
        for local in [
            Some(ip("127.0.0.2")),
            Some(ip("::ffff:127.0.0.2")),
            Some(ip("10.0.0.1")),
            None,
        ] {
            let served = nameless(&table, local).expect("the one IP certificate");
            assert_eq!(served.cert, one_key.cert, "{local:?}");
        }

        // Two: by address only.
        let (two, two_key) = slot("two.example.com");
        table.set(&name("127.0.0.3"), Some(&two));
        assert_eq!(
            nameless(&table, Some(ip("127.0.0.3"))).unwrap().cert,
            two_key.cert
        );
        assert_eq!(
            nameless(&table, Some(ip("::1"))).unwrap().cert,
            one_key.cert
        );
        assert!(
            nameless(&table, Some(ip("10.0.0.1"))).is_none(),
            "which one is not known"
        );
        assert!(nameless(&table, None).is_none());

        // An address moving to the other certificate (set twice: nothing counted twice)
        // leaves one IP certificate; moved back, two again.
        table.set(&name("127.0.0.3"), Some(&one));
        table.set(&name("127.0.0.3"), Some(&one));
        assert_eq!(nameless(&table, None).unwrap().cert, one_key.cert);
        table.set(&name("127.0.0.3"), Some(&two));
        assert!(nameless(&table, None).is_none());

        // One again when the other goes; none when both have.
        table.set(&name("127.0.0.3"), None);
        assert_eq!(nameless(&table, None).unwrap().cert, one_key.cert);
        table.set(&name("127.0.0.2"), None);
        table.set(&name("::1"), None);
        assert!(nameless(&table, None).is_none());
        assert_eq!(table.len(), 1);
    }
}
