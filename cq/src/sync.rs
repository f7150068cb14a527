//! The one place `cq` takes its atomics from, so that loom can replace them.
//!
//! Under `cfg(loom)` every atomic, `Arc`, spin hint and yield comes from
//! loom and the ring lives in loom-tracked heap objects; otherwise they
//! come from `std`. Nothing else in the crate names `std::sync::atomic`.
#![forbid(unsafe_code)]

#[cfg(loom)]
pub(crate) use loom::sync::Arc;
#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering};

#[cfg(not(loom))]
pub(crate) use std::sync::Arc;
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Tells the CPU (or loom's scheduler) that we are busy-waiting.
#[inline]
pub(crate) fn spin_loop() {
    #[cfg(loom)]
    loom::hint::spin_loop();
    #[cfg(not(loom))]
    std::hint::spin_loop();
}

/// Gives the core away: under loom this is where another thread may run.
#[inline]
pub(crate) fn yield_now() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    std::thread::yield_now();
}

/// Exponential backoff for the bounded retry loops of the ring.
///
/// Spins with `spin_loop` for the first few steps, then yields. The caller
/// bounds the number of steps; `Backoff` only decides how long each one is.
#[derive(Debug, Default)]
pub(crate) struct Backoff {
    step: u32,
}

impl Backoff {
    const SPIN_LIMIT: u32 = 6;

    /// Backs off after a lost CAS: someone else made progress.
    #[inline]
    pub(crate) fn spin(&mut self) {
        if cfg!(loom) {
            // One scheduling point is all loom needs; more only grows the model.
            return yield_now();
        }
        for _ in 0..1u32 << self.step.min(Self::SPIN_LIMIT) {
            spin_loop();
        }
        if self.step <= Self::SPIN_LIMIT {
            self.step += 1;
        }
    }

    /// Backs off while waiting for another thread to finish a step.
    #[inline]
    pub(crate) fn snooze(&mut self) {
        if cfg!(loom) {
            return yield_now();
        }
        if self.step <= Self::SPIN_LIMIT {
            for _ in 0..1u32 << self.step {
                spin_loop();
            }
            self.step += 1;
        } else {
            yield_now();
        }
    }
}
