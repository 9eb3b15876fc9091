//! The driver, thin: for each certificate it asks the plan (`plan.rs`) what to do, does it
//! through the CA (`order.rs`) and the store, and reports the outcome back to the plan, on the
//! workspace's [`Clock`] and an injected random source.
//!
//! It runs in terms ([`Driver::run_term`]): one for ever with a state directory, one per
//! leadership term in a fleet. A term loads what it needs from the store when it begins (the
//! account, the weekly budget, each certificate's record) and keeps nothing when it ends, so a
//! replica that leads again continues from what the leaders between wrote.

use std::fmt;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, SystemTime};

use futures::StreamExt as _;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::CertificateDer;
use tls_source::clock::{Clock, Rfc3339};
use tls_source::x509::LeafInfo;
use tls_source::{CertBundle, Decoder, Keyed, KeyedUpdate, Origin};
use tokio::sync::{mpsc, watch};

use crate::Error;
use crate::budget::Budget;
use crate::challenge::{ChallengeType, Challenges, Dns01Solver};
use crate::fallback::CaConfig;
use crate::order::{self, Answering, Ca, Directory, Trust};
use crate::plan::{self, Action, Failure, Held as PlanHeld, Settings};
use crate::record::{FailureKind, Record, from_unix};
use crate::status::{AcmeStatus, NameState, NameStatus};
use crate::store::{AcmeStore, InFlight, NewAccount, StoredCert};

/// Where the driver's certificates go: the keyed source's channel.
pub(crate) type Tx = mpsc::UnboundedSender<Result<Keyed, tls_source::Error>>;

/// A number in [0, 1), drawn for the jitter of renewals and backoffs.
pub(crate) type Random = Arc<dyn Fn() -> f64 + Send + Sync>;

/// The system's randomness.
pub(crate) fn system_random() -> Random {
    Arc::new(|| {
        let mut bytes = [0u8; 8];
        let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes);
        #[allow(clippy::cast_precision_loss)] // 53 bits: exact in an f64
        let fraction = (u64::from_le_bytes(bytes) >> 11) as f64 / (1u64 << 53) as f64;
        fraction
    })
}

/// Stored certificates checked at once at start (each a few file reads and a parse).
const LOAD_CONCURRENCY: usize = 32;

/// Everything the driver is configured with, and what it shares with the [`Acme`](crate::Acme)
/// handle (the challenges, the thumbprint, the status, the retry requests).
pub(crate) struct Driver {
    pub(crate) directory: String,
    pub(crate) contact: Vec<String>,
    pub(crate) eab: Option<(String, Vec<u8>)>,
    /// The CAs after `directory`, in order of preference.
    pub(crate) fallbacks: Vec<CaConfig>,
    pub(crate) groups: Vec<Vec<String>>,
    pub(crate) store: Arc<dyn AcmeStore>,
    pub(crate) challenge: ChallengeType,
    pub(crate) answered_at: Option<String>,
    pub(crate) profile: Option<Profile>,
    pub(crate) dns01: Option<Arc<dyn Dns01Solver>>,
    pub(crate) trust: Trust,
    pub(crate) provider: Arc<CryptoProvider>,
    pub(crate) stagger: Duration,
    pub(crate) per_week: u32,
    pub(crate) challenges: Arc<Challenges>,
    pub(crate) thumbprint: Arc<RwLock<Option<String>>>,
    /// HTTP-01 answers of orders at a CA whose account's thumbprint is not `thumbprint`'s.
    pub(crate) http01_tokens: Arc<RwLock<std::collections::HashMap<String, String>>>,
    pub(crate) status: watch::Sender<AcmeStatus>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) random: Random,
    /// Bumped by `Acme::retry_now`.
    pub(crate) retry: watch::Receiver<u64>,
}

/// The profile a group with an IP address asks for when none is configured and the directory
/// advertises it: Let's Encrypt's six-day profile, the only one it issues addresses under.
pub(crate) const SHORTLIVED: &str = "shortlived";

/// The profile orders ask for ([`AcmeBuilder::profile`](crate::AcmeBuilder::profile)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Profile {
    pub(crate) name: String,
    /// Refuse to order when the directory does not advertise it.
    pub(crate) required: bool,
}

impl fmt::Debug for Driver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Driver")
            .field("directory", &self.directory)
            .field("groups", &self.groups.len())
            .finish_non_exhaustive()
    }
}

/// A certificate being served: what renewal needs of it.
#[derive(Clone)]
struct Held {
    leaf: CertificateDer<'static>,
    plan: PlanHeld,
}

/// A certificate issued (or read) and checked.
struct Issued {
    bundle: CertBundle,
    held: Held,
    stored: StoredCert,
}

