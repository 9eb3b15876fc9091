//! A TSIG key file in BIND's format, as `tsig-keygen` writes it:
//!
//! ```text
//! key "acme-update" {
//!         algorithm hmac-sha256;
//!         secret "n5ZcK6c2V7dC2TtMFaWw2pGx3vN1F3Y0bT8nq7c2tH8=";
//! };
//! ```

use std::fmt;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use hickory_proto::rr::Name;
use hickory_proto::rr::rdata::tsig::TsigAlgorithm;

/// A TSIG key: its name, its algorithm and its secret. `Debug` shows the name and the
/// algorithm, never the secret.
#[derive(Clone)]
pub struct TsigKey {
    pub(crate) name: Name,
    pub(crate) algorithm: TsigAlgorithm,
    pub(crate) secret: Vec<u8>,
}

impl fmt::Debug for TsigKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TsigKey")
            .field("name", &self.name())
            .field("algorithm", &self.algorithm.to_string())
            .finish_non_exhaustive()
    }
}

/// A key file that cannot be used: what is wrong, naming the file (never the secret).
#[derive(Debug, thiserror::Error)]
#[error("TSIG key file {}: {reason}", path.display())]
pub struct KeyFileError {
    /// The file.
    pub path: PathBuf,
    /// Why it cannot be used.
    pub reason: String,
}

impl TsigKey {
    /// A key from its parts: `name` as the server knows it, `algorithm` one of `hmac-sha256`,
    /// `hmac-sha384`, `hmac-sha512`, `secret` the key's bytes.
    ///
    /// # Errors
    /// A name that is not a domain name, another algorithm, or an empty secret.
    pub fn new(name: &str, algorithm: &str, secret: Vec<u8>) -> Result<Self, String> {
        let mut key_name =
            Name::from_ascii(name).map_err(|e| format!("the key name {name:?}: {e}"))?;
        key_name.set_fqdn(true);
        let algorithm = match algorithm.to_ascii_lowercase().as_str() {
            "hmac-sha256" => TsigAlgorithm::HmacSha256,
            "hmac-sha384" => TsigAlgorithm::HmacSha384,
            "hmac-sha512" => TsigAlgorithm::HmacSha512,
            other => {
                return Err(format!(
                    "the algorithm {other} is not supported: use hmac-sha256 (tsig-keygen's default), hmac-sha384 or hmac-sha512"
                ));
            }
        };
        if secret.is_empty() {
            return Err("the secret is empty".into());
        }
        Ok(Self {
            name: key_name,
            algorithm,
            secret,
        })
    }

    /// Reads a key file in BIND's format (one `key "NAME" { algorithm ...; secret "..."; };`
    /// clause, as `tsig-keygen NAME` prints it). A file other users may read is refused: the
    /// key lets whoever holds it change the zone.
    ///
    /// # Errors
    /// An unreadable or world-readable file, no key clause or more than one, an unsupported
    /// algorithm, a secret that is not base64. The error names the file, never the secret.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, KeyFileError> {
        let path = path.as_ref();
        let error = |reason: String| KeyFileError {
            path: path.to_owned(),
            reason,
        };
        let metadata = std::fs::metadata(path).map_err(|e| error(e.to_string()))?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = metadata.permissions().mode() & 0o777;
            if mode & 0o004 != 0 {
                return Err(error(format!(
                    "every user of this machine may read it (mode {mode:o}): chmod o-r (600 or 640), since the key may change the zone"
                )));
            }
        }
        #[cfg(not(unix))]
        drop(metadata);
        let text = std::fs::read_to_string(path).map_err(|e| error(e.to_string()))?;
        parse(&text).map_err(error)
    }

    /// The key's name, as the server knows it (with a final dot).
    pub fn name(&self) -> String {
        self.name.to_ascii()
    }
}

/// The words of a BIND configuration: quoted strings (without their quotes), `{`, `}`, `;` and
/// bare words; comments (`#`, `//`, `/* */`) dropped.
fn tokens(text: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => {}
            '#' => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        break;
                    }
                }
            }
            '/' if chars.peek() == Some(&'/') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        break;
                    }
                }
            }
            '/' if chars.peek() == Some(&'*') => {
                chars.next();
                let mut last = ' ';
                loop {
                    match chars.next() {
                        Some('/') if last == '*' => break,
                        Some(c) => last = c,
                        None => return Err("a /* comment is not closed".into()),
                    }
                }
            }
            '{' | '}' | ';' => out.push(c.to_string()),
            '"' => {
                let mut word = String::new();
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some(c) => word.push(c),
                        None => return Err("a quoted string is not closed".into()),
                    }
                }
                out.push(word);
            }
            c => {
                let mut word = c.to_string();
                while let Some(&next) = chars.peek() {
                    if next.is_whitespace() || matches!(next, '{' | '}' | ';' | '"') {
                        break;
                    }
                    word.push(next);
                    chars.next();
                }
                out.push(word);
            }
        }
    }
    Ok(out)
}

