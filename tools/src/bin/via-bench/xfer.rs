//! The data-transfer machinery of the suite: a [`Spec`] says what one
//! measurement point does; the measuring process (the client) runs it
//! against a server process (`via-bench server`), started by it on this
//! host or running on another one.
//!
//! A point has two phases. Control: the client connects a control VI to
//! the server's discriminator, sends the spec as JSON, and receives the
//! server's answer (where its RDMA target is); both tear the control VI
//! down. Data: the server has built its side from the spec (VIs with their
//! reliability, MaxTransferSize, RDMA enables and CQs; buffers; receives
//! posted), the client connects the data VIs, runs the benchmark and
//! disconnects, which flushes the server's receives: its signal to stop.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use via::descriptor::status;
use via::{Cq, DescBuilder, NetAddr, Nic, Ptag, Region, Reliability, Vi, ViAttributes};

use crate::out::{Measure, stats};

/// How completions are waited for.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Wait {
    /// `Vip*Done` in a loop.
    Poll,
    /// `Vip*Wait` with no spinning first (`VIA_SPIN_US=0`).
    Block,
    /// `Vip*Wait` spinning `VIA_SPIN_US` (20 us by default) before sleeping.
    Spin,
}

impl Wait {
    pub fn name(self) -> &'static str {
        match self {
            Wait::Poll => "poll",
            Wait::Block => "block",
            Wait::Spin => "spin-then-block",
        }
    }

    /// The environment this mode needs in both processes.
    pub fn env(self) -> Vec<(String, String)> {
        match self {
            Wait::Block => vec![("VIA_SPIN_US".into(), "0".into())],
            _ => vec![],
        }
    }
}

/// Reliability levels.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Rel {
    /// Unreliable delivery.
    U,
    /// Reliable delivery.
    Rd,
    /// Reliable reception.
    Rr,
}

impl Rel {
    pub fn via(self) -> Reliability {
        match self {
            Rel::U => Reliability::Unreliable,
            Rel::Rd => Reliability::ReliableDelivery,
            Rel::Rr => Reliability::ReliableReception,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Rel::U => "unreliable",
            Rel::Rd => "reliable-delivery",
            Rel::Rr => "reliable-reception",
        }
    }
}

/// The operation that moves the data.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Op {
    /// Send / receive.
    Send,
    /// RDMA write; the target polls the last 8 bytes of its buffer.
    Write,
    /// RDMA write with immediate data (consumes a receive at the target).
    WriteImm,
    /// RDMA read (one read is one round trip).
    Read,
}

impl Op {
    pub fn name(self) -> &'static str {
        match self {
            Op::Send => "send",
            Op::Write => "write",
            Op::WriteImm => "write-imm",
            Op::Read => "read",
        }
    }
}

/// Which queues report to a CQ.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CqUse {
    None,
    /// Receive queues only.
    Recv,
    /// Send and receive queues.
    Both,
}

/// How the server of the asynchronous benchmark answers while it computes.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Notify {
    /// A Notify handler (run by the provider's thread when the receive
    /// completes) answers: the event-driven wake-up.
    Event,
    /// A communication thread blocks in `VipRecvWait` and answers.
    Thread,
    /// The computing thread polls `VipRecvDone` between chunks of work.
    Poll,
    /// The computing thread looks every 10 ms.
    Timer,
}

/// Worker models of the multi-threaded server.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Model {
    /// A master waits on the CQ and hands each request to a worker.
    Master,
    /// Workers wait on the CQ themselves.
    Pool,
}

/// What a point measures.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Ping-pong (latency; CS1 transactions with `reply` != `size`).
    PingPong,
    /// Streaming with `window` messages in flight (bandwidth, rate).
    Stream,
    /// Ping-pong whose server answers while computing.
    Async(Notify),
    /// Several client threads against a multi-threaded server.
    Server { model: Model, workers: usize },
    /// Connection set-up and tear-down, `n` times.
    Conn { peer: bool, n: usize },
    /// VI create / destroy (no server).
    ViCreate,
    /// CQ create / destroy of `size` entries (no server).
    CqCreate,
    /// Register / deregister `size` bytes (no server); `cached`: the same
    /// buffer again (a cache hit when the cache is on).
    Mem { cached: bool },
}

/// One measurement point.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Spec {
    pub mode: Mode,
    pub op: Op,
    /// Bytes from client to server.
    pub size: usize,
    /// Bytes from server to client (= `size` except for transactions).
    pub reply: usize,
    pub wait: Wait,
    pub rel: Rel,
    /// Data segments per descriptor.
    pub segs: usize,
    pub cq: CqUse,
    /// VIs created on each side.
    pub vis: usize,
    /// Of which connected (1, or all); used round robin.
    pub connected: usize,
    /// Share of messages from the first ("hot") buffer; the others cycle
    /// through the rest of the pool. `None`: always the first.
    pub reuse_pct: Option<u32>,
    /// Buffers (each registered before the timing starts).
    pub pool: usize,
    /// The VIs' MaxTransferSize; messages above it go as several
    /// descriptors (`None`: the NIC's maximum).
    pub mts: Option<usize>,
    /// Messages in flight per acknowledgement (streaming).
    pub window: usize,
    /// Time budget of the point.
    pub budget_ms: u64,
    /// Fixed iteration count instead of the budget.
    pub iters: Option<u64>,
    pub seed: u64,
    /// Record the memory handles of the sends (`extra.trace`).
    pub trace: bool,
    pub device: String,
    pub client_cpu: Option<usize>,
    pub server_cpu: Option<usize>,
    /// The server's discriminator (filled by the client).
    #[serde(default)]
    pub disc: String,
    /// The client's RDMA target (address, handle), filled by the client.
    #[serde(default)]
    pub client_rdma: Option<(u64, u32)>,
}

impl Spec {
    pub fn new(mode: Mode, size: usize) -> Spec {
        Spec {
            mode,
            op: Op::Send,
            size,
            reply: size,
            wait: Wait::Poll,
            rel: Rel::Rd,
            segs: 1,
            cq: CqUse::None,
            vis: 1,
            connected: 1,
            reuse_pct: None,
            pool: 1,
            mts: None,
            window: 16,
            budget_ms: 200,
            iters: None,
            seed: 0x5eed,
            trace: false,
            device: "via_lo".into(),
            client_cpu: Some(0),
            server_cpu: Some(1),
            disc: String::new(),
            client_rdma: None,
        }
    }

