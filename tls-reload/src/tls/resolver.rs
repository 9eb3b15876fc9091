//! [`CertResolver`]: what rustls asks on every handshake.

use std::cell::RefCell;
use std::fmt;
use std::future::Future;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use arc_swap::{ArcSwap, ArcSwapOption};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio_util::sync::CancellationToken;

use super::{Slot, Table, TableEdit};

/// The rustls certificate resolver that serves whatever the [`Reloader`](crate::Reloader)
/// installed last: by SNI when it has routes, else (or for an unknown or missing name) the
/// default certificate.
///
/// A handshake without a server name (rustls reports an IP address sent as one as none too)
/// is served the certificate for the local address it arrived on ([`Incoming`](crate::Incoming)
/// knows it; an acceptor of your own says it with [`on_local_addr`]): a route's for that IP
/// address, else the default certificate if it covers the address; else the one IP
/// certificate among the routes if there is exactly one (behind NAT the address a client
/// reached is not the socket's); else what any unknown name gets: the default certificate, or
/// nothing under strict SNI.
///
/// `resolve` is wait-free and allocation-free. With one certificate it is, on each thread, one
/// atomic load of the installed generation and a reference-count increment of the certificate
/// that thread last saw (arc-swap's load only after a rotation); with SNI routes, a hash lookup
/// of the name (exact, then the one-label wildcard) and an arc-swap load. It returns `None`, so the handshake fails cleanly,
/// when there is nothing to serve: before the first certificate is installed (wait for
/// [`Reloader::ready`](crate::Reloader::ready) before accepting), and, in strict mode, for a
/// name no route serves.
///
/// The reload task runs as long as a resolver or a `Reloader` handle exists (it holds only a
/// weak reference, upgraded for each store).
///
/// Each thread that resolved keeps a reference to the default certificate it last served, so a
/// replaced certificate (and its key) is freed once every such thread has resolved again, or
/// has exited.
pub struct CertResolver {
    /// The default route: served when no SNI route matches (or when there are none). Inline, so
    /// the one-certificate path is one load.
    default: Slot,
    /// Bumped after every store into `default`: a thread's cached certificate is current while
    /// the generation it was read at is.
    generation: AtomicU64,
    /// Tells this resolver's entries in the per-thread cache from another's (never reused).
    id: u64,
    /// The SNI routes; empty without routes.
    table: ArcSwap<Table>,
    /// The default certificate with the IP addresses it covers, when it covers any: a
    /// handshake without a server name that arrived on one of them is served it.
    default_addrs: ArcSwapOption<DefaultAddrs>,
    /// The table before the last edit and the edits it lacks: the next edit's starting point.
    spare: Mutex<Option<(Arc<Table>, Vec<TableEdit>)>>,
    /// `None` without SNI routes: the single-certificate path skips the table.
    sni: Option<Sni>,
    /// Cancelled when the last resolver is dropped: the reload task then ends.
    gone: CancellationToken,
    /// Asked first, when set ([`Builder::handshake_hook`](crate::Builder::handshake_hook)).
    hook: Option<Arc<dyn HandshakeHook>>,
}

/// A hook the resolver asks before its routes: how a source crate reaches into handshakes
/// without the core depending on it. An ACME client answers a TLS-ALPN-01 challenge this way
/// (the CA's validation handshake, recognised by its `acme-tls/1` ALPN, gets the challenge
/// certificate); anything it does not claim goes to the routes as usual.
///
/// It runs on every handshake, on the handshake's thread: it must be quick and must not block.
///
/// ```
/// use std::sync::Arc;
/// use tls_reload::HandshakeHook;
/// use tls_reload::rustls::server::ClientHello;
/// use tls_reload::rustls::sign::CertifiedKey;
///
/// /// Answers handshakes for one name with a certificate of its own.
/// #[derive(Debug)]
/// struct Maintenance(Arc<CertifiedKey>);
///
/// impl HandshakeHook for Maintenance {
///     fn answer(&self, hello: &ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
///         (hello.server_name() == Some("maintenance.example.com")).then(|| Arc::clone(&self.0))
///     }
/// }
/// ```
pub trait HandshakeHook: Send + Sync + std::fmt::Debug + 'static {
    /// The certificate for this handshake, or `None` to let the routes answer.
    fn answer(&self, hello: &ClientHello<'_>) -> Option<Arc<CertifiedKey>>;

    /// Whether this hook takes whole handshakes over ([`take_over`](Self::take_over)). Only
    /// then does the accept stream read each `ClientHello` before it picks a config (rustls's
    /// `LazyConfigAcceptor`), and start handshakes before the reloader is ready. Default:
    /// `false`.
    fn takes_over(&self) -> bool {
        false
    }

    /// A handshake this hook answers alone, with a config of its own ([`Takeover`]): no
    /// client authentication, the one ALPN protocol it names, its certificate, and the
    /// connection closed once the handshake is done; never given to the server. Asked before
    /// anything else, also before the reloader is [ready](crate::Reloader::ready) (an ACME
    /// CA's TLS-ALPN-01 validation must get through on a first start, when nothing is
    /// installed yet). `None` (the default) leaves the handshake to the routes.
    ///
    /// Only asked when [`takes_over`](Self::takes_over) says so. With an acceptor of your
    /// own, [`Reloader::takeover_config`](crate::Reloader::takeover_config) asks it.
    fn take_over(&self, hello: &ClientHello<'_>) -> Option<Takeover> {
        let _ = hello;
        None
    }
}

