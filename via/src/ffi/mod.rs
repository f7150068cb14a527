//! The VIPL 1.0 C ABI (`include/vipl.h`), exported by `libvipl`.
//!
//! One file per area; each export is `#[unsafe(no_mangle)] pub unsafe
//! extern "C" fn Vip*`, documents its return codes and its C caller's
//! contract, checks its inputs, and calls the safe core inside one
//! `ffi_boundary!` (a panic becomes `VIP_ERROR_RESOURCE`).
//!
//! | file | calls |
//! |---|---|
//! | `nic.rs` | `VipOpenNic`, `VipCloseNic`, `VipQueryNic` |
//! | `mem.rs` | `VipRegisterMem`, `VipDeregisterMem`, `VipQueryMem`, `VipSetMemAttributes` |
//! | `ptag.rs` | `VipCreatePtag`, `VipDestroyPtag` |
//! | `vi.rs` | `VipCreateVi`, `VipDestroyVi`, `VipQueryVi`, `VipSetViAttributes` |
//! | `send.rs`, `recv.rs` (`post.rs`) | `VipPost*`, `Vip*Done`, `Vip*Wait`, `Vip*Notify` |
//! | `cq.rs` | `VipCreateCQ`, `VipDestroyCQ`, `VipResizeCQ`, `VipCQDone`, `VipCQWait`, `VipCQNotify` |
//! | `conn.rs` | `VipConnect*`, `VipDisconnect` |
//! | `ns.rs` | `VipNS*` |
//! | `error.rs` | `VipErrorCallback` |
//! | `smi.rs` | `VipQuerySystemManagementInfo` |
//! | `handles.rs` | C handles: encoding and checked lookup |
//! | `last_vi.rs` | the VI a thread used last (the first look of posting and polling) |
//! | `boundary.rs` | `ffi_boundary!`, pointer checks, conversions |
//!
//! Threads: every call may be made from any thread, concurrently. Notify
//! handlers and the error callback run on the NIC's provider thread with
//! no library lock held, so they may call any `Vip*` function, including
//! re-arming themselves, posting, and `VipCloseNic` of their own NIC. A
//! handler that blocks (a `Vip*Wait`, a connection call) delays the other
//! handlers and the error callback of that NIC until it returns.
#![allow(non_snake_case, non_camel_case_types)]

pub(crate) mod boundary;
pub mod conn;
pub mod cq;
pub mod error;
pub(crate) mod handles;
mod last_vi;
pub mod mem;
pub mod nic;
pub mod ns;
mod post;
pub mod ptag;
pub mod recv;
pub mod send;
pub mod smi;
pub mod srq;
pub mod types;
pub mod vi;

#[cfg(test)]
mod tests;

pub use conn::*;
pub use cq::*;
pub use error::*;
pub use mem::*;
pub use nic::*;
pub use ns::*;
pub use ptag::*;
pub use recv::*;
pub use send::*;
pub use smi::*;
pub use srq::*;
pub use vi::*;
