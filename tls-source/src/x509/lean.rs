//! A lean reader of the certificates rotation sees every day: one pass over the DER, reading
//! only the fields [`LeafInfo`] holds, with no allocation beyond them.
//!
//! It declines (returns `None`) anything it does not recognise as the plain, canonical form:
//! non-minimal lengths, unique identifiers, a malformed or duplicated extension among the
//! ones it reads, a name attribute outside the common set, a time in another format. A
//! declined certificate goes to x509-parser ([`super::full`]), which gives the verdict and
//! the error message; so this reader only ever accepts certificates x509-parser accepts too,
//! and says the same about them (a property test mutates certificates to hold it to that).
//! Why: a rotation parses its leaf on the way to the swap, and x509-parser's full parse cost
//! about 40 µs there with cold caches (this reader, a few).

use std::net::IpAddr;

use super::{ExtendedKeyUsage, LeafInfo, from_unix};

/// DER tags used below.
const SEQUENCE: u8 = 0x30;
const SET: u8 = 0x31;
const INTEGER: u8 = 0x02;
const BIT_STRING: u8 = 0x03;
const OCTET_STRING: u8 = 0x04;
const OID: u8 = 0x06;
const BOOLEAN: u8 = 0x01;
const UTC_TIME: u8 = 0x17;
const GENERALIZED_TIME: u8 = 0x18;
const VERSION: u8 = 0xa0;
const EXTENSIONS: u8 = 0xa3;
const DNS_NAME: u8 = 0x82;
const IP_ADDRESS: u8 = 0x87;

/// Extension OIDs (content octets).
const SUBJECT_ALT_NAME: &[u8] = &[0x55, 0x1d, 0x11];
const EXTENDED_KEY_USAGE: &[u8] = &[0x55, 0x1d, 0x25];
const BASIC_CONSTRAINTS: &[u8] = &[0x55, 0x1d, 0x13];
const SERVER_AUTH: &[u8] = &[0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x03, 0x01];
const CLIENT_AUTH: &[u8] = &[0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x03, 0x02];
const ANY_EXTENDED_KEY_USAGE: &[u8] = &[0x55, 0x1d, 0x25, 0x00];

/// The name attributes written out here, as x509-parser writes them.
const ATTRIBUTES: &[(&[u8], &str)] = &[
    (&[0x55, 0x04, 0x03], "CN"),
    (&[0x55, 0x04, 0x06], "C"),
    (&[0x55, 0x04, 0x07], "L"),
    (&[0x55, 0x04, 0x08], "ST"),
    (&[0x55, 0x04, 0x0a], "O"),
    (&[0x55, 0x04, 0x0b], "OU"),
    (
        &[0x09, 0x92, 0x26, 0x89, 0x93, 0xf2, 0x2c, 0x64, 0x01, 0x19],
        "DC",
    ),
    (
        &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x09, 0x01],
        "Email",
    ),
];

/// DER input being read, front to back.
#[derive(Clone, Copy)]
struct Der<'a>(&'a [u8]);

impl<'a> Der<'a> {
    fn is_empty(self) -> bool {
        self.0.is_empty()
    }

    fn peek(self) -> Option<u8> {
        self.0.first().copied()
    }

    /// The next TLV: its tag, its content and its whole encoding. Lengths must be minimal
    /// (DER) and definite.
    fn any(&mut self) -> Option<(u8, &'a [u8], &'a [u8])> {
        let input = self.0;
        let (&tag, rest) = input.split_first()?;
        // Multi-byte tags are not used by anything read here.
        if tag & 0x1f == 0x1f {
            return None;
        }
        let (&first, mut rest) = rest.split_first()?;
        let len = if first < 0x80 {
            usize::from(first)
        } else {
            let count = usize::from(first & 0x7f);
            if count == 0 || count > 4 || rest.len() < count {
                return None;
            }
            let (bytes, after) = rest.split_at(count);
            rest = after;
            if bytes[0] == 0 {
                return None;
            }
            let len = bytes.iter().fold(0usize, |n, b| n << 8 | usize::from(*b));
            if len < 0x80 {
                return None;
            }
            len
        };
        if rest.len() < len {
            return None;
        }
        let (content, after) = rest.split_at(len);
        let whole = &input[..input.len() - after.len()];
        self.0 = after;
        Some((tag, content, whole))
    }

    /// The content of the one TLV `input` holds, if its tag is `tag`: nothing may follow it.
    fn sole(input: &'a [u8], tag: u8) -> Option<Self> {
        let mut outer = Self(input);
        let content = outer.expect(tag)?;
        outer.is_empty().then_some(Self(content))
    }

    /// The next TLV's content, if its tag is `tag`.
    fn expect(&mut self, tag: u8) -> Option<&'a [u8]> {
        let (got, content, _) = self.any()?;
        (got == tag).then_some(content)
    }

    /// The next TLV's content and whole encoding, if its tag is `tag`.
    fn expect_whole(&mut self, tag: u8) -> Option<(&'a [u8], &'a [u8])> {
        let (got, content, whole) = self.any()?;
        (got == tag).then_some((content, whole))
    }
}

