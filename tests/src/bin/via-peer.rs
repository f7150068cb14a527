//! The other process of the integration tests: `via-peer <scenario> <args>`.
//! It talks to the test over stdin/stdout lines.
//!
//! Scenarios:
//! * `echo <disc> <u|rd|rr> <max> <rounds>`: accept, echo every message back.
//! * `serve`: a command interpreter (below); one answer line per command.
//! * `fan <disc> <rel> <vis> <msgs>`: `vis` VIs with CQs, connected to the
//!   test; on `GO` sends `msgs` messages on each, round robin; then receives
//!   one message per VI.
//! * `sink <disc> <rel> <vis> <per_vi> <size>`: accepts `vis` connections,
//!   each with `per_vi` receives posted, and checks that every message of
//!   every sending thread arrives exactly once and in order.
//! * `autostart`: checks that no viad serves `VIA_INSTANCE`, opens a NIC
//!   (which starts one) and prints its pid.
//! * `abuse <fds|conns|sessions|listens|publishers> <n>`: a client of viad
//!   that goes beyond its limits (raw protocol): `n` published fds, `n`
//!   connections without Hello, `n` sessions, `n` listens on one session,
//!   or `n` sessions that each publish an object. Prints `ABUSED <counts>`
//!   (`publishers`: `SESSIONS <ids>`), then on any input line exits (every
//!   session it holds dies at once).
//! * `open_timed`: opens a NIC and prints `OPEN ok <ms>` or
//!   `OPEN <error> <ms>`, then closes it.
//! * `rawfetch <socket> <session> <kind>:<nic>:<id>...`: a raw client of the
//!   daemon at `<socket>` that says Hello and asks for each object
//!   (`kind` 1 NIC segment, 2 arena, 3 CQ ring) of `<session>`; prints
//!   `FETCH <key> FD` or `FETCH <key> <refusal>` for each, then `DONE`.
//! * `rawtcp <addr:port> <silent|oversize|garbage|spoof>`: a hostile
//!   client of a viad's TCP port (sockets NIC): says nothing, announces a
//!   request over the size limit, sends a malformed request, or a request
//!   whose requester address is not its own; prints `CLOSED <ms>` when
//!   viad drops the connection, or `ANSWER <answer>` if it answers.
//! * `impostor <socket>`: listens on `<socket>` (as whoever runs it),
//!   prints `READY`, accepts and reads everything, and on any input line
//!   prints `GOT <connections> <bytes> <fds>` and exits.
//! * `squat <dir|link|abstract> <victim uid> <instance>`: an impostor of
//!   another user. Binds viad's old abstract name for the victim and, with
//!   `dir`, creates the victim's `/tmp/via-rs-<uid>` as its own with a
//!   listening socket in it, with `link`, makes that path a symlink to a
//!   directory of its own with the socket. Prints `READY`, accepts and
//!   reads everything, and on any input line prints
//!   `GOT <connections> <bytes> <fds>` and exits.
//!
//! Interpreter commands (numbers in decimal or `0x` hex; `seg` is
//! `off:len` in region 0 or `off:len@region`):
//!
//! | command | answer |
//! |---|---|
//! | `open <rel> <bytes> <w> <r> [mtu]` | `MEM <addr> <handle> <len>` (NIC, tag, region 0, VI) |
//! | `listen <disc> accept\|reject [ms]` | `LISTENING`, then `ACCEPT ok\|<error>` or `REJECT ok\|<error>` |
//! | `connect <disc> [ms]` | `CONNECT ok\|<error>` (to the test's address `<disc>`) |
//! | `peer <local> <remote> [ms]` | `PEER ok\|<error>` (peer-to-peer, waits) |
//! | `daemon` | `DAEMON <user\|system> <pin per process> <pin per user> <max objects> <session>` |
//! | `attrs` | `ATTRS <max register bytes> <max block bytes> <max regions>` (`VipQueryNic`) |
//! | `try_region <bytes>` | `REGION ...` (as `region <bytes> same 0 0`) or `REGERR <error>` |
//! | `memory <bytes>` | `MEMORY <idx>` (library-owned memory the peer keeps mapped) |
//! | `try_region_in <idx>` | `REGION ...` (all of memory `idx`, tag of region 0) or `REGERR <error>` |
//! | `close` | `OK` (the NIC closed, its objects dropped; `open` may follow) |
//! | `recv <desc> <seg>...` | `OK` or `POSTERR <error>` |
//! | `send <desc> [imm=<v>] <seg>...` | `OK` or `POSTERR <error>` |
//! | `write <desc> <raddr> <rhandle> [imm=<v>] <seg>...` | RDMA write: `OK` or `POSTERR <error>` |
//! | `wait_recv` / `wait_send` | `RECV\|SEND <status> <len> <imm>` or `WAITERR <error>` |
//! | `recv_done` | `RECV ...` or `WAITERR NotDone` |
//! | `fill\|check <region> <off> <len> <seed>` | `OK` / `SAME` or `DIFF <index>` |
//! | `spin_status <desc>` | `SPINNING`, then `STATUS <status> <len> <imm>` (spins on memory only) |
//! | `spin_mem <region> <off> <len> <seed>` | `SPINNING`, then `SEEN` (spins on memory only) |
//! | `peek <region> <off> <len>` / `poke <region> <off> <hex>` | `DATA <hex>` / `OK` |
//! | `wait_error <code>` | `ERROR <code> <resource> <vi slot>` or `NOERROR` |
//! | `errors` / `clear_errors` | `ERRORS <code>,...` or `ERRORS none` / `OK` |
//! | `set_vi <w> <r>` | `OK` or `<error>` (RDMA enables of the idle VI) |
//! | `state` / `slot` | `STATE <state>` / `SLOT <n>` |
//! | `resolve <name>` | `ADDR <hex>` or `NSERR <error>` (name service) |
//! | `region <bytes> <same\|new> <w> <r>` | `REGION <idx> <addr> <handle> <len>` |
//! | `foreign <bytes>` | `REGION ...`: a region of a second NIC |
//! | `set_mem <idx> <w> <r>` | `OK` |
//! | `dereg <idx>` | `OK` |
//! | `disconnect` | `OK` or `<error>` |
//! | `stream <raddr> <rhandle> <bytes>` | `STREAMING`, then RDMA writes forever |
//! | `stream_send <bytes> [<credit off>]` | `STREAMING`, then sends forever (`[round: u64]` + pattern), message r once the u64 at `<credit off>` reaches r |
//! | `read <desc> <raddr> <rhandle> <seg>...` | RDMA read: `OK` or `POSTERR <error>` |
//! | `stream_arm <msg> <window>` | posts `stream_tx`'s first `go` receive (before the receiver starts): `OK` |
//! | `stream_tx <total> <msg> <window>` | (after `stream_arm`) sends `total` bytes in messages of `msg` bytes, `window` at a time after each `go` message of the receiver: `SENT <bytes> <checksum>` or `STREAMERR <what>` |
//! | `stream_rx <total> <msg> <window>` | the receiving side: `RECEIVED <bytes> <checksum> <bad messages>` or `STREAMERR <what>` |
//! | `exit` | (exits 0) |
//!
//! Environment of the interpreter: `VIA_PEER_DEVICE` (the NIC `open`
//! opens; default: the default NIC), `VIA_PEER_REMOTE` (IPv4 host address
//! `connect` and `peer` reach; default: this NIC's host).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use via::descriptor::status;
use via::{Cq, DescBuilder, Nic, Ptag, Region, Reliability, Vi, ViAttributes, ViState};
use via_tests::*;

fn rel(s: &str) -> Reliability {
    match s {
        "u" => Reliability::Unreliable,
        "rd" => Reliability::ReliableDelivery,
        "rr" => Reliability::ReliableReception,
        _ => panic!("reliability {s}"),
    }
}

