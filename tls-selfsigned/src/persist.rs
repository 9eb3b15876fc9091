//! Keeping generated pairs in a directory: atomic writes, key files mode 0600.

use std::fs;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};

use crate::Error;

/// Reads `dir/name`; `None` when it does not exist.
pub(crate) fn read(dir: &Path, name: &str) -> Result<Option<Vec<u8>>, Error> {
    let path = dir.join(name);
    match fs::read(&path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(Error::Persist { path, source }),
    }
}

/// Writes `dir/{stem}.key` (mode 0600) then `dir/{stem}.crt` (mode 0644), each atomically.
pub(crate) fn write_pair(
    dir: &Path,
    stem: &str,
    cert_pem: &str,
    key_pem: &str,
) -> Result<(), Error> {
    fs::create_dir_all(dir).map_err(|source| Error::Persist {
        path: dir.to_path_buf(),
        source,
    })?;
    write_atomic(&dir.join(format!("{stem}.key")), key_pem.as_bytes(), 0o600)?;
    write_atomic(&dir.join(format!("{stem}.crt")), cert_pem.as_bytes(), 0o644)
}

/// Writes a temporary file beside `path` with `mode`, syncs it, renames it over `path`, and syncs
/// the directory: a reader sees the old file or the new one, never a part.
fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<(), Error> {
    let persist_err = |source| Error::Persist {
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
