//! Shared memory: bounds-checked mappings, and rings inside them.
//!
//! With `sys.rs`, `mem/` and `ffi/`, this is where the crate's `unsafe` lives: every
//! other module builds on the safe, bounds-checked types here.

pub mod mapping;
pub mod rings;

/// Whether this processor has `prefetchw` (CPUID 8000_0001h, ECX bit 8:
/// PRFCHW, "3dnowprefetch" in /proc/cpuinfo); asked once.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn has_prefetchw() -> bool {
    use std::sync::atomic::{AtomicU8, Ordering};
    // 0: not asked yet; 1: no; 2: yes. Relaxed: every thread computes the
    // same answer, so a racing first look only asks twice.
    static HAS: AtomicU8 = AtomicU8::new(0);
    match HAS.load(Ordering::Relaxed) {
        0 => {
            // Leaf 8000_0001h exists on every x86-64 processor.
            let ecx = std::arch::x86_64::__cpuid(0x8000_0001).ecx;
            let yes = ecx & (1 << 8) != 0;
            HAS.store(if yes { 2 } else { 1 }, Ordering::Relaxed);
            yes
        }
        v => v == 2,
    }
}

/// Asks the processor for the cache line at `addr` with the intent to write
/// it (x86-64 `prefetchw`; nothing elsewhere). A hint: a prefetch never
/// faults, so any address, 0 or unmapped included, is harmless.
///
/// Why not `_mm_prefetch::<_MM_HINT_ET0>`: without the `prfchw` target
/// feature at compile time (the default x86-64 target has none) it compiles
/// to `prefetcht0`, a read prefetch. That brings a line the peer wrote last
/// in shared state, and the store that follows still needs a round trip to
/// take it over, at the next locked instruction of the caller. So the
/// instruction is written out, used where the processor has it (checked once).
#[inline(always)]
pub(crate) fn prefetch_write(addr: usize) {
    #[cfg(target_arch = "x86_64")]
    if has_prefetchw() {
        // SAFETY: `prefetchw` exists on this processor (checked above); a
        // prefetch reads nothing the program sees, writes nothing and never
        // faults, whatever the address.
        unsafe {
            std::arch::asm!(
                "prefetchw [{a}]",
                a = in(reg) addr,
                options(nostack, preserves_flags, readonly)
            );
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = addr;
}
