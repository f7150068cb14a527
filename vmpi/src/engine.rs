//! The point-to-point engine of a process: requests, matching, the eager
//! and rendezvous protocols over the [`Channel`]s, and progress.
//!
//! **Progress runs inline** in the caller (every call that may complete
//! something drains the completion queue first); no helper thread is on
//! this path. The one completion queue of the process takes the receive
//! completions of every channel; with a single peer (two processes) there
//! is no CQ: the channel's write ring is polled in memory (see
//! [`crate::channel`]), or, without one, its VI is polled and waited on
//! directly. Send
//! completions are reaped lazily from each VI (see [`crate::channel`]);
//! only while RDMA reads are outstanding does progress look at them.
//!
//! **Matching** follows MPI: a message matches the earliest posted
//! receive with its context, a source equal to its own or `ANY_SOURCE`,
//! and a tag equal to its own or `ANY_TAG`; a new receive matches the
//! earliest unexpected message. Messages of one sender arrive in order on
//! its channel and are matched in arrival order, so nothing overtakes.
//!
//! **Protocols.** Up to the eager limit a message travels in the header's
//! slot (copied into a send slot, placed by the provider into a receive
//! slot, copied out into the posted receive or the unexpected queue).
//! Above it the sender registers its buffer (the registration cache makes
//! a repeated buffer cost a lookup) and sends an RTS; the receiver, once a
//! receive matches, registers its own buffer and RDMA-reads the data
//! straight into it (one copy, no intermediate buffer), then sends FIN,
//! which completes the send.
//!
//! **Waiting.** A wait polls for [`Config::spin`] (none by default), then
//! blocks in the provider's CQ wait, or the single peer's VI receive wait
//! (spin for `VIA_SPIN_US`, then a futex sleep), unless a send waits for
//! credits, which arrive by RDMA write without a completion: then it polls
//! with a backoff that yields and sleeps. While an RDMA read is
//! outstanding it blocks briefly on that channel's send queue. Nothing
//! spins for long when processes outnumber cores, so those jobs progress.
//!
//! **Direct receive.** A blocking receive with nothing posted, queued or
//! unexpectedly matching makes no request ([`Engine::recv`]); the slot it
//! copied from is re-posted off the critical path (`Engine::settle`'s
//! deferred work: after the next send, or before any wait).
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::time::Duration;

use via::{Cq, Nic, Ptag, Region};

use crate::buffer::UserBuf;
use crate::channel::{Channel, SendOp, Shape};
use crate::error::{Error, Result};
use crate::pmi::Pmi;
use crate::wire::{Header, Kind};

/// A request's id.
pub type ReqId = u64;

/// What a completed receive (or probe) reports.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Status {
    /// Sender's rank in the communicator.
    pub source: i32,
    /// Tag.
    pub tag: i32,
    /// Bytes received (for a probe: bytes of the message).
    pub bytes: u64,
}

/// Where an outgoing message's data comes from.
enum Data {
    None,
    /// The send request's buffer.
    Req(ReqId),
}

/// Work waiting for credits or a descriptor slot, in order per channel.
enum Out {
    Msg(Header, Data),
    Read {
        req: ReqId,
        remote: (u64, u32),
        off: usize,
        len: u32,
    },
}

struct Req {
    done: bool,
    status: Status,
    error: Option<Error>,
    buf: UserBuf,
    region: Option<Region>,
    reads_left: u32,
    fin_to: Option<(u32, u64)>,
    /// The data was read into `region`, a copy, not into `buf`.
    bounce: bool,
}

impl Req {
    fn new(buf: UserBuf) -> Req {
        Req {
            done: false,
            status: Status::default(),
            error: None,
            buf,
            region: None,
            reads_left: 0,
            fin_to: None,
            bounce: false,
        }
    }
}

/// The live requests: a slab whose slots and their `Req`s are reused (a
/// steady exchange allocates nothing for its requests and hashes nothing).
/// An id is `generation << 32 | index`, so a stale or forged id (a request
/// already waited for) finds nothing rather than another request.
#[derive(Default)]
struct Reqs {
    slots: Vec<(u32, Option<Req>)>,
    free: Vec<u32>,
}

impl Reqs {
    fn insert(&mut self, r: Req) -> ReqId {
        let i = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push((0, None));
                (self.slots.len() - 1) as u32
            }
        };
        let s = &mut self.slots[i as usize];
        // Generations start at 1: no id is 0.
        s.0 = s.0.wrapping_add(1).max(1);
        s.1 = Some(r);
        (u64::from(s.0) << 32) | u64::from(i)
    }

    fn get(&self, id: ReqId) -> Option<&Req> {
        match self.slots.get(id as u32 as usize) {
            Some((g, Some(r))) if u64::from(*g) == id >> 32 => Some(r),
            _ => None,
        }
    }

    fn get_mut(&mut self, id: ReqId) -> Option<&mut Req> {
        match self.slots.get_mut(id as u32 as usize) {
            Some((g, Some(r))) if u64::from(*g) == id >> 32 => Some(r),
            _ => None,
        }
    }

    fn remove(&mut self, id: ReqId) -> Option<Req> {
        let i = id as u32;
        let s = self.slots.get_mut(i as usize)?;
        if u64::from(s.0) != id >> 32 || s.1.is_none() {
            return None;
        }
        self.free.push(i);
        s.1.take()
    }
}

impl std::ops::Index<&ReqId> for Reqs {
    type Output = Req;
    fn index(&self, id: &ReqId) -> &Req {
        self.get(*id).expect("a live request")
    }
}

struct Posted {
    id: ReqId,
    context: u32,
    source: Option<u32>,
    tag: Option<i32>,
}

