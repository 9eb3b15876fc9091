//! The status as JSON (feature `serde`): the shape the `serve` example answers on `GET /`, for a
//! status page or a script. Times are RFC 3339 in UTC to the second ([`Rfc3339`]), origins and
//! errors their text; a field with nothing to say is `null`.
//!
//! The shape is documented on [`Status`].

use std::sync::Arc;

use serde::ser::{Serialize, SerializeMap as _, Serializer};
use tls_source::clock::Rfc3339;

use crate::status::{CertInfo, RouteStatus, Status, TrustedCa};
use crate::{Ended, Error};

fn time(t: std::time::SystemTime) -> String {
    Rfc3339(t).to_string()
}

fn error(e: Option<&Arc<Error>>) -> Option<String> {
    e.map(ToString::to_string)
}

fn ips(info: &CertInfo) -> Vec<String> {
    info.ip_addresses.iter().map(ToString::to_string).collect()
}

/// The routes by label, each as [`RouteStatus`] serializes.
struct Routes<'a>(&'a std::collections::BTreeMap<Arc<str>, Arc<RouteStatus>>);

impl Serialize for Routes<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.0.iter().map(|(label, route)| (&**label, &**route)))
    }
}

impl Serialize for Status {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let c = self.current.as_ref();
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("fingerprint_sha256", &c.map(|c| &c.fingerprint_sha256))?;
        map.serialize_entry("subject", &c.map(|c| &c.subject))?;
        map.serialize_entry("dns_names", &c.map(|c| &c.dns_names))?;
        map.serialize_entry("ip_addresses", &c.map(|c| ips(c)))?;
        map.serialize_entry("not_before", &c.map(|c| time(c.not_before)))?;
        map.serialize_entry("not_after", &c.map(|c| time(c.not_after)))?;
        map.serialize_entry("origin", &c.map(|c| c.origin.to_string()))?;
        map.serialize_entry(
            "ca_fingerprints_sha256",
            &c.map(|c| &c.ca_fingerprints_sha256),
        )?;
        map.serialize_entry("loaded_at", &c.map(|c| time(c.loaded_at)))?;
        map.serialize_entry("generation", &self.generation)?;
        map.serialize_entry("expiring", &self.expiring)?;
        map.serialize_entry("expired", &self.expired)?;
        map.serialize_entry("stopped", &self.stopped)?;
        map.serialize_entry("running", &self.running)?;
        map.serialize_entry("ready", &self.ready)?;
        map.serialize_entry("ended", &self.ended.as_ref().map(Ended::to_string))?;
        map.serialize_entry("last_error", &error(self.last_error.as_ref()))?;
        map.serialize_entry("routes", &Routes(&self.routes))?;
        if !self.client_cas.is_empty() || self.client_ca_error.is_some() {
            let fingerprints: Vec<_> = self
                .client_cas
                .iter()
                .map(|ca| &ca.fingerprint_sha256)
                .collect();
            map.serialize_entry("client_ca_fingerprints_sha256", &fingerprints)?;
            map.serialize_entry("client_cas", &self.client_cas)?;
            map.serialize_entry("client_ca_error", &error(self.client_ca_error.as_ref()))?;
        }
        map.end()
    }
}

impl Serialize for RouteStatus {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let c = self.current.as_ref();
        let mut map = serializer.serialize_map(Some(9))?;
        map.serialize_entry("fingerprint_sha256", &c.map(|c| &c.fingerprint_sha256))?;
        map.serialize_entry("names", &self.names)?;
        map.serialize_entry("generation", &self.generation)?;
        map.serialize_entry("not_after", &c.map(|c| time(c.not_after)))?;
        map.serialize_entry("origin", &c.map(|c| c.origin.to_string()))?;
        map.serialize_entry("expiring", &self.expiring)?;
        map.serialize_entry("expired", &self.expired)?;
        map.serialize_entry("stopped", &self.stopped)?;
        map.serialize_entry("last_error", &error(self.last_error.as_ref()))?;
        map.end()
    }
}

