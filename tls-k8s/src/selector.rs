//! Label selectors evaluated on our side: the API server applies them, but a proxy, a mock or
//! an aggregated API may not, and a Secret outside the selection must never be served.

use std::collections::BTreeMap;
use std::fmt;

/// A parsed label selector (`app=web,tier!=db,env in (prod,staging),!legacy`), the grammar of
/// Kubernetes' `labels.Parse`: requirements joined by commas, each `key`, `!key`, `key=value`,
/// `key==value`, `key!=value`, `key in (v1,v2)` or `key notin (v1,v2)`. The empty selector
/// matches everything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Selector(Vec<Requirement>);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    Exists(String),
    Absent(String),
    /// `key in (...)`, and `key=value` as a set of one.
    In(String, Vec<String>),
    /// `key notin (...)`, and `key!=value`: also matches when the label is absent.
    NotIn(String, Vec<String>),
}

/// Why a selector could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Invalid {
    selector: String,
    reason: String,
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid label selector {:?}: {}",
            self.selector, self.reason
        )
    }
}

impl std::error::Error for Invalid {}

impl Selector {
    pub(crate) fn parse(selector: &str) -> Result<Self, Invalid> {
        let invalid = |reason: String| Invalid {
            selector: selector.to_owned(),
            reason,
        };
        let mut requirements = Vec::new();
        for part in split_top_level(selector).map_err(invalid)? {
            let part = part.trim();
            if part.is_empty() {
                if selector.trim().is_empty() {
                    continue;
                }
                return Err(invalid("an empty requirement".to_owned()));
            }
            requirements.push(requirement(part).map_err(invalid)?);
        }
        Ok(Self(requirements))
    }

    /// Whether an object with these labels is selected.
    pub(crate) fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|r| match r {
            Requirement::Exists(key) => labels.contains_key(key),
            Requirement::Absent(key) => !labels.contains_key(key),
            Requirement::In(key, values) => labels.get(key).is_some_and(|v| values.contains(v)),
            Requirement::NotIn(key, values) => labels.get(key).is_none_or(|v| !values.contains(v)),
        })
    }
}

/// Splits at commas outside parentheses.
fn split_top_level(selector: &str) -> Result<Vec<&str>, String> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0u32, 0);
    for (i, c) in selector.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth = depth
                    .checked_sub(1)
                    .ok_or_else(|| "a ')' without its '('".to_owned())?;
            }
            ',' if depth == 0 => {
                parts.push(&selector[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("a '(' without its ')'".to_owned());
    }
    parts.push(&selector[start..]);
    Ok(parts)
}

fn requirement(part: &str) -> Result<Requirement, String> {
    let key = |k: &str| -> Result<String, String> {
        let k = k.trim();
        let valid = !k.is_empty()
            && k.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
        if valid {
            Ok(k.to_owned())
        } else {
            Err(format!("{k:?} is not a label key"))
        }
    };
    let value = |v: &str| -> Result<String, String> {
        let v = v.trim();
        let valid = v
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if valid {
            Ok(v.to_owned())
        } else {
            Err(format!("{v:?} is not a label value"))
        }
    };
    if let Some((k, v)) = part.split_once("!=") {
        return Ok(Requirement::NotIn(key(k)?, vec![value(v)?]));
    }
    if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
        return Ok(Requirement::In(key(k)?, vec![value(v)?]));
    }
    if let Some(open) = part.find('(') {
        let head = part[..open].trim();
        let Some(body) = part[open + 1..].trim_end().strip_suffix(')') else {
            return Err(format!("{part:?}: nothing may follow the ')'"));
        };
        let values = body.split(',').map(value).collect::<Result<Vec<_>, _>>()?;
        if let Some(k) = head.strip_suffix(" notin") {
            return Ok(Requirement::NotIn(key(k)?, values));
        }
        if let Some(k) = head.strip_suffix(" in") {
            return Ok(Requirement::In(key(k)?, values));
        }
        return Err(format!(
            "{part:?}: expected `key in (...)` or `key notin (...)`"
        ));
    }
    match part.strip_prefix('!') {
        Some(k) => Ok(Requirement::Absent(key(k)?)),
        None => Ok(Requirement::Exists(key(part)?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn equality_and_set_based_requirements_select_as_the_api_server_does() {
        let web = labels(&[("app", "web"), ("env", "prod")]);
        let db = labels(&[("app", "db"), ("env", "staging"), ("legacy", "")]);
        let none = labels(&[]);
        let cases: &[(&str, [bool; 3])] = &[
            ("", [true, true, true]),
            ("app=web", [true, false, false]),
            ("app==web", [true, false, false]),
            ("app!=web", [false, true, true]),
            ("app", [true, true, false]),
            ("!legacy", [true, false, true]),
            ("env in (prod, staging)", [true, true, false]),
            ("env notin (prod)", [false, true, true]),
            ("app=web,env in (prod,staging)", [true, false, false]),
            ("app in (web,db),!legacy", [true, false, false]),
        ];
        for (selector, want) in cases {
            let s = Selector::parse(selector).unwrap();
            let got = [s.matches(&web), s.matches(&db), s.matches(&none)];
            assert_eq!(&got, want, "{selector}");
        }
    }

    #[test]
    fn a_malformed_selector_is_an_error_naming_it() {
        for bad in [
            "app in (web",
            "app=web,",
            "app in web)",
            "a b",
            "env in (prod) x",
        ] {
            let err = Selector::parse(bad).unwrap_err().to_string();
            assert!(err.contains(&format!("{bad:?}")), "{err}");
        }
    }
}
