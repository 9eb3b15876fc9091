//! Writing files the ways they change under a server.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A directory updated the way the kubelet updates a Secret or ConfigMap volume.
///
/// Layout after [`write`](Self::write):
/// ```text
/// dir/..2026_12_01_10_00_00.000000001/tls.crt   (the files of this generation)
/// dir/..data -> ..2026_12_01_10_00_00.000000001
/// dir/tls.crt -> ..data/tls.crt                   (stable user-visible paths)
/// ```
/// Each write makes a new timestamped directory, points a `..data_tmp` symlink at it, renames
/// that over `..data` (the one atomic step), then removes the previous directory. A watch on
/// `dir/tls.crt` itself sees no write at all: only the parent directory sees the rename.
#[derive(Debug, Clone)]
pub struct KubeDir {
    dir: PathBuf,
}

static SEQUENCE: AtomicU64 = AtomicU64::new(0);

impl KubeDir {
    /// A writer for `dir`, created if missing.
    ///
    /// # Errors
    /// If the directory cannot be created.
    pub fn new(dir: impl Into<PathBuf>) -> io::Result<Self> {
        let dir = dir.into();
        fs::create_dir_all(&dir)?;
        Ok(Self { dir })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The user-visible path of `name` in the directory.
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Atomically replaces the whole set of files with `files` (name, content), key files mode
    /// 0600 and others 0644, as the kubelet does.
    ///
    /// # Errors
    /// Any I/O error; the previous generation stays in place if the swap did not happen.
    pub fn write(&self, files: &[(&str, &[u8])]) -> io::Result<()> {
        let staged = self.stage(files)?;
        staged.swap()?;
        staged.finish()
    }

    /// The first half of [`write`](Self::write): writes the new generation's directory, and
    /// nothing a reader of the user-visible paths can see yet. Then [`Staged::swap`] makes it
    /// visible and [`Staged::finish`] tidies up.
    ///
    /// # Errors
    /// Any I/O error.
    pub fn stage(&self, files: &[(&str, &[u8])]) -> io::Result<Staged> {
        let seq = SEQUENCE.fetch_add(1, Ordering::Relaxed);
        let secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let generation = PathBuf::from(format!("..{secs}.{}.{seq:09}", std::process::id()));
        let gen_dir = self.dir.join(&generation);
        fs::create_dir(&gen_dir)?;
        for (name, content) in files {
            let path = gen_dir.join(name);
            // A nested key (`sub/tls.crt`) is written below the generation.
            if let Some(parent) = path.parent() {
                fs::create_dir_all(parent)?;
            }
            fs::write(&path, content)?;
            set_mode(&path, if name.ends_with(".key") { 0o600 } else { 0o644 })?;
        }
        Ok(Staged {
            dir: self.dir.clone(),
            old: fs::read_link(self.dir.join("..data")).ok(),
            generation,
            names: files.iter().map(|(name, _)| (*name).to_owned()).collect(),
        })
    }

    /// Points `..data` at a directory that does not exist: every file becomes a dangling symlink.
    ///
    /// # Errors
    /// Any I/O error.
    pub fn dangle(&self) -> io::Result<()> {
        let tmp = self.dir.join("..data_tmp");
        let _ = fs::remove_file(&tmp);
        symlink(Path::new("..gone"), &tmp)?;
        fs::rename(&tmp, self.dir.join("..data"))
    }
}

/// A generation written by [`KubeDir::stage`], not yet visible.
#[derive(Debug)]
#[must_use = "a staged generation is not visible until swapped"]
pub struct Staged {
    dir: PathBuf,
    old: Option<PathBuf>,
    generation: PathBuf,
    names: Vec<String>,
}

impl Staged {
    /// The one atomic step: points a `..data_tmp` symlink at the new generation and renames it
    /// over `..data`. Opens no file (it works while file descriptors are exhausted).
    ///
    /// # Errors
    /// Any I/O error; the previous generation stays visible if the rename did not happen.
    pub fn swap(&self) -> io::Result<()> {
        let tmp = self.dir.join("..data_tmp");
        let _ = fs::remove_file(&tmp);
        symlink(&self.generation, &tmp)?;
        fs::rename(&tmp, self.dir.join("..data"))
    }

    /// What the kubelet does after the swap: links for new names (for a nested key such as
    /// `sub/tls.crt`, a link of its first component, `sub -> ..data/sub`), the links of names
    /// the new set no longer has removed, and the previous generation's directory removed.
    ///
    /// # Errors
    /// Any I/O error.
    pub fn finish(self) -> io::Result<()> {
        for name in &self.names {
            let visible = self.dir.join(top(name));
            if fs::symlink_metadata(&visible).is_err() {
                symlink(&Path::new("..data").join(top(name)), &visible)?;
            }
        }
        if let Some(old) = &self.old
            && let Ok(entries) = fs::read_dir(self.dir.join(old))
        {
            for entry in entries.flatten() {
                let name = entry.file_name();
                let visible = self.dir.join(&name);
                if !self.names.iter().any(|n| top(n) == Path::new(&name))
                    && fs::symlink_metadata(&visible).is_ok_and(|m| m.file_type().is_symlink())
                {
                    fs::remove_file(visible)?;
                }
            }
        }
        if let Some(old) = self.old {
            match fs::remove_dir_all(self.dir.join(old)) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                other => other?,
            }
        }
        Ok(())
    }
}

/// The name the kubelet links in the volume for the key `name`: its first component (`sub`
/// for `sub/tls.crt`).
fn top(name: &str) -> &Path {
    Path::new(name)
        .iter()
        .next()
        .map_or(Path::new(name), Path::new)
}

/// Overwrites `path` in place (truncate and write, same inode), as `cp new tls.crt` does.
///
/// # Errors
/// Any I/O error.
pub fn overwrite_in_place(path: &Path, content: &[u8]) -> io::Result<()> {
    use std::io::Write as _;
    let mut file = fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)?;
    file.write_all(content)?;
    file.sync_all()
}

/// Writes a temporary file beside `path` and renames it over `path`, as editors and
/// `mv new tls.crt` do.
///
/// # Errors
/// Any I/O error.
pub fn replace_by_rename(path: &Path, content: &[u8]) -> io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    fs::write(&tmp, content)?;
    fs::rename(&tmp, path)
}

#[cfg(unix)]
fn symlink(target: &Path, link: &Path) -> io::Result<()> {
    std::os::unix::fs::symlink(target, link)
}

#[cfg(unix)]
fn set_mode(path: &Path, mode: u32) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
}

#[cfg(not(unix))]
fn symlink(_target: &Path, _link: &Path) -> io::Result<()> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "symlinks need Unix",
    ))
}

#[cfg(not(unix))]
fn set_mode(_path: &Path, _mode: u32) -> io::Result<()> {
    Ok(())
}
