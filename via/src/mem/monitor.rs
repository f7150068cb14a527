//! The memory-event monitor: tells the registration path when the
//! application unmaps, discards or moves memory that is registered or
//! cached, before that memory can be registered again.
//!
//! Mechanism: a userfaultfd with the non-cooperative events `UNMAP` (munmap,
//! `brk` shrink, `mmap(MAP_FIXED)` over a range, which is how glibc's `free`
//! of a large block and its heap trim give memory back), `REMOVE`
//! (`madvise(MADV_DONTNEED/FREE/REMOVE)`) and `REMAP` (`mremap`). Every page
//! range the registration path pins is registered with it ([`Monitor::watch`]).
//! The kernel holds the thread that unmaps until the event is read, so:
//!
//! * a **reader thread** reads events as soon as they arrive. It only moves
//!   them into a fixed ring and never allocates or frees memory: a `free`
//!   may unmap registered memory and wait for this very reader.
//! * the reader raises `reading` before each `read(2)` and lowers it once the
//!   events are in the ring. [`Monitor::sync`], which the registration path
//!   calls before every cache lookup, applies everything in the ring and
//!   waits while `reading` is up. A thread whose `munmap` has returned has
//!   had its event read, so its next registration finds the event applied:
//!   no lookup after an unmap returns a translation of the old memory.
//! * an **applier thread** applies events when nobody registers, so that
//!   registrations over memory that went away are revoked promptly.
//! * The kernel frees the address *before* it queues the event, so another
//!   thread could map new memory there and register it before there is
//!   anything to read. [`super::unmap_hook`] counts each `munmap`, `mremap`
//!   and `shmdt` in flight from before its system call until it returns
//!   (after its event was read), and `sync` first waits until none is in
//!   flight. Where the hooks cannot be installed, [`Monitor::hooked`] is
//!   false and the registration path checks hits against the mappings.
//!
//! The monitor is per address space (one per process, re-created in a child
//! after `fork`). It is optional: without userfaultfd (old kernel, seccomp)
//! [`Monitor::get`] returns `None` and the registration cache validates each
//! hit against the mappings instead (README, "Registration").
#![forbid(unsafe_code)]

use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use super::uffd::{self, Event, MSG_SIZE, Uffd};

/// Something the application did to memory the registration path watches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemEvent {
    /// Unmapped.
    Unmap(Range<usize>),
    /// Contents discarded (`madvise`).
    Remove(Range<usize>),
    /// Moved to `to` (`mremap`).
    Remap {
        /// Old range.
        from: Range<usize>,
        /// New start.
        to: usize,
    },
    /// Events were lost (the ring overflowed): treat all memory as changed.
    Everything,
}

/// Counters of a monitor.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MonitorStats {
    /// Unmap events.
    pub unmaps: u64,
    /// Remove (madvise) events.
    pub removes: u64,
    /// Remap events.
    pub remaps: u64,
    /// Times the ring overflowed (every entry invalidated).
    pub overflows: u64,
    /// Unexpected page faults released.
    pub faults: u64,
}

const RING: usize = 4096;
const KIND_UNMAP: u64 = 1;
const KIND_REMOVE: u64 = 2;
const KIND_REMAP: u64 = 3;

/// One ring entry: plain atomics, written by the reader, read by appliers.
#[derive(Default)]
struct Slot {
    kind: AtomicU64,
    a: AtomicU64,
    b: AtomicU64,
    c: AtomicU64,
}

/// The callback that applies events (the process's registration state).
pub type Apply = fn(&[MemEvent]);

/// A running monitor.
pub struct Monitor {
    uffd: Uffd,
    ring: Box<[Slot]>,
    /// Next slot the reader fills (written by the reader only).
    tail: AtomicU64,
    /// Next slot to apply (written under `apply_lock`).
    head: AtomicU64,
    /// Events applied completely (written under `apply_lock`, after the
    /// application): `sync` waits for this, not for `head`, so that an
    /// event being applied by another thread is finished before a lookup.
    applied: AtomicU64,
    reading: AtomicBool,
    /// Overflows applied (an `Everything` event each); `overflows` counts
    /// them as they happen.
    overflows_applied: AtomicU64,
    apply_lock: Mutex<()>,
    apply: Apply,
    /// Whether the unmap hooks are in place (`sync` then closes the window).
    hooked: bool,
    wake: doorbell::EventCount,
    unmaps: AtomicU64,
    removes: AtomicU64,
    remaps: AtomicU64,
    overflows: AtomicU64,
    faults: AtomicU64,
}

static MONITOR: Mutex<Option<(i32, Option<Arc<Monitor>>)>> = Mutex::new(None);
static APPLY: OnceLock<Apply> = OnceLock::new();

/// Sets the function that applies events (once, before the first
/// [`Monitor::get`]).
pub fn set_apply(f: Apply) {
    let _ = APPLY.set(f);
}

fn nothing(_: &[MemEvent]) {}

