//! [`FileSource`]: certificate, key and CA files, followed through symlink swaps.

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use futures::Stream;
use futures::stream::BoxStream;
use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher as _};
use sha2::{Digest as _, Sha256};
use tokio::sync::Notify;
use tokio::time::{Instant, MissedTickBehavior};

use crate::Backoff;
use crate::trigger::Triggered;
use crate::{CertBundle, Decoder, Digest, Error, Origin, Trigger};

/// The default poll interval: 10 seconds.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(10);

/// The default quiet period after a file-system event before the files are read: 2 ms.
pub const DEFAULT_SETTLE: Duration = Duration::from_millis(2);

/// The default [`FileSourceBuilder::in_place_quiet`]: 100 ms, ten times the slowest
/// line-by-line writer seen in black-box tests (a line every 3 to 10 ms), while a `cp` of a
/// whole chain takes well under a millisecond. Atomic replacements never wait for it.
pub const DEFAULT_IN_PLACE_QUIET: Duration = Duration::from_millis(100);

/// How many times a read that raced a change is retried before the result is passed on anyway.
const STABLE_READ_ATTEMPTS: usize = 3;

/// A [`CertSource`](crate::CertSource) that reads a certificate chain, a private key and an
/// optional CA bundle from files, and yields a new bundle whenever their content changes.
///
/// - **Symlink-safe.** Every check reads through the configured paths; no resolved target or inode
///   is cached. A Kubernetes Secret volume, where the kubelet writes a new timestamped directory
///   and renames a `..data` symlink over the old one, is followed on every rotation.
/// - **Fast path and backstop.** A `notify` watch on *directories* (not the files, whose watches
///   die when a symlink is swapped) triggers a read within milliseconds of a change, after a
///   short quiet period that coalesces bursts ([`settle`](FileSourceBuilder::settle)). The watched
///   set follows the layout, recomputed after every read: each path's directory, or while it is
///   missing its nearest existing ancestor (so a directory created late, or removed and laid out
///   again, is seen); the directory holding a directory symlink on the way; and the directory
///   each path resolves to (so in-place writes behind the kubelet's `..data` links, or behind a
///   link into another directory, are seen). The poll
///   ([`poll_interval`](FileSourceBuilder::poll_interval), default 10 s) stays as the backstop;
///   what cannot be watched (inotify limits, an unsupported file system) is logged once and
///   retried with backoff while the source polls.
/// - **Off the runtime.** Files are read on a blocking thread (`spawn_blocking`), never on a
///   runtime worker.
/// - **Cheap when nothing changed.** A SHA-256 of the bytes read is compared with the last one;
///   unchanged input is not parsed and yields nothing.
/// - **No torn pairs.** The files are stat'ed before and after they are read; a read that raced a
///   change is read again. A non-atomic writer (a certificate written, then its key) can still be
///   seen half-way: the reload core rejects a key that does not match its certificate and keeps
///   the last good one, and the next event or poll brings the complete pair.
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
    cert: PathBuf,
    key: PathBuf,
    ca: Option<PathBuf>,
    ca_required: bool,
    poll_interval: Duration,
    notify: bool,
    settle: Duration,
    in_place_quiet: Duration,
    decoder: Decoder,
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

    /// The quiet period after a file-system event before reading. Default: [`DEFAULT_SETTLE`].
    pub fn settle(mut self, quiet: Duration) -> Self {
        self.config.settle = quiet;
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
    /// # Panics
    /// If the poll interval is zero.
    pub fn build(self) -> FileSource {
        assert!(
            !self.config.poll_interval.is_zero(),
            "FileSource poll interval must be above zero"
        );
        let config = Arc::new(self.config);
        let (trigger, triggered) = Trigger::new();
        let inner = Box::pin(futures::stream::unfold(
            State::Start {
                config: config.clone(),
                trigger: triggered,
            },
            State::step,
        ));
        FileSource {
            config,
            trigger,
            inner,
        }
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
                settle: DEFAULT_SETTLE,
                in_place_quiet: DEFAULT_IN_PLACE_QUIET,
                decoder: Decoder::new(),
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

// ===== impl FileReader =====

/// The reading half of a [`FileSource`], for callers that schedule reads themselves: each
/// [`check`](Self::check) reads the files through their paths and returns a bundle, an error, or
/// nothing when the bytes are unchanged since the last check (compared by SHA-256, without
/// parsing). Made by [`FileSourceBuilder::build_reader`]; the poll and notify settings do not
/// apply to it.
///
/// ```
/// use tls_source::FileSource;
///
/// let mut reader = FileSource::builder("missing.crt", "missing.key").build_reader();
/// let first = reader.check().expect("the first check always says something");
/// assert!(first.unwrap_err().to_string().starts_with("cannot read missing.crt"));
/// assert!(reader.check().is_none(), "the same error is not repeated");
/// assert!(reader.read_now().is_err(), "unless asked to read now");
/// ```
pub struct FileReader {
    config: Arc<Config>,
    last_raw: Option<Digest>,
    /// The files (device, inode) whose content was last passed on: the same files with new
    /// content were written in place.
    last_ids: Option<Vec<(u64, u64)>>,
    /// New content written in place, and when it was first read: passed on once it has stayed
    /// the same for `in_place_quiet`.
    unsettled: Option<(Digest, std::time::Instant)>,
    last_error: Option<String>,
    warned_key_mode: bool,
}

impl FileSourceBuilder {
    /// Builds only the reading half: a [`FileReader`], with no watch and no poll.
    pub fn build_reader(self) -> FileReader {
        FileReader::new(Arc::new(self.config))
    }
}

impl fmt::Debug for FileReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileReader")
            .field("cert", &self.config.cert)
            .field("key", &self.config.key)
            .field("ca", &self.config.ca)
            .finish_non_exhaustive()
    }
}

