//! The verbs kind of NIC: VIA over an InfiniBand or RoCE device through
//! libibverbs (Soft-RoCE `rxe0` in the tests).
//!
//! The mapping (the reasons are in `docs/design.md`, "The verbs kind"):
//!
//! | VIA | verbs |
//! |---|---|
//! | NIC | device context, port 1, one CQ with a completion channel, one progress thread |
//! | protection tag | protection domain (one per tag, made on first use) |
//! | registration | memory region, registered after the common registration path pinned the pages |
//! | memory handle | the MR's rkey (peers use it as is; the lkey for a region without remote access, whose rkey is 0); the lkey stays in this process |
//! | VI | RC queue pair (reliable levels) or UC (Unreliable), created with the VI |
//! | connection | QPN, PSN, LID, GID and MTU in the endpoint blob that viad's broker carries |
//! | send, RDMA write (with immediate), RDMA read | one work request, signalled, `wr_id` = VI + queue position |
//! | completion | the progress thread polls the CQ and writes status, length and immediate data through `crate::completion` |
//! | QP in error | VI in ERROR (`CONN_LOST`), outstanding descriptors flushed |
//!
//! The data path of a send: `ViCore::post_send` translates and checks the
//! descriptor → [`Verbs::post_send`] maps its segments to lkeys and posts
//! one work request (`ibv.rs`) → the device moves the data → the progress
//! thread ([`Verbs::progress`]) takes the completion and writes the user's
//! descriptor, the CQ entry and the wakeups.
//!
//! `ibv.rs` is the only module with `unsafe` (the FFI); this one is safe but
//! for one registration call, whose contract the common registration path
//! upholds (the pages stay mapped until the region is removed).
#![deny(unsafe_code)]

pub(crate) mod bench;
mod central;
mod cqs;
#[allow(unsafe_code)]
mod ibv;
mod keys;
mod records;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use doorbell::EventCount;

use crate::attrs::{Reliability, ViAttributes, ViState};
use crate::backend::{
    CqSignals, Device, Kick, Limits, RegionSlot, RegionSpec, RetiredEntry, SrqDone, ViSignals,
};
use crate::completion;
use crate::config::{Config, DoorbellMode};
use crate::descriptor::{control, status};
use crate::error::{Error, ErrorKind, Result};
use crate::nic::{AsyncError, ErrorCode, NicInner, flags};
use crate::process::Process;
use crate::proto::{Endpoint, Request};
use crate::regions::RegionCache;
use crate::shm::mapping::Mapping;
use crate::shm::rings::MappedRing;
use crate::translate::{RecvWr, SendWr, Translated, WrRegions};
use crate::vi::{ViCore, Which};

use central::{Central, Failed, Queued};
use cqs::DeviceCqs;
use ibv::{
    Context, CqShare, DeviceEvent, Mr, OneReq, Opcode, Pd, Qp, Remote, SendOp, SendReq, Sge,
    SgeList, Srq, Transport, Wc,
};
use keys::{Epoch, Key, KeyCache};
use records::{PosRing, RecvDone, RecvRec, RecvSlab};

const MAX_VI: u32 = 1024;
const MAX_CQ: u32 = 1024;
/// Shared receive queues per NIC (an extension, not VIPL 1.0).
const MAX_SRQ: u32 = 64;
/// The `wr_id` slot field of an SRQ's receives: this bit plus the SRQ id
/// (VI slots are below [`MAX_VI`]).
const SRQ_SLOT: u32 = 0x8000;
/// Work requests per queue of a QP (and descriptors per VIA work queue).
const QUEUE_DEPTH: u32 = 1024;
/// Entries of each device CQ (rxe's largest; at most the device's
/// `max_cqe`): 15 VIs' queues in each ([`cqs`]).
const CQ_ENTRIES: i32 = 32767;
const PORT: u8 = 1;
/// How long a disconnect waits for the device to flush a QP.
const FLUSH_WAIT: Duration = Duration::from_secs(5);

/// The canonical name if `name` is a verbs device: `verbs` (the first
/// device), an ibverbs device name (`rxe0`, `mlx5_0`), or `/dev/via_<dev>`.
pub(crate) fn accepts(name: &str) -> Option<String> {
    let base = name.strip_prefix("/dev/via_").unwrap_or(name);
    if base == "verbs" {
        return Some(base.to_string());
    }
    let ok = !base.is_empty()
        && !base.contains('/')
        && !base.starts_with('.')
        && std::path::Path::new("/sys/class/infiniband")
            .join(base)
            .exists();
    ok.then(|| base.to_string())
}

/// The RDMA devices of this host (for tests and tools; empty when none).
pub(crate) fn devices() -> Vec<String> {
    ibv::devices()
}

/// Whether device `name` opens XRC domains (the error if not).
pub(crate) fn xrc_supported(name: &str) -> std::io::Result<()> {
    Context::open(Some(name))?.xrc_supported()
}

/// Work requests posted through central queues and the chains they took.
pub(crate) fn central_counts() -> (u64, u64) {
    central::counts()
}

#[derive(Default)]
struct ViWords {
    send_wake: EventCount,
    recv_wake: EventCount,
    interest: AtomicU32,
    /// The device CQs the VI's QP completes on, for a thread that polls
    /// the VI ([`Device::poll`]): each one's index + 1, sends in the low
    /// half, receives in the high half (0: not known, poll them all).
    cqs: AtomicU64,
}

#[derive(Default)]
struct CqWords {
    wake: EventCount,
    interest: AtomicU32,
}

/// The record a work completion takes from its VI.
enum Taken {
    Recv(RecvDone),
    Send(SendRec, Reliability),
}

/// A send in flight: where its completion goes.
#[derive(Clone, Copy, Default)]
struct SendRec {
    desc_handle: u32,
    desc_va: u64,
    op_status: u32,
    rdma: bool,
}

/// The device side of one VI.
struct ViQp {
    generation: u16,
    /// The VI (a completion finds it here, under the lock it takes anyway,
    /// rather than in the NIC's table of VIs).
    core: std::sync::Weak<ViCore>,
    reliability: Reliability,
    ptag: u32,
    /// Remote access the QP allows (the VI's RDMA enables).
    access: u32,
    qp: Arc<Qp>,
    /// Our first send PSN of the next connection.
    psn: u32,
    /// RTS towards a peer.
    connected: bool,
    /// The connection's MaxTransferSize (the smaller of the two VIs').
    mtu: u32,
    /// We moved the QP to ERROR: its flushes are expected.
    erroring: bool,
    /// Sends on the QP, by queue position (removed when completed).
    sends: PosRing<SendRec>,
    /// Receives on the QP, by queue position (removed when completed or
    /// cancelled; a completion of a removed one is ignored).
    recvs: PosRing<RecvRec>,
    /// The lkeys of the regions this VI posts from.
    keys: KeyCache,
    /// The SRQ the QP receives from.
    srq: Option<u32>,
    /// The peer and path MTU of the connection (to bring the QP back).
    remote: Option<(Remote, u32)>,
    /// An Unreliable VI whose QP went to ERROR on a message longer than
    /// its receive, until the QP is back ([`Recovery`]).
    recovery: Option<Recovery>,
}

/// An Unreliable VI (a UC QP) coming back from a message longer than its
/// receive. VIA completes that receive with a length error and keeps the
/// VI connected; verbs moves the QP to ERROR and flushes every request.
/// Until each request of the QP has come out, receives are kept (a
/// flushed one, or one posted meanwhile, is not handed to the device) and
/// a flushed send completes as sent (Unreliable: its message is lost, as
/// one may be). Then the QP goes through RESET back to RTS towards the
/// same peer (UC takes the peer's next message at any PSN), the kept
/// receives are posted again in their order, and only then is the failed
/// receive completed, so that what the program does next meets a working
/// VI.
struct Recovery {
    /// The failed receive, and its completion (`None`: cancelled).
    failed: Option<(RecvDone, Wc)>,
    /// Its queue position: the kept receives follow it.
    pos: u64,
    /// Receives kept: flushed, or posted during the recovery.
    kept: usize,
}

impl ViQp {
    /// The receives in flight or kept, in queue order from position `pos`
    /// on (positions wrap at `POS_MASK`).
    fn recvs_after(&self, pos: u64) -> Vec<(u64, RecvRec)> {
        let mut v: Vec<(u64, RecvRec)> = self.recvs.iter().map(|(p, r)| (p, *r)).collect();
        v.sort_by_key(|(p, _)| p.wrapping_sub(pos) & records::POS_MASK);
        v
    }

    /// Posts the receives `kept` (in queue order) to the QP again, counting
    /// them in `posted`, after a RESET dropped them.
    fn post_again(
        &self,
        kept: &[(u64, RecvRec)],
        slot: u32,
        generation: u16,
        posted: &mut usize,
    ) -> std::io::Result<()> {
        for (p, rec) in kept {
            failpoint!("verbs-repost", |_| Err(std::io::Error::other(
                "fail point verbs-repost"
            )));
            self.qp
                .post_recv(wr_id(slot, generation, true, *p), rec.sges())?;
            *posted += 1;
        }
        Ok(())
    }
}

/// What a completion during a [`Recovery`] leaves to complete.
#[derive(Default)]
struct Recovered {
    /// A send that came out, and its error bits.
    send: Option<(SendRec, u32)>,
    /// The failed receive, once the QP is back (or could not come back).
    failed: Option<(RecvDone, Wc)>,
    /// The QP could not come back: the VI breaks.
    broke: bool,
}

/// Whether a receive that failed with `status` starts a [`Recovery`]: a
/// message longer than the receive (as `recv_status` reads it) on a
/// connected Unreliable VI with its own receive queue.
fn recoverable(v: &ViQp, status: u32) -> bool {
    v.reliability == Reliability::Unreliable
        && v.connected
        && !v.erroring
        && v.srq.is_none()
        && v.remote.is_some()
        && matches!(
            status,
            ibv::WC_LOC_LEN_ERR | ibv::WC_REM_INV_REQ_ERR | ibv::WC_LOC_QP_OP_ERR
        )
}

/// A map keyed by memory handles or queue positions: integers that need
/// no protection against chosen collisions, hashed by one multiplication
/// (std's SipHash was a tenth of the post path's instructions).
type KeyMap<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<KeyHasher>>;

/// Fibonacci hashing of an integer key.
#[derive(Default)]
struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u32(&mut self, x: u32) {
        self.write_u64(x as u64);
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0 ^ x).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// A shared receive queue of the NIC.
struct SrqDev {
    srq: Arc<Srq>,
    /// Its depth's entries in a device CQ: its receives complete there,
    /// whichever QP takes them.
    share: CqShare,
    ptag: u32,
    /// Receives posted.
    recvs: RecvSlab,
    /// The lkeys of the regions receives are posted from.
    keys: KeyCache,
    /// Completed descriptors, oldest first.
    done: VecDeque<SrqDone>,
    /// VIs attached.
    attached: u32,
}

/// A connection break found while running, settled outside the locks the
/// poster holds (breaking takes the VI's queue locks).
struct Break {
    vi: (u32, u16),
    code: ErrorCode,
    /// What the peer reports (`CONN_LOST`, or an error only this side saw
    /// that happened at the peer: [`peer_reason`]).
    tell: ErrorCode,
}

