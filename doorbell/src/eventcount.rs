//! EventCount: the futex sleep/wake handshake on a word in shared memory.
//!
//! Waiters (a consumer with nothing to do) and notifiers (whoever changes the condition the
//! waiter waits for) follow this protocol, with a condition that lives outside the event
//! count (for the doorbell: "the slot at the head is committed"):
//!
//! ```text
//! waiter                                   notifier
//! key = prepare_wait()                     publish the condition (e.g. Release stamp store)
//!   waiters += 1                           notify_all():
//!   armed? SeqCst fence                      light fence [Fn]
//!   else: set SLEEPY; heavy fence [Fw];      w = waiters
//!         set ARMED                          if w has SLEEPY: SeqCst fence; w = waiters
//!   key = seq (Acquire)                      if count(w) != 0:
//! if condition: cancel_wait(key)               seq += 1 (Release); futex wake
//! else: wait(key): futex-wait while seq==key
//! ```
//!
//! **Two modes.** A polling program's completions call `notify_all` on every message, and a
//! fence there waits until the completion's stores have reached the peer's cache. So while
//! nobody sleeps on an event count, the notifier's fence is light ([`crate::asymmetric`]: a
//! compiler fence once the process is registered for global expedited `membarrier`), and the
//! first waiter to sleep pays for both sides once: it sets `SLEEPY`, runs the heavy fence (the
//! barrier on every running thread of every registered process), and sets `ARMED`. From then
//! on every notifier sees `SLEEPY` and fences as well (symmetric, the classic eventcount), and
//! later waiters fence only with a SeqCst fence. After [`QUIET_WAITS`] waits in a row end
//! without sleeping ([`wait_until`] counts them), the count disarms: back to light notifiers,
//! and the next sleeper arms again.
//!
//! **Why no wake-up is lost.** A notifier that sees `SLEEPY` fences; against a waiter that
//! fenced after registering, that is the classic argument: either the notifier's reload of
//! `waiters` sees the registration and bumps `seq` (so the waiter's futex wait sees a changed
//! word or is woken), or the waiter's condition check sees what the notifier published. A
//! notifier that did not see `SLEEPY` read `waiters` before the arming waiter set it (or after
//! a disarm, when it sees every registration still in place, the count being in the same
//! word). The arming waiter's heavy fence then ran a barrier on the notifier's CPU after that
//! read: the notifier's earlier publication was visible before the heavy fence returned, hence
//! before `ARMED` was set, hence to every waiter that found `ARMED` (its condition check comes
//! after), and to the arming waiter itself. A waiter that finds `SLEEPY` but not yet `ARMED`
//! (another is arming) runs its own heavy fence. If the waiter's `key` already includes a
//! notification, the Acquire load of `seq` pairs with the notifier's Release increment, so the
//! condition check also sees its publication.
//!
//! Where the heavy fence cannot run its barrier (a seccomp filter), some notifier's light fence
//! may have been a compiler fence that nothing ordered, and `ARMED` is not set: the key is
//! marked, and the wait sleeps at most [`BOUNDED_SLEEP`] at a time and then reports `Notified`,
//! so that the caller looks at its condition again. A lost wake-up costs that long, never a
//! hang.
//!
//! `notify_all` costs one load when nobody waits and nobody slept lately. The sequence is a
//! `u32`; a waiter that misses exactly 2^32 notifications between `prepare_wait` and `wait`
//! would sleep until the next one (or its timeout).
#![forbid(unsafe_code)]

use core::fmt;
use std::time::{Duration, Instant};

use crate::EventCount;
use crate::asymmetric::{heavy_fence, light_fence};
use crate::sync::{AtomicU32, FutexWait, Ordering, WaitQueue, fence, spin_loop};

/// The longest sleep of a wait whose `prepare_wait` could not run its barrier (module doc).
pub const BOUNDED_SLEEP: Duration = Duration::from_millis(1);

/// Waits in a row that end without sleeping before an armed event count disarms (module doc).
pub const QUIET_WAITS: u32 = 64;

/// `waiters`: a waiter has set, or is setting, the symmetric mode (module doc).
const SLEEPY: u32 = 1 << 31;
/// `waiters`: the heavy fence of the waiter that set `SLEEPY` has returned.
const ARMED: u32 = 1 << 30;
/// `waiters`: the number of registered waiters.
const COUNT: u32 = ARMED - 1;

