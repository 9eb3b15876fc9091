//! [`FileSource`]: certificate, key and CA files, followed through symlink swaps.
//!
//! `mod.rs` is the public face (the source, its builder, the configuration); `reader.rs` decides
//! what a read may pass on ([`FileReader`]); `read.rs` reads the files consistently; `watch.rs`
//! is the notify fast path and the layout it follows, watched on Linux by `inotify.rs` (our own
//! inotify reader) and elsewhere by notify; `state.rs` is the loop that ties them.
//!
//! # How it works
//!
//! `state.rs`: the loop (a `futures::stream::unfold` state machine) and `Reads`, what makes a
//! read from any thread (it implements `event.rs`'s `OnEvent`, so neither watcher needs anything of
//! `state.rs`: the modules depend one way): right after an event that matters, on the watcher's own thread (no hop
//! through a runtime worker on the way to a rotation); for the poll backstop, a trigger or a
//! timer, on a blocking thread (`spawn_blocking`); never on a runtime worker. A read offers
//! what it found to the consumer's hook through the source's `Handoff` first, when one is
//! attached (what the hook takes never goes down the stream); a read that panics becomes that
//! read's error item there. Every read sends
//! what it found and the layout down one channel while it holds the reader, so results arrive
//! in the order reads happened; dropped, the source discards what is still in flight. With no
//! hook, it sends what it found first, yields its core once after a change, then works out and
//! sends the layout, and the loop yields once before following it (moving watches is inotify
//! calls, through notify's thread where notify watches), so the new certificate is served first. With a hook (which
//! installed the bundle and yielded right after the install), what it handed back (if anything)
//! and the layout go in one message, so a rotation wakes the consumer once; the loop follows the
//! layout at its next poll. The layout is worked out on the reading thread, not
//! later: until it is, the old generation's paths stay relevant, and the kubelet deletes that
//! generation right after the swap (a deferred layout cost one more read per rotation).
//! `reader.rs`: `FileReader`, what a read may pass on: unchanged bytes (compared with the bytes kept from the last read) nothing;
//! atomic replacements (new inodes) at once; in-place writes (the same files) only after
//! `in_place_quiet` without change and a re-read that agrees, so a chain written line by line is
//! never read half-way; one file of the pair replaced alone in a way that cannot make a good
//! pair (the key alone, or the certificate alone for another key: `half_pair`) waits the same
//! quiet for the other, so two renames milliseconds apart are one install, not a rejection first; files that went away and came back are new even if inode numbers are
//! reused; a read that ran out of descriptors (EMFILE) is retried every 250 ms. `read.rs`: the
//! stable read (each file opened non-blocking and stamped by `fstat`, read, then every path
//! stamped again; again if a change raced), into named fields (`PerFile`).
//! `watch.rs`: the watched set follows the layout: each read works out `targets`: each path's
//! directory (or its nearest existing ancestor), the directory of a directory symlink on the way,
//! and the directory the path resolves to, each with its (device, inode), and the paths whose
//! events matter (the configured paths, each link met resolving them, the resolved files: the
//! end of the resolution, `canonicalize` only where a `..` needs the file system). A kubelet
//! volume (a `..data` link to a directory beside it; Linux) is one target, in place of its
//! current generation's directory. `inotify.rs` (Linux) watches: an inotify instance read by a
//! thread of ours (mio for its wake-up to stop), in place of notify's watcher, for two things
//! notify cannot do: it asks only for events that can change what is read (no opens, reads or
//! read-only closes, so our own reads raise none), and it moves a volume's watch on its own
//! thread: a volume is watched as its directory and the generation `..data` leads to. When an
//! event names `..data`, the old generation's watch leaves the table and the kernel at once,
//! before the read (the kubelet removes that generation right after the swap; a watch left on
//! it had the kernel queue the removal's events and tear the watch down in the writer's own
//! system calls, about 1% of the time to serve from outside); right after the read (the new
//! certificate served), the new generation is watched and the files' stamps are checked once
//! (a write between the read and the new watch is read then): adding the mark before the read
//! cost the in-process swap its lead. (A directory below the generation, where a key's path
//! nests as in `sub/tls.crt`, is a target of its own, followed with the layout.) So the
//! kubelet's writing of the next generation and its removal of the old one raise no events
//! (a recursive notify watch took about a dozen per rotation, each queued in the writer's own
//! system calls and waking the watcher beside the handshakes), and `follow` has nothing to move after a rotation. Its table (each descriptor's
//! directory, each volume's generation) is shared by that thread and `Watching`. Elsewhere
//! notify's watcher watches, told not to follow links, with the read-only events filtered out
//! in its handler; both hand the paths an event names to `on_event`. Each
//! path is looked up once (`lstat`, `readlink` for a link) into `Lookups`, which keeps what the
//! last layout looked up until an event names the path or a directory above it (the watcher's
//! handler says so before it filters); a read after an event works the layout out from what is
//! left (a kubelet rotation: `..data` and the new generation, 5 syscalls, was ~15), any other
//! read (the first, the poll, a trigger, a recheck) looks everything up again. Every kept path
//! is absolute and link-free but for its last component, as event paths are, and lies at or
//! above a relevant path, so an event that would stale it also causes a read; a directory no
//! watch covers (those above the certificate's directory) changes unseen, as before, and the
//! poll's fresh read is the backstop. Events on other names are ignored.
//! `Watching::follow` unwatches what went or was replaced and watches what came, then
//! re-checks the files by their stamps (`FileReader::unchanged`, a few `stat` calls) and reads
//! once more only if one changed (what a new watch could have missed); what cannot be watched is
//! said once and retried with `Backoff`, or every 250 ms when descriptors ran out. Where notify
//! watches, it logs at info and warn when a watched directory is deleted before it is unwatched
//! (it removes the watch twice, for the parent's DELETE and for `DELETE_SELF`); serve's default
//! filter keeps notify at error, a library user's subscriber decides for itself.

