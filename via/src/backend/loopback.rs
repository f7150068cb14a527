//! An in-process kind of NIC for unit tests: VIs of one NIC connected to
//! each other, requests run synchronously by the posting thread.
//!
//! It exists so that the device-neutral object model (the VI state machine,
//! descriptor translation, error reporting, the one writer of completions)
//! is tested without processes or viad, and as the smallest complete
//! implementation of [`Device`]: every operation a kind must provide, with
//! none of the soft NIC's shared-memory machinery. Reliability semantics
//! are the soft NIC's (the table in the README), so the tests below hold
//! the object model to them.
#![forbid(unsafe_code)]

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex};

use doorbell::EventCount;

use crate::attrs::{Reliability, ViAttributes};
use crate::backend::{CqSignals, Device, Kick, Limits, RegionSlot, RegionSpec, ViSignals};
use crate::completion;
use crate::descriptor::{control, status};
use crate::error::{Error, Result};
use crate::mem::region::Resolved;
use crate::nic::{AsyncError, ErrorCode, NicInner, ResourceCode, flags};
use crate::process::Process;
use crate::proto::Endpoint;
use crate::shm::mapping::Mapping;
use crate::shm::rings::MappedRing;
use crate::translate::{RecvWr, SendWr, WrRegions};
use crate::vi::{ViCore, Which};

const MAX_VI: u32 = 64;
const MAX_CQ: u32 = 64;

#[derive(Default)]
struct ViWords {
    send_wake: EventCount,
    recv_wake: EventCount,
    interest: AtomicU32,
}

#[derive(Default)]
struct CqWords {
    wake: EventCount,
    interest: AtomicU32,
}

/// Connections and offered receives, by VI slot.
#[derive(Default)]
struct Wires {
    peer: HashMap<u32, (u32, u16)>,
    recvs: HashMap<u32, VecDeque<(u64, RecvWr)>>,
}

/// A connection break found while running, settled in `kick` (breaking
/// takes the VI's locks, which the poster holds while posting).
struct Break {
    vi: (u32, u16),
    code: ErrorCode,
    tell_peer: bool,
}

/// The loopback device of one NIC.
pub(crate) struct Loopback {
    provider: EventCount,
    vis: Box<[ViWords]>,
    cqs: Box<[CqWords]>,
    next_handle: Mutex<u32>,
    wires: Mutex<Wires>,
    errors: Mutex<Vec<AsyncError>>,
    breaks: Mutex<Vec<Break>>,
}

/// Opens a loopback device (the `open` of its row, were it in the table).
pub(crate) fn open(_process: &Arc<Process>, _id: u32, _name: &str) -> Result<Arc<dyn Device>> {
    Ok(Arc::new(Loopback {
        provider: EventCount::new(),
        vis: (0..MAX_VI).map(|_| ViWords::default()).collect(),
        cqs: (0..MAX_CQ).map(|_| CqWords::default()).collect(),
        next_handle: Mutex::new(0x100),
        wires: Mutex::new(Wires::default()),
        errors: Mutex::new(Vec::new()),
        breaks: Mutex::new(Vec::new()),
    }))
}

/// Why a request failed, for the initiator's status.
type Status = u32;

impl Loopback {
    fn brk(&self, vi: &ViCore, code: ErrorCode, tell_peer: bool) {
        self.breaks.lock().unwrap().push(Break {
            vi: (vi.slot, vi.generation),
            code,
            tell_peer,
        });
    }

    /// Reports `code` to the peer VI (its provider thread acts on it).
    fn tell(&self, peer: (u32, u16), code: ErrorCode) {
        self.errors.lock().unwrap().push(AsyncError {
            resource: ResourceCode::Vi,
            code,
            vi: Some(peer),
            cq: None,
            descriptor: 0,
        });
        self.provider.notify_all();
    }

    /// The bytes of the local segments of `wr`.
    fn gather(nic: &NicInner, wr: &SendWr) -> std::result::Result<Vec<u8>, Status> {
        let mut out = Vec::with_capacity(wr.length as usize);
        for s in wr.local() {
            let r = nic.regions.get(s.handle).ok_or(status::PROTECTION_ERROR)?;
            let at = out.len();
            out.resize(at + s.len as usize, 0);
            r.read(s.va, &mut out[at..])
                .map_err(|_| status::PROTECTION_ERROR)?;
        }
        Ok(out)
    }

