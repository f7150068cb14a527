//! Doorbells and event counts shared by two processes through a memfd.
//!
//! The parent re-executes this test binary (with a role in the environment) to run the other
//! side; the child inherits the memfd. Before the first wake the child waits until the
//! parent's thread is seen sleeping in a futex, so the wake must cross processes through the
//! shared (non-private) futex: with a private futex the parent would sleep until its timeout.
// Needs real processes, memfds and futexes: not under loom (models in loom.rs) or Miri.
#![cfg(not(any(loom, miri)))]

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use common::{ChildGuard, SharedMem, TID_ENV, child_role, thread_id, wait_blocked_in_futex};
use doorbell::{Doorbell, EventCount, Full, WaitOutcome, wait_until};

type Entry = [u64; 2];

const ENTRIES: u64 = 20_000;
const CAPACITY: u32 = 64;

fn entry(i: u64) -> Entry {
    [i, i.wrapping_mul(0x9e37_79b9_7f4a_7c15)]
}

/// Test-side shared state next to the doorbell.
#[repr(C, align(64))]
struct Control {
    /// The producer sleeps here when the ring is full; the consumer notifies after each pop.
    space: EventCount,
    /// Set by the child when it saw the parent blocked in a futex before waking it.
    saw_block: AtomicU32,
    /// Condition the event-count test waits for.
    flag: AtomicU32,
}

/// The `Control` at `offset` in `mem`.
fn control(mem: &SharedMem, offset: usize) -> &Control {
    assert!(offset % 64 == 0 && offset + size_of::<Control>() <= mem.len());
    // SAFETY: inside the mapping and 64-byte aligned (page-aligned base, offset checked);
    // the memfd starts zero-filled, and all-zero bytes are a valid Control (the event count's
    // initial state, zero atomics); it is only accessed through atomics, and the reference
    // lives no longer than the borrowed mapping.
    unsafe { mem.at(offset).cast::<Control>().as_ref() }
}

fn parent_tid() -> u32 {
    std::env::var(TID_ENV)
        .expect("parent tid")
        .parse()
        .expect("numeric tid")
}

#[test]
fn doorbell_across_processes() {
    if child_role().as_deref() == Some("doorbell-producer") {
        return doorbell_producer();
    }
    let ctl_offset = Doorbell::<Entry>::bytes_for(CAPACITY);
    let mem = SharedMem::create(ctl_offset + size_of::<Control>());
    // SAFETY: the mapping is valid for its length and outlives `db` (dropped first, declared
    // later); it is only accessed through the doorbell and the control atomics.
    let db = unsafe { Doorbell::<Entry>::init(mem.ptr(), mem.len(), CAPACITY) }.unwrap();
    let ctl = control(&mem, ctl_offset);

    let child = ChildGuard::spawn(
        "doorbell_across_processes",
        "doorbell-producer",
        &mem,
        thread_id(),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut next = 0;
    let mut waits = 0u64;
    while next < ENTRIES {
        match db.poll() {
            Some(e) => {
                assert_eq!(e, entry(next), "entry {next} out of order or corrupt");
                next += 1;
                ctl.space.notify_all();
            }
            None => {
                waits += 1;
                let left = deadline.saturating_duration_since(Instant::now());
                assert!(db.wait(Some(left)), "timed out waiting for entry {next}");
            }
        }
    }
    assert_eq!(db.poll(), None, "more entries than sent");
    let status = child.wait(Duration::from_secs(30));
    assert!(status.success(), "producer process failed: {status}");
    assert_eq!(
        ctl.saw_block.load(Ordering::Relaxed),
        1,
        "the producer never saw the consumer asleep in the futex, so no cross-process wake was tested"
    );
    eprintln!("consumer waited {waits} times for {ENTRIES} entries");
}

/// Child side of `doorbell_across_processes`: attaches and rings `ENTRIES` entries.
fn doorbell_producer() {
    let mem = SharedMem::inherited();
    // SAFETY: the inherited mapping is valid for its length, outlives `db`, and the parent
    // formatted it; it is only accessed through the doorbell protocol.
    let db = unsafe { Doorbell::<Entry>::attach(mem.ptr(), mem.len()) }.unwrap();
    let ctl = control(&mem, Doorbell::<Entry>::bytes_for(CAPACITY));
    let deadline = Instant::now() + Duration::from_secs(25);
    let ppid = std::os::unix::process::parent_id();
    if wait_blocked_in_futex(ppid, parent_tid(), Instant::now() + Duration::from_secs(10)) {
        ctl.saw_block.store(1, Ordering::Relaxed);
    }
    let ring = db.ring_view();
    for i in 0..ENTRIES {
        let mut e = entry(i);
        loop {
            match db.ring(e) {
                Ok(_) => break,
                Err(Full(back)) => {
                    e = back;
                    let room = wait_until(
                        &ctl.space,
                        Duration::from_micros(20),
                        Some(deadline),
                        || ring.len() < ring.capacity(),
                    );
                    assert!(room, "ring stayed full until the deadline at entry {i}");
                }
            }
        }
    }
}

#[test]
fn event_count_in_shared_memory_times_out_without_notify() {
    let mem = SharedMem::create(4096);
    let ctl = control(&mem, 0);
    let key = ctl.space.prepare_wait();
    let start = Instant::now();
    let outcome = ctl.space.wait(key, Some(Duration::from_millis(100)));
    assert_eq!(outcome, WaitOutcome::TimedOut);
    assert!(start.elapsed() >= Duration::from_millis(100), "woke early");
    assert!(!ctl.space.has_waiters());
}

#[test]
fn event_count_wakes_across_processes() {
    if child_role().as_deref() == Some("ec-notifier") {
        return event_count_notifier();
    }
    let mem = SharedMem::create(4096);
    let ctl = control(&mem, 0);
    // Registered before the child exists, so its notify cannot miss us.
    let key = ctl.space.prepare_wait();
    let child = ChildGuard::spawn(
        "event_count_wakes_across_processes",
        "ec-notifier",
        &mem,
        thread_id(),
    );
    let start = Instant::now();
    let outcome = ctl.space.wait(key, Some(Duration::from_secs(10)));
    assert_eq!(
        outcome,
        WaitOutcome::Notified,
        "not woken by the other process"
    );
    // Acquire: pairs with the child's Release store; also ordered by the event count.
    assert_eq!(ctl.flag.load(Ordering::Acquire), 1);
    assert!(start.elapsed() < Duration::from_secs(10));
    let status = child.wait(Duration::from_secs(20));
    assert!(status.success(), "notifier process failed: {status}");
    assert_eq!(
        ctl.saw_block.load(Ordering::Relaxed),
        1,
        "the notifier never saw the waiter asleep in the futex"
    );
}

/// Child side of `event_count_wakes_across_processes`.
fn event_count_notifier() {
    let mem = SharedMem::inherited();
    let ctl = control(&mem, 0);
    assert!(
        ctl.space.has_waiters(),
        "the parent registered before spawning us"
    );
    let ppid = std::os::unix::process::parent_id();
    if wait_blocked_in_futex(ppid, parent_tid(), Instant::now() + Duration::from_secs(8)) {
        ctl.saw_block.store(1, Ordering::Relaxed);
    }
    // Release: pairs with the parent's Acquire load after it is notified.
    ctl.flag.store(1, Ordering::Release);
    ctl.space.notify_all();
}
