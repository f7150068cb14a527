//! The safe Rust API: RAII handles over the object model.
//!
//! ```no_run
//! use via::{Nic, Region, ViAttributes, Reliability, DescBuilder};
//! let nic = Nic::open(None).unwrap();
//! let ptag = nic.create_ptag().unwrap();
//! let mem = Region::new(&nic, 1 << 16, ptag, false, false).unwrap();
//! let vi = nic.create_vi(&ViAttributes::new(Reliability::ReliableDelivery, ptag), None, None).unwrap();
//! // ... connect, then:
//! let d = DescBuilder::send().segment(&mem, 4096, 8).write(&mem, 0).unwrap();
//! vi.post_recv(&mem, d).unwrap();
//! ```
#![forbid(unsafe_code)]

use std::sync::Arc;
use std::time::Duration;

use crate::attrs::{MemAttributes, NicAttributes, Ptag, Reliability, ViAttributes, ViState};
use crate::cq::CqCore;
use crate::descriptor::{ALIGNMENT, SEGMENT_SIZE, control};
use crate::error::{Error, Result};
use crate::nic::{AsyncError, NicInner};
use crate::proto::NetAddr;
use crate::shm::mapping::Mapping;
use crate::vi::{Completion, ViCore, Which};

/// Counters of the registration path of a process.
#[derive(Clone, Copy, Debug)]
pub struct RegistrationStats {
    /// The pin-down cache.
    pub cache: regcache::Stats,
    /// The arenas (shared files registered pages move into).
    pub arenas: crate::mem::arena::ArenaStats,
    /// The memory-event monitor (`None`: none on this kernel).
    pub monitor: Option<crate::mem::monitor::MonitorStats>,
    /// Of `cache.hits`, the registrations that took back a parked
    /// registration of the same bytes whole (the cache was not asked), on
    /// the NICs open now.
    pub parked_hits: u64,
}

pub use crate::backend::TranslationStats;

/// An open NIC. Closed with [`Nic::close`] or when the last clone is
/// dropped (VIs, CQs and regions of a closed NIC refuse further use).
#[derive(Clone)]
pub struct Nic {
    pub(crate) inner: Arc<NicInner>,
    _open: Arc<OpenNic>,
}

/// Closes the NIC when the last [`Nic`] clone goes.
struct OpenNic(Arc<NicInner>);

impl Drop for OpenNic {
    fn drop(&mut self) {
        let _ = self.0.close();
    }
}

impl Nic {
    /// Opens a NIC: `None`, `"via_lo"` or `"/dev/via_lo"` for the default
    /// shared-memory NIC.
    ///
    /// # Errors
    /// `InvalidParameter` for an unknown name, `Resource` if viad cannot be
    /// reached or started.
    pub fn open(name: Option<&str>) -> Result<Nic> {
        let inner = NicInner::open(name)?;
        Ok(Nic {
            _open: Arc::new(OpenNic(inner.clone())),
            inner,
        })
    }

    /// A NIC over an object model opened directly (unit tests' loopback).
    #[cfg(test)]
    pub(crate) fn over(inner: Arc<NicInner>) -> Nic {
        Nic {
            _open: Arc::new(OpenNic(inner.clone())),
            inner,
        }
    }

    /// Closes the NIC: disconnects its VIs and releases everything.
    pub fn close(&self) -> Result<()> {
        self.inner.close()
    }