/// What one term holds: each CA through its account (the preferred first; connected when
/// first needed), and the weekly budget as the store had it when the term began (with what
/// this term spent).
struct Term {
    cas: Vec<tokio::sync::Mutex<Option<Arc<Ca>>>>,
    /// How many certificates were stored when the term began.
    stored: usize,
    budget: tokio::sync::Mutex<(Budget, u64)>,
    /// The latest budget version stored (writers queue here; one write covers every spend
    /// made before it).
    budget_stored: tokio::sync::Mutex<u64>,
}

/// A certificate obtained: what it was ordered under, the index of the CA that issued it, and
/// why that is not the preferred one.
struct Obtained {
    issued: Issued,
    profile: Option<String>,
    issuer: usize,
    fallback_reason: Option<String>,
}

/// What is stored for a certificate when a term begins.
struct Loaded {
    held: Option<Held>,
    record: Record,
    in_flight: bool,
}

impl Driver {
    /// One term: serve what is stored, then keep every certificate until the future is
    /// dropped (a fleet's term ends) or for ever.
    pub(crate) async fn run_term(&self, tx: &Tx) {
        let _ = tx.send(Ok(Keyed::listing()));
        // By index: a closure taking the group by reference makes the future not `Send`
        // for every lifetime (rust-lang/rust#102211).
        let held: Vec<Option<Held>> = futures::stream::iter(0..self.groups.len())
            .map(|i| self.load_cert(&self.groups[i], tx))
            .buffered(LOAD_CONCURRENCY)
            .collect()
            .await;
        // Ready: every stored certificate is served. The rest of what is stored is read next.
        let _ = tx.send(Ok(Keyed::listed()));
        let stored = held.iter().filter(|h| h.is_some()).count();
        let loaded: Vec<Loaded> = futures::stream::iter(held.into_iter().enumerate())
            .map(|(i, held)| self.load(&self.groups[i][0], held))
            .buffered(LOAD_CONCURRENCY)
            .collect()
            .await;
        let term_cas = (0..=self.fallbacks.len())
            .map(|_| tokio::sync::Mutex::new(None))
            .collect();
        // Answers left published by an order that stopped (a restart, a leader gone), except
        // those of an order in flight: the CA may be validating them, and it is resumed.
        let in_flight: std::collections::HashSet<&str> = self
            .groups
            .iter()
            .zip(&loaded)
            .filter(|(_, l)| l.in_flight)
            .flat_map(|(group, _)| group.iter().map(|n| n.trim_start_matches("*.")))
            .collect();
        self.withdraw_leftovers(&in_flight).await;
        let budget = match self.store.budget().await {
            Ok(budget) => budget,
            Err(e) => {
                tracing::warn!(error = %e, "the stored ACME budget cannot be read; counting from none");
                Budget::default()
            }
        };
        let term = Term {
            cas: term_cas,
            stored,
            budget: tokio::sync::Mutex::new((budget, 0)),
            budget_stored: tokio::sync::Mutex::new(0),
        };
        // The stagger spaces the names to order now, in their configured order (a CA sees a
        // ramp, not a burst): one stored that still fits does not delay the others (after a
        // failover, most).
        self.first_account(&term).await;
        let now = self.clock.now();
        let mut position = 0;
        let loops = self.groups.iter().zip(loaded).map(|(group, loaded)| {
            let mut record = loaded.record.clone();
            let settings = Settings {
                config: &self.config_of(group),
                ari: self.offers_ari(&term, &record),
            };
            let first = plan::next(
                &mut record,
                loaded.held.as_ref().map(|h| &h.plan),
                loaded.in_flight,
                &settings,
                now,
                0.0,
            );
            let start = if matches!(first, Action::Order { .. } | Action::Resume) {
                position += 1;
                plan::staggered(now, self.stagger, position - 1)
            } else {
                now
            };
            self.keep(&term, group, loaded, start, tx)
        });
        futures::future::join_all(loops).await;
    }

    /// What is stored for the certificate `name` besides `held`: its record, whether an order
    /// is in flight.
    async fn load(&self, name: &str, held: Option<Held>) -> Loaded {
        let record = match self.store.record(name).await {
            Ok(record) => record,
            Err(e) => {
                tracing::warn!(name = %name, error = %e, "the stored ACME record cannot be read; starting from none");
                Record::default()
            }
        };
        let in_flight = matches!(self.store.in_flight(name).await, Ok(Some(_)));
        Loaded {
            held,
            record,
            in_flight,
        }
    }

