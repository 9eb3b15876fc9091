//! The reload task and its handle.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::{FutureExt as _, StreamExt as _};
use rustls::crypto::CryptoProvider;
use tls_source::{CertBundle, CertSource};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::error::Rfc3339;
use crate::status::CertInfo;
use crate::tls::{self, CertResolver};
use crate::{Error, NotReady, Policy, Status};

/// The most items taken from a source in one go before the latest wins.
const MAX_BATCH: usize = 64;

/// Drives a [`CertSource`], validates each bundle and swaps it into a rustls resolver.
///
/// Made with [`Reloader::builder`] (or [`Reloader::spawn`] for the defaults), which spawns the
/// reload task on the current Tokio runtime. The task:
/// - turns each bundle into a rustls `CertifiedKey` with the crypto provider, checks that the key
///   matches the leaf, applies the [`Policy`] (expired, not yet valid), and only then swaps;
/// - keeps the last good certificate on every error, recording it in [`Status::last_error`] and
///   logging it (`tracing` warn); logs each install at info;
/// - is latest-wins: when a burst of bundles is waiting, only the newest is validated and swapped;
/// - stops when the cancellation token is cancelled (dropping the source) or when the source ends.
///   The resolver keeps serving the last certificate either way.
///
/// Dropping the `Reloader` handle does not stop the task: the resolver you handed to rustls keeps
/// rotating. Stop it with the token, or [`stop`](Self::stop).
///
/// # Example
/// ```no_run
/// use std::time::Duration;
/// use tls_reload::Reloader;
/// use tls_source::FileSource;
/// use tokio_util::sync::CancellationToken;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let shutdown = CancellationToken::new();
/// let reloader = Reloader::builder()
///     .cancellation_token(shutdown.clone())
///     .spawn(FileSource::kubernetes_dir("/etc/tls").build())?;
/// reloader.ready_timeout(Duration::from_secs(10)).await?;
/// let config = reloader.server_config()?; // or .with_cert_resolver(reloader.resolver())
/// // ... serve with `config` until `shutdown` is cancelled.
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Reloader {
    resolver: Arc<CertResolver>,
    provider: Arc<CryptoProvider>,
    status: watch::Receiver<Status>,
    token: CancellationToken,
}

/// Configures and spawns a [`Reloader`].
#[derive(Debug, Default)]
#[must_use = "a builder does nothing until `spawn` is called"]
pub struct Builder {
    provider: Option<Arc<CryptoProvider>>,
    policy: Policy,
    token: Option<CancellationToken>,
}

// ===== impl Builder =====

impl Builder {
    /// The crypto provider that loads keys (and that [`Reloader::server_config`] uses). Default:
    /// the process default (`CryptoProvider::get_default`); failing that, the provider enabled by
    /// this crate's `ring` or `aws-lc-rs` feature when exactly one is on. Never installs one.
    pub fn crypto_provider(mut self, provider: Arc<CryptoProvider>) -> Self {
        self.provider = Some(provider);
        self
    }

    /// What is accepted; see [`Policy`].
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// The token that stops the reload task. The reloader watches a child of it, so
    /// [`Reloader::stop`] does not cancel `token`. Default: a new token.
    pub fn cancellation_token(mut self, token: CancellationToken) -> Self {
        self.token = Some(token);
        self
    }

    /// Spawns the reload task for `source` on the current Tokio runtime.
    ///
    /// # Errors
    /// [`Error::NoCryptoProvider`] when none was given and none can be found.
    ///
    /// # Panics
    /// Outside a Tokio runtime.
    pub fn spawn<S>(self, source: S) -> Result<Reloader, Error>
    where
        S: CertSource + 'static,
    {
        let provider = self
            .provider
            .or_else(tls::default_provider)
            .ok_or(Error::NoCryptoProvider)?;
        let token = self.token.unwrap_or_default().child_token();
        let resolver = Arc::new(CertResolver::new());
        let (tx, rx) = watch::channel(Status {
            running: true,
            ..Status::default()
        });
        let task = Task {
            provider: Arc::clone(&provider),
            policy: self.policy,
            resolver: Arc::clone(&resolver),
            status: tx,
            retry: None,
        };
        tokio::spawn(task.run(source, token.clone()));
        Ok(Reloader {
            resolver,
            provider,
            status: rx,
            token,
        })
    }
}

