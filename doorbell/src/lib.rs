//! How posted descriptors reach the NIC engine: rings and doorbells in shared memory.
//!
//! * [`Ring<T>`]: a bounded lock-free MPMC ring of [`Plain`] entries with per-slot sequence
//!   stamps (Vyukov), laid out `#[repr(C)]` so several processes can map it.
//! * [`Lock<T>`]: a futex lock without poisoning, for the provider's per-call paths, and
//!   [`BiasedLock<T>`]: the same, entered with plain loads and stores by the one thread
//!   that uses it (revoked through `membarrier(2)` when another thread comes).
//! * [`EventCount`]: the sleep/wake handshake on a futex word in shared memory, and
//!   [`wait_until`] to spin, then sleep, on a condition.
//! * [`asymmetric`]: Dekker handshakes whose frequent side costs no fence instruction.
//! * [`Doorbell<T>`]: a ring plus the event count its consumer (the engine) sleeps on.
//!   The central doorbell (one MPSC ring per NIC) and the per-VI doorbells (one SPSC ring per
//!   VI) are two uses of this type (which one is the provider's configuration).
//!
//! # Ordering contract
//!
//! Producers own the ring's `tail` (reserve by CAS), consumers own its `head` (take by
//! CAS); both CASes are Relaxed because the per-slot stamps carry the data: a producer
//! commits with a Release stamp store that the consumer's Acquire stamp load pairs with, and
//! the consumer frees the slot with a Release stamp store that the next lap's producer
//! pairs with. A sleeping consumer and a ringing producer meet through an asymmetric fence
//! ([`asymmetric`]: `membarrier(2)` in `prepare_wait`, a compiler fence in `notify_all`).
//! Details are in the module docs of `ring`, `eventcount`, `asymmetric` and `doorbell`
//! (shown on the types).
//!
//! # Shared memory
//!
//! Layouts start with a magic and version word and are validated on `attach`; everything
//! read from the region is untrusted: indices are masked with the view's own mask, loops are
//! bounded, and corruption yields errors, never undefined behaviour, panics or hangs.
//! The futex is the shared (non-private) variant, so wakes cross processes.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod asymmetric;
#[cfg(not(loom))]
#[allow(unsafe_code)]
mod biased;
#[allow(unsafe_code)]
mod doorbell;
mod error;
mod eventcount;
#[allow(unsafe_code)]
mod heap;
#[allow(unsafe_code)]
mod layout;
#[cfg(not(loom))]
#[allow(unsafe_code)]
mod lock;
#[allow(unsafe_code)]
mod ring;
mod sync;
#[cfg(not(loom))]
#[allow(unsafe_code)]
mod sys;

#[cfg(not(loom))]
pub use crate::biased::{BiasedGuard, BiasedLock};
pub use crate::doorbell::{Doorbell, Rang};
pub use crate::error::LayoutError;
pub use crate::eventcount::{BOUNDED_SLEEP, Key, WaitOutcome, wait_until};
pub use crate::layout::{
    CACHE_LINE, DOORBELL_MAGIC, EventCount, LAYOUT_VERSION, MAX_CAPACITY, Plain, RING_MAGIC,
};
#[cfg(not(loom))]
pub use crate::lock::{Lock, LockGuard};
pub use crate::ring::{Full, Pushed, Ring};
