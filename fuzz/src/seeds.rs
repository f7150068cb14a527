//! The seed corpus (`seeds/<target>/`), generated here so that it follows
//! the protocol and descriptor layouts as they change: `cargo test` in
//! `fuzz/` fails if the files on disk differ from what this module makes,
//! and `VIA_FUZZ_WRITE_SEEDS=1 cargo test --test replay seeds` rewrites them.

use via::proto::{Endpoint, INFINITE, NetAddr, ObjKey, ObjKind, Refusal, Reply, Request, VERSION};

use crate::input::Output;

fn ep(session: u64) -> Endpoint {
    Endpoint {
        session,
        nic: 1,
        vi: 2,
        vi_gen: 1,
        reliability: 2,
        mtu: 65536,
        rdma_write: true,
        rdma_read: false,
        device: 0u64.to_le_bytes().to_vec(),
    }
}

fn addr(d: &[u8]) -> NetAddr {
    NetAddr {
        host: vec![2, 0, 0, 0, 0, 1],
        discriminator: d.to_vec(),
    }
}

/// One request of every kind.
pub fn requests() -> Vec<Request> {
    let key = ObjKey {
        kind: ObjKind::Arena,
        nic: 0,
        id: 1,
        generation: 0,
    };
    vec![
        Request::Hello { version: VERSION },
        Request::Publish { key },
        Request::Retire { key },
        Request::Fetch { session: 1, key },
        Request::Listen {
            local: addr(b"srv"),
            timeout_ms: INFINITE,
        },
        Request::Connect {
            me: ep(1),
            local: addr(b"cli"),
            remote: addr(b"srv"),
            timeout_ms: 1000,
        },
        Request::Accept { conn: 1, me: ep(2) },
        Request::Reject {
            conn: 1,
            reason: Refusal::Reject,
        },
        Request::PeerConnect {
            me: ep(1),
            local: addr(b"p1"),
            remote: addr(b"p2"),
            timeout_ms: 50,
        },
        Request::Disconnect {
            peer: ep(2),
            me: ep(1),
            reason: 1,
        },
        Request::DisconnectAck { token: 1 },
        Request::ResolveName {
            name: "localhost".into(),
        },
        Request::ResolveAddr {
            host: vec![2, 0, 0, 0, 0, 1],
        },
    ]
}

/// One reply or event of every kind.
pub fn replies() -> Vec<Reply> {
    vec![
        Reply::Welcome {
            session: 1,
            host: vec![2, 0, 0, 0, 0, 1],
            name: "host".into(),
            mode: via::proto::DaemonMode::System,
            limits: via::proto::SessionLimits {
                pin_process: 1 << 20,
                pin_user: 4 << 20,
                max_objects: 4096,
            },
        },
        Reply::Ok,
        Reply::Fd,
        Reply::Refused(Refusal::Timeout),
        Reply::Refused(Refusal::Quota),
        Reply::Incoming {
            conn: 1,
            peer: ep(1),
            remote: addr(b"cli"),
        },
        Reply::Connected { peer: ep(2) },
        Reply::Address {
            host: vec![2, 0, 0, 0, 0, 1],
        },
        Reply::Name {
            name: "host".into(),
        },
        Reply::PeerDied { session: 3 },
        Reply::RemoteDisconnect {
            me: ep(1),
            token: 1,
            reason: 4,
        },
    ]
}

/// Scenario ops (the format of [`crate::broker::parse`]).
struct Scenario(Output);

impl Scenario {
    fn new() -> Self {
        Scenario(Output::default())
    }
    fn frame(mut self, who: u8, bytes: &[u8], fd: bool) -> Self {
        self.0
            .u8(3 | (who << 3) | if fd { 0x80 } else { 0 })
            .u16(bytes.len() as u16)
            .bytes(bytes);
        self
    }
    fn request(mut self, who: u8, bytes: &[u8]) -> Self {
        self.0.u8(who << 3).u8(bytes.len() as u8).bytes(bytes);
        self
    }
    /// As [`Scenario::request`], with an fd attached.
    fn request_fd(mut self, who: u8, bytes: &[u8]) -> Self {
        self.0
            .u8(0x80 | (who << 3))
            .u8(bytes.len() as u8)
            .bytes(bytes);
        self
    }
    fn reopen(mut self, who: u8, bare: bool) -> Self {
        self.0.u8(4 | (who << 3) | if bare { 0x80 } else { 0 });
        self
    }
    fn tick(mut self, ms: u16) -> Self {
        self.0.u8(6).u16(ms).u8(0);
        self
    }
    /// Runs the scenario in system mode (bit 0x40 of its first byte).
    fn system(mut self) -> Self {
        if let Some(b) = self.0.0.first_mut() {
            *b |= 0x40;
        }
        self
    }
}

