//! The watch on Linux: inotify, read on a thread of its own, for two things notify's watcher
//! cannot do.
//!
//! - **It asks only for the events that can change what is read**: creations, removals,
//!   renames, writes and attribute changes. No opens, reads or read-only closes: our own
//!   reads, and anyone listing the directory, raise nothing here.
//! - **It moves a kubelet volume's watch on its own thread.** A volume (a directory whose
//!   `..data` link leads to a directory beside it) is watched as its directory and the
//!   generation `..data` leads to. When an event names `..data`, the old generation's watch
//!   leaves the kernel at once, before the read: the kubelet removes that generation right
//!   after the swap, and each removal in a watched directory is an event the kernel queues in
//!   the remover's own system calls, ending with the watch's teardown. (With the watch left
//!   until after the read, the writer's removal took 5 to 17 µs longer than beside the peer's
//!   watch on the 2-core VM; 1 to 9 µs now, as it often starts before this thread wakes.
//!   Removing a mark is one quick system call; the kernel frees it later on a worker.) Right
//!   after the read the event causes (the new certificate is served by then) the new
//!   generation is watched and the files' stamps are checked once, so that a write between
//!   the read and the new watch is read (adding the mark before the read cost the in-process
//!   swap its lead). notify's watcher can only be changed through its own thread, the one
//!   that would be waiting. So the kubelet's writing of the next generation (before the swap)
//!   and its removal of the old one (after it) raise no event here: a recursive watch of the
//!   volume took about a dozen per rotation, each one waking this thread while the handshakes
//!   the rotation is for were starting, and each one queued by the kernel in the writer's own
//!   system calls. (A directory below the generation, where a key's path nests as in
//!   `sub/tls.crt`, is a target of its own, followed with the layout.)
//!
//! What is watched is kept in one table, shared by the thread (which moves generations) and
//! [`Watching`](super::watch::Watching) (which adds and drops directories as the layout
//! changes).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io;
use std::os::fd::AsRawFd as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use inotify::{EventMask, Inotify, WatchDescriptor, WatchMask, Watches};
use mio::unix::SourceFd;
use mio::{Interest, Poll, Token, Waker};

use super::event::{OnEvent, beside, on_event};

const EVENTS: Token = Token(0);
const WAKE: Token = Token(1);

/// The events that can change what is read. Links are not followed: a watched path that is a
/// link is watched as the link (where it leads is watched by its own path).
fn mask() -> WatchMask {
    WatchMask::CREATE
        | WatchMask::DELETE
        | WatchMask::MODIFY
        | WatchMask::CLOSE_WRITE
        | WatchMask::ATTRIB
        | WatchMask::MOVED_FROM
        | WatchMask::MOVED_TO
        | WatchMask::DELETE_SELF
        | WatchMask::MOVE_SELF
        | WatchMask::DONT_FOLLOW
}

/// An inotify instance and the thread that reads it; dropping it stops the thread.
pub(super) struct Watcher {
    table: Arc<Mutex<Table>>,
    stop: Arc<AtomicBool>,
    waker: Waker,
}

struct Table {
    watches: Watches,
    /// The directory each descriptor watches.
    by_wd: HashMap<WatchDescriptor, PathBuf>,
    /// Each directory watched through [`Watcher::watch`].
    roots: HashMap<PathBuf, Root>,
}

struct Root {
    wd: WatchDescriptor,
    /// For a kubelet volume: where `..data` led when last looked at, and that generation's
    /// watch.
    generation: Option<Generation>,
}

struct Generation {
    target: Option<PathBuf>,
    wd: Option<WatchDescriptor>,
}

