//! [`Lock<T>`]: a mutual-exclusion lock for the provider's per-call paths
//! (a VI's work queues, the soft NIC's engine state), cheaper than
//! `std::sync::Mutex` where every `Vip*` call takes one.
//!
//! The same futex protocol as std's (Drepper's "Futexes are tricky",
//! mutex 2): the word is 0 (free), 1 (held) or 2 (held, a thread may
//! sleep). Taking a free lock is one compare-and-swap, releasing it one
//! swap. What it leaves out is poisoning: std checks the global panic
//! count twice and a poison flag once per lock pair, and a poisoned queue
//! would fail every later call anyway. A panic inside the critical section
//! (the C boundary turns it into `VIP_ERROR_RESOURCE`) just releases the
//! lock as the guard unwinds.
//!
//! Orderings: the Acquire of the taking CAS (or swap) pairs with the
//! Release swap of the previous holder's release, so each holder sees
//! everything its predecessor wrote under the lock. The sleeping side is
//! the futex's: `futex_wait(2)` sleeps only while the word still holds 2,
//! and a releaser that swapped out a 2 wakes one sleeper, which then swaps
//! in 2 again (it cannot know whether others sleep).

use core::cell::UnsafeCell;
use core::marker::PhantomData;
use core::ops::{Deref, DerefMut};
use core::sync::atomic::{AtomicU32, Ordering};

const FREE: u32 = 0;
const HELD: u32 = 1;
const CONTENDED: u32 = 2;

/// A mutual-exclusion lock around a `T`, without poisoning.
#[derive(Default)]
pub struct Lock<T> {
    state: AtomicU32,
    value: UnsafeCell<T>,
}

// SAFETY: the lock hands out access to `value` to one thread at a time (the
// guard exists only while the state word is held by its creator), so
// sharing the lock between threads moves `T` between them: `T: Send`
// suffices, as for `std::sync::Mutex`.
unsafe impl<T: Send> Sync for Lock<T> {}
// SAFETY: owning the lock is owning the `T`.
unsafe impl<T: Send> Send for Lock<T> {}

/// Access to the value of a held [`Lock`]; releases it when dropped.
#[must_use = "the lock is released at once if the guard is not kept"]
pub struct LockGuard<'a, T> {
    lock: &'a Lock<T>,
    /// Makes the guard `Sync` only if `T` is (a shared guard hands out
    /// `&T`), and `Send` only if `T` is, as `&mut T` would be: without it
    /// the guard would be `Sync` whenever the lock is, i.e. for any
    /// `T: Send`.
    _access: PhantomData<&'a mut T>,
}

impl<T> Lock<T> {
    /// A free lock around `value`.
    pub const fn new(value: T) -> Self {
        Lock {
            state: AtomicU32::new(FREE),
            value: UnsafeCell::new(value),
        }
    }

    /// Takes the lock, waiting for it if another thread holds it.
    #[inline]
    pub fn lock(&self) -> LockGuard<'_, T> {
        // Acquire: pairs with the Release swap of the previous release.
        if self
            .state
            .compare_exchange(FREE, HELD, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.lock_contended();
        }
        LockGuard {
            lock: self,
            _access: PhantomData,
        }
    }

    /// Takes the lock if it is free.
    #[inline]
    pub fn try_lock(&self) -> Option<LockGuard<'_, T>> {
        // Acquire: as in `lock`.
        self.state
            .compare_exchange(FREE, HELD, Ordering::Acquire, Ordering::Relaxed)
            .ok()
            .map(|_| LockGuard {
                lock: self,
                _access: PhantomData,
            })
    }

    #[cold]
    fn lock_contended(&self) {
        // Spin a little while the holder is running (critical sections here
        // are short), without writing the line.
        for _ in 0..100 {
            let s = self.state.load(Ordering::Relaxed);
            if s == CONTENDED {
                break;
            }
            // Acquire: as in `lock`.
            if s == FREE
                && self
                    .state
                    .compare_exchange(FREE, HELD, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return;
            }
            core::hint::spin_loop();
        }
        // Acquire: as in `lock`. Swapping in CONTENDED (not HELD) makes the
        // release wake a sleeper, since we cannot tell whether others sleep.
        while self.state.swap(CONTENDED, Ordering::Acquire) != FREE {
            let _ = crate::sys::futex_wait(&self.state, CONTENDED, None);
        }
    }

    /// The value, through exclusive access to the lock.
    pub fn get_mut(&mut self) -> &mut T {
        self.value.get_mut()
    }
}

impl<T> Drop for LockGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        // SAFETY: this guard holds the lock and is dropped once.
        unsafe { self.lock.release_held() }
    }
}

impl<T> Lock<T> {
    /// Releases the lock held through a guard: the guard's drop, or a
    /// guard that was forgotten (`mem::forget`, as `BiasedLock` does).
    ///
    /// # Safety
    /// The caller holds the lock through a guard (dropped or forgotten)
    /// and releases it once.
    #[inline]
    pub(crate) unsafe fn release_held(&self) {
        // Release: pairs with the Acquire of the next taker.
        if self.state.swap(FREE, Ordering::Release) == CONTENDED {
            self.wake_one();
        }
    }

    #[cold]
    fn wake_one(&self) {
        crate::sys::futex_wake(&self.state, 1);
    }
}

impl<T> Deref for LockGuard<'_, T> {
    type Target = T;

    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the guard exists only while its creator holds the lock,
        // so no other reference to the value exists (module doc).
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for LockGuard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`; `&mut self` makes this the only access
        // through the guard.
        unsafe { &mut *self.lock.value.get() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn excludes_across_threads() {
        // Four threads increment a plain counter under the lock; a lost
        // update (no exclusion) shows in the total.
        let l = Arc::new(Lock::new(0u64));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let l = l.clone();
                std::thread::spawn(move || {
                    for _ in 0..100_000 {
                        let mut g = l.lock();
                        let v = *g;
                        std::hint::black_box(&v);
                        *g = v + 1;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*l.lock(), 400_000);
    }

    #[test]
    fn try_lock_fails_while_held_and_a_panic_releases() {
        let l = Lock::new(1);
        let g = l.lock();
        assert!(l.try_lock().is_none());
        drop(g);
        assert!(l.try_lock().is_some());
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _g = l.lock();
            panic!("inside");
        }));
        assert!(r.is_err());
        assert_eq!(*l.try_lock().expect("released by the unwind"), 1);
    }

    #[test]
    fn a_sleeper_is_woken() {
        // The holder keeps the lock until the other thread has had time to
        // spin out and sleep; the release must wake it.
        let l = Arc::new(Lock::new(()));
        let g = l.lock();
        let (tx, rx) = std::sync::mpsc::channel();
        let t = {
            let l = l.clone();
            std::thread::spawn(move || {
                tx.send(()).unwrap();
                drop(l.lock());
            })
        };
        rx.recv().unwrap();
        // Wait until the waiter marked the lock contended (it sleeps then).
        while l.state.load(Ordering::Relaxed) != CONTENDED {
            std::thread::yield_now();
        }
        drop(g);
        t.join().unwrap();
    }
}
