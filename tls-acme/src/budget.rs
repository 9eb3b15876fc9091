//! The weekly budget of first orders, pure: a sliding week per registered domain (by the public
//! suffix list; an IPv4 address alone, an IPv6 address by its /64). A value the store keeps (`budget.json`, the format every version has written:
//! a map from registered domain to the times of its first orders, seconds since the epoch), so
//! that a restart, or a fleet's next leader, continues from what was last written.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::record::{from_unix, to_unix};

/// A week, the budget's window.
pub(crate) const WEEK: Duration = Duration::from_secs(7 * 24 * 3600);

/// First orders per registered domain in the last week.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub(crate) struct Budget {
    spent: BTreeMap<String, Vec<u64>>,
}

/// The budget of a registered domain is spent until `until`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Spent {
    pub(crate) domain: String,
    pub(crate) until: SystemTime,
}

impl Budget {
    /// Takes one first order for `name` at `now`, with at most `limit` a week for its
    /// registered domain; or says until when that domain's budget is spent (nothing taken).
    pub(crate) fn spend(&mut self, name: &str, limit: u32, now: SystemTime) -> Result<(), Spent> {
        let domain = registered_domain(name);
        let now = to_unix(now);
        let week = WEEK.as_secs();
        let spent = self.spent.entry(domain.clone()).or_default();
        spent.retain(|t| t.saturating_add(week) > now);
        if spent.len() >= usize::try_from(limit).unwrap_or(usize::MAX) {
            // Frees up when the oldest spend leaves the week (with a limit of 0: in a week).
            let until = spent
                .iter()
                .min()
                .map_or(now.saturating_add(week), |t| t.saturating_add(week));
            if spent.is_empty() {
                self.spent.remove(&domain);
            }
            return Err(Spent {
                domain,
                until: from_unix(until),
            });
        }
        spent.push(now);
        Ok(())
    }

    /// How many first orders for `domain` (a registered domain) are within the week at `now`.
    #[cfg(test)]
    pub(crate) fn spent(&self, domain: &str, now: SystemTime) -> usize {
        let (now, week) = (to_unix(now), WEEK.as_secs());
        self.spent.get(domain).map_or(0, |times| {
            times
                .iter()
                .filter(|t| t.saturating_add(week) > now)
                .count()
        })
    }

    /// Every spend still inside the week at `now`, across domains.
    #[cfg(test)]
    pub(crate) fn total(&self, now: SystemTime) -> usize {
        self.spent.keys().map(|d| self.spent(d, now)).sum()
    }
}

/// The registered domain of `name` (its public suffix and one label more, by the public
/// suffix list), or the name itself when the list does not say; for an IP address what the CA
/// counts it under (the IPv4 address, the IPv6 /64: the list means nothing there).
pub(crate) fn registered_domain(name: &str) -> String {
    if let Some(ip) = crate::ip::address(name) {
        return crate::ip::budget_key(ip);
    }
    let bare = name.trim_start_matches("*.");
    psl::domain_str(bare).unwrap_or(bare).to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
    }

    #[test]
    fn registered_domains_follow_the_public_suffix_list() {
        for (name, domain) in [
            ("a.b.example.com", "example.com"),
            ("*.apps.example.co.uk", "example.co.uk"),
            ("www.example.co.uk", "example.co.uk"),
            ("user.github.io", "user.github.io"),
            ("example.com", "example.com"),
            ("192.0.2.7", "192.0.2.7"),
            ("2001:db8::7", "2001:db8::/64"),
            ("2001:db8::1:0:0:8", "2001:db8::/64"),
        ] {
            assert_eq!(registered_domain(name), domain, "{name}");
        }
    }

    #[test]
    fn a_budget_runs_out_per_registered_domain_and_says_when_it_refills() {
        let mut budget = Budget::default();
        for (i, name) in ["a.example.com", "b.example.com", "*.c.example.com"]
            .iter()
            .enumerate()
        {
            budget
                .spend(name, 3, at(i as u64 * 60))
                .expect("within the limit");
        }
        let spent = budget
            .spend("d.example.com", 3, at(600))
            .expect_err("the fourth in a week");
        assert_eq!(spent.domain, "example.com");
        assert_eq!(
            spent.until,
            at(0) + WEEK,
            "when the first spend leaves the week"
        );
        // Another registered domain has a budget of its own.
        budget
            .spend("a.example.org", 3, at(600))
            .expect("example.org");
        assert_eq!(budget.spent("example.com", at(600)), 3);
        assert_eq!(budget.total(at(600)), 4);
        // Addresses: each IPv4 address alone, IPv6 by its /64.
        budget.spend("192.0.2.7", 1, at(600)).expect("192.0.2.7");
        budget
            .spend("192.0.2.8", 1, at(600))
            .expect("another address");
        budget
            .spend("2001:db8::7", 1, at(600))
            .expect("2001:db8::7");
        let spent = budget
            .spend("2001:db8::8", 1, at(600))
            .expect_err("the same /64");
        assert_eq!(spent.domain, "2001:db8::/64");
        budget
            .spend("2001:db8:0:1::7", 1, at(600))
            .expect("another /64");
    }

    #[test]
    fn a_spent_budget_refills_one_order_at_a_time_as_the_week_slides() {
        let mut budget = Budget::default();
        budget.spend("a.example.com", 2, at(0)).unwrap();
        budget.spend("b.example.com", 2, at(3600)).unwrap();
        assert!(budget.spend("c.example.com", 2, at(7200)).is_err());
        // One second before the first spend leaves the week: still spent.
        let just_before = at(0) + WEEK - Duration::from_secs(1);
        assert!(budget.spend("c.example.com", 2, just_before).is_err());
        budget
            .spend("c.example.com", 2, at(0) + WEEK)
            .expect("the first spend left the week");
        let spent = budget
            .spend("d.example.com", 2, at(0) + WEEK)
            .expect_err("full again");
        assert_eq!(spent.until, at(3600) + WEEK);
    }

    #[test]
    fn a_limit_of_zero_spends_nothing_and_a_refusal_takes_nothing() {
        let mut budget = Budget::default();
        let spent = budget
            .spend("a.example.com", 0, at(0))
            .expect_err("none allowed");
        assert_eq!(spent.until, at(0) + WEEK);
        assert_eq!(budget, Budget::default(), "a refused spend is not stored");
    }

    #[test]
    fn the_stored_format_is_the_map_every_version_wrote() {
        let mut budget = Budget::default();
        budget.spend("a.example.com", 5, at(0)).unwrap();
        let json = serde_json::to_string(&budget).unwrap();
        assert_eq!(json, format!(r#"{{"example.com":[{}]}}"#, to_unix(at(0))));
        let old: BTreeMap<String, Vec<u64>> = serde_json::from_str(&json).unwrap();
        assert_eq!(old["example.com"], vec![to_unix(at(0))]);
        let back: Budget = serde_json::from_str(&json).unwrap();
        assert_eq!(back, budget);
    }

    #[test]
    fn spends_stored_far_in_the_future_or_at_the_end_of_time_do_not_overflow() {
        let mut budget: Budget =
            serde_json::from_str(&format!(r#"{{"example.com":[{}]}}"#, u64::MAX)).unwrap();
        let spent = budget.spend("a.example.com", 1, at(0)).expect_err("spent");
        assert_eq!(spent.until, tls_source::clock::latest());
    }
}
