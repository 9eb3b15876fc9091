//! Writing files the way the kubelet does, for sources that keep what they make or fetch (the
//! self-signed generator's pairs, an ACME client's certificates): every file of a generation
//! written into a new directory and made visible by one atomic swap of a `..data` symlink,
//! the layout [`FileSource`](crate::FileSource) follows. A reader sees the old set or the new
//! one, never a mix.
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! let store = dir.path().join("example.com");
//! tls_source::layout::write_set(&store, &[("tls.crt", b"PEM...", 0o644), ("tls.key", b"PEM...", 0o600)])?;
//! assert_eq!(tls_source::layout::read(&store, "tls.crt")?.as_deref(), Some(&b"PEM..."[..]));
//! assert!(std::fs::symlink_metadata(store.join("..data"))?.file_type().is_symlink());
//! # Ok(()) }
//! ```

use std::fs;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};

/// A file of the layout that could not be read or written: the path and why.
#[derive(Debug, thiserror::Error)]
#[error("{}: {source}", path.display())]
pub struct LayoutError {
    /// The file or directory.
    pub path: PathBuf,
    /// Why.
    #[source]
    pub source: io::Error,
}

/// Reads `dir/name`; `None` when it does not exist.
pub fn read(dir: &Path, name: &str) -> Result<Option<Vec<u8>>, LayoutError> {
    let path = dir.join(name);
    match fs::read(&path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(LayoutError { path, source }),
    }
}

/// Writes `files` (name, content, Unix mode) as one generation: into a new `dir/..<n>` directory,
/// then `dir/..data` is pointed at it by one rename, and `dir/<name>` are links through
/// `..data`. A reader of `dir/<name>` sees the old set or the new one, never a mix; the
/// previous generation is removed after. (Without symlinks: each file renamed into place.)
pub fn write_set(dir: &Path, files: &[(&str, &[u8], u32)]) -> Result<(), LayoutError> {
    fs::create_dir_all(dir).map_err(|source| LayoutError {
        path: dir.to_path_buf(),
        source,
    })?;
    #[cfg(unix)]
    {
        swap_in(dir, files)
    }
    #[cfg(not(unix))]
    {
        for (name, content, mode) in files {
            write_atomic(&dir.join(name), content, *mode)?;
        }
        Ok(())
    }
}

#[cfg(unix)]
fn swap_in(dir: &Path, files: &[(&str, &[u8], u32)]) -> Result<(), LayoutError> {
    use std::os::unix::fs::symlink;
    let err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| LayoutError { path, source }
    };
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let generation = format!("..{nanos}.{}", std::process::id());
    let gen_dir = dir.join(&generation);
    fs::create_dir(&gen_dir).map_err(err(&gen_dir))?;
    let staged = files
        .iter()
        .try_for_each(|(name, content, mode)| write_new(&gen_dir.join(name), content, *mode))
        .and_then(|()| {
            sync_dir(&gen_dir);
            let tmp = dir.join("..data_tmp");
            let _ = fs::remove_file(&tmp);
            symlink(&generation, &tmp).map_err(err(&tmp))?;
            Ok(tmp)
        });
    let tmp = match staged {
        Ok(tmp) => tmp,
        Err(e) => {
            // Nothing is visible yet: no half-written generation (keys included) is left.
            let _ = fs::remove_dir_all(&gen_dir);
            return Err(e);
        }
    };
    let old = fs::read_link(dir.join("..data")).ok();
    // The one atomic step.
    if let Err(e) = fs::rename(&tmp, dir.join("..data")) {
        let _ = fs::remove_file(&tmp);
        let _ = fs::remove_dir_all(&gen_dir);
        return Err(LayoutError {
            path: dir.join("..data"),
            source: e,
        });
    }
    // The previous generation is unreachable now: removed at once, so a failure below (a
    // directory where a link should be) leaves no stale copy of a key behind.
    if let Some(old) = old.as_ref().filter(|old| *old != Path::new(&generation)) {
        let _ = fs::remove_dir_all(dir.join(old));
    }
    for (name, _, _) in files {
        let visible = dir.join(name);
        if fs::symlink_metadata(&visible).is_ok_and(|m| m.file_type().is_symlink()) {
            continue;
        }
        // A plain file of an older layout is replaced by the link, atomically too.
        let link = dir.join(format!(".{name}.link"));
        let _ = fs::remove_file(&link);
        symlink(Path::new("..data").join(name), &link).map_err(err(&link))?;
        fs::rename(&link, &visible).map_err(err(&visible))?;
    }
    sync_dir(dir);
    Ok(())
}

/// Creates `path` with `mode` and `bytes`, synced.
#[cfg(unix)]
fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<(), LayoutError> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let persist_err = |source| LayoutError {
        path: path.to_path_buf(),
        source,
    };
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(persist_err)?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(persist_err)
}

fn sync_dir(dir: &Path) {
    if let Ok(dir) = fs::File::open(dir) {
        let _ = dir.sync_all();
    }
}

/// Writes a temporary file beside `path` with `mode`, syncs it, renames it over `path`, and syncs
/// the directory: a reader sees the old file or the new one, never a part.
#[cfg(not(unix))]
fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<(), LayoutError> {
    let persist_err = |source| LayoutError {
        path: path.to_path_buf(),
        source,
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp: PathBuf = dir.join(format!(".{name}.tmp.{}", std::process::id()));
    let _ = fs::remove_file(&tmp);
    let mut options = fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.mode(mode);
    }
    #[cfg(not(unix))]
    let _ = mode;
    let mut file = options.open(&tmp).map_err(persist_err)?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(persist_err)?;
    drop(file);
    fs::rename(&tmp, path).map_err(persist_err)?;
    if let Ok(dir) = fs::File::open(dir) {
        let _ = dir.sync_all();
    }
    Ok(())
}