    /// Descriptors per message.
    fn frags(&self, len: usize) -> usize {
        match self.mts {
            Some(m) if len > m => len.div_ceil(m),
            _ => 1,
        }
    }

    fn frag_len(&self, len: usize, f: usize) -> usize {
        match self.mts {
            Some(m) if len > m => m.min(len - f * m),
            _ => len,
        }
    }
}

pub fn pin(cpu: Option<usize>) {
    if let Some(c) = cpu {
        if c < via::sys::cpu_count() {
            if let Err(e) = via::sys::pin_to_cpu(c) {
                log::warn!("cannot pin to cpu {c}: {e}");
            }
        }
    }
}

const TIMEOUT: Duration = Duration::from_secs(30);

/// Bounds a polling loop by [`TIMEOUT`] without reading the clock per
/// call: the floor reads none, and a clock read per wait (about 20 ns)
/// would be counted as VIA's. The clock is read first after `every`
/// failed polls, then every `every` polls.
pub struct Spin {
    every: u32,
    n: u32,
    since: Option<Instant>,
}

impl Spin {
    pub fn new(every: u32) -> Spin {
        Spin {
            every,
            n: 0,
            since: None,
        }
    }

    /// One failed poll; panics with `what` once polling went on for
    /// [`TIMEOUT`].
    #[inline]
    pub fn failed(&mut self, what: &str) {
        self.n = self.n.wrapping_add(1);
        if self.n % self.every == 0 {
            let t0 = *self.since.get_or_insert_with(Instant::now);
            assert!(t0.elapsed() < TIMEOUT, "{what} in 30 s");
        }
        std::hint::spin_loop();
    }
}
/// Bytes of a descriptor slot (a descriptor with 16 segments and an
/// address segment is 304 bytes).
const SLOT: usize = 512;
/// Receive slots 0..1024, send slots 1024..2048, then these.
const ACK_RECV: usize = 2048;
const ACK_SEND: usize = 2049;
const CTL_RECV: usize = 2050;
const CTL_SEND: usize = 2051;
const SLOTS: usize = 2052;
/// Control messages (the spec, the answer) live after the slots.
const CTL_BUF: usize = SLOTS * SLOT;
const CTL_LEN: usize = 16 * 1024;
const MAX_DESCS: usize = 1024;

fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// One side of a point: the NIC, descriptors, buffers, VIs, CQ.
pub struct Side {
    pub nic: Nic,
    ptag: Ptag,
    ctl: Region,
    bufs: Vec<Region>,
    /// Bytes of a buffer's area (an RDMA buffer has two: source, target).
    blen: usize,
    /// The data VIs, made by [`Side::create_vis`] once the control VI is
    /// gone (a NIC has 1,024 VIs, and `mvis` may want them all).
    pub vis: Vec<Vi>,
    attrs: ViAttributes,
    by_slot: HashMap<u32, usize>,
    cq: Option<Cq>,
    /// CQ entries seen but not consumed, per (VI, queue).
    pending: Mutex<Vec<u32>>,
    /// What each descriptor slot holds (to write it again only on change).
    written: Vec<AtomicU64>,
    pub spec: Spec,
    server: bool,
}

fn quiet_errors(nic: &Nic) {
    // The end of a point is a disconnect, which the peer sees as a lost
    // connection: expected, not worth an error line.
    nic.set_error_callback(|e| {
        if e.code != via::ErrorCode::ConnLost {
            log::error!("asynchronous error {:?}", e.code);
        }
    });
}

pub fn open_nic(device: &str) -> Result<Nic, String> {
    let verbs = if via::HAS_VERBS {
        "and the verbs kind: an RDMA device's name (rxe0, mlx5_0) or verbs for the first"
    } else {
        "not the verbs kind (a build with the cargo feature via/verbs has it)"
    };
    Nic::open(Some(device)).map_err(|e| match e.kind() {
        via::ErrorKind::InvalidParameter => format!(
            "device {device:?}: no such NIC (this build has the shared-memory kind: via_lo, /dev/via_lo; the sockets kind: via_<interface>, /dev/via_<interface>; {verbs})"
        ),
        _ => format!("device {device:?}: cannot open: {e} (see the log above)"),
    })
}

impl Side {
    /// The side of `spec` on `nic` (a server's data VIs must be of the NIC
    /// that accepts their connections), or on a NIC of its own.
    pub fn new(spec: &Spec, server: bool, nic: Option<&Nic>) -> Side {
        let nic = match nic {
            Some(n) => n.clone(),
            None => open_nic(&spec.device).unwrap_or_else(|e| panic!("{e}")),
        };
        quiet_errors(&nic);
        let ptag = nic.create_ptag().expect("ptag");
        let ctl = Region::new(&nic, CTL_BUF + CTL_LEN, ptag, false, false).expect("register");
        let rdma = spec.op != Op::Send;
        let blen = spec.size.max(spec.reply).max(8);
        let area = if rdma { 2 * blen } else { blen };
        let bufs = (0..spec.pool.max(1))
            .map(|_| Region::new(&nic, area, ptag, rdma, rdma).expect("register a buffer"))
            .collect();
        // The clients of the threaded server wait on their own VIs.
        let cq_use = match spec.mode {
            Mode::Server { .. } if !server => CqUse::None,
            _ => spec.cq,
        };
        let cq = (cq_use != CqUse::None).then(|| {
            nic.create_cq((spec.vis * 2 + 16).min(65536) as u32)
                .expect("CQ")
        });
        let mut a = ViAttributes::new(spec.rel.via(), ptag);
        a.max_transfer_size =
            spec.mts
                .unwrap_or(nic.attributes().max_transfer_size as usize) as u32;
        a.enable_rdma_write = rdma;
        a.enable_rdma_read = rdma && spec.rel != Rel::U;
        Side {
            attrs: a,
            pending: Mutex::new(vec![0; spec.vis * 2]),
            written: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
            nic,
            ptag,
            ctl,
            bufs,
            blen,
            vis: Vec::new(),
            by_slot: HashMap::new(),
            cq,
            spec: Spec {
                cq: cq_use,
                ..spec.clone()
            },
            server,
        }
    }

