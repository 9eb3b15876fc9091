//! Reading the files consistently: each opened and stamped (`fstat`), read, every path stamped
//! again, and all read again if a change raced.

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

impl<A, B> PerFile<(A, B)> {
    fn unzip(self) -> (PerFile<A>, PerFile<B>) {
        let (ca_a, ca_b) = self.ca.unzip();
        (
            PerFile {
                cert: self.cert.0,
                key: self.key.0,
                ca: ca_a,
            },
            PerFile {
                cert: self.cert.1,
                key: self.key.1,
                ca: ca_b,
            },
        )
    }
}

/// A file's identity: (device, inode) on Unix. The same identity with new content is a file
/// written in place; a new identity, a file replaced.
pub(super) type FileId = (u64, u64);

/// The bytes of the files, read consistently, and each path's stamp once all were read.
pub(super) struct Files {
    pub(super) contents: PerFile<Vec<u8>>,
    pub(super) stamps: PerFile<Stamp>,
}

impl Files {
    /// Which files were read.
    pub(super) fn ids(&self) -> PerFile<FileId> {
        self.stamps.map(|s| (s.dev, s.ino))
    }
}

/// What identifies a file's content cheaply: device, inode, length, modification time (and its
/// permission bits, which the key's warning reads).
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub(super) struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    modified: Option<SystemTime>,
    #[cfg_attr(not(unix), allow(dead_code))]
    pub(super) mode: u32,
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
/// and stamps what it opened (`fstat`: no second walk of the path).
fn open(path: &Path, decoder: &Decoder) -> Result<(fs::File, Stamp), Error> {
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
    let file = options.open(path).map_err(read_err)?;
    let meta = file.metadata().map_err(read_err)?;
    let stamp = stamp_of(path, &meta, decoder)?;
    Ok((file, stamp))
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

/// Opens, stamps and reads one file.
fn read_one(path: &Path, exact: bool, decoder: &Decoder) -> Result<(Vec<u8>, Stamp), Error> {
    let (file, stamp) = open(path, decoder)?;
    let bytes = read_file(path, file, stamp.len, exact, decoder)?;
    Ok((bytes, stamp))
}

/// Whether every path still has the stamp `last` it had at a read (an optional CA that was
/// absent still is): a read now would find the same bytes, without reading them. Any error is
/// a change.
pub(super) fn unchanged(config: &Config, last: &PerFile<Stamp>) -> bool {
    let decoder = &config.decoder;
    let same = |path: &Path, was: &Stamp| stamp(path, decoder).is_ok_and(|now| now == *was);
    let ca = match (config.ca.as_deref(), &last.ca) {
        (Some(path), Some(was)) => same(path, was),
        (Some(path), None) => fs::symlink_metadata(path).is_err(),
        (None, _) => true,
    };
    ca && same(&config.cert, &last.cert) && same(&config.key, &last.key)
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
        let mut paths = PerFile {
            cert: config.cert.as_path(),
            key: config.key.as_path(),
            ca: config.ca.as_deref(),
        };
        let read = PerFile {
            cert: read_one(paths.cert, exact, decoder)?,
            key: read_one(paths.key, exact, decoder)?,
            // An optional CA is read when it exists when it is opened.
            ca: match paths.ca.map(|ca| read_one(ca, exact, decoder)) {
                Some(Err(Error::Read { source, .. }))
                    if !config.ca_required && source.kind() == std::io::ErrorKind::NotFound =>
                {
                    None
                }
                ca => ca.transpose()?,
            },
        };
        if read.ca.is_none() {
            paths.ca = None;
        }
        let (contents, before) = read.unzip();
        let after = paths.try_map(|p| stamp(p, decoder))?;
        if before != after && attempt < STABLE_READ_ATTEMPTS {
            tracing::debug!(cert = %config.cert.display(), "files changed while read; reading again");
            continue;
        }
        return Ok(Files {
            stamps: after,
            contents,
        });
    }
}