/// A handshake a [`HandshakeHook`] answers alone ([`HandshakeHook::take_over`]): the
/// certificate and the one ALPN protocol it is served with.
#[derive(Clone)]
pub struct Takeover {
    pub(crate) certified: Option<Arc<CertifiedKey>>,
    pub(crate) alpn: Vec<u8>,
}

impl Takeover {
    /// The handshake is served `certified`, with `alpn` as the only protocol (a client that
    /// does not offer it fails the handshake).
    pub fn new(certified: Arc<CertifiedKey>, alpn: impl Into<Vec<u8>>) -> Self {
        Self {
            certified: Some(certified),
            alpn: alpn.into(),
        }
    }

    /// The handshake is taken over and fails with an alert: nothing is served to it (an ACME
    /// validation for a name with no challenge in progress must not reach the routes).
    pub fn refuse(alpn: impl Into<Vec<u8>>) -> Self {
        Self {
            certified: None,
            alpn: alpn.into(),
        }
    }

    /// The certificate served, `None` when the handshake is refused.
    pub fn certified(&self) -> Option<&Arc<CertifiedKey>> {
        self.certified.as_ref()
    }

    /// The ALPN protocol served.
    pub fn alpn(&self) -> &[u8] {
        &self.alpn
    }
}

impl fmt::Debug for Takeover {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Takeover")
            .field("refused", &self.certified.is_none())
            .field("alpn", &String::from_utf8_lossy(&self.alpn))
            .finish_non_exhaustive()
    }
}

/// The default certificate and its IP addresses.
struct DefaultAddrs {
    ips: Box<[IpAddr]>,
    key: Arc<CertifiedKey>,
}

#[derive(Debug, Clone, Copy)]
struct Sni {
    strict: bool,
}

tokio::task_local! {
    /// The local address of the connection whose handshake is being polled ([`on_local_addr`]).
    static LOCAL_ADDR: IpAddr;
}

/// Runs `handshake` (an accept of your own, tokio-rustls's `TlsAcceptor::accept` say) as a
/// handshake that arrived on the local address `local` (the accepted socket's
/// `local_addr()`, not the listener's, which may be `0.0.0.0`): if it sends no server name,
/// the [`CertResolver`] serves it the IP certificate covering `local`. The accept stream
/// ([`Incoming`](crate::Incoming)) does this itself.
///
/// ```
/// # #[cfg(feature = "accept")]
/// # async fn run(reloader: tls_reload::Reloader, listener: tokio::net::TcpListener) -> std::io::Result<()> {
/// let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(reloader.server_config().unwrap()));
/// let (tcp, _peer) = listener.accept().await?;
/// let local = tcp.local_addr()?.ip();
/// let tls = tls_reload::on_local_addr(local, acceptor.accept(tcp)).await?;
/// # drop(tls); Ok(()) }
/// ```
pub fn on_local_addr<F: Future>(local: IpAddr, handshake: F) -> impl Future<Output = F::Output> {
    LOCAL_ADDR.scope(local.to_canonical(), handshake)
}

/// Where resolver ids come from.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A thread's last default certificate: the resolver, the generation it was read at, and it.
struct Cached {
    id: u64,
    generation: u64,
    key: Option<Arc<CertifiedKey>>,
}

thread_local! {
    static CACHE: RefCell<Cached> = const {
        RefCell::new(Cached { id: 0, generation: 0, key: None })
    };
}

// ===== impl CertResolver =====

impl CertResolver {
    pub(crate) fn new(
        routes: bool,
        strict: bool,
        gone: CancellationToken,
        hook: Option<Arc<dyn HandshakeHook>>,
    ) -> Self {
        Self {
            hook,
            default: Slot::const_empty(),
            generation: AtomicU64::new(0),
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            table: ArcSwap::from_pointee(Table::default()),
            default_addrs: ArcSwapOption::const_empty(),
            spare: Mutex::new(None),
            sni: routes.then_some(Sni { strict }),
            gone,
        }
    }