    /// Creates the data VIs (with their CQs).
    pub fn create_vis(&mut self) {
        let (s, r) = match self.spec.cq {
            CqUse::None => (None, None),
            CqUse::Recv => (None, self.cq.as_ref()),
            CqUse::Both => (self.cq.as_ref(), self.cq.as_ref()),
        };
        self.vis = (0..self.spec.vis)
            .map(|_| self.nic.create_vi(&self.attrs, s, r).expect("create VI"))
            .collect();
        self.by_slot = self
            .vis
            .iter()
            .enumerate()
            .map(|(i, v)| (v.slot(), i))
            .collect();
    }

    /// The buffer of message `k`.
    fn buf_index(&self, k: u64) -> usize {
        let p = self.bufs.len();
        if p == 1 {
            return 0;
        }
        if let Mode::Server { .. } = self.spec.mode {
            return k as usize % p;
        }
        match self.spec.reuse_pct {
            None => 0,
            Some(r) if mix(self.spec.seed ^ k) % 100 < r as u64 => 0,
            Some(_) => 1 + (k as usize % (p - 1)),
        }
    }

    /// The RDMA target of this side: the second area of buffer 0 (a
    /// read's source is the first).
    fn rdma_target(&self) -> (u64, u32) {
        let b = &self.bufs[0];
        let off = if self.spec.op == Op::Read || self.spec.op == Op::Send {
            0
        } else {
            self.blen
        };
        (b.addr(off).unwrap(), b.handle())
    }

    /// Writes the descriptor of fragment `f` of message `k` (of `len`
    /// bytes in all) into `slot`, unless it is there already.
    fn desc(
        &self,
        slot: usize,
        op: Op,
        k: u64,
        f: usize,
        len: usize,
        remote: Option<(u64, u32)>,
    ) -> usize {
        let bi = self.buf_index(k);
        let flen = self.spec.frag_len(len, f);
        let off = f * self.spec.mts.unwrap_or(0);
        let key = 1 + (((bi as u64) << 44) | ((f as u64) << 34) | ((flen as u64) << 2) | op as u64);
        let at = slot * SLOT;
        if self.written[slot].load(Ordering::Relaxed) == key {
            return at;
        }
        let buf = &self.bufs[bi];
        let mut d = match (op, remote) {
            (Op::Write, Some((a, h))) => DescBuilder::rdma_write(a + off as u64, h),
            (Op::WriteImm, Some((a, h))) => {
                DescBuilder::rdma_write(a + off as u64, h).immediate(0x5eed)
            }
            (Op::Read, Some((a, h))) => DescBuilder::rdma_read(a + off as u64, h),
            _ => DescBuilder::send(),
        };
        // A receive for an RDMA write with immediate data carries no
        // segments; the sending side of RDMA writes sends from area 0.
        if flen > 0 && !(op == Op::WriteImm && remote.is_none()) {
            let base = if op == Op::Read && remote.is_some() {
                self.blen
            } else {
                0
            };
            let segs = self.spec.segs.clamp(1, 16).min(flen);
            let piece = flen / segs;
            let mut o = 0;
            for s in 0..segs {
                let l = if s == segs - 1 { flen - o } else { piece };
                d = d.segment(buf, base + off + o, l as u32);
                o += l;
            }
        }
        d.write(&self.ctl, at).expect("write a descriptor");
        self.written[slot].store(key, Ordering::Relaxed);
        at
    }

    fn recv_slot(&self, v: usize, f: usize, nfrag: usize) -> usize {
        v * nfrag + f
    }

    /// Posts the receives of message `k` on VI `v`.
    fn post_recvs(&self, v: usize, k: u64, len: usize) {
        let nf = self.spec.frags(len);
        for f in 0..nf {
            let op = if self.spec.op == Op::WriteImm {
                Op::WriteImm
            } else {
                Op::Send
            };
            let d = self.desc(self.recv_slot(v, f, nf) % MAX_DESCS, op, k, f, len, None);
            self.vis[v].post_recv(&self.ctl, d).expect("post receive");
        }
    }

    /// Posts the sends (or RDMA operations) of message `k` on VI `v`;
    /// `base` picks the slots (streams use several).
    fn post_sends(&self, v: usize, k: u64, len: usize, base: usize, remote: Option<(u64, u32)>) {
        let nf = self.spec.frags(len);
        for f in 0..nf {
            let d = self.desc(
                MAX_DESCS + (base + v * nf + f) % MAX_DESCS,
                self.spec.op,
                k,
                f,
                len,
                remote,
            );
            self.vis[v].post_send(&self.ctl, d).expect("post send");
        }
    }

    fn uses_cq(&self, recv: bool) -> bool {
        match self.spec.cq {
            CqUse::None => false,
            CqUse::Recv => recv,
            CqUse::Both => true,
        }
    }

    /// Waits for the next completion of VI `v`'s receive (or send) queue;
    /// returns its status. Errors other than a flush are fatal.
    fn wait(&self, v: usize, recv: bool) -> u32 {
        let vi = &self.vis[v];
        let block = self.spec.wait != Wait::Poll;
        if self.uses_cq(recv) {
            let cq = self.cq.as_ref().unwrap();
            let want = v * 2 + recv as usize;
            let mut spin = Spin::new(64);
            loop {
                {
                    let mut p = self.pending.lock().unwrap();
                    if p[want] > 0 {
                        p[want] -= 1;
                        break;
                    }
                }
                let r = if block {
                    cq.wait(Some(TIMEOUT))
                } else {
                    cq.done()
                };
                match r {
                    Ok((slot, is_recv)) => {
                        let i = self.by_slot[&slot];
                        self.pending.lock().unwrap()[i * 2 + is_recv as usize] += 1;
                    }
                    Err(e) if e.kind() == via::ErrorKind::NotDone => spin.failed("no CQ entry"),
                    Err(e) => panic!("CQ: {e:?}"),
                }
            }
        }
        let c = if block {
            if recv {
                vi.recv_wait(Some(TIMEOUT))
            } else {
                vi.send_wait(Some(TIMEOUT))
            }
        } else {
            let mut spin = Spin::new(4096);
            loop {
                match if recv { vi.recv_done() } else { vi.send_done() } {
                    Err(e) if e.kind() == via::ErrorKind::NotDone => spin.failed("no completion"),
                    r => break r,
                }
            }
        };
        let c = c.expect("completion");
        assert_eq!(
            c.status & status::ERROR_MASK & !status::DESC_FLUSHED_ERROR,
            0,
            "completion status {:#x} ({} side)",
            c.status,
            if self.server { "server" } else { "client" }
        );
        c.status
    }

