//! The NIC: one open instance of a kind of NIC and everything it owns.
//!
//! `VipOpenNic` picks the kind by name (`backend::KINDS`), opens its device
//! (the operations table) and creates a [`NicInner`]: the tables of
//! protection tags, registered regions, VIs, CQs and pending connection
//! requests, and the provider thread (Notify handlers, error callback).
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use crate::attrs::{MemAttributes, NicAttributes, Ptag};
use crate::backend::{self, DeviceRef, Limits, RegionSpec};
use crate::cq::CqCore;
use crate::error::{Error, Result};
use crate::handle::Slab;
use crate::mem::arena::{Extent, UserRange};
use crate::mem::region::{Resolved, ResolvedExtent};
use crate::notify::Provider;
use crate::parked::Key;
use crate::process::Process;
use crate::proto::Endpoint;
use crate::regions::{RegionTable, TableWriter};
use crate::shm::mapping::Mapping;
use crate::vi::ViCore;

/// RDMA enable bits of a region or VI, as devices store them.
pub mod flags {
    /// RDMA write allowed.
    pub const RDMA_WRITE: u32 = 1;
    /// RDMA read allowed.
    pub const RDMA_READ: u32 = 2;
}

/// Largest CQ.
pub const MAX_CQ_ENTRIES: u32 = 1 << 16;
/// Protection tags per NIC.
pub const MAX_PTAGS: u32 = 65535;
/// Longest discriminator.
pub const MAX_DISCRIMINATOR: u16 = crate::proto::MAX_DISCRIMINATOR as u16;
/// Provider version reported by `VipQueryNic` (major << 16 | minor << 8 | patch).
pub const PROVIDER_VERSION: u64 = 0x0000_0100;

/// Resource an asynchronous error is about (`VIP_RESOURCE_CODE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResourceCode {
    /// The NIC.
    Nic = 0,
    /// A VI.
    Vi = 1,
    /// A CQ.
    Cq = 2,
    /// A descriptor.
    Descriptor = 3,
}

/// What went wrong (`VIP_ERROR_CODE`, in VIPL order).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorCode {
    /// A posted descriptor was malformed.
    PostDesc = 0,
    /// The connection was lost (peer gone, disconnected, or broken by an error).
    ConnLost = 1,
    /// A message arrived with no receive posted on a reliable VI.
    RecvqEmpty = 2,
    /// A work queue overflowed.
    ViOverrun = 3,
    /// An incoming RDMA write violated protection.
    RdmawProt = 4,
    /// RDMA write data error.
    RdmawData = 5,
    /// RDMA write aborted.
    RdmawAbort = 6,
    /// An incoming RDMA read violated protection.
    RdmarProt = 7,
    /// A completion could not be written.
    CompProt = 8,
    /// RDMA transport error.
    RdmaTransport = 9,
    /// Unrecoverable (e.g. CQ overrun).
    Catastrophic = 10,
}

// A disconnect's reason on viad's wire is an `ErrorCode` value.
const _: () = assert!(ErrorCode::ConnLost as u8 == crate::proto::REASON_CONN_LOST);

impl ErrorCode {
    fn from_u8(v: u8) -> Option<ErrorCode> {
        use ErrorCode::*;
        Some(match v {
            0 => PostDesc,
            1 => ConnLost,
            2 => RecvqEmpty,
            3 => ViOverrun,
            4 => RdmawProt,
            5 => RdmawData,
            6 => RdmawAbort,
            7 => RdmarProt,
            8 => CompProt,
            9 => RdmaTransport,
            10 => Catastrophic,
            _ => return None,
        })
    }
}

/// An asynchronous error, as given to the error callback.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AsyncError {
    /// What it is about.
    pub resource: ResourceCode,
    /// What happened.
    pub code: ErrorCode,
    /// The VI (slot, generation), if any.
    pub vi: Option<(u32, u16)>,
    /// The CQ (slot, generation), if any.
    pub cq: Option<(u32, u16)>,
    /// Address of the descriptor involved, or 0.
    pub descriptor: u64,
}

impl AsyncError {
    /// Packs the error for the shared error ring (descriptor addresses do not
    /// cross processes).
    pub(crate) fn encode(&self) -> u64 {
        let (idx, generation) = self.vi.or(self.cq).unwrap_or((0, 0));
        (self.code as u64)
            | ((self.resource as u64) << 8)
            | ((idx as u64 & 0xffff) << 16)
            | ((generation as u64) << 32)
    }