fn main() {
    let _ = env_logger::try_init();
    let args: Vec<String> = std::env::args().collect();
    match args[1].as_str() {
        // Echo server: accept on <disc>, then echo every message back.
        "echo" => echo(
            &args[2],
            rel(&args[3]),
            args[4].parse().unwrap(),
            args[5].parse().unwrap(),
        ),
        "serve" => Interp::default().run(),
        "fan" => fan(
            &args[2],
            rel(&args[3]),
            args[4].parse().unwrap(),
            args[5].parse().unwrap(),
        ),
        "sink" => sink(
            &args[2],
            rel(&args[3]),
            args[4].parse().unwrap(),
            args[5].parse().unwrap(),
            args[6].parse().unwrap(),
        ),
        "autostart" => autostart(),
        "open_timed" => open_timed(),
        "abuse" => abuse(&args[2], args[3].parse().unwrap()),
        "squat" => squat(&args[2], args[3].parse().unwrap(), &args[4]),
        "rawfetch" => rawfetch(&args[2], args[3].parse().unwrap(), &args[4..]),
        "impostor" => impostor(&args[2]),
        "rawtcp" => rawtcp(&args[2], &args[3]),
        other => panic!("unknown scenario {other}"),
    }
}

/// Echoes every message back. Two receive buffers alternate, so the next
/// receive is posted before the reply goes out (a reliable connection breaks
/// on a message that finds no receive).
fn echo(disc: &str, r: Reliability, max: usize, rounds: u32) {
    let s = Setup::new(r, 2 * max + 8192, false, false);
    let bufs = [4096, 4096 + max];
    let descs = [0, 256];
    post_recv(&s, descs[0], bufs[0], max as u32);
    let local = s.nic.address(disc.as_bytes());
    tell("LISTENING");
    let req = s.nic.connect_wait(&local, WAIT).expect("connect wait");
    req.accept(&s.vi).expect("accept");
    for i in 0..rounds as usize {
        let c = s.vi.recv_wait(WAIT).expect("recv");
        assert_eq!(
            c.status & status::ERROR_MASK,
            0,
            "recv status {:#x}",
            c.status
        );
        let len = s.mem.word(descs[i % 2] + 24);
        post_recv(&s, descs[(i + 1) % 2], bufs[(i + 1) % 2], max as u32);
        post_send(&s, 128, bufs[i % 2], len);
        s.vi.send_wait(WAIT).expect("send");
    }
    tell("DONE");
}

/// The interpreter's objects.
#[derive(Default)]
struct Interp {
    nic: Option<Nic>,
    nic2: Option<Nic>,
    ptag: Option<Ptag>,
    regions: Vec<Option<Region>>,
    vi: Option<Vi>,
    errors: Option<Arc<ErrorLog>>,
    memories: Vec<via::Memory>,
}

fn flag(s: &str) -> bool {
    matches!(s, "1" | "true" | "y")
}

impl Interp {
    fn nic(&self) -> &Nic {
        self.nic.as_ref().expect("open first")
    }
    fn vi(&self) -> &Vi {
        self.vi.as_ref().expect("open first")
    }
    fn region(&self, i: usize) -> &Region {
        self.regions[i].as_ref().expect("live region")
    }

    /// Adds the segments `off:len[@region]` to `b`.
    fn segs(&self, mut b: DescBuilder, args: &[&str]) -> DescBuilder {
        for a in args {
            let (body, reg) = match a.split_once('@') {
                Some((x, r)) => (x, r.parse::<usize>().unwrap()),
                None => (*a, 0),
            };
            let (off, len) = body.split_once(':').expect("off:len");
            b = b.segment(self.region(reg), num(off) as usize, num(len) as u32);
        }
        b
    }

