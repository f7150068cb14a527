//! Baselines of the verbs kind's measurements, with bare verbs calls on
//! the same device in the same run (`tests/tests/verbs.rs`,
//! `tests/tests/verbs_bench.rs`):
//!
//! * [`bare_post_cost`]: a bare `ibv_post_send` / `ibv_post_recv` on an RC
//!   QP connected to itself, measured the way the tests measure
//!   `Vi::post_send` / `Vi::post_recv`;
//! * [`RawPingPong`]: an `ibv_rc_pingpong`-style loop (RC, send/receive,
//!   busy polling of the CQ) between two processes, against which via's
//!   ping-pong latency is reported.

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::ibv::{
    self, Context, Cq, Mr, Pd, PortInfo, Qp, Remote, SendOp, SendReq, Sge, Transport,
};
use super::{Blob, PORT, pick_gid};

/// Posts in flight at once (then their completions are taken, untimed).
pub(crate) const BATCH: u32 = 32;
/// Bytes of the baseline's registered buffer: two halves of 128 KiB.
const BUF: usize = 256 << 10;
/// How long a baseline waits for one completion.
const WAIT: Duration = Duration::from_secs(30);

/// A device, a registered buffer and an RC QP (not yet connected).
struct Bare {
    // Field order is drop order: the QP and MR before what they use, the
    // buffer last.
    qp: Qp,
    mr: Mr,
    cq: Arc<Cq>,
    _pd: Arc<Pd>,
    _ctx: Arc<Context>,
    port: PortInfo,
    gid_index: u8,
    gid: [u8; 16],
    psn: u32,
    buf: Box<[u8]>,
}

impl Bare {
    fn new(name: &str, depth: u32) -> io::Result<Bare> {
        let ctx = Arc::new(Context::open(Some(name))?);
        let port = ctx.port(PORT)?;
        let (gid_index, gid) = pick_gid(&ctx);
        let pd = Pd::new(&ctx)?;
        let cq = Cq::new(&ctx, 4096, None)?;
        let share = cq
            .reserve(2 * depth)
            .ok_or_else(|| io::Error::other("the CQ is too small for the QP"))?;
        let buf = vec![0u8; BUF].into_boxed_slice();
        let access = ibv::ACCESS_LOCAL_WRITE | ibv::ACCESS_REMOTE_WRITE;
        // SAFETY: `buf` is kept in the returned value and dropped after the
        // MR (field order).
        #[allow(unsafe_code)]
        let mr = unsafe { pd.register(buf.as_ptr() as u64, BUF as u64, access)? };
        let qp = Qp::new(&pd, share, Transport::Rc, depth, 1, None)?;
        qp.init(PORT, access)?;
        Ok(Bare {
            qp,
            mr,
            cq,
            _pd: pd,
            _ctx: ctx,
            port,
            gid_index,
            gid,
            psn: super::new_psn(),
            buf,
        })
    }

    fn blob(&self) -> Blob {
        Blob {
            qpn: self.qp.qpn,
            psn: self.psn,
            lid: self.port.lid,
            mtu: self.port.active_mtu as u8,
            global: self.port.ethernet,
            gid: self.gid,
        }
    }

    fn connect(&self, b: &Blob) -> io::Result<()> {
        let r = Remote {
            qpn: b.qpn,
            psn: b.psn,
            lid: b.lid,
            gid: b.gid,
            global: self.port.ethernet || b.global,
        };
        let mtu = self.port.active_mtu.min(b.mtu as u32).max(1);
        self.qp.connect(&r, self.psn, mtu, PORT, self.gid_index)
    }

    fn va(&self, off: usize) -> u64 {
        self.buf.as_ptr() as u64 + off as u64
    }

    fn sge(&self, off: usize, len: u32) -> [Sge; 1] {
        [Sge {
            addr: self.va(off),
            len,
            lkey: self.mr.lkey,
        }]
    }

    /// Takes `n` successful completions (busy polling).
    fn reap(&self, n: u32) -> io::Result<()> {
        let mut got = 0;
        let mut idle = 0u32;
        let mut deadline = None;
        while got < n {
            let mut failed = None;
            let k = self.cq.poll_each((n - got) as usize, |w| {
                if w.status != ibv::WC_SUCCESS {
                    failed.get_or_insert(w.status);
                }
            });
            if let Some(st) = failed {
                return Err(io::Error::other(ibv::status_str(st)));
            }
            got += k as u32;
            if k == 0 {
                idle += 1;
                // The clock only now and then: it is not free under TCG.
                if idle % 4096 == 0 {
                    let d = *deadline.get_or_insert_with(|| Instant::now() + WAIT);
                    if Instant::now() > d {
                        return Err(io::Error::other("no completion in 30 s"));
                    }
                }
            }
        }
        Ok(())
    }

