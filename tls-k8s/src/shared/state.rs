//! What the shared store keeps in its CA Secret, read and written: the signing CA, the announced
//! next one (with when leaves switch to it), the previous one (served until it expires).

use std::collections::BTreeMap;
use std::time::SystemTime;

use tls_selfsigned::{CaPem, CaRotation};
use tls_source::clock::Rfc3339;
use tls_source::x509::LeafInfo;

use super::SWITCH_AFTER_ANNOTATION;
use crate::fenced::Stored;

/// Keys of the CA Secret: the signing CA, the announced next one, the one it replaced.
const CA_CRT: &str = "ca.crt";
const CA_KEY: &str = "ca.key";
const NEXT_CRT: &str = "next.crt";
const NEXT_KEY: &str = "next.key";
const PREVIOUS_CRT: &str = "previous.crt";

/// The CA Secret's content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CaState {
    pub(crate) signing: CaPem,
    /// The announced CA and when leaves switch to it.
    pub(crate) next: Option<(CaPem, SystemTime)>,
    /// The CA certificate the signing one replaced, served until it expires.
    pub(crate) previous: Option<String>,
}

/// The data and annotations of a Secret, as written.
pub(crate) type Content = (BTreeMap<String, Vec<u8>>, BTreeMap<String, String>);

impl CaState {
    /// A state with only a signing CA.
    pub(crate) fn new(signing: CaPem) -> Self {
        Self {
            signing,
            next: None,
            previous: None,
        }
    }

    /// The CA Secret as written, each CA loaded as a signing CA (parsable, a CA, its key its
    /// own), or why it cannot be used. A next CA without its switch time switches at `now`.
    pub(crate) fn read(
        stored: &Stored,
        rotation: &CaRotation,
        now: SystemTime,
    ) -> Result<Self, String> {
        let text = |key: &str| -> Result<Option<String>, String> {
            stored
                .data
                .get(key)
                .map(|b| {
                    String::from_utf8(b.clone()).map_err(|_| format!("{key} is not UTF-8 PEM"))
                })
                .transpose()
        };
        let pair = |crt: &str, key: &str| -> Result<Option<CaPem>, String> {
            match (text(crt)?, text(key)?) {
                (Some(cert_pem), Some(key_pem)) => {
                    let pem = CaPem { cert_pem, key_pem };
                    rotation
                        .signer(&pem)
                        .map_err(|e| format!("{crt}/{key}: {e}"))?;
                    Ok(Some(pem))
                }
                (None, None) => Ok(None),
                (Some(_), None) => Err(format!("{key} is missing beside {crt}")),
                (None, Some(_)) => Err(format!("{crt} is missing beside {key}")),
            }
        };
        let signing =
            pair(CA_CRT, CA_KEY)?.ok_or_else(|| format!("{CA_CRT} and {CA_KEY} are missing"))?;
        let next = pair(NEXT_CRT, NEXT_KEY)?.map(|next| {
            let at = stored
                .annotations
                .get(SWITCH_AFTER_ANNOTATION)
                .and_then(|t| Rfc3339::parse(t))
                .unwrap_or(now);
            (next, at)
        });
        Ok(Self {
            signing,
            next,
            previous: text(PREVIOUS_CRT)?,
        })
    }

    /// The Secret's data and annotations for this state.
    pub(crate) fn write(&self) -> Content {
        let mut data = BTreeMap::from([
            (
                CA_CRT.to_owned(),
                self.signing.cert_pem.clone().into_bytes(),
            ),
            (CA_KEY.to_owned(), self.signing.key_pem.clone().into_bytes()),
        ]);
        let mut annotations = BTreeMap::new();
        if let Some((next, at)) = &self.next {
            data.insert(NEXT_CRT.to_owned(), next.cert_pem.clone().into_bytes());
            data.insert(NEXT_KEY.to_owned(), next.key_pem.clone().into_bytes());
            annotations.insert(SWITCH_AFTER_ANNOTATION.to_owned(), Rfc3339(*at).to_string());
        }
        if let Some(previous) = &self.previous {
            data.insert(PREVIOUS_CRT.to_owned(), previous.clone().into_bytes());
        }
        (data, annotations)
    }

    /// The `ca.crt` served with every leaf: the signing CA, then the announced and the
    /// previous one.
    pub(crate) fn served(&self) -> String {
        let mut served = self.signing.cert_pem.clone();
        for extra in self
            .next
            .iter()
            .map(|(n, _)| n.cert_pem.as_str())
            .chain(self.previous.as_deref())
        {
            if !served.ends_with('\n') {
                served.push('\n');
            }
            served.push_str(extra);
        }
        served
    }
}

/// The first certificate of a PEM text, parsed.
pub(crate) fn first_certificate(pem: &[u8]) -> Option<LeafInfo> {
    let chain = tls_source::Decoder::new()
        .certificates("certificate", pem)
        .ok()?;
    LeafInfo::parse(chain.first()?).ok()
}

/// For the fuzz target: reads a CA Secret's content as the writer does.
#[cfg(feature = "fuzzing")]
pub(crate) fn fuzz_ca_state(data: &[(String, Vec<u8>)], switch_after: Option<&str>) {
    let stored = Stored {
        fence: None,
        data: data.iter().cloned().collect(),
        annotations: switch_after
            .map(|t| BTreeMap::from([(SWITCH_AFTER_ANNOTATION.to_owned(), t.to_owned())]))
            .unwrap_or_default(),
    };
    static ROTATION: std::sync::OnceLock<CaRotation> = std::sync::OnceLock::new();
    let rotation = ROTATION.get_or_init(|| {
        tls_selfsigned::SelfSigned::builder()
            .dns_name("fuzz")
            .ca()
            .build()
            .expect("a fixed configuration")
            .ca_rotation()
            .expect("CA mode")
    });
    if let Ok(state) = CaState::read(&stored, rotation, SystemTime::UNIX_EPOCH) {
        let _ = state.served();
        let _ = state.write();
    }
}
