//! What a fleet's store keeps for its CA, read and written: the signing CA, the announced next
//! one (with when leaves switch to it), the previous one (served until it expires).

use std::collections::BTreeMap;
use std::time::SystemTime;

use tls_source::clock::Rfc3339;
use tls_source::x509::LeafInfo;

use super::{Annotations, Content, Data, SWITCH_AFTER};
use crate::{CaPem, CaRotation};

/// Keys of the CA Secret: the signing CA, the announced next one, the one it replaced.
const CA_CRT: &str = "ca.crt";
const CA_KEY: &str = "ca.key";
const NEXT_CRT: &str = "next.crt";
const NEXT_KEY: &str = "next.key";
const PREVIOUS_CRT: &str = "previous.crt";

/// The CA's stored state: its values are `ca.crt`, `ca.key` (the signing CA), `next.crt`,
/// `next.key` (the announced one, switched to after the annotation [`SWITCH_AFTER`]) and
/// `previous.crt`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CaState {
    /// The CA that signs leaves now.
    pub signing: CaPem,
    /// The announced CA and when leaves switch to it.
    pub next: Option<(CaPem, SystemTime)>,
    /// The CA certificate the signing one replaced, served until it expires.
    pub previous: Option<String>,
}

impl CaState {
    /// A state with only a signing CA.
    pub fn new(signing: CaPem) -> Self {
        Self {
            signing,
            next: None,
            previous: None,
        }
    }

    /// The state as stored (`data` and `annotations`), each CA loaded as a signing CA
    /// (parsable, a CA, its key its own), or why it cannot be used. A next CA without its
    /// switch time switches at `now`.
    ///
    /// # Errors
    /// Why the stored state cannot be used (naming the value, never its content).
    pub fn read(
        data: &Data,
        annotations: &Annotations,
        rotation: &CaRotation,
        now: SystemTime,
    ) -> Result<Self, String> {
        let text = |key: &str| -> Result<Option<String>, String> {
            data.get(key)
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
            let at = annotations
                .get(SWITCH_AFTER)
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

    /// The values and annotations to store for this state.
    pub fn write(&self) -> Content {
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
            annotations.insert(SWITCH_AFTER.to_owned(), Rfc3339(*at).to_string());
        }
        if let Some(previous) = &self.previous {
            data.insert(PREVIOUS_CRT.to_owned(), previous.clone().into_bytes());
        }
        (data, annotations)
    }

    /// The `ca.crt` served with every leaf: the signing CA, then the announced and the
    /// previous one.
    pub fn served(&self) -> String {
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
pub fn first_certificate(pem: &[u8]) -> Option<LeafInfo> {
    let chain = tls_source::Decoder::new()
        .certificates("certificate", pem)
        .ok()?;
    LeafInfo::parse(chain.first()?).ok()
}