use std::fmt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt as _};
use rustls_pki_types::CertificateDer;

use crate::inline::{Handoff, Inline};
use crate::{CertBundle, Decoder, Error, Trigger};

mod event;
#[cfg(target_os = "linux")]
mod inotify;
mod read;
mod reader;
mod state;
mod watch;

pub use reader::FileReader;
use state::State;

/// The default poll interval: 10 seconds.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(10);

/// The default [`FileSourceBuilder::in_place_quiet`]: 100 ms, ten times the slowest
/// line-by-line writer seen in black-box tests (a line every 3 to 10 ms), while a `cp` of a
/// whole chain takes well under a millisecond. Atomic replacements never wait for it.
pub const DEFAULT_IN_PLACE_QUIET: Duration = Duration::from_millis(100);

/// A [`CertSource`](crate::CertSource) that reads a certificate chain, a private key and an
/// optional CA bundle from files, and yields a new bundle whenever their content changes.
///
/// - **Symlink-safe.** Every check reads through the configured paths; no resolved target or inode
///   is cached. A Kubernetes Secret volume, where the kubelet writes a new timestamped directory
///   and renames a `..data` symlink over the old one, is followed on every rotation.
/// - **Fast path and backstop.** A watch on *directories* (not the files, whose watches
///   die when a symlink is swapped) triggers a read at once, on the watcher's own thread, for
///   events on the paths that matter (the configured paths, the links met resolving them, the
///   files they resolve to), so a kubelet swap is served well under a millisecond after the
///   rename: an atomic replacement is complete when it is seen. The watched
///   set follows the layout, recomputed after every read: each path's directory, or while it is
///   missing its nearest existing ancestor (so a directory created late, or removed and laid out
///   again, is seen); the directory holding a directory symlink on the way; and the directory
///   each path resolves to (so in-place writes behind the kubelet's `..data` links, or behind a
///   link into another directory, are seen). On Linux the watch is an inotify reader of our
///   own, which asks for no read-only events (its own reads raise none) and watches a kubelet
///   volume (a `..data` link to a directory beside it) as its directory and the current
///   generation, moving that watch itself when `..data` is swapped (the old generation's
///   watch removed at once, the new one's added right after the read, with a check of the
///   files' stamps): the kubelet's writing of the next generation and its removal of the old
///   one raise no events. Elsewhere `notify` watches. Working the layout out again after an
///   event looks up only what the event named (the new `..data` and generation, not every
///   directory from the root); a read no event caused looks everything up again. The poll
///   ([`poll_interval`](FileSourceBuilder::poll_interval), default 10 s) stays as the backstop;
///   what cannot be watched (inotify limits, an unsupported file system) is logged once and
///   retried with backoff while the source polls; when file descriptors ran out (EMFILE,
///   ENFILE), the watch and the read are tried again every 250 ms, so a rotation made meanwhile
///   is seen within a second of their return.
/// - **Off the runtime.** Files are read on the watcher's thread or a blocking thread
///   (`spawn_blocking`), never on a runtime worker.
/// - **Cheap when nothing changed.** The bytes read are compared with the last ones passed on;
///   unchanged input is not parsed and yields nothing.
/// - **Nothing read half-way.** Each file is stat'ed as it is opened, and every path again after
///   all are read; a read that raced a change is read again. Files replaced atomically (new
///   inodes: the `..data` swap, a rename over the file) are passed on at once. Files written *in place* (the same inodes with
///   new content, e.g. a chain rewritten line by line) are passed on only after they have been
///   quiet for [`in_place_quiet`](FileSourceBuilder::in_place_quiet) and a re-read agrees, so a
///   leaf without its intermediate is never passed on. One file of the pair replaced alone in
///   a way that cannot make a good pair (the key alone; with feature `x509`, the certificate
///   alone for another key) waits the same quiet for the other file: `--cert` and `--key`
///   replaced one after the other are passed on once, as one pair. A key that does not match
///   its certificate after that is refused by the reload core, which keeps the last good pair.
/// - **Errors are reports.** A missing, unreadable, oversized or malformed file is an `Err` item
///   naming the path; the same error is not repeated until something changes (or a
///   [`Trigger`] forces a read), and the source carries on.
/// - Warns once if the key file is readable by group or others (Unix).
///
/// The first check happens on the first poll of the stream; the watch starts then too. Dropping
/// the source stops the watch: no thread or task outlives it.
///
/// # Recovery
/// Every error is transient: the next event, poll or trigger reads the files again.
///
/// # Example
/// ```no_run
/// use std::time::Duration;
/// use futures::StreamExt;
/// use tls_source::FileSource;
///
/// # async fn run() {
/// let mut source = FileSource::builder("/etc/tls/tls.crt", "/etc/tls/tls.key")
///     .ca("/etc/tls/ca.crt")
///     .poll_interval(Duration::from_secs(30))
///     .build();
/// let reread = source.trigger(); // e.g. for a SIGHUP handler
/// while let Some(item) = source.next().await {
///     match item {
///         Ok(bundle) => println!("new certificate from {}", bundle.origin()),
///         Err(err) => eprintln!("{err}"),
///     }
/// }
/// # }
/// ```
#[must_use = "streams do nothing unless polled"]
pub struct FileSource {
    config: Arc<Config>,
    trigger: Trigger,
    inner: BoxStream<'static, Result<CertBundle, Error>>,
}

