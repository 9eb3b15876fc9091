//! DNS-01 on any standard DNS server: RFC 2136 dynamic updates signed with TSIG (RFC 8945), as
//! BIND, Knot, `PowerDNS` and Windows DNS accept them (feature `rfc2136`).
//!
//! For each record the CA asks for, [`Rfc2136`]:
//! 1. follows a CNAME at `_acme-challenge.<name>` into another zone (up to 8 steps, as
//!    cert-manager's `cnameStrategy: Follow`): asked of the update server, then of the
//!    resolvers of `/etc/resolv.conf` when that server does not hold the name's zone;
//! 2. finds the zone of the record (the SOA the update server answers with);
//! 3. adds the TXT value to the record, a TXT record of its own: an apex and its wildcard put
//!    two values at one name, and a value of anyone else's stays;
//! 4. returns once every authoritative server of the zone (its NS set, asked on the update
//!    server's port, and the update server) answers the value, so the CA finds it.
//!
//! Clean-up deletes that one value, never the record set. What was published is stored with the
//! ACME state before the update is sent, so a restart removes what the last run left, and
//! nothing else. Updates are signed, and an answer is trusted only when its signature verifies.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use tls_acme::rfc2136::{Rfc2136, TsigKey};
//!
//! // Made with `tsig-keygen acme-update > /etc/acme/acme-update.key` (mode 600).
//! let key = TsigKey::from_file("/etc/acme/acme-update.key")?;
//! let solver = Rfc2136::new("ns1.example.com:53", key)?;
//! let acme = tls_acme::Acme::builder("https://acme-v02.api.letsencrypt.org/directory")
//!     .name("*.example.com")
//!     .challenge(tls_acme::ChallengeType::Dns01)
//!     .dns01_solver(Arc::new(solver))
//!     .state_dir("/var/lib/acme")
//!     .build()?;
//! # drop(acme); Ok(()) }
//! ```
//!
//! The zone's `update-policy` need allow no more than the challenge records, e.g. in BIND:
//! `update-policy { grant acme-update name _acme-challenge.example.com. TXT; };`
//! (a wildcard's record is its parent's, `_acme-challenge.example.com.` for
//! `*.example.com`).

mod key;
mod wire;

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::op::{Message, ResponseCode, update_message};
use hickory_proto::rr::rdata::TXT;
use hickory_proto::rr::{Name, RData, Record, RecordSet, RecordType, TSigner};

pub use key::{KeyFileError, TsigKey};

use tls_source::clock::{Clock, SystemClock};

use crate::challenge::{Dns01Solver, SolverFuture};

/// How many CNAMEs are followed from `_acme-challenge.<name>` before giving up.
const MAX_CNAMES: usize = 8;

/// A [`Dns01Solver`] that publishes the challenge records by RFC 2136 dynamic update, signed
/// with a TSIG key (see the [module docs](self)).
#[derive(Clone)]
pub struct Rfc2136 {
    server: String,
    /// The key's name, algorithm and secret.
    signer: TSigner,
    /// The time the updates are signed at (the server refuses one off by more than the fudge,
    /// 300 s: BADTIME).
    clock: Arc<dyn Clock>,
    ttl: u32,
    timeout: Duration,
    propagation_timeout: Duration,
    check_interval: Duration,
    resolvers: Option<Vec<SocketAddr>>,
}

impl fmt::Debug for Rfc2136 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rfc2136")
            .field("server", &self.server)
            .field("key", &self.signer.signer_name().to_ascii())
            .field("algorithm", &self.signer.algorithm().to_string())
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

impl Rfc2136 {
    /// Updates go to `server` (`HOST:PORT`, or `HOST` for port 53: the zone's primary), signed
    /// with `key`.
    ///
    /// # Errors
    /// A server that is not `HOST[:PORT]`, or a key the TSIG signer refuses.
    pub fn new(server: impl Into<String>, key: TsigKey) -> Result<Self, String> {
        let server = with_port(server.into())?;
        let name = key.name();
        // The key moves into the signer: one copy of the secret.
        let signer = TSigner::new(key.secret, key.algorithm, key.name, 300)
            .map_err(|e| format!("the TSIG key {name}: {e}"))?;
        Ok(Self {
            server,
            signer,
            clock: Arc::new(SystemClock),
            ttl: 60,
            timeout: Duration::from_secs(10),
            propagation_timeout: Duration::from_secs(120),
            check_interval: Duration::from_secs(2),
            resolvers: None,
        })
    }