    /// Spins until the last 8 bytes of the RDMA target area hold `seq`
    /// (or, on the server, until the client has gone).
    fn poll_target(&self, len: usize, seq: u64) -> bool {
        let at = self.blen + len - 8;
        let b = &self.bufs[0];
        // The clock first read after 1,024 polls (as in `Spin`).
        let mut t0 = None;
        let mut n = 0u32;
        loop {
            let mut w = [0u8; 8];
            b.read(at, &mut w).unwrap();
            if u64::from_ne_bytes(w) == seq {
                return true;
            }
            n = n.wrapping_add(1);
            if n % 1024 == 0 {
                if self.server && self.vis[0].recv_done().is_ok() {
                    return false;
                }
                let t0 = *t0.get_or_insert_with(Instant::now);
                assert!(t0.elapsed() < TIMEOUT, "RDMA write not seen in 30 s");
            }
            std::hint::spin_loop();
        }
    }

    fn stamp(&self, len: usize, seq: u64) {
        self.bufs[0].write(len - 8, &seq.to_ne_bytes()).unwrap();
    }

    fn ctl_send(&self, vi: &Vi, msg: &[u8]) {
        self.ctl.write(CTL_BUF, msg).unwrap();
        let d = DescBuilder::send()
            .segment(&self.ctl, CTL_BUF, msg.len() as u32)
            .write(&self.ctl, CTL_SEND * SLOT)
            .unwrap();
        vi.post_send(&self.ctl, d).unwrap();
        let c = vi.send_wait(Some(TIMEOUT)).expect("control send");
        assert_eq!(
            c.status & status::ERROR_MASK,
            0,
            "control send {:#x}",
            c.status
        );
    }

    fn ctl_post_recv(&self, vi: &Vi) {
        let d = DescBuilder::recv()
            .segment(&self.ctl, CTL_BUF + CTL_LEN / 2, (CTL_LEN / 2) as u32)
            .write(&self.ctl, CTL_RECV * SLOT)
            .unwrap();
        vi.post_recv(&self.ctl, d).unwrap();
    }

    /// The message of the control receive, `None` if it was flushed.
    fn ctl_recv(&self, vi: &Vi) -> Option<Vec<u8>> {
        let c = vi.recv_wait(Some(TIMEOUT)).expect("control receive");
        if c.status & status::DESC_FLUSHED_ERROR != 0 {
            return None;
        }
        assert_eq!(
            c.status & status::ERROR_MASK,
            0,
            "control receive {:#x}",
            c.status
        );
        let len = self.ctl.word(CTL_RECV * SLOT + 24) as usize;
        let mut b = vec![0u8; len];
        self.ctl.read(CTL_BUF + CTL_LEN / 2, &mut b).unwrap();
        Some(b)
    }

    fn ctl_vi(&self) -> Vi {
        let a = ViAttributes::new(Reliability::ReliableDelivery, self.ptag);
        self.nic.create_vi(&a, None, None).expect("control VI")
    }
}

// ------------------------------------------------------------------ server

/// `via-bench server`: serves points, `count` of them (or for ever).
pub fn server(device: &str, disc: &str, count: Option<u64>, ready: bool, cpu: Option<usize>) {
    pin(cpu);
    let nic = match open_nic(device) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("via-bench server: {e}");
            std::process::exit(1)
        }
    };
    quiet_errors(&nic);
    let local = nic.address(disc.as_bytes());
    if ready {
        println!("READY");
        std::io::stdout().flush().unwrap();
    } else {
        eprintln!(
            "via-bench server: listening on discriminator {disc:?} of host {} ({device})",
            hex(&nic.host_address())
        );
    }
    let mut served = 0u64;
    while count.is_none_or(|c| served < c) {
        let timeout = count.map(|_| TIMEOUT);
        let req = match nic.connect_wait(&local, timeout) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("via-bench server: waiting for a client: {e:?}");
                std::process::exit(1)
            }
        };
        // A point that goes wrong (a client that died, say) costs that
        // point, not the server.
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            serve_point(&nic, &local, req)
        }));
        if r.is_err() {
            if count.is_some() {
                std::process::exit(101);
            }
            eprintln!("via-bench server: the point failed; serving the next");
        }
        served += 1;
    }
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn serve_point(nic: &Nic, local: &NetAddr, req: via::ConnRequest) {
    let client_host = req.remote.host.clone();
    // Control phase: a VI of a throwaway side that only knows the device.
    let ptag = nic.create_ptag().unwrap();
    let ctl = Region::new(nic, CTL_BUF + CTL_LEN, ptag, false, false).unwrap();
    let vi = nic
        .create_vi(
            &ViAttributes::new(Reliability::ReliableDelivery, ptag),
            None,
            None,
        )
        .unwrap();
    let d = DescBuilder::recv()
        .segment(&ctl, CTL_BUF, CTL_LEN as u32)
        .write(&ctl, 0)
        .unwrap();
    vi.post_recv(&ctl, d).unwrap();
    req.accept(&vi).expect("accept the control connection");
    let c = vi.recv_wait(Some(TIMEOUT)).expect("the spec");
    assert_eq!(
        c.status & status::ERROR_MASK,
        0,
        "spec receive {:#x}",
        c.status
    );
    let mut b = vec![0u8; ctl.word(24) as usize];
    ctl.read(CTL_BUF, &mut b).unwrap();
    let spec: Spec = serde_json::from_slice(&b).expect("a spec");
    let mut side = Side::new(&spec, true, Some(nic));
    let answer = json!({ "rdma": side.rdma_target() }).to_string();
    // The answer goes from the control side's memory.
    ctl.write(CTL_BUF, answer.as_bytes()).unwrap();
    let sd = DescBuilder::send()
        .segment(&ctl, CTL_BUF, answer.len() as u32)
        .write(&ctl, 128)
        .unwrap();
    let rd = DescBuilder::recv().write(&ctl, 256).unwrap();
    vi.post_recv(&ctl, rd).unwrap();
    vi.post_send(&ctl, sd).unwrap();
    vi.send_wait(Some(TIMEOUT)).expect("answer");
    // The client disconnects the control VI once it has the answer.
    let c = vi.recv_wait(Some(TIMEOUT)).expect("control tear-down");
    assert!(
        c.status & status::DESC_FLUSHED_ERROR != 0,
        "control VI: {:#x}",
        c.status
    );
    let _ = vi.disconnect();
    let _ = vi.destroy();
    drop(ctl);
    let _ = nic.destroy_ptag(ptag);
    // Data phase.
    side.create_vis();
    // Receives first: the client may send as soon as it is connected.
    match spec.mode {
        Mode::PingPong | Mode::Async(_) | Mode::Server { .. } => {
            if spec.op == Op::Write || spec.op == Op::Read {
                for v in 0..spec.connected {
                    side.ctl_post_recv(&side.vis[v]);
                }
            } else {
                for v in 0..spec.connected {
                    side.post_recvs(v, v as u64, spec.size);
                }
            }
        }
        Mode::Stream => {
            if spec.op == Op::Write || spec.op == Op::Read {
                side.ctl_post_recv(&side.vis[0]);
            } else {
                for k in 0..spec.window as u64 {
                    stream_post_recv(&side, k);
                }
            }
        }
        _ => {}
    }
    if let Mode::Conn { peer, n } = spec.mode {
        return serve_conn(&side, local, &client_host, peer, n);
    }
    for v in 0..spec.connected {
        let r = nic
            .connect_wait(local, Some(TIMEOUT))
            .expect("data connection");
        r.accept(&side.vis[v]).expect("accept");
    }
    match spec.mode {
        Mode::PingPong => serve_pingpong(&side),
        Mode::Stream => serve_stream(&side),
        Mode::Async(n) => serve_async(side, n),
        Mode::Server { model, workers } => serve_threads(side, model, workers),
        _ => unreachable!(),
    }
}

