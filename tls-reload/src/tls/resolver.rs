//! [`CertResolver`]: what rustls asks on every handshake.

use std::fmt;
use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio_util::sync::CancellationToken;

use super::{Slot, Table};

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
/// The reload task runs as long as a resolver or a `Reloader` handle exists (it holds only a
/// weak reference, upgraded for each store).
pub struct CertResolver {
    /// The default route: served when no SNI route matches (or when there are none). Inline, so
    /// the one-certificate path is one load.
    default: Slot,
    /// The SNI routes; empty without routes.
    table: ArcSwap<Table>,
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
    pub(crate) fn new(routes: bool, strict: bool, gone: CancellationToken) -> Self {
        Self {
            default: Slot::const_empty(),
            table: ArcSwap::from_pointee(Table::default()),
            sni: routes.then_some(Sni { strict }),
            gone,
        }
    }

    /// Installs the default certificate (the reload task only, after validation).
    pub(crate) fn store_default(&self, certified: Arc<CertifiedKey>) {
        self.default.store(Some(certified));
    }

    /// Installs a new SNI table (the reload task only).
    pub(crate) fn store_table(&self, table: Table) {
        self.table.store(Arc::new(table));
    }

    /// The default certificate served now, if any: what `resolve` returns for a handshake no
    /// SNI route matches (the same code, so the resolve benches measure it).
    #[inline]
    pub fn current(&self) -> Option<Arc<CertifiedKey>> {
        self.default.load_full()
    }

    /// The certificate a handshake with this server name (SNI) is served: exactly what
    /// `resolve` returns, for benches and for callers that resolve by hand.
    #[inline]
    pub fn lookup(&self, server_name: Option<&str>) -> Option<Arc<CertifiedKey>> {
        let Some(sni) = self.sni else {
            return self.current();
        };
        if let Some(found) = server_name.and_then(|name| self.table.load().lookup(name)) {
            return Some(found);
        }
        if sni.strict { None } else { self.current() }
    }

    /// How many names the SNI table holds.
    pub fn route_names(&self) -> usize {
        self.table.load().len()
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
            .field("has_default", &self.default.load().is_some())
            .field("route_names", &self.route_names())
            .field("strict", &self.sni.is_some_and(|s| s.strict))
            .finish()
    }
}
