//! The soft NIC: processes of one host, connected through shared memory.
//!
//! Everything this kind of NIC owns is in this directory: its shared
//! segment ([`layout`]: the VI and CQ tables peers read, the translation
//! table [`tpt`], the receive rings [`ring`], the async error ring), the
//! engine ([`engine`]), the mappings of peers ([`remote`]) and the engine's
//! translation cache ([`tcache`]).
//!
//! The data path of a send, in order:
//!
//! 1. `ffi/` checks the C arguments and calls `ViCore::post_send`
//!    (`vi.rs`), which reads and checks the descriptor (`translate.rs`) into
//!    a [`SendWr`](crate::translate::SendWr) and hands it to
//!    [`SoftNic::post_send`](Device::post_send).
//! 2. [`engine`]: with nothing queued, the posting thread runs the request
//!    at once; otherwise it goes through a doorbell (reserve a slot, fill,
//!    commit with Release, ring) and whoever holds the engine lock runs it.
//!    A send takes the peer's next posted receive from its ring in the
//!    peer's NIC segment ([`engine::op`]).
//! 3. [`engine::transfer`]: the bytes move through `mem::region`: one
//!    `memcpy` between arena mappings, cross-memory attach, or from the
//!    doorbell entry (`mem::copy`).
//! 4. [`complete`] and `crate::completion`: `Length`/`ImmediateData`, then
//!    `Status` (Release) into the user descriptors on both sides, CQ
//!    entries, wakeups.
#![deny(unsafe_code)]

pub(crate) mod complete;
pub(crate) mod engine;
pub mod layout;
pub(crate) mod remote;
pub(crate) mod ring;
pub mod tcache;
pub(crate) mod tpt;

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};

use doorbell::EventCount;

use crate::attrs::{Reliability, ViAttributes};
use crate::backend::{
    CqSignals, Device, Kick, Limits, RegionSlot, RegionSpec, RetiredEntry, TranslationStats,
    ViSignals,
};
use crate::error::{Error, Result};
use crate::mem::arena::{CMA, Extent};
use crate::nic::{AsyncError, NicInner};
use crate::process::Process;
use crate::proto::{Endpoint, ObjKey, ObjKind, Request};
use crate::shm::mapping::Mapping;
use crate::shm::rings::MappedRing;
use crate::translate::{RecvWr, SendWr, WrRegions};
use crate::vi::ViCore;

use engine::Engine;
use layout::{
    CqShared, ERROR_RING, MAX_CQ, MAX_EXTENTS, MAX_REGIONS, MAX_SEGS, MAX_VI, NicView, OFFSETS,
    RQ_SLOTS, Segment, ViShared, flags,
};
use remote::{PeerLink, RemoteNic};
use tpt::TranslationTable;

/// Largest message (`MaxTransferSize`).
pub const MAX_TRANSFER: u32 = 1 << 30;

/// Longest wait of [`SoftNic::quiesce_region_users`] for one peer.
pub const QUIESCE_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(500);

/// Accepted device names: `via_lo` and `/dev/via_lo`, and `via_<if>` /
/// `/dev/via_<if>` for a network interface of this host (M-VIA's names; all
/// served by shared memory until the sockets kind of NIC lands).
pub(crate) fn accepts(name: &str) -> Option<String> {
    let base = name.strip_prefix("/dev/").unwrap_or(name);
    let ifname = base.strip_prefix("via_")?;
    // Other interfaces are the sockets kind's.
    (ifname == "lo").then(|| base.to_string())
}

/// Whether the peer's engine marked the connection of `vi` (whose entry in
/// this NIC's segment is `sh`) broken (`ViShared::broken`):
/// [`Device::broken_by_peer`], and the engine's check before it runs a
/// request of `vi`.
#[inline(always)]
pub(crate) fn marked_broken(sh: &ViShared, vi: &ViCore) -> bool {
    // Acquire: pairs with the peer engine's Release (`Op::peer_breaks`).
    sh.broken.load(Ordering::Acquire) == vi.generation as u32
}

