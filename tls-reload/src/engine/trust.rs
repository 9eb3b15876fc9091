//! The client CAs the server trusts, as a set that only decides: which CAs are in, which are
//! leaving and when, and whether the config must be rebuilt. Building and storing the config is
//! the task's ([`TrustConfig`](crate::client_auth::TrustConfig)).

use std::time::{Duration, SystemTime};

use rustls::pki_types::CertificateDer;

use crate::status::TrustedCa;

/// What a trust source yields: the CA certificates to trust now, or why it cannot say.
pub type TrustItem = Result<Vec<CertificateDer<'static>>, tls_source::Error>;

/// A CA the server trusts, and, once it left the bundle, until when.
#[derive(Debug, Clone)]
struct Ca {
    der: CertificateDer<'static>,
    fingerprint: String,
    leaves_at: Option<SystemTime>,
}

/// The trusted client CAs.
#[derive(Debug)]
pub(crate) struct TrustSet {
    cas: Vec<Ca>,
    overlap: Duration,
    /// The trust is the served bundle's CA certificates (no source of its own).
    from_bundle: bool,
}

/// What a change of the set asks of the config.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Change {
    /// The trusted roots changed: the config is rebuilt.
    pub(crate) rebuild: bool,
    /// A CA left: no session from before may be resumed.
    pub(crate) invalidate: bool,
    /// The fingerprints of the CAs that left.
    pub(crate) left: Vec<String>,
}

impl TrustSet {
    /// Nothing trusted yet: every client is refused until the first CAs come.
    pub(crate) fn new(overlap: Duration, from_bundle: bool) -> Self {
        Self {
            cas: Vec::new(),
            overlap,
            from_bundle,
        }
    }

    /// Whether the trust is the served bundle's CA certificates.
    pub(crate) fn is_the_bundles(&self) -> bool {
        self.from_bundle
    }

    /// The CAs to trust from now: new ones are in at once, missing ones leave after the overlap.
    pub(crate) fn set(&mut self, cas: &[CertificateDer<'static>], now: SystemTime) -> Change {
        let mut change = Change::default();
        for ca in &mut self.cas {
            let kept = cas.contains(&ca.der);
            match (kept, ca.leaves_at) {
                (true, Some(_)) => {
                    ca.leaves_at = None;
                    change.rebuild = true;
                }
                (false, None) => {
                    // Saturating: `overlap(Duration::MAX)` keeps it until the year 9999.
                    ca.leaves_at = Some(tls_source::clock::saturating_add(now, self.overlap));
                    change.rebuild = true;
                }
                _ => {}
            }
        }
        for der in cas {
            if !self.cas.iter().any(|ca| &ca.der == der) {
                self.cas.push(Ca {
                    fingerprint: tls_source::Digest::of(der).to_string(),
                    der: der.clone(),
                    leaves_at: None,
                });
                change.rebuild = true;
            }
        }
        if self.overlap.is_zero() {
            self.drop_left(now, &mut change);
        }
        change
    }

    /// Drops the CAs whose overlap is over by `now`.
    pub(crate) fn expire(&mut self, now: SystemTime) -> Change {
        let mut change = Change::default();
        self.drop_left(now, &mut change);
        change
    }

    /// When the next leaving CA must be dropped, if any.
    pub(crate) fn next_leave(&self) -> Option<SystemTime> {
        self.cas.iter().filter_map(|ca| ca.leaves_at).min()
    }

    /// Whether any CA is trusted (before the first, every client is refused).
    pub(crate) fn trusts_any(&self) -> bool {
        !self.cas.is_empty()
    }

    /// The CAs trusted now, as roots.
    pub(crate) fn roots(&self) -> Vec<CertificateDer<'static>> {
        self.cas.iter().map(|ca| ca.der.clone()).collect()
    }

    /// The trusted CAs, for the status.
    pub(crate) fn status(&self) -> Vec<TrustedCa> {
        self.cas
            .iter()
            .map(|ca| TrustedCa {
                fingerprint_sha256: ca.fingerprint.clone(),
                leaves_at: ca.leaves_at,
            })
            .collect()
    }

    fn drop_left(&mut self, now: SystemTime, change: &mut Change) {
        self.cas.retain(|ca| {
            let gone = ca.leaves_at.is_some_and(|at| at <= now);
            if gone {
                change.left.push(ca.fingerprint.clone());
            }
            !gone
        });
        if !change.left.is_empty() {
            change.rebuild = true;
            change.invalidate = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tls_test::TestCa;

    fn der(ca: &TestCa) -> CertificateDer<'static> {
        ca.cert_der()
    }

    const T0: SystemTime = SystemTime::UNIX_EPOCH;

    #[test]
    fn a_ca_that_leaves_the_bundle_is_trusted_until_the_overlap_ends() {
        let (old, new) = (der(&TestCa::new("old")), der(&TestCa::new("new")));
        let mut set = TrustSet::new(Duration::from_secs(60), true);
        assert!(!set.trusts_any());
        assert!(set.set(std::slice::from_ref(&old), T0).rebuild);
        let change = set.set(std::slice::from_ref(&new), T0 + Duration::from_secs(10));
        assert!(change.rebuild && !change.invalidate);
        assert_eq!(set.roots().len(), 2);
        let leaves = T0 + Duration::from_secs(70);
        assert_eq!(set.next_leave(), Some(leaves));

        let early = set.expire(leaves - Duration::from_millis(1));
        assert_eq!(early, Change::default());
        let change = set.expire(leaves);
        assert!(change.rebuild && change.invalidate);
        assert_eq!(change.left, [tls_source::Digest::of(&old).to_string()]);
        assert_eq!(set.roots(), [new]);
        assert_eq!(set.next_leave(), None);
    }

    #[test]
    fn a_ca_that_comes_back_before_it_left_stays() {
        let (old, new) = (der(&TestCa::new("old")), der(&TestCa::new("new")));
        let mut set = TrustSet::new(Duration::from_secs(60), true);
        set.set(std::slice::from_ref(&old), T0);
        set.set(std::slice::from_ref(&new), T0);
        assert!(set.set(&[old.clone(), new], T0).rebuild);
        assert_eq!(set.next_leave(), None);
        assert_eq!(
            set.expire(T0 + Duration::from_secs(3600)),
            Change::default()
        );
        assert!(set.status().iter().all(|ca| ca.leaves_at.is_none()));
    }

    #[test]
    fn without_overlap_a_ca_leaves_at_once_and_sessions_go() {
        let (old, new) = (der(&TestCa::new("old")), der(&TestCa::new("new")));
        let mut set = TrustSet::new(Duration::ZERO, false);
        set.set(std::slice::from_ref(&old), T0);
        let change = set.set(std::slice::from_ref(&new), T0);
        assert!(change.invalidate);
        assert_eq!(set.roots(), [new]);
    }

    #[test]
    fn an_endless_overlap_ends_in_9999_not_in_a_panic() {
        let (old, new) = (der(&TestCa::new("old")), der(&TestCa::new("new")));
        let mut set = TrustSet::new(Duration::MAX, true);
        set.set(std::slice::from_ref(&old), T0);
        set.set(std::slice::from_ref(&new), tls_test::new_year(2030));
        assert_eq!(set.next_leave(), Some(tls_source::clock::latest()));
    }

    #[test]
    fn the_same_cas_again_change_nothing() {
        let ca = der(&TestCa::new("ca"));
        let mut set = TrustSet::new(Duration::from_secs(60), true);
        set.set(std::slice::from_ref(&ca), T0);
        assert_eq!(set.set(std::slice::from_ref(&ca), T0), Change::default());
    }
}