    /// The TTL of the records published. Default: 60 seconds.
    #[must_use]
    pub fn ttl(mut self, seconds: u32) -> Self {
        self.ttl = seconds;
        self
    }

    /// How long one exchange with a server may take. Default: 10 seconds.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How long to wait for every authoritative server to answer a new record, and how often
    /// to ask (10 ms to a minute). Default: 120 seconds, every 2.
    #[must_use]
    pub fn propagation(mut self, timeout: Duration, interval: Duration) -> Self {
        self.propagation_timeout = timeout;
        self.check_interval = interval.clamp(Duration::from_millis(10), Duration::from_secs(60));
        self
    }

    /// The clock the updates are signed with. Default: the system's.
    #[must_use]
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The recursive resolvers asked for a CNAME at `_acme-challenge.<name>` when the update
    /// server does not hold the name's zone. Default: the `nameserver`s of `/etc/resolv.conf`.
    #[must_use]
    pub fn resolvers(mut self, resolvers: Vec<SocketAddr>) -> Self {
        self.resolvers = Some(resolvers);
        self
    }

    async fn server(&self) -> Result<SocketAddr, String> {
        tokio::net::lookup_host(&self.server)
            .await
            .map_err(|e| format!("the DNS server {}: {e}", self.server))?
            .next()
            .ok_or_else(|| format!("the DNS server {}: no address", self.server))
    }

    /// The name the record is published at: `record`, or where its CNAMEs lead.
    async fn target(&self, server: SocketAddr, record: &Name) -> Result<Name, String> {
        let mut name = record.clone();
        for _ in 0..=MAX_CNAMES {
            match self.cname(server, &name).await? {
                Some(next) if next != name => name = next,
                _ => return Ok(name),
            }
        }
        Err(format!(
            "{record}: more than {MAX_CNAMES} CNAMEs from it (a loop?)"
        ))
    }

    /// The CNAME at `name`, asked of the update server, or of the resolvers when that server
    /// does not hold its zone.
    async fn cname(&self, server: SocketAddr, name: &Name) -> Result<Option<Name>, String> {
        let answer = wire::query(server, name, RecordType::CNAME, false, self.timeout).await?;
        if matches!(
            answer.metadata.response_code,
            ResponseCode::NoError | ResponseCode::NXDomain
        ) && answer.metadata.authoritative
        {
            return Ok(cname_in(&answer, name));
        }
        let resolvers = match &self.resolvers {
            Some(resolvers) => resolvers.clone(),
            None => system_resolvers(),
        };
        let mut errors = Vec::new();
        for resolver in resolvers {
            match wire::query(resolver, name, RecordType::CNAME, true, self.timeout).await {
                Ok(answer)
                    if matches!(
                        answer.metadata.response_code,
                        ResponseCode::NoError | ResponseCode::NXDomain
                    ) =>
                {
                    return Ok(cname_in(&answer, name));
                }
                Ok(answer) => errors.push(format!("{resolver}: {}", answer.metadata.response_code)),
                Err(e) => errors.push(e),
            }
        }
        // Not ours, and no resolver knows: the zone lookup will say the server does not hold it.
        tracing::debug!(%name, errors = ?errors, "no CNAME answer for the challenge record");
        Ok(None)
    }

    /// The zone holding `name` on the update server: the owner of the SOA it answers with.
    async fn zone(&self, server: SocketAddr, name: &Name) -> Result<Name, String> {
        let answer = wire::query(server, name, RecordType::SOA, false, self.timeout).await?;
        let code = answer.metadata.response_code;
        if matches!(code, ResponseCode::NoError | ResponseCode::NXDomain) {
            let soa = answer
                .answers
                .iter()
                .chain(&answer.authorities)
                .find(|r| r.record_type() == RecordType::SOA && r.name.zone_of(name));
            if let Some(soa) = soa {
                return Ok(soa.name.clone());
            }
        }
        Err(format!(
            "the DNS server {server} holds no zone for {name} (it answered {code} with no SOA)"
        ))
    }