/// Configures a [`FileSource`]; made by [`FileSource::builder`].
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct FileSourceBuilder {
    config: Config,
}

#[derive(Debug, Clone)]
struct Config {
    /// With `certificates_only`, the CA file (and `key` the same path).
    cert: PathBuf,
    key: PathBuf,
    ca: Option<PathBuf>,
    ca_required: bool,
    poll_interval: Duration,
    notify: bool,
    in_place_quiet: Duration,
    decoder: Decoder,
    /// A [`CaFileSource`]: certificates only, no key.
    certificates_only: bool,
    /// Offered every item on the reading thread before it is sent ([`crate::inline`]). Made
    /// anew by `build`: a builder's clone never shares one.
    handoff: Handoff,
}

// ===== impl FileSourceBuilder =====

impl FileSourceBuilder {
    /// Also reads a CA bundle (`ca.crt`) into [`CertBundle::ca`]. A missing CA file is an error
    /// like a missing certificate; see [`ca_if_present`](Self::ca_if_present) for an optional one.
    pub fn ca(mut self, path: impl Into<PathBuf>) -> Self {
        self.config.ca = Some(path.into());
        self.config.ca_required = true;
        self
    }

    /// Reads a CA bundle into [`CertBundle::ca`] whenever the file exists; when it does not, the
    /// bundle has no CA (as a `kubernetes.io/tls` Secret without `ca.crt`).
    pub fn ca_if_present(mut self, path: impl Into<PathBuf>) -> Self {
        self.config.ca = Some(path.into());
        self.config.ca_required = false;
        self
    }