/// The asynchronous error the peer reports when a send of ours failed with
/// `status`: an RDMA protection violation or a message without a receive
/// happened at the peer, which verbs reports to the initiator only (as
/// the soft NIC's engine tells the target through its error ring).
fn peer_reason(status: u32, rec: &SendRec) -> ErrorCode {
    if rdma_refused(status, rec) {
        if rec.op_status == status::OP_RDMA_READ {
            ErrorCode::RdmarProt
        } else {
            ErrorCode::RdmawProt
        }
    } else if status == ibv::WC_RNR_RETRY_EXC_ERR {
        ErrorCode::RecvqEmpty
    } else {
        ErrorCode::ConnLost
    }
}

/// Whether the target refused our RDMA operation `rec` (work completion
/// `status`): a bad rkey or bounds (an access error), or RDMA disabled on
/// its QP, which rxe answers as an invalid request. VIA's RDMA enables are
/// protection either way: `RDMA_PROT_ERROR` here, `RDMAW_PROT` or
/// `RDMAR_PROT` at the target.
fn rdma_refused(status: u32, rec: &SendRec) -> bool {
    rec.rdma && matches!(status, ibv::WC_REM_ACCESS_ERR | ibv::WC_REM_INV_REQ_ERR)
}

/// What a peer needs to reach one of our QPs (the endpoint blob).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Blob {
    qpn: u32,
    psn: u32,
    lid: u16,
    mtu: u8,
    global: bool,
    gid: [u8; 16],
}

impl Blob {
    const LEN: usize = 28;

    fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(Self::LEN);
        b.extend_from_slice(&self.qpn.to_le_bytes());
        b.extend_from_slice(&self.psn.to_le_bytes());
        b.extend_from_slice(&self.lid.to_le_bytes());
        b.push(self.mtu);
        b.push(self.global as u8);
        b.extend_from_slice(&self.gid);
        b
    }

    fn decode(b: &[u8]) -> Option<Blob> {
        if b.len() != Self::LEN {
            return None;
        }
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        Some(Blob {
            qpn: u32_at(0) & 0xff_ffff,
            psn: u32_at(4) & 0xff_ffff,
            lid: u16::from_le_bytes([b[8], b[9]]),
            mtu: b[10],
            global: b[11] != 0,
            gid: b[12..28].try_into().unwrap(),
        })
    }
}

/// `wr_id` of a work request: VI slot and generation, the queue, and (for
/// receives) the queue position.
fn wr_id(slot: u32, generation: u16, recv: bool, pos: u64) -> u64 {
    ((slot as u64) << 48)
        | ((generation as u64) << 32)
        | ((recv as u64) << 31)
        | (pos & 0x7fff_ffff)
}

fn wr_id_parts(id: u64) -> (u32, u16, bool, u64) {
    (
        (id >> 48) as u32,
        (id >> 32) as u16,
        id & (1 << 31) != 0,
        id & 0x7fff_ffff,
    )
}

/// The device event a test injects (fail point `verbs-device-event`, its
/// argument read by [`Verbs::event_named`]): rxe raises no QP or SRQ
/// failure and no `DEVICE_FATAL` by itself. The progress thread takes it
/// as if the device had reported it. (`None` in a build without fail
/// points.)
fn injected_event() -> Option<String> {
    failpoint!("verbs-device-event", |arg| arg);
    None
}

/// Whether a new NIC takes lkeys to be the memory handles until an MR says
/// otherwise: yes, unless a test takes the lookup path (fail point
/// `verbs-keys-differ`; rxe gives every MR one key).
fn one_key_assumed() -> bool {
    failpoint!("verbs-keys-differ", |_| false);
    true
}

fn new_psn() -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    (t ^ std::process::id().rotate_left(12)) & 0xff_ffff
}

/// The QP access flags of a VI's attributes.
fn qp_access(a: &ViAttributes) -> u32 {
    let mut x = 0;
    if a.enable_rdma_write {
        x |= ibv::ACCESS_REMOTE_WRITE;
    }
    if a.enable_rdma_read && a.reliability != Reliability::Unreliable {
        x |= ibv::ACCESS_REMOTE_READ;
    }
    x
}

/// The status word of a receive completion.
fn recv_status(wc: &Wc) -> u32 {
    let ok = wc.status == ibv::WC_SUCCESS;
    let op = if wc.opcode == ibv::WC_RECV_RDMA_WITH_IMM {
        status::OP_REMOTE_RDMA_WRITE
    } else {
        status::OP_RECEIVE
    };
    let err = match wc.status {
        ibv::WC_SUCCESS => 0,
        ibv::WC_WR_FLUSH_ERR => status::DESC_FLUSHED_ERROR,
        // A message longer than the receive: LOC_LEN_ERR by the verbs
        // specification, REM_INV_REQ_ERR from rxe (the NAK it sends,
        // reported on the receive too). On UC, rxe reports it as
        // LOC_QP_OP_ERR.
        ibv::WC_LOC_LEN_ERR | ibv::WC_REM_INV_REQ_ERR | ibv::WC_LOC_QP_OP_ERR => {
            status::LENGTH_ERROR
        }
        ibv::WC_LOC_PROT_ERR | ibv::WC_LOC_ACCESS_ERR => status::PROTECTION_ERROR,
        _ => status::TRANSPORT_ERROR,
    };
    let imm = if ok { wc.imm } else { None };
    status::DONE | op | err | if imm.is_some() { status::IMMEDIATE } else { 0 }
}

/// Completes the receive of `vi` whose descriptor is `rw` with `wc`: the
/// status written, then the CQ entry and the wake-up (none if nothing
/// could be written: the descriptor's region is gone).
fn complete_recv(nic: &NicInner, vi: &ViCore, w: &mut RegionCache, rw: &RecvDone, wc: &Wc) {
    if write_recv(nic, w, rw, wc).is_some() {
        completion::after_local(nic, vi, Which::Recv);
    }
}

/// Writes the completion `wc` into the receive descriptor of `rw`; its
/// status, or `None` if the descriptor cannot be written.
fn write_recv(nic: &NicInner, w: &mut RegionCache, rw: &RecvDone, wc: &Wc) -> Option<u32> {
    let ok = wc.status == ibv::WC_SUCCESS;
    let st = recv_status(wc);
    let imm = if ok { wc.imm } else { None };
    let len = ok.then_some(wc.byte_len);
    let Some(d) = w.get(&nic.regions, rw.desc_handle) else {
        log::warn!("a receive descriptor lost its registration");
        return None;
    };
    let va = d.va + rw.desc_off;
    match completion::write_in_region(d, va, st, len, imm) {
        Ok(_) => Some(st),
        Err(_) => {
            log::warn!("cannot write a receive status at {va:#x}");
            None
        }
    }
}

/// The verbs operation and immediate data of a validated send.
/// Per `CS.Control & 7` (operation and immediate flag): the verbs opcode,
/// the completion's operation status and whether it is RDMA.
const SEND_OPS: [(Opcode, u32, bool); 8] = {
    let (send, write, read) = (status::OP_SEND, status::OP_RDMA_WRITE, status::OP_RDMA_READ);
    [
        (Opcode::SEND, send, false),
        (Opcode::RDMA_WRITE, write, true),
        (Opcode::RDMA_READ, read, true),
        (Opcode::SEND, send, false),
        (Opcode::SEND_WITH_IMM, send, false),
        (Opcode::RDMA_WRITE_WITH_IMM, write, true),
        (Opcode::RDMA_READ, read, true),
        (Opcode::SEND_WITH_IMM, send, false),
    ]
};

const _: () = {
    assert!(control::OP_MASK == 3 && control::IMMEDIATE == 4);
    assert!(control::OP_SENDRECV == 0 && control::OP_RDMAWRITE == 1);
    assert!(control::OP_RDMAREAD == 2);
};

fn send_op(wr: &SendWr) -> (SendOp, Option<u32>) {
    let imm = (wr.control & control::IMMEDIATE != 0).then_some(wr.imm);
    let op = match wr.op() {
        control::OP_RDMAWRITE => SendOp::Write {
            remote_va: wr.remote_va,
            rkey: wr.remote_handle,
        },
        control::OP_RDMAREAD => SendOp::Read {
            remote_va: wr.remote_va,
            rkey: wr.remote_handle,
        },
        _ => SendOp::Send,
    };
    (op, imm)
}

fn transport(r: Reliability) -> Transport {
    match r {
        Reliability::Unreliable => Transport::Uc,
        _ => Transport::Rc,
    }
}

/// A VI's generation and its QP.
type GenQp = (u16, Arc<Qp>);

