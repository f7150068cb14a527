//! An offline model of the engine's translation cache, and synthetic
//! traces shaped like the communication of NAS kernels.
//!
//! The model indexes as the engine does (`via/src/backend/soft/tcache.rs`:
//! local regions by `handle & (sets - 1)`, LRU within a set) and counts
//! compulsory misses (first reference) apart from the others.

use std::collections::HashSet;

pub struct Replay {
    pub lookups: u64,
    pub compulsory: u64,
    pub other: u64,
}

impl Replay {
    pub fn miss_pct(&self) -> f64 {
        100.0 * (self.compulsory + self.other) as f64 / self.lookups.max(1) as f64
    }
}

/// Replays `trace` (memory handles, or any keys) against a cache of
/// `entries` (rounded up to a power of two) in sets of `ways`.
pub fn replay(trace: &[u64], entries: usize, ways: usize) -> Replay {
    let ways = ways.clamp(1, 64);
    let entries = entries.max(ways).next_power_of_two();
    let sets = (entries / ways).max(1);
    // (key, last use) per way.
    let mut slots: Vec<Option<(u64, u64)>> = vec![None; sets * ways];
    let mut seen = HashSet::new();
    let mut r = Replay {
        lookups: 0,
        compulsory: 0,
        other: 0,
    };
    for (clock, &k) in trace.iter().enumerate() {
        r.lookups += 1;
        let base = (k as usize & (sets - 1)) * ways;
        let set = &mut slots[base..base + ways];
        if let Some(s) = set.iter_mut().flatten().find(|s| s.0 == k) {
            s.1 = clock as u64;
            continue;
        }
        if seen.insert(k) {
            r.compulsory += 1;
        } else {
            r.other += 1;
        }
        // An empty way, else the least recently used.
        let victim = set.iter().position(|s| s.is_none()).unwrap_or_else(|| {
            set.iter()
                .enumerate()
                .min_by_key(|(_, s)| s.map(|x| x.1).unwrap_or(0))
                .map(|(i, _)| i)
                .unwrap_or(0)
        });
        set[victim] = Some((k, clock as u64));
    }
    r
}

/// A 32-bit handle for buffer `i` of a synthetic trace (handles are a
/// keyed permutation in the provider: pseudo-random, as here).
fn handle(i: u64) -> u64 {
    let mut x = i.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (x ^ (x >> 31)) & 0xffff_ffff
}

/// Synthetic per-process send/receive buffer traces shaped like NAS
/// kernels (not NAS runs), `scale` times their base length:
/// * `lu-like`: a wavefront, 4 neighbours, the same 8 buffers every sweep;
/// * `mg-like`: halo exchange on 6 faces over 8 grid levels down and up;
/// * `cg-like`: a transpose exchange and a reduction, 12 buffers;
/// * `bt-like`: 3 directions x 2 stages x 400 cells, each its own buffer;
/// * `is-like`: an all-to-all whose buffers are allocated afresh each
///   iteration (new registrations every time).
pub fn nas_like(scale: usize) -> Vec<(String, Vec<u64>)> {
    let mut v = Vec::new();
    let it = 50 * scale as u64;
    let mut lu = Vec::new();
    for _ in 0..it * 4 {
        for b in 0..8 {
            lu.push(handle(b));
        }
    }
    v.push(("lu-like".to_string(), lu));
    let mut mg = Vec::new();
    for _ in 0..it {
        for level in (0..8).chain((0..8).rev()) {
            for face in 0..6 {
                mg.push(handle(100 + level * 6 + face));
            }
        }
    }
    v.push(("mg-like".to_string(), mg));
    let mut cg = Vec::new();
    for _ in 0..it * 4 {
        for b in 0..12 {
            cg.push(handle(1000 + b));
        }
    }
    v.push(("cg-like".to_string(), cg));
    let mut bt = Vec::new();
    for _ in 0..it / 5 {
        for dir in 0..3 {
            for stage in 0..2 {
                for cell in 0..400 {
                    bt.push(handle(10_000 + dir * 1000 + stage * 400 + cell));
                }
            }
        }
    }
    v.push(("bt-like".to_string(), bt));
    let mut is = Vec::new();
    let mut fresh = 100_000;
    for _ in 0..it {
        for _peer in 0..16 {
            is.push(handle(fresh));
            fresh += 1;
        }
    }
    v.push(("is-like".to_string(), is));
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_working_set_that_fits_misses_only_once() {
        let t: Vec<u64> = (0..10).flat_map(|_| 0..64u64).collect();
        let r = replay(&t, 128, 128);
        assert_eq!((r.compulsory, r.other), (64, 0));
    }

    #[test]
    fn a_cycle_larger_than_the_cache_always_misses_under_lru() {
        let t: Vec<u64> = (0..4).flat_map(|_| 0..9u64).collect();
        let r = replay(&t, 8, 8);
        assert_eq!(r.compulsory, 9);
        assert_eq!(r.other, 27);
    }

    #[test]
    fn direct_mapped_conflicts_are_other_misses() {
        // 0 and 8 share set 0 of an 8-entry direct-mapped cache.
        let r = replay(&[0, 8, 0, 8], 8, 1);
        assert_eq!((r.compulsory, r.other), (2, 2));
        let r = replay(&[0, 8, 0, 8], 8, 2);
        assert_eq!((r.compulsory, r.other), (2, 0));
    }
}
