//! `CompletionQueue`: one type over both designs, selected by [`Mode`].
#![forbid(unsafe_code)]

use core::fmt;
use core::time::Duration;
use std::sync::Mutex;
use std::time::Instant;

use doorbell::EventCount;

use crate::{EntryRing, Mode, Probe, Scan};

/// A completion queue in either design: `done` (`VipCQDone`) and `wait`
/// (`VipCQWait`) behave the same and return the entry of one completion.
///
/// * [`Mode::Ring`]: entries come from an [`EntryRing`] the completing
///   engines push into; they notify the ring's event themselves.
/// * [`Mode::Scan`]: entries come from a round-robin [`Scan`] of the work
///   queues' probes. Whoever makes a completion visible must then call
///   `event().notify_all()` so that `wait` wakes up.
///
/// ```
/// use std::sync::atomic::{AtomicU32, Ordering};
/// use std::time::Duration;
/// use cq::{CompletionQueue, Mode, Probe};
///
/// struct Wq { id: u64, ready: AtomicU32 }
/// impl Probe for Wq {
///     fn take_ready(&self) -> Option<u64> {
///         self.ready
///             .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
///             .ok()
///             .map(|_| self.id)
///     }
/// }
///
/// let wqs = vec![Wq { id: 1, ready: AtomicU32::new(0) }, Wq { id: 2, ready: AtomicU32::new(1) }];
/// let scan = CompletionQueue::scan(wqs);
/// assert_eq!(scan.mode(), Mode::Scan);
/// assert_eq!(scan.done(), Some(2));
/// assert_eq!(scan.wait(Duration::ZERO, Some(Duration::from_millis(1))), None);
///
/// let ring: CompletionQueue<Wq> = CompletionQueue::ring(cq::EntryRing::new_in_heap(8));
/// ring.as_ring().unwrap().push(9).unwrap();
/// assert_eq!(ring.done(), Some(9));
/// ```
pub struct CompletionQueue<P> {
    source: Source<P>,
}

/// Where a queue's entries come from.
enum Source<P> {
    Ring(EntryRing),
    Scan {
        probes: Vec<P>,
        scan: Mutex<Scan>,
        event: Box<EventCount>,
    },
}

impl<P: Probe> CompletionQueue<P> {
    /// A CQ1 queue over `ring`.
    pub fn ring(ring: EntryRing) -> Self {
        Self {
            source: Source::Ring(ring),
        }
    }

    /// A CQ2 queue scanning `probes`.
    pub fn scan(probes: Vec<P>) -> Self {
        Self {
            source: Source::Scan {
                probes,
                scan: Mutex::new(Scan::new()),
                event: Box::new(EventCount::new()),
            },
        }
    }

    /// The design in use.
    pub fn mode(&self) -> Mode {
        match self.source {
            Source::Ring(_) => Mode::Ring,
            Source::Scan { .. } => Mode::Scan,
        }
    }

    /// The ring, in [`Mode::Ring`].
    pub fn as_ring(&self) -> Option<&EntryRing> {
        match &self.source {
            Source::Ring(ring) => Some(ring),
            Source::Scan { .. } => None,
        }
    }

    /// The probes, in [`Mode::Scan`] (empty in [`Mode::Ring`]).
    pub fn probes(&self) -> &[P] {
        match &self.source {
            Source::Ring(_) => &[],
            Source::Scan { probes, .. } => probes,
        }
    }

    /// The event `wait` sleeps on.
    pub fn event(&self) -> &EventCount {
        match &self.source {
            Source::Ring(ring) => ring.event(),
            Source::Scan { event, .. } => event,
        }
    }

    /// Takes one completion if there is one (`VipCQDone`).
    pub fn done(&self) -> Option<u64> {
        match &self.source {
            Source::Ring(ring) => ring.pop(),
            Source::Scan { probes, scan, .. } => {
                // A panic in another thread's probe leaves only a cursor behind.
                let mut scan = scan.lock().unwrap_or_else(|e| e.into_inner());
                scan.next(probes)
            }
        }
    }

    /// Takes one completion, spinning for `spin` and then sleeping until one
    /// arrives or `timeout` (`None`: no timeout) expires (`VipCQWait`).
    pub fn wait(&self, spin: Duration, timeout: Option<Duration>) -> Option<u64> {
        match &self.source {
            Source::Ring(ring) => ring.wait(spin, timeout),
            Source::Scan { event, .. } => {
                if let Some(entry) = self.done() {
                    return Some(entry);
                }
                let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
                let mut got = None;
                doorbell::wait_until(event, spin, deadline, || {
                    got = self.done();
                    got.is_some()
                });
                got
            }
        }
    }
}

impl<P> fmt::Debug for CompletionQueue<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.source {
            Source::Ring(ring) => f.debug_tuple("CompletionQueue::Ring").field(ring).finish(),
            Source::Scan { probes, .. } => f
                .debug_struct("CompletionQueue::Scan")
                .field("probes", &probes.len())
                .finish(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    struct Wq {
        id: u64,
        ready: AtomicU32,
    }

    impl Probe for Wq {
        fn take_ready(&self) -> Option<u64> {
            self.ready
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .ok()
                .map(|_| self.id)
        }
    }

    #[test]
    fn scan_wait_wakes_on_notify() {
        let wq = Arc::new(Wq {
            id: 4,
            ready: AtomicU32::new(0),
        });
        let cq = Arc::new(CompletionQueue::scan(vec![wq.clone()]));
        let waiter = {
            let cq = cq.clone();
            std::thread::spawn(move || cq.wait(Duration::ZERO, Some(Duration::from_secs(20))))
        };
        // Complete only once the waiter sleeps, so the wake path is the one tested.
        let deadline = Instant::now() + Duration::from_secs(20);
        while !cq.event().has_waiters() && Instant::now() < deadline {
            std::thread::yield_now();
        }
        wq.ready.store(1, Ordering::Release);
        cq.event().notify_all();
        assert_eq!(waiter.join().unwrap(), Some(4));
    }

    #[test]
    fn ring_mode_reads_the_ring() {
        let cq: CompletionQueue<Wq> = CompletionQueue::ring(EntryRing::new_in_heap(2));
        assert_eq!(cq.mode(), Mode::Ring);
        assert!(cq.probes().is_empty());
        cq.as_ring().unwrap().push(1).unwrap();
        assert_eq!(
            cq.wait(Duration::ZERO, Some(Duration::from_secs(5))),
            Some(1)
        );
        assert_eq!(cq.done(), None);
    }
}