/// The viad name of ring generation `generation` of CQ `slot` of NIC `nic`.
pub(crate) fn ring_key(nic: u32, slot: u32, generation: u32) -> ObjKey {
    ObjKey {
        kind: ObjKind::CqRing,
        nic,
        id: slot,
        generation,
    }
}

fn nic_key(id: u32) -> ObjKey {
    ObjKey {
        kind: ObjKind::Nic,
        nic: id,
        id: 0,
        generation: 0,
    }
}

/// The device side of one VI: its connection.
#[derive(Default)]
pub(crate) struct ViLink {
    /// Bumped whenever `link` changes (engines cache the link by epoch).
    epoch: AtomicU32,
    link: RwLock<Option<Arc<PeerLink>>>,
    /// Session of the last peer (kept after a disconnect, for `peer_gone`).
    session: AtomicU64,
    /// Where the peer's next receive slot probably is (its address in this
    /// process, 0 for unknown): written by the engine after it takes a
    /// receive, read only as a prefetch hint ([`crate::shm::prefetch_write`]), so
    /// a stale or wrong address costs nothing but the hint.
    next_recv: AtomicUsize,
    /// Where this VI's next receive will be offered (as `next_recv`, a
    /// hint): the slot the peer's engine claimed last time round the ring.
    next_offer: AtomicUsize,
}

impl ViLink {
    /// The link epoch.
    pub fn epoch(&self) -> u32 {
        // Acquire: pairs with the Release bump in `set`.
        self.epoch.load(Ordering::Acquire)
    }

    /// Records the address of the peer's next receive slot (a hint).
    #[inline(always)]
    pub fn hint_next_recv(&self, addr: usize) {
        self.next_recv.store(addr, Ordering::Relaxed);
    }

    /// Records the address of this VI's next receive slot (a hint).
    #[inline(always)]
    pub fn hint_next_offer(&self, addr: usize) {
        self.next_offer.store(addr, Ordering::Relaxed);
    }

    /// The current link.
    pub fn link(&self) -> Option<Arc<PeerLink>> {
        self.link.read().unwrap().clone()
    }

    /// Replaces the link; returns the old one. Callers then quiesce the
    /// engine before relying on the old link being unused.
    fn set(&self, l: Option<Arc<PeerLink>>) -> Option<Arc<PeerLink>> {
        let mut g = self.link.write().unwrap();
        if let Some(l) = &l {
            self.session.store(l.remote.session, Ordering::Relaxed);
        }
        let old = std::mem::replace(&mut *g, l);
        // Release: an engine that sees the new epoch reads the new link.
        self.epoch.fetch_add(1, Ordering::Release);
        old
    }
}

/// One open soft NIC.
pub(crate) struct SoftNic {
    process: Arc<Process>,
    id: u32,
    seg: Segment,
    tpt: TranslationTable,
    errors: MappedRing,
    engine: Engine,
    links: Box<[ViLink]>,
    /// Mappings of peer NICs, shared by every VI connected to one.
    remotes: Mutex<HashMap<(u64, u32), Weak<RemoteNic>>>,
}

