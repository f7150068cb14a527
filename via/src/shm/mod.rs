//! Shared memory: bounds-checked mappings, and rings inside them.
//!
//! With `sys.rs`, `mem/` and `ffi/`, this is where the crate's `unsafe` lives: every
//! other module builds on the safe, bounds-checked types here.

pub mod mapping;
pub mod rings;

/// Whether this processor has `prefetchw` (CPUID 8000_0001h, ECX bit 8:
/// PRFCHW, "3dnowprefetch" in /proc/cpuinfo), as [`probe`] found it. Until
/// then false: the prefetches are hints, and skipping a few is harmless.
#[cfg(target_arch = "x86_64")]
static HAS_PREFETCHW: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Asks the processor what the hints here may use; called when a NIC opens
/// (idempotent), so that each hint tests one flag.
pub(crate) fn probe() {
    #[cfg(target_arch = "x86_64")]
    {
        // Leaf 8000_0001h exists on every x86-64 processor.
        let ecx = std::arch::x86_64::__cpuid(0x8000_0001).ecx;
        // Relaxed: every thread computes the same answer.
        HAS_PREFETCHW.store(ecx & (1 << 8) != 0, std::sync::atomic::Ordering::Relaxed);
    }
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn has_prefetchw() -> bool {
    HAS_PREFETCHW.load(std::sync::atomic::Ordering::Relaxed)
}

/// Messages up to this many bytes have their lines demoted ([`demote`]).
/// Measured here (a two-thread ping-pong reading n lines after a flag):
/// 5 lines 300 -> 240 ns, 17 lines 670 -> 560 ns, 65 lines no better
/// (1,415 -> 1,535 ns): a long message is read as a stream, which the
/// hardware prefetchers already fetch ahead.
pub(crate) const DEMOTE_MAX: usize = 1024;

/// Pushes the cache lines of `[addr, addr + len)`, just written here for
/// another process to read next (a message copied into its buffer), out of
/// this core's private caches into the shared last-level cache (x86-64
/// `cldemote`; nothing elsewhere, nothing for more than [`DEMOTE_MAX`]
/// bytes). A hint: the reader's miss is then served by the shared cache
/// instead of a snoop of this core, which on the Intel server parts
/// measured here is the slower transfer (README, "Demoted lines").
///
/// No processor check: `cldemote` is encoded in the hint-NOP space
/// (`0F 1C /0`), so a processor without it executes a NOP.
#[inline(always)]
pub(crate) fn demote(addr: usize, len: usize) {
    #[cfg(target_arch = "x86_64")]
    if len.wrapping_sub(1) < DEMOTE_MAX {
        // The first line here (most messages have one); any others out of
        // line.
        let first = addr & !63;
        let last = (addr + len - 1) & !63;
        demote_line(first);
        if last != first {
            demote_lines(first + 64, last);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (addr, len);
}

/// [`demote`] of the lines from `line` to `last` (both 64-byte aligned).
#[cfg(target_arch = "x86_64")]
#[cold]
#[inline(never)]
fn demote_lines(mut line: usize, last: usize) {
    while line <= last {
        demote_line(line);
        line += 64;
    }
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn demote_line(line: usize) {
    // SAFETY: `cldemote` only moves a cache line between cache levels (or
    // is a NOP); it reads and writes nothing the program sees, and the
    // callers name memory they just wrote.
    unsafe {
        std::arch::asm!(
            "cldemote [{a}]",
            a = in(reg) line,
            options(nostack, preserves_flags, readonly)
        );
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
