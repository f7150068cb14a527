//! The sockets NIC: VIs of processes on any hosts, one TCP connection per
//! VI, through a network interface (`via_<ifname>`, `/dev/via_<ifname>`).
//!
//! Steps of a request, in order:
//! 1. `post_send` (this file): the posting thread gathers the local
//!    segments and writes one frame ([`frame`]) on the VI's connection
//!    ([`conn`]); the request joins the VI's `awaiting` queue.
//! 2. The peer's progress thread ([`progress`]) reads the frame, checks it
//!    (protection on the target: memory handle, the VI's protection tag,
//!    RDMA enables of VI and region, bounds) and places the payload in the
//!    posted receive or the RDMA target, completes the receive in the
//!    user's descriptor, and answers when the initiator waits for it.
//! 3. The initiator's send completes once written (Unreliable and Reliable
//!    Delivery sends) or on the answer (Reliable Reception, RDMA write,
//!    RDMA read), in posting order.
//!
//! Why TCP: the kernel retransmits, orders and paces, and TSO/GRO move
//! large transfers in few system calls; a UDP transport with our own
//! reliability would need its own retransmission, ordering and congestion
//! control, and a system call per datagram. Unreliable and Reliable
//! Delivery differ from Reliable Reception only in when a send completes.
//!
//! Connection set-up goes through the viad of the server's host
//! (`via_wire::tcp`); the requester's library connects straight to that
//! viad's TCP port, which hands the connection to the accepting process.
// `unsafe` only in `io.rs` (its two vectored system calls); every other
// file forbids it.
#![deny(unsafe_code)]

mod conn;
mod frame;
#[allow(unsafe_code)]
mod io;
mod progress;

use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use doorbell::EventCount;
use via_wire::tcp::{SetupAnswer, SetupRequest};

use self::conn::{Awaiting, Conn, Payload};
use self::frame::Header;
use crate::attrs::{Reliability, ViAttributes};
use crate::backend::{CqSignals, Device, Kick, Limits, RegionSlot, RegionSpec, ViSignals};
use crate::descriptor::{control, status};
use crate::error::{Error, Result};
use crate::mem::region::Resolved;
use crate::nic::{ErrorCode, NicInner};
use crate::process::Process;
use crate::proto::{self, Endpoint, NetAddr, ObjKey, ObjKind, Request};
use crate::shm::mapping::Mapping;
use crate::shm::rings::MappedRing;
use crate::translate::{RecvWr, SendWr, WrRegions};
use crate::vi::ViCore;

const MAX_VI: u32 = 256;
const MAX_CQ: u32 = 256;
/// Largest message: also the bound on what a peer may make us buffer.
const MAX_TRANSFER: u32 = 4 << 20;

/// Default of `$VIA_SOCK_TIMEOUT_MS`.
const DEFAULT_TIMEOUT_MS: u64 = 5000;

/// Default of `$VIA_SOCK_ACK_DELAY_US`.
const DEFAULT_ACK_DELAY_US: u64 = 50;

/// Accepted device names: `via_<if>` / `/dev/via_<if>` for a network
/// interface of this host other than `lo` (which is the shared-memory NIC).
pub(crate) fn accepts(name: &str) -> Option<String> {
    let base = name.strip_prefix("/dev/").unwrap_or(name);
    let ifname = base.strip_prefix("via_")?;
    // /sys shows the interfaces of the namespace it was mounted in; a
    // process that entered another network namespace (setns) finds its
    // interfaces through getifaddrs (those with an IPv4 address).
    let ok = ifname != "lo"
        && !ifname.is_empty()
        && !ifname.contains('/')
        && !ifname.starts_with('.')
        && (std::path::Path::new("/sys/class/net").join(ifname).exists()
            || via_sys::interface_ipv4(ifname).is_ok_and(|a| !a.is_empty()));
    ok.then(|| base.to_string())
}

