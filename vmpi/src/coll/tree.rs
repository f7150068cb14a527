//! k-nomial trees over ranks `0..p` rooted at 0 (binomial when `k = 2`):
//! a rank's parent clears its lowest non-zero base-`k` digit, its children
//! set one of the lower digits. The subtree of a child of `v` at stride
//! `s` is the contiguous range `child .. child + s`, so visiting children
//! by increasing stride, then increasing digit, visits ranks in order
//! (what a non-commutative reduction needs).
#![forbid(unsafe_code)]

/// The parent of `v` (`None` for the root).
pub fn parent(v: u32, k: u32) -> Option<u32> {
    if v == 0 {
        return None;
    }
    let mut s = 1u32;
    while v % (s * k) == 0 {
        s *= k;
    }
    Some(v - v % (s * k))
}

/// The children of `v` in a tree of `p` ranks, by increasing stride then
/// digit: `(child, stride)`; the child's subtree is `child..child + stride`
/// (clipped to `p`).
pub fn children(v: u32, p: u32, k: u32) -> Vec<(u32, u32)> {
    let mut out = Vec::new();
    let mut s = 1u64;
    let (v64, p64, k64) = (v as u64, p as u64, k as u64);
    while s < p64 {
        if v64 % (s * k64) != 0 {
            break;
        }
        for j in 1..k64 {
            let c = v64 + j * s;
            if c < p64 {
                out.push((c as u32, s as u32));
            }
        }
        s *= k64;
    }
    out
}

/// Rounds of a k-nomial tree over `p` ranks (`ceil(log_k p)`).
pub fn depth(p: u32, k: u32) -> u32 {
    let (mut d, mut n) = (0, 1u64);
    while n < p as u64 {
        n *= k as u64;
        d += 1;
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rank_once_and_parents_agree() {
        for p in 1..40 {
            for k in 2..6 {
                let mut seen = vec![0; p as usize];
                seen[0] += 1;
                for v in 0..p {
                    for (c, s) in children(v, p, k) {
                        seen[c as usize] += 1;
                        assert_eq!(parent(c, k), Some(v), "p {p} k {k} v {v} c {c}");
                        assert!(c + s > c);
                    }
                }
                assert!(seen.iter().all(|&n| n == 1), "p {p} k {k}");
            }
        }
        assert_eq!(children(0, 16, 4).len(), 6);
        assert_eq!(depth(16, 4), 2);
        assert_eq!(depth(13, 2), 4);
    }
}
