//! [`FencedSecret`]: writes to a Secret that carry the writer's round and identity, refused once
//! a later round (or another holder of the same round) has written.

use std::collections::BTreeMap;
use std::fmt;

use base64::Engine as _;
use kube::api::{DynamicObject, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

/// The annotation with the round of the last accepted write.
pub const ROUND_ANNOTATION: &str = "tls-rotation.io/round";
/// The annotation with the identity of the last accepted writer.
pub const HOLDER_ANNOTATION: &str = "tls-rotation.io/holder";

/// How many compare-and-swap conflicts in a row a write re-reads and decides again after.
const CONFLICT_RETRIES: usize = 16;

/// A writer's fence: its round (from the Lease: see [`Leadership`](crate::Leadership)) and
/// its identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    /// The round.
    pub round: u64,
    /// The writer's identity (the Lease holder's).
    pub holder: String,
}

/// What became of a fenced write.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a refused write is a normal outcome that the caller decides about"]
pub enum Written {
    /// Accepted: the Secret now carries this fence (and the data, if any was given).
    Accepted {
        /// The Secret's new resourceVersion.
        resource_version: Option<String>,
    },
    /// Refused: the Secret carries a later round, or the same round from another holder. The
    /// normal outcome for a deposed writer.
    Refused {
        /// The fence the Secret carries.
        stored: Fence,
    },
}

/// Writes to one Secret, fenced: each write reads the Secret, is refused if the stored round
/// is higher (or equal from another holder), and replaces it with the resourceVersion it read
/// (the API server's compare-and-swap), re-reading and deciding again on a 409. So a writer
/// paused past its lease, whose successor has stamped a later round, can no longer write.
///
/// Needs `get`, `create` and `update` on the Secret.
pub struct FencedSecret {
    api: Api<DynamicObject>,
    namespace: String,
    name: String,
    secret_type: String,
    labels: BTreeMap<String, String>,
}

/// A Secret as read: its fence, its data (decoded), its annotations. Its `Debug` shows the
/// data's keys, never their values.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stored {
    /// The fence of the last accepted write, if any.
    pub fence: Option<Fence>,
    /// The Secret's `data`, decoded from base64.
    pub data: BTreeMap<String, Vec<u8>>,
    /// The Secret's annotations.
    pub annotations: BTreeMap<String, String>,
}

impl Stored {
    /// A Secret as the API returned it (a watch event, a list). Data that is not base64 reads
    /// as missing (the writer replaces it).
    pub fn of(secret: &DynamicObject) -> Self {
        let data = secret
            .data
            .get("data")
            .and_then(Value::as_object)
            .map(|data| {
                data.iter()
                    .filter_map(|(k, v)| {
                        let bytes = base64::engine::general_purpose::STANDARD
                            .decode(v.as_str()?)
                            .ok()?;
                        Some((k.clone(), bytes))
                    })
                    .collect()
            })
            .unwrap_or_default();
        Self {
            fence: stored_fence(secret),
            data,
            annotations: secret.metadata.annotations.clone().unwrap_or_default(),
        }
    }
}

impl fmt::Debug for Stored {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The data may hold private keys: only its keys are shown.
        f.debug_struct("Stored")
            .field("fence", &self.fence)
            .field("data", &self.data.keys().collect::<Vec<_>>())
            .field("annotations", &self.annotations)
            .finish()
    }
}

