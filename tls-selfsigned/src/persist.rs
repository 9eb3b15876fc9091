//! Keeping generated pairs in a directory: every file of a generation (certificate, key, CA
//! certificate and key) written by `tls_source::layout` (one atomic swap of a `..data` symlink,
//! the kubelet's layout, which `FileSource` follows), key files mode 0600, with this crate's
//! errors.

use std::path::Path;

use tls_source::layout::{self, LayoutError};

use crate::Error;

/// Reads `dir/name`; `None` when it does not exist.
pub(crate) fn read(dir: &Path, name: &str) -> Result<Option<Vec<u8>>, Error> {
    layout::read(dir, name)
        .map_err(|LayoutError { path, source }| Error::PersistRead { path, source })
}

/// Writes `files` (name, content, mode) as one generation: a reader sees the old set or the
/// new one, never a mix.
pub(crate) fn write_set(dir: &Path, files: &[(&str, &str, u32)]) -> Result<(), Error> {
    let files: Vec<(&str, &[u8], u32)> = files
        .iter()
        .map(|(name, content, mode)| (*name, content.as_bytes(), *mode))
        .collect();
    layout::write_set(dir, &files)
        .map_err(|LayoutError { path, source }| Error::Persist { path, source })
}