fn parse(text: &str) -> Result<TsigKey, String> {
    let tokens = tokens(text)?;
    let mut keys = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        if tokens[i] == "key" {
            let name = tokens
                .get(i + 1)
                .ok_or("`key` is not followed by a name")?
                .clone();
            if tokens.get(i + 2).map(String::as_str) != Some("{") {
                return Err(format!("key {name:?}: `{{` expected after its name"));
            }
            let mut algorithm = None;
            let mut secret = None;
            let mut j = i + 3;
            loop {
                match tokens.get(j).map(String::as_str) {
                    None => return Err(format!("key {name:?}: its `}}` is missing")),
                    Some("}") => break,
                    Some(";") => j += 1,
                    Some("algorithm") => {
                        algorithm = tokens.get(j + 1).cloned();
                        j += 2;
                    }
                    Some("secret") => {
                        secret = tokens.get(j + 1).cloned();
                        j += 2;
                    }
                    Some(other) => {
                        return Err(format!("key {name:?}: unknown statement {other:?}"));
                    }
                }
            }
            let algorithm = algorithm.ok_or(format!("key {name:?} has no algorithm"))?;
            let secret = secret.ok_or(format!("key {name:?} has no secret"))?;
            // Not the decoder's message: it could quote part of the secret.
            let secret = base64::engine::general_purpose::STANDARD
                .decode(secret.trim())
                .map_err(|_| format!("key {name:?}: its secret is not base64"))?;
            keys.push(
                TsigKey::new(&name, &algorithm, secret)
                    .map_err(|e| format!("key {name:?}: {e}"))?,
            );
            i = j + 1;
        } else {
            i += 1;
        }
    }
    match keys.len() {
        1 => Ok(keys.remove(0)),
        0 => Err("no `key \"NAME\" { algorithm ...; secret \"...\"; };` clause (tsig-keygen NAME writes one)".into()),
        n => Err(format!("{n} keys: give a file with one")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "n5ZcK6c2V7dC2TtMFaWw2pGx3vN1F3Y0bT8nq7c2tH8=";

    fn file(text: &str, mode: u32) -> (tempfile::TempDir, PathBuf) {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("acme.key");
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        (dir, path)
    }

    #[test]
    fn reads_what_tsig_keygen_writes_and_never_shows_the_secret() {
        let text = format!(
            "# made by tsig-keygen\nkey \"acme-update\" {{\n\talgorithm hmac-sha256;\n\tsecret \"{SECRET}\";\n}};\n"
        );
        let (_dir, path) = file(&text, 0o600);
        let key = TsigKey::from_file(&path).expect("a key");
        assert_eq!(key.name(), "acme-update.");
        assert_eq!(key.algorithm, TsigAlgorithm::HmacSha256);
        assert_eq!(key.secret.len(), 32);
        let debug = format!("{key:?}");
        assert!(
            debug.contains("acme-update") && !debug.contains(SECRET),
            "{debug}"
        );
    }

    #[test]
    fn a_world_readable_file_is_refused_naming_it() {
        let text = format!("key k {{ algorithm hmac-sha256; secret \"{SECRET}\"; }};");
        let (_dir, path) = file(&text, 0o644);
        let error = TsigKey::from_file(&path)
            .expect_err("world-readable")
            .to_string();
        assert!(
            error.contains("acme.key") && error.contains("644"),
            "{error}"
        );
        assert!(!error.contains(SECRET), "{error}");
        let (_dir, path) = file(&text, 0o640);
        assert!(TsigKey::from_file(&path).is_ok(), "group-readable is fine");
    }

    #[test]
    fn bad_files_say_what_is_wrong_without_quoting_the_secret() {
        for (text, expected) in [
            ("", "no `key"),
            (
                "key k { algorithm hmac-md5; secret \"AAAA\"; };",
                "hmac-md5 is not supported",
            ),
            (
                "key k { algorithm hmac-sha256; secret \"not base64!!\"; };",
                "not base64",
            ),
            ("key k { algorithm hmac-sha256; };", "has no secret"),
            (
                "key k { algorithm hmac-sha256; secret \"AAAA\";",
                "`}` is missing",
            ),
            (
                "key a { algorithm hmac-sha256; secret \"AAAA\"; }; key b { algorithm hmac-sha256; secret \"AAAA\"; };",
                "2 keys",
            ),
        ] {
            let (_dir, path) = file(text, 0o600);
            let error = TsigKey::from_file(&path).expect_err(text).to_string();
            assert!(error.contains(expected), "{text}: {error}");
            assert!(!error.contains("not base64!!"), "{error}");
        }
    }
}