/// Settings read from the environment at open.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Settings {
    /// `$VIA_SOCK_SPIN_US`: how long the progress thread polls without
    /// sleeping after the last activity (default 0: it sleeps at once).
    pub spin: Duration,
    /// `$VIA_SOCK_TIMEOUT_MS`: a connection that hears nothing for this
    /// long, or cannot write for this long, breaks (`CONN_LOST`).
    pub timeout: Duration,
    /// `$VIA_SOCK_FRAGMENT`: the most bytes one system call writes (the
    /// fragment size of the thesis's Ethernet VIA; default 0: a whole
    /// frame per call, as the socket takes it). For the design-alternative
    /// benchmark (`via-bench alt fragment`).
    pub fragment: usize,
    /// `$VIA_SOCK_ACK_DELAY_US`: how long a Reliable Reception
    /// acknowledgement waits for a frame to ride on (the application's
    /// reply, an answer) before it is sent alone.
    pub ack_delay: Duration,
}

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v.parse().unwrap_or_else(|_| {
            log::warn!("ignoring {name}={v:?}: not a number");
            default
        }),
        Err(_) => default,
    }
}

impl Settings {
    fn from_env() -> Settings {
        Settings {
            spin: Duration::from_micros(env_u64("VIA_SOCK_SPIN_US", 0)),
            timeout: Duration::from_millis(
                env_u64("VIA_SOCK_TIMEOUT_MS", DEFAULT_TIMEOUT_MS).max(10),
            ),
            fragment: env_u64("VIA_SOCK_FRAGMENT", 0) as usize,
            ack_delay: Duration::from_micros(env_u64(
                "VIA_SOCK_ACK_DELAY_US",
                DEFAULT_ACK_DELAY_US,
            )),
        }
    }
}

/// The device side of one VI slot.
#[derive(Default)]
pub(crate) struct ViWords {
    send_wake: EventCount,
    recv_wake: EventCount,
    interest: AtomicU32,
    /// Posted receives not taken yet: (queue position, request).
    pub recvs: Mutex<VecDeque<(u64, RecvWr)>>,
    /// The connection, while connected.
    pub conn: RwLock<Option<Arc<Conn>>>,
}

#[derive(Default)]
struct CqWords {
    wake: EventCount,
    interest: AtomicU32,
}

/// A connection break found while posting, settled in `kick`.
pub(crate) struct Break {
    pub vi: (u32, u16),
    pub code: ErrorCode,
    pub orderly: bool,
}

/// What the device and its progress thread share.
pub(crate) struct Shared {
    pub provider: EventCount,
    pub vis: Box<[ViWords]>,
    cqs: Box<[CqWords]>,
    pub settings: Settings,
    /// Bumped when a connection comes or goes (the progress thread
    /// rebuilds its poll set).
    pub conns_version: AtomicU32,
    /// Written to wake the progress thread.
    wake_tx: UnixStream,
    pub wake_rx: UnixStream,
    pub stop: AtomicBool,
    /// Read-held while the progress side may place bytes in registered
    /// memory; `quiesce_region_users` takes it for writing once, so when
    /// `VipDeregisterMem` returns no byte lands in the region any more.
    pub region_users: RwLock<()>,
    /// Microseconds since `epoch` until which the progress thread sleeps
    /// (0: it runs, and looks at every owed acknowledgement before it
    /// sleeps again).
    pub asleep_until: AtomicU64,
    pub epoch: Instant,
    /// A polling thread left an acknowledgement owed since the progress
    /// thread last looked: it then sleeps no longer than the delay for a
    /// while (`progress::TICKING`), so a polling program's owed
    /// acknowledgements need no wake-up each.
    pub polled_owed: AtomicBool,
}

impl Shared {
    /// Wakes the progress thread (a connection came or went, or it stops).
    pub fn wake(&self) {
        let _ = (&self.wake_tx).write(&[1]);
    }

    /// Microseconds of `t` since `epoch` (at least 1).
    pub fn micros(&self, t: Instant) -> u64 {
        (t.saturating_duration_since(self.epoch).as_micros() as u64).max(1)
    }

