//! Reading the files consistently: stat, read, stat again, and read again if a change raced.

use std::fs;
use std::io::Read as _;
use std::path::Path;
use std::time::SystemTime;

use sha2::{Digest as _, Sha256};

use super::Config;
use crate::{Decoder, Digest, Error};

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

    fn try_zip<U, V, E>(
        &self,
        other: &PerFile<U>,
        mut f: impl FnMut(&T, &U) -> Result<V, E>,
    ) -> Result<PerFile<V>, E> {
        Ok(PerFile {
            cert: f(&self.cert, &other.cert)?,
            key: f(&self.key, &other.key)?,
            ca: match (&self.ca, &other.ca) {
                (Some(a), Some(b)) => Some(f(a, b)?),
                _ => None,
            },
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

/// The bytes of the files, read consistently, and a digest of them.
pub(super) struct Files {
    pub(super) contents: PerFile<Vec<u8>>,
    pub(super) digest: Digest,
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

/// Reads the file at `path`, `len` bytes long when it was stamped, into a buffer of that size
/// (a growing buffer took half a dozen calls). With `exact`, exactly `len` bytes are read, in
/// one call: a file that changed length meanwhile has a new stamp too, and is read again. The
/// last attempt reads to the end, whatever the length.
fn read_file(path: &Path, len: u64, exact: bool, decoder: &Decoder) -> Result<Vec<u8>, Error> {
    let read_err = |source| Error::Read {
        path: path.to_path_buf(),
        source,
    };
    let file = fs::File::open(path).map_err(read_err)?;
    // The stamp checked the length against the limit.
    let len = len.min(decoder.limit());
    let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0) + 1);
    // Otherwise one byte more than the limit, so a file that grew past it is still refused.
    let take = if exact {
        len
    } else {
        decoder.limit().saturating_add(1)
    };
    file.take(take).read_to_end(&mut bytes).map_err(read_err)?;
    decoder.check_size(&path.display().to_string(), bytes.len() as u64)?;
    Ok(bytes)
}

fn is_missing(path: &Path) -> bool {
    matches!(fs::metadata(path), Err(e) if e.kind() == std::io::ErrorKind::NotFound)
}

/// Reads every file, retrying while a change races the read (see [`FileSource`](super::FileSource)).
pub(super) fn read_stable(config: &Config) -> Result<Files, Error> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let paths = PerFile {
            cert: config.cert.as_path(),
            key: config.key.as_path(),
            // An optional CA is read when it exists at the first stat.
            ca: match (&config.ca, config.ca_required) {
                (Some(ca), false) if is_missing(ca) => None,
                (ca, _) => ca.as_deref(),
            },
        };
        let before = paths.try_map(|p| stamp(p, &config.decoder))?;
        let lens = PerFile {
            cert: before.cert.len,
            key: before.key.len,
            ca: before.ca.map(|s| s.len),
        };
        let exact = attempt < STABLE_READ_ATTEMPTS;
        let contents = paths.try_zip(&lens, |p, len| read_file(p, *len, exact, &config.decoder))?;
        let after = paths.try_map(|p| stamp(p, &config.decoder))?;
        if before != after && attempt < STABLE_READ_ATTEMPTS {
            tracing::debug!(cert = %config.cert.display(), "files changed while read; reading again");
            continue;
        }
        let mut h = Sha256::new();
        for bytes in [
            Some(&contents.cert),
            Some(&contents.key),
            contents.ca.as_ref(),
        ]
        .into_iter()
        .flatten()
        {
            h.update((bytes.len() as u64).to_be_bytes());
            h.update(bytes);
        }
        return Ok(Files {
            digest: Digest::from_bytes(h.finalize().into()),
            ids: after.map(|s| (s.dev, s.ino)),
            key_mode: after.key.mode,
            contents,
        });
    }
}
