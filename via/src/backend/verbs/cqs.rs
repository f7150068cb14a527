//! The device CQs of one NIC: as many as it takes for every completion
//! that can be outstanding at once to have its entry.
//!
//! A device CQ that fills up overruns: rxe drops the completions it cannot
//! post, a hardware device (mlx5) puts the CQ and every QP on it in error
//! and reports `IBV_EVENT_CQ_ERR`. VIPL sets no queue depth per VI, so each
//! VI may have [`super::QUEUE_DEPTH`] requests outstanding each way: a
//! QP reserves that many entries of one CQ when it is made (two queues'
//! worth, or its send queue's when it takes receives from an SRQ, which
//! reserves its own depth), and a new CQ is made when none has room. The
//! entries come back when the QP (or SRQ) is destroyed.
//!
//! The CQs share one completion channel (one fd for the progress thread to
//! sleep on) and are never destroyed before the NIC: a drain polls each of
//! them, without a lock, in the order they were made.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use super::ibv::{Channel, Context, Cq, CqShare};

/// The device CQs and their channel.
pub(crate) struct DeviceCqs {
    ctx: Arc<Context>,
    channel: Arc<Channel>,
    /// Entries asked for each CQ.
    entries: i32,
    /// The CQs made so far (the first `made`).
    all: Box<[OnceLock<Arc<Cq>>]>,
    /// How many of `all` are set. Release by the maker, after the set;
    /// Acquire by readers.
    made: AtomicUsize,
    /// Held to reserve (and to make a CQ).
    reserving: Mutex<()>,
}

impl DeviceCqs {
    /// The CQs of `ctx`, each of `entries` entries, at most `max` of them;
    /// the first is made now (a device that makes none fails the open).
    pub fn new(ctx: &Arc<Context>, entries: i32, max: usize) -> io::Result<DeviceCqs> {
        let channel = Channel::new(ctx)?;
        let cqs = DeviceCqs {
            ctx: ctx.clone(),
            channel,
            entries,
            all: (0..max.max(1)).map(|_| OnceLock::new()).collect(),
            made: AtomicUsize::new(0),
            reserving: Mutex::new(()),
        };
        cqs.make()?;
        Ok(cqs)
    }

    /// Makes one more CQ (the reservation lock held, or alone).
    fn make(&self) -> io::Result<Arc<Cq>> {
        let n = self.made.load(Ordering::Relaxed);
        let cell = self.all.get(n).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::OutOfMemory,
                format!("all {} device CQs are reserved", self.all.len()),
            )
        })?;
        let cq = Cq::new(&self.ctx, self.entries, Some(&self.channel))?;
        // Armed from the start: the progress thread arms each CQ only
        // after polling it empty.
        cq.arm();
        let _ = cell.set(cq.clone());
        self.made.store(n + 1, Ordering::Release);
        log::debug!("verbs: device CQ {n} made ({} entries)", cq.capacity());
        Ok(cq)
    }

    /// Reserves `n` entries in a CQ with room, made if none has.
    ///
    /// # Errors
    /// The device's, when it makes no more CQs.
    pub fn reserve(&self, n: u32) -> io::Result<CqShare> {
        let _g = self.reserving.lock().unwrap_or_else(|p| p.into_inner());
        // A test puts every QP on the first CQ, reserving nothing (as one
        // device CQ for all did): it overruns.
        failpoint!("verbs-cq-overcommit", |_| self
            .first()
            .reserve(0)
            .ok_or_else(|| io::Error::other("unreachable: nothing reserved")));
        for cq in self.iter() {
            if let Some(s) = cq.reserve(n) {
                return Ok(s);
            }
        }
        let cq = self.make()?;
        cq.reserve(n).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::OutOfMemory,
                format!("a device CQ of {} entries cannot hold {n}", cq.capacity()),
            )
        })
    }

    #[cfg(feature = "failpoints")]
    fn first(&self) -> &Arc<Cq> {
        self.all[0]
            .get()
            .expect("the first CQ is made with the set")
    }

    /// The CQs made so far.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Cq>> {
        let n = self.made.load(Ordering::Acquire);
        self.all[..n].iter().filter_map(OnceLock::get)
    }

    /// Where `cq` is among the CQs made.
    pub fn index_of(&self, cq: &Arc<Cq>) -> Option<usize> {
        self.iter().position(|c| Arc::ptr_eq(c, cq))
    }

    /// The CQ made `i`-th, if made.
    pub fn get(&self, i: usize) -> Option<&Arc<Cq>> {
        if i < self.made.load(Ordering::Acquire) {
            self.all[i].get()
        } else {
            None
        }
    }

    /// How many CQs are made.
    pub fn len(&self) -> usize {
        self.made.load(Ordering::Acquire)
    }

    /// The completion channel of every CQ.
    pub fn channel(&self) -> &Channel {
        &self.channel
    }
}