/// Opens NIC `id` of `process`: its segment, published to viad for peers.
pub(crate) fn open(process: &Arc<Process>, id: u32, _name: &str) -> Result<Arc<dyn Device>> {
    let agent = process.agent()?;
    let session = agent.session;
    let (fd, map) =
        Mapping::create(&format!("via-nic:{session}:{id}"), OFFSETS.len).map_err(|e| {
            log::error!("cannot create the NIC segment: {e}");
            Error::failed("creating the NIC segment", e)
        })?;
    let seg =
        Segment::new(Arc::new(map)).map_err(|e| Error::failed("formatting the NIC segment", e))?;
    NicView::init(&seg, session, id, process.pid as u32);
    let (eoff, elen) = NicView::errors_range();
    let errors = MappedRing::init(seg.mapping().clone(), eoff, elen, ERROR_RING).map_err(|e| {
        log::error!("cannot format the error ring: {e}");
        Error::failed("formatting the error ring", e)
    })?;
    errors
        .get()
        .set_limit(ERROR_RING as usize)
        .map_err(|e| Error::failed("sizing the error ring", e))?;
    agent.publish(nic_key(id), &fd).map_err(|e| {
        log::error!("cannot publish the NIC segment: {e}");
        Error::failed("publishing the NIC segment", e)
    })?;
    drop(fd);
    let engine = Engine::new(process.config, session, id)?;
    Ok(Arc::new(SoftNic {
        process: process.clone(),
        id,
        tpt: TranslationTable::new(seg.clone()),
        seg,
        errors,
        engine,
        links: (0..MAX_VI).map(|_| ViLink::default()).collect(),
        remotes: Mutex::new(HashMap::new()),
    }))
}

impl SoftNic {
    /// The segment view.
    #[inline(always)]
    pub fn view(&self) -> NicView<'_> {
        self.seg.view()
    }

    fn vi_shared(&self, slot: u32) -> &ViShared {
        self.view().vi(slot).expect("slot in range")
    }

    fn cq_shared(&self, slot: u32) -> &CqShared {
        self.view().cq(slot).expect("slot in range")
    }

    /// The connection of VI `slot`.
    pub fn vi_link(&self, slot: u32) -> Option<&ViLink> {
        self.links.get(slot as usize)
    }

    /// A mapping of NIC `nic` of `session`, shared by every VI connected to it.
    pub fn remote(&self, session: u64, nic: u32) -> io::Result<Arc<RemoteNic>> {
        let mut g = self.remotes.lock().unwrap();
        if let Some(r) = g.get(&(session, nic)).and_then(Weak::upgrade) {
            return Ok(r);
        }
        let agent = self
            .process
            .agent()
            .map_err(|_| io::Error::other("no viad session"))?;
        let r = Arc::new(RemoteNic::open(agent.clone(), session, nic)?);
        g.insert((session, nic), Arc::downgrade(&r));
        g.retain(|_, w| w.strong_count() > 0);
        Ok(r)
    }

    fn publish_attrs(&self, slot: u32, a: &ViAttributes) {
        let sh = self.vi_shared(slot);
        sh.reliability
            .store(a.reliability.bits(), Ordering::Relaxed);
        sh.ptag.store(a.ptag.id(), Ordering::Relaxed);
        sh.flags.store(
            (if a.enable_rdma_write {
                flags::RDMA_WRITE
            } else {
                0
            }) | (if a.enable_rdma_read {
                flags::RDMA_READ
            } else {
                0
            }),
            Ordering::Release,
        );
    }
}

