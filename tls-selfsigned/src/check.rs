//! The generator's fit checks: whether a certificate found (on disk, in a Secret) can still be
//! served for this configuration, or why not ([`Unfit`]).

use std::net::IpAddr;

use rcgen::KeyPair;
use rustls_pki_types::PrivateKeyDer;
use tls_source::CertBundle;

use crate::SelfSigned;
use crate::fit::{Part, Unfit, check_times, key_matches, parse, signed_by};

impl SelfSigned {
    /// Whether a certificate and key (PEM, as found on disk; `None` when missing) can still be
    /// served for this configuration, or why not. See [`check_bundle`](Self::check_bundle).
    ///
    /// ```
    /// use tls_selfsigned::{SelfSigned, Unfit};
    ///
    /// let generator = SelfSigned::builder().dns_name("localhost").build().unwrap();
    /// let pem = generator.generate_pem().unwrap();
    /// assert_eq!(generator.check(Some(pem.cert_pem.as_bytes()), Some(pem.key_pem.as_bytes())), Ok(()));
    ///
    /// let wider = SelfSigned::builder().dns_name("localhost").dns_name("api.test").build().unwrap();
    /// let why = wider.check(Some(pem.cert_pem.as_bytes()), Some(pem.key_pem.as_bytes()));
    /// assert_eq!(why, Err(Unfit::MissingDnsNames(vec!["api.test".into()])));
    /// ```
    ///
    /// # Errors
    /// The first reason found, in the order of [`Unfit`]'s variants.
    pub fn check(&self, cert_pem: Option<&[u8]>, key_pem: Option<&[u8]>) -> Result<(), Unfit> {
        let cert_pem = cert_pem.ok_or(Unfit::Missing {
            what: Part::Certificate,
        })?;
        let key_pem = key_pem.ok_or(Unfit::Missing {
            what: Part::PrivateKey,
        })?;
        let decoder = tls_source::Decoder::new();
        let chain =
            decoder
                .certificates("certificate", cert_pem)
                .map_err(|e| Unfit::Unparsable {
                    what: Part::Certificate,
                    reason: e.to_string(),
                })?;
        let key = decoder
            .private_key("private key", key_pem)
            .map_err(|e| Unfit::Unparsable {
                what: Part::PrivateKey,
                reason: e.to_string(),
            })?;
        self.check_parts(&chain[0], &key)
    }

    /// Whether a bundle can still be served for this configuration, or why not: regenerate only
    /// when the key does not match, the certificate is expired or inside the renewal window, or
    /// the wanted names are not all on it (extra names are fine: a certificate that covers more is
    /// kept, so brief changes in the wanted set cause no churn). In CA mode the leaf must be
    /// signed by the current CA.
    ///
    /// # Errors
    /// The first reason found.
    pub fn check_bundle(&self, bundle: &CertBundle) -> Result<(), Unfit> {
        let leaf = bundle.leaf().ok_or(Unfit::Missing {
            what: Part::Certificate,
        })?;
        self.check_parts(leaf, bundle.key())
    }

