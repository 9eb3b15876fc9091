//! Which objects a list or watch sees: `fieldSelector` (`metadata.name`, `metadata.namespace`)
//! and `labelSelector` (equality and set-based), and the ADDED/DELETED a watch sends when an
//! object moves into or out of the selection.

use std::collections::BTreeMap;

use serde_json::Value;

use super::store::*;

/// Field and label selectors of a list or watch.
pub(super) struct Filter {
    pub(super) namespace: Option<String>,
    pub(super) fields: Vec<(String, String, bool)>,
    pub(super) labels: Vec<LabelReq>,
}

pub(super) enum LabelReq {
    Eq(String, String),
    Ne(String, String),
    Exists(String),
    Absent(String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

impl Filter {
    pub(super) fn new(
        namespace: Option<String>,
        params: &BTreeMap<String, String>,
        ignore: bool,
    ) -> Self {
        let pairs = |s: Option<&String>| -> Vec<String> {
            s.filter(|_| !ignore)
                .map(|s| {
                    s.split(',')
                        .filter(|p| !p.is_empty())
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default()
        };
        let fields = pairs(params.get("fieldSelector"))
            .into_iter()
            .filter_map(|p| {
                if let Some((k, v)) = p.split_once("!=") {
                    Some((k.to_owned(), v.to_owned(), false))
                } else {
                    let (k, v) = p.split_once("==").or_else(|| p.split_once('='))?;
                    Some((k.to_owned(), v.to_owned(), true))
                }
            })
            .collect();
        // Set-based requirements hold commas inside their parentheses.
        let label_parts = params
            .get("labelSelector")
            .filter(|_| !ignore)
            .map(|s| {
                let (mut parts, mut depth, mut current) = (Vec::new(), 0, String::new());
                for c in s.chars() {
                    match c {
                        '(' => depth += 1,
                        ')' => depth -= 1,
                        ',' if depth == 0 => {
                            parts.push(std::mem::take(&mut current));
                            continue;
                        }
                        _ => {}
                    }
                    current.push(c);
                }
                parts.push(current);
                parts.retain(|p| !p.trim().is_empty());
                parts
            })
            .unwrap_or_default();
        let labels = label_parts
            .into_iter()
            .map(|p| {
                let set = |p: &str, op: &str| {
                    let (k, rest) = p.split_once(op)?;
                    let values = rest.trim().strip_prefix('(')?.strip_suffix(')')?;
                    Some((
                        k.trim().to_owned(),
                        values.split(',').map(|v| v.trim().to_owned()).collect(),
                    ))
                };
                if let Some((k, values)) = set(&p, " notin ") {
                    LabelReq::NotIn(k, values)
                } else if let Some((k, values)) = set(&p, " in ") {
                    LabelReq::In(k, values)
                } else if let Some((k, v)) = p.split_once("!=") {
                    LabelReq::Ne(k.to_owned(), v.to_owned())
                } else if let Some((k, v)) = p.split_once("==").or_else(|| p.split_once('=')) {
                    LabelReq::Eq(k.to_owned(), v.to_owned())
                } else if let Some(k) = p.strip_prefix('!') {
                    LabelReq::Absent(k.to_owned())
                } else {
                    LabelReq::Exists(p)
                }
            })
            .collect();
        Self {
            namespace,
            fields,
            labels,
        }
    }

    /// What a watch with this filter sees of `event`, as the API server's watch cache does: an
    /// object modified into the selection is `ADDED`, one modified out of it `DELETED`.
    pub(super) fn event_kind(&self, event: &Stored) -> Option<&'static str> {
        let now = self.matches(&event.object);
        let before = event.previous.as_ref().is_some_and(|p| self.matches(p));
        match (event.kind, before, now) {
            ("MODIFIED", true, true) => Some("MODIFIED"),
            ("MODIFIED", false, true) => Some("ADDED"),
            ("MODIFIED", true, false) => Some("DELETED"),
            ("MODIFIED", false, false) => None,
            (kind, _, true) => Some(kind),
            _ => None,
        }
    }

    pub(super) fn matches(&self, object: &Value) -> bool {
        let meta = &object["metadata"];
        if let Some(ns) = &self.namespace
            && meta["namespace"].as_str() != Some(ns)
        {
            return false;
        }
        for (field, want, equal) in &self.fields {
            let have = match field.as_str() {
                "metadata.name" => meta["name"].as_str(),
                "metadata.namespace" => meta["namespace"].as_str(),
                "type" => object["type"].as_str(),
                _ => None,
            };
            if (have == Some(want.as_str())) != *equal {
                return false;
            }
        }
        let label = |k: &str| meta["labels"][k].as_str().map(str::to_owned);
        self.labels.iter().all(|req| match req {
            LabelReq::Eq(k, v) => label(k).as_deref() == Some(v),
            LabelReq::Ne(k, v) => label(k).as_deref() != Some(v),
            LabelReq::Exists(k) => label(k).is_some(),
            LabelReq::Absent(k) => label(k).is_none(),
            LabelReq::In(k, values) => label(k).is_some_and(|v| values.contains(&v)),
            LabelReq::NotIn(k, values) => label(k).is_none_or(|v| !values.contains(&v)),
        })
    }
}
