//! Kinds of NIC: the operations table each one implements, and the table of
//! kinds that `VipOpenNic` picks from by name.
//!
//! The object model (`nic`, `vi`, `cq`, `conn`, `translate`, `regions`,
//! `completion`) is the same for every kind: protection tags, the VI state
//! machine and its work queues, descriptor validation, the one writer of
//! completions into user descriptors, error callbacks. A kind supplies what
//! differs, through [`Device`] (the shape of rdma-core's `verbs_context_ops`):
//! how a registered region becomes reachable by the NIC and by peers, where
//! completers wake waiters, how a connection is set up on the wire, and how
//! a validated work request moves data. The default methods answer with a
//! clean error (`VIP_ERROR_RESOURCE`), the idea of rdma-core's
//! `dummy_ops.c`: a kind that lacks an operation never crashes.
//!
//! | kind | directory | names |
//! |---|---|---|
//! | shared memory between the processes of a host | [`soft`] | default, `via_lo` |
//! | TCP through a network interface, between hosts (and processes of one host) | [`sockets`] | `via_<ifname>` for an interface other than `lo` |
//! | InfiniBand / RoCE through libibverbs (feature `verbs`) | `verbs` | `verbs` (first device), `rxe0`, `mlx5_0`, ... (any ibverbs device), `/dev/via_<ibdev>` |
//! | in-process loopback, for unit tests | `loopback` (tests only) | none (opened directly) |
//!
//! A new kind is one directory here plus one row in [`KINDS`].
#![deny(unsafe_code)]

// The one `unsafe` block: a reference kept beside the `Arc` it borrows.
#[allow(unsafe_code)]
mod device_ref;
#[cfg(test)]
pub(crate) mod loopback;
pub(crate) mod sockets;
pub(crate) mod soft;
#[cfg(feature = "verbs")]
pub(crate) mod verbs;

pub(crate) use device_ref::DeviceRef;

use std::sync::Arc;
use std::sync::atomic::AtomicU32;

use doorbell::EventCount;

use crate::attrs::ViAttributes;
use crate::error::{Error, Result};
use crate::mem::arena::Extent;
use crate::nic::{AsyncError, NicInner};
use crate::process::Process;
use crate::proto::{Endpoint, NetAddr};
use crate::shm::rings::MappedRing;
use crate::translate::{RecvWr, SendWr, Translated, WrRegions};
use crate::vi::{ViCore, Which};

/// What a kind of NIC supports (`VipQueryNic` reports these).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// VIs per NIC.
    pub max_vi: u32,
    /// CQs per NIC.
    pub max_cq: u32,
    /// Descriptors outstanding per work queue.
    pub queue_depth: u32,
    /// Data segments per descriptor.
    pub max_segments: u32,
    /// Largest `MaxTransferSize`.
    pub max_transfer: u32,
    /// Live registrations per NIC.
    pub max_regions: u32,
    /// `VIP_SERVICE_*` bits of the reliability levels offered.
    pub reliability: u32,
    /// Levels on which RDMA read works.
    pub rdma_read: u32,
    /// An RDMA write stores the last 8 bytes of its target last, as one
    /// atomic word, when the target's end is 8-byte aligned
    /// (`Nic::writes_tail_last`).
    pub write_tail_last: bool,
}

/// Where the completers of one VI's queues wake waiters (memory every
/// completer of the kind can reach: for the soft NIC, the NIC segment).
#[derive(Clone, Copy)]
pub(crate) struct ViSignals<'a> {
    /// Sleepers in `VipSendWait`.
    pub send_wake: &'a EventCount,
    /// Sleepers in `VipRecvWait`.
    pub recv_wake: &'a EventCount,
    /// `interest` bits: a Notify handler waits (see `crate::completion`).
    pub interest: &'a AtomicU32,
}

impl ViSignals<'_> {
    /// The event count of queue `w`.
    pub fn wake(&self, w: Which) -> &EventCount {
        match w {
            Which::Send => self.send_wake,
            Which::Recv => self.recv_wake,
        }
    }
}