    /// Installs the default certificate (the reload task only, after validation).
    pub(crate) fn store_default(&self, certified: Arc<CertifiedKey>) {
        self.default.store(Some(certified));
        // After the store: a reader that sees the new generation then loads the new certificate.
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// Says which addresses the default certificate `key` covers (the reload task only, as it
    /// installs the default; under strict SNI the default serves from a slot of its own).
    pub(crate) fn store_default_addrs(&self, ips: &[IpAddr], key: &Arc<CertifiedKey>) {
        self.default_addrs.store((!ips.is_empty()).then(|| {
            Arc::new(DefaultAddrs {
                ips: ips.iter().map(IpAddr::to_canonical).collect(),
                key: Arc::clone(key),
            })
        }));
    }

    /// Installs a new SNI table (the reload task only).
    pub(crate) fn store_table(&self, table: Table) {
        // The spare starts as a copy: the next edit costs the edit, not a copy of the table.
        let spare = Arc::new(table.clone());
        self.table.store(Arc::new(table));
        *self.spare.lock().unwrap_or_else(PoisonError::into_inner) = Some((spare, Vec::new()));
    }

    /// Edits the SNI table in proportion to the change, while lookups stay wait-free: the
    /// edits go into the previous table (kept aside as the spare, brought up to date with the
    /// edits it missed) once no lookup holds it any more, and it is swapped in; only if a
    /// lookup still holds it is the current table copied instead.
    pub(crate) fn edit_table(&self, edits: &[TableEdit]) {
        let mut spare = self.spare.lock().unwrap_or_else(PoisonError::into_inner);
        let mut next = match spare.take() {
            Some((table, missed)) => match Arc::try_unwrap(table) {
                Ok(mut table) => {
                    table.edit(&missed);
                    table
                }
                Err(_) => Table::clone(&self.table.load()),
            },
            None => Table::clone(&self.table.load()),
        };
        next.edit(edits);
        let previous = self.table.swap(Arc::new(next));
        *spare = Some((previous, edits.to_vec()));
    }

    /// The default certificate served now, if any: what `resolve` returns for a handshake no
    /// SNI route matches (the same code, so the resolve benches measure it).
    #[inline]
    pub fn current(&self) -> Option<Arc<CertifiedKey>> {
        let generation = self.generation.load(Ordering::Acquire);
        CACHE
            .try_with(|cache| {
                let mut cache = cache.try_borrow_mut().ok()?;
                if cache.id != self.id || cache.generation != generation {
                    // A rotation since this thread last looked (or another resolver): the old
                    // certificate it held is released here.
                    *cache = Cached {
                        id: self.id,
                        generation,
                        key: self.default.load_full(),
                    };
                }
                Some(cache.key.clone())
            })
            .ok()
            .flatten()
            .unwrap_or_else(|| self.default.load_full())
    }

    /// The certificate a handshake with this server name (SNI) is served: exactly what
    /// `resolve` returns, for benches and for callers that resolve by hand (inside
    /// [`on_local_addr`], a handshake without a name is taken to have arrived there).
    #[inline]
    pub fn lookup(&self, server_name: Option<&str>) -> Option<Arc<CertifiedKey>> {
        let local = match server_name {
            None => LOCAL_ADDR.try_with(|ip| *ip).ok(),
            Some(_) => None,
        };
        self.lookup_on(server_name, local)
    }

    /// The certificate a handshake with this server name is served when it arrived on the
    /// local address `local` (`None`: not known), which only matters without a server name
    /// (see [`CertResolver`]).
    #[inline]
    pub fn lookup_on(
        &self,
        server_name: Option<&str>,
        local: Option<IpAddr>,
    ) -> Option<Arc<CertifiedKey>> {
        let Some(sni) = self.sni else {
            return self.current();
        };
        let table = self.table.load();
        let found = match server_name {
            Some(name) => table.lookup(name),
            // A route's IP certificate for the address, the default's, the one IP certificate.
            None => local
                .and_then(|local| {
                    table.lookup_addr(local).or_else(|| {
                        self.default_addrs
                            .load()
                            .as_ref()
                            .filter(|d| d.ips.contains(&local.to_canonical()))
                            .map(|d| Arc::clone(&d.key))
                    })
                })
                .or_else(|| table.sole_ip()),
        };
        if found.is_some() {
            return found;
        }
        if sni.strict { None } else { self.current() }
    }

    /// The hook, if it takes handshakes over.
    pub(crate) fn takeover_hook(&self) -> Option<&Arc<dyn HandshakeHook>> {
        self.hook.as_ref().filter(|hook| hook.takes_over())
    }

    /// How many names the SNI table holds.
    pub fn route_names(&self) -> usize {
        self.table.load().len()
    }
}

impl ResolvesServerCert for CertResolver {
    fn resolve(&self, client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        if let Some(answer) = self.hook.as_ref().and_then(|h| h.answer(&client_hello)) {
            return Some(answer);
        }
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
