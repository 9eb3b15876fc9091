//! The running source: a `futures::stream::unfold` state machine. Reads happen off the runtime:
//! on the watcher's own thread right after an event (no hop to another thread on the way to a
//! rotation), or on a blocking thread for the poll, a trigger or a timer. Every read sends what
//! it found down one channel while it holds the reader, so what it found arrives in the order
//! the reads happened and a slower, older read never overtakes a newer one.

use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::{Instant, MissedTickBehavior};

use super::Config;
use super::event::OnEvent;
use super::reader::{Decoded, FileReader};
use super::watch::{self, Lookups, STARVED_RETRY, Targets, Watching};
use crate::Error;
use crate::trigger::Triggered;

type Item = Result<Decoded, Error>;

pub(super) enum State {
    Start {
        config: Arc<Config>,
        trigger: Triggered,
    },
    Running(Box<Running>),
}

pub(super) struct Running {
    reads: Reads,
    found: mpsc::UnboundedReceiver<Found>,
    trigger: Triggered,
    /// The notify watch; `None` with notify off.
    watching: Option<Watching>,
    /// When to read again without an event: content written in place is waiting to be quiet,
    /// or the last read ran out of file descriptors.
    read_at: Option<Instant>,
    interval: tokio::time::Interval,
    /// A layout that came with an item: followed at the next turn, after the item is out.
    layout: Option<Targets>,
}

/// What makes a read, from any thread: the reader (one read at a time) and where what it found
/// goes. Cloned into the watcher's event handler.
#[derive(Clone)]
pub(super) struct Reads {
    config: Arc<Config>,
    reader: Arc<Mutex<FileReader>>,
    found: mpsc::UnboundedSender<Found>,
    /// [`Targets::relevant`](watch::Targets) as of the last read: the watcher's thread filters
    /// events by it. Set by the read itself, so the events of a rotation's clean-up (the old
    /// generation removed) no longer count once the read saw the new one.
    relevant: Arc<Mutex<Vec<PathBuf>>>,
    /// What the last layout looked up, less what events named since: the next layout after an
    /// event looks up only what changed.
    lookups: Arc<Mutex<Lookups>>,
}

/// What a read found, in the order reads happen.
enum Found {
    Read {
        item: Option<Item>,
        /// How long until content written in place has been quiet long enough.
        settling: Option<Duration>,
        starved: bool,
        /// The layout as it stood at this read, sent with it when the consumer installed the
        /// item inline already: one wake of the consumer per read, not two.
        layout: Option<Targets>,
    },
    /// What to watch as the layout stood at that read (with notify on).
    Layout(Targets),
}

impl Reads {
    /// Reads the files on the calling thread, which must not be a runtime worker, and sends
    /// what it found. If the source is gone, it is discarded. Each item is offered to the
    /// consumer's [`Inline`](crate::inline::Inline) hook first, if it attached one. `after_event`:
    /// the watcher's thread reads after an event, and the layout's lookups that no event named
    /// since are taken as they were; any other read looks everything up again.
    fn read_here(&self, force: bool, after_event: bool) {
        let mut reader = self.reader.lock().unwrap_or_else(PoisonError::into_inner);
        let read = std::panic::catch_unwind(AssertUnwindSafe(|| {
            let item = reader.read(force);
            (item, reader.settling(), reader.starved())
        }));
        let (item, settling, starved) = read.unwrap_or_else(|panic| {
            // One read panicked (a bug): reported as that read's error; the next poll or
            // event reads again, and the stream goes on.
            let message = crate::panic_message(panic.as_ref());
            let cert = self.config.cert.display();
            tracing::error!(cert = %cert, panic = %message, "reading the certificate files panicked; reading again at the next poll");
            let error = crate::Error::source(
                format!("files {cert}"),
                format!("internal error: the read panicked: {message}"),
            );
            (Some(Err(error)), None, false)
        });
        // Every item goes through the handoff, hook or not, so that it counts what goes down
        // the stream. Still holding the reader: offers come one at a time, in the order of the
        // items. What a hook takes (a bundle is installed already) never goes down the stream.
        let item = item.and_then(|item| match item {
            // A CA file's certificates: no consumer takes those inline.
            Ok(certificates @ Decoded::Certificates(_)) => Some(Ok(certificates)),
            bundle_or_error => self
                .config
                .handoff
                .offer(bundle_or_error.map(Decoded::into_bundle))
                .map(|item| item.map(Decoded::Bundle)),
        });
        let found = item.is_some();
        if self.config.handoff.is_attached() {
            // What the hook handed back waits for the layout, and both wake the consumer once.
            let layout = self.layout(after_event);
            let _ = self.found.send(Found::Read {
                item,
                settling,
                starved,
                layout,
            });
            return;
        }
        let _ = self.found.send(Found::Read {
            item,
            settling,
            starved,
            layout: None,
        });
        if found {
            // The consumer was just woken, maybe onto this very core: let it take the item
            // before this thread works out the layout (stat calls on every directory of it),
            // which would otherwise run first and delay the install.
            std::thread::yield_now();
        }
        if let Some(targets) = self.layout(after_event) {
            let _ = self.found.send(Found::Layout(targets));
        }
    }

