//! Mappings of a peer's NIC: its segment, its arenas, its CQ rings, and a
//! cache of its translation table.
//!
//! Everything read from these mappings was written by another process and
//! is checked before use (`NicView` bounds-checks slots, `tpt::read` checks
//! handles, [`Resolved`] bounds-checks every access).
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use crate::agent::Agent;
use crate::attrs::Reliability;
use crate::backend::soft::memory::{Resolved, ResolvedExtent};
use crate::nic::{AsyncError, ErrorCode, NicInner, ResourceCode};
use crate::proto::{Endpoint, ObjKey, ObjKind};
use crate::shm::arena::CMA;
use crate::shm::layout::{NicView, OFFSETS};
use crate::shm::mapping::Mapping;
use crate::shm::rings::MappedRing;
use crate::tpt;

/// Most arenas of one peer kept mapped at once; beyond this half of them are
/// unmapped (and fetched again if needed).
const MAX_ARENAS: usize = 4096;

/// A peer NIC, mapped.
pub(crate) struct RemoteNic {
    pub session: u64,
    pub nic: u32,
    pub pid: i32,
    map: Arc<Mapping>,
    agent: Arc<Agent>,
    arenas: RwLock<HashMap<u32, Arc<Mapping>>>,
    cqs: RwLock<HashMap<(u32, u32), Arc<MappedRing>>>,
    errors: MappedRing,
}

fn fetch_map(agent: &Agent, session: u64, key: ObjKey, min: usize) -> io::Result<Arc<Mapping>> {
    let fd = agent.fetch(session, key)?;
    let size = crate::sys::file_size(&fd)? as usize;
    if size < min || size == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "shared object too small",
        ));
    }
    Ok(Arc::new(Mapping::map_shared(&fd, 0, size)?))
}

impl RemoteNic {
    /// Maps NIC `nic` of `session` (fetching its segment from viad).
    pub fn open(agent: Arc<Agent>, session: u64, nic: u32) -> io::Result<RemoteNic> {
        let key = ObjKey {
            kind: ObjKind::Nic,
            nic,
            id: 0,
            generation: 0,
        };
        let map = fetch_map(&agent, session, key, OFFSETS.len)?;
        let view = NicView::attach(&map)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
        let h = view.header();
        if h.session.load(Ordering::Relaxed) != session || h.nic_id.load(Ordering::Relaxed) != nic {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "segment of another NIC",
            ));
        }
        let pid = h.pid.load(Ordering::Relaxed) as i32;
        let (off, len) = view.errors_range();
        let errors = MappedRing::attach(map.clone(), off, len)?;
        Ok(RemoteNic {
            session,
            nic,
            pid,
            map,
            agent,
            arenas: RwLock::new(HashMap::new()),
            cqs: RwLock::new(HashMap::new()),
            errors,
        })
    }

    /// The peer's segment.
    pub fn view(&self) -> NicView<'_> {
        NicView::trusted(&self.map)
    }

    /// The mapping of the peer's arena `id` (fetched on first use).
    fn arena(&self, id: u32) -> Option<Arc<Mapping>> {
        if let Some(m) = self.arenas.read().unwrap().get(&id) {
            return Some(m.clone());
        }
        let m = match fetch_map(&self.agent, self.session, crate::process::arena_key(id), 1) {
            Ok(m) => m,
            Err(e) => {
                log::debug!("arena {id} of session {}: {e}", self.session);
                return None;
            }
        };
        let mut g = self.arenas.write().unwrap();
        if g.len() >= MAX_ARENAS {
            let drop: Vec<u32> = g.keys().take(MAX_ARENAS / 2).copied().collect();
            for k in drop {
                g.remove(&k);
            }
        }
        g.insert(id, m.clone());
        Some(m)
    }

    /// Resolves the peer's region `handle` (mapping its arenas as needed),
    /// with the table entry's sequence value for caching; `None` if the
    /// handle is not live in the peer's table.
    pub fn resolve(&self, handle: u32) -> Option<(Arc<Resolved>, u32)> {
        let view = self.view();
        let (snap, seq) = tpt::read(&view, handle)?;
        let mut extents = Vec::with_capacity(snap.n_extents);
        for e in &snap.extents[..snap.n_extents] {
            let map = if e.arena == CMA {
                None
            } else {
                Some(self.arena(e.arena)?)
            };
            extents.push(ResolvedExtent {
                va: e.va,
                len: e.len,
                map_off: if map.is_some() { e.arena_off } else { 0 },
                map,
            });
        }
        let r = Arc::new(Resolved {
            handle,
            va: snap.va,
            len: snap.len,
            ptag: snap.ptag,
            flags: snap.flags,
            pid: self.pid,
            extents,
        });
        Some((r, seq))
    }

    /// The peer's CQ ring `slot`, generation `generation` (fetched on first use).
    pub fn cq_ring(&self, slot: u32, generation: u32) -> Option<Arc<MappedRing>> {
        if let Some(r) = self.cqs.read().unwrap().get(&(slot, generation)) {
            return Some(r.clone());
        }
        let map = fetch_map(
            &self.agent,
            self.session,
            crate::cq::ring_key(self.nic, slot, generation),
            64,
        )
        .ok()?;
        let len = map.len();
        let ring = Arc::new(MappedRing::attach(map, 0, len).ok()?);
        let mut g = self.cqs.write().unwrap();
        g.retain(|(s, _), _| *s != slot);
        g.insert((slot, generation), ring.clone());
        Some(ring)
    }

    /// Pushes an asynchronous error into the peer's error ring and wakes its
    /// provider thread.
    pub fn post_error(&self, e: AsyncError) {
        if let Err(err) = self.errors.get().push(e.encode()) {
            log::warn!(
                "cannot report {:?} to session {}: {err}",
                e.code,
                self.session
            );
        }
        self.view().header().notify.notify_all();
    }
}

