//! The notify fast path: which directories to watch as the layout stands, and following it.

#[cfg(not(target_os = "linux"))]
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::io;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

#[cfg(not(target_os = "linux"))]
use notify::RecommendedWatcher;
use tokio::time::Instant;

#[cfg(not(target_os = "linux"))]
use super::event::on_event;
use super::event::{OnEvent, at_or_above, beside};
use super::{Config, out_of_descriptors};
use crate::Backoff;

/// The first wait before a watch that could not be set up is tried again, and the longest.
const WATCH_RETRY_INITIAL: Duration = Duration::from_secs(1);
const WATCH_RETRY_MAX: Duration = Duration::from_secs(60);

/// How soon to try again when file descriptors ran out: nothing says when they come back, and a
/// rotation made meanwhile must be seen within a second of it.
pub(super) const STARVED_RETRY: Duration = Duration::from_millis(250);

/// What to watch as the layout stands.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Targets {
    /// The directories, each as it was when it was worked out.
    dirs: BTreeMap<PathBuf, Dir>,
    /// Every path whose change can change what is read: the configured paths, each symlink met
    /// resolving them (the kubelet's `..data`) and where it leads, and the resolved files. An
    /// event is a reason to read only if it names one of these or a directory above one.
    pub(super) relevant: Vec<PathBuf>,
}

/// The watch of a running source: the watcher (`inotify.rs` on Linux, notify's elsewhere), what
/// it watches, and, when part of it could not be set up, when to try again.
pub(super) struct Watching {
    /// What the watcher's thread reads with, right after an event that may be a change.
    reads: Arc<dyn OnEvent>,
    /// Named in what is logged.
    cert: PathBuf,
    /// Dropping the watcher stops its thread.
    watch: Option<Watch>,
    retry: Option<(Backoff, Instant)>,
}

struct Watch {
    watcher: Backend,
    watched: BTreeMap<PathBuf, Dir>,
}

/// What watches: on Linux our own inotify reader ([`super::inotify`]), which asks for no
/// read-only events and moves a kubelet volume's watch to each new generation on its own
/// thread; elsewhere notify's watcher.
#[cfg(target_os = "linux")]
type Backend = super::inotify::Watcher;
#[cfg(not(target_os = "linux"))]
type Backend = NotifyWatcher;

/// A directory to watch, as it was when the layout was worked out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Dir {
    /// Its identity: a directory removed and re-created is a new one, watched again.
    id: DirId,
    /// A kubelet volume (Linux): watched with the generation its `..data` leads to. The
    /// watcher's own thread moves that watch when an event names `..data`, right after the
    /// read ([`super::inotify`]): no round trip after each rotation, and no events from the
    /// generations being written or removed.
    volume: bool,
}

impl Watching {
    pub(super) fn new(cert: PathBuf, reads: Arc<dyn OnEvent>) -> Self {
        Self {
            reads,
            cert,
            watch: None,
            retry: None,
        }
    }

    /// When to try again to set up what could not be watched, if anything.
    pub(super) fn retry_at(&self) -> Option<Instant> {
        self.retry.as_ref().map(|(_, at)| *at)
    }

    /// A retry has started (a read, whose layout [`follow`](Self::follow) gets): not due again
    /// until that says how it went.
    pub(super) fn retrying(&mut self) {
        if let Some((_, at)) = self.retry.as_mut() {
            *at = Instant::now() + WATCH_RETRY_MAX;
        }
    }

