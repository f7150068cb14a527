//! Completion-queue micro-benches: CQ1 (`EntryRing`) against CQ2 (`Scan`).
//!
//! * `cq/ring_push_pop`: one completion through the ring, the engine's push
//!   plus the application's pop.
//! * `cq/scan_last_ready/N`: one completion found by a round-robin scan of
//!   N work queues where only the last one is ready (the worst case: every
//!   call probes all N), including the engine's status store.
//!
//! The break-even number of queues is where `scan_last_ready/N` crosses
//! `ring_push_pop` (the thesis reports ~18-20 on 2000 hardware).

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};

use cq::{EntryRing, Probe, Scan};
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};

/// A work queue as the scan sees it: completions `reported..done` are
/// unreported. One consumer, so the claim is a plain store.
struct WorkQueue {
    id: u64,
    done: AtomicU64,
    reported: AtomicU64,
}

impl WorkQueue {
    fn new(id: u64) -> Self {
        Self {
            id,
            done: AtomicU64::new(0),
            reported: AtomicU64::new(0),
        }
    }

    /// The engine completes a descriptor.
    fn complete(&self) {
        self.done.fetch_add(1, Ordering::Release);
    }
}

impl Probe for WorkQueue {
    fn take_ready(&self) -> Option<u64> {
        let reported = self.reported.load(Ordering::Relaxed);
        if self.done.load(Ordering::Acquire) == reported {
            return None;
        }
        self.reported.store(reported + 1, Ordering::Relaxed);
        Some(self.id)
    }
}

fn ring_push_pop(c: &mut Criterion) {
    let mut group = c.benchmark_group("cq");
    let ring = EntryRing::new_in_heap(1024);
    let mut entry = 0u64;
    group.bench_function("ring_push_pop", |b| {
        b.iter(|| {
            entry = entry.wrapping_add(1);
            ring.push(black_box(entry)).unwrap();
            black_box(ring.pop())
        })
    });
    group.finish();
}

fn scan_last_ready(c: &mut Criterion) {
    let mut group = c.benchmark_group("cq");
    for n in [1usize, 4, 16, 64] {
        let queues: Vec<WorkQueue> = (0..n as u64).map(WorkQueue::new).collect();
        let last = &queues[n - 1];
        let mut scan = Scan::new();
        group.bench_with_input(BenchmarkId::new("scan_last_ready", n), &n, |b, _| {
            b.iter(|| {
                last.complete();
                let got = scan.next(black_box(&queues[..]));
                debug_assert_eq!(got, Some(n as u64 - 1));
                black_box(got)
            })
        });
    }
    group.finish();
}

criterion_group!(benches, ring_push_pop, scan_last_ready);
criterion_main!(benches);
