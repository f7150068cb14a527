//! The daemon's state machine, free of I/O so it can be tested directly.
//!
//! It stores the shared-object fds of every session, matches connection
//! requests with listeners (client/server) and with each other
//! (peer-to-peer) by discriminator, relays disconnects, enforces deadlines,
//! and turns the death of a session into `PeerDied` events.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use via::proto::{self, Endpoint, NetAddr, ObjKey, Refusal, Reply, Request};

/// Objects one session may store (bounds a misbehaving client).
pub const MAX_OBJECTS: usize = 1 << 20;
/// How long a disconnect waits for the peer's acknowledgement.
pub use via::proto::DISCONNECT_ACK;

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

struct Session {
    hello: bool,
    objects: HashMap<ObjKey, OwnedFd>,
}

struct Listen {
    session: u64,
    id: u32,
    local: NetAddr,
    deadline: Option<Instant>,
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
    deadline: Option<Instant>,
    state: ConnState,
}

struct PeerReq {
    session: u64,
    id: u32,
    me: Endpoint,
    local: NetAddr,
    remote: NetAddr,
    deadline: Option<Instant>,
}

struct Disc {
    session: u64,
    id: u32,
    target: u64,
    deadline: Instant,
}

/// A VI as the broker names it: (session, NIC, slot, generation).
type ViKey = (u64, u32, u32, u32);

fn vi_key(e: &Endpoint) -> ViKey {
    (e.session, e.nic, e.vi, e.vi_gen)
}