    /// Splits an optional `imm=<v>` off the arguments.
    fn imm<'a>(args: &'a [&'a str]) -> (Option<u32>, &'a [&'a str]) {
        match args.first().and_then(|a| a.strip_prefix("imm=")) {
            Some(v) => (Some(num(v) as u32), &args[1..]),
            None => (None, args),
        }
    }

    fn post(&self, desc: usize, b: DescBuilder, send: bool) -> String {
        let mem = self.region(0);
        let d = b.write(mem, desc).unwrap();
        let r = if send {
            self.vi().post_send(mem, d)
        } else {
            self.vi().post_recv(mem, d)
        };
        match r {
            Ok(()) => "OK".into(),
            Err(e) => format!("POSTERR {:?}", e.kind()),
        }
    }

    fn completion(&self, tag: &str, r: via::Result<via::Completion>) -> String {
        match r {
            Ok(c) => {
                let m = self.region(0);
                let off = (c.desc - m.addr(0).unwrap()) as usize;
                format!(
                    "{tag} {:#x} {} {:#x}",
                    c.status,
                    m.word(off + 24),
                    m.word(off + 20)
                )
            }
            Err(e) => format!("WAITERR {:?}", e.kind()),
        }
    }

    fn run(mut self) {
        while let Some(line) = read_cmd() {
            let a: Vec<&str> = line.split_whitespace().collect();
            if a.is_empty() {
                continue;
            }
            if a[0] == "exit" {
                if let Some(n) = &self.nic {
                    let _ = n.close();
                }
                return;
            }
            let out = self.exec(&a);
            tell(&out);
        }
    }

    fn exec(&mut self, a: &[&str]) -> String {
        match a[0] {
            "open" => {
                let dev = std::env::var("VIA_PEER_DEVICE").ok();
                let nic = Nic::open(dev.as_deref()).expect("open NIC");
                let errors = ErrorLog::install(&nic);
                let ptag = nic.create_ptag().unwrap();
                let (w, r) = (flag(a[3]), flag(a[4]));
                let mem = Region::new(&nic, num(a[2]) as usize, ptag, w, r).unwrap();
                let mut at = ViAttributes::new(rel(a[1]), ptag);
                at.enable_rdma_write = w;
                at.enable_rdma_read = r;
                if let Some(m) = a.get(5) {
                    at.max_transfer_size = num(m) as u32;
                }
                let vi = nic.create_vi(&at, None, None).unwrap();
                let out = format!(
                    "MEM {:#x} {} {}",
                    mem.addr(0).unwrap(),
                    mem.handle(),
                    mem.len()
                );
                self.nic = Some(nic);
                self.ptag = Some(ptag);
                self.regions = vec![Some(mem)];
                self.vi = Some(vi);
                self.errors = Some(errors);
                out
            }
            "listen" => {
                let local = self.nic().address(a[1].as_bytes());
                tell("LISTENING");
                let req = match self.nic().connect_wait(&local, ms(a.get(3), WAIT)) {
                    Ok(r) => r,
                    Err(e) => return format!("ACCEPT {:?}", e.kind()),
                };
                if a[2] == "reject" {
                    match req.reject() {
                        Ok(()) => "REJECT ok".into(),
                        Err(e) => format!("REJECT {:?}", e.kind()),
                    }
                } else {
                    match req.accept(self.vi()) {
                        Ok(()) => "ACCEPT ok".into(),
                        Err(e) => format!("ACCEPT {:?}", e.kind()),
                    }
                }
            }
            "connect" => {
                let local = self.nic().address(b"peer");
                let mut remote = self.nic().address(a[1].as_bytes());
                if let Ok(h) = std::env::var("VIA_PEER_REMOTE") {
                    let ip: std::net::Ipv4Addr = h.parse().expect("VIA_PEER_REMOTE: IPv4");
                    remote.host = ip.octets().to_vec();
                }
                match self.vi().connect(&local, &remote, ms(a.get(2), WAIT)) {
                    Ok(_) => "CONNECT ok".into(),
                    Err(e) => format!("CONNECT {:?}", e.kind()),
                }
            }
            "peer" => {
                let local = self.nic().address(a[1].as_bytes());
                let mut remote = self.nic().address(a[2].as_bytes());
                if let Ok(h) = std::env::var("VIA_PEER_REMOTE") {
                    let ip: std::net::Ipv4Addr = h.parse().expect("VIA_PEER_REMOTE: IPv4");
                    remote.host = ip.octets().to_vec();
                }
                let r = self
                    .vi()
                    .connect_peer(&local, &remote, ms(a.get(3), WAIT))
                    .and_then(|()| self.vi().connect_peer_wait());
                match r {
                    Ok(_) => "PEER ok".into(),
                    Err(e) => format!("PEER {:?}", e.kind()),
                }
            }
            "recv" => {
                let b = self.segs(DescBuilder::recv(), &a[2..]);
                self.post(num(a[1]) as usize, b, false)
            }
            "send" => {
                let (imm, rest) = Self::imm(&a[2..]);
                let mut b = DescBuilder::send();
                if let Some(v) = imm {
                    b = b.immediate(v);
                }
                let b = self.segs(b, rest);
                self.post(num(a[1]) as usize, b, true)
            }
            "write" => {
                let (imm, rest) = Self::imm(&a[4..]);
                let mut b = DescBuilder::rdma_write(num(a[2]), num(a[3]) as u32);
                if let Some(v) = imm {
                    b = b.immediate(v);
                }
                let b = self.segs(b, rest);
                self.post(num(a[1]) as usize, b, true)
            }
            "read" => {
                let b = DescBuilder::rdma_read(num(a[2]), num(a[3]) as u32);
                let b = self.segs(b, &a[4..]);
                self.post(num(a[1]) as usize, b, true)
            }
            "pp_arm" => {
                // The first receive of `pingpong` (posted before either side
                // sends: a reliable connection breaks on a message that finds
                // no receive).
                let n = num(a[1]) as usize;
                match pp_recv(self.vi(), self.region(0), n, 0) {
                    Ok(()) => "OK".into(),
                    Err(e) => format!("PPERR {e}"),
                }
            }
            "pingpong" => {
                // pingpong <bytes> <rounds> <first: 0|1>: polling ping-pong
                // (Vip*Done in a loop); answers the longest and the total
                // round trip in µs.
                let (n, rounds, first) = (num(a[1]) as usize, num(a[2]), a[3] == "1");
                match pingpong(self.vi(), self.region(0), n, rounds, first) {
                    Ok((max, total)) => format!("PINGPONG {max} {total}"),
                    Err(e) => format!("PPERR {e}"),
                }
            }
            "stream_arm" => {
                let (msg, window) = (num(a[1]) as usize, num(a[2]) as usize);
                match post_go(self.vi(), self.region(0), msg, window) {
                    Ok(()) => "OK".into(),
                    Err(e) => format!("STREAMERR {e}"),
                }
            }
            "stream_tx" => {
                let (total, msg, window) = (num(a[1]), num(a[2]) as usize, num(a[3]) as usize);
                match stream_tx(self.vi(), self.region(0), total, msg, window) {
                    Ok((n, sum)) => format!("SENT {n} {sum:#x}"),
                    Err(e) => format!("STREAMERR {e}"),
                }
            }
            "stream_rx" => {
                let (total, msg, window) = (num(a[1]), num(a[2]) as usize, num(a[3]) as usize);
                match stream_rx(self.vi(), self.region(0), total, msg, window) {
                    Ok((n, sum, bad)) => format!("RECEIVED {n} {sum:#x} {bad}"),
                    Err(e) => format!("STREAMERR {e}"),
                }
            }
            "recvs" => {
                // recvs <count> <bytes>: `count` receives, descriptor i at
                // 64 i, buffer at BURST_DATA + i bytes.
                let (count, n) = (num(a[1]) as usize, num(a[2]) as usize);
                for i in 0..count {
                    let d = DescBuilder::recv()
                        .segment(self.region(0), BURST_DATA + i * n, n as u32)
                        .write(self.region(0), 64 * i)
                        .unwrap();
                    if let Err(e) = self.vi().post_recv(self.region(0), d) {
                        return format!("POSTERR {:?}", e.kind());
                    }
                }
                "OK".into()
            }
            "burst" => {
                // burst <count> <bytes> <window> [first]: see `burst`.
                let (count, n, w) = (num(a[1]), num(a[2]) as usize, num(a[3]) as usize);
                let first = a.get(4).map_or(0, |f| num(f));
                match burst(self.vi(), self.region(0), first, count, n, w) {
                    Ok((max, mean)) => format!("BURST {max} {mean}"),
                    Err(e) => format!("BURSTERR {e}"),
                }
            }
            "drain" => {
                // drain <count> <bytes> <poll|block>: the receives of `recvs`
                // complete in order, each with message i of `burst`.
                let (count, n, poll) = (num(a[1]) as usize, num(a[2]) as usize, a[3] == "poll");
                match drain(self.vi(), self.region(0), count, n, poll) {
                    Ok(()) => format!("DRAINED {count}"),
                    Err(e) => format!("DRAINERR {e}"),
                }
            }
            "send_done" => self.completion("SEND", self.vi().send_done()),
            "wait_recv" => self.completion("RECV", self.vi().recv_wait(WAIT)),
            "wait_send" => self.completion("SEND", self.vi().send_wait(WAIT)),
            "recv_done" => self.completion("RECV", self.vi().recv_done()),
            "fill" => {
                let p = pattern(num(a[3]) as usize, num(a[4]) as u32);
                self.region(num(a[1]) as usize)
                    .write(num(a[2]) as usize, &p)
                    .unwrap();
                "OK".into()
            }
            "check" => {
                let p = pattern(num(a[3]) as usize, num(a[4]) as u32);
                let mut got = vec![0u8; p.len()];
                self.region(num(a[1]) as usize)
                    .read(num(a[2]) as usize, &mut got)
                    .unwrap();
                match got.iter().zip(&p).position(|(x, y)| x != y) {
                    None => "SAME".into(),
                    Some(i) => format!("DIFF {i}"),
                }
            }
            "spin_status" => {
                // Only memory loads while spinning: no library call runs here.
                let desc = num(a[1]) as usize;
                let m = self.region(0);
                tell("SPINNING");
                let deadline = Instant::now() + WAIT.unwrap();
                loop {
                    let st = m.status(desc);
                    if st & status::DONE != 0 {
                        return format!(
                            "STATUS {st:#x} {} {:#x}",
                            m.word(desc + 24),
                            m.word(desc + 20)
                        );
                    }
                    if Instant::now() > deadline {
                        return "SPINTIMEOUT".into();
                    }
                    std::hint::spin_loop();
                }
            }
            "spin_mem" => {
                let m = self.region(num(a[1]) as usize);
                let (off, p) = (
                    num(a[2]) as usize,
                    pattern(num(a[3]) as usize, num(a[4]) as u32),
                );
                let mut got = vec![0u8; p.len()];
                tell("SPINNING");
                let deadline = Instant::now() + WAIT.unwrap();
                loop {
                    m.read(off, &mut got).unwrap();
                    if got == p {
                        return "SEEN".into();
                    }
                    if Instant::now() > deadline {
                        return "SPINTIMEOUT".into();
                    }
                    std::hint::spin_loop();
                }
            }
            "tail_watch" => {
                // tail_watch <region> <off> <slot> <len> <rounds>: for each
                // round k, spins (Acquire loads) on the last 8 bytes of
                // slot k until they read k + 1, then checks that the
                // `len - 8` bytes before them are all (k + 1) as u8.
                let m = self.region(num(a[1]) as usize);
                let (off, slot, len, rounds) = (
                    num(a[2]) as usize,
                    num(a[3]) as usize,
                    num(a[4]) as usize,
                    num(a[5]),
                );
                let mut body = vec![0u8; len - 8];
                let mut bad = 0u64;
                tell("WATCHING");
                let deadline = Instant::now() + WAIT.unwrap();
                for k in 0..rounds {
                    let at = off + k as usize * slot;
                    loop {
                        if m.load_u64(at + len - 8) == Some(k + 1) {
                            break;
                        }
                        if Instant::now() > deadline {
                            return format!("TAILTIMEOUT {k}");
                        }
                        std::hint::spin_loop();
                    }
                    m.read(at, &mut body).unwrap();
                    if body.iter().any(|&b| b != (k + 1) as u8) {
                        bad += 1;
                    }
                }
                format!("TAIL {bad}")
            }
            "wait_error" => {
                let log = self.errors.as_ref().unwrap();
                let code = code(a[1]);
                match log.take(code, WAIT.unwrap()) {
                    Some((e, _, _)) => format!(
                        "ERROR {:?} {:?} {}",
                        e.code,
                        e.resource,
                        e.vi.map_or(-1, |v| v.0 as i64)
                    ),
                    None => "NOERROR".into(),
                }
            }
            "errors" => {
                let all = self.errors.as_ref().unwrap().all();
                let v: Vec<String> = all.iter().map(|e| format!("{:?}", e.code)).collect();
                if v.is_empty() {
                    "ERRORS none".into()
                } else {
                    format!("ERRORS {}", v.join(","))
                }
            }
            "clear_errors" => {
                self.errors.as_ref().unwrap().clear();
                "OK".into()
            }
            "set_vi" => {
                let mut at = self.vi().attributes();
                at.enable_rdma_write = flag(a[1]);
                at.enable_rdma_read = flag(a[2]);
                match self.vi().set_attributes(&at) {
                    Ok(()) => "OK".into(),
                    Err(e) => format!("{:?}", e.kind()),
                }
            }
            "peek" => {
                let mut b = vec![0u8; num(a[3]) as usize];
                self.region(num(a[1]) as usize)
                    .read(num(a[2]) as usize, &mut b)
                    .unwrap();
                format!("DATA {}", hex(&b))
            }
            "poke" => {
                self.region(num(a[1]) as usize)
                    .write(num(a[2]) as usize, &unhex(a[3]))
                    .unwrap();
                "OK".into()
            }
            "state" => format!("STATE {:?}", self.vi().state()),
            "resolve" => match self.nic().resolve(a[1]) {
                Ok(h) => format!("ADDR {}", hex(&h)),
                Err(e) => format!("NSERR {:?}", e.kind()),
            },
            "slot" => format!("SLOT {}", self.vi().slot()),
            "daemon" => {
                let d = self.nic().daemon();
                format!(
                    "DAEMON {} {} {} {} {}",
                    match d.mode {
                        via::proto::DaemonMode::User => "user",
                        via::proto::DaemonMode::System => "system",
                    },
                    d.limits.pin_process,
                    d.limits.pin_user,
                    d.limits.max_objects,
                    self.nic().session_id()
                )
            }
            "attrs" => {
                let at = self.nic().attributes();
                format!(
                    "ATTRS {} {} {}",
                    at.max_register_bytes, at.max_register_block_bytes, at.max_register_regions
                )
            }
            "try_region" => {
                match Region::new(
                    self.nic(),
                    num(a[1]) as usize,
                    self.ptag.unwrap(),
                    false,
                    false,
                ) {
                    Ok(m) => self.add_region(m),
                    Err(e) => format!("REGERR {:?}", e.kind()),
                }
            }
            "memory" => {
                self.memories
                    .push(via::Memory::new(num(a[1]) as usize).expect("memory"));
                format!("MEMORY {}", self.memories.len() - 1)
            }
            "try_region_in" => {
                let m = &self.memories[num(a[1]) as usize];
                match Region::within(self.nic(), m, 0, m.len(), self.ptag.unwrap(), false, false) {
                    Ok(r) => self.add_region(r),
                    Err(e) => format!("REGERR {:?}", e.kind()),
                }
            }
            "close" => {
                self.vi = None;
                self.regions.clear();
                self.ptag = None;
                self.errors = None;
                if let Some(n) = self.nic2.take() {
                    let _ = n.close();
                }
                if let Some(n) = self.nic.take() {
                    let _ = n.close();
                }
                "OK".into()
            }
            "region" => {
                let ptag = if a[2] == "new" {
                    self.nic().create_ptag().unwrap()
                } else {
                    self.ptag.unwrap()
                };
                let m = Region::new(self.nic(), num(a[1]) as usize, ptag, flag(a[3]), flag(a[4]))
                    .unwrap();
                self.add_region(m)
            }
            "foreign" => {
                let nic2 = Nic::open(None).expect("second NIC");
                let p2 = nic2.create_ptag().unwrap();
                let m = Region::new(&nic2, num(a[1]) as usize, p2, true, true).unwrap();
                self.nic2 = Some(nic2);
                self.add_region(m)
            }
            "set_mem" => {
                self.region(num(a[1]) as usize)
                    .set_attributes(self.ptag.unwrap(), flag(a[2]), flag(a[3]))
                    .unwrap();
                "OK".into()
            }
            "dereg" => {
                let m = self.regions[num(a[1]) as usize].take().unwrap();
                m.deregister().unwrap();
                "OK".into()
            }
            "disconnect" => match self.vi().disconnect() {
                Ok(()) => "OK".into(),
                Err(e) => format!("{:?}", e.kind()),
            },
            "stream" => {
                // RDMA writes into the test's memory until killed: each
                // round writes a chunk, then the round number at offset 0.
                let (raddr, rh, n) = (num(a[1]), num(a[2]) as u32, num(a[3]) as usize);
                let m = self.region(0);
                tell("STREAMING");
                for round in 1u64.. {
                    m.write(8192, &pattern(n, round as u32)).unwrap();
                    m.write(4096, &round.to_ne_bytes()).unwrap();
                    let d = DescBuilder::rdma_write(raddr + 4096, rh)
                        .segment(m, 8192, n as u32)
                        .write(m, 0)
                        .unwrap();
                    let c = DescBuilder::rdma_write(raddr, rh)
                        .segment(m, 4096, 8)
                        .write(m, 64)
                        .unwrap();
                    if self.vi().post_send(m, d).is_err() || self.vi().post_send(m, c).is_err() {
                        break;
                    }
                    let ok = (0..2).all(|_| {
                        self.vi()
                            .send_wait(WAIT)
                            .is_ok_and(|c| c.status & status::ERROR_MASK == 0)
                    });
                    if !ok {
                        break;
                    }
                }
                "STREAMEND".into()
            }
            "stream_send" => {
                // Sends forever: message r is [r: u64] then pattern(n - 8, r).
                // With a credit offset, message r waits until the u64 there
                // (RDMA-written by the receiver) is at least r, and the
                // stream ends when the VI leaves Connected.
                let n = num(a[1]) as usize;
                let credit_at = a.get(2).map(|c| num(c) as usize);
                let m = self.region(0);
                tell("STREAMING");
                for round in 1u64.. {
                    if let Some(at) = credit_at {
                        let mut c = [0u8; 8];
                        while {
                            m.read(at, &mut c).unwrap();
                            u64::from_ne_bytes(c) < round
                        } {
                            if self.vi().state() != ViState::Connected {
                                return "STREAMEND".into();
                            }
                            std::thread::yield_now();
                        }
                    }
                    m.write(8192, &round.to_ne_bytes()).unwrap();
                    m.write(8200, &pattern(n - 8, round as u32)).unwrap();
                    let d = DescBuilder::send()
                        .segment(m, 8192, n as u32)
                        .write(m, 0)
                        .unwrap();
                    if self.vi().post_send(m, d).is_err()
                        || !self
                            .vi()
                            .send_wait(WAIT)
                            .is_ok_and(|c| c.status & status::ERROR_MASK == 0)
                    {
                        break;
                    }
                }
                "STREAMEND".into()
            }
            other => panic!("unknown command {other}"),
        }
    }

    fn add_region(&mut self, m: Region) -> String {
        let out = format!(
            "REGION {} {:#x} {} {}",
            self.regions.len(),
            m.addr(0).unwrap(),
            m.handle(),
            m.len()
        );
        self.regions.push(Some(m));
        out
    }
}

/// Region layout of `stream_tx`/`stream_rx`: descriptors at 64-byte
/// steps from 0 (`window` data descriptors, then the `go` one), data from
/// [`STREAM_DATA`].
const STREAM_DATA: usize = 1 << 16;

/// Message `i` of a stream: `[i: u64]`, then bytes that depend on `i` and
/// the position.
fn stream_msg(i: u64, msg: usize, out: &mut [u8]) {
    out[..8].copy_from_slice(&i.to_le_bytes());
    let mut x = (i as u32).wrapping_mul(0x9e37_79b9) | 1;
    for b in &mut out[8..msg] {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        *b = x as u8;
    }
}

/// FNV-1a over `b`, continuing `h`.
fn fnv(mut h: u64, b: &[u8]) -> u64 {
    for &x in b {
        h = (h ^ x as u64).wrapping_mul(0x100_0000_01b3);
    }
    h
}

fn ok(c: via::Result<via::Completion>, what: &str) -> Result<via::Completion, String> {
    match c {
        Ok(c) if c.status & status::ERROR_MASK == 0 => Ok(c),
        Ok(c) => Err(format!("{what}:status:{:#x}", c.status)),
        Err(e) => Err(format!("{what}:{:?}", e.kind())),
    }
}

/// Where `recvs` and `burst` put message bytes.
const BURST_DATA: usize = 1 << 16;

/// Message `i` of a burst: `[i: u64]`, then `pattern(n - 8, i)`.
fn burst_msg(i: u64, n: usize) -> Vec<u8> {
    let mut b = i.to_le_bytes().to_vec();
    b.extend(pattern(n - 8, i as u32));
    b
}

/// Sends messages `first..first + count` of `n` bytes back to back, at most `window`
/// outstanding, polling (`VipSendDone`) for each completion; each must
/// complete without error and in posting order. The longest and the mean
/// time from posting a send to seeing it complete, in µs.
fn burst(
    vi: &Vi,
    m: &Region,
    first: u64,
    count: u64,
    n: usize,
    window: usize,
) -> Result<(u64, u64), String> {
    let mut posted = std::collections::VecDeque::new();
    let (mut max, mut total) = (0u64, 0u64);
    let base = m.addr(0).unwrap();
    let mut complete = |posted: &mut std::collections::VecDeque<(u64, Instant)>| {
        let (i, t) = posted.pop_front().unwrap();
        let start = Instant::now();
        let c = loop {
            match vi.send_done() {
                Err(e) if e.kind() == via::ErrorKind::NotDone => {
                    if start.elapsed() > std::time::Duration::from_secs(30) {
                        return Err(format!("send {i}: no completion in 30 s"));
                    }
                }
                c => break ok(c, "send")?,
            }
        };
        let us = t.elapsed().as_micros() as u64;
        let want = base + 64 * (i as usize % window) as u64;
        if c.desc != want {
            return Err(format!("send {i}: completed {:#x}, not {want:#x}", c.desc));
        }
        max = max.max(us);
        total += us;
        Ok(())
    };
    for i in first..first + count {
        if posted.len() == window {
            complete(&mut posted)?;
        }
        let at = BURST_DATA + (i as usize % window) * n;
        m.write(at, &burst_msg(i, n)).unwrap();
        let d = DescBuilder::send()
            .segment(m, at, n as u32)
            .write(m, 64 * (i as usize % window))
            .unwrap();
        vi.post_send(m, d)
            .map_err(|e| format!("post send:{:?}", e.kind()))?;
        posted.push_back((i, Instant::now()));
    }
    while !posted.is_empty() {
        complete(&mut posted)?;
    }
    Ok((max, total / count.max(1)))
}

/// Waits (`poll`: `VipRecvDone` in a loop; else `VipRecvWait`) for the
/// `count` receives of `recvs`: in order, without error, each holding
/// message i of `burst`.
fn drain(vi: &Vi, m: &Region, count: usize, n: usize, poll: bool) -> Result<(), String> {
    let base = m.addr(0).unwrap();
    for i in 0..count {
        let c = if poll {
            let t = Instant::now();
            loop {
                match vi.recv_done() {
                    Err(e) if e.kind() == via::ErrorKind::NotDone => {
                        if t.elapsed() > std::time::Duration::from_secs(30) {
                            return Err(format!("recv {i}: no completion in 30 s"));
                        }
                    }
                    c => break ok(c, "recv")?,
                }
            }
        } else {
            ok(vi.recv_wait(WAIT), "recv")?
        };
        if c.desc != base + 64 * i as u64 {
            return Err(format!("recv {i}: completed {:#x}", c.desc));
        }
        let mut got = vec![0u8; n];
        m.read(BURST_DATA + i * n, &mut got).unwrap();
        if got != burst_msg(i as u64, n) {
            return Err(format!("recv {i}: bytes differ"));
        }
    }
    Ok(())
}

/// Posts the receive of a `go` message of `stream_rx`.
fn post_go(vi: &Vi, m: &Region, msg: usize, window: usize) -> Result<(), String> {
    let d = DescBuilder::recv()
        .segment(m, STREAM_DATA + window * msg, 64)
        .write(m, window * 64)
        .unwrap();
    vi.post_recv(m, d)
        .map_err(|e| format!("post go:{:?}", e.kind()))
}

/// Posts receive `k` (of two that alternate) of `pingpong`: descriptors at
/// 128 and 192, data at 4096 + n.
fn pp_recv(vi: &Vi, m: &Region, n: usize, k: usize) -> Result<(), String> {
    let d = DescBuilder::recv()
        .segment(m, 4096 + n, n as u32)
        .write(m, 128 + 64 * (k % 2))
        .unwrap();
    vi.post_recv(m, d)
        .map_err(|e| format!("post recv:{:?}", e.kind()))
}

/// Polls for a completion (`Vip*Done` in a loop) for at most 30 s.
fn poll_done(f: impl Fn() -> via::Result<via::Completion>, what: &str) -> Result<(), String> {
    let t = Instant::now();
    loop {
        match f() {
            Err(e) if e.kind() == via::ErrorKind::NotDone => {
                if t.elapsed() > std::time::Duration::from_secs(30) {
                    return Err(format!("{what}:no completion in 30 s"));
                }
            }
            c => return ok(c, what).map(|_| ()),
        }
    }
}

/// A polling ping-pong of `n`-byte messages, `rounds` round trips, this
/// side sending `first` or answering; the longest and the total round trip
/// in µs. The first receive is posted by `pp_arm`.
fn pingpong(vi: &Vi, m: &Region, n: usize, rounds: u64, first: bool) -> Result<(u64, u64), String> {
    m.write(4096, &pattern(n, 5)).unwrap();
    let send = || {
        let d = DescBuilder::send()
            .segment(m, 4096, n as u32)
            .write(m, 0)
            .unwrap();
        vi.post_send(m, d)
            .map_err(|e| format!("post send:{:?}", e.kind()))?;
        poll_done(|| vi.send_done(), "send")
    };
    let (mut max, start) = (0u64, Instant::now());
    for i in 0..rounds as usize {
        let t = Instant::now();
        if first {
            send()?;
        }
        poll_done(|| vi.recv_done(), "recv")?;
        pp_recv(vi, m, n, i + 1)?;
        if !first {
            send()?;
        }
        if first {
            max = max.max(t.elapsed().as_micros() as u64);
        }
    }
    let mut got = vec![0u8; n];
    m.read(4096 + n, &mut got).unwrap();
    if got != pattern(n, 5) {
        return Err("bytes differ".into());
    }
    Ok((max, start.elapsed().as_micros() as u64))
}

/// The sending side of a checksummed stream (see `stream_rx`).
fn stream_tx(
    vi: &Vi,
    m: &Region,
    total: u64,
    msg: usize,
    window: usize,
) -> Result<(u64, u64), String> {
    let mut buf = vec![0u8; msg];
    let (mut sent, mut i, mut sum) = (0u64, 0u64, 0xcbf2_9ce4_8422_2325u64);
    // The next `go` receive is posted before the batch that provokes it
    // (the first one by `stream_arm`, before the receiver starts).
    let post_go = || post_go(vi, m, msg, window);
    while sent < total {
        ok(vi.recv_wait(WAIT), "go")?;
        let n = window.min(((total - sent) as usize).div_ceil(msg));
        if sent + ((n * msg) as u64) < total {
            post_go()?;
        }
        let mut batch = 0u64;
        for k in 0..n {
            let len = msg.min((total - sent) as usize - k * msg);
            batch += len as u64;
            let at = STREAM_DATA + k * msg;
            stream_msg(i + k as u64, len.max(8), &mut buf);
            m.write(at, &buf[..len]).unwrap();
            sum = fnv(sum, &buf[..len]);
            let d = DescBuilder::send()
                .segment(m, at, len as u32)
                .write(m, k * 64)
                .unwrap();
            vi.post_send(m, d)
                .map_err(|e| format!("post send:{:?}", e.kind()))?;
        }
        for _ in 0..n {
            ok(vi.send_wait(WAIT), "send")?;
        }
        sent += batch;
        i += n as u64;
    }
    Ok((sent, sum))
}

/// The receiving side: posts `window` receives, sends `go`, checks each
/// message (its index first: every message exactly once and in order, and
/// its bytes), and returns the bytes, their checksum and the number of bad
/// messages.
fn stream_rx(
    vi: &Vi,
    m: &Region,
    total: u64,
    msg: usize,
    window: usize,
) -> Result<(u64, u64, u64), String> {
    let go = window * 64;
    let mut want = vec![0u8; msg];
    let mut got = vec![0u8; msg];
    let (mut recvd, mut i, mut bad, mut sum) = (0u64, 0u64, 0u64, 0xcbf2_9ce4_8422_2325u64);
    while recvd < total {
        let n = window.min(((total - recvd) as usize).div_ceil(msg));
        for k in 0..n {
            let d = DescBuilder::recv()
                .segment(m, STREAM_DATA + k * msg, msg as u32)
                .write(m, k * 64)
                .unwrap();
            vi.post_recv(m, d)
                .map_err(|e| format!("post recv:{:?}", e.kind()))?;
        }
        let d = DescBuilder::send()
            .segment(m, STREAM_DATA + window * msg, 1)
            .write(m, go)
            .unwrap();
        vi.post_send(m, d)
            .map_err(|e| format!("post go:{:?}", e.kind()))?;
        ok(vi.send_wait(WAIT), "go")?;
        for k in 0..n {
            let c = ok(vi.recv_wait(WAIT), "recv")?;
            let len = m.word(k * 64 + 24) as usize;
            let expect = msg.min((total - recvd) as usize);
            m.read(STREAM_DATA + k * msg, &mut got[..len]).unwrap();
            stream_msg(i, len.max(8), &mut want);
            if len != expect || got[..len] != want[..len] || c.desc != m.addr(k * 64).unwrap() {
                bad += 1;
            }
            sum = fnv(sum, &got[..len]);
            recvd += len as u64;
            i += 1;
        }
    }
    Ok((recvd, sum, bad))
}

/// `rawtcp`: see the module doc.
fn rawtcp(to: &str, how: &str) {
    use std::io::{Read, Write};
    use via_wire::tcp::{SetupAnswer, SetupRequest};
    let mut s = std::net::TcpStream::connect(to).expect("connect to viad's port");
    let t = Instant::now();
    let req = |host: Vec<u8>| SetupRequest {
        local: via::NetAddr {
            host,
            discriminator: b"x".to_vec(),
        },
        remote: via::NetAddr {
            host: match s.peer_addr().unwrap().ip() {
                std::net::IpAddr::V4(a) => a.octets().to_vec(),
                std::net::IpAddr::V6(_) => panic!("IPv4 only"),
            },
            discriminator: b"nobody".to_vec(),
        },
        reliability: 2,
        mtu: 65536,
        rdma_write: false,
        rdma_read: false,
        timeout_ms: 100,
        peer: false,
    };
    match how {
        "silent" => {}
        "oversize" => s.write_all(&(1u32 << 30).to_le_bytes()).unwrap(),
        "garbage" => {
            s.write_all(&16u32.to_le_bytes()).unwrap();
            s.write_all(&[0xab; 16]).unwrap();
        }
        "spoof" => s.write_all(&req(vec![192, 0, 2, 77]).encode()).unwrap(),
        other => panic!("rawtcp {other}"),
    }
    let mut head = [0u8; 4];
    match s.read_exact(&mut head) {
        Err(_) => tell(&format!("CLOSED {}", t.elapsed().as_millis())),
        Ok(()) => {
            let n = via_wire::tcp::body_len(head).expect("answer length");
            let mut body = vec![0u8; n];
            s.read_exact(&mut body).unwrap();
            tell(&format!("ANSWER {:?}", SetupAnswer::decode(&body).unwrap()));
        }
    }
}

/// An optional timeout argument in milliseconds (`inf`: none), else `default`.
fn ms(a: Option<&&str>, default: Option<std::time::Duration>) -> Option<std::time::Duration> {
    match a {
        None => default,
        Some(&"inf") => None,
        Some(v) => Some(std::time::Duration::from_millis(num(v))),
    }
}

fn code(s: &str) -> via::ErrorCode {
    use via::ErrorCode::*;
    match s {
        "PostDesc" => PostDesc,
        "ConnLost" => ConnLost,
        "RecvqEmpty" => RecvqEmpty,
        "RdmawProt" => RdmawProt,
        "RdmarProt" => RdmarProt,
        "CompProt" => CompProt,
        "Catastrophic" => Catastrophic,
        _ => panic!("error code {s}"),
    }
}

/// `fan`: `vis` VIs, each connected to the test's server on `disc`. Send
/// completions go to one CQ, receive completions to another; both are
/// drained through the CQ only.
fn fan(disc: &str, r: Reliability, vis: usize, msgs: usize) {
    const MSG: usize = 64;
    tell(&format!("MODE {}", via::config::Config::get().cq.as_str()));
    let nic = Nic::open(None).expect("open NIC");
    let ptag = nic.create_ptag().unwrap();
    let sends = vis * msgs;
    let mem = Region::new(&nic, 2 * (sends + vis) * MSG + 4096, ptag, false, false).unwrap();
    let scq: Cq = nic.create_cq(sends as u32).unwrap();
    let rcq: Cq = nic.create_cq(vis as u32).unwrap();
    let at = ViAttributes::new(r, ptag);
    let v: Vec<Vi> = (0..vis)
        .map(|_| nic.create_vi(&at, Some(&scq), Some(&rcq)).unwrap())
        .collect();
    let by_slot: HashMap<u32, usize> = v.iter().enumerate().map(|(i, x)| (x.slot(), i)).collect();
    // Layout: send descriptors, then receive descriptors, then buffers.
    let (sdesc, rdesc) = (0, sends * 64);
    let bufs = (sends + vis) * 64;
    let rbuf = |i: usize| bufs + (sends + i) * MSG;
    for (i, x) in v.iter().enumerate() {
        let d = DescBuilder::recv()
            .segment(&mem, rbuf(i), MSG as u32)
            .write(&mem, rdesc + i * 64)
            .unwrap();
        x.post_recv(&mem, d).unwrap();
        let local = nic.address(format!("fan-{i}").as_bytes());
        x.connect(&local, &nic.address(disc.as_bytes()), WAIT)
            .expect("connect");
    }
    tell("CONNECTED");
    assert_eq!(read_cmd().as_deref(), Some("GO"));
    // Round robin: message j of every VI before message j + 1 of any.
    for j in 0..msgs {
        for (i, x) in v.iter().enumerate() {
            let k = j * vis + i;
            let mut p = pattern(MSG, k as u32);
            p[0..4].copy_from_slice(&(i as u32).to_le_bytes());
            p[4..8].copy_from_slice(&(j as u32).to_le_bytes());
            mem.write(bufs + k * MSG, &p).unwrap();
            let d = DescBuilder::send()
                .segment(&mem, bufs + k * MSG, MSG as u32)
                .write(&mem, sdesc + k * 64)
                .unwrap();
            x.post_send(&mem, d).unwrap();
        }
    }
    let mut next = vec![0usize; vis];
    for _ in 0..sends {
        let (slot, is_recv) = scq.wait(WAIT).expect("send CQ");
        assert!(!is_recv);
        let i = by_slot[&slot];
        let c = v[i].send_done().expect("send done after CQ");
        assert_eq!(c.status, status::DONE, "send status");
        let k = ((c.desc - mem.addr(sdesc).unwrap()) / 64) as usize;
        assert_eq!(k, next[i] * vis + i, "send FIFO of VI {i}");
        next[i] += 1;
    }
    assert_eq!(scq.done(), Err(via::Error::NotDone));
    tell("SENT");
    let mut got = vec![false; vis];
    for _ in 0..vis {
        let (slot, is_recv) = rcq.wait(WAIT).expect("recv CQ");
        assert!(is_recv);
        let i = by_slot[&slot];
        let c = v[i].recv_done().expect("recv done after CQ");
        assert_eq!(c.status, status::DONE | status::OP_RECEIVE);
        let mut b = vec![0u8; MSG];
        mem.read(rbuf(i), &mut b).unwrap();
        assert_eq!(b, pattern(MSG, 1000 + i as u32), "reply data on VI {i}");
        assert!(!std::mem::replace(&mut got[i], true));
    }
    assert_eq!(rcq.done(), Err(via::Error::NotDone));
    tell("GOT");
    // Wait for the test to finish before the VIs go away.
    let _ = read_cmd();
    let _ = nic.close();
}

/// `sink`: accepts `vis` connections and checks what the test's threads
/// send: each message is `[thread: u32][seq: u32]` then a pattern.
fn sink(disc: &str, r: Reliability, vis: usize, per_vi: usize, size: usize) {
    let nic = Nic::open(None).expect("open NIC");
    let ptag = nic.create_ptag().unwrap();
    let slots = vis * per_vi;
    let mem = Region::new(&nic, slots * (64 + size) + 4096, ptag, false, false).unwrap();
    let at = ViAttributes::new(r, ptag);
    let v: Vec<Vi> = (0..vis)
        .map(|_| nic.create_vi(&at, None, None).unwrap())
        .collect();
    let buf = |k: usize| slots * 64 + k * size;
    for (i, x) in v.iter().enumerate() {
        for j in 0..per_vi {
            let k = i * per_vi + j;
            let d = DescBuilder::recv()
                .segment(&mem, buf(k), size as u32)
                .write(&mem, k * 64)
                .unwrap();
            x.post_recv(&mem, d).unwrap();
        }
    }
    let local = nic.address(disc.as_bytes());
    tell("LISTENING");
    for x in &v {
        nic.connect_wait(&local, WAIT)
            .expect("connect wait")
            .accept(x)
            .expect("accept");
    }
    let mut seen: HashMap<(u32, u32), usize> = HashMap::new();
    for (i, x) in v.iter().enumerate() {
        let mut last: HashMap<u32, u32> = HashMap::new();
        for j in 0..per_vi {
            let c = x.recv_wait(WAIT).expect("recv");
            assert_eq!(
                c.status,
                status::DONE | status::OP_RECEIVE,
                "VI {i} message {j}"
            );
            let k = i * per_vi + j;
            assert_eq!(c.desc, mem.addr(k * 64).unwrap(), "receive FIFO");
            assert_eq!(mem.word(k * 64 + 24) as usize, size);
            let mut b = vec![0u8; size];
            mem.read(buf(k), &mut b).unwrap();
            let t = u32::from_le_bytes(b[0..4].try_into().unwrap());
            let s = u32::from_le_bytes(b[4..8].try_into().unwrap());
            assert_eq!(
                b[8..],
                pattern(size - 8, t * 100_000 + s)[..],
                "data of thread {t} seq {s}"
            );
            if let Some(p) = last.insert(t, s) {
                assert!(s > p, "VI {i}: thread {t} sent {p} then {s} (order lost)");
            }
            *seen.entry((t, s)).or_default() += 1;
        }
        assert_eq!(
            x.recv_done(),
            Err(via::Error::NotDone),
            "extra message on VI {i}"
        );
        tell(&format!("VI {i} {}", last.len()));
    }
    assert_eq!(seen.len(), slots, "distinct messages");
    assert!(seen.values().all(|&n| n == 1), "a message arrived twice");
    tell("DONE");
    let _ = read_cmd();
    let _ = nic.close();
}

/// `autostart`: run with a fresh `VIA_INSTANCE`.
fn autostart() {
    let path = via::agent::place::user_socket().expect("socket path");
    let t = std::time::Duration::from_secs(5);
    let before = via::sys::seqpacket_connect_path(&path, t);
    tell(&format!(
        "BEFORE {}",
        if before.is_ok() { "listening" } else { "none" }
    ));
    let nic = Nic::open(None).expect("open NIC (starts viad)");
    let s = via::sys::seqpacket_connect_path(&path, t).expect("viad listens after open");
    let cred = via::sys::peer_cred(std::os::fd::AsRawFd::as_raw_fd(&s)).unwrap();
    drop(s);
    tell(&format!("VIAD {}", cred.pid));
    // A quick self-connection proves the new daemon brokers.
    let ptag = nic.create_ptag().unwrap();
    let at = ViAttributes::new(Reliability::ReliableDelivery, ptag);
    let (a, b) = (
        nic.create_vi(&at, None, None).unwrap(),
        nic.create_vi(&at, None, None).unwrap(),
    );
    let d = format!("auto-{}", std::process::id());
    let addr = nic.address(d.as_bytes());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|sc| {
        let (nic, addr) = (&nic, &addr);
        sc.spawn(move || {
            let r = nic.connect_wait(addr, WAIT).and_then(|req| req.accept(&b));
            tx.send(r).unwrap();
        });
        a.connect(&nic.address(b"c"), addr, WAIT)
            .expect("connect through the new viad");
    });
    rx.recv().unwrap().expect("accept through the new viad");
    assert_eq!(a.state(), ViState::Connected);
    let _ = nic.close();
    tell("CLOSED");
}

