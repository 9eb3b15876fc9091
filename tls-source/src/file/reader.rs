//! [`FileReader`]: what changed since the last read, and whether it may be passed on yet.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::read::{FileId, Files, PerFile, Stamp, read_stable};
use super::{Config, FileSourceBuilder, out_of_descriptors};
use crate::{CertBundle, Error, Origin};
use rustls_pki_types::CertificateDer;

/// What a read decoded: a bundle, or (for a CA file) certificates alone.
pub(super) enum Decoded {
    Bundle(CertBundle),
    Certificates(Vec<CertificateDer<'static>>),
}

impl Decoded {
    /// The bundle of a source that reads bundles (a reader of bundles never decodes anything
    /// else).
    pub(super) fn into_bundle(self) -> CertBundle {
        match self {
            Self::Bundle(bundle) => bundle,
            Self::Certificates(_) => unreachable!("a bundle reader decodes bundles"),
        }
    }
}

/// The reading half of a [`FileSource`](super::FileSource), for callers that schedule reads themselves: each
/// [`check`](Self::check) reads the files through their paths and returns a bundle, an error, or
/// nothing when the bytes are unchanged since the last check (compared with the bytes kept, without
/// parsing). Made by [`FileSourceBuilder::build_reader`]; the poll and notify settings do not
/// apply to it.
///
/// ```
/// use tls_source::FileSource;
///
/// let mut reader = FileSource::builder("missing.crt", "missing.key").build_reader();
/// let first = reader.check().expect("the first check always says something");
/// assert!(first.unwrap_err().to_string().starts_with("cannot read missing.crt"));
/// assert!(reader.check().is_none(), "the same error is not repeated");
/// assert!(reader.read_now().is_err(), "unless asked to read now");
/// ```
pub struct FileReader {
    config: Arc<Config>,
    /// The files' bytes as last read and passed on: equal bytes, nothing new (compared as they
    /// are, which costs less than hashing them).
    last_raw: Option<PerFile<Vec<u8>>>,
    /// The files (device, inode) whose content was last passed on: the same files with new
    /// content were written in place.
    last_ids: Option<PerFile<FileId>>,
    /// New content written in place, and when it was first read: passed on once it has stayed
    /// the same for `in_place_quiet`.
    unsettled: Option<(PerFile<Vec<u8>>, std::time::Instant)>,
    last_error: Option<String>,
    /// The paths' stamps at the last read that succeeded (reading the files, decoded or not).
    last_stamps: Option<PerFile<Stamp>>,
    /// The last read failed for want of file descriptors (EMFILE, ENFILE): nothing will say
    /// when they come back, so the source reads again soon.
    starved: bool,
    warned_key_mode: bool,
}

impl FileSourceBuilder {
    /// Builds only the reading half: a [`FileReader`], with no watch and no poll.
    pub fn build_reader(self) -> FileReader {
        FileReader::new(Arc::new(self.config))
    }
}

impl fmt::Debug for FileReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileReader")
            .field("cert", &self.config.cert)
            .field("key", &self.config.key)
            .field("ca", &self.config.ca)
            .finish_non_exhaustive()
    }
}

impl FileReader {
    pub(super) fn new(config: Arc<Config>) -> Self {
        Self {
            config,
            last_raw: None,
            last_ids: None,
            unsettled: None,
            last_error: None,
            last_stamps: None,
            starved: false,
            warned_key_mode: false,
        }
    }

    /// Reads the files: `Some(Ok(bundle))` when their content changed (or on the first check),
    /// `Some(Err(error))` when they cannot be read or decoded (an error is not repeated while
    /// it stays the same), `None` when nothing changed, or when files changed in place have not
    /// been quiet for [`in_place_quiet`](FileSourceBuilder::in_place_quiet) yet (check again
    /// after [`settling`](Self::settling)).
    pub fn check(&mut self) -> Option<Result<CertBundle, Error>> {
        self.read(false).map(|item| item.map(Decoded::into_bundle))
    }

    /// How long until content written in place has been quiet long enough to be passed on by
    /// [`check`](Self::check); `None` when nothing is waiting.
    pub fn settling(&self) -> Option<Duration> {
        self.unsettled
            .as_ref()
            .map(|(_, since)| self.config.in_place_quiet.saturating_sub(since.elapsed()))
    }

    /// Reads the files and returns what they hold now, changed or not.
    ///
    /// # Errors
    /// Any [`Error`] of reading or decoding, naming the path.
    pub fn read_now(&mut self) -> Result<CertBundle, Error> {
        match self.read(true) {
            Some(item) => item.map(Decoded::into_bundle),
            None => unreachable!("a forced read always yields an item"),
        }
    }