    /// Makes sure the progress thread looks at the connections by `due`
    /// (an acknowledgement owed, found by a thread that may stop polling):
    /// wakes it if it sleeps past that, once.
    pub fn wake_by(&self, due: Instant) {
        self.polled_owed.store(true, Ordering::Relaxed);
        // The progress thread publishes its sleep before it reads the owed
        // acknowledgements (under each connection's `acks` lock, which the
        // caller took after making its own owed): either it saw ours, or we
        // see its sleep here.
        let s = self.asleep_until.load(Ordering::SeqCst);
        if s != 0
            && s > self.micros(due)
            && self
                .asleep_until
                .compare_exchange(s, 0, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        {
            self.wake();
        }
    }
}

/// The sockets device of one NIC.
pub(crate) struct Sockets {
    shared: Arc<Shared>,
    process: Arc<Process>,
    ifname: String,
    addr: Option<Ipv4Addr>,
    /// Requesters' connections between the answer and `connect`.
    accepted: Arc<Mutex<HashMap<u32, TcpStream>>>,
    breaks: Mutex<Vec<Break>>,
    progress: Mutex<Option<JoinHandle<()>>>,
}

/// Opens the sockets NIC `name` (`via_<ifname>`).
pub(crate) fn open(process: &Arc<Process>, _id: u32, name: &str) -> Result<Arc<dyn Device>> {
    let ifname = name.strip_prefix("via_").unwrap_or(name).to_string();
    let addr = via_sys::interface_ipv4(&ifname)
        .map_err(|e| Error::failed("reading interface addresses", e))?
        .first()
        .copied();
    match addr {
        Some(a) => {
            // Requests from other hosts reach our listeners through viad.
            let agent = process.agent()?;
            match agent.call(
                &Request::OpenTcp {
                    host: a.octets().to_vec(),
                },
                None,
            ) {
                Ok((proto::Reply::Ok, _)) => {}
                other => log::warn!(
                    "{name}: viad does not listen for other hosts on {a} ({other:?}); connection requests to this NIC fail"
                ),
            }
        }
        None => log::warn!("{name}: interface {ifname} has no IPv4 address; it cannot connect"),
    }
    let (wake_tx, wake_rx) = UnixStream::pair().map_err(|e| Error::failed("socketpair", e))?;
    wake_tx
        .set_nonblocking(true)
        .and_then(|()| wake_rx.set_nonblocking(true))
        .map_err(|e| Error::failed("socketpair", e))?;
    Ok(Arc::new(Sockets {
        shared: Arc::new(Shared {
            provider: EventCount::new(),
            vis: (0..MAX_VI).map(|_| ViWords::default()).collect(),
            cqs: (0..MAX_CQ).map(|_| CqWords::default()).collect(),
            settings: Settings::from_env(),
            conns_version: AtomicU32::new(0),
            wake_tx,
            wake_rx,
            stop: AtomicBool::new(false),
            region_users: RwLock::new(()),
            asleep_until: AtomicU64::new(0),
            polled_owed: AtomicBool::new(false),
            epoch: Instant::now(),
        }),
        process: process.clone(),
        ifname,
        addr,
        accepted: Arc::new(Mutex::new(HashMap::new())),
        breaks: Mutex::new(Vec::new()),
        progress: Mutex::new(None),
    }))
}

/// The `OP_*` completion bits of a send request.
fn op_status(wr: &SendWr) -> u32 {
    match wr.op() {
        control::OP_RDMAWRITE => status::OP_RDMA_WRITE,
        control::OP_RDMAREAD => status::OP_RDMA_READ,
        _ => status::OP_SEND,
    }
}

impl Sockets {
    fn brk(&self, vi: &ViCore, code: ErrorCode) {
        self.breaks.lock().unwrap().push(Break {
            vi: (vi.slot, vi.generation),
            code,
            orderly: false,
        });
    }

    fn conn(&self, slot: u32) -> Option<Arc<Conn>> {
        self.shared.vis[slot as usize].conn.read().unwrap().clone()
    }