/// The sequence observed by [`EventCount::prepare_wait`]; hand it to `wait` or `cancel_wait`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use = "a prepared wait must be finished with `wait` or `cancel_wait`"]
pub struct Key {
    seq: u32,
    /// The barrier failed: sleep at most [`BOUNDED_SLEEP`] at a time.
    bounded: bool,
}

/// How [`EventCount::wait`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitOutcome {
    /// The sequence moved past the key: somebody notified after `prepare_wait`.
    Notified,
    /// The timeout expired first.
    TimedOut,
}

impl EventCount {
    /// Creates an event count in its initial state (no waiters), equal to all-zero bytes.
    ///
    /// ```
    /// static EC: doorbell::EventCount = doorbell::EventCount::new();
    /// assert!(!EC.has_waiters());
    /// ```
    #[cfg(not(loom))]
    pub const fn new() -> Self {
        Self {
            seq: AtomicU32::new(0),
            waiters: AtomicU32::new(0),
            quiet: AtomicU32::new(0),
            queue: WaitQueue::new(),
        }
    }

    /// Creates an event count in its initial state (no waiters).
    #[cfg(loom)]
    pub fn new() -> Self {
        Self {
            seq: AtomicU32::new(0),
            waiters: AtomicU32::new(0),
            quiet: AtomicU32::new(0),
            queue: WaitQueue::new(),
        }
    }

    /// Registers the caller as a waiter and returns the current sequence.
    ///
    /// The caller must then check its condition and either [`cancel_wait`](Self::cancel_wait)
    /// (condition true) or [`wait`](Self::wait) with the key.
    pub fn prepare_wait(&self) -> Key {
        // Relaxed: ordered before the condition check by the fences below.
        let old = self.waiters.fetch_add(1, Ordering::Relaxed);
        let covered = if old & ARMED != 0 {
            // Armed: every notifier that could miss us fences (module doc).
            fence(Ordering::SeqCst);
            // Relaxed: a heuristic count; written only by waiters, and here only when it
            // changes (a sleep starts a new run of quiet waits).
            if self.quiet.load(Ordering::Relaxed) != 0 {
                self.quiet.store(0, Ordering::Relaxed);
            }
            true
        } else {
            if old & SLEEPY == 0 {
                // Relaxed: ordered before the notifiers' later loads by the heavy fence.
                self.waiters.fetch_or(SLEEPY, Ordering::Relaxed);
            }
            // Heavy fence [Fw]: pairs with the light fence of every notifier that read
            // `waiters` before `SLEEPY` (module doc).
            let ok = heavy_fence();
            if ok {
                // Relaxed: waiters that find it read it by an RMW of the same word, after
                // which our heavy fence has returned (real time) and its effects are visible.
                self.waiters.fetch_or(ARMED, Ordering::Relaxed);
            }
            ok
        };
        // Acquire: pairs with the Release increment in `notify_all`; if the key includes a
        // notification, our condition check sees what that notifier published.
        Key {
            seq: self.seq.load(Ordering::Acquire),
            bounded: !covered,
        }
    }

    /// Counts a wait that ended without sleeping, and disarms after [`QUIET_WAITS`] in a row
    /// (module doc). One load when not armed.
    #[inline]
    pub fn note_quiet_wait(&self) {
        // Relaxed: the bits only choose the notifiers' fence; disarming is safe at any time.
        if self.waiters.load(Ordering::Relaxed) & (SLEEPY | ARMED) == 0 {
            return;
        }
        if self.quiet.fetch_add(1, Ordering::Relaxed) + 1 >= QUIET_WAITS {
            self.disarm();
        }
    }

    /// Back to light notifiers (module doc): safe at any time, registered waiters included
    /// (their count stays, in the word every notifier reads).
    #[doc(hidden)]
    pub fn disarm(&self) {
        // Relaxed: as in `note_quiet_wait`.
        self.quiet.store(0, Ordering::Relaxed);
        self.waiters.fetch_and(!(SLEEPY | ARMED), Ordering::Relaxed);
    }

