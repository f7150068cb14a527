//! Asymmetric fences: the two sides of a Dekker handshake where one side runs
//! on every message and the other almost never.
//!
//! A Dekker handshake (each side stores its flag, then loads the other's) needs
//! a StoreLoad barrier on both sides. On x86 that is a locked instruction or
//! `mfence`, and it waits until every earlier store of the core has reached the
//! cache. On the send path those stores are the peer's lines (its receive
//! descriptor, its status word), each a cache-line transfer away, so the
//! sender's fence after a completion waits for both transfers before the
//! sender can go on to its own receive.
//!
//! Here the frequent side ([`light_fence`]: a completion's wake-up check, the
//! engine lock's re-check after a release) compiles to no instruction, and the
//! rare side ([`heavy_fence`]: a thread about to sleep, a poster that found the
//! engine lock taken, a Notify being armed) runs
//! `membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED)`, which makes every running
//! thread of every registered process execute a full barrier before it
//! returns. Either the light side's store is visible to the heavy side's load,
//! or the barrier lands before the light side's load, which then sees the heavy
//! side's store (the argument of liburcu's membarrier flavour and Folly's
//! `asymmetricHeavyBarrier`).
//!
//! **When the light side is light.** Only in a process registered for global
//! expedited barriers, which [`register`] does (it may wait for an RCU grace
//! period). Before that, and where the kernel or a seccomp filter refuses, or
//! after [`disable`], it is a SeqCst fence, which pairs with any heavy side.
//! The registration belongs to the address space: a forked child keeps it on
//! the kernels checked (6.x), and a fork handler registers the child again
//! anyway; `exec` drops it along with this module's state.
//!
//! **When the heavy side covers.** [`heavy_fence`] returns false when its
//! barrier failed (a kernel without the command, a filter in this process).
//! Some other process's light side may then be a compiler fence that nothing
//! covers, and the caller must not rely on the handshake alone: a sleeper caps
//! its sleep and looks again (`EventCount::wait`).
//!
//! Cost of the heavy side: a system call, about 0.14 µs when no other CPU runs
//! a registered process; with one, an inter-processor interrupt to it (9 µs
//! measured in this project's 2-core VM, about 1–2 µs on bare metal). It runs
//! only where the caller is about to sleep or has already lost a race, and an
//! event count runs it once per arming, not per sleep (`eventcount`).
//!
//! Cost of the registration: in this project's VM a registered process's
//! sleeps and wake-ups got slower (a blocking ping-pong through `via-bench
//! base --wait block`: 45–49 µs against 26–41 µs, with every light fence
//! still a full fence; a plain C futex ping-pong: 2–6%). The library that
//! uses these fences decides whether a process registers ([`register`]).
//!
//! Under loom both sides are SeqCst fences (loom cannot model `membarrier`).

#[cfg(not(loom))]
use core::sync::atomic::{AtomicU8, compiler_fence};

use crate::sync::{Ordering, fence};

/// [`STATE`]: not registered (yet): the light side is a fence.
#[cfg(not(loom))]
const UNKNOWN: u8 = 0;
/// Registered: the light side is a compiler fence.
#[cfg(not(loom))]
const LIGHT: u8 = 1;
/// Not registered (refused, or [`disable`]d): the light side is a fence.
#[cfg(not(loom))]
const FULL: u8 = 2;

/// This process's light side: [`UNKNOWN`], [`LIGHT`] or [`FULL`].
#[cfg(not(loom))]
static STATE: AtomicU8 = AtomicU8::new(UNKNOWN);

/// The frequent side: a StoreLoad barrier against every [`heavy_fence`]
/// (of this process or another). A compiler fence once the process is
/// [`register`]ed; a SeqCst fence otherwise.
#[inline(always)]
pub fn light_fence() {
    #[cfg(not(loom))]
    {
        // Relaxed: LIGHT is stored after the registration returned, so a
        // thread that reads it runs its light sides after the kernel counts
        // this process as registered.
        if STATE.load(Ordering::Relaxed) == LIGHT {
            compiler_fence(Ordering::SeqCst);
        } else {
            fence(Ordering::SeqCst);
        }
    }
    #[cfg(loom)]
    fence(Ordering::SeqCst);
}