    /// Completes `wr` with `err` without touching the wire.
    fn complete_now(nic: &NicInner, vi: &ViCore, wr: &SendWr, err: u32) {
        let mut q = VecDeque::from([Awaiting {
            desc_va: wr.desc_va,
            desc_handle: wr.desc_handle,
            op_status: op_status(wr),
            answer: false,
            read_into: None,
            status: Some(err),
            seq: 0,
        }]);
        Conn::drain(nic, vi, &mut q);
    }

    /// Gathers the (checked) segments `segs` into `out`.
    fn gather(
        segs: &[(Arc<Resolved>, u64, u64)],
        out: &mut Vec<u8>,
    ) -> std::result::Result<(), u32> {
        out.clear();
        for (r, va, len) in segs {
            let at = out.len();
            out.resize(at + *len as usize, 0);
            r.read(*va, &mut out[at..])
                .map_err(|_| status::PROTECTION_ERROR)?;
        }
        Ok(())
    }

    /// Connects to the viad of `remote`'s host and asks for a connection.
    fn request(
        &self,
        vi: &ViCore,
        local: &NetAddr,
        remote: &NetAddr,
        timeout: Option<Duration>,
    ) -> Result<Endpoint> {
        let (s, peer) = ask(self.addr, vi.attributes(), local, remote, timeout, false)?;
        self.accepted.lock().unwrap().insert(vi.slot, s);
        Ok(peer)
    }
}

/// Connects to the viad of `remote`'s host and asks for a connection of a
/// VI with attributes `a` (`peer`: peer-to-peer); the connection and the
/// peer as the broker would describe it.
fn ask(
    me: Option<Ipv4Addr>,
    a: ViAttributes,
    local: &NetAddr,
    remote: &NetAddr,
    timeout: Option<Duration>,
    peer: bool,
) -> Result<(TcpStream, Endpoint)> {
    let Some(me) = me else {
        return Err(Error::NoMatch);
    };
    let host: [u8; 4] = remote
        .host
        .as_slice()
        .try_into()
        .map_err(|_| Error::InvalidParameter)?;
    let to = SocketAddr::from((Ipv4Addr::from(host), via_wire::tcp::port()));
    let start = Instant::now();
    let connect_for = timeout
        .unwrap_or(via_wire::timeout())
        .min(via_wire::timeout())
        .max(Duration::from_millis(1));
    let mut s = match TcpStream::connect_timeout(&to, connect_for) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            return Err(Error::NoMatch);
        }
        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => return Err(Error::Timeout),
        Err(e) => return Err(Error::failed("connecting to the remote viad", e)),
    };
    let req = SetupRequest {
        local: NetAddr {
            host: me.octets().to_vec(),
            discriminator: local.discriminator.clone(),
        },
        remote: remote.clone(),
        reliability: a.reliability.bits(),
        mtu: a.max_transfer_size,
        rdma_write: a.enable_rdma_write,
        rdma_read: a.enable_rdma_read,
        // What is left of the caller's timeout, rounded up to the next
        // millisecond (never answered before the timeout passed).
        timeout_ms: crate::conn::timeout_ms(
            timeout.map(|t| t.saturating_sub(start.elapsed()) + Duration::from_micros(999)),
        ),
        peer,
    };
    let io = |e| Error::failed("connection request", e);
    s.write_all(&req.encode()).map_err(io)?;
    // viad keeps the deadline; we wait a little longer for its answer.
    let grace = via_wire::timeout();
    s.set_read_timeout(timeout.map(|t| t.saturating_sub(start.elapsed()) + grace))
        .map_err(io)?;
    let mut head = [0u8; 4];
    let answer = s.read_exact(&mut head).and_then(|()| {
        let n = via_wire::tcp::body_len(head).map_err(std::io::Error::other)?;
        let mut body = vec![0u8; n];
        s.read_exact(&mut body)?;
        SetupAnswer::decode(&body).map_err(std::io::Error::other)
    });
    match answer {
        Ok(SetupAnswer::Accepted {
            reliability,
            mtu,
            rdma_write,
            rdma_read,
        }) => {
            s.set_read_timeout(None).map_err(io)?;
            let peer = Endpoint {
                session: 0,
                nic: 0,
                vi: 0,
                vi_gen: 0,
                reliability,
                mtu,
                rdma_write,
                rdma_read,
                device: Vec::new(),
            };
            Ok((s, peer))
        }
        Ok(SetupAnswer::Refused(r)) => Err(Error::from(r)),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            Err(Error::Timeout)
        }
        Err(e) => Err(io(e)),
    }
}