    fn post_one(&self, req: &SendReq<'_>) -> io::Result<()> {
        self.qp
            .post_send(std::slice::from_ref(req))
            .map_err(|e| e.1)
    }
}

/// Mean time of one bare `ibv_post_send` (an 8-byte RDMA write, signalled)
/// over `iters` posts on device `name` (see [`bare_post_cost`]).
///
/// # Errors
/// The device's, if it cannot be opened or set up.
pub(crate) fn bare_post(name: &str, iters: u32) -> io::Result<Duration> {
    bare_post_cost(name, iters, 8, false)
}

/// Mean time of one bare post on device `name` over `iters` posts, in
/// batches of [`BATCH`] timed calls whose completions are taken untimed:
/// `recv` false: `ibv_post_send` of an RDMA write of `size` bytes
/// (signalled); true: `ibv_post_recv` of a `size`-byte buffer, each
/// consumed by an untimed 8-byte send of the QP (connected to itself).
///
/// # Errors
/// The device's, if it cannot be opened or set up, or an operation fails.
pub(crate) fn bare_post_cost(
    name: &str,
    iters: u32,
    size: u32,
    recv: bool,
) -> io::Result<Duration> {
    let size = size.min(BUF as u32 / 2);
    let b = Bare::new(name, 64)?;
    b.connect(&b.blob())?;
    let half = BUF / 2;
    let src = b.sge(0, size);
    let write = SendReq {
        wr_id: 1,
        op: SendOp::Write {
            remote_va: b.va(half),
            rkey: b.mr.rkey,
        },
        imm: None,
        sges: &src,
    };
    let small = b.sge(0, 8);
    let send = SendReq {
        wr_id: 2,
        op: SendOp::Send,
        imm: None,
        sges: &small,
    };
    let dst = b.sge(half, size);
    let mut total = Duration::ZERO;
    let mut done = 0;
    while done < iters {
        let n = BATCH.min(iters - done);
        for _ in 0..n {
            let t = Instant::now();
            if recv {
                b.qp.post_recv(3, &dst)?;
            } else {
                b.post_one(&write)?;
            }
            total += t.elapsed();
        }
        if recv {
            for _ in 0..n {
                b.post_one(&send)?;
            }
            b.reap(2 * n)?;
        } else {
            b.reap(n)?;
        }
        done += n;
    }
    Ok(total / iters.max(1))
}

/// One side of an `ibv_rc_pingpong`-style loop: RC, 8-byte send/receive,
/// both sides busy-polling one CQ, a receive re-posted before each send.
/// The two sides (two processes) exchange [`RawPingPong::endpoint`]s out
/// of band, then [`RawPingPong::connect`] and [`RawPingPong::run`].
pub struct RawPingPong {
    b: Bare,
}

impl RawPingPong {
    /// A QP on device `name` with one receive posted.
    ///
    /// # Errors
    /// The device's.
    pub fn new(name: &str) -> io::Result<RawPingPong> {
        let b = Bare::new(name, 16)?;
        b.qp.post_recv(1, &b.sge(BUF / 2, 64))?;
        Ok(RawPingPong { b })
    }

    /// What the other side needs to connect to this one.
    pub fn endpoint(&self) -> Vec<u8> {
        self.b.blob().encode()
    }

    /// Connects to the side whose [`RawPingPong::endpoint`] is `peer`.
    ///
    /// # Errors
    /// `InvalidInput` for a malformed endpoint; the device's.
    pub fn connect(&self, peer: &[u8]) -> io::Result<()> {
        let b = Blob::decode(peer)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not a verbs endpoint"))?;
        self.b.connect(&b)
    }

    /// `iters` round trips of `size` bytes (at most 64); the initiator
    /// sends first. Returns the time they took.
    ///
    /// # Errors
    /// A failed completion, or none within 30 s.
    pub fn run(&self, iters: u32, size: u32, initiator: bool) -> io::Result<Duration> {
        let b = &self.b;
        let src = b.sge(0, size.min(64));
        let dst = b.sge(BUF / 2, 64);
        let send = SendReq {
            wr_id: 2,
            op: SendOp::Send,
            imm: None,
            sges: &src,
        };
        let t = Instant::now();
        for _ in 0..iters {
            if initiator {
                b.post_one(&send)?;
                b.reap(2)?;
                b.qp.post_recv(1, &dst)?;
            } else {
                b.reap(1)?;
                b.qp.post_recv(1, &dst)?;
                b.post_one(&send)?;
                b.reap(1)?;
            }
        }
        Ok(t.elapsed())
    }
}