    /// Watches `targets` and nothing else: directories gone or replaced are unwatched, new or
    /// re-created ones watched. Returns whether anything new is watched (a change made before
    /// the watch was set is seen only by reading once more). What cannot be watched is said
    /// once and retried with backoff.
    pub(super) fn follow(&mut self, targets: Targets) -> bool {
        let targets = targets.dirs;
        if self.watch.is_none() {
            match Backend::new(Arc::clone(&self.reads)) {
                Ok(watcher) => {
                    self.watch = Some(Watch {
                        watcher,
                        watched: BTreeMap::new(),
                    });
                }
                Err(err) => {
                    let cert = self.cert.clone();
                    self.failed(&cert, &err);
                    return false;
                }
            }
        }
        let Some(watch) = self.watch.as_mut() else {
            return false;
        };
        let stale: Vec<PathBuf> = watch
            .watched
            .iter()
            .filter(|(dir, id)| targets.get(*dir) != Some(*id))
            .map(|(dir, _)| dir.clone())
            .collect();
        for dir in stale {
            watch.watcher.unwatch(&dir);
            watch.watched.remove(&dir);
        }
        let mut grew = false;
        let mut failed = None;
        for (path, dir) in targets {
            if watch.watched.contains_key(&path) {
                continue;
            }
            match watch.watcher.watch(&path, dir.volume) {
                Ok(()) => {
                    tracing::debug!(dir = %path.display(), volume = dir.volume, "watching");
                    watch.watched.insert(path, dir);
                    grew = true;
                }
                Err(err) => failed = Some((path, err)),
            }
        }
        match failed {
            Some((dir, err)) => self.failed(&dir, &err),
            None => {
                if self.retry.take().is_some() {
                    tracing::info!(cert = %self.cert.display(), "watching the certificate directories again");
                }
            }
        }
        grew
    }

    /// Says once that a watch could not be set up, and schedules the next try: soon when file
    /// descriptors ran out, with backoff otherwise (inotify limits, an unsupported file system).
    fn failed(&mut self, dir: &Path, err: &io::Error) {
        let (backoff, at) = self.retry.get_or_insert_with(|| {
            tracing::warn!(
                error = %err,
                dir = %dir.display(),
                cert = %self.cert.display(),
                "cannot watch the certificate directories; polling meanwhile, retrying the watch"
            );
            (
                Backoff::new(WATCH_RETRY_INITIAL, WATCH_RETRY_MAX),
                Instant::now(),
            )
        });
        let starved = out_of_descriptors(err);
        let wait = if starved {
            STARVED_RETRY
        } else {
            backoff.next().unwrap_or(WATCH_RETRY_MAX)
        };
        *at = Instant::now() + wait;
    }
}

/// notify's watcher, where inotify is not ours to read: every event handed to [`on_event`]
/// on notify's thread, but for the read-only ones. A kubelet volume is not told apart there
/// (only on Linux, see `is_volume_data`).
#[cfg(not(target_os = "linux"))]
struct NotifyWatcher(RecommendedWatcher);

#[cfg(not(target_os = "linux"))]
impl NotifyWatcher {
    fn new(reads: Arc<dyn OnEvent>) -> io::Result<Self> {
        use notify::Watcher as _;
        // Links are not followed into: where a link leads is watched by its own path.
        let config = notify::Config::default().with_follow_symlinks(false);
        let handler = move |event: notify::Result<notify::Event>| match event {
            Ok(event) if is_read_only(&event.kind) => {}
            Ok(event) => {
                let paths: Vec<Cow<'_, Path>> = event
                    .paths
                    .iter()
                    .map(|path| plain(path).map_or_else(|| absolute(path).into(), Cow::Borrowed))
                    .collect();
                on_event(&*reads, &paths, event.need_rescan());
            }
            // Queue overflow and the like: a read will sort it out.
            Err(_) => on_event::<&Path>(&*reads, &[], true),
        };
        RecommendedWatcher::new(handler, config)
            .map(Self)
            .map_err(notify_io)
    }

    fn watch(&mut self, dir: &Path, volume: bool) -> io::Result<()> {
        use notify::Watcher as _;
        let mode = if volume {
            notify::RecursiveMode::Recursive
        } else {
            notify::RecursiveMode::NonRecursive
        };
        self.0.watch(dir, mode).map_err(notify_io)
    }

    fn unwatch(&mut self, dir: &Path) {
        use notify::Watcher as _;
        // A removed directory's watch went with it (unwatching it would only have notify log
        // that it cannot); a replaced one's is dropped here.
        if dir.exists() {
            let _ = self.0.unwatch(dir);
        }
    }
}

/// notify's error as the I/O error it is, or carries.
#[cfg(not(target_os = "linux"))]
fn notify_io(err: notify::Error) -> io::Error {
    match err.kind {
        notify::ErrorKind::Io(io) => io,
        _ => io::Error::other(err),
    }
}

