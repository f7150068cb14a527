//! Unit tests of the ring: layout, wrap-around, limit, close, attach
//! validation, tombstones, repair against a live producer, corrupt memory.

use super::*;
use crate::layout::{ALIGN, MAX_CAPACITY};
use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::sync::mpsc;
use std::time::Instant;

/// Test-owned, 64-aligned, zeroed memory standing in for a mapping.
struct Mem {
    ptr: NonNull<u8>,
    layout: Layout,
}

impl Mem {
    fn new(len: usize) -> Self {
        let layout = Layout::from_size_align(len.max(1) + ALIGN, ALIGN).unwrap();
        // SAFETY: non-zero size.
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) }).unwrap();
        Self { ptr, layout }
    }

    fn len(&self) -> usize {
        self.layout.size()
    }

    fn words(&self) -> *mut u64 {
        self.ptr.as_ptr().cast()
    }

    /// Overwrites the 64-bit word at byte `offset`, as a peer could.
    fn poke(&self, offset: usize, value: u64) {
        assert!(offset % 8 == 0 && offset + 8 <= self.len());
        // SAFETY: in bounds and aligned (asserted); the rings under test only
        // access this memory through atomics, and this test runs them on
        // the same thread, so there is no concurrent access.
        unsafe { self.words().add(offset / 8).write_volatile(value) };
    }
}

impl Drop for Mem {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout; the tests drop every
        // view before the memory.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

/// A deadline far enough for a loaded 2-core machine, so a test fails rather
/// than hangs.
fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(20)
}

#[test]
fn bytes_for_matches_the_layout() {
    assert_eq!(EntryRing::bytes_for(1), HEADER_BYTES + SLOT_BYTES);
    assert_eq!(EntryRing::bytes_for(1024), 256 + 16 * 1024);
    let ring = EntryRing::new_in_heap(8);
    let base = ring.header.as_ptr() as usize;
    assert_eq!(base % 64, 0);
    assert_eq!(ring.slots.as_ptr() as usize - base, HEADER_BYTES);
    assert_eq!(
        ring.slot(9) as *const Slot as usize - base,
        HEADER_BYTES + SLOT_BYTES
    );
}

#[test]
fn wraps_around_many_laps_in_order() {
    for capacity in [1u32, 2, 4, 8] {
        let ring = EntryRing::new_in_heap(capacity);
        let mut next_in = 0u64;
        let mut next_out = 0u64;
        // Alternate bursts of different sizes so head and tail cross the
        // mask boundary in every relative position.
        for round in 0..(capacity as u64 * 8) {
            let burst = 1 + round % u64::from(capacity);
            for _ in 0..burst {
                let entry = next_in.wrapping_mul(0x9E37_79B9_7F4A_7C15);
                ring.push(entry).unwrap();
                next_in += 1;
            }
            assert_eq!(ring.len() as u64, next_in - next_out);
            while let Some(entry) = ring.pop() {
                assert_eq!(entry, next_out.wrapping_mul(0x9E37_79B9_7F4A_7C15));
                next_out += 1;
            }
            assert_eq!(next_out, next_in);
            assert!(ring.is_empty());
        }
    }
}

#[test]
fn overrun_at_the_logical_limit() {
    let ring = EntryRing::new_in_heap(8);
    ring.set_limit(3).unwrap();
    for i in 0..3 {
        ring.push(i).unwrap();
    }
    assert_eq!(ring.push(3), Err(PushError::Overrun));
    assert_eq!(ring.len(), 3);
    assert_eq!(ring.pop(), Some(0));
    ring.push(3).unwrap();
    assert_eq!(ring.push(4), Err(PushError::Overrun));
    // At the physical capacity too.
    ring.set_limit(8).unwrap();
    for i in 4..9 {
        ring.push(i).unwrap();
    }
    assert_eq!(ring.push(9), Err(PushError::Overrun));
    assert_eq!(
        (0..8).map(|_| ring.pop().unwrap()).collect::<Vec<_>>(),
        (1..9).collect::<Vec<_>>()
    );
}

#[test]
fn set_limit_rules() {
    let ring = EntryRing::new_in_heap(4);
    assert_eq!(ring.limit(), 4);
    assert_eq!(
        ring.set_limit(5),
        Err(LimitError::AboveCapacity {
            limit: 5,
            capacity: 4
        })
    );
    ring.push(1).unwrap();
    ring.push(2).unwrap();
    assert_eq!(
        ring.set_limit(1),
        Err(LimitError::BelowLen { limit: 1, len: 2 })
    );
    ring.set_limit(2).unwrap();
    assert_eq!(ring.limit(), 2);
    assert_eq!(ring.push(3), Err(PushError::Overrun));
    ring.set_limit(4).unwrap();
    ring.push(3).unwrap();
    // A peer scribbling a huge limit cannot lift it above the capacity.
    ring.header().ident.limit.store(u32::MAX, Ordering::Relaxed);
    assert_eq!(ring.limit(), 4);
    ring.push(4).unwrap();
    assert_eq!(ring.push(5), Err(PushError::Overrun));
}