/// Reads `der` as one certificate, or declines.
pub(super) fn parse(der: &[u8]) -> Option<LeafInfo> {
    let mut certificate = Der::sole(der, SEQUENCE)?;
    let tbs = certificate.expect(SEQUENCE)?;
    let (_, outer_algorithm) = certificate.expect_whole(SEQUENCE)?;
    algorithm(outer_algorithm)?;
    let signature = certificate.expect(BIT_STRING)?;
    if signature.first() != Some(&0) || !certificate.is_empty() {
        return None;
    }

    let mut tbs = Der(tbs);
    let mut v3 = false;
    if tbs.peek() == Some(VERSION) {
        let mut version = Der(tbs.expect(VERSION)?);
        let number = version.expect(INTEGER)?;
        // v2 or v3 (v1 is the default, so DER leaves it out).
        if !version.is_empty() || !matches!(number, [1] | [2]) {
            return None;
        }
        v3 = number == [2];
    }
    let serial = tbs.expect(INTEGER)?;
    if serial.is_empty() {
        return None;
    }
    let (_, inner_algorithm) = tbs.expect_whole(SEQUENCE)?;
    if inner_algorithm != outer_algorithm {
        return None;
    }
    let (issuer, issuer_der) = tbs.expect_whole(SEQUENCE)?;
    let mut validity = Der(tbs.expect(SEQUENCE)?);
    let not_before = time(&mut validity)?;
    let not_after = time(&mut validity)?;
    if !validity.is_empty() {
        return None;
    }
    let (subject, subject_der) = tbs.expect_whole(SEQUENCE)?;
    let (spki, spki_der) = tbs.expect_whole(SEQUENCE)?;
    let mut spki = Der(spki);
    algorithm(spki.expect_whole(SEQUENCE)?.1)?;
    let key = spki.expect(BIT_STRING)?;
    if key.first() != Some(&0) || key.len() < 2 || !spki.is_empty() {
        return None;
    }

    let mut info = LeafInfo {
        subject: name(subject)?,
        dns_names: Vec::new(),
        ip_addresses: Vec::new(),
        not_before: from_unix(not_before),
        not_after: from_unix(not_after),
        spki_der: spki_der.to_vec(),
        is_ca: false,
        issuer: name(issuer)?,
        subject_der: subject_der.to_vec(),
        issuer_der: issuer_der.to_vec(),
        extended_key_usage: None,
    };
    if v3 && tbs.peek() == Some(EXTENSIONS) {
        extensions(Der::sole(tbs.expect(EXTENSIONS)?, SEQUENCE)?, &mut info)?;
    }
    // Unique identifiers, or anything after the extensions: declined.
    tbs.is_empty().then_some(info)
}

/// An `AlgorithmIdentifier`: an OID and, optionally, one parameter.
fn algorithm(whole: &[u8]) -> Option<()> {
    let mut algorithm = Der::sole(whole, SEQUENCE)?;
    oid(algorithm.expect(OID)?)?;
    if !algorithm.is_empty() {
        algorithm.any()?;
    }
    algorithm.is_empty().then_some(())
}

/// An OID's content octets: not empty, each arc minimally encoded and complete.
fn oid(content: &[u8]) -> Option<&[u8]> {
    let last = *content.last()?;
    let mut arc_start = true;
    for &byte in content {
        if arc_start && byte == 0x80 {
            return None;
        }
        arc_start = byte & 0x80 == 0;
    }
    (last & 0x80 == 0).then_some(content)
}

/// A `Name` as x509-parser writes it: `CN=a, O=b`, the attributes of a multi-valued RDN joined
/// by ` + `. Declines attributes outside [`ATTRIBUTES`] and values that are not plain strings.
fn name(content: &[u8]) -> Option<String> {
    let mut rdns = Der(content);
    let mut out = String::new();
    while !rdns.is_empty() {
        let mut set = Der(rdns.expect(SET)?);
        if set.is_empty() {
            return None;
        }
        if !out.is_empty() {
            out.push_str(", ");
        }
        let mut first = true;
        while !set.is_empty() {
            let mut attribute = Der(set.expect(SEQUENCE)?);
            let kind = oid(attribute.expect(OID)?)?;
            let (tag, value, _) = attribute.any()?;
            if !attribute.is_empty() {
                return None;
            }
            let abbrev = ATTRIBUTES.iter().find(|(o, _)| *o == kind)?.1;
            // UTF8String, PrintableString, IA5String: the string types certificates use.
            if !matches!(tag, 0x0c | 0x13 | 0x16) {
                return None;
            }
            let value = std::str::from_utf8(value).ok()?;
            if !first {
                out.push_str(" + ");
            }
            first = false;
            out.push_str(abbrev);
            out.push('=');
            out.push_str(value);
        }
    }
    Some(out)
}