    /// The kind of NIC behind it (`"soft"`: shared memory within a host).
    pub fn kind(&self) -> &'static str {
        self.inner.dev.kind()
    }

    /// The NIC's attributes.
    pub fn attributes(&self) -> NicAttributes {
        self.inner.attributes()
    }

    /// Whether an RDMA write through this NIC stores the last 8 bytes of
    /// its target last, as one atomic word, when the target's end is 8-byte
    /// aligned (an extension, not VIPL 1.0). Then a target that polls that
    /// word (with [`Region::load_u64`], or any Acquire load) and sees the
    /// new value sees every other byte of the write too: a message written
    /// into a ring needs no receive descriptor. The soft NIC does
    /// (`backend/soft/engine/op.rs`); the sockets and verbs kinds do not
    /// promise it (a device places an RDMA write's bytes in any order).
    pub fn writes_tail_last(&self) -> bool {
        self.inner.limits.write_tail_last
    }

    /// Counters of the registration path of this process (the pin-down
    /// cache, the arenas, the memory-event monitor).
    pub fn registration_stats(&self) -> RegistrationStats {
        let p = &self.inner.process;
        let parked_hits = p.all_nics().iter().map(|n| n.parked_hits()).sum();
        let mut cache = p.registrations.stats();
        cache.hits += parked_hits;
        RegistrationStats {
            parked_hits,
            cache,
            arenas: p.arenas.stats(),
            monitor: p.monitor.as_ref().map(|m| m.stats()),
        }
    }

    /// Drops every cached registration that no live registration uses
    /// (for measurements that start cold).
    pub fn flush_registration_cache(&self) -> usize {
        let p = &self.inner.process;
        if let Some(m) = &p.monitor {
            // Unsettled or not, what is applied is dropped below.
            let _ = m.sync();
        }
        self.inner.drop_parked();
        p.registrations.flush()
    }

    /// Counters of this NIC's translation cache (the engine's), if the
    /// device has one.
    pub fn translation_stats(&self) -> Option<TranslationStats> {
        self.inner.dev.translation_stats(&self.inner)
    }

    /// Which daemon serves this process (the system daemon or the
    /// per-user one) and the limits it announced (pinning quota, objects).
    pub fn daemon(&self) -> crate::agent::DaemonInfo {
        self.inner
            .process
            .daemon()
            .expect("a NIC opened through the API has a daemon")
    }

    /// This process's session id with its daemon (how peers and the
    /// daemon name it).
    pub fn session_id(&self) -> u64 {
        self.inner.process.session()
    }

    /// This host's VIA address.
    pub fn host_address(&self) -> Vec<u8> {
        self.inner.host_address()
    }

    /// Creates a protection tag.
    pub fn create_ptag(&self) -> Result<Ptag> {
        self.inner.create_ptag()
    }

    /// Destroys a protection tag (refused while in use).
    pub fn destroy_ptag(&self, p: Ptag) -> Result<()> {
        self.inner.destroy_ptag(p)
    }

    /// Creates a completion queue of `entries`.
    pub fn create_cq(&self, entries: u32) -> Result<Cq> {
        Ok(Cq {
            nic: self.inner.clone(),
            core: CqCore::create(&self.inner, entries)?,
        })
    }

    /// Creates a VI, optionally associating its queues with CQs.
    pub fn create_vi(
        &self,
        attrs: &ViAttributes,
        send_cq: Option<&Cq>,
        recv_cq: Option<&Cq>,
    ) -> Result<Vi> {
        for c in [send_cq, recv_cq].into_iter().flatten() {
            if !Arc::ptr_eq(&c.nic, &self.inner) {
                return Err(Error::InvalidParameter);
            }
        }
        Ok(Vi {
            nic: self.inner.clone(),
            core: ViCore::create(
                &self.inner,
                *attrs,
                send_cq.map(|c| c.core.clone()),
                recv_cq.map(|c| c.core.clone()),
            )?,
        })
    }

    /// Creates a shared receive queue of `entries` descriptors of tag
    /// `ptag` (an extension, not VIPL 1.0; `VipCreateSrq`): VIs attached
    /// with [`Vi::set_srq`] take their receives from it.
    ///
    /// # Errors
    /// `InvalidParameter` on a kind of NIC without SRQs (only verbs has
    /// them) or for 0 entries; `InvalidPtag`; `Resource` above
    /// `MaxDescriptorsPerQueue` or the NIC's SRQs.
    pub fn create_srq(&self, ptag: Ptag, entries: u32) -> Result<Srq> {
        Srq::create(&self.inner, ptag, entries)
    }

    /// Waits for a connection request on `local` (`VipConnectWait`).
    pub fn connect_wait(&self, local: &NetAddr, timeout: Option<Duration>) -> Result<ConnRequest> {
        let (h, remote, attrs) = crate::conn::wait(&self.inner, local.clone(), timeout)?;
        Ok(ConnRequest {
            nic: self.inner.clone(),
            handle: h,
            remote,
            attrs,
        })
    }

    /// Sets the error callback, run on the provider thread.
    pub fn set_error_callback(&self, f: impl Fn(&AsyncError) + Send + Sync + 'static) {
        *self.inner.error_cb.lock().unwrap() = Some(Arc::new(f));
    }

    /// The VIA address for `discriminator` on this host.
    pub fn address(&self, discriminator: &[u8]) -> NetAddr {
        NetAddr {
            host: self.host_address(),
            discriminator: discriminator.to_vec(),
        }
    }

    /// Resolves a host name to a VIA host address.
    pub fn resolve(&self, name: &str) -> Result<Vec<u8>> {
        crate::ns::by_name(&self.inner, name)
    }
}

