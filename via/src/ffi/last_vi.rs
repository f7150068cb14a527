//! The VIs (and NICs) this thread used lately, found without a lock, a
//! reference count change or a thread-local destructor check: the first
//! look of `handles::with_vi` (posting and polling) and of
//! `handles::nic_ref` (registering around every message).
//!
//! One cell per entry of this thread's cache of VI handles
//! (`handles::Recent`, which owns an `Arc` of each VI and NIC, and so needs
//! a destructor and a borrow flag): the handle bits and plain pointers to
//! the VI and its NIC. Thread-local storage without a destructor costs one
//! address computation; the closure inside it only finds the cell, so that
//! the caller's work runs outside it (inlined, no result moved through
//! memory).
//!
//! Why the pointers are valid whenever a cell holds them (the argument for
//! the one `unsafe` block below):
//! - [`point`] is called only with a VI and NIC that an entry of this
//!   thread's handle cache owns (an `Arc` of each).
//! - The cache never drops an entry that a cell names without first
//!   calling [`forget`]: it replaces entries only in `Recent::remember`,
//!   which forgets the one it replaces, and its destructor (thread exit)
//!   forgets everything.
//! - While a closure runs on a cell's VI ([`with`]), the cache replaces no
//!   entry at all ([`busy`]): a nested lookup of another handle inside the
//!   closure cannot drop what the closure uses.
//! - Only this thread reads or writes the cells. After `fork` the child's
//!   copy would name copied memory: a fork handler (installed with the
//!   first cell) empties the cells of the forking thread, the only thread
//!   of the child, so no cell needs a process id.

use std::cell::Cell;
use std::sync::atomic::Ordering;

use crate::nic::NicInner;
use crate::vi::ViCore;

#[derive(Clone, Copy)]
struct Last {
    bits: u64,
    nic: *const NicInner,
    vi: *const ViCore,
}

const NONE: Last = Last {
    bits: 0,
    nic: std::ptr::null(),
    vi: std::ptr::null(),
};

/// Cells: as many as the cache has entries.
pub(crate) const CELLS: usize = 4;

/// A cell naming a NIC (as `Last` names a VI with its NIC).
#[derive(Clone, Copy)]
struct LastNic {
    bits: u64,
    nic: *const NicInner,
}

const NO_NIC: LastNic = LastNic {
    bits: 0,
    nic: std::ptr::null(),
};

struct Fast {
    cells: [Cell<Last>; CELLS],
    /// NIC handles (`VipRegisterMem` and `VipDeregisterMem` around every
    /// message), one cell per entry of the thread's cache of NIC handles,
    /// under the same rules as the VI cells.
    nics: [Cell<LastNic>; CELLS],
    /// Closures running on a cell's VI (nested calls count each).
    busy: Cell<u32>,
}

thread_local! {
    static FAST: Fast = const {
        Fast {
            cells: [const { Cell::new(NONE) }; CELLS],
            nics: [const { Cell::new(NO_NIC) }; CELLS],
            busy: Cell::new(0),
        }
    };
}

/// This thread's count of guards alive ([`busy`]), raised while a `Busy`
/// lives. Not `Send`: it stays on the thread whose count it raised.
struct Busy(*const Fast);

impl Busy {
    #[inline(always)]
    fn raise(fast: &Fast) -> Busy {
        fast.busy.set(fast.busy.get() + 1);
        Busy(fast)
    }
}

impl Drop for Busy {
    #[inline(always)]
    fn drop(&mut self) {
        // SAFETY: `self.0` is this thread's storage (a `Busy` never leaves
        // its thread: a raw pointer makes it neither `Send` nor `Sync`),
        // alive as long as the thread.
        let busy = unsafe { &(*self.0).busy };
        busy.set(busy.get() - 1);
    }
}

/// The cell of `cells` (this thread's VI or NIC cells) that `hit` picks,
/// with this thread's storage.
#[inline(always)]
fn find<C: Copy>(
    cells: impl Fn(&Fast) -> &[Cell<C>; CELLS],
    hit: impl Fn(&C) -> bool,
) -> Option<(*const Fast, C)> {
    FAST.with(|fast| {
        let c = cells(fast).iter().map(Cell::get).find(|c| hit(c))?;
        Some((std::ptr::from_ref(fast), c))
    })
}

/// The VI of handle `bits` and its NIC, borrowed from a cell, while the
/// [`Entered`] lives: the cache replaces no entry meanwhile ([`busy`]).
pub(crate) struct Entered {
    _busy: Busy,
    nic: *const NicInner,
    vi: *const ViCore,
}

impl Entered {
    /// The NIC.
    #[inline(always)]
    pub fn nic(&self) -> &NicInner {
        // SAFETY: a cell named it when `enter` made `self`, so an entry of
        // this thread's handle cache owns it; `busy` (raised by `enter`,
        // lowered only when `self` drops) keeps that entry in place, and
        // the reference lives no longer than `self`.
        unsafe { &*self.nic }
    }

    /// The VI.
    #[inline(always)]
    pub fn vi(&self) -> &ViCore {
        // SAFETY: as in `nic`.
        unsafe { &*self.vi }
    }
}

