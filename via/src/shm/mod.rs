//! Shared memory: mappings, registration arenas, and the shared layouts.
//!
//! With `sys.rs` and `ffi/`, this is where the crate's `unsafe` lives: every
//! other module builds on the safe, bounds-checked types here.

pub mod arena;
pub mod layout;
pub mod mapping;
pub mod rings;
