//! `viad_broker`: viad's state machine driven by several hostile sessions.
//!
//! The broker is a private module of the `viad` binary; it is compiled
//! into this crate unchanged (`#[path]` to `tools/src/bin/viad/broker.rs`),
//! so no daemon code is edited or exported for fuzzing. The harness plays
//! the daemon's I/O loop (`main.rs`): it decodes each frame with
//! `Request::decode` (a frame that does not decode ends the session),
//! passes fds along, runs `on_tick` after every frame, delivers `Out`s
//! (`SendFd` of a missing object becomes `Refused(Gone)`, `Close` ends the
//! session) and reports deaths. Time is virtual.
//!
//! A scenario whose first byte has bit 0x40 set runs the broker in system
//! mode: slots 0 and 1 are processes of one user, slot 2 of another;
//! pinning quotas of a few pages (each fd the harness attaches is a
//! one-page memfd, which the broker really locks), and a grant from slot
//! 2's user to slot 0's for discriminators starting with "a" (refused
//! for now).
//!
//! Checked, besides "no panic":
//! * every reply or event goes to a live session and survives
//!   `Reply::decode(encode(..))` within `MAX_FRAME`;
//! * events (id 0) are `PeerDied`/`RemoteDisconnect`, and replies (id ≠ 0)
//!   never are;
//! * no request is answered twice (per session and request id), and once
//!   the clock is moved past every deadline, every request with a finite
//!   deadline has been answered (a well-behaved client never waits forever
//!   unless it asked to);
//! * after that tick no deadline is left in the past;
//! * system mode: no session gets an fd of, or an `Incoming`/`Connected`
//!   naming, a session of another user; once every session is gone,
//!   nothing is locked.

use std::collections::{HashMap, HashSet};
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use via::proto::{
    self, Endpoint, INFINITE, MAX_FRAME, NetAddr, ObjKey, ObjKind, Refusal, Reply, Request, VERSION,
};

use crate::input::Input;

#[path = "../../tools/src/bin/viad/broker.rs"]
#[allow(dead_code)]
mod viad;

use viad::{Broker, Cred, Grant, Out, Quota, SystemPolicy};

/// Client sessions a scenario plays.
pub const SLOTS: usize = 3;
/// Longest scenario, in operations.
pub const MAX_OPS: usize = 256;

/// One step of a scenario (the format `viad_broker` and `viad_socket` share).
#[derive(Debug)]
pub enum Op<'a> {
    /// Send raw bytes as one frame from session `who` (with an fd if `fd`).
    Frame {
        who: usize,
        bytes: &'a [u8],
        fd: bool,
    },
    /// Send a request built from `bytes` by [`gen_request`] (well-formed
    /// apart from what the bytes choose to break).
    Gen {
        who: usize,
        bytes: &'a [u8],
        fd: bool,
    },
    /// End session `who`; the next use opens a new one (with `Hello`
    /// unless `bare`).
    Reopen { who: usize, bare: bool },
    /// Advance the clock.
    Tick { ms: u32 },
}

/// Bytes [`gen_request`] reads at most (its reads do not depend on the
/// sessions, so a scenario means the same thing to both targets).
pub const GEN_BYTES: usize = 64;

/// Splits an input into operations.
pub fn parse(data: &[u8]) -> Vec<Op<'_>> {
    let mut i = Input(data);
    let mut ops = Vec::new();
    while !i.is_empty() && ops.len() < MAX_OPS {
        let tag = i.u8();
        let who = ((tag as usize >> 3) & 3) % SLOTS;
        let flag = tag & 0x80 != 0;
        ops.push(match tag % 8 {
            0..=2 => {
                let n = i.u8() as usize % (GEN_BYTES + 1);
                Op::Gen {
                    who,
                    bytes: i.take(n),
                    fd: flag,
                }
            }
            3 | 7 => {
                let n = i.u16() as usize % (MAX_FRAME + 16);
                Op::Frame {
                    who,
                    bytes: i.take(n),
                    fd: flag,
                }
            }
            4 | 5 => Op::Reopen { who, bare: flag },
            _ => Op::Tick {
                ms: i.u16() as u32 * (1 + (i.u8() as u32 % 64)),
            },
        });
    }
    ops
}

/// What [`gen_request`] may name.
pub struct Ctx<'a> {
    /// Session id of each slot (0 if not open).
    pub sessions: &'a [u64; SLOTS],
    /// The sender's slot.
    pub me: usize,
    /// The daemon's host address and name.
    pub host: &'a [u8],
    pub name: &'a str,
}

fn gen_session(i: &mut Input, cx: &Ctx) -> u64 {
    let sel = i.u8();
    let raw = i.u64();
    match sel % 8 {
        0 => raw,
        1 | 2 => cx.sessions[(sel as usize >> 3) % SLOTS],
        _ => cx.sessions[cx.me],
    }
}