impl fmt::Debug for FencedSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FencedSecret")
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl FencedSecret {
    /// The Secret `namespace/name`.
    pub fn new(client: Client, namespace: &str, name: impl Into<String>) -> Self {
        Self {
            api: crate::secret::api(client, namespace),
            namespace: namespace.to_owned(),
            name: name.into(),
            secret_type: "kubernetes.io/tls".to_owned(),
            labels: BTreeMap::new(),
        }
    }

    /// Labels every write sets (others are kept): e.g. the label a
    /// [`SecretsSource`](crate::SecretsSource) of the fleet selects.
    #[must_use]
    pub fn labels(mut self, labels: BTreeMap<String, String>) -> Self {
        self.labels = labels;
        self
    }

    /// The `type` a missing Secret is created with (default `kubernetes.io/tls`, which the API
    /// server requires to hold `tls.crt` and `tls.key`; `Opaque` for anything else).
    #[must_use]
    pub fn secret_type(mut self, secret_type: impl Into<String>) -> Self {
        self.secret_type = secret_type.into();
        self
    }

    /// The Secret's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The Secret's namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The Secret's `namespace/name`.
    pub fn id(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Reads the Secret: `None` when it does not exist. Data that is not base64 reads as
    /// missing (the writer replaces it).
    ///
    /// # Errors
    /// An API error.
    pub async fn read(&self) -> Result<Option<Stored>, kube::Error> {
        Ok(self
            .api
            .get_opt(&self.name)
            .await?
            .map(|secret| Stored::of(&secret)))
    }

    /// The fencing write a new leader makes first: the Secret carries its round from now on,
    /// data unchanged (a missing Secret is created, `kubernetes.io/tls` with empty keys).
    ///
    /// # Errors
    /// An API error other than a conflict (which is re-read and decided again).
    pub async fn stamp(&self, fence: &Fence) -> Result<Written, kube::Error> {
        self.write(fence, None).await
    }

    /// Replaces the Secret's `data` with `data` (values as bytes), fenced by `fence`.
    ///
    /// # Errors
    /// An API error other than a conflict.
    pub async fn write(
        &self,
        fence: &Fence,
        data: Option<&BTreeMap<String, Vec<u8>>>,
    ) -> Result<Written, kube::Error> {
        self.write_with(fence, data, &BTreeMap::new()).await
    }

    /// Like [`write`](Self::write), also setting `annotations` (others are kept).
    ///
    /// # Errors
    /// An API error other than a conflict.
    pub async fn write_with(
        &self,
        fence: &Fence,
        data: Option<&BTreeMap<String, Vec<u8>>>,
        annotations: &BTreeMap<String, String>,
    ) -> Result<Written, kube::Error> {
        let mut conflicts = 0;
        loop {
            let outcome = match self.api.get_opt(&self.name).await? {
                None => self.create(fence, data, annotations).await,
                Some(secret) => match stored_fence(&secret) {
                    Some(stored) if refuses(&stored, fence) => {
                        tracing::debug!(secret = %self.name, round = fence.round, stored = stored.round, "fenced write refused");
                        return Ok(Written::Refused { stored });
                    }
                    _ => self.replace(secret, fence, data, annotations).await,
                },
            };
            match outcome {
                Err(kube::Error::Api(status))
                    if status.code == 409 && conflicts < CONFLICT_RETRIES =>
                {
                    conflicts += 1;
                }
                other => return other,
            }
        }
    }

    /// Changes the Secret's `data` with `change`, fenced by `fence`, applied to the data each
    /// attempt reads: after a conflict (another write landed between the read and the write)
    /// the change is made again on what is stored now, so concurrent changes of different keys
    /// all land (a [`write`](Self::write) of a whole map made from an older read would drop the
    /// others'). `None` when the change leaves the data as stored, a missing Secret counting
    /// as empty (nothing is written, nothing created).
    ///
    /// # Errors
    /// An API error other than a conflict.
    pub async fn modify(
        &self,
        fence: &Fence,
        change: impl Fn(&mut BTreeMap<String, Vec<u8>>),
    ) -> Result<Option<Written>, kube::Error> {
        let mut conflicts = 0;
        loop {
            let stored = self.api.get_opt(&self.name).await?;
            let before = stored
                .as_ref()
                .map(|s| Stored::of(s).data)
                .unwrap_or_default();
            let mut data = before.clone();
            change(&mut data);
            if data == before {
                return Ok(None);
            }
            let outcome = match stored {
                None => self.create(fence, Some(&data), &BTreeMap::new()).await,
                Some(secret) => match stored_fence(&secret) {
                    Some(stored) if refuses(&stored, fence) => {
                        tracing::debug!(secret = %self.name, round = fence.round, stored = stored.round, "fenced write refused");
                        return Ok(Some(Written::Refused { stored }));
                    }
                    _ => {
                        self.replace(secret, fence, Some(&data), &BTreeMap::new())
                            .await
                    }
                },
            };
            match outcome {
                Err(kube::Error::Api(status))
                    if status.code == 409 && conflicts < CONFLICT_RETRIES =>
                {
                    conflicts += 1;
                }
                other => return other.map(Some),
            }
        }
    }

    async fn create(
        &self,
        fence: &Fence,
        data: Option<&BTreeMap<String, Vec<u8>>>,
        annotations: &BTreeMap<String, String>,
    ) -> Result<Written, kube::Error> {
        let empty = BTreeMap::from([
            ("tls.crt".to_owned(), Vec::new()),
            ("tls.key".to_owned(), Vec::new()),
        ]);
        let mut secret: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": { "name": self.name, "namespace": self.namespace },
            "type": self.secret_type,
        }))
        .map_err(kube::Error::SerdeError)?;
        set(
            &mut secret,
            fence,
            Some(data.unwrap_or(&empty)),
            annotations,
            &self.labels,
        );
        let created = self.api.create(&PostParams::default(), &secret).await?;
        Ok(Written::Accepted {
            resource_version: created.metadata.resource_version,
        })
    }

    async fn replace(
        &self,
        mut secret: DynamicObject,
        fence: &Fence,
        data: Option<&BTreeMap<String, Vec<u8>>>,
        annotations: &BTreeMap<String, String>,
    ) -> Result<Written, kube::Error> {
        // The resourceVersion read stays in the metadata: the replace is a compare-and-swap.
        set(&mut secret, fence, data, annotations, &self.labels);
        let replaced = self
            .api
            .replace(&self.name, &PostParams::default(), &secret)
            .await?;
        Ok(Written::Accepted {
            resource_version: replaced.metadata.resource_version,
        })
    }
}

/// Whether a write fenced by `fence` must be refused, given what the Secret carries.
fn refuses(stored: &Fence, fence: &Fence) -> bool {
    stored.round > fence.round || (stored.round == fence.round && stored.holder != fence.holder)
}

/// The fence a Secret carries, if any.
pub(crate) fn stored_fence(secret: &DynamicObject) -> Option<Fence> {
    let annotations = secret.metadata.annotations.as_ref()?;
    Some(Fence {
        round: annotations.get(ROUND_ANNOTATION)?.parse().ok()?,
        holder: annotations.get(HOLDER_ANNOTATION)?.clone(),
    })
}

fn set(
    secret: &mut DynamicObject,
    fence: &Fence,
    data: Option<&BTreeMap<String, Vec<u8>>>,
    extra: &BTreeMap<String, String>,
    labels: &BTreeMap<String, String>,
) {
    if !labels.is_empty() {
        secret
            .metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .extend(labels.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    let annotations = secret
        .metadata
        .annotations
        .get_or_insert_with(BTreeMap::new);
    annotations.extend(extra.iter().map(|(k, v)| (k.clone(), v.clone())));
    annotations.insert(ROUND_ANNOTATION.to_owned(), fence.round.to_string());
    annotations.insert(HOLDER_ANNOTATION.to_owned(), fence.holder.clone());
    if let Some(data) = data {
        let encoded: serde_json::Map<String, Value> = data
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    Value::String(base64::engine::general_purpose::STANDARD.encode(v)),
                )
            })
            .collect();
        secret.data["data"] = Value::Object(encoded);
    }
}