/// One connection as the engine of this side uses it.
pub(crate) struct PeerLink {
    pub remote: Arc<RemoteNic>,
    /// Peer VI slot and generation.
    pub vi: u32,
    pub vi_gen: u32,
    /// Next position of the peer's receive ring to consume (engine only).
    pub rq_pos: AtomicU64,
    /// Reliability level of the connection.
    pub reliability: Reliability,
    /// Negotiated MaxTransferSize.
    pub mtu: u32,
}

impl PeerLink {
    /// Maps the peer of `ep` and starts at its first unconsumed receive.
    pub fn open(nic: &NicInner, ep: &Endpoint, mtu: u32) -> io::Result<PeerLink> {
        let remote = nic.process.remote(ep.session, ep.nic)?;
        let reliability = Reliability::from_bits(ep.reliability)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "bad reliability"))?;
        Ok(PeerLink {
            remote,
            vi: ep.vi,
            vi_gen: ep.vi_gen,
            rq_pos: AtomicU64::new(ep.rq_pos),
            reliability,
            mtu,
        })
    }

    /// Tells the peer VI that the connection is broken (`code`).
    pub fn tell_peer(&self, code: ErrorCode) {
        self.remote.post_error(AsyncError {
            resource: ResourceCode::Vi,
            code,
            vi: Some((self.vi, self.vi_gen as u16)),
            cq: None,
            descriptor: 0,
        });
    }

    /// Starts fetching the peer's next receive slot: the engine will claim
    /// it a few hundred nanoseconds later, and the line is usually in the
    /// peer's cache (it just posted the receive).
    pub fn prefetch_next_receive(&self) {
        let pos = self.rq_pos.load(Ordering::Relaxed);
        if let Some(s) = self.remote.view().rq_slot(self.vi, pos) {
            crate::shm::mapping::prefetch(s);
        }
    }

    /// Whether the peer VI still exists with the same generation.
    pub fn peer_alive(&self) -> bool {
        self.remote
            .view()
            .vi(self.vi)
            .is_some_and(|v| v.generation.load(Ordering::Acquire) == self.vi_gen)
    }
}