enum Body {
    Data(Vec<u8>),
    Rts {
        peer: u32,
        sreq: u64,
        addr: u64,
        handle: u32,
    },
}

struct Unexpected {
    context: u32,
    source: u32,
    tag: i32,
    len: u64,
    body: Body,
}

/// Tunables, from the environment.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// Largest message sent eagerly (`VMPI_EAGER_LIMIT`).
    pub eager_limit: usize,
    /// Receive slots per channel (`VMPI_SLOTS`).
    pub slots: usize,
    /// How long a wait polls the completion queue itself before it blocks
    /// in the provider's wait (`VMPI_SPIN_US`, default 0: the provider's
    /// wait spins `VIA_SPIN_US`, 20 µs, first anyway). Longer polling was
    /// measured harmful on this shared 2-core machine (docs/vmpi.md).
    pub spin: Duration,
    /// How many times a receive wait with a single peer reads the status
    /// of the receive descriptor expected next in memory before it blocks
    /// in the provider's wait (`VMPI_POLL`, default 0: an A/B on the
    /// shared machine did not show it faster; always 0 when processes
    /// outnumber cores): a message that lands meanwhile is taken with a
    /// dequeue, without the wait's set-up and its locked polls.
    pub poll: u32,
    /// Messages between the two processes of a two-process job travel by
    /// RDMA write into a ring polled in memory, where the NIC stores a
    /// write's last word last (`VMPI_RING=on|off`; unset: on unless
    /// processes outnumber cores, since a ring wait polls and yields but
    /// never sleeps). See [`crate::channel`].
    pub ring: bool,
}

impl Config {
    /// Defaults and environment overrides (`size`: processes of the job;
    /// large jobs get fewer slots per channel, the memory being
    /// `2 × slots × eager limit` per peer).
    pub fn from_env(size: u32) -> Config {
        let get = |k: &str, d: usize| {
            std::env::var(k)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(d)
        };
        Config {
            eager_limit: get("VMPI_EAGER_LIMIT", DEFAULT_EAGER_LIMIT).clamp(0, 1 << 20),
            slots: get("VMPI_SLOTS", if size > 8 { 8 } else { 16 }).clamp(2, 256),
            spin: Duration::from_micros(get("VMPI_SPIN_US", 0).min(1_000_000) as u64),
            poll: if std::env::var_os("VMPI_OVERSUBSCRIBED").is_some() {
                0
            } else {
                get("VMPI_POLL", DEFAULT_POLL).min(1 << 20) as u32
            },
            ring: match std::env::var("VMPI_RING").as_deref() {
                Ok("0" | "off" | "no" | "false") => false,
                Ok("1" | "on" | "yes" | "true") => true,
                _ => std::env::var_os("VMPI_OVERSUBSCRIBED").is_none(),
            },
        }
    }
}

/// Reads of the expected receive's status before a blocking wait.
pub const DEFAULT_POLL: usize = 0;

/// The default eager limit, chosen by measurement (docs/vmpi.md).
pub const DEFAULT_EAGER_LIMIT: usize = 65536;

/// The engine of one process.
pub struct Engine {
    rank: u32,
    size: u32,
    nic: Nic,
    ptag: Ptag,
    /// Receive completions of every channel; `None` with a single peer
    /// (its VI is polled and waited on instead).
    cq: Option<Cq>,
    /// The one peer when the job has two processes.
    single: Option<u32>,
    channels: Vec<Option<Channel>>,
    /// Peer of each VI slot (`u32::MAX`: none).
    by_vi: Vec<u32>,
    out: Vec<VecDeque<Out>>,
    queued: usize,
    /// RDMA reads posted and not yet seen complete.
    reads_out: usize,
    reqs: Reqs,
    posted: VecDeque<Posted>,
    unexpected: VecDeque<Unexpected>,
    eager_limit: usize,
    spin: Duration,
    poll: u32,
    closing: bool,
    /// A receive slot copied out by a direct receive and not yet re-posted
    /// (peer, slot): re-posted off the critical path, once the caller has
    /// had its data (see [`Engine::settle`]).
    deferred: Option<(u32, usize)>,
    /// A list of request ids lent to each collective call (no allocation
    /// per call).
    pub(crate) spare_ids: Vec<ReqId>,
}

/// How long a wait on a write ring polls before it also yields the
/// processor between polls (as the provider's wait spins `VIA_SPIN_US`
/// before it sleeps).
const RING_SPIN: Duration = Duration::from_micros(20);

/// How long `finalize` waits for queued sends that make no progress.
const DRAIN_STALL: Duration = Duration::from_secs(10);

