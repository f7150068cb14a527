//! Threads acquiring, releasing and invalidating overlapping ranges of one cache at once.
//!
//! Checks the invariants the model test checks, as far as they hold under concurrency: a
//! leased pin is never unpinned, nothing is unpinned twice, a lease covers what was asked,
//! no acquire returns an entry pinned before an invalidation of its pages, and dropping the
//! cache unpins everything.

mod common;

use std::ops::Range;
use std::sync::Barrier;
use std::thread;

use common::{Counting, Token, covers, overlaps};
use regcache::{Config, Error, Lease, RegCache, page_range, page_size};

const THREADS: usize = 4;
const OPS: usize = 3000;
/// Pages in the shared made-up address space: small, so ranges overlap a lot.
const PAGES: usize = 24;
const CAPACITY_PAGES: usize = 8;

struct XorShift(u64);

impl XorShift {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// What one thread did, for the checks after the join.
#[derive(Default)]
struct Tally {
    acquired: u64,
    refused: u64,
}

fn worker(cache: &RegCache<Counting>, seed: u64) -> Tally {
    let ps = page_size();
    let base = 0x1000 * ps;
    let mut rng = XorShift(seed);
    let mut held: Vec<Lease<Token>> = Vec::new();
    // (first pin id not yet handed out before the call, invalidated pages)
    let mut invalidated: Vec<(u64, Range<usize>)> = Vec::new();
    let mut tally = Tally::default();
    for _ in 0..OPS {
        let addr = base + rng.below(PAGES) * ps + rng.below(ps);
        let len = rng.below(4 * ps);
        match rng.below(10) {
            0..=4 if held.len() < 6 => {
                let want = page_range(addr, len).unwrap();
                match cache.acquire(addr, len) {
                    Ok(lease) => {
                        tally.acquired += 1;
                        assert!(covers(&lease.pages(), &want));
                        assert_eq!(lease.pinned().pages, lease.pages());
                        let id = lease.pinned().id;
                        for (mark, range) in &invalidated {
                            assert!(
                                id >= *mark || !overlaps(&lease.pages(), range),
                                "got pin {id} of {:x?}, older than invalidation of {range:x?}",
                                lease.pages()
                            );
                        }
                        held.push(lease);
                    }
                    Err(Error::Pin(_)) => tally.refused += 1,
                    Err(e) => panic!("unexpected {e}"),
                }
            }
            0..=8 if !held.is_empty() => {
                let lease = held.swap_remove(rng.below(held.len()));
                let id = lease.pinned().id;
                assert!(
                    cache.pinner().ledger().live.contains_key(&id),
                    "leased pin {id} unpinned"
                );
                cache.release(lease);
            }
            9 => {
                let mark = cache.pinner().ledger().next_id;
                cache.invalidate(addr, len);
                invalidated.push((mark, page_range(addr, len).unwrap()));
            }
            _ => {}
        }
    }
    for lease in held {
        cache.release(lease);
    }
    tally
}

#[test]
fn threads_share_one_cache() {
    let pinner = Counting::default();
    // Pins of ranges holding the last page fail, so the error path runs concurrently too.
    pinner.ledger().refuse = Some(0x1000 * page_size() + (PAGES - 1) * page_size());
    let capacity = CAPACITY_PAGES * page_size();
    let cache = RegCache::new(
        pinner.clone(),
        Config {
            capacity_bytes: capacity,
            ..Config::default()
        },
    );
    let start = Barrier::new(THREADS);
    let tallies: Vec<Tally> = thread::scope(|s| {
        let workers: Vec<_> = (0..THREADS as u64)
            .map(|t| {
                let (cache, start) = (&cache, &start);
                s.spawn(move || {
                    start.wait();
                    worker(cache, 0x9e37_79b9 + t * 0x1234_5677)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("worker panicked"))
            .collect()
    });

    let acquired: u64 = tallies.iter().map(|t| t.acquired).sum();
    let s = cache.stats();
    assert_eq!(s.hits + s.misses, acquired);
    assert!(
        s.hits > 0 && s.misses > 0 && s.evictions > 0 && s.invalidations > 0,
        "{s:?}"
    );
    assert!(tallies.iter().map(|t| t.refused).sum::<u64>() > 0);
    // Every lease is back: what is still pinned is exactly the cache's unreferenced entries.
    assert!(s.cached_unreferenced_bytes <= capacity);
    assert_eq!(s.pinned_bytes, s.cached_unreferenced_bytes);
    {
        let ledger = pinner.ledger();
        assert_eq!(ledger.live.len(), s.entries);
        assert_eq!(
            ledger.live.values().map(|r| r.len()).sum::<usize>(),
            s.pinned_bytes
        );
    }
    drop(cache);
    pinner.assert_all_unpinned();
}
