//! [`CertResolver`]: what rustls asks on every handshake.

use std::fmt;
use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio_util::sync::CancellationToken;

use super::{Slot, Table};

/// What the reload task writes and the resolver reads.
#[derive(Debug)]
pub(crate) struct Shared {
    /// The default route: served when no SNI route matches (or when there are none).
    pub(crate) default: Arc<Slot>,
    /// The SNI routes; empty without routes.
    pub(crate) table: ArcSwap<Table>,
}

/// The rustls certificate resolver that serves whatever the [`Reloader`](crate::Reloader)
/// installed last: by SNI when it has routes, else (or for an unknown or missing name) the
/// default certificate.
///
/// `resolve` is wait-free and allocation-free. With one certificate it is one atomic load and a
/// reference-count increment (arc-swap); with SNI routes, a hash lookup of the name (exact,
/// then the one-label wildcard) before that. It returns `None`, so the handshake fails cleanly,
/// when there is nothing to serve: before the first certificate is installed (wait for
/// [`Reloader::ready`](crate::Reloader::ready) before accepting), and, in strict mode, for a
/// name no route serves.
///
/// The reload task runs as long as a resolver or a `Reloader` handle exists.
pub struct CertResolver {
    shared: Arc<Shared>,
    /// `None` without SNI routes: the single-certificate path skips the table.
    sni: Option<Sni>,
    /// Cancelled when the last resolver is dropped: the reload task then ends.
    gone: CancellationToken,
}

#[derive(Debug, Clone, Copy)]
struct Sni {
    strict: bool,
}

// ===== impl CertResolver =====

impl CertResolver {
    pub(crate) fn new(
        shared: Arc<Shared>,
        routes: bool,
        strict: bool,
        gone: CancellationToken,
    ) -> Self {
        Self {
            shared,
            sni: routes.then_some(Sni { strict }),
            gone,
        }
    }

    /// The default certificate served now, if any: what `resolve` returns for a handshake no
    /// SNI route matches (the same code, so the resolve benches measure it).
    #[inline]
    pub fn current(&self) -> Option<Arc<CertifiedKey>> {
        self.shared.default.load_full()
    }

    /// The certificate a handshake with this server name (SNI) is served: exactly what
    /// `resolve` returns, for benches and for callers that resolve by hand.
    #[inline]
    pub fn lookup(&self, server_name: Option<&str>) -> Option<Arc<CertifiedKey>> {
        let Some(sni) = self.sni else {
            return self.current();
        };
        if let Some(found) = server_name.and_then(|name| self.shared.table.load().lookup(name)) {
            return Some(found);
        }
        if sni.strict { None } else { self.current() }
    }

    /// How many names the SNI table holds.
    pub fn route_names(&self) -> usize {
        self.shared.table.load().len()
    }
}

impl ResolvesServerCert for CertResolver {
    fn resolve(&self, client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        match self.sni {
            None => self.current(),
            Some(_) => self.lookup(client_hello.server_name()),
        }
    }
}

impl Drop for CertResolver {
    fn drop(&mut self) {
        self.gone.cancel();
    }
}

impl fmt::Debug for CertResolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertResolver")
            .field("has_default", &self.shared.default.load().is_some())
            .field("route_names", &self.route_names())
            .field("strict", &self.sni.is_some_and(|s| s.strict))
            .finish()
    }
}
