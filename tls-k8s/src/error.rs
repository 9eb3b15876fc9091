//! The Secret sources' error.

/// What went wrong with the Secret; carried inside a
/// [`tls_source::Error::Source`] naming `secret namespace/name`. Every variant is a report: the
/// source carries on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The Secret does not exist, and has not existed since the source started.
    #[error("the Secret does not exist; keeping the current certificate until it is created")]
    NotFound,
    /// The Secret was deleted (the watch saw it go, or a relist no longer has it).
    #[error("the Secret was deleted; keeping the current certificate until it is recreated")]
    Deleted,
    /// The Secret lacks the certificate or key.
    #[error("the Secret has no {}", keys.join(" and no "))]
    MissingKeys {
        /// The missing data keys.
        keys: Vec<String>,
    },
    /// The API refused: the service account lacks a permission.
    #[error(
        "forbidden: the service account needs get, list and watch on secrets named {name} in namespace {namespace} (a Role with resourceNames: [{name}]; see the tls-k8s docs): {message}"
    )]
    Forbidden {
        /// The Secret's namespace.
        namespace: String,
        /// The Secret's name.
        name: String,
        /// What the API server said.
        message: String,
    },
    /// A value of the Secret's `data` is not base64 (or not a string): said by key, without
    /// the value.
    #[error("the Secret's data key {key} is {reason}")]
    BadData {
        /// The data key.
        key: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The API refused a list or watch of Secrets by label selector.
    #[error(
        "forbidden: the service account needs list and watch on secrets in namespace {namespace} (a Role without resourceNames; see the tls-k8s docs): {message}"
    )]
    ForbiddenList {
        /// The namespace.
        namespace: String,
        /// What the API server said.
        message: String,
    },
    /// Any other API or watch failure (retried with backoff).
    #[error("watching the Secret failed: {0}")]
    Watch(#[source] kube::runtime::watcher::Error),
    /// A sealed value does not open (see [`SecretSourceBuilder::seal`](crate::SecretSourceBuilder::seal)); said by place, without
    /// the value.
    #[error("{0}")]
    Sealed(#[source] tls_seal::Error),
}

impl Error {
    pub(crate) fn from_watcher(
        err: kube::runtime::watcher::Error,
        namespace: &str,
        name: &str,
    ) -> Self {
        match forbidden(&err) {
            Some(message) => Self::Forbidden {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                message,
            },
            None => Self::Watch(err),
        }
    }

    pub(crate) fn from_selector_watcher(
        err: kube::runtime::watcher::Error,
        namespace: &str,
    ) -> Self {
        match forbidden(&err) {
            Some(message) => Self::ForbiddenList {
                namespace: namespace.to_owned(),
                message,
            },
            None => Self::Watch(err),
        }
    }
}

/// The API server's message when `err` is a 403.
fn forbidden(err: &kube::runtime::watcher::Error) -> Option<String> {
    use kube::runtime::watcher::Error as W;
    let status = match err {
        W::InitialListFailed(kube::Error::Api(status))
        | W::WatchStartFailed(kube::Error::Api(status))
        | W::WatchFailed(kube::Error::Api(status)) => Some(status.as_ref()),
        W::WatchError(status) => Some(status.as_ref()),
        _ => None,
    };
    status.filter(|s| s.code == 403).map(|s| s.message.clone())
}
