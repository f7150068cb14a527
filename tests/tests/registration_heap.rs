//! A registration whose pages hold the library's own heap blocks.
//!
//! Registration moves whole pages into shared memory chunk by chunk, each
//! chunk write-protected while it moves, and any write into a protected
//! chunk waits for the mover. When a cache entry merges with touching ones,
//! the pinned range spans bytes the application registered earlier and has
//! since freed; the allocator hands that memory out again, to the library
//! too. A mover that wrote into its own heap scratch while the chunk was
//! protected then waited for itself forever (a 7-process vmpi job hung that
//! way). This test makes it happen every time: a global allocator serves
//! every allocation made during the registration from the very pages being
//! registered.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use via::mem::arena::UserRange;
use via::{Nic, Region};

/// Serves allocations from `[NEXT, END)` while `ON`, else from `System`.
struct Redirect;

static ON: AtomicBool = AtomicBool::new(false);
static START: AtomicUsize = AtomicUsize::new(0);
static NEXT: AtomicUsize = AtomicUsize::new(0);
static END: AtomicUsize = AtomicUsize::new(0);
/// Allocations served from the registered pages.
static SERVED: AtomicUsize = AtomicUsize::new(0);

// SAFETY: blocks from the bump range are distinct (compare-exchange on
// `NEXT`), aligned, inside a mapping that is never unmapped, and never
// reused (their deallocation is a no-op); the rest is `System`'s.
unsafe impl GlobalAlloc for Redirect {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if ON.load(Ordering::Acquire) {
            let mut cur = NEXT.load(Ordering::Relaxed);
            loop {
                let at = cur.next_multiple_of(l.align());
                let end = at + l.size();
                if end > END.load(Ordering::Relaxed) {
                    break;
                }
                match NEXT.compare_exchange(cur, end, Ordering::Relaxed, Ordering::Relaxed) {
                    Ok(_) => {
                        SERVED.fetch_add(1, Ordering::Relaxed);
                        return at as *mut u8;
                    }
                    Err(now) => cur = now,
                }
            }
        }
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(l) }
    }

    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        let a = p as usize;
        if a >= START.load(Ordering::Relaxed) && a < END.load(Ordering::Relaxed) {
            return;
        }
        // SAFETY: `p` came from `System.alloc` with layout `l`.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static GLOBAL: Redirect = Redirect;

#[test]
fn registering_pages_that_hold_the_librarys_heap_blocks() {
    let page = 4096;
    let pages = 64;
    let len = pages * page;
    let nic = Nic::open(None).expect("open the default NIC");
    let ptag = nic.create_ptag().unwrap();
    // SAFETY: a fresh private anonymous mapping aliases nothing.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    let base = p as usize;
    // The application's data in the first half; the second half is where
    // the allocator puts blocks during the registration (all pages touched,
    // so all are copied).
    // SAFETY: inside the mapping above, which nothing else uses.
    let mem = unsafe { std::slice::from_raw_parts_mut(p as *mut u8, len) };
    for (i, b) in mem.iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    START.store(base + len / 2, Ordering::Relaxed);
    NEXT.store(base + len / 2, Ordering::Relaxed);
    END.store(base + len, Ordering::Relaxed);

    let (tx, rx) = std::sync::mpsc::channel();
    let worker = {
        let nic = nic.clone();
        std::thread::spawn(move || {
            // SAFETY: the mapping is never unmapped (it holds heap blocks).
            let range = unsafe { UserRange::new(base, len) };
            ON.store(true, Ordering::Release);
            let r = Region::of_user_range(&nic, range, ptag, true, true);
            ON.store(false, Ordering::Release);
            let _ = tx.send(r.map(|r| r.handle()));
        })
    };
    // A deadline, not a sleep: the registration either returns or waits
    // for itself forever.
    let handle = match rx.recv_timeout(Duration::from_secs(30)) {
        Ok(r) => r.expect("registration"),
        Err(_) => {
            // Later allocations (the failure report's) from the heap again.
            ON.store(false, Ordering::Release);
            panic!(
                "registration of pages holding the library's heap blocks did not return in 30 s \
             (the mover waits for its own write into a protected chunk)"
            )
        }
    };
    worker.join().unwrap();
    assert!(
        SERVED.load(Ordering::Relaxed) > 0,
        "no allocation landed in the registered pages: the test proves nothing"
    );
    assert_ne!(handle, 0);
    let stats = nic.registration_stats();
    assert!(
        stats.arenas.chunks > 0,
        "the pages were not moved: {stats:?}"
    );
    // The application's bytes are where they were, unchanged.
    for (i, b) in mem[..len / 2].iter().enumerate() {
        assert_eq!(*b, (i % 251) as u8, "byte {i}");
    }
}
