//! Several producers and several consumers share one doorbell; consumers sleep on it.
#![cfg(not(loom))] // needs real memory and threads; the loom models are in loom.rs

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use doorbell::{Doorbell, Full, wait_until};
use proptest::prelude::*;

fn entry(p: usize, i: u32) -> u64 {
    ((p as u64) << 32) | u64::from(i)
}

/// Checks that the consumers' logs hold every entry exactly once and that each consumer saw
/// each producer's entries in increasing order.
fn check(logs: &[Vec<u64>], producers: usize, per: u32) {
    let mut seen = vec![vec![false; per as usize]; producers];
    for (c, log) in logs.iter().enumerate() {
        let mut last: Vec<Option<u32>> = vec![None; producers];
        for &v in log {
            let (p, i) = ((v >> 32) as usize, v as u32);
            assert!(p < producers && i < per, "consumer {c}: bogus entry {v:#x}");
            assert!(!seen[p][i as usize], "entry {v:#x} delivered twice");
            seen[p][i as usize] = true;
            assert!(
                last[p].is_none_or(|l| l < i),
                "consumer {c}: producer {p} reordered"
            );
            last[p] = Some(i);
        }
    }
    for (p, s) in seen.iter().enumerate() {
        assert!(s.iter().all(|&x| x), "producer {p}: entries lost");
    }
}

fn run(producers: usize, consumers: usize, per: u32, capacity: u32) {
    let db = Doorbell::<u64>::new_in_heap(capacity);
    let total = producers as u64 * u64::from(per);
    let taken = AtomicU64::new(0);
    let done = AtomicBool::new(total == 0);
    let logs = Mutex::new(Vec::new());
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
        for _ in 0..consumers {
            let (db, taken, done, logs) = (db.clone(), &taken, &done, &logs);
            s.spawn(move || {
                let mut log = Vec::new();
                loop {
                    if let Some(v) = db.poll() {
                        log.push(v);
                        // Relaxed: a counter; `done` carries the ordering.
                        if taken.fetch_add(1, Ordering::Relaxed) + 1 == total {
                            // Release: pairs with the Acquire loads below.
                            done.store(true, Ordering::Release);
                            db.event_count().notify_all();
                        }
                        continue;
                    }
                    // Acquire: pairs with the Release store above.
                    if done.load(Ordering::Acquire) {
                        break;
                    }
                    let woke = wait_until(db.event_count(), Duration::ZERO, Some(deadline), || {
                        db.ring_view().can_pop() || done.load(Ordering::Acquire)
                    });
                    assert!(
                        woke,
                        "consumer timed out with {} taken",
                        taken.load(Ordering::Relaxed)
                    );
                }
                logs.lock().unwrap().push(log);
            });
        }
    });
    check(&logs.into_inner().unwrap(), producers, per);
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: if cfg!(miri) { 2 } else { 20 },
        ..ProptestConfig::default()
    })]

    #[test]
    fn every_entry_once_per_consumer_order(
        producers in 1usize..=3,
        consumers in 2usize..=3,
        per in 0u32..300,
        capacity_log2 in 1u32..=5,
    ) {
        run(producers, consumers, per, 1 << capacity_log2);
    }
}

#[test]
fn two_by_two_stress() {
    run(2, 2, if cfg!(miri) { 100 } else { 20_000 }, 4);
}
