//! [`BiasedLock<T>`]: a [`Lock`] that, once one thread has taken it many
//! times in a row, is *biased* to that thread, which then enters and leaves
//! it with plain loads and stores: no atomic read-modify-write, no fence.
//!
//! Why: on x86 every locked instruction waits until the stores before it
//! have reached the cache. A VIA program posts a receive (its stores go to
//! lines the peer wrote last) and then a send; with a futex lock around
//! each queue, the send cannot start until those lines have come over. A
//! VI is nearly always used by one thread, so that thread should not pay.
//!
//! How (an asymmetric Dekker handshake, as in biased locking and in
//! `membarrier(2)`'s own documentation):
//! - The holder of the bias writes its grant's `busy` word (1), then,
//!   after a *compiler* fence only, checks that the bias still names the
//!   grant; leaving, it writes `busy` back to 0.
//! - Any other thread takes the inner [`Lock`]. If the lock is biased, it
//!   revokes: it marks the bias as revoking, calls
//!   `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`, which runs a full
//!   barrier on every running thread of the process, and waits until the
//!   grant's `busy` reads 0. Either the holder's `busy = 1` was visible to
//!   it after the barrier, or the holder's check after its store sees the
//!   revocation (the barrier stands in for the fence the holder left out).
//! - Each grant has its own `busy` word, used for that grant only. A holder
//!   that read the bias just before it was revoked may still write its old
//!   grant's word after the revocation finished; nobody waits on that word
//!   any more, so a later holder's word is never overwritten.
//!
//! Grants are few ([`GRANTS`] per lock): the first after [`FIRST_STREAK`]
//! acquisitions in a row by one thread, each later one after twice the
//! streak of the one before. A lock that used them all is a plain futex
//! lock from then on: threads that keep taking turns pay a system call per
//! revocation, so they stop being offered the bias.
//!
//! Where `membarrier` is unavailable (old kernels, system-call filters),
//! no bias is ever granted. Re-entry by the holder finds its grant busy and
//! takes the slow path: `try_lock` fails there, as a futex lock's does, and
//! `lock` panics instead of deadlocking.
//!
//! Orderings: the holder leaves with a Release store of `busy`; a revoker
//! reads it with Acquire, and so sees what the holder wrote. Everything
//! else goes through the inner lock: a thread is granted the bias while it
//! holds the inner lock, so it has seen what earlier holders wrote, and
//! after a revocation the former holder takes the inner lock too.

use core::cell::UnsafeCell;
use core::marker::PhantomData;
use core::ops::{Deref, DerefMut};
use core::sync::atomic::{AtomicU32, AtomicUsize, Ordering, compiler_fence};

use crate::lock::Lock;

/// Grants of the bias in a lock's lifetime.
pub const GRANTS: usize = 4;
/// Acquisitions in a row by one thread before the first grant.
pub const FIRST_STREAK: u32 = 16;

/// `bias`: no grant.
const UNBIASED: usize = 0;
/// `bias` bit: the grant in the low bits is being revoked.
const REVOKING: usize = 32;
/// `bias` bits naming the grant.
const GRANT_BITS: usize = GRANTS - 1;
/// Low bits of a token that must be clear (tokens are 64-byte aligned).
const TOKEN_LOW: usize = 63;
/// `BiasedGuard::grant` of a guard that holds the inner lock.
const SLOW: usize = usize::MAX;

/// Who took the inner lock lately (under the inner lock).
struct Streak {
    last: usize,
    count: u32,
    needed: u32,
    granted: u32,
}

/// A mutual-exclusion lock around a `T`, biased to the thread that uses it.
pub struct BiasedLock<T> {
    /// `UNBIASED`; `token | i`: grant `i` of the thread `token` holds the
    /// bias; `token | REVOKING | i`: it is being revoked. Written only
    /// under `inner`.
    bias: AtomicUsize,
    /// Per grant: 1 while its thread is inside through the fast path;
    /// written only by that thread.
    busy: [AtomicU32; GRANTS],
    inner: Lock<Streak>,
    value: UnsafeCell<T>,
}

// SAFETY: as for `Lock`: one thread at a time gets access to `value` (a
// fast-path holder excludes every inner-lock holder through the handshake in
// the module doc), so sharing the lock moves `T` between threads.
unsafe impl<T: Send> Sync for BiasedLock<T> {}
// SAFETY: owning the lock is owning the `T`.
unsafe impl<T: Send> Send for BiasedLock<T> {}

