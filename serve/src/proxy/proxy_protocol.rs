//! The PROXY protocol's version 2 header (`HAProxy`'s `proxy-protocol.txt`, section 2.2): the
//! client's address and what the TLS handshake established, sent to a `--upstream-tcp` before
//! the first byte of the connection.

use std::net::SocketAddr;

/// The header's fixed signature.
const SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";
/// Version 2, command PROXY.
const V2_PROXY: u8 = 0x21;
/// TCP over IPv4 / IPv6.
const TCP4: u8 = 0x11;
const TCP6: u8 = 0x21;
/// TLV types.
const PP2_TYPE_ALPN: u8 = 0x01;
const PP2_TYPE_AUTHORITY: u8 = 0x02;
const PP2_TYPE_SSL: u8 = 0x20;
const PP2_SUBTYPE_SSL_VERSION: u8 = 0x21;
const PP2_SUBTYPE_SSL_CN: u8 = 0x22;
/// The `client` bits of `PP2_TYPE_SSL`.
const PP2_CLIENT_SSL: u8 = 0x01;
const PP2_CLIENT_CERT_CONN: u8 = 0x02;
/// Our own TLV (the range reserved for applications): the client certificate's URI SANs,
/// one per TLV (a SPIFFE ID).
pub(crate) const PP2_TYPE_CLIENT_URI: u8 = 0xe0;

/// What the header says about the TLS connection.
#[derive(Debug, Default)]
pub(crate) struct Tls<'a> {
    pub(crate) server_name: Option<&'a str>,
    pub(crate) alpn: Option<&'a [u8]>,
    /// `TLSv1.3` or `TLSv1.2`.
    pub(crate) version: Option<&'a str>,
    /// With a client certificate (verified: serve refuses any other).
    pub(crate) client: Option<Client>,
}

/// The client certificate's names the header carries.
#[derive(Debug, Default)]
pub(crate) struct Client {
    pub(crate) common_name: Option<String>,
    pub(crate) uris: Vec<String>,
}

/// The header for a connection from `source` to `destination` (the two of one family; a
/// mix, IPv4 mapped into IPv6, is sent as IPv6).
pub(crate) fn header(source: SocketAddr, destination: SocketAddr, tls: &Tls<'_>) -> Vec<u8> {
    let mut addresses = Vec::with_capacity(36);
    let family = match (source, destination) {
        (SocketAddr::V4(s), SocketAddr::V4(d)) => {
            addresses.extend_from_slice(&s.ip().octets());
            addresses.extend_from_slice(&d.ip().octets());
            TCP4
        }
        _ => {
            addresses.extend_from_slice(&v6(source).octets());
            addresses.extend_from_slice(&v6(destination).octets());
            TCP6
        }
    };
    addresses.extend_from_slice(&source.port().to_be_bytes());
    addresses.extend_from_slice(&destination.port().to_be_bytes());

    let mut tlvs = Vec::new();
    if let Some(alpn) = tls.alpn {
        tlv(&mut tlvs, PP2_TYPE_ALPN, alpn);
    }
    if let Some(name) = tls.server_name {
        tlv(&mut tlvs, PP2_TYPE_AUTHORITY, name.as_bytes());
    }
    let mut ssl = vec![PP2_CLIENT_SSL];
    if tls.client.is_some() {
        ssl[0] |= PP2_CLIENT_CERT_CONN;
    }
    // verify: 0, the client certificate (if any) verified.
    ssl.extend_from_slice(&0u32.to_be_bytes());
    if let Some(version) = tls.version {
        tlv(&mut ssl, PP2_SUBTYPE_SSL_VERSION, version.as_bytes());
    }
    if let Some(cn) = tls.client.as_ref().and_then(|c| c.common_name.as_deref()) {
        tlv(&mut ssl, PP2_SUBTYPE_SSL_CN, cn.as_bytes());
    }
    tlv(&mut tlvs, PP2_TYPE_SSL, &ssl);
    for uri in tls.client.iter().flat_map(|c| &c.uris) {
        tlv(&mut tlvs, PP2_TYPE_CLIENT_URI, uri.as_bytes());
    }

    let length = addresses.len() + tlvs.len();
    let mut out = Vec::with_capacity(16 + length);
    out.extend_from_slice(&SIGNATURE);
    out.push(V2_PROXY);
    out.push(family);
    out.extend_from_slice(&u16::try_from(length).unwrap_or(u16::MAX).to_be_bytes());
    out.extend_from_slice(&addresses);
    out.extend_from_slice(&tlvs);
    out
}

fn v6(addr: SocketAddr) -> std::net::Ipv6Addr {
    match addr {
        SocketAddr::V4(a) => a.ip().to_ipv6_mapped(),
        SocketAddr::V6(a) => *a.ip(),
    }
}

/// A type-length-value; a value beyond 65,535 bytes (no name is) is cut there.
fn tlv(out: &mut Vec<u8>, kind: u8, value: &[u8]) {
    let value = &value[..value.len().min(usize::from(u16::MAX))];
    out.push(kind);
    out.extend_from_slice(&u16::try_from(value.len()).unwrap_or(u16::MAX).to_be_bytes());
    out.extend_from_slice(value);
}
