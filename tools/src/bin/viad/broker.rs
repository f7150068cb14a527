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

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use via::proto::{self, Endpoint, NetAddr, ObjKey, Refusal, Reply, Request};

pub use via::proto::DISCONNECT_ACK;

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
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            objects_per_session: 1 << 17,
            objects_total: 1 << 20,
            pending_per_session: 4096,
        }
    }
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
}

#[derive(Default)]
struct Session {
    hello: bool,
    objects: HashMap<ObjKey, OwnedFd>,
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
    fn pending(&self) -> usize {
        self.listens.len() + self.connects.len() + self.peers.len()
    }
}

struct Listen {
    session: u64,
    id: u32,
    local: NetAddr,
}

enum ConnState {
    Waiting,
    Offered { server: u64 },
}

struct Connect {
    session: u64,
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
    name: String,
    hosts: Vec<(String, Vec<u8>)>,
    limits: Limits,
    sessions: HashMap<u64, Session>,
    objects_total: usize,
    listens: HashMap<u64, Listen>,
    /// Waiting listens by discriminator, oldest first.
    listen_q: HashMap<Vec<u8>, VecDeque<u64>>,
    connects: HashMap<u64, Connect>,
    /// Waiting (not offered) connects by the discriminator they want.
    connect_q: HashMap<Vec<u8>, VecDeque<u64>>,
    peers: HashMap<u64, PeerReq>,
    /// Waiting peer requests by (local, remote) discriminator.
    peer_q: HashMap<(Vec<u8>, Vec<u8>), VecDeque<u64>>,
    discs: HashMap<u64, Disc>,
    timers: BinaryHeap<Reverse<(Instant, Timer)>>,
    /// The connections this broker made, both ways: a `Disconnect` is
    /// relayed only along one of them (a client may not break a connection
    /// it is not part of). A VI has at most one connection.
    links: HashMap<ViKey, ViKey>,
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
            name,
            hosts,
            limits: Limits::default(),
            sessions: HashMap::new(),
            objects_total: 0,
            listens: HashMap::new(),
            listen_q: HashMap::new(),
            connects: HashMap::new(),
            connect_q: HashMap::new(),
            peers: HashMap::new(),
            peer_q: HashMap::new(),
            discs: HashMap::new(),
            timers: BinaryHeap::new(),
            links: HashMap::new(),
            next_session: 1,
            next_id: 1,
        }
    }

    /// Sets the per-client limits.
    pub fn set_limits(&mut self, l: Limits) {
        self.limits = l;
    }

    /// Registers a new client; returns its session id.
    pub fn open_session(&mut self) -> u64 {
        let s = self.next_session;
        self.next_session += 1;
        self.sessions.insert(s, Session::default());
        s
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
        self.sessions.get(&owner)?.objects.get(key)
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
        if a == b || !self.sessions.contains_key(&a) || !self.sessions.contains_key(&b) {
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
        if fetcher == owner || !self.sessions.contains_key(&owner) {
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
        h.is_empty() || h == self.host.as_slice()
    }

    fn remove_listen(&mut self, lid: u64) -> Option<Listen> {
        let l = self.listens.remove(&lid)?;
        unqueue(&mut self.listen_q, &l.local.discriminator, lid);
        if let Some(s) = self.sessions.get_mut(&l.session) {
            s.listens.remove(&lid);
        }
        Some(l)
    }

    fn remove_connect(&mut self, conn: u64) -> Option<Connect> {
        let c = self.connects.remove(&conn)?;
        match c.state {
            ConnState::Waiting => unqueue(&mut self.connect_q, &c.remote.discriminator, conn),
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
                    out.push(Out::Send {
                        to: s,
                        id,
                        reply: Reply::Welcome {
                            session: s,
                            host: self.host.clone(),
                            name: self.name.clone(),
                        },
                    });
                }
            }
            Request::Publish { key } => {
                let (per, total) = (self.limits.objects_per_session, self.limits.objects_total);
                let objects_total = self.objects_total;
                let sess = self.sessions.get_mut(&s).unwrap();
                let replaces = sess.objects.contains_key(&key);
                if fds.len() != 1 {
                    out.push(Out::Close {
                        session: s,
                        why: "Publish without exactly one fd",
                    });
                } else if !replaces && (sess.objects.len() >= per || objects_total >= total) {
                    log::warn!(
                        "session {s}: Publish refused: it holds {} fds (limit {per}), all sessions {objects_total} (limit {total})",
                        sess.objects.len()
                    );
                    refuse(&mut out, Refusal::Limit);
                } else {
                    sess.objects.insert(key, fds.pop().unwrap());
                    if !replaces {
                        self.objects_total += 1;
                    }
                    out.push(Out::Send {
                        to: s,
                        id,
                        reply: Reply::Ok,
                    });
                }
            }
            Request::Retire { key } => {
                if self
                    .sessions
                    .get_mut(&s)
                    .unwrap()
                    .objects
                    .remove(&key)
                    .is_some()
                {
                    self.objects_total -= 1;
                }
            }
            Request::Fetch { session, key } => {
                if self.object(session, &key).is_some() {
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
                let waiting = self
                    .connect_q
                    .get(&local.discriminator)
                    .and_then(|q| q.front().copied());
                if let Some(conn) = waiting {
                    unqueue(&mut self.connect_q, &local.discriminator, conn);
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
                    self.listen_q
                        .entry(local.discriminator.clone())
                        .or_default()
                        .push_back(lid);
                    self.listens.insert(
                        lid,
                        Listen {
                            session: s,
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
                } else {
                    let conn = self.id();
                    let d = deadline(now, timeout_ms);
                    self.connects.insert(
                        conn,
                        Connect {
                            session: s,
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
                if !self.local_host(&remote.host) {
                    refuse(&mut out, Refusal::NoMatch);
                    return out;
                }
                // The other side waits under (its local, its remote) = (our
                // remote, our local); not the same VI.
                let key = (remote.discriminator.clone(), local.discriminator.clone());
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
                    let key = (local.discriminator.clone(), remote.discriminator.clone());
                    self.peer_q.entry(key).or_default().push_back(pid);
                    self.peers.insert(
                        pid,
                        PeerReq {
                            session: s,
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
            Request::Disconnect { peer, me } => {
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
                } else if self.links.get(&vi_key(&me)) != Some(&vi_key(&peer)) {
                    // Not a connection of the sender's VI: nothing to relay.
                    log::warn!("session {s}: disconnect of a VI it is not connected to");
                    refuse(&mut out, Refusal::Invalid);
                } else {
                    self.unlink_vi(&vi_key(&me));
                    let token = self.id();
                    out.push(Out::Send {
                        to: peer.session,
                        id: 0,
                        reply: Reply::RemoteDisconnect {
                            me: peer.clone(),
                            token,
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
        let disc = self.connects[&conn].remote.discriminator.clone();
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
        let Some(sess) = self.sessions.remove(&s) else {
            return out;
        };
        self.objects_total -= sess.objects.len();
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
        let s = b.open_session();
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
        let s = b.open_session();
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
        via::sys::memfd_create("viad-test").unwrap()
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

    #[test]
    fn disconnect_only_along_a_connection() {
        let now = Instant::now();
        let mut b = Broker::new(vec![1], "h".into(), vec![]);
        let a = hello(&mut b);
        let c = hello(&mut b);
        let x = hello(&mut b);
        connect(&mut b, a, c, "d");
        let disc = |peer, me| Request::Disconnect { peer, me };
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
            },
            vec![],
            now,
        );
        let out = b.on_tick(now + DISCONNECT_ACK);
        assert_eq!(replies(&out), vec![(a, 3, Reply::Ok)]);
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