    /// Writes `bytes` over the local segments of `wr` (RDMA read).
    fn scatter_local(nic: &NicInner, wr: &SendWr, bytes: &[u8]) -> std::result::Result<(), Status> {
        let mut done = 0usize;
        for s in wr.local() {
            let r = nic.regions.get(s.handle).ok_or(status::PROTECTION_ERROR)?;
            let n = s.len as usize;
            r.write(s.va, &bytes[done..done + n])
                .map_err(|_| status::PROTECTION_ERROR)?;
            done += n;
        }
        Ok(())
    }

    /// What the initiator's status is when the receiver could not take a
    /// message (the soft NIC's table).
    fn remote_failure(&self, vi: &ViCore, peer: (u32, u16), code: ErrorCode) -> Status {
        match vi.reliability() {
            Reliability::Unreliable => 0,
            r => {
                self.tell(peer, code);
                self.brk(vi, ErrorCode::ConnLost, false);
                if r == Reliability::ReliableReception {
                    status::REMOTE_DESC_ERROR
                } else {
                    0
                }
            }
        }
    }

    /// Delivers `bytes` (or only the completion, `data == None`) into the
    /// peer's next receive with `recv_op`. The receive's error bits, or
    /// `None` if the peer had no receive.
    fn deliver(
        &self,
        nic: &NicInner,
        peer: &ViCore,
        wr: &SendWr,
        data: Option<&[u8]>,
        recv_op: u32,
    ) -> Option<Status> {
        let (_, rw) = self
            .wires
            .lock()
            .unwrap()
            .recvs
            .get_mut(&peer.slot)?
            .pop_front()?;
        let mut fault = 0;
        if let Some(bytes) = data {
            let cap: u64 = rw.segs[..rw.n].iter().map(|s| s.1 as u64).sum();
            if bytes.len() as u64 > cap {
                fault = status::LENGTH_ERROR;
            } else {
                let mut done = 0usize;
                for &(off, len, h) in &rw.segs[..rw.n] {
                    let n = (len as usize).min(bytes.len() - done);
                    if n == 0 {
                        break;
                    }
                    let ok = nic
                        .regions
                        .get(h)
                        .is_some_and(|r| r.write(r.va + off, &bytes[done..done + n]).is_ok());
                    if !ok {
                        fault = status::PROTECTION_ERROR;
                        break;
                    }
                    done += n;
                }
            }
        }
        let imm = (wr.control & control::IMMEDIATE != 0).then_some(wr.imm);
        let st = status::DONE | recv_op | fault | if imm.is_some() { status::IMMEDIATE } else { 0 };
        let len = if fault == 0 { wr.length } else { 0 };
        if let Some(d) = nic.regions.get(rw.desc_handle) {
            let va = d.va + rw.desc_off;
            if completion::write_in_region(&d, va, st, Some(len), imm).is_ok() {
                completion::after_local(nic, peer, Which::Recv);
            }
        }
        Some(fault)
    }

    /// An RDMA target region of `peer` allowing `need`, covering the
    /// request's remote bytes.
    fn target(nic: &NicInner, peer: &ViCore, wr: &SendWr, need: u32) -> Option<Arc<Resolved>> {
        let r = nic.regions.get(wr.remote_handle)?;
        let a = peer.attributes();
        let vi_ok = match need {
            flags::RDMA_WRITE => a.enable_rdma_write,
            _ => a.enable_rdma_read,
        };
        (vi_ok
            && r.flags & need != 0
            && r.ptag == a.ptag.id()
            && r.covers(wr.remote_va, wr.length as u64))
        .then_some(r)
    }

    fn rdma_violation(&self, vi: &ViCore, peer: (u32, u16), code: ErrorCode) -> Status {
        self.tell(peer, code);
        if vi.reliability().is_reliable() {
            self.brk(vi, ErrorCode::ConnLost, false);
        }
        status::RDMA_PROT_ERROR
    }

