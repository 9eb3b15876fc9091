//! Reading the files consistently: stat, read, stat again, and read again if a change raced.

use std::fs;
use std::io::Read as _;
use std::path::Path;
use std::time::SystemTime;

use super::Config;
use crate::{Decoder, Error};

/// How many times a read that raced a change is retried before the result is passed on anyway.
const STABLE_READ_ATTEMPTS: usize = 3;

/// One value for each file a source reads: the certificate chain, the key, and the CA bundle
/// when one is configured (and, if optional, present).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PerFile<T> {
    pub(super) cert: T,
    pub(super) key: T,
    pub(super) ca: Option<T>,
}

impl<T> PerFile<T> {
    fn try_map<U, E>(&self, mut f: impl FnMut(&T) -> Result<U, E>) -> Result<PerFile<U>, E> {
        Ok(PerFile {
            cert: f(&self.cert)?,
            key: f(&self.key)?,
            ca: self.ca.as_ref().map(f).transpose()?,
        })
    }

    fn map<U>(&self, mut f: impl FnMut(&T) -> U) -> PerFile<U> {
        PerFile {
            cert: f(&self.cert),
            key: f(&self.key),
            ca: self.ca.as_ref().map(f),
        }
    }
}

/// A file's identity: (device, inode) on Unix. The same identity with new content is a file
/// written in place; a new identity, a file replaced.
pub(super) type FileId = (u64, u64);

/// The bytes of the files, read consistently.
pub(super) struct Files {
    pub(super) contents: PerFile<Vec<u8>>,
    pub(super) ids: PerFile<FileId>,
    #[cfg_attr(not(unix), allow(dead_code))]
    pub(super) key_mode: u32,
}

/// What identifies a file's content cheaply: device, inode, length, modification time.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
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
    stamp_of(path, &meta, decoder)
}

fn stamp_of(path: &Path, meta: &fs::Metadata, decoder: &Decoder) -> Result<Stamp, Error> {
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

/// Opens the file at `path` (non-blocking on Unix, so that a FIFO does not wait for a writer)
/// and stamps what it opened (`fstat`: no second walk of the path). `Ok(None)`: it is missing
/// and `optional`.
fn open(
    path: &Path,
    optional: bool,
    decoder: &Decoder,
) -> Result<Option<(fs::File, Stamp)>, Error> {
    let read_err = |source| Error::Read {
        path: path.to_path_buf(),
        source,
    };
    let mut options = fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.custom_flags(libc::O_NONBLOCK);
    }
    let file = match options.open(path) {
        Ok(file) => file,
        Err(e) if optional && e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(read_err(e)),
    };
    let meta = file.metadata().map_err(read_err)?;
    let stamp = stamp_of(path, &meta, decoder)?;
    Ok(Some((file, stamp)))
}

/// Reads the file opened from `path`, `len` bytes long when it was stamped, into a buffer of
/// that size (a growing buffer took half a dozen calls). With `exact`, exactly `len` bytes are
/// read, in one call: a file that changed length meanwhile has a new stamp too, and is read
/// again. The last attempt reads to the end, whatever the length.
fn read_file(
    path: &Path,
    file: fs::File,
    len: u64,
    exact: bool,
    decoder: &Decoder,
) -> Result<Vec<u8>, Error> {
    // The stamp checked the length against the limit.
    let len = len.min(decoder.limit());
    let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0) + 1);
    // Otherwise one byte more than the limit, so a file that grew past it is still refused.
    let take = if exact {
        len
    } else {
        decoder.limit().saturating_add(1)
    };
    file.take(take)
        .read_to_end(&mut bytes)
        .map_err(|source| Error::Read {
            path: path.to_path_buf(),
            source,
        })?;
    decoder.check_size(&path.display().to_string(), bytes.len() as u64)?;
    Ok(bytes)
}

/// Opens, stamps and reads one file; `Ok(None)`: missing and `optional`.
fn read_one(
    path: &Path,
    optional: bool,
    exact: bool,
    decoder: &Decoder,
) -> Result<Option<(Vec<u8>, Stamp)>, Error> {
    let Some((file, stamp)) = open(path, optional, decoder)? else {
        return Ok(None);
    };
    let bytes = read_file(path, file, stamp.len, exact, decoder)?;
    Ok(Some((bytes, stamp)))
}

/// Reads every file, retrying while a change races the read (see [`FileSource`](super::FileSource)).
pub(super) fn read_stable(config: &Config) -> Result<Files, Error> {
    let decoder = &config.decoder;
    let mut attempt = 0;
    loop {
        attempt += 1;
        let exact = attempt < STABLE_READ_ATTEMPTS;
        // Each file stamped as it is opened, read, and stamped again by its path once all are
        // read: what was read is what the paths hold after the last read, or it is read again.
        let required = |path: &Path| {
            read_one(path, false, exact, decoder)?.ok_or_else(|| Error::Read {
                path: path.to_path_buf(),
                source: std::io::ErrorKind::NotFound.into(),
            })
        };
        let cert = required(&config.cert)?;
        let key = required(&config.key)?;
        // An optional CA is read when it exists when it is opened.
        let ca = match &config.ca {
            Some(ca) => read_one(ca, !config.ca_required, exact, decoder)?.map(|read| (ca, read)),
            None => None,
        };
        let paths = PerFile {
            cert: config.cert.as_path(),
            key: config.key.as_path(),
            ca: ca.as_ref().map(|(path, _)| path.as_path()),
        };
        let before = PerFile {
            cert: cert.1,
            key: key.1,
            ca: ca.as_ref().map(|(_, (_, stamp))| *stamp),
        };
        let contents = PerFile {
            cert: cert.0,
            key: key.0,
            ca: ca.map(|(_, (bytes, _))| bytes),
        };
        let after = paths.try_map(|p| stamp(p, decoder))?;
        if before != after && attempt < STABLE_READ_ATTEMPTS {
            tracing::debug!(cert = %config.cert.display(), "files changed while read; reading again");
            continue;
        }
        return Ok(Files {
            ids: after.map(|s| (s.dev, s.ino)),
            key_mode: after.key.mode,
            contents,
        });
    }
}
