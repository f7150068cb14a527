//! One work request run by the engine: a send into the peer's next posted
//! receive, an RDMA write or read checked against the peer's translation
//! table, and the completions on both sides.
#![forbid(unsafe_code)]

use std::sync::atomic::Ordering;

use crate::completion::{self, StatusLoc};
use crate::descriptor::{control, status};
use crate::mem::region::{self, Cursor, Fault, Seg};
use crate::nic::{ErrorCode, NicInner};
use crate::shm::mapping::Mapping;
use crate::translate::SendWr;
use crate::vi::{ViCore, Which};

use super::EngineState;
use super::lane::Lane;
use super::transfer::{
    CUT, NO_SEG, Source, copy_mapped_tail_last, move_fast, move_general, still_registered,
};
use crate::backend::soft::complete;
use crate::backend::soft::layout::{MAX_SEGS, NicView, RecvSlot, ViShared, flags, slot};
use crate::backend::soft::remote::PeerLink;
use crate::backend::soft::tcache::{Regions, Use};
use crate::backend::soft::tpt;
use crate::backend::soft::{SoftNic, marked_broken};

/// A reliable-connection break found while the engine lock was held; acted
/// on after it is released (breaking takes VI locks).
pub(crate) struct Break {
    vi: (u32, u16),
    code: ErrorCode,
    tell_peer: bool,
}

/// What the poster already found for the request (direct execution): the
/// bytes of a send's one data segment, and where the descriptor's status
/// goes (the same mappings and offsets a lookup would find). Their regions
/// were registered when the request was posted; a deregistration since
/// waits for the engine lock this request runs under
/// (`Device::quiesce_region_users`), so they stay valid until it is done.
#[derive(Clone, Copy, Default)]
pub(crate) struct Known<'a> {
    pub src: Option<(&'a Mapping, usize)>,
    pub status: Option<&'a StatusLoc>,
}

/// One request being run.
struct Op<'a> {
    soft: &'a SoftNic,
    nic: &'a NicInner,
    vi: &'a ViCore,
    link: &'a PeerLink,
    /// The peer VI's entry in its NIC segment ([`PeerLink::peer_vi`]).
    peer: Option<&'a ViShared>,
    wr: &'a SendWr,
    /// The payload when it came inline in the doorbell entry (else empty).
    inline: &'a [u8],
    known: Known<'a>,
    regions: &'a mut Regions,
    /// The link's flattened peer regions.
    lane: &'a mut Lane,
    breaks: &'a mut Vec<Break>,
    /// The initiator's status when a transfer stopped because a region was
    /// deregistered under it.
    cut: Option<u32>,
}

impl<'a> Op<'a> {
    /// The initiator's connection breaks over this request. The VI reads
    /// ERROR from now on (before the request's failed status is written);
    /// the rest of the break follows once the engine lock is released
    /// ([`settle`]).
    fn brk(&mut self, code: ErrorCode, tell_peer: bool) {
        // Release: pairs with the Acquire in `ViCore::vi_state`; the status
        // written after it is a Release store too.
        self.vi.broken.store(true, Ordering::Release);
        self.breaks.push(Break {
            vi: (self.vi.slot, self.vi.generation),
            code,
            tell_peer,
        });
    }

    /// A request longer than the connection's MaxTransferSize (the smaller
    /// of the two VIs'; translation checked this VI's): the local length
    /// error, which breaks a reliable connection as any local descriptor
    /// error does.
    #[cold]
    fn beyond_mtu(&mut self) -> u32 {
        if self.link.reliability.is_reliable() {
            self.brk(ErrorCode::PostDesc, true);
        }
        status::LENGTH_ERROR
    }

