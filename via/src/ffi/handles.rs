//! C handles: [`Handle`] values in a `void *`, never Rust pointers.
//!
//! | C type | kind | `nic` | `generation` | `index` |
//! |---|---|---|---|---|
//! | `VIP_NIC_HANDLE` | `Nic` | NIC slot | NIC generation | 0 |
//! | `VIP_VI_HANDLE` | `Vi` | NIC slot | VI generation | NIC generation << 16 \| VI slot |
//! | `VIP_CQ_HANDLE` | `Cq` | NIC slot | CQ generation | NIC generation << 16 \| CQ slot |
//! | `VIP_PROTECTION_HANDLE` | `Ptag` | NIC slot | ptag generation | NIC generation << 16 \| ptag index |
//! | `VIP_CONN_HANDLE` | `Conn` | NIC slot | request generation | NIC generation << 16 \| request slot |
//! | `VIP_SRQ_HANDLE` (extension) | `Srq` | NIC slot | SRQ generation | NIC generation << 16 \| SRQ slot (`ffi::srq`'s table) |
//!
//! Every handle names its NIC by slot *and* generation, so a handle of a
//! closed NIC whose slot was reused is refused, and so is a handle used
//! with another NIC. Decoding checks the kind, the NIC (open, in this
//! process: handles do not survive `fork`), and the object's generation;
//! anything else is `VIP_INVALID_PARAMETER` (`VIP_INVALID_PTAG` for the
//! protection tag inside attributes, which the callers map).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::attrs::Ptag;
use crate::cq::CqCore;
use crate::error::{Error, Result};
use crate::ffi::boundary::{opaque, opaque_value};
use crate::ffi::last_vi;
use crate::ffi::types::*;
use crate::handle::{Handle, Kind};
use crate::nic::NicInner;
use crate::process::Process;
use crate::vi::ViCore;

/// Slots of objects inside a NIC fit in the low 16 bits of `index`.
const SLOT_MASK: u32 = 0xffff;

fn encode(kind: Kind, nic: &NicInner, generation: u16, slot: u32) -> *mut core::ffi::c_void {
    debug_assert!(slot <= SLOT_MASK);
    let index = match kind {
        Kind::Nic => 0,
        _ => ((nic.generation as u32) << 16) | (slot & SLOT_MASK),
    };
    opaque(
        Handle {
            kind,
            nic: nic.slot as u16,
            generation,
            index,
        }
        .encode(),
    )
}

/// The handle of `nic`.
pub(crate) fn nic_handle(nic: &NicInner) -> VIP_NIC_HANDLE {
    encode(Kind::Nic, nic, nic.generation, 0)
}

/// The handle of SRQ (`slot`, `generation`) of `nic` (`ffi::srq`'s table).
pub(crate) fn srq_handle(nic: &NicInner, slot: u32, generation: u16) -> VIP_SRQ_HANDLE {
    encode(Kind::Srq, nic, generation, slot)
}

/// The NIC, table slot and generation of SRQ handle `h`.
///
/// # Errors
/// `InvalidParameter` for anything but a live NIC's SRQ handle.
pub(crate) fn srq_decode(h: VIP_SRQ_HANDLE) -> Result<(Arc<NicInner>, u32, u16)> {
    decode(h, Kind::Srq)
}

/// The handle of VI (`slot`, `generation`) of `nic`.
pub(crate) fn vi_handle(nic: &NicInner, slot: u32, generation: u16) -> VIP_VI_HANDLE {
    encode(Kind::Vi, nic, generation, slot)
}

/// The handle of CQ (`slot`, `generation`) of `nic`.
pub(crate) fn cq_handle(nic: &NicInner, slot: u32, generation: u16) -> VIP_CQ_HANDLE {
    encode(Kind::Cq, nic, generation, slot)
}

/// The handle of protection tag `p` of `nic`.
pub(crate) fn ptag_handle(nic: &NicInner, p: Ptag) -> VIP_PROTECTION_HANDLE {
    encode(Kind::Ptag, nic, (p.id() >> 16) as u16, p.id() & SLOT_MASK)
}

