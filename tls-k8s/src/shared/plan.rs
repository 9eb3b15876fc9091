//! The shared store's fence, and whether a write is needed; the rest of its decisions are
//! store-neutral, in `tls_selfsigned::fleet` (what the Secrets must hold, when to look again).
//! The writer (`writer.rs`) reads, asks these, writes, counts and logs.

use tls_selfsigned::fleet::Content;

use crate::fenced::Stored;
use crate::store::Fence;

/// The fence for Lease round `lease_round`, for the writer `identity`: monotonic across a
/// recreated Lease (which restarts `leaseTransitions`), past every stored round of another
/// holder.
pub(crate) fn fence<'a>(
    lease_round: u64,
    identity: &str,
    stored: impl IntoIterator<Item = &'a Fence>,
) -> Fence {
    let round = stored.into_iter().fold(lease_round, |round, f| {
        round.max(f.round + u64::from(f.holder != identity))
    });
    Fence {
        round,
        holder: identity.to_owned(),
    }
}

/// Whether the Secret already holds `content` under `fence` (so nothing is written).
pub(crate) fn unchanged(stored: Option<&Stored>, fence: &Fence, content: &Content) -> bool {
    let (data, annotations) = content;
    stored.is_some_and(|s| {
        s.fence.as_ref() == Some(fence)
            && &s.data == data
            && annotations
                .iter()
                .all(|(k, v)| s.annotations.get(k) == Some(v))
    })
}

/// For the fuzz target: reads a CA Secret's content as the writer does.
#[cfg(feature = "fuzzing")]
pub(crate) fn fuzz_ca_state(data: &[(String, Vec<u8>)], switch_after: Option<&str>) {
    use std::collections::BTreeMap;

    use tls_selfsigned::CaRotation;
    use tls_selfsigned::fleet::{CaState, SWITCH_AFTER};

    let data = data.iter().cloned().collect();
    let annotations = switch_after
        .map(|t| BTreeMap::from([(SWITCH_AFTER.to_owned(), t.to_owned())]))
        .unwrap_or_default();
    static ROTATION: std::sync::OnceLock<CaRotation> = std::sync::OnceLock::new();
    let rotation = ROTATION.get_or_init(|| {
        tls_selfsigned::SelfSigned::builder()
            .dns_name("fuzz")
            .ca()
            .build()
            .expect("a fixed configuration")
            .ca_rotation()
            .expect("CA mode")
    });
    if let Ok(state) = CaState::read(
        &data,
        &annotations,
        rotation,
        std::time::SystemTime::UNIX_EPOCH,
    ) {
        let _ = state.served();
        let _ = state.write();
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use tls_selfsigned::fleet::RENEW_AFTER;

    use super::*;

    #[test]
    fn a_fence_passes_every_round_stored_by_another_holder() {
        let theirs = Fence {
            round: 7,
            holder: "b".into(),
        };
        let mine = Fence {
            round: 9,
            holder: "a".into(),
        };
        assert_eq!(fence(3, "a", [&theirs]).round, 8);
        assert_eq!(fence(3, "a", [&mine]).round, 9, "its own round is its own");
        assert_eq!(fence(12, "a", [&theirs, &mine]).round, 12);
        assert_eq!(fence(0, "a", []).holder, "a");
    }

    #[test]
    fn only_the_same_content_under_the_same_fence_is_unchanged() {
        let fence = Fence {
            round: 2,
            holder: "a".into(),
        };
        let content: Content = (
            BTreeMap::from([("tls.crt".into(), b"x".to_vec())]),
            BTreeMap::from([(RENEW_AFTER.into(), "t".into())]),
        );
        let stored = Stored {
            fence: Some(fence.clone()),
            data: content.0.clone(),
            annotations: BTreeMap::from([
                (RENEW_AFTER.into(), "t".into()),
                ("other".into(), "kept".into()),
            ]),
        };
        assert!(unchanged(Some(&stored), &fence, &content));
        let later = Fence { round: 3, ..fence };
        assert!(!unchanged(Some(&stored), &later, &content));
        assert!(!unchanged(None, &later, &content));
    }
}