fn disc(job: &str, from: u32, to: u32, kind: &str) -> Vec<u8> {
    format!("vmpi:{job}:{kind}:{from}:{to}").into_bytes()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    (s.len() % 2 == 0)
        .then(|| {
            (0..s.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
                .collect()
        })
        .flatten()
}

/// What [`connect_all`] opens: the NIC, the protection tag, the receive
/// CQ (if any), a channel per other process (`None` for this one).
pub(crate) type Connected = (Nic, Ptag, Option<Cq>, Vec<Option<Channel>>);

/// Opens the NIC and connects a set of channels to every other process:
/// the channel set of the engine, or of the offload context (`kind`).
/// `with_cq`: the channels' receive completions go to one CQ (else each
/// VI is polled itself). `ring`: this process would take messages through
/// write rings; a channel uses one when both of its ends would and the NIC
/// stores a write's last word last.
pub(crate) fn connect_all(
    pmi: &mut Pmi,
    kind: &str,
    shape: Shape,
    with_cq: bool,
    ring: bool,
) -> Result<Connected> {
    let (rank, size) = (pmi.rank(), pmi.size());
    let nic = Nic::open(None)?;
    nic.set_error_callback(|e| log::debug!("via: {e:?}"));
    let ptag = nic.create_ptag()?;
    let entries = ((size as usize) * shape.recv + 64).next_power_of_two() as u32;
    let cq = if with_cq {
        Some(nic.create_cq(entries.min(65536))?)
    } else {
        None
    };
    let mut channels = Vec::new();
    for p in 0..size {
        channels.push(if p == rank {
            None
        } else {
            Some(Channel::new(&nic, ptag, cq.as_ref(), p, shape)?)
        });
    }
    let ring = ring && nic.writes_tail_last();
    for ch in channels.iter().flatten() {
        let (a, h) = ch.credit_word()?;
        // The ring's base, 0 for none.
        let base = if ring { ch.ring_base()? } else { 0 };
        pmi.put(
            &format!("{kind}.cw.{rank}.{}", ch.peer()),
            &format!("{a}:{h}:{base}"),
        )?;
    }
    pmi.put(&format!("{kind}.host.{rank}"), &hex(&nic.host_address()))?;
    pmi.fence()?;
    let job = pmi.job().to_string();
    for ch in channels.iter_mut().flatten() {
        let p = ch.peer();
        let v = pmi
            .get(&format!("{kind}.cw.{p}.{rank}"))
            .ok_or_else(|| Error::Intern(format!("rank {p} published no credit word")))?;
        let mut f = v.split(':').map(str::parse::<u64>);
        let (Some(Ok(a)), Some(Ok(h)), Some(Ok(base)), None) =
            (f.next(), f.next(), f.next(), f.next())
        else {
            return Err(Error::Intern(format!("bad credit word {v:?}")));
        };
        let h = u32::try_from(h).map_err(|_| Error::Intern(format!("bad credit word {v:?}")))?;
        ch.set_remote_credit(a, h);
        if ring && base != 0 {
            ch.use_ring(base, h)?;
        }
    }
    // Client/server set-up, which every kind of NIC offers (the sockets
    // NIC has no peer-to-peer set-up across hosts): the lower rank of a
    // pair requests, the higher accepts. Each rank accepts from the ranks
    // below it in order, then requests to those above in order: a request
    // waits in the broker until its listener comes, and rank 0 never
    // waits to accept, so by induction every wait ends.
    let timeout = Some(Duration::from_secs(60));
    for ch in channels.iter().flatten().filter(|c| c.peer() < rank) {
        let p = ch.peer();
        let req = nic.connect_wait(&nic.address(&disc(&job, p, rank, kind)), timeout)?;
        ch.accept(req)?;
    }
    for ch in channels.iter().flatten().filter(|c| c.peer() > rank) {
        let p = ch.peer();
        let host = pmi
            .get(&format!("{kind}.host.{p}"))
            .and_then(unhex)
            .ok_or_else(|| Error::Intern(format!("rank {p} published no host address")))?;
        let remote = via::NetAddr {
            host,
            discriminator: disc(&job, rank, p, kind),
        };
        ch.connect(&nic.address(&disc(&job, rank, p, kind)), &remote, timeout)?;
    }
    Ok((nic, ptag, cq, channels))
}

/// A backoff for polling waits: yields first, then sleeps up to 1 ms.
pub(crate) struct Backoff(u32);

impl Backoff {
    pub(crate) fn new() -> Backoff {
        Backoff(0)
    }
    pub(crate) fn snooze(&mut self) {
        self.0 += 1;
        if self.0 < 16 {
            std::thread::yield_now();
        } else {
            let us = (1u64 << ((self.0 - 16) / 4).min(10)).min(1000);
            std::thread::sleep(Duration::from_micros(us));
        }
    }
}

impl Engine {
    /// Connects this process to every other process of the job.
    ///
    /// # Errors
    /// `Transport` if the provider or a peer fails.
    pub fn new(pmi: &mut Pmi, cfg: Config) -> Result<Engine> {
        let slot = (crate::wire::HEADER + cfg.eager_limit).next_multiple_of(64);
        let shape = Shape {
            recv: cfg.slots,
            send: cfg.slots,
            slot,
        };
        let single = (pmi.size() == 2).then(|| 1 - pmi.rank());
        let (nic, ptag, cq, channels) = connect_all(
            pmi,
            "p2p",
            shape,
            single.is_none(),
            cfg.ring && single.is_some(),
        )?;
        let mut by_vi = Vec::new();
        for ch in channels.iter().flatten() {
            let v = ch.vi_slot() as usize;
            if by_vi.len() <= v {
                by_vi.resize(v + 1, u32::MAX);
            }
            by_vi[v] = ch.peer();
        }
        let size = pmi.size();
        Ok(Engine {
            rank: pmi.rank(),
            size,
            nic,
            ptag,
            cq,
            single,
            channels,
            by_vi,
            out: (0..size).map(|_| VecDeque::new()).collect(),
            queued: 0,
            reads_out: 0,
            reqs: Reqs::default(),
            posted: VecDeque::new(),
            unexpected: VecDeque::new(),
            eager_limit: cfg.eager_limit,
            spin: cfg.spin,
            poll: cfg.poll,
            closing: false,
            deferred: None,
            spare_ids: Vec::new(),
        })
    }

    /// This process's rank in the job.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Processes in the job.
    pub fn size(&self) -> u32 {
        self.size
    }

    /// The NIC (for the offload context and statistics).
    pub fn nic(&self) -> &Nic {
        &self.nic
    }

    /// How many of this process's channels take messages through a write
    /// ring (diagnostics, and the tests' check of which transport ran).
    pub fn write_rings(&self) -> usize {
        self.channels
            .iter()
            .flatten()
            .filter(|c| c.is_ring())
            .count()
    }

    /// The eager limit in bytes.
    pub fn eager_limit(&self) -> usize {
        self.eager_limit
    }

    fn new_req(&mut self, buf: UserBuf) -> ReqId {
        self.reqs.insert(Req::new(buf))
    }

    fn complete(&mut self, id: ReqId) {
        if let Some(r) = self.reqs.get_mut(id) {
            // Deregister before completing: nothing touches the buffer afterwards.
            r.region = None;
            r.done = true;
        }
    }

    #[inline]
    fn ch(&mut self, peer: u32) -> Result<&mut Channel> {
        self.channels
            .get_mut(peer as usize)
            .and_then(Option::as_mut)
            .ok_or_else(|| Error::Intern(format!("no channel to rank {peer}")))
    }

    /// Starts a send of `buf` to world rank `dest` (`source` is the
    /// sender's rank in the communicator of `context`).
    pub fn isend(
        &mut self,
        context: u32,
        source: u32,
        dest: u32,
        tag: i32,
        buf: UserBuf,
    ) -> Result<ReqId> {
        self.settle()?;
        let len = buf.len();
        let id = self.new_req(buf);
        if dest == self.rank {
            let data = self.reqs[&id].buf.slice(0, len).to_vec();
            self.deliver(context, source, tag, len as u64, Body::Data(data))?;
            self.complete(id);
            return Ok(id);
        }
        let mut h = Header::new(Kind::Eager);
        h.context = context;
        h.source = source;
        h.tag = tag;
        h.len = len as u64;
        h.sreq = id;
        if len > self.eager_limit {
            h.kind = Kind::Rts;
            let nic = self.nic.clone();
            let ptag = self.ptag;
            let r = self.reqs.get_mut(id).unwrap();
            let range = r
                .buf
                .user_range()
                .ok_or_else(|| Error::Intern("empty RTS".into()))?;
            let region = match Region::of_user_range(&nic, range, ptag, false, true) {
                Ok(region) => region,
                Err(e) => {
                    // A range the provider cannot register (one that
                    // crosses a page boundary without a whole page): send
                    // from a registered copy.
                    log::debug!(
                        "send buffer of {len} bytes not registered ({e:?}); sending a copy"
                    );
                    let region = Region::new(&nic, len, ptag, false, true)?;
                    region.write(0, r.buf.slice(0, len))?;
                    region
                }
            };
            h.addr = region.addr(0)?;
            h.handle = region.handle();
            r.region = Some(region);
            self.push(dest, Out::Msg(h, Data::None))?;
        } else {
            self.push(dest, Out::Msg(h, Data::Req(id)))?;
        }
        Ok(id)
    }

    /// Sends `data` to world rank `dest` and returns when `data` may be
    /// reused (`MPI_Send`). An eager message that can go at once (a credit,
    /// a descriptor slot, nothing queued before it) is copied out with no
    /// request at all; anything else is a request waited for.
    #[inline]
    pub fn send(
        &mut self,
        context: u32,
        source: u32,
        dest: u32,
        tag: i32,
        data: &[u8],
    ) -> Result<()> {
        if self.send_now(context, source, dest, tag, data)? {
            return Ok(());
        }
        let id = self.isend(context, source, dest, tag, UserBuf::lend(data))?;
        self.wait(id).map(|_| ())
    }

    /// Sends `data` at once, with no request, if it is an eager message
    /// that can go now (a credit, a descriptor slot, nothing queued before
    /// it): whether it went.
    #[inline(always)]
    pub fn send_now(
        &mut self,
        context: u32,
        source: u32,
        dest: u32,
        tag: i32,
        data: &[u8],
    ) -> Result<bool> {
        if dest == self.rank || data.len() > self.eager_limit {
            return Ok(false);
        }
        let Some(ch) = self
            .channels
            .get_mut(dest as usize)
            .and_then(Option::as_mut)
        else {
            return Ok(false);
        };
        if !self.out[dest as usize].is_empty() || !ch.can_send() {
            return Ok(false);
        }
        let mut h = Header::new(Kind::Eager);
        h.context = context;
        h.source = source;
        h.tag = tag;
        h.len = data.len() as u64;
        ch.send(&mut h, data)?;
        self.settle()?;
        Ok(true)
    }

    /// Starts a receive into `buf` of a message of `context` from `source`
    /// (`None`: any) with `tag` (`None`: any).
    pub fn irecv(
        &mut self,
        context: u32,
        source: Option<u32>,
        tag: Option<i32>,
        buf: UserBuf,
    ) -> Result<ReqId> {
        self.settle()?;
        let id = self.new_req(buf);
        // No progress first: a message still in the completion queue
        // matches this receive when it is handled (it came after the ones
        // already unexpected, in order), and is then copied once, straight
        // into `buf`.
        let found = self.unexpected.iter().position(|u| {
            u.context == context
                && source.is_none_or(|s| s == u.source)
                && tag.is_none_or(|t| t == u.tag)
        });
        match found {
            Some(i) => {
                let u = self.unexpected.remove(i).unwrap();
                self.matched(id, u)?;
            }
            None => self.posted.push_back(Posted {
                id,
                context,
                source,
                tag,
            }),
        }
        Ok(id)
    }

    /// Receives into `buf` (`MPI_Recv`): its status, and the error of the
    /// message (truncation). When no receive is posted, nothing waits to
    /// be sent and no unexpected message matches, it is **direct**: no
    /// request; the next messages are taken from the channels one by one,
    /// and the first eager one that matches is copied from its slot into
    /// `buf` (others are handled as usual). Anything else (a rendezvous
    /// message for it, queued work) falls back to a request.
    #[inline]
    pub fn recv(
        &mut self,
        context: u32,
        source: Option<u32>,
        tag: Option<i32>,
        buf: &mut [u8],
    ) -> Result<(Status, Option<Error>)> {
        if let Some(r) = self.recv_direct(context, source, tag, buf)? {
            return Ok(r);
        }
        let id = self.irecv(context, source, tag, UserBuf::lend_mut(buf))?;
        let (st, _, err) = self.wait(id)?;
        Ok((st, err))
    }

    /// Work kept off the critical path of a message: re-posts the slot a
    /// direct receive left, returns credits, and reaps a send queue that
    /// is half full. Runs after a send has gone and before any wait.
    #[inline]
    fn settle(&mut self) -> Result<()> {
        match self.deferred.take() {
            Some((peer, slot)) => self.settle_slot(peer, slot),
            None => Ok(()),
        }
    }

    fn settle_slot(&mut self, peer: u32, slot: usize) -> Result<()> {
        {
            let ch = self.ch(peer)?;
            let r = ch
                .repost(slot)
                .and_then(|_| ch.return_credits(false))
                .and_then(|_| {
                    if ch.half_in_flight() {
                        ch.reap()
                    } else {
                        Ok(())
                    }
                });
            // A send that failed is seen here, by the reap: a peer leaving
            // once the job is finishing.
            self.closing_ok(r.map(Some))?;
        }
        Ok(())
    }

    #[inline]
    fn recv_direct(
        &mut self,
        context: u32,
        source: Option<u32>,
        tag: Option<i32>,
        buf: &mut [u8],
    ) -> Result<Option<(Status, Option<Error>)>> {
        let matches = |c: u32, s: u32, t: i32| {
            c == context && source.is_none_or(|x| x == s) && tag.is_none_or(|x| x == t)
        };
        let direct = |e: &Engine| {
            e.posted.is_empty()
                && e.queued == 0
                && e.reads_out == 0
                && (e.unexpected.is_empty()
                    || !e
                        .unexpected
                        .iter()
                        .any(|u| matches(u.context, u.source, u.tag)))
        };
        if !direct(self) {
            return Ok(None);
        }
        loop {
            let m = self.wait_message();
            let Some((peer, slot)) = self.closing_ok(m)? else {
                continue;
            };
            let ch = self.ch(peer)?;
            let h = ch.header();
            if h.kind == Kind::Eager && matches(h.context, h.source, h.tag) {
                let n = h.len as usize;
                let got = n.min(buf.len());
                ch.read_data(slot, h, 0, &mut buf[..got])?;
                let status = Status {
                    source: h.source as i32,
                    tag: h.tag,
                    bytes: got as u64,
                };
                let err = (n > got).then_some(Error::Truncate {
                    got: h.len,
                    room: got as u64,
                });
                // The slot is re-posted later, off the critical path (the
                // caller's next call, or before any wait; `wait_message`
                // has just settled what was deferred before).
                debug_assert!(self.deferred.is_none());
                self.settle()?;
                self.deferred = Some((peer, slot));
                return Ok(Some((status, err)));
            }
            let h = *h;
            let r = self.on_message(peer, slot, h);
            self.closing_ok(r.map(Some))?;
            if !direct(self) {
                return Ok(None);
            }
        }
    }

    /// Finds a matching unexpected message without receiving it.
    pub fn iprobe(
        &mut self,
        context: u32,
        source: Option<u32>,
        tag: Option<i32>,
    ) -> Result<Option<Status>> {
        self.progress()?;
        Ok(self
            .unexpected
            .iter()
            .find(|u| {
                u.context == context
                    && source.is_none_or(|s| s == u.source)
                    && tag.is_none_or(|t| t == u.tag)
            })
            .map(|u| Status {
                source: u.source as i32,
                tag: u.tag,
                bytes: u.len,
            }))
    }

    /// Waits for a matching message; returns its status without receiving it.
    pub fn probe(&mut self, context: u32, source: Option<u32>, tag: Option<i32>) -> Result<Status> {
        loop {
            if let Some(s) = self.iprobe(context, source, tag)? {
                return Ok(s);
            }
            self.wait_step()?;
        }
    }

    /// Whether request `id` is complete (`Request` if unknown).
    pub fn is_done(&self, id: ReqId) -> Result<bool> {
        self.reqs.get(id).map(|r| r.done).ok_or(Error::Request)
    }

    /// Progresses, then whether request `id` is complete.
    pub fn test_done(&mut self, id: ReqId) -> Result<bool> {
        self.progress()?;
        self.is_done(id)
    }

    /// Removes a complete request: its status, its buffer, and its error.
    fn take(&mut self, id: ReqId) -> Result<(Status, UserBuf, Option<Error>)> {
        let r = self.reqs.remove(id).ok_or(Error::Request)?;
        Ok((r.status, r.buf, r.error))
    }

    /// Completes `id` if it is done: `Some((status, buffer, error))`.
    pub fn test(&mut self, id: ReqId) -> Result<Option<(Status, UserBuf, Option<Error>)>> {
        self.progress()?;
        if self.is_done(id)? {
            self.take(id).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Waits for `id` and removes it. A request already complete (an eager
    /// send is, once its data is copied) returns at once: completions of
    /// other requests are handled by the next call that waits or polls.
    pub fn wait(&mut self, id: ReqId) -> Result<(Status, UserBuf, Option<Error>)> {
        while !self.is_done(id)? {
            self.wait_step()?;
        }
        self.take(id)
    }

    /// Waits for every request of `ids`.
    pub fn wait_all(&mut self, ids: &[ReqId]) -> Result<Vec<(Status, UserBuf, Option<Error>)>> {
        for &id in ids {
            while !self.is_done(id)? {
                self.wait_step()?;
            }
        }
        ids.iter().map(|&id| self.take(id)).collect()
    }

    /// One blocking step: waits for a completion (or polls while sends
    /// wait for credits) and handles it.
    pub fn wait_step(&mut self) -> Result<()> {
        // A read completes on a send queue, which is on no CQ: block on the
        // send queue of a channel whose read is outstanding (its completion
        // wakes this process at once), briefly, so that receives on other
        // channels are polled again soon.
        if self.reads_out > 0 && self.queued == 0 {
            if self.progress()? {
                return Ok(());
            }
            let busy = self
                .channels
                .iter()
                .position(|c| c.as_ref().is_some_and(Channel::reads_in_flight));
            if let Some(p) = busy {
                let r = self.ch(p as u32)?.wait_send(Duration::from_micros(50));
                self.closing_ok(r.map(Some))?;
                self.progress()?;
                return Ok(());
            }
        }
        // Credits come by RDMA write and reads complete on send queues,
        // neither through a receive completion: poll while either is awaited.
        if self.queued > 0 || self.reads_out > 0 {
            if self.progress()? {
                return Ok(());
            }
            let mut b = Backoff::new();
            for _ in 0..64 {
                if self.progress()? {
                    return Ok(());
                }
                b.snooze();
            }
            return Ok(());
        }
        let m = self.wait_message();
        if let Some((peer, slot)) = self.closing_ok(m)? {
            let h = *self.ch(peer)?.header();
            let r = self.on_message(peer, slot, h);
            self.closing_ok(r.map(Some))?;
        }
        Ok(())
    }

    /// The next message if one is ready: (peer, slot); its header is the
    /// channel's [`Channel::header`].
    fn poll_message(&mut self) -> Result<Option<(u32, usize)>> {
        if let Some(peer) = self.single {
            let ch = self.ch(peer)?;
            let m = if ch.is_ring() {
                ch.ring_poll()?
            } else {
                ch.recv_done()?
            };
            return Ok(m.map(|i| (peer, i)));
        }
        loop {
            let cq = self
                .cq
                .as_ref()
                .ok_or_else(|| Error::Intern("no CQ with more than one peer".into()))?;
            match cq.done() {
                Ok((vi, true)) => {
                    if let Some(m) = self.on_cq(vi)? {
                        return Ok(Some(m));
                    }
                }
                // Send queues are not on the CQ.
                Ok((_, false)) => {}
                Err(e) if e.kind() == via::ErrorKind::NotDone => return Ok(None),
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Waits for the next message: polls for up to [`Config::spin`], then
    /// blocks in the provider's wait (which spins for `VIA_SPIN_US`, then
    /// sleeps until the peer's engine wakes it); `None` after 500 ms.
    #[inline]
    fn wait_message(&mut self) -> Result<Option<(u32, usize)>> {
        self.settle()?;
        // (The provider's wait polls first: no poll of our own before it.)
        // A core per process: the peer is running, and its answer comes
        // sooner than a sleeping process wakes up.
        if !self.spin.is_zero() {
            let end = std::time::Instant::now() + self.spin;
            loop {
                for _ in 0..32 {
                    if let Some(m) = self.poll_message()? {
                        return Ok(Some(m));
                    }
                    std::hint::spin_loop();
                }
                if std::time::Instant::now() >= end {
                    break;
                }
            }
        }
        let timeout = Duration::from_millis(500);
        if let Some(peer) = self.single {
            let poll = self.poll;
            let ch = self.ch(peer)?;
            let m = if ch.is_ring() {
                ch.ring_wait(timeout, RING_SPIN)?
            } else {
                ch.recv_wait(timeout, poll)?
            };
            return Ok(m.map(|i| (peer, i)));
        }
        let cq = self
            .cq
            .as_ref()
            .ok_or_else(|| Error::Intern("no CQ with more than one peer".into()))?;
        match cq.wait(Some(timeout)) {
            Ok((vi, true)) => self.on_cq(vi),
            Ok((_, false)) => Ok(None),
            Err(e) if e.kind() == via::ErrorKind::Timeout => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Handles every completion that is ready and sends what waited.
    pub fn progress(&mut self) -> Result<bool> {
        self.settle()?;
        let mut did = false;
        loop {
            let m = self.poll_message();
            let Some((peer, slot)) = self.closing_ok(m)? else {
                break;
            };
            let h = *self.ch(peer)?.header();
            let r = self.on_message(peer, slot, h);
            self.closing_ok(r.map(Some))?;
            did = true;
        }
        if self.reads_out > 0 {
            did |= self.reap_reads()?;
        }
        if self.queued > 0 {
            did |= self.flush()?;
        }
        Ok(did)
    }

    /// Reaps the send queues for completed RDMA reads and handles them.
    fn reap_reads(&mut self) -> Result<bool> {
        let mut did = false;
        for peer in 0..self.size {
            let Some(ch) = self.channels[peer as usize].as_mut() else {
                continue;
            };
            let r = ch.reap();
            self.closing_ok(r.map(Some))?;
            while let Some(id) = self.channels[peer as usize]
                .as_mut()
                .and_then(Channel::take_read_done)
            {
                self.reads_out -= 1;
                self.on_send_done(peer, SendOp::Read(id))?;
                did = true;
            }
        }
        Ok(did)
    }

    /// A transport error is a peer leaving once the job is finishing
    /// (peers disconnect in any order then): nothing.
    #[inline]
    fn closing_ok<T>(&self, r: Result<Option<T>>) -> Result<Option<T>> {
        match r {
            Err(Error::Transport(m)) if self.closing => {
                log::debug!("while finishing: {m}");
                Ok(None)
            }
            r => r,
        }
    }

    /// The message whose receive completion the CQ reported on VI `vi`.
    fn on_cq(&mut self, vi: u32) -> Result<Option<(u32, usize)>> {
        let peer = match self.by_vi.get(vi as usize) {
            Some(&p) if p != u32::MAX => p,
            _ => return Ok(None),
        };
        Ok(self.ch(peer)?.recv_done()?.map(|i| (peer, i)))
    }

    fn on_send_done(&mut self, peer: u32, op: SendOp) -> Result<()> {
        if let SendOp::Read(id) = op {
            let last = {
                let r = self.reqs.get_mut(id).ok_or(Error::Request)?;
                r.reads_left -= 1;
                r.reads_left == 0
            };
            if last {
                let r = self.reqs.get_mut(id).ok_or(Error::Request)?;
                if r.bounce {
                    let n = r.status.bytes as usize;
                    if let Some(region) = r.region.take() {
                        region.read(0, r.buf.slice_mut(0, n))?;
                    }
                }
                let (to, sreq) = self.reqs[&id].fin_to.expect("a read has a FIN");
                self.complete(id);
                self.send_fin(to, sreq)?;
            }
        }
        let _ = peer;
        Ok(())
    }

    fn send_fin(&mut self, to: u32, sreq: u64) -> Result<()> {
        let mut h = Header::new(Kind::Fin);
        h.sreq = sreq;
        self.push(to, Out::Msg(h, Data::None))
    }

    fn on_message(&mut self, peer: u32, slot: usize, h: Header) -> Result<()> {
        match h.kind {
            Kind::Eager => {
                let n = h.len as usize;
                let found = self.find_posted(h.context, h.source, h.tag);
                match found {
                    Some(id) => {
                        let ch = self.channels[peer as usize].as_ref().unwrap();
                        let r = self.reqs.get_mut(id).unwrap();
                        let room = r.buf.len();
                        ch.read_data(slot, &h, 0, r.buf.slice_mut(0, n.min(room)))?;
                        Self::set_status(r, &h, n.min(room) as u64, h.len);
                        self.complete(id);
                    }
                    None => {
                        let mut data = vec![0u8; n];
                        self.channels[peer as usize]
                            .as_ref()
                            .unwrap()
                            .read_data(slot, &h, 0, &mut data)?;
                        self.unexpected.push_back(Unexpected {
                            context: h.context,
                            source: h.source,
                            tag: h.tag,
                            len: h.len,
                            body: Body::Data(data),
                        });
                    }
                }
            }
            Kind::Rts => {
                let u = Unexpected {
                    context: h.context,
                    source: h.source,
                    tag: h.tag,
                    len: h.len,
                    body: Body::Rts {
                        peer,
                        sreq: h.sreq,
                        addr: h.addr,
                        handle: h.handle,
                    },
                };
                match self.find_posted(h.context, h.source, h.tag) {
                    Some(id) => self.matched(id, u)?,
                    None => self.unexpected.push_back(u),
                }
            }
            Kind::Fin => self.complete(h.sreq),
            Kind::Offload => {
                return Err(Error::Intern(
                    "offload message on a point-to-point channel".into(),
                ));
            }
        }
        let ch = self.ch(peer)?;
        ch.repost(slot)?;
        ch.return_credits(false)
    }

    fn set_status(r: &mut Req, h: &Header, got: u64, len: u64) {
        r.status = Status {
            source: h.source as i32,
            tag: h.tag,
            bytes: got,
        };
        if len > got {
            r.error = Some(Error::Truncate {
                got: len,
                room: got,
            });
        }
    }

    fn find_posted(&mut self, context: u32, source: u32, tag: i32) -> Option<ReqId> {
        let i = self.posted.iter().position(|p| {
            p.context == context
                && p.source.is_none_or(|s| s == source)
                && p.tag.is_none_or(|t| t == tag)
        })?;
        self.posted.remove(i).map(|p| p.id)
    }

    /// A message for this process from itself, or one taken from a slot.
    fn deliver(&mut self, context: u32, source: u32, tag: i32, len: u64, body: Body) -> Result<()> {
        let u = Unexpected {
            context,
            source,
            tag,
            len,
            body,
        };
        match self.find_posted(context, source, tag) {
            Some(id) => self.matched(id, u),
            None => {
                self.unexpected.push_back(u);
                Ok(())
            }
        }
    }

    /// Receive `id` matched message `u`.
    fn matched(&mut self, id: ReqId, u: Unexpected) -> Result<()> {
        let h = Header {
            context: u.context,
            source: u.source,
            tag: u.tag,
            len: u.len,
            ..Header::new(Kind::Eager)
        };
        match u.body {
            Body::Data(d) => {
                let r = self.reqs.get_mut(id).unwrap();
                let n = d.len().min(r.buf.len());
                r.buf.slice_mut(0, n).copy_from_slice(&d[..n]);
                Self::set_status(r, &h, n as u64, u.len);
                self.complete(id);
                Ok(())
            }
            Body::Rts {
                peer,
                sreq,
                addr,
                handle,
            } => {
                let nic = self.nic.clone();
                let ptag = self.ptag;
                let r = self.reqs.get_mut(id).unwrap();
                let n = (u.len as usize).min(r.buf.len());
                Self::set_status(r, &h, n as u64, u.len);
                r.fin_to = Some((peer, sreq));
                if n == 0 {
                    self.complete(id);
                    return self.send_fin(peer, sreq);
                }
                let range = r.buf.user_range().expect("not empty");
                r.region = Some(
                    match Region::of_user_range(&nic, range, ptag, false, false) {
                        Ok(region) => region,
                        Err(e) => {
                            // Not registrable (see `isend`): read into a
                            // registered bounce buffer, copied out at the end.
                            log::debug!(
                                "receive buffer of {n} bytes not registered ({e:?}); reading into a copy"
                            );
                            r.bounce = true;
                            Region::new(&nic, n, ptag, false, false)?
                        }
                    },
                );
                let mts = crate::channel::transfer_limit(&nic) as usize;
                let chunks = n.div_ceil(mts);
                r.reads_left = chunks as u32;
                for c in 0..chunks {
                    let off = c * mts;
                    let len = (n - off).min(mts) as u32;
                    self.push(
                        peer,
                        Out::Read {
                            req: id,
                            remote: (addr + off as u64, handle),
                            off,
                            len,
                        },
                    )?;
                }
                Ok(())
            }
        }
    }

    /// Sends now if the channel lets it and nothing waits before; queues otherwise.
    fn push(&mut self, peer: u32, o: Out) -> Result<()> {
        if self.out[peer as usize].is_empty() && self.try_send(peer, &o)? {
            return Ok(());
        }
        self.out[peer as usize].push_back(o);
        self.queued += 1;
        Ok(())
    }

    /// Sends what waited, in order per channel; whether anything went.
    fn flush(&mut self) -> Result<bool> {
        let mut did = false;
        for peer in 0..self.size {
            while let Some(o) = self.out[peer as usize].pop_front() {
                if self.try_send(peer, &o)? {
                    self.queued -= 1;
                    did = true;
                } else {
                    self.out[peer as usize].push_front(o);
                    break;
                }
            }
        }
        Ok(did)
    }

    fn try_send(&mut self, peer: u32, o: &Out) -> Result<bool> {
        // Completions free descriptor slots: take them first.
        let ch = self.channels[peer as usize]
            .as_mut()
            .ok_or_else(|| Error::Intern(format!("no channel to rank {peer}")))?;
        match o {
            Out::Msg(h, data) => {
                if !ch.can_send() {
                    return Ok(false);
                }
                let mut h = *h;
                match data {
                    Data::None => ch.send(&mut h, &[])?,
                    Data::Req(id) => {
                        let r = self.reqs.get(*id).ok_or(Error::Request)?;
                        let n = h.len as usize;
                        ch.send(&mut h, r.buf.slice(0, n))?;
                        let id = *id;
                        self.complete(id);
                    }
                }
                Ok(true)
            }
            Out::Read {
                req,
                remote,
                off,
                len,
            } => {
                if !ch.desc_free() {
                    return Ok(false);
                }
                let r = self.reqs.get(*req).ok_or(Error::Request)?;
                let region = r
                    .region
                    .as_ref()
                    .ok_or_else(|| Error::Intern("read without a region".into()))?;
                ch.read(*remote, region, *off, *len, *req)?;
                self.reads_out += 1;
                Ok(true)
            }
        }
    }

    /// Marks the job as finishing: connections that break from now on are
    /// peers leaving, not errors.
    pub fn set_closing(&mut self) {
        self.closing = true;
    }

    /// Sends what is still queued and returns every unreported credit.
    ///
    /// Bounded: a peer that finished first may have closed before granting
    /// the credits a queued send waits for; after [`DRAIN_STALL`] without
    /// progress the rest is dropped with a warning rather than waited for
    /// forever (a program that finalizes with sends nobody receives is
    /// erroneous anyway).
    pub fn drain(&mut self) -> Result<()> {
        self.settle()?;
        let mut last = (self.queued, std::time::Instant::now());
        while self.queued > 0 {
            self.wait_step()?;
            if self.queued != last.0 {
                last = (self.queued, std::time::Instant::now());
            } else if last.1.elapsed() > DRAIN_STALL {
                log::warn!(
                    "finalize: {} sends still queued after {DRAIN_STALL:?} without progress (peers closed?); dropped",
                    self.queued
                );
                return Ok(());
            }
        }
        self.sent_out()
    }

    /// Waits until every posted send has completed
    /// ([`Channel::finish_sends`]), for at most [`DRAIN_STALL`].
    fn sent_out(&mut self) -> Result<()> {
        let deadline = std::time::Instant::now() + DRAIN_STALL;
        for ch in self.channels.iter_mut().flatten() {
            ch.finish_sends(deadline)?;
        }
        Ok(())
    }

    /// Disconnects every channel.
    pub fn close(&mut self) {
        self.closing = true;
        for ch in self.channels.iter().flatten() {
            ch.disconnect();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(n: usize) -> Req {
        Req::new(UserBuf::owned(vec![0u8; n]))
    }

    #[test]
    fn request_slots_are_reused_and_stale_ids_find_nothing() {
        let mut r = Reqs::default();
        let a = r.insert(req(1));
        let b = r.insert(req(2));
        assert_ne!(a, b);
        assert_ne!(a, 0);
        assert_eq!(r.get(a).map(|q| q.buf.len()), Some(1));
        assert!(r.remove(a).is_some());
        // Gone: neither found nor removable twice.
        assert!(r.get(a).is_none() && r.get_mut(a).is_none() && r.remove(a).is_none());
        // The slot is reused under a new generation: the old id stays dead.
        let c = r.insert(req(3));
        assert_eq!(c as u32, a as u32);
        assert_ne!(c, a);
        assert!(r.get(a).is_none());
        assert_eq!(r.get(c).map(|q| q.buf.len()), Some(3));
        assert_eq!(r.get(b).map(|q| q.buf.len()), Some(2));
        // Ids that were never issued.
        assert!(r.get(u64::MAX).is_none() && r.remove(7 << 32 | 1).is_none());
        assert_eq!(r.slots.len(), 2, "no growth while a slot is free");
    }
}