/// The handle of pending connection request (`slot`, `generation`) of `nic`.
pub(crate) fn conn_handle(nic: &NicInner, (slot, generation): (u32, u16)) -> VIP_CONN_HANDLE {
    encode(Kind::Conn, nic, generation, slot)
}

/// Decodes `h` as a `kind` handle and finds its NIC; returns the NIC, the
/// object slot and the object generation.
fn decode(h: *mut core::ffi::c_void, kind: Kind) -> Result<(Arc<NicInner>, u32, u16)> {
    let d = Handle::decode(opaque_value(h), kind).ok_or(Error::InvalidParameter)?;
    let (nic_generation, slot) = match kind {
        Kind::Nic if d.index != 0 => return Err(Error::InvalidParameter),
        Kind::Nic => (d.generation, 0),
        _ => ((d.index >> 16) as u16, d.index & SLOT_MASK),
    };
    // The process table of this process only: after fork the child starts
    // a new table, and the parent's handles name nothing in it.
    let p = Process::current()
        .filter(|p| p.pid == crate::sys::getpid())
        .ok_or(Error::InvalidParameter)?;
    let nic = p
        .nic(d.nic as u32, nic_generation)
        .ok_or(Error::InvalidParameter)?;
    if nic.closed.load(Ordering::Acquire) {
        return Err(Error::InvalidParameter);
    }
    Ok((nic, slot, d.generation))
}

/// The open NIC named by `h` (from this thread's recent handles when it
/// can: see [`Recent`]).
///
/// # Errors
/// `InvalidParameter` for NULL, another kind, a closed NIC or a stale handle.
pub(crate) fn nic_from(h: VIP_NIC_HANDLE) -> Result<Arc<NicInner>> {
    let bits = opaque_value(h);
    let pid = crate::sys::getpid();
    // One reference taken (a NIC's entry names it twice, as NIC and object).
    let found = RECENT_NICS.with(|c| c.borrow().hit(bits, pid, |_| true).map(|e| e.nic.clone()));
    if let Some(nic) = found {
        return Ok(nic);
    }
    let (nic, _, _) = decode(h, Kind::Nic)?;
    RECENT_NICS.with(|c| {
        // Busy only while a guard of `last_vi` lives: then uncached.
        if let Ok(mut c) = c.try_borrow_mut() {
            if let Some(i) = c.remember(bits, pid, &nic, &nic) {
                // Entry `i` owns it now.
                last_vi::point_nic(i, bits, &nic);
            }
        }
    });
    Ok(nic)
}

/// The open NIC named by `h`, borrowed from this thread's cells when it
/// can (no reference count change, no thread-local destructor check),
/// else as [`nic_from`] finds it.
///
/// # Errors
/// As [`nic_from`].
#[inline(always)]
pub(crate) fn nic_ref(h: VIP_NIC_HANDLE) -> Result<NicRef> {
    match last_vi::enter_nic(opaque_value(h)) {
        Some(e) => Ok(NicRef::Cell(e)),
        None => nic_from(h).map(NicRef::Held),
    }
}

/// A NIC as [`nic_ref`] found it.
pub(crate) enum NicRef {
    /// Borrowed from this thread's cells.
    Cell(last_vi::EnteredNic),
    /// Held by a reference (a miss of the cells).
    Held(Arc<NicInner>),
}

impl std::ops::Deref for NicRef {
    type Target = NicInner;

    #[inline(always)]
    fn deref(&self) -> &NicInner {
        match self {
            NicRef::Cell(e) => e.nic(),
            NicRef::Held(n) => n,
        }
    }
}

/// An object handle this thread used lately, with what it names.
struct Cached<T> {
    bits: u64,
    pid: i32,
    nic: Arc<NicInner>,
    obj: Arc<T>,
}

/// Handles of one kind a thread used lately (a ping-pong uses one VI, a
/// server a few): the common path of `Vip*` takes no process-wide lock.
/// The same handle bits name the same object for as long as it lives
/// (generations never repeat in a slot before 65,536 reuses), so an entry
/// stands while the object is not destroyed, its NIC not closed, and the
/// process the same (handles do not survive `fork`).
struct Recent<T> {
    entries: [Option<Cached<T>>; RECENT],
    next: usize,
}