    /// Indices of the regions of the local segments; the error status if
    /// one is no longer registered or no longer covers its segment.
    fn local_regions(&mut self, idx: &mut [usize; MAX_SEGS]) -> std::result::Result<usize, u32> {
        let n = (self.wr.seg_count as usize).min(MAX_SEGS);
        for i in 0..n {
            let s = &self.wr.segs[i];
            let j = match i.checked_sub(1) {
                Some(p) if self.regions.get(idx[p]).handle == s.handle => idx[p],
                _ => self
                    .regions
                    .local(&self.nic.regions, s.handle, Use::Send)
                    .ok_or(status::PROTECTION_ERROR)?,
            };
            if !self.regions.get(j).covers(s.va, s.len as u64) {
                return Err(status::PROTECTION_ERROR);
            }
            idx[i] = j;
        }
        Ok(n)
    }

    /// The peer VI's reliable connection breaks over this request: it is
    /// marked so in its NIC segment before a failed receive status is
    /// written into its memory ([`ViShared::broken`]); the break itself
    /// reaches it through its error ring ([`PeerLink::tell_peer`]).
    fn peer_breaks(&self) {
        if let (true, Some(p)) = (self.link.reliability.is_reliable(), self.peer) {
            // Release: ordered before the status store that follows.
            p.broken.store(self.link.vi_gen, Ordering::Release);
        }
    }