    pub(super) fn read(&mut self, force: bool) -> Option<Result<Decoded, Error>> {
        let read = read_stable(&self.config);
        self.starved =
            matches!(&read, Err(Error::Read { source, .. }) if out_of_descriptors(source));
        let files = match read {
            Ok(files) => files,
            Err(err) => {
                self.last_stamps = None;
                // Files that went away and come back are new ones, even where the file system
                // reuses their inode numbers: not an in-place write.
                self.last_raw = None;
                self.last_ids = None;
                self.unsettled = None;
                return self.report(err, force);
            }
        };
        self.last_stamps = Some(files.stamps);
        if !force && self.last_raw.as_ref() == Some(&files.contents) {
            self.unsettled = None;
            return None;
        }
        let ids = files.ids();
        // The same files with new content: written in place, maybe still being written. Or one
        // file of the pair replaced alone in a way that cannot make a good pair: the other is
        // being written (`--cert`/`--key` replaced one after the other).
        let waiting = if self.last_ids.as_ref() == Some(&ids) {
            Some("files changed in place; waiting until they are quiet")
        } else {
            self.half_pair(&files.contents)
        };
        if let (false, Some(why)) = (force, waiting) {
            match &self.unsettled {
                Some((contents, since))
                    if *contents == files.contents
                        && since.elapsed() >= self.config.in_place_quiet => {}
                Some((contents, _)) if *contents == files.contents => return None,
                _ => {
                    tracing::debug!(cert = %self.config.cert.display(), "{why}");
                    self.unsettled = Some((files.contents, std::time::Instant::now()));
                    return None;
                }
            }
        }
        self.unsettled = None;
        self.last_ids = Some(ids);
        let config = Arc::clone(&self.config);
        let decoded = if config.certificates_only {
            let name = config.cert.display().to_string();
            config
                .decoder
                .certificates(&name, &files.contents.cert)
                .map(Decoded::Certificates)
        } else {
            self.warn_key_mode(&files);
            let origin = Origin::Files {
                cert: config.cert.clone(),
                key: config.key.clone(),
            };
            let cert_name = config.cert.display().to_string();
            let key_name = config.key.display().to_string();
            let ca_name = config.ca.as_ref().map(|p| p.display().to_string());
            config
                .decoder
                .bundle(
                    (&cert_name, &files.contents.cert),
                    (&key_name, &files.contents.key),
                    ca_name.as_deref().zip(files.contents.ca.as_deref()),
                    origin,
                )
                .map(Decoded::Bundle)
        };
        self.last_raw = Some(files.contents);
        match decoded {
            Ok(decoded) => {
                self.last_error = None;
                Some(Ok(decoded))
            }
            Err(err) => self.report(err, true),
        }
    }

    /// Why `contents` look like half of a pair being written, if they do: compared with what was
    /// last passed on, the key changed alone (a new key never matches the certificate it had),
    /// or the certificate changed alone to one for another key (with feature `x509`; a renewal
    /// that keeps the key passes at once). Such a read waits, as an in-place write does, for
    /// [`in_place_quiet`](FileSourceBuilder::in_place_quiet): the other file arriving meanwhile
    /// makes one good pair, not a rejection and then an install; a half that stays is passed on
    /// then (and refused by the reload core, as it should be).
    fn half_pair(&self, contents: &PerFile<Vec<u8>>) -> Option<&'static str> {
        let last = self.last_raw.as_ref()?;
        if self.config.certificates_only || contents.ca != last.ca {
            return None;
        }
        let (cert_changed, key_changed) = (contents.cert != last.cert, contents.key != last.key);
        if key_changed && !cert_changed {
            return Some("the key changed alone; waiting for its certificate");
        }
        #[cfg(feature = "x509")]
        if cert_changed && !key_changed {
            let spki = |pem: &[u8]| {
                let der = self
                    .config
                    .decoder
                    .certificates("", pem)
                    .ok()?
                    .into_iter()
                    .next()?;
                crate::x509::LeafInfo::parse(der.as_ref())
                    .ok()
                    .map(|leaf| leaf.spki_der)
            };
            if let (Some(new), Some(old)) = (spki(&contents.cert), spki(&last.cert))
                && new != old
            {
                return Some("the certificate changed alone to another key; waiting for its key");
            }
        }
        None
    }

    /// Whether every file still has the stamp it had at the last read, so that a read now would
    /// find what that one found (a few `stat` calls instead of a read). False when the last
    /// read failed, or there was none.
    pub(super) fn unchanged(&self) -> bool {
        self.last_stamps
            .as_ref()
            .is_some_and(|last| super::read::unchanged(&self.config, last))
    }

    /// Whether the last read failed for want of file descriptors.
    pub(super) fn starved(&self) -> bool {
        self.starved
    }

    /// Passes an error on, unless it repeats the last one and nothing forces it.
    fn report(&mut self, err: Error, force: bool) -> Option<Result<Decoded, Error>> {
        let message = err.to_string();
        if !force && self.last_error.as_deref() == Some(message.as_str()) {
            return None;
        }
        self.last_error = Some(message);
        Some(Err(err))
    }

    fn warn_key_mode(&mut self, files: &Files) {
        #[cfg(unix)]
        if !self.warned_key_mode && files.stamps.key.mode & 0o077 != 0 {
            self.warned_key_mode = true;
            tracing::warn!(
                path = %self.config.key.display(),
                mode = format_args!("{:o}", files.stamps.key.mode & 0o777),
                "private key file is readable by group or others; restrict it (chmod 600, or \
                 defaultMode: 0400 on a Secret volume)"
            );
        }
        #[cfg(not(unix))]
        let _ = files;
    }
}