    /// Works out what to watch as the layout stands now (with notify on), on the reading
    /// thread and still holding the reader, so that layouts arrive in the order of their
    /// reads. `after_event`: the lookups no event named since the last read are taken as they
    /// were.
    fn layout(&self, after_event: bool) -> Option<Targets> {
        if !self.config.notify {
            return None;
        }
        let targets = std::panic::catch_unwind(AssertUnwindSafe(|| {
            let mut lookups = self.lookups.lock().unwrap_or_else(PoisonError::into_inner);
            if !after_event {
                lookups.forget();
            }
            let mut targets = watch::targets(&self.config, &mut lookups);
            *self.relevant.lock().unwrap_or_else(PoisonError::into_inner) =
                std::mem::take(&mut targets.relevant);
            targets
        }));
        match targets {
            Ok(targets) => Some(targets),
            Err(panic) => {
                let message = crate::panic_message(panic.as_ref());
                tracing::error!(cert = %self.config.cert.display(), panic = %message, "working out the files' layout panicked; the watch stays as it was until the next read");
                None
            }
        }
    }

    /// On a blocking thread: reads if any file's stamp changed since the last read (what a
    /// new watch could have missed). Most times nothing did: a few `stat` calls, and neither a
    /// read nor a layout to work out again.
    fn spawn_recheck(&self) {
        let reads = self.clone();
        drop(tokio::task::spawn_blocking(move || reads.recheck_here()));
    }

    /// Reads if any file's stamp changed since the last read, on the calling thread.
    fn recheck_here(&self) {
        let unchanged = self
            .reader
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .unchanged();
        if !unchanged {
            self.read_here(false, false);
        }
    }

    /// Reads on a blocking thread (`spawn_blocking`), off the runtime's workers: a slow network
    /// file system never stalls the worker that also runs handshakes.
    fn spawn(&self, force: bool) {
        let reads = self.clone();
        drop(tokio::task::spawn_blocking(move || {
            reads.read_here(force, false);
        }));
    }
}

impl OnEvent for Reads {
    fn relevant(&self) -> std::sync::MutexGuard<'_, Vec<PathBuf>> {
        self.relevant.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn changed(&self, path: &Path) {
        self.lookups
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .changed(path);
    }

    fn lost(&self) {
        self.lookups
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .forget();
    }

    fn read(&self) {
        self.read_here(false, true);
    }

    #[cfg(target_os = "linux")]
    fn recheck(&self) {
        self.recheck_here();
    }
}

impl State {
    pub(super) async fn step(self) -> Option<(Item, Self)> {
        let mut running = match self {
            Self::Start { config, trigger } => Running::start(&config, trigger),
            Self::Running(running) => running,
        };
        loop {
            if let Some(item) = running.turn().await {
                return Some((item, Self::Running(running)));
            }
        }
    }
}

impl Running {
    fn start(config: &Arc<Config>, trigger: Triggered) -> Box<Self> {
        let (tx, found) = mpsc::unbounded_channel();
        let reads = Reads {
            reader: Arc::new(Mutex::new(FileReader::new(config.clone()))),
            config: config.clone(),
            found: tx,
            relevant: Arc::default(),
            lookups: Arc::default(),
        };
        reads.spawn(false);
        Box::new(Self {
            watching: config
                .notify
                .then(|| Watching::new(config.cert.clone(), Arc::new(reads.clone()))),
            reads,
            found,
            trigger,
            read_at: None,
            interval: {
                let mut interval = tokio::time::interval_at(
                    Instant::now() + config.poll_interval,
                    config.poll_interval,
                );
                interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
                interval
            },
            layout: None,
        })
    }

    /// Watches what `targets` says. A change made before a new watch was set is seen only by
    /// reading again, if the files' stamps say there was one.
    fn follow(&mut self, targets: Targets) {
        if let Some(watching) = self.watching.as_mut()
            && watching.follow(targets)
        {
            self.reads.spawn_recheck();
        }
    }

    /// Waits for one thing to happen and handles it: what a read found (the item to pass on,
    /// if any), or a reason to read (the poll, a trigger, a timer).
    async fn turn(&mut self) -> Option<Item> {
        if let Some(targets) = self.layout.take() {
            self.follow(targets);
        }
        let retry_at = self.watching.as_ref().and_then(Watching::retry_at);
        tokio::select! {
            biased;
            found = self.found.recv() => match found? {
                Found::Read { item, settling, starved, layout } => {
                    let now = Instant::now();
                    let starved = starved.then_some(STARVED_RETRY);
                    self.read_at = settling.into_iter().chain(starved).min().map(|wait| now + wait);
                    match item {
                        Some(item) => {
                            self.layout = layout;
                            Some(item)
                        }
                        None => {
                            if let Some(targets) = layout {
                                self.follow(targets);
                            }
                            None
                        }
                    }
                }
                Found::Layout(targets) => {
                    // What the read found is handled first: a consumer that polls again at
                    // once, as the reload task does to gather a batch, gets `Pending` here and
                    // installs the new certificate before the watches are moved (a few
                    // syscalls; through notify's thread where notify watches, a hundred
                    // microseconds or more).
                    tokio::task::yield_now().await;
                    self.follow(targets);
                    None
                }
            },
            () = self.trigger.notified() => {
                self.reads.spawn(true);
                None
            }
            _ = self.interval.tick() => {
                self.reads.spawn(false);
                None
            }
            () = sleep_until(self.read_at), if self.read_at.is_some() => {
                self.read_at = None;
                self.reads.spawn(false);
                None
            }
            // The read's layout sets the watch up again.
            () = sleep_until(retry_at), if retry_at.is_some() => {
                if let Some(watching) = self.watching.as_mut() {
                    watching.retrying();
                }
                self.reads.spawn(false);
                None
            }
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