#[test]
fn closed_ring_refuses_pushes_and_drains_in_order() {
    let ring = EntryRing::new_in_heap(8);
    for i in 0..5 {
        ring.push(i).unwrap();
    }
    assert_eq!(ring.pop(), Some(0));
    ring.close();
    assert!(ring.is_closed());
    assert_eq!(ring.push(9), Err(PushError::Closed));
    let other_view = ring.clone();
    assert_eq!(other_view.push(9), Err(PushError::Closed));
    assert_eq!(ring.drain_closed(Duration::ZERO), vec![1, 2, 3, 4]);
    assert_eq!(ring.pop(), None);
    assert_eq!(ring.push(9), Err(PushError::Closed));
}

#[test]
fn drain_tombstones_a_reservation_that_never_commits() {
    let ring = EntryRing::new_in_heap(8);
    ring.push(1).unwrap();
    ring.reserve_and_die().unwrap();
    ring.push(3).unwrap();
    let start = Instant::now();
    assert_eq!(ring.drain_closed(Duration::from_millis(30)), vec![1, 3]);
    // It did wait for the grace period before giving up on the slot.
    assert!(start.elapsed() >= Duration::from_millis(30));
}

#[test]
fn init_validates_its_arguments() {
    let mem = Mem::new(EntryRing::bytes_for(8));
    for bad in [0, 3, 12, MAX_CAPACITY * 2, u32::MAX] {
        // SAFETY: `mem` is ours and unshared; failing `init` writes nothing.
        let r = unsafe { EntryRing::init(mem.ptr, mem.len(), bad) };
        assert_eq!(r.err(), Some(LayoutError::BadCapacity(bad)));
    }
    // SAFETY: as above.
    let r = unsafe { EntryRing::init(mem.ptr, EntryRing::bytes_for(8) - 1, 8) };
    assert!(matches!(r, Err(LayoutError::TooSmall { .. })));
    // SAFETY: one byte in, still inside `mem`.
    let odd = unsafe { mem.ptr.add(8) };
    // SAFETY: as above; fails before writing.
    let r = unsafe { EntryRing::init(odd, mem.len() - 8, 4) };
    assert_eq!(r.err(), Some(LayoutError::Misaligned));
}

#[test]
fn attach_validates_the_header() {
    let len = EntryRing::bytes_for(8);
    let mem = Mem::new(len);
    // Never initialised: zero magic.
    // SAFETY: `mem` outlives every view below.
    let r = unsafe { EntryRing::attach(mem.ptr, len) };
    assert_eq!(r.err(), Some(LayoutError::BadMagic(0)));
    // SAFETY: as above.
    let ring = unsafe { EntryRing::init(mem.ptr, len, 8) }.unwrap();
    ring.push(77).unwrap();
    // SAFETY: as above.
    let peer = unsafe { EntryRing::attach(mem.ptr, len) }.unwrap();
    assert_eq!(peer.capacity(), 8);
    assert_eq!(peer.pop(), Some(77));
    // SAFETY: as above.
    let r = unsafe { EntryRing::attach(mem.ptr, HEADER_BYTES - 1) };
    assert!(matches!(r, Err(LayoutError::TooSmall { .. })));
    // SAFETY: as above.
    let r = unsafe { EntryRing::attach(mem.ptr, len - 1) };
    assert_eq!(
        r.err(),
        Some(LayoutError::TooSmall {
            need: len,
            have: len - 1
        })
    );
    // SAFETY: one line in, still inside `mem`.
    let r = unsafe { EntryRing::attach(mem.ptr.add(1), len) };
    assert_eq!(r.err(), Some(LayoutError::Misaligned));

    // Version, then capacity, as a peer might have rewritten them.
    mem.poke(8, u64::from(VERSION + 1) | 8 << 32);
    // SAFETY: as above.
    let r = unsafe { EntryRing::attach(mem.ptr, len) };
    assert_eq!(r.err(), Some(LayoutError::BadVersion(VERSION + 1)));
    for bad_capacity in [0u64, 6, 16, u64::from(u32::MAX)] {
        mem.poke(8, u64::from(VERSION) | bad_capacity << 32);
        // SAFETY: as above.
        let r = unsafe { EntryRing::attach(mem.ptr, len) };
        if bad_capacity == 16 {
            // A valid capacity the mapping is too short for.
            assert!(matches!(r, Err(LayoutError::TooSmall { .. })), "{r:?}");
        } else {
            assert!(matches!(r, Err(LayoutError::BadCapacity(_))), "{r:?}");
        }
    }
    // The views made before keep their own capacity and keep working.
    ring.push(78).unwrap();
    assert_eq!(peer.pop(), Some(78));
    drop((ring, peer));
}