impl Monitor {
    /// The process's monitor, started on first use; `None` when the kernel
    /// offers no userfaultfd with the events needed (logged once).
    pub fn get() -> Option<Arc<Monitor>> {
        let pid = crate::sys::getpid();
        let mut g = MONITOR.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((p, m)) = g.as_ref() {
            if *p == pid {
                return m.clone();
            }
        }
        let m = match Monitor::start(*APPLY.get().unwrap_or(&(nothing as Apply))) {
            Ok(m) => Some(m),
            Err(e) => {
                log::warn!(
                    "no memory-event monitor ({e}): the registration cache keeps no unused \
                     entries and checks every hit against the mappings"
                );
                None
            }
        };
        *g = Some((pid, m.clone()));
        m
    }

    fn start(apply: Apply) -> io::Result<Arc<Monitor>> {
        let uffd = Uffd::open(
            uffd::feature::EVENT_UNMAP
                | uffd::feature::EVENT_REMOVE
                | uffd::feature::EVENT_REMAP
                | uffd::feature::WP_HUGETLBFS_SHMEM,
        )?;
        let hooked = super::unmap_hook::install().is_ok();
        let m = Arc::new(Monitor {
            uffd,
            ring: (0..RING).map(|_| Slot::default()).collect(),
            tail: AtomicU64::new(0),
            head: AtomicU64::new(0),
            applied: AtomicU64::new(0),
            reading: AtomicBool::new(false),
            overflows_applied: AtomicU64::new(0),
            apply_lock: Mutex::new(()),
            apply,
            hooked,
            wake: doorbell::EventCount::new(),
            unmaps: AtomicU64::new(0),
            removes: AtomicU64::new(0),
            remaps: AtomicU64::new(0),
            overflows: AtomicU64::new(0),
            faults: AtomicU64::new(0),
        });
        let r = m.clone();
        std::thread::Builder::new()
            .name("via-memevents".into())
            .spawn(move || r.read_loop())?;
        let a = m.clone();
        std::thread::Builder::new()
            .name("via-memapply".into())
            .spawn(move || a.apply_loop())?;
        Ok(m)
    }

    /// Starts watching `range` (page aligned). Parts whose mappings cannot be
    /// watched (file-backed private mappings such as `.data`) are skipped:
    /// they are never unmapped while the program runs.
    pub fn watch(&self, range: &Range<usize>) {
        if range.is_empty() {
            return;
        }
        if self.uffd.register(range, uffd::mode::WP).is_ok() {
            return;
        }
        // Some mapping in the range cannot be registered: do it piece by piece.
        let Ok(vmas) = super::vma::mappings(range) else {
            return;
        };
        for v in vmas {
            let r = v.range.start.max(range.start)..v.range.end.min(range.end);
            if let Err(e) = self.uffd.register(&r, uffd::mode::WP) {
                log::trace!("not watching {r:#x?} ({}): {e}", v.name);
            }
        }
    }

    /// Stops watching `range` (before the library itself replaces the
    /// mappings there, which must not look like the application's doing).
    pub fn unwatch(&self, range: &Range<usize>) {
        if range.is_empty() {
            return;
        }
        if self.uffd.unregister(range).is_err() {
            if let Ok(vmas) = super::vma::mappings(range) {
                for v in vmas {
                    let r = v.range.start.max(range.start)..v.range.end.min(range.end);
                    let _ = self.uffd.unregister(&r);
                }
            }
        }
    }

    /// Whether an unmap is known before its address is free (the unmap
    /// hooks are in place). Without, a hit must be checked against the
    /// mappings even after [`sync`](Self::sync).
    pub fn hooked(&self) -> bool {
        self.hooked
    }

    /// How long `sync` waits for an unmap in flight before it gives up and
    /// asks for checked hits (an unmap normally takes microseconds).
    const IN_FLIGHT_DEADLINE: Duration = Duration::from_millis(5);