/// The VI of handle `bits` if a cell names it, it is not destroyed and its
/// NIC not closed. Returned as a guard rather than run as a closure, so
/// that the caller's work is straight-line code in the export on every
/// build (one call site, nothing for the inliner to decide).
#[inline(always)]
pub(crate) fn enter(bits: u64) -> Option<Entered> {
    let (fast, last) = find(|f| &f.cells, |c| c.bits == bits && !c.vi.is_null())?;
    // SAFETY: `fast` is this thread's storage, alive as long as the thread
    // (and this call runs on it). A non-null cell names a VI and a NIC that
    // an entry of this thread's handle cache keeps alive until the cell is
    // forgotten (the module doc).
    let (fast_ref, nic, vi) = unsafe { (&*fast, &*last.nic, &*last.vi) };
    // Acquire: pairs with the Release stores of `VipDestroyVi` and
    // `VipCloseNic`, as the cache's own check (`handles::Recent::hit`).
    if vi.destroyed.load(Ordering::Acquire) || nic.closed.load(Ordering::Acquire) {
        return None;
    }
    Some(Entered {
        _busy: Busy::raise(fast_ref),
        nic: last.nic,
        vi: last.vi,
    })
}

/// The NIC of handle `bits`, borrowed from a cell while the guard lives
/// (as [`Entered`]).
pub(crate) struct EnteredNic {
    _busy: Busy,
    nic: *const NicInner,
}

impl EnteredNic {
    /// The NIC.
    #[inline(always)]
    pub fn nic(&self) -> &NicInner {
        // SAFETY: as in `Entered::nic`: a cell named it when `enter_nic`
        // made `self`, and `busy` keeps the cache entry that owns it.
        unsafe { &*self.nic }
    }
}

/// The NIC of handle `bits` if a cell names it and it is not closed.
#[inline(always)]
pub(crate) fn enter_nic(bits: u64) -> Option<EnteredNic> {
    let (fast, last) = find(|f| &f.nics, |c| c.bits == bits && !c.nic.is_null())?;
    // SAFETY: as in `enter`: this thread's storage, and a NIC that an entry
    // of this thread's handle cache keeps alive until the cell is
    // forgotten.
    let (fast_ref, nic) = unsafe { (&*fast, &*last.nic) };
    // Acquire: pairs with the Release store of `VipCloseNic`.
    if nic.closed.load(Ordering::Acquire) {
        return None;
    }
    Some(EnteredNic {
        _busy: Busy::raise(fast_ref),
        nic: last.nic,
    })
}

/// Points NIC cell `i` at `nic`, which entry `i` of this thread's cache of
/// NIC handles owns (handle `bits`, made in this process).
pub(crate) fn point_nic(i: usize, bits: u64, nic: &NicInner) {
    install_fork_handler();
    FAST.with(|fast| fast.nics[i % CELLS].set(LastNic { bits, nic }));
}

/// Runs `f` on the VI of handle `bits` if a cell names it (see [`enter`]);
/// else gives `f` back.
#[cfg(test)]
pub(crate) fn with<R, F: FnOnce(&NicInner, &ViCore) -> R>(bits: u64, f: F) -> Result<R, F> {
    match enter(bits) {
        Some(e) => Ok(f(e.nic(), e.vi())),
        None => Err(f),
    }
}

/// Points cell `i` at `vi` and `nic`, which entry `i` of this thread's
/// cache of VI handles owns (handle `bits`, made in this process).
pub(crate) fn point(i: usize, bits: u64, nic: &NicInner, vi: &ViCore) {
    install_fork_handler();
    FAST.with(|fast| fast.cells[i % CELLS].set(Last { bits, nic, vi }));
}

/// The fork handler that empties the cells in the child (installed with
/// the first cell).
fn install_fork_handler() {
    static FORK_HANDLER: std::sync::Once = std::sync::Once::new();
    FORK_HANDLER.call_once(|| {
        unsafe extern "C" fn keep() {}
        unsafe extern "C" fn child() {
            forget(None);
        }
        if let Err(e) = crate::sys::atfork(keep, keep, child) {
            log::warn!("cannot install the fork handler of the VI cells: {e}");
        }
    });
}

/// Forgets the cells that name the object at `addr` (`None`: all), before
/// the cache drops the entry that owns it: a VI cell naming it as its VI,
/// a NIC cell naming it as its NIC. (A live object of another kind never
/// has the address of an object a cell names; a VI cell's NIC is owned by
/// the VI's entry, so dropping a NIC entry leaves it alone.)
pub(crate) fn forget(addr: Option<*const ()>) {
    // `try_with` for form's sake: storage without a destructor stays
    // readable while the thread's destructors run.
    let _ = FAST.try_with(|fast| {
        for c in &fast.cells {
            if addr.is_none_or(|a| std::ptr::eq(c.get().vi.cast(), a)) {
                c.set(NONE);
            }
        }
        for c in &fast.nics {
            if addr.is_none_or(|a| std::ptr::eq(c.get().nic.cast(), a)) {
                c.set(NO_NIC);
            }
        }
    });
}

/// Whether a closure runs on a cell's VI (the cache must not replace
/// entries then).
pub(crate) fn busy() -> bool {
    FAST.try_with(|fast| fast.busy.get() != 0).unwrap_or(false)
}
