//! The root README's Rust code, compiled as doctests with the dependencies it shows.
// The README is written for GitHub and crates.io, not to rustdoc's lints.
#![allow(clippy::doc_markdown)]
#![doc = include_str!("../../README.md")]
