//! `fork` handling for registered memory.
//!
//! * The arena pages a live registration holds are not in the child (verbs'
//!   `ibv_fork_init` semantics): the prepare handler marks them
//!   `MADV_DONTFORK` and the parent handler clears the mark again, so
//!   registering costs no system call for it.
//! * Every other arena mapping of application memory (deregistered pages,
//!   cached or not) is turned into a private copy in the child, before the
//!   child returns from `fork`, so parent and child share no memory the
//!   application owns; library-owned mappings (shadows, peers' arenas) are
//!   unmapped in the child.
//!
//! The prepare handler takes the fork lock for writing, so no registration
//! is half-way through a move while the address space is copied; the
//! registration path holds it for reading ([`enter`]).
#![forbid(unsafe_code)]

use std::cell::RefCell;
use std::ops::Range;
use std::sync::{Mutex, Once, RwLock, RwLockReadGuard, RwLockWriteGuard, Weak};

use super::arena::{self, Arenas};

static FORK_LOCK: RwLock<()> = RwLock::new(());
static ARENAS: Mutex<Option<Weak<Arenas>>> = Mutex::new(None);
static HOLDERS: Mutex<Vec<Weak<dyn HoldsPages>>> = Mutex::new(Vec::new());

/// Something whose live registrations hold arena pages (a NIC): the fork
/// handler keeps those pages out of the child.
pub trait HoldsPages: Send + Sync {
    /// Appends the page ranges its live registrations hold.
    fn held_pages(&self, out: &mut Vec<Range<usize>>);
}

/// Adds `h` to the holders the fork handler asks (forgotten once dropped).
pub fn add_holder(h: Weak<dyn HoldsPages>) {
    let mut g = HOLDERS.lock().unwrap_or_else(|p| p.into_inner());
    g.retain(|w| w.strong_count() > 0);
    g.push(h);
}

/// What the prepare handler leaves for the parent and child handlers: the
/// fork lock, the parent's pid, the shadow mappings, the pages marked
/// `MADV_DONTFORK`.
type Held = (
    RwLockWriteGuard<'static, ()>,
    i32,
    Vec<Range<usize>>,
    Vec<Range<usize>>,
);

thread_local! {
    static HELD: RefCell<Option<Held>> = const { RefCell::new(None) };
}

/// Held by the registration path while it changes mappings or the
/// registrations that hold pages.
pub fn enter() -> RwLockReadGuard<'static, ()> {
    FORK_LOCK.read().unwrap_or_else(|p| p.into_inner())
}

/// Installs the handlers (once) and makes `arenas` the ones a child
/// converts.
pub fn install(arenas: Weak<Arenas>) {
    *ARENAS.lock().unwrap_or_else(|p| p.into_inner()) = Some(arenas);
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if let Err(e) = crate::sys::atfork(prepare, parent, child) {
            log::warn!("cannot install fork handlers: {e}");
        }
    });
}

extern "C" fn prepare() {
    let g = FORK_LOCK.write().unwrap_or_else(|p| p.into_inner());
    let arenas = ARENAS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .and_then(Weak::upgrade);
    let shadows = arenas.map(|a| a.shadow_ranges()).unwrap_or_default();
    let mut held = Vec::new();
    for h in HOLDERS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter_map(Weak::upgrade)
    {
        h.held_pages(&mut held);
    }
    for r in &held {
        if let Err(e) = crate::sys::madvise(r, libc::MADV_DONTFORK) {
            log::warn!("fork: cannot keep registered pages {r:#x?} out of the child: {e}");
        }
    }
    HELD.with(|h| *h.borrow_mut() = Some((g, crate::sys::getpid(), shadows, held)));
}

extern "C" fn parent() {
    if let Some((_g, _, _, held)) = HELD.with(|h| h.borrow_mut().take()) {
        for r in &held {
            let _ = crate::sys::madvise(r, libc::MADV_DOFORK);
        }
    }
}

extern "C" fn child() {
    // The threads that were inside an unmap did not come along.
    super::unmap_hook::reset_in_child();
    let Some((g, parent_pid, shadows, _)) = HELD.with(|h| h.borrow_mut().take()) else {
        return;
    };
    arena::child_after_fork(parent_pid, &shadows);
    drop(g);
}
