//! Benches: see `benches/`.
