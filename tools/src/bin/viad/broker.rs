//! The daemon's state machine, free of I/O so it can be tested directly.
//!
//! It stores the shared-object fds of every session, matches connection
//! requests with listeners (client/server) and with each other
//! (peer-to-peer) by discriminator, relays disconnects, enforces deadlines,
//! and turns the death of a session into `PeerDied` events for the sessions
//! that depended on it.
//!
//! Costs: matching is a hash lookup by discriminator (FIFO queues per
//! discriminator), deadlines sit in a heap, and everything a session holds
//! is indexed from the session, so a death costs what that session held,
//! not what every session holds. A death is told only to the sessions that
//! were connected to the dead one, had a connection pending with it, or
//! fetched one of its objects (they map its memory).
//!
//! Two modes. Per-user (the default): every session is of the daemon's own
//! user. System ([`Broker::set_system`], `viad --system`): sessions of
//! every uid, kept apart: a session fetches objects of sessions of its own
//! uid only (so it can map memory of its own user's processes only);
//! listens, connects and peer requests match within one uid (each uid has
//! its own discriminator namespace, so a request for another user's
//! discriminator finds nobody and ends as `NoMatch` at its deadline; a
//! cross-user grant of the configuration lets a request over TCP, the
//! sockets NIC, reach the granted user's listener, which may then fetch
//! that request's connection and nothing else of the requester, and is
//! refused at once with `Reject` on the shared-memory NIC); and each
//! published arena is
//! mapped and locked in memory by the daemon, within a per-process, a
//! per-user and a total pinning quota (`Refused(Quota)` beyond), released
//! on `Retire` and on the session's death.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use via_sys::LockedMapping;
use via_wire::proto::{
    self, DaemonMode, Endpoint, NetAddr, ObjKey, ObjKind, Refusal, Reply, Request, SessionLimits,
};

pub use via_wire::proto::DISCONNECT_ACK;

/// What one client may hold, so that one client cannot take the daemon's
/// resources from the others.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Shared-object fds one session may store.
    pub objects_per_session: usize,
    /// Shared-object fds all sessions together may store (the daemon's fd
    /// budget less what connections need).
    pub objects_total: usize,
    /// Listens, connects and peer requests one session may have waiting.
    pub pending_per_session: usize,
    /// Shared-object fds the sessions of one uid may store together (in
    /// per-user mode, all sessions are of one uid).
    pub objects_per_user: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            objects_per_session: 1 << 17,
            objects_total: 1 << 20,
            pending_per_session: 4096,
            objects_per_user: 1 << 20,
        }
    }
}

/// Who a session is: the credentials of its connection (`SO_PEERCRED`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cred {
    /// User.
    pub uid: u32,
    /// Process.
    pub pid: i32,
}

/// Bytes of arenas the daemon locks for one process and for all processes
/// of one user ([`proto::UNLIMITED`]: no bound).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quota {
    /// For one process (all its sessions).
    pub per_process: u64,
    /// For all processes of the user.
    pub per_user: u64,
}

/// A cross-user connection the configuration allows: a client of
/// `client_uid` may connect to discriminators starting with `prefix` that
/// a server of `server_uid` listens on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The requesting user.
    pub client_uid: u32,
    /// The listening user.
    pub server_uid: u32,
    /// Discriminators it covers (all if empty).
    pub prefix: Vec<u8>,
}

/// What the system mode enforces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SystemPolicy {
    /// Quota of every user without an entry in `users`.
    pub quota: Quota,
    /// Quota of particular users.
    pub users: HashMap<u32, Quota>,
    /// Bytes locked for all users together.
    pub total: u64,
    /// Cross-user connections allowed (over the sockets NIC only).
    pub grants: Vec<Grant>,
}

impl SystemPolicy {
    /// The quota of `uid`.
    pub fn quota(&self, uid: u32) -> Quota {
        self.users.get(&uid).copied().unwrap_or(self.quota)
    }

    /// The grant that lets `uid` connect to discriminator `d` of another
    /// user, if any.
    fn grant(&self, uid: u32, d: &[u8]) -> Option<&Grant> {
        self.grants
            .iter()
            .find(|g| g.client_uid == uid && d.starts_with(&g.prefix))
    }
}

/// A stored object: its fd and, for an arena in system mode, the lock the
/// daemon holds on its pages and the bytes counted for it.
struct Obj {
    fd: OwnedFd,
    /// Held for its effect (the pages stay resident); dropped with the
    /// object, which unlocks them.
    _lock: Option<LockedMapping>,
    pinned: u64,
}

/// What the I/O loop must do.
#[derive(Debug)]
pub enum Out {
    /// Send `reply` with id `id` to `to`.
    Send { to: u64, id: u32, reply: Reply },
    /// Send `Reply::Fd` with the fd of `key` of `owner` attached.
    SendFd {
        to: u64,
        id: u32,
        owner: u64,
        key: ObjKey,
    },
    /// Drop the session (protocol violation).
    Close { session: u64, why: &'static str },
    /// Open the TCP listener for other hosts on `host` (a sockets NIC was
    /// opened there), then answer `to`.
    OpenTcp { to: u64, id: u32, host: Vec<u8> },
}

struct Session {
    cred: Cred,
    hello: bool,
    /// A connection request from another host (`tcp.rs`): nobody watches
    /// it, since it ends when the TCP connection is handed to a listener.
    remote: bool,
    objects: HashMap<ObjKey, Obj>,
    /// Its waiting listens, connects and peer requests.
    listens: HashSet<u64>,
    connects: HashSet<u64>,
    peers: HashSet<u64>,
    /// Connects offered to it (as the server), not yet settled.
    offered: HashSet<u64>,
    /// Disconnects it waits for or must acknowledge (tokens).
    discs: HashSet<u64>,
    /// Its VIs that have a connection in `links`.
    vis: HashSet<ViKey>,
    /// Sessions to tell when this one dies, and the converse.
    watchers: HashSet<u64>,
    watching: HashSet<u64>,
}

impl Session {
    fn new(cred: Cred) -> Session {
        Session {
            cred,
            hello: false,
            remote: false,
            objects: HashMap::new(),
            listens: HashSet::new(),
            connects: HashSet::new(),
            peers: HashSet::new(),
            offered: HashSet::new(),
            discs: HashSet::new(),
            vis: HashSet::new(),
            watchers: HashSet::new(),
            watching: HashSet::new(),
        }
    }

    fn pending(&self) -> usize {
        self.listens.len() + self.connects.len() + self.peers.len()
    }
}

struct Listen {
    session: u64,
    uid: u32,
    id: u32,
    local: NetAddr,
}

enum ConnState {
    Waiting,
    Offered { server: u64 },
}

struct Connect {
    session: u64,
    uid: u32,
    id: u32,
    me: Endpoint,
    local: NetAddr,
    remote: NetAddr,
    state: ConnState,
    /// A listener took it at some point (at the deadline: `Timeout`, else
    /// `NoMatch`).
    offered_ever: bool,
    deadline: Option<Instant>,
}

struct PeerReq {
    session: u64,
    uid: u32,
    id: u32,
    me: Endpoint,
    local: NetAddr,
    remote: NetAddr,
}

struct Disc {
    session: u64,
    id: u32,
    target: u64,
}

/// What a deadline in the heap is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Timer {
    Listen(u64),
    Connect(u64),
    Peer(u64),
    Disc(u64),
}

/// A VI as the broker names it: (session, NIC, slot, generation).
type ViKey = (u64, u32, u32, u32);

fn vi_key(e: &Endpoint) -> ViKey {
    (e.session, e.nic, e.vi, e.vi_gen)
}

/// A discriminator in the namespace of a uid: requests match only within
/// one.
type NsDisc = (u32, Vec<u8>);

/// Removes `id` from the FIFO of `key` (and the FIFO if it empties).
fn unqueue<K: std::hash::Hash + Eq + Clone>(q: &mut HashMap<K, VecDeque<u64>>, key: &K, id: u64) {
    if let Some(v) = q.get_mut(key) {
        v.retain(|&x| x != id);
        if v.is_empty() {
            q.remove(key);
        }
    }
}

/// The broker.
pub struct Broker {
    host: Vec<u8>,
    /// IPv4 addresses of this host's sockets NICs (listened on for other
    /// hosts): local addresses too.
    tcp_hosts: Vec<Vec<u8>>,
    name: String,
    hosts: Vec<(String, Vec<u8>)>,
    limits: Limits,
    /// System mode's policy (`None`: per-user mode).
    system: Option<SystemPolicy>,
    sessions: HashMap<u64, Session>,
    objects_total: usize,
    /// Objects stored by the sessions of each uid.
    objects_by_uid: HashMap<u32, usize>,
    /// Bytes locked for each process, each uid, and in all.
    pinned_by_pid: HashMap<i32, u64>,
    pinned_by_uid: HashMap<u32, u64>,
    pinned_total: u64,
    listens: HashMap<u64, Listen>,
    /// Waiting listens by discriminator, oldest first.
    listen_q: HashMap<NsDisc, VecDeque<u64>>,
    connects: HashMap<u64, Connect>,
    /// Waiting (not offered) connects by the discriminator they want.
    connect_q: HashMap<NsDisc, VecDeque<u64>>,
    peers: HashMap<u64, PeerReq>,
    /// Waiting peer requests by uid and (local, remote) discriminator.
    peer_q: HashMap<(u32, Vec<u8>, Vec<u8>), VecDeque<u64>>,
    discs: HashMap<u64, Disc>,
    timers: BinaryHeap<Reverse<(Instant, Timer)>>,
    /// The connections this broker made, both ways: a `Disconnect` is
    /// relayed only along one of them (a client may not break a connection
    /// it is not part of). A VI has at most one connection.
    links: HashMap<ViKey, ViKey>,
    /// Connections a `Disconnect` of one side just dissolved, by the other
    /// side: that side may still send its own, crossing, `Disconnect` with
    /// a reason only it saw (the verbs kind: the peer's RDMA violation),
    /// which is relayed once. Dropped when either VI is linked again or
    /// its session ends.
    crossed: HashMap<ViKey, ViKey>,
    next_session: u64,
    next_id: u64,
}

fn deadline(now: Instant, ms: u32) -> Option<Instant> {
    (ms != proto::INFINITE).then(|| now + Duration::from_millis(ms as u64))
}