fn flushed(st: u32) -> bool {
    st & status::DESC_FLUSHED_ERROR != 0
}

fn serve_pingpong(s: &Side) {
    let sp = &s.spec;
    let m = sp.connected as u64;
    let remote = sp.client_rdma;
    match sp.op {
        Op::Send | Op::WriteImm => {
            for k in 0.. {
                let v = (k % m) as usize;
                let nf = sp.frags(sp.size);
                for _ in 0..nf {
                    if flushed(s.wait(v, true)) {
                        return;
                    }
                }
                s.post_recvs(v, k + m, sp.size);
                s.post_sends(v, k, sp.reply, 0, remote);
                for _ in 0..sp.frags(sp.reply) {
                    s.wait(v, false);
                }
            }
        }
        Op::Write => {
            for k in 0.. {
                if !s.poll_target(sp.size, k + 1) {
                    return;
                }
                s.stamp(sp.reply, k + 1);
                s.post_sends(0, k, sp.reply, 0, remote);
                s.wait(0, false);
            }
        }
        Op::Read => {
            s.wait(0, true);
        }
    }
}

fn stream_post_recv(s: &Side, k: u64) {
    let nf = s.spec.frags(s.spec.size);
    for f in 0..nf {
        let slot = ((k as usize % s.spec.window) * nf + f) % MAX_DESCS;
        let op = if s.spec.op == Op::WriteImm {
            Op::WriteImm
        } else {
            Op::Send
        };
        let d = s.desc(slot, op, k, f, s.spec.size, None);
        s.vis[0].post_recv(&s.ctl, d).expect("post receive");
    }
}

fn ack_send(s: &Side) -> usize {
    DescBuilder::send().write(&s.ctl, ACK_SEND * SLOT).unwrap()
}

fn ack_recv(s: &Side) -> usize {
    DescBuilder::recv().write(&s.ctl, ACK_RECV * SLOT).unwrap()
}

fn serve_stream(s: &Side) {
    let sp = &s.spec;
    if sp.op == Op::Write || sp.op == Op::Read {
        s.wait(0, true);
        return;
    }
    let w = sp.window as u64;
    let nf = sp.frags(sp.size);
    let ack = ack_send(s);
    for r in 0.. {
        for _ in 0..w as usize * nf {
            if flushed(s.wait(0, true)) {
                return;
            }
        }
        for k in (r + 1) * w..(r + 2) * w {
            stream_post_recv(s, k);
        }
        s.vis[0].post_send(&s.ctl, ack).unwrap();
        s.wait(0, false);
    }
}

/// Chunks of make-believe work for the asynchronous benchmark.
fn work(units: u64) -> u64 {
    let mut x = 0x1234_5678u64;
    for i in 0..units * 64 {
        x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
    }
    x
}

/// Answers one request of the asynchronous benchmark (the receive is
/// dequeued); false when the client has gone.
fn answer(s: &Side, st: u32, k: u64) -> bool {
    if flushed(st) {
        return false;
    }
    s.post_recvs(0, k + 1, s.spec.size);
    s.post_sends(0, k, s.spec.reply, 0, None);
    loop {
        match s.vis[0].send_done() {
            Err(e) if e.kind() == via::ErrorKind::NotDone => std::hint::spin_loop(),
            r => {
                let c = r.expect("reply");
                assert_eq!(c.status & status::ERROR_MASK, 0, "reply {:#x}", c.status);
                return true;
            }
        }
    }
}

fn arm(s: Arc<Side>, stop: Arc<AtomicBool>, k: u64) {
    let s2 = s.clone();
    s.vis[0].recv_notify(move |c| {
        if answer(&s2, c.status, k) {
            arm(s2, stop, k + 1);
        } else {
            stop.store(true, Ordering::Release);
        }
    });
}

