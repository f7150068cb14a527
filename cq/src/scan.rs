//! `Scan`: the CQ2 design. Instead of an entry per completion, the CQ keeps
//! the list of its work queues and scans them round robin for a completion
//! that has not been reported yet.
//!
//! Cheaper than a ring when few queues are attached (one probe per queue
//! versus one entry write and read per completion); the benches
//! (`benches/benches/cq.rs`) measure where the two cross.
#![forbid(unsafe_code)]

use std::rc::Rc;
use std::sync::Arc;

/// A work queue as seen by a CQ2 scan: it can report completions it has not
/// reported through the CQ yet.
///
/// `take_ready` must *claim* the completion: once it returned `Some` for a
/// descriptor, no later call (from any thread) returns that descriptor again.
/// Typically it advances a "reported up to" cursor by CAS.
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
///
/// /// Completions `reported..done` are unreported.
/// struct Queue { id: u64, done: AtomicU64, reported: AtomicU64 }
///
/// impl cq::Probe for Queue {
///     fn take_ready(&self) -> Option<u64> {
///         let reported = self.reported.load(Ordering::Relaxed);
///         if reported == self.done.load(Ordering::Acquire) {
///             return None;
///         }
///         self.reported
///             .compare_exchange(reported, reported + 1, Ordering::Relaxed, Ordering::Relaxed)
///             .ok()
///             .map(|_| self.id)
///     }
/// }
///
/// let q = Queue { id: 3, done: AtomicU64::new(1), reported: AtomicU64::new(0) };
/// assert_eq!(q.take_ready(), Some(3));
/// assert_eq!(q.take_ready(), None);
/// # use cq::Probe;
/// ```
pub trait Probe {
    /// Claims one unreported completion and returns its CQ entry value.
    fn take_ready(&self) -> Option<u64>;
}

impl<P: Probe + ?Sized> Probe for &P {
    fn take_ready(&self) -> Option<u64> {
        (**self).take_ready()
    }
}

impl<P: Probe + ?Sized> Probe for Box<P> {
    fn take_ready(&self) -> Option<u64> {
        (**self).take_ready()
    }
}

impl<P: Probe + ?Sized> Probe for Arc<P> {
    fn take_ready(&self) -> Option<u64> {
        (**self).take_ready()
    }
}

impl<P: Probe + ?Sized> Probe for Rc<P> {
    fn take_ready(&self) -> Option<u64> {
        (**self).take_ready()
    }
}

/// Round-robin scan over the probes of one CQ.
///
/// Each call starts right after the probe that answered last, so a busy
/// queue cannot starve the others: with every queue ready, successive calls
/// visit them in turn.
///
/// ```
/// use std::cell::Cell;
///
/// struct Q(u64, Cell<u32>); // id, pending completions
/// impl cq::Probe for Q {
///     fn take_ready(&self) -> Option<u64> {
///         let n = self.1.get();
///         (n > 0).then(|| { self.1.set(n - 1); self.0 })
///     }
/// }
///
/// let qs = [Q(0, Cell::new(2)), Q(1, Cell::new(2)), Q(2, Cell::new(0))];
/// let mut scan = cq::Scan::new();
/// let got: Vec<_> = std::iter::from_fn(|| scan.next(&qs)).collect();
/// assert_eq!(got, [0, 1, 0, 1]);
/// ```
#[derive(Clone, Debug, Default)]
pub struct Scan {
    /// Index of the probe the next call asks first.
    cursor: usize,
}

