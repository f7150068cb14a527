//! via: a user-level Virtual Interface Architecture provider.
//!
//! See `docs/design.md` for the data path and the shared-memory contract.

pub mod descriptor;
pub mod ffi;