impl FileReader {
    fn new(config: Arc<Config>) -> Self {
        Self {
            config,
            last_raw: None,
            last_ids: None,
            unsettled: None,
            last_error: None,
            warned_key_mode: false,
        }
    }

    /// Reads the files: `Some(Ok(bundle))` when their content changed (or on the first check),
    /// `Some(Err(error))` when they cannot be read or decoded (an error is not repeated while
    /// it stays the same), `None` when nothing changed, or when files changed in place have not
    /// been quiet for [`in_place_quiet`](FileSourceBuilder::in_place_quiet) yet (check again
    /// after [`settling`](Self::settling)).
    pub fn check(&mut self) -> Option<Result<CertBundle, Error>> {
        self.read(false)
    }

    /// How long until content written in place has been quiet long enough to be passed on by
    /// [`check`](Self::check); `None` when nothing is waiting.
    pub fn settling(&self) -> Option<Duration> {
        self.unsettled
            .map(|(_, since)| self.config.in_place_quiet.saturating_sub(since.elapsed()))
    }

    /// Reads the files and returns what they hold now, changed or not.
    ///
    /// # Errors
    /// Any [`Error`] of reading or decoding, naming the path.
    pub fn read_now(&mut self) -> Result<CertBundle, Error> {
        match self.read(true) {
            Some(item) => item,
            None => unreachable!("a forced read always yields an item"),
        }
    }

    fn read(&mut self, force: bool) -> Option<Result<CertBundle, Error>> {
        let files = match read_stable(&self.config) {
            Ok(files) => files,
            Err(err) => {
                self.last_raw = None;
                return self.report(err, force);
            }
        };
        if !force && self.last_raw == Some(files.digest) {
            self.unsettled = None;
            return None;
        }
        if !force && self.last_ids.as_ref() == Some(&files.ids) {
            // The same files with new content: written in place, maybe still being written.
            match self.unsettled {
                Some((digest, since))
                    if digest == files.digest && since.elapsed() >= self.config.in_place_quiet => {}
                Some((digest, _)) if digest == files.digest => return None,
                _ => {
                    tracing::debug!(cert = %self.config.cert.display(), "files changed in place; waiting until they are quiet");
                    self.unsettled = Some((files.digest, std::time::Instant::now()));
                    return None;
                }
            }
        }
        self.unsettled = None;
        self.last_ids = Some(files.ids.clone());
        self.last_raw = Some(files.digest);
        self.warn_key_mode(&files);
        let config = &self.config;
        let origin = Origin::Files {
            cert: config.cert.clone(),
            key: config.key.clone(),
        };
        let cert_name = config.cert.display().to_string();
        let key_name = config.key.display().to_string();
        let ca_name = config.ca.as_ref().map(|p| p.display().to_string());
        let decoded = config.decoder.bundle(
            (&cert_name, &files.cert),
            (&key_name, &files.key),
            ca_name.as_deref().zip(files.ca.as_deref()),
            origin,
        );
        match decoded {
            Ok(bundle) => {
                self.last_error = None;
                Some(Ok(bundle))
            }
            Err(err) => self.report(err, true),
        }
    }