    /// Takes the next posted receive of the peer VI: its position and slot.
    /// `None` if there is none.
    #[inline(always)]
    fn take_receive(&self) -> Option<(u64, &'a RecvSlot)> {
        let link: &'a PeerLink = self.link;
        let view = link.remote.view();
        let mut pos = link.rq_pos.load(Ordering::Relaxed);
        for _ in 0..crate::backend::soft::layout::RQ_SLOTS {
            let s = view.rq_slot(link.vi, pos)?;
            // Claim it directly (one ownership transfer of the line instead
            // of a read and then an upgrade). Acquire: pairs with the owner's
            // Release store of POSTED, so the descriptor fields read
            // afterwards are the ones it wrote.
            let seq = match s.seq.compare_exchange(
                slot::seq(pos, slot::POSTED),
                slot::seq(pos, slot::TAKEN),
                Ordering::Acquire,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    link.rq_pos.store(pos + 1, Ordering::Relaxed);
                    // The next slot, for the prefetch when this VI next
                    // receives (wrong at the ring's end: only a hint).
                    if let Some(l) = self.soft.vi_link(self.vi.slot) {
                        l.hint_next_recv(std::ptr::from_ref(s).addr() + size_of::<RecvSlot>());
                    }
                    return Some((pos, s));
                }
                Err(seq) => seq,
            };
            if seq == slot::seq(pos, slot::DONE) {
                // Completed at post time (bad descriptor) or flushed: skip.
                pos += 1;
                continue;
            }
            log::debug!(
                "no receive at position {pos} of VI {} (seq {seq:#x})",
                link.vi
            );
            break;
        }
        link.rq_pos.store(pos, Ordering::Relaxed);
        None
    }

    /// Sender-side status when the receiver could not take a message
    /// (no receive, too short, bad receive): the table in the README.
    fn remote_failure(&mut self, peer_code: ErrorCode) -> u32 {
        use crate::attrs::Reliability::*;
        match self.link.reliability {
            Unreliable => 0,
            ReliableDelivery | ReliableReception => {
                self.peer_breaks();
                self.link.tell_peer(peer_code);
                self.brk(ErrorCode::ConnLost, false);
                if self.link.reliability == ReliableReception {
                    status::REMOTE_DESC_ERROR
                } else {
                    0
                }
            }
        }
    }

    /// Delivers into the receive at `pos`: data (from the local segments or
    /// the inline payload, if `copy_data`), then the descriptor. Returns the
    /// receive's error bits (0 = delivered).
    #[inline(never)]
    fn deliver(
        &mut self,
        (pos, s): (u64, &RecvSlot),
        recv_op: u32,
        copy_data: bool,
        len: u32,
    ) -> std::result::Result<(), u32> {
        let (link, wr) = (self.link, self.wr);
        let view = link.remote.view();
        let desc_handle = s.desc_handle.load(Ordering::Relaxed);
        let desc_off = s.desc_off.load(Ordering::Relaxed);
        let n = s.seg_count.load(Ordering::Relaxed) as usize;
        // Mutable phase: find every region (indices stay valid).
        let lv = self.nic.regions.version();
        let desc_i = self
            .regions
            .remote(&link.remote, desc_handle, lv, Use::Recv);
        let mut fault = if n > MAX_SEGS {
            status::FORMAT_ERROR
        } else {
            0
        };
        let mut dst_i = [0usize; MAX_SEGS];
        let mut cap: u64 = 0;
        if fault == 0 && copy_data {
            for i in 0..n {
                let h = s.segs[i].handle.load(Ordering::Relaxed);
                let prev = i.checked_sub(1).map(|p| dst_i[p]).or(desc_i);
                let j = match prev {
                    Some(p) if self.regions.get(p).handle == h => Some(p),
                    _ => self.regions.remote(&link.remote, h, lv, Use::Recv),
                };
                let off = s.segs[i].off.load(Ordering::Relaxed);
                let l = s.segs[i].len.load(Ordering::Relaxed) as u64;
                match j.filter(|&j| {
                    off.checked_add(l)
                        .is_some_and(|e| e <= self.regions.get(j).len)
                }) {
                    Some(j) => dst_i[i] = j,
                    None => {
                        fault = status::PROTECTION_ERROR;
                        break;
                    }
                }
                cap += l;
            }
            if fault == 0 && len as u64 > cap {
                fault = status::LENGTH_ERROR;
            }
        }
        let mut src_i = [0usize; MAX_SEGS];
        let src_n = if fault == 0 && copy_data && self.inline.is_empty() {
            match self.local_regions(&mut src_i) {
                Ok(m) => m,
                Err(_) => {
                    fault = status::PROTECTION_ERROR;
                    0
                }
            }
        } else {
            0
        };
        // Immutable phase: move the bytes, then complete.
        let regions = &*self.regions;
        let desc = desc_i.map(|i| regions.get(i));
        let desc_va = desc.and_then(|d| d.va.checked_add(desc_off)).unwrap_or(0);
        let desc = desc.filter(|d| d.covers(desc_va, 32));
        if desc.is_none() {
            fault = status::FORMAT_ERROR;
        }
        if fault == 0 && copy_data {
            let soft = self.soft;
            let inline = self.inline;
            let dst_handles: [u32; MAX_SEGS] = std::array::from_fn(|i| {
                if i < n {
                    regions.get(dst_i[i]).handle
                } else {
                    0
                }
            });
            let mut still = || {
                still_registered(
                    soft,
                    link,
                    wr,
                    !inline.is_empty(),
                    &dst_handles[..n],
                    status::REMOTE_DESC_ERROR,
                )
            };
            let src = Source {
                wr,
                inline,
                src_i: &src_i,
                src_n,
            };
            fault = match move_fast(regions, s, &dst_i, n, &src, len) {
                Some(r) => r,
                None => move_general(regions, s, &dst_i, n, &src, len, &mut still),
            };
            if fault & CUT != 0 {
                // Stopped at a chunk boundary: the receive failed, and the
                // initiator hears why (never DONE).
                self.cut = Some(fault & !CUT);
                fault = status::PROTECTION_ERROR;
            }
        }
        // The owner may have deregistered the receive descriptor's memory:
        // nothing is written into it then.
        let desc = desc.filter(|d| tpt::is_live(&view, d.handle));
        // The slot is finished before the status becomes visible: once the
        // owner sees DONE it may recycle the slot.
        s.seq.store(slot::seq(pos, slot::DONE), Ordering::Release);
        if fault != 0 {
            self.peer_breaks();
        }
        if let Some(d) = desc {
            let imm = (wr.control & control::IMMEDIATE != 0).then_some(wr.imm);
            let st =
                status::DONE | recv_op | fault | if imm.is_some() { status::IMMEDIATE } else { 0 };
            let got = if fault == 0 { len } else { 0 };
            complete::remote_recv(
                &link.remote,
                (link.vi, link.vi_gen as u16),
                self.peer,
                d,
                desc_va,
                st,
                got,
                imm,
            );
        }
        if fault == 0 { Ok(()) } else { Err(fault) }
    }

    /// [`Op::deliver`] for the common case, straight through: at most one
    /// local segment whose region the poster resolved, a receive of at most
    /// one segment with room, each side in one mapped extent. `None` (and
    /// nothing done yet) when the case does not apply: the general path
    /// then runs, and finds the same errors.
    ///
    /// The receive's regions come from the link's lane; when it lacks them
    /// they are resolved through the translation cache and kept there.
    #[inline(always)]
    fn deliver_one(
        &mut self,
        (pos, s): (u64, &RecvSlot),
        recv_op: u32,
        len: u32,
    ) -> Option<std::result::Result<(), u32>> {
        let (link, wr) = (self.link, self.wr);
        if wr.seg_count > 1 || !self.inline.is_empty() || len as u64 > region::CHUNK {
            return None;
        }
        // One segment: its bytes (`len` of them, the request's length)
        // as the poster found them.
        let src = match wr.seg_count {
            0 => None,
            _ => Some(self.known.src?),
        };
        let view = link.remote.view();
        let n = s.seg_count.load(Ordering::Relaxed);
        if n > 1 || (n == 0 && len > 0) {
            return None;
        }
        let desc_handle = s.desc_handle.load(Ordering::Relaxed);
        let desc_off = s.desc_off.load(Ordering::Relaxed);
        let seg = (n == 1).then(|| {
            (
                s.segs[0].handle.load(Ordering::Relaxed),
                s.segs[0].off.load(Ordering::Relaxed),
                s.segs[0].len.load(Ordering::Relaxed),
            )
        });
        if seg.is_some_and(|(_, _, cap)| len > cap) {
            return None;
        }
        let data = seg.map(|(h, _, _)| h);
        let (d, entry, g) = match self.lane.locate(&view, desc_handle, data) {
            Some(found) => {
                self.regions.cache.counts(Use::Recv).hits += 1;
                found
            }
            None => {
                // Changed since: a region registered again whole is the
                // same region, found in place (a hit: its translation is
                // the one resolved before). Else not there, or another
                // region: the translation cache refills the lane.
                self.lane.again(&view, [Some(desc_handle), data]);
                match self.lane.locate(&view, desc_handle, data) {
                    Some(found) => {
                        self.regions.cache.counts(Use::Recv).hits += 1;
                        found
                    }
                    None => {
                        self.fill_lane(&view, desc_handle, data)?;
                        self.lane.locate(&view, desc_handle, data)?
                    }
                }
            }
        };
        let lane = &*self.lane;
        // Where the status goes, then where the data goes (the region
        // checked as the whole receive segment, `cap` bytes).
        let status_at = lane.place(d)?.at(desc_off, 32)?;
        let dst = match (seg, g) {
            (Some((_, off, cap)), Some(g)) => Some(lane.place(g)?.at(off, cap as u64)?),
            _ => None,
        };
        // From here on the receive is ours to finish.
        let mut fault = 0;
        if let (Some((sm, sat)), Some((dm, dat))) = (src, dst) {
            // The receiver reads the message next: from the shared cache.
            if !crate::shm::mapping::Mapping::copy_for_reader(sm, sat, dm, dat, len as usize) {
                fault = status::PROTECTION_ERROR;
                self.peer_breaks();
            }
        }
        // The owner may have deregistered the descriptor's memory meanwhile:
        // nothing is written into it then.
        let live = tpt::entry_live(entry, desc_handle);
        // The slot is finished before the status becomes visible.
        s.seq.store(slot::seq(pos, slot::DONE), Ordering::Release);
        if live {
            let imm = (wr.control & control::IMMEDIATE != 0).then_some(wr.imm);
            let st =
                status::DONE | recv_op | fault | if imm.is_some() { status::IMMEDIATE } else { 0 };
            complete::remote_recv_at(
                &link.remote,
                (link.vi, link.vi_gen as u16),
                self.peer,
                status_at,
                st,
                if fault == 0 { len } else { 0 },
                imm,
            );
        }
        Some(if fault == 0 { Ok(()) } else { Err(fault) })
    }

    /// Resolves the receive's regions (descriptor, and data when in another
    /// region) through the translation cache into the link's lane. `None`
    /// when one is not registered now (the general path reports it).
    #[inline(never)]
    fn fill_lane(&mut self, view: &NicView<'_>, desc_handle: u32, data: Option<u32>) -> Option<()> {
        let link = self.link;
        let lv = self.nic.regions.version();
        let (index, seq) = tpt::index_seq(view, desc_handle)?;
        let i = self
            .regions
            .remote_at(&link.remote, desc_handle, seq, lv, Use::Recv)?;
        self.lane.keep(view, 0, self.regions.get(i), index, seq);
        if let Some(h) = data.filter(|&h| h != desc_handle) {
            let (index, seq) = tpt::index_seq(view, h)?;
            let j = self
                .regions
                .remote_at(&link.remote, h, seq, lv, Use::Recv)?;
            self.lane.keep(view, 1, self.regions.get(j), index, seq);
        }
        Some(())
    }

    #[inline(always)]
    fn send(&mut self) -> u32 {
        if self.wr.length > self.link.mtu {
            return self.beyond_mtu();
        }
        let Some(taken) = self.take_receive() else {
            return self.remote_failure(ErrorCode::RecvqEmpty);
        };
        let r = match self.deliver_one(taken, status::OP_RECEIVE, self.wr.length) {
            Some(r) => r,
            None => self.deliver(taken, status::OP_RECEIVE, true, self.wr.length),
        };
        match r {
            Ok(()) => 0,
            Err(_) => {
                let st = self.remote_failure(ErrorCode::ConnLost);
                self.cut.take().unwrap_or(st)
            }
        }
    }

    /// Checks an RDMA target: region live, same tag as the target VI, the
    /// enable bit on both, bytes in bounds. Returns its index.
    fn rdma_target(&mut self, need: u32) -> Option<usize> {
        let (link, wr) = (self.link, self.wr);
        let tvi = self.peer?;
        let lv = self.nic.regions.version();
        let i = self
            .regions
            .remote(&link.remote, wr.remote_handle, lv, Use::Rdma)?;
        let r = self.regions.get(i);
        let ok = tvi.flags.load(Ordering::Acquire) & need != 0
            && r.flags & need != 0
            && r.ptag == tvi.ptag.load(Ordering::Relaxed)
            && r.covers(wr.remote_va, wr.length as u64);
        ok.then_some(i)
    }

    fn rdma_violation(&mut self, code: ErrorCode) -> u32 {
        // The target always hears of it; reliable connections also break.
        self.peer_breaks();
        self.link.tell_peer(code);
        if self.link.reliability.is_reliable() {
            self.brk(ErrorCode::ConnLost, false);
        }
        status::RDMA_PROT_ERROR
    }

    /// Copies between the local segments and the peer region at index
    /// `far` (`to_remote`: RDMA write; else RDMA read).
    fn rdma_copy(&mut self, far: usize, to_remote: bool) -> std::result::Result<(), u32> {
        let mut idx = [0usize; MAX_SEGS];
        let m = self.local_regions(&mut idx)?;
        let (soft, link, wr) = (self.soft, self.link, self.wr);
        let regions = &*self.regions;
        let far_handle = [regions.get(far).handle];
        let mut still =
            || still_registered(soft, link, wr, false, &far_handle, status::RDMA_PROT_ERROR);
        let mut local = [NO_SEG; MAX_SEGS];
        for i in 0..m {
            local[i] = Seg {
                region: regions.get(idx[i]),
                va: wr.segs[i].va,
                len: wr.segs[i].len as u64,
            };
        }
        let remote = [Seg {
            region: regions.get(far),
            va: wr.remote_va,
            len: wr.length as u64,
        }];
        let (mut a, mut b) = (Cursor::new(&local[..m]), Cursor::new(&remote));
        let r = if to_remote {
            // The target's last word last: a ring of messages polled in
            // memory (`Nic::writes_tail_last`).
            let end = wr.remote_va.wrapping_add(wr.length as u64);
            region::copy_tail_last(&mut a, &mut b, wr.length as u64, end, &mut still)
        } else {
            region::copy(&mut b, &mut a, wr.length as u64, &mut still)
        };
        r.map_err(|f| match f {
            Fault::Protection => status::PROTECTION_ERROR,
            Fault::Transport => status::TRANSPORT_ERROR,
            Fault::Cut(st) => st,
        })
    }

    /// An RDMA write's bytes in the common case, straight through: one
    /// local segment whose bytes the poster found in one mapped extent, a
    /// target in one mapped extent of the peer's region at `far`. `None`
    /// (nothing moved) when the case does not apply: [`Op::rdma_copy`]
    /// then moves them, with the same rule for the last word.
    #[inline(always)]
    fn write_fast(&self, far: usize) -> Option<std::result::Result<(), u32>> {
        let wr = self.wr;
        if wr.seg_count != 1 || wr.length as u64 > region::CHUNK {
            return None;
        }
        let (sm, sat) = self.known.src?;
        let len = wr.length as u64;
        let (dm, dat) = self.regions.get(far).span(wr.remote_va, len)?;
        let aligned = wr.remote_va.wrapping_add(len) % 8 == 0;
        Some(
            if copy_mapped_tail_last(sm, sat, dm, dat, len as usize, aligned) {
                Ok(())
            } else {
                Err(status::PROTECTION_ERROR)
            },
        )
    }

    fn rdma_write(&mut self) -> u32 {
        if self.wr.length > self.link.mtu {
            return self.beyond_mtu();
        }
        let Some(target) = self.rdma_target(flags::RDMA_WRITE) else {
            return self.rdma_violation(ErrorCode::RdmawProt);
        };
        // Write-with-immediate needs a receive at the target: take it first
        // so that no data lands when there is none.
        let imm_pos = if self.wr.control & control::IMMEDIATE != 0 {
            match self.take_receive() {
                Some(p) => Some(p),
                None => return self.remote_failure(ErrorCode::RecvqEmpty),
            }
        } else {
            None
        };
        let moved = match self.write_fast(target) {
            Some(r) => r,
            None => self.rdma_copy(target, true),
        };
        if let Err(e) = moved {
            return e;
        }
        if let Some(pos) = imm_pos {
            if self
                .deliver(pos, status::OP_REMOTE_RDMA_WRITE, false, self.wr.length)
                .is_err()
            {
                return self.remote_failure(ErrorCode::ConnLost);
            }
        }
        0
    }

    fn rdma_read(&mut self) -> u32 {
        if self.wr.length > self.link.mtu {
            return self.beyond_mtu();
        }
        let Some(source) = self.rdma_target(flags::RDMA_READ) else {
            return self.rdma_violation(ErrorCode::RdmarProt);
        };
        match self.rdma_copy(source, false) {
            Ok(()) => 0,
            Err(st) => st,
        }
    }
}