/// Generated-request bytes (see [`crate::broker::gen_request`]): an
/// endpoint of the sender's own session on VI `vi`, reliability level `rel`.
fn gen_ep(o: &mut Output, vi: u8, rel: u8) {
    o.u8(3)
        .u64(0)
        .u8(0)
        .u8(vi)
        .u8(0)
        .u8(rel)
        .u32(65536)
        .u8(1)
        .u8(0);
}
fn gen_addr(o: &mut Output, d: u8) {
    o.u8(1).bytes(&[0; 4]).u8(d);
}

/// The `viad_broker` / `viad_socket` seeds.
pub fn scenarios() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    // Every request kind as a raw frame from a session that said Hello.
    for (k, r) in requests().iter().enumerate() {
        let fd = matches!(r, Request::Publish { .. });
        let id = if matches!(r, Request::Retire { .. } | Request::DisconnectAck { .. }) {
            0
        } else {
            9
        };
        let s = Scenario::new().frame(0, &r.encode(id), fd).tick(100);
        out.push((format!("frame-{k:02}"), s.0.0));
    }
    // Client/server: listen on "a" (slot 1), connect to "a" (slot 0),
    // accept connection 1, disconnect and ack.
    let mut listen = Output::default();
    listen.u8(4).u8(5);
    gen_addr(&mut listen, 0);
    listen.u8(3).u32(0);
    let mut connect = Output::default();
    connect.u8(5).u8(6);
    gen_ep(&mut connect, 1, 1);
    gen_addr(&mut connect, 1);
    gen_addr(&mut connect, 0);
    connect.u8(3).u32(0);
    let mut accept = Output::default();
    accept.u8(6).u8(7).u8(1);
    gen_ep(&mut accept, 2, 1);
    let mut disc = Output::default();
    disc.u8(9).u8(8);
    // peer: slot 1's session, VI 2
    disc.u8(1 | (1 << 3))
        .u64(0)
        .u8(0)
        .u8(2)
        .u8(0)
        .u8(1)
        .u32(65536)
        .u8(1)
        .u8(0);
    gen_ep(&mut disc, 1, 1);
    let mut ack = Output::default();
    ack.u8(10).u8(0).u8(1);
    let s = Scenario::new()
        .request(1, &listen.0)
        .request(0, &connect.0)
        .request(1, &accept.0)
        .request(0, &disc.0)
        .request(1, &ack.0)
        .tick(3000);
    out.push(("client-server".into(), s.0.0));
    // Peer to peer: both name each other ("a" <-> "b").
    let peer = |me: u8, local: u8, remote: u8| {
        let mut o = Output::default();
        o.u8(8).u8(4);
        gen_ep(&mut o, me, 1);
        gen_addr(&mut o, local);
        gen_addr(&mut o, remote);
        o.u8(2).u32(0);
        o.0
    };
    let s = Scenario::new()
        .request(0, &peer(1, 0, 1))
        .request(2, &peer(3, 1, 0))
        .tick(100);
    out.push(("peer-to-peer".into(), s.0.0));
    // A session that dies with a pending connect; one that never says Hello.
    let s = Scenario::new()
        .request(1, &listen.0)
        .request(0, &connect.0)
        .reopen(1, false)
        .reopen(2, true)
        .frame(
            2,
            &Request::ResolveName { name: "x".into() }.encode(3),
            false,
        )
        .tick(2000);
    out.push(("deaths".into(), s.0.0));
    // System mode: slot 0 (user A) publishes arenas up to and beyond its
    // quota, slot 2 (user B) asks for them; slot 2 connects to slot 1's
    // listener on "a" (granted: refused) and on "b" (nobody of its user).
    let mut publish = Output::default();
    publish.u8(1).u8(2).u8(1).u8(0).u8(1).u8(0);
    let mut publish2 = Output::default();
    publish2.u8(1).u8(3).u8(1).u8(0).u8(2).u8(0);
    let mut publish3 = Output::default();
    publish3.u8(1).u8(4).u8(1).u8(0).u8(3).u8(0);
    let mut fetch = Output::default();
    // Fetch: session of slot 0 (selector 1: slot (1 >> 3) % 3 = 0), arena 1.
    fetch.u8(3).u8(5).u8(1).u64(0).u8(1).u8(0).u8(1).u8(0);
    let mut listen_b = Output::default();
    listen_b.u8(4).u8(6);
    gen_addr(&mut listen_b, 1);
    listen_b.u8(3).u32(0);
    let mut connect_b = Output::default();
    connect_b.u8(5).u8(7);
    gen_ep(&mut connect_b, 1, 1);
    gen_addr(&mut connect_b, 2);
    gen_addr(&mut connect_b, 1);
    connect_b.u8(2).u32(0);
    let s = Scenario::new()
        .request(1, &listen.0)
        .request(1, &listen_b.0)
        .request(2, &connect.0)
        .request(2, &connect_b.0)
        .tick(10);
    let s = Scenario(Output(
        [
            s.0.0,
            Scenario::new()
                .request_fd(0, &publish.0)
                .request_fd(0, &publish2.0)
                .request_fd(0, &publish3.0)
                .request(2, &fetch.0)
                .request(1, &fetch.0)
                .tick(3000)
                .0
                .0,
        ]
        .concat(),
    ))
    .system();
    out.push(("system-two-users".into(), s.0.0));
    out
}

