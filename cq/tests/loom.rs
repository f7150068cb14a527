//! Loom models of the ring's concurrency protocol.
//!
//! Run with
//! `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=/tmp/target-cq-loom cargo test -p cq --release --test loom`.
//! Under `cfg(loom)` the ring's atomics are loom's and the ring lives in
//! loom-tracked heap objects (`EntryRing::new_in_heap`); every interleaving up
//! to the preemption bound is explored.
#![cfg(loom)]

use std::time::Duration;

use cq::{EntryRing, PushError};
use loom::thread;

/// Explores `f` with a small preemption bound so each model finishes quickly.
fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(f);
}

/// Pops everything left.
fn drain(ring: &EntryRing, got: &mut Vec<u64>) {
    while let Some(e) = ring.pop() {
        got.push(e);
    }
}

#[test]
fn two_producers_one_consumer() {
    model(|| {
        let ring = EntryRing::new_in_heap(2);
        let producers: Vec<_> = [1u64, 2]
            .into_iter()
            .map(|e| {
                let ring = ring.clone();
                thread::spawn(move || ring.push(e).unwrap())
            })
            .collect();
        // The consumer races with both producers.
        let mut got = Vec::new();
        for _ in 0..2 {
            if let Some(e) = ring.pop() {
                got.push(e);
            }
        }
        for p in producers {
            p.join().unwrap();
        }
        drain(&ring, &mut got);
        got.sort_unstable();
        assert_eq!(got, [1, 2]);
    });
}

#[test]
fn two_producers_one_consumer_wrapping_one_slot() {
    // Capacity 1: every push after the first needs the consumer to release
    // the slot, so reserve/release (contract point 2) and the wrap of the
    // stamps are exercised. Loops are bounded (loom explores every schedule,
    // including the ones where a thread never sees the others progress), so
    // a push may give up with `Overrun`; what was pushed must come out once.
    model(|| {
        let ring = EntryRing::new_in_heap(1);
        let producers: Vec<_> = [1u64 << 40 | 1, 2u64 << 40 | 2]
            .into_iter()
            .map(|e| {
                let ring = ring.clone();
                thread::spawn(move || {
                    for _ in 0..2 {
                        match ring.push(e) {
                            Ok(()) => return Some(e),
                            Err(PushError::Overrun) => thread::yield_now(),
                            Err(err) => panic!("push: {err}"),
                        }
                    }
                    None
                })
            })
            .collect();
        let mut got = Vec::new();
        for _ in 0..2 {
            if let Some(e) = ring.pop() {
                got.push(e);
            }
        }
        let mut pushed: Vec<u64> = producers
            .into_iter()
            .filter_map(|p| p.join().unwrap())
            .collect();
        drain(&ring, &mut got);
        got.sort_unstable();
        pushed.sort_unstable();
        assert_eq!(got, pushed);
        assert!(
            !pushed.is_empty(),
            "the first push into an empty ring succeeds"
        );
    });
}

#[test]
fn commit_racing_with_tombstone() {
    // A producer pushes while the owner repairs (grace zero: any reserved,
    // uncommitted slot is fair game). Exactly one of commit and tombstone
    // wins each slot; the entry arrives exactly once either way.
    model(|| {
        let ring = EntryRing::new_in_heap(2);
        let producer = {
            let ring = ring.clone();
            thread::spawn(move || ring.push(7))
        };
        let repairer = {
            let ring = ring.clone();
            thread::spawn(move || ring.repair(Duration::ZERO))
        };
        let mut got = Vec::new();
        if let Some(e) = ring.pop() {
            got.push(e);
        }
        assert_eq!(producer.join().unwrap(), Ok(()));
        let tombstoned = repairer.join().unwrap();
        assert!(tombstoned <= 1);
        drain(&ring, &mut got);
        assert_eq!(got, [7]);
        // Any tombstone was skipped: the ring is empty and usable.
        assert!(ring.is_empty());
        ring.push(8).unwrap();
        assert_eq!(ring.pop(), Some(8));
    });
}

