//! Interval tree of cache entries: finds an extent that covers a range, or every extent that
//! overlaps one, in O(log n) expected time.
//!
//! A `BTreeMap` keyed by start is not enough, because entries are never merged: the entry that
//! covers `[a, b)` may start long before `a`, with many shorter entries in between. So this is a
//! treap (a binary search tree that is also a heap on random priorities, which keeps its
//! expected depth O(log n)) keyed by `(start, id)`, whose nodes also hold `max_end`, the largest
//! end in their subtree. Among the entries that start at or before `a`, one covers `[a, b)` iff
//! the largest end among them reaches `b`, and `max_end` finds it without visiting the others.
//! Nodes live in a `Vec` and link by index, so the tree needs no `unsafe` and no `Box` per node.
#![forbid(unsafe_code)]

use std::ops::Range;

/// Index of a node in [`IntervalTree::nodes`], or `None` for an empty subtree.
type Link = Option<usize>;

#[derive(Debug)]
struct Node {
    start: usize,
    end: usize,
    /// Tie-breaker for entries with the same start, and what the tree hands back.
    id: usize,
    /// Heap priority: a parent's is at least its children's.
    prio: u64,
    left: Link,
    right: Link,
    /// Largest `end` in this node's subtree, itself included.
    max_end: usize,
}

/// Interval tree over non-empty `start..end` extents, each tagged with a unique id.
#[derive(Debug)]
pub(crate) struct IntervalTree {
    nodes: Vec<Node>,
    /// Slots of `nodes` left by [`IntervalTree::remove`], reused by [`IntervalTree::insert`].
    free: Vec<usize>,
    root: Link,
    len: usize,
    /// xorshift64 state for node priorities. A fixed seed is fine: keys do not depend on it.
    rng: u64,
}

impl IntervalTree {
    pub(crate) fn new() -> Self {
        Self {
            nodes: Vec::new(),
            free: Vec::new(),
            root: None,
            len: 0,
            rng: 0x9e37_79b9_7f4a_7c15,
        }
    }

