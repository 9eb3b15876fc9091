//! [`SecretsSource`]: every TLS Secret matching a label selector, through one watch.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::stream::BoxStream;
use futures::{Stream, StreamExt as _};
use kube::Client;
use kube::api::DynamicObject;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event};
use tls_source::{Decoder, Keyed, KeyedState, KeyedUpdate};

use crate::Error;
use crate::secret::{Keys, api, digest, read, secret_type};
use crate::selector::Selector;

/// The Secret type this source serves.
const TLS_TYPE: &str = "kubernetes.io/tls";

/// A [`KeyedCertSource`](tls_source::KeyedCertSource) of every `kubernetes.io/tls` Secret
/// matching a label selector in one namespace, through **one** watch
/// (`kube::runtime::watcher` with the selector), for SNI: give it to
/// `tls_reload::Builder::routes` and each Secret is served for the DNS names in its certificate.
///
/// - The key of each update is the Secret's `namespace/name`.
/// - A Secret that appears, or whose certificate data changes, is a
///   [`Put`](KeyedUpdate::Put); metadata-only changes yield nothing.
/// - A Secret deleted, or no longer matching the selector (a label removed), or no longer of type
///   `kubernetes.io/tls`, is a [`Remove`](KeyedUpdate::Remove): its routes go.
/// - A Secret with missing keys or malformed data is [`Invalid`](KeyedUpdate::Invalid), once per
///   change: the reload core keeps its last good certificate.
/// - Needs `list` and `watch` on Secrets in the namespace (a Role without `resourceNames`).
///
/// # Recovery
/// Watch failures (a dropped watch, 410 Gone, 5xx, an API server restart, 403) are `Err` items
/// naming the namespace and selector; kube's watcher retries with its default backoff and
/// relists, and a relist removes the Secrets that went away meanwhile.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use tls_k8s::SecretsSource;
/// use tls_reload::Reloader;
///
/// let client = kube::Client::try_default().await?;
/// let reloader = Reloader::builder()
///     .routes(SecretsSource::builder(client, "web").selector("app=web").build())
///     .spawn_routes()?;
/// reloader.ready().await?; // at least one Secret served
/// # Ok(()) }
/// ```
#[must_use = "streams do nothing unless polled"]
pub struct SecretsSource {
    namespace: String,
    selector: String,
    inner: BoxStream<'static, Result<Keyed, tls_source::Error>>,
}

/// Configures a [`SecretsSource`]; made by [`SecretsSource::builder`].
#[derive(Clone)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct SecretsSourceBuilder {
    client: Client,
    namespace: String,
    selector: String,
    keys: Keys,
    decoder: Decoder,
}

impl fmt::Debug for SecretsSourceBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretsSourceBuilder")
            .field("namespace", &self.namespace)
            .field("selector", &self.selector)
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

// ===== impl SecretsSourceBuilder =====

impl SecretsSourceBuilder {
    /// The label selector, e.g. `app=web` or `app=web,tier!=canary` (default: every TLS Secret
    /// in the namespace).
    pub fn selector(mut self, selector: impl Into<String>) -> Self {
        self.selector = selector.into();
        self
    }

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

    /// Builds the source. Nothing is requested until the stream is first polled.
    pub fn build(self) -> SecretsSource {
        let api = api(self.client, &self.namespace);
        let mut config = watcher::Config::default();
        if !self.selector.is_empty() {
            config = config.labels(&self.selector);
        }
        // The selection is checked here too: an API that ignores the selector sends every
        // Secret of the namespace. A selector that cannot be parsed selects nothing, and says
        // why first.
        let (selection, invalid) = match Selector::parse(&self.selector) {
            Ok(selection) => (Some(selection), None),
            Err(err) => (None, Some(err)),
        };
        let origin = origin(&self.namespace, &self.selector);
        let invalid = invalid.map(|err| Err(tls_source::Error::source(origin, err)));
        let mut state = State {
            namespace: self.namespace.clone(),
            selection,
            selector: self.selector.clone(),
            data_keys: self.keys,
            decoder: self.decoder,
            keys: KeyedState::new(),
        };
        let inner = futures::stream::iter(invalid)
            .chain(
                watcher::watcher(api, config)
                    .default_backoff()
                    .flat_map(move |event| futures::stream::iter(state.handle(event))),
            )
            .boxed();
        SecretsSource {
            namespace: self.namespace,
            selector: self.selector,
            inner,
        }
    }
}