    /// Passes an error on, unless it repeats the last one and nothing forces it.
    fn report(&mut self, err: Error, force: bool) -> Option<Result<CertBundle, Error>> {
        let message = err.to_string();
        if !force && self.last_error.as_deref() == Some(message.as_str()) {
            return None;
        }
        self.last_error = Some(message);
        Some(Err(err))
    }

    fn warn_key_mode(&mut self, files: &Files) {
        #[cfg(unix)]
        if !self.warned_key_mode && files.key_mode & 0o077 != 0 {
            self.warned_key_mode = true;
            tracing::warn!(
                path = %self.config.key.display(),
                mode = format_args!("{:o}", files.key_mode & 0o777),
                "private key file is readable by group or others; restrict it (chmod 600, or \
                 defaultMode: 0400 on a Secret volume)"
            );
        }
        #[cfg(not(unix))]
        let _ = files;
    }
}

// ===== the state machine =====

enum State {
    Start {
        config: Arc<Config>,
        trigger: Triggered,
    },
    Running(Box<Running>),
}

struct Running {
    config: Arc<Config>,
    /// Shared with the blocking thread that reads: dropping the source mid-read leaves that
    /// thread to finish and its result to be dropped.
    reader: Arc<Mutex<FileReader>>,
    trigger: Triggered,
    /// The notify watch and what it watches; dropping it stops the watch thread.
    watch: Option<Watch>,
    /// When the watch (or part of it) could not be set up: the backoff and when to try again.
    watch_retry: Option<(Backoff, Instant)>,
    /// The watched set grew: read once more at once, for a change made before the new watch.
    reread: bool,
    /// Content written in place is waiting to be quiet: read again then.
    settle_at: Option<Instant>,
    changed: Arc<Notify>,
    interval: tokio::time::Interval,
}

/// The notify watcher and the directories it watches, each with the identity it had when the
/// watch was set (a directory removed and re-created is a new one to watch).
struct Watch {
    watcher: RecommendedWatcher,
    watched: BTreeMap<PathBuf, DirId>,
}

/// What a read yields, how long until content written in place has settled, and the
/// directories to watch as the layout now stands.
type Read = (
    Option<Result<CertBundle, Error>>,
    Option<Duration>,
    BTreeMap<PathBuf, DirId>,
);

enum Wake {
    Poll,
    Event,
    Trigger,
}

impl State {
    async fn step(self) -> Option<(Result<CertBundle, Error>, Self)> {
        let mut running = match self {
            Self::Start { config, trigger } => {
                let mut running = Running::start(config, trigger);
                if let Some(item) = running.read(false).await {
                    return Some((item, Self::Running(running)));
                }
                running
            }
            Self::Running(running) => running,
        };
        loop {
            let force = match running.wait().await {
                Wake::Poll | Wake::Event => false,
                Wake::Trigger => true,
            };
            if let Some(item) = running.read(force).await {
                return Some((item, Self::Running(running)));
            }
        }
    }
}

impl Running {
    fn start(config: Arc<Config>, trigger: Triggered) -> Box<Self> {
        Box::new(Self {
            reader: Arc::new(Mutex::new(FileReader::new(config.clone()))),
            trigger,
            watch: None,
            watch_retry: None,
            reread: false,
            settle_at: None,
            changed: Arc::new(Notify::new()),
            interval: {
                let mut interval = tokio::time::interval_at(
                    Instant::now() + config.poll_interval,
                    config.poll_interval,
                );
                interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
                interval
            },
            config,
        })
    }

