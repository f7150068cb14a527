//! Reference counts over address ranges: which parts of a range become
//! used (0 → 1) or unused (1 → 0) when a range is added or removed.
//!
//! The arenas use it to keep `MADV_DONTFORK` on exactly the pages that some
//! live registration holds, however the registrations overlap.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::ops::Range;

/// Counts per address, stored as breakpoints: the count at `a` is the
/// value of the last breakpoint at or before `a` (0 before the first).
#[derive(Debug, Default)]
pub struct RangeCounter {
    points: BTreeMap<usize, u32>,
}

impl RangeCounter {
    /// An empty counter (every count is 0).
    pub fn new() -> RangeCounter {
        RangeCounter::default()
    }

    fn at(&self, a: usize) -> u32 {
        self.points.range(..=a).next_back().map_or(0, |(_, &c)| c)
    }

    /// Makes `a` a breakpoint (keeping the counts).
    fn split(&mut self, a: usize) {
        let c = self.at(a);
        self.points.entry(a).or_insert(c);
    }

    /// Adds `delta` (+1 or -1) to every address of `r`; returns the maximal
    /// sub-ranges whose count crossed between 0 and 1 (0 → 1 for +1,
    /// 1 → 0 for -1), in address order.
    ///
    /// # Panics
    /// If a count would go below zero (a release without a hold).
    pub fn add(&mut self, r: Range<usize>, delta: i32) -> Vec<Range<usize>> {
        let mut crossed: Vec<Range<usize>> = Vec::new();
        if r.is_empty() {
            return crossed;
        }
        self.split(r.start);
        self.split(r.end);
        let keys: Vec<usize> = self.points.range(r.start..r.end).map(|(&k, _)| k).collect();
        for (i, &k) in keys.iter().enumerate() {
            let end = keys.get(i + 1).copied().unwrap_or(r.end);
            let c = self.points.get_mut(&k).expect("breakpoint");
            let before = *c;
            *c = if delta > 0 {
                before + 1
            } else {
                before
                    .checked_sub(1)
                    .expect("range released more often than held")
            };
            let cross = if delta > 0 { before == 0 } else { *c == 0 };
            if cross {
                match crossed.last_mut() {
                    Some(last) if last.end == k => last.end = end,
                    _ => crossed.push(k..end),
                }
            }
        }
        // Drop breakpoints that no longer change the count.
        let lo = self.points.range(..r.start).next_back().map(|(&k, _)| k);
        let mut prev = lo.map_or(0, |k| self.points[&k]);
        let keys: Vec<usize> = self
            .points
            .range(r.start..=r.end)
            .map(|(&k, _)| k)
            .collect();
        for k in keys {
            let c = self.points[&k];
            if c == prev {
                self.points.remove(&k);
            } else {
                prev = c;
            }
        }
        crossed
    }

    /// The maximal sub-ranges of `r` whose count is 0.
    pub fn free_parts(&self, r: Range<usize>) -> Vec<Range<usize>> {
        let mut out: Vec<Range<usize>> = Vec::new();
        if r.is_empty() {
            return out;
        }
        let mut at = r.start;
        let mut c = self.at(at);
        for (&k, &v) in self.points.range(r.start + 1..r.end) {
            if c == 0 {
                out.push(at..k);
            }
            at = k;
            c = v;
        }
        if c == 0 && at < r.end {
            out.push(at..r.end);
        }
        // Merge neighbours split by breakpoints of equal zero counts.
        let mut merged: Vec<Range<usize>> = Vec::new();
        for x in out {
            match merged.last_mut() {
                Some(l) if l.end == x.start => l.end = x.end,
                _ => merged.push(x),
            }
        }
        merged
    }

    /// Whether every count is 0.
    pub fn is_empty(&self) -> bool {
        self.points.values().all(|&c| c == 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_holds_cross_zero_once() {
        let mut c = RangeCounter::new();
        assert_eq!(c.add(10..20, 1), vec![10..20]);
        assert_eq!(c.add(15..30, 1), vec![20..30]);
        assert_eq!(c.free_parts(0..40), vec![0..10, 30..40]);
        assert_eq!(c.add(10..20, -1), vec![10..15]);
        assert_eq!(c.free_parts(0..40), vec![0..15, 30..40]);
        assert_eq!(c.add(15..30, -1), vec![15..30]);
        assert!(c.is_empty());
        assert_eq!(c.free_parts(0..40), vec![0..40]);
        assert!(c.points.is_empty(), "no stale breakpoints: {:?}", c.points);
    }

    #[test]
    fn nested_and_adjacent() {
        let mut c = RangeCounter::new();
        assert_eq!(c.add(0..100, 1), vec![0..100]);
        assert!(c.add(20..30, 1).is_empty());
        assert!(c.add(20..30, -1).is_empty());
        assert_eq!(c.add(100..110, 1), vec![100..110]);
        assert_eq!(c.add(0..100, -1), vec![0..100]);
        assert_eq!(c.free_parts(0..120), vec![0..100, 110..120]);
        assert_eq!(c.add(100..110, -1), vec![100..110]);
        assert!(c.points.is_empty());
    }

    #[test]
    #[should_panic(expected = "released more often")]
    fn release_without_hold_panics() {
        RangeCounter::new().add(0..10, -1);
    }

    #[test]
    fn matches_a_per_address_model() {
        // Deterministic pseudo-random operations against a plain array.
        let mut model = [0u32; 64];
        let mut c = RangeCounter::new();
        let mut held: Vec<Range<usize>> = Vec::new();
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        for _ in 0..2000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let add = held.is_empty() || x % 3 != 0;
            let r = if add {
                let a = (x >> 8) as usize % 64;
                let b = a + 1 + (x >> 20) as usize % (64 - a);
                held.push(a..b);
                a..b
            } else {
                held.swap_remove((x >> 8) as usize % held.len())
            };
            let before = model;
            for m in &mut model[r.clone()] {
                *m = if add { *m + 1 } else { *m - 1 };
            }
            let crossed = c.add(r.clone(), if add { 1 } else { -1 });
            let want: Vec<usize> = r
                .clone()
                .filter(|&i| if add { before[i] == 0 } else { model[i] == 0 })
                .collect();
            let got: Vec<usize> = crossed.iter().flat_map(|r| r.clone()).collect();
            assert_eq!(got, want);
            let free: Vec<usize> = c.free_parts(0..64).iter().flat_map(|r| r.clone()).collect();
            let want_free: Vec<usize> = (0..64).filter(|&i| model[i] == 0).collect();
            assert_eq!(free, want_free);
        }
    }
}