    /// How often the files are checked without any event. Default: [`DEFAULT_POLL_INTERVAL`].
    ///
    /// # Panics
    /// [`build`](Self::build) panics if the interval is zero.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.config.poll_interval = interval;
        self
    }

    /// Whether to watch the files' directories for changes (the fast path). Default: on.
    pub fn notify(mut self, enabled: bool) -> Self {
        self.config.notify = enabled;
        self
    }

    /// How long files changed *in place* (the same files, rewritten) must stay unchanged before
    /// their new content is passed on; a quiet re-read must find the same bytes. So a writer that
    /// rewrites `tls.crt` line by line is never seen half-way (a leaf without its intermediate
    /// matches the key and would be served). Files replaced atomically (the kubelet's `..data`
    /// swap, a rename over the old file: new inodes) are passed on at once. Default:
    /// [`DEFAULT_IN_PLACE_QUIET`].
    pub fn in_place_quiet(mut self, quiet: Duration) -> Self {
        self.config.in_place_quiet = quiet;
        self
    }

    /// The largest file accepted, in bytes. Default: [`DEFAULT_MAX_SIZE`](crate::DEFAULT_MAX_SIZE).
    pub fn max_size(mut self, bytes: u64) -> Self {
        self.config.decoder = self.config.decoder.max_size(bytes);
        self
    }

    /// Builds the source. Nothing is read and no watch starts until the stream is first polled.
    ///
    /// An [`Inline`] source: given to the reload core (boxed with its handoff), each item is
    /// handed over on the thread that read it, so a rotation is installed without waiting for
    /// a runtime worker. [`Inline::into_inner`] is the plain stream; [`dedup`](Inline::dedup),
    /// [`fallback`](Inline::fallback) and [`debounce`](Inline::debounce) work as on any
    /// source; the source's own methods ([`trigger`](FileSource::trigger)) through `Deref`.
    ///
    /// # Panics
    /// If the poll interval is zero.
    pub fn build(mut self) -> Inline<FileSource> {
        assert!(
            !self.config.poll_interval.is_zero(),
            "FileSource poll interval must be above zero"
        );
        let handoff = Handoff::new();
        self.config.handoff = handoff.clone();
        let (config, trigger, inner) = spawn_unfold(self.config);
        let inner = inner
            .map(|item| item.map(reader::Decoded::into_bundle))
            .boxed();
        let source = FileSource {
            config,
            trigger,
            inner,
        };
        Inline::new(source, handoff)
    }
}

// ===== impl FileSource =====

impl FileSource {
    /// Starts configuring a source for a certificate chain file and its private key file.
    pub fn builder(cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> FileSourceBuilder {
        FileSourceBuilder {
            config: Config {
                cert: cert.into(),
                key: key.into(),
                ca: None,
                ca_required: false,
                poll_interval: DEFAULT_POLL_INTERVAL,
                notify: true,
                in_place_quiet: DEFAULT_IN_PLACE_QUIET,
                decoder: Decoder::new(),
                certificates_only: false,
                handoff: Handoff::new(),
            },
        }
    }

    /// A source for the `kubernetes.io/tls` layout in `dir`: `tls.crt`, `tls.key`, and `ca.crt`
    /// whenever it exists ([`ca_if_present`](FileSourceBuilder::ca_if_present)).
    pub fn kubernetes_dir(dir: impl AsRef<Path>) -> FileSourceBuilder {
        let dir = dir.as_ref();
        Self::builder(dir.join("tls.crt"), dir.join("tls.key")).ca_if_present(dir.join("ca.crt"))
    }

    /// A handle that forces a read now, bypassing the unchanged-input check, e.g. from a SIGHUP
    /// handler or an admin endpoint. Cloneable; triggers while a read is pending coalesce.
    pub fn trigger(&self) -> Trigger {
        self.trigger.clone()
    }
}

impl Stream for FileSource {
    type Item = Result<CertBundle, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}

impl fmt::Debug for FileSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileSource")
            .field("cert", &self.config.cert)
            .field("key", &self.config.key)
            .field("ca", &self.config.ca)
            .field("poll_interval", &self.config.poll_interval)
            .field("notify", &self.config.notify)
            .finish_non_exhaustive()
    }
}

/// The running state machine for `config`: its trigger and the stream of what it decodes.
fn spawn_unfold(
    config: Config,
) -> (
    Arc<Config>,
    Trigger,
    BoxStream<'static, Result<reader::Decoded, Error>>,
) {
    let config = Arc::new(config);
    let (trigger, triggered) = Trigger::new();
    let inner = futures::stream::unfold(
        State::Start {
            config: config.clone(),
            trigger: triggered,
        },
        State::step,
    )
    .boxed();
    (config, trigger, inner)
}