/// `path` as it is when it is already absolute and normalised, as the events of watches on
/// absolute directories are: no allocation for most events.
#[cfg(not(target_os = "linux"))]
fn plain(path: &Path) -> Option<&Path> {
    let bytes = path.as_os_str().as_encoded_bytes();
    let dotted = bytes.ends_with(b"/.")
        || bytes.ends_with(b"/..")
        || bytes.windows(2).any(|w| w == b"//")
        || bytes.windows(3).any(|w| w == b"/./")
        || bytes.windows(4).any(|w| w == b"/../");
    (path.is_absolute() && !dotted).then_some(path)
}

/// Events that cannot change what is read: opens and read-only closes (our own reads cause
/// them). (On Linux, where `inotify.rs` watches, they are not asked for.)
#[cfg(not(target_os = "linux"))]
fn is_read_only(kind: &notify::EventKind) -> bool {
    use notify::EventKind;
    use notify::event::{AccessKind, AccessMode};
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => false,
        EventKind::Access(_) => true,
        _ => false,
    }
}

/// A directory's identity: (device, inode) on Unix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct DirId(u64, u64);

impl DirId {
    fn of(meta: &fs::Metadata) -> Self {
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt as _;
            Self(meta.dev(), meta.ino())
        }
        #[cfg(not(unix))]
        {
            let _ = meta;
            Self(0, 0)
        }
    }
}

/// The file system as the layout was last worked out: each path looked up once (`lstat`, and
/// `readlink` for a link), and kept until an event names it or a directory above it, or until
/// a read that no event caused (the first, the poll, a trigger) starts afresh. A kubelet
/// rotation then looks up its new generation and `..data` again, not every directory from the
/// root down: the layout is worked out on the watcher's thread right after the install, while
/// the handshakes that want the new certificate are starting.
///
/// Kept entries are sound because every path looked up is absolute and free of links but for
/// its last component, as the paths of events are; a directory no watch covers (the ones
/// above a certificate's directory) changes unseen, as it always did: the poll's read, which
/// looks everything up again, is the backstop.
#[derive(Default)]
pub(super) struct Lookups {
    /// What the last layout looked up, less what events have named since.
    kept: HashMap<PathBuf, Entry>,
    /// What this layout looked up: kept when it is done.
    current: HashMap<PathBuf, Entry>,
    /// `stat` through a link (a configured directory that is a link): this layout only, since
    /// an event on where the link leads does not name the link.
    followed: HashMap<PathBuf, Option<fs::Metadata>>,
    /// The kubelet volumes met on the way: directories whose `..data` link, followed, leads to
    /// a directory beside it.
    volumes: BTreeSet<PathBuf>,
}

/// What `lstat` (and for a link `readlink`) said of a path.
#[derive(Clone)]
enum Entry {
    /// Missing, or not to be looked at (permissions, a file on the way).
    Missing,
    Link(PathBuf),
    Other(fs::Metadata),
}

impl Entry {
    fn of(path: &Path) -> Self {
        match fs::symlink_metadata(path) {
            Ok(meta) if meta.is_symlink() => fs::read_link(path).map_or(Self::Missing, Self::Link),
            Ok(meta) => Self::Other(meta),
            Err(_) => Self::Missing,
        }
    }
}

impl Lookups {
    /// An event named `path` (absolute and normalised, as kept paths are): it, and everything
    /// below it, is looked up again.
    pub(super) fn changed(&mut self, path: &Path) {
        if !self.kept.is_empty() {
            self.kept.retain(|kept, _| !at_or_above(path, kept));
        }
    }

    /// Everything is looked up again (a read no event caused, or events lost).
    pub(super) fn forget(&mut self) {
        self.kept.clear();
    }

    fn entry(&mut self, path: &Path) -> &Entry {
        if !self.current.contains_key(path) {
            let entry = self.kept.remove(path).unwrap_or_else(|| Entry::of(path));
            self.current.insert(path.to_path_buf(), entry);
        }
        &self.current[path]
    }

    /// This layout is worked out: what it looked up is kept for the next.
    fn done(&mut self) {
        self.kept = std::mem::take(&mut self.current);
        self.followed.clear();
        self.volumes.clear();
    }

    /// Where the symlink at `path` leads, or `None` when `path` is not a symlink (or missing).
    fn read_link(&mut self, path: &Path) -> Option<PathBuf> {
        match self.entry(path) {
            Entry::Link(target) => Some(target.clone()),
            Entry::Missing | Entry::Other(_) => None,
        }
    }

