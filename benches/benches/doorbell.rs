//! Micro-benchmarks of the doorbell crate: ring push/pop, doorbell ring, cross-thread ping.

use std::hint::black_box;
use std::thread;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use doorbell::{Doorbell, Ring, wait_until};

/// Descriptor-sized entry, like the physical descriptors the engine receives.
type Entry = [u64; 4];

/// How long a ping side spins before it sleeps in the futex.
const SPIN: Duration = Duration::from_micros(50);
/// Bound on any single wait in the ping benchmark, so a bug fails instead of hanging.
const WAIT_LIMIT: Duration = Duration::from_secs(10);

fn push_pop(c: &mut Criterion) {
    let ring = Ring::<Entry>::new_in_heap(1024);
    c.bench_function("ring/push_pop", |b| {
        b.iter(|| {
            ring.push(black_box([1, 2, 3, 4])).unwrap();
            black_box(ring.pop().unwrap())
        })
    });
}

fn ring_no_sleeper(c: &mut Criterion) {
    let db = Doorbell::<Entry>::new_in_heap(1024);
    let mut group = c.benchmark_group("doorbell");
    group.bench_function("ring_poll_no_sleeper", |b| {
        b.iter(|| {
            black_box(db.ring(black_box([1, 2, 3, 4])).unwrap());
            black_box(db.poll().unwrap())
        })
    });
    // Baseline for the cost of the notify check (fence + load) in `ring`.
    group.bench_function("push_quiet_poll", |b| {
        b.iter(|| {
            black_box(db.push_quiet(black_box([1, 2, 3, 4])).unwrap());
            black_box(db.poll().unwrap())
        })
    });
    group.finish();
}

/// Waits for an entry on `db` (spin, then futex), then takes it.
fn take(db: &Doorbell<Entry>) -> Entry {
    loop {
        if let Some(e) = db.poll() {
            return e;
        }
        let deadline = Instant::now() + WAIT_LIMIT;
        let ready = wait_until(db.event_count(), SPIN, Some(deadline), || {
            db.ring_view().can_pop()
        });
        assert!(ready, "ping partner stopped answering");
    }
}

fn ping_two_threads(c: &mut Criterion) {
    const STOP: u64 = u64::MAX;
    let to_echo = Doorbell::<Entry>::new_in_heap(64);
    let back = Doorbell::<Entry>::new_in_heap(64);
    let echo = {
        let (to_echo, back) = (to_echo.clone(), back.clone());
        thread::spawn(move || {
            loop {
                let e = take(&to_echo);
                if e[0] == STOP {
                    break;
                }
                back.ring(e).unwrap();
            }
        })
    };
    c.bench_function("doorbell/ping_two_threads", |b| {
        let mut i = 0u64;
        b.iter(|| {
            i += 1;
            to_echo.ring(black_box([i, 0, 0, 0])).unwrap();
            let e = take(&back);
            assert_eq!(e[0], i);
            black_box(e)
        })
    });
    to_echo.ring([STOP, 0, 0, 0]).unwrap();
    echo.join().unwrap();
}

criterion_group!(benches, push_pop, ring_no_sleeper, ping_two_threads);
criterion_main!(benches);