// ===== impl SecretsSource =====

impl SecretsSource {
    /// Starts configuring a source for the TLS Secrets of `namespace`.
    pub fn builder(client: Client, namespace: impl Into<String>) -> SecretsSourceBuilder {
        SecretsSourceBuilder {
            client,
            namespace: namespace.into(),
            selector: String::new(),
            keys: Keys::default(),
            decoder: Decoder::new(),
        }
    }
}

impl Stream for SecretsSource {
    type Item = Result<Keyed, tls_source::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}

impl fmt::Debug for SecretsSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretsSource")
            .field("namespace", &self.namespace)
            .field("selector", &self.selector)
            .finish_non_exhaustive()
    }
}

// ===== the event handling =====

type Item = Result<Keyed, tls_source::Error>;

struct State {
    namespace: String,
    /// The selector, evaluated here too; `None` when it cannot be parsed (nothing selected).
    selection: Option<Selector>,
    selector: String,
    /// The data keys of the certificate, the key and the CA.
    data_keys: Keys,
    decoder: Decoder,
    /// What has been passed on, by `namespace/name`.
    keys: KeyedState,
}

impl State {
    fn handle(&mut self, event: Result<Event<DynamicObject>, watcher::Error>) -> Vec<Item> {
        match event {
            Ok(Event::Init) => vec![Ok(self.keys.listing())],
            Ok(Event::InitApply(secret) | Event::Apply(secret)) => {
                self.apply(key_of(&secret), &secret).into_iter().collect()
            }
            // Whatever the relist no longer holds went away while the watch was down.
            Ok(Event::InitDone) => self.keys.listed().into_iter().map(Ok).collect(),
            Ok(Event::Delete(secret)) => self
                .keys
                .remove(&key_of(&secret))
                .map(Ok)
                .into_iter()
                .collect(),
            Err(err) => {
                tracing::debug!(namespace = %self.namespace, selector = %self.selector, error = %err, "watch error; retrying with backoff");
                let err = Error::from_selector_watcher(err, &self.namespace);
                let origin = origin(&self.namespace, &self.selector);
                vec![Err(tls_source::Error::source(origin, err))]
            }
        }
    }

    /// Whether the API sent an object of our namespace matching our selector (one that does
    /// not apply selectors sends every Secret).
    fn selects(&self, secret: &DynamicObject) -> bool {
        let no_labels = std::collections::BTreeMap::new();
        let labels = secret.metadata.labels.as_ref().unwrap_or(&no_labels);
        secret.metadata.namespace.as_deref() == Some(self.namespace.as_str())
            && self.selection.as_ref().is_some_and(|s| s.matches(labels))
    }

    fn apply(&mut self, key: String, secret: &DynamicObject) -> Option<Item> {
        if secret_type(secret) != Some(TLS_TYPE) || !self.selects(secret) {
            // Not (or no longer) ours: removed if it was served, else ignored.
            return self.keys.remove(&key).map(Ok);
        }
        if !self.keys.changed(&key, digest(secret, &self.data_keys)) {
            return None; // a metadata-only change: not decoded again
        }
        let update = match read(secret, &self.data_keys, &self.decoder, None) {
            Ok(bundle) => KeyedUpdate::Put(bundle),
            Err(err) => KeyedUpdate::Invalid(err),
        };
        Some(Ok(Keyed { key, update }))
    }
}

/// What the source's own errors are about.
fn origin(namespace: &str, selector: &str) -> String {
    if selector.is_empty() {
        format!("TLS secrets in {namespace}")
    } else {
        format!("TLS secrets in {namespace} matching {selector}")
    }
}

fn key_of(secret: &DynamicObject) -> String {
    format!(
        "{}/{}",
        secret.metadata.namespace.as_deref().unwrap_or_default(),
        secret.metadata.name.as_deref().unwrap_or_default()
    )
}
