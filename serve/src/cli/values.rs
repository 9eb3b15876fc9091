//! The flags' values: parsers that check each value on its own, naming the flag, and the values
//! kept out of `Debug` (secrets).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use tls_rotation::acme::ChallengeType;

/// An external account binding's HMAC key (kept out of `Debug`).
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct EabKey(pub(crate) Vec<u8>);

impl std::fmt::Debug for EabKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EabKey(..)")
    }
}

/// A flag's value that is a secret, as given (kept out of `Debug`).
#[derive(Clone)]
pub(super) struct Secret(pub(super) String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// Takes any value: checked later, so that no report shows it.
#[allow(clippy::unnecessary_wraps)] // clap's value parsers return a Result
pub(super) fn secret(v: &str) -> Result<Secret, String> {
    Ok(Secret(v.to_owned()))
}

/// `--acme-challenge`: what serve can answer.
pub(super) fn acme_challenge(v: &str) -> Result<ChallengeType, String> {
    v.parse()
        .map_err(|_| format!("--acme-challenge {v}: expected tls-alpn-01, http-01 or dns-01"))
}

/// One `--acme-directory URL[,ca=PATH][,eab-kid=ID,eab-key-file=PATH]`, as given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DirectoryFlag {
    pub(crate) url: String,
    pub(crate) ca: Option<PathBuf>,
    pub(crate) eab_kid: Option<String>,
    pub(crate) eab_key_file: Option<PathBuf>,
}

/// `--acme-directory URL[,ca=PATH][,eab-kid=ID,eab-key-file=PATH]`.
pub(super) fn acme_directory(v: &str) -> Result<DirectoryFlag, String> {
    let mut parts = v.split(',');
    let url = parts.next().unwrap_or_default().trim().to_owned();
    if !url.starts_with("https://") {
        return Err(format!("--acme-directory {url}: an https:// URL is needed"));
    }
    let mut flag = DirectoryFlag {
        url,
        ca: None,
        eab_kid: None,
        eab_key_file: None,
    };
    for option in parts {
        let (key, value) = option.split_once('=').ok_or_else(|| {
            format!("--acme-directory {v}: {option:?} is not KEY=VALUE (ca=PATH, eab-kid=ID, eab-key-file=PATH)")
        })?;
        let slot_taken = match key {
            "ca" => flag.ca.replace(PathBuf::from(value)).is_some(),
            "eab-kid" => flag.eab_kid.replace(value.to_owned()).is_some(),
            "eab-key-file" => flag.eab_key_file.replace(PathBuf::from(value)).is_some(),
            other => {
                return Err(format!(
                    "--acme-directory {v}: unknown option {other} (ca=PATH, eab-kid=ID, eab-key-file=PATH)"
                ));
            }
        };
        if slot_taken || value.is_empty() {
            return Err(format!(
                "--acme-directory {v}: {key} is given twice, or empty"
            ));
        }
    }
    if flag.eab_kid.is_some() != flag.eab_key_file.is_some() {
        return Err(format!(
            "--acme-directory {v}: eab-kid and eab-key-file go together"
        ));
    }
    Ok(flag)
}

/// An external account binding's HMAC key from `path` (base64url, as the CA gives it): a key
/// in a file, not on the command line, where every user could read it in `/proc`.
pub(crate) fn eab_key_file(path: &std::path::Path) -> Result<EabKey, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("--acme-directory eab-key-file={}: {e}", path.display()))?;
    eab_key(&text).map_err(|_| {
        format!(
            "--acme-directory eab-key-file={}: not base64url (the value is not shown: it is a secret)",
            path.display()
        )
    })
}

/// `--acme-eab-key`: base64url, padded or not.
pub(super) fn eab_key(v: &str) -> Result<EabKey, String> {
    use base64::Engine as _;
    let engine = base64::engine::GeneralPurpose::new(
        &base64::alphabet::URL_SAFE,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    );
    match engine.decode(v.trim()) {
        Ok(key) if !key.is_empty() => Ok(EabKey(key)),
        _ => Err("--acme-eab-key: not base64url (the value is not shown: it is a secret)".into()),
    }
}

/// A duration for `flag`, like `example`, within its bounds (each a value and how to write it).
pub(super) fn duration(
    flag: &'static str,
    (min, min_text): (Duration, &'static str),
    (max, max_text): (Duration, &'static str),
    example: &'static str,
) -> impl Fn(&str) -> Result<Duration, String> + Clone + Send + Sync + 'static {
    move |v| {
        let d = humantime::parse_duration(v)
            .map_err(|_| format!("{flag} {v}: not a duration like {example}"))?;
        if d < min || d > max {
            return Err(format!(
                "{flag} {v}: must be between {min_text} and {max_text}"
            ));
        }
        Ok(d)
    }
}

/// A socket address for `flag`, like `example`.
pub(super) fn address(
    flag: &'static str,
    example: &'static str,
) -> impl Fn(&str) -> Result<SocketAddr, String> + Clone + Send + Sync + 'static {
    move |v| {
        v.parse()
            .map_err(|_| format!("{flag} {v}: not an address like {example}"))
    }
}

/// An ACME profile's name, for `flag`: one token, as a directory advertises it.
pub(super) fn profile(
    flag: &'static str,
) -> impl Fn(&str) -> Result<String, String> + Clone + Send + Sync + 'static {
    move |v| {
        if v.is_empty() || v.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(format!(
                "{flag} {v:?}: expected a profile name such as shortlived"
            ));
        }
        Ok(v.to_owned())
    }
}

/// `NAMESPACE/NAME`, for `flag`.
pub(super) fn namespaced(
    flag: &'static str,
) -> impl Fn(&str) -> Result<(String, String), String> + Clone + Send + Sync + 'static {
    move |v| {
        v.split_once('/')
            .filter(|(ns, name)| !ns.is_empty() && !name.is_empty())
            .map(|(ns, name)| (ns.to_owned(), name.to_owned()))
            .ok_or_else(|| format!("{flag} {v}: expected NAMESPACE/NAME"))
    }
}

/// `--k8s-secrets NAMESPACE`.
pub(super) fn namespace(v: &str) -> Result<String, String> {
    if v.is_empty() || v.contains('/') {
        return Err(format!("--k8s-secrets {v}: expected a NAMESPACE"));
    }
    Ok(v.to_owned())
}

/// `--sni NAME=DIR`.
pub(super) fn sni_route(v: &str) -> Result<(String, PathBuf), String> {
    v.split_once('=')
        .filter(|(name, dir)| !name.is_empty() && !dir.is_empty())
        .map(|(name, dir)| (name.to_owned(), PathBuf::from(dir)))
        .ok_or_else(|| format!("--sni {v}: expected NAME=DIR"))
}

/// This replica's name: `POD_NAME` (set from the downward API), else the host name.
pub(super) fn default_identity() -> Option<String> {
    std::env::var("POD_NAME")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
}