/// The `viad_request` seeds: every request and reply, encoded.
pub fn frames() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for (k, r) in requests().iter().enumerate() {
        out.push((format!("request-{k:02}"), r.encode(k as u32 + 1)));
    }
    for (k, r) in replies().iter().enumerate() {
        out.push((format!("reply-{k:02}"), r.encode(k as u32)));
    }
    out
}

/// Descriptor-target input builder (the layout `descriptor::gen_desc` reads).
struct DescIn(Output);

impl DescIn {
    fn new(level: u8) -> Self {
        let mut o = Output::default();
        o.u8(level);
        DescIn(o)
    }
    /// A descriptor in the descriptor area, posted with its natural handle,
    /// operation `op` (+ immediate), with `segs` as (address selector,
    /// offset, length) in R1 (selector 0) etc., `Length` = sum.
    fn desc(mut self, send: bool, op: u8, imm: bool, segs: &[(u8, u16, u16)]) -> Self {
        let o = &mut self.0;
        o.u8(if send { 1 } else { 0 });
        o.u8(0).u8(0); // place: descriptor area, aligned
        o.u8(0); // post handle: natural
        o.u8(1 | (op << 2) | if imm { 0x40 } else { 0 }).u16(0);
        o.u8(segs.len() as u8);
        o.u32(0x1234_5678);
        o.u8(2).u32(0); // Length = sum
        for &(sel, off, len) in segs {
            o.u8(sel).u16(off).u8(0).u8(0).u16(len);
        }
        self
    }
}

/// The `descriptor` seeds: a valid descriptor of every operation at every
/// reliability level, and a few refused or faulty ones.
pub fn descriptors() -> Vec<(String, Vec<u8>)> {
    // R1 offsets: buffers at R1 + 0x2000 (source) and R1 + 0x3000 (target).
    let mut out = Vec::new();
    for level in 0..3u8 {
        let send = DescIn::new(level)
            .desc(false, 0, false, &[(0, 0x3000, 100)])
            .desc(true, 0, true, &[(0, 0x2000, 60), (0, 0x2100, 40)]);
        out.push((format!("l{level}-send-recv"), send.0.0));
        let w = DescIn::new(level)
            .desc(false, 0, false, &[(0, 0x3000, 100)])
            .desc(true, 1, true, &[(0, 0x4000, 0), (0, 0x2000, 64)]);
        out.push((format!("l{level}-rdma-write-imm"), w.0.0));
        let r = DescIn::new(level).desc(true, 2, false, &[(0, 0x4000, 0), (0, 0x2000, 64)]);
        out.push((format!("l{level}-rdma-read"), r.0.0));
        let bad = DescIn::new(level)
            .desc(false, 0, false, &[(6, 0, 16)])
            .desc(true, 0, false, &[(5, 0, 16)])
            .desc(true, 1, false, &[(4, 0, 0), (0, 0x2000, 8)]);
        out.push((format!("l{level}-faults"), bad.0.0));
    }
    out
}

/// Named inputs of one target.
pub type Seeds = Vec<(String, Vec<u8>)>;

/// Every seed, by target.
pub fn all() -> Vec<(&'static str, Seeds)> {
    vec![
        ("viad_request", frames()),
        ("viad_broker", scenarios()),
        ("viad_socket", scenarios()),
        ("descriptor", descriptors()),
    ]
}