const RECENT: usize = last_vi::CELLS;

impl<T> Drop for Recent<T> {
    /// Thread exit: `last_vi`'s cell must not outlive the entries it names.
    fn drop(&mut self) {
        last_vi::forget(None);
    }
}

impl<T> Recent<T> {
    const EMPTY: Recent<T> = Recent {
        entries: [const { None }; RECENT],
        next: 0,
    };

    fn find(
        &self,
        bits: u64,
        pid: i32,
        live: impl Fn(&T) -> bool,
    ) -> Option<(Arc<NicInner>, Arc<T>)> {
        self.entries.iter().flatten().find_map(|e| {
            (e.bits == bits
                && e.pid == pid
                && live(&e.obj)
                && !e.nic.closed.load(Ordering::Acquire))
            .then(|| (e.nic.clone(), e.obj.clone()))
        })
    }

    /// The live entry for `bits`, borrowed (no reference count changes).
    #[inline]
    fn hit(&self, bits: u64, pid: i32, live: impl Fn(&T) -> bool) -> Option<&Cached<T>> {
        self.entries.iter().flatten().find(|e| {
            e.bits == bits && e.pid == pid && live(&e.obj) && !e.nic.closed.load(Ordering::Acquire)
        })
    }

    /// Remembers `obj`, replacing the oldest entry; nothing while a closure
    /// runs on the VI of `last_vi`'s cell (its entry must stay).
    /// Returns the entry's index.
    fn remember(
        &mut self,
        bits: u64,
        pid: i32,
        nic: &Arc<NicInner>,
        obj: &Arc<T>,
    ) -> Option<usize> {
        if last_vi::busy() {
            return None;
        }
        let i = self.next;
        self.next = (i + 1) % RECENT;
        if let Some(old) = &self.entries[i] {
            // The cell may name the VI this entry owns (a cache of VIs).
            last_vi::forget(Some(Arc::as_ptr(&old.obj).cast()));
        }
        self.entries[i] = Some(Cached {
            bits,
            pid,
            nic: nic.clone(),
            obj: obj.clone(),
        });
        Some(i)
    }
}

thread_local! {
    static RECENT_VIS: std::cell::RefCell<Recent<ViCore>> =
        const { std::cell::RefCell::new(Recent::EMPTY) };
    static RECENT_CQS: std::cell::RefCell<Recent<CqCore>> =
        const { std::cell::RefCell::new(Recent::EMPTY) };
    static RECENT_NICS: std::cell::RefCell<Recent<NicInner>> =
        const { std::cell::RefCell::new(Recent::EMPTY) };
}

/// The VI named by `h`, with its NIC (from this thread's recent handles
/// when it can: see [`Recent`]).
///
/// # Errors
/// `InvalidParameter` for NULL, another kind, or a destroyed VI or NIC.
pub(crate) fn vi_from(h: VIP_VI_HANDLE) -> Result<(Arc<NicInner>, Arc<ViCore>)> {
    let bits = opaque_value(h);
    let pid = crate::sys::getpid();
    let live = |v: &ViCore| !v.destroyed.load(Ordering::Acquire);
    let found = RECENT_VIS.with(|c| c.try_borrow().ok()?.find(bits, pid, live));
    if let Some(found) = found {
        return Ok(found);
    }
    let (nic, slot, generation) = decode(h, Kind::Vi)?;
    let vi = nic.vi(slot, generation).ok_or(Error::InvalidParameter)?;
    RECENT_VIS.with(|c| {
        // Busy only while a guard of `last_vi` lives: then this lookup goes uncached.
        if let Ok(mut c) = c.try_borrow_mut() {
            if let Some(i) = c.remember(bits, pid, &nic, &vi) {
                // Entry `i` owns both now.
                last_vi::point(i, bits, &nic, &vi);
            }
        }
    });
    Ok((nic, vi))
}