impl Serialize for TrustedCa {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(2))?;
        map.serialize_entry("fingerprint_sha256", &self.fingerprint_sha256)?;
        map.serialize_entry("leaves_at", &self.leaves_at.map(time))?;
        map.end()
    }
}

impl Serialize for CertInfo {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(11))?;
        map.serialize_entry("fingerprint_sha256", &self.fingerprint_sha256)?;
        map.serialize_entry("subject", &self.subject)?;
        map.serialize_entry("issuer", &self.issuer)?;
        map.serialize_entry("dns_names", &self.dns_names)?;
        map.serialize_entry("ip_addresses", &ips(self))?;
        map.serialize_entry("not_before", &time(self.not_before))?;
        map.serialize_entry("not_after", &time(self.not_after))?;
        map.serialize_entry("origin", &self.origin.to_string())?;
        map.serialize_entry("loaded_at", &time(self.loaded_at))?;
        map.serialize_entry("chain_len", &self.chain_len)?;
        map.serialize_entry("ca_fingerprints_sha256", &self.ca_fingerprints_sha256)?;
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_status_before_any_certificate_is_nulls_and_its_routes() {
        let mut status = Status {
            running: true,
            ..Status::default()
        };
        Arc::make_mut(&mut status.routes).insert(
            "api.example.com".into(),
            Arc::new(RouteStatus {
                names: vec!["api.example.com".into()],
                ..RouteStatus::default()
            }),
        );
        let json = serde_json::to_value(&status).unwrap();
        assert!(json["fingerprint_sha256"].is_null() && json["not_after"].is_null());
        assert_eq!(json["running"], true);
        assert_eq!(json["ready"], false);
        assert_eq!(
            json["routes"]["api.example.com"]["names"][0],
            "api.example.com"
        );
        assert!(
            json.get("client_ca_fingerprints_sha256").is_none(),
            "no mTLS: no client fields"
        );
    }

    #[test]
    fn times_before_1970_and_in_9999_errors_and_cas_as_text() {
        let cert = tls_test::TestCa::new("serde").leaf_valid(
            &["localhost", "127.0.0.1"],
            tls_test::new_year(1950),
            tls_source::clock::latest(),
        );
        let bundle = crate::testing::bundle_from(&cert, None, tls_source::Origin::SelfSigned);
        let provider = crate::testing::provider();
        let info = crate::Validator::new(provider, crate::Policy::default())
            .validate(&bundle)
            .unwrap()
            .shared_info()
            .clone();
        let status = Status {
            current: Some(info.clone()),
            generation: 3,
            last_error: Some(Arc::new(Error::ClientCas {
                reason: "no CA certificate".into(),
            })),
            client_cas: vec![TrustedCa {
                fingerprint_sha256: "ab".into(),
                leaves_at: Some(std::time::UNIX_EPOCH + Duration::from_secs(86_400)),
            }],
            ..Status::default()
        };
        let json = serde_json::to_value(&status).unwrap();
        assert_eq!(json["not_before"], "1950-01-01T00:00:00Z");
        assert_eq!(json["not_after"], "9999-12-31T23:59:59Z");
        assert_eq!(json["ip_addresses"][0], "127.0.0.1");
        assert_eq!(json["origin"], "self-signed");
        assert_eq!(json["generation"], 3);
        assert!(
            json["last_error"]
                .as_str()
                .unwrap()
                .contains("no CA certificate")
        );
        assert_eq!(json["client_ca_fingerprints_sha256"][0], "ab");
        assert_eq!(json["client_cas"][0]["leaves_at"], "1970-01-02T00:00:00Z");
        assert!(json["client_ca_error"].is_null());
        let info = serde_json::to_value(&*info).unwrap();
        assert_eq!(info["chain_len"], 2, "the leaf and the test CA");
        assert_eq!(info["dns_names"][0], "localhost");
    }
}