/// The verbs device of one NIC.
pub(crate) struct Verbs {
    me: Weak<Verbs>,
    ctx: Arc<Context>,
    lid: u16,
    gid: [u8; 16],
    gid_index: u8,
    global: bool,
    mtu: u32,
    cqs: DeviceCqs,
    /// The device's asynchronous event fd (non-blocking).
    async_fd: std::os::fd::RawFd,
    /// The device failed (`DEVICE_FATAL`): no flush will come, and a
    /// disconnect does not wait for one.
    failed: AtomicBool,
    pds: Mutex<HashMap<u32, Arc<Pd>>>,
    /// Live MRs by memory handle (= rkey).
    mrs: RwLock<KeyMap<u32, Arc<Mr>>>,
    /// Removals from `mrs` (validates the queues' [`KeyCache`]s).
    mr_epoch: Epoch,
    /// Every MR's lkey is its memory handle (its rkey is the lkey, or it
    /// has none): a post hands the validated segments to the device as
    /// they are, with no key lookup. rxe, mlx4 and mlx5 give an MR one key
    /// for both; the first MR of another device whose keys differ clears
    /// this, and posts look lkeys up in the queue's [`KeyCache`] from then
    /// on.
    keys_are_handles: AtomicBool,
    /// MRs of parked registrations, by the handle they had: out of `mrs`
    /// (the handle is dead), kept for the same registration again.
    retired: Mutex<KeyMap<u32, Arc<Mr>>>,
    /// Each VI's QP state: a [`doorbell::Lock`] (no poisoning checks),
    /// taken by every post.
    vis: Box<[doorbell::Lock<Option<ViQp>>]>,
    /// Each VI's QP (and generation) for the central poster, which never
    /// takes the VIs' locks (a poster draining a full queue holds one).
    qps: Box<[Mutex<Option<GenQp>>]>,
    /// The central send queue (`VIA_DOORBELL=central`), or direct posting.
    central: Option<Central>,
    poster: Mutex<Option<JoinHandle<()>>>,
    srqs: Box<[Mutex<Option<SrqDev>>]>,
    srq_wakes: Box<[EventCount]>,
    /// The VI (slot, generation) of each QP number: who took a shared
    /// receive.
    qpns: Mutex<HashMap<u32, (u32, u16)>>,
    vi_words: Box<[ViWords]>,
    cq_words: Box<[CqWords]>,
    provider: EventCount,
    errors: Mutex<Vec<AsyncError>>,
    breaks: Mutex<Vec<Break>>,
    /// `breaks` may be non-empty.
    breaks_pending: AtomicBool,
    /// Held while polling the device CQ (the progress thread, or a
    /// disconnect draining a QP's flushes) and around every status write
    /// ([`Verbs::status_writer`]), with the regions of the descriptors
    /// written last: a completion finds its descriptor's region there,
    /// validated by the table's change count, without the table's lock or
    /// a reference count change (the table is read on a miss).
    poll_lock: Mutex<RegionCache>,
    /// Calls of `Device::poll` (application threads polling).
    polls: AtomicU64,
    /// The CQ a VI poller takes besides its own (in turn).
    poll_turn: AtomicUsize,
    stop: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// The GID index to use on an Ethernet port: `VIA_GID_INDEX`, else the
/// first IPv4-mapped GID (RoCEv2 over IPv4), else 0.
fn pick_gid(ctx: &Context) -> (u8, [u8; 16]) {
    if let Some(i) = std::env::var("VIA_GID_INDEX")
        .ok()
        .and_then(|v| v.parse::<u8>().ok())
    {
        return (i, ctx.gid(PORT, i as i32).unwrap_or([0; 16]));
    }
    let mut first = None;
    for i in 0..16u8 {
        let Ok(g) = ctx.gid(PORT, i as i32) else {
            break;
        };
        if g == [0; 16] {
            continue;
        }
        first.get_or_insert((i, g));
        if g[..10] == [0; 10] && g[10] == 0xff && g[11] == 0xff {
            return (i, g);
        }
    }
    first.unwrap_or((0, [0; 16]))
}

/// Opens NIC number `id` on the verbs device `name` (`verbs`: the first).
///
/// # Errors
/// `InvalidParameter` when no such device exists (no RDMA device, or no
/// libibverbs), `Resource` when the device refuses an object.
pub(crate) fn open(_process: &Arc<Process>, _id: u32, name: &str) -> Result<Arc<dyn Device>> {
    let want = (name != "verbs").then_some(name);
    let ctx = Context::open(want).map_err(|e| {
        log::info!("verbs: {e}");
        Error::caused_by(ErrorKind::InvalidParameter, e)
    })?;
    let ctx = Arc::new(ctx);
    let port = ctx.port(PORT).map_err(Error::resource)?;
    let (gid_index, gid) = pick_gid(&ctx);
    let cqs = device_cqs(&ctx).map_err(Error::resource)?;
    let async_fd = ctx.async_fd().map_err(Error::resource)?;
    log::info!(
        "verbs: opened {} (lid {}, mtu code {}, {}; gid index {gid_index})",
        ctx.name,
        port.lid,
        port.active_mtu,
        if port.ethernet { "RoCE" } else { "InfiniBand" }
    );
    Ok(Arc::new_cyclic(|me| Verbs {
        me: me.clone(),
        lid: port.lid,
        gid,
        gid_index,
        global: port.ethernet,
        mtu: port.active_mtu,
        ctx,
        cqs,
        async_fd,
        failed: AtomicBool::new(false),
        pds: Mutex::new(HashMap::new()),
        mrs: RwLock::new(KeyMap::default()),
        mr_epoch: Epoch::default(),
        keys_are_handles: AtomicBool::new(one_key_assumed()),
        retired: Mutex::new(KeyMap::default()),
        vis: (0..MAX_VI).map(|_| doorbell::Lock::new(None)).collect(),
        qps: (0..MAX_VI).map(|_| Mutex::new(None)).collect(),
        central: (Config::get().verbs_doorbell == DoorbellMode::Central).then(Central::new),
        poster: Mutex::new(None),
        srqs: (0..MAX_SRQ).map(|_| Mutex::new(None)).collect(),
        srq_wakes: (0..MAX_SRQ).map(|_| EventCount::new()).collect(),
        qpns: Mutex::new(HashMap::new()),
        vi_words: (0..MAX_VI).map(|_| ViWords::default()).collect(),
        cq_words: (0..MAX_CQ).map(|_| CqWords::default()).collect(),
        provider: EventCount::new(),
        errors: Mutex::new(Vec::new()),
        breaks: Mutex::new(Vec::new()),
        breaks_pending: AtomicBool::new(false),
        poll_lock: Mutex::new(RegionCache::default()),
        polls: AtomicU64::new(0),
        poll_turn: AtomicUsize::new(0),
        stop: AtomicBool::new(false),
        thread: Mutex::new(None),
    }))
}

/// [`CQ_ENTRIES`]; a test makes it small, to have several CQs with few
/// VIs.
fn cq_entries() -> i32 {
    failpoint!("verbs-cq-entries", |v: Option<String>| v
        .and_then(|v| v.parse::<i32>().ok())
        .unwrap_or(CQ_ENTRIES));
    CQ_ENTRIES
}

/// The device CQs of a NIC on `ctx`: each of [`CQ_ENTRIES`] entries or
/// the device's largest, enough for every VI and SRQ the NIC may have.
fn device_cqs(ctx: &Arc<Context>) -> std::io::Result<DeviceCqs> {
    let max = ctx.max_cqe()?;
    let entries = cq_entries().min(max);
    let one_vi = 2 * QUEUE_DEPTH as i32;
    if entries < one_vi {
        return Err(std::io::Error::other(format!(
            "the device's CQs hold {entries} entries, fewer than one VI's {one_vi} (max_cqe)"
        )));
    }
    // Enough for every VI's two queues and every SRQ, however few entries
    // beyond its size the device gives each CQ.
    let per_cq = (entries / one_vi) as usize;
    let most = (MAX_VI as usize).div_ceil(per_cq) + MAX_SRQ as usize;
    DeviceCqs::new(ctx, entries, most)
}

impl Verbs {
    fn pd(&self, ptag: u32) -> Result<Arc<Pd>> {
        let mut pds = self.pds.lock().unwrap();
        if let Some(p) = pds.get(&ptag) {
            return Ok(p.clone());
        }
        let p = Pd::new(&self.ctx).map_err(Error::resource)?;
        pds.insert(ptag, p.clone());
        Ok(p)
    }

    fn new_qp(&self, a: &ViAttributes, srq: Option<u32>) -> Result<Arc<Qp>> {
        failpoint!("verbs-create-qp", |_| Err(Error::Resource));
        let pd = self.pd(a.ptag.id())?;
        // With an SRQ its receives complete on the SRQ's CQ, which holds
        // their entries: the QP reserves its send queue's only.
        let srq = match srq {
            Some(id) => Some(
                self.srqs[id as usize]
                    .lock()
                    .unwrap()
                    .as_ref()
                    .map(|s| (s.srq.clone(), s.share.cq().clone()))
                    .ok_or(Error::InvalidParameter)?,
            ),
            None => None,
        };
        let queues = if srq.is_some() { 1 } else { 2 };
        let share = self.cqs.reserve(queues * QUEUE_DEPTH).map_err(|e| {
            log::warn!("verbs: {e}");
            Error::resource(e)
        })?;
        let qp = Qp::new(
            &pd,
            share,
            transport(a.reliability),
            QUEUE_DEPTH,
            crate::descriptor::MAX_SEGMENTS as u32,
            srq.as_ref().map(|(s, cq)| (s, cq)),
        )
        .map_err(Error::resource)?;
        qp.init(PORT, qp_access(a)).map_err(Error::resource)?;
        Ok(Arc::new(qp))
    }

    /// Whether every MR's lkey is its memory handle (see the field).
    #[inline(always)]
    fn keys_are_handles(&self) -> bool {
        // Acquire: pairs with the Release in `add_region`.
        self.keys_are_handles.load(Ordering::Acquire)
    }

    /// The key of the live MR of memory handle `handle` (a queue's
    /// [`KeyCache`] asks on a miss).
    fn mr_key(&self, handle: u32) -> Option<Key> {
        self.mrs.read().unwrap().get(&handle).map(|m| Key {
            lkey: m.lkey,
            addr: m.addr,
        })
    }

    /// Fills the record `rec` of receive `wr` (descriptor at `desc_va`),
    /// the segments' keys through `keys`, and posts its scatter list with
    /// `post`: the common part of a VI's and an SRQ's `post_recv`. On an
    /// error the caller frees the record.
    ///
    /// # Errors
    /// `InvalidParameter` if a segment's region is gone; the device's.
    fn post_recv_rec(
        &self,
        keys: &mut KeyCache,
        rec: &mut RecvRec,
        wr: &RecvWr,
        desc_va: u64,
        post: impl FnOnce(&[Sge]) -> std::io::Result<()>,
    ) -> Result<()> {
        self.fill_recv_rec(keys, rec, wr, desc_va)?;
        post(rec.sges()).map_err(|e| {
            log::warn!("verbs: posting a receive: {e}");
            Error::resource(e)
        })
    }

    /// One completion of a VI in [`Recovery`] (or the one that starts
    /// it), under the VI's lock: what to complete once it is released.
    fn recover(
        &self,
        v: &mut ViQp,
        wc: &Wc,
        recv: bool,
        pos: u64,
        slot: u32,
        generation: u16,
    ) -> Recovered {
        let mut out = Recovered::default();
        match v.recovery.as_mut() {
            None => {
                // (Its record gone, cancelled: the QP comes back all the same.)
                let failed = v.recvs.take(pos).map(|rec| (rec.done, *wc));
                log::debug!(
                    "VI {slot}: a message longer than its receive ({}): the Unreliable VI's QP \
                     is brought back",
                    ibv::status_str(wc.status)
                );
                v.recovery = Some(Recovery {
                    failed,
                    pos,
                    kept: 0,
                });
                failpoint!("verbs-recovery-begins");
            }
            Some(r) if recv => {
                // Flushed: the record stays, to be posted again.
                if v.recvs.contains(pos) {
                    r.kept += 1;
                }
            }
            Some(_) => {
                if let Some(rec) = v.sends.take(pos) {
                    // Flushed (or sent before the QP stopped): its message
                    // is lost or went, as an Unreliable one may.
                    let err = match wc.status {
                        ibv::WC_SUCCESS | ibv::WC_WR_FLUSH_ERR => 0,
                        _ => status::TRANSPORT_ERROR,
                    };
                    out.send = Some((*rec, err));
                }
            }
        }
        let r = v.recovery.as_ref().expect("in recovery");
        if v.erroring || !v.sends.is_empty() || v.recvs.len() != r.kept {
            // Requests still to come out (or a disconnect takes over).
            return out;
        }
        // A test holds the recovery open for a disconnect to land in.
        failpoint!("verbs-recovery-holds", |_| std::mem::take(&mut out));
        let r = v.recovery.take().expect("in recovery");
        out.failed = r.failed;
        let kept = v.recvs_after(r.pos);
        let mut posted = 0;
        let back = match v.remote {
            Some((remote, mtu)) => {
                v.psn = new_psn();
                v.qp.reset(PORT, v.access)
                    .and_then(|_| v.qp.connect(&remote, v.psn, mtu, PORT, self.gid_index))
                    .and_then(|_| v.post_again(&kept, slot, generation, &mut posted))
            }
            None => Err(std::io::Error::other("no peer recorded")),
        };
        match back {
            Ok(()) => log::debug!("VI {slot}: QP back, {posted} receives posted again"),
            Err(e) => {
                // The VI breaks; its disconnect completes the receives:
                // the ones not posted here as kept, the others when the
                // QP (in ERROR again) flushes them.
                log::warn!("verbs: VI {slot}: bringing the QP back: {e}");
                let _ = v.qp.error();
                v.recovery = Some(Recovery {
                    failed: None,
                    pos: r.pos,
                    kept: kept.len() - posted,
                });
                out.broke = true;
            }
        }
        out
    }