    pub(crate) fn decode(v: u64) -> Option<AsyncError> {
        let code = ErrorCode::from_u8(v as u8)?;
        let resource = match (v >> 8) as u8 {
            0 => ResourceCode::Nic,
            1 => ResourceCode::Vi,
            2 => ResourceCode::Cq,
            3 => ResourceCode::Descriptor,
            _ => return None,
        };
        let idx = ((v >> 16) & 0xffff) as u32;
        let generation = (v >> 32) as u16;
        Some(AsyncError {
            resource,
            code,
            vi: matches!(resource, ResourceCode::Vi | ResourceCode::Descriptor)
                .then_some((idx, generation)),
            cq: matches!(resource, ResourceCode::Cq).then_some((idx, generation)),
            descriptor: 0,
        })
    }
}

/// The error callback.
pub type ErrorHandler = Arc<dyn Fn(&AsyncError) + Send + Sync>;

/// A connection request returned by `VipConnectWait`, waiting for accept or reject.
pub(crate) struct Incoming {
    pub conn: u64,
    pub peer: Endpoint,
}

/// What the registration path pinned for a registration (a lease on the
/// process's registration cache).
pub(crate) type Pinned = regcache::Lease<Vec<Extent>>;

/// A registration of this NIC, by handle.
pub(crate) struct RegionRec {
    /// What the registration path pinned.
    pinned: Pinned,
    /// Protection tag id.
    ptag: u32,
    /// RDMA enable flags.
    flags: u32,
    /// The registered bytes.
    va: u64,
    len: u64,
    /// Arena pages it holds (kept out of a child after `fork`).
    held: Vec<std::ops::Range<usize>>,
}

/// What a deregistered registration kept whole (`parked`, in place in the
/// table with its record and region) keeps of its device entry.
pub(crate) struct ParkedReg {
    /// The device entry it kept, if the kind of NIC keeps one.
    entry: Option<crate::backend::RetiredEntry>,
}

/// One open NIC.
pub(crate) struct NicInner {
    pub process: Arc<Process>,
    pub slot: u32,
    pub generation: u16,
    pub id: u32,
    pub name: String,
    /// What the device supports.
    pub limits: Limits,
    /// Registered regions as this process reaches them, with what undoes
    /// each registration (boxed: the table moves its entries when it
    /// grows or shifts), and deregistered ones kept whole in place for the
    /// same bytes again (parked): all under one lock.
    pub regions: RegionTable,
    pub ptags: Mutex<Slab<u32>>,
    /// Whether deregistered registrations are parked.
    parking: bool,
    pub vis: RwLock<Slab<Arc<ViCore>>>,
    pub cqs: RwLock<Slab<Arc<CqCore>>>,
    pub conns: Mutex<Slab<Incoming>>,
    pub dev: DeviceRef,
    /// `dev.polls()`, a property of the kind, read once: a poll that finds
    /// nothing asks it, and a load costs less than the call.
    pub dev_polls: bool,
    pub provider: Provider,
    pub error_cb: Mutex<Option<ErrorHandler>>,
    pub closed: AtomicBool,
    pub ns_open: AtomicBool,
    /// The host address `VipQueryNic` reports (the device's, e.g. a sockets
    /// NIC's interface address, or the process's host), for the NIC's life.
    pub host: Vec<u8>,
}

impl crate::mem::fork::HoldsPages for NicInner {
    fn held_pages(&self, out: &mut Vec<std::ops::Range<usize>>) {
        for r in self.regions.read().records() {
            out.extend(r.held.iter().cloned());
        }
    }
}

/// The arena pages of a registration of `len` bytes at `addr`: the whole
/// pages of its arena extents (what `MADV_DONTFORK` covers while it lives).
fn held_ranges(extents: &[Extent], addr: usize, len: usize) -> Vec<std::ops::Range<usize>> {
    let page = regcache::page_size();
    let (lo, hi) = (addr.div_ceil(page) * page, (addr + len) / page * page);
    extents
        .iter()
        .filter(|e| e.arena != crate::mem::arena::CMA)
        .map(|e| (e.va as usize).max(lo)..((e.va + e.len) as usize).min(hi))
        .filter(|r| r.start < r.end)
        .collect()
}

fn total_memory() -> u64 {
    let page = regcache::page_size() as u64;
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map(|kb| kb * 1024)
        .unwrap_or(page * 1024 * 1024)
}