fn serve_async(s: Side, mode: Notify) {
    let s = Arc::new(s);
    let stop = Arc::new(AtomicBool::new(false));
    let mut done = 0u64;
    match mode {
        Notify::Event => {
            arm(s.clone(), stop.clone(), 0);
            while !stop.load(Ordering::Acquire) {
                done = done.wrapping_add(work(16));
            }
        }
        Notify::Thread => {
            let (s2, stop2) = (s.clone(), stop.clone());
            let t = std::thread::spawn(move || {
                for k in 0.. {
                    let c = s2.vis[0].recv_wait(Some(TIMEOUT)).expect("request");
                    if !answer(&s2, c.status, k) {
                        break;
                    }
                }
                stop2.store(true, Ordering::Release);
            });
            while !stop.load(Ordering::Acquire) {
                done = done.wrapping_add(work(16));
            }
            t.join().unwrap();
        }
        Notify::Poll | Notify::Timer => {
            let period = (mode == Notify::Timer).then_some(Duration::from_millis(10));
            let mut k = 0;
            let mut last = Instant::now();
            'run: loop {
                done = done.wrapping_add(work(16));
                if period.is_some_and(|p| last.elapsed() < p) {
                    continue;
                }
                last = Instant::now();
                loop {
                    match s.vis[0].recv_done() {
                        Err(e) if e.kind() == via::ErrorKind::NotDone => break,
                        r => {
                            if !answer(&s, r.expect("request").status, k) {
                                break 'run;
                            }
                            k += 1;
                        }
                    }
                }
            }
        }
    }
    std::hint::black_box(done);
}

/// The multi-threaded server: every client VI's receive queue reports to
/// one CQ; a master hands requests to workers, or workers wait on the CQ.
fn serve_threads(s: Side, model: Model, workers: usize) {
    let s = Arc::new(s);
    let c = s.spec.connected;
    let closed = Arc::new(AtomicUsize::new(0));
    // Handles one request of VI `v`; false if the client left.
    let handle = |s: &Side, v: usize| -> bool {
        let st = s.vis[v].recv_done().expect("a completed receive").status;
        if flushed(st) {
            return false;
        }
        s.post_recvs(v, v as u64, s.spec.size);
        s.post_sends(v, v as u64, s.spec.reply, 0, None);
        s.wait(v, false);
        true
    };
    let cq_next = |s: &Side| -> Option<usize> {
        match s
            .cq
            .as_ref()
            .unwrap()
            .wait(Some(Duration::from_millis(100)))
        {
            Ok((slot, _)) => Some(s.by_slot[&slot]),
            Err(e) if matches!(e.kind(), via::ErrorKind::Timeout | via::ErrorKind::NotDone) => None,
            Err(e) => panic!("CQ wait: {e:?}"),
        }
    };
    match model {
        Model::Pool => {
            std::thread::scope(|sc| {
                for _ in 0..workers.max(1) {
                    let (s, closed) = (&s, &closed);
                    sc.spawn(move || {
                        while closed.load(Ordering::Acquire) < c {
                            if let Some(v) = cq_next(s) {
                                if !handle(s, v) {
                                    closed.fetch_add(1, Ordering::AcqRel);
                                }
                            }
                        }
                    });
                }
            });
        }
        Model::Master => {
            let (tx, rx) = std::sync::mpsc::channel::<usize>();
            let rx = Arc::new(Mutex::new(rx));
            std::thread::scope(|sc| {
                for _ in 0..workers.max(1) {
                    let (s, rx) = (&s, rx.clone());
                    sc.spawn(move || {
                        loop {
                            let v = match rx.lock().unwrap().recv() {
                                Ok(v) => v,
                                Err(_) => break,
                            };
                            s.post_recvs(v, v as u64, s.spec.size);
                            s.post_sends(v, v as u64, s.spec.reply, 0, None);
                            s.wait(v, false);
                        }
                    });
                }
                let mut gone = 0;
                while gone < c {
                    if let Some(v) = cq_next(&s) {
                        let st = s.vis[v].recv_done().expect("a completed receive").status;
                        if flushed(st) {
                            gone += 1;
                        } else {
                            tx.send(v).unwrap();
                        }
                    }
                }
                drop(tx);
            });
        }
    }
}

fn serve_conn(s: &Side, local: &NetAddr, client_host: &[u8], peer: bool, n: usize) {
    let vi = &s.vis[0];
    let (mine, theirs) = peer_addrs(&s.spec.disc);
    for _ in 0..n {
        s.ctl_post_recv(vi);
        if peer {
            vi.connect_peer(
                &NetAddr {
                    host: s.nic.host_address(),
                    discriminator: theirs.clone(),
                },
                &NetAddr {
                    host: client_host.to_vec(),
                    discriminator: mine.clone(),
                },
                Some(TIMEOUT),
            )
            .expect("peer connect");
            vi.connect_peer_wait().expect("peer connection");
        } else {
            let r = s
                .nic
                .connect_wait(local, Some(TIMEOUT))
                .expect("connection");
            r.accept(vi).expect("accept");
        }
        assert!(s.ctl_recv(vi).is_none(), "expected a disconnect");
        vi.disconnect().expect("disconnect");
    }
}

/// Discriminators of the peer-to-peer connections: (client's, server's).
fn peer_addrs(disc: &str) -> (Vec<u8>, Vec<u8>) {
    (
        format!("{disc}-pc").into_bytes(),
        format!("{disc}-ps").into_bytes(),
    )
}

// ------------------------------------------------------------------ client

/// Where the server is.
pub enum Peer {
    /// Start `via-bench server` here for the point.
    Local,
    /// A server already running: host name (name service) and discriminator.
    Remote(String, String),
}

struct LocalServer(std::process::Child);

impl LocalServer {
    fn start(spec: &Spec, disc: &str) -> LocalServer {
        let exe = std::env::current_exe().expect("own path");
        let mut cmd = Command::new(exe);
        cmd.args([
            "server",
            "--disc",
            disc,
            "--count",
            "1",
            "--ready",
            "--device",
            &spec.device,
        ]);
        match spec.server_cpu {
            Some(c) => cmd.args(["--cpu", &c.to_string()]),
            None => cmd.arg("--no-pin"),
        };
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn the server");
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "READY", "the server did not start");
        LocalServer(child)
    }

    fn finish(mut self) {
        let st = self.0.wait().unwrap();
        assert!(st.success(), "server failed: {st}");
    }
}

static POINTS: AtomicU64 = AtomicU64::new(0);