impl<T: Default> Default for BiasedLock<T> {
    fn default() -> Self {
        Self::new(T::default())
    }
}

/// Access to the value of a held [`BiasedLock`]; releases it when dropped.
#[must_use = "the lock is released at once if the guard is not kept"]
pub struct BiasedGuard<'a, T> {
    lock: &'a BiasedLock<T>,
    /// The grant entered through (fast path), or `SLOW`: the inner lock is
    /// held (its guard forgotten, released in `drop`).
    grant: usize,
    /// As in `LockGuard`: `Send`/`Sync` only as `&mut T` would be.
    _access: PhantomData<&'a mut T>,
}

/// Whether [`token`] is never 0 here (so the fast path need not check).
const HAS_TOKEN: bool = cfg!(all(target_arch = "x86_64", target_os = "linux"));

/// This thread's token: an address unique among live threads, 64-byte
/// aligned (x86-64 Linux: the thread pointer, one instruction); 0 where
/// none is cheap, which disables the bias.
#[inline(always)]
fn token() -> usize {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        let t: usize;
        // SAFETY: on x86-64 Linux, `fs:0` holds the thread control block's
        // pointer to itself (the TLS ABI), readable by any code of the
        // thread; the asm only reads it. Not `pure`: the value depends on
        // the thread, so the compiler must not reuse one read for another.
        unsafe {
            core::arch::asm!("mov {t}, fs:[0]", t = out(reg) t,
                options(nostack, preserves_flags, readonly));
        }
        t
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    {
        0
    }
}

impl<T> BiasedLock<T> {
    /// A free, unbiased lock around `value`.
    pub const fn new(value: T) -> Self {
        BiasedLock {
            bias: AtomicUsize::new(UNBIASED),
            busy: [const { AtomicU32::new(0) }; GRANTS],
            inner: Lock::new(Streak {
                last: 0,
                count: 0,
                needed: FIRST_STREAK,
                granted: 0,
            }),
            value: UnsafeCell::new(value),
        }
    }