    /// The zone's authoritative servers: the update server and its NS set's addresses (in the
    /// zone's own records, else the system's), on the update server's port.
    async fn authoritative(&self, server: SocketAddr, zone: &Name) -> Vec<SocketAddr> {
        let mut servers = vec![server];
        let Ok(answer) = wire::query(server, zone, RecordType::NS, false, self.timeout).await
        else {
            return servers;
        };
        for ns in answer.answers.iter().filter_map(|r| match &r.data {
            RData::NS(ns) => Some(ns.0.clone()),
            _ => None,
        }) {
            let mut addresses = Vec::new();
            for kind in [RecordType::A, RecordType::AAAA] {
                if let Ok(answer) = wire::query(server, &ns, kind, false, self.timeout).await {
                    addresses.extend(answer.answers.iter().filter_map(|r| match &r.data {
                        RData::A(a) => Some(SocketAddr::new(a.0.into(), server.port())),
                        RData::AAAA(a) => Some(SocketAddr::new(a.0.into(), server.port())),
                        _ => None,
                    }));
                }
            }
            if addresses.is_empty()
                && let Ok(found) =
                    tokio::net::lookup_host((ns.to_ascii().trim_end_matches('.'), server.port()))
                        .await
            {
                addresses.extend(found);
            }
            if addresses.is_empty() {
                tracing::warn!(zone = %zone, ns = %ns, "a name server of the zone has no address: not checked");
            }
            servers.extend(addresses);
        }
        servers.sort_unstable();
        servers.dedup();
        servers
    }

    /// Returns once every server answers `value` at `name`.
    async fn until_answered(
        &self,
        servers: Vec<SocketAddr>,
        name: &Name,
        value: &str,
    ) -> Result<(), String> {
        // None: a timeout beyond the clock's range, so no deadline.
        let deadline = tokio::time::Instant::now().checked_add(self.propagation_timeout);
        let mut waiting = servers;
        loop {
            let mut still = Vec::new();
            for server in waiting {
                let answered =
                    match wire::query(server, name, RecordType::TXT, false, self.timeout).await {
                        Ok(answer) => answer.answers.iter().any(|r| txt_is(r, value)),
                        Err(_) => false,
                    };
                if !answered {
                    still.push(server);
                }
            }
            if still.is_empty() {
                return Ok(());
            }
            if deadline.is_some_and(|deadline| tokio::time::Instant::now() >= deadline) {
                let missing: Vec<_> = still.iter().map(ToString::to_string).collect();
                return Err(format!(
                    "{name}: the new TXT value is not answered by {} after {:?}",
                    missing.join(", "),
                    self.propagation_timeout
                ));
            }
            waiting = still;
            tokio::time::sleep(self.check_interval).await;
        }
    }

    fn rrset(&self, name: &Name, value: &str) -> RecordSet {
        let mut rrset = RecordSet::with_ttl(name.clone(), RecordType::TXT, self.ttl);
        rrset.add_rdata(RData::TXT(TXT::new(vec![value.to_owned()])));
        rrset
    }

    /// The update server's address, where `record` is published (its CNAMEs followed), and
    /// that name's zone.
    async fn locate(&self, record: &str) -> Result<(SocketAddr, Name, Name), String> {
        let server = self.server().await?;
        let name = self.target(server, &fqdn(record)?).await?;
        let zone = self.zone(server, &name).await?;
        Ok((server, name, zone))
    }

    /// Sends `message`, signed at the clock's time, to `server` for `zone`.
    async fn update(
        &self,
        server: SocketAddr,
        zone: &Name,
        message: Message,
    ) -> Result<(), String> {
        wire::update(
            server,
            zone,
            message,
            &self.signer,
            self.clock.now(),
            self.timeout,
        )
        .await
    }

    async fn publish(&self, record: &str, value: &str) -> Result<(), String> {
        let (server, name, zone) = self.locate(record).await?;
        let message = update_message::append(self.rrset(&name, value), zone.clone(), false, false);
        self.update(server, &zone, message).await?;
        tracing::info!(record = %name, zone = %zone, server = %server, "DNS-01 record added");
        let servers = self.authoritative(server, &zone).await;
        self.until_answered(servers, &name, value).await
    }