/// Completes the send descriptor of `wr`: where the poster found its status
/// (direct execution), else in its region looked up through the engine's
/// cache.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn complete_send(
    soft: &SoftNic,
    nic: &NicInner,
    regions: &mut Regions,
    known: Known<'_>,
    vi: &ViCore,
    wr: &SendWr,
    status: u32,
) {
    let view = soft.view();
    let Some(sh) = view.vi(vi.slot) else { return };
    if let Some(loc) = known.status {
        // Direct execution: the poster found where the status goes.
        loc.complete(status, None, None);
        let signals = complete::vi_signals(sh);
        completion::after_local_with(nic, vi, Which::Send, &signals, &view.header().notify);
        return;
    }
    let r = regions
        .local(&nic.regions, wr.desc_handle, Use::Send)
        .map(|i| regions.get(i));
    let r = r.filter(|r| r.covers(wr.desc_va, 32));
    completion::send_with(
        nic,
        vi,
        r,
        wr.desc_va,
        status,
        &complete::vi_signals(sh),
        &view.header().notify,
    );
}

/// Runs a request taken from a doorbell (`inline`: its payload if it came
/// inline), on its VI: `hint` if that is the one, else looked up (it may
/// have been destroyed since).
pub(crate) fn execute_queued(
    soft: &SoftNic,
    nic: &NicInner,
    st: &mut EngineState,
    wr: &SendWr,
    inline: &[u8],
    hint: Option<&ViCore>,
) {
    match hint {
        Some(h) if h.slot == wr.vi && h.generation as u32 == wr.vi_gen => {
            execute(soft, nic, st, h, wr, inline, Known::default())
        }
        _ => match nic.vi(wr.vi, wr.vi_gen as u16) {
            Some(v) => execute(soft, nic, st, &v, wr, inline, Known::default()),
            None => log::warn!("doorbell entry for a destroyed VI {}", wr.vi),
        },
    }
}

