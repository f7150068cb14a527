//! A registration of new memory at an address another thread has just
//! unmapped must not find the old memory's cached or parked registration.
//!
//! The kernel frees the address at `munmap` and only afterwards queues the
//! userfaultfd event and holds the unmapping thread until it is read, so a
//! thread that maps and registers at that address in between finds no event
//! pending. The unmap hooks (`via::mem::unmap_hook`) close that window: the
//! registration waits for every unmap in flight. Without them (the hooks'
//! wait skipped) 112, 593 and 967 of 3,000 rounds hit the stale entry here.
//! `docs/registration.md` §2.
//!
//! Each way memory goes away from another thread is tried: `munmap`,
//! glibc's `free` of a large block (its internal `__munmap`), and `mremap`
//! moving the block elsewhere.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use via::mem::arena::UserRange;
use via::{Nic, Region};

const LEN: usize = 256 * 1024;
const ROUNDS: usize = 1000;

fn map(at: usize, len: usize, fixed: bool) -> Option<usize> {
    let flags =
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | if fixed { libc::MAP_FIXED_NOREPLACE } else { 0 };
    // SAFETY: a new anonymous mapping, at `at` only if nothing is mapped
    // there (`MAP_FIXED_NOREPLACE`): it aliases no Rust object.
    let p = unsafe {
        libc::mmap(
            at as *mut libc::c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            -1,
            0,
        )
    };
    (p != libc::MAP_FAILED).then_some(p as usize)
}

fn unmap(at: usize, len: usize) {
    // SAFETY: a mapping of this test that nothing references any more.
    unsafe { libc::munmap(at as *mut libc::c_void, len) };
}

fn register(nic: &Nic, ptag: via::Ptag, at: usize) -> Region {
    // SAFETY: the memory stays mapped until after the region is dropped.
    let range = unsafe { UserRange::new(at, LEN) };
    Region::of_user_range(nic, range, ptag, false, false).unwrap()
}

/// Old memory at a page-aligned address: the address of the bytes to
/// register and of the whole block, and its length.
struct Old {
    bytes: usize,
    block: usize,
    len: usize,
}

#[derive(Clone, Copy)]
enum GoesAway {
    Munmap,
    Free,
    Mremap,
}

impl GoesAway {
    fn make(self) -> Old {
        match self {
            GoesAway::Munmap | GoesAway::Mremap => {
                let a = map(0, LEN, false).unwrap();
                Old {
                    bytes: a,
                    block: a,
                    len: LEN,
                }
            }
            GoesAway::Free => {
                // SAFETY: plain allocation; above the mmap threshold (fixed,
                // so that glibc does not raise it after a free), so glibc
                // maps it alone and `free` unmaps it.
                let p = unsafe {
                    libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
                    libc::malloc(LEN)
                } as usize;
                assert_ne!(p, 0);
                // SAFETY: glibc's chunk header, the word before the block.
                let size = unsafe { ((p - 8) as *const usize).read() };
                assert_ne!(size & 2, 0, "glibc mapped the block alone (IS_MMAPPED)");
                // glibc's mmapped chunk: its header is the 16 bytes before,
                // the mapping starts at the page holding it.
                let block = p & !4095;
                let end = (p + LEN + 4095) & !4095;
                Old {
                    bytes: p,
                    block,
                    len: end - block,
                }
            }
        }
    }

    /// Makes `old` go away (on another thread).
    fn apply(self, old: &Old) {
        match self {
            GoesAway::Munmap => unmap(old.block, old.len),
            // SAFETY: the block `make` allocated, freed once.
            GoesAway::Free => unsafe { libc::free(old.bytes as *mut libc::c_void) },
            GoesAway::Mremap => {
                // Moved onto a mapping reserved for it (`MREMAP_FIXED`, the
                // hook's fifth argument): the old address is free after.
                let to = map(0, old.len, false).unwrap();
                // SAFETY: this test's mappings, referenced by nothing.
                let q = unsafe {
                    libc::mremap(
                        old.block as *mut libc::c_void,
                        old.len,
                        old.len,
                        libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                        to as *mut libc::c_void,
                    )
                };
                assert_eq!(
                    q as usize,
                    to,
                    "mremap: {}",
                    std::io::Error::last_os_error()
                );
                unmap(to, old.len);
            }
        }
    }
}

