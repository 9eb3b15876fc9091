//! What the watcher's thread does with an event, whichever watcher it comes from (`inotify.rs`
//! on Linux, notify's in `watch.rs` elsewhere): the [`OnEvent`] it calls back into (the running
//! source's reads, `state.rs`), and the path tests both watchers share.

use std::path::{Component, Path, PathBuf};
use std::sync::MutexGuard;

/// What the watcher's thread needs of the source it watches for (the running source's reads,
/// in `state.rs`): which paths matter now, and a read right after an event on one of them.
pub(super) trait OnEvent: Send + Sync + 'static {
    /// Every path whose change can change what is read ([`Targets::relevant`](super::watch::Targets) as of the last
    /// read).
    fn relevant(&self) -> MutexGuard<'_, Vec<PathBuf>>;
    /// An event named `path` (absolute): what the layout looked up there is stale.
    fn changed(&self, path: &Path);
    /// Events were lost (the queue overflowed): everything the layout looked up is stale.
    fn lost(&self);
    /// Reads now, on the calling thread (the watcher's), after an event.
    fn read(&self);
    /// A watch was just added: reads again, on the calling thread, if the files' stamps say
    /// they changed since the last read (what the new watch could have missed). Linux only,
    /// where the watcher's thread moves a volume's watch itself (`inotify.rs`).
    #[cfg(target_os = "linux")]
    fn recheck(&self);
}

/// What the watcher's thread does with the paths an event (or one read of several) names,
/// before anything else: the layout's lookups of them and below them are stale; `unknown`
/// (events were lost) makes every lookup stale. Then it reads, on this thread, if any path is
/// one that matters or a directory above one: no hop to another thread on the way to a
/// rotation, which keeps it fast on a server whose runtime is busy. Events on other names (the
/// kubelet's new timestamped directory and `..data_tmp` before the rename, the old generation
/// removed after it, a neighbour's files) are ignored: a read they caused would only delay the
/// one that matters. Paths are absolute and normalised.
pub(super) fn on_event<P: AsRef<Path>>(reads: &dyn OnEvent, paths: &[P], unknown: bool) {
    for path in paths {
        reads.changed(path.as_ref());
    }
    let unknown = unknown || paths.is_empty();
    if unknown {
        reads.lost();
    }
    let matters = unknown || {
        let relevant = reads.relevant();
        paths
            .iter()
            .any(|path| relevant.iter().any(|r| at_or_above(path.as_ref(), r)))
    };
    if matters {
        reads.read();
    }
}

/// Whether `path` is `relevant` or a directory above it; both absolute and normalised. By
/// bytes, which for such paths is what [`Path::starts_with`] decides, without parsing them
/// into components.
pub(super) fn at_or_above(path: &Path, relevant: &Path) -> bool {
    let (p, r) = (
        path.as_os_str().as_encoded_bytes(),
        relevant.as_os_str().as_encoded_bytes(),
    );
    let p = if p.len() > 1 {
        p.strip_suffix(b"/").unwrap_or(p)
    } else {
        p
    };
    r.starts_with(p) && (r.len() == p.len() || r[p.len()] == b'/' || p == b"/")
}

/// Whether a link's target is a directory beside the link: one plain name (as the kubelet's
/// `..data` leads to its current generation).
pub(super) fn beside(target: &Path) -> bool {
    let mut parts = target.components();
    matches!(
        (parts.next(), parts.next()),
        (Some(Component::Normal(_)), None)
    )
}