    /// The stored certificate of `group`, checked as a new one is, sent to be served.
    async fn load_cert(&self, group: &[String], tx: &Tx) -> Option<Held> {
        let name = &group[0];
        let stored = match self.store.cert(name).await {
            Ok(stored) => stored?,
            Err(e) => {
                tracing::warn!(name = %name, error = %e, "the stored ACME certificate cannot be read; ordering a new one");
                let _ = tx.send(Err(tls_source::Error::source(format!("acme:{name}"), e)));
                return None;
            }
        };
        match self.check(group, stored) {
            Ok(issued) => {
                tracing::debug!(name = %name, not_after = %Rfc3339(issued.held.plan.not_after), "serving the stored ACME certificate");
                let _ = tx.send(Ok(Keyed {
                    key: name.clone(),
                    update: KeyedUpdate::Put(issued.bundle),
                }));
                self.set(name, |s| {
                    s.state = NameState::Valid;
                    s.not_after = Some(issued.held.plan.not_after);
                });
                Some(issued.held)
            }
            Err(e) => {
                tracing::warn!(name = %name, error = %e, "the stored ACME certificate cannot be used; ordering a new one");
                let _ = tx.send(Err(tls_source::Error::source(format!("acme:{name}"), e)));
                None
            }
        }
    }

    fn set(&self, name: &str, change: impl FnOnce(&mut NameStatus)) {
        self.status.send_modify(|s| {
            if let Some(entry) = s.names.get_mut(name) {
                change(entry);
            }
            crate::metrics::status(s);
        });
    }

    /// The CAs in order, each with its URL, external account binding and trust.
    fn ca_config(&self, i: usize) -> (&str, Option<&(String, Vec<u8>)>, &Trust) {
        match i.checked_sub(1) {
            None => (&self.directory, self.eab.as_ref(), &self.trust),
            Some(f) => {
                let ca = &self.fallbacks[f];
                (&ca.url, ca.eab.as_ref(), &ca.trust)
            }
        }
    }

    /// The index of the CA that issued the certificate of `record`: the preferred one when
    /// the record does not say (stored before there was a choice); `None` when that CA is no
    /// longer configured (no ARI then, and no `replaces`: another CA does not know it).
    fn issuer_of(&self, record: &Record) -> Option<usize> {
        match record.issuer.as_deref() {
            None => Some(0),
            Some(url) => (0..=self.fallbacks.len()).find(|&i| self.ca_config(i).0 == url),
        }
    }

    /// Whether the issuer of `record` offers ARI (as far as known: until it says it does not).
    fn offers_ari(&self, term: &Term, record: &Record) -> bool {
        self.issuer_of(record).is_some_and(|issuer| {
            term.cas[issuer]
                .try_lock()
                .ok()
                .and_then(|slot| slot.as_ref().map(|ca| ca.offers_ari()))
                .unwrap_or(true)
        })
    }

    /// Waits until an account can be used at some CA (the preferred one first), retried with
    /// backoff: the term needs one (and HTTP-01 its thumbprint). The others connect when an
    /// order first needs them.
    async fn first_account(&self, term: &Term) {
        let mut backoff =
            tls_source::Backoff::new(Duration::from_secs(1), Duration::from_secs(300));
        loop {
            for i in 0..term.cas.len() {
                match self.ca(term, i).await {
                    Ok(_) => return,
                    Err(e) => {
                        tracing::warn!(directory = self.ca_config(i).0, error = %e, "the ACME account cannot be used");
                    }
                }
            }
            let wait = backoff.next().unwrap_or(Duration::from_secs(300));
            tracing::error!(retry_in = ?wait, "no ACME account can be used");
            tokio::time::sleep(wait).await;
        }
    }

    /// The CA `i` of the term, through its account: connected (and registered, the first
    /// time) when first needed, once.
    async fn ca(&self, term: &Term, i: usize) -> Result<Arc<Ca>, Error> {
        let mut slot = term.cas[i].lock().await;
        if let Some(ca) = &*slot {
            return Ok(Arc::clone(ca));
        }
        match self.try_account(i, term.stored).await {
            Ok(ca) => {
                let ca = Arc::new(ca);
                {
                    let mut thumbprint = self
                        .thumbprint
                        .write()
                        .unwrap_or_else(PoisonError::into_inner);
                    // HTTP-01's answer: the preferred account's, else the first one's.
                    if i == 0 || thumbprint.is_none() {
                        *thumbprint = Some(ca.thumbprint().to_owned());
                    }
                }
                if i == 0 {
                    self.status.send_modify(|s| {
                        s.account = Some(ca.id().to_owned());
                        s.account_error = None;
                    });
                }
                *slot = Some(Arc::clone(&ca));
                Ok(ca)
            }
            Err(e) => {
                if i == 0 {
                    self.status
                        .send_modify(|s| s.account_error = Some(crate::error::chain(&e)));
                }
                Err(e)
            }
        }
    }