impl Broker {
    /// A broker for a host with VIA address `host` and name `name`; `hosts`
    /// are extra name-service entries.
    pub fn new(host: Vec<u8>, name: String, hosts: Vec<(String, Vec<u8>)>) -> Broker {
        Broker {
            host,
            tcp_hosts: Vec::new(),
            name,
            hosts,
            limits: Limits::default(),
            system: None,
            sessions: HashMap::new(),
            objects_total: 0,
            objects_by_uid: HashMap::new(),
            pinned_by_pid: HashMap::new(),
            pinned_by_uid: HashMap::new(),
            pinned_total: 0,
            listens: HashMap::new(),
            listen_q: HashMap::new(),
            connects: HashMap::new(),
            connect_q: HashMap::new(),
            peers: HashMap::new(),
            peer_q: HashMap::new(),
            discs: HashMap::new(),
            timers: BinaryHeap::new(),
            links: HashMap::new(),
            crossed: HashMap::new(),
            next_session: 1,
            next_id: 1,
        }
    }

    /// Sets the per-client limits.
    pub fn set_limits(&mut self, l: Limits) {
        self.limits = l;
    }

    /// Switches to system mode with `policy` (before any session opens).
    pub fn set_system(&mut self, policy: SystemPolicy) {
        self.system = Some(policy);
    }

    /// Registers a new client of credentials `cred`; returns its session id.
    pub fn open_session(&mut self, cred: Cred) -> u64 {
        let s = self.next_session;
        self.next_session += 1;
        self.sessions.insert(s, Session::new(cred));
        s
    }

    /// Bytes locked for all sessions (system mode).
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn pinned_total(&self) -> u64 {
        self.pinned_total
    }

    /// What a session of `cred` is told in its `Welcome`.
    fn welcome_limits(&self, cred: Cred) -> (DaemonMode, SessionLimits) {
        let max_objects = self
            .limits
            .objects_per_session
            .min(self.limits.objects_per_user) as u64;
        match &self.system {
            None => (DaemonMode::User, SessionLimits::unpinned(max_objects)),
            Some(p) => {
                let q = p.quota(cred.uid);
                (
                    DaemonMode::System,
                    SessionLimits {
                        pin_process: q.per_process.min(q.per_user).min(p.total),
                        pin_user: q.per_user.min(p.total),
                        max_objects,
                    },
                )
            }
        }
    }

    /// In system mode, the grant that would let session `s` connect to
    /// discriminator `d` of another user, if the configuration has one and
    /// no listener of its own user waits on `d`.
    fn cross_user_grant(&self, s: u64, d: &[u8]) -> Option<Grant> {
        let policy = self.system.as_ref()?;
        let uid = self.sessions.get(&s)?.cred.uid;
        if self
            .listen_q
            .get(&(uid, d.to_vec()))
            .is_some_and(|q| !q.is_empty())
        {
            return None;
        }
        policy.grant(uid, d).cloned()
    }

    /// Counts `bytes` out of the pinning totals of `cred`.
    fn unpin(&mut self, cred: Cred, bytes: u64) {
        if bytes == 0 {
            return;
        }
        self.pinned_total -= bytes;
        if let Some(n) = self.pinned_by_uid.get_mut(&cred.uid) {
            *n -= bytes;
            if *n == 0 {
                self.pinned_by_uid.remove(&cred.uid);
            }
        }
        if let Some(n) = self.pinned_by_pid.get_mut(&cred.pid) {
            *n -= bytes;
            if *n == 0 {
                self.pinned_by_pid.remove(&cred.pid);
            }
        }
    }

    /// Forgets object `key` of session `s` (its lock goes with it).
    fn drop_object(&mut self, s: u64, key: &ObjKey) {
        let Some(sess) = self.sessions.get_mut(&s) else {
            return;
        };
        let cred = sess.cred;
        if let Some(o) = sess.objects.remove(key) {
            self.objects_total -= 1;
            if let Some(n) = self.objects_by_uid.get_mut(&cred.uid) {
                *n -= 1;
                if *n == 0 {
                    self.objects_by_uid.remove(&cred.uid);
                }
            }
            self.unpin(cred, o.pinned);
        }
    }

    /// In system mode, maps and locks arena `fd` of session `s` (`cred`)
    /// if its quota allows, replacing `replaced` bytes it held under the
    /// same key. `Ok(None)`: nothing to lock (per-user mode, or not an
    /// arena); `Err`: the refusal to send.
    fn pin_arena(
        &mut self,
        s: u64,
        cred: Cred,
        key: &ObjKey,
        fd: &OwnedFd,
        replaced: u64,
    ) -> Result<Option<(LockedMapping, u64)>, Refusal> {
        let Some(policy) = &self.system else {
            return Ok(None);
        };
        if key.kind != ObjKind::Arena {
            return Ok(None);
        }
        // The file's own size is what gets locked: what the client says
        // does not matter.
        let size = match via_sys::memory_file_size(fd) {
            Ok(n) => n,
            Err(e) => {
                log::warn!(
                    "session {s} (uid {}, pid {}): arena {} is not a memory file ({e}): refused",
                    cred.uid,
                    cred.pid,
                    key.id
                );
                return Err(Refusal::Invalid);
            }
        };
        if size == 0 {
            return Ok(None);
        }
        let page = via_sys::page_size() as u64;
        let bytes = size.div_ceil(page).saturating_mul(page);
        let q = policy.quota(cred.uid);
        let proc_used = self.pinned_by_pid.get(&cred.pid).copied().unwrap_or(0) - replaced;
        let user_used = self.pinned_by_uid.get(&cred.uid).copied().unwrap_or(0) - replaced;
        let total_used = self.pinned_total - replaced;
        let over = |used: u64, limit: u64| used.saturating_add(bytes) > limit;
        if over(proc_used, q.per_process)
            || over(user_used, q.per_user)
            || over(total_used, policy.total)
        {
            log::warn!(
                "session {s} (uid {}, pid {}): arena {} of {bytes} bytes refused: pinning quota \
                 (process {proc_used} of {}, user {user_used} of {}, all users {total_used} of {})",
                cred.uid,
                cred.pid,
                key.id,
                q.per_process,
                q.per_user,
                policy.total
            );
            return Err(Refusal::Quota);
        }
        let Ok(len) = usize::try_from(size) else {
            return Err(Refusal::Quota);
        };
        match LockedMapping::lock(fd, len) {
            Ok(m) => Ok(Some((m, bytes))),
            Err(e) => {
                log::error!(
                    "session {s} (uid {}, pid {}): cannot lock arena {} of {bytes} bytes: {e}; refused",
                    cred.uid,
                    cred.pid,
                    key.id
                );
                Err(Refusal::Quota)
            }
        }
    }

    /// Number of live sessions.
    #[cfg(test)]
    pub fn sessions(&self) -> usize {
        self.sessions.len()
    }

    /// Shared-object fds stored, all sessions together.
    #[cfg(test)]
    pub fn objects_total(&self) -> usize {
        self.objects_total
    }

    /// Whether `s` has said Hello.
    pub fn said_hello(&self, s: u64) -> bool {
        self.sessions.get(&s).is_some_and(|x| x.hello)
    }

