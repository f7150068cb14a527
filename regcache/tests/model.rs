//! Model test: random acquire/release/invalidate sequences against a plain reference model of
//! the cache's policy, with a pinner that checks no pin is unpinned twice and none is left
//! pinned after the cache is dropped.

mod common;

use std::collections::BTreeMap;
use std::ops::Range;

use common::{Counting, Token, covers, overlaps};
use proptest::prelude::*;
use regcache::{Config, Error, Lease, RegCache, page_size};

/// Pages of the made-up address space the ops touch (nothing is dereferenced).
const PAGES: usize = 12;

fn base() -> usize {
    0x1000 * page_size()
}

#[derive(Debug, Clone)]
enum Op {
    Acquire {
        page: usize,
        offset: usize,
        pages: usize,
        extra: usize,
    },
    /// The lease at this index modulo the number held.
    Release(usize),
    Invalidate {
        page: usize,
        offset: usize,
        pages: usize,
    },
    /// Make pins that contain this page fail from now on (`None`: stop failing).
    Refuse(Option<usize>),
    /// A region that wraps past the top of the address space.
    Overflow,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0..PAGES, 0..3usize, 0..4usize, 0..3usize)
            .prop_map(|(page, offset, pages, extra)| Op::Acquire { page, offset, pages, extra }),
        4 => any::<usize>().prop_map(Op::Release),
        1 => (0..PAGES, 0..3usize, 0..4usize)
            .prop_map(|(page, offset, pages)| Op::Invalidate { page, offset, pages }),
        1 => prop::option::weighted(0.5, 0..PAGES).prop_map(Op::Refuse),
        1 => Just(Op::Overflow),
    ]
}

/// Region start: page `page` plus one of a few offsets into it.
fn addr(page: usize, offset: usize) -> usize {
    base() + page * page_size() + [0, 1, page_size() / 2][offset]
}

/// Region length: whole pages plus one of a few odd byte counts.
fn len(pages: usize, extra: usize) -> usize {
    pages * page_size() + [0, 1, page_size() - 1][extra]
}

/// Page rounding written out again, independently of the crate.
fn rounded(addr: usize, len: usize) -> Range<usize> {
    let ps = page_size();
    let start = addr / ps * ps;
    let end = if len == 0 {
        start
    } else {
        (addr + len).div_ceil(ps) * ps
    };
    start..end
}

#[derive(Debug)]
struct Entry {
    pages: Range<usize>,
    refs: usize,
    /// Still findable: not invalidated.
    valid: bool,
    /// Release tick, while unreferenced and valid.
    lru: Option<u64>,
}

/// The cache's policy, with linear scans and entries keyed by the pinner's token id.
#[derive(Debug, Default)]
struct Model {
    capacity: usize,
    entries: BTreeMap<u64, Entry>,
    tick: u64,
    hits: u64,
    misses: u64,
    evictions: u64,
    invalidations: u64,
    unreferenced: usize,
}

impl Model {
    fn covering(&self, want: &Range<usize>) -> Vec<u64> {
        self.entries
            .iter()
            .filter(|(_, e)| e.valid && covers(&e.pages, want))
            .map(|(id, _)| *id)
            .collect()
    }

    fn hit(&mut self, id: u64) {
        let e = self.entries.get_mut(&id).unwrap();
        if e.lru.take().is_some() {
            self.unreferenced -= e.pages.len();
        }
        e.refs += 1;
        self.hits += 1;
    }

    fn release(&mut self, id: u64) {
        let e = self.entries.get_mut(&id).unwrap();
        e.refs -= 1;
        if e.refs > 0 {
            return;
        }
        if !e.valid || self.capacity == 0 || e.pages.is_empty() {
            self.entries.remove(&id);
            return;
        }
        e.lru = Some(self.tick);
        self.tick += 1;
        self.unreferenced += e.pages.len();
        while self.unreferenced > self.capacity {
            let (&victim, _) = self
                .entries
                .iter()
                .filter(|(_, e)| e.lru.is_some())
                .min_by_key(|(_, e)| e.lru)
                .unwrap();
            let e = self.entries.remove(&victim).unwrap();
            self.unreferenced -= e.pages.len();
            self.evictions += 1;
        }
    }

    fn invalidate(&mut self, range: &Range<usize>) -> usize {
        let hit: Vec<u64> = self
            .entries
            .iter()
            .filter(|(_, e)| e.valid && overlaps(&e.pages, range))
            .map(|(id, _)| *id)
            .collect();
        for id in &hit {
            let e = self.entries.get_mut(id).unwrap();
            e.valid = false;
            if e.refs == 0 {
                let e = self.entries.remove(id).unwrap();
                self.unreferenced -= e.pages.len();
            }
        }
        self.invalidations += hit.len() as u64;
        hit.len()
    }