impl Watcher {
    /// Starts the thread; `reads` hears of every event, as notify's handler did.
    pub(super) fn new(reads: Arc<dyn OnEvent>) -> io::Result<Self> {
        let inotify = Inotify::init()?;
        let poll = Poll::new()?;
        poll.registry().register(
            &mut SourceFd(&inotify.as_raw_fd()),
            EVENTS,
            Interest::READABLE,
        )?;
        let waker = Waker::new(poll.registry(), WAKE)?;
        let table = Arc::new(Mutex::new(Table {
            watches: inotify.watches(),
            by_wd: HashMap::new(),
            roots: HashMap::new(),
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = Thread {
            inotify,
            poll,
            table: Arc::clone(&table),
            stop: Arc::clone(&stop),
            reads,
        };
        // Detached: dropping the watcher wakes it to end (joining could wait on a read in
        // progress, which may be waiting on whoever drops the watcher).
        std::thread::Builder::new()
            .name("tls-source inotify".into())
            .spawn(move || thread.run())?;
        Ok(Self { table, stop, waker })
    }

    /// Watches the directory `dir`; `volume`: a kubelet volume, watched with its current
    /// generation.
    pub(super) fn watch(&mut self, dir: &Path, volume: bool) -> io::Result<()> {
        let mut table = lock(&self.table);
        let table = &mut *table;
        // Watched before (a directory replaced since): its old watches go first, so that a new
        // watch of the same inode (the same descriptor) is not removed with them.
        if let Some(old) = table.roots.remove(dir) {
            table.forget(old);
        }
        let wd = table.watches.add(dir, mask())?;
        table.by_wd.insert(wd.clone(), dir.to_path_buf());
        let root = Root {
            wd,
            generation: volume.then(|| Generation {
                target: data_target(dir),
                wd: None,
            }),
        };
        table.roots.insert(dir.to_path_buf(), root);
        if volume {
            // The layout's read follows.
            table.attach(dir);
        }
        Ok(())
    }

    /// Stops watching `dir` (and a volume's generation with it).
    pub(super) fn unwatch(&mut self, dir: &Path) {
        let mut table = lock(&self.table);
        if let Some(root) = table.roots.remove(dir) {
            table.forget(root);
        }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Err(err) = self.waker.wake() {
            tracing::debug!(error = %err, "cannot wake the inotify thread to stop it");
        }
    }
}

fn lock(table: &Mutex<Table>) -> MutexGuard<'_, Table> {
    table.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Table {
    /// Drops `root`'s watches (a removed directory's are gone already: the kernel says no).
    fn forget(&mut self, root: Root) {
        let generation = root.generation.and_then(|g| g.wd);
        for wd in std::iter::once(root.wd).chain(generation) {
            self.by_wd.remove(&wd);
            let _ = self.watches.remove(wd);
        }
    }

    /// The volume `dir`'s `..data` names an event: if it leads elsewhere now, the old
    /// generation's watch leaves the table (its events are dropped from now on) and the kernel
    /// (before whoever swapped removes that generation: see the module's notes), and the new
    /// generation is to be watched ([`attach`](Self::attach)).
    fn detach(&mut self, dir: &Path) {
        let target = data_target(dir);
        let Some(generation) = self.roots.get_mut(dir).and_then(|r| r.generation.as_mut()) else {
            return;
        };
        if generation.target == target && generation.wd.is_some() {
            return;
        }
        generation.target = target;
        if let Some(old) = generation.wd.take() {
            self.by_wd.remove(&old);
            // Already gone if the generation was removed first (the kernel says so).
            let _ = self.watches.remove(old);
        }
    }

    /// Watches the generation the volume `dir`'s `..data` led to when last looked at, unless
    /// it is watched. Returns whether a watch was added.
    fn attach(&mut self, dir: &Path) -> bool {
        let Self {
            watches,
            by_wd,
            roots,
        } = self;
        let Some(generation) = roots.get_mut(dir).and_then(|r| r.generation.as_mut()) else {
            return false;
        };
        if generation.wd.is_some() {
            return false;
        }
        // Gone already (swapped again, or removed): the next event on `..data` looks again.
        let Some(path) = generation.target.as_ref().map(|target| dir.join(target)) else {
            return false;
        };
        let Ok(wd) = watches.add(&path, mask()) else {
            return false;
        };
        by_wd.insert(wd.clone(), path);
        generation.wd = Some(wd);
        true
    }
}

/// Where the volume `dir`'s `..data` leads now, if to a directory beside it.
fn data_target(dir: &Path) -> Option<PathBuf> {
    std::fs::read_link(dir.join("..data"))
        .ok()
        .filter(|target| beside(target))
}

/// The reading thread's side.
struct Thread {
    inotify: Inotify,
    poll: Poll,
    table: Arc<Mutex<Table>>,
    stop: Arc<AtomicBool>,
    reads: Arc<dyn OnEvent>,
}

impl Thread {
    fn run(mut self) {
        // Room for many events per read; one needs at most 16 bytes and a 256-byte name.
        let mut buffer = vec![0_u8; 64 * 1024];
        let mut ready = mio::Events::with_capacity(2);
        loop {
            if let Err(err) = self.poll.poll(&mut ready, None) {
                if err.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                tracing::error!(error = %err, "cannot wait for file events; the poll backstop goes on");
                return;
            }
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            // Edge-triggered: read until there is nothing left.
            loop {
                match self.inotify.read_events(&mut buffer) {
                    Ok(events) => {
                        let (paths, lost, moved) = self.paths(events);
                        on_event(&*self.reads, &paths, lost);
                        if !moved.is_empty() {
                            self.moved(moved);
                        }
                    }
                    Err(err) if err.kind() == io::ErrorKind::WouldBlock => break,
                    Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                    Err(err) => {
                        tracing::error!(error = %err, "cannot read file events; the poll backstop goes on");
                        return;
                    }
                }
            }
        }
    }

    /// After the read that a swap of `..data` caused (the new certificate is served by then):
    /// the volumes' new generations are watched, and what a write made between the read and
    /// the new watch is read now.
    fn moved(&self, volumes: Vec<PathBuf>) {
        let mut table = lock(&self.table);
        let mut added = false;
        for volume in volumes {
            added |= table.attach(&volume);
        }
        drop(table);
        if added {
            self.reads.recheck();
        }
    }

    /// The paths one read's events name; whether events were lost (the kernel's queue
    /// overflowed); and each volume whose `..data` they name (its old generation's watch gone
    /// from that event on, its new one still to add).
    fn paths(&self, events: inotify::Events<'_>) -> (Vec<PathBuf>, bool, Vec<PathBuf>) {
        let mut table = lock(&self.table);
        let mut paths = Vec::new();
        let mut moved = Vec::new();
        let mut lost = false;
        for event in events {
            if event.mask.contains(EventMask::Q_OVERFLOW) {
                lost = true;
                continue;
            }
            if event.mask.contains(EventMask::IGNORED) {
                // The watch is gone (its directory removed, or dropped here): a generation
                // that lost it is watched again at the next event on `..data`.
                table.by_wd.remove(&event.wd);
                for generation in table
                    .roots
                    .values_mut()
                    .filter_map(|r| r.generation.as_mut())
                {
                    if generation.wd.as_ref() == Some(&event.wd) {
                        generation.wd = None;
                    }
                }
                continue;
            }
            let Some(dir) = table.by_wd.get(&event.wd) else {
                // A watch dropped since the event was queued (an old generation's).
                continue;
            };
            let Some(name) = event.name.filter(|name| !name.is_empty()) else {
                paths.push(dir.clone());
                continue;
            };
            paths.push(dir.join(name));
            // A volume's own watch naming its `..data`: here, not after the batch, so that
            // the old generation's events that follow in it (the kubelet removing it) are
            // dropped with its watch.
            let volume = table
                .roots
                .get(dir)
                .is_some_and(|root| root.wd == event.wd && root.generation.is_some());
            if volume && name == OsStr::new("..data") {
                let volume = dir.clone();
                table.detach(&volume);
                moved.push(volume);
            }
        }
        (paths, lost, moved)
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::sync::mpsc;
    use std::time::Duration;

    use tls_test::{KubeDir, overwrite_in_place};

    use super::super::tests::CHILDREN;
    use super::*;

    const PATIENCE: Duration = Duration::from_secs(10);

    /// What the watcher's thread hands over: each path an event named, and each read it made
    /// (with what the kernel was watching for this process as it made it).
    struct Recorder {
        relevant: Mutex<Vec<PathBuf>>,
        seen: Mutex<mpsc::Sender<Seen>>,
        watched_at_read: Mutex<Vec<Inode>>,
    }

    impl Recorder {
        fn new(relevant: Vec<PathBuf>) -> (Arc<Self>, mpsc::Receiver<Seen>) {
            let (tx, seen) = mpsc::channel();
            let recorder = Self {
                relevant: Mutex::new(relevant),
                seen: Mutex::new(tx),
                watched_at_read: Mutex::new(Vec::new()),
            };
            (Arc::new(recorder), seen)
        }
    }

    /// No child process starts while a test counts events (see [`CHILDREN`]).
    fn children() -> std::sync::RwLockReadGuard<'static, ()> {
        CHILDREN.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// A file's device (as the kernel numbers it) and inode.
    type Inode = (u64, u64);

    fn inode(path: &Path) -> Inode {
        use std::os::unix::fs::MetadataExt as _;
        let meta = fs::metadata(path).unwrap();
        let dev = meta.dev();
        // The C library's device number, in the kernel's own encoding (as /proc shows it).
        let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
        let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
        ((major << 20) | minor, meta.ino())
    }

    /// Every inode an inotify instance of this process watches, as the kernel lists them in
    /// `/proc/self/fdinfo` (`inotify wd:1 ino:1a2b sdev:800021 mask:…`, in hexadecimal).
    fn watched_by_the_kernel() -> Vec<Inode> {
        let hex = |line: &str, key: &str| {
            let value = line.split(' ').find_map(|field| field.strip_prefix(key))?;
            u64::from_str_radix(value, 16).ok()
        };
        let mut watched = Vec::new();
        for fd in fs::read_dir("/proc/self/fdinfo").unwrap() {
            // A descriptor closed since it was listed is skipped.
            let Ok(info) = fs::read_to_string(fd.unwrap().path()) else {
                continue;
            };
            for line in info.lines().filter(|l| l.starts_with("inotify wd:")) {
                if let (Some(dev), Some(ino)) = (hex(line, "sdev:"), hex(line, "ino:")) {
                    watched.push((dev, ino));
                }
            }
        }
        watched
    }

    #[derive(Debug, PartialEq)]
    enum Seen {
        Path(PathBuf),
        Read,
        /// A new generation watched after the read.
        Recheck,
    }

    impl OnEvent for Recorder {
        fn relevant(&self) -> MutexGuard<'_, Vec<PathBuf>> {
            self.relevant.lock().unwrap()
        }
        fn changed(&self, path: &Path) {
            let _ = self
                .seen
                .lock()
                .unwrap()
                .send(Seen::Path(path.to_path_buf()));
        }
        fn lost(&self) {}
        fn read(&self) {
            *self.watched_at_read.lock().unwrap() = watched_by_the_kernel();
            let _ = self.seen.lock().unwrap().send(Seen::Read);
        }
        fn recheck(&self) {
            let _ = self.seen.lock().unwrap().send(Seen::Recheck);
        }
    }

    /// Everything seen until an event names `marker`, a new file made by the test after what
    /// it looks at: inotify keeps the order of events, so nothing earlier is still on its way.
    /// The marker's own later events are dropped with it (it is removed, unwatched).
    fn until(seen: &mpsc::Receiver<Seen>, marker: &Path) -> Vec<Seen> {
        fs::write(marker, b"marker").unwrap();
        let mut out = Vec::new();
        loop {
            let next = seen.recv_timeout(PATIENCE).expect("the marker's event");
            if next == Seen::Path(marker.to_path_buf()) {
                break;
            }
            out.push(next);
        }
        fs::remove_file(marker).unwrap();
        // Its write, close and removal. When the marker's creation came in one read with what
        // the test looks at, the read and re-check that batch causes follow its paths: they
        // come between the marker's events (about once in 60 runs) and belong to what was seen.
        let mut left = 3;
        while left > 0 {
            match seen.recv_timeout(PATIENCE).expect("the marker's events") {
                Seen::Path(path) => {
                    assert_eq!(path, marker, "only the marker's events after it");
                    left -= 1;
                }
                done => out.push(done),
            }
        }
        out
    }

    fn under<'a>(seen: &'a [Seen], dir: &'a Path) -> impl Iterator<Item = &'a Path> + 'a {
        seen.iter().filter_map(move |s| match s {
            Seen::Path(path) if path.starts_with(dir) => Some(path.as_path()),
            _ => None,
        })
    }

    /// A kubelet volume is watched as its directory and its current generation: writing the
    /// next generation and removing the old one raise no event of theirs, the swap of `..data`
    /// moves the watch to the new generation (an in-place write there is seen), and our own
    /// reads raise nothing.
    #[test]
    fn a_volume_is_watched_with_its_current_generation_only() {
        let _children = children();
        let root = tempfile::tempdir().unwrap();
        let root = fs::canonicalize(root.path()).unwrap();
        let kube = KubeDir::new(root.join("kube")).unwrap();
        kube.write(&[("tls.crt", b"one"), ("tls.key", b"one")])
            .unwrap();
        let data = kube.file("..data");
        let (reads, seen) = Recorder::new(vec![data.clone()]);
        let mut watcher = Watcher::new(reads).unwrap();
        watcher.watch(kube.path(), true).unwrap();
        let first = kube.path().join(fs::read_link(&data).unwrap());
        let marker = kube.file("marker");

        // Reading the current generation's files raises nothing.
        fs::read(first.join("tls.crt")).unwrap();
        let read = until(&seen, &marker);
        assert!(read.is_empty(), "{read:?}");

        let staged = kube
            .stage(&[("tls.crt", b"two"), ("tls.key", b"two")])
            .unwrap();
        let staging = until(&seen, &marker);
        let second = fs::read_dir(kube.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| fs::symlink_metadata(p).is_ok_and(|m| m.is_dir()) && p != &first)
            .expect("the staged generation");
        assert_eq!(
            under(&staging, &second).count(),
            1,
            "only its creation: {staging:?}"
        );
        assert!(!staging.contains(&Seen::Read), "{staging:?}");

        staged.swap().unwrap();
        staged.finish().unwrap();
        let swap = until(&seen, &marker);
        assert!(swap.contains(&Seen::Path(data.clone())), "{swap:?}");
        assert!(swap.contains(&Seen::Read), "the swap is read: {swap:?}");
        assert!(swap.contains(&Seen::Recheck), "then re-checked: {swap:?}");
        let old: Vec<_> = under(&swap, &first).collect();
        assert_eq!(old, [first.as_path()], "only its removal: {swap:?}");

        overwrite_in_place(&second.join("tls.crt"), b"three").unwrap();
        let write = until(&seen, &marker);
        assert!(
            write.contains(&Seen::Path(second.join("tls.crt"))),
            "the new generation is watched: {write:?}"
        );

        // Unwatched: the volume and its generation raise nothing more (what the test writes
        // there comes before the marker in another watched directory).
        watcher.unwatch(kube.path());
        let other = root.join("other");
        fs::create_dir(&other).unwrap();
        watcher.watch(&other, false).unwrap();
        overwrite_in_place(&second.join("tls.crt"), b"four").unwrap();
        fs::write(&marker, b"unwatched").unwrap();
        let after = until(&seen, &other.join("marker"));
        assert_eq!(under(&after, kube.path()).count(), 0, "{after:?}");
    }

    /// The swap of `..data` takes the old generation's watch out of the kernel as soon as it
    /// is seen, before the read: the writer removes that generation right after the swap, and
    /// a watch still there would have the kernel queue its removal's events, and tear the
    /// watch down, in the writer's own system calls.
    #[test]
    fn a_swap_unwatches_the_old_generation_before_the_read() {
        let _children = children();
        let root = tempfile::tempdir().unwrap();
        let kube = KubeDir::new(root.path().join("kube")).unwrap();
        kube.write(&[("tls.crt", b"one"), ("tls.key", b"one")])
            .unwrap();
        let data = kube.file("..data");
        let (reads, seen) = Recorder::new(vec![data.clone()]);
        let mut watcher = Watcher::new(Arc::clone(&reads) as Arc<dyn OnEvent>).unwrap();
        watcher.watch(kube.path(), true).unwrap();
        let (volume, first) = (inode(kube.path()), inode(&data));
        let watched = watched_by_the_kernel();
        assert!(watched.contains(&volume), "{volume:?} in {watched:?}");
        assert!(watched.contains(&first), "{first:?} in {watched:?}");

        let staged = kube
            .stage(&[("tls.crt", b"two"), ("tls.key", b"two")])
            .unwrap();
        staged.swap().unwrap();
        // The old generation is still there (removed only after the read is seen).
        while seen.recv_timeout(PATIENCE).expect("the swap's read") != Seen::Read {}
        let at_read = reads.watched_at_read.lock().unwrap().clone();
        assert!(at_read.contains(&volume), "{volume:?} in {at_read:?}");
        assert!(!at_read.contains(&first), "{first:?} in {at_read:?}");
        staged.finish().unwrap();
    }
}