    /// The fd of `key` of `owner`, if stored.
    pub fn object(&self, owner: u64, key: &ObjKey) -> Option<&OwnedFd> {
        self.sessions.get(&owner)?.objects.get(key).map(|o| &o.fd)
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn timer(&mut self, at: Option<Instant>, t: Timer) {
        if let Some(at) = at {
            self.timers.push(Reverse((at, t)));
        }
        // Entries of requests settled early stay until their time: rebuild
        // when they dominate.
        let live = self.listens.len() + self.connects.len() + self.peers.len() + self.discs.len();
        if self.timers.len() > 2 * live + 1024 {
            let keep: Vec<_> = std::mem::take(&mut self.timers)
                .into_iter()
                .filter(|Reverse((_, t))| self.timer_live(*t))
                .collect();
            self.timers = keep.into();
        }
    }

    fn timer_live(&self, t: Timer) -> bool {
        match t {
            Timer::Listen(id) => self.listens.contains_key(&id),
            Timer::Connect(id) => self.connects.contains_key(&id),
            Timer::Peer(id) => self.peers.contains_key(&id),
            Timer::Disc(id) => self.discs.contains_key(&id),
        }
    }

    /// `a` and `b` must hear of each other's death.
    fn watch(&mut self, a: u64, b: u64) {
        if a == b
            || !self.sessions.contains_key(&a)
            || !self.sessions.contains_key(&b)
            || self.is_remote(a)
            || self.is_remote(b)
        {
            return;
        }
        for (x, y) in [(a, b), (b, a)] {
            let sx = self.sessions.get_mut(&x).unwrap();
            sx.watchers.insert(y);
            sx.watching.insert(y);
        }
    }

    /// `fetcher` maps memory of `owner`: it must hear of `owner`'s death.
    fn watch_owner(&mut self, fetcher: u64, owner: u64) {
        if fetcher == owner || !self.sessions.contains_key(&owner) || self.is_remote(owner) {
            return;
        }
        self.sessions
            .get_mut(&owner)
            .unwrap()
            .watchers
            .insert(fetcher);
        if let Some(f) = self.sessions.get_mut(&fetcher) {
            f.watching.insert(owner);
        }
    }

    fn unlink_vi(&mut self, k: &ViKey) {
        if let Some(other) = self.links.remove(k) {
            self.links.remove(&other);
            for v in [k, &other] {
                if let Some(s) = self.sessions.get_mut(&v.0) {
                    s.vis.remove(v);
                }
            }
        }
    }

    /// Records a connection between `a` and `b`, replacing older ones of either.
    fn link(&mut self, a: &Endpoint, b: &Endpoint) {
        let (a, b) = (vi_key(a), vi_key(b));
        for k in [a, b] {
            self.unlink_vi(&k);
            self.crossed.remove(&k);
        }
        self.links.insert(a, b);
        self.links.insert(b, a);
        for k in [a, b] {
            if let Some(s) = self.sessions.get_mut(&k.0) {
                s.vis.insert(k);
            }
        }
        self.watch(a.0, b.0);
    }

    fn local_host(&self, h: &[u8]) -> bool {
        h.is_empty() || h == self.host.as_slice() || self.tcp_hosts.iter().any(|t| t == h)
    }

    /// `host` is the address of a sockets NIC of this host (its TCP
    /// listener is open): requests and listens on it are local.
    pub fn add_tcp_host(&mut self, host: Vec<u8>) {
        if !self.tcp_hosts.contains(&host) {
            self.tcp_hosts.push(host);
        }
    }

    /// A session for a connection request that came from another host over
    /// TCP (it says no Hello; nobody hears of its end).
    pub fn open_remote_session(&mut self, cred: Cred) -> u64 {
        let s = self.open_session(cred);
        let sess = self.sessions.get_mut(&s).unwrap();
        sess.hello = true;
        sess.remote = true;
        s
    }

    fn is_remote(&self, s: u64) -> bool {
        self.sessions.get(&s).is_some_and(|x| x.remote)
    }

    fn remove_listen(&mut self, lid: u64) -> Option<Listen> {
        let l = self.listens.remove(&lid)?;
        unqueue(
            &mut self.listen_q,
            &(l.uid, l.local.discriminator.clone()),
            lid,
        );
        if let Some(s) = self.sessions.get_mut(&l.session) {
            s.listens.remove(&lid);
        }
        Some(l)
    }

    fn remove_connect(&mut self, conn: u64) -> Option<Connect> {
        let c = self.connects.remove(&conn)?;
        match c.state {
            ConnState::Waiting => unqueue(
                &mut self.connect_q,
                &(c.uid, c.remote.discriminator.clone()),
                conn,
            ),
            ConnState::Offered { server } => {
                if let Some(s) = self.sessions.get_mut(&server) {
                    s.offered.remove(&conn);
                }
            }
        }
        if let Some(s) = self.sessions.get_mut(&c.session) {
            s.connects.remove(&conn);
        }
        Some(c)
    }

    fn remove_peer(&mut self, pid: u64) -> Option<PeerReq> {
        let p = self.peers.remove(&pid)?;
        let key = (
            p.uid,
            p.local.discriminator.clone(),
            p.remote.discriminator.clone(),
        );
        unqueue(&mut self.peer_q, &key, pid);
        if let Some(s) = self.sessions.get_mut(&p.session) {
            s.peers.remove(&pid);
        }
        Some(p)
    }

    fn remove_disc(&mut self, token: u64) -> Option<Disc> {
        let d = self.discs.remove(&token)?;
        for x in [d.session, d.target] {
            if let Some(s) = self.sessions.get_mut(&x) {
                s.discs.remove(&token);
            }
        }
        Some(d)
    }

    /// Handles one decoded request.
    pub fn on_request(
        &mut self,
        s: u64,
        id: u32,
        req: Request,
        mut fds: Vec<OwnedFd>,
        now: Instant,
    ) -> Vec<Out> {
        let mut out = Vec::new();
        let Some(sess) = self.sessions.get(&s) else {
            return out;
        };
        let hello_done = sess.hello;
        let pending = sess.pending();
        if !hello_done && !matches!(req, Request::Hello { .. }) {
            out.push(Out::Close {
                session: s,
                why: "request before Hello",
            });
            return out;
        }
        if !matches!(req, Request::Publish { .. }) && !fds.is_empty() {
            out.push(Out::Close {
                session: s,
                why: "unexpected fd",
            });
            return out;
        }
        let refuse = |out: &mut Vec<Out>, r: Refusal| {
            out.push(Out::Send {
                to: s,
                id,
                reply: Reply::Refused(r),
            })
        };
        let waits = matches!(
            req,
            Request::Listen { .. } | Request::Connect { .. } | Request::PeerConnect { .. }
        );
        if waits && pending >= self.limits.pending_per_session {
            log::warn!(
                "session {s}: {} refused: {pending} requests already waiting (limit {})",
                req.name(),
                self.limits.pending_per_session
            );
            refuse(&mut out, Refusal::Limit);
            return out;
        }
        match req {
            Request::Hello { version } => {
                let sess = self.sessions.get_mut(&s).unwrap();
                if sess.hello || version != proto::VERSION {
                    out.push(Out::Close {
                        session: s,
                        why: "bad Hello",
                    });
                } else {
                    sess.hello = true;
                    let cred = sess.cred;
                    let (mode, limits) = self.welcome_limits(cred);
                    out.push(Out::Send {
                        to: s,
                        id,
                        reply: Reply::Welcome {
                            session: s,
                            host: self.host.clone(),
                            name: self.name.clone(),
                            mode,
                            limits,
                        },
                    });
                }
            }
            Request::Publish { key } => {
                let l = self.limits;
                let sess = self.sessions.get(&s).unwrap();
                let cred = sess.cred;
                let held = sess.objects.len();
                let old = sess.objects.get(&key).map(|o| o.pinned);
                let by_uid = self.objects_by_uid.get(&cred.uid).copied().unwrap_or(0);
                if fds.len() != 1 {
                    out.push(Out::Close {
                        session: s,
                        why: "Publish without exactly one fd",
                    });
                    return out;
                }
                if old.is_none()
                    && (held >= l.objects_per_session
                        || by_uid >= l.objects_per_user
                        || self.objects_total >= l.objects_total)
                {
                    log::warn!(
                        "session {s}: Publish refused: it holds {held} fds (limit {}), its user {by_uid} (limit {}), all sessions {} (limit {})",
                        l.objects_per_session,
                        l.objects_per_user,
                        self.objects_total,
                        l.objects_total
                    );
                    refuse(&mut out, Refusal::Limit);
                    return out;
                }
                let fd = fds.pop().unwrap();
                let lock = match self.pin_arena(s, cred, &key, &fd, old.unwrap_or(0)) {
                    Ok(l) => l,
                    Err(r) => {
                        refuse(&mut out, r);
                        return out;
                    }
                };
                // The object it replaces (and its lock) goes first.
                self.drop_object(s, &key);
                let (lock, pinned) = match lock {
                    Some((m, b)) => (Some(m), b),
                    None => (None, 0),
                };
                if pinned > 0 {
                    self.pinned_total += pinned;
                    *self.pinned_by_uid.entry(cred.uid).or_default() += pinned;
                    *self.pinned_by_pid.entry(cred.pid).or_default() += pinned;
                }
                self.objects_total += 1;
                *self.objects_by_uid.entry(cred.uid).or_default() += 1;
                self.sessions.get_mut(&s).unwrap().objects.insert(
                    key,
                    Obj {
                        fd,
                        _lock: lock,
                        pinned,
                    },
                );
                out.push(Out::Send {
                    to: s,
                    id,
                    reply: Reply::Ok,
                });
            }
            Request::Retire { key } => self.drop_object(s, &key),
            Request::Fetch { session, key } => {
                let me = self.sessions[&s].cred.uid;
                let owner = self.sessions.get(&session).map(|x| x.cred.uid);
                // The TCP connection of a request offered to `s` (a granted
                // cross-user request over the sockets NIC): a socket, no
                // memory of the other user.
                let offered_stream = key.kind == ObjKind::Stream
                    && self.sessions[&s]
                        .offered
                        .iter()
                        .any(|c| self.connects.get(c).is_some_and(|c| c.session == session));
                if self.system.is_some() && owner.is_some_and(|u| u != me) && !offered_stream {
                    // Another user's memory: answered as for an object that
                    // does not exist (nothing is told about the other user).
                    log::warn!(
                        "session {s} (uid {me}) asked for {key:?} of session {session} (uid {}): refused",
                        owner.unwrap()
                    );
                    refuse(&mut out, Refusal::Gone);
                } else if self.object(session, &key).is_some() {
                    self.watch_owner(s, session);
                    out.push(Out::SendFd {
                        to: s,
                        id,
                        owner: session,
                        key,
                    });
                } else {
                    refuse(&mut out, Refusal::Gone);
                }
            }
            Request::Listen { local, timeout_ms } => {
                if !self.local_host(&local.host) {
                    refuse(&mut out, Refusal::NoMatch);
                    return out;
                }
                let uid = self.sessions[&s].cred.uid;
                let ns = (uid, local.discriminator.clone());
                let waiting = self.connect_q.get(&ns).and_then(|q| q.front().copied());
                if let Some(conn) = waiting {
                    unqueue(&mut self.connect_q, &ns, conn);
                    let c = self.connects.get_mut(&conn).unwrap();
                    c.state = ConnState::Offered { server: s };
                    c.offered_ever = true;
                    let (client, peer, remote) = (c.session, c.me.clone(), c.local.clone());
                    self.sessions.get_mut(&s).unwrap().offered.insert(conn);
                    self.watch(s, client);
                    out.push(Out::Send {
                        to: s,
                        id,
                        reply: Reply::Incoming { conn, peer, remote },
                    });
                } else {
                    let lid = self.id();
                    self.listen_q.entry(ns).or_default().push_back(lid);
                    self.listens.insert(
                        lid,
                        Listen {
                            session: s,
                            uid,
                            id,
                            local,
                        },
                    );
                    self.sessions.get_mut(&s).unwrap().listens.insert(lid);
                    self.timer(deadline(now, timeout_ms), Timer::Listen(lid));
                }
            }
            Request::Connect {
                me,
                local,
                remote,
                timeout_ms,
            } => {
                if me.session != s {
                    out.push(Out::Close {
                        session: s,
                        why: "endpoint of another session",
                    });
                } else if !self.local_host(&remote.host) {
                    refuse(&mut out, Refusal::NoMatch);
                } else if let Some(g) = self
                    .cross_user_grant(s, &remote.discriminator)
                    .filter(|_| !self.is_remote(s))
                {
                    // Allowed by the configuration, but the shared-memory
                    // NIC would map one user's memory into the other's
                    // process: only the sockets NIC, whose data path
                    // shares no memory, carries a cross-user connection.
                    log::warn!(
                        "session {s} (uid {}): connection to discriminator {:?} of uid {} is granted by the configuration, but not on the shared-memory NIC (it would share memory between the users): refused (VIP_REJECT); open a sockets NIC (via_<ifname>) for cross-user connections",
                        g.client_uid,
                        String::from_utf8_lossy(&remote.discriminator),
                        g.server_uid
                    );
                    refuse(&mut out, Refusal::Reject);
                } else {
                    let conn = self.id();
                    let d = deadline(now, timeout_ms);
                    // A granted request of another user over the sockets NIC
                    // waits for the listeners of the user it is granted to.
                    let uid = match self.cross_user_grant(s, &remote.discriminator) {
                        Some(g) => {
                            log::info!(
                                "session {s} (uid {}, over TCP): connection to discriminator {:?} of uid {} granted by the configuration",
                                g.client_uid,
                                String::from_utf8_lossy(&remote.discriminator),
                                g.server_uid
                            );
                            g.server_uid
                        }
                        None => self.sessions[&s].cred.uid,
                    };
                    self.connects.insert(
                        conn,
                        Connect {
                            session: s,
                            uid,
                            id,
                            me,
                            local,
                            remote,
                            state: ConnState::Waiting,
                            offered_ever: false,
                            deadline: d,
                        },
                    );
                    self.sessions.get_mut(&s).unwrap().connects.insert(conn);
                    self.timer(d, Timer::Connect(conn));
                    self.offer(conn, &mut out);
                }
            }
            Request::Accept { conn, me } => {
                if me.session != s {
                    out.push(Out::Close {
                        session: s,
                        why: "endpoint of another session",
                    });
                    return out;
                }
                match self.connects.get(&conn) {
                    Some(c) if matches!(c.state, ConnState::Offered { server } if server == s) => {
                        let c = self.remove_connect(conn).unwrap();
                        self.link(&c.me, &me);
                        out.push(Out::Send {
                            to: c.session,
                            id: c.id,
                            reply: Reply::Connected { peer: me },
                        });
                        out.push(Out::Send {
                            to: s,
                            id,
                            reply: Reply::Ok,
                        });
                    }
                    _ => refuse(&mut out, Refusal::Gone),
                }
            }
            Request::Reject { conn, reason } => match self.connects.get(&conn) {
                Some(c) if matches!(c.state, ConnState::Offered { server } if server == s) => {
                    let c = self.remove_connect(conn).unwrap();
                    let reason = match reason {
                        Refusal::Reliability => Refusal::Reliability,
                        _ => Refusal::Reject,
                    };
                    out.push(Out::Send {
                        to: c.session,
                        id: c.id,
                        reply: Reply::Refused(reason),
                    });
                    out.push(Out::Send {
                        to: s,
                        id,
                        reply: Reply::Ok,
                    });
                }
                _ => refuse(&mut out, Refusal::Gone),
            },
            Request::PeerConnect {
                me,
                local,
                remote,
                timeout_ms,
            } => {
                if me.session != s {
                    out.push(Out::Close {
                        session: s,
                        why: "endpoint of another session",
                    });
                    return out;
                }
                // A sockets NIC's request (its own address is a TCP host of
                // ours) waits for its peer's request from the network.
                if !self.local_host(&remote.host) && !self.tcp_hosts.contains(&local.host) {
                    refuse(&mut out, Refusal::NoMatch);
                    return out;
                }
                // The other side waits under (its local, its remote) = (our
                // remote, our local); not the same VI.
                let uid = self.sessions[&s].cred.uid;
                let key = (
                    uid,
                    remote.discriminator.clone(),
                    local.discriminator.clone(),
                );
                let found = self.peer_q.get(&key).and_then(|q| {
                    q.iter().copied().find(|pid| {
                        let p = &self.peers[pid];
                        !(p.me.session == me.session && p.me.nic == me.nic && p.me.vi == me.vi)
                    })
                });
                if let Some(pid) = found {
                    let p = self.remove_peer(pid).unwrap();
                    if p.me.reliability != me.reliability {
                        out.push(Out::Send {
                            to: p.session,
                            id: p.id,
                            reply: Reply::Refused(Refusal::Reliability),
                        });
                        refuse(&mut out, Refusal::Reliability);
                    } else {
                        self.link(&p.me, &me);
                        out.push(Out::Send {
                            to: p.session,
                            id: p.id,
                            reply: Reply::Connected { peer: me },
                        });
                        out.push(Out::Send {
                            to: s,
                            id,
                            reply: Reply::Connected { peer: p.me },
                        });
                    }
                } else {
                    let pid = self.id();
                    let key = (
                        uid,
                        local.discriminator.clone(),
                        remote.discriminator.clone(),
                    );
                    self.peer_q.entry(key).or_default().push_back(pid);
                    self.peers.insert(
                        pid,
                        PeerReq {
                            session: s,
                            uid,
                            id,
                            me,
                            local,
                            remote,
                        },
                    );
                    self.sessions.get_mut(&s).unwrap().peers.insert(pid);
                    self.timer(deadline(now, timeout_ms), Timer::Peer(pid));
                }
            }
            Request::Disconnect { peer, me, reason } => {
                let crossing = reason != proto::REASON_CONN_LOST
                    && self.crossed.get(&vi_key(&me)) == Some(&vi_key(&peer));
                if me.session != s {
                    out.push(Out::Close {
                        session: s,
                        why: "endpoint of another session",
                    });
                } else if !self.sessions.contains_key(&peer.session) {
                    // The peer is gone already: nothing to wait for.
                    out.push(Out::Send {
                        to: s,
                        id,
                        reply: Reply::Ok,
                    });
                } else if !crossing && self.links.get(&vi_key(&me)) != Some(&vi_key(&peer)) {
                    // Not a connection of the sender's VI: nothing to relay.
                    log::warn!("session {s}: disconnect of a VI it is not connected to");
                    refuse(&mut out, Refusal::Invalid);
                } else {
                    if crossing {
                        // The peer's own disconnect came first; its side
                        // still hears this one's reason.
                        self.crossed.remove(&vi_key(&me));
                    } else {
                        self.unlink_vi(&vi_key(&me));
                        self.crossed.insert(vi_key(&peer), vi_key(&me));
                    }
                    let token = self.id();
                    out.push(Out::Send {
                        to: peer.session,
                        id: 0,
                        reply: Reply::RemoteDisconnect {
                            me: peer.clone(),
                            token,
                            reason,
                        },
                    });
                    self.discs.insert(
                        token,
                        Disc {
                            session: s,
                            id,
                            target: peer.session,
                        },
                    );
                    for x in [s, peer.session] {
                        self.sessions.get_mut(&x).unwrap().discs.insert(token);
                    }
                    self.timer(Some(now + DISCONNECT_ACK), Timer::Disc(token));
                }
            }
            Request::DisconnectAck { token } => {
                if self.discs.get(&token).is_some_and(|d| d.target == s) {
                    let d = self.remove_disc(token).unwrap();
                    out.push(Out::Send {
                        to: d.session,
                        id: d.id,
                        reply: Reply::Ok,
                    });
                }
            }
            Request::ResolveName { name } => {
                let n = name.trim_end_matches('.');
                let host = if n == self.name || n == "localhost" || n.is_empty() {
                    Some(self.host.clone())
                } else {
                    self.hosts
                        .iter()
                        .find(|(h, _)| h == n)
                        .map(|(_, a)| a.clone())
                };
                match host {
                    Some(host) => out.push(Out::Send {
                        to: s,
                        id,
                        reply: Reply::Address { host },
                    }),
                    None => refuse(&mut out, Refusal::NameService),
                }
            }
            Request::OpenTcp { host } => {
                if host.len() != 4 {
                    refuse(&mut out, Refusal::Invalid);
                } else {
                    out.push(Out::OpenTcp { to: s, id, host });
                }
            }
            Request::ResolveAddr { host } => {
                let name = if host == self.host {
                    Some(self.name.clone())
                } else {
                    self.hosts
                        .iter()
                        .find(|(_, a)| *a == host)
                        .map(|(n, _)| n.clone())
                };
                match name {
                    Some(name) => out.push(Out::Send {
                        to: s,
                        id,
                        reply: Reply::Name { name },
                    }),
                    None => refuse(&mut out, Refusal::NameService),
                }
            }
        }
        out
    }

    /// Offers waiting connect `conn` to the oldest listener of its
    /// discriminator, if any; else queues it.
    fn offer(&mut self, conn: u64, out: &mut Vec<Out>) {
        let c = &self.connects[&conn];
        let disc = (c.uid, c.remote.discriminator.clone());
        let lid = self.listen_q.get(&disc).and_then(|q| q.front().copied());
        let Some(lid) = lid else {
            self.connect_q.entry(disc).or_default().push_back(conn);
            return;
        };
        let l = self.remove_listen(lid).unwrap();
        let c = self.connects.get_mut(&conn).unwrap();
        c.state = ConnState::Offered { server: l.session };
        c.offered_ever = true;
        let (client, peer, remote) = (c.session, c.me.clone(), c.local.clone());
        if let Some(srv) = self.sessions.get_mut(&l.session) {
            srv.offered.insert(conn);
        }
        self.watch(l.session, client);
        out.push(Out::Send {
            to: l.session,
            id: l.id,
            reply: Reply::Incoming { conn, peer, remote },
        });
    }

    /// Expires deadlines.
    pub fn on_tick(&mut self, now: Instant) -> Vec<Out> {
        let mut out = Vec::new();
        while let Some(Reverse((at, t))) = self.timers.peek().copied() {
            if at > now {
                break;
            }
            self.timers.pop();
            // A waiter past its deadline is answered and dropped.
            let answer = |out: &mut Vec<Out>, session: u64, id: u32, r: Refusal| {
                out.push(Out::Send {
                    to: session,
                    id,
                    reply: Reply::Refused(r),
                })
            };
            match t {
                Timer::Listen(lid) => {
                    if let Some(l) = self.remove_listen(lid) {
                        answer(&mut out, l.session, l.id, Refusal::Timeout);
                    }
                }
                Timer::Connect(conn) => {
                    if self.connects.get(&conn).and_then(|c| c.deadline) != Some(at) {
                        continue;
                    }
                    let c = self.remove_connect(conn).unwrap();
                    // Nobody ever listened: the legacy answer, NO_MATCH (a
                    // program retries on it). A listener took it but did not
                    // accept in time: TIMEOUT.
                    let r = if c.offered_ever {
                        Refusal::Timeout
                    } else {
                        Refusal::NoMatch
                    };
                    answer(&mut out, c.session, c.id, r);
                }
                Timer::Peer(pid) => {
                    if let Some(p) = self.remove_peer(pid) {
                        answer(&mut out, p.session, p.id, Refusal::Timeout);
                    }
                }
                Timer::Disc(token) => {
                    if let Some(d) = self.remove_disc(token) {
                        log::warn!(
                            "session {} did not acknowledge a disconnect in time",
                            d.target
                        );
                        out.push(Out::Send {
                            to: d.session,
                            id: d.id,
                            reply: Reply::Ok,
                        });
                    }
                }
            }
        }
        out
    }

    /// The earliest pending deadline (possibly of a request settled
    /// since: the loop then wakes once for nothing).
    pub fn next_deadline(&self) -> Option<Instant> {
        self.timers.peek().map(|Reverse((at, _))| *at)
    }

    /// The process of session `s` is gone: release everything it held and
    /// tell the sessions that depended on it.
    pub fn on_death(&mut self, s: u64) -> Vec<Out> {
        let mut out = Vec::new();
        let keys: Vec<ObjKey> = match self.sessions.get(&s) {
            Some(x) => x.objects.keys().copied().collect(),
            None => return out,
        };
        for k in &keys {
            self.drop_object(s, k);
        }
        let Some(sess) = self.sessions.remove(&s) else {
            return out;
        };
        for lid in &sess.listens {
            self.remove_listen(*lid);
        }
        for pid in &sess.peers {
            self.remove_peer(*pid);
        }
        for conn in &sess.connects {
            self.remove_connect(*conn);
        }
        for k in &sess.vis {
            self.unlink_vi(k);
        }
        self.crossed.retain(|k, v| k.0 != s && v.0 != s);
        // Requests offered to the dead server go back to waiting.
        for &conn in &sess.offered {
            if let Some(c) = self.connects.get_mut(&conn) {
                c.state = ConnState::Waiting;
                self.offer(conn, &mut out);
            }
        }
        for &token in &sess.discs {
            if let Some(d) = self.remove_disc(token) {
                if d.target == s {
                    out.push(Out::Send {
                        to: d.session,
                        id: d.id,
                        reply: Reply::Ok,
                    });
                }
            }
        }
        for &w in &sess.watching {
            if let Some(x) = self.sessions.get_mut(&w) {
                x.watchers.remove(&s);
            }
        }
        for &w in &sess.watchers {
            if let Some(x) = self.sessions.get_mut(&w) {
                x.watching.remove(&s);
                out.push(Out::Send {
                    to: w,
                    id: 0,
                    reply: Reply::PeerDied { session: s },
                });
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(d: &str) -> NetAddr {
        NetAddr {
            host: vec![],
            discriminator: d.as_bytes().to_vec(),
        }
    }

    fn ep(s: u64, vi: u32, rel: u32) -> Endpoint {
        Endpoint {
            session: s,
            vi,
            reliability: rel,
            ..Endpoint::default()
        }
    }

    fn hello(b: &mut Broker) -> u64 {
        hello_as(b, 1000, 4000)
    }

    /// A session of `uid` and `pid` that has said Hello.
    fn hello_as(b: &mut Broker, uid: u32, pid: i32) -> u64 {
        let s = b.open_session(Cred { uid, pid });
        b.on_request(
            s,
            1,
            Request::Hello {
                version: proto::VERSION,
            },
            vec![],
            Instant::now(),
        );
        s
    }

    fn replies(out: &[Out]) -> Vec<(u64, u32, Reply)> {
        out.iter()
            .filter_map(|o| match o {
                Out::Send { to, id, reply } => Some((*to, *id, reply.clone())),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn request_before_hello_closes() {
        let mut b = Broker::new(vec![1], "h".into(), vec![]);
        let s = b.open_session(Cred { uid: 1, pid: 1 });
        let out = b.on_request(
            s,
            1,
            Request::ResolveName { name: "h".into() },
            vec![],
            Instant::now(),
        );
        assert!(matches!(out[0], Out::Close { .. }));
    }

    #[test]
    fn client_server_match_either_order() {
        let now = Instant::now();
        for listen_first in [true, false] {
            let mut b = Broker::new(vec![1], "h".into(), vec![]);
            let srv = hello(&mut b);
            let cli = hello(&mut b);
            let listen = Request::Listen {
                local: addr("d"),
                timeout_ms: 1000,
            };
            let connect = Request::Connect {
                me: ep(cli, 3, 2),
                local: addr("c"),
                remote: addr("d"),
                timeout_ms: 1000,
            };
            let out = if listen_first {
                assert!(b.on_request(srv, 5, listen, vec![], now).is_empty());
                b.on_request(cli, 6, connect, vec![], now)
            } else {
                assert!(b.on_request(cli, 6, connect, vec![], now).is_empty());
                b.on_request(srv, 5, listen, vec![], now)
            };
            let r = replies(&out);
            assert_eq!(r.len(), 1);
            let (to, id, Reply::Incoming { conn, peer, remote }) = r[0].clone() else {
                panic!("{r:?}")
            };
            assert_eq!((to, id, peer.vi, remote), (srv, 5, 3, addr("c")));
            let out = b.on_request(
                srv,
                7,
                Request::Accept {
                    conn,
                    me: ep(srv, 9, 2),
                },
                vec![],
                now,
            );
            let r = replies(&out);
            assert!(r.contains(&(
                cli,
                6,
                Reply::Connected {
                    peer: ep(srv, 9, 2)
                }
            )));
            assert!(r.contains(&(srv, 7, Reply::Ok)));
            // A second accept of the same handle is refused.
            let out = b.on_request(
                srv,
                8,
                Request::Accept {
                    conn,
                    me: ep(srv, 9, 2),
                },
                vec![],
                now,
            );
            assert_eq!(replies(&out), vec![(srv, 8, Reply::Refused(Refusal::Gone))]);
        }
    }

    #[test]
    fn timeouts_and_rejects() {
        let now = Instant::now();
        let mut b = Broker::new(vec![1], "h".into(), vec![]);
        let cli = hello(&mut b);
        let c = Request::Connect {
            me: ep(cli, 3, 2),
            local: addr("c"),
            remote: addr("nobody"),
            timeout_ms: 50,
        };
        assert!(b.on_request(cli, 2, c, vec![], now).is_empty());
        assert_eq!(b.next_deadline(), Some(now + Duration::from_millis(50)));
        assert!(b.on_tick(now + Duration::from_millis(49)).is_empty());
        // Nobody ever listened: NO_MATCH (legacy programs retry on it).
        let out = b.on_tick(now + Duration::from_millis(50));
        assert_eq!(
            replies(&out),
            vec![(cli, 2, Reply::Refused(Refusal::NoMatch))]
        );
        // A listener took it and did not answer in time: TIMEOUT.
        let l = hello(&mut b);
        b.on_request(
            l,
            9,
            Request::Listen {
                local: addr("slow"),
                timeout_ms: proto::INFINITE,
            },
            vec![],
            now,
        );
        let c = Request::Connect {
            me: ep(cli, 3, 2),
            local: addr("c"),
            remote: addr("slow"),
            timeout_ms: 50,
        };
        assert_eq!(replies(&b.on_request(cli, 10, c, vec![], now))[0].0, l);
        let out = b.on_tick(now + Duration::from_millis(50));
        assert_eq!(
            replies(&out),
            vec![(cli, 10, Reply::Refused(Refusal::Timeout))]
        );

        let srv = hello(&mut b);
        b.on_request(
            srv,
            3,
            Request::Listen {
                local: addr("d"),
                timeout_ms: proto::INFINITE,
            },
            vec![],
            now,
        );
        let out = b.on_request(
            cli,
            4,
            Request::Connect {
                me: ep(cli, 3, 2),
                local: addr("c"),
                remote: addr("d"),
                timeout_ms: proto::INFINITE,
            },
            vec![],
            now,
        );
        let Reply::Incoming { conn, .. } = replies(&out)[0].2.clone() else {
            panic!()
        };
        let out = b.on_request(
            srv,
            5,
            Request::Reject {
                conn,
                reason: Refusal::Reject,
            },
            vec![],
            now,
        );
        assert!(replies(&out).contains(&(cli, 4, Reply::Refused(Refusal::Reject))));
    }

    #[test]
    fn remote_host_elsewhere_is_no_match() {
        let mut b = Broker::new(vec![1], "h".into(), vec![]);
        let cli = hello(&mut b);
        let out = b.on_request(
            cli,
            2,
            Request::Connect {
                me: ep(cli, 1, 2),
                local: addr("c"),
                remote: NetAddr {
                    host: vec![9, 9],
                    discriminator: b"d".to_vec(),
                },
                timeout_ms: 10,
            },
            vec![],
            Instant::now(),
        );
        assert_eq!(
            replies(&out),
            vec![(cli, 2, Reply::Refused(Refusal::NoMatch))]
        );
    }

    #[test]
    fn peer_to_peer_and_reliability_mismatch() {
        let now = Instant::now();
        let mut b = Broker::new(vec![1], "h".into(), vec![]);
        let a = hello(&mut b);
        let c = hello(&mut b);
        let req = |s, rel, l: &str, r: &str| Request::PeerConnect {
            me: ep(s, 1, rel),
            local: addr(l),
            remote: addr(r),
            timeout_ms: 1000,
        };
        assert!(
            b.on_request(a, 2, req(a, 2, "a", "c"), vec![], now)
                .is_empty()
        );
        let out = b.on_request(c, 3, req(c, 2, "c", "a"), vec![], now);
        let r = replies(&out);
        assert!(r.contains(&(a, 2, Reply::Connected { peer: ep(c, 1, 2) })));
        assert!(r.contains(&(c, 3, Reply::Connected { peer: ep(a, 1, 2) })));

        assert!(
            b.on_request(a, 4, req(a, 2, "a2", "c2"), vec![], now)
                .is_empty()
        );
        let out = b.on_request(c, 5, req(c, 4, "c2", "a2"), vec![], now);
        let r = replies(&out);
        assert!(r.contains(&(a, 4, Reply::Refused(Refusal::Reliability))));
        assert!(r.contains(&(c, 5, Reply::Refused(Refusal::Reliability))));
    }

    #[test]
    fn death_requeues_and_broadcasts() {
        let now = Instant::now();
        let mut b = Broker::new(vec![1], "h".into(), vec![]);
        let srv1 = hello(&mut b);
        let srv2 = hello(&mut b);
        let cli = hello(&mut b);
        b.on_request(
            srv1,
            2,
            Request::Listen {
                local: addr("d"),
                timeout_ms: proto::INFINITE,
            },
            vec![],
            now,
        );
        let out = b.on_request(
            cli,
            3,
            Request::Connect {
                me: ep(cli, 1, 2),
                local: addr("c"),
                remote: addr("d"),
                timeout_ms: proto::INFINITE,
            },
            vec![],
            now,
        );
        assert_eq!(replies(&out)[0].0, srv1);
        b.on_request(
            srv2,
            4,
            Request::Listen {
                local: addr("d"),
                timeout_ms: proto::INFINITE,
            },
            vec![],
            now,
        );
        let out = b.on_death(srv1);
        let r = replies(&out);
        assert!(
            r.iter().any(|(to, id, rep)| *to == srv2
                && *id == 4
                && matches!(rep, Reply::Incoming { .. }))
        );
        // The client had a connection pending with srv1: it hears of the
        // death; srv2 never dealt with srv1: it does not.
        assert!(r.contains(&(cli, 0, Reply::PeerDied { session: srv1 })));
        assert!(!r.contains(&(srv2, 0, Reply::PeerDied { session: srv1 })));
        assert_eq!(b.sessions(), 2);
    }

    fn key(id: u32) -> ObjKey {
        ObjKey {
            kind: proto::ObjKind::Arena,
            nic: 0,
            id,
            generation: 0,
        }
    }

    fn memfd() -> OwnedFd {
        via_sys::memfd_create("viad-test").unwrap()
    }

    /// A death goes to the sessions that fetched an object of the dead one
    /// or were connected to it, and to nobody else.
    #[test]
    fn death_goes_to_dependents_only() {
        let now = Instant::now();
        let mut b = Broker::new(vec![1], "h".into(), vec![]);
        let dead = hello(&mut b);
        let fetcher = hello(&mut b);
        let linked = hello(&mut b);
        let bystanders: Vec<u64> = (0..50).map(|_| hello(&mut b)).collect();
        b.on_request(
            dead,
            2,
            Request::Publish { key: key(1) },
            vec![memfd()],
            now,
        );
        let out = b.on_request(
            fetcher,
            3,
            Request::Fetch {
                session: dead,
                key: key(1),
            },
            vec![],
            now,
        );
        assert!(matches!(out[0], Out::SendFd { .. }));
        connect(&mut b, linked, dead, "x");
        let out = b.on_death(dead);
        let mut told: Vec<u64> = replies(&out)
            .into_iter()
            .filter(|(_, _, r)| *r == Reply::PeerDied { session: dead })
            .map(|(to, _, _)| to)
            .collect();
        told.sort();
        assert_eq!(told, vec![fetcher, linked]);
        assert!(bystanders.iter().all(|s| !told.contains(s)));
        assert_eq!(b.objects_total(), 0);
        // A dead fetcher is forgotten by what it watched.
        let owner = hello(&mut b);
        b.on_request(
            owner,
            2,
            Request::Publish { key: key(1) },
            vec![memfd()],
            now,
        );
        b.on_request(
            fetcher,
            4,
            Request::Fetch {
                session: owner,
                key: key(1),
            },
            vec![],
            now,
        );
        b.on_death(fetcher);
        assert!(replies(&b.on_death(owner)).is_empty());
    }

    /// Beyond its limits a session is refused (`Limit`), and keeps working.
    #[test]
    fn limits_refuse_cleanly() {
        let now = Instant::now();
        let mut b = Broker::new(vec![1], "h".into(), vec![]);
        b.set_limits(Limits {
            objects_per_session: 3,
            objects_total: 5,
            pending_per_session: 2,
            objects_per_user: 100,
        });
        let a = hello(&mut b);
        let c = hello(&mut b);
        let publish = |b: &mut Broker, s, k| {
            replies(&b.on_request(s, 7, Request::Publish { key: key(k) }, vec![memfd()], now))
        };
        for k in 0..3 {
            assert_eq!(publish(&mut b, a, k), vec![(a, 7, Reply::Ok)]);
        }
        assert_eq!(
            publish(&mut b, a, 3),
            vec![(a, 7, Reply::Refused(Refusal::Limit))]
        );
        // Replacing an object is not a new one.
        assert_eq!(publish(&mut b, a, 0), vec![(a, 7, Reply::Ok)]);
        // The total bound.
        assert_eq!(publish(&mut b, c, 0), vec![(c, 7, Reply::Ok)]);
        assert_eq!(publish(&mut b, c, 1), vec![(c, 7, Reply::Ok)]);
        assert_eq!(
            publish(&mut b, c, 2),
            vec![(c, 7, Reply::Refused(Refusal::Limit))]
        );
        b.on_request(a, 0, Request::Retire { key: key(1) }, vec![], now);
        assert_eq!(publish(&mut b, c, 2), vec![(c, 7, Reply::Ok)]);
        // Waiting requests.
        let listen = |d: &str| Request::Listen {
            local: addr(d),
            timeout_ms: proto::INFINITE,
        };
        assert!(b.on_request(a, 8, listen("l1"), vec![], now).is_empty());
        assert!(b.on_request(a, 9, listen("l2"), vec![], now).is_empty());
        assert_eq!(
            replies(&b.on_request(a, 10, listen("l3"), vec![], now)),
            vec![(a, 10, Reply::Refused(Refusal::Limit))]
        );
        // Still served otherwise.
        let r = replies(&b.on_request(
            a,
            11,
            Request::ResolveName { name: "h".into() },
            vec![],
            now,
        ));
        assert_eq!(r, vec![(a, 11, Reply::Address { host: vec![1] })]);
    }

    /// Matching and expiry do not cost time in proportion to everything
    /// waiting: 60,000 listens, each matched by a connect, then 60,000
    /// expiring at once, well within a second each on a loaded machine
    /// (the linear scans took 25 s).
    #[test]
    fn matching_scales() {
        let now = Instant::now();
        let mut b = Broker::new(vec![1], "h".into(), vec![]);
        let n = 60_000;
        let sessions: Vec<u64> = (0..64).map(|_| hello(&mut b)).collect();
        let t0 = Instant::now();
        for i in 0..n {
            let s = sessions[i % 64];
            let l = Request::Listen {
                local: addr(&format!("d{i}")),
                timeout_ms: 1000,
            };
            assert!(b.on_request(s, 1, l, vec![], now).is_empty());
        }
        for i in 0..n {
            let s = sessions[(i + 1) % 64];
            let c = Request::Connect {
                me: ep(s, 1, 2),
                local: addr("c"),
                remote: addr(&format!("d{i}")),
                timeout_ms: 1000,
            };
            assert_eq!(b.on_request(s, 2, c, vec![], now).len(), 1);
        }
        let matched = t0.elapsed();
        for i in 0..n {
            let s = sessions[i % 64];
            let l = Request::Listen {
                local: addr(&format!("e{i}")),
                timeout_ms: 10,
            };
            b.on_request(s, 3, l, vec![], now);
        }
        let t1 = Instant::now();
        let out = b.on_tick(now + Duration::from_millis(10));
        let expired = t1.elapsed();
        eprintln!(
            "{n} listens matched in {matched:?}, {} expired in {expired:?}",
            out.len()
        );
        assert_eq!(out.len(), n);
        assert!(matched < Duration::from_secs(10), "{matched:?}");
        assert!(expired < Duration::from_secs(5), "{expired:?}");
    }

    /// Connects VI 1 of `a` (client) and VI 1 of `c` (server) through `b`.
    fn connect(b: &mut Broker, a: u64, c: u64, d: &str) {
        let now = Instant::now();
        let listen = Request::Listen {
            local: addr(d),
            timeout_ms: 1000,
        };
        b.on_request(c, 90, listen, vec![], now);
        let req = Request::Connect {
            me: ep(a, 1, 2),
            local: addr("c"),
            remote: addr(d),
            timeout_ms: 1000,
        };
        let out = b.on_request(a, 91, req, vec![], now);
        let Reply::Incoming { conn, .. } = replies(&out)[0].2.clone() else {
            panic!()
        };
        let accept = Request::Accept {
            conn,
            me: ep(c, 1, 2),
        };
        b.on_request(c, 92, accept, vec![], now);
    }

    /// A broker with sessions `a` and `c` connected (VI 1 each) and a third,
    /// `x`.
    fn two_connected_and_a_third() -> (Broker, u64, u64, u64) {
        let mut b = Broker::new(vec![1], "h".into(), vec![]);
        let a = hello(&mut b);
        let c = hello(&mut b);
        let x = hello(&mut b);
        connect(&mut b, a, c, "d");
        (b, a, c, x)
    }

    #[test]
    fn disconnect_only_along_a_connection() {
        let now = Instant::now();
        let (mut b, a, c, x) = two_connected_and_a_third();
        let disc = |peer, me| Request::Disconnect {
            peer,
            me,
            reason: proto::REASON_CONN_LOST,
        };
        // A third session names c's VI: refused, nothing relayed.
        let out = b.on_request(x, 2, disc(ep(c, 1, 2), ep(x, 1, 2)), vec![], now);
        assert_eq!(
            replies(&out),
            vec![(x, 2, Reply::Refused(Refusal::Invalid))]
        );
        // So is a when it names another VI of c.
        let out = b.on_request(a, 3, disc(ep(c, 2, 2), ep(a, 1, 2)), vec![], now);
        assert_eq!(
            replies(&out),
            vec![(a, 3, Reply::Refused(Refusal::Invalid))]
        );
        // The real peer is relayed, once.
        let out = b.on_request(a, 4, disc(ep(c, 1, 2), ep(a, 1, 2)), vec![], now);
        assert!(matches!(replies(&out)[0], (to, 0, Reply::RemoteDisconnect { .. }) if to == c));
        let out = b.on_request(c, 5, disc(ep(a, 1, 2), ep(c, 1, 2)), vec![], now);
        assert_eq!(
            replies(&out),
            vec![(c, 5, Reply::Refused(Refusal::Invalid))]
        );
        // Peer-to-peer connections count too; a death forgets its links.
        let req = |s, l: &str, r: &str| Request::PeerConnect {
            me: ep(s, 7, 2),
            local: addr(l),
            remote: addr(r),
            timeout_ms: 1000,
        };
        b.on_request(a, 6, req(a, "pa", "pc"), vec![], now);
        b.on_request(c, 7, req(c, "pc", "pa"), vec![], now);
        assert_eq!(b.links.len(), 2);
        b.on_death(c);
        assert!(b.links.is_empty());
    }

    #[test]
    fn disconnect_waits_for_ack_or_deadline() {
        let now = Instant::now();
        let mut b = Broker::new(vec![1], "h".into(), vec![]);
        let a = hello(&mut b);
        let c = hello(&mut b);
        connect(&mut b, a, c, "d1");
        let out = b.on_request(
            a,
            2,
            Request::Disconnect {
                peer: ep(c, 1, 2),
                me: ep(a, 1, 2),
                reason: proto::REASON_CONN_LOST,
            },
            vec![],
            now,
        );
        let r = replies(&out);
        let (to, 0, Reply::RemoteDisconnect { token, .. }) = r[0].clone() else {
            panic!()
        };
        assert_eq!(to, c);
        // An ack from the wrong session is ignored.
        assert!(
            b.on_request(a, 0, Request::DisconnectAck { token }, vec![], now)
                .is_empty()
        );
        let out = b.on_request(c, 0, Request::DisconnectAck { token }, vec![], now);
        assert_eq!(replies(&out), vec![(a, 2, Reply::Ok)]);
        // No ack: the deadline answers.
        connect(&mut b, a, c, "d2");
        b.on_request(
            a,
            3,
            Request::Disconnect {
                peer: ep(c, 1, 2),
                me: ep(a, 1, 2),
                reason: proto::REASON_CONN_LOST,
            },
            vec![],
            now,
        );
        let out = b.on_tick(now + DISCONNECT_ACK);
        assert_eq!(replies(&out), vec![(a, 3, Reply::Ok)]);
    }

    #[test]
    fn a_crossing_disconnect_relays_its_reason_once() {
        // The verbs kind: c's QP broke by itself (its disconnect comes
        // first), while a saw why (an RDMA violation at c) and says so.
        let now = Instant::now();
        let (mut b, a, c, x) = two_connected_and_a_third();
        let disc = |peer, me, reason| Request::Disconnect { peer, me, reason };
        let out = b.on_request(
            c,
            2,
            disc(ep(a, 1, 2), ep(c, 1, 2), proto::REASON_CONN_LOST),
            vec![],
            now,
        );
        assert!(matches!(replies(&out)[0], (to, 0, Reply::RemoteDisconnect { .. }) if to == a));
        // A third session cannot use the dissolved connection.
        let out = b.on_request(x, 3, disc(ep(c, 1, 2), ep(x, 1, 2), 4), vec![], now);
        assert_eq!(
            replies(&out),
            vec![(x, 3, Reply::Refused(Refusal::Invalid))]
        );
        // A plain crossing disconnect has nothing to add: refused as before.
        let out = b.on_request(
            a,
            4,
            disc(ep(c, 1, 2), ep(a, 1, 2), proto::REASON_CONN_LOST),
            vec![],
            now,
        );
        assert_eq!(
            replies(&out),
            vec![(a, 4, Reply::Refused(Refusal::Invalid))]
        );
        // One with a reason reaches c, carrying it, once.
        let out = b.on_request(a, 5, disc(ep(c, 1, 2), ep(a, 1, 2), 4), vec![], now);
        let r = replies(&out);
        let (to, 0, Reply::RemoteDisconnect { me, token, reason }) = r[0].clone() else {
            panic!("{r:?}")
        };
        assert_eq!((to, me, reason), (c, ep(c, 1, 2), 4));
        let out = b.on_request(c, 0, Request::DisconnectAck { token }, vec![], now);
        assert_eq!(replies(&out), vec![(a, 5, Reply::Ok)]);
        let out = b.on_request(a, 6, disc(ep(c, 1, 2), ep(a, 1, 2), 4), vec![], now);
        assert_eq!(
            replies(&out),
            vec![(a, 6, Reply::Refused(Refusal::Invalid))]
        );
        // Linked again, a crossing left over is forgotten: a reason meant
        // for the old connection cannot reach the new one.
        connect(&mut b, a, c, "d2");
        b.on_request(c, 7, disc(ep(a, 1, 2), ep(c, 1, 2), 1), vec![], now);
        assert_eq!(b.crossed.len(), 1);
        connect(&mut b, a, c, "d3");
        assert!(b.crossed.is_empty());
        // And a death forgets the crossings of its session.
        b.on_request(a, 8, disc(ep(c, 1, 2), ep(a, 1, 2), 1), vec![], now);
        assert_eq!(b.crossed.len(), 1);
        b.on_death(c);
        assert!(b.crossed.is_empty());
    }

    #[test]
    fn spoofed_endpoint_closes() {
        let mut b = Broker::new(vec![1], "h".into(), vec![]);
        let a = hello(&mut b);
        let out = b.on_request(
            a,
            2,
            Request::PeerConnect {
                me: ep(a + 100, 1, 2),
                local: addr("x"),
                remote: addr("y"),
                timeout_ms: 1,
            },
            vec![],
            Instant::now(),
        );
        assert!(matches!(out[0], Out::Close { .. }));
    }

    const A: u32 = 1000;
    const B: u32 = 1001;

    fn system(quota: Quota, total: u64, grants: Vec<Grant>) -> Broker {
        let mut b = Broker::new(vec![1], "h".into(), vec![]);
        b.set_system(SystemPolicy {
            quota,
            users: HashMap::new(),
            total,
            grants,
        });
        b
    }

    fn unlimited() -> Quota {
        Quota {
            per_process: proto::UNLIMITED,
            per_user: proto::UNLIMITED,
        }
    }

    fn listen(b: &mut Broker, s: u64, id: u32, d: &str, ms: u32) -> Vec<(u64, u32, Reply)> {
        let req = Request::Listen {
            local: addr(d),
            timeout_ms: ms,
        };
        replies(&b.on_request(s, id, req, vec![], Instant::now()))
    }

    fn connect_req(b: &mut Broker, s: u64, id: u32, d: &str, ms: u32) -> Vec<(u64, u32, Reply)> {
        let req = Request::Connect {
            me: ep(s, 1, 2),
            local: addr("c"),
            remote: addr(d),
            timeout_ms: ms,
        };
        replies(&b.on_request(s, id, req, vec![], Instant::now()))
    }

    /// A request from another host (a remote session) reaches a listener
    /// on a sockets NIC's address, hands its connection over by `Fetch`,
    /// and its end is nobody's peer death; a peer request of a sockets NIC
    /// waits for a remote host's request instead of `NoMatch`.
    #[test]
    fn remote_sessions_from_other_hosts() {
        let mut b = Broker::new(vec![1; 6], "h".into(), vec![]);
        let ip = vec![10, 0, 0, 2];
        let there = NetAddr {
            host: ip.clone(),
            discriminator: b"srv".to_vec(),
        };
        let server = hello(&mut b);
        // Not a local address until a sockets NIC opened the listener.
        let r = replies(&b.on_request(
            server,
            2,
            Request::Listen {
                local: there.clone(),
                timeout_ms: 1000,
            },
            vec![],
            Instant::now(),
        ));
        assert_eq!(r, vec![(server, 2, Reply::Refused(Refusal::NoMatch))]);
        let out = b.on_request(
            server,
            3,
            Request::OpenTcp { host: ip.clone() },
            vec![],
            Instant::now(),
        );
        assert!(matches!(out[..], [Out::OpenTcp { to, id: 3, .. }] if to == server));
        b.add_tcp_host(ip.clone());
        assert!(
            b.on_request(
                server,
                4,
                Request::Listen {
                    local: there.clone(),
                    timeout_ms: 1000,
                },
                vec![],
                Instant::now(),
            )
            .is_empty()
        );
        let remote = b.open_remote_session(Cred { uid: 1000, pid: 0 });
        assert!(b.said_hello(remote));
        let key = ObjKey {
            kind: ObjKind::Stream,
            nic: 0,
            id: 0,
            generation: 0,
        };
        b.on_request(
            remote,
            1,
            Request::Publish { key },
            vec![memfd()],
            Instant::now(),
        );
        let r = replies(&b.on_request(
            remote,
            2,
            Request::Connect {
                me: ep(remote, 0, 2),
                local: NetAddr {
                    host: vec![10, 0, 0, 1],
                    discriminator: b"cli".to_vec(),
                },
                remote: there.clone(),
                timeout_ms: 1000,
            },
            vec![],
            Instant::now(),
        ));
        let conn = match &r[..] {
            [(to, 4, Reply::Incoming { conn, .. })] if *to == server => *conn,
            other => panic!("{other:?}"),
        };
        let out = b.on_request(
            server,
            5,
            Request::Fetch {
                session: remote,
                key,
            },
            vec![],
            Instant::now(),
        );
        assert!(
            matches!(out[..], [Out::SendFd { to, owner, .. }] if to == server && owner == remote)
        );
        let r = replies(&b.on_request(
            server,
            6,
            Request::Accept {
                conn,
                me: ep(server, 1, 2),
            },
            vec![],
            Instant::now(),
        ));
        assert!(r.contains(&(
            remote,
            2,
            Reply::Connected {
                peer: ep(server, 1, 2)
            }
        )));
        assert!(r.contains(&(server, 6, Reply::Ok)));
        // The remote session ends (its connection handed over): the server
        // is not told of a death.
        assert!(replies(&b.on_death(remote)).is_empty());
        // A sockets NIC's peer request for a remote host waits.
        let p = hello(&mut b);
        let out = b.on_request(
            p,
            2,
            Request::PeerConnect {
                me: ep(p, 1, 2),
                local: NetAddr {
                    host: ip.clone(),
                    discriminator: b"right".to_vec(),
                },
                remote: NetAddr {
                    host: vec![10, 0, 0, 1],
                    discriminator: b"left".to_vec(),
                },
                timeout_ms: 1000,
            },
            vec![],
            Instant::now(),
        );
        assert!(out.is_empty(), "{out:?}");
    }

    /// System mode: objects are fetched and requests matched within one
    /// uid; across uids a fetch is refused as if the object did not exist,
    /// and a request finds nobody (`NoMatch`/`Timeout` at its deadline)
    /// without taking the other user's listener.
    #[test]
    fn system_mode_keeps_users_apart() {
        let now = Instant::now();
        let mut b = system(unlimited(), proto::UNLIMITED, vec![]);
        let a1 = hello_as(&mut b, A, 1);
        let a2 = hello_as(&mut b, A, 2);
        let x = hello_as(&mut b, B, 3);
        let f = memfd();
        via_sys::ftruncate(&f, 8192).unwrap();
        let nic = ObjKey {
            kind: proto::ObjKind::Nic,
            nic: 1,
            id: 0,
            generation: 0,
        };
        for k in [key(1), nic] {
            let fd = f.try_clone().unwrap();
            let out = b.on_request(a1, 2, Request::Publish { key: k }, vec![fd], now);
            assert_eq!(replies(&out), vec![(a1, 2, Reply::Ok)]);
            let fetch = Request::Fetch {
                session: a1,
                key: k,
            };
            let out = b.on_request(a2, 3, fetch.clone(), vec![], now);
            assert!(matches!(out[..], [Out::SendFd { to, owner, .. }] if to == a2 && owner == a1));
            let out = b.on_request(x, 3, fetch, vec![], now);
            assert_eq!(replies(&out), vec![(x, 3, Reply::Refused(Refusal::Gone))]);
        }
        // The other user did not become a dependent of a1.
        let out = b.on_death(a1);
        assert_eq!(
            replies(&out),
            vec![(a2, 0, Reply::PeerDied { session: a1 })]
        );
        let a1 = hello_as(&mut b, A, 1);
        // B asks for A's discriminator: nobody of B listens there.
        assert!(listen(&mut b, a1, 4, "d", proto::INFINITE).is_empty());
        assert!(connect_req(&mut b, x, 5, "d", 50).is_empty());
        assert_eq!(
            replies(&b.on_tick(now + Duration::from_secs(1))),
            vec![(x, 5, Reply::Refused(Refusal::NoMatch))]
        );
        // A's listener is still there for A.
        let r = connect_req(&mut b, a2, 6, "d", proto::INFINITE);
        assert!(
            matches!(r[..], [(to, 4, Reply::Incoming { .. })] if to == a1),
            "{r:?}"
        );
        // And the other way round: A's request never reaches B's listener.
        assert!(listen(&mut b, x, 7, "e", 100_000).is_empty());
        assert!(connect_req(&mut b, a2, 8, "e", 10).is_empty());
        let r = replies(&b.on_tick(now + Duration::from_secs(2)));
        assert_eq!(r, vec![(a2, 8, Reply::Refused(Refusal::NoMatch))]);
        // Peer to peer across users never matches.
        let peer = |b: &mut Broker, s, id, l: &str, r: &str| {
            let req = Request::PeerConnect {
                me: ep(s, 2, 2),
                local: addr(l),
                remote: addr(r),
                timeout_ms: 10,
            };
            replies(&b.on_request(s, id, req, vec![], now))
        };
        assert!(peer(&mut b, a2, 9, "p", "q").is_empty());
        assert!(peer(&mut b, x, 10, "q", "p").is_empty());
        let mut r = replies(&b.on_tick(now + Duration::from_secs(3)));
        r.sort_by_key(|x| x.0);
        assert_eq!(
            r,
            vec![
                (a2, 9, Reply::Refused(Refusal::Timeout)),
                (x, 10, Reply::Refused(Refusal::Timeout))
            ]
        );
        // The same pair within one user does match.
        assert!(peer(&mut b, a2, 11, "p", "q").is_empty());
        let r = peer(&mut b, a1, 12, "q", "p");
        assert_eq!(r.len(), 2, "{r:?}");
    }

    /// A grant of the configuration: a request of the other user over the
    /// sockets NIC (a remote session: a TCP connection, no memory shared)
    /// reaches the granted listener, which may fetch that connection and
    /// nothing else of the requester; the same request on the shared-memory
    /// NIC is refused at once (`Reject`) and the listener is untouched.
    #[test]
    fn granted_cross_user_connections_go_over_sockets_only() {
        let grant = Grant {
            client_uid: B,
            server_uid: A,
            prefix: b"svc-".to_vec(),
        };
        let mut b = system(unlimited(), proto::UNLIMITED, vec![grant]);
        let a1 = hello_as(&mut b, A, 1);
        let a2 = hello_as(&mut b, A, 2);
        let x = hello_as(&mut b, B, 3);
        assert!(listen(&mut b, a1, 2, "svc-x", proto::INFINITE).is_empty());
        assert_eq!(
            connect_req(&mut b, x, 3, "svc-x", 1000),
            vec![(x, 3, Reply::Refused(Refusal::Reject))]
        );
        let r = connect_req(&mut b, a2, 4, "svc-x", 1000);
        assert!(
            matches!(r[..], [(to, 2, Reply::Incoming { .. })] if to == a1),
            "{r:?}"
        );
        // Not covered by the grant: waits, as any request nobody serves.
        assert!(connect_req(&mut b, x, 5, "other", 10).is_empty());
        // A listener of its own user on a granted name comes first.
        assert!(listen(&mut b, x, 6, "svc-y", proto::INFINITE).is_empty());
        let x2 = hello_as(&mut b, B, 4);
        let r = connect_req(&mut b, x2, 7, "svc-y", 1000);
        assert!(
            matches!(r[..], [(to, 6, Reply::Incoming { .. })] if to == x),
            "{r:?}"
        );
        // Over TCP (a remote session of B): offered to A's listener, which
        // may fetch the request's connection but no other object of it.
        assert!(listen(&mut b, a1, 8, "svc-z", proto::INFINITE).is_empty());
        let t = b.open_remote_session(Cred { uid: B, pid: 0 });
        let stream = ObjKey {
            kind: ObjKind::Stream,
            nic: 0,
            id: 0,
            generation: 0,
        };
        let fd = OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
        let req = Request::Publish { key: stream };
        assert!(matches!(
            replies(&b.on_request(t, 1, req, vec![fd], Instant::now()))[..],
            [(_, 1, Reply::Ok)]
        ));
        let fetch = |b: &mut Broker, id, key| {
            let req = Request::Fetch { session: t, key };
            b.on_request(a1, id, req, vec![], Instant::now())
        };
        assert!(matches!(
            replies(&fetch(&mut b, 9, stream))[..],
            [(_, 9, Reply::Refused(Refusal::Gone))]
        ));
        let r = connect_req(&mut b, t, 10, "svc-z", 1000);
        assert!(
            matches!(r[..], [(to, 8, Reply::Incoming { .. })] if to == a1),
            "{r:?}"
        );
        assert!(matches!(
            fetch(&mut b, 11, stream)[..],
            [Out::SendFd { id: 11, .. }]
        ));
        let arena = ObjKey {
            kind: ObjKind::Arena,
            ..stream
        };
        assert!(matches!(
            replies(&fetch(&mut b, 12, arena))[..],
            [(_, 12, Reply::Refused(Refusal::Gone))]
        ));
        // Per-user mode knows no grants.
        let mut u = Broker::new(vec![1], "h".into(), vec![]);
        let s = hello(&mut u);
        assert!(connect_req(&mut u, s, 2, "svc-x", 10).is_empty());
    }

    fn locked_kib() -> u64 {
        std::fs::read_to_string("/proc/self/status")
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("VmLck:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    }

    /// Pinning: each arena is locked (the process's `VmLck` grows by its
    /// size) within the per-process, per-user and total quotas; beyond,
    /// `Quota` and nothing locked; released on Retire, replacement and
    /// death. Other objects are neither locked nor counted.
    #[test]
    fn pinning_quota() {
        let now = Instant::now();
        let page = via_sys::page_size() as u64;
        let mut b = system(
            Quota {
                per_process: 3 * page,
                per_user: 5 * page,
            },
            6 * page,
            vec![],
        );
        let before = locked_kib();
        let a1 = hello_as(&mut b, A, 1);
        let a2 = hello_as(&mut b, A, 2);
        let x = hello_as(&mut b, B, 3);
        let file = |pages: u64| {
            let f = memfd();
            // A size that is not a whole number of pages counts whole pages.
            via_sys::ftruncate(&f, pages * page - 100).unwrap();
            f
        };
        let publish = |b: &mut Broker, s, k: ObjKey, f: OwnedFd| {
            replies(&b.on_request(s, 9, Request::Publish { key: k }, vec![f], now))[0]
                .2
                .clone()
        };
        for k in 0..3 {
            assert_eq!(publish(&mut b, a1, key(k), file(1)), Reply::Ok);
        }
        assert_eq!(b.pinned_total(), 3 * page);
        assert_eq!(locked_kib() - before, 3 * page / 1024);
        // Per process.
        assert_eq!(
            publish(&mut b, a1, key(3), file(1)),
            Reply::Refused(Refusal::Quota)
        );
        // Another session of the same process shares its quota.
        let a1b = hello_as(&mut b, A, 1);
        assert_eq!(
            publish(&mut b, a1b, key(3), file(1)),
            Reply::Refused(Refusal::Quota)
        );
        // Not an arena: not counted.
        let nic = ObjKey {
            kind: proto::ObjKind::Nic,
            ..key(0)
        };
        assert_eq!(publish(&mut b, a1, nic, file(1)), Reply::Ok);
        // Per user.
        assert_eq!(publish(&mut b, a2, key(0), file(2)), Reply::Ok);
        assert_eq!(
            publish(&mut b, a2, key(1), file(1)),
            Reply::Refused(Refusal::Quota)
        );
        // All users: one page left.
        assert_eq!(
            publish(&mut b, x, key(0), file(2)),
            Reply::Refused(Refusal::Quota)
        );
        assert_eq!(publish(&mut b, x, key(0), file(1)), Reply::Ok);
        assert_eq!(b.pinned_total(), 6 * page);
        assert_eq!(locked_kib() - before, 6 * page / 1024);
        // What is not a memory file is refused.
        for path in ["/dev/null", "/proc/self/status"] {
            let f: OwnedFd = std::fs::File::open(path).unwrap().into();
            assert_eq!(
                publish(&mut b, x, key(1), f),
                Reply::Refused(Refusal::Invalid),
                "{path}"
            );
        }
        // Retire gives quota back.
        b.on_request(a1, 0, Request::Retire { key: key(0) }, vec![], now);
        assert_eq!(b.pinned_total(), 5 * page);
        assert_eq!(publish(&mut b, a1, key(4), file(1)), Reply::Ok);
        // A replacement counts the difference (a1 holds 3 pages; replacing
        // a page with two would make 4).
        assert_eq!(
            publish(&mut b, a1, key(1), file(2)),
            Reply::Refused(Refusal::Quota)
        );
        b.on_request(a1, 0, Request::Retire { key: key(4) }, vec![], now);
        assert_eq!(publish(&mut b, a1, key(1), file(2)), Reply::Ok);
        assert_eq!(b.pinned_total(), 6 * page);
        // Deaths give everything back.
        for s in [a1, a1b, a2, x] {
            b.on_death(s);
        }
        assert_eq!(b.pinned_total(), 0);
        assert_eq!(locked_kib(), before);
        assert!(b.pinned_by_pid.is_empty() && b.pinned_by_uid.is_empty());
        assert!(b.objects_by_uid.is_empty());
        assert_eq!(b.objects_total(), 0);
    }

    #[test]
    fn welcome_tells_mode_and_limits() {
        let welcome = |b: &mut Broker, uid| {
            let s = b.open_session(Cred { uid, pid: 7 });
            let r = replies(&b.on_request(
                s,
                1,
                Request::Hello {
                    version: proto::VERSION,
                },
                vec![],
                Instant::now(),
            ));
            match r[0].2 {
                Reply::Welcome { mode, limits, .. } => (mode, limits),
                ref other => panic!("{other:?}"),
            }
        };
        let mut u = Broker::new(vec![1], "h".into(), vec![]);
        assert_eq!(
            welcome(&mut u, A),
            (DaemonMode::User, SessionLimits::unpinned(1 << 17))
        );
        let mut b = system(
            Quota {
                per_process: 8 << 20,
                per_user: 4 << 20,
            },
            1 << 30,
            vec![],
        );
        b.system.as_mut().unwrap().users.insert(
            B,
            Quota {
                per_process: 1 << 40,
                per_user: 1 << 40,
            },
        );
        assert_eq!(
            welcome(&mut b, A),
            (
                DaemonMode::System,
                SessionLimits {
                    pin_process: 4 << 20,
                    pin_user: 4 << 20,
                    max_objects: 1 << 17
                }
            )
        );
        let (_, l) = welcome(&mut b, B);
        assert_eq!((l.pin_process, l.pin_user), (1 << 30, 1 << 30));
    }

    #[test]
    fn name_service() {
        let mut b = Broker::new(vec![1, 2], "box".into(), vec![("other".into(), vec![3, 4])]);
        let a = hello(&mut b);
        let now = Instant::now();
        let r = replies(&b.on_request(
            a,
            2,
            Request::ResolveName { name: "box".into() },
            vec![],
            now,
        ));
        assert_eq!(r[0].2, Reply::Address { host: vec![1, 2] });
        let r = replies(&b.on_request(
            a,
            3,
            Request::ResolveName {
                name: "other".into(),
            },
            vec![],
            now,
        ));
        assert_eq!(r[0].2, Reply::Address { host: vec![3, 4] });
        let r = replies(&b.on_request(
            a,
            4,
            Request::ResolveName {
                name: "nope".into(),
            },
            vec![],
            now,
        ));
        assert_eq!(r[0].2, Reply::Refused(Refusal::NameService));
        let r =
            replies(&b.on_request(a, 5, Request::ResolveAddr { host: vec![1, 2] }, vec![], now));
        assert_eq!(r[0].2, Reply::Name { name: "box".into() });
    }
}
