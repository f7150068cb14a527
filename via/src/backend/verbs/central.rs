//! The centralized send doorbell of the verbs kind (`VIA_DOORBELL=central`).
//!
//! Posting threads of every VI of the NIC push their validated sends into
//! one multi-producer queue (a heap [`doorbell::Doorbell`], the type the
//! soft NIC's engine uses) and ring its event count; one poster thread
//! (`via-verbs-post`) drains it, regroups what it took per QP (a stable
//! sort by VI: each VI's order is kept) and hands each QP its requests as
//! one chain of `ibv_send_wr` linked by `next`: one `ibv_post_send`, one
//! device doorbell, per QP and drain. A poster that finds the queue full
//! drains it itself. The direct path (`per-vi`, default) posts each
//! descriptor to its QP from the posting thread instead.
//!
//! Sends complete in order on a QP, and each VI's entries enter the queue
//! in its send queue order (pushed under the VI's lock, right after its
//! in-flight record), so completions still pair with records FIFO.
//! Requests the provider refuses are recorded as [`Failed`] and completed
//! (`TRANSPORT_ERROR`, the VI breaks) by whoever settles next without the
//! VI's lock held: the poster thread after its drain, or the progress path.
#![deny(unsafe_code)]

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use doorbell::Doorbell;

use crate::descriptor::MAX_SEGMENTS;
use crate::translate::SendWr;

/// Entries of the central queue (a power of two).
pub(super) const CAPACITY: u32 = 1024;
/// Most entries one drain takes before posting them.
pub(super) const DRAIN_MAX: usize = 256;

/// A send queued for the poster: the validated request and the lkeys of
/// its segments (resolved at post time, as the direct path does).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(super) struct Queued {
    pub wr: SendWr,
    pub lkeys: [u32; MAX_SEGMENTS],
}

// SAFETY: #[repr(C)] of `SendWr` (integers without padding, documented so
// and carried the same way by the soft NIC's doorbell) and an array of
// u32 whose size keeps the struct a multiple of its 8-byte alignment: no
// padding, every bit pattern valid, no pointers.
#[allow(unsafe_code)]
unsafe impl doorbell::Plain for Queued {}

const _: () = assert!(size_of::<Queued>() == size_of::<SendWr>() + 4 * MAX_SEGMENTS);

/// A request of a chain the provider refused (not posted).
#[derive(Clone, Copy, Debug)]
pub(super) struct Failed {
    pub vi: (u32, u16),
    pub seq: u32,
}

/// The queue, the drain lock and what was refused.
pub(super) struct Central {
    pub db: Doorbell<Queued>,
    /// Held while draining; the drain's buffer.
    pub drain: Mutex<Vec<Queued>>,
    pub failed: Mutex<Vec<Failed>>,
}

/// Work requests the poster posted and `ibv_post_send` calls (chains) it
/// made, over every NIC of the process (for the benchmark's report).
pub(super) static WRS: AtomicU64 = AtomicU64::new(0);
pub(super) static CHAINS: AtomicU64 = AtomicU64::new(0);

/// Work requests posted through central queues, and the chains they went
/// in, since the process started.
pub(crate) fn counts() -> (u64, u64) {
    (WRS.load(Ordering::Relaxed), CHAINS.load(Ordering::Relaxed))
}

impl Central {
    pub fn new() -> Central {
        Central {
            db: Doorbell::new_in_heap(CAPACITY),
            drain: Mutex::new(Vec::with_capacity(DRAIN_MAX)),
            failed: Mutex::new(Vec::new()),
        }
    }
}