    /// Reads the files on a blocking thread, off the runtime's workers (a slow network file
    /// system never stalls the worker that also runs handshakes), works out there what to watch
    /// as the layout now stands, and follows it.
    ///
    /// Cancellation safe: dropped mid-read, the read finishes on its thread and is discarded.
    async fn read(&mut self, force: bool) -> Option<Result<CertBundle, Error>> {
        let reader = Arc::clone(&self.reader);
        let config = Arc::clone(&self.config);
        let read = tokio::task::spawn_blocking(move || -> Read {
            let mut reader = reader.lock().unwrap_or_else(PoisonError::into_inner);
            let item = reader.read(force);
            let targets = if config.notify {
                watch_targets(&config)
            } else {
                BTreeMap::new()
            };
            (item, reader.settling(), targets)
        });
        match read.await {
            Ok((item, settling, targets)) => {
                self.settle_at = settling.map(|wait| Instant::now() + wait);
                if self.config.notify {
                    self.follow(targets);
                }
                item
            }
            Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
            // The runtime is shutting down: nothing more to say.
            Err(_) => None,
        }
    }

    /// Watches `targets` and nothing else: directories gone or replaced are unwatched, new or
    /// re-created ones watched. What cannot be watched is said once and retried with backoff.
    fn follow(&mut self, targets: BTreeMap<PathBuf, DirId>) {
        if self.watch.is_none() {
            let changed = Arc::clone(&self.changed);
            match new_watcher(changed) {
                Ok(watcher) => {
                    self.watch = Some(Watch {
                        watcher,
                        watched: BTreeMap::new(),
                    });
                }
                Err(err) => return self.watch_failed(&self.config.cert.clone(), &err),
            }
        }
        let Some(watch) = self.watch.as_mut() else {
            return;
        };
        let stale: Vec<PathBuf> = watch
            .watched
            .iter()
            .filter(|(dir, id)| targets.get(*dir) != Some(*id))
            .map(|(dir, _)| dir.clone())
            .collect();
        for dir in stale {
            // A removed directory's watch is gone already; the error says only that.
            let _ = watch.watcher.unwatch(&dir);
            watch.watched.remove(&dir);
        }
        let mut failed = None;
        for (dir, id) in targets {
            if watch.watched.contains_key(&dir) {
                continue;
            }
            match watch.watcher.watch(&dir, RecursiveMode::NonRecursive) {
                Ok(()) => {
                    tracing::debug!(dir = %dir.display(), "watching");
                    watch.watched.insert(dir, id);
                    self.reread = true;
                }
                Err(err) => failed = Some((dir, err)),
            }
        }
        match failed {
            Some((dir, err)) => self.watch_failed(&dir, &err),
            None => {
                if self.watch_retry.take().is_some() {
                    tracing::info!(cert = %self.config.cert.display(), "watching the certificate directories again");
                }
            }
        }
    }

    /// Says once that a watch could not be set up, and schedules the next try.
    fn watch_failed(&mut self, dir: &Path, err: &notify::Error) {
        let (backoff, at) = self.watch_retry.get_or_insert_with(|| {
            tracing::warn!(
                error = %err,
                dir = %dir.display(),
                cert = %self.config.cert.display(),
                "cannot watch the certificate directories; polling meanwhile, retrying the watch"
            );
            (
                Backoff::new(WATCH_RETRY_INITIAL, WATCH_RETRY_MAX),
                Instant::now(),
            )
        });
        *at = Instant::now() + backoff.next().unwrap_or(WATCH_RETRY_MAX);
    }

    async fn wait(&mut self) -> Wake {
        if std::mem::take(&mut self.reread) {
            return Wake::Poll;
        }
        let retry_at = self.watch_retry.as_ref().map(|(_, at)| *at);
        let wake = tokio::select! {
            _ = self.interval.tick() => Wake::Poll,
            () = self.changed.notified() => Wake::Event,
            () = self.trigger.notified() => Wake::Trigger,
            // The read that follows sets the watch up again.
            () = sleep_until(retry_at), if retry_at.is_some() => Wake::Poll,
            () = sleep_until(self.settle_at), if self.settle_at.is_some() => Wake::Poll,
        };
        if matches!(wake, Wake::Event) {
            // Coalesce a burst: wait until events stop for `settle`, at most 50 settles.
            let deadline = Instant::now() + self.config.settle * 50;
            loop {
                let quiet = Instant::now() + self.config.settle;
                tokio::select! {
                    () = tokio::time::sleep_until(quiet.min(deadline)) => break,
                    () = self.changed.notified() => {}
                }
            }
        }
        wake
    }
}

