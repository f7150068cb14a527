//! Shared memory: bounds-checked mappings, and rings inside them.
//!
//! With `sys.rs`, `mem/` and `ffi/`, this is where the crate's `unsafe` lives: every
//! other module builds on the safe, bounds-checked types here.

pub mod mapping;
pub mod rings;

/// Asks the processor for the cache line at `addr` with the intent to write
/// it (x86-64 `prefetchw`; nothing elsewhere). A hint: a prefetch never
/// faults, so any address, 0 or unmapped included, is harmless.
#[inline(always)]
pub(crate) fn prefetch_write(addr: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch instruction reads nothing the program sees and
    // never faults, whatever the address.
    unsafe {
        use std::arch::x86_64::{_MM_HINT_ET0, _mm_prefetch};
        _mm_prefetch::<_MM_HINT_ET0>(addr as *const i8);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = addr;
}
