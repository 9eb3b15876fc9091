//! The error type of certificate sources.

use std::path::PathBuf;

/// Why a source could not produce a [`CertBundle`](crate::CertBundle).
///
/// Every variant is a *report*: a source yields it as an `Err` item and carries on, and the reload
/// core keeps serving the last good certificate. None of them is final; the source recovers by
/// itself when good input returns.
///
/// Messages name the input (a path, or a Secret key) and never contain key material.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A file could not be read: it is missing, unreadable, or a dangling symlink.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The path as configured (not a resolved symlink target).
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },

    /// A path names something other than a regular file (a directory, a socket...).
    #[error("{} is not a regular file", path.display())]
    NotAFile {
        /// The path as configured.
        path: PathBuf,
    },

    /// An input is larger than the configured limit.
    #[error("{input} is larger than the limit of {limit} bytes")]
    TooLarge {
        /// The input: a path or a Secret key.
        input: String,
        /// The limit in bytes.
        limit: u64,
    },

    /// An input is empty (or only whitespace).
    #[error("{input} is empty")]
    Empty {
        /// The input: a path or a Secret key.
        input: String,
    },

    /// An input holds no certificate.
    #[error("no certificate found in {input}")]
    NoCertificate {
        /// The input: a path or a Secret key.
        input: String,
    },

    /// An input holds no private key.
    #[error("no private key found in {input}")]
    NoKey {
        /// The input: a path or a Secret key.
        input: String,
    },

    /// An input holds more than one private key, so which one to use is ambiguous.
    #[error("{input} holds {count} private keys, expected exactly one")]
    MultipleKeys {
        /// The input: a path or a Secret key.
        input: String,
        /// How many private keys were found.
        count: usize,
    },

    /// The private key is encrypted with a passphrase; servers need it in the clear.
    #[error(
        "the private key in {input} is encrypted; provide it unencrypted (PKCS#8, PKCS#1 or SEC1)"
    )]
    EncryptedKey {
        /// The input: a path or a Secret key.
        input: String,
    },

    /// An input is not valid PEM (or DER): a truncated section, bad base64, garbage.
    #[error("malformed {input}: {reason}")]
    Malformed {
        /// The input: a path or a Secret key.
        input: String,
        /// What is wrong, without any of the input's bytes.
        reason: String,
    },

    /// Any other source's failure (a generator, an API), with its origin.
    #[error("{origin}: {source}")]
    Source {
        /// Where the failure happened, e.g. `self-signed` or `namespace/name`.
        origin: String,
        /// The underlying error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
}

impl Error {
    /// Wraps another source's error, naming where it happened.
    pub fn source(
        origin: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Self {
        Self::Source {
            origin: origin.into(),
            source: source.into(),
        }
    }
}

/// The message of a caught panic (`catch_unwind`'s payload): the `&str` or `String` it was
/// given, else a placeholder. Shared by every crate that contains panics, so they report them
/// alike.
///
/// ```
/// let caught = std::panic::catch_unwind(|| panic!("a {} bug", "small")).unwrap_err();
/// assert_eq!(tls_source::panic_message(caught.as_ref()), "a small bug");
/// ```
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned())
}