    /// Whether a waiter armed the symmetric mode (module doc).
    pub fn is_armed(&self) -> bool {
        // Relaxed: a snapshot.
        self.waiters.load(Ordering::Relaxed) & ARMED != 0
    }

    /// [`prepare_wait`](Self::prepare_wait) for an event count that only threads of this
    /// process notify (an engine or helper thread's own wake-up): where this process's light
    /// fences are full fences for good ([`crate::asymmetric::light_is_full_fence`]), a SeqCst
    /// fence pairs with them, and the sleep costs no `membarrier`.
    pub fn prepare_wait_local(&self) -> Key {
        if !crate::asymmetric::light_is_full_fence() {
            return self.prepare_wait();
        }
        // Relaxed: ordered before the condition check by the fence below.
        self.waiters.fetch_add(1, Ordering::Relaxed);
        // SeqCst fence [Fw]: every notifier is a thread of this process, whose light fence is a
        // SeqCst fence for good.
        fence(Ordering::SeqCst);
        // Acquire: as in `prepare_wait`.
        Key {
            seq: self.seq.load(Ordering::Acquire),
            bounded: false,
        }
    }

    /// Unregisters a waiter whose condition turned out to be true.
    pub fn cancel_wait(&self, key: Key) {
        let _ = key;
        // Relaxed: the count only tells notifiers whether to bump the sequence and wake; a
        // notifier that still sees us costs one spurious wake.
        self.waiters.fetch_sub(1, Ordering::Relaxed);
    }

    /// Sleeps until the sequence moves past `key` (a notification since `prepare_wait`) or
    /// `timeout` expires (`None`: no limit); unregisters the waiter in both cases.
    ///
    /// Signals and spurious futex wake-ups are absorbed: the wait resumes for the time left.
    /// A key whose barrier failed returns `Notified` after at most [`BOUNDED_SLEEP`] (module
    /// doc): callers check their condition after every `Notified`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use doorbell::{EventCount, WaitOutcome};
    ///
    /// let ec = EventCount::new();
    /// let key = ec.prepare_wait();
    /// assert_eq!(ec.wait(key, Some(Duration::from_millis(1))), WaitOutcome::TimedOut);
    ///
    /// let key = ec.prepare_wait();
    /// ec.notify_all(); // a waiter is registered: the sequence moves
    /// assert_eq!(ec.wait(key, None), WaitOutcome::Notified);
    /// assert!(!ec.has_waiters());
    /// ```
    pub fn wait(&self, key: Key, timeout: Option<Duration>) -> WaitOutcome {
        // A deadline beyond what Instant can represent is no deadline.
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        let outcome = loop {
            // Acquire: pairs with the Release increment in `notify_all`, so after `Notified`
            // the caller sees the condition the notifier published.
            if self.seq.load(Ordering::Acquire) != key.seq {
                break WaitOutcome::Notified;
            }
            let remaining = match deadline {
                None => None,
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => Some(left),
                    _ => break WaitOutcome::TimedOut,
                },
            };
            // A key whose barrier failed sleeps a bounded time (module doc).
            let capped = match remaining {
                Some(r) if key.bounded && r > BOUNDED_SLEEP => Some(BOUNDED_SLEEP),
                None if key.bounded => Some(BOUNDED_SLEEP),
                r => r,
            };
            match self.queue.wait(&self.seq, key.seq, capped) {
                // Re-check the word: woken (maybe spuriously), changed, or interrupted.
                FutexWait::Woken | FutexWait::Changed | FutexWait::Interrupted => {}
                FutexWait::TimedOut => {
                    // Acquire: as above.
                    if self.seq.load(Ordering::Acquire) != key.seq || capped != remaining {
                        break WaitOutcome::Notified;
                    }
                    break WaitOutcome::TimedOut;
                }
                // The futex is unusable (logged once by `sys`): degrade to polling the word
                // until notified or the deadline, rather than failing the caller.
                FutexWait::Failed(_) => spin_loop(),
            }
        };
        // Relaxed: see `cancel_wait`.
        self.waiters.fetch_sub(1, Ordering::Relaxed);
        outcome
    }

    /// Wakes every waiter, if there is any. Call it after publishing the condition.
    ///
    /// One load when nobody waits (a light fence: module doc); otherwise also an increment
    /// and a `FUTEX_WAKE` system call. Always inlined: on every completion, and the
    /// common case is that load.
    #[inline(always)]
    pub fn notify_all(&self) {
        // Light fence [Fn]: the sleep/wake handshake (module doc). Orders the caller's
        // publication before the load of `waiters`; pairs with the heavy fence of the waiter
        // that arms.
        light_fence();
        // Relaxed: ordered by the fence above. Zero: nobody waits and nobody armed (the
        // common case, inline); else the rest, out of line.
        let w = self.waiters.load(Ordering::Relaxed);
        if w != 0 {
            self.notify_slow(w);
        }
    }

    #[cold]
    #[inline(never)]
    fn notify_slow(&self, mut w: u32) {
        if w & SLEEPY != 0 {
            // Armed (or arming): the classic handshake, with the waiters' SeqCst fences.
            fence(Ordering::SeqCst);
            // Relaxed: ordered by the fence.
            w = self.waiters.load(Ordering::Relaxed);
        }
        if w & COUNT != 0 {
            // Release: pairs with the Acquire loads of `seq` in `prepare_wait` and `wait`, so a
            // waiter that sees the new sequence sees the published condition.
            self.seq.fetch_add(1, Ordering::Release);
            self.queue.wake_all(&self.seq);
        }
    }

    /// Whether some thread (of any process) is registered as a waiter.
    pub fn has_waiters(&self) -> bool {
        // Relaxed: a snapshot for callers deciding whether a notify is worth it.
        self.waiters.load(Ordering::Relaxed) & COUNT != 0
    }
}