    fn run(&self, nic: &NicInner, vi: &ViCore, peer: (u32, u16), wr: &SendWr) -> Status {
        let Some(pv) = nic.vi(peer.0, peer.1) else {
            self.brk(vi, ErrorCode::ConnLost, false);
            return status::DESC_FLUSHED_ERROR;
        };
        match wr.op() {
            control::OP_SENDRECV => {
                let bytes = match Self::gather(nic, wr) {
                    Ok(b) => b,
                    Err(st) => return st,
                };
                match self.deliver(nic, &pv, wr, Some(&bytes), status::OP_RECEIVE) {
                    None => self.remote_failure(vi, peer, ErrorCode::RecvqEmpty),
                    Some(0) => 0,
                    Some(_) => self.remote_failure(vi, peer, ErrorCode::ConnLost),
                }
            }
            control::OP_RDMAWRITE => {
                let Some(t) = Self::target(nic, &pv, wr, flags::RDMA_WRITE) else {
                    return self.rdma_violation(vi, peer, ErrorCode::RdmawProt);
                };
                let imm = wr.control & control::IMMEDIATE != 0;
                if imm
                    && self
                        .wires
                        .lock()
                        .unwrap()
                        .recvs
                        .get(&pv.slot)
                        .is_none_or(|q| q.is_empty())
                {
                    return self.remote_failure(vi, peer, ErrorCode::RecvqEmpty);
                }
                let bytes = match Self::gather(nic, wr) {
                    Ok(b) => b,
                    Err(st) => return st,
                };
                if t.write(wr.remote_va, &bytes).is_err() {
                    return status::PROTECTION_ERROR;
                }
                if imm {
                    self.deliver(nic, &pv, wr, None, status::OP_REMOTE_RDMA_WRITE);
                }
                0
            }
            _ => {
                let Some(s) = Self::target(nic, &pv, wr, flags::RDMA_READ) else {
                    return self.rdma_violation(vi, peer, ErrorCode::RdmarProt);
                };
                let mut bytes = vec![0u8; wr.length as usize];
                if s.read(wr.remote_va, &mut bytes).is_err() {
                    return status::PROTECTION_ERROR;
                }
                match Self::scatter_local(nic, wr, &bytes) {
                    Ok(()) => 0,
                    Err(st) => st,
                }
            }
        }
    }
}