/// The two tests of this file do not run at once: the other one maps and
/// registers memory of its own, which can land in the address a round of
/// [`race`] waits for (and, parked by the registration cache, stay there).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn race(how: GoesAway) {
    let nic = Nic::open(None).unwrap();
    let ptag = nic.create_ptag().unwrap();
    let mut stale = 0;
    let mut reused = 0;
    // Rounds whose address another mapping of this process took between
    // the unmap and our map (a thread stack, an arena): nothing to race.
    let mut taken = 0;
    for _ in 0..ROUNDS {
        let old = how.make();
        drop(register(&nic, ptag, old.bytes));
        let (tx, rx) = mpsc::channel();
        let (block, len, offset) = (old.block, old.len, old.bytes - old.block);
        let t = std::thread::spawn(move || {
            rx.recv().unwrap();
            how.apply(&old);
        });
        tx.send(()).unwrap();
        // The same address as soon as it is free.
        let deadline = Instant::now() + Duration::from_secs(30);
        let b = loop {
            if let Some(b) = map(block, len, true) {
                break Some(b);
            }
            if t.is_finished() {
                // The unmap is over: free now, or another mapping has it.
                break map(block, len, true);
            }
            assert!(
                Instant::now() < deadline,
                "the old block's address never came free"
            );
        };
        let Some(b) = b else {
            taken += 1;
            t.join().unwrap();
            continue;
        };
        reused += 1;
        let before = nic.registration_stats().cache.hits;
        let r = register(&nic, ptag, b + offset);
        if nic.registration_stats().cache.hits > before {
            stale += 1;
        }
        drop(r);
        t.join().unwrap();
        unmap(b, len);
    }
    assert_eq!(reused + taken, ROUNDS);
    assert!(
        reused >= ROUNDS * 9 / 10,
        "only {reused} of {ROUNDS} rounds got the old address back ({taken} taken by other mappings)"
    );
    assert_eq!(
        stale, 0,
        "{stale} of {ROUNDS} registrations of new memory found the old memory's registration"
    );
}

/// One after the other: each case reuses the address its own other thread
/// freed, which a concurrent case could take first.
#[test]
fn new_memory_where_another_thread_unmapped_freed_or_moved() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    race(GoesAway::Munmap);
    race(GoesAway::Free);
    race(GoesAway::Mremap);
}

/// An unmap whose event is applied late — after new memory was mapped at
/// the address and registered, as when the unmapping thread is held past
/// the registration path's wait on a loaded machine — must leave the new
/// registration its translation: only the old memory's registration loses
/// it. (C suite `regreuse` failed so with `RDMAW_PROT` under load.)
/// Discarded contents (`madvise`) still take every registration over them.
#[test]
fn an_unmap_applied_late_spares_memory_registered_since() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    use via::descriptor::status;
    use via::mem::monitor::MemEvent;
    use via::{DescBuilder, Reliability};

    let s = via_tests::Setup::new(Reliability::ReliableDelivery, 4096, false, false);
    let (nic, ptag, ctl, vi) = (&s.nic, s.ptag, &s.mem, &s.vi);
    // A receive into `r` posted with its descriptor at `desc`: its status
    // right after (0 while it waits; DONE with an error if `r` does not
    // translate).
    let posted = |r: &Region, desc: usize| {
        let d = DescBuilder::recv()
            .segment(r, 0, 4096)
            .write(ctl, desc)
            .unwrap();
        vi.post_recv(ctl, d).unwrap();
        ctl.status(desc)
    };
    // Another thread of the process may map something at the freed
    // address first: then again elsewhere.
    let (a, old) = (0..100)
        .find_map(|_| {
            let a = map(0, LEN, false).unwrap();
            let old = register(nic, ptag, a);
            unmap(a, LEN);
            map(a, LEN, true).map(|_| (a, old))
        })
        .expect("a freed address came free for this thread");
    let new = register(nic, ptag, a);
    // The unmap's event once more, as if it were read only now.
    via::apply_memory_event(MemEvent::Unmap(a..a + LEN));
    assert_eq!(
        posted(&new, 0),
        0,
        "the registration of the new memory keeps its translation"
    );
    let st = posted(&old, 256);
    assert_ne!(
        st & status::DONE,
        0,
        "the old memory's registration has none"
    );
    assert_ne!(st & status::PROTECTION_ERROR, 0, "status {st:#x}");
    // Discarded: the mapping stays, the translation goes.
    via::apply_memory_event(MemEvent::Remove(a..a + LEN));
    let st = posted(&new, 512);
    assert_ne!(st & status::PROTECTION_ERROR, 0, "status {st:#x}");
    drop((new, old));
    unmap(a, LEN);
}