    /// Takes the QP of a VI whose connection could not be set up back to
    /// INIT through RESET (which drops its requests without completions)
    /// and posts its receives again, in their order: the VI stays idle
    /// with them, as VIA leaves a VI whose connection failed. How many.
    fn back_to_init(&self, v: &mut ViQp, slot: u32, generation: u16) -> std::io::Result<usize> {
        v.qp.reset(PORT, v.access)?;
        v.psn = new_psn();
        // Live positions lie within a queue's depth of each other: counted
        // from one depth before any of them, they sort in posting order.
        let Some(first) = v.recvs.iter().next().map(|(p, _)| p) else {
            return Ok(0);
        };
        let kept = v.recvs_after(first.wrapping_sub(QUEUE_DEPTH as u64) & records::POS_MASK);
        let mut posted = 0;
        v.post_again(&kept, slot, generation, &mut posted)?;
        Ok(posted)
    }

    /// Completes what [`Verbs::recover`] handed out (the VI's lock
    /// released; `w`: the poll lock's, held).
    fn recovered(
        &self,
        nic: &NicInner,
        vi: &ViCore,
        w: &mut RegionCache,
        out: Recovered,
        key: (u32, u16),
    ) {
        if let Some((rec, err)) = out.send {
            complete_send(
                nic,
                vi,
                w,
                rec.desc_handle,
                rec.desc_va,
                err | rec.op_status,
            );
        }
        if let Some((rw, wc)) = out.failed {
            complete_recv(nic, vi, w, &rw, &wc);
        }
        if out.broke {
            self.brk(key, ErrorCode::ConnLost);
        }
    }

    /// Fills the record `rec` of receive `wr` (descriptor at `desc_va`):
    /// the segments' keys are their handles ([`Verbs::keys_are_handles`]),
    /// or come through `keys`.
    ///
    /// # Errors
    /// `InvalidParameter` if a segment's region is gone.
    #[inline]
    fn fill_recv_rec(
        &self,
        keys: &mut KeyCache,
        rec: &mut RecvRec,
        wr: &RecvWr,
        desc_va: u64,
    ) -> Result<()> {
        if self.keys_are_handles() && rec.fill_in_known_regions(wr, desc_va) {
            return Ok(());
        }
        self.fill_recv_looked_up(keys, rec, wr, desc_va)
    }

    /// [`Verbs::fill_recv_rec`] with each segment's key looked up (a
    /// segment outside the descriptor's region, or a device whose lkeys
    /// are not the handles).
    #[cold]
    fn fill_recv_looked_up(
        &self,
        keys: &mut KeyCache,
        rec: &mut RecvRec,
        wr: &RecvWr,
        desc_va: u64,
    ) -> Result<()> {
        keys.validate(self.mr_epoch.now());
        if !rec.fill(wr, desc_va, |h| keys.get(h, |h| self.mr_key(h))) {
            return Err(Error::InvalidParameter);
        }
        Ok(())
    }

    fn brk(&self, vi: (u32, u16), code: ErrorCode) {
        self.brk_telling(vi, code, ErrorCode::ConnLost);
    }

    /// [`Verbs::brk`], the peer reporting `tell`.
    fn brk_telling(&self, vi: (u32, u16), code: ErrorCode, tell: ErrorCode) {
        self.breaks.lock().unwrap().push(Break { vi, code, tell });
        // After the push: a settler that sees the flag sees the break.
        self.breaks_pending.store(true, Ordering::Release);
    }

    /// Breaks the connections found broken while polling (no lock held),
    /// and tells each peer through viad (as `VipDisconnect` does): verbs
    /// tells a peer nothing when our QP fails, and a peer with no receive
    /// posted would not notice otherwise.
    fn settle(&self, nic: &NicInner) {
        self.settle_failed(nic);
        // One load on the common path (every post kicks): no lock unless a
        // break waits. A break pushed after the swap is taken below or by
        // the next settle (its flag store comes after its push).
        if !self.breaks_pending.swap(false, Ordering::Acquire) {
            return;
        }
        // A test holds the breaks here (the VI is in ERROR already).
        failpoint!("verbs-settle-breaks");
        let breaks = std::mem::take(&mut *self.breaks.lock().unwrap());
        for b in breaks {
            let Some(vi) = nic.vi(b.vi.0, b.vi.1) else {
                continue;
            };
            // A reason for the peer is sent even if the VI broke already
            // (the peer's own disconnect came first: viad relays a crossing
            // one that carries a reason).
            let telling = b.tell != ErrorCode::ConnLost;
            let peer = {
                let st = vi.state.lock().unwrap();
                // (In ERROR already by the completer: `enter_error`.)
                let error = st.state == ViState::Error;
                (st.state == ViState::Connected || (error && (telling || vi.break_due())))
                    .then(|| st.peer.clone())
                    .flatten()
            };
            vi.break_connection(nic, b.code, false, false);
            if let Some(peer) = peer {
                let me = vi.endpoint(nic);
                let reason = b.tell as u8;
                let r = nic
                    .process
                    .agent()
                    .map_err(|_| std::io::Error::other("no viad session"))
                    .and_then(|a| a.call(&Request::Disconnect { peer, me, reason }, None));
                if let Err(e) = r {
                    log::debug!("verbs: VI {}: telling the peer: {e}", vi.slot);
                }
            }
        }
    }

    /// Takes what the device CQ holds and completes it; how many.
    fn take_completions(&self, nic: &NicInner) -> usize {
        let g = self.poll_lock.lock().unwrap();
        self.drain(nic, g)
    }

    /// [`Verbs::take_completions`] unless another thread is at it (then 0).
    fn try_take_completions(&self, nic: &NicInner) -> usize {
        match self.poll_lock.try_lock() {
            Ok(g) => self.drain(nic, g),
            Err(_) => 0,
        }
    }

    /// The poll lock, held to write a status outside [`Verbs::drain`] (which
    /// holds it throughout): then the write cannot outlive the
    /// deregistration of its region (`quiesce_region_users`).
    fn status_writer(&self) -> std::sync::MutexGuard<'_, RegionCache> {
        self.poll_lock.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn drain(&self, nic: &NicInner, mut w: std::sync::MutexGuard<'_, RegionCache>) -> usize {
        self.drain_cqs(nic, &mut w, self.cqs.iter())
    }

    /// Takes every completion of `cqs` (the poll lock held: `w`).
    fn drain_cqs<'a>(
        &self,
        nic: &NicInner,
        w: &mut RegionCache,
        cqs: impl Iterator<Item = &'a Arc<ibv::Cq>>,
    ) -> usize {
        const BATCH: usize = 16;
        // A test keeps completions in the device's CQs.
        failpoint!("verbs-drain", |_| 0);
        let mut total = 0;
        for cq in cqs {
            loop {
                let n = cq.poll_each(BATCH, |wc| self.complete(nic, w, wc));
                total += n;
                if n < BATCH {
                    break;
                }
            }
        }
        total
    }

    /// Makes `qp` the QP of `vi` wherever one is looked up without the
    /// VI's lock (its caller sets `ViQp::qp`): by number, for shared
    /// receives and device events (replacing the QP numbered `old`); by
    /// slot, for the central poster; and its CQs, for a thread polling
    /// the VI ([`ViWords::cqs`]).
    fn publish_qp(&self, vi: &ViCore, qp: &Arc<ibv::Qp>, old: Option<u32>) {
        {
            let mut qpns = self.qpns.lock().unwrap();
            if let Some(old) = old {
                qpns.remove(&old);
            }
            qpns.insert(qp.qpn, (vi.slot, vi.generation));
        }
        let [s, r] = qp
            .cqs()
            .map(|cq| self.cqs.index_of(cq).map_or(0, |i| i as u64 + 1));
        self.vi_words[vi.slot as usize]
            .cqs
            .store(s | r << 32, Ordering::Relaxed);
        *self.qps[vi.slot as usize].lock().unwrap() = Some((vi.generation, qp.clone()));
    }

    /// Takes the completions of the VI in `slot` unless another thread is
    /// at it: those of its QP's CQs, and of one other CQ in turn (the
    /// progress thread takes the rest on its rounds); of every CQ while
    /// its CQs are not known. How many.
    fn try_take_completions_of(&self, nic: &NicInner, slot: u32) -> usize {
        let Ok(mut w) = self.poll_lock.try_lock() else {
            return 0;
        };
        let n = self.cqs.len();
        let known = self.vi_words[slot as usize].cqs.load(Ordering::Relaxed);
        let (s, r) = ((known as u32) as usize, (known >> 32) as usize);
        if n <= 1 || s == 0 || r == 0 {
            return self.drain_cqs(nic, &mut w, self.cqs.iter());
        }
        let turn = self.poll_turn.fetch_add(1, Ordering::Relaxed) % n;
        let (s, r) = (s - 1, r - 1);
        let mut mine = [Some(s), (r != s).then_some(r), None];
        if turn != s && turn != r {
            mine[2] = Some(turn);
        }
        self.drain_cqs(
            nic,
            &mut w,
            mine.into_iter().flatten().filter_map(|i| self.cqs.get(i)),
        )
    }

    /// Completes the descriptor of one work completion.
    fn complete(&self, nic: &NicInner, w: &mut RegionCache, wc: &Wc) {
        let (slot, generation, recv, pos) = wr_id_parts(wc.wr_id);
        if recv && slot & SRQ_SLOT != 0 {
            self.complete_srq(nic, w, wc, slot & !SRQ_SLOT, pos);
            return;
        }
        let ok = wc.status == ibv::WC_SUCCESS;
        let flushed = wc.status == ibv::WC_WR_FLUSH_ERR;
        // One look under the VI's lock (the poster takes it on every post):
        // the VI, whether the QP went to ERROR by itself (an error of this
        // or the peer's side: the VI breaks), and the record of the request.
        let (vi, broke, taken) = {
            let mut g = self.vis[slot as usize].lock();
            let v = match g.as_mut() {
                Some(v) if v.generation == generation => v,
                _ => return,
            };
            let Some(vi) = v.core.upgrade() else { return };
            if v.recovery.is_some() || (recv && !ok && !flushed && recoverable(v, wc.status)) {
                let out = self.recover(v, wc, recv, pos, slot, generation);
                drop(g);
                self.recovered(nic, &vi, w, out, (slot, generation));
                return;
            }
            let taken = if recv {
                v.recvs.take(pos).map(|r| Taken::Recv(r.done))
            } else {
                v.sends.take(pos).map(|r| Taken::Send(*r, v.reliability))
            };
            // A failed request of this QP breaks the VI; a completion
            // with no record is stale (its request was completed by a
            // disconnect that stopped waiting for it): the VI, idle or
            // connected again since, is left alone.
            (vi, !ok && !v.erroring && taken.is_some(), taken)
        };
        if !ok && !flushed {
            log::info!(
                "VI {slot}: {} completion: {}",
                if recv { "receive" } else { "send" },
                ibv::status_str(wc.status)
            );
        }
        if broke {
            let tell = match &taken {
                Some(Taken::Send(rec, _)) => peer_reason(wc.status, rec),
                _ => ErrorCode::ConnLost,
            };
            self.brk_telling((slot, generation), ErrorCode::ConnLost, tell);
            // In ERROR before the failed descriptor's status is written;
            // the break itself is settled after the drain (no lock held).
            vi.enter_error();
        }
        let Some(taken) = taken else { return };
        match taken {
            Taken::Recv(rw) => complete_recv(nic, &vi, w, &rw, wc),
            Taken::Send(rec, reliability) => {
                let err = match wc.status {
                    st if rdma_refused(st, &rec) => status::RDMA_PROT_ERROR,
                    ibv::WC_SUCCESS => 0,
                    ibv::WC_WR_FLUSH_ERR => status::DESC_FLUSHED_ERROR,
                    ibv::WC_LOC_LEN_ERR => status::LENGTH_ERROR,
                    ibv::WC_LOC_PROT_ERR | ibv::WC_LOC_ACCESS_ERR => status::PROTECTION_ERROR,
                    ibv::WC_REM_ACCESS_ERR
                    | ibv::WC_REM_INV_REQ_ERR
                    | ibv::WC_REM_OP_ERR
                    | ibv::WC_RNR_RETRY_EXC_ERR => match reliability {
                        // Reliable delivery: the data left; the break reports it.
                        Reliability::ReliableDelivery => 0,
                        _ => status::REMOTE_DESC_ERROR,
                    },
                    _ => status::TRANSPORT_ERROR,
                };
                complete_send(
                    nic,
                    &vi,
                    w,
                    rec.desc_handle,
                    rec.desc_va,
                    err | rec.op_status,
                );
            }
        }
    }

