//! The running source: a `futures::stream::unfold` state machine that waits for an event, the
//! poll, a trigger or a timer, reads on a blocking thread, and follows the layout.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::{Instant, MissedTickBehavior};

use super::Config;
use super::reader::FileReader;
use super::watch::{self, STARVED_RETRY, Targets, Watching};
use crate::trigger::Triggered;
use crate::{CertBundle, Error};

pub(super) enum State {
    Start {
        config: Arc<Config>,
        trigger: Triggered,
    },
    Running(Box<Running>),
}

pub(super) struct Running {
    config: Arc<Config>,
    /// Shared with the blocking thread that reads: dropping the source mid-read leaves that
    /// thread to finish and its result to be dropped.
    reader: Arc<Mutex<FileReader>>,
    trigger: Triggered,
    /// The notify watch; `None` with notify off.
    watching: Option<Watching>,
    /// What to watch as the layout stood at the last read (empty with notify off), still being
    /// worked out on the blocking thread; followed before the next wait or read.
    layout: Option<tokio::task::JoinHandle<Targets>>,
    /// The watched set grew: read once more at once, for a change made before the new watch.
    reread: bool,
    /// When to read again without an event: content written in place is waiting to be quiet,
    /// or the last read ran out of file descriptors.
    read_at: Option<Instant>,
    interval: tokio::time::Interval,
}

/// What a read on the blocking thread brings back first.
struct Read {
    item: Option<Result<CertBundle, Error>>,
    /// How long until content written in place has been quiet long enough.
    settling: Option<Duration>,
    starved: bool,
}

enum Wake {
    Poll,
    Event,
    Trigger,
}

impl State {
    pub(super) async fn step(self) -> Option<(Result<CertBundle, Error>, Self)> {
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
            watching: config.notify.then(|| Watching::new(config.cert.clone())),
            layout: None,
            reread: false,
            read_at: None,
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
    /// system never stalls the worker that also runs handshakes). What the read yields comes
    /// back first; the thread then works out what to watch as the layout now stands, which the
    /// next [`wait`](Self::wait) follows, so a rotation is passed on without waiting for that.
    ///
    /// Cancellation safe: dropped mid-read, the read finishes on its thread and is discarded.
    async fn read(&mut self, force: bool) -> Option<Result<CertBundle, Error>> {
        self.follow().await;
        let reader = Arc::clone(&self.reader);
        let config = Arc::clone(&self.config);
        let (tx, rx) = tokio::sync::oneshot::channel();
        let layout = tokio::task::spawn_blocking(move || {
            let mut reader = reader.lock().unwrap_or_else(PoisonError::into_inner);
            let read = Read {
                item: reader.read(force),
                settling: reader.settling(),
                starved: reader.starved(),
            };
            drop(reader);
            // The source may be gone already: then nothing is waiting for either.
            let _ = tx.send(read);
            if config.notify {
                watch::targets(&config)
            } else {
                Targets::default()
            }
        });
        let Ok(read) = rx.await else {
            // The read panicked (or the runtime is shutting down): say so through the handle.
            return match layout.await {
                Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
                _ => None,
            };
        };
        self.layout = Some(layout);
        let now = Instant::now();
        let starved = read.starved.then_some(STARVED_RETRY);
        self.read_at = read
            .settling
            .into_iter()
            .chain(starved)
            .min()
            .map(|wait| now + wait);
        read.item
    }

    /// Follows the layout the last read worked out, once it is known.
    async fn follow(&mut self) {
        let Some(layout) = self.layout.take() else {
            return;
        };
        match layout.await {
            Ok(targets) => {
                if let Some(watching) = self.watching.as_mut() {
                    self.reread |= watching.follow(targets);
                }
            }
            Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
            // The runtime is shutting down.
            Err(_) => {}
        }
    }

    async fn wait(&mut self) -> Wake {
        self.follow().await;
        if std::mem::take(&mut self.reread) {
            return Wake::Poll;
        }
        let changed = self.watching.as_ref().map(|w| Arc::clone(&w.changed));
        // A watch that could not be set up is tried again by the read that follows.
        let retry_at = self.watching.as_ref().and_then(Watching::retry_at);
        let wake = tokio::select! {
            _ = self.interval.tick() => Wake::Poll,
            () = notified(changed.as_deref()) => Wake::Event,
            () = self.trigger.notified() => Wake::Trigger,
            () = sleep_until(retry_at), if retry_at.is_some() => Wake::Poll,
            () = sleep_until(self.read_at), if self.read_at.is_some() => Wake::Poll,
        };
        if let (Wake::Event, Some(changed)) = (&wake, changed)
            && !self.config.settle.is_zero()
        {
            // Coalesce a burst: wait until events stop for `settle`, at most 50 settles.
            let deadline = Instant::now() + self.config.settle * 50;
            loop {
                let quiet = Instant::now() + self.config.settle;
                tokio::select! {
                    () = tokio::time::sleep_until(quiet.min(deadline)) => break,
                    () = changed.notified() => {}
                }
            }
        }
        wake
    }
}

async fn notified(changed: Option<&tokio::sync::Notify>) {
    match changed {
        Some(changed) => changed.notified().await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