    async fn remove(&self, record: &str, value: &str) -> Result<(), String> {
        let (server, name, zone) = self.locate(record).await?;
        let message =
            update_message::delete_by_rdata(self.rrset(&name, value), zone.clone(), false);
        self.update(server, &zone, message).await?;
        tracing::info!(record = %name, zone = %zone, server = %server, "DNS-01 record removed");
        Ok(())
    }
}

impl Dns01Solver for Rfc2136 {
    fn present<'a>(&'a self, record: &'a str, value: &'a str) -> SolverFuture<'a> {
        Box::pin(async move { self.publish(record, value).await.map_err(Into::into) })
    }

    fn clean_up<'a>(&'a self, record: &'a str, value: &'a str) -> SolverFuture<'a> {
        Box::pin(async move { self.remove(record, value).await.map_err(Into::into) })
    }
}

/// `HOST:PORT`, with port 53 added to a bare host (an IPv6 address with a port in brackets).
fn with_port(server: String) -> Result<String, String> {
    if server.parse::<SocketAddr>().is_ok() {
        return Ok(server);
    }
    if let Ok(ip) = server.parse::<std::net::IpAddr>() {
        return Ok(SocketAddr::new(ip, 53).to_string());
    }
    match server.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && !host.contains(':') => {
            port.parse::<u16>()
                .map_err(|_| format!("the DNS server {server:?}: the port is not a number"))?;
            Ok(server)
        }
        None if !server.is_empty() => Ok(format!("{server}:53")),
        _ => Err(format!("the DNS server {server:?}: HOST:PORT is needed")),
    }
}

fn fqdn(record: &str) -> Result<Name, String> {
    let mut name = Name::from_ascii(record).map_err(|e| format!("{record}: {e}"))?;
    name.set_fqdn(true);
    Ok(name)
}

fn cname_in(answer: &Message, name: &Name) -> Option<Name> {
    answer.answers.iter().find_map(|r| match &r.data {
        RData::CNAME(target) if r.name == *name => Some(target.0.clone()),
        _ => None,
    })
}

fn txt_is(record: &Record, value: &str) -> bool {
    match &record.data {
        RData::TXT(txt) => txt.txt_data.concat() == value.as_bytes(),
        _ => false,
    }
}

/// The `nameserver`s of `/etc/resolv.conf`, on port 53.
fn system_resolvers() -> Vec<SocketAddr> {
    std::fs::read_to_string("/etc/resolv.conf")
        .map(|text| {
            text.lines()
                .filter_map(|line| line.trim().strip_prefix("nameserver"))
                .filter_map(|address| address.trim().parse::<std::net::IpAddr>().ok())
                .map(|ip| SocketAddr::new(ip, 53))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_check_interval_is_clamped_and_the_secret_is_not_shown() {
        let key = TsigKey::new("acme-update", "hmac-sha256", b"top-secret-bytes".to_vec()).unwrap();
        let solver = Rfc2136::new("192.0.2.1", key)
            .unwrap()
            .propagation(Duration::MAX, Duration::MAX);
        assert_eq!(
            solver.check_interval,
            Duration::from_secs(60),
            "re-armed every minute"
        );
        let debug = format!("{solver:?}");
        assert!(
            debug.contains("acme-update") && debug.contains("hmac-sha256"),
            "{debug}"
        );
        assert!(
            !debug.contains("top-secret") && !debug.contains("116, 111, 112"),
            "{debug}"
        );
    }

    #[test]
    fn a_server_gets_port_53_unless_it_names_one() {
        assert_eq!(
            with_port("ns1.example.com".into()).unwrap(),
            "ns1.example.com:53"
        );
        assert_eq!(
            with_port("ns1.example.com:5353".into()).unwrap(),
            "ns1.example.com:5353"
        );
        assert_eq!(with_port("192.0.2.1".into()).unwrap(), "192.0.2.1:53");
        assert_eq!(with_port("2001:db8::1".into()).unwrap(), "[2001:db8::1]:53");
        assert_eq!(
            with_port("[2001:db8::1]:5353".into()).unwrap(),
            "[2001:db8::1]:5353"
        );
        let error = with_port("ns1.example.com:dns".into()).unwrap_err();
        assert!(error.contains("port"), "{error}");
        assert!(with_port(String::new()).is_err());
    }
}
