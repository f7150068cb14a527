//! Baselines of the verbs kind's measurements, with bare verbs calls on
//! the same device in the same run (`tests/tests/verbs.rs`,
//! `tests/tests/verbs_bench.rs`):
//!
//! * [`bare_post_cost`]: a bare `ibv_post_send` / `ibv_post_recv` on an RC
//!   QP connected to itself, measured the way the tests measure
//!   `Vi::post_send` / `Vi::post_recv`; its completions taken by busy
//!   polling, or ([`Reap::Events`]) by a thread sleeping on a completion
//!   channel, as the verbs kind's provider thread takes them when the
//!   application blocks;
//! * [`RawPingPong`]: an `ibv_rc_pingpong`-style loop (RC, send/receive,
//!   busy polling of the CQ) between two processes, against which via's
//!   ping-pong latency is reported.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::ibv::{
    self, Channel, Context, Cq, Mr, Pd, PortInfo, Qp, Remote, SendOp, SendReq, Sge, Transport,
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
    /// The CQ's completion channel ([`Reap::Events`]).
    channel: Option<Arc<Channel>>,
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
        Bare::with_reap(name, depth, Reap::Poll)
    }

    /// [`Bare::new`], its CQ signalling on a channel of its own for
    /// [`Reap::Events`].
    fn with_reap(name: &str, depth: u32, reap: Reap) -> io::Result<Bare> {
        let ctx = Arc::new(Context::open(Some(name))?);
        let port = ctx.port(PORT)?;
        let (gid_index, gid) = pick_gid(&ctx);
        let pd = Pd::new(&ctx)?;
        let channel = match reap {
            Reap::Poll => None,
            Reap::Events => Some(Channel::new(&ctx)?),
        };
        let cq = Cq::new(&ctx, 4096, channel.as_ref())?;
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
            channel,
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
    bare_post_cost(name, iters, 8, false, Reap::Poll)
}

/// How a baseline takes the completions of its posts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reap {
    /// The posting thread polls the CQ (`ibv_poll_cq` in a loop).
    Poll,
    /// A thread of its own sleeps on the CQ's completion channel and, once
    /// woken, drains the CQ, arming it again whenever it finds the CQ
    /// empty: what the verbs kind's provider thread does while no
    /// application thread polls (`Verbs::progress`), with nothing else.
    Events,
}

/// The thread of [`Reap::Events`], counting the completions it takes.
struct EventReaper {
    got: Arc<AtomicU32>,
    /// The status of the first failed completion (`WC_SUCCESS`: none).
    failed: Arc<AtomicU32>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl EventReaper {
    fn start(cq: Arc<Cq>, channel: Arc<Channel>) -> io::Result<EventReaper> {
        let got = Arc::new(AtomicU32::new(0));
        let failed = Arc::new(AtomicU32::new(ibv::WC_SUCCESS));
        let stop = Arc::new(AtomicBool::new(false));
        let (count, first_failure, stopping) = (got.clone(), failed.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("bare-reaper".into())
            .spawn(move || {
                let drain = || {
                    let mut all = 0;
                    loop {
                        let k = cq.poll_each(16, |w| {
                            if w.status != ibv::WC_SUCCESS {
                                let _ = first_failure.compare_exchange(
                                    ibv::WC_SUCCESS,
                                    w.status,
                                    Ordering::Relaxed,
                                    Ordering::Relaxed,
                                );
                            }
                        });
                        if k == 0 {
                            return all;
                        }
                        all += k;
                        // Release: a waiter that sees the count sees the
                        // failure recorded before it.
                        count.fetch_add(k as u32, Ordering::Release);
                    }
                };
                while !stopping.load(Ordering::Acquire) {
                    if drain() > 0 {
                        continue;
                    }
                    cq.arm();
                    // A completion may have arrived between the drain and
                    // the arm.
                    if drain() > 0 {
                        continue;
                    }
                    // Bounded: the stop flag is looked at every 100 ms.
                    if ibv::wait_readable([channel.fd()], 100)[0] {
                        channel.take_events();
                    }
                }
            })?;
        Ok(EventReaper {
            got,
            failed,
            stop,
            thread: Some(thread),
        })
    }

    /// Waits until the thread took `total` completions in all; an error
    /// if one failed, or after [`WAIT`] without them.
    fn wait_for(&self, total: u32) -> io::Result<()> {
        let mut deadline = None;
        let mut idle = 0u32;
        loop {
            let got = self.got.load(Ordering::Acquire);
            let st = self.failed.load(Ordering::Relaxed);
            if st != ibv::WC_SUCCESS {
                return Err(io::Error::other(ibv::status_str(st)));
            }
            if got >= total {
                return Ok(());
            }
            idle += 1;
            // The clock only now and then: it is not free under TCG.
            if idle % 1024 == 0 {
                let d = *deadline.get_or_insert_with(|| Instant::now() + WAIT);
                if Instant::now() > d {
                    return Err(io::Error::other("no completion in 30 s"));
                }
            }
            std::thread::yield_now();
        }
    }
}

impl Drop for EventReaper {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Mean time of one bare post on device `name` over `iters` posts, in
/// batches of [`BATCH`] timed calls whose completions are taken untimed,
/// as `reap` says: `recv` false: `ibv_post_send` of an RDMA write of
/// `size` bytes (signalled); true: `ibv_post_recv` of a `size`-byte
/// buffer, each consumed by an untimed 8-byte send of the QP (connected to
/// itself).
///
/// # Errors
/// The device's, if it cannot be opened or set up, or an operation fails.
pub(crate) fn bare_post_cost(
    name: &str,
    iters: u32,
    size: u32,
    recv: bool,
    reap: Reap,
) -> io::Result<Duration> {
    let size = size.min(BUF as u32 / 2);
    let b = Bare::with_reap(name, 64, reap)?;
    b.connect(&b.blob())?;
    // Declared after `b`: stopped before the QP goes.
    let reaper = match &b.channel {
        Some(ch) => Some(EventReaper::start(b.cq.clone(), ch.clone())?),
        None => None,
    };
    let mut expected = 0;
    let mut take = |n: u32| match &reaper {
        Some(r) => {
            expected += n;
            r.wait_for(expected)
        }
        None => b.reap(n),
    };
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
            take(2 * n)?;
        } else {
            take(n)?;
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
