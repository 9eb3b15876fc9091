//! [`SecretSource`]: one TLS Secret, watched through the Kubernetes API.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use base64::Engine as _;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt as _};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher;
use kube::{Api, Client};
use tls_seal::{Location, Seal};
use tls_source::{CertBundle, Decoder, Digest, Origin};

use crate::Error;

/// The default key of the certificate chain in a `kubernetes.io/tls` Secret.
pub const TLS_CRT: &str = "tls.crt";
/// The default key of the private key.
pub const TLS_KEY: &str = "tls.key";
/// The default key of the CA bundle (optional).
pub const CA_CRT: &str = "ca.crt";

/// A [`CertSource`](tls_source::CertSource) that watches one Secret through the Kubernetes API
/// and yields a bundle whenever its certificate data changes: milliseconds after the update,
/// where a mounted Secret waits for the kubelet's sync (often a minute) and a `subPath` mount
/// never updates at all.
///
/// - Built on `kube::runtime::watcher::watch_object` (the watcher with a field selector on
///   `metadata.name`) and the default backoff: lists, then watches from the list's
///   resourceVersion, resumes after a dropped watch, relists after 410 Gone.
/// - Yields only when `tls.crt`, `tls.key` or `ca.crt` change, not on label, annotation or other
///   metadata changes. The bundle's origin names `namespace/name` and the resourceVersion.
/// - Needs `get`, `list` and `watch` on that one Secret; see the crate docs for the Role.
///
/// # Recovery
/// Every problem is an `Err` item naming the Secret, and the source carries on: a deleted Secret
/// (and a recreated one is picked up), a Secret without the keys, malformed data, a dropped watch,
/// 410 Gone, 5xx answers, an API server restart, 403 Forbidden (the message says which RBAC
/// permission is missing). Watch errors are retried with kube's default backoff. The reload
/// core keeps the last good certificate meanwhile.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use futures::StreamExt;
/// use tls_k8s::SecretSource;
///
/// let client = kube::Client::try_default().await?;
/// let mut source = SecretSource::builder(client, "web", "web-tls").build();
/// while let Some(item) = source.next().await {
///     match item {
///         Ok(bundle) => println!("new certificate from {}", bundle.origin()),
///         Err(err) => eprintln!("{err}"),
///     }
/// }
/// # Ok(()) }
/// ```
#[must_use = "streams do nothing unless polled"]
pub struct SecretSource {
    namespace: String,
    name: String,
    inner: BoxStream<'static, Result<CertBundle, tls_source::Error>>,
}

/// Configures a [`SecretSource`]; made by [`SecretSource::builder`].
#[derive(Clone)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct SecretSourceBuilder {
    client: Client,
    namespace: String,
    name: String,
    keys: Keys,
    decoder: Decoder,
    seal: Option<Arc<dyn Seal>>,
}

/// The data keys of a TLS Secret.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    pub(crate) cert: String,
    pub(crate) key: String,
    pub(crate) ca: String,
}

impl Keys {
    pub(crate) fn new(cert: String, key: String, ca: String) -> Self {
        Self { cert, key, ca }
    }
}

impl Default for Keys {
    fn default() -> Self {
        Self::new(TLS_CRT.to_owned(), TLS_KEY.to_owned(), CA_CRT.to_owned())
    }
}

impl fmt::Debug for SecretSourceBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretSourceBuilder")
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .field("keys", &self.keys)
            .field("seal", &self.seal)
            .finish_non_exhaustive()
    }
}

// ===== impl SecretSourceBuilder =====

impl SecretSourceBuilder {
    /// The data keys of the certificate chain, the private key and the (optional) CA bundle.
    /// Default: `tls.crt`, `tls.key`, `ca.crt`.
    pub fn keys(
        mut self,
        cert: impl Into<String>,
        key: impl Into<String>,
        ca: impl Into<String>,
    ) -> Self {
        self.keys = Keys::new(cert.into(), key.into(), ca.into());
        self
    }

    /// The largest value accepted for each key, in bytes (default 1 MiB).
    pub fn max_size(mut self, bytes: u64) -> Self {
        self.decoder = self.decoder.max_size(bytes);
        self
    }

    /// Opens the private key (`tls.key`) with `seal`: for a Secret whose key is sealed
    /// (`SharedSelfSigned::seal_served_key`, feature `self-signed`). A
    /// key that does not open (stored unsealed, sealed with a key not in the ring, altered, or
    /// copied from another Secret) is reported ([`Error::Sealed`]) and the last good
    /// certificate keeps serving. The seal's key files are re-read at each change of the
    /// Secret. Default: the key is read as it is stored.
    pub fn seal(mut self, seal: Arc<dyn Seal>) -> Self {
        self.seal = Some(seal);
        self
    }