/// `open_timed`: how `Nic::open` ends, and how long it took.
fn open_timed() {
    let t0 = Instant::now();
    let r = Nic::open(None);
    let ms = t0.elapsed().as_millis();
    match r {
        Ok(nic) => {
            tell(&format!("OPEN ok {ms}"));
            let _ = nic.close();
        }
        Err(e) => tell(&format!("OPEN {:?} {ms}", e.kind())),
    }
}

/// `rawfetch`: see the module documentation.
fn rawfetch(socket: &str, session: u64, keys: &[String]) {
    use via::proto::{ObjKey, ObjKind, Reply, Request};
    use via_tests::raw::Client;
    let mut c = Client::open_at(std::path::Path::new(socket)).expect("session with the daemon");
    for k in keys {
        let f: Vec<u32> = k.split(':').map(|x| num(x) as u32).collect();
        let key = ObjKey {
            kind: match f[0] {
                1 => ObjKind::Nic,
                2 => ObjKind::Arena,
                _ => ObjKind::CqRing,
            },
            nic: f[1],
            id: f[2],
            generation: 0,
        };
        let r = match c.call(&Request::Fetch { session, key }, None) {
            Ok((Reply::Fd, fds)) if fds.len() == 1 => "FD".to_string(),
            Ok((Reply::Refused(r), fds)) if fds.is_empty() => format!("{r:?}"),
            other => panic!("fetch {k}: {other:?}"),
        };
        tell(&format!("FETCH {k} {r}"));
    }
    tell("DONE");
}

