//! The engine: the soft NIC's "firmware", run by the process that initiates.
//!
//! It runs work requests: a send takes the next posted receive of the peer
//! VI and copies the message into it, an RDMA write or read checks the
//! peer's translation table and copies, and each completes into the user
//! descriptors on both sides ([`op`]; the bytes move in [`transfer`]).
//!
//! This module is the progress handshake. Inline progress (default): the
//! thread that posts runs its request directly when nothing is queued and
//! nobody else runs the engine (the common case: no doorbell round trip).
//! Otherwise the request goes through a doorbell, and whichever thread holds
//! the engine lock drains the doorbells; a thread that finds the lock taken
//! leaves its request to the holder, which checks the doorbells again after
//! releasing the lock. The two sides meet Dekker-style through an asymmetric
//! fence (`doorbell::asymmetric`): the holder, on every post, has a light
//! fence (no instruction) between its release and the re-check; the poster
//! that found the lock taken, rarely, a heavy one (`membarrier`) between its
//! push and a second `try_lock`. So a post that raced with the release is
//! never stranded, and the common post does not wait behind its own stores
//! into the peer's lines. The lock also guards the engine's caches (translations
//! of local and peer regions, [`links`]), so the data path takes no other
//! lock for them. No thread spins on behalf of the engine: on 2 cores a
//! polling ping-pong already uses both. Thread progress
//! (`VIA_PROGRESS=thread`): an engine thread sleeps on the doorbell's event
//! count and posters ring it.
//!
//! Doorbells: one central multi-producer ring per NIC (default), or one ring
//! per VI (`VIA_DOORBELL=per-vi`, the engine then polls every VI's ring),
//! the two designs the thesis compares.
#![forbid(unsafe_code)]

pub(crate) mod lane;
pub(crate) mod links;
pub(crate) mod op;
pub(crate) mod transfer;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use doorbell::asymmetric::{heavy_fence, light_fence};
use doorbell::{BiasedGuard, BiasedLock};

use crate::backend::Kick;
use crate::config::{Config, DoorbellMode, Progress};
use crate::error::{Error, Result};
use crate::nic::NicInner;
use crate::shm::rings::MappedDoorbell;
use crate::translate::{SendWr, WrRegions};
use crate::vi::ViCore;

use super::SoftNic;
use super::layout::{DOORBELL_SLOTS, MAX_INLINE, SendPd, VI_DOORBELL_SLOTS};
use super::tcache::Regions;
use links::Links;
use op::{Break, Known, execute, execute_queued, settle};

/// What the engine keeps between requests; guarded by the engine lock.
pub(crate) struct EngineState {
    pub regions: Regions,
    pub links: Links,
    /// Connection breaks found while running, acted on after the lock is
    /// released (breaking takes VI locks).
    pub breaks: Vec<Break>,
}

/// The engine of one NIC.
pub(crate) struct Engine {
    /// The engine lock (no poisoning: the state is caches and pending
    /// breaks, usable after a panic inside the engine). Biased: with inline
    /// progress the posting thread takes it for every send, and with its
    /// bias it does so without a locked instruction (`doorbell::biased`).
    state: BiasedLock<EngineState>,
    mode: DoorbellMode,
    progress: Progress,
    /// Bytes of a send copied into its doorbell entry (`VIA_INLINE`).
    inline: usize,
    central: Option<MappedDoorbell<SendPd>>,
    per_vi: RwLock<HashMap<u32, Arc<MappedDoorbell<SendPd>>>>,
    /// Where the engine thread sleeps (thread progress); posters notify it
    /// after pushing into any doorbell.
    wake: Arc<doorbell::EventCount>,
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    name: String,
    /// A direct execution (in `post_send`) left connection breaks to settle.
    breaks_waiting: AtomicBool,
    /// Entries pushed into the doorbells and not yet taken out: what
    /// [`Engine::pending`] reads (one load, not the rings' shared indices).
    queued: AtomicU32,
}

impl Engine {
    /// An engine with the configured doorbells.
    pub fn new(config: &Config, session: u64, nic: u32) -> Result<Engine> {
        let name = format!("via-engine:{session}:{nic}");
        let central = match config.doorbell {
            DoorbellMode::Central => {
                Some(MappedDoorbell::create(&name, DOORBELL_SLOTS).map_err(|e| {
                    log::error!("cannot create the doorbell: {e}");
                    Error::failed("creating the doorbell", e)
                })?)
            }
            DoorbellMode::PerVi => None,
        };
        Ok(Engine {
            state: BiasedLock::new(EngineState {
                regions: Regions::new(config.tcache_entries, config.tcache_ways),
                links: Links::default(),
                breaks: Vec::new(),
            }),
            mode: config.doorbell,
            progress: config.progress,
            inline: config.inline.min(MAX_INLINE),
            central,
            per_vi: RwLock::new(HashMap::new()),
            wake: Arc::new(doorbell::EventCount::new()),
            stop: Arc::new(AtomicBool::new(false)),
            thread: Mutex::new(None),
            name,
            breaks_waiting: AtomicBool::new(false),
            queued: AtomicU32::new(0),
        })
    }

