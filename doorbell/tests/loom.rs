//! Loom models of the ring and of the sleep/wake handshake.
//!
//! Run with:
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 cargo test -p doorbell --release --test loom`
//!
//! Under loom the crate's atomics, slot cells and futex (a loom Mutex + Condvar model) are
//! loom's, so every interleaving and every permitted weak-memory outcome up to the
//! preemption bound is explored. A lost wake-up shows up as a deadlock, which loom reports.
#![cfg(loom)]

use loom::sync::Arc;
use loom::sync::atomic::{AtomicBool, Ordering};
use loom::thread;

use doorbell::{Doorbell, EventCount, Full, Ring, wait_until};

/// Loom's model builder with a default preemption bound of 3 (overridable from the
/// environment), so the models finish in seconds.
fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(3);
    }
    builder.check(f);
}

#[test]
fn two_producers_one_consumer_ring() {
    // Two producers race for slots of a 2-slot ring whose positions already wrapped once,
    // while the consumer pops. Nobody spins on a full or empty ring (two spinning threads can
    // starve a third forever in loom's scheduler): a producer that finds the ring full keeps
    // its entry, and the consumer drains after joining. Every accepted entry must come out
    // exactly once and in its producer's order; refused ones never.
    model(|| {
        let ring = Ring::<u32>::new_in_heap(2);
        ring.push(99).unwrap();
        assert_eq!(ring.pop(), Some(99));
        let producers: Vec<_> = [vec![0x000, 0x001], vec![0x100]]
            .into_iter()
            .map(|entries| {
                let ring = ring.clone();
                thread::spawn(move || {
                    let mut accepted = Vec::new();
                    for v in entries {
                        match ring.push(v) {
                            Ok(_) => accepted.push(v),
                            Err(Full(back)) => assert_eq!(back, v),
                        }
                    }
                    accepted
                })
            })
            .collect();
        let mut got = Vec::new();
        for _ in 0..2 {
            match ring.pop() {
                Some(v) => got.push(v),
                None => thread::yield_now(),
            }
        }
        let mut accepted: Vec<u32> = Vec::new();
        for p in producers {
            accepted.extend(p.join().unwrap());
        }
        while let Some(v) = ring.pop() {
            got.push(v);
        }
        // Per-producer order: entries of one producer come out in increasing order.
        for p in [0x000, 0x100] {
            let mine: Vec<u32> = got.iter().copied().filter(|v| v & 0xf00 == p).collect();
            assert!(
                mine.windows(2).all(|w| w[0] < w[1]),
                "producer {p:#x} reordered: {got:?}"
            );
        }
        got.sort_unstable();
        accepted.sort_unstable();
        assert_eq!(got, accepted, "lost or duplicated entries");
        assert!(
            accepted.len() >= 2,
            "a 2-slot ring refused an entry with room: {accepted:?}"
        );
    });
}

#[test]
fn one_producer_one_consumer_wraps_through_full() {
    // SPSC through a 2-slot ring, three entries: the producer meets a full ring and the
    // slots are reused. Only one thread can spin at a time, which loom handles.
    model(|| {
        let ring = Ring::<u32>::new_in_heap(2);
        let producer = {
            let ring = ring.clone();
            thread::spawn(move || {
                for i in 0..3 {
                    let mut v = i;
                    while let Err(Full(back)) = ring.push(v) {
                        v = back;
                        thread::yield_now();
                    }
                }
            })
        };
        for i in 0..3 {
            loop {
                if let Some(v) = ring.pop() {
                    assert_eq!(v, i);
                    break;
                }
                thread::yield_now();
            }
        }
        producer.join().unwrap();
        assert_eq!(ring.pop(), None);
    });
}

#[test]
fn consumer_going_to_sleep_is_woken_by_ring() {
    model(|| {
        let db = Doorbell::<u32>::new_in_heap(2);
        let producer = {
            let db = db.clone();
            thread::spawn(move || {
                db.ring(7).unwrap();
            })
        };
        loop {
            if let Some(v) = db.poll() {
                assert_eq!(v, 7);
                break;
            }
            // Blocks in the futex model; a lost wake-up deadlocks the model.
            assert!(db.wait(None));
        }
        producer.join().unwrap();
    });
}

#[test]
fn consumer_asleep_on_uncommitted_slot_is_woken() {
    // P1 may reserve slot k while P2 reserves k+1 and commits; the consumer finds k
    // uncommitted and sleeps; P1's commit must wake it, though P1 did not see an empty ring.
    model(|| {
        let db = Doorbell::<u32>::new_in_heap(2);
        let producers: Vec<_> = (1..=2u32)
            .map(|v| {
                let db = db.clone();
                thread::spawn(move || {
                    db.ring(v).unwrap();
                })
            })
            .collect();
        let mut got = Vec::new();
        while got.len() < 2 {
            match db.poll() {
                Some(v) => got.push(v),
                None => assert!(db.wait(None)),
            }
        }
        got.sort_unstable();
        assert_eq!(got, [1, 2]);
        for p in producers {
            p.join().unwrap();
        }
    });
}

/// A thread that sets `flag` and notifies `ec` (the publish-then-notify side).
fn spawn_notifier(ec: &Arc<EventCount>, flag: &Arc<AtomicBool>) -> thread::JoinHandle<()> {
    let (ec, flag) = (ec.clone(), flag.clone());
    thread::spawn(move || {
        // Release: pairs with the waiter's Acquire load in the condition.
        flag.store(true, Ordering::Release);
        ec.notify_all();
    })
}

#[test]
fn event_count_handshake_loses_no_wakeup() {
    model(|| {
        let ec = Arc::new(EventCount::new());
        let flag = Arc::new(AtomicBool::new(false));
        let notifier = spawn_notifier(&ec, &flag);
        let ok = wait_until(&ec, std::time::Duration::ZERO, None, || {
            flag.load(Ordering::Acquire)
        });
        assert!(ok);
        assert!(!ec.has_waiters());
        notifier.join().unwrap();
    });
}

#[test]
fn armed_event_count_disarmed_under_a_waiter_loses_no_wakeup() {
    // The event count was armed by an earlier sleeper; a waiter registers on the armed path
    // while the count disarms and a notifier publishes: the waiter must still be woken (or
    // see the flag).
    model(|| {
        let ec = Arc::new(EventCount::new());
        let key = ec.prepare_wait();
        ec.cancel_wait(key);
        assert!(ec.is_armed());
        let flag = Arc::new(AtomicBool::new(false));
        let notifier = spawn_notifier(&ec, &flag);
        let disarmer = {
            let ec = ec.clone();
            thread::spawn(move || ec.disarm())
        };
        let ok = wait_until(&ec, std::time::Duration::ZERO, None, || {
            flag.load(Ordering::Acquire)
        });
        assert!(ok);
        notifier.join().unwrap();
        disarmer.join().unwrap();
        assert!(!ec.has_waiters());
    });
}
