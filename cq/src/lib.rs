//! Completion queues for via-rs: the two designs of the thesis (which one a
//! CQ uses is the provider's configuration, `VIA_CQ`).
//!
//! * **CQ1, [`EntryRing`]**: the completing engine (in the receiver's case,
//!   the *sender's* process) pushes a 64-bit entry into a ring that lives in
//!   a memfd mapped by every peer. Producers are untrusted and may die at any
//!   instruction; the owner repairs the ring with [`EntryRing::repair`],
//!   resizes it with [`EntryRing::close`] + [`EntryRing::drain_closed`], and
//!   reports overrun at a logical [`EntryRing::limit`]. The protocol and the
//!   ordering contract are in the [`ring`] module.
//! * **CQ2, [`Scan`]**: no entries; the CQ scans its work queues' [`Probe`]s
//!   round robin for completions not reported yet. Cheaper for few queues.
//!
//! ```
//! use cq::EntryRing;
//!
//! let ring = EntryRing::new_in_heap(64);
//! ring.set_limit(48).unwrap();
//! ring.push(0x0001_0002).unwrap(); // e.g. (VI 1, receive queue)
//! assert_eq!(ring.pop(), Some(0x0001_0002));
//! ```
//!
//! `unsafe` lives only in [`ring`] (raw mapping, slot access); every other
//! module is `#![forbid(unsafe_code)]`. Atomics come from one `sync` module so
//! that loom can replace them (`cfg(loom)`).

mod error;
pub mod layout;
pub mod ring;
mod scan;
mod sync;

pub use error::{LayoutError, LimitError, PushError};
pub use ring::EntryRing;
pub use scan::{Probe, Scan};