/// Runs `f` on the VI named by `h` and its NIC, borrowed from this
/// thread's cells (`last_vi`) or, on a miss, held by references (posting:
/// the closure is inlined once, into the export).
///
/// # Errors
/// `InvalidParameter` for NULL, another kind, or a destroyed VI or NIC;
/// else what `f` returns.
#[inline(always)]
pub(crate) fn with_vi<R>(
    h: VIP_VI_HANDLE,
    f: impl FnOnce(&NicInner, &ViCore) -> Result<R>,
) -> Result<R> {
    // `f` has one call site, so it is inlined into the export whatever
    // else the export does; a miss takes references instead.
    let entered = last_vi::enter(opaque_value(h));
    let held;
    let (nic, vi) = match &entered {
        Some(e) => (e.nic(), e.vi()),
        None => {
            held = vi_from(h)?;
            (&*held.0, &*held.1)
        }
    };
    f(nic, vi)
}

/// The handle bits this thread's VI cache holds, in entry order (tests).
#[cfg(test)]
pub(crate) fn cached_vi_bits() -> Vec<Option<u64>> {
    RECENT_VIS.with(|c| {
        c.borrow()
            .entries
            .iter()
            .map(|e| e.as_ref().map(|e| e.bits))
            .collect()
    })
}

/// The CQ named by `h`, with its NIC (from this thread's recent handles
/// when it can).
///
/// # Errors
/// `InvalidParameter` for NULL, another kind, or a destroyed CQ or NIC.
pub(crate) fn cq_from(h: VIP_CQ_HANDLE) -> Result<(Arc<NicInner>, Arc<CqCore>)> {
    let bits = opaque_value(h);
    let pid = crate::sys::getpid();
    let live = |c: &CqCore| !c.destroyed.load(Ordering::Acquire);
    if let Some(found) = RECENT_CQS.with(|c| c.borrow().find(bits, pid, live)) {
        return Ok(found);
    }
    let (nic, slot, generation) = decode(h, Kind::Cq)?;
    let cq = nic.cq(slot, generation).ok_or(Error::InvalidParameter)?;
    RECENT_CQS.with(|c| c.borrow_mut().remember(bits, pid, &nic, &cq));
    Ok((nic, cq))
}

/// The CQ `h` of `nic`, or `None` for a NULL handle (no CQ).
///
/// # Errors
/// `InvalidParameter` for a bad handle or a CQ of another NIC.
pub(crate) fn optional_cq_of(nic: &Arc<NicInner>, h: VIP_CQ_HANDLE) -> Result<Option<Arc<CqCore>>> {
    if h.is_null() {
        return Ok(None);
    }
    let (owner, cq) = cq_from(h)?;
    if !Arc::ptr_eq(&owner, nic) {
        return Err(Error::InvalidParameter);
    }
    Ok(Some(cq))
}

/// The live protection tag `h` of `nic`; `None` for NULL, another kind, a
/// tag of another NIC, or a destroyed tag.
pub(crate) fn ptag_of(nic: &Arc<NicInner>, h: VIP_PROTECTION_HANDLE) -> Option<Ptag> {
    ptag_named_by(nic, h).filter(|&p| nic.ptag_valid(p))
}

/// The tag of `nic` that `h` names, live or not (for callers that check
/// liveness themselves, as `NicInner::register` does).
pub(crate) fn ptag_named_by(nic: &NicInner, h: VIP_PROTECTION_HANDLE) -> Option<Ptag> {
    // A tag of `nic` names it by slot and generation: no process lookup.
    let d = Handle::decode(opaque_value(h), Kind::Ptag)?;
    if d.nic as u32 != nic.slot || (d.index >> 16) as u16 != nic.generation {
        return None;
    }
    let (index, generation) = (d.index & SLOT_MASK, d.generation);
    Some(Ptag(((generation as u32) << 16) | index))
}

/// The pending connection request named by `h`, with its NIC. The request
/// itself is looked up (and consumed) by `conn::accept`/`conn::reject`.
///
/// # Errors
/// `InvalidParameter` for NULL, another kind, or a closed NIC.
pub(crate) fn conn_from(h: VIP_CONN_HANDLE) -> Result<(Arc<NicInner>, (u32, u16))> {
    let (nic, slot, generation) = decode(h, Kind::Conn)?;
    Ok((nic, (slot, generation)))
}
