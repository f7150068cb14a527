//! Several producer threads ring one doorbell; one consumer polls and sleeps on it.
#![cfg(not(loom))] // needs real memory and threads; the loom models are in loom.rs

use std::time::{Duration, Instant};

use doorbell::{Doorbell, Full};
use proptest::prelude::*;

/// Entry of producer `p`, sequence `i`.
fn entry(p: usize, i: u32) -> u64 {
    ((p as u64) << 32) | u64::from(i)
}

/// Runs `producers` threads ringing `per` entries each into a doorbell of `capacity`; the
/// calling thread consumes with `poll` + `wait` and checks that every entry arrives exactly
/// once and each producer's entries arrive in order.
fn run(producers: usize, per: u32, capacity: u32) {
    let db = Doorbell::<u64>::new_in_heap(capacity);
    let total = producers as u64 * u64::from(per);
    let deadline = Instant::now() + Duration::from_secs(20);
    std::thread::scope(|s| {
        for p in 0..producers {
            let db = db.clone();
            s.spawn(move || {
                for i in 0..per {
                    let mut v = entry(p, i);
                    while let Err(Full(back)) = db.ring(v) {
                        v = back;
                        assert!(
                            Instant::now() < deadline,
                            "producer {p} stuck on a full ring"
                        );
                        std::thread::yield_now();
                    }
                }
            });
        }
        let mut next = vec![0u32; producers];
        let mut got = 0u64;
        while got < total {
            match db.poll() {
                Some(v) => {
                    let (p, i) = ((v >> 32) as usize, v as u32);
                    assert!(p < producers, "entry {v:#x} from no producer");
                    assert_eq!(
                        i, next[p],
                        "producer {p}: wrong entry (lost, duplicated or reordered)"
                    );
                    next[p] += 1;
                    got += 1;
                }
                None => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    assert!(
                        db.wait(Some(left)),
                        "consumer timed out after {got}/{total}"
                    );
                }
            }
        }
        assert_eq!(db.poll(), None, "entries beyond those sent");
    });
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: if cfg!(miri) { 2 } else { 24 },
        ..ProptestConfig::default()
    })]

    #[test]
    fn every_entry_once_in_producer_order(
        producers in 1usize..=4,
        per in 0u32..400,
        capacity_log2 in 1u32..=6,
    ) {
        run(producers, per, 1 << capacity_log2);
    }
}

#[test]
fn three_producers_small_ring_stress() {
    run(3, if cfg!(miri) { 100 } else { 20_000 }, 8);
}
