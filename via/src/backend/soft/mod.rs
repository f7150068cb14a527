//! The soft NIC: processes of one host, connected through shared memory.
//!
//! The data path of a send, in order:
//!
//! 1. `ffi/` checks the C arguments and calls `ViCore::post_send` (`vi.rs`),
//!    which reads and checks the descriptor (`translate.rs`) into a
//!    [`SendPd`](crate::shm::layout::SendPd).
//! 2. [`post`]: reserve a doorbell slot, fill, commit (Release), ring.
//! 3. [`engine`]: the posting thread takes the engine lock and drains the
//!    doorbell; a send takes the peer's next posted receive from its ring in
//!    the peer's NIC segment.
//! 4. [`proto`]: the bytes move through [`memory`]: one `memcpy` between
//!    arena mappings ([`proto::mapped`]), cross-memory attach
//!    ([`proto::cma`]), or from the doorbell entry ([`proto::inline`]).
//! 5. [`complete`]: `Length`/`ImmediateData`, then `Status` (Release) into
//!    the user descriptors on both sides, CQ entries, wakeups.
//!
//! [`remote`] holds the mappings of peers.
#![forbid(unsafe_code)]

pub(crate) mod complete;
pub(crate) mod engine;
pub(crate) mod memory;
pub(crate) mod post;
pub(crate) mod proto;
pub(crate) mod remote;
pub(crate) mod ring;
pub mod tcache;