    pub(crate) fn check_parts(&self, leaf: &[u8], key: &PrivateKeyDer<'_>) -> Result<(), Unfit> {
        let parsed = parse(leaf).map_err(|reason| Unfit::Unparsable {
            what: Part::Certificate,
            reason,
        })?;
        let key = KeyPair::try_from(key).map_err(|_| Unfit::Unparsable {
            what: Part::PrivateKey,
            reason: "not a PKCS#8 ECDSA, Ed25519 or RSA key".to_owned(),
        })?;
        if !key_matches(&key, &parsed) {
            return Err(Unfit::KeyMismatch);
        }
        check_times(
            parsed.not_before,
            parsed.not_after,
            self.clock.now(),
            self.renewal_window(),
        )?;
        let config = &self.config;
        let missing_dns: Vec<String> = config
            .dns_names
            .iter()
            .filter(|want| {
                !parsed
                    .dns_names
                    .iter()
                    .any(|have| have.eq_ignore_ascii_case(want))
            })
            .cloned()
            .collect();
        if !missing_dns.is_empty() {
            return Err(Unfit::MissingDnsNames(missing_dns));
        }
        let missing_ips: Vec<IpAddr> = config
            .ip_addresses
            .iter()
            .filter(|want| !parsed.ip_addresses.contains(want))
            .copied()
            .collect();
        if !missing_ips.is_empty() {
            return Err(Unfit::MissingIpAddresses(missing_ips));
        }
        let for_clients = parsed
            .extended_key_usage
            .is_none_or(|usage| usage.client_auth || usage.any);
        if config.client_auth && !for_clients {
            return Err(Unfit::NotForClients);
        }
        if self.is_ca_mode() {
            // Pure: the CA installed now, never one generated for the check.
            let ca = self.installed_ca().ok_or(Unfit::WrongIssuer)?;
            if !signed_by(leaf, &ca.cert_der) {
                return Err(Unfit::WrongIssuer);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use std::time::{Duration, SystemTime};

    use super::*;
    use tls_source::clock::SteppedClock;

    use crate::SelfSigned;

    fn generator(names: &[&str]) -> SelfSigned {
        names
            .iter()
            .fold(SelfSigned::builder(), |b, n| b.name(n))
            .validity(Duration::from_secs(90 * 86400))
            .build()
            .unwrap()
    }

    fn pem(g: &SelfSigned) -> (Vec<u8>, Vec<u8>) {
        let pair = g.generate_pem().unwrap();
        (pair.cert_pem.into_bytes(), pair.key_pem.into_bytes())
    }

    #[test]
    fn a_fresh_certificate_fits() {
        let g = generator(&["localhost", "127.0.0.1"]);
        let (cert, key) = pem(&g);
        assert_eq!(g.check(Some(&cert), Some(&key)), Ok(()));
        assert_eq!(g.check_bundle(&g.generate().unwrap()), Ok(()));
    }

    #[test]
    fn missing_and_unparsable() {
        let g = generator(&["localhost"]);
        let (cert, key) = pem(&g);
        assert_eq!(
            g.check(None, Some(&key)),
            Err(Unfit::Missing {
                what: Part::Certificate
            })
        );
        assert_eq!(
            g.check(Some(&cert), None),
            Err(Unfit::Missing {
                what: Part::PrivateKey
            })
        );
        let bad_cert = g.check(Some(b"junk"), Some(&key)).unwrap_err();
        assert!(
            matches!(
                bad_cert,
                Unfit::Unparsable {
                    what: Part::Certificate,
                    ..
                }
            ),
            "{bad_cert}"
        );
        let bad_key = g.check(Some(&cert), Some(b"junk")).unwrap_err();
        assert!(
            matches!(
                bad_key,
                Unfit::Unparsable {
                    what: Part::PrivateKey,
                    ..
                }
            ),
            "{bad_key}"
        );
    }

    #[test]
    fn a_key_from_another_pair_does_not_fit() {
        let g = generator(&["localhost"]);
        let (cert, _) = pem(&g);
        let (_, other_key) = pem(&g);
        assert_eq!(
            g.check(Some(&cert), Some(&other_key)),
            Err(Unfit::KeyMismatch)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn expired_and_renewal_due_follow_the_clock() {
        let clock = Arc::new(SteppedClock::starting_at(SystemTime::now()));
        let g = SelfSigned::builder()
            .dns_name("localhost")
            .validity(Duration::from_secs(90 * 86400))
            .clock(clock.clone())
            .build()
            .unwrap();
        let (cert, key) = pem(&g);
        clock.step(Duration::from_secs(59 * 86400));
        assert_eq!(
            g.check(Some(&cert), Some(&key)),
            Ok(()),
            "two thirds not yet used"
        );
        clock.step(Duration::from_secs(2 * 86400));
        let due = g.check(Some(&cert), Some(&key)).unwrap_err();
        assert!(matches!(due, Unfit::RenewalDue { .. }), "{due}");
        clock.step(Duration::from_secs(30 * 86400));
        let expired = g.check(Some(&cert), Some(&key)).unwrap_err();
        assert!(matches!(expired, Unfit::Expired { .. }), "{expired}");
    }

    #[test]
    fn wanted_names_must_be_on_it_extra_names_are_fine() {
        let wide = generator(&["localhost", "api.test", "127.0.0.1", "::1"]);
        let (cert, key) = pem(&wide);
        // Fewer wanted names than the certificate covers: kept.
        assert_eq!(
            generator(&["api.test", "::1"]).check(Some(&cert), Some(&key)),
            Ok(())
        );
        // Case does not matter for DNS names.
        assert_eq!(
            generator(&["API.test"]).check(Some(&cert), Some(&key)),
            Ok(())
        );
        assert_eq!(
            generator(&["localhost", "new.test"]).check(Some(&cert), Some(&key)),
            Err(Unfit::MissingDnsNames(vec!["new.test".into()]))
        );
        assert_eq!(
            generator(&["localhost", "10.0.0.1"]).check(Some(&cert), Some(&key)),
            Err(Unfit::MissingIpAddresses(vec!["10.0.0.1".parse().unwrap()]))
        );
    }

    #[test]
    fn leaves_for_clients_carry_client_auth_and_a_server_only_leaf_does_not_fit() {
        let server_only = generator(&["localhost"]);
        let for_clients = SelfSigned::builder()
            .name("localhost")
            .client_auth()
            .build()
            .unwrap();
        let (cert, key) = pem(&server_only);
        assert_eq!(server_only.check(Some(&cert), Some(&key)), Ok(()));
        assert_eq!(
            for_clients.check(Some(&cert), Some(&key)),
            Err(Unfit::NotForClients)
        );
        let (cert, key) = pem(&for_clients);
        assert_eq!(for_clients.check(Some(&cert), Some(&key)), Ok(()));
        // Both purposes: the same leaf still serves.
        assert_eq!(server_only.check(Some(&cert), Some(&key)), Ok(()));
        let leaf = tls_source::x509::LeafInfo::parse(
            &tls_source::Decoder::new()
                .certificates("leaf", &cert)
                .unwrap()[0],
        )
        .unwrap();
        let usage = leaf.extended_key_usage.unwrap();
        assert!(usage.server_auth && usage.client_auth);
    }

    #[test]
    fn in_ca_mode_a_leaf_of_another_ca_does_not_fit() {
        let ca_a = SelfSigned::builder()
            .dns_name("localhost")
            .ca()
            .build()
            .unwrap();
        let ca_b = SelfSigned::builder()
            .dns_name("localhost")
            .ca()
            .build()
            .unwrap();
        let leaf = ca_a.generate().unwrap();
        assert_eq!(ca_a.check_bundle(&leaf), Ok(()));
        assert_eq!(
            ca_b.check_bundle(&leaf),
            Err(Unfit::WrongIssuer),
            "no CA of its own yet"
        );
        assert!(ca_b.ca_pem().unwrap().is_some());
        assert_eq!(ca_b.check_bundle(&leaf), Err(Unfit::WrongIssuer));
    }

    #[test]
    fn the_check_is_pure_it_never_makes_a_ca() {
        let g = SelfSigned::builder()
            .dns_name("localhost")
            .ca()
            .build()
            .unwrap();
        let other = SelfSigned::builder().dns_name("localhost").build().unwrap();
        let (cert, key) = pem(&other);
        assert_eq!(g.check(Some(&cert), Some(&key)), Err(Unfit::WrongIssuer));
        assert!(g.installed_ca().is_none(), "checking generated a CA");
    }
}