impl NicInner {
    /// Opens the device `name` (see `backend::KINDS`).
    pub fn open(name: Option<&str>) -> Result<Arc<NicInner>> {
        let (kind, name) = backend::lookup(name)?;
        let process = Process::get()?;
        log::debug!("{name}: a NIC of the {} kind", kind.name);
        Self::open_with(&process, &name, kind.open)
    }

    /// Opens a NIC of `process` on the device `make` opens.
    pub(crate) fn open_with(
        process: &Arc<Process>,
        name: &str,
        make: backend::OpenFn,
    ) -> Result<Arc<NicInner>> {
        crate::shm::probe();
        let id = {
            let mut n = process.next_nic_id.lock().unwrap();
            *n += 1;
            *n - 1
        };
        let dev = make(process, id, name)?;
        let limits = dev.limits();
        let dev_polls = dev.polls();
        let host = dev.local_address().unwrap_or_else(|| process.host.clone());
        let nic = process
            .nics
            .write()
            .unwrap()
            .insert_with(|slot, generation| {
                // Parked registrations need memory events, known before an
                // unmapped address is free (the unmap hooks), and the cache.
                let parking = process.config.parked
                    && process.monitor.as_ref().is_some_and(|m| m.hooked())
                    && process.config.regcache.capacity_bytes > 0
                    && process.config.regcache.capacity_regions > 0;
                Arc::new(NicInner {
                    process: process.clone(),
                    slot,
                    generation,
                    id,
                    name: name.to_string(),
                    limits,
                    regions: RegionTable::new(if parking { crate::parked::CAPACITY } else { 0 }),
                    ptags: Mutex::new(Slab::new(MAX_PTAGS + 1, 1)),
                    parking,
                    vis: RwLock::new(Slab::new(limits.max_vi, 0)),
                    cqs: RwLock::new(Slab::new(limits.max_cq, 0)),
                    conns: Mutex::new(Slab::new(1024, 1)),
                    dev: DeviceRef::new(dev.clone()),
                    dev_polls,
                    provider: Provider::new(),
                    error_cb: Mutex::new(None),
                    closed: AtomicBool::new(false),
                    ns_open: AtomicBool::new(false),
                    host: host.clone(),
                })
            })
            .cloned()
            .ok_or(Error::Resource)?;
        crate::mem::fork::add_holder(
            Arc::downgrade(&nic) as std::sync::Weak<dyn crate::mem::fork::HoldsPages>
        );
        nic.dev.start(&nic);
        nic.provider.start(&nic);
        log::debug!(
            "opened {} ({} device) as NIC {id} of session {}",
            nic.name,
            nic.dev.kind(),
            process.session()
        );
        Ok(nic)
    }

    /// The host part of this NIC's addresses.
    pub fn host_address(&self) -> Vec<u8> {
        self.host.clone()
    }

    /// `VipQueryNic`.
    pub fn attributes(&self) -> NicAttributes {
        // The real limits: memory, the daemon's pinning quota (system
        // mode: per process and per user), and the objects it stores for
        // the session (one per arena, besides NIC segments and CQ rings).
        let l = &self.limits;
        let mut mem = total_memory();
        let mut regions = l.max_regions as u64;
        if let Some(d) = self.process.daemon() {
            let lim = d.limits;
            mem = mem.min(lim.pin_process).min(lim.pin_user);
            regions = regions.min(lim.max_objects.saturating_sub(1));
        }
        NicAttributes {
            name: self.name.clone(),
            hardware_version: 1,
            provider_version: PROVIDER_VERSION,
            local_address: self.host_address(),
            thread_safe: true,
            max_discriminator_len: MAX_DISCRIMINATOR,
            max_register_bytes: mem,
            max_register_regions: regions,
            max_register_block_bytes: mem,
            max_vi: l.max_vi as u64,
            max_descriptors_per_queue: l.queue_depth as u64,
            max_segments_per_desc: l.max_segments as u64,
            max_cq: l.max_cq as u64,
            max_cq_entries: MAX_CQ_ENTRIES as u64,
            max_transfer_size: l.max_transfer as u64,
            native_mtu: l.max_transfer as u64,
            max_ptags: MAX_PTAGS as u64,
            reliability_level_support: l.reliability,
            rdma_read_support: l.rdma_read,
        }
    }

    // ---- protection tags ----

    /// `VipCreatePtag`.
    pub fn create_ptag(&self) -> Result<Ptag> {
        let (i, g) = self
            .ptags
            .lock()
            .unwrap()
            .insert(0)
            .ok_or(Error::Resource)?;
        Ok(Ptag(((g as u32) << 16) | i))
    }