#[test]
fn one_producer_two_consumers() {
    // Two consumers race for the head; each entry goes to exactly one, and a
    // consumer sees one producer's entries in push order.
    model(|| {
        let ring = EntryRing::new_in_heap(2);
        let producer = {
            let ring = ring.clone();
            thread::spawn(move || {
                ring.push(1).unwrap();
                ring.push(2).unwrap();
            })
        };
        let consumer = {
            let ring = ring.clone();
            thread::spawn(move || {
                let mut got = Vec::new();
                for _ in 0..2 {
                    if let Some(e) = ring.pop() {
                        got.push(e);
                    }
                }
                got
            })
        };
        let mut mine = Vec::new();
        if let Some(e) = ring.pop() {
            mine.push(e);
        }
        producer.join().unwrap();
        let theirs = consumer.join().unwrap();
        assert!(theirs.is_sorted());
        drain(&ring, &mut mine);
        assert!(mine.is_sorted());
        let mut all: Vec<u64> = mine.into_iter().chain(theirs).collect();
        all.sort_unstable();
        assert_eq!(all, [1, 2]);
    });
}

#[test]
fn two_consumers_race_for_committed_entries() {
    // The entries are committed before the consumers start: with a
    // concurrent producer, loom 0.7 does not explore every consumer/consumer
    // interleaving (see the README), and this race is the point here.
    model(|| {
        let ring = EntryRing::new_in_heap(2);
        ring.push(1).unwrap();
        ring.push(2).unwrap();
        let consumer = {
            let ring = ring.clone();
            thread::spawn(move || {
                let mut got = Vec::new();
                for _ in 0..2 {
                    if let Some(e) = ring.pop() {
                        got.push(e);
                    }
                }
                got
            })
        };
        let mut all = Vec::new();
        for _ in 0..2 {
            if let Some(e) = ring.pop() {
                all.push(e);
            }
        }
        let theirs = consumer.join().unwrap();
        assert!(theirs.is_sorted() && all.is_sorted());
        all.extend(theirs);
        drain(&ring, &mut all);
        all.sort_unstable();
        assert_eq!(all, [1, 2]);
        // Both slots were released: a full lap fits again.
        ring.push(3).unwrap();
        ring.push(4).unwrap();
        assert_eq!(ring.push(5), Err(PushError::Overrun));
    });
}

#[test]
fn repair_racing_with_two_producers() {
    // Both producers may be tombstoned mid-push; each retries, and the
    // consumer skips the tombstones: both entries arrive exactly once.
    model(|| {
        let ring = EntryRing::new_in_heap(4);
        let producers: Vec<_> = [5u64, 6]
            .into_iter()
            .map(|e| {
                let ring = ring.clone();
                thread::spawn(move || ring.push(e))
            })
            .collect();
        let tombstoned = ring.repair(Duration::ZERO);
        for p in producers {
            assert_eq!(p.join().unwrap(), Ok(()));
        }
        let mut got = Vec::new();
        drain(&ring, &mut got);
        got.sort_unstable();
        assert_eq!(got, [5, 6]);
        assert!(tombstoned <= 2);
        assert!(ring.is_empty());
    });
}

#[test]
fn close_racing_with_push() {
    // A push either lands before the close (and is drained) or gets Closed.
    model(|| {
        let ring = EntryRing::new_in_heap(2);
        let producer = {
            let ring = ring.clone();
            thread::spawn(move || ring.push(3))
        };
        ring.close();
        let result = producer.join().unwrap();
        let drained = ring.drain_closed(Duration::ZERO);
        match result {
            Ok(()) => assert_eq!(drained, [3]),
            Err(e) => {
                assert_eq!(e, PushError::Closed);
                assert!(drained.is_empty());
            }
        }
    });
}