    /// The progress thread: polls the device CQ, sleeps on the completion
    /// channel when it is empty, until the NIC closes.
    ///
    /// While application threads poll ([`Device::poll`] counts their
    /// calls), they take their completions themselves: the thread then
    /// does not arm the CQ, which would wake it (and preempt a poller) on
    /// every completion, but looks again every millisecond. The cost: a
    /// waiter that stops polling to sleep may see its completion up to a
    /// millisecond later, once.
    fn progress(self: Arc<Self>, nic: Weak<NicInner>) {
        let mut polls = self.polls.load(Ordering::Relaxed);
        // Busy draining, the thread does not sleep (where it looks at the
        // device's events): every so many rounds it looks anyway.
        let mut busy = 0u32;
        let mut events = false;
        while !self.stop.load(Ordering::Acquire) {
            // A test stops the thread here (`verbs_faults`: pollers
            // progress without it).
            failpoint!("verbs-progress");
            let Some(n) = nic.upgrade() else { break };
            busy += 1;
            let injected = injected_event();
            if events || busy % 64 == 0 || injected.is_some() {
                self.device_events(&n, injected);
                events = false;
            }
            if self.take_completions(&n) > 0 {
                self.settle(&n);
                continue;
            }
            busy = 0;
            let now = self.polls.load(Ordering::Relaxed);
            if now != polls {
                polls = now;
                self.settle(&n);
                drop(n);
                // Not armed: a bounded idle wait, not a synchronisation.
                events = self.wait(1);
                continue;
            }
            for cq in self.cqs.iter() {
                cq.arm();
            }
            // A completion may have arrived between the poll and the arm.
            if self.take_completions(&n) > 0 {
                self.settle(&n);
                continue;
            }
            self.settle(&n);
            drop(n);
            events = self.wait(100);
        }
    }

    /// Sleeps up to `ms` milliseconds until a CQ signals or the device has
    /// an asynchronous event, and takes the CQs' events; whether the
    /// device has one.
    fn wait(&self, ms: i32) -> bool {
        let [cq, device] = ibv::wait_readable([self.cqs.channel().fd(), self.async_fd], ms);
        if cq {
            self.cqs.channel().take_events();
        }
        device
    }

    /// Takes the device's asynchronous events and acts on them: a CQ that
    /// overran (completions lost) or a device that failed is the NIC's
    /// catastrophic error, and breaks the connections it took; a QP or SRQ
    /// that failed breaks its VIs (their flushed requests complete them).
    /// Port changes are logged: a connection across a port that stays down
    /// breaks when the transport's retries run out.
    fn device_events(&self, nic: &NicInner, injected: Option<String>) {
        // A CQ that overran reports each completion it could not take
        // (rxe): one error for the NIC per CQ, and per VI one break, per
        // batch of events.
        let mut overran = Vec::new();
        let mut broken = Vec::new();
        // Reported once the VIs it breaks read ERROR (below).
        let mut catastrophes = 0;
        let mut injected = injected.and_then(|what| self.event_named(&what));
        while let Some(ev) = injected.take().or_else(|| self.ctx.take_async_event()) {
            broken.extend(match ev {
                DeviceEvent::CqError(addr) if overran.contains(&addr) => Vec::new(),
                DeviceEvent::CqError(addr) => {
                    overran.push(addr);
                    log::error!(
                        "verbs: {}: a device CQ overran: completions were lost",
                        self.ctx.name
                    );
                    catastrophes += 1;
                    self.vis_where(|qp, _| qp.completes_on(addr))
                }
                DeviceEvent::DeviceFatal => {
                    log::error!("verbs: {}: the device failed (DEVICE_FATAL)", self.ctx.name);
                    self.failed.store(true, Ordering::Relaxed);
                    catastrophes += 1;
                    self.vis_where(|_, _| true)
                }
                DeviceEvent::QpError(qpn, what) => {
                    let vi = self.qpns.lock().unwrap().get(&qpn).copied();
                    log::warn!("verbs: {}: QP {qpn} (VI {vi:?}): {what}", self.ctx.name);
                    vi.into_iter().collect()
                }
                DeviceEvent::SrqError(addr) => {
                    let id = self
                        .srqs
                        .iter()
                        .position(|c| c.lock().unwrap().as_ref().is_some_and(|s| s.srq.is(addr)));
                    log::error!("verbs: {}: SRQ {id:?} failed", self.ctx.name);
                    match id {
                        Some(id) => self.vis_where(|_, srq| srq == Some(id as u32)),
                        None => Vec::new(),
                    }
                }
                DeviceEvent::Port { port, up } => {
                    if up {
                        log::info!("verbs: {}: port {port} is active", self.ctx.name);
                    } else {
                        log::warn!(
                            "verbs: {}: port {port} is down (connections break if it stays down)",
                            self.ctx.name
                        );
                    }
                    Vec::new()
                }
                DeviceEvent::Other(what) => {
                    log::debug!("verbs: {}: event {what}", self.ctx.name);
                    Vec::new()
                }
            });
        }
        broken.sort_unstable();
        broken.dedup();
        for vi in broken {
            self.brk(vi, ErrorCode::ConnLost);
            // In ERROR now, before the error is reported and before any
            // of its descriptors completes; the rest of the break is
            // settled later (no lock held).
            if let Some(v) = nic.vi(vi.0, vi.1) {
                v.enter_error();
            }
        }
        for _ in 0..catastrophes {
            self.catastrophic(nic);
        }
    }

    /// A test's injected event ([`injected_event`]) as the device would
    /// report it: `QP_FATAL <VI slot>` (that VI's QP), `SRQ_ERR <SRQ id>`,
    /// `DEVICE_FATAL`.
    fn event_named(&self, what: &str) -> Option<DeviceEvent> {
        let mut words = what.split_whitespace();
        let kind = words.next()?;
        let n = words.next().and_then(|n| n.parse::<usize>().ok());
        let ev = match kind {
            "DEVICE_FATAL" => DeviceEvent::DeviceFatal,
            "QP_FATAL" => {
                DeviceEvent::QpError(self.vis.get(n?)?.lock().as_ref()?.qp.qpn, "QP_FATAL")
            }
            "SRQ_ERR" => {
                DeviceEvent::SrqError(self.srqs.get(n?)?.lock().unwrap().as_ref()?.srq.addr())
            }
            _ => return None,
        };
        Some(ev)
    }

    /// The NIC's catastrophic error, for the error callback.
    fn catastrophic(&self, nic: &NicInner) {
        nic.report(AsyncError {
            resource: crate::nic::ResourceCode::Nic,
            code: ErrorCode::Catastrophic,
            vi: None,
            cq: None,
            descriptor: 0,
        });
    }

    /// The VIs (slot, generation) whose QP and SRQ satisfy `f`.
    fn vis_where(&self, f: impl Fn(&Qp, Option<u32>) -> bool) -> Vec<(u32, u16)> {
        let mut out = Vec::new();
        for (slot, cell) in self.vis.iter().enumerate() {
            if let Some(v) = cell.lock().as_ref() {
                if f(&v.qp, v.srq) {
                    out.push((slot as u32, v.generation));
                }
            }
        }
        out
    }

    /// Drains the central queue (after any other thread draining it),
    /// posting one chain per QP; how many entries it took.
    fn flush_central(&self, c: &Central) -> usize {
        let mut buf = c.drain.lock().unwrap_or_else(|p| p.into_inner());
        let mut total = 0;
        loop {
            buf.clear();
            while buf.len() < central::DRAIN_MAX {
                match c.db.poll() {
                    Some(q) => buf.push(q),
                    None => break,
                }
            }
            if buf.is_empty() {
                return total;
            }
            total += buf.len();
            // Stable: each VI's requests keep their order.
            buf.sort_by_key(|q| q.wr.vi);
            for run in buf.chunk_by(|a, b| a.wr.vi == b.wr.vi && a.wr.vi_gen == b.wr.vi_gen) {
                self.post_run(c, run);
            }
        }
    }

    /// Posts the queued requests of one VI as one chain.
    fn post_run(&self, c: &Central, run: &[Queued]) {
        let (slot, generation) = (run[0].wr.vi, run[0].wr.vi_gen as u16);
        let qp = match self.qps.get(slot as usize).map(|q| q.lock().unwrap()) {
            Some(g) => match g.as_ref() {
                Some((gen_, qp)) if *gen_ == generation => qp.clone(),
                // The VI is gone (its records with it).
                _ => return,
            },
            None => return,
        };
        let sges: Vec<[Sge; crate::descriptor::MAX_SEGMENTS]> = run
            .iter()
            .map(|q| {
                let mut a = [Sge::default(); crate::descriptor::MAX_SEGMENTS];
                for ((d, s), k) in a.iter_mut().zip(q.wr.local()).zip(q.lkeys) {
                    *d = Sge {
                        addr: s.va,
                        len: s.len,
                        lkey: k,
                    };
                }
                a
            })
            .collect();
        let reqs: Vec<SendReq<'_>> = run
            .iter()
            .zip(&sges)
            .map(|(q, a)| {
                let (op, imm) = send_op(&q.wr);
                SendReq {
                    wr_id: wr_id(slot, generation, false, q.wr.seq as u64),
                    op,
                    imm,
                    sges: &a[..q.wr.local().len()],
                }
            })
            .collect();
        central::CHAINS.fetch_add(1, Ordering::Relaxed);
        // As in `send`: a test has the device refuse the chain.
        let chain = if refused_by_test("verbs-post-send") {
            Err((0, std::io::Error::other("fail point verbs-post-send")))
        } else {
            qp.post_send(&reqs)
        };
        let posted = match chain {
            Ok(()) => reqs.len(),
            Err((n, e)) => {
                log::warn!(
                    "verbs: VI {slot}: {} of a chain of {}: {e}",
                    reqs.len() - n,
                    reqs.len()
                );
                c.failed
                    .lock()
                    .unwrap()
                    .extend(run[n..].iter().map(|q| Failed {
                        vi: (slot, generation),
                        seq: q.wr.seq,
                    }));
                n
            }
        };
        central::WRS.fetch_add(posted as u64, Ordering::Relaxed);
    }