    fn central(&self) -> Option<&doorbell::Doorbell<SendPd>> {
        self.central.as_ref().map(|d| d.get())
    }

    /// Wakes the engine thread (thread progress) after a push.
    fn wake_engine(&self) {
        self.wake.notify_all();
    }

    pub fn threaded(&self) -> bool {
        self.progress == Progress::Thread
    }

    #[inline(always)]
    fn try_lock(&self) -> Option<BiasedGuard<'_, EngineState>> {
        self.state.try_lock()
    }

    fn lock(&self) -> BiasedGuard<'_, EngineState> {
        self.state.lock()
    }

    /// Whether a doorbell holds work. SeqCst: the pusher's increment and
    /// this load are the two sides of the handshake with the engine lock
    /// (see the module doc).
    pub fn pending(&self) -> bool {
        self.queued.load(Ordering::SeqCst) != 0
    }

    /// Runs or queues `wr` (the caller holds the VI's send lock).
    #[inline(always)]
    pub fn post(
        &self,
        soft: &SoftNic,
        nic: &NicInner,
        vi: &ViCore,
        wr: &SendWr,
        regions: WrRegions<'_>,
    ) -> Result<Kick> {
        // Inline progress with nothing queued: run the request here, no
        // round trip through the doorbell ring (ordering holds: the VI's
        // send lock is held and nothing of it waits in a doorbell). The
        // breaks it finds are settled by the `kick` that follows the post.
        if !self.threaded() && !self.pending() {
            if let Some(mut g) = self.try_lock() {
                if !self.pending() {
                    let known = Known {
                        src: regions.src,
                        status: regions.status,
                    };
                    execute(soft, nic, &mut g, vi, wr, &[], known);
                    if !g.breaks.is_empty() {
                        self.breaks_waiting.store(true, Ordering::Release);
                    }
                    drop(g);
                    // What `kick` would look at first, once the engine
                    // lock is released: a kick only if it would act.
                    return Ok(if self.waiting() {
                        Kick::Needed
                    } else {
                        Kick::NotNeeded
                    });
                }
            }
        }
        let pd = self.entry(nic, wr);
        match self.central() {
            Some(db) => self.push(soft, nic, db, pd)?,
            None => {
                let db = self
                    .per_vi
                    .read()
                    .unwrap()
                    .get(&vi.slot)
                    .cloned()
                    .ok_or(Error::Resource)?;
                self.push(soft, nic, db.get(), pd)?
            }
        }
        // Queued: inline, the kick runs it.
        Ok(Kick::Needed)
    }

    /// The doorbell entry of `wr`, with the payload inline when it is small
    /// enough (`VIA_INLINE`) and readable now.
    fn entry(&self, nic: &NicInner, wr: &SendWr) -> SendPd {
        let mut pd = SendPd::new(wr);
        let total = wr.length as usize;
        if self.inline == 0
            || wr.fault != 0
            || wr.op() != crate::descriptor::control::OP_SENDRECV
            || total == 0
            || total > self.inline
        {
            return pd;
        }
        let mut done = 0usize;
        for s in wr.local() {
            let n = s.len as usize;
            if n == 0 {
                continue;
            }
            let ok = nic
                .regions
                .get(s.handle)
                .is_some_and(|r| r.read(s.va, &mut pd.inline[done..done + n]).is_ok());
            if !ok {
                // The engine finds the same problem from the segments.
                return SendPd::new(wr);
            }
            done += n;
        }
        pd.inline_len = done as u32;
        pd
    }

    /// Pushes `pd` into `db`. In thread mode this rings the doorbell
    /// (waking the engine thread if it sleeps); inline, the caller then
    /// kicks the engine.
    ///
    /// # Errors
    /// `Resource` if the doorbell stays full (only in thread mode, where the
    /// engine thread drains it concurrently).
    fn push(
        &self,
        soft: &SoftNic,
        nic: &NicInner,
        db: &doorbell::Doorbell<SendPd>,
        pd: SendPd,
    ) -> Result<()> {
        let mut pd = pd;
        for _ in 0..1_000_000 {
            // Reserve + fill + commit happen inside push (Release on the
            // slot stamp); a failed push publishes nothing.
            // Counted before the push: a drainer may take the entry at once.
            self.queued.fetch_add(1, Ordering::SeqCst);
            match db.push_quiet(pd) {
                Ok(_) => {
                    if self.threaded() {
                        // The doorbell proper: wake the engine thread if it sleeps.
                        self.wake_engine();
                    }
                    return Ok(());
                }
                Err(full) => {
                    // Full: drain it ourselves (inline), or let the engine
                    // thread catch up (backpressure).
                    self.queued.fetch_sub(1, Ordering::SeqCst);
                    pd = full.into_inner();
                    if self.threaded() {
                        self.wake_engine();
                    } else {
                        self.kick_inline(soft, nic, None);
                    }
                    std::thread::yield_now();
                }
            }
        }
        Err(Error::Resource)
    }

    /// After a post (send lock released): runs what a doorbell holds and
    /// settles breaks a direct execution found.
    pub fn kick(&self, soft: &SoftNic, nic: &NicInner, vi: Option<&ViCore>) {
        if self.threaded() {
            return;
        }
        if self.waiting() {
            self.kick_inline(soft, nic, vi);
        }
    }

    /// Whether work waits for inline progress (doorbell entries, or breaks
    /// to settle), looked at after the engine lock was released.
    #[inline(always)]
    fn waiting(&self) -> bool {
        // Light fence: whatever was posted before this point (by us, or a
        // poster that found the engine lock taken by our direct execution)
        // is seen below; pairs with the poster's heavy fence in
        // `kick_inline`.
        light_fence();
        self.pending() || self.breaks_waiting.load(Ordering::Acquire)
    }

    /// Runs the engine unless another thread does. `hint` is the VI that
    /// just posted (saves looking it up).
    fn kick_inline(&self, soft: &SoftNic, nic: &NicInner, hint: Option<&ViCore>) {
        loop {
            let mut g = match self.try_lock() {
                Some(g) => g,
                None => {
                    // Heavy fence: our push is ordered before the second
                    // look at the lock; pairs with the holder's light fence
                    // after its release (see the module doc).
                    if heavy_fence() {
                        match self.try_lock() {
                            Some(g) => g,
                            None => return,
                        }
                    } else {
                        // The barrier failed here: light fences are full
                        // fences in this process then (it could not have
                        // registered), unless it did register and the
                        // barrier alone is refused. Do not rely on either:
                        // look until the holder has drained our push or
                        // the lock is free.
                        match self.try_lock() {
                            Some(g) => g,
                            None if !self.pending() => return,
                            None => {
                                std::thread::yield_now();
                                continue;
                            }
                        }
                    }
                }
            };
            self.drain(soft, nic, &mut g, hint);
            let breaks = std::mem::take(&mut g.breaks);
            self.breaks_waiting.store(false, Ordering::Relaxed);
            drop(g);
            // Light fence: the release above is ordered before the re-check
            // below; pairs with the poster's heavy fence.
            light_fence();
            settle(nic, breaks);
            if !self.pending() {
                return;
            }
        }
    }

    /// Runs everything queued now, waiting for the lock if another thread
    /// holds it. After this returns no request posted before the call is
    /// still in a doorbell and no engine step is in progress.
    pub fn drain_now(&self, soft: &SoftNic, nic: &NicInner) {
        let mut g = self.lock();
        self.drain(soft, nic, &mut g, None);
        self.release(soft, nic, g);
    }

    /// Waits until no engine step that started before the call is still
    /// running: every step holds the lock, so taking it once waits for the
    /// step in progress, and later steps see the updated tables. Released
    /// like every holder must: a request posted while we held the lock (its
    /// poster saw the lock taken and left it to us) runs, instead of waiting
    /// in its doorbell until some later post (a process that disconnects
    /// next would flush it: a message that never arrives).
    pub fn quiesce_light(&self, soft: &SoftNic, nic: &NicInner) {
        let g = self.lock();
        self.release(soft, nic, g);
    }

    /// Runs `f` on the engine's state (under the engine lock), then releases
    /// it like every holder must.
    pub fn with_state<R>(
        &self,
        soft: &SoftNic,
        nic: &NicInner,
        f: impl FnOnce(&mut EngineState) -> R,
    ) -> R {
        let mut g = self.lock();
        let r = f(&mut g);
        self.release(soft, nic, g);
        r
    }

    /// The translation cache's counters.
    pub fn translation_stats(
        &self,
        soft: &SoftNic,
        nic: &NicInner,
    ) -> crate::backend::TranslationStats {
        self.with_state(soft, nic, |g| g.regions.cache.stats())
    }

    /// Releases the engine lock like every holder must: fence, act on the
    /// breaks found, and run what was posted while the lock was held (its
    /// poster saw the lock taken and left the request to us).
    fn release(&self, soft: &SoftNic, nic: &NicInner, mut g: BiasedGuard<'_, EngineState>) {
        let breaks = std::mem::take(&mut g.breaks);
        self.breaks_waiting.store(false, Ordering::Relaxed);
        drop(g);
        // Light fence: the release above is ordered before the re-check
        // below; pairs with the poster's heavy fence (module doc).
        light_fence();
        settle(nic, breaks);
        if self.pending() {
            if self.threaded() {
                self.wake_engine();
            } else {
                self.kick_inline(soft, nic, None);
            }
        }
    }

    fn drain(&self, soft: &SoftNic, nic: &NicInner, st: &mut EngineState, hint: Option<&ViCore>) {
        if let Some(db) = self.central() {
            while let Some(pd) = db.poll() {
                self.queued.fetch_sub(1, Ordering::SeqCst);
                execute_queued(soft, nic, st, &pd.wr, pd.payload(), hint);
            }
            return;
        }
        // Per-VI doorbells: poll every VI's ring (the D1 design: the cost
        // grows with the number of VIs).
        let dbs: Vec<_> = self.per_vi.read().unwrap().values().cloned().collect();
        loop {
            let mut any = false;
            for d in &dbs {
                while let Some(pd) = d.get().poll() {
                    self.queued.fetch_sub(1, Ordering::SeqCst);
                    execute_queued(soft, nic, st, &pd.wr, pd.payload(), hint);
                    any = true;
                }
            }
            if !any {
                break;
            }
        }
    }

    /// Creates the doorbell of VI `slot` (per-VI doorbells), named as the
    /// engine's (`via-engine:<session>:<nic>`) with the slot after it.
    pub fn add_vi(&self, slot: u32) -> Result<()> {
        if self.mode != DoorbellMode::PerVi {
            return Ok(());
        }
        let d = MappedDoorbell::create(&format!("{}:{slot}", self.name), VI_DOORBELL_SLOTS)
            .map_err(|e| {
                log::error!("cannot create a VI doorbell: {e}");
                Error::failed("creating a VI doorbell", e)
            })?;
        self.per_vi.write().unwrap().insert(slot, Arc::new(d));
        Ok(())
    }

    /// Drops the doorbell of VI `slot`.
    pub fn remove_vi(&self, slot: u32) {
        self.per_vi.write().unwrap().remove(&slot);
    }

    /// Starts the engine thread (thread progress).
    pub fn start(&self, nic: &Arc<NicInner>) {
        if !self.threaded() {
            return;
        }
        let weak = Arc::downgrade(nic);
        let stop = self.stop.clone();
        let sleeper = self.wake.clone();
        let t = std::thread::Builder::new()
            .name("via-engine".into())
            .spawn(move || {
                // One look: whether to stop, else whether work waited (and
                // was run). `None`: stop.
                let look = |weak: &std::sync::Weak<NicInner>| -> Option<bool> {
                    // SeqCst: pairs with the store in `stop` (eventcount
                    // handshake).
                    if stop.load(Ordering::SeqCst) {
                        return None;
                    }
                    let nic = weak.upgrade()?;
                    let work = nic.dev.has_work();
                    if work {
                        nic.dev.quiesce(&nic);
                    }
                    Some(work)
                };
                loop {
                    // Look first: registering as a sleeper may run a heavy
                    // fence (`membarrier`), worth paying only when about to
                    // sleep. (Only this process's posters ring this event
                    // count, and thread progress keeps their fences full:
                    // `prepare_wait_local`.)
                    match look(&weak) {
                        None => return,
                        Some(true) => continue,
                        Some(false) => {}
                    }
                    // Register as a sleeper before the last look, so that a
                    // post landing after it wakes us (eventcount handshake).
                    let key = sleeper.prepare_wait_local();
                    match look(&weak) {
                        None => {
                            sleeper.cancel_wait(key);
                            return;
                        }
                        Some(true) => sleeper.cancel_wait(key),
                        // Sleep holding no reference to the NIC.
                        Some(false) => {
                            sleeper.wait(key, None);
                        }
                    }
                }
            })
            .expect("spawn engine thread");
        *self.thread.lock().unwrap() = Some(t);
    }

    /// Stops the engine thread.
    pub fn stop(&self) {
        // SeqCst: the engine thread checks `stop` after registering as a
        // sleeper; `notify_all` below then finds it registered.
        self.stop.store(true, Ordering::SeqCst);
        self.wake.notify_all();
        if let Some(t) = self.thread.lock().unwrap().take() {
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
        log::debug!("{} stopped", self.name);
    }
}