impl Default for EventCount {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for EventCount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Relaxed: diagnostics only.
        f.debug_struct("EventCount")
            .field("seq", &self.seq.load(Ordering::Relaxed))
            .field("waiters", &self.waiters.load(Ordering::Relaxed))
            .finish()
    }
}

/// Spins for `spin`, then blocks on `ec` until `cond()` is true or `deadline` passes
/// (`None`: no deadline). Returns `cond`'s final value. A wait that ends without sleeping is
/// counted towards disarming `ec` ([`EventCount::note_quiet_wait`]).
///
/// Whoever makes `cond` true must call [`EventCount::notify_all`] on the same `ec` afterwards
/// (the publish-then-notify side of the handshake), or a sleeping caller is only released by
/// its deadline.
///
/// ```
/// use std::sync::atomic::{AtomicBool, Ordering};
/// use std::time::{Duration, Instant};
/// use doorbell::{EventCount, wait_until};
///
/// let ec = EventCount::new();
/// let ready = AtomicBool::new(false);
/// std::thread::scope(|s| {
///     s.spawn(|| {
///         ready.store(true, Ordering::Release);
///         ec.notify_all();
///     });
///     let deadline = Instant::now() + Duration::from_secs(10);
///     assert!(wait_until(&ec, Duration::from_micros(10), Some(deadline), || {
///         ready.load(Ordering::Acquire)
///     }));
/// });
/// ```
pub fn wait_until(
    ec: &EventCount,
    spin: Duration,
    deadline: Option<Instant>,
    mut cond: impl FnMut() -> bool,
) -> bool {
    if cond() {
        ec.note_quiet_wait();
        return true;
    }
    if !spin.is_zero() {
        let spin_end = Instant::now().checked_add(spin);
        let spin_end = match (spin_end, deadline) {
            (Some(s), Some(d)) => Some(s.min(d)),
            (s, None) => s,
            (None, d) => d,
        };
        if let Some(end) = spin_end {
            // Check the clock once per batch: reading it costs more than a condition check.
            while Instant::now() < end {
                for _ in 0..64 {
                    if cond() {
                        ec.note_quiet_wait();
                        return true;
                    }
                    spin_loop();
                }
            }
        }
    }
    loop {
        let key = ec.prepare_wait();
        if cond() {
            ec.cancel_wait(key);
            return true;
        }
        let timeout = match deadline {
            None => None,
            Some(d) => match d.checked_duration_since(Instant::now()) {
                Some(left) if !left.is_zero() => Some(left),
                _ => {
                    ec.cancel_wait(key);
                    return cond();
                }
            },
        };
        match ec.wait(key, timeout) {
            WaitOutcome::Notified => {
                if cond() {
                    return true;
                }
            }
            WaitOutcome::TimedOut => return cond(),
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    fn heavy_calls() -> u64 {
        crate::asymmetric::tests::HEAVY_CALLS.with(std::cell::Cell::get)
    }

    /// The first sleeper arms with one heavy fence; later ones fence plainly; a run of
    /// `QUIET_WAITS` waits that end without sleeping disarms, and the next sleeper arms again.
    #[test]
    fn the_first_sleeper_arms_and_quiet_waits_disarm() {
        let ec = EventCount::new();
        let h0 = heavy_calls();
        let key = ec.prepare_wait();
        assert_eq!(
            heavy_calls(),
            h0 + 1,
            "the first sleeper runs the heavy fence"
        );
        assert!(ec.is_armed());
        ec.cancel_wait(key);
        for _ in 0..10 {
            let key = ec.prepare_wait();
            ec.cancel_wait(key);
        }
        assert_eq!(heavy_calls(), h0 + 1, "armed: no more heavy fences");
        assert!(!ec.has_waiters());
        for i in 0..QUIET_WAITS {
            assert!(ec.is_armed(), "disarmed after {i} quiet waits");
            assert!(wait_until(&ec, Duration::ZERO, None, || true));
        }
        assert!(
            !ec.is_armed(),
            "still armed after {QUIET_WAITS} quiet waits"
        );
        let key = ec.prepare_wait();
        assert_eq!(heavy_calls(), h0 + 2, "the next sleeper arms again");
        ec.cancel_wait(key);
        // A sleep in between starts the count of quiet waits again.
        for _ in 0..QUIET_WAITS - 1 {
            assert!(wait_until(&ec, Duration::ZERO, None, || true));
        }
        let key = ec.prepare_wait();
        ec.cancel_wait(key);
        assert!(wait_until(&ec, Duration::ZERO, None, || true));
        assert!(ec.is_armed(), "a sleep restarts the run of quiet waits");
    }

    /// Two threads hand a counter back and forth through two event counts, many thousand
    /// times, with waits that sleep (arming) and waits that find the value at once (disarming)
    /// in alternating blocks: a lost wake-up leaves a waiter asleep until its deadline.
    #[test]
    fn a_ping_pong_through_arming_and_disarming_loses_no_wake_up() {
        use std::sync::Arc;
        const ROUNDS: u32 = 20_000;
        let ecs = Arc::new([EventCount::new(), EventCount::new()]);
        let vals = Arc::new([AtomicU32::new(0), AtomicU32::new(0)]);
        let side = |me: usize, ecs: Arc<[EventCount; 2]>, vals: Arc<[AtomicU32; 2]>| {
            move || {
                let other = 1 - me;
                for r in 1..=ROUNDS {
                    // Side 0 serves round r; side 1 answers it.
                    let want = if me == 0 { r - 1 } else { r };
                    if (r / 200) % 2 == 1 {
                        // Busy-wait first: the wait below then ends at once (quiet).
                        while vals[other].load(Ordering::Acquire) < want {
                            std::hint::spin_loop();
                        }
                    }
                    let deadline = Instant::now() + Duration::from_secs(10);
                    assert!(
                        wait_until(&ecs[other], Duration::ZERO, Some(deadline), || {
                            vals[other].load(Ordering::Acquire) >= want
                        }),
                        "side {me} lost a wake-up in round {r}"
                    );
                    vals[me].store(r, Ordering::Release);
                    ecs[me].notify_all();
                }
            }
        };
        let t = std::thread::spawn(side(1, ecs.clone(), vals.clone()));
        side(0, ecs.clone(), vals.clone())();
        t.join().unwrap();
        assert_eq!(vals[0].load(Ordering::Relaxed), ROUNDS);
        assert_eq!(vals[1].load(Ordering::Relaxed), ROUNDS);
    }

    /// A waiter whose barrier failed may have been missed by a light notifier: its sleep is
    /// bounded, and it comes back to look at its condition although nobody notified.
    #[test]
    fn a_wait_without_its_barrier_comes_back_to_look() {
        let ec = EventCount::new();
        crate::asymmetric::tests::FAIL_HEAVY.with(|f| f.set(true));
        let key = ec.prepare_wait();
        crate::asymmetric::tests::FAIL_HEAVY.with(|f| f.set(false));
        let t = Instant::now();
        assert_eq!(ec.wait(key, None), WaitOutcome::Notified);
        assert!(t.elapsed() >= BOUNDED_SLEEP);
        assert!(!ec.has_waiters());
        // With its barrier, the same wait runs to its own timeout.
        let key = ec.prepare_wait();
        let t = Instant::now();
        let limit = Duration::from_millis(20);
        assert_eq!(ec.wait(key, Some(limit)), WaitOutcome::TimedOut);
        assert!(t.elapsed() >= limit);
    }

    #[test]
    fn notify_without_waiters_leaves_the_sequence() {
        let ec = EventCount::new();
        ec.notify_all();
        assert_eq!(ec.seq.load(Ordering::Relaxed), 0);
        let key = ec.prepare_wait();
        assert!(ec.has_waiters());
        ec.cancel_wait(key);
        assert!(!ec.has_waiters());
        ec.notify_all();
        assert_eq!(ec.seq.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn notify_with_a_waiter_moves_the_sequence() {
        let ec = EventCount::new();
        let key = ec.prepare_wait();
        ec.notify_all();
        assert_eq!(ec.seq.load(Ordering::Relaxed), 1);
        assert_eq!(ec.wait(key, Some(Duration::ZERO)), WaitOutcome::Notified);
        assert!(!ec.has_waiters());
    }

    #[test]
    #[cfg_attr(miri, ignore = "memfd, futex or /proc are outside Miri")]
    fn wait_times_out_and_unregisters() {
        let ec = EventCount::new();
        let key = ec.prepare_wait();
        let start = Instant::now();
        assert_eq!(
            ec.wait(key, Some(Duration::from_millis(30))),
            WaitOutcome::TimedOut
        );
        assert!(start.elapsed() >= Duration::from_millis(30));
        assert!(!ec.has_waiters());
        let key = ec.prepare_wait();
        assert_eq!(ec.wait(key, Some(Duration::ZERO)), WaitOutcome::TimedOut);
    }

    #[test]
    fn huge_timeout_is_no_timeout_but_notify_still_wakes() {
        let ec = EventCount::new();
        let key = ec.prepare_wait();
        ec.notify_all();
        assert_eq!(ec.wait(key, Some(Duration::MAX)), WaitOutcome::Notified);
    }

    #[test]
    #[cfg_attr(miri, ignore = "memfd, futex or /proc are outside Miri")]
    fn wait_until_returns_at_once_when_true_and_times_out_when_false() {
        let ec = EventCount::new();
        assert!(wait_until(&ec, Duration::from_millis(1), None, || true));
        let past = Instant::now();
        assert!(!wait_until(&ec, Duration::ZERO, Some(past), || false));
        let deadline = Instant::now() + Duration::from_millis(20);
        assert!(!wait_until(
            &ec,
            Duration::from_millis(1),
            Some(deadline),
            || false
        ));
        assert!(Instant::now() >= deadline);
        assert!(!ec.has_waiters());
    }

    #[test]
    #[cfg_attr(miri, ignore = "memfd, futex or /proc are outside Miri")]
    fn blocked_thread_is_woken_by_notify() {
        use crate::sys::testing::{thread_id, wait_blocked_in_futex};
        let ec = EventCount::new();
        let flag = AtomicBool::new(false);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            let waiter = s.spawn(|| {
                tx.send(thread_id()).unwrap();
                let deadline = Instant::now() + Duration::from_secs(10);
                wait_until(&ec, Duration::ZERO, Some(deadline), || {
                    flag.load(Ordering::Acquire)
                })
            });
            let tid = rx.recv().unwrap();
            // Make sure the waiter really sleeps in the kernel before notifying.
            let blocked = wait_blocked_in_futex(tid, Instant::now() + Duration::from_secs(5));
            assert!(blocked, "the waiter never slept in the futex");
            let notified = Instant::now();
            flag.store(true, Ordering::Release);
            ec.notify_all();
            assert!(waiter.join().unwrap());
            // `wait_until` also returns the condition after its deadline: check the wake did it.
            assert!(
                notified.elapsed() < Duration::from_secs(5),
                "woken by the timeout"
            );
        });
    }
}