/// `impostor`: see the module documentation.
fn impostor(socket: &str) {
    use std::os::fd::{AsRawFd, OwnedFd};
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    static CONNS: AtomicUsize = AtomicUsize::new(0);
    static BYTES: AtomicUsize = AtomicUsize::new(0);
    static FDS: AtomicUsize = AtomicUsize::new(0);
    // Counts what arrives on `c` until its peer closes it.
    fn drain(c: OwnedFd) {
        CONNS.fetch_add(1, Relaxed);
        let mut buf = vec![0u8; 65536];
        while let Ok(r) = via::sys::recv_msg(c.as_raw_fd(), &mut buf) {
            if r.len == 0 && r.fds.is_empty() {
                break;
            }
            BYTES.fetch_add(r.len, Relaxed);
            FDS.fetch_add(r.fds.len() + r.fds_lost as usize, Relaxed);
        }
    }
    let l = std::sync::Arc::new(
        via::sys::seqpacket_listen_path(std::path::Path::new(socket)).expect("listen"),
    );
    let l2 = l.clone();
    std::thread::spawn(move || {
        while let Ok(c) = via::sys::accept(l2.as_raw_fd()) {
            std::thread::spawn(move || drain(c));
        }
    });
    tell("READY");
    let _ = read_cmd();
    // Connections still in the backlog count too (their clients are done
    // with them: the test asks once its clients have finished).
    via::sys::set_nonblocking(l.as_raw_fd(), true).unwrap();
    while let Ok(c) = via::sys::accept(l.as_raw_fd()) {
        via::sys::set_nonblocking(c.as_raw_fd(), true).unwrap();
        drain(c);
    }
    tell(&format!(
        "GOT {} {} {}",
        CONNS.load(Relaxed),
        BYTES.load(Relaxed),
        FDS.load(Relaxed)
    ));
    std::process::exit(0);
}