/// A `Time`: `UTCTime` `YYMMDDHHMMSSZ` (years 1950 to 2049) or `GeneralizedTime`
/// `YYYYMMDDHHMMSSZ`, as seconds since the Unix epoch.
fn time(input: &mut Der<'_>) -> Option<i64> {
    let (tag, content, _) = input.any()?;
    let (year, rest) = match (tag, content.len()) {
        (UTC_TIME, 13) => {
            let yy = digits(&content[..2])?;
            (if yy < 50 { 2000 + yy } else { 1900 + yy }, &content[2..])
        }
        (GENERALIZED_TIME, 15) => (digits(&content[..4])?, &content[4..]),
        _ => return None,
    };
    if rest[10] != b'Z' {
        return None;
    }
    let field = |at: usize| digits(&rest[at..at + 2]).and_then(|n| u8::try_from(n).ok());
    let month = time::Month::try_from(field(0)?).ok()?;
    // The calendar (days in the month, leap years) and the clock's ranges are the time crate's;
    // a leap second (60) is declined.
    let date = time::Date::from_calendar_date(i32::try_from(year).ok()?, month, field(2)?).ok()?;
    let at = date.with_hms(field(4)?, field(6)?, field(8)?).ok()?;
    Some(at.assume_utc().unix_timestamp())
}

fn digits(bytes: &[u8]) -> Option<i64> {
    bytes.iter().try_fold(0i64, |n, b| {
        b.is_ascii_digit().then(|| n * 10 + i64::from(b - b'0'))
    })
}

/// The extensions: subject alternative names, extended key usage and basic constraints read,
/// the others only checked to be well-formed; no OID twice.
fn extensions(mut list: Der<'_>, info: &mut LeafInfo) -> Option<()> {
    let mut seen: Vec<&[u8]> = Vec::new();
    if list.is_empty() {
        return None;
    }
    while !list.is_empty() {
        let mut extension = Der(list.expect(SEQUENCE)?);
        let id = oid(extension.expect(OID)?)?;
        if seen.contains(&id) {
            return None;
        }
        seen.push(id);
        if extension.peek() == Some(BOOLEAN) {
            // DER leaves out the default (not critical).
            if extension.expect(BOOLEAN)? != [0xff] {
                return None;
            }
        }
        let value = extension.expect(OCTET_STRING)?;
        if !extension.is_empty() {
            return None;
        }
        match id {
            SUBJECT_ALT_NAME => alt_names(value, info)?,
            EXTENDED_KEY_USAGE => info.extended_key_usage = Some(key_usage(value)?),
            BASIC_CONSTRAINTS => info.is_ca = basic_constraints(value)?,
            _ => {}
        }
    }
    Some(())
}

fn alt_names(value: &[u8], info: &mut LeafInfo) -> Option<()> {
    let mut names = Der::sole(value, SEQUENCE)?;
    if names.is_empty() {
        return None;
    }
    while !names.is_empty() {
        let (tag, content, _) = names.any()?;
        match tag {
            DNS_NAME if content.is_ascii() => {
                info.dns_names
                    .push(std::str::from_utf8(content).ok()?.to_owned());
            }
            IP_ADDRESS => match content.len() {
                4 => info
                    .ip_addresses
                    .push(IpAddr::from(<[u8; 4]>::try_from(content).ok()?)),
                16 => info
                    .ip_addresses
                    .push(IpAddr::from(<[u8; 16]>::try_from(content).ok()?)),
                _ => return None,
            },
            // Other kinds of names (e-mail, URI, directory name, ...) are not read here.
            _ => return None,
        }
    }
    Some(())
}

fn key_usage(value: &[u8]) -> Option<ExtendedKeyUsage> {
    let mut purposes = Der::sole(value, SEQUENCE)?;
    if purposes.is_empty() {
        return None;
    }
    let mut usage = ExtendedKeyUsage {
        server_auth: false,
        client_auth: false,
        any: false,
    };
    while !purposes.is_empty() {
        match oid(purposes.expect(OID)?)? {
            SERVER_AUTH => usage.server_auth = true,
            CLIENT_AUTH => usage.client_auth = true,
            ANY_EXTENDED_KEY_USAGE => usage.any = true,
            _ => return None,
        }
    }
    Some(usage)
}

fn basic_constraints(value: &[u8]) -> Option<bool> {
    let mut constraints = Der::sole(value, SEQUENCE)?;
    let ca = if constraints.peek() == Some(BOOLEAN) {
        if constraints.expect(BOOLEAN)? != [0xff] {
            return None;
        }
        true
    } else {
        false
    };
    if !constraints.is_empty() {
        // pathLenConstraint: a small non-negative INTEGER, minimally encoded.
        let length = constraints.expect(INTEGER)?;
        let minimal = match length {
            [first, second, ..] => !(*first == 0 && second & 0x80 == 0),
            [_] => true,
            [] => false,
        };
        if !ca || !minimal || length.len() > 4 || length[0] & 0x80 != 0 {
            return None;
        }
        if !constraints.is_empty() {
            return None;
        }
    }
    Some(ca)
}
