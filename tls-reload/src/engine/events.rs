//! What the engine tells the outside: each [`Event`] is one `tracing` event and its metrics,
//! emitted together by [`Event::emit`], so a log line and a counter cannot drift apart.

use std::sync::Arc;

use tls_source::Origin;

use super::Label;
use crate::status::CertInfo;
use crate::{Error, metrics};
use tls_source::clock::Rfc3339;

/// Something that happened to a route or to the trust, for the log and the metrics.
#[derive(Debug, Clone)]
pub(crate) enum Event {
    /// A certificate was installed (its status says whether it expires soon). `listing`: a
    /// keyed route installed while its source's initial list loads, logged at debug (the
    /// list's [`ListComplete`](Self::ListComplete) counts them; tens of thousands of lines at
    /// every start would bury what matters).
    Installed {
        route: Option<Label>,
        info: Arc<CertInfo>,
        generation: u64,
        expiring: bool,
        keyed: bool,
        listing: bool,
    },
    /// A bundle was dropped unchecked: a newer one for its route came in the same batch.
    Superseded { origin: Origin },
    /// The source gave the installed material again after an error.
    Recovered {
        route: Option<Label>,
        origin: Origin,
        keyed: bool,
    },
    /// A bundle was refused; the route keeps what it serves (`serving`: whether it serves
    /// anything yet).
    Rejected {
        route: Option<Label>,
        error: Arc<Error>,
        serving: bool,
        keyed: bool,
    },
    /// The route's source reported an error.
    SourceError {
        route: Option<Label>,
        error: Arc<Error>,
        serving: bool,
        keyed: bool,
    },
    /// A keyed source reported an error about no one route.
    KeyedSourceError { error: Arc<Error> },
    /// A source panicked and was dropped (`routes`: the routes it fed).
    SourcePanicked {
        routes: Vec<Option<Label>>,
        message: String,
        keyed: bool,
    },
    /// The client-CA source panicked and was dropped.
    TrustSourcePanicked { message: String },
    /// The client-CA source's input was refused.
    TrustRejected { reason: String },
    /// A client CA's overlap ended.
    CaLeft { fingerprint: String },
    /// A keyed route's key is gone.
    RouteRemoved { route: Label },
    /// A name is served by an earlier route already.
    NameTaken { route: Option<Label>, name: String },
    /// The served certificate entered its expiry-warning window without being replaced.
    ExpiringNotReplaced {
        route: Option<Label>,
        info: Arc<CertInfo>,
    },
    /// The served certificate expired.
    ServedExpired {
        route: Option<Label>,
        error: Arc<Error>,
        keyed: bool,
    },
    /// The earliest `notAfter` of the keyed routes changed (`None`: no keyed route serves).
    KeyedEarliest {
        not_after: Option<std::time::SystemTime>,
    },
    /// Readiness changed (or was first computed).
    Ready(bool),
    /// A keyed source's initial list is in: its routes are served from now on (`routes`:
    /// its keys; `serving`: those with a certificate; `refused`: those without one, whose
    /// input was refused).
    ListComplete {
        source: usize,
        routes: usize,
        serving: usize,
        refused: usize,
    },
    /// The static routes, at the start: their counters are recorded at 0.
    Declared { routes: Vec<Option<Label>> },
}

/// A `tracing` event about a route's certificate, with the fields every such event carries.
macro_rules! cert_event {
    ($level:ident, $info:expr, $route:expr, $($rest:tt)+) => {
        tracing::$level!(
            fingerprint = %$info.fingerprint_sha256,
            not_after = %Rfc3339($info.not_after),
            origin = %$info.origin,
            route = $route.as_deref(),
            $($rest)+
        )
    };
}

