//! A counting global allocator: the `viad_request` target checks that
//! decoding a frame never allocates more than a fixed multiple of
//! `via::proto::MAX_FRAME`, whatever lengths the frame claims.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

struct Counting;

thread_local! {
    /// Bytes live on this thread since [`Measure::start`] (may go negative
    /// when memory from before is freed), and the peak of that.
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(delta: isize, size: usize) {
    // `try_with`: the allocator runs during thread teardown too.
    let _ = LIVE.try_with(|l| {
        let v = l.get() + delta;
        l.set(v);
        let _ = PEAK.try_with(|p| p.set(p.get().max(v)));
    });
    if delta > 0 {
        let _ = LARGEST.try_with(|m| m.set(m.get().max(size)));
    }
}

// SAFETY: forwards every call to the system allocator unchanged; the
// bookkeeping touches only thread-local cells (no allocation, no locks).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        note(l.size() as isize, l.size());
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        note(-(l.size() as isize), 0);
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        note(l.size() as isize, l.size());
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        note(new as isize - l.size() as isize, new);
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocation on this thread between `start` and `finish`.
pub struct Measure;

/// What [`Measure::finish`] reports.
#[derive(Clone, Copy, Debug)]
pub struct Usage {
    /// Highest number of bytes live at once.
    pub peak: usize,
    /// Largest single allocation.
    pub largest: usize,
}

impl Measure {
    pub fn start() -> Measure {
        LIVE.with(|l| l.set(0));
        PEAK.with(|p| p.set(0));
        LARGEST.with(|m| m.set(0));
        Measure
    }

    pub fn finish(self) -> Usage {
        Usage {
            peak: PEAK.with(|p| p.get()).max(0) as usize,
            largest: LARGEST.with(|m| m.get()),
        }
    }
}
