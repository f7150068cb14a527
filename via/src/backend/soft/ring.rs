//! The receive ring of a VI in the NIC segment: posted receives offered to
//! the peer's engine.
//!
//! Slot states (`seq = position * 4 + state`): the owner writes a
//! pre-translated receive and publishes `POSTED` (Release); the peer's
//! engine claims it by CAS `POSTED → TAKEN`, fills it, and stores `DONE`
//! before writing the descriptor's status. The owner withdraws a receive by
//! CAS `POSTED → DONE` (flush), so exactly one side completes each receive.
#![forbid(unsafe_code)]

use std::sync::atomic::Ordering;

use crate::translate::RecvWr;

use super::SoftNic;
use super::layout::{RecvSlot, slot};

/// Publishes `pd` at ring position `pos` of VI `vi`. Inlined into the soft
/// NIC's `post_recv`, its one caller (one frame less per receive).
#[inline(always)]
pub(crate) fn offer(soft: &SoftNic, vi: u32, pos: u64, pd: &RecvWr) {
    let s = soft.view().rq_slot(vi, pos).expect("slot in range");
    s.desc_off.store(pd.desc_off, Ordering::Relaxed);
    s.desc_handle.store(pd.desc_handle, Ordering::Relaxed);
    s.seg_count.store(pd.n as u32, Ordering::Relaxed);
    let mut cap: u64 = 0;
    for (i, (off, len, h)) in pd.segs[..pd.n].iter().enumerate() {
        s.segs[i].off.store(*off, Ordering::Relaxed);
        s.segs[i].len.store(*len, Ordering::Relaxed);
        s.segs[i].handle.store(*h, Ordering::Relaxed);
        cap += *len as u64;
    }
    s.capacity
        .store(cap.min(u32::MAX as u64) as u32, Ordering::Relaxed);
    // Release: publishes the fields above; pairs with the Acquire load of
    // `seq` in the peer engine's `take_receive`.
    s.seq.store(slot::seq(pos, slot::POSTED), Ordering::Release);
    // The next slot (wrong at the ring's end: only a prefetch hint).
    let next = std::ptr::from_ref(s).addr() + size_of::<RecvSlot>();
    if let Some(l) = soft.vi_link(vi) {
        l.hint_next_offer(next);
    }
    crate::shm::prefetch_write(next);
}

/// Marks position `pos` as finished without offering it.
pub(crate) fn skip(soft: &SoftNic, vi: u32, pos: u64) {
    let s = soft.view().rq_slot(vi, pos).expect("slot in range");
    s.seq.store(slot::seq(pos, slot::DONE), Ordering::Release);
}

/// Withdraws the receive at `pos`; see `Device::cancel_recv`.
pub(crate) fn cancel(soft: &SoftNic, vi: u32, pos: u64, force: bool) -> bool {
    let s = soft.view().rq_slot(vi, pos).expect("slot in range");
    // AcqRel: wins against the peer's claiming CAS or loses to it.
    let ours = s
        .seq
        .compare_exchange(
            slot::seq(pos, slot::POSTED),
            slot::seq(pos, slot::DONE),
            Ordering::AcqRel,
            Ordering::Acquire,
        )
        .is_ok();
    if ours {
        return true;
    }
    if force && s.seq.load(Ordering::Acquire) == slot::seq(pos, slot::TAKEN) {
        s.seq.store(slot::seq(pos, slot::DONE), Ordering::Release);
        return true;
    }
    false
}