/// A stream of the CA certificates in one PEM (or DER) file, for a trust of its own (e.g.
/// `tls_reload::ClientAuth::from_source`): followed like a [`FileSource`] (symlink swaps, the
/// watched set following the layout, in-place writes only once quiet, the poll backstop, a
/// [`Trigger`]), yielding the certificates whenever the file's content changes, or an error
/// naming the file. Made by [`CaFileSource::builder`].
///
/// ```no_run
/// use futures::StreamExt as _;
/// # async fn run() {
/// let mut cas = tls_source::CaFileSource::builder("/etc/tls/clients-ca.crt").build();
/// while let Some(item) = cas.next().await {
///     match item {
///         Ok(cas) => println!("{} trusted CAs", cas.len()),
///         Err(err) => eprintln!("{err}"),
///     }
/// }
/// # }
/// ```
#[must_use = "streams do nothing unless polled"]
pub struct CaFileSource {
    config: Arc<Config>,
    trigger: Trigger,
    inner: BoxStream<'static, Result<Vec<CertificateDer<'static>>, Error>>,
}

/// Configures a [`CaFileSource`]; made by [`CaFileSource::builder`].
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `build` is called"]
pub struct CaFileSourceBuilder {
    config: Config,
}

impl CaFileSource {
    /// Starts configuring a source for the CA bundle at `path`.
    pub fn builder(path: impl Into<PathBuf>) -> CaFileSourceBuilder {
        let path = path.into();
        let mut config = FileSource::builder(path.clone(), path).config;
        config.certificates_only = true;
        CaFileSourceBuilder { config }
    }

    /// A handle that forces a read now (see [`FileSource::trigger`]).
    pub fn trigger(&self) -> Trigger {
        self.trigger.clone()
    }
}

impl CaFileSourceBuilder {
    /// Applies a setting of [`FileSourceBuilder`]'s to this source's configuration.
    fn with(self, set: impl FnOnce(FileSourceBuilder) -> FileSourceBuilder) -> Self {
        let config = set(FileSourceBuilder {
            config: self.config,
        })
        .config;
        Self { config }
    }

    /// As [`FileSourceBuilder::poll_interval`]. Default: [`DEFAULT_POLL_INTERVAL`].
    ///
    /// # Panics
    /// [`build`](Self::build) panics if the interval is zero.
    pub fn poll_interval(self, interval: Duration) -> Self {
        self.with(|b| b.poll_interval(interval))
    }

    /// As [`FileSourceBuilder::notify`]. Default: on.
    pub fn notify(self, enabled: bool) -> Self {
        self.with(|b| b.notify(enabled))
    }

    /// As [`FileSourceBuilder::in_place_quiet`]. Default: [`DEFAULT_IN_PLACE_QUIET`].
    pub fn in_place_quiet(self, quiet: Duration) -> Self {
        self.with(|b| b.in_place_quiet(quiet))
    }

    /// As [`FileSourceBuilder::max_size`].
    pub fn max_size(self, bytes: u64) -> Self {
        self.with(|b| b.max_size(bytes))
    }

    /// Builds the source. Nothing is read until the stream is first polled.
    ///
    /// # Panics
    /// If the poll interval is zero.
    pub fn build(self) -> CaFileSource {
        assert!(
            !self.config.poll_interval.is_zero(),
            "CaFileSource poll interval must be above zero"
        );
        let (config, trigger, inner) = spawn_unfold(self.config);
        let inner = inner
            .map(|item| {
                item.map(|decoded| match decoded {
                    reader::Decoded::Certificates(cas) => cas,
                    // A CA file's reader decodes certificates only.
                    reader::Decoded::Bundle(bundle) => bundle.chain().to_vec(),
                })
            })
            .boxed();
        CaFileSource {
            config,
            trigger,
            inner,
        }
    }
}

impl Stream for CaFileSource {
    type Item = Result<Vec<CertificateDer<'static>>, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}

impl fmt::Debug for CaFileSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CaFileSource")
            .field("path", &self.config.cert)
            .field("poll_interval", &self.config.poll_interval)
            .field("notify", &self.config.notify)
            .finish_non_exhaustive()
    }
}

/// Whether an I/O error says the process or the system ran out of file descriptors (EMFILE,
/// ENFILE: the same numbers on Linux and the BSDs, macOS included).
fn out_of_descriptors(err: &std::io::Error) -> bool {
    const ENFILE: i32 = 23;
    const EMFILE: i32 = 24;
    cfg!(unix) && matches!(err.raw_os_error(), Some(ENFILE | EMFILE))
}

#[cfg(test)]
mod tests;