impl Device for Sockets {
    fn kind(&self) -> &'static str {
        "sockets"
    }

    fn limits(&self) -> Limits {
        Limits {
            max_vi: MAX_VI,
            max_cq: MAX_CQ,
            queue_depth: 1024,
            max_segments: crate::descriptor::MAX_SEGMENTS as u32,
            max_transfer: MAX_TRANSFER,
            max_regions: 65536,
            reliability: Reliability::Unreliable.bits()
                | Reliability::ReliableDelivery.bits()
                | Reliability::ReliableReception.bits(),
            rdma_read: Reliability::ReliableDelivery.bits() | Reliability::ReliableReception.bits(),
            write_tail_last: false,
        }
    }

    fn local_address(&self) -> Option<Vec<u8>> {
        Some(self.addr.unwrap_or(Ipv4Addr::UNSPECIFIED).octets().to_vec())
    }

    fn start(&self, nic: &Arc<NicInner>) {
        let shared = self.shared.clone();
        let weak = Arc::downgrade(nic);
        let name = format!("via-sock-{}", self.ifname);
        match std::thread::Builder::new()
            .name(name)
            .spawn(move || progress::run(shared, weak))
        {
            Ok(h) => *self.progress.lock().unwrap() = Some(h),
            Err(e) => log::error!("cannot start the progress thread: {e}"),
        }
    }

    fn close(&self, _nic: &NicInner) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake();
        if let Some(h) = self.progress.lock().unwrap().take() {
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }

    fn provider_wake(&self) -> &EventCount {
        &self.shared.provider
    }

    fn vi_signals(&self, slot: u32) -> ViSignals<'_> {
        let w = &self.shared.vis[slot as usize];
        ViSignals {
            send_wake: &w.send_wake,
            recv_wake: &w.recv_wake,
            interest: &w.interest,
        }
    }

    fn cq_signals(&self, slot: u32) -> CqSignals<'_> {
        let w = &self.shared.cqs[slot as usize];
        CqSignals {
            wake: &w.wake,
            interest: &w.interest,
        }
    }

    fn reserve_region(&self) -> Result<RegionSlot> {
        // Unique in the process, not only in this NIC: a handle of another
        // NIC is refused (`VIP_INVALID_PARAMETER`), not taken for one of ours.
        static NEXT: AtomicU32 = AtomicU32::new(0x100);
        Ok(RegionSlot {
            handle: NEXT.fetch_add(1, Ordering::Relaxed),
            index: 0,
        })
    }

    fn add_region(&self, _nic: &NicInner, slot: RegionSlot, _r: &RegionSpec<'_>) -> Result<u32> {
        Ok(slot.handle)
    }

    fn set_region_attributes(&self, _handle: u32, _ptag: u32, _flags: u32) -> Result<()> {
        Ok(())
    }

    fn quiesce_region_users(&self, _nic: &NicInner) {
        // Readers look regions up under the lock: once we had it, none
        // holds a removed one any more.
        drop(self.shared.region_users.write().unwrap());
    }

    fn add_vi(&self, _nic: &NicInner, vi: &ViCore) -> Result<()> {
        if vi.slot >= MAX_VI {
            return Err(Error::Resource);
        }
        Ok(())
    }

    fn vi_attributes(&self, _vi: &ViCore, _a: &ViAttributes) {}

    fn remove_vi(&self, _nic: &NicInner, vi: &ViCore) {
        let w = &self.shared.vis[vi.slot as usize];
        w.recvs.lock().unwrap().clear();
        if let Some(c) = w.conn.write().unwrap().take() {
            c.close();
            self.shared.conns_version.fetch_add(1, Ordering::Release);
            self.shared.wake();
        }
        self.accepted.lock().unwrap().remove(&vi.slot);
    }

    fn cq_ring(
        &self,
        _nic: &NicInner,
        _slot: u32,
        _generation: u32,
        entries: u32,
    ) -> Result<Arc<MappedRing>> {
        let cap = entries.next_power_of_two().max(64);
        let len = cq::EntryRing::bytes_for(cap);
        let map = Mapping::anonymous(len).map_err(|_| Error::Resource)?;
        let ring = MappedRing::init(Arc::new(map), 0, len, cap).map_err(|_| Error::Resource)?;
        ring.get()
            .set_limit(entries as usize)
            .map_err(|_| Error::Resource)?;
        Ok(Arc::new(ring))
    }

    fn request_connection(
        &self,
        _nic: &NicInner,
        vi: &ViCore,
        local: &NetAddr,
        remote: &NetAddr,
        timeout: Option<Duration>,
    ) -> Option<Result<Endpoint>> {
        Some(self.request(vi, local, remote, timeout))
    }

    fn request_peer(
        &self,
        _nic: &NicInner,
        vi: &ViCore,
        local: &NetAddr,
        remote: &NetAddr,
        timeout: Option<Duration>,
    ) -> Option<Result<crate::agent::Pending>> {
        // One side asks the other's viad over TCP: the one whose address is
        // smaller. The other waits for it in its own viad's broker.
        if (&local.host, &local.discriminator) >= (&remote.host, &remote.discriminator) {
            return None;
        }
        let (tx, pending) = crate::agent::Pending::answered_locally();
        let (me, a, slot) = (self.addr, vi.attributes(), vi.slot);
        let (local, remote) = (local.clone(), remote.clone());
        let accepted = self.accepted.clone();
        let spawned = std::thread::Builder::new()
            .name("via-sock-peer".into())
            .spawn(move || {
                let reply = match ask(me, a, &local, &remote, timeout, true) {
                    Ok((s, peer)) => {
                        accepted.lock().unwrap().insert(slot, s);
                        proto::Reply::Connected { peer }
                    }
                    Err(e) => proto::Reply::Refused(match e.kind() {
                        crate::ErrorKind::Timeout => proto::Refusal::Timeout,
                        crate::ErrorKind::Reject => proto::Refusal::Reject,
                        crate::ErrorKind::InvalidReliabilityLevel => proto::Refusal::Reliability,
                        _ => proto::Refusal::NoMatch,
                    }),
                };
                let _ = tx.send((reply, Vec::new()));
            });
        Some(
            spawned
                .map(|_| pending)
                .map_err(|e| Error::failed("starting a peer request", e)),
        )
    }

    fn connect(&self, _nic: &NicInner, vi: &ViCore, peer: &Endpoint) -> Result<()> {
        let stream = match peer.device.as_slice() {
            // The acceptor: the requester's connection, held by viad.
            [b'T', s @ ..] if s.len() == 8 => {
                let session = u64::from_le_bytes(s.try_into().unwrap());
                let key = ObjKey {
                    kind: ObjKind::Stream,
                    nic: 0,
                    id: 0,
                    generation: 0,
                };
                let fd = self
                    .process
                    .agent()?
                    .fetch(session, key)
                    .map_err(|e| Error::failed("fetching the requester's connection", e))?;
                TcpStream::from(fd)
            }
            // The requester: the connection the answer came on.
            [] => self
                .accepted
                .lock()
                .unwrap()
                .remove(&vi.slot)
                .ok_or(Error::Resource)?,
            _ => {
                log::warn!("sockets NIC: a peer of another kind of NIC");
                return Err(Error::Resource);
            }
        };
        let c = Conn::new(
            (vi.slot, vi.generation),
            stream,
            self.shared.settings.timeout,
            self.shared.settings.fragment,
            peer.mtu,
            self.shared.settings.ack_delay,
        )
        .map_err(|e| Error::failed("setting up the connection", e))?;
        *self.shared.vis[vi.slot as usize].conn.write().unwrap() = Some(Arc::new(c));
        self.shared.conns_version.fetch_add(1, Ordering::Release);
        self.shared.wake();
        Ok(())
    }

    fn disconnect(&self, nic: &NicInner, vi: &ViCore, _tell_peer: bool) {
        let c = self.shared.vis[vi.slot as usize]
            .conn
            .write()
            .unwrap()
            .take();
        if let Some(c) = c {
            if !c.closed.load(Ordering::Acquire) {
                c.queue(
                    Header {
                        op: frame::BYE,
                        ..Header::default()
                    },
                    &[],
                );
            }
            c.close();
            progress::flush_taken(nic, vi, &c);
            c.flush_sends(nic, vi);
            self.shared.conns_version.fetch_add(1, Ordering::Release);
            self.shared.wake();
        }
    }

    fn post_send(
        &self,
        nic: &NicInner,
        vi: &ViCore,
        wr: &SendWr,
        _regions: WrRegions<'_>,
    ) -> Result<Kick> {
        let conn = self
            .conn(vi.slot)
            .filter(|c| !c.closed.load(Ordering::Acquire) && !vi.broken.load(Ordering::Acquire));
        let Some(conn) = conn else {
            Self::complete_now(nic, vi, wr, status::DESC_FLUSHED_ERROR);
            return Ok(Kick::Needed);
        };
        let reliability = vi.reliability();
        let mut aw = Awaiting {
            desc_va: wr.desc_va,
            desc_handle: wr.desc_handle,
            op_status: op_status(wr),
            answer: false,
            read_into: None,
            status: None,
            seq: 0,
        };
        // The smaller MaxTransferSize of the two VIs applies.
        let fault = if wr.fault == 0 && conn.peer_mtu != 0 && wr.length > conn.peer_mtu {
            status::LENGTH_ERROR
        } else {
            wr.fault
        };
        if fault != 0 {
            aw.status = Some(fault);
            // In ERROR before the status is written; the break follows at
            // `kick`.
            progress::breaks_now(&self.shared, &conn, vi);
            let mut q = conn.awaiting.lock().unwrap();
            q.push_back(aw);
            Conn::drain(nic, vi, &mut q);
            if reliability.is_reliable() {
                self.brk(vi, ErrorCode::PostDesc);
            }
            return Ok(Kick::Needed);
        }
        let mut h = Header {
            len: wr.length,
            ..Header::default()
        };
        if wr.control & control::IMMEDIATE != 0 {
            h.flags |= frame::IMM;
            h.imm = wr.imm;
        }
        // The payload's segments, checked here: each inside its region.
        // They go from registered memory straight to the socket when this
        // process reaches them by address, else through `tx.staging`.
        let mut segs: Vec<(Arc<Resolved>, u64, u64)> = Vec::new();
        let mut staged = wr.op() == control::OP_RDMAREAD;
        if !staged {
            segs.reserve(wr.local().len());
            for s in wr.local() {
                let (va, len) = (s.va, s.len as u64);
                match nic.regions.get(s.handle).filter(|r| r.covers(va, len)) {
                    Some(r) => {
                        staged |= !io::reachable(&r, va, len);
                        segs.push((r, va, len));
                    }
                    None => {
                        aw.status = Some(status::PROTECTION_ERROR);
                        let mut q = conn.awaiting.lock().unwrap();
                        q.push_back(aw);
                        Conn::drain(nic, vi, &mut q);
                        return Ok(Kick::Needed);
                    }
                }
            }
        }
        let mut tx = conn.tx.lock().unwrap();
        match wr.op() {
            control::OP_RDMAREAD => {
                h.op = frame::READ_REQ;
                h.handle = wr.remote_handle;
                h.va = wr.remote_va;
                aw.answer = true;
                aw.read_into = Some(wr.local().to_vec());
                tx.staging.clear();
            }
            op => {
                if staged {
                    if let Err(st) = Self::gather(&segs, &mut tx.staging) {
                        drop(tx);
                        aw.status = Some(st);
                        let mut q = conn.awaiting.lock().unwrap();
                        q.push_back(aw);
                        Conn::drain(nic, vi, &mut q);
                        return Ok(Kick::Needed);
                    }
                }
                if op == control::OP_RDMAWRITE {
                    // The target's protection checks answer every RDMA
                    // write: RDMA_PROT_ERROR reaches this descriptor.
                    h.op = frame::WRITE;
                    h.handle = wr.remote_handle;
                    h.va = wr.remote_va;
                    aw.answer = true;
                } else {
                    h.op = frame::SEND;
                    aw.answer = reliability == Reliability::ReliableReception;
                }
                if aw.answer {
                    h.flags |= frame::WANT_ACK;
                }
            }
        }
        let answer = aw.answer;
        // `send_frame` numbers the frame `tx.seq` (the peer answers by it).
        aw.seq = tx.seq;
        conn.awaiting.lock().unwrap().push_back(aw);
        let payload = if staged {
            Payload::Staged
        } else {
            Payload::Regions(&segs)
        };
        match conn.send_frame(&mut tx, h, payload) {
            Ok(()) => {
                if !answer {
                    // Written: done (Unreliable, Reliable Delivery). Marked
                    // before `tx` is released: a break's flush waits for it
                    // (`Conn::flush_sends`), and must not find the request
                    // written but unmarked and complete it as flushed (the
                    // peer may break the connection over this very message,
                    // faster than this thread gets here).
                    let mut q = conn.awaiting.lock().unwrap();
                    if let Some(a) = q.back_mut() {
                        a.status = Some(0);
                    }
                    Conn::drain(nic, vi, &mut q);
                }
                drop(tx);
            }
            Err(e) => {
                drop(tx);
                log::debug!("VI {}: write failed: {e}", vi.slot);
                // Flushed with the rest when the connection breaks.
                self.brk(vi, ErrorCode::ConnLost);
            }
        }
        Ok(Kick::Needed)
    }

    fn kick(&self, nic: &NicInner, _vi: Option<&ViCore>) {
        let breaks = std::mem::take(&mut *self.breaks.lock().unwrap());
        for b in breaks {
            if let Some(vi) = nic.vi(b.vi.0, b.vi.1) {
                let tell = b.code == ErrorCode::PostDesc;
                vi.break_connection_as(nic, b.code, tell, false, b.orderly);
            }
        }
    }

    fn poll(&self, nic: &NicInner, vi: &ViCore) {
        progress::poll(nic, &self.shared, vi.slot);
    }

    fn poll_any(&self, nic: &NicInner, slots: &[u32]) -> bool {
        // A CQ's poller reads its members' connections as a VI's does
        // its own, rather than wait for the progress thread to wake.
        for &slot in slots {
            progress::poll(nic, &self.shared, slot);
        }
        !slots.is_empty()
    }

    fn post_recv(&self, _nic: &NicInner, vi: &ViCore, pos: u64, wr: &RecvWr) -> Result<()> {
        self.shared.vis[vi.slot as usize]
            .recvs
            .lock()
            .unwrap()
            .push_back((pos, wr.clone()));
        Ok(())
    }

    fn cancel_recv(&self, _nic: &NicInner, vi: &ViCore, pos: u64, _force: bool) -> bool {
        let mut q = self.shared.vis[vi.slot as usize].recvs.lock().unwrap();
        match q.iter().position(|(p, _)| *p == pos) {
            Some(i) => {
                q.remove(i);
                true
            }
            None => false,
        }
    }
}