    /// `path`'s metadata, following symlinks.
    fn metadata(&mut self, path: &Path) -> Option<fs::Metadata> {
        match self.entry(path) {
            Entry::Other(meta) => Some(meta.clone()),
            Entry::Missing => None,
            Entry::Link(_) => {
                if let Some(meta) = self.followed.get(path) {
                    return meta.clone();
                }
                let meta = fs::metadata(path).ok();
                self.followed.insert(path.to_path_buf(), meta.clone());
                meta
            }
        }
    }

    /// `dir`, or while it is missing its nearest existing ancestor, with its identity.
    fn nearest_existing(&mut self, mut dir: PathBuf) -> Option<(PathBuf, DirId)> {
        loop {
            match self.metadata(&dir) {
                Some(meta) if meta.is_dir() => return Some((dir, DirId::of(&meta))),
                _ => match dir.parent() {
                    Some(up) if !up.as_os_str().is_empty() => dir = up.to_path_buf(),
                    _ => {
                        let here = PathBuf::from(".");
                        let meta = self.metadata(&here)?;
                        return Some((here, DirId::of(&meta)));
                    }
                },
            }
        }
    }
}

/// What to watch for the configured paths as the layout stands now: each path's directory (or,
/// while it is missing, its nearest existing ancestor, to see it appear); the directory holding
/// a directory symlink on the way (a retargeted link changes there); and the directory the path
/// really resolves to (in-place writes behind the kubelet's `..data` links, or behind a link
/// into another directory, happen there). With them, the paths whose events matter. Blocking:
/// run with the read. All paths are absolute, as the events are. What `lookups` kept from the
/// last call is taken as it stands.
pub(super) fn targets(config: &Config, lookups: &mut Lookups) -> Targets {
    let mut targets = Targets::default();
    let mut add = |lookups: &mut Lookups, dir: PathBuf| {
        if let Some((dir, id)) = lookups.nearest_existing(dir) {
            let volume = false;
            targets.dirs.insert(dir, Dir { id, volume });
        }
    };
    let mut relevant = Vec::new();
    for path in [Some(&config.cert), Some(&config.key), config.ca.as_ref()]
        .into_iter()
        .flatten()
    {
        let path = absolute(path);
        let parent = parent_of(&path);
        if lookups.read_link(&parent).is_some() {
            add(lookups, parent_of(&parent));
        }
        add(lookups, parent);
        let resolved = resolution(&path, &mut relevant, 0, lookups);
        // Where the path really leads (what `canonicalize` returns), when it exists: the end of
        // its resolution, every link on the way followed.
        let real = if resolved {
            relevant.last().cloned()
        } else {
            fs::canonicalize(&path).ok()
        };
        if let Some(real) = real.filter(|real| lookups.metadata(real).is_some()) {
            add(lookups, parent_of(&real));
            relevant.push(real);
        }
    }
    // A kubelet volume is watched as one: its directory and its current generation, which
    // the watcher moves itself. Directories below the generation (a key's path such as
    // `sub/tls.crt`) stay targets of their own; other paths into the volume are its links.
    for volume in std::mem::take(&mut lookups.volumes) {
        if let Some(meta) = lookups.metadata(&volume).filter(fs::Metadata::is_dir) {
            let generation = lookups
                .read_link(&volume.join("..data"))
                .map(|target| volume.join(target));
            targets.dirs.retain(|dir, _| {
                dir == &volume
                    || !dir.starts_with(&volume)
                    || generation
                        .as_ref()
                        .is_some_and(|g| dir != g && dir.starts_with(g))
            });
            let id = DirId::of(&meta);
            targets.dirs.insert(volume, Dir { id, volume: true });
        }
    }
    lookups.done();
    relevant.sort();
    relevant.dedup();
    targets.relevant = relevant;
    targets
}

/// Whether the link at `link`, leading to `target`, is a kubelet volume's `..data`: named so,
/// and leading to a directory beside it (the current generation). Told apart on Linux only,
/// where the kubelet runs and the watch is ours to move (`inotify.rs`).
fn is_volume_data(link: &Path, target: &Path) -> bool {
    cfg!(target_os = "linux")
        && link.file_name() == Some(std::ffi::OsStr::new("..data"))
        && beside(target)
}