/// A refused destroy: the error and the object, still usable.
pub struct Refused<T> {
    /// Why.
    pub error: Error,
    /// The object, unchanged.
    pub object: T,
}

impl<T> std::fmt::Debug for Refused<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Refused({:?})", self.error)
    }
}

impl<T> std::fmt::Display for Refused<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "destroy refused: {}", self.error)
    }
}

impl<T> std::error::Error for Refused<T> {}

impl<T> From<Refused<T>> for Error {
    fn from(r: Refused<T>) -> Error {
        r.error
    }
}

/// A pending connection request, from [`Nic::connect_wait`].
pub struct ConnRequest {
    nic: Arc<NicInner>,
    handle: (u32, u16),
    /// The requester's address.
    pub remote: NetAddr,
    /// The requester's VI attributes.
    pub attrs: ViAttributes,
}

impl ConnRequest {
    /// Accepts with `vi`.
    pub fn accept(self, vi: &Vi) -> Result<()> {
        crate::conn::accept(&self.nic, self.handle, &vi.core)
    }

    /// Rejects.
    pub fn reject(self) -> Result<()> {
        crate::conn::reject(&self.nic, self.handle)
    }
}

/// A completion queue.
pub struct Cq {
    nic: Arc<NicInner>,
    core: Arc<CqCore>,
}

impl Cq {
    /// The next (VI slot, is-receive) with a completion, without blocking.
    pub fn done(&self) -> Result<(u32, bool)> {
        self.core.done(&self.nic).map(|(v, r)| (v.slot, r))
    }

    /// Waits for the next completion.
    pub fn wait(&self, timeout: Option<Duration>) -> Result<(u32, bool)> {
        self.core.wait(&self.nic, timeout).map(|(v, r)| (v.slot, r))
    }

    /// Changes the number of entries.
    pub fn resize(&self, entries: u32) -> Result<()> {
        self.core.resize(&self.nic, entries)
    }

    /// Runs `f` once, on the provider thread, for the next completion: with
    /// the slot of the VI and whether it is the receive queue (the CQ entry
    /// is consumed; the descriptor is still to be dequeued from the VI).
    pub fn notify(&self, f: impl FnOnce(u32, bool) + Send + 'static) {
        self.core.notify(
            &self.nic,
            Box::new(move |vi: Arc<ViCore>, recv| f(vi.slot, recv)),
        )
    }

    /// Destroys the CQ; refused (`InvalidState`, and the CQ given back) while
    /// VIs use it.
    pub fn destroy(self) -> std::result::Result<(), Refused<Cq>> {
        match self.core.destroy(&self.nic) {
            Ok(()) => Ok(()),
            Err(error) => Err(Refused {
                error,
                object: self,
            }),
        }
    }
}

/// A shared receive queue (an extension, not VIPL 1.0): receive
/// descriptors posted once for every VI attached ([`Vi::set_srq`]); a
/// message to any of them takes the oldest. Destroyed with
/// [`Srq::destroy`] (or when dropped) once no VI is attached.
pub struct Srq {
    nic: Arc<NicInner>,
    id: u32,
    ptag: Ptag,
    post: std::sync::Mutex<Box<SrqPost>>,
    /// Destroyed by [`Srq::destroy`] (the id may belong to another SRQ).
    gone: std::sync::atomic::AtomicBool,
}

/// The posting path's scratch of an SRQ.
#[derive(Default)]
struct SrqPost {
    regions: crate::regions::RegionCache,
    descs: crate::translate::DescCache,
    copy: crate::translate::SegCopy,
    status: crate::completion::StatusLoc,
    rwr: crate::translate::RecvWr,
}

/// A descriptor a shared receive queue completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SrqCompletion {
    /// Slot of the VI that received ([`Vi::slot`]); `u32::MAX` for a
    /// descriptor completed at post time (a bad segment) or flushed.
    pub vi: u32,
    /// Address of the descriptor.
    pub desc: u64,
    /// Its status word (as written into the descriptor).
    pub status: u32,
    /// Generation of the VI (the C layer's handle).
    pub(crate) generation: u16,
}