#[test]
fn consumers_skip_a_dead_producers_tombstone() {
    let ring = EntryRing::new_in_heap(4);
    ring.push(1).unwrap();
    let dead = ring.reserve_and_die().unwrap();
    assert_eq!(dead, 1);
    ring.push(3).unwrap();
    assert_eq!(ring.pop(), Some(1));
    // Entry 3 waits behind the uncommitted slot.
    assert_eq!(ring.pop(), None);
    assert_eq!(ring.len(), 2);
    assert_eq!(ring.repair(Duration::ZERO), 1);
    assert_eq!(ring.repair(Duration::ZERO), 0, "tombstoned once");
    assert_eq!(ring.pop(), Some(3));
    assert_eq!(ring.pop(), None);
    // The ring keeps working over the recycled slot, for several laps.
    for i in 10..30 {
        ring.push(i).unwrap();
        assert_eq!(ring.pop(), Some(i));
    }
}

#[test]
fn repair_waits_out_the_grace_period_for_the_dead() {
    let ring = EntryRing::new_in_heap(4);
    ring.reserve_and_die().unwrap();
    ring.push(5).unwrap();
    let start = Instant::now();
    assert_eq!(ring.repair(Duration::from_millis(20)), 1);
    assert!(start.elapsed() >= Duration::from_millis(20));
    assert_eq!(ring.pop(), Some(5));
}