    fn check(&self, cache: &RegCache<Counting>) {
        let s = cache.stats();
        assert_eq!(s.hits, self.hits, "hits");
        assert_eq!(s.misses, self.misses, "misses");
        assert_eq!(s.evictions, self.evictions, "evictions");
        assert_eq!(s.invalidations, self.invalidations, "invalidations");
        assert_eq!(
            s.cached_unreferenced_bytes, self.unreferenced,
            "unreferenced bytes"
        );
        assert!(s.cached_unreferenced_bytes <= self.capacity);
        let pinned: usize = self.entries.values().map(|e| e.pages.len()).sum();
        assert_eq!(s.pinned_bytes, pinned, "pinned bytes");
        assert_eq!(
            s.entries,
            self.entries.values().filter(|e| e.valid).count(),
            "entries"
        );
        // Exactly the model's entries are pinned, each under the token it was pinned with.
        let ledger = cache.pinner().ledger();
        assert_eq!(ledger.live.len(), self.entries.len(), "live pins");
        for (id, e) in &self.entries {
            assert_eq!(ledger.live.get(id), Some(&e.pages), "pin of entry {id}");
        }
    }
}

fn run(capacity_pages: usize, ops: Vec<Op>, release_at_end: Vec<bool>) {
    let pinner = Counting::default();
    let capacity = capacity_pages * page_size();
    let cache = RegCache::new(
        pinner.clone(),
        Config {
            capacity_bytes: capacity,
            ..Config::default()
        },
    );
    let mut model = Model {
        capacity,
        ..Model::default()
    };
    let mut leases: Vec<Lease<Token>> = Vec::new();

    for op in ops {
        match op {
            Op::Acquire {
                page,
                offset,
                pages,
                extra,
            } => {
                let (addr, len) = (addr(page, offset), len(pages, extra));
                let want = rounded(addr, len);
                let covering = model.covering(&want);
                match cache.acquire(addr, len) {
                    Ok(lease) => {
                        let id = lease.pinned().id;
                        assert!(covers(&lease.pages(), &want));
                        if covering.is_empty() {
                            assert_eq!(lease.pages(), want, "a miss pins its own range");
                            let entry = Entry {
                                pages: want,
                                refs: 1,
                                valid: true,
                                lru: None,
                            };
                            assert!(model.entries.insert(id, entry).is_none());
                            model.misses += 1;
                        } else {
                            assert!(covering.contains(&id), "hit on {id}, not a valid cover");
                            model.hit(id);
                        }
                        leases.push(lease);
                    }
                    Err(Error::Pin(_)) => {
                        assert!(covering.is_empty(), "pinned although covered");
                        let refuse = pinner.ledger().refuse;
                        assert!(refuse.is_some_and(|a| want.contains(&a)));
                    }
                    Err(e) => panic!("unexpected {e}"),
                }
            }
            Op::Release(which) => {
                if !leases.is_empty() {
                    let lease = leases.swap_remove(which % leases.len());
                    let id = lease.pinned().id;
                    assert!(
                        pinner.ledger().live.contains_key(&id),
                        "leased pin was unpinned"
                    );
                    cache.release(lease);
                    model.release(id);
                }
            }
            Op::Invalidate {
                page,
                offset,
                pages,
            } => {
                let (addr, len) = (addr(page, offset), len(pages, 0));
                let dropped = cache.invalidate(addr, len);
                assert_eq!(dropped, model.invalidate(&rounded(addr, len)));
            }
            Op::Refuse(page) => {
                pinner.ledger().refuse = page.map(|p| base() + p * page_size());
            }
            Op::Overflow => {
                assert!(matches!(
                    cache.acquire(usize::MAX - 3, 10),
                    Err(Error::Range(_))
                ));
            }
        }
        model.check(&cache);
    }

    // Release some of what is left and simply drop the rest: dropping the cache must unpin both.
    for (lease, release) in leases
        .into_iter()
        .zip(release_at_end.into_iter().chain(std::iter::repeat(true)))
    {
        if release {
            let id = lease.pinned().id;
            cache.release(lease);
            model.release(id);
            model.check(&cache);
        }
    }
    drop(cache);
    pinner.assert_all_unpinned();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn cache_matches_model(
        capacity_pages in prop_oneof![Just(0usize), Just(1), Just(3), Just(8)],
        ops in prop::collection::vec(op(), 1..120),
        release_at_end in prop::collection::vec(any::<bool>(), 0..32),
    ) {
        run(capacity_pages, ops, release_at_end);
    }
}

/// A fixed sequence through every branch, so a failure here reads without shrinking.
#[test]
fn scripted() {
    use Op::*;
    let ops = vec![
        Acquire {
            page: 0,
            offset: 1,
            pages: 2,
            extra: 1,
        },
        Acquire {
            page: 1,
            offset: 0,
            pages: 1,
            extra: 0,
        },
        Acquire {
            page: 2,
            offset: 2,
            pages: 2,
            extra: 0,
        },
        Release(0),
        Release(0),
        Invalidate {
            page: 2,
            offset: 0,
            pages: 0,
        },
        Refuse(Some(5)),
        Acquire {
            page: 4,
            offset: 0,
            pages: 2,
            extra: 0,
        },
        Refuse(None),
        Acquire {
            page: 4,
            offset: 0,
            pages: 0,
            extra: 0,
        },
        Overflow,
        Release(0),
        Release(0),
    ];
    for capacity in [0, 1, 8] {
        run(capacity, ops.clone(), vec![false]);
    }
}