/// `squat`: see the module documentation.
fn squat(mode: &str, victim: u32, instance: &str) {
    use std::os::fd::{AsRawFd, OwnedFd};
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    static CONNS: AtomicUsize = AtomicUsize::new(0);
    static BYTES: AtomicUsize = AtomicUsize::new(0);
    static FDS: AtomicUsize = AtomicUsize::new(0);
    let me = via::sys::getuid();
    let mut listeners: Vec<OwnedFd> = Vec::new();
    let old = format!("via-rs/{victim}/{instance}");
    listeners.push(via::sys::seqpacket_listen_abstract(old.as_bytes()).expect("bind old name"));
    let victim_dir = std::path::PathBuf::from(format!("/tmp/via-rs-{victim}"));
    let sock_dir = match mode {
        "dir" => Some(victim_dir.clone()),
        "link" => Some(std::path::PathBuf::from(format!(
            "/tmp/via-squat-{me}-{victim}"
        ))),
        "abstract" => None,
        m => panic!("squat mode {m}"),
    };
    if let Some(d) = &sock_dir {
        std::fs::create_dir(d).expect("squatter's directory");
        use std::os::unix::fs::PermissionsExt;
        let mode = if d == &victim_dir { 0o777 } else { 0o700 };
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(mode)).unwrap();
        let l = via::sys::seqpacket_listen_path(
            &d.join(format!("{instance}.p{}.sock", via::proto::VERSION)),
        )
        .expect("bind in the squatter's directory");
        listeners.push(l);
        if d != &victim_dir {
            std::os::unix::fs::symlink(d, &victim_dir).expect("symlink");
        }
    }
    for l in listeners {
        std::thread::spawn(move || {
            while let Ok(c) = via::sys::accept(l.as_raw_fd()) {
                CONNS.fetch_add(1, Relaxed);
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; 65536];
                    while let Ok(r) = via::sys::recv_msg(c.as_raw_fd(), &mut buf) {
                        if r.len == 0 && r.fds.is_empty() {
                            break;
                        }
                        BYTES.fetch_add(r.len, Relaxed);
                        FDS.fetch_add(r.fds.len() + r.fds_lost as usize, Relaxed);
                    }
                });
            }
        });
    }
    tell("READY");
    let _ = read_cmd();
    tell(&format!(
        "GOT {} {} {}",
        CONNS.load(Relaxed),
        BYTES.load(Relaxed),
        FDS.load(Relaxed)
    ));
    std::process::exit(0);
}

