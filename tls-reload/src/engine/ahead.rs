//! A batch's keyed bundles validated ahead, on every core: the start of an estate is tens of
//! thousands of bundles, each tens of microseconds of parsing and key loading, and the engine
//! would check them one after the other on one thread. Validation is pure (the bundle, the
//! route's rule, the batch's `now`), so the results are what the engine would compute itself;
//! it installs or rejects them in the batch's order as before.
//!
//! `ahead.rs`: a batch's keyed bundles with new material, validated ahead on every core
//! (scoped threads, at least 16 bundles, 8 a thread; panics contained as the engine contains
//! them), installed or refused in the batch's order as one by one: the start of an estate is
//! tens of thousands of key loads.

use std::panic::AssertUnwindSafe;
use std::sync::OnceLock;
use std::time::SystemTime;

use tls_source::{CertBundle, Keyed, KeyedUpdate, panic_message};

use super::input::Input;
use crate::validate::Rule;
use crate::{Error, Validated, Validator};

/// Below this many bundles a batch is checked in place: a thread costs more than it saves.
const MIN_AHEAD: usize = 16;
/// Each thread gets at least this many bundles.
const PER_THREAD: usize = 8;

/// A check done ahead: the outcome for the input at the same index of the batch.
pub(crate) type Ahead = Option<Result<Validated, Error>>;

fn cores() -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, usize::from))
}

/// Checks, on up to every core, the keyed bundles of `batch` that `wanted` picks (by index in
/// the batch, source and update; a keyed
/// route's rule: [`Rule::Names`]), with a panic in a check contained as the engine contains
/// it. Returns one entry per input; `None` where nothing was checked ahead.
pub(crate) fn check(
    validator: &Validator,
    batch: &[Input],
    wanted: impl Fn(usize, usize, &Keyed) -> bool,
    now: SystemTime,
) -> Vec<Ahead> {
    let mut ahead: Vec<Ahead> = Vec::new();
    let picked: Vec<(usize, &Keyed, &CertBundle)> = batch
        .iter()
        .enumerate()
        .filter_map(|(i, input)| match input {
            Input::Keyed(
                source,
                Ok(
                    keyed @ Keyed {
                        update: KeyedUpdate::Put(bundle),
                        ..
                    },
                ),
            ) if wanted(i, *source, keyed) => Some((i, keyed, bundle)),
            _ => None,
        })
        .collect();
    let threads = cores().min(picked.len() / PER_THREAD);
    if picked.len() < MIN_AHEAD || threads < 2 {
        return ahead;
    }
    ahead.resize_with(batch.len(), || None);
    let chunk = picked.len().div_ceil(threads);
    let one = |(_, keyed, bundle): &(usize, &Keyed, &CertBundle)| {
        checked(validator, &keyed.key, bundle, now)
    };
    let results: Vec<Vec<Result<Validated, Error>>> = std::thread::scope(|scope| {
        let mut chunks = picked.chunks(chunk);
        let here = chunks.next().unwrap_or_default();
        let others: Vec<_> = chunks
            .map(|part| scope.spawn(move || part.iter().map(one).collect::<Vec<_>>()))
            .collect();
        let mut results = vec![here.iter().map(one).collect()];
        for other in others {
            // `checked` contains panics, so a thread ends normally; were it not to, its
            // bundles are checked in place below.
            results.push(other.join().unwrap_or_default());
        }
        results
    });
    for (part, results) in picked.chunks(chunk).zip(results) {
        for ((i, _, _), result) in part.iter().zip(results) {
            ahead[*i] = Some(result);
        }
    }
    ahead
}

/// What the engine's own check of a keyed bundle gives: the validator's verdict, or a
/// contained panic as [`Error::Internal`].
fn checked(
    validator: &Validator,
    key: &str,
    bundle: &CertBundle,
    now: SystemTime,
) -> Result<Validated, Error> {
    std::panic::catch_unwind(AssertUnwindSafe(|| {
        #[cfg(feature = "__test-hooks")]
        crate::hooks::before_check(bundle);
        validator.validate_as(bundle, &Rule::Names, now)
    }))
    .unwrap_or_else(|panic| {
        Err(super::internal(
            Some(key),
            bundle,
            panic_message(panic.as_ref()),
        ))
    })
}