/// Where completers wake the waiters of one CQ.
#[derive(Clone, Copy)]
pub(crate) struct CqSignals<'a> {
    /// Sleepers in `VipCQWait`.
    pub wake: &'a EventCount,
    /// Non-zero while a Notify handler waits.
    pub interest: &'a AtomicU32,
}

/// A memory handle and whatever the device reserved with it, taken before
/// the pages are pinned (see [`Device::reserve_region`]).
#[derive(Debug)]
pub(crate) struct RegionSlot {
    /// The handle the registration will have.
    pub handle: u32,
    /// Device-private (the soft NIC's table index).
    pub index: u32,
}

/// A region's device entry kept while its registration is parked (see
/// [`Device::retire_region`]): device-private (the soft NIC's table index
/// and the handle it had).
#[derive(Debug)]
pub(crate) struct RetiredEntry(pub u64);

/// A registration to make reachable.
pub(crate) struct RegionSpec<'a> {
    /// First byte.
    pub va: u64,
    /// Length.
    pub len: u64,
    /// Protection tag id.
    pub ptag: u32,
    /// RDMA enables (`layout::flags`).
    pub flags: u32,
    /// The pinned pages: arena extents, or cross-memory-attach extents.
    pub extents: &'a [Extent],
}

/// Counts of one kind of lookup in a device's translation cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheCounts {
    /// Found valid in the cache.
    pub hits: u64,
    /// First reference to the region.
    pub compulsory: u64,
    /// Referenced before, but evicted or changed since.
    pub other: u64,
}

/// A device translation cache's counters, and its shape.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TranslationStats {
    /// Entries.
    pub entries: usize,
    /// Ways per set.
    pub ways: usize,
    /// Local regions of the initiator.
    pub send: CacheCounts,
    /// Peers' posted receives.
    pub recv: CacheCounts,
    /// Peers' RDMA targets.
    pub rdma: CacheCounts,
}

/// Whether a poster calls [`Device::kick`] after a post
/// ([`Device::post_send_queued`]'s answer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kick {
    /// Something may wait: work queued behind the post, or a break to
    /// settle.
    Needed,
    /// The post ran and the device saw nothing waiting after it.
    NotNeeded,
}

/// The operations table of a kind of NIC, one instance per open NIC.
///
/// Calls come from the object model with its own locks as documented per
/// method; a device never calls back into a method of the object model that
/// takes the same lock.
pub(crate) trait Device: Send + Sync {
    /// Name of the kind, for logs.
    fn kind(&self) -> &'static str;

    /// What the kind supports.
    fn limits(&self) -> Limits;

    /// The NIC's own host address (`VipQueryNic`'s `LocalNicAddress`, the
    /// host part of its addresses), if it is not the host's VIA address.
    fn local_address(&self) -> Option<Vec<u8>> {
        None
    }

    /// Starts background work, if the kind has any.
    fn start(&self, _nic: &Arc<NicInner>) {}

    /// Stops background work and retires what the device published
    /// (`VipCloseNic`, after every VI is disconnected).
    fn close(&self, _nic: &NicInner) {}

    // ---- signals ----

    /// Where the provider thread sleeps; completers and peers wake it for
    /// Notify handlers and asynchronous errors.
    fn provider_wake(&self) -> &EventCount;

    /// The signals of VI `slot`.
    fn vi_signals(&self, slot: u32) -> ViSignals<'_>;

    /// The signals of CQ `slot`.
    fn cq_signals(&self, slot: u32) -> CqSignals<'_>;

    /// Asynchronous errors peers reported to this NIC since the last call.
    fn take_async_errors(&self, _out: &mut Vec<AsyncError>) {}

    /// The process retired registered memory (an arena): peers may drop
    /// what they cached of it.
    fn memory_retired(&self) {}

    // ---- memory ----

    /// Takes the handle of the next registration (before its pages are
    /// pinned, so that the device's bookkeeping overlaps the pinning).
    fn reserve_region(&self) -> Result<RegionSlot> {
        Err(Error::Resource)
    }

    /// Gives back a reservation whose registration failed.
    fn unreserve_region(&self, _slot: RegionSlot) {}