/// The first wait before a watch that could not be set up is tried again, and the longest.
const WATCH_RETRY_INITIAL: Duration = Duration::from_secs(1);
const WATCH_RETRY_MAX: Duration = Duration::from_secs(60);

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn new_watcher(changed: Arc<Notify>) -> notify::Result<RecommendedWatcher> {
    notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        match event {
            // Our own reads open the files: ignore opens and read-only closes.
            Ok(event) if is_read_only(&event.kind) => {}
            Ok(_) => changed.notify_one(),
            // Queue overflow and the like: a read will sort it out.
            Err(_) => changed.notify_one(),
        }
    })
}

/// A directory's identity: (device, inode) on Unix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DirId(u64, u64);

impl DirId {
    fn of(dir: &Path) -> Option<Self> {
        let meta = fs::metadata(dir).ok()?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt as _;
            Some(Self(meta.dev(), meta.ino()))
        }
        #[cfg(not(unix))]
        {
            let _ = meta;
            Some(Self(0, 0))
        }
    }
}

/// The directories to watch for the configured paths as the layout stands now: each path's
/// directory (or, while it is missing, its nearest existing ancestor, to see it appear); the
/// directory holding a directory symlink on the way (a retargeted link changes there); and the
/// directory the path really resolves to (in-place writes behind the kubelet's `..data` links,
/// or behind a link into another directory, happen there). Recomputed after every read.
fn watch_targets(config: &Config) -> BTreeMap<PathBuf, DirId> {
    let mut dirs = BTreeMap::new();
    let mut add = |dir: PathBuf| {
        let dir = nearest_existing(dir);
        if let Some(id) = DirId::of(&dir) {
            dirs.insert(dir, id);
        }
    };
    for path in [Some(&config.cert), Some(&config.key), config.ca.as_ref()]
        .into_iter()
        .flatten()
    {
        let parent = parent_of(path);
        if fs::symlink_metadata(&parent).is_ok_and(|m| m.file_type().is_symlink()) {
            add(parent_of(&parent));
        }
        add(parent);
        if let Ok(real) = fs::canonicalize(path) {
            add(parent_of(&real));
        }
    }
    dirs
}

fn parent_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

fn nearest_existing(mut dir: PathBuf) -> PathBuf {
    while !dir.is_dir() {
        match dir.parent() {
            Some(up) if !up.as_os_str().is_empty() => dir = up.to_path_buf(),
            _ => return PathBuf::from("."),
        }
    }
    dir
}

fn is_read_only(kind: &EventKind) -> bool {
    use notify::event::{AccessKind, AccessMode};
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => false,
        EventKind::Access(_) => true,
        _ => false,
    }
}

/// The bytes of the files, read consistently, and a digest of them.
struct Files {
    cert: Vec<u8>,
    key: Vec<u8>,
    ca: Option<Vec<u8>>,
    digest: Digest,
    /// (device, inode) of each file read.
    ids: Vec<(u64, u64)>,
    #[cfg_attr(not(unix), allow(dead_code))]
    key_mode: u32,
}

/// What identifies a file's content cheaply: device, inode, length, modification time.
#[derive(PartialEq, Eq, Clone, Copy)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    modified: Option<SystemTime>,
    mode: u32,
}

fn stamp(path: &Path, decoder: &Decoder) -> Result<Stamp, Error> {
    let meta = fs::metadata(path).map_err(|source| Error::Read {
        path: path.to_path_buf(),
        source,
    })?;
    if !meta.is_file() {
        return Err(Error::NotAFile {
            path: path.to_path_buf(),
        });
    }
    decoder.check_size(&path.display().to_string(), meta.len())?;
    #[cfg(unix)]
    let (dev, ino, mode) = {
        use std::os::unix::fs::MetadataExt as _;
        (meta.dev(), meta.ino(), meta.mode())
    };
    #[cfg(not(unix))]
    let (dev, ino, mode) = (0, 0, 0);
    Ok(Stamp {
        dev,
        ino,
        len: meta.len(),
        modified: meta.modified().ok(),
        mode,
    })
}

