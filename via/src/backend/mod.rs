//! Device kinds: the operations table every kind of NIC implements.
//!
//! The object model (`nic`, `vi`, `cq`, `translate`, `tpt`) is common to all
//! kinds; what differs is how memory is made reachable, how a translated
//! descriptor reaches the hardware (or the software engine), and how a
//! posted receive is offered to the peer. Those operations are the [`Device`]
//! trait. Its default methods refuse with `VIP_ERROR_RESOURCE` (the idea of
//! rdma-core's `dummy_ops.c`): a kind that lacks an operation answers with an
//! error, never a crash.
//!
//! Kinds: [`soft`] (the default: shared memory within a host). The sockets
//! and verbs kinds plug in here.
#![forbid(unsafe_code)]

pub(crate) mod soft;

use std::io;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::mem::arena::{Extent, UserRange};
use crate::nic::NicInner;
use crate::shm::layout::SendPd;
use crate::translate::RecvPd;
use crate::vi::ViCore;

/// A registration's pinned memory: its extents, and whatever the device
/// keeps to undo the pin (a registration-cache lease).
pub(crate) struct Pinned {
    pub extents: Vec<Extent>,
    pub token: Box<dyn std::any::Any + Send + Sync>,
}

fn unsupported() -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        "operation not supported by this device kind",
    )
}

/// The operations table of a device kind.
pub(crate) trait Device: Send + Sync {
    /// Name of the kind, for logs.
    fn kind(&self) -> &'static str;

    /// Starts background work, if the kind has any.
    fn start(&self, _nic: &Arc<NicInner>) {}

    /// Stops background work.
    fn stop(&self) {}

    /// Makes the pages of `range` reachable by the device (and the peers).
    fn pin(&self, _nic: &NicInner, _range: &UserRange) -> io::Result<Pinned> {
        Err(unsupported())
    }

    /// Undoes [`Device::pin`].
    fn unpin(&self, _nic: &NicInner, _pinned: Pinned) {}

    /// A VI was created in `slot`.
    fn add_vi(&self, _nic: &NicInner, _slot: u32) -> Result<()> {
        Ok(())
    }

    /// The VI in `slot` was destroyed.
    fn remove_vi(&self, _slot: u32) {}

    /// Queues a translated send, RDMA write or read; the caller holds the
    /// VI's send-queue lock, so descriptors of one VI arrive in order.
    fn post_send(&self, _nic: &NicInner, _vi: &ViCore, _pd: SendPd) -> Result<()> {
        Err(Error::Resource)
    }

    /// Lets queued work run (after the send-queue lock is released); `vi`
    /// is the VI that just posted, if any.
    fn kick(&self, _nic: &NicInner, _vi: Option<&ViCore>) {}

    /// Runs everything queued now; afterwards no earlier descriptor is in
    /// flight in this process.
    fn quiesce(&self, _nic: &NicInner) {}

    /// Counters of the device's translation cache, if it has one.
    fn translation_stats(&self) -> Option<soft::tcache::TranslationStats> {
        None
    }

    /// Waits until no engine step that started before the call is still
    /// running (it may leave queued work queued).
    fn quiesce_light(&self, nic: &NicInner) {
        self.quiesce(nic)
    }

    /// Whether queued work waits for the engine.
    fn has_work(&self) -> bool {
        false
    }

    /// Forgets everything cached about a peer session (it died): its
    /// mappings can then be released.
    fn peer_gone(&self, _nic: &NicInner, _session: u64) {}

    /// Offers a translated receive at ring position `pos` to the peer.
    fn post_recv(&self, _nic: &NicInner, _vi: &ViCore, _pos: u64, _pd: &RecvPd) -> Result<()> {
        Err(Error::Resource)
    }

    /// Marks the receive at `pos` as never to be offered (completed at post
    /// time).
    fn skip_recv(&self, _nic: &NicInner, _vi: &ViCore, _pos: u64) {}

    /// Withdraws the receive at `pos` from the peer. True if it was still
    /// offered (or `force` and the peer had taken it but is gone): the caller
    /// completes it as flushed. False if the peer is completing it.
    fn cancel_recv(&self, _nic: &NicInner, _vi: &ViCore, _pos: u64, _force: bool) -> bool {
        false
    }
}