fn gen_ep(i: &mut Input, cx: &Ctx) -> Endpoint {
    let session = gen_session(i, cx);
    let (nic, vi, vi_gen, rel) = (i.u8(), i.u8(), i.u8(), i.u8());
    let mtu = i.u32();
    let (flags, rq) = (i.u8(), i.u8());
    Endpoint {
        session,
        nic: nic as u32 % 2,
        vi: vi as u32 % 4,
        vi_gen: vi_gen as u32 % 2,
        reliability: [1, 2, 4, 3][rel as usize % 4],
        mtu,
        rdma_write: flags & 1 != 0,
        rdma_read: flags & 2 != 0,
        device: (rq as u64).to_le_bytes().to_vec(),
    }
}

fn gen_host(i: &mut Input, cx: &Ctx) -> Vec<u8> {
    let sel = i.u8();
    let raw: [u8; 4] = i.array();
    match sel % 5 {
        0 => vec![],
        1 | 2 => cx.host.to_vec(),
        3 => raw[..(sel as usize >> 3) % 5].to_vec(),
        _ => vec![0x5a; proto::MAX_HOST + 1],
    }
}

fn gen_addr(i: &mut Input, cx: &Ctx) -> NetAddr {
    let host = gen_host(i, cx);
    let d = i.u8();
    let discriminator = match d % 7 {
        0 => b"a".to_vec(),
        1 => b"b".to_vec(),
        2 => b"c".to_vec(),
        3 => vec![],
        4 => vec![b'x'; proto::MAX_DISCRIMINATOR],
        5 => vec![b'y'; proto::MAX_DISCRIMINATOR + 1],
        _ => vec![d],
    };
    NetAddr {
        host,
        discriminator,
    }
}

fn gen_key(i: &mut Input) -> ObjKey {
    let (k, nic, id, generation) = (i.u8(), i.u8(), i.u8(), i.u8());
    ObjKey {
        kind: [ObjKind::Nic, ObjKind::Arena, ObjKind::CqRing][k as usize % 3],
        nic: nic as u32 % 2,
        id: id as u32 % 4,
        generation: generation as u32 % 2,
    }
}

fn gen_timeout(i: &mut Input) -> u32 {
    let sel = i.u8();
    let raw = i.u32();
    [0, 1, 50, 2000, INFINITE, raw][sel as usize % 6]
}

/// A request (and its id) built from `bytes`: mostly well-formed, naming
/// the sessions, connections and discriminators of the scenario so that
/// matches, accepts and disconnects happen.
pub fn gen_request(bytes: &[u8], cx: &Ctx) -> (u32, Request) {
    let mut i = Input(bytes);
    let kind = i.u8() % 13;
    let id = i.u8() as u32;
    let req = match kind {
        0 => {
            let sel = i.u8();
            let raw = i.u32();
            Request::Hello {
                version: [VERSION, VERSION, 0, raw][sel as usize % 4],
            }
        }
        1 => Request::Publish {
            key: gen_key(&mut i),
        },
        2 => Request::Retire {
            key: gen_key(&mut i),
        },
        3 => Request::Fetch {
            session: gen_session(&mut i, cx),
            key: gen_key(&mut i),
        },
        4 => Request::Listen {
            local: gen_addr(&mut i, cx),
            timeout_ms: gen_timeout(&mut i),
        },
        5 | 8 => {
            let me = gen_ep(&mut i, cx);
            let local = gen_addr(&mut i, cx);
            let remote = gen_addr(&mut i, cx);
            let timeout_ms = gen_timeout(&mut i);
            if kind == 5 {
                Request::Connect {
                    me,
                    local,
                    remote,
                    timeout_ms,
                }
            } else {
                Request::PeerConnect {
                    me,
                    local,
                    remote,
                    timeout_ms,
                }
            }
        }
        6 => Request::Accept {
            conn: i.u8() as u64 % 8,
            me: gen_ep(&mut i, cx),
        },
        7 => Request::Reject {
            conn: i.u8() as u64 % 8,
            reason: [
                Refusal::Timeout,
                Refusal::Reject,
                Refusal::Reliability,
                Refusal::Gone,
                Refusal::NoMatch,
                Refusal::NameService,
                Refusal::Invalid,
            ][i.u8() as usize % 7],
        },
        9 => Request::Disconnect {
            peer: gen_ep(&mut i, cx),
            me: gen_ep(&mut i, cx),
            reason: i.u8() % 12,
        },
        10 => Request::DisconnectAck {
            token: i.u8() as u64 % 8,
        },
        11 => Request::ResolveName {
            name: match i.u8() % 6 {
                0 => "localhost".into(),
                1 => cx.name.into(),
                2 => String::new(),
                3 => "nowhere".into(),
                4 => format!("{}.", cx.name),
                _ => "n".repeat(proto::MAX_NAME + 1),
            },
        },
        _ => Request::ResolveAddr {
            host: gen_host(&mut i, cx),
        },
    };
    // Requests other than the two unanswered ones need a non-zero id.
    let id = match req {
        Request::Retire { .. } | Request::DisconnectAck { .. } => id,
        _ if id == 0 => 1,
        _ => id,
    };
    (id, req)
}