    /// Completes the requests the provider refused (the caller holds no
    /// VI lock): `TRANSPORT_ERROR`, and a reliable VI breaks.
    fn settle_failed(&self, nic: &NicInner) {
        let Some(c) = &self.central else { return };
        let failed = std::mem::take(&mut *c.failed.lock().unwrap());
        for f in failed {
            let (slot, generation) = f.vi;
            let rec = {
                let mut g = self.vis[slot as usize].lock();
                match g.as_mut() {
                    Some(v) if v.generation == generation => v.sends.take(f.seq as u64).copied(),
                    _ => None,
                }
            };
            let (Some(rec), Some(vi)) = (rec, nic.vi(slot, generation)) else {
                continue;
            };
            if vi.reliability().is_reliable() {
                self.brk(f.vi, ErrorCode::ConnLost);
                vi.enter_error();
            }
            complete_send(
                nic,
                &vi,
                &mut self.status_writer(),
                rec.desc_handle,
                rec.desc_va,
                status::TRANSPORT_ERROR | rec.op_status,
            );
        }
    }

    /// The poster thread of the central queue: drains it, spinning
    /// `VIA_SPIN_US` then sleeping on its event count when it is empty.
    fn poster(self: Arc<Self>, nic: Weak<NicInner>) {
        let Some(c) = &self.central else { return };
        let spin = Config::get().spin;
        while !self.stop.load(Ordering::Acquire) {
            if self.flush_central(c) > 0 {
                if !c.failed.lock().unwrap().is_empty() {
                    if let Some(n) = nic.upgrade() {
                        self.settle(&n);
                    }
                }
                continue;
            }
            doorbell::wait_until(
                c.db.event_count(),
                spin,
                Some(Instant::now() + Duration::from_millis(100)),
                || self.stop.load(Ordering::Acquire) || c.db.ring_view().can_pop(),
            );
        }
    }

    /// Completes receive `pos` of SRQ `id`, taken by the QP of `wc`.
    fn complete_srq(&self, nic: &NicInner, w: &mut RegionCache, wc: &Wc, id: u32, pos: u64) {
        let Some(cell) = self.srqs.get(id as usize) else {
            return;
        };
        let Some(rw) = cell
            .lock()
            .unwrap()
            .as_mut()
            .and_then(|s| s.recvs.take(pos))
        else {
            return;
        };
        let vi = self.qpns.lock().unwrap().get(&wc.qp_num).copied();
        let ok = wc.status == ibv::WC_SUCCESS;
        if !ok && wc.status != ibv::WC_WR_FLUSH_ERR {
            log::info!(
                "SRQ {id}: receive completion of QP {}: {}",
                wc.qp_num,
                ibv::status_str(wc.status)
            );
            if let Some((slot, generation)) = vi {
                let breaking = self.vis[slot as usize]
                    .lock()
                    .as_ref()
                    .filter(|v| v.generation == generation && !v.erroring)
                    .map(|v| v.core.upgrade());
                if let Some(core) = breaking {
                    self.brk((slot, generation), ErrorCode::ConnLost);
                    // In ERROR before the status is written, as for a
                    // VI's own receive (`complete`).
                    if let Some(vi) = core {
                        vi.enter_error();
                    }
                }
            }
        }
        failpoint!("verbs-srq-status");
        let st = write_recv(nic, w, &rw, wc).unwrap_or(status::DONE | recv_status(wc));
        self.srq_push(
            id,
            SrqDone {
                vi: vi.unwrap_or((u32::MAX, 0)),
                desc: rw.desc_va,
                status: st,
            },
        );
    }

    fn srq_push(&self, id: u32, d: SrqDone) {
        if let Some(s) = self.srqs[id as usize].lock().unwrap().as_mut() {
            s.done.push_back(d);
        }
        self.srq_wakes[id as usize].notify_all();
    }

    /// Posts the checked send `wr` of `vi` (under its send-queue lock):
    /// the device half of `VipPostSend`.
    #[inline(always)]
    fn send(&self, nic: &NicInner, vi: &ViCore, wr: &SendWr) -> Result<()> {
        // Translation refused the reserved operation and RDMA read with
        // immediate data; the table has them for completeness.
        let (opcode, op_status, rdma) = SEND_OPS[(wr.control & 7) as usize];
        if wr.fault != 0 {
            if vi.reliability().is_reliable() {
                self.brk((vi.slot, vi.generation), ErrorCode::PostDesc);
                // In ERROR before the status is written (another thread
                // may be polling it); the break is settled at `kick`.
                vi.enter_error();
            }
            self.complete_now(nic, vi, wr, wr.fault | op_status);
            return Ok(());
        }
        let mut g = self.vis[vi.slot as usize].lock();
        let v = match g.as_mut() {
            Some(v) if v.generation == vi.generation => v,
            _ => return Err(Error::InvalidState),
        };
        // On the stack: the post itself runs after the VI's lock is
        // released (below).
        let mut sge_list = SgeList::<{ crate::descriptor::MAX_SEGMENTS }>::new();
        let sges = if self.keys_are_handles() {
            // Translation checked each segment against its live region.
            ibv::sges_of(wr.local())
        } else {
            v.keys.validate(self.mr_epoch.now());
            for s in wr.local() {
                let Some(k) = v.keys.get(s.handle, |h| self.mr_key(h)) else {
                    drop(g);
                    self.complete_now(nic, vi, wr, status::PROTECTION_ERROR | op_status);
                    return Ok(());
                };
                sge_list.push(Sge {
                    addr: s.va,
                    len: s.len,
                    lkey: k.lkey,
                });
            }
            sge_list.as_slice()
        };
        if !v.connected || vi.broken.load(Ordering::Acquire) {
            drop(g);
            self.complete_now(nic, vi, wr, status::DESC_FLUSHED_ERROR | op_status);
            return Ok(());
        }
        if wr.length > v.mtu {
            // Beyond the connection's MaxTransferSize (the peer's may be
            // smaller than ours): refused here, as the soft NIC does; a
            // local descriptor error breaks a reliable connection.
            drop(g);
            if vi.reliability().is_reliable() {
                self.brk((vi.slot, vi.generation), ErrorCode::PostDesc);
                vi.enter_error();
            }
            self.complete_now(nic, vi, wr, status::LENGTH_ERROR | op_status);
            return Ok(());
        }
        *v.sends.insert(wr.seq as u64) = SendRec {
            desc_handle: wr.desc_handle,
            desc_va: wr.desc_va,
            op_status,
            rdma,
        };
        if let Some(c) = &self.central {
            // In this VI's order (under its lock); the poster posts it.
            let mut q = Queued {
                wr: *wr,
                lkeys: [0; crate::descriptor::MAX_SEGMENTS],
            };
            for (k, s) in q.lkeys.iter_mut().zip(sges) {
                *k = s.lkey;
            }
            while let Err(full) = c.db.ring(q) {
                q = full.0;
                self.flush_central(c);
            }
            drop(g);
            self.settle_failed(nic);
            return Ok(());
        }
        let req = OneReq {
            wr_id: wr_id(vi.slot, vi.generation, false, wr.seq as u64),
            opcode,
            imm: wr.imm,
            remote_va: wr.remote_va,
            rkey: wr.remote_handle,
        };
        // Posted without the VI's lock: the provider's post is a system
        // call on rxe, and the completer (which takes the lock for every
        // completion) would sleep on it and cost this post a wake-up. The
        // VI's send-queue lock, held by the caller, keeps the posts of
        // this VI in order; the Arc keeps the QP alive should a racing
        // thread destroy the VI meanwhile (the completion then finds no
        // VI and is dropped).
        let qp = v.qp.clone();
        drop(g);
        // A test has the device refuse the post (as a full send queue or a
        // QP gone to ERROR would).
        let posted = if refused_by_test("verbs-post-send") {
            Err(std::io::Error::other("fail point verbs-post-send"))
        } else {
            qp.post_send_one(&req, sges)
        };
        if let Err(e) = posted {
            if let Some(v) = self.vis[vi.slot as usize].lock().as_mut() {
                if v.generation == vi.generation {
                    v.sends.take(wr.seq as u64);
                }
            }
            log::warn!("verbs: VI {}: {e}", vi.slot);
            if vi.reliability().is_reliable() {
                self.brk((vi.slot, vi.generation), ErrorCode::ConnLost);
                vi.enter_error();
            }
            self.complete_now(nic, vi, wr, status::TRANSPORT_ERROR | op_status);
        }
        Ok(())
    }

    fn complete_now(&self, nic: &NicInner, vi: &ViCore, wr: &SendWr, st: u32) {
        complete_send(
            nic,
            vi,
            &mut self.status_writer(),
            wr.desc_handle,
            wr.desc_va,
            st,
        );
    }
}

/// Whether a test set fail point `name` to refuse the device call there
/// (always false without the `failpoints` feature).
#[inline(always)]
fn refused_by_test(_name: &str) -> bool {
    #[cfg(feature = "failpoints")]
    if fail::eval(_name, |_| ()).is_some() {
        return true;
    }
    false
}

/// Completes the send descriptor at `desc_va` (in the region of
/// `desc_handle`) of `vi` with status `st` (`DONE` added).
fn complete_send(
    nic: &NicInner,
    vi: &ViCore,
    w: &mut RegionCache,
    desc_handle: u32,
    desc_va: u64,
    st: u32,
) {
    let desc = w
        .get(&nic.regions, desc_handle)
        .filter(|r| r.covers(desc_va, 32));
    failpoint!("verbs-send-status");
    completion::send(nic, vi, desc.map(|r| &**r), desc_va, status::DONE | st);
}

