//! The root README's Rust code, compiled as doctests with the dependencies it shows.
#![doc = include_str!("../../README.md")]