    /// Builds the source. Nothing is requested until the stream is first polled.
    pub fn build(self) -> SecretSource {
        let api = api(self.client, &self.namespace);
        let mut state = State {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            keys: self.keys,
            decoder: self.decoder,
            seal: self.seal,
            last: None,
            present: None,
            listed: false,
        };
        // The watcher with a field selector on the name; each object's namespace and name are
        // checked again here (an API that ignores the selector sends the whole namespace), so
        // the events are handled here rather than through `watch_object`, which turns another
        // object's deletion into "deleted".
        let config = watcher::Config::default().fields(&format!("metadata.name={}", self.name));
        let inner = watcher::watcher(api, config)
            .default_backoff()
            .filter_map(move |event| futures::future::ready(state.event(event)))
            .boxed();
        SecretSource {
            namespace: self.namespace,
            name: self.name,
            inner,
        }
    }
}

// ===== impl SecretSource =====

impl SecretSource {
    /// Starts configuring a source for the Secret `namespace/name`.
    pub fn builder(
        client: Client,
        namespace: impl Into<String>,
        name: impl Into<String>,
    ) -> SecretSourceBuilder {
        SecretSourceBuilder {
            client,
            namespace: namespace.into(),
            name: name.into(),
            keys: Keys::default(),
            decoder: Decoder::new(),
            seal: None,
        }
    }
}

impl Stream for SecretSource {
    type Item = Result<CertBundle, tls_source::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}

impl fmt::Debug for SecretSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretSource")
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

// ===== the event handling =====

struct State {
    namespace: String,
    name: String,
    keys: Keys,
    decoder: Decoder,
    seal: Option<Arc<dyn Seal>>,
    /// The digest of the certificate data last passed on (a bundle or a decoding error);
    /// `None` after any error, so that the same data afterwards is passed on again.
    last: Option<Digest>,
    /// Whether the Secret was there when last heard of: `None` before the first list, then
    /// whether it exists. Its absence is said once, as "deleted" once it had been seen.
    present: Option<bool>,
    /// Whether the (re)list under way has held the Secret.
    listed: bool,
}

pub(crate) type Item = Result<CertBundle, tls_source::Error>;

impl State {
    fn origin(&self) -> String {
        format!("secret {}/{}", self.namespace, self.name)
    }

    fn report(&mut self, err: Error) -> Option<Item> {
        self.last = None;
        Some(Err(tls_source::Error::source(self.origin(), err)))
    }

    /// Whether `object` is the Secret watched, not another one an API sent regardless.
    fn is_ours(&self, object: &DynamicObject) -> bool {
        let ours = object.metadata.name.as_deref() == Some(self.name.as_str())
            && object.metadata.namespace.as_deref() == Some(self.namespace.as_str());
        if !ours {
            tracing::debug!(secret = %self.origin(), other = ?object.metadata.name, namespace = ?object.metadata.namespace, "ignoring another object the API sent (it did not apply the field selector)");
        }
        ours
    }

    fn event(
        &mut self,
        event: Result<watcher::Event<DynamicObject>, watcher::Error>,
    ) -> Option<Item> {
        use watcher::Event;
        match event {
            Ok(Event::Init) => {
                self.listed = false;
                None
            }
            Ok(Event::InitApply(object)) => {
                if !self.is_ours(&object) {
                    return None;
                }
                self.listed = true;
                self.handle(Ok(Some(object)))
            }
            Ok(Event::InitDone) if self.listed => None,
            // The (re)list did not hold it: missing, or deleted while the watch was down.
            Ok(Event::InitDone) => self.handle(Ok(None)),
            Ok(Event::Apply(object)) if self.is_ours(&object) => self.handle(Ok(Some(object))),
            Ok(Event::Delete(object)) if self.is_ours(&object) => self.handle(Ok(None)),
            Ok(Event::Apply(_) | Event::Delete(_)) => None,
            Err(err) => self.handle(Err(err)),
        }
    }

    fn handle(&mut self, event: Result<Option<DynamicObject>, watcher::Error>) -> Option<Item> {
        match event {
            Ok(Some(secret)) => {
                self.present = Some(true);
                self.secret(&secret)
            }
            Ok(None) => match self.present.replace(false) {
                Some(false) => None,
                Some(true) => self.report(Error::Deleted),
                None => self.report(Error::NotFound),
            },
            Err(err) => {
                tracing::debug!(secret = %self.origin(), error = %err, "watch error; retrying with backoff");
                let err = Error::from_watcher(err, &self.namespace, &self.name);
                self.report(err)
            }
        }
    }