/// `abuse`: see the module documentation.
fn abuse(kind: &str, n: usize) {
    use std::os::fd::AsRawFd;
    use via::proto::{NetAddr, ObjKey, ObjKind, Refusal, Reply, Request};
    use via_tests::raw::{self, Client};
    let key = |id: u32| ObjKey {
        kind: ObjKind::Arena,
        nic: 0,
        id,
        generation: 0,
    };
    let mut hold: Vec<Box<dyn std::any::Any>> = Vec::new();
    match kind {
        "fds" => {
            let mut c = Client::open().expect("session");
            let f = via::sys::memfd_create("via-abuse").unwrap();
            let (mut ok, mut refused) = (0, 0);
            for i in 0..n {
                match c.call(
                    &Request::Publish { key: key(i as u32) },
                    Some(f.as_raw_fd()),
                ) {
                    Ok((Reply::Ok, _)) => ok += 1,
                    Ok((Reply::Refused(Refusal::Limit), _)) => refused += 1,
                    other => panic!("publish {i}: {other:?}"),
                }
            }
            c.round_trip()
                .expect("the abuser's own session still works");
            tell(&format!("ABUSED {ok} {refused}"));
            hold.push(Box::new(c));
        }
        "conns" => {
            let mut failed = 0;
            for _ in 0..n {
                match raw::connect() {
                    Ok(s) => hold.push(Box::new(s)),
                    Err(_) => failed += 1,
                }
            }
            tell(&format!("ABUSED {} {failed}", hold.len()));
        }
        "sessions" => {
            let mut failed = 0;
            for _ in 0..n {
                match Client::open() {
                    Ok(c) => hold.push(Box::new(c)),
                    Err(_) => failed += 1,
                }
            }
            tell(&format!("ABUSED {} {failed}", hold.len()));
        }
        "listens" => {
            let mut c = Client::open().expect("session");
            for i in 0..n {
                let l = Request::Listen {
                    local: NetAddr {
                        host: vec![],
                        discriminator: format!("abuse-{}-{i}", std::process::id()).into_bytes(),
                    },
                    timeout_ms: via::proto::INFINITE,
                };
                c.send(&l, None).expect("send listen");
            }
            // Refusals come at once; the accepted listens never answer.
            let want: usize = std::env::var("ABUSE_EXPECT_REFUSED")
                .map(|v| v.parse().unwrap())
                .unwrap_or(0);
            let mut refused = 0;
            while refused < want {
                match raw::recv(c.fd.as_raw_fd()) {
                    Ok((_, Reply::Refused(Refusal::Limit), _)) => refused += 1,
                    Ok(other) => panic!("listen answered {other:?}"),
                    Err(e) => panic!("after {refused} refusals: {e}"),
                }
            }
            c.round_trip()
                .expect("the abuser's own session still works");
            tell(&format!("ABUSED {refused}"));
            hold.push(Box::new(c));
        }
        "publishers" => {
            let f = via::sys::memfd_create("via-abuse").unwrap();
            let mut ids = Vec::new();
            for _ in 0..n {
                let mut c = Client::open().expect("session");
                match c.call(&Request::Publish { key: key(1) }, Some(f.as_raw_fd())) {
                    Ok((Reply::Ok, _)) => {}
                    other => panic!("publish: {other:?}"),
                }
                ids.push(c.session.to_string());
                hold.push(Box::new(c));
            }
            tell(&format!("SESSIONS {}", ids.join(" ")));
        }
        k => panic!("abuse {k}"),
    }
    let _ = read_cmd();
    drop(hold);
    std::process::exit(0);
}
