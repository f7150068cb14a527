//! Mappings of a peer's NIC: its segment, its arenas, its CQ rings, and a
//! cache of its translation table.
//!
//! Everything read from these mappings was written by another process and
//! is checked before use (`NicView` bounds-checks slots, `tpt::read` checks
//! handles, [`Resolved`] bounds-checks every access).
#![forbid(unsafe_code)]

use std::collections::{HashMap, VecDeque};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};

use crate::agent::Agent;
use crate::attrs::Reliability;
use crate::mem::arena::CMA;
use crate::mem::region::{Resolved, ResolvedExtent};
use crate::nic::{AsyncError, ErrorCode, ResourceCode};
use crate::proto::{Endpoint, ObjKey, ObjKind};

use super::SoftNic;
use super::layout::{LayoutError, NicView, OFFSETS, Segment, ViShared};
use super::tpt;
use crate::shm::mapping::Mapping;
use crate::shm::rings::MappedRing;

/// Arenas of one peer kept mapped after the last region that used them is
/// gone from the engine's caches (the most recently used ones). Any other
/// mapping lives exactly as long as a resolved region holds it, so the
/// arenas a peer retires are unmapped here within a bounded number of
/// translations.
const RECENT_ARENAS: usize = 16;

/// The arenas of a peer this process maps.
#[derive(Default)]
struct ArenaMaps {
    /// Every mapping still held somewhere, by arena id.
    held: HashMap<u32, Weak<Mapping>, crate::regions::BuildHandleHasher>,
    /// The most recently used mappings, kept alive (newest last).
    recent: VecDeque<(u32, Arc<Mapping>)>,
}

/// A peer NIC, mapped.
pub(crate) struct RemoteNic {
    pub session: u64,
    pub nic: u32,
    pub pid: i32,
    seg: Segment,
    agent: Arc<Agent>,
    arenas: Mutex<ArenaMaps>,
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
        let bad = |e: LayoutError| io::Error::new(io::ErrorKind::InvalidData, e.to_string());
        let seg = Segment::new(fetch_map(&agent, session, key, OFFSETS.len)?).map_err(bad)?;
        let view = NicView::attach(&seg).map_err(bad)?;
        let h = view.header();
        if h.session.load(Ordering::Relaxed) != session || h.nic_id.load(Ordering::Relaxed) != nic {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "segment of another NIC",
            ));
        }
        let pid = h.pid.load(Ordering::Relaxed) as i32;
        let (off, len) = NicView::errors_range();
        let errors = MappedRing::attach(seg.mapping().clone(), off, len)?;
        Ok(RemoteNic {
            session,
            nic,
            pid,
            seg,
            agent,
            arenas: Mutex::new(ArenaMaps::default()),
            cqs: RwLock::new(HashMap::new()),
            errors,
        })
    }

    /// The peer's arena-retirement count (see `NicHeader::retired`).
    pub fn retired(&self) -> u32 {
        // Acquire: pairs with the owner's Release bump.
        self.view().header().retired.load(Ordering::Acquire)
    }

    /// The peer's segment.
    #[inline(always)]
    pub fn view(&self) -> NicView<'_> {
        self.seg.view()
    }

    /// The mapping of the peer's arena `id` (fetched on first use).
    fn arena(&self, id: u32) -> Option<Arc<Mapping>> {
        {
            let mut g = self.arenas.lock().unwrap();
            if let Some(m) = g.held.get(&id).and_then(Weak::upgrade) {
                g.touch(id, &m);
                return Some(m);
            }
        }
        let m = match fetch_map(&self.agent, self.session, crate::process::arena_key(id), 1) {
            Ok(m) => m,
            Err(e) => {
                log::debug!("arena {id} of session {}: {e}", self.session);
                return None;
            }
        };
        let mut g = self.arenas.lock().unwrap();
        g.held.insert(id, Arc::downgrade(&m));
        g.touch(id, &m);
        if g.held.len() > 4 * RECENT_ARENAS {
            g.held.retain(|_, w| w.strong_count() > 0);
        }
        Some(m)
    }

    /// The region a consistent snapshot of the peer's table describes, its
    /// arenas mapped.
    pub fn build(&self, snap: &tpt::Snapshot) -> Option<Arc<Resolved>> {
        let handle = snap.handle;
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
            extents: extents.into(),
            live: Default::default(),
        });
        Some(r)
    }

    /// The peer's CQ ring `slot`, generation `generation` (fetched on first use).
    pub fn cq_ring(&self, slot: u32, generation: u32) -> Option<Arc<MappedRing>> {
        if let Some(r) = self.cqs.read().unwrap().get(&(slot, generation)) {
            return Some(r.clone());
        }
        let map = fetch_map(
            &self.agent,
            self.session,
            super::ring_key(self.nic, slot, generation),
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

impl ArenaMaps {
    /// Marks `id` as just used.
    fn touch(&mut self, id: u32, m: &Arc<Mapping>) {
        // Usually the arena used last (one buffer, registered again and again).
        if self.recent.back().is_some_and(|(r, _)| *r == id) {
            return;
        }
        if let Some(i) = self.recent.iter().position(|(r, _)| *r == id) {
            let e = self.recent.remove(i).expect("present");
            self.recent.push_back(e);
            return;
        }
        self.recent.push_back((id, m.clone()));
        if self.recent.len() > RECENT_ARENAS {
            self.recent.pop_front();
        }
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
    /// Maps the peer of `ep` and starts at its receive ring position
    /// `rq_pos` (the first one it has not finished).
    pub fn open(soft: &SoftNic, ep: &Endpoint, rq_pos: u64, mtu: u32) -> io::Result<PeerLink> {
        let remote = soft.remote(ep.session, ep.nic)?;
        let reliability = Reliability::from_bits(ep.reliability)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "bad reliability"))?;
        Ok(PeerLink {
            remote,
            vi: ep.vi,
            vi_gen: ep.vi_gen,
            rq_pos: AtomicU64::new(rq_pos),
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

    /// The peer VI's entry in its NIC segment (looked up once per operation
    /// and handed to the calls below).
    pub fn peer_vi(&self) -> Option<&ViShared> {
        self.remote.view().vi(self.vi)
    }

    /// Raises the access epoch of the peer VI (`pv`: [`PeerLink::peer_vi`])
    /// (odd: inside an operation on its memory); returns the raised value
    /// for [`PeerLink::end_access`].
    pub fn begin_access(&self, pv: Option<&ViShared>) -> u32 {
        let Some(v) = pv else { return 0 };
        let e = (v.access.load(Ordering::Relaxed) | 1).wrapping_add(2);
        v.access.store(e, Ordering::Relaxed);
        // SeqCst: the odd epoch is ordered before every translation this
        // operation reads afterwards; pairs with the owner's fence between
        // its table update and its epoch loads (Dekker).
        std::sync::atomic::fence(Ordering::SeqCst);
        e
    }

    /// Lowers the epoch raised by [`PeerLink::begin_access`].
    pub fn end_access(&self, pv: Option<&ViShared>, e: u32) {
        if e == 0 {
            return;
        }
        if let Some(v) = pv {
            // Release: every access of the operation happens before the
            // owner sees the epoch move.
            v.access.store(e.wrapping_add(1), Ordering::Release);
        }
    }

    /// Whether the peer VI (`pv`: [`PeerLink::peer_vi`]) still exists with
    /// the same generation.
    pub fn peer_alive(&self, pv: Option<&ViShared>) -> bool {
        pv.is_some_and(|v| v.generation.load(Ordering::Acquire) == self.vi_gen)
    }
}