/// Registers this process for global expedited barriers, so that its light
/// fences become compiler fences (once; idempotent). Returns whether they
/// are. False where the kernel or a filter refuses, or after [`disable`].
pub fn register() -> bool {
    #[cfg(not(loom))]
    {
        // Relaxed: a racing call registers twice (idempotent).
        match STATE.load(Ordering::Relaxed) {
            LIGHT => return true,
            FULL => return false,
            _ => {}
        }
        static FORK_HANDLER: std::sync::Once = std::sync::Once::new();
        FORK_HANDLER.call_once(|| {
            extern "C" fn child() {
                // Registered again (kept or not by the kernel; idempotent).
                // Only the forking thread runs in the child: no other light
                // side runs before this returns.
                if STATE.load(Ordering::Relaxed) == LIGHT {
                    let again = crate::sys::membarrier_register_global();
                    STATE.store(if again { LIGHT } else { FULL }, Ordering::Relaxed);
                }
            }
            if !crate::sys::atfork_child(child) {
                log::warn!("asymmetric fences: no fork handler; they stay full fences");
                STATE.store(FULL, Ordering::Relaxed);
            }
        });
        if STATE.load(Ordering::Relaxed) != UNKNOWN {
            return STATE.load(Ordering::Relaxed) == LIGHT;
        }
        let registered = crate::sys::membarrier_register_global();
        // Relaxed: see `light_fence`. `disable` may have run meanwhile: it wins.
        let _ = STATE.compare_exchange(
            UNKNOWN,
            if registered { LIGHT } else { FULL },
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
        STATE.load(Ordering::Relaxed) == LIGHT
    }
    #[cfg(loom)]
    false
}

/// The rare side: a StoreLoad barrier against every [`light_fence`] of every
/// process. Returns whether it covered them: false when the barrier failed
/// here, so that a light side elsewhere may have been a compiler fence
/// nothing ordered (see the module doc for what the caller does then).
pub fn heavy_fence() -> bool {
    fence(Ordering::SeqCst);
    #[cfg(all(test, not(loom)))]
    {
        tests::HEAVY_CALLS.with(|c| c.set(c.get() + 1));
        if tests::FAIL_HEAVY.with(std::cell::Cell::get) {
            return false;
        }
    }
    #[cfg(not(loom))]
    {
        crate::sys::membarrier_global()
    }
    #[cfg(loom)]
    true
}

/// Keeps this process's light sides full fences from now on, for good (no
/// registration; if one was made, it stays and costs the heavy sides
/// elsewhere an interrupt). Heavy sides are unaffected: other processes may
/// still be light.
pub fn disable() {
    #[cfg(not(loom))]
    STATE.store(FULL, Ordering::Relaxed);
}

/// Whether this process's light sides are full fences for good: after
/// [`disable`], or a refused registration (final; a forked child inherits
/// it). A handshake whose light sides all run in this process needs no heavy
/// barrier then.
pub fn light_is_full_fence() -> bool {
    #[cfg(not(loom))]
    {
        STATE.load(Ordering::Relaxed) == FULL
    }
    #[cfg(loom)]
    true
}

/// Whether this process's light sides are compiler fences now.
pub fn light_is_compiler_fence() -> bool {
    #[cfg(not(loom))]
    {
        STATE.load(Ordering::Relaxed) == LIGHT
    }
    #[cfg(loom)]
    false
}

#[cfg(all(test, not(loom)))]
#[allow(unsafe_code)]
pub(crate) mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicU32;

    thread_local! {
        /// Makes this thread's heavy fences fail (as under a seccomp filter).
        pub(crate) static FAIL_HEAVY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
        /// This thread's heavy fences so far.
        pub(crate) static HEAVY_CALLS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    }

    /// The handshake the fences exist for, many times over: a light side
    /// (store, light fence, load) racing a heavy side (store, heavy fence,
    /// load) must never have both loads miss the other side's store. (With a
    /// plain SeqCst fence as the heavy side, store buffering makes both miss
    /// now and then.)
    #[test]
    fn a_light_and_a_heavy_side_never_both_miss() {
        assert!(
            register() && light_is_compiler_fence(),
            "this kernel should register global expedited barriers"
        );
        const ROUNDS: u32 = 100_000;
        let flags = Arc::new([AtomicU32::new(0), AtomicU32::new(0)]);
        let (start, done) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
        let light = {
            let (flags, start, done) = (flags.clone(), start.clone(), done.clone());
            std::thread::spawn(move || {
                let mut missed = Vec::new();
                for r in 1..=ROUNDS {
                    while start.load(Ordering::Acquire) != r {
                        std::hint::spin_loop();
                    }
                    flags[0].store(r, Ordering::Relaxed);
                    light_fence();
                    missed.push(flags[1].load(Ordering::Relaxed) != r);
                    done.store(r, Ordering::Release);
                }
                missed
            })
        };
        let mut heavy_missed = Vec::new();
        for r in 1..=ROUNDS {
            start.store(r, Ordering::Release);
            flags[1].store(r, Ordering::Relaxed);
            assert!(heavy_fence());
            heavy_missed.push(flags[0].load(Ordering::Relaxed) != r);
            while done.load(Ordering::Acquire) != r {
                std::hint::spin_loop();
            }
        }
        let light_missed = light.join().unwrap();
        let both = light_missed
            .iter()
            .zip(&heavy_missed)
            .filter(|(a, b)| **a && **b)
            .count();
        assert_eq!(
            both, 0,
            "both sides missed the other's store in {both} rounds"
        );
    }

    #[test]
    fn a_forked_child_stays_light() {
        assert!(register() && light_is_compiler_fence());
        // SAFETY: the child only calls async-signal-safe functions and
        // atomics here, and leaves with `_exit`.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            // The fork handler registered the child again.
            let ok = light_is_compiler_fence() && heavy_fence();
            // SAFETY: ends the child without running the parent's atexit
            // handlers or test harness.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: `pid` is our child; `status` is a valid out pointer.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
    }
}