impl Device for Loopback {
    fn kind(&self) -> &'static str {
        "loopback"
    }

    fn limits(&self) -> Limits {
        Limits {
            max_vi: MAX_VI,
            max_cq: MAX_CQ,
            queue_depth: 64,
            max_segments: crate::descriptor::MAX_SEGMENTS as u32,
            max_transfer: 1 << 20,
            max_regions: 1024,
            reliability: Reliability::Unreliable.bits()
                | Reliability::ReliableDelivery.bits()
                | Reliability::ReliableReception.bits(),
            rdma_read: Reliability::ReliableDelivery.bits() | Reliability::ReliableReception.bits(),
            write_tail_last: false,
        }
    }

    fn provider_wake(&self) -> &EventCount {
        &self.provider
    }

    fn vi_signals(&self, slot: u32) -> ViSignals<'_> {
        let w = &self.vis[slot as usize];
        ViSignals {
            send_wake: &w.send_wake,
            recv_wake: &w.recv_wake,
            interest: &w.interest,
        }
    }

    fn cq_signals(&self, slot: u32) -> CqSignals<'_> {
        let w = &self.cqs[slot as usize];
        CqSignals {
            wake: &w.wake,
            interest: &w.interest,
        }
    }

    fn take_async_errors(&self, out: &mut Vec<AsyncError>) {
        out.append(&mut self.errors.lock().unwrap());
    }

    fn reserve_region(&self) -> Result<RegionSlot> {
        let mut n = self.next_handle.lock().unwrap();
        *n += 1;
        Ok(RegionSlot {
            handle: *n,
            index: 0,
        })
    }

    fn add_region(&self, _nic: &NicInner, slot: RegionSlot, _r: &RegionSpec<'_>) -> Result<u32> {
        Ok(slot.handle)
    }

    fn set_region_attributes(&self, _handle: u32, _ptag: u32, _flags: u32) -> Result<()> {
        Ok(())
    }

    fn add_vi(&self, _nic: &NicInner, _vi: &ViCore) -> Result<()> {
        Ok(())
    }

    fn vi_attributes(&self, _vi: &ViCore, _a: &ViAttributes) {}

    fn remove_vi(&self, _nic: &NicInner, vi: &ViCore) {
        let mut w = self.wires.lock().unwrap();
        w.peer.remove(&vi.slot);
        w.recvs.remove(&vi.slot);
    }

    fn cq_ring(
        &self,
        _nic: &NicInner,
        _slot: u32,
        _generation: u32,
        entries: u32,
    ) -> Result<Arc<MappedRing>> {
        let cap = entries.next_power_of_two().max(64);
        let len = cq::EntryRing::bytes_for(cap);
        let map = Mapping::anonymous(len).map_err(|_| Error::Resource)?;
        let ring = MappedRing::init(Arc::new(map), 0, len, cap).map_err(|_| Error::Resource)?;
        ring.get()
            .set_limit(entries as usize)
            .map_err(|_| Error::Resource)?;
        Ok(Arc::new(ring))
    }

    fn connect(&self, _nic: &NicInner, vi: &ViCore, peer: &Endpoint) -> Result<()> {
        self.wires
            .lock()
            .unwrap()
            .peer
            .insert(vi.slot, (peer.vi, peer.vi_gen as u16));
        Ok(())
    }

    fn disconnect(&self, _nic: &NicInner, vi: &ViCore, tell_peer: bool) {
        let peer = self.wires.lock().unwrap().peer.remove(&vi.slot);
        if let (true, Some(p)) = (tell_peer, peer) {
            self.tell(p, ErrorCode::ConnLost);
        }
    }

    fn post_send(
        &self,
        nic: &NicInner,
        vi: &ViCore,
        wr: &SendWr,
        _regions: WrRegions<'_>,
    ) -> Result<Kick> {
        let op_status = match wr.op() {
            control::OP_RDMAWRITE => status::OP_RDMA_WRITE,
            control::OP_RDMAREAD => status::OP_RDMA_READ,
            _ => status::OP_SEND,
        };
        let peer = self.wires.lock().unwrap().peer.get(&vi.slot).copied();
        let st = match peer {
            _ if wr.fault != 0 => {
                if vi.reliability().is_reliable() {
                    self.brk(vi, ErrorCode::PostDesc, true);
                }
                wr.fault
            }
            Some(p) if !vi.broken.load(std::sync::atomic::Ordering::Acquire) => {
                self.run(nic, vi, p, wr)
            }
            _ => status::DESC_FLUSHED_ERROR,
        };
        let desc = nic
            .regions
            .get(wr.desc_handle)
            .filter(|r| r.covers(wr.desc_va, 32));
        completion::send(
            nic,
            vi,
            desc.as_deref(),
            wr.desc_va,
            status::DONE | st | op_status,
        );
        Ok(Kick::Needed)
    }

    fn kick(&self, nic: &NicInner, _vi: Option<&ViCore>) {
        let breaks = std::mem::take(&mut *self.breaks.lock().unwrap());
        for b in breaks {
            if let Some(vi) = nic.vi(b.vi.0, b.vi.1) {
                vi.break_connection(nic, b.code, b.tell_peer, false);
            }
        }
    }

    fn post_recv(&self, _nic: &NicInner, vi: &ViCore, pos: u64, wr: &RecvWr) -> Result<()> {
        self.wires
            .lock()
            .unwrap()
            .recvs
            .entry(vi.slot)
            .or_default()
            .push_back((pos, wr.clone()));
        Ok(())
    }

    fn cancel_recv(&self, _nic: &NicInner, vi: &ViCore, pos: u64, _force: bool) -> bool {
        let mut w = self.wires.lock().unwrap();
        let Some(q) = w.recvs.get_mut(&vi.slot) else {
            return false;
        };
        match q.iter().position(|(p, _)| *p == pos) {
            Some(i) => {
                q.remove(i);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests;