/// Runs one request of `vi`; `inline` is its payload if it came inline.
pub(crate) fn execute(
    soft: &SoftNic,
    nic: &NicInner,
    st: &mut EngineState,
    vi: &ViCore,
    wr: &SendWr,
    inline: &[u8],
    known: Known<'_>,
) {
    let op = wr.op();
    let op_status = match op {
        control::OP_RDMAWRITE => status::OP_RDMA_WRITE,
        control::OP_RDMAREAD => status::OP_RDMA_READ,
        _ => status::OP_SEND,
    };
    let EngineState {
        regions,
        links,
        breaks,
    } = st;
    // Broken here, or by the peer's engine (its mark, written before the
    // failed status that may have led the program to post this): flushed,
    // not run; the break itself is on its way.
    let (link, lane) = match links.get(soft, vi) {
        Some(l)
            if !vi.broken.load(Ordering::Acquire)
                && !marked_broken(soft.vi_shared(vi.slot), vi) =>
        {
            l
        }
        _ => {
            complete_send(
                soft,
                nic,
                regions,
                known,
                vi,
                wr,
                status::DONE | status::DESC_FLUSHED_ERROR | op_status,
            );
            regions.trim();
            return;
        }
    };
    let peer = link.peer_vi();
    let mut o = Op {
        soft,
        nic,
        vi,
        link,
        peer,
        wr,
        inline,
        known,
        regions,
        lane,
        breaks,
        cut: None,
    };
    // Inside the operation for the peer's deregistration path: it waits
    // for this epoch to move before `VipDeregisterMem` returns.
    let access = link.begin_access(peer);
    let r = if wr.fault != 0 {
        if link.reliability.is_reliable() {
            o.brk(ErrorCode::PostDesc, true);
        }
        wr.fault
    } else if !link.peer_alive(peer) {
        o.brk(ErrorCode::ConnLost, false);
        status::DESC_FLUSHED_ERROR
    } else {
        match op {
            control::OP_SENDRECV => o.send(),
            control::OP_RDMAWRITE => o.rdma_write(),
            _ => o.rdma_read(),
        }
    };
    link.end_access(peer, access);
    complete_send(
        soft,
        nic,
        o.regions,
        known,
        vi,
        wr,
        status::DONE | r | op_status,
    );
    o.regions.trim();
}

/// Acts on the connection breaks found while running.
pub(crate) fn settle(nic: &NicInner, breaks: Vec<Break>) {
    for b in breaks {
        if let Some(vi) = nic.vi(b.vi.0, b.vi.1) {
            vi.break_connection(nic, b.code, b.tell_peer, false);
        }
    }
}