impl Srq {
    pub(crate) fn create(nic: &Arc<NicInner>, ptag: Ptag, entries: u32) -> Result<Srq> {
        if !nic.ptag_valid(ptag) {
            return Err(Error::InvalidPtag);
        }
        let id = nic.dev.create_srq(nic, ptag.id(), entries)?;
        Ok(Srq {
            nic: nic.clone(),
            id,
            ptag,
            post: std::sync::Mutex::new(Box::default()),
            gone: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// The NIC of the SRQ.
    pub(crate) fn nic(&self) -> &Arc<NicInner> {
        &self.nic
    }

    /// [`Vi::set_srq`] of VI `core` of `nic`.
    pub(crate) fn attach(nic: &Arc<NicInner>, core: &ViCore, srq: Option<&Srq>) -> Result<()> {
        if let Some(s) = srq {
            if !Arc::ptr_eq(&s.nic, nic) {
                return Err(Error::InvalidParameter);
            }
        }
        if core.vi_state() != ViState::Idle {
            return Err(Error::InvalidState);
        }
        let (_, _, _, recv_empty) = core.query(nic);
        if !recv_empty {
            return Err(Error::InvalidState);
        }
        nic.dev.attach_srq(nic, core, srq.map(|s| s.id))
    }

    /// Posts the receive descriptor at byte `desc` of `mem`
    /// (`VipPostSrqRecv`).
    ///
    /// # Errors
    /// As [`Vi::post_recv`]: `InvalidParameter` for a bad handle or
    /// address, `DescriptorError` for a malformed descriptor (a segment
    /// fault completes it with an error status instead); `Resource` when
    /// the SRQ holds `entries` descriptors.
    pub fn post_recv(&self, mem: &Region, desc: usize) -> Result<()> {
        self.post_at(mem.addr(desc)?, mem.handle)
    }

    /// Posts the receive descriptor at address `va` in the region of
    /// memory handle `handle`.
    pub(crate) fn post_at(&self, va: u64, handle: u32) -> Result<()> {
        let nic = &self.nic;
        let ptag = self.ptag.id();
        let mut p = self.post.lock().unwrap();
        let SrqPost {
            regions,
            descs,
            copy,
            status,
            rwr,
        } = &mut **p;
        crate::translate::read_recv(
            &nic.regions,
            regions,
            descs,
            va,
            handle,
            ptag,
            rwr,
            status,
            copy,
        )?;
        status.complete(0, None, None);
        nic.dev.post_srq_recv(nic, self.id, va, rwr)
    }

    /// The oldest completed descriptor (`VipSrqDone`).
    ///
    /// # Errors
    /// `NotDone` when none is.
    pub fn done(&self) -> Result<SrqCompletion> {
        if let Some(d) = self.nic.dev.srq_done(self.id) {
            return Ok(self.completion(d));
        }
        self.nic.dev.kick(&self.nic, None);
        // As a polled VI or CQ: the device progresses inline once.
        if self.nic.dev.poll_any(&self.nic, &[]) {
            if let Some(d) = self.nic.dev.srq_done(self.id) {
                return Ok(self.completion(d));
            }
        }
        Err(Error::NotDone)
    }

    /// Waits up to `timeout` (`None`: for ever) for a completed descriptor
    /// (`VipSrqWait`).
    ///
    /// # Errors
    /// `Timeout`.
    pub fn wait(&self, timeout: Option<Duration>) -> Result<SrqCompletion> {
        let deadline = timeout.and_then(|t| std::time::Instant::now().checked_add(t));
        let wake = self
            .nic
            .dev
            .srq_wake(self.id)
            .ok_or(Error::InvalidParameter)?;
        let mut got = None;
        doorbell::wait_until(wake, crate::config::Config::get().spin, deadline, || {
            got = self.nic.dev.srq_done(self.id);
            got.is_some()
        });
        match got {
            Some(d) => Ok(self.completion(d)),
            None => Err(Error::Timeout),
        }
    }

    fn completion(&self, d: crate::backend::SrqDone) -> SrqCompletion {
        SrqCompletion {
            vi: d.vi.0,
            desc: d.desc,
            status: d.status,
            generation: d.vi.1,
        }
    }

    /// [`Srq::destroy`] of an SRQ the C layer shares.
    pub(crate) fn destroy_shared(&self) -> Result<()> {
        self.nic.dev.destroy_srq(&self.nic, self.id)?;
        self.gone.store(true, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Destroys the SRQ (`VipDestroySrq`); descriptors still posted
    /// complete with `DESC_FLUSHED_ERROR` written into them.
    ///
    /// # Errors
    /// `InvalidState` (the SRQ is given back) while a VI is attached.
    pub fn destroy(self) -> std::result::Result<(), Refused<Srq>> {
        match self.nic.dev.destroy_srq(&self.nic, self.id) {
            Ok(()) => {
                self.gone.store(true, std::sync::atomic::Ordering::Relaxed);
                Ok(())
            }
            Err(error) => Err(Refused {
                error,
                object: self,
            }),
        }
    }
}

impl Drop for Srq {
    fn drop(&mut self) {
        if !self.gone.load(std::sync::atomic::Ordering::Relaxed) {
            let _ = self.nic.dev.destroy_srq(&self.nic, self.id);
        }
    }
}

/// A VI.
pub struct Vi {
    nic: Arc<NicInner>,
    core: Arc<ViCore>,
}

#[cfg(test)]
impl Vi {
    /// The object model's VI (unit tests).
    pub(crate) fn core(&self) -> &Arc<ViCore> {
        &self.core
    }
}

impl Vi {
    /// Slot of the VI in its NIC (what [`Cq::done`] reports).
    pub fn slot(&self) -> u32 {
        self.core.slot
    }

    /// The VI's state.
    pub fn state(&self) -> ViState {
        self.core.state_seen(&self.nic)
    }

    /// Attributes.
    pub fn attributes(&self) -> ViAttributes {
        self.core.query(&self.nic).1
    }

    /// Changes attributes (idle only).
    pub fn set_attributes(&self, a: &ViAttributes) -> Result<()> {
        self.core.set_attributes(&self.nic, *a)
    }

    /// Whether the send and receive queues are empty.
    pub fn queues_empty(&self) -> (bool, bool) {
        let (_, _, s, r) = self.core.query(&self.nic);
        (s, r)
    }

    /// Connects to the server at `remote` (`VipConnectRequest`).
    pub fn connect(
        &self,
        local: &NetAddr,
        remote: &NetAddr,
        timeout: Option<Duration>,
    ) -> Result<ViAttributes> {
        crate::conn::request(
            &self.nic,
            &self.core,
            local.clone(),
            remote.clone(),
            timeout,
        )
    }

    /// Starts a peer-to-peer connection.
    pub fn connect_peer(
        &self,
        local: &NetAddr,
        remote: &NetAddr,
        timeout: Option<Duration>,
    ) -> Result<()> {
        crate::conn::peer_request(
            &self.nic,
            &self.core,
            local.clone(),
            remote.clone(),
            timeout,
        )
    }

    /// Polls a peer-to-peer connection.
    pub fn connect_peer_done(&self) -> Result<ViAttributes> {
        crate::conn::peer_done(&self.nic, &self.core, false)
    }

    /// Waits for a peer-to-peer connection.
    pub fn connect_peer_wait(&self) -> Result<ViAttributes> {
        crate::conn::peer_done(&self.nic, &self.core, true)
    }

    /// Attaches the VI to a shared receive queue (`Some`), or gives it
    /// its own receive queue again (`None`) (an extension, not VIPL 1.0;
    /// `VipSetViSrq`). The VI must be idle with no receive posted; while
    /// attached, its receives come from the SRQ ([`Srq::done`] says which
    /// VI took each) and [`Vi::post_recv`] is `InvalidState`.
    ///
    /// # Errors
    /// `InvalidParameter`: an SRQ of another NIC, or a kind without SRQs;
    /// `InvalidState`: the VI is not idle or has receives posted;
    /// `InvalidPtag`: the SRQ's tag is not the VI's;
    /// `InvalidReliabilityLevel`: an Unreliable VI.
    pub fn set_srq(&self, srq: Option<&Srq>) -> Result<()> {
        Srq::attach(&self.nic, &self.core, srq)
    }

    /// Disconnects.
    pub fn disconnect(&self) -> Result<()> {
        self.core.disconnect(&self.nic)
    }

    /// Posts the send descriptor at byte `desc` of `mem`.
    pub fn post_send(&self, mem: &Region, desc: usize) -> Result<()> {
        self.core.post_send(&self.nic, mem.addr(desc)?, mem.handle)
    }

    /// Posts the receive descriptor at byte `desc` of `mem`.
    pub fn post_recv(&self, mem: &Region, desc: usize) -> Result<()> {
        self.core.post_recv(&self.nic, mem.addr(desc)?, mem.handle)
    }

    /// Dequeues a completed send.
    pub fn send_done(&self) -> Result<Completion> {
        self.core.done_polling(&self.nic, Which::Send)
    }

    /// Dequeues a completed receive.
    pub fn recv_done(&self) -> Result<Completion> {
        self.core.done_polling(&self.nic, Which::Recv)
    }

    /// Waits for a completed send.
    pub fn send_wait(&self, timeout: Option<Duration>) -> Result<Completion> {
        self.core.wait(&self.nic, Which::Send, timeout)
    }

    /// Waits for a completed receive.
    pub fn recv_wait(&self, timeout: Option<Duration>) -> Result<Completion> {
        self.core.wait(&self.nic, Which::Recv, timeout)
    }

    /// Runs `f` once, on the provider thread, for the next completed receive.
    pub fn recv_notify(&self, f: impl FnOnce(Completion) + Send + 'static) {
        self.core.notify(&self.nic, Which::Recv, Box::new(f))
    }

    /// Runs `f` once, on the provider thread, for the next completed send.
    pub fn send_notify(&self, f: impl FnOnce(Completion) + Send + 'static) {
        self.core.notify(&self.nic, Which::Send, Box::new(f))
    }

    /// Destroys the VI; refused (`InvalidState`, and the VI given back)
    /// unless it is idle with empty queues.
    pub fn destroy(self) -> std::result::Result<(), Refused<Vi>> {
        match self.core.destroy(&self.nic) {
            Ok(()) => Ok(()),
            Err(error) => Err(Refused {
                error,
                object: self,
            }),
        }
    }
}

/// Page-aligned memory owned by the library for the application: what a
/// [`Region`] registers. Clones share the pages; they are unmapped when the
/// last clone and the last region over them are gone. Peers may write it
/// at any time, so it is read and written by copy, never through references.
#[derive(Clone)]
pub struct Memory(Arc<Mapping>);

impl Memory {
    /// `len` bytes (rounded up to pages), zeroed.
    ///
    /// # Errors
    /// `Resource` if the memory cannot be mapped.
    pub fn new(len: usize) -> Result<Memory> {
        let len = len.max(1).next_multiple_of(regcache::page_size());
        Ok(Memory(Arc::new(
            Mapping::anonymous(len).map_err(|e| Error::failed("mapping memory", e))?,
        )))
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether it is empty (never).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Address of the first byte.
    pub fn addr(&self) -> u64 {
        self.0.addr() as u64
    }

    /// Copies bytes in at `off`.
    pub fn write(&self, off: usize, b: &[u8]) -> Result<()> {
        self.0
            .write(off, b)
            .then_some(())
            .ok_or(Error::InvalidParameter)
    }

    /// Copies bytes out from `off`.
    pub fn read(&self, off: usize, b: &mut [u8]) -> Result<()> {
        self.0
            .read(off, b)
            .then_some(())
            .ok_or(Error::InvalidParameter)
    }
}

/// Memory registered with a NIC: the safe way to get registered memory
/// from Rust. It keeps its [`Memory`] mapped while it lives; regions may
/// overlap. Offsets of its methods count from the region's first byte.
pub struct Region {
    nic: Arc<NicInner>,
    mem: Memory,
    off: usize,
    len: usize,
    handle: u32,
}

impl Region {
    /// Allocates `len` bytes (rounded up to pages) and registers them.
    pub fn new(
        nic: &Nic,
        len: usize,
        ptag: Ptag,
        rdma_write: bool,
        rdma_read: bool,
    ) -> Result<Region> {
        let mem = Memory::new(len)?;
        let len = mem.len();
        Region::within(nic, &mem, 0, len, ptag, rdma_write, rdma_read)
    }

    /// Registers `len` bytes at `off` of `mem` (any alignment, as
    /// `VipRegisterMem`).
    ///
    /// # Errors
    /// `InvalidParameter` if the range is empty or not inside `mem`; the
    /// errors of `VipRegisterMem`.
    pub fn within(
        nic: &Nic,
        mem: &Memory,
        off: usize,
        len: usize,
        ptag: Ptag,
        rdma_write: bool,
        rdma_read: bool,
    ) -> Result<Region> {
        if len == 0 || off.checked_add(len).is_none_or(|e| e > mem.len()) {
            return Err(Error::InvalidParameter);
        }
        // The region keeps `mem` mapped (it holds a clone) until it is
        // deregistered.
        let range = mem
            .0
            .user_range_of(off, len)
            .ok_or(Error::InvalidParameter)?;
        let handle = nic.inner.register(
            range,
            &MemAttributes {
                ptag,
                enable_rdma_write: rdma_write,
                enable_rdma_read: rdma_read,
            },
        )?;
        Ok(Region {
            nic: nic.inner.clone(),
            mem: mem.clone(),
            off,
            len,
            handle,
        })
    }

    /// Registers memory the caller owns, for transfers straight from and
    /// into application buffers (zero copy). `range` carries the promise,
    /// made where it was built (`UserRange::new` is `unsafe`), that the
    /// memory stays mapped while registered; dropping the region
    /// deregisters it, after which no byte of it is read or written. The
    /// region's [`Region::read`] and [`Region::write`] copy through a window
    /// on the range.
    ///
    /// # Errors
    /// `InvalidParameter` for an empty range; the errors of `VipRegisterMem`.
    pub fn of_user_range(
        nic: &Nic,
        range: crate::mem::arena::UserRange,
        ptag: Ptag,
        rdma_write: bool,
        rdma_read: bool,
    ) -> Result<Region> {
        let len = range.len();
        let (_, window) = range
            .borrow(range.addr() as u64, len as u64)
            .ok_or(Error::InvalidParameter)?;
        let handle = nic.inner.register(
            range,
            &MemAttributes {
                ptag,
                enable_rdma_write: rdma_write,
                enable_rdma_read: rdma_read,
            },
        )?;
        Ok(Region {
            nic: nic.inner.clone(),
            mem: Memory(Arc::new(window)),
            off: 0,
            len,
            handle,
        })
    }

    /// The memory handle (`VIP_MEM_HANDLE`).
    pub fn handle(&self) -> u32 {
        self.handle
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty (never).
    pub fn is_empty(&self) -> bool {
        false
    }

    fn at(&self, off: usize, n: usize) -> Result<usize> {
        match off.checked_add(n) {
            Some(e) if e <= self.len => Ok(self.off + off),
            _ => Err(Error::InvalidParameter),
        }
    }

    /// Virtual address of byte `off`.
    ///
    /// # Errors
    /// `InvalidParameter` if `off` is outside the region.
    pub fn addr(&self, off: usize) -> Result<u64> {
        if off >= self.len {
            return Err(Error::InvalidParameter);
        }
        Ok(self.mem.addr() + (self.off + off) as u64)
    }

    /// Copies bytes in at `off`.
    pub fn write(&self, off: usize, b: &[u8]) -> Result<()> {
        self.mem.write(self.at(off, b.len())?, b)
    }

    /// Copies bytes out from `off`.
    pub fn read(&self, off: usize, b: &mut [u8]) -> Result<()> {
        self.mem.read(self.at(off, b.len())?, b)
    }

    /// Reads the descriptor status at `desc` (what a program spinning on
    /// `CS.Status` sees).
    pub fn status(&self, desc: usize) -> u32 {
        self.at(desc, 32)
            .ok()
            .and_then(|at| self.mem.0.u32_at(at + crate::descriptor::offsets::STATUS))
            .map(|w| w.load(std::sync::atomic::Ordering::Acquire))
            .unwrap_or(0)
    }

    /// Loads the 8-byte word at `off` with Acquire ordering: `None` if it is
    /// outside the region or not 8-byte aligned. Polling the last word of an
    /// RDMA write's target with it is how a program learns that the whole
    /// write has landed, on a kind of NIC whose [`Nic::writes_tail_last`]
    /// holds: the bytes before the word are visible once the word is.
    pub fn load_u64(&self, off: usize) -> Option<u64> {
        let at = self.at(off, 8).ok()?;
        self.mem
            .0
            .u64_at(at)
            .map(|w| w.load(std::sync::atomic::Ordering::Acquire))
    }

    /// Reads a control-segment word of the descriptor at `desc` (`Length` is
    /// at 24, `ImmediateData` at 20).
    pub fn word(&self, off: usize) -> u32 {
        let mut b = [0u8; 4];
        let _ = self.read(off, &mut b);
        u32::from_ne_bytes(b)
    }

    /// Changes the RDMA attributes or tag.
    pub fn set_attributes(&self, ptag: Ptag, rdma_write: bool, rdma_read: bool) -> Result<()> {
        self.nic.set_mem_attributes(
            self.mem.addr() + self.off as u64,
            self.handle,
            &MemAttributes {
                ptag,
                enable_rdma_write: rdma_write,
                enable_rdma_read: rdma_read,
            },
        )
    }

    /// Deregisters now (also done on drop).
    pub fn deregister(mut self) -> Result<()> {
        let h = std::mem::replace(&mut self.handle, 0);
        self.nic.deregister(self.mem.addr() + self.off as u64, h)
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if self.handle != 0 {
            let _ = self
                .nic
                .deregister(self.mem.addr() + self.off as u64, self.handle);
        }
    }
}

/// Builds a descriptor in a [`Region`].
#[derive(Clone, Debug)]
pub struct DescBuilder {
    control: u16,
    imm: u32,
    remote: Option<(u64, u32)>,
    segs: Vec<(u64, u32, u32)>,
    length: Option<u32>,
}

impl DescBuilder {
    /// A send or receive descriptor.
    pub fn send() -> DescBuilder {
        DescBuilder {
            control: control::OP_SENDRECV,
            imm: 0,
            remote: None,
            segs: Vec::new(),
            length: None,
        }
    }

    /// A receive descriptor (same layout as a send).
    pub fn recv() -> DescBuilder {
        Self::send()
    }

    /// An RDMA write to `remote_addr` in the region `remote_handle`.
    pub fn rdma_write(remote_addr: u64, remote_handle: u32) -> DescBuilder {
        DescBuilder {
            control: control::OP_RDMAWRITE,
            remote: Some((remote_addr, remote_handle)),
            ..Self::send()
        }
    }

    /// An RDMA read from `remote_addr` in the region `remote_handle`.
    pub fn rdma_read(remote_addr: u64, remote_handle: u32) -> DescBuilder {
        DescBuilder {
            control: control::OP_RDMAREAD,
            remote: Some((remote_addr, remote_handle)),
            ..Self::send()
        }
    }

    /// Adds immediate data.
    pub fn immediate(mut self, v: u32) -> DescBuilder {
        self.control |= control::IMMEDIATE;
        self.imm = v;
        self
    }

    /// Sets raw control bits (for error-path tests).
    pub fn control(mut self, c: u16) -> DescBuilder {
        self.control = c;
        self
    }

    /// Overrides `CS.Length` (defaults to the sum of the segments).
    pub fn length(mut self, l: u32) -> DescBuilder {
        self.length = Some(l);
        self
    }

    /// Adds `len` bytes at `off` of `mem`.
    pub fn segment(mut self, mem: &Region, off: usize, len: u32) -> DescBuilder {
        self.segs
            .push((mem.mem.addr() + (mem.off + off) as u64, mem.handle, len));
        self
    }

    /// Adds a raw segment (address, handle, length) (for error-path tests).
    pub fn raw_segment(mut self, addr: u64, handle: u32, len: u32) -> DescBuilder {
        self.segs.push((addr, handle, len));
        self
    }

    /// Writes the descriptor at `off` of `mem` (must be 64-byte aligned);
    /// returns `off`.
    pub fn write(&self, mem: &Region, off: usize) -> Result<usize> {
        if mem.addr(off)? % ALIGNMENT as u64 != 0 {
            return Err(Error::InvalidParameter);
        }
        let n = self.segs.len() + self.remote.is_some() as usize;
        let mut b = vec![0u8; 32 + n * SEGMENT_SIZE];
        let total: u64 = self.segs.iter().map(|s| s.2 as u64).sum();
        b[12..14].copy_from_slice(&(n as u16).to_ne_bytes());
        b[14..16].copy_from_slice(&self.control.to_ne_bytes());
        b[20..24].copy_from_slice(&self.imm.to_ne_bytes());
        b[24..28].copy_from_slice(&self.length.unwrap_or(total as u32).to_ne_bytes());
        let mut at = 32;
        if let Some((a, h)) = self.remote {
            b[at..at + 8].copy_from_slice(&a.to_ne_bytes());
            b[at + 8..at + 12].copy_from_slice(&h.to_ne_bytes());
            at += 16;
        }
        for (a, h, l) in &self.segs {
            b[at..at + 8].copy_from_slice(&a.to_ne_bytes());
            b[at + 8..at + 12].copy_from_slice(&h.to_ne_bytes());
            b[at + 12..at + 16].copy_from_slice(&l.to_ne_bytes());
            at += 16;
        }
        mem.write(off, &b)?;
        Ok(off)
    }
}

impl ViAttributes {
    /// Attributes with `MaxTransferSize` 64 KiB and RDMA disabled.
    pub fn new(reliability: Reliability, ptag: Ptag) -> ViAttributes {
        ViAttributes {
            reliability,
            max_transfer_size: 65536,
            qos: 0,
            ptag,
            enable_rdma_write: false,
            enable_rdma_read: false,
        }
    }
}
