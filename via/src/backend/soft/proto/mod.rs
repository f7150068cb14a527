//! How bytes move, one module per mechanism.
//!
//! * [`mapped`]: both sides are in arena files this process maps: one
//!   `memcpy`. The common case: registration moves private pages into arenas.
//! * [`cma`]: one side is only reachable by cross-memory attach
//!   (`process_vm_readv/writev`): one copy in the kernel.
//! * [`inline`]: the payload travels inside the doorbell entry (copied at
//!   post time, `VIA_INLINE`), so the engine never reads the sender's buffer.
//!
//! The choice and the measurements behind it are in the README.
#![forbid(unsafe_code)]

pub(crate) mod cma;
pub(crate) mod inline;
pub(crate) mod mapped;