impl Event {
    /// Logs the event and, with `metrics`, records its metrics (the client side records none:
    /// its routes are not the server's).
    pub(crate) fn emit(&self, with_metrics: bool) {
        let m = with_metrics;
        match self {
            Self::Installed {
                route,
                info,
                generation,
                expiring,
                keyed,
                listing,
            } => {
                if *listing {
                    cert_event!(debug, info, route, generation, "certificate installed");
                } else {
                    cert_event!(info, info, route, generation, "certificate installed");
                }
                if *expiring {
                    cert_event!(warn, info, route, "installed certificate expires soon");
                }
                if m {
                    metrics::installed(series(route, *keyed), info, *keyed);
                }
            }
            Self::Superseded { origin } => {
                tracing::debug!(%origin, "certificate superseded by a newer one before it was checked");
            }
            Self::Recovered {
                route,
                origin,
                keyed,
            } => {
                tracing::info!(%origin, route = route.as_deref(), "certificate source recovered; certificate unchanged");
                if m {
                    metrics::recovered(series(route, *keyed));
                }
            }
            Self::Rejected {
                route,
                error,
                serving,
                keyed,
            } => {
                let keeping = keeping(*serving);
                if let Error::Internal {
                    origin, message, ..
                } = &**error
                {
                    tracing::error!(route = route.as_deref().unwrap_or("default"), %origin, panic = %message, "checking a certificate panicked; rejected; {keeping}");
                } else {
                    tracing::warn!(error = %error, route = route.as_deref(), "certificate rejected; {keeping}");
                }
                if m {
                    metrics::rejected(series(route, *keyed), error.reason());
                }
            }
            Self::SourceError {
                route,
                error,
                serving,
                keyed,
            } => {
                let keeping = keeping(*serving);
                tracing::warn!(error = %error, route = route.as_deref(), "certificate source error; {keeping}");
                if m {
                    let series = series(route, *keyed);
                    metrics::source_error(series);
                    if error.is_undecodable_input() {
                        metrics::rejected(series, error.reason());
                    }
                }
            }
            Self::KeyedSourceError { error } => {
                tracing::warn!(error = %error, "certificate source error; keeping the current certificates");
                if m {
                    metrics::source_error(None);
                }
            }
            Self::SourcePanicked {
                routes,
                message,
                keyed,
            } => {
                let names: Vec<&str> = routes
                    .iter()
                    .map(|r| r.as_deref().unwrap_or("default"))
                    .collect();
                tracing::error!(routes = ?names, panic = %message, "a certificate source panicked and was dropped; its routes keep their certificates and will not rotate");
                if m && *keyed {
                    metrics::rejected(Some(metrics::KEYED), "internal");
                } else if m {
                    for route in routes {
                        metrics::rejected(route.as_deref(), "internal");
                    }
                }
            }
            Self::TrustSourcePanicked { message } => {
                tracing::error!(panic = %message, "the client CA source panicked and was dropped; keeping the trusted CAs, which will not change again");
                if m {
                    metrics::rejected(None, "internal");
                }
            }
            Self::TrustRejected { reason } => {
                tracing::warn!(error = %reason, "client CA source: keeping the trusted CAs");
            }
            Self::CaLeft { fingerprint } => {
                tracing::info!(%fingerprint, "client CA no longer trusted; sessions from before must authenticate again");
            }
            Self::RouteRemoved { route } => tracing::info!(route = &**route, "route removed"),
            Self::NameTaken { route, name } => {
                tracing::debug!(route = route.as_deref(), %name, "name already served by another route");
            }
            Self::ExpiringNotReplaced { route, info } => {
                cert_event!(
                    warn,
                    info,
                    route,
                    "the served certificate expires soon and has not been replaced"
                );
            }
            Self::ServedExpired {
                route,
                error,
                keyed,
            } => {
                tracing::warn!(error = %error, route = route.as_deref(), "the served certificate has expired");
                if m {
                    metrics::rejected(series(route, *keyed), error.reason());
                }
            }
            Self::KeyedEarliest { not_after } => {
                if m {
                    metrics::keyed_earliest(*not_after);
                }
            }
            Self::Declared { routes } => {
                if m {
                    for route in routes {
                        metrics::declared(route.as_deref());
                    }
                }
            }
            Self::Ready(ready) => {
                if m {
                    metrics::ready(*ready);
                }
            }
            Self::ListComplete {
                source,
                routes,
                serving,
                refused,
            } => {
                tracing::info!(
                    source,
                    routes,
                    serving,
                    refused,
                    "the keyed source's initial list is in; its routes are served"
                );
            }
        }
    }
}

/// What a refusal leaves served: the current certificate, or (before the first) nothing.
fn keeping(serving: bool) -> &'static str {
    if serving {
        "keeping the current certificate"
    } else {
        "no certificate is served yet"
    }
}

/// The `route` label of a route's series: its own, or the keyed routes' one.
fn series(route: &Option<Label>, keyed: bool) -> Option<&str> {
    if keyed {
        Some(metrics::KEYED)
    } else {
        route.as_deref()
    }
}
