//! The root README's Rust code, compiled as doctests with the dependencies it shows.
// The README is written for GitHub and crates.io: its lines are not held to rustdoc's markdown
// lint, and its relative links (`(examples)`) point at folders, not at Rust items.
#![allow(clippy::doc_markdown, rustdoc::broken_intra_doc_links)]
#![doc = include_str!("../../README.md")]