    /// Takes the lock, waiting for it if another thread holds it.
    ///
    /// # Panics
    /// If this thread holds it already through its bias (a futex lock
    /// would deadlock there).
    #[inline]
    pub fn lock(&self) -> BiasedGuard<'_, T> {
        let t = token();
        let grant = match self.enter_biased(t) {
            Some(i) => i,
            None => self.lock_slow(t),
        };
        self.guard(grant)
    }

    /// Takes the lock if no other thread holds it (and this one does not
    /// hold it already).
    #[inline]
    pub fn try_lock(&self) -> Option<BiasedGuard<'_, T>> {
        let t = token();
        let grant = match self.enter_biased(t) {
            Some(i) => i,
            None => self.try_lock_slow(t)?,
        };
        Some(self.guard(grant))
    }

    /// Whether the lock is biased now (diagnostics and tests).
    pub fn is_biased(&self) -> bool {
        // Relaxed: a snapshot.
        let b = self.bias.load(Ordering::Relaxed);
        b != UNBIASED && b & REVOKING == 0
    }

    /// The value, through exclusive access to the lock.
    pub fn get_mut(&mut self) -> &mut T {
        self.value.get_mut()
    }

    #[inline(always)]
    fn guard(&self, grant: usize) -> BiasedGuard<'_, T> {
        BiasedGuard {
            lock: self,
            grant,
            _access: PhantomData,
        }
    }

    /// The fast path: the grant's index if this thread holds the bias and
    /// is now inside.
    #[inline(always)]
    fn enter_biased(&self, t: usize) -> Option<usize> {
        // Relaxed: the bias names this thread only if this thread stored
        // it; a revocation is seen in time through the handshake. One
        // comparison: this thread's token with a grant and no REVOKING bit.
        let b = self.bias.load(Ordering::Relaxed);
        if (b ^ t) > GRANT_BITS || (!HAS_TOKEN && t == 0) {
            return None;
        }
        let busy = &self.busy[b & GRANT_BITS];
        // Relaxed: written only by this thread (nonzero: re-entry).
        if busy.load(Ordering::Relaxed) != 0 {
            return None;
        }
        busy.store(1, Ordering::Relaxed);
        // The light side of the handshake: the revoker's membarrier is the
        // processor fence between the store above and the load below.
        compiler_fence(Ordering::SeqCst);
        if self.bias.load(Ordering::Relaxed) == b {
            return Some(b & GRANT_BITS);
        }
        // Revoked meanwhile. Release: nothing was touched, but a revoker
        // reading 0 with Acquire may go on at once.
        busy.store(0, Ordering::Release);
        None
    }

    #[cold]
    fn lock_slow(&self, t: usize) -> usize {
        let mut g = self.inner.lock();
        // Relaxed: `bias` is written only under `inner`, which we hold.
        let b = self.bias.load(Ordering::Relaxed);
        if b != UNBIASED {
            assert!(
                (b ^ t) > GRANT_BITS,
                "BiasedLock taken again by the thread that holds it"
            );
            if b & REVOKING == 0 {
                self.revoke(&mut g, b);
            }
            self.wait_out(b & GRANT_BITS);
            self.bias.store(UNBIASED, Ordering::Relaxed);
        }
        self.note(&mut g, t);
        core::mem::forget(g);
        SLOW
    }

    #[cold]
    fn try_lock_slow(&self, t: usize) -> Option<usize> {
        let mut g = self.inner.try_lock()?;
        // Relaxed: as in `lock_slow`.
        let b = self.bias.load(Ordering::Relaxed);
        if b != UNBIASED {
            if (b ^ t) <= GRANT_BITS {
                // This thread is inside already.
                return None;
            }
            if b & REVOKING == 0 {
                self.revoke(&mut g, b);
            }
            // Never waits: the holder may be waiting for something we
            // hold. Acquire: pairs with the holder's Release of `busy`.
            if self.busy[b & GRANT_BITS].load(Ordering::Acquire) != 0 {
                return None;
            }
            self.bias.store(UNBIASED, Ordering::Relaxed);
        }
        self.note(&mut g, t);
        core::mem::forget(g);
        Some(SLOW)
    }

    /// Takes the bias from the grant in `b` (the caller holds `inner`).
    /// The holder may still be inside: see [`BiasedLock::wait_out`].
    fn revoke(&self, s: &mut Streak, b: usize) {
        self.bias.store(b | REVOKING, Ordering::Relaxed);
        // The heavy side of the handshake (module doc).
        crate::sys::membarrier();
        s.needed = s.needed.saturating_mul(2);
        s.count = 0;
        log::trace!("bias of grant {} revoked", b & GRANT_BITS);
    }

    /// Waits until grant `i`'s holder has left.
    fn wait_out(&self, i: usize) {
        let mut n = 0u32;
        // Acquire: pairs with the holder's Release of `busy`, so what it
        // wrote inside is seen here.
        while self.busy[i].load(Ordering::Acquire) != 0 {
            n += 1;
            if n < 100 {
                core::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Counts an inner-lock acquisition by `t`, and grants the bias after
    /// a long enough streak.
    fn note(&self, s: &mut Streak, t: usize) {
        if t == 0 || t & TOKEN_LOW != 0 {
            return;
        }
        if s.last == t {
            s.count += 1;
        } else {
            s.last = t;
            s.count = 1;
        }
        if s.count < s.needed || s.granted as usize >= GRANTS || !crate::sys::membarrier_ready() {
            return;
        }
        let i = s.granted as usize;
        s.granted += 1;
        s.count = 0;
        // Relaxed: read by `t` itself, or by inner-lock holders.
        self.bias.store(t | i, Ordering::Relaxed);
        log::trace!("bias granted ({i})");
    }

    #[cold]
    fn unlock_slow(&self) {
        // SAFETY: `lock_slow`/`try_lock_slow` forgot the inner guard of
        // the guard being dropped, which releases it once, here.
        unsafe { self.inner.release_held() }
    }
}

impl<T> Drop for BiasedGuard<'_, T> {
    #[inline(always)]
    fn drop(&mut self) {
        match self.lock.busy.get(self.grant) {
            // Release: pairs with a revoker's Acquire in `wait_out`.
            Some(busy) => busy.store(0, Ordering::Release),
            None => self.lock.unlock_slow(),
        }
    }
}

impl<T> Deref for BiasedGuard<'_, T> {
    type Target = T;

    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the guard exists only while its thread holds the lock,
        // through the bias or the inner lock (module doc), so no other
        // reference to the value exists.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for BiasedGuard<'_, T> {
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
    fn one_thread_gets_the_bias_and_keeps_the_value() {
        let l = BiasedLock::new(0u64);
        for _ in 0..FIRST_STREAK + 10 {
            *l.lock() += 1;
        }
        assert_eq!(*l.lock(), (FIRST_STREAK + 10) as u64);
        if crate::sys::membarrier_ready() {
            assert!(l.is_biased(), "biased after {FIRST_STREAK} acquisitions");
        } else {
            eprintln!("SKIPPED (part): membarrier unavailable here, no bias is granted");
        }
    }

    #[test]
    fn try_lock_fails_inside_and_a_panic_releases() {
        let l = BiasedLock::new(1);
        for _ in 0..FIRST_STREAK + 1 {
            drop(l.lock());
        }
        let g = l.lock();
        assert!(l.try_lock().is_none(), "re-entry through try_lock fails");
        drop(g);
        assert!(l.try_lock().is_some());
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _g = l.lock();
            panic!("inside");
        }));
        assert!(r.is_err());
        assert!(l.try_lock().is_some(), "the unwinding guard released it");
    }

    #[test]
    fn another_thread_revokes_and_excludes() {
        // One thread is biased, then four threads (the holder among them)
        // increment a plain counter under the lock; a lost update (two
        // threads inside at once) shows in the total.
        let l = Arc::new(BiasedLock::new(0u64));
        for _ in 0..FIRST_STREAK + 1 {
            *l.lock() += 1;
        }
        let start = *l.lock();
        if crate::sys::membarrier_ready() {
            assert!(l.is_biased());
        }
        let threads: Vec<_> = (0..4)
            .map(|k| {
                let l = l.clone();
                std::thread::spawn(move || {
                    for n in 0..50_000u32 {
                        let mut g = if (n + k) % 3 == 0 {
                            match l.try_lock() {
                                Some(g) => g,
                                None => l.lock(),
                            }
                        } else {
                            l.lock()
                        };
                        let v = *g;
                        std::hint::black_box(&v);
                        *g = v + 1;
                    }
                })
            })
            .collect();
        for _ in 0..50_000 {
            let mut g = l.lock();
            let v = *g;
            std::hint::black_box(&v);
            *g = v + 1;
        }
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*l.lock(), start + 250_000);
    }

    #[test]
    fn a_revoker_waits_for_the_holder_inside() {
        use std::sync::atomic::AtomicBool;
        if !crate::sys::membarrier_ready() {
            eprintln!("SKIPPED: membarrier unavailable here, no bias is granted");
            return;
        }
        let l = Arc::new(BiasedLock::new(0u64));
        for _ in 0..FIRST_STREAK + 1 {
            drop(l.lock());
        }
        assert!(l.is_biased());
        let revoker_in = Arc::new(AtomicBool::new(false));
        let g = l.lock();
        let biased = l.bias.load(Ordering::Relaxed);
        let t = {
            let (l, revoker_in) = (l.clone(), revoker_in.clone());
            std::thread::spawn(move || {
                let mut g = l.lock();
                revoker_in.store(true, Ordering::SeqCst);
                *g += 1;
            })
        };
        // Inside through the bias: wait until the other thread has begun
        // the revocation, then look for it inside for a while.
        while l.bias.load(Ordering::Relaxed) == biased {
            std::hint::spin_loop();
        }
        for _ in 0..200_000 {
            assert!(!revoker_in.load(Ordering::SeqCst), "two threads inside");
            std::hint::spin_loop();
        }
        drop(g);
        t.join().unwrap();
        assert_eq!(*l.lock(), 1);
        assert!(!l.is_biased());
    }

    #[test]
    fn grants_run_out_under_contention() {
        // Threads taking turns: each revocation doubles the streak needed,
        // and after GRANTS grants the lock stays unbiased.
        let l = Arc::new(BiasedLock::new(0u64));
        for round in 0..64u32 {
            let l2 = l.clone();
            let n = FIRST_STREAK << (round % 12).min(8);
            std::thread::spawn(move || {
                for _ in 0..n {
                    *l2.lock() += 1;
                }
            })
            .join()
            .unwrap();
        }
        let s = l.inner.lock();
        assert!(s.granted as usize <= GRANTS);
        drop(s);
    }
}