    /// Makes a pinned region reachable (by the device and by peers);
    /// returns its memory handle.
    fn add_region(&self, _nic: &NicInner, _slot: RegionSlot, _r: &RegionSpec<'_>) -> Result<u32> {
        Err(Error::Resource)
    }

    /// Makes a region unreachable (deregistration, or its memory went away).
    /// Transfers already running may still touch it until
    /// [`Device::quiesce_region_users`] returns.
    fn remove_region(&self, _nic: &NicInner, _handle: u32) {}

    /// Like [`Device::remove_region`] (the handle is dead at once), but the
    /// device may keep the region's entry for the same region again
    /// (parked registrations): then it returns the entry, which goes back
    /// through [`Device::revive_region`] or [`Device::release_retired`].
    /// Kinds that keep nothing remove the region and return `None` (a
    /// parked registration then adds it anew).
    fn retire_region(&self, nic: &NicInner, handle: u32) -> Option<RetiredEntry> {
        self.remove_region(nic, handle);
        None
    }

    /// Makes a retired entry reachable again with the region it held;
    /// returns its memory handle: the one it had (the same registration
    /// taken back whole: same bytes, tag and enables), or a fresh one. On an
    /// error the entry is released.
    fn revive_region(&self, _nic: &NicInner, _entry: RetiredEntry) -> Result<u32> {
        Err(Error::Resource)
    }

    /// Frees a retired entry for good.
    fn release_retired(&self, _entry: RetiredEntry) {}

    /// Changes the protection tag and RDMA enables of a live region.
    fn set_region_attributes(&self, _handle: u32, _ptag: u32, _flags: u32) -> Result<()> {
        Err(Error::Resource)
    }

    /// Waits until no transfer that could see a region removed before the
    /// call still touches it (this process's, and connected peers').
    fn quiesce_region_users(&self, _nic: &NicInner) {}

    // ---- VIs ----

    /// A VI was created (its attributes are set and its CQs attached).
    fn add_vi(&self, _nic: &NicInner, _vi: &ViCore) -> Result<()> {
        Err(Error::Resource)
    }

    /// The VI's attributes changed (`VipSetViAttributes`, idle VI).
    fn vi_attributes(&self, _vi: &ViCore, _a: &ViAttributes) {}

    /// The VI was destroyed.
    fn remove_vi(&self, _nic: &NicInner, _vi: &ViCore) {}

    // ---- CQs ----

    /// The entry ring of CQ `slot` (ring mode), generation `generation`,
    /// for `entries` entries, in memory every completer reaches.
    fn cq_ring(
        &self,
        _nic: &NicInner,
        _slot: u32,
        _generation: u32,
        _entries: u32,
    ) -> Result<Arc<MappedRing>> {
        Err(Error::Resource)
    }

    /// Tells completers how CQ `slot` takes entries now: `ring` generation
    /// `generation`, or scanning (`ring == false`); generation 0: no CQ.
    fn cq_state(&self, _slot: u32, _ring: bool, _generation: u32) {}

    /// Ring generation `generation` of CQ `slot` is no longer used.
    fn retire_cq_ring(&self, _nic: &NicInner, _slot: u32, _generation: u32) {}

    // ---- connections ----

    /// What the peer of `vi` needs to know to reach it on the wire, carried
    /// opaquely by the connection broker (`Endpoint::device`, at most
    /// `proto::MAX_DEVICE_BLOB` bytes).
    fn endpoint_blob(&self, _vi: &ViCore) -> Vec<u8> {
        Vec::new()
    }

    /// Sets up the device side of a connection of `vi` to `peer` (before
    /// the VI is marked connected: once the peer hears, it may send).
    fn connect(&self, _nic: &NicInner, _vi: &ViCore, _peer: &Endpoint) -> Result<()> {
        Err(Error::Resource)
    }

    /// Asks for a connection of `vi` to `remote` itself instead of through
    /// the local viad (`None`: through viad). Returns the peer as the
    /// broker would have; [`Device::connect`] follows with it.
    fn request_connection(
        &self,
        _nic: &NicInner,
        _vi: &ViCore,
        _local: &NetAddr,
        _remote: &NetAddr,
        _timeout: Option<std::time::Duration>,
    ) -> Option<Result<Endpoint>> {
        None
    }