// ===== impl Reloader =====

impl Reloader {
    /// Starts configuring a reloader.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// Spawns a reloader for `source` with the defaults: the process crypto provider, the
    /// default [`Policy`], and a token of its own (stop it with [`stop`](Self::stop)).
    ///
    /// # Errors
    /// [`Error::NoCryptoProvider`], see [`Builder::spawn`].
    ///
    /// # Panics
    /// Outside a Tokio runtime.
    pub fn spawn<S: CertSource + 'static>(source: S) -> Result<Self, Error> {
        Self::builder().spawn(source)
    }

    /// The rustls resolver to put in a `ServerConfig` (`with_cert_resolver`).
    pub fn resolver(&self) -> Arc<CertResolver> {
        Arc::clone(&self.resolver)
    }

    /// A `ServerConfig` with safe defaults and no client authentication, on this reloader's
    /// crypto provider and resolver. Set `alpn_protocols` on it as your server needs.
    ///
    /// # Errors
    /// If the provider supports no safe protocol version.
    pub fn server_config(&self) -> Result<rustls::ServerConfig, rustls::Error> {
        tls::server_config(Arc::clone(&self.provider), self.resolver())
    }

    /// A receiver of the reloader's [`Status`], updated on every install, rejection, source
    /// error and stop.
    pub fn status(&self) -> watch::Receiver<Status> {
        self.status.clone()
    }

    /// Waits until the first certificate is installed. A server should not accept before.
    ///
    /// # Errors
    /// [`NotReady::Stopped`] when the reload task ends without installing anything.
    ///
    /// # Cancellation safety
    /// Cancellation safe.
    pub async fn ready(&self) -> Result<(), NotReady> {
        let mut rx = self.status.clone();
        let status = rx
            .wait_for(|s| s.current.is_some() || !s.running)
            .await
            .map(|s| s.clone())
            .unwrap_or_default();
        if status.current.is_some() {
            Ok(())
        } else {
            Err(NotReady::Stopped {
                last_error: status.last_error,
            })
        }
    }

    /// Like [`ready`](Self::ready), giving up after `timeout`.
    ///
    /// # Errors
    /// [`NotReady::TimedOut`] carrying the last error (why nothing was installed), or
    /// [`NotReady::Stopped`].
    pub async fn ready_timeout(&self, timeout: Duration) -> Result<(), NotReady> {
        match tokio::time::timeout(timeout, self.ready()).await {
            Ok(result) => result,
            Err(_) => Err(NotReady::TimedOut {
                waited: timeout,
                last_error: self.status.borrow().last_error.clone(),
            }),
        }
    }

    /// Stops the reload task (the source is dropped). The certificate installed last keeps being
    /// served.
    pub fn stop(&self) {
        self.token.cancel();
    }

    /// Waits until the reload task has ended and dropped its source.
    ///
    /// # Cancellation safety
    /// Cancellation safe.
    pub async fn stopped(&self) {
        let mut rx = self.status.clone();
        let _ = rx.wait_for(|s| !s.running).await;
    }
}

// ===== the reload task =====

struct Task {
    provider: Arc<CryptoProvider>,
    policy: Policy,
    resolver: Arc<CertResolver>,
    status: watch::Sender<Status>,
    /// A bundle rejected as not yet valid, tried again when it becomes valid.
    retry: Option<(tokio::time::Instant, CertBundle)>,
}

