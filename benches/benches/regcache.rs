//! regcache: acquire + release of one page on a hit and on a miss, with 1, 64 and 4096 entries
//! cached. The pinner does nothing, so the numbers are the cache's own cost: lock, interval
//! tree lookup, LRU upkeep, and on a miss the insert plus the eviction of the oldest entry.

use std::convert::Infallible;
use std::hint::black_box;
use std::ops::Range;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use regcache::{Config, Pinner, RegCache, page_size};

/// Pins nothing and never fails.
struct Trivial;

impl Pinner for Trivial {
    type Pinned = ();
    type Error = Infallible;

    fn pin(&self, _pages: Range<usize>) -> Result<(), Infallible> {
        Ok(())
    }

    fn unpin(&self, _pages: Range<usize>, _pinned: ()) {}
}

const SIZES: [usize; 3] = [1, 64, 4096];

/// Start of one-page entry `i`; entries are two pages apart so none covers another.
/// The addresses are made up: nothing is dereferenced.
fn entry(i: usize) -> usize {
    (0x1000 + 2 * i) * page_size()
}

/// A cache holding `n` unreferenced one-page entries, with room for exactly `n`.
fn filled(n: usize) -> RegCache<Trivial> {
    let cache = RegCache::new(
        Trivial,
        Config {
            capacity_bytes: n * page_size(),
            capacity_regions: usize::MAX,
            ..Config::default()
        },
    );
    for i in 0..n {
        cache.release(cache.acquire(entry(i), page_size()).unwrap());
    }
    assert_eq!(cache.stats().entries, n);
    cache
}

fn hit(c: &mut Criterion) {
    let mut group = c.benchmark_group("regcache/hit");
    for n in SIZES {
        let cache = filled(n);
        let mut i = 0;
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, &n| {
            b.iter(|| {
                // An odd stride visits every entry, in an order the tree cannot predict.
                i = (i + 769) % n;
                let lease = cache
                    .acquire(black_box(entry(i) + 64), black_box(128))
                    .unwrap();
                cache.release(black_box(lease));
            });
        });
        assert_eq!(
            cache.stats().misses as usize,
            n,
            "every timed acquire must hit"
        );
    }
    group.finish();
}

fn miss(c: &mut Criterion) {
    let mut group = c.benchmark_group("regcache/miss");
    for n in SIZES {
        let cache = filled(n);
        // Cycling over n + 1 entries with room for n: each one was evicted as the oldest just
        // before it comes round again, so every acquire misses and every release evicts one.
        let mut i = n;
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, &n| {
            b.iter(|| {
                let lease = cache
                    .acquire(black_box(entry(i)), black_box(page_size()))
                    .unwrap();
                cache.release(black_box(lease));
                i = (i + 1) % (n + 1);
            });
        });
        let s = cache.stats();
        assert_eq!(s.hits, 0, "every timed acquire must miss");
        assert_eq!(s.entries, n);
    }
    group.finish();
}

criterion_group!(benches, hit, miss);
criterion_main!(benches);
