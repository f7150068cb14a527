//! `fork` handling for registered memory.
//!
//! * While a live registration holds arena pages they are `MADV_DONTFORK`:
//!   a child has no mapping there (verbs' `ibv_fork_init` semantics).
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

/// What the prepare handler leaves for the parent and child handlers: the
/// fork lock, the parent's pid, the shadow mappings.
type Held = (RwLockWriteGuard<'static, ()>, i32, Vec<Range<usize>>);

thread_local! {
    static HELD: RefCell<Option<Held>> = const { RefCell::new(None) };
}

/// Held by the registration path while it changes mappings.
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
    let shadows = ARENAS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .and_then(Weak::upgrade)
        .map(|a| a.shadow_ranges())
        .unwrap_or_default();
    HELD.with(|h| *h.borrow_mut() = Some((g, crate::sys::getpid(), shadows)));
}

extern "C" fn parent() {
    HELD.with(|h| h.borrow_mut().take());
}

extern "C" fn child() {
    let Some((g, parent_pid, shadows)) = HELD.with(|h| h.borrow_mut().take()) else {
        return;
    };
    arena::child_after_fork(parent_pid, &shadows);
    drop(g);
}