impl Scan {
    /// A scan that starts at the first probe.
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks each probe at most once, starting after the last one that
    /// answered, and returns the first completion found.
    ///
    /// The probe list may change between calls (a work queue attached to or
    /// detached from the CQ); the cursor is reduced modulo its length.
    pub fn next<P: Probe>(&mut self, probes: &[P]) -> Option<u64> {
        let n = probes.len();
        if n == 0 {
            return None;
        }
        let start = self.cursor % n;
        for i in 0..n {
            let index = if start + i < n {
                start + i
            } else {
                start + i - n
            };
            if let Some(entry) = probes[index].take_ready() {
                self.cursor = index + 1;
                return Some(entry);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A probe with `pending` completions, each reported as `id`.
    struct Q {
        id: u64,
        pending: Cell<u32>,
        asked: Cell<u32>,
    }

    impl Q {
        fn new(id: u64, pending: u32) -> Self {
            Self {
                id,
                pending: Cell::new(pending),
                asked: Cell::new(0),
            }
        }
    }

    impl Probe for Q {
        fn take_ready(&self) -> Option<u64> {
            self.asked.set(self.asked.get() + 1);
            let n = self.pending.get();
            (n > 0).then(|| {
                self.pending.set(n - 1);
                self.id
            })
        }
    }

    #[test]
    fn empty_list_and_idle_queues_give_none() {
        let mut scan = Scan::new();
        assert_eq!(scan.next::<Q>(&[]), None);
        let qs = [Q::new(0, 0), Q::new(1, 0)];
        assert_eq!(scan.next(&qs), None);
        // Each probe asked exactly once per call.
        assert!(qs.iter().all(|q| q.asked.get() == 1));
    }

    #[test]
    fn round_robin_is_fair_when_all_are_ready() {
        let qs: Vec<Q> = (0..4).map(|i| Q::new(i, 3)).collect();
        let mut scan = Scan::new();
        let got: Vec<u64> = std::iter::from_fn(|| scan.next(&qs)).collect();
        assert_eq!(got, [0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3]);
    }

    #[test]
    fn a_busy_queue_does_not_starve_the_next_one() {
        let qs = [Q::new(0, 100), Q::new(1, 0), Q::new(2, 1)];
        let mut scan = Scan::new();
        assert_eq!(scan.next(&qs), Some(0));
        // Starts after probe 0, so probe 2 answers before probe 0 again.
        assert_eq!(scan.next(&qs), Some(2));
        assert_eq!(scan.next(&qs), Some(0));
        assert_eq!(scan.next(&qs), Some(0));
    }

    #[test]
    fn cursor_survives_a_shrinking_list() {
        let qs: Vec<Q> = (0..4).map(|i| Q::new(i, 1)).collect();
        let mut scan = Scan::new();
        assert_eq!(scan.next(&qs[..]), Some(0));
        assert_eq!(scan.next(&qs[..]), Some(1));
        assert_eq!(scan.next(&qs[..]), Some(2));
        // Cursor is 3; with two probes it wraps to 1 (already empty), then 0 (empty).
        assert_eq!(scan.next(&qs[..2]), None);
        assert_eq!(scan.next(&qs[..]), Some(3));
    }

    /// A shared probe: `ready` completions, claimed by CAS.
    struct Shared {
        ready: AtomicU32,
    }

    impl Probe for Shared {
        fn take_ready(&self) -> Option<u64> {
            let mut n = self.ready.load(Ordering::Relaxed);
            while n > 0 {
                match self
                    .ready
                    .compare_exchange(n, n - 1, Ordering::Relaxed, Ordering::Relaxed)
                {
                    Ok(_) => return Some(u64::from(n)),
                    Err(m) => n = m,
                }
            }
            None
        }
    }

    #[test]
    fn each_completion_is_claimed_once_across_threads() {
        const N: u32 = 2000;
        let probes: Vec<Arc<Shared>> = (0..3)
            .map(|_| {
                Arc::new(Shared {
                    ready: AtomicU32::new(N),
                })
            })
            .collect();
        let counts: Vec<usize> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..2)
                .map(|_| {
                    s.spawn(|| {
                        let mut scan = Scan::new();
                        std::iter::from_fn(|| scan.next(&probes)).count()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(counts.iter().sum::<usize>(), 3 * N as usize);
        assert!(probes.iter().all(|p| p.ready.load(Ordering::Relaxed) == 0));
    }
}