/// Whether the daemon owes an answer to `req`, and whether it may wait
/// forever for a partner (an infinite `Listen`/`Connect`/`PeerConnect`).
pub fn owed(req: &Request) -> Option<bool> {
    match req {
        Request::Retire { .. } | Request::DisconnectAck { .. } => None,
        Request::Listen { timeout_ms, .. }
        | Request::Connect { timeout_ms, .. }
        | Request::PeerConnect { timeout_ms, .. } => Some(*timeout_ms == INFINITE),
        _ => Some(false),
    }
}

/// A memfd to attach to frames that carry an fd.
pub fn some_fd() -> OwnedFd {
    static FD: std::sync::OnceLock<OwnedFd> = std::sync::OnceLock::new();
    FD.get_or_init(|| {
        let fd = via::sys::memfd_create("via-fuzz").expect("memfd");
        via::sys::ftruncate(&fd, 4096).expect("ftruncate");
        fd
    })
    .try_clone()
    .expect("dup")
}

#[derive(Default, Debug)]
struct Owed {
    finite: u32,
    infinite: u32,
    answered: u32,
}

/// The users of system mode: slots 0 and 1, and slot 2.
const UID_A: u32 = 1000;
const UID_B: u32 = 1001;

struct Harness {
    b: Broker,
    /// System mode: the uid of each live session.
    uids: Option<HashMap<u64, u32>>,
    host: Vec<u8>,
    name: String,
    now: Instant,
    slots: [u64; SLOTS],
    live: HashSet<u64>,
    owed: HashMap<(u64, u32), Owed>,
}

impl Harness {
    fn new(system: bool) -> Harness {
        let host = vec![2, 0, 0, 0, 0, 1];
        let name = "fuzzhost".to_string();
        let mut b = Broker::new(
            host.clone(),
            name.clone(),
            vec![("other".into(), vec![2, 0, 0, 0, 0, 2])],
        );
        if system {
            let page = via::sys::page_size() as u64;
            b.set_system(SystemPolicy {
                quota: Quota {
                    per_process: 2 * page,
                    per_user: 3 * page,
                },
                users: HashMap::new(),
                total: 4 * page,
                grants: vec![Grant {
                    client_uid: UID_B,
                    server_uid: UID_A,
                    prefix: b"a".to_vec(),
                }],
            });
        }
        Harness {
            b,
            uids: system.then(HashMap::new),
            host,
            name,
            now: Instant::now(),
            slots: [0; SLOTS],
            live: HashSet::new(),
            owed: HashMap::new(),
        }
    }

    fn session(&mut self, who: usize) -> u64 {
        if self.slots[who] == 0 {
            self.open(who, false);
        }
        self.slots[who]
    }

    fn open(&mut self, who: usize, bare: bool) {
        let uid = if who == 2 { UID_B } else { UID_A };
        let s = self.b.open_session(Cred {
            uid,
            pid: 100 + who as i32,
        });
        if let Some(u) = &mut self.uids {
            u.insert(s, uid);
        }
        self.slots[who] = s;
        self.live.insert(s);
        if !bare {
            let frame = Request::Hello { version: VERSION }.encode(1);
            self.frame(s, &frame, vec![]);
        }
    }

    fn die(&mut self, s: u64) {
        if self.live.remove(&s) {
            self.owed.retain(|k, _| k.0 != s);
            let outs = self.b.on_death(s);
            self.deliver(outs);
        }
    }

    /// One frame from session `s`, as the daemon's loop handles it.
    fn frame(&mut self, s: u64, bytes: &[u8], fds: Vec<OwnedFd>) {
        if !self.live.contains(&s) {
            return;
        }
        match Request::decode(bytes) {
            Ok((id, req)) => {
                if trace() {
                    eprintln!("session {s} -> {id}: {req:?}");
                }
                if let Some(inf) = owed(&req) {
                    let o = self.owed.entry((s, id)).or_default();
                    if inf { o.infinite += 1 } else { o.finite += 1 }
                }
                let outs = self.b.on_request(s, id, req, fds, self.now);
                self.deliver(outs);
            }
            Err(_) => self.die(s),
        }
        let outs = self.b.on_tick(self.now);
        self.deliver(outs);
    }