impl Device for SoftNic {
    fn kind(&self) -> &'static str {
        "soft"
    }

    fn limits(&self) -> Limits {
        Limits {
            max_vi: MAX_VI,
            max_cq: MAX_CQ,
            queue_depth: RQ_SLOTS,
            max_segments: MAX_SEGS as u32,
            max_transfer: MAX_TRANSFER,
            max_regions: MAX_REGIONS - 1,
            reliability: Reliability::Unreliable.bits()
                | Reliability::ReliableDelivery.bits()
                | Reliability::ReliableReception.bits(),
            rdma_read: Reliability::ReliableDelivery.bits() | Reliability::ReliableReception.bits(),
            write_tail_last: true,
        }
    }

    fn start(&self, nic: &Arc<NicInner>) {
        self.engine.start(nic);
    }

    fn close(&self, _nic: &NicInner) {
        self.engine.stop();
        if let Ok(agent) = self.process.agent() {
            let _ = agent.send(&Request::Retire {
                key: nic_key(self.id),
            });
        }
    }

    fn provider_wake(&self) -> &EventCount {
        &self.view().header().notify
    }

    fn vi_signals(&self, slot: u32) -> ViSignals<'_> {
        complete::vi_signals(self.vi_shared(slot))
    }

    fn cq_signals(&self, slot: u32) -> CqSignals<'_> {
        complete::cq_signals(self.cq_shared(slot))
    }

    fn take_async_errors(&self, out: &mut Vec<AsyncError>) {
        while let Some(v) = self.errors.get().pop() {
            match AsyncError::decode(v) {
                Some(e) => out.push(e),
                None => log::warn!("ignoring a malformed entry {v:#x} in the error ring"),
            }
        }
    }

    fn memory_retired(&self) {
        // Release: peers that see the bump see the table changes made
        // before the retirement.
        self.view().header().retired.fetch_add(1, Ordering::Release);
    }

    fn reserve_region(&self) -> Result<RegionSlot> {
        self.tpt.reserve()
    }

    fn unreserve_region(&self, slot: RegionSlot) {
        self.tpt.unreserve(slot);
    }

    fn add_region(&self, _nic: &NicInner, slot: RegionSlot, r: &RegionSpec<'_>) -> Result<u32> {
        // Too many pieces for one table entry: peers reach the region by
        // cross-memory attach instead.
        let one;
        let extents = if r.extents.len() > MAX_EXTENTS {
            let first = r.extents[0].va;
            one = [Extent {
                va: first,
                len: r.extents.iter().map(|e| e.len).sum(),
                arena: CMA,
                arena_off: first,
            }];
            &one[..]
        } else {
            r.extents
        };
        self.tpt.fill(
            slot,
            tpt::NewRegion {
                va: r.va,
                len: r.len,
                ptag: r.ptag,
                flags: r.flags,
                extents,
            },
        )
    }

    fn remove_region(&self, _nic: &NicInner, handle: u32) {
        let _ = self.tpt.remove(handle);
    }

    // A parked registration keeps its table entry: taken back, it only
    // needs its handle written back, not its extents.
    fn retire_region(&self, _nic: &NicInner, handle: u32) -> Option<RetiredEntry> {
        self.tpt.retire(handle).ok().map(RetiredEntry)
    }

    fn revive_region(&self, _nic: &NicInner, entry: RetiredEntry) -> Result<u32> {
        Ok(self.tpt.revive(entry.0))
    }

    fn release_retired(&self, entry: RetiredEntry) {
        self.tpt.release(entry.0);
    }

    fn set_region_attributes(&self, handle: u32, ptag: u32, flags: u32) -> Result<()> {
        self.tpt.set_attributes(handle, ptag, flags)
    }

    /// Waits until no engine touches memory under a translation that was
    /// valid before the call: this process's engine (its lock) and the
    /// engine of every connected peer (the access epoch of each VI: odd
    /// while the peer's engine is inside an operation on it; it re-checks
    /// the translation between chunks of 256 KiB, so the wait is bounded by
    /// one chunk). A peer that does not move on within [`QUIESCE_TIMEOUT`]
    /// (stopped, or dead) is logged and not waited for.
    fn quiesce_region_users(&self, nic: &NicInner) {
        self.engine.quiesce_light(self, nic);
        // SeqCst: the table update before this call is ordered before the
        // epoch loads below; pairs with the fence in the peer's engine after
        // it raises the epoch (Dekker: either it sees the new table, or we
        // see its odd epoch).
        std::sync::atomic::fence(Ordering::SeqCst);
        let view = self.view();
        // The VIs inside an operation now (usually none: no allocation).
        let mut inside = Vec::new();
        for (slot, _, _) in nic.vis.read().unwrap().iter() {
            if let Some(sh) = view.vi(slot) {
                let e = sh.access.load(Ordering::SeqCst);
                if e & 1 == 1 {
                    inside.push((slot, e));
                }
            }
        }
        if inside.is_empty() {
            return;
        }
        let deadline = std::time::Instant::now() + QUIESCE_TIMEOUT;
        for (slot, e) in inside {
            let Some(sh) = view.vi(slot) else { continue };
            let mut spins = 0u32;
            while sh.access.load(Ordering::Acquire) == e {
                if std::time::Instant::now() >= deadline {
                    log::warn!(
                        "{}: the peer of VI {slot} stayed inside an operation for {:?}; not waiting",
                        nic.name,
                        QUIESCE_TIMEOUT
                    );
                    break;
                }
                spins += 1;
                if spins < 1000 {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
        }
    }

    fn add_vi(&self, _nic: &NicInner, vi: &ViCore) -> Result<()> {
        let sh = self.vi_shared(vi.slot);
        self.publish_attrs(vi.slot, &vi.attributes());
        sh.recv_cq.store(
            vi.recv_cq.as_ref().map_or(0, |c| c.slot + 1),
            Ordering::Relaxed,
        );
        sh.send_cq.store(
            vi.send_cq.as_ref().map_or(0, |c| c.slot + 1),
            Ordering::Relaxed,
        );
        sh.interest.store(0, Ordering::Relaxed);
        self.links[vi.slot as usize].set(None);
        self.engine.add_vi(vi.slot)?;
        // Release: the fields above are visible to a peer that sees the generation.
        sh.generation.store(vi.generation as u32, Ordering::Release);
        Ok(())
    }

    fn vi_attributes(&self, vi: &ViCore, a: &ViAttributes) {
        self.publish_attrs(vi.slot, a);
    }

    fn remove_vi(&self, _nic: &NicInner, vi: &ViCore) {
        self.engine.remove_vi(vi.slot);
        self.links[vi.slot as usize].set(None);
        self.vi_shared(vi.slot)
            .generation
            .store(0, Ordering::Release);
    }

    fn cq_ring(
        &self,
        _nic: &NicInner,
        slot: u32,
        generation: u32,
        entries: u32,
    ) -> Result<Arc<MappedRing>> {
        let agent = self.process.agent()?;
        let cap = entries.next_power_of_two().max(64);
        let len = cq::EntryRing::bytes_for(cap);
        let (fd, map) = Mapping::create(
            &format!("via-cq:{}:{}:{slot}:{generation}", agent.session, self.id),
            len,
        )
        .map_err(|e| Error::failed("creating a CQ ring", e))?;
        let ring = MappedRing::init(Arc::new(map), 0, len, cap)
            .map_err(|e| Error::failed("formatting a CQ ring", e))?;
        ring.get()
            .set_limit(entries as usize)
            .map_err(|e| Error::failed("sizing a CQ ring", e))?;
        agent
            .publish(ring_key(self.id, slot, generation), &fd)
            .map_err(|e| Error::failed("publishing a CQ ring", e))?;
        Ok(Arc::new(ring))
    }

    fn cq_state(&self, slot: u32, ring: bool, generation: u32) {
        let sh = self.cq_shared(slot);
        sh.mode.store(!ring as u32, Ordering::Relaxed);
        // Release: a peer that sees this generation finds the ring published.
        sh.generation.store(generation, Ordering::Release);
    }

    fn retire_cq_ring(&self, _nic: &NicInner, slot: u32, generation: u32) {
        if let Ok(agent) = self.process.agent() {
            let _ = agent.send(&Request::Retire {
                key: ring_key(self.id, slot, generation),
            });
        }
    }

    fn endpoint_blob(&self, vi: &ViCore) -> Vec<u8> {
        // The first position of our receive ring the peer's engine takes.
        vi.recv_start().to_le_bytes().to_vec()
    }

    fn connect(&self, _nic: &NicInner, vi: &ViCore, peer: &Endpoint) -> Result<()> {
        let mtu = vi.attributes().max_transfer_size.min(peer.mtu);
        let Ok(rq_pos) = <[u8; 8]>::try_from(&peer.device[..]).map(u64::from_le_bytes) else {
            log::error!(
                "the peer's endpoint is not a soft NIC's ({} device bytes)",
                peer.device.len()
            );
            return Err(Error::InvalidParameter);
        };
        let link = PeerLink::open(self, peer, rq_pos, mtu).map_err(|e| {
            log::error!("cannot map the peer's NIC: {e}");
            Error::failed("mapping the peer's NIC", e)
        })?;
        // A mark the former peer left (`ViShared::broken`) is void now:
        // that connection's break is over.
        self.vi_shared(vi.slot).broken.store(0, Ordering::Relaxed);
        self.links[vi.slot as usize].set(Some(Arc::new(link)));
        Ok(())
    }

    fn disconnect(&self, _nic: &NicInner, vi: &ViCore, tell_peer: bool) {
        let old = self.links[vi.slot as usize].set(None);
        if let (true, Some(l)) = (tell_peer, &old) {
            l.tell_peer(crate::nic::ErrorCode::ConnLost);
        }
    }

    fn broken_by_peer(&self, vi: &ViCore) -> bool {
        marked_broken(self.vi_shared(vi.slot), vi)
    }

    fn peer_gone(&self, nic: &NicInner, session: u64) {
        // The dead process's engine touches nothing any more (its mappings
        // are gone): an access epoch it left odd is over.
        let view = self.view();
        for (slot, l) in self.links.iter().enumerate() {
            if l.session.load(Ordering::Relaxed) != session {
                continue;
            }
            if let Some(sh) = view.vi(slot as u32) {
                let e = sh.access.load(Ordering::Acquire);
                if e & 1 == 1 {
                    let _ = sh.access.compare_exchange(
                        e,
                        e.wrapping_add(1),
                        Ordering::AcqRel,
                        Ordering::Relaxed,
                    );
                }
            }
        }
        self.engine.with_state(self, nic, |st| {
            st.regions.forget(session);
            st.links.forget(session);
        });
        self.remotes
            .lock()
            .unwrap()
            .retain(|(s, _), _| *s != session);
    }

    // Inlined into the default `post_send_queued`: one frame less on
    // every send. A request run at once asks for no kick unless something
    // waits behind it: the call through the device after every send is
    // saved.
    #[inline(always)]
    fn post_send(
        &self,
        nic: &NicInner,
        vi: &ViCore,
        wr: &SendWr,
        regions: WrRegions<'_>,
    ) -> Result<Kick> {
        self.engine.post(self, nic, vi, wr, regions)
    }

    fn polls(&self) -> bool {
        // The peer's engine writes our completions; nothing runs here.
        false
    }

    fn received(&self, vi: &ViCore) {
        // A receive completed: an answer often follows, and its send claims
        // the peer's next receive slot, a line the peer wrote last. Ask for
        // it now, so that the transfer overlaps the application's work.
        // The receive that is re-posted first writes this VI's next slot,
        // which the peer's engine wrote last: asked for too.
        if let Some(l) = self.links.get(vi.slot as usize) {
            crate::shm::prefetch_write(l.next_recv.load(Ordering::Relaxed));
            crate::shm::prefetch_write(l.next_offer.load(Ordering::Relaxed));
        }
    }

    fn kick(&self, nic: &NicInner, vi: Option<&ViCore>) {
        self.engine.kick(self, nic, vi);
    }

    fn post_recv(&self, _nic: &NicInner, vi: &ViCore, pos: u64, wr: &RecvWr) -> Result<()> {
        ring::offer(self, vi.slot, pos, wr);
        Ok(())
    }

    fn skip_recv(&self, _nic: &NicInner, vi: &ViCore, pos: u64) {
        ring::skip(self, vi.slot, pos);
    }

    fn cancel_recv(&self, _nic: &NicInner, vi: &ViCore, pos: u64, force: bool) -> bool {
        ring::cancel(self, vi.slot, pos, force)
    }

    fn quiesce(&self, nic: &NicInner) {
        self.engine.drain_now(self, nic);
    }

    fn has_work(&self) -> bool {
        self.engine.pending()
    }

    fn translation_stats(&self, nic: &NicInner) -> Option<TranslationStats> {
        Some(self.engine.translation_stats(self, nic))
    }
}