/// Runs one point as the client; prints nothing, returns the measurement.
pub fn run_point(mut spec: Spec, peer: &Peer) -> Measure {
    pin(spec.client_cpu);
    if matches!(
        spec.mode,
        Mode::ViCreate | Mode::CqCreate | Mode::Mem { .. }
    ) {
        return crate::nd::run_local(&spec);
    }
    let (server, disc, host) = match peer {
        Peer::Local => {
            let d = format!(
                "vb-{}-{}",
                std::process::id(),
                POINTS.fetch_add(1, Ordering::Relaxed)
            );
            (Some(LocalServer::start(&spec, &d)), d, None)
        }
        Peer::Remote(h, d) => (None, d.clone(), Some(h.clone())),
    };
    spec.disc = disc.clone();
    let mut side = Side::new(&spec, false, None);
    let host = match host {
        None => side.nic.host_address(),
        Some(h) => side.nic.resolve(&h).unwrap_or_else(|e| {
            panic!("host {h:?}: {e:?} (name service: localhost, this host's name, $VIA_HOSTS)")
        }),
    };
    let remote = NetAddr {
        host,
        discriminator: disc.into_bytes(),
    };
    let local = side
        .nic
        .address(format!("vb-client-{}", std::process::id()).as_bytes());
    spec.client_rdma = Some(side.rdma_target());
    // Control phase.
    let cvi = side.ctl_vi();
    side.ctl_post_recv(&cvi);
    // A server started at the same time may not listen yet: no listener
    // is `NoMatch` at once, and a client tries again (as legacy VIA
    // clients do) until its time is up.
    let start = std::time::Instant::now();
    loop {
        match cvi.connect(&local, &remote, Some(TIMEOUT)) {
            Err(e) if e.kind() == via::ErrorKind::NoMatch && start.elapsed() < TIMEOUT => {
                log::debug!("no listener on the server's discriminator yet; trying again");
                std::thread::sleep(Duration::from_millis(20));
            }
            r => {
                r.expect("connect to the server");
                break;
            }
        }
    }
    side.ctl_send(&cvi, serde_json::to_string(&spec).unwrap().as_bytes());
    let answer: Value =
        serde_json::from_slice(&side.ctl_recv(&cvi).expect("the server's answer")).unwrap();
    cvi.disconnect().unwrap();
    let _ = cvi.destroy();
    let srv_rdma: Option<(u64, u32)> = serde_json::from_value(answer["rdma"].clone()).ok();
    side.create_vis();
    // Data phase.
    let m = match spec.mode {
        Mode::Conn { peer, n } => client_conn(&side, &local, &remote, peer, n),
        _ => {
            for v in 0..spec.connected {
                side.vis[v]
                    .connect(&local, &remote, Some(TIMEOUT))
                    .expect("data connection");
            }
            let m = match spec.mode {
                Mode::PingPong | Mode::Async(_) => client_pingpong(&side, srv_rdma),
                Mode::Stream => client_stream(&side, srv_rdma),
                Mode::Server { .. } => client_threads(&side),
                _ => unreachable!(),
            };
            for v in 0..spec.connected {
                side.vis[v].disconnect().expect("disconnect");
            }
            m
        }
    };
    if let Some(s) = server {
        s.finish();
    }
    m
}

/// Runs `round(k)` for the budget: warm-up, a run without clock reads
/// (the mean and CPU use), a run that times each round (the percentiles).
/// Returns (rounds of the mean run, its wall time, its CPU time, samples
/// in microseconds per round).
fn timed(spec: &Spec, mut round: impl FnMut(u64)) -> (u64, Duration, Duration, Vec<f64>) {
    let budget = Duration::from_millis(spec.budget_ms.max(1));
    let mut k = 0u64;
    let (n_mean, n_samp) = match spec.iters {
        Some(n) => {
            for _ in 0..n.min(10) {
                round(k);
                k += 1;
            }
            (n.max(1), n.max(1))
        }
        None => {
            let t = Instant::now();
            while k < 3 || (t.elapsed() < budget / 10 && k < 100_000) {
                round(k);
                k += 1;
            }
            let per = t.elapsed().as_secs_f64() / k as f64;
            let n =
                |share: f64, cap: f64| (budget.as_secs_f64() * share / per).clamp(3.0, cap) as u64;
            (n(0.6, 5e6), n(0.3, 200_000.0))
        }
    };
    let cpu0 = via::sys::rusage_cpu();
    let t0 = Instant::now();
    for _ in 0..n_mean {
        round(k);
        k += 1;
    }
    let wall = t0.elapsed();
    let cpu = via::sys::rusage_cpu() - cpu0;
    let mut samples = Vec::with_capacity(n_samp as usize);
    for _ in 0..n_samp {
        let t = Instant::now();
        round(k);
        k += 1;
        samples.push(t.elapsed().as_secs_f64() * 1e6);
    }
    (n_mean, wall, cpu, samples)
}

fn tstats(nic: &Nic) -> Option<via::TranslationStats> {
    nic.translation_stats()
}

fn tdelta(a: Option<via::TranslationStats>, b: Option<via::TranslationStats>) -> Value {
    match (a, b) {
        (Some(a), Some(b)) => json!({
            "entries": b.entries, "ways": b.ways,
            "send_hits": b.send.hits - a.send.hits,
            "send_compulsory": b.send.compulsory - a.send.compulsory,
            "send_other": b.send.other - a.send.other,
            "recv_hits": b.recv.hits - a.recv.hits,
            "recv_misses": (b.recv.compulsory + b.recv.other) - (a.recv.compulsory + a.recv.other),
        }),
        _ => Value::Null,
    }
}