    /// Whether `p` is a live tag of this NIC.
    pub fn ptag_valid(&self, p: Ptag) -> bool {
        self.ptags
            .lock()
            .unwrap()
            .get(p.0 & 0xffff, (p.0 >> 16) as u16)
            .is_some()
    }

    /// Adds (`d = 1`) or drops (`d = -1`) a user of a tag.
    pub fn ptag_ref(&self, p: Ptag, d: i32) -> Result<()> {
        let mut t = self.ptags.lock().unwrap();
        let (i, g) = (p.0 & 0xffff, (p.0 >> 16) as u16);
        if t.get(i, g).is_none() {
            return Err(Error::InvalidPtag);
        }
        let v = t.get_mut(i, g).unwrap();
        *v = (*v as i64 + d as i64).max(0) as u32;
        Ok(())
    }

    /// `VipDestroyPtag`: refused while a VI or region uses the tag.
    pub fn destroy_ptag(&self, p: Ptag) -> Result<()> {
        // Parked registrations count as the tag's users; they go first.
        let parked = self
            .regions
            .write()
            .take_parked(|parked| parked.take_if(|k| k.ptag == p.0));
        for parked in parked {
            self.unpark_for_good(parked);
        }
        let mut t = self.ptags.lock().unwrap();
        let (i, g) = (p.0 & 0xffff, (p.0 >> 16) as u16);
        match t.get(i, g) {
            None => Err(Error::InvalidParameter),
            Some(&n) if n > 0 => Err(Error::InvalidState),
            Some(_) => {
                t.remove(i, g);
                Ok(())
            }
        }
    }

    // ---- memory ----

    fn mem_flags(a: &MemAttributes) -> u32 {
        (if a.enable_rdma_write {
            flags::RDMA_WRITE
        } else {
            0
        }) | (if a.enable_rdma_read {
            flags::RDMA_READ
        } else {
            0
        })
    }

    /// Pins `range` through the process's registration cache (the one
    /// registration path of every kind of NIC). Memory events read so far
    /// are applied first, so a hit never returns the translation of memory
    /// the application has since unmapped.
    fn pin(&self, range: &UserRange) -> std::io::Result<Pinned> {
        let settled = match &self.process.monitor {
            Some(m) => m.sync(),
            None => false,
        };
        let cache = &self.process.registrations;
        // Unsettled (an unmap stayed in flight): this hit is checked against
        // the mappings. Without a monitor the cache checks every hit anyway.
        if settled {
            cache.acquire(range.addr(), range.len())
        } else {
            cache.acquire_checked(range.addr(), range.len())
        }
        .map_err(|e| match e {
            regcache::Error::Pin(e) => e,
            other => std::io::Error::new(std::io::ErrorKind::InvalidInput, other.to_string()),
        })
    }

    /// `VipRegisterMem`.
    pub fn register(&self, range: UserRange, attrs: &MemAttributes) -> Result<u32> {
        let key = Key {
            va: range.addr() as u64,
            len: range.len() as u64,
            ptag: attrs.ptag.0,
            flags: Self::mem_flags(attrs),
        };
        if self.parking {
            // Memory events read so far first: a parked registration over
            // memory that went away is dropped before it could be found.
            // (`parking` implies a monitor with its unmap hooks.) Unsettled:
            // no parked registration is taken, the cache checks its hit.
            if self.process.monitor.as_ref().is_some_and(|m| m.sync()) {
                // A parked registration still counts as its tag's user, so
                // the tag is alive (`destroy_ptag` drops parked ones first).
                let mut w = self.regions.write();
                if let Some(h) = w.parked().take(&key) {
                    return self.unpark(w, key, h);
                }
            }
        }
        // Validates the tag, and counts the registration as its user.
        self.ptag_ref(attrs.ptag, 1)?;
        let r = self.register_anew(range, key);
        if r.is_err() {
            let _ = self.ptag_ref(attrs.ptag, -1);
        }
        r
    }