impl Task {
    async fn run<S: CertSource>(mut self, source: S, token: CancellationToken) {
        // Boxed so that it can be dropped before the stop is announced.
        let mut source = Box::pin(source);
        loop {
            let retry_at = self.retry.as_ref().map(|(at, _)| *at);
            tokio::select! {
                biased;
                () = token.cancelled() => {
                    tracing::info!("certificate reloader cancelled; stopping");
                    break;
                }
                () = sleep_until(retry_at), if retry_at.is_some() => {
                    if let Some((_, bundle)) = self.retry.take() {
                        self.consider(&bundle);
                    }
                }
                item = source.next() => {
                    let Some(first) = item else {
                        tracing::info!("certificate source ended; serving the current certificate");
                        break;
                    };
                    let mut batch = vec![first];
                    let mut ended = false;
                    while batch.len() < MAX_BATCH {
                        match source.next().now_or_never() {
                            Some(Some(item)) => batch.push(item),
                            Some(None) => {
                                ended = true;
                                break;
                            }
                            None => break,
                        }
                    }
                    self.handle(batch);
                    if ended {
                        tracing::info!("certificate source ended; serving the current certificate");
                        break;
                    }
                }
            }
        }
        drop(source);
        self.status.send_modify(|s| s.running = false);
    }

    /// Handles a batch in order; of its good bundles only the last is considered (latest wins).
    fn handle(&mut self, batch: Vec<Result<CertBundle, tls_source::Error>>) {
        let last_ok = batch.iter().rposition(Result::is_ok);
        for (i, item) in batch.into_iter().enumerate() {
            match item {
                Ok(bundle) if Some(i) == last_ok => self.consider(&bundle),
                Ok(bundle) => {
                    tracing::debug!(origin = %bundle.origin(), "certificate superseded by a newer one before it was checked");
                }
                Err(err) => {
                    tracing::warn!(error = %err, "certificate source error; keeping the current certificate");
                    self.record(Error::Source(err));
                }
            }
        }
    }

    /// Validates a bundle and installs it, or records why not.
    fn consider(&mut self, bundle: &CertBundle) {
        self.retry = None;
        if self.resolver.digest() == Some(bundle.digest()) {
            // The same material again, e.g. after a transient error: a recovery, not a rotation.
            self.status.send_if_modified(|s| {
                let had_error = s.last_error.take().is_some();
                if had_error {
                    tracing::info!(origin = %bundle.origin(), "certificate source recovered; certificate unchanged");
                }
                had_error
            });
            return;
        }
        match self.validate(bundle) {
            Ok((installed, info)) => {
                self.resolver.store(installed);
                let remaining = info
                    .not_after
                    .duration_since(SystemTime::now())
                    .unwrap_or_default();
                self.status.send_modify(|s| {
                    s.generation += 1;
                    s.last_error = None;
                    tracing::info!(
                        fingerprint = %info.fingerprint_sha256,
                        not_after = %Rfc3339(info.not_after),
                        origin = %info.origin,
                        generation = s.generation,
                        "certificate installed"
                    );
                    s.current = Some(info.clone());
                });
                if remaining < self.policy.expiry_warning_window() {
                    tracing::warn!(
                        fingerprint = %info.fingerprint_sha256,
                        not_after = %Rfc3339(info.not_after),
                        origin = %info.origin,
                        "installed certificate expires soon"
                    );
                }
            }
            Err(err) => {
                tracing::warn!(error = %err, "certificate rejected; keeping the current certificate");
                if let Error::NotYetValid { not_before, .. } = &err {
                    let wait = not_before
                        .duration_since(SystemTime::now())
                        .unwrap_or_default();
                    self.retry = Some((tokio::time::Instant::now() + wait, bundle.clone()));
                }
                self.record(err);
            }
        }
    }

    fn validate(&self, bundle: &CertBundle) -> Result<(tls::Installed, CertInfo), Error> {
        let origin = bundle.origin();
        let info = CertInfo::inspect(bundle)?;
        let installed = tls::certify(bundle, &self.provider)?;
        let now = SystemTime::now();
        if self.policy.rejects_expired() && now > info.not_after {
            return Err(Error::Expired {
                origin: origin.clone(),
                not_after: info.not_after,
            });
        }
        if self.policy.rejects_not_yet_valid() && now < info.not_before {
            return Err(Error::NotYetValid {
                origin: origin.clone(),
                not_before: info.not_before,
            });
        }
        Ok((installed, info))
    }

    fn record(&self, err: Error) {
        let err = Arc::new(err);
        self.status.send_modify(|s| s.last_error = Some(err));
    }
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
