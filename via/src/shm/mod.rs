//! Shared memory: bounds-checked mappings, and rings inside them.
//!
//! With `sys.rs`, `mem/` and `ffi/`, this is where the crate's `unsafe` lives: every
//! other module builds on the safe, bounds-checked types here.

pub mod mapping;
pub mod rings;