    /// The account at CA `i`: the stored one, or a new one registered and stored
    /// (`certificates`: how many are stored, which a missing account of the preferred CA does
    /// not explain).
    async fn try_account(&self, i: usize, certificates: usize) -> Result<Ca, Error> {
        let (url, eab, trust) = self.ca_config(i);
        let certificates = if i == 0 { certificates } else { 0 };
        let stored = self.store.account(url).await?;
        let had = stored.is_some();
        let (credentials, note) = match stored {
            Some(s) => (Some(s.credentials), s.replaced),
            None => (None, None),
        };
        let directory = Directory {
            url,
            contact: &self.contact,
            eab,
            trust,
            provider: &self.provider,
            clock: &self.clock,
        };
        let (ca, new) = Ca::connect(&directory, credentials).await?;
        let replaced = if let Some(credentials) = new {
            // Certificates without their account: it was deleted (or the directory changed).
            let replaced = (certificates > 0).then(|| {
                format!(
                    "{}: registered a new account: no account for {} was stored while {certificates} certificate(s) were (deleted, or the directory changed)",
                    Rfc3339(self.clock.now()),
                    url
                )
            });
            self.store
                .save_account(
                    url,
                    NewAccount {
                        credentials: &credentials,
                        url: ca.id(),
                        thumbprint: ca.thumbprint(),
                        replaced: replaced.as_deref(),
                    },
                )
                .await?;
            match &replaced {
                Some(why) => {
                    tracing::warn!(account = ca.id(), directory = %url, stored_certificates = certificates, "the stored ACME account is missing: {why}");
                }
                None => {
                    tracing::info!(account = ca.id(), directory = %url, stored_before = had, "registered a new ACME account");
                }
            }
            replaced
        } else {
            note
        };
        if i == 0 {
            self.status.send_modify(|s| s.account_replaced = replaced);
        }
        Ok(ca)
    }