    fn secret(&mut self, secret: &DynamicObject) -> Option<Item> {
        let digest = digest(secret, &self.keys);
        if self.last == Some(digest) {
            return None; // a metadata-only change: not decoded again
        }
        self.last = Some(digest);
        Some(read(
            secret,
            &self.keys,
            &self.decoder,
            self.seal.as_deref(),
        ))
    }
}

/// The API's view of a Secret, as a dynamic object: its `data` stays JSON, so no base64 in it can
/// make kube's decoding fail (kube then logs the whole response body, keys included); this crate
/// decodes each value itself and reports bad data by Secret and key, without the bytes.
pub(crate) fn api(client: Client, namespace: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client, namespace, &ApiResource::erase::<Secret>(&()))
}

/// The Secret's `type`.
pub(crate) fn secret_type(secret: &DynamicObject) -> Option<&str> {
    secret.data.get("type").and_then(serde_json::Value::as_str)
}

/// A digest of a TLS Secret's certificate data as the API gave it (each of the three keys
/// absent, a string's own bytes, or anything else as JSON, each tagged): the sources compare it
/// with the last one passed on before decoding anything, so a metadata-only change, or the
/// same Secret listed again, is not decoded.
pub(crate) fn digest(secret: &DynamicObject, keys: &Keys) -> Digest {
    let data = secret.data.get("data");
    let mut material = Vec::new();
    for key in [&keys.cert, &keys.key, &keys.ca] {
        let (tag, text) = match data.and_then(|d| d.get(key)) {
            None => (0u8, std::borrow::Cow::Borrowed("")),
            Some(serde_json::Value::String(text)) => (1, std::borrow::Cow::Borrowed(text.as_str())),
            Some(other) => (2, std::borrow::Cow::Owned(other.to_string())),
        };
        material.push(tag);
        material.extend_from_slice(&(text.len() as u64).to_be_bytes());
        material.extend_from_slice(text.as_bytes());
    }
    Digest::of(&material)
}

/// The certificate material of a TLS Secret: the bundle, or why there is none (missing keys,
/// bad data, a sealed key that does not open with `seal`), naming the Secret.
pub(crate) fn read(
    secret: &DynamicObject,
    keys: &Keys,
    decoder: &Decoder,
    seal: Option<&dyn Seal>,
) -> Item {
    let namespace = secret.metadata.namespace.clone().unwrap_or_default();
    let name = secret.metadata.name.clone().unwrap_or_default();
    let origin = || format!("secret {namespace}/{name}");
    let data = secret.data.get("data");
    let raw = |key: &str| data.and_then(|d| d.get(key));
    let get = |key: &str| -> Result<Option<Vec<u8>>, tls_source::Error> {
        let Some(value) = raw(key) else {
            return Ok(None);
        };
        let text = value.as_str().ok_or_else(|| {
            tls_source::Error::source(
                origin(),
                Error::BadData {
                    key: key.to_owned(),
                    reason: "not a string",
                },
            )
        })?;
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .map(Some)
            .map_err(|_| {
                tls_source::Error::source(
                    origin(),
                    Error::BadData {
                        key: key.to_owned(),
                        reason: "not valid base64",
                    },
                )
            })
    };
    let (cert, key, ca) = (get(&keys.cert)?, get(&keys.key)?, get(&keys.ca)?);
    let key = match (key, seal) {
        (Some(key), Some(seal)) => {
            seal.reload();
            let at = Location::new(&namespace, &name, &keys.key);
            let opened = seal
                .open(at, &key)
                .map_err(|err| tls_source::Error::source(origin(), Error::Sealed(err)))?;
            Some(opened.into_plaintext())
        }
        (key, _) => key,
    };
    let (Some(cert), Some(key)) = (cert, key) else {
        let missing = [&keys.cert, &keys.key]
            .into_iter()
            .filter(|k| raw(k).is_none())
            .cloned()
            .collect();
        return Err(tls_source::Error::source(
            origin(),
            Error::MissingKeys { keys: missing },
        ));
    };
    let input = |key: &str| format!("{namespace}/{name} key {key}");
    let bundle_origin = Origin::Secret {
        namespace: namespace.clone(),
        name: name.clone(),
        resource_version: secret.metadata.resource_version.clone(),
    };
    decoder.bundle(
        (&input(&keys.cert), &cert),
        (&input(&keys.key), &key),
        ca.as_deref()
            .map(|ca| (input(&keys.ca), ca))
            .as_ref()
            .map(|(n, b)| (n.as_str(), *b)),
        bundle_origin,
    )
}