fn client_pingpong(s: &Side, remote: Option<(u64, u32)>) -> Measure {
    let sp = &s.spec;
    let m = sp.connected as u64;
    let trace = std::cell::RefCell::new(Vec::new());
    let t_before = tstats(&s.nic);
    let round = |k: u64| {
        let v = (k % m) as usize;
        if sp.trace {
            trace.borrow_mut().push(s.bufs[s.buf_index(k)].handle());
        }
        match sp.op {
            Op::Send | Op::WriteImm => {
                s.post_recvs(v, k, sp.reply);
                s.post_sends(v, k, sp.size, 0, remote);
                for _ in 0..sp.frags(sp.reply) {
                    s.wait(v, true);
                }
                for _ in 0..sp.frags(sp.size) {
                    s.wait(v, false);
                }
            }
            Op::Write => {
                s.stamp(sp.size, k + 1);
                s.post_sends(0, k, sp.size, 0, remote);
                s.wait(0, false);
                s.poll_target(sp.reply, k + 1);
            }
            Op::Read => {
                s.post_sends(0, k, sp.size, 0, remote);
                s.wait(0, false);
            }
        }
    };
    let (n, wall, cpu, mut samples) = timed(sp, round);
    let t_after = tstats(&s.nic);
    let half = wall.as_secs_f64() * 1e6 / n as f64 / 2.0;
    for x in samples.iter_mut() {
        *x /= 2.0;
    }
    let (mean, min, med, p99) = stats(half, &mut samples);
    let moved = (sp.size + sp.reply) as f64 / 2.0;
    Measure {
        iters: n,
        mean_us: Some(mean),
        min_us: Some(min),
        median_us: Some(med),
        p99_us: Some(p99),
        // Ping-pong bandwidth: bytes of one direction per half round trip.
        mbps: (moved > 0.0).then(|| moved / half),
        cpu_pct: Some(cpu.as_secs_f64() / wall.as_secs_f64() * 100.0),
        rate: Some(1e6 / (2.0 * half)),
        extra: json!({
            "pool": s.bufs.len(),
            "tcache": tdelta(t_before, t_after),
            "trace": if sp.trace { json!(trace.into_inner()) } else { Value::Null },
        }),
    }
}

fn client_stream(s: &Side, remote: Option<(u64, u32)>) -> Measure {
    let sp = &s.spec;
    let w = sp.window.max(1);
    let nf = sp.frags(sp.size);
    let acked = sp.op == Op::Send || sp.op == Op::WriteImm;
    let ack = ack_recv(s);
    let round = |r: u64| {
        // Message numbers match the server's receives.
        let msg = r * w as u64;
        if acked {
            s.vis[0].post_recv(&s.ctl, ack).unwrap();
        }
        for i in 0..w {
            s.post_sends(0, msg + i as u64, sp.size, i * nf, remote);
        }
        for _ in 0..w * nf {
            s.wait(0, false);
        }
        if acked {
            s.wait(0, true);
        }
    };
    let (n, wall, cpu, mut samples) = timed(sp, round);
    let per_msg = wall.as_secs_f64() / (n as f64 * w as f64);
    for x in samples.iter_mut() {
        *x /= w as f64;
    }
    let (mean, min, med, p99) = stats(per_msg * 1e6, &mut samples);
    Measure {
        iters: n * w as u64,
        mean_us: Some(mean),
        min_us: Some(min),
        median_us: Some(med),
        p99_us: Some(p99),
        mbps: Some(sp.size as f64 / (per_msg * 1e6)),
        cpu_pct: Some(cpu.as_secs_f64() / wall.as_secs_f64() * 100.0),
        rate: Some(1.0 / per_msg),
        extra: json!({ "window": w, "pool": s.bufs.len(), "note": "mean/min/median/p99: time per message" }),
    }
}

fn client_threads(s: &Side) -> Measure {
    let sp = &s.spec;
    let c = sp.connected;
    let budget = Duration::from_millis(sp.budget_ms.max(1));
    let cpu0 = via::sys::rusage_cpu();
    let t0 = Instant::now();
    let results: Vec<Vec<f64>> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..c)
            .map(|v| {
                sc.spawn(move || {
                    let mut lat = Vec::new();
                    let start = Instant::now();
                    let mut k = 0u64;
                    while match sp.iters {
                        Some(n) => k < n,
                        None => start.elapsed() < budget,
                    } {
                        let t = Instant::now();
                        s.post_recvs(v, v as u64, sp.reply);
                        s.post_sends(v, v as u64, sp.size, 0, None);
                        s.wait(v, true);
                        s.wait(v, false);
                        lat.push(t.elapsed().as_secs_f64() * 1e6 / 2.0);
                        k += 1;
                    }
                    lat
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let wall = t0.elapsed();
    let cpu = via::sys::rusage_cpu() - cpu0;
    let mut all: Vec<f64> = results.into_iter().flatten().collect();
    let n = all.len() as u64;
    let mean = all.iter().sum::<f64>() / n.max(1) as f64;
    let (mean, min, med, p99) = stats(mean, &mut all);
    Measure {
        iters: n,
        mean_us: Some(mean),
        min_us: Some(min),
        median_us: Some(med),
        p99_us: Some(p99),
        mbps: None,
        cpu_pct: Some(cpu.as_secs_f64() / wall.as_secs_f64() * 100.0),
        rate: Some(n as f64 / wall.as_secs_f64()),
        extra: json!({ "clients": c }),
    }
}

fn client_conn(s: &Side, local: &NetAddr, remote: &NetAddr, peer: bool, n: usize) -> Measure {
    let vi = &s.vis[0];
    let (mine, theirs) = peer_addrs(&s.spec.disc);
    let (mut up, mut down) = (Vec::new(), Vec::new());
    let cpu0 = via::sys::rusage_cpu();
    let t0 = Instant::now();
    for _ in 0..n {
        let t = Instant::now();
        if peer {
            vi.connect_peer(
                &NetAddr {
                    host: local.host.clone(),
                    discriminator: mine.clone(),
                },
                &NetAddr {
                    host: remote.host.clone(),
                    discriminator: theirs.clone(),
                },
                Some(TIMEOUT),
            )
            .expect("peer connect");
            vi.connect_peer_wait().expect("peer connection");
        } else {
            vi.connect(local, remote, Some(TIMEOUT)).expect("connect");
        }
        let t1 = Instant::now();
        vi.disconnect().expect("disconnect");
        down.push(t1.elapsed().as_secs_f64() * 1e6);
        up.push((t1 - t).as_secs_f64() * 1e6);
    }
    let wall = t0.elapsed();
    let cpu = via::sys::rusage_cpu() - cpu0;
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let (dm, dmin, dmed, dp99) = stats(mean(&down), &mut down);
    let (um, umin, umed, up99) = stats(mean(&up), &mut up);
    Measure {
        iters: n as u64,
        mean_us: Some(um),
        min_us: Some(umin),
        median_us: Some(umed),
        p99_us: Some(up99),
        mbps: None,
        cpu_pct: Some(cpu.as_secs_f64() / wall.as_secs_f64() * 100.0),
        rate: None,
        extra: json!({ "second": { "mean_us": dm, "min_us": dmin, "median_us": dmed, "p99_us": dp99 } }),
    }
}