    /// Number of extents in the tree.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Adds `extent` under `id`. The pair `(extent.start, id)` must not be in the tree yet.
    pub(crate) fn insert(&mut self, extent: Range<usize>, id: usize) {
        debug_assert!(extent.start < extent.end, "empty extent {extent:?}");
        let node = Node {
            start: extent.start,
            end: extent.end,
            id,
            prio: self.next_prio(),
            left: None,
            right: None,
            max_end: extent.end,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.nodes[i] = node;
                i
            }
            None => {
                self.nodes.push(node);
                self.nodes.len() - 1
            }
        };
        let (lower, upper) = self.split(self.root, (extent.start, id), false);
        let lower = self.merge(lower, Some(i));
        self.root = self.merge(lower, upper);
        self.len += 1;
    }

    /// Removes the extent that starts at `start` under `id`; returns whether it was there.
    pub(crate) fn remove(&mut self, start: usize, id: usize) -> bool {
        let (lower, rest) = self.split(self.root, (start, id), false);
        let (found, upper) = self.split(rest, (start, id), true);
        self.root = self.merge(lower, upper);
        match found {
            Some(i) => {
                debug_assert!(self.nodes[i].left.is_none() && self.nodes[i].right.is_none());
                self.free.push(i);
                self.len -= 1;
                true
            }
            None => false,
        }
    }

    /// Id of an extent that contains all of `want` (`start <= want.start`, `end >= want.end`).
    pub(crate) fn find_covering(&self, want: &Range<usize>) -> Option<usize> {
        let mut cur = self.root;
        while let Some(i) = cur {
            let node = &self.nodes[i];
            if node.max_end < want.end {
                // Nothing below here reaches far enough.
                return None;
            }
            if node.start <= want.start {
                // Every key in the left subtree is smaller, so every start there qualifies
                // too: only the end decides.
                if let Some(left) = node.left {
                    if self.nodes[left].max_end >= want.end {
                        return Some(self.any_reaching(left, want.end));
                    }
                }
                if node.end >= want.end {
                    return Some(node.id);
                }
                cur = node.right;
            } else {
                cur = node.left;
            }
        }
        None
    }

    /// Id of some extent in the subtree at `i` whose end is at least `end`; `max_end` of that
    /// subtree must be at least `end`.
    fn any_reaching(&self, mut i: usize, end: usize) -> usize {
        loop {
            let node = &self.nodes[i];
            match node.left {
                Some(left) if self.nodes[left].max_end >= end => i = left,
                _ if node.end >= end => return node.id,
                _ => {
                    i = node
                        .right
                        .expect("max_end says an extent below reaches `end`")
                }
            }
        }
    }

    /// Pushes onto `out` the id of every extent that shares at least one byte with `range`.
    pub(crate) fn overlapping(&self, range: &Range<usize>, out: &mut Vec<usize>) {
        let mut stack: Vec<usize> = self.root.into_iter().collect();
        while let Some(i) = stack.pop() {
            let node = &self.nodes[i];
            if node.max_end <= range.start {
                // The whole subtree ends before the range.
                continue;
            }
            stack.extend(node.left);
            if node.start < range.end {
                if node.end > range.start {
                    out.push(node.id);
                }
                // Right keys start at or after this node, so only worth a look if it started
                // before the range ends.
                stack.extend(node.right);
            }
        }
    }

    /// Splits the subtree at `t` into keys below `key` (or at most `key`, if `inclusive`) and
    /// the rest.
    fn split(&mut self, t: Link, key: (usize, usize), inclusive: bool) -> (Link, Link) {
        let Some(i) = t else { return (None, None) };
        let node_key = (self.nodes[i].start, self.nodes[i].id);
        let goes_lower = if inclusive {
            node_key <= key
        } else {
            node_key < key
        };
        if goes_lower {
            let (lower, upper) = self.split(self.nodes[i].right, key, inclusive);
            self.nodes[i].right = lower;
            self.update(i);
            (Some(i), upper)
        } else {
            let (lower, upper) = self.split(self.nodes[i].left, key, inclusive);
            self.nodes[i].left = upper;
            self.update(i);
            (lower, Some(i))
        }
    }

    /// Joins two subtrees; every key in `a` must be smaller than every key in `b`.
    fn merge(&mut self, a: Link, b: Link) -> Link {
        match (a, b) {
            (None, t) | (t, None) => t,
            (Some(i), Some(j)) => {
                if self.nodes[i].prio >= self.nodes[j].prio {
                    let right = self.nodes[i].right;
                    self.nodes[i].right = self.merge(right, b);
                    self.update(i);
                    Some(i)
                } else {
                    let left = self.nodes[j].left;
                    self.nodes[j].left = self.merge(a, left);
                    self.update(j);
                    Some(j)
                }
            }
        }
    }

    /// Recomputes `max_end` of node `i` from its children.
    fn update(&mut self, i: usize) {
        let node = &self.nodes[i];
        let max_end = [node.left, node.right]
            .into_iter()
            .flatten()
            .map(|c| self.nodes[c].max_end)
            .fold(node.end, usize::max);
        self.nodes[i].max_end = max_end;
    }

    fn next_prio(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    #[cfg(test)]
    fn depth(&self) -> usize {
        fn walk(tree: &IntervalTree, t: Link) -> usize {
            t.map_or(0, |i| {
                1 + walk(tree, tree.nodes[i].left).max(walk(tree, tree.nodes[i].right))
            })
        }
        walk(self, self.root)
    }

    /// Checks key order, heap order and `max_end` everywhere.
    #[cfg(test)]
    fn check(&self) {
        fn walk(
            tree: &IntervalTree,
            t: Link,
            lo: Option<(usize, usize)>,
        ) -> (usize, Option<(usize, usize)>) {
            let Some(i) = t else { return (0, lo) };
            let n = &tree.nodes[i];
            for c in [n.left, n.right].into_iter().flatten() {
                assert!(tree.nodes[c].prio <= n.prio, "heap order");
            }
            let (lcount, last) = walk(tree, n.left, lo);
            assert!(last.is_none_or(|k| k < (n.start, n.id)), "key order");
            let (rcount, last) = walk(tree, n.right, Some((n.start, n.id)));
            let want = [n.left, n.right]
                .into_iter()
                .flatten()
                .map(|c| tree.nodes[c].max_end)
                .fold(n.end, usize::max);
            assert_eq!(n.max_end, want, "max_end");
            (lcount + rcount + 1, last)
        }
        assert_eq!(walk(self, self.root, None).0, self.len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Small deterministic generator, so the test needs no dependency and replays exactly.
    struct XorShift(u64);
    impl XorShift {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 % n as u64) as usize
        }
    }

    #[test]
    fn matches_brute_force() {
        let mut rng = XorShift(0x1234_5678);
        let mut tree = IntervalTree::new();
        let mut all: Vec<(Range<usize>, usize)> = Vec::new();
        for id in 0..3000usize {
            if !all.is_empty() && rng.below(3) == 0 {
                let (extent, id) = all.swap_remove(rng.below(all.len()));
                assert!(tree.remove(extent.start, id));
                assert!(!tree.remove(extent.start, id));
            } else {
                let start = rng.below(200);
                let extent = start..start + 1 + rng.below(30);
                tree.insert(extent.clone(), id);
                all.push((extent, id));
            }
            let a = rng.below(220);
            let want = a..a + 1 + rng.below(20);
            match tree.find_covering(&want) {
                Some(found) => {
                    let (extent, _) = all.iter().find(|(_, i)| *i == found).expect("known id");
                    assert!(extent.start <= want.start && extent.end >= want.end);
                }
                None => assert!(
                    !all.iter()
                        .any(|(e, _)| e.start <= want.start && e.end >= want.end),
                    "missed a cover of {want:?}"
                ),
            }
            let mut got = Vec::new();
            tree.overlapping(&want, &mut got);
            got.sort_unstable();
            let mut expected: Vec<usize> = all
                .iter()
                .filter(|(e, _)| e.start < want.end && want.start < e.end)
                .map(|(_, i)| *i)
                .collect();
            expected.sort_unstable();
            assert_eq!(got, expected);
            if id % 100 == 0 {
                tree.check();
            }
        }
        tree.check();
        assert_eq!(tree.len(), all.len());
    }

    #[test]
    fn same_start_different_ids() {
        let mut tree = IntervalTree::new();
        tree.insert(10..20, 1);
        tree.insert(10..30, 2);
        tree.insert(10..15, 3);
        assert_eq!(tree.find_covering(&(12..25)), Some(2));
        assert!(tree.remove(10, 2));
        assert_eq!(tree.find_covering(&(12..25)), None);
        assert_eq!(tree.find_covering(&(12..18)), Some(1));
        tree.check();
    }

    #[test]
    fn cover_starting_far_before_many_short_entries() {
        // The case a start-keyed map alone gets wrong or slow: the only cover starts first.
        let mut tree = IntervalTree::new();
        tree.insert(0..10_000, 0);
        for i in 1..1000usize {
            let s = i * 8;
            tree.insert(s..s + 2, i);
        }
        assert_eq!(tree.find_covering(&(5000..5003)), Some(0));
        assert_eq!(tree.find_covering(&(5000..10_001)), None);
    }

    #[test]
    fn depth_stays_logarithmic_for_sorted_inserts() {
        let mut tree = IntervalTree::new();
        for i in 0..4096usize {
            let s = i * 4096;
            tree.insert(s..s + 4096, i);
        }
        tree.check();
        // log2(4096) = 12; a treap's expected depth is about 3 log2 n.
        assert!(tree.depth() <= 48, "depth {}", tree.depth());
    }
}