/// Pushes `path` and, if resolving it meets a symlink, every path resolving goes through: the
/// first symlink on the way and, recursively, the path it leads to (lexically normalised).
/// Returns whether the last path pushed is fully resolved: no symlink on it, and no `..` that
/// only the file system could fold.
fn resolution(path: &Path, out: &mut Vec<PathBuf>, depth: usize, lookups: &mut Lookups) -> bool {
    // Linux follows at most 40 links in one resolution.
    const MAX_LINKS: usize = 40;
    out.push(path.to_path_buf());
    if depth == MAX_LINKS {
        return false;
    }
    let mut prefix = PathBuf::new();
    let mut components = path.components();
    let mut folded = true;
    while let Some(component) = components.next() {
        prefix.push(component);
        match component {
            Component::Normal(_) => {
                if let Some(target) = lookups.read_link(&prefix) {
                    let base = parent_of(&prefix);
                    if is_volume_data(&prefix, &target) {
                        lookups.volumes.insert(base.clone());
                    }
                    let mut next = normalize(&base.join(target));
                    // (Pushing nothing would add a trailing `/`: no longer the file's path.)
                    let rest = components.as_path();
                    if !rest.as_os_str().is_empty() {
                        next.push(rest);
                    }
                    return resolution(&next, out, depth + 1, lookups);
                }
            }
            Component::ParentDir | Component::CurDir => folded = false,
            Component::RootDir | Component::Prefix(_) => {}
        }
    }
    folded
}

/// `path` made absolute against the current directory, without touching the file system.
fn absolute(path: &Path) -> PathBuf {
    normalize(&std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()))
}

/// Drops `.` and folds `..` into its parent, lexically.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