/// The broker.
pub struct Broker {
    host: Vec<u8>,
    name: String,
    hosts: Vec<(String, Vec<u8>)>,
    sessions: HashMap<u64, Session>,
    listens: Vec<Listen>,
    connects: HashMap<u64, Connect>,
    peers: Vec<PeerReq>,
    discs: HashMap<u64, Disc>,
    /// The connections this broker made, both ways: a `Disconnect` is
    /// relayed only along one of them (a client may not break a connection
    /// it is not part of). A VI has at most one connection.
    links: HashMap<ViKey, ViKey>,
    next_session: u64,
    next_conn: u64,
    next_token: u64,
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
            sessions: HashMap::new(),
            listens: Vec::new(),
            connects: HashMap::new(),
            peers: Vec::new(),
            discs: HashMap::new(),
            links: HashMap::new(),
            next_session: 1,
            next_conn: 1,
            next_token: 1,
        }
    }

    /// Registers a new client; returns its session id.
    pub fn open_session(&mut self) -> u64 {
        let s = self.next_session;
        self.next_session += 1;
        self.sessions.insert(
            s,
            Session {
                hello: false,
                objects: HashMap::new(),
            },
        );
        s
    }

    /// Number of live sessions.
    #[cfg(test)]
    pub fn sessions(&self) -> usize {
        self.sessions.len()
    }

    /// The fd of `key` of `owner`, if stored.
    pub fn object(&self, owner: u64, key: &ObjKey) -> Option<&OwnedFd> {
        self.sessions.get(&owner)?.objects.get(key)
    }

    /// Records a connection between `a` and `b`, replacing older ones of either.
    fn link(&mut self, a: &Endpoint, b: &Endpoint) {
        let (a, b) = (vi_key(a), vi_key(b));
        for k in [a, b] {
            if let Some(old) = self.links.remove(&k) {
                self.links.remove(&old);
            }
        }
        self.links.insert(a, b);
        self.links.insert(b, a);
    }

    fn local_host(&self, h: &[u8]) -> bool {
        h.is_empty() || h == self.host.as_slice()
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
        let Some(hello_done) = self.sessions.get(&s).map(|x| x.hello) else {
            return out;
        };
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
                let sess = self.sessions.get_mut(&s).unwrap();
                if fds.len() != 1 {
                    out.push(Out::Close {
                        session: s,
                        why: "Publish without exactly one fd",
                    });
                } else if sess.objects.len() >= MAX_OBJECTS && !sess.objects.contains_key(&key) {
                    refuse(&mut out, Refusal::Invalid);
                } else {
                    sess.objects.insert(key, fds.pop().unwrap());
                    out.push(Out::Send {
                        to: s,
                        id,
                        reply: Reply::Ok,
                    });
                }
            }
            Request::Retire { key } => {
                self.sessions.get_mut(&s).unwrap().objects.remove(&key);
            }
            Request::Fetch { session, key } => {
                if self.object(session, &key).is_some() {
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
                } else if let Some((&conn, c)) = self.connects.iter_mut().find(|(_, c)| {
                    matches!(c.state, ConnState::Waiting)
                        && c.remote.discriminator == local.discriminator
                }) {
                    c.state = ConnState::Offered { server: s };
                    out.push(Out::Send {
                        to: s,
                        id,
                        reply: Reply::Incoming {
                            conn,
                            peer: c.me.clone(),
                            remote: c.local.clone(),
                        },
                    });
                } else {
                    self.listens.push(Listen {
                        session: s,
                        id,
                        local,
                        deadline: deadline(now, timeout_ms),
                    });
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
                    let conn = self.next_conn;
                    self.next_conn += 1;
                    let mut c = Connect {
                        session: s,
                        id,
                        me,
                        local,
                        remote,
                        deadline: deadline(now, timeout_ms),
                        state: ConnState::Waiting,
                    };
                    self.offer(conn, &mut c, &mut out);
                    self.connects.insert(conn, c);
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
                        let c = self.connects.remove(&conn).unwrap();
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
                    let c = self.connects.remove(&conn).unwrap();
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
                } else if !self.local_host(&remote.host) {
                    refuse(&mut out, Refusal::NoMatch);
                } else if let Some(i) = self.peers.iter().position(|p| {
                    p.local.discriminator == remote.discriminator
                        && p.remote.discriminator == local.discriminator
                        && !(p.me.session == me.session && p.me.nic == me.nic && p.me.vi == me.vi)
                }) {
                    let p = self.peers.remove(i);
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
                    self.peers.push(PeerReq {
                        session: s,
                        id,
                        me,
                        local,
                        remote,
                        deadline: deadline(now, timeout_ms),
                    });
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
                    self.links.remove(&vi_key(&me));
                    self.links.remove(&vi_key(&peer));
                    let token = self.next_token;
                    self.next_token += 1;
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
                            deadline: now + DISCONNECT_ACK,
                        },
                    );
                }
            }
            Request::DisconnectAck { token } => {
                if self.discs.get(&token).is_some_and(|d| d.target == s) {
                    let d = self.discs.remove(&token).unwrap();
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

    /// Offers a waiting connect to a matching listener, if any.
    fn offer(&mut self, conn: u64, c: &mut Connect, out: &mut Vec<Out>) {
        if let Some(i) = self.listens.iter().position(|l| {
            l.local.discriminator == c.remote.discriminator
                && self.sessions.contains_key(&l.session)
        }) {
            let l = self.listens.remove(i);
            c.state = ConnState::Offered { server: l.session };
            out.push(Out::Send {
                to: l.session,
                id: l.id,
                reply: Reply::Incoming {
                    conn,
                    peer: c.me.clone(),
                    remote: c.local.clone(),
                },
            });
        }
    }

    /// Expires deadlines.
    pub fn on_tick(&mut self, now: Instant) -> Vec<Out> {
        let mut out = Vec::new();
        // A waiter past its deadline is answered with Timeout and dropped.
        let mut keep = |session: u64, id: u32, deadline: Option<Instant>| {
            if deadline.is_some_and(|d| d <= now) {
                out.push(Out::Send {
                    to: session,
                    id,
                    reply: Reply::Refused(Refusal::Timeout),
                });
                false
            } else {
                true
            }
        };
        self.listens.retain(|l| keep(l.session, l.id, l.deadline));
        self.connects
            .retain(|_, c| keep(c.session, c.id, c.deadline));
        self.peers.retain(|p| keep(p.session, p.id, p.deadline));
        self.discs.retain(|_, d| {
            if d.deadline <= now {
                log::warn!(
                    "session {} did not acknowledge a disconnect in time",
                    d.target
                );
                out.push(Out::Send {
                    to: d.session,
                    id: d.id,
                    reply: Reply::Ok,
                });
                false
            } else {
                true
            }
        });
        out
    }

    /// The earliest pending deadline.
    pub fn next_deadline(&self) -> Option<Instant> {
        let a = self.listens.iter().filter_map(|l| l.deadline);
        let b = self.connects.values().filter_map(|c| c.deadline);
        let c = self.peers.iter().filter_map(|p| p.deadline);
        let d = self.discs.values().map(|d| d.deadline);
        a.chain(b).chain(c).chain(d).min()
    }

    /// The process of session `s` is gone: release everything it held and
    /// tell everyone else.
    pub fn on_death(&mut self, s: u64) -> Vec<Out> {
        let mut out = Vec::new();
        if self.sessions.remove(&s).is_none() {
            return out;
        }
        self.listens.retain(|l| l.session != s);
        self.peers.retain(|p| p.session != s);
        self.links.retain(|a, b| a.0 != s && b.0 != s);
        self.connects.retain(|_, c| c.session != s);
        // Requests offered to the dead server go back to waiting.
        let mut requeue = Vec::new();
        for (&conn, c) in self.connects.iter_mut() {
            if matches!(c.state, ConnState::Offered { server } if server == s) {
                c.state = ConnState::Waiting;
                requeue.push(conn);
            }
        }
        for conn in requeue {
            let mut c = self.connects.remove(&conn).unwrap();
            self.offer(conn, &mut c, &mut out);
            self.connects.insert(conn, c);
        }
        self.discs.retain(|_, d| {
            if d.target == s {
                out.push(Out::Send {
                    to: d.session,
                    id: d.id,
                    reply: Reply::Ok,
                });
            }
            d.session != s && d.target != s
        });
        for &other in self.sessions.keys() {
            out.push(Out::Send {
                to: other,
                id: 0,
                reply: Reply::PeerDied { session: s },
            });
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
        let out = b.on_tick(now + Duration::from_millis(50));
        assert_eq!(
            replies(&out),
            vec![(cli, 2, Reply::Refused(Refusal::Timeout))]
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
        assert!(r.contains(&(cli, 0, Reply::PeerDied { session: srv1 })));
        assert!(r.contains(&(srv2, 0, Reply::PeerDied { session: srv1 })));
        assert_eq!(b.sessions(), 2);
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