    fn answering(&self) -> Answering<'_> {
        Answering {
            challenge: self.challenge,
            challenges: &self.challenges,
            provider: &self.provider,
            dns01: self.dns01.as_deref(),
            store: &*self.store,
            thumbprint: &self.thumbprint,
            http01_tokens: &self.http01_tokens,
        }
    }

    /// Withdraws the challenge answers a previous run published and did not withdraw (it
    /// stopped in the middle of an order), but those for the identifiers `in_flight`.
    async fn withdraw_leftovers(&self, in_flight: &std::collections::HashSet<&str>) {
        self.withdraw_where(|identifier| !in_flight.contains(identifier))
            .await;
    }

    /// Withdraws the challenge answers published for the names of `group`: those of a stored
    /// order that is not resumed (the CA gave it up, or the names changed).
    async fn withdraw_for(&self, group: &[String]) {
        self.withdraw_where(|identifier| {
            group
                .iter()
                .any(|name| name.trim_start_matches("*.") == identifier)
        })
        .await;
    }

    /// Withdraws the answers published for the identifiers `pred` picks.
    async fn withdraw_where(&self, pred: impl Fn(&str) -> bool) {
        let leftover =
            |p: &crate::store::Published| pred(p.name.trim_start_matches("_acme-challenge."));
        match self.store.published().await {
            Ok(mut published) => {
                published.retain(leftover);
                if published.is_empty() {
                    return;
                }
                tracing::info!(
                    count = published.len(),
                    "withdrawing challenge answers left published"
                );
                order::withdraw(&self.answering(), published).await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the challenge answers published");
            }
        }
    }

    /// The configuration an order of `group` is made with: a failure is kept with it, and
    /// another configuration tries at once.
    fn config_of(&self, group: &[String]) -> String {
        let profile = match &self.profile {
            Some(p) if p.required => format!("{}!", p.name),
            Some(p) => p.name.clone(),
            None => String::new(),
        };
        format!(
            "{}|{}|{}|{}|{profile}",
            group.join(","),
            self.challenge,
            self.answered_at.as_deref().unwrap_or_default(),
            self.directory
        )
    }

    /// One certificate, for the term: asks the plan, does what it says, tells it the outcome.
    /// (`start`: not before then, if the first thing to do is an order.)
    async fn keep(
        &self,
        term: &Term,
        group: &[String],
        loaded: Loaded,
        start: SystemTime,
        tx: &Tx,
    ) {
        let name = &group[0];
        let config = self.config_of(group);
        let mut retry = self.retry.clone();
        retry.mark_unchanged();
        let Loaded {
            mut held,
            mut record,
            mut in_flight,
        } = loaded;
        let mut saved = record.clone();
        let mut first = true;
        loop {
            let now = self.clock.now();
            let settings = Settings {
                config: &config,
                ari: self.offers_ari(term, &record),
            };
            let action = plan::next(
                &mut record,
                held.as_ref().map(|h| &h.plan),
                in_flight,
                &settings,
                now,
                (self.random)(),
            );
            self.save(name, &record, &mut saved).await;
            self.show(name, &record, action, held.as_ref(), now);
            match action {
                Action::Wait { until } | Action::Backoff { until } => {
                    if self.sleep_until(until, &mut retry).await {
                        self.retry_asked(name, &mut record);
                    }
                }
                Action::GiveUp => {
                    tracing::warn!(name = %name, error = ?record.last_error, "not ordering: the CA will not issue for it (change the configuration, or ask for a retry)");
                    if retry.changed().await.is_err() {
                        return std::future::pending().await;
                    }
                    self.retry_asked(name, &mut record);
                }
                Action::FetchAri => {
                    let Some(h) = held.as_ref() else { continue };
                    // Asked of the CA that issued it (one no longer configured is not asked).
                    let Some(issuer) = self.issuer_of(&record) else {
                        continue;
                    };
                    let answer = match self.ca(term, issuer).await {
                        Ok(ca) => ca.renewal_info(name, &h.leaf).await,
                        Err(e) => Err(e),
                    }
                    .map_err(|e| tracing::debug!(name = %name, error = %e, "ARI failed"));
                    if answer.is_err() && !self.offers_ari(term, &record) {
                        // The CA has no ARI (known without asking it): nothing to record, the
                        // lifetime decides.
                        continue;
                    }
                    plan::ari_fetched(
                        &mut record,
                        &h.plan,
                        answer,
                        self.clock.now(),
                        (self.random)(),
                    );
                }
                Action::Order { .. } | Action::Resume => {
                    let replaces = matches!(action, Action::Order { replaces: true });
                    if first {
                        let _ = self.sleep_until(start, &mut retry).await;
                    }
                    self.set(name, |s| {
                        s.state = NameState::Ordering;
                        s.retry_at = None;
                    });
                    // Named only to the CA that issued it.
                    let replaces = held
                        .as_ref()
                        .filter(|_| replaces)
                        .and_then(|h| Some((&h.leaf, self.issuer_of(&record)?)));
                    let obtained = self
                        .obtain(term, group, replaces, held.is_some(), in_flight)
                        .await;
                    crate::metrics::order(
                        name,
                        crate::metrics::outcome(obtained.as_ref().map(drop).map_err(|(e, _)| e)),
                    );
                    let now = self.clock.now();
                    match obtained {
                        Ok(Obtained {
                            issued,
                            profile,
                            issuer,
                            fallback_reason,
                        }) => {
                            in_flight = false;
                            if let Err(e) = self.store.save_cert(name, &issued.stored).await {
                                tracing::error!(name = %name, error = %e, "cannot store the new ACME certificate; serving it from memory");
                            }
                            if let Err(e) = self.store.forget_in_flight(name).await {
                                tracing::warn!(name = %name, error = %e, "cannot forget the completed order");
                            }
                            plan::issued(&mut record, now);
                            record.profile = profile;
                            record.issuer = Some(self.ca_config(issuer).0.to_owned());
                            record.fallback_reason = fallback_reason;
                            tracing::info!(name = %name, not_after = %Rfc3339(issued.held.plan.not_after), "ACME certificate issued");
                            let _ = tx.send(Ok(Keyed {
                                key: name.clone(),
                                update: KeyedUpdate::Put(issued.bundle),
                            }));
                            self.set(name, |s| {
                                s.not_after = Some(issued.held.plan.not_after);
                                s.last_error = None;
                            });
                            held = Some(issued.held);
                        }
                        Err((e, spent_order)) => {
                            if spent_order {
                                in_flight = false;
                                let _ = self.store.forget_in_flight(name).await;
                            } else {
                                in_flight = matches!(self.store.in_flight(name).await, Ok(Some(_)));
                            }
                            let (kind, until) = failure_of(&e);
                            let error = crate::error::chain(&e);
                            plan::failed(
                                &mut record,
                                Failure {
                                    kind,
                                    error: &error,
                                    until,
                                },
                                &config,
                                now,
                                (self.random)(),
                            );
                            tracing::warn!(name = %name, error = %e, retry_at = ?record.retry_at.map(|t| Rfc3339(from_unix(t))), "ACME order failed");
                        }
                    }
                }
            }
            first = false;
        }
    }

    /// A retry was asked for: the plan says whether the CA's limits allow it now.
    fn retry_asked(&self, name: &str, record: &mut Record) {
        if let Err(until) = plan::retry_now(record, self.clock.now()) {
            tracing::info!(name = %name, not_before = %Rfc3339(until), "retry asked for: the CA's limits allow it no sooner");
        }
    }

    /// Stores `record` if it changed since `saved`.
    async fn save(&self, name: &str, record: &Record, saved: &mut Record) {
        if record == saved {
            return;
        }
        match self.store.save_record(name, record).await {
            Ok(()) => *saved = record.clone(),
            Err(e) => {
                tracing::warn!(name = %name, error = %e, "cannot store the ACME record");
            }
        }
    }

    /// The status of `name`, as the plan decided.
    fn show(
        &self,
        name: &str,
        record: &Record,
        action: Action,
        held: Option<&Held>,
        now: SystemTime,
    ) {
        self.set(name, |s| {
            s.decided_at = Some(now);
            s.state = match action {
                Action::Wait { .. } | Action::FetchAri => NameState::Valid,
                Action::Order { .. } | Action::Resume => NameState::Ordering,
                Action::Backoff { .. } => NameState::Backoff,
                Action::GiveUp => NameState::Failed,
            };
            s.retry_at = match action {
                Action::Backoff { until } => Some(until),
                _ => None,
            };
            s.not_after = held.map(|h| h.plan.not_after);
            // With ARI, the time is not known before the CA's first answer (or failure).
            let deciding =
                action == Action::FetchAri && record.ari.is_none() && record.ari_failures == 0;
            s.renew_after = record
                .renew_at
                .map(from_unix)
                .filter(|_| held.is_some() && !deciding);
            s.renew_reason = record.renew_reason.filter(|_| held.is_some());
            s.ari_next = record.ari_next.map(from_unix).filter(|_| held.is_some());
            s.last_error.clone_from(&record.last_error);
            s.profile.clone_from(&record.profile);
            s.issuer = record.issuer.clone().filter(|_| held.is_some());
            s.fallback_reason = record.fallback_reason.clone().filter(|_| held.is_some());
        });
    }

    /// Sleeps until the clock reaches `at` (in steps of at most an hour, so a clock that
    /// jumps is followed and tokio's timer is never armed decades ahead); `true` if a retry
    /// was asked for first.
    async fn sleep_until(&self, at: SystemTime, retry: &mut watch::Receiver<u64>) -> bool {
        loop {
            let Ok(left) = at.duration_since(self.clock.now()) else {
                return false;
            };
            if left.is_zero() {
                return false;
            }
            tokio::select! {
                () = tokio::time::sleep(left.min(Duration::from_secs(3600))) => {}
                changed = retry.changed() => {
                    if changed.is_ok() {
                        return true;
                    }
                    // No one can ask any more: sleep on.
                    tokio::time::sleep(left.min(Duration::from_secs(3600))).await;
                }
            }
        }
    }

    /// One order for `group`: the one in flight resumed (at the CA it was placed with), or a
    /// new one at the preferred CA, and at the next when one fails for a reason of its own
    /// (a first order spends from the weekly budget, once; `replaces` names the held
    /// certificate, ARI, to the CA of the given index, which issued it). On failure, also
    /// whether the order in flight is spent (forgotten: the next try places another).
    async fn obtain(
        &self,
        term: &Term,
        group: &[String],
        replaces: Option<(&CertificateDer<'static>, usize)>,
        renewal: bool,
        in_flight: bool,
    ) -> Result<Obtained, (Error, bool)> {
        let name = &group[0];
        let kept = |e: Error| (e, false);
        let stored = if in_flight {
            self.store.in_flight(name).await.map_err(kept)?
        } else {
            None
        };
        if let Some(stored) = stored {
            // The CA whose directory has the order's origin.
            let at = (0..term.cas.len())
                .find(|&i| {
                    crate::fallback::origin(self.ca_config(i).0)
                        == crate::fallback::origin(&stored.url)
                })
                .unwrap_or(0);
            let resumed = match self.ca(term, at).await {
                Ok(ca) => ca
                    .resume(&stored.url, group)
                    .await
                    .map(|placed| (ca, placed)),
                Err(_) => None,
            };
            match resumed {
                Some((ca, placed)) => {
                    tracing::info!(name = %name, order = %stored.url, "resuming the stored ACME order");
                    return self
                        .complete(&ca, group, placed, stored.key_pem, None)
                        .await
                        .map(|(issued, profile)| Obtained {
                            issued,
                            profile,
                            issuer: at,
                            fallback_reason: None,
                        });
                }
                None => {
                    self.withdraw_for(group).await;
                    self.store.forget_in_flight(name).await.map_err(kept)?;
                }
            }
        }
        let mut spent = renewal;
        let mut passed_over: Vec<String> = Vec::new();
        for i in 0..term.cas.len() {
            let last = i + 1 == term.cas.len();
            let (url, _, _) = self.ca_config(i);
            // An error, whether it spent the order in flight, and whether it is this CA's
            // alone (a profile it does not offer).
            let attempt = async {
                let ca = self.ca(term, i).await.map_err(|e| (e, false, false))?;
                // Before anything is spent: a profile the CA does not offer may mean no order.
                let profile = self.profile_for(&ca, group).map_err(|e| (e, false, true))?;
                if !spent {
                    self.spend(term, name)
                        .await
                        .map_err(|e| (e, false, false))?;
                    spent = true;
                }
                let replaces = replaces
                    .filter(|(_, issuer)| *issuer == i)
                    .map(|(leaf, _)| leaf);
                self.place(&ca, group, replaces, profile)
                    .await
                    .map_err(|(e, spent_order)| (e, spent_order, false))
            };
            match attempt.await {
                Ok((issued, profile)) => {
                    if !passed_over.is_empty() {
                        tracing::warn!(name = %name, issuer = %url, passed_over = %passed_over.join("; "), "ordered from a fallback CA");
                    }
                    return Ok(Obtained {
                        issued,
                        profile,
                        issuer: i,
                        fallback_reason: (!passed_over.is_empty()).then(|| passed_over.join("; ")),
                    });
                }
                Err((e, _, this_ca)) if !last && (this_ca || crate::fallback::ca_fault(&e)) => {
                    tracing::warn!(name = %name, directory = %url, error = %e, "the CA failed; asking the next");
                    let why = crate::error::chain(&e);
                    // Named once: most of the CA's errors name its directory already.
                    passed_over.push(if why.contains(url) {
                        why
                    } else {
                        format!("{url}: {why}")
                    });
                    // An order placed there is left: the next CA's replaces it.
                    if let Err(e) = self.store.forget_in_flight(name).await {
                        return Err((e, false));
                    }
                }
                Err((e, spent_order, _)) => return Err((e, spent_order)),
            }
        }
        unreachable!("the preferred CA is always tried")
    }

    /// A new order at `ca`, completed.
    async fn place(
        &self,
        ca: &Ca,
        group: &[String],
        replaces: Option<&CertificateDer<'static>>,
        profile: Option<String>,
    ) -> Result<(Issued, Option<String>), (Error, bool)> {
        let name = &group[0];
        let kept = |e: Error| (e, false);
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(|e| {
            kept(Error::Order {
                name: name.clone(),
                reason: "cannot make the order's key".into(),
                source: Some(Box::new(e)),
            })
        })?;
        let key_pem = key.serialize_pem().into_bytes();
        let placed = ca
            .place(group, replaces, profile.as_deref())
            .await
            .map_err(kept)?;
        // Before any challenge is answered: whoever comes next resumes it.
        self.store
            .save_in_flight(
                name,
                &InFlight {
                    url: placed.url().to_owned(),
                    key_pem: key_pem.clone(),
                },
            )
            .await
            .map_err(kept)?;
        tracing::info!(name = %name, order = placed.url(), "placed an ACME order");
        self.complete(ca, group, placed, key_pem, profile).await
    }

    /// An order placed or resumed at `ca`, through its challenges to its certificate, checked.
    async fn complete(
        &self,
        ca: &Ca,
        group: &[String],
        mut placed: crate::order::Placed,
        key_pem: Vec<u8>,
        asked: Option<String>,
    ) -> Result<(Issued, Option<String>), (Error, bool)> {
        let chain = ca
            .complete(&mut placed, group, &key_pem, &self.answering())
            .await
            .map_err(|e| {
                let spent = matches!(e, Error::Refused { .. } | Error::Rejected { .. });
                (e, spent)
            })?;
        // Under the profile the CA says, else the one asked for (a resumed order: the CA's word).
        let profile = placed.profile().or(asked);
        // Finalized with this key: a certificate that cannot be used ends the order.
        self.check(
            group,
            StoredCert {
                chain_pem: chain.into_bytes(),
                key_pem,
            },
        )
        .map(|issued| (issued, profile))
        .map_err(|e| (e, true))
    }

    /// The profile to ask for: the configured one when the directory advertises it; else the
    /// CA's default (with a note in the status), or, when it is required, no order: the error
    /// names what the directory advertises. With none configured, a group with an IP address
    /// asks for [`SHORTLIVED`] when the directory advertises it (Let's Encrypt issues for
    /// addresses only under it), else the CA's default.
    fn profile_for(&self, ca: &Ca, group: &[String]) -> Result<Option<String>, Error> {
        let name = &group[0];
        let advertised = ca.profiles();
        let Some(profile) = &self.profile else {
            let address = group.iter().any(|n| crate::ip::address(n).is_some());
            let shortlived = advertised.iter().any(|p| p == SHORTLIVED);
            return Ok((address && shortlived).then(|| SHORTLIVED.to_owned()));
        };
        if advertised.contains(&profile.name) {
            self.set(name, |s| s.profile_note = None);
            return Ok(Some(profile.name.clone()));
        }
        let offered = if advertised.is_empty() {
            "it advertises none".to_owned()
        } else {
            format!("it advertises {}", advertised.join(", "))
        };
        if profile.required {
            return Err(Error::Rejected {
                name: name.to_owned(),
                reason: format!(
                    "the profile {} is required, and the CA does not offer it ({offered})",
                    profile.name
                ),
            });
        }
        let note = format!(
            "the CA does not offer the profile {} ({offered}): ordered with its default",
            profile.name
        );
        tracing::warn!(name = %name, profile = %profile.name, "{note}");
        self.set(name, |s| s.profile_note = Some(note));
        Ok(None)
    }

    /// Takes one first order for `name` from its registered domain's weekly budget, or says
    /// until when it is spent (the CA is not asked).
    ///
    /// The spend is stored before this returns (a restart, or the next leader, does not
    /// forget it), but many spends at once share one write: the first waiting writer stores
    /// the latest budget, and those whose spend it includes return without writing (at start,
    /// 100 names cost two writes, not 100 in a row).
    async fn spend(&self, term: &Term, name: &str) -> Result<(), Error> {
        let version = {
            let mut guard = term.budget.lock().await;
            let (budget, version) = &mut *guard;
            budget
                .spend(name, self.per_week, self.clock.now())
                .map_err(|spent| Error::Budget {
                    name: name.to_owned(),
                    domain: spent.domain,
                    limit: self.per_week,
                    until: spent.until,
                })?;
            *version += 1;
            *version
        };
        let mut stored = term.budget_stored.lock().await;
        if *stored >= version {
            return Ok(());
        }
        let (latest, version) = {
            let guard = term.budget.lock().await;
            (guard.0.clone(), guard.1)
        };
        self.store.save_budget(&latest).await?;
        *stored = version;
        Ok(())
    }

    /// Checks what the CA issued (or what is stored): PEM, for every name of the group, for
    /// the key.
    fn check(&self, group: &[String], stored: StoredCert) -> Result<Issued, Error> {
        let name = &group[0];
        let bad = |reason: String| Error::BadCertificate {
            name: name.clone(),
            reason,
        };
        let bundle = Decoder::default()
            .bundle(
                ("the certificate chain", &stored.chain_pem),
                ("the key", &stored.key_pem),
                None,
                Origin::Other(format!("acme:{name}")),
            )
            .map_err(|e| bad(e.to_string()))?;
        let leaf = bundle
            .leaf()
            .cloned()
            .ok_or_else(|| bad("no certificate".into()))?;
        let info = LeafInfo::parse(&leaf).map_err(|e| bad(e.to_string()))?;
        if let Some(missing) = group.iter().find(|n| !info.covers(n)) {
            return Err(bad(format!("it does not cover {missing}")));
        }
        let key = self
            .provider
            .key_provider
            .load_private_key(bundle.key().clone_key())
            .map_err(|e| bad(format!("the key cannot be loaded: {e}")))?;
        if key
            .public_key()
            .is_some_and(|spki| spki.as_ref() != info.spki_der.as_slice())
        {
            return Err(bad("it is not for the order's key".into()));
        }
        Ok(Issued {
            bundle,
            held: Held {
                plan: PlanHeld {
                    id: order::certificate_id(&leaf),
                    not_before: info.not_before,
                    not_after: info.not_after,
                },
                leaf,
            },
            stored,
        })
    }
}

/// What kind of failure `e` is for the plan, and until when it waits if the error says.
fn failure_of(e: &Error) -> (FailureKind, Option<SystemTime>) {
    match e {
        Error::Refused { .. } => (FailureKind::Validation, None),
        Error::Rejected { .. } => (FailureKind::Identifier, None),
        Error::RateLimited { until, .. } => (FailureKind::RateLimited, Some(*until)),
        Error::Budget { until, .. } => (FailureKind::Budget, Some(*until)),
        Error::BadCertificate { .. } => (FailureKind::BadCertificate, None),
        _ => (FailureKind::Transient, None),
    }
}