#[test]
fn repair_racing_with_a_slow_producer_delivers_its_entry_once() {
    let ring = EntryRing::new_in_heap(4);
    let (reserved_tx, reserved_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let producer = {
        let ring = ring.clone();
        std::thread::spawn(move || {
            let mut stalls = 0;
            let result = ring.push_stalled(42, |pos| {
                if stalls == 0 {
                    // First reservation: stall until the owner has repaired.
                    reserved_tx.send(pos).unwrap();
                    go_rx.recv_timeout(Duration::from_secs(20)).unwrap();
                }
                stalls += 1;
            });
            (result, stalls)
        })
    };
    let pos = reserved_rx.recv_timeout(Duration::from_secs(20)).unwrap();
    assert_eq!(pos, 0);
    // Another producer's entry lands behind the stalled slot.
    ring.push(7).unwrap();
    assert_eq!(ring.repair(Duration::ZERO), 1);
    // The consumer skips the tombstone and recycles it before the stalled
    // producer wakes: its late writes must not touch the new lap.
    assert_eq!(ring.pop(), Some(7));
    for i in 100..103 {
        ring.push(i).unwrap();
    }
    go_tx.send(()).unwrap();
    let (result, stalls) = producer.join().unwrap();
    assert_eq!(result, Ok(()));
    assert_eq!(stalls, 2, "the producer retried with a new reservation");
    let mut got = Vec::new();
    while let Some(e) = ring.pop() {
        got.push(e);
    }
    assert_eq!(got, vec![100, 101, 102, 42]);
}

#[test]
fn a_producer_that_commits_within_the_grace_period_is_kept() {
    let ring = EntryRing::new_in_heap(4);
    let (reserved_tx, reserved_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let producer = {
        let ring = ring.clone();
        std::thread::spawn(move || {
            let mut stalls = 0;
            let result = ring.push_stalled(9, |_| {
                if stalls == 0 {
                    reserved_tx.send(()).unwrap();
                    go_rx.recv_timeout(Duration::from_secs(20)).unwrap();
                }
                stalls += 1;
            });
            (result, stalls)
        })
    };
    reserved_rx.recv_timeout(Duration::from_secs(20)).unwrap();
    let repairer = {
        let ring = ring.clone();
        std::thread::spawn(move || ring.repair(Duration::from_secs(20)))
    };
    // Let the producer go only once `repair` sleeps in its grace period.
    let until = deadline();
    while !ring.event().has_waiters() {
        assert!(Instant::now() < until, "repair never waited");
        std::thread::yield_now();
    }
    go_tx.send(()).unwrap();
    assert_eq!(repairer.join().unwrap(), 0);
    assert_eq!(producer.join().unwrap(), (Ok(()), 1));
    assert_eq!(ring.pop(), Some(9));
}

#[test]
fn a_stale_producer_cannot_overwrite_a_later_lap() {
    // Drive the internals by hand: reserve, tombstone, recycle, then let the
    // stale reservation try to fill and commit.
    let ring = EntryRing::new_in_heap(1);
    let stale = ring.reserve().unwrap();
    assert_eq!(ring.repair(Duration::ZERO), 1);
    assert_eq!(ring.pop(), None, "tombstone skipped, nothing else");
    ring.push(0xAAAA_AAAA_BBBB_BBBB).unwrap();
    assert!(ring.commit(stale, 0x1111_1111_2222_2222).is_err());
    assert_eq!(ring.pop(), Some(0xAAAA_AAAA_BBBB_BBBB));
    // And once that lap is consumed too.
    let stale = ring.reserve().unwrap();
    assert_eq!(ring.repair(Duration::ZERO), 1);
    assert_eq!(ring.pop(), None);
    assert!(ring.commit(stale, 5).is_err());
    ring.push(6).unwrap();
    assert_eq!(ring.pop(), Some(6));
}

#[test]
fn wait_blocks_until_a_push_and_times_out_when_idle() {
    let ring = EntryRing::new_in_heap(4);
    let start = Instant::now();
    assert_eq!(
        ring.wait(Duration::ZERO, Some(Duration::from_millis(10))),
        None
    );
    assert!(start.elapsed() >= Duration::from_millis(10));

    let consumer = {
        let ring = ring.clone();
        std::thread::spawn(move || ring.wait(Duration::ZERO, Some(Duration::from_secs(20))))
    };
    let until = deadline();
    while !ring.event().has_waiters() {
        assert!(Instant::now() < until, "consumer never slept");
        std::thread::yield_now();
    }
    ring.push(11).unwrap();
    assert_eq!(consumer.join().unwrap(), Some(11));
}

#[test]
fn close_wakes_a_sleeping_consumer() {
    let ring = EntryRing::new_in_heap(4);
    let consumer = {
        let ring = ring.clone();
        std::thread::spawn(move || ring.wait(Duration::ZERO, None))
    };
    let until = deadline();
    while !ring.event().has_waiters() {
        assert!(Instant::now() < until, "consumer never slept");
        std::thread::yield_now();
    }
    ring.close();
    assert_eq!(consumer.join().unwrap(), None);
}

/// xorshift64*, enough to scribble reproducibly.
fn scribble(seed: u64) -> impl FnMut() -> u64 {
    let mut x = seed | 1;
    move || {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

#[test]
fn corrupt_memory_gives_errors_not_hangs_or_panics() {
    let capacity = 8u32;
    let len = EntryRing::bytes_for(capacity);
    let mem = Mem::new(len);
    for seed in 1..=24u64 {
        // SAFETY: `mem` outlives the views of this iteration.
        let ring = unsafe { EntryRing::init(mem.ptr, len, capacity) }.unwrap();
        for i in 0..5 {
            ring.push(i).unwrap();
        }
        let mut next = scribble(seed);
        // Overwrite the tail/head lines and/or the slots with garbage; the
        // event line is left alone (a peer can only make it wake or sleep).
        let targets: Vec<usize> = match seed % 4 {
            0 => vec![64, 128],
            1 => (HEADER_BYTES..len).step_by(8).collect(),
            2 => vec![16, 64],
            _ => [64, 128]
                .into_iter()
                .chain((HEADER_BYTES..len).step_by(8))
                .collect(),
        };
        for offset in targets {
            let v = next();
            // Sometimes near-valid values, which are the nasty ones.
            let v = if v % 3 == 0 { v % 64 } else { v };
            mem.poke(offset, v);
        }
        let start = Instant::now();
        let _ = ring.len();
        let _ = ring.limit();
        for i in 0..20 {
            let _ = ring.push(i);
            let _ = ring.pop();
        }
        let _ = ring.repair(Duration::ZERO);
        for i in 0..4 {
            let _ = ring.push(i);
        }
        assert!(ring.len() <= ring.capacity());
        let drained = ring.drain_closed(Duration::ZERO);
        assert!(drained.len() <= ring.capacity());
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "seed {seed} too slow"
        );
    }
}

#[test]
fn a_peer_rewinding_the_tail_is_reported_corrupt() {
    let ring = EntryRing::new_in_heap(4);
    ring.push(1).unwrap();
    ring.pop().unwrap();
    // Tail far behind head: impossible for a sane ring.
    ring.header()
        .producer
        .tail
        .store(1 << 40, Ordering::Relaxed);
    ring.header()
        .consumer
        .head
        .store(1 << 50, Ordering::Relaxed);
    assert_eq!(ring.push(2), Err(PushError::Corrupt));
    assert_eq!(ring.len(), 4, "clamped to the capacity");
}