    /// A parked registration of the same bytes back in use: its device
    /// entry live again (the soft NIC kept it: the same handle comes back),
    /// or a new one under a fresh handle, over the pages and mappings it
    /// kept.
    ///
    /// Called with the table's lock (`w`): taken from the parked and made
    /// live in one critical section when the device kept its entry (a few
    /// stores); a device that adds the region anew (a system call, for a
    /// verbs memory region) does it with the lock released.
    fn unpark<'a>(&'a self, mut w: TableWriter<'a>, key: Key, handle: u32) -> Result<u32> {
        let ParkedReg { entry } = w.unpark(handle).expect("a parked handle is in the table");
        let added = match entry {
            // In place: the same handle back, nothing else written.
            Some(entry) => match self.dev.revive_region(self, entry) {
                Ok(h) if h == handle => return Ok(handle),
                r => r,
            },
            None => {
                // The device kept nothing: the region is added anew, with
                // the lock released (the registration out of the table
                // meanwhile).
                let live = w.remove(handle).expect("just unparked");
                drop(w);
                let added = self.dev.reserve_region().and_then(|slot| {
                    self.dev.add_region(
                        self,
                        slot,
                        &RegionSpec {
                            va: key.va,
                            len: key.len,
                            ptag: key.ptag,
                            flags: key.flags,
                            extents: live.rec.pinned.pinned(),
                        },
                    )
                });
                return self.relive(self.regions.write(), live, added);
            }
        };
        let live = w.remove(handle).expect("just unparked");
        self.relive(w, live, added)
    }

    /// A parked registration taken out of the table, live again under the
    /// handle `added` gave it (a failed revival has released the device
    /// entry already; the pages go back to the cache).
    fn relive(
        &self,
        mut w: TableWriter<'_>,
        live: crate::regions::Live<Box<RegionRec>, ParkedReg>,
        added: Result<u32>,
    ) -> Result<u32> {
        let handle = match added {
            Ok(h) => h,
            Err(e) => {
                drop(w);
                self.release(*live.rec);
                return Err(e);
            }
        };
        let mut resolved = live.region.expect("parked ones translate");
        Arc::make_mut(&mut resolved).handle = handle;
        // No fork lock: nothing moves (the pages stayed where the first
        // registration put them), so a fork that does not see this
        // registration yet copies them into the child as deregistered
        // memory, which they were until now.
        w.insert(handle, resolved, live.rec);
        Ok(handle)
    }

    /// A registration through the registration cache (its pages pinned,
    /// or found pinned there).
    fn register_anew(&self, range: UserRange, key: Key) -> Result<u32> {
        // The device's slot first: its bookkeeping overlaps the pinning.
        let slot = self.dev.reserve_region()?;
        let pinned = match self.pin(&range) {
            // Beyond the system daemon's pinning quota: cached registrations
            // that nothing uses hold quota too; drop them and try once more.
            Err(e)
                if crate::agent::is_quota(&e)
                    && self.drop_parked() + self.process.registrations.flush() > 0 =>
            {
                log::debug!("{e}: registration cache flushed, trying again");
                self.pin(&range)
            }
            r => r,
        };
        let pinned = match pinned {
            Ok(p) => p,
            Err(e) => {
                self.dev.unreserve_region(slot);
                if crate::agent::is_quota(&e) {
                    log::error!(
                        "registration of {} bytes at {:#x} refused: {e}",
                        range.len(),
                        range.addr()
                    );
                    return Err(Error::failed("pinning (viad's quota)", e));
                }
                log::debug!(
                    "registration of {:#x}+{} refused: {e}",
                    range.addr(),
                    range.len()
                );
                let kind = if e.kind() == std::io::ErrorKind::InvalidInput {
                    crate::error::ErrorKind::InvalidParameter
                } else {
                    crate::error::ErrorKind::Resource
                };
                return Err(Error::caused_by(kind, e));
            }
        };
        let extents = pinned.pinned();
        // This process reaches arena extents through the arena's shadow, and
        // the others (cross-memory-attach extents) in place.
        let local: Vec<ResolvedExtent> = extents
            .iter()
            .filter_map(|e| {
                if e.arena != crate::mem::arena::CMA {
                    return Some(ResolvedExtent {
                        va: e.va,
                        len: e.len,
                        map: self.process.arenas.shadow(e.arena),
                        map_off: e.arena_off,
                    });
                }
                let (va, window) = range.borrow(e.va, e.len)?;
                Some(ResolvedExtent {
                    va,
                    len: window.len() as u64,
                    map: Some(Arc::new(window)),
                    map_off: 0,
                })
            })
            .collect();
        // The arena pages of this registration stay out of a child after fork.
        let held = held_ranges(extents, range.addr(), range.len());
        let Key {
            va,
            len,
            ptag,
            flags,
        } = key;
        let handle = match self.dev.add_region(
            self,
            slot,
            &RegionSpec {
                va,
                len,
                ptag,
                flags,
                extents,
            },
        ) {
            Ok(h) => h,
            Err(e) => {
                self.process.registrations.release(pinned);
                return Err(e);
            }
        };
        let resolved = Arc::new(Resolved {
            handle,
            va,
            len,
            ptag,
            flags,
            pid: self.process.pid,
            extents: local.into(),
            live: Default::default(),
        });
        let rec = Box::new(RegionRec {
            pinned,
            ptag,
            flags,
            va,
            len,
            held,
        });
        // Under the fork lock: a fork sees the registration and its pages whole.
        let _fork = crate::mem::fork::enter();
        self.regions.write().insert(handle, resolved, rec);
        Ok(handle)
    }

    /// `VipDeregisterMem`. `addr` must be the address the region was
    /// registered with. When it returns, no engine of this process or of a
    /// peer reads or writes the region any more
    /// (`Device::quiesce_region_users`).
    pub fn deregister(&self, addr: u64, handle: u32) -> Result<()> {
        // One critical section: the handle dies for this process and the
        // device, and a parked registration is parked at once. Parking
        // before the peers are quiesced is sound: the dead handle is what
        // they must stop using, and a registration that takes the parked
        // one back meanwhile makes the bytes registered again anyway.
        let (rec, evicted, windows) = {
            let _fork = crate::mem::fork::enter();
            let mut w = self.regions.write();
            let (translates, key, windows) = match w.get(handle) {
                Some(l) if l.rec.va == addr => (
                    l.region.is_some(),
                    Key {
                        va: l.rec.va,
                        len: l.rec.len,
                        ptag: l.rec.ptag,
                        flags: l.rec.flags,
                    },
                    l.region
                        .as_ref()
                        .map(|r| r.borrowed_windows())
                        .unwrap_or_default(),
                ),
                _ => return Err(Error::InvalidParameter),
            };
            if translates && self.parking {
                // Parked in place: it keeps its device entry (the handle
                // dies either way), its record and region, and stays its
                // tag's user.
                let entry = self.dev.retire_region(self, handle);
                w.park(handle, ParkedReg { entry });
                let evicted = w.parked().put(key, handle).and_then(|old| w.remove(old));
                (None, evicted, windows)
            } else {
                let live = w.remove(handle).expect("present");
                // Revoked (the memory went away): nothing is reachable.
                if translates {
                    self.dev.remove_region(self, handle);
                }
                (Some(live.rec), None, windows)
            }
        };
        self.dev.quiesce_region_users(self);
        // The application may unmap the memory once this returns.
        self.detach_posted(&windows);
        if let Some(rec) = rec {
            self.release(*rec);
        }
        if let Some(old) = evicted {
            self.unpark_for_good(old);
        }
        Ok(())
    }

    fn release(&self, rec: RegionRec) {
        let _ = self.ptag_ref(Ptag(rec.ptag), -1);
        self.process.registrations.release(rec.pinned);
    }

    /// Gives a parked registration, taken out of the table, back: its
    /// device entry, its pages to the registration cache, and its tag.
    fn unpark_for_good(&self, p: crate::regions::Live<Box<RegionRec>, ParkedReg>) {
        if let Some(ParkedReg { entry: Some(entry) }) = p.parked {
            self.dev.release_retired(entry);
        }
        self.release(*p.rec);
    }

    /// Whether deregistered registrations of this NIC are parked.
    #[cfg(test)]
    pub fn parks(&self) -> bool {
        self.parking
    }

    /// Registrations served by a parked registration of this NIC.
    pub fn parked_hits(&self) -> u64 {
        self.regions.read().parked.hits()
    }

    /// Drops every parked registration; returns how many.
    pub fn drop_parked(&self) -> usize {
        let all = self.regions.write().take_parked(|p| p.drain());
        let n = all.len();
        for p in all {
            self.unpark_for_good(p);
        }
        n
    }

    /// The application unmapped, moved or discarded `range` (memory
    /// events): registrations over it lose their translation at once (peers
    /// then get `RDMA_PROT_ERROR`, local posts `PROTECTION_ERROR`); the
    /// handles stay until `VipDeregisterMem`.
    ///
    /// With `mapping_gone` (an unmap or a move) a registration whose arena
    /// pages are all still mapped where it registered them keeps its
    /// translation: it was made after the event's unmap, over new memory
    /// mapped at the address since (the event came late: its thread was
    /// held past the registration path's wait). Its old memory's
    /// registrations no longer find their arenas there. Extents that are not
    /// arena pages cannot be told apart by their mapping, so those go.
    pub fn revoke_overlapping(&self, range: &std::ops::Range<usize>, mapping_gone: bool) {
        let overlaps = |r: &RegionRec| {
            let (a, b) = (r.va as usize, (r.va + r.len.max(1)) as usize);
            a < range.end && range.start < b
        };
        // Registrations made since, found outside the lock (the check reads
        // the mappings).
        let mut kept: Vec<(u32, Vec<Extent>)> = Vec::new();
        if mapping_gone {
            let w = self.regions.write();
            for h in w.handles_where(|r| overlaps(r)) {
                let extents = w
                    .get(h)
                    .filter(|l| l.region.is_some())
                    .map(|l| l.rec.pinned.pinned());
                if let Some(x) =
                    extents.filter(|x| x.iter().all(|e| e.arena != crate::mem::arena::CMA))
                {
                    kept.push((h, x.clone()));
                }
            }
            drop(w);
            kept.retain(|(_, x)| self.process.arenas.is_current(x));
        }
        let mut revoked = 0;
        let mut windows = Vec::new();
        let parked = {
            let mut w = self.regions.write();
            for h in w.handles_where(|r| overlaps(r)) {
                if kept.iter().any(|(k, _)| *k == h) {
                    log::debug!(
                        "{}: region {h:#x} over {range:#x?} is new memory mapped since: kept",
                        self.name
                    );
                    continue;
                }
                if let Some(r) = w.get(h).and_then(|l| l.region.as_ref()) {
                    windows.extend(r.borrowed_windows());
                }
                if w.revoke(h) {
                    self.dev.remove_region(self, h);
                    revoked += 1;
                }
            }
            w.take_parked(|p| p.take_overlapping(range))
        };
        for p in parked {
            self.unpark_for_good(p);
        }
        if revoked > 0 {
            log::debug!(
                "{}: {revoked} registrations over {range:#x?} revoked (memory went away)",
                self.name
            );
            self.dev.quiesce_region_users(self);
        }
        self.detach_posted(&windows);
    }

    /// Moves the status locations of posted descriptors that lie in
    /// `windows` (borrowed windows of registrations going away: memory
    /// the application may unmap next) into library-owned copies, so that
    /// dequeuing or flushing them never touches that memory again. A
    /// descriptor deregistered while posted is an error of the program;
    /// it completes in the copy (`VipRecvDone` returns it) instead of
    /// crashing the library.
    fn detach_posted(&self, windows: &[Arc<Mapping>]) {
        if windows.is_empty() {
            return;
        }
        let pid = self.process.pid;
        for vi in self.all_vis() {
            let n = vi.detach_posted(windows, pid);
            if n > 0 {
                log::warn!(
                    "{}: VI {}: {n} posted descriptors lost their registration (deregistered \
                     or unmapped while posted); their completions go to a copy",
                    self.name,
                    vi.slot
                );
            }
        }
    }

    /// `VipQueryMem`.
    pub fn query_mem(&self, addr: u64, handle: u32) -> Result<MemAttributes> {
        let r = self.regions.get(handle).ok_or(Error::InvalidParameter)?;
        if r.va != addr {
            return Err(Error::InvalidParameter);
        }
        Ok(MemAttributes {
            ptag: Ptag(r.ptag),
            enable_rdma_write: r.flags & flags::RDMA_WRITE != 0,
            enable_rdma_read: r.flags & flags::RDMA_READ != 0,
        })
    }

    /// `VipSetMemAttributes`.
    pub fn set_mem_attributes(&self, addr: u64, handle: u32, attrs: &MemAttributes) -> Result<()> {
        let r = self.regions.get(handle).ok_or(Error::InvalidParameter)?;
        if r.va != addr {
            return Err(Error::InvalidParameter);
        }
        if !self.ptag_valid(attrs.ptag) {
            return Err(Error::InvalidPtag);
        }
        let old = Ptag(r.ptag);
        let fl = Self::mem_flags(attrs);
        self.dev.set_region_attributes(handle, attrs.ptag.0, fl)?;
        {
            let mut w = self.regions.write();
            w.set_attributes(handle, attrs.ptag.0, fl);
            if let Some(r) = w.rec_mut(handle) {
                r.ptag = attrs.ptag.0;
                r.flags = fl;
            }
        }
        if old != attrs.ptag {
            self.ptag_ref(attrs.ptag, 1)?;
            let _ = self.ptag_ref(old, -1);
        }
        Ok(())
    }

    // ---- lookups ----

    /// The VI in `slot` with generation `generation`.
    pub fn vi(&self, slot: u32, generation: u16) -> Option<Arc<ViCore>> {
        self.vis.read().unwrap().get(slot, generation).cloned()
    }

    /// The CQ in `slot` with generation `generation`.
    pub fn cq(&self, slot: u32, generation: u16) -> Option<Arc<CqCore>> {
        self.cqs.read().unwrap().get(slot, generation).cloned()
    }

    /// Every live VI.
    pub fn all_vis(&self) -> Vec<Arc<ViCore>> {
        self.vis
            .read()
            .unwrap()
            .iter()
            .map(|(_, _, v)| v.clone())
            .collect()
    }

    // ---- errors ----

    /// Delivers an asynchronous error to the error callback (on the
    /// provider thread).
    pub fn report(&self, e: AsyncError) {
        self.provider.post_error(self, e, false);
    }

    /// [`NicInner::report`]; `orderly`: an expected event (the peer
    /// disconnected), not an error to log when no callback is set.
    pub fn report_as(&self, e: AsyncError, orderly: bool) {
        self.provider.post_error(self, e, orderly);
    }

    /// Runs the error callback for `e` (provider thread only). Without a
    /// callback the error is logged: at error level, except the
    /// `CONN_LOST` of an orderly disconnect by the peer (info).
    pub fn run_error_callback(&self, e: &AsyncError, orderly: bool) {
        let cb = self.error_cb.lock().unwrap().clone();
        match cb {
            Some(cb) => cb(e),
            None if orderly => log::info!(
                "{}: the peer disconnected ({:?} on {:?})",
                self.name,
                e.code,
                e.resource
            ),
            None => log::error!(
                "{}: asynchronous error {:?} on {:?}",
                self.name,
                e.code,
                e.resource
            ),
        }
    }

    // ---- events ----

    /// viad says `session` died: every VI connected to it breaks.
    pub fn peer_died(&self, session: u64) {
        for vi in self.all_vis() {
            if vi.peer_session() == Some(session) {
                vi.break_connection(self, ErrorCode::ConnLost, false, true);
            }
        }
        self.dev.peer_gone(self, session);
    }

    /// The viad session is gone: nothing reports a peer's death any more,
    /// so every connected VI breaks (`CONN_LOST`) now.
    pub fn daemon_lost(&self) {
        for vi in self.all_vis() {
            if vi.peer_session().is_some() {
                vi.break_connection(self, ErrorCode::ConnLost, false, false);
            }
        }
    }

    /// viad says the peer of our VI `me` disconnected.
    pub fn remote_disconnect(&self, me: &Endpoint, reason: u8) {
        let Some(vi) = self.vi(me.vi, me.vi_gen as u16) else {
            return;
        };
        // The errors a peer reports for us (it saw them, we did not: a
        // verbs device tells only the initiator); anything else is a
        // plain disconnect.
        match ErrorCode::from_u8(reason) {
            Some(code @ (ErrorCode::RdmawProt | ErrorCode::RdmarProt | ErrorCode::RecvqEmpty)) => {
                vi.peer_reported(self, code)
            }
            _ => vi.peer_disconnected(self),
        }
    }

    /// Acts on the asynchronous errors peers reported (provider thread).
    pub fn drain_async_errors(&self) {
        let mut errors = Vec::new();
        self.dev.take_async_errors(&mut errors);
        for e in errors {
            if let Some((slot, generation)) = e.vi {
                if let Some(vi) = self.vi(slot, generation) {
                    let reliable = vi.reliability().is_reliable();
                    if reliable || matches!(e.code, ErrorCode::ConnLost) {
                        vi.break_connection(self, e.code, false, false);
                        continue;
                    }
                }
            }
            self.run_error_callback(&e, false);
        }
    }

    /// `VipCloseNic`: tears everything down.
    pub fn close(self: &Arc<Self>) -> Result<()> {
        if self.closed.swap(true, Ordering::AcqRel) {
            return Err(Error::InvalidParameter);
        }
        for vi in self.all_vis() {
            let _ = vi.disconnect(self);
        }
        self.provider.stop(self);
        self.dev.close(self);
        let regions = self.regions.write().drain();
        for (h, live) in regions {
            if live.parked.is_some() {
                self.unpark_for_good(live);
                continue;
            }
            if live.region.is_some() {
                self.dev.remove_region(self, h);
            }
            self.release(*live.rec);
        }
        for (_, _, cq) in self.cqs.read().unwrap().iter() {
            cq.retire(self);
        }
        self.vis.write().unwrap().clear();
        self.cqs.write().unwrap().clear();
        self.process
            .nics
            .write()
            .unwrap()
            .remove(self.slot, self.generation);
        Ok(())
    }
}