    /// System mode: whether `a` and `b` are sessions of different users
    /// (a session that is gone counts as nobody's).
    fn apart(&self, a: u64, b: u64) -> bool {
        self.uids
            .as_ref()
            .is_some_and(|u| matches!((u.get(&a), u.get(&b)), (Some(x), Some(y)) if x != y))
    }

    fn reply(&mut self, to: u64, id: u32, reply: &Reply) {
        if trace() {
            eprintln!("session {to} <- {id}: {reply:?}");
        }
        if let Reply::Incoming { peer, .. } | Reply::Connected { peer } = reply {
            assert!(
                !self.apart(to, peer.session),
                "{reply:?} to session {to}: a session of another user"
            );
        }
        assert!(
            self.live.contains(&to),
            "{reply:?} (id {id}) to dead session {to}"
        );
        let bytes = reply.encode(id);
        assert!(bytes.len() <= MAX_FRAME, "{reply:?}: {} bytes", bytes.len());
        assert_eq!(Reply::decode(&bytes).as_ref(), Ok(&(id, reply.clone())));
        let event = matches!(
            reply,
            Reply::PeerDied { .. } | Reply::RemoteDisconnect { .. }
        );
        if id == 0 {
            assert!(event, "{reply:?} sent with id 0");
            return;
        }
        assert!(!event, "event {reply:?} sent as the reply to {id}");
        let o = self.owed.get_mut(&(to, id));
        let Some(o) = o else {
            panic!("session {to} got {reply:?} for id {id}, which it never used");
        };
        o.answered += 1;
        assert!(
            o.answered <= o.finite + o.infinite,
            "session {to}: request {id} answered twice ({o:?}), last {reply:?}"
        );
    }

    fn deliver(&mut self, mut outs: Vec<Out>) {
        while !outs.is_empty() {
            let mut more = Vec::new();
            for o in outs {
                match o {
                    Out::Send { to, id, reply } => self.reply(to, id, &reply),
                    Out::SendFd { to, id, owner, key } => {
                        assert!(
                            !self.apart(to, owner),
                            "session {to} gets {key:?} of session {owner}, of another user"
                        );
                        let reply = match self.b.object(owner, &key) {
                            Some(_) => Reply::Fd,
                            None => Reply::Refused(Refusal::Gone),
                        };
                        self.reply(to, id, &reply)
                    }
                    // The I/O loop opens the TCP listener and answers.
                    Out::OpenTcp { to, id, .. } => self.reply(to, id, &Reply::Ok),
                    Out::Close { session, .. } => {
                        if self.live.remove(&session) {
                            self.owed.retain(|k, _| k.0 != session);
                            more.extend(self.b.on_death(session));
                        }
                    }
                }
            }
            outs = more;
        }
    }

    fn tick(&mut self, by: Duration) {
        self.now += by;
        let outs = self.b.on_tick(self.now);
        self.deliver(outs);
    }
}

/// `VIA_FUZZ_TRACE=1`: print every request and reply (for reading a crash
/// input).
fn trace() -> bool {
    static T: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *T.get_or_init(|| std::env::var_os("VIA_FUZZ_TRACE").is_some())
}

pub fn viad_broker(data: &[u8]) {
    let mut h = Harness::new(data.first().is_some_and(|b| b & 0x40 != 0));
    for op in parse(data) {
        match op {
            Op::Frame { who, bytes, fd } => {
                let s = h.session(who);
                let fds = if fd { vec![some_fd()] } else { vec![] };
                h.frame(s, bytes, fds);
            }
            Op::Gen { who, bytes, fd } => {
                let s = h.session(who);
                let cx = Ctx {
                    sessions: &h.slots,
                    me: who,
                    host: &h.host,
                    name: &h.name,
                };
                let (id, req) = gen_request(bytes, &cx);
                let fds = if fd { vec![some_fd()] } else { vec![] };
                h.frame(s, &req.encode(id), fds);
            }
            Op::Reopen { who, bare } => {
                let old = h.slots[who];
                h.die(old);
                h.open(who, bare);
            }
            Op::Tick { ms } => h.tick(Duration::from_millis(ms as u64)),
        }
    }
    // Past every finite deadline (the longest timeout is u32::MAX - 1 ms).
    h.tick(Duration::from_millis(u32::MAX as u64) + viad::DISCONNECT_ACK);
    if let Some(d) = h.b.next_deadline() {
        assert!(
            d > h.now,
            "a deadline {:?} in the past survived a tick",
            h.now - d
        );
    }
    for ((s, id), o) in &h.owed {
        assert!(
            o.finite + o.infinite - o.answered <= o.infinite,
            "session {s}: request {id} with a finite deadline never answered ({o:?})"
        );
    }
    let live: Vec<u64> = h.live.iter().copied().collect();
    for s in live {
        h.die(s);
    }
    assert_eq!(h.b.pinned_total(), 0, "locked bytes left after every death");
}