    /// Starts a peer-to-peer request of `vi` itself instead of through the
    /// local viad (`None`: through viad); the answer comes through the
    /// returned request as the broker's would.
    fn request_peer(
        &self,
        _nic: &NicInner,
        _vi: &ViCore,
        _local: &NetAddr,
        _remote: &NetAddr,
        _timeout: Option<std::time::Duration>,
    ) -> Option<Result<crate::agent::Pending>> {
        None
    }

    /// Tears down the device side of `vi`'s connection; `tell_peer`: the
    /// peer hears `CONN_LOST` through the device. No descriptor of `vi`
    /// runs on the old connection once [`Device::quiesce`] returns.
    fn disconnect(&self, _nic: &NicInner, _vi: &ViCore, _tell_peer: bool) {}

    /// Whether the peer's side already found `vi`'s connection broken,
    /// the break not yet delivered (a kind whose peer writes into this
    /// process's memory: it says so before the failed status it writes).
    fn broken_by_peer(&self, _vi: &ViCore) -> bool {
        false
    }

    /// A peer session died: forget what the device holds of it.
    fn peer_gone(&self, _nic: &NicInner, _session: u64) {}

    // ---- work ----

    /// Runs or queues a validated send, RDMA write or read; `regions` are
    /// what translation resolved for it. Answers whether the caller must
    /// [`Device::kick`] once it has released the send-queue lock (a kind
    /// that knows nothing waits says so). The caller holds the VI's
    /// send-queue lock, so one VI's requests arrive in order.
    fn post_send(
        &self,
        _nic: &NicInner,
        _vi: &ViCore,
        _wr: &SendWr,
        _regions: WrRegions<'_>,
    ) -> Result<Kick> {
        Err(Error::Resource)
    }

    /// [`Device::post_send`] of the request translation just read into the
    /// VI's send queue (`t`: what it found). The default hands it on as
    /// [`WrRegions`]; a kind that uses none of it overrides this to skip
    /// finding them (the caller holds the send-queue lock, as for
    /// `post_send`).
    #[inline]
    fn post_send_queued(
        &self,
        nic: &NicInner,
        vi: &ViCore,
        wr: &SendWr,
        t: Translated<'_>,
    ) -> Result<Kick> {
        self.post_send(nic, vi, wr, WrRegions::of(wr, t))
    }

    /// A thread polls for a completion of `vi` that has not come: the
    /// device may progress inline (no locks of the object model held).
    fn poll(&self, _nic: &NicInner, _vi: &ViCore) {}

    /// A thread polls a CQ or a shared receive queue that has nothing: the
    /// device may progress inline, for the VIs in `slots` (the CQ's
    /// members; none for an SRQ) or for all. True if it may have completed
    /// something (the caller looks again).
    fn poll_any(&self, _nic: &NicInner, _slots: &[u32]) -> bool {
        false
    }

    /// Whether [`Device::poll`] can complete anything (false: a poller need
    /// not look at its queue again after it; a kind whose completions are
    /// all written by the initiator's engine). A constant of the kind: read
    /// once, when the NIC opens (`NicInner::dev_polls`).
    fn polls(&self) -> bool {
        true
    }

    /// A receive of `vi` was dequeued (a hint: a kind may prepare for the
    /// answer that often follows).
    fn received(&self, _vi: &ViCore) {}

    /// Lets queued work run (after the send-queue lock is released); `vi`
    /// is the VI that just posted, if any.
    fn kick(&self, _nic: &NicInner, _vi: Option<&ViCore>) {}

