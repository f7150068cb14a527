//! Property test: several producer threads and several consumer threads on
//! one ring. Every entry is popped exactly once; with one consumer, each
//! producer's entries come out in the order it pushed them.
#![cfg(not(loom))]

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use cq::{EntryRing, PushError};
use proptest::prelude::*;

/// Upper bound for one case, so a bug shows up as a failure, not a hang.
const CASE_TIME: Duration = Duration::from_secs(15);

/// Entry of producer `p`, sequence `i`.
fn entry(p: usize, i: usize) -> u64 {
    // Use both halves of the word: the ring splits entries in two.
    ((p as u64) << 48) | ((i as u64) << 20) | 0xABCDE
}

fn producer_of(e: u64) -> usize {
    (e >> 48) as usize
}

fn seq_of(e: u64) -> usize {
    ((e >> 20) & 0x0FFF_FFFF) as usize
}

/// Runs one case; returns what each consumer popped, in pop order.
fn run(
    capacity: u32,
    limit: usize,
    producers: usize,
    consumers: usize,
    per: usize,
) -> Vec<Vec<u64>> {
    let ring = EntryRing::new_in_heap(capacity);
    ring.set_limit(limit).unwrap();
    let total = producers * per;
    let popped = Arc::new(AtomicUsize::new(0));
    let deadline = Instant::now() + CASE_TIME;
    std::thread::scope(|s| {
        for p in 0..producers {
            let ring = ring.clone();
            s.spawn(move || {
                for i in 0..per {
                    loop {
                        match ring.push(entry(p, i)) {
                            Ok(()) => break,
                            Err(PushError::Overrun) => {
                                assert!(Instant::now() < deadline, "producer {p} starved");
                                std::thread::yield_now();
                            }
                            Err(e) => panic!("push: {e}"),
                        }
                    }
                }
            });
        }
        let handles: Vec<_> = (0..consumers)
            .map(|_| {
                let ring = ring.clone();
                let popped = popped.clone();
                s.spawn(move || {
                    let mut got = Vec::new();
                    while popped.load(Ordering::Relaxed) < total {
                        assert!(Instant::now() < deadline, "consumers stalled");
                        // Alternate the polling and the blocking path.
                        let e = if got.len() % 2 == 0 {
                            ring.pop()
                        } else {
                            ring.wait(Duration::from_micros(5), Some(Duration::from_millis(2)))
                        };
                        match e {
                            Some(e) => {
                                got.push(e);
                                popped.fetch_add(1, Ordering::Relaxed);
                            }
                            None => std::thread::yield_now(),
                        }
                    }
                    got
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: if cfg!(miri) { 2 } else { 24 },
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn every_entry_is_popped_exactly_once(
        capacity_log in 0u32..7,
        limit_cut in 0usize..4,
        producers in 1usize..4,
        consumers in 1usize..4,
        per in 1usize..if cfg!(miri) { 20 } else { 400 },
    ) {
        let capacity = 1u32 << capacity_log;
        let limit = (capacity as usize).saturating_sub(limit_cut).max(1);
        let out = run(capacity, limit, producers, consumers, per);
        let mut seen = HashSet::new();
        for e in out.iter().flatten() {
            prop_assert!(seen.insert(*e), "entry {:#x} popped twice", e);
        }
        let expected: HashSet<u64> = (0..producers)
            .flat_map(|p| (0..per).map(move |i| entry(p, i)))
            .collect();
        prop_assert_eq!(seen, expected);
        // Each consumer still sees each producer's entries in push order
        // (FIFO ring), whatever the number of consumers.
        for got in &out {
            let mut last = vec![None; producers];
            for e in got {
                let p = producer_of(*e);
                prop_assert!(last[p].is_none_or(|l| l < seq_of(*e)), "producer {} out of order", p);
                last[p] = Some(seq_of(*e));
            }
        }
        if consumers == 1 {
            for p in 0..producers {
                let mine: Vec<usize> = out[0].iter().filter(|e| producer_of(**e) == p).map(|e| seq_of(*e)).collect();
                prop_assert_eq!(mine, (0..per).collect::<Vec<_>>());
            }
        }
    }
}