fn parent_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn path() -> impl Strategy<Value = PathBuf> {
        prop::collection::vec(
            prop::sample::select(vec!["a", "ab", "b", "..data", "tls.crt"]),
            0..4,
        )
        .prop_map(|parts| Path::new("/").join(parts.join("/")))
    }

    proptest! {
        /// The event filter's byte comparison decides as `Path::starts_with` does.
        #[test]
        fn at_or_above_is_starts_with(event in path(), relevant in path()) {
            prop_assert_eq!(at_or_above(&event, &relevant), relevant.starts_with(&event));
        }
    }

    /// What is watched for the kubelet's layout and for links into another directory (by
    /// absolute path): each file's directory, and where each really leads, as `canonicalize`
    /// says; a kubelet volume whole, its generations with it.
    #[test]
    fn targets_follow_the_kubelet_links_and_links_elsewhere() {
        let root = tempfile::tempdir().unwrap();
        let root = fs::canonicalize(root.path()).unwrap();
        let kube = tls_test::KubeDir::new(root.join("kube")).unwrap();
        kube.write(&[("tls.crt", b"cert"), ("tls.key", b"key")])
            .unwrap();
        let (elsewhere, links) = (root.join("elsewhere"), root.join("links"));
        fs::create_dir(&elsewhere).unwrap();
        fs::create_dir(&links).unwrap();
        for name in ["tls.crt", "tls.key"] {
            fs::write(elsewhere.join(name), name).unwrap();
            std::os::unix::fs::symlink(elsewhere.join(name), links.join(name)).unwrap();
        }
        for dir in [kube.path(), links.as_path()] {
            let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
            let found = targets(
                &crate::FileSource::builder(&cert, &key).config,
                &mut Lookups::default(),
            );
            assert!(found.dirs.contains_key(dir), "{found:?}");
            for file in [&cert, &key] {
                let real = fs::canonicalize(file).unwrap();
                assert_ne!(&real, file);
                assert!(found.relevant.contains(file), "{found:?}");
                assert!(found.relevant.contains(&real), "{found:?}");
                let real_dir = real.parent().unwrap();
                if dir == kube.path() && cfg!(target_os = "linux") {
                    // The generation is watched with the volume, not on its own (elsewhere a
                    // volume is not told apart: its generation is a directory like another).
                    assert!(found.dirs[dir].volume, "{found:?}");
                    assert!(!found.dirs.contains_key(real_dir), "{found:?}");
                    assert!(real_dir.starts_with(dir));
                } else {
                    assert!(!found.dirs[dir].volume, "{found:?}");
                    assert!(found.dirs.contains_key(real_dir), "{found:?}");
                }
            }
        }
    }

    /// A layout worked out again after events, from what the last one looked up less what
    /// the events named, is the layout worked out afresh: through kubelet swaps, a link
    /// retargeted into another directory, and a directory removed and laid out again.
    #[test]
    fn a_layout_after_events_is_the_layout_afresh() {
        let root = tempfile::tempdir().unwrap();
        let root = fs::canonicalize(root.path()).unwrap();
        let kube = tls_test::KubeDir::new(root.join("kube")).unwrap();
        kube.write(&[("tls.crt", b"1"), ("tls.key", b"1")]).unwrap();
        let config =
            crate::FileSource::builder(kube.path().join("tls.crt"), kube.path().join("tls.key"))
                .config;
        let mut kept = Lookups::default();
        let first = targets(&config, &mut kept);
        assert_eq!(first, targets(&config, &mut Lookups::default()));

        // A kubelet swap: the events name the new generation, `..data_tmp` and `..data`, then
        // the old generation as it is removed.
        let old = fs::read_link(kube.path().join("..data")).unwrap();
        kube.write(&[("tls.crt", b"2"), ("tls.key", b"2")]).unwrap();
        let new = fs::read_link(kube.path().join("..data")).unwrap();
        assert_ne!(old, new);
        for name in [
            new.as_path(),
            Path::new("..data_tmp"),
            Path::new("..data"),
            old.as_path(),
        ] {
            kept.changed(&kube.path().join(name));
        }
        let swapped = targets(&config, &mut kept);
        assert_ne!(swapped.relevant, first.relevant);
        assert_eq!(swapped, targets(&config, &mut Lookups::default()));

        // Links retargeted into another directory: the events name the links.
        let (links, a, b) = (root.join("links"), root.join("a"), root.join("b"));
        for dir in [&links, &a, &b] {
            fs::create_dir(dir).unwrap();
        }
        for name in ["tls.crt", "tls.key"] {
            fs::write(a.join(name), name).unwrap();
            fs::write(b.join(name), name).unwrap();
            std::os::unix::fs::symlink(a.join(name), links.join(name)).unwrap();
        }
        let config =
            crate::FileSource::builder(links.join("tls.crt"), links.join("tls.key")).config;
        let mut kept = Lookups::default();
        let first = targets(&config, &mut kept);
        for name in ["tls.crt", "tls.key"] {
            let tmp = links.join(format!("{name}.tmp"));
            std::os::unix::fs::symlink(b.join(name), &tmp).unwrap();
            fs::rename(&tmp, links.join(name)).unwrap();
            kept.changed(&tmp);
            kept.changed(&links.join(name));
        }
        let retargeted = targets(&config, &mut kept);
        assert!(retargeted.dirs.contains_key(&b) && !retargeted.dirs.contains_key(&a));
        assert_ne!(retargeted, first);
        assert_eq!(retargeted, targets(&config, &mut Lookups::default()));

        // The directory removed (its watch names it) and laid out again (its parent's names
        // it): a new directory, watched again.
        fs::remove_dir_all(&b).unwrap();
        kept.changed(&b);
        let gone = targets(&config, &mut kept);
        assert!(!gone.dirs.contains_key(&b));
        assert_eq!(gone, targets(&config, &mut Lookups::default()));
        fs::create_dir(&b).unwrap();
        for name in ["tls.crt", "tls.key"] {
            fs::write(b.join(name), name).unwrap();
        }
        kept.changed(&b);
        let back = targets(&config, &mut kept);
        assert!(back.dirs.contains_key(&b));
        assert_eq!(back, targets(&config, &mut Lookups::default()));
    }

    #[cfg(not(target_os = "linux"))]
    #[test]
    fn plain_paths_are_taken_as_they_are() {
        assert!(plain(Path::new("/run/secrets/..data")).is_some());
        for dotted in [
            "/run/./secrets",
            "/run/../secrets",
            "/run//secrets",
            "/run/.",
            "run",
        ] {
            assert!(plain(Path::new(dotted)).is_none(), "{dotted}");
        }
    }
}