    /// Offers a validated receive at queue position `pos` to the peer.
    fn post_recv(&self, _nic: &NicInner, _vi: &ViCore, _pos: u64, _wr: &RecvWr) -> Result<()> {
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

    /// Runs everything queued now; afterwards no earlier request is in
    /// flight in this process.
    fn quiesce(&self, _nic: &NicInner) {}

    /// Whether queued work waits for the engine.
    fn has_work(&self) -> bool {
        false
    }

    /// Counters of the device's translation cache, if it has one.
    fn translation_stats(&self, _nic: &NicInner) -> Option<TranslationStats> {
        None
    }

    // ---- shared receive queues (an extension, not VIPL 1.0) ----
    // Kinds without them keep these defaults: `InvalidParameter`, the
    // answer VIPL gives for a NIC that cannot do what is asked.

    /// Creates a shared receive queue of `entries` descriptors of tag
    /// `ptag`; its id.
    fn create_srq(&self, _nic: &NicInner, _ptag: u32, _entries: u32) -> Result<u32> {
        Err(Error::InvalidParameter)
    }

    /// Destroys SRQ `id` (no VI attached): its outstanding descriptors
    /// complete flushed.
    fn destroy_srq(&self, _nic: &NicInner, _id: u32) -> Result<()> {
        Err(Error::InvalidParameter)
    }

    /// Posts a validated receive (descriptor at `desc_va`) to SRQ `id`.
    fn post_srq_recv(&self, _nic: &NicInner, _id: u32, _desc_va: u64, _wr: &RecvWr) -> Result<()> {
        Err(Error::InvalidParameter)
    }

    /// The oldest completed descriptor of SRQ `id`, if any.
    fn srq_done(&self, _id: u32) -> Option<SrqDone> {
        None
    }

    /// The event count SRQ `id`'s waiters sleep on.
    fn srq_wake(&self, _id: u32) -> Option<&EventCount> {
        None
    }

    /// Attaches idle `vi` (no receive posted) to SRQ `id`, or detaches it
    /// (`None`).
    fn attach_srq(&self, _nic: &NicInner, _vi: &ViCore, _id: Option<u32>) -> Result<()> {
        Err(Error::InvalidParameter)
    }
}

/// A descriptor a shared receive queue completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SrqDone {
    /// Slot and generation of the VI that received.
    pub vi: (u32, u16),
    /// Address of the descriptor.
    pub desc: u64,
    /// Its status word.
    pub status: u32,
}

/// Opens NIC number `id` of a process under the canonical `name`.
pub(crate) type OpenFn = fn(process: &Arc<Process>, id: u32, name: &str) -> Result<Arc<dyn Device>>;

/// One kind of NIC in the table.
pub(crate) struct Kind {
    /// For logs and `VipQueryNic`.
    pub name: &'static str,
    /// The canonical device name if `name` is one of this kind's.
    pub accepts: fn(name: &str) -> Option<String>,
    /// Opens NIC number `id` of `process` under the canonical name.
    pub open: OpenFn,
}

/// Every kind of NIC, in the order names are tried.
pub(crate) static KINDS: &[Kind] = &[
    Kind {
        name: "soft",
        accepts: soft::accepts,
        open: soft::open,
    },
    Kind {
        name: "sockets",
        accepts: sockets::accepts,
        open: sockets::open,
    },
    #[cfg(feature = "verbs")]
    Kind {
        name: "verbs",
        accepts: verbs::accepts,
        open: verbs::open,
    },
];

/// The default device name (`VipOpenNic` with NULL or "", unless
/// `VIA_DEVICE` names another).
pub const DEFAULT_NAME: &str = "via_lo";

/// The kind and canonical name of device `name` (NULL or "": `VIA_DEVICE`
/// if set, else [`DEFAULT_NAME`]; so an unchanged program runs on another
/// kind, e.g. `VIA_DEVICE=rxe0`).
///
/// # Errors
/// `InvalidParameter` if no kind accepts the name.
pub(crate) fn lookup(name: Option<&str>) -> Result<(&'static Kind, String)> {
    let env = std::env::var("VIA_DEVICE").ok().filter(|d| !d.is_empty());
    let n = match name {
        None | Some("") => env.as_deref().unwrap_or(DEFAULT_NAME),
        Some(n) => n,
    };
    KINDS
        .iter()
        .find_map(|k| (k.accepts)(n).map(|c| (k, c)))
        .ok_or(Error::InvalidParameter)
}
