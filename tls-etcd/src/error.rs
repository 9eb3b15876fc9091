//! The crate's error type.

use std::path::PathBuf;

/// Why a connection to etcd could not be configured or made, or why a value could not be served.
///
/// Messages name the endpoint or file they concern, never a password, a token or key material.
/// The sources report the errors of a key inside a `tls_source::Error` whose origin names the
/// key (`etcd /tls-rotation/certs/web: the key was deleted`).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No endpoint was given.
    #[error("no etcd endpoint given")]
    NoEndpoints,

    /// An endpoint could not be understood.
    #[error("etcd endpoint {endpoint:?}: {reason}")]
    Endpoint {
        /// The endpoint as given.
        endpoint: String,
        /// What is wrong with it.
        reason: String,
    },

    /// The password file could not be read, or is empty.
    #[error("etcd password file {}: {reason}", path.display())]
    PasswordFile {
        /// The file as given.
        path: PathBuf,
        /// What is wrong with it (an I/O error, or empty).
        reason: String,
    },

    /// No endpoint could be connected to.
    #[error("no etcd endpoint answered ({tried}): {last}")]
    Unreachable {
        /// The endpoints tried, comma-separated.
        tried: String,
        /// What the last one said.
        last: String,
    },

    /// etcd (or the connection to it) failed a request.
    #[error("etcd {what}: {source}")]
    Request {
        /// The request, e.g. `list of /tls-rotation/certs/`.
        what: String,
        /// etcd's error.
        #[source]
        source: etcd_client::Error,
    },

    /// A watch was cancelled by etcd for a reason other than compaction.
    #[error("etcd cancelled the watch of {key}: {reason}")]
    WatchCancelled {
        /// The key or prefix watched.
        key: String,
        /// etcd's reason.
        reason: String,
    },

    /// The key holds no value (never put, or deleted before the source started).
    #[error("the key holds no value (never put, or deleted before the source started)")]
    NotFound {
        /// The etcd key.
        key: String,
    },

    /// The key was deleted; what it held last keeps serving.
    #[error("the key was deleted")]
    Deleted {
        /// The etcd key.
        key: String,
    },

    /// The value is not a certificate in the format of this crate.
    #[error("{reason}")]
    BadValue {
        /// The etcd key.
        key: String,
        /// What is wrong, without any of the value's bytes.
        reason: String,
    },
}