    /// Applies every event read so far, after waiting for the unmaps in
    /// flight and for a read in progress. Cheap when nothing happened (three
    /// loads). `false` when an unmap stayed in flight past a deadline (a
    /// thread stopped inside it): hits must then be checked against the
    /// mappings.
    #[must_use = "when false, hits must be checked against the mappings"]
    pub fn sync(&self) -> bool {
        // First: every unmap that could have freed an address this thread
        // found free has returned, so its event has been read.
        if !super::unmap_hook::settle(Self::IN_FLIGHT_DEADLINE) {
            log::debug!("an unmap is still in flight: this lookup checks its hit");
            return false;
        }
        loop {
            // Acquire on `reading` first: a reader that lowered it pushed its
            // events (Release) before, so the `tail` load below sees them.
            let reading = self.reading.load(Ordering::SeqCst);
            let tail = self.tail.load(Ordering::Acquire);
            let unapplied = tail != self.applied.load(Ordering::Acquire)
                || self.overflows.load(Ordering::Acquire)
                    != self.overflows_applied.load(Ordering::Acquire);
            if !unapplied && !reading {
                return true;
            }
            if unapplied {
                // Applies what is left, or waits (the lock) for the thread
                // applying it now.
                self.apply_pending();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Counters.
    pub fn stats(&self) -> MonitorStats {
        MonitorStats {
            unmaps: self.unmaps.load(Ordering::Relaxed),
            removes: self.removes.load(Ordering::Relaxed),
            remaps: self.remaps.load(Ordering::Relaxed),
            overflows: self.overflows.load(Ordering::Relaxed),
            faults: self.faults.load(Ordering::Relaxed),
        }
    }

    fn apply_pending(&self) {
        let _g = self.apply_lock.lock().unwrap_or_else(|p| p.into_inner());
        let mut evs = Vec::new();
        let tail = self.tail.load(Ordering::Acquire);
        let mut head = self.head.load(Ordering::Relaxed);
        while head != tail {
            let s = &self.ring[head as usize % RING];
            let (a, b, c) = (
                s.a.load(Ordering::Relaxed) as usize,
                s.b.load(Ordering::Relaxed) as usize,
                s.c.load(Ordering::Relaxed) as usize,
            );
            evs.push(match s.kind.load(Ordering::Relaxed) {
                KIND_UNMAP => MemEvent::Unmap(a..b),
                KIND_REMOVE => MemEvent::Remove(a..b),
                _ => MemEvent::Remap {
                    from: a..a + c,
                    to: b,
                },
            });
            head += 1;
        }
        // Release: the reader reuses the slots only after seeing this.
        self.head.store(head, Ordering::Release);
        let overflows = self.overflows.load(Ordering::Acquire);
        if overflows != self.overflows_applied.load(Ordering::Relaxed) {
            evs.push(MemEvent::Everything);
        }
        if !evs.is_empty() {
            log::debug!("applying {} memory events", evs.len());
            (self.apply)(&evs);
        }
        // Release: a `sync` that sees these sees the application's effects.
        self.applied.store(head, Ordering::Release);
        self.overflows_applied.store(overflows, Ordering::Release);
    }

    fn push(&self, kind: u64, a: u64, b: u64, c: u64) {
        let tail = self.tail.load(Ordering::Relaxed);
        if tail - self.head.load(Ordering::Acquire) >= RING as u64 {
            // Full: everything will be invalidated; nothing is lost.
            // Release: pairs with the appliers' Acquire.
            self.overflows.fetch_add(1, Ordering::Release);
            return;
        }
        let s = &self.ring[tail as usize % RING];
        s.kind.store(kind, Ordering::Relaxed);
        s.a.store(a, Ordering::Relaxed);
        s.b.store(b, Ordering::Relaxed);
        s.c.store(c, Ordering::Relaxed);
        // Release: publishes the slot to appliers (Acquire on `tail`).
        self.tail.store(tail + 1, Ordering::Release);
    }

    /// The reader thread. Allocates nothing inside the loop.
    fn read_loop(&self) {
        let mut buf = [[0u8; MSG_SIZE]; 64];
        loop {
            let mut pfd = [libc::pollfd {
                fd: self.uffd.raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            }];
            if crate::sys::poll(&mut pfd, -1).is_err() {
                continue;
            }
            // SeqCst: raised before the read that releases the unmapping
            // thread, so that thread's next `sync` sees it (module doc).
            self.reading.store(true, Ordering::SeqCst);
            loop {
                let n = match self.uffd.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                for m in &buf[..n] {
                    match Event::parse(m) {
                        Event::Unmap { start, end } => {
                            self.unmaps.fetch_add(1, Ordering::Relaxed);
                            self.push(KIND_UNMAP, start, end, 0);
                        }
                        Event::Remove { start, end } => {
                            self.removes.fetch_add(1, Ordering::Relaxed);
                            self.push(KIND_REMOVE, start, end, 0);
                        }
                        Event::Remap { from, to, len } => {
                            self.remaps.fetch_add(1, Ordering::Relaxed);
                            self.push(KIND_REMAP, from, to, len);
                        }
                        Event::PageFault { addr } => {
                            // Nothing here protects pages; release the writer.
                            self.faults.fetch_add(1, Ordering::Relaxed);
                            let page = regcache::page_size();
                            let p = addr as usize & !(page - 1);
                            let _ = self.uffd.write_protect(&(p..p + page), false);
                        }
                        Event::Other(_) => {}
                    }
                }
            }
            // Release: the events pushed above happen before a `sync` that
            // sees `reading` low.
            self.reading.store(false, Ordering::SeqCst);
            self.wake.notify_all();
        }
    }

    /// The applier thread: applies events when no registration does.
    fn apply_loop(&self) {
        let pending = || {
            self.tail.load(Ordering::Acquire) != self.applied.load(Ordering::Acquire)
                || self.overflows.load(Ordering::Acquire)
                    != self.overflows_applied.load(Ordering::Acquire)
        };
        loop {
            // Look first: registering as a sleeper runs a heavy fence
            // (`membarrier`), worth paying only when about to sleep.
            if pending() {
                self.apply_pending();
                continue;
            }
            // Only this process's threads notify it.
            let key = self.wake.prepare_wait_local();
            if pending() {
                self.wake.cancel_wait(key);
                self.apply_pending();
                continue;
            }
            self.wake.wait(key, None);
        }
    }
}