impl Device for Verbs {
    fn kind(&self) -> &'static str {
        "verbs"
    }

    fn limits(&self) -> Limits {
        Limits {
            max_vi: MAX_VI,
            max_cq: MAX_CQ,
            queue_depth: QUEUE_DEPTH,
            max_segments: crate::descriptor::MAX_SEGMENTS as u32,
            max_transfer: 1 << 24,
            max_regions: 1 << 16,
            reliability: Reliability::Unreliable.bits()
                | Reliability::ReliableDelivery.bits()
                | Reliability::ReliableReception.bits(),
            rdma_read: Reliability::ReliableDelivery.bits() | Reliability::ReliableReception.bits(),
            write_tail_last: false,
        }
    }

    fn start(&self, nic: &Arc<NicInner>) {
        let Some(me) = self.me.upgrade() else { return };
        let me2 = me.clone();
        let weak = Arc::downgrade(nic);
        match std::thread::Builder::new()
            .name("via-verbs".into())
            .spawn(move || me2.progress(weak))
        {
            Ok(h) => *self.thread.lock().unwrap() = Some(h),
            Err(e) => log::error!("verbs: cannot start the progress thread: {e}"),
        }
        if self.central.is_some() {
            let me = me.clone();
            let weak = Arc::downgrade(nic);
            match std::thread::Builder::new()
                .name("via-verbs-post".into())
                .spawn(move || me.poster(weak))
            {
                Ok(h) => *self.poster.lock().unwrap() = Some(h),
                Err(e) => log::error!("verbs: cannot start the poster thread: {e}"),
            }
        }
    }

    fn close(&self, _nic: &NicInner) {
        self.stop.store(true, Ordering::Release);
        if let Some(c) = &self.central {
            c.db.event_count().notify_all();
        }
        for t in [&self.thread, &self.poster] {
            let h = t.lock().unwrap().take();
            if let Some(h) = h {
                if h.thread().id() != std::thread::current().id() {
                    let _ = h.join();
                }
            }
        }
    }

    fn provider_wake(&self) -> &EventCount {
        &self.provider
    }

    fn vi_signals(&self, slot: u32) -> ViSignals<'_> {
        let w = &self.vi_words[slot as usize];
        ViSignals {
            send_wake: &w.send_wake,
            recv_wake: &w.recv_wake,
            interest: &w.interest,
        }
    }

    fn cq_signals(&self, slot: u32) -> CqSignals<'_> {
        let w = &self.cq_words[slot as usize];
        CqSignals {
            wake: &w.wake,
            interest: &w.interest,
        }
    }

    fn take_async_errors(&self, out: &mut Vec<AsyncError>) {
        out.append(&mut self.errors.lock().unwrap());
    }

    // ---- memory ----

    fn reserve_region(&self) -> Result<RegionSlot> {
        // The handle is the rkey, known once the MR exists (add_region).
        Ok(RegionSlot {
            handle: 0,
            index: 0,
        })
    }

    fn add_region(&self, _nic: &NicInner, _slot: RegionSlot, r: &RegionSpec<'_>) -> Result<u32> {
        let pd = self.pd(r.ptag)?;
        let mut access = ibv::ACCESS_LOCAL_WRITE;
        if r.flags & flags::RDMA_WRITE != 0 {
            access |= ibv::ACCESS_REMOTE_WRITE;
        }
        if r.flags & flags::RDMA_READ != 0 {
            access |= ibv::ACCESS_REMOTE_READ;
        }
        failpoint!("verbs-reg-mr", |_| Err(Error::Resource));
        // SAFETY: the registration path pinned these pages and keeps them
        // mapped until `remove_region` (which drops the MR first).
        #[allow(unsafe_code)]
        let mr = unsafe { pd.register(r.va, r.len, access) }.map_err(|e| {
            log::warn!("verbs: {e}");
            Error::resource(e)
        })?;
        // The rkey, which peers use as is; a region without remote access
        // has none (rxe gives 0), and is named by its lkey instead.
        let handle = if mr.rkey != 0 { mr.rkey } else { mr.lkey };
        if handle != mr.lkey && self.keys_are_handles.load(Ordering::Relaxed) {
            log::info!("verbs: an MR's lkey is not its rkey: posts look lkeys up");
            // Before the handle is returned: a post of this region, which
            // comes after, sees the flag clear (Acquire in `keys_are_handles`).
            self.keys_are_handles.store(false, Ordering::Release);
        }
        let mut mrs = self.mrs.write().unwrap();
        if handle == 0 || mrs.contains_key(&handle) {
            log::error!("verbs: memory handle {handle:#x} is not unique");
            return Err(Error::Resource);
        }
        mrs.insert(handle, Arc::new(mr));
        Ok(handle)
    }

    fn remove_region(&self, _nic: &NicInner, handle: u32) {
        self.mrs.write().unwrap().remove(&handle);
        // After the removal: a queue that sees the new count looks again.
        self.mr_epoch.bump();
    }

    // A parked registration keeps its MR when nothing but this process
    // can reach it: taken back, it needs no `ibv_reg_mr` (a system call
    // that pins every page again), the pin-down cache's gain on a device.
    // An MR with remote access is deregistered at once: the peer's device
    // checks the rkey alone, and a parked registration must be out of
    // reach, as any deregistered one.
    fn quiesce_region_users(&self, _nic: &NicInner) {
        // The device stopped at `ibv_dereg_mr`; what may still write into
        // the region is a completer that looked it up before it went away
        // and is about to write a status there, through a window on the
        // program's memory when pages stayed in place. Statuses are written
        // under the poll lock (`status_writer`): once we had it, no writer
        // holds a region removed before.
        drop(self.poll_lock.lock().unwrap_or_else(|p| p.into_inner()));
    }

    fn retire_region(&self, _nic: &NicInner, handle: u32) -> Option<RetiredEntry> {
        let mr = self.mrs.write().unwrap().remove(&handle);
        // After the removal: a queue that sees the new count looks again
        // (and finds the handle dead).
        self.mr_epoch.bump();
        let mr = mr.filter(|m| !m.remote)?;
        self.retired.lock().unwrap().insert(handle, mr);
        Some(RetiredEntry(handle as u64))
    }

    fn revive_region(&self, _nic: &NicInner, entry: RetiredEntry) -> Result<u32> {
        let handle = entry.0 as u32;
        let mr = self
            .retired
            .lock()
            .unwrap()
            .remove(&handle)
            .ok_or(Error::Resource)?;
        // Unique: the kept MR still holds its keys, so no other MR has them.
        self.mrs.write().unwrap().insert(handle, mr);
        Ok(handle)
    }

    fn release_retired(&self, entry: RetiredEntry) {
        let mr = self.retired.lock().unwrap().remove(&(entry.0 as u32));
        drop(mr);
    }

    fn set_region_attributes(&self, handle: u32, ptag: u32, fl: u32) -> Result<()> {
        // The rkey (the handle) would change with the PD or the access
        // flags: only a change to nothing is possible.
        let _ = (handle, ptag, fl);
        Err(Error::resource(
            "verbs: a region's attributes are fixed at registration",
        ))
    }

    // ---- VIs ----

    fn add_vi(&self, nic: &NicInner, vi: &ViCore) -> Result<()> {
        let a = vi.attributes();
        let qp = self.new_qp(&a, None)?;
        self.publish_qp(vi, &qp, None);
        let core = nic
            .vi(vi.slot, vi.generation)
            .map_or_else(std::sync::Weak::new, |a| Arc::downgrade(&a));
        *self.vis[vi.slot as usize].lock() = Some(ViQp {
            generation: vi.generation,
            core,
            reliability: a.reliability,
            ptag: a.ptag.id(),
            access: qp_access(&a),
            qp,
            psn: new_psn(),
            connected: false,
            mtu: a.max_transfer_size,
            erroring: false,
            sends: PosRing::new(QUEUE_DEPTH as usize),
            recvs: PosRing::new(QUEUE_DEPTH as usize),
            keys: KeyCache::default(),
            srq: None,
            remote: None,
            recovery: None,
        });
        Ok(())
    }

    fn vi_attributes(&self, vi: &ViCore, a: &ViAttributes) {
        let mut g = self.vis[vi.slot as usize].lock();
        let Some(v) = g.as_mut() else { return };
        if v.reliability == a.reliability && v.ptag == a.ptag.id() && v.access == qp_access(a) {
            return;
        }
        // An idle VI: a new QP of the new kind, its receives posted again.
        match self.new_qp(a, v.srq) {
            Ok(qp) => {
                for (pos, rec) in v.recvs.iter() {
                    // The same keys: the QP's PD is the new tag's, so a
                    // region of the old tag completes with a protection
                    // error, as it would be refused if posted now.
                    if let Err(e) =
                        qp.post_recv(wr_id(vi.slot, vi.generation, true, pos), rec.sges())
                    {
                        log::warn!("verbs: re-posting a receive: {e}");
                    }
                }
                self.publish_qp(vi, &qp, Some(v.qp.qpn));
                v.qp = qp;
                v.reliability = a.reliability;
                v.ptag = a.ptag.id();
                v.access = qp_access(a);
            }
            Err(e) => log::error!("verbs: VI {}: new attributes: {e}", vi.slot),
        }
    }

    fn remove_vi(&self, _nic: &NicInner, vi: &ViCore) {
        let v = self.vis[vi.slot as usize].lock().take();
        self.qps[vi.slot as usize].lock().unwrap().take();
        if let Some(v) = &v {
            self.qpns.lock().unwrap().remove(&v.qp.qpn);
            if let Some(id) = v.srq {
                if let Some(s) = self.srqs[id as usize].lock().unwrap().as_mut() {
                    s.attached -= 1;
                }
            }
        }
        drop(v);
    }

    // ---- CQs ----

    fn cq_ring(
        &self,
        _nic: &NicInner,
        _slot: u32,
        _generation: u32,
        entries: u32,
    ) -> Result<Arc<MappedRing>> {
        // Only this process completes into its CQs: private memory.
        let cap = entries.next_power_of_two().max(64);
        let len = cq::EntryRing::bytes_for(cap);
        let map = Mapping::anonymous(len).map_err(Error::resource)?;
        let ring = MappedRing::init(Arc::new(map), 0, len, cap).map_err(Error::resource)?;
        ring.get()
            .set_limit(entries as usize)
            .map_err(|_| Error::Resource)?;
        Ok(Arc::new(ring))
    }

    // ---- connections ----

    fn endpoint_blob(&self, vi: &ViCore) -> Vec<u8> {
        let g = self.vis[vi.slot as usize].lock();
        let Some(v) = g.as_ref() else {
            return Vec::new();
        };
        Blob {
            qpn: v.qp.qpn,
            psn: v.psn,
            lid: self.lid,
            mtu: self.mtu as u8,
            global: self.global,
            gid: self.gid,
        }
        .encode()
    }

    fn connect(&self, _nic: &NicInner, vi: &ViCore, peer: &Endpoint) -> Result<()> {
        let b = Blob::decode(&peer.device).ok_or_else(|| {
            log::warn!("verbs: the peer's endpoint is not a verbs endpoint");
            Error::InvalidParameter
        })?;
        let mut g = self.vis[vi.slot as usize].lock();
        let v = g.as_mut().ok_or(Error::InvalidState)?;
        let mtu = self.mtu.min(b.mtu as u32).max(1);
        let remote = Remote {
            qpn: b.qpn,
            psn: b.psn,
            lid: b.lid,
            gid: b.gid,
            global: self.global || b.global,
        };
        if let Err(e) = v.qp.connect(&remote, v.psn, mtu, PORT, self.gid_index) {
            log::warn!("verbs: VI {}: {e}", vi.slot);
            match self.back_to_init(v, vi.slot, vi.generation) {
                Ok(n) => log::debug!("VI {}: QP back in INIT, {n} receives posted again", vi.slot),
                // Its receives stay recorded: a disconnect completes them.
                Err(e) => log::warn!("verbs: VI {}: bringing the QP back to INIT: {e}", vi.slot),
            }
            return Err(Error::resource(e));
        }
        v.remote = Some((remote, mtu));
        v.recovery = None;
        v.connected = true;
        v.mtu = vi.attributes().max_transfer_size.min(peer.mtu);
        v.erroring = false;
        Ok(())
    }

    fn disconnect(&self, nic: &NicInner, vi: &ViCore, _tell_peer: bool) {
        {
            let mut g = self.vis[vi.slot as usize].lock();
            let Some(v) = g.as_mut() else { return };
            v.connected = false;
            v.erroring = true;
            if let Err(e) = v.qp.error() {
                log::warn!("verbs: VI {}: {e}", vi.slot);
            }
        }
        // The device flushes every outstanding request; take the flushes
        // (a failed device flushes nothing: what is left completes below).
        let wait = if self.failed.load(Ordering::Relaxed) {
            Duration::ZERO
        } else {
            FLUSH_WAIT
        };
        let deadline = Instant::now() + wait;
        loop {
            let idle = {
                let g = self.vis[vi.slot as usize].lock();
                // In a recovery, the kept receives are out of the device.
                g.as_ref().is_none_or(|v| {
                    let kept = v.recovery.as_ref().map_or(0, |r| r.kept);
                    v.sends.is_empty() && v.recvs.len() == kept
                })
            };
            if idle {
                break;
            }
            if Instant::now() > deadline {
                log::warn!("verbs: VI {}: the device did not flush in time", vi.slot);
                break;
            }
            // Sends still in the central queue go to the (erroring) QP and
            // complete flushed; refused ones complete here.
            if let Some(c) = &self.central {
                self.flush_central(c);
                self.settle_failed(nic);
            }
            if self.take_completions(nic) == 0 {
                std::thread::yield_now();
            }
        }
        // Back to INIT with a new PSN: the VI may connect again.
        let mut g = self.vis[vi.slot as usize].lock();
        let mut unfinished = Vec::new();
        let mut unflushed = Vec::new();
        if let Some(v) = g.as_mut() {
            let flushed = Wc {
                status: ibv::WC_WR_FLUSH_ERR,
                ..Wc::default()
            };
            if let Some(r) = v.recovery.take() {
                // A recovery cut short: the failed receive completes with
                // its error, the kept ones flushed, in their order.
                unfinished.extend(r.failed);
                let kept = v.recvs_after(r.pos);
                unfinished.extend(kept.into_iter().map(|(_, rec)| (rec.done, flushed)));
            } else {
                // Left only when the device did not flush in time (its
                // completions lost): completed flushed here all the same.
                unfinished.extend(v.recvs.iter().map(|(_, rec)| (rec.done, flushed)));
            }
            unflushed.extend(v.sends.iter().map(|(_, rec)| *rec));
            v.sends.clear();
            v.recvs.clear();
            if let Err(e) = v.qp.reset(PORT, v.access) {
                log::warn!("verbs: VI {}: {e}", vi.slot);
            }
            v.psn = new_psn();
            v.erroring = false;
        }
        drop(g);
        let mut w = self.status_writer();
        for rec in unflushed {
            let st = status::DESC_FLUSHED_ERROR | rec.op_status;
            complete_send(nic, vi, &mut w, rec.desc_handle, rec.desc_va, st);
        }
        for (rw, wc) in unfinished {
            complete_recv(nic, vi, &mut w, &rw, &wc);
        }
    }

    // ---- work ----

    fn post_send(
        &self,
        nic: &NicInner,
        vi: &ViCore,
        wr: &SendWr,
        _regions: WrRegions<'_>,
    ) -> Result<Kick> {
        self.send(nic, vi, wr).map(|()| Kick::Needed)
    }

    fn post_send_queued(
        &self,
        nic: &NicInner,
        vi: &ViCore,
        wr: &SendWr,
        _t: Translated<'_>,
    ) -> Result<Kick> {
        // The lkeys come from the VI's own cache: the regions translation
        // found are not needed (nor looked up again).
        self.send(nic, vi, wr).map(|()| Kick::Needed)
    }

    fn poll(&self, nic: &NicInner, vi: &ViCore) {
        // As `poll_any`, but of the VI's CQs (and one more in turn): with
        // many VIs, and so many device CQs, a poll that misses would
        // otherwise look into each.
        self.polls.fetch_add(1, Ordering::Relaxed);
        if self.try_take_completions_of(nic, vi.slot) > 0 {
            self.settle(nic);
        }
    }

    fn poll_any(&self, nic: &NicInner, _slots: &[u32]) -> bool {
        // A polling program takes its completion itself rather than wait
        // for the progress thread to be scheduled (which, seeing it poll,
        // stops arming the CQ: `progress`). A CQ's members and an SRQ's
        // VIs may complete on any device CQ: all are drained.
        self.polls.fetch_add(1, Ordering::Relaxed);
        if self.try_take_completions(nic) > 0 {
            self.settle(nic);
        }
        true
    }

    fn kick(&self, nic: &NicInner, _vi: Option<&ViCore>) {
        // After every post: one load unless there is something to settle
        // (a break this thread found, or the central queue's refusals).
        if self.central.is_some() || self.breaks_pending.load(Ordering::Relaxed) {
            self.settle(nic);
        }
    }

    fn post_recv(&self, _nic: &NicInner, vi: &ViCore, pos: u64, wr: &RecvWr) -> Result<()> {
        let mut g = self.vis[vi.slot as usize].lock();
        let v = match g.as_mut() {
            Some(v) if v.generation == vi.generation => v,
            _ => return Err(Error::InvalidState),
        };
        let ViQp {
            recvs,
            keys,
            qp,
            recovery,
            ..
        } = v;
        let id = wr_id(vi.slot, vi.generation, true, pos);
        if let Some(r) = recovery {
            // Kept for the QP that comes back (one in ERROR would not
            // flush it: rxe hears of a receive only when it needs one).
            let filled = self.fill_recv_rec(keys, recvs.insert(pos), wr, 0);
            if filled.is_err() {
                recvs.take(pos);
            } else {
                r.kept += 1;
            }
            return filled;
        }
        // Under the VI's lock, unlike a send: a receive is posted without
        // a system call (rxe's receive queue is in user memory).
        let r = self.post_recv_rec(keys, recvs.insert(pos), wr, 0, |s| qp.post_recv(id, s));
        if r.is_err() {
            recvs.take(pos);
        }
        r
    }

    fn cancel_recv(&self, _nic: &NicInner, vi: &ViCore, pos: u64, _force: bool) -> bool {
        let mut g = self.vis[vi.slot as usize].lock();
        g.as_mut()
            .is_some_and(|v| v.generation == vi.generation && v.recvs.take(pos).is_some())
    }

    // ---- shared receive queues ----

    fn create_srq(&self, _nic: &NicInner, ptag: u32, entries: u32) -> Result<u32> {
        if entries == 0 {
            return Err(Error::InvalidParameter);
        }
        if entries > QUEUE_DEPTH {
            return Err(Error::Resource);
        }
        let pd = self.pd(ptag)?;
        for (id, cell) in self.srqs.iter().enumerate() {
            let mut g = cell.lock().unwrap();
            if g.is_some() {
                continue;
            }
            let made = self.cqs.reserve(entries).and_then(|share| {
                Srq::new(&pd, entries, crate::descriptor::MAX_SEGMENTS as u32)
                    .map(|srq| (srq, share))
            });
            let (srq, share) = made.map_err(|e| {
                log::warn!("verbs: {e}");
                Error::resource(e)
            })?;
            *g = Some(SrqDev {
                srq,
                share,
                ptag,
                recvs: RecvSlab::new(entries),
                keys: KeyCache::default(),
                done: VecDeque::new(),
                attached: 0,
            });
            return Ok(id as u32);
        }
        Err(Error::Resource)
    }

    fn destroy_srq(&self, nic: &NicInner, id: u32) -> Result<()> {
        let cell = self.srqs.get(id as usize).ok_or(Error::InvalidParameter)?;
        let s = {
            let mut g = cell.lock().unwrap();
            match g.as_ref() {
                None => return Err(Error::InvalidParameter),
                Some(s) if s.attached > 0 => return Err(Error::InvalidState),
                Some(_) => g.take().unwrap(),
            }
        };
        // Outstanding descriptors complete flushed (nobody will take them).
        let mut w = self.status_writer();
        for rw in s.recvs.iter().map(|r| r.done) {
            if let Some(d) = w.get(&nic.regions, rw.desc_handle) {
                let va = d.va + rw.desc_off;
                let st = status::DONE | status::OP_RECEIVE | status::DESC_FLUSHED_ERROR;
                let _ = completion::write_in_region(d, va, st, None, None);
            }
        }
        self.srq_wakes[id as usize].notify_all();
        Ok(())
    }

    fn post_srq_recv(&self, nic: &NicInner, id: u32, desc_va: u64, wr: &RecvWr) -> Result<()> {
        let cell = self.srqs.get(id as usize).ok_or(Error::InvalidParameter)?;
        if wr.fault != 0 {
            // Completed at once, as a VI's receive with a bad segment is.
            let st = status::DONE | status::OP_RECEIVE | wr.fault;
            let mut w = self.status_writer();
            if let Some(d) = w.get(&nic.regions, wr.desc_handle) {
                let _ = completion::write_in_region(d, d.va + wr.desc_off, st, None, None);
            }
            drop(w);
            if cell.lock().unwrap().is_none() {
                return Err(Error::InvalidParameter);
            }
            self.srq_push(
                id,
                SrqDone {
                    vi: (u32::MAX, 0),
                    desc: desc_va,
                    status: st,
                },
            );
            return Ok(());
        }
        let mut g = cell.lock().unwrap();
        let SrqDev {
            recvs, keys, srq, ..
        } = g.as_mut().ok_or(Error::InvalidParameter)?;
        let (pos, rec) = recvs.insert().ok_or(Error::Resource)?;
        let id = wr_id(SRQ_SLOT | id, 0, true, pos);
        let r = self.post_recv_rec(keys, rec, wr, desc_va, |s| srq.post_recv(id, s));
        if r.is_err() {
            recvs.take(pos);
        }
        r
    }

    fn srq_done(&self, id: u32) -> Option<SrqDone> {
        self.srqs
            .get(id as usize)?
            .lock()
            .unwrap()
            .as_mut()?
            .done
            .pop_front()
    }

    fn srq_wake(&self, id: u32) -> Option<&EventCount> {
        self.srq_wakes.get(id as usize)
    }

    fn attach_srq(&self, _nic: &NicInner, vi: &ViCore, id: Option<u32>) -> Result<()> {
        let a = vi.attributes();
        if let Some(id) = id {
            let g = self
                .srqs
                .get(id as usize)
                .ok_or(Error::InvalidParameter)?
                .lock()
                .unwrap();
            let s = g.as_ref().ok_or(Error::InvalidParameter)?;
            if s.ptag != a.ptag.id() {
                return Err(Error::InvalidPtag);
            }
            if a.reliability == Reliability::Unreliable {
                // UC QPs do not take receives from an SRQ on every device.
                return Err(Error::InvalidReliabilityLevel);
            }
        }
        let mut g = self.vis[vi.slot as usize].lock();
        let v = match g.as_mut() {
            Some(v) if v.generation == vi.generation => v,
            _ => return Err(Error::InvalidState),
        };
        if v.srq == id {
            return Ok(());
        }
        if v.connected || !v.recvs.is_empty() {
            return Err(Error::InvalidState);
        }
        let qp = self.new_qp(&a, id)?;
        self.publish_qp(vi, &qp, Some(v.qp.qpn));
        v.qp = qp;
        for (x, d) in [(v.srq, u32::MAX), (id, 1)] {
            if let Some(x) = x {
                if let Some(s) = self.srqs[x as usize].lock().unwrap().as_mut() {
                    s.attached = s.attached.wrapping_add(d);
                }
            }
        }
        v.srq = id;
        vi.srq
            .store(id.unwrap_or(crate::vi::NO_SRQ), Ordering::Relaxed);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blob_round_trip() {
        let b = Blob {
            qpn: 0x12_3456,
            psn: 0xab_cdef,
            lid: 7,
            mtu: 3,
            global: true,
            gid: [9; 16],
        };
        let e = b.encode();
        assert_eq!(e.len(), Blob::LEN);
        assert!(e.len() <= crate::proto::MAX_DEVICE_BLOB);
        assert_eq!(Blob::decode(&e), Some(b));
        assert_eq!(Blob::decode(&e[1..]), None);
    }

    #[test]
    fn wr_id_round_trip() {
        let id = wr_id(1023, 0xfffe, true, 0x7fff_fffe);
        assert_eq!(wr_id_parts(id), (1023, 0xfffe, true, 0x7fff_fffe));
        assert_eq!(wr_id_parts(wr_id(3, 1, false, 5)), (3, 1, false, 5));
    }

    #[test]
    fn names() {
        assert_eq!(accepts("verbs").as_deref(), Some("verbs"));
        assert_eq!(accepts("/dev/via_verbs").as_deref(), Some("verbs"));
        assert_eq!(accepts("../x"), None);
        assert_eq!(accepts(""), None);
    }
}