fn read_file(path: &Path, decoder: &Decoder) -> Result<Vec<u8>, Error> {
    let read_err = |source| Error::Read {
        path: path.to_path_buf(),
        source,
    };
    let file = fs::File::open(path).map_err(read_err)?;
    let mut bytes = Vec::new();
    // Take one byte more than the limit, so a file that grew since the stat is still refused.
    file.take(decoder.limit().saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(read_err)?;
    decoder.check_size(&path.display().to_string(), bytes.len() as u64)?;
    Ok(bytes)
}

fn is_missing(path: &Path) -> bool {
    matches!(fs::metadata(path), Err(e) if e.kind() == std::io::ErrorKind::NotFound)
}

/// Reads every file, retrying while a change races the read (see [`FileSource`]).
fn read_stable(config: &Config) -> Result<Files, Error> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        // An optional CA is read when it exists at the first stat.
        let ca = match (&config.ca, config.ca_required) {
            (Some(ca), false) if is_missing(ca) => None,
            (ca, _) => ca.as_deref(),
        };
        let paths: Vec<&Path> = [Some(config.cert.as_path()), Some(config.key.as_path()), ca]
            .into_iter()
            .flatten()
            .collect();
        let before = paths
            .iter()
            .map(|p| stamp(p, &config.decoder))
            .collect::<Result<Vec<_>, _>>()?;
        let mut contents = paths
            .iter()
            .map(|p| read_file(p, &config.decoder))
            .collect::<Result<Vec<_>, _>>()?;
        let after = paths
            .iter()
            .map(|p| stamp(p, &config.decoder))
            .collect::<Result<Vec<_>, _>>()?;
        if before != after && attempt < STABLE_READ_ATTEMPTS {
            tracing::debug!(cert = %config.cert.display(), "files changed while read; reading again");
            continue;
        }
        let mut h = Sha256::new();
        for c in &contents {
            h.update((c.len() as u64).to_be_bytes());
            h.update(c);
        }
        let ca = (contents.len() == 3).then(|| contents.pop()).flatten();
        let key = contents.pop().unwrap_or_default();
        let cert = contents.pop().unwrap_or_default();
        return Ok(Files {
            cert,
            key,
            ca,
            digest: Digest::from_bytes(h.finalize().into()),
            ids: after.iter().map(|s| (s.dev, s.ino)).collect(),
            key_mode: after[1].mode,
        });
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use futures::StreamExt as _;

    use super::*;

    /// Collects what `tracing` writes in this test binary. A global subscriber: a thread-local
    /// one misses events whose callsite interest another test thread cached first.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Captured {
        fn global() -> Self {
            static LOGS: std::sync::OnceLock<Captured> = std::sync::OnceLock::new();
            LOGS.get_or_init(|| {
                let logs = Captured::default();
                let writer = logs.clone();
                let subscriber = tracing_subscriber::fmt()
                    .with_writer(move || writer.clone())
                    .with_ansi(false)
                    .finish();
                tracing::subscriber::set_global_default(subscriber).expect("one global subscriber");
                logs
            })
            .clone()
        }

        /// The lines that mention `needle`.
        fn lines_with(&self, needle: &str) -> Vec<String> {
            String::from_utf8_lossy(&self.0.lock().unwrap())
                .lines()
                .filter(|l| l.contains(needle))
                .map(str::to_owned)
                .collect()
        }
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn warns_once_about_a_key_readable_by_others() {
        use std::os::unix::fs::PermissionsExt as _;
        let logs = Captured::global();

        let cert = tls_test::TestCa::new("mode").leaf(&["localhost"]);
        let dir = tempfile::tempdir().unwrap();
        let (crt, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        fs::write(&crt, &cert.cert_pem).unwrap();
        fs::write(&key, &cert.key_pem).unwrap();
        fs::set_permissions(&key, fs::Permissions::from_mode(0o644)).unwrap();
        let mut source = FileSource::builder(&crt, &key).notify(false).build();
        let trigger = source.trigger();
        source.next().await.unwrap().unwrap();
        trigger.trigger();
        source.next().await.unwrap().unwrap();
        let warnings = logs.lines_with(&key.display().to_string());
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].contains("readable by group or others"),
            "{warnings:?}"
        );
        assert!(warnings[0].contains("mode=644"), "{warnings:?}");

        // A 0600 key draws no warning.
        let dir = tempfile::tempdir().unwrap();
        let (crt, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        fs::write(&crt, &cert.cert_pem).unwrap();
        fs::write(&key, &cert.key_pem).unwrap();
        fs::set_permissions(&key, fs::Permissions::from_mode(0o600)).unwrap();
        let mut quiet = FileSource::builder(&crt, &key).notify(false).build();
        quiet.next().await.unwrap().unwrap();
        assert!(logs.lines_with(&key.display().to_string()).is_empty());
    }

    #[tokio::test]
    async fn unchanged_files_yield_nothing_and_a_repeated_error_is_said_once() {
        let cert = tls_test::TestCa::new("quiet").leaf(&["localhost"]);
        let dir = tempfile::tempdir().unwrap();
        let (crt, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        fs::write(&crt, &cert.cert_pem).unwrap();
        fs::write(&key, &cert.key_pem).unwrap();
        let mut source = FileSource::builder(&crt, &key)
            .notify(false)
            .poll_interval(Duration::from_millis(10))
            .build();
        let first = source.next().await.unwrap().unwrap();
        assert_eq!(first.chain().len(), 1);
        // Several polls pass with nothing new.
        let idle = tokio::time::timeout(Duration::from_millis(100), source.next()).await;
        assert!(idle.is_err(), "unchanged files yield nothing");
        fs::remove_file(&key).unwrap();
        let err = source.next().await.unwrap().unwrap_err();
        assert!(matches!(err, Error::Read { .. }), "{err}");
        let repeat = tokio::time::timeout(Duration::from_millis(100), source.next()).await;
        assert!(repeat.is_err(), "the same error is not repeated every poll");
        fs::write(&key, &cert.key_pem).unwrap();
        let back = source.next().await.unwrap().unwrap();
        assert_eq!(back.digest(), first.digest());
    }

    #[tokio::test]
    async fn a_watch_that_cannot_start_is_retried_and_then_delivers() {
        let cert = tls_test::TestCa::new("later").leaf(&["localhost"]);
        let dir = tempfile::tempdir().unwrap();
        let later = dir.path().join("later");
        // The poll is an hour away: only the retried watch can deliver in time.
        let mut source = FileSource::kubernetes_dir(&later)
            .poll_interval(Duration::from_secs(3600))
            .build();
        let first = tokio::time::timeout(Duration::from_secs(20), source.next())
            .await
            .expect("a first report")
            .unwrap();
        assert!(first.is_err(), "the directory does not exist yet");
        fs::create_dir(&later).unwrap();
        fs::write(later.join("tls.crt"), &cert.chain_pem).unwrap();
        fs::write(later.join("tls.key"), &cert.key_pem).unwrap();
        let bundle = tokio::time::timeout(Duration::from_secs(20), source.next())
            .await
            .expect("the retried watch reads the files")
            .unwrap()
            .unwrap();
        assert_eq!(bundle.chain().len(), 2);
    }

    #[tokio::test]
    async fn an_optional_ca_is_read_when_present() {
        let cert = tls_test::TestCa::new("ca").leaf(&["localhost"]);
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("tls.crt"), &cert.cert_pem).unwrap();
        fs::write(dir.path().join("tls.key"), &cert.key_pem).unwrap();
        let mut source = FileSource::kubernetes_dir(dir.path()).notify(false).build();
        let trigger = source.trigger();
        assert!(source.next().await.unwrap().unwrap().ca().is_empty());
        fs::write(dir.path().join("ca.crt"), &cert.ca_pem).unwrap();
        trigger.trigger();
        let with_ca = source.next().await.unwrap().unwrap();
        assert_eq!(with_ca.ca().len(), 1);
    }

    #[tokio::test]
    async fn an_oversized_file_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let (crt, key) = (dir.path().join("big.crt"), dir.path().join("tls.key"));
        fs::write(&crt, vec![b'a'; 2048]).unwrap();
        fs::write(&key, b"k").unwrap();
        let mut source = FileSource::builder(&crt, &key)
            .max_size(1024)
            .notify(false)
            .build();
        let err = source.next().await.unwrap().unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("{} is larger than the limit of 1024 bytes", crt.display())
        );
    }
}
