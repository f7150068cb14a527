//! Safe owners of the ibverbs objects the verbs kind uses: the one module of
//! the kind with `unsafe` (FFI through `rdma-mummy-sys`, which loads
//! `libibverbs.so.1` at run time: without rdma-core, or without a device,
//! [`devices`] is empty and [`Context::open`] fails cleanly).
//!
//! Each object owns its ibv pointer and releases it in `Drop`; the objects
//! it depends on are kept alive by an `Arc` (a QP holds its PD and CQ, a PD
//! its context), so release happens in the order libibverbs requires.
//! libibverbs objects may be used from any thread (its documented thread
//! safety), hence the `Send`/`Sync` impls.

use std::ffi::CStr;
use std::io;
use std::os::fd::RawFd;
use std::ptr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use rdma_mummy_sys as sys;

use crate::translate::WrSeg;

/// `ibv_access_flags` bits.
pub(crate) const ACCESS_LOCAL_WRITE: u32 = sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
pub(crate) const ACCESS_REMOTE_WRITE: u32 = sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
pub(crate) const ACCESS_REMOTE_READ: u32 = sys::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;

/// `ibv_wc_status` values.
pub(crate) use sys::ibv_wc_status::{
    IBV_WC_LOC_ACCESS_ERR as WC_LOC_ACCESS_ERR, IBV_WC_LOC_LEN_ERR as WC_LOC_LEN_ERR,
    IBV_WC_LOC_PROT_ERR as WC_LOC_PROT_ERR, IBV_WC_LOC_QP_OP_ERR as WC_LOC_QP_OP_ERR,
    IBV_WC_REM_ACCESS_ERR as WC_REM_ACCESS_ERR, IBV_WC_REM_INV_REQ_ERR as WC_REM_INV_REQ_ERR,
    IBV_WC_REM_OP_ERR as WC_REM_OP_ERR, IBV_WC_RNR_RETRY_EXC_ERR as WC_RNR_RETRY_EXC_ERR,
    IBV_WC_SUCCESS as WC_SUCCESS, IBV_WC_WR_FLUSH_ERR as WC_WR_FLUSH_ERR,
};
/// `ibv_wc_opcode` of a receive that completes an RDMA write with immediate.
pub(crate) const WC_RECV_RDMA_WITH_IMM: u32 = sys::ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM;

/// The names of the RDMA devices of this host (empty: none, or no
/// libibverbs).
pub(crate) fn devices() -> Vec<String> {
    let mut n = 0;
    // SAFETY: `n` is a valid out-pointer; the list is freed below and its
    // entries are only read while it lives.
    let list = unsafe { sys::ibv_get_device_list(&mut n) };
    if list.is_null() {
        return Vec::new();
    }
    let mut out = Vec::new();
    for i in 0..n.max(0) as usize {
        // SAFETY: `list` holds `n` valid device pointers (ibv_get_device_list).
        let dev = unsafe { *list.add(i) };
        // SAFETY: `dev` is a live device of the list; the name is a
        // NUL-terminated string owned by it, copied before the list is freed.
        let name = unsafe { CStr::from_ptr(sys::ibv_get_device_name(dev)) };
        out.push(name.to_string_lossy().into_owned());
    }
    // SAFETY: `list` came from ibv_get_device_list and is freed once.
    unsafe { sys::ibv_free_device_list(list) };
    out
}

fn last_error(what: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// A verb's return code as a result. Success inline (every post checks
/// one), the error built out of line.
#[inline(always)]
fn check(rc: i32, what: &str) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(failed(rc, what))
    }
}

#[cold]
#[inline(never)]
fn failed(rc: i32, what: &str) -> io::Error {
    if rc > 0 {
        // Most verbs return a positive errno; some return -1 and set errno.
        io::Error::new(
            io::Error::from_raw_os_error(rc).kind(),
            format!("{what}: {}", io::Error::from_raw_os_error(rc)),
        )
    } else {
        last_error(what)
    }
}

/// Port attributes the kind uses.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PortInfo {
    /// Local identifier (0 on RoCE).
    pub lid: u16,
    /// Active MTU (`ibv_mtu` code).
    pub active_mtu: u32,
    /// Link layer is Ethernet (RoCE): addressing goes through the GID.
    pub ethernet: bool,
}

/// An open device (`ibv_context`) and its port 1.
pub(crate) struct Context {
    ctx: *mut sys::ibv_context,
    /// Name of the device.
    pub name: String,
}

// SAFETY: libibverbs contexts are thread safe (rdma-core's documented
// thread safety: every verb may be called concurrently on one context).
unsafe impl Send for Context {}
// SAFETY: as above.
unsafe impl Sync for Context {}

impl Context {
    /// Opens device `name`, or the first device (`None`).
    ///
    /// # Errors
    /// `NotFound` when no such device exists (or no libibverbs).
    pub fn open(name: Option<&str>) -> io::Result<Context> {
        let mut n = 0;
        // SAFETY: as in `devices`.
        let list = unsafe { sys::ibv_get_device_list(&mut n) };
        if list.is_null() || n <= 0 {
            if !list.is_null() {
                // SAFETY: freed once.
                unsafe { sys::ibv_free_device_list(list) };
            }
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                "no RDMA device (ibv_get_device_list found none)",
            ));
        }
        let mut found = None;
        for i in 0..n as usize {
            // SAFETY: `list` holds `n` valid device pointers.
            let dev = unsafe { *list.add(i) };
            // SAFETY: the name belongs to the live device.
            let dn = unsafe { CStr::from_ptr(sys::ibv_get_device_name(dev)) }
                .to_string_lossy()
                .into_owned();
            if name.is_none_or(|w| w == dn) {
                found = Some((dev, dn));
                break;
            }
        }
        let r = match found {
            None => Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("no RDMA device named {}", name.unwrap_or("")),
            )),
            Some((dev, dn)) => {
                // SAFETY: `dev` is a live device of the list; the context
                // outlives the list (libibverbs keeps the device referenced).
                let ctx = unsafe { sys::ibv_open_device(dev) };
                if ctx.is_null() {
                    Err(last_error("ibv_open_device"))
                } else {
                    Ok(Context { ctx, name: dn })
                }
            }
        };
        // SAFETY: freed once, after the device was opened.
        unsafe { sys::ibv_free_device_list(list) };
        r
    }

    /// Attributes of port `port`.
    pub fn port(&self, port: u8) -> io::Result<PortInfo> {
        // SAFETY: ibv_port_attr is plain data; all-zero is a valid value.
        let mut a: sys::ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: `ctx` is live; `a` is a valid out-pointer of the right size.
        let rc = unsafe { sys::ibv_query_port(self.ctx, port, &mut a) };
        check(rc, "ibv_query_port")?;
        Ok(PortInfo {
            lid: a.lid,
            active_mtu: a.active_mtu,
            // IBV_LINK_LAYER_ETHERNET
            ethernet: a.link_layer == 2,
        })
    }

    /// GID `index` of `port`.
    pub fn gid(&self, port: u8, index: i32) -> io::Result<[u8; 16]> {
        let mut g = sys::ibv_gid { raw: [0; 16] };
        // SAFETY: `ctx` is live; `g` is a valid out-pointer.
        let rc = unsafe { sys::ibv_query_gid(self.ctx, port, index, &mut g) };
        check(rc, "ibv_query_gid")?;
        // SAFETY: every bit pattern of the union is a valid `raw`.
        Ok(unsafe { g.raw })
    }
}

impl Context {
    /// Whether the device opens an XRC domain (`ibv_open_xrcd`); the error
    /// when it does not (rxe: `EOPNOTSUPP`).
    pub fn xrc_supported(&self) -> io::Result<()> {
        // SAFETY: plain data; zero is valid.
        let mut a: sys::ibv_xrcd_init_attr = unsafe { std::mem::zeroed() };
        a.comp_mask = (sys::ibv_xrcd_init_attr_mask::IBV_XRCD_INIT_ATTR_FD
            | sys::ibv_xrcd_init_attr_mask::IBV_XRCD_INIT_ATTR_OFLAGS)
            .0;
        a.fd = -1;
        a.oflags = libc::O_CREAT;
        // SAFETY: `ctx` is live; `a` valid for the call.
        let x = unsafe { sys::ibv_open_xrcd(self.ctx, &mut a) };
        if x.is_null() {
            return Err(last_error("ibv_open_xrcd"));
        }
        // SAFETY: the domain just opened, closed once.
        unsafe { sys::ibv_close_xrcd(x) };
        Ok(())
    }
}

/// An asynchronous event of the device (`ibv_get_async_event`), as the
/// kind acts on it.
#[derive(Debug)]
pub(crate) enum DeviceEvent {
    /// A CQ overran: it lost completions (the CQ's address).
    CqError(usize),
    /// A QP went to ERROR by itself: its number, and the event's name
    /// (`QP_FATAL`, `QP_REQ_ERR`, `QP_ACCESS_ERR`).
    QpError(u32, &'static str),
    /// An SRQ failed (its address).
    SrqError(usize),
    /// The device stopped working.
    DeviceFatal,
    /// A port came up or went down.
    Port { port: i32, up: bool },
    /// Anything else, by name: nothing to do but log it.
    Other(&'static str),
}

/// The names of `ibv_event_type` values (libibverbs' `ibv_event_type_str`
/// would need a value of the binding's enum: one libibverbs does not
/// know yet would be undefined behaviour there).
const EVENT_NAMES: [&str; 21] = [
    "CQ_ERR",
    "QP_FATAL",
    "QP_REQ_ERR",
    "QP_ACCESS_ERR",
    "COMM_EST",
    "SQ_DRAINED",
    "PATH_MIG",
    "PATH_MIG_ERR",
    "DEVICE_FATAL",
    "PORT_ACTIVE",
    "PORT_ERR",
    "LID_CHANGE",
    "PKEY_CHANGE",
    "SM_CHANGE",
    "SRQ_ERR",
    "SRQ_LIMIT_REACHED",
    "QP_LAST_WQE_REACHED",
    "CLIENT_REREGISTER",
    "GID_CHANGE",
    "WQ_FATAL",
    "DEVICE_SPEED_CHANGE",
];

impl Context {
    /// The largest CQ the device makes (`max_cqe`).
    pub fn max_cqe(&self) -> io::Result<i32> {
        // SAFETY: plain data; all-zero is a valid value.
        let mut a: sys::ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: `ctx` is live; `a` is a valid out-pointer.
        let rc = unsafe { sys::ibv_query_device(self.ctx, &mut a) };
        check(rc, "ibv_query_device")?;
        Ok(a.max_cqe)
    }

    /// The file descriptor of the device's asynchronous events (readable:
    /// one waits), made non-blocking.
    pub fn async_fd(&self) -> io::Result<RawFd> {
        // SAFETY: `ctx` is live.
        let fd = unsafe { (*self.ctx).async_fd };
        set_nonblocking(fd, "asynchronous event fd")?;
        Ok(fd)
    }

    /// Takes and acknowledges the next asynchronous event; `None` when none
    /// waits (the fd is non-blocking: [`Context::async_fd`]).
    pub fn take_async_event(&self) -> Option<DeviceEvent> {
        let mut ev = std::mem::MaybeUninit::<sys::ibv_async_event>::uninit();
        // SAFETY: `ctx` is live; `ev` is a valid out-pointer. Non-blocking:
        // fails (EAGAIN) when no event waits.
        if unsafe { sys::ibv_get_async_event(self.ctx, ev.as_mut_ptr()) } != 0 {
            return None;
        }
        let p = ev.as_mut_ptr();
        // SAFETY: the call filled `ev`. The type is read as the integer the
        // C library wrote (not as the binding's enum, which a newer
        // library's value would make invalid).
        let kind = unsafe { ptr::addr_of!((*p).event_type).cast::<u32>().read() };
        let name = EVENT_NAMES.get(kind as usize).copied().unwrap_or("unknown");
        // SAFETY: for each type the union holds the member read below; the
        // QP, CQ or SRQ it points to lives until the event is acked.
        let out = unsafe {
            match kind {
                0 => DeviceEvent::CqError((*p).element.cq.addr()),
                1..=3 => DeviceEvent::QpError((*(*p).element.qp).qp_num, name),
                8 => DeviceEvent::DeviceFatal,
                9 | 10 => DeviceEvent::Port {
                    port: (*p).element.port_num,
                    up: kind == 9,
                },
                14 => DeviceEvent::SrqError((*p).element.srq.addr()),
                _ => DeviceEvent::Other(name),
            }
        };
        // SAFETY: the event just taken, acked once.
        unsafe { sys::ibv_ack_async_event(p) };
        Some(out)
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: every object of the context holds an Arc of it, so none
        // is left; closed once.
        unsafe { sys::ibv_close_device(self.ctx) };
    }
}

/// A protection domain.
pub(crate) struct Pd {
    pd: *mut sys::ibv_pd,
    _ctx: Arc<Context>,
}

// SAFETY: see Context.
unsafe impl Send for Pd {}
// SAFETY: see Context.
unsafe impl Sync for Pd {}

impl Pd {
    /// Allocates a protection domain on `ctx`.
    pub fn new(ctx: &Arc<Context>) -> io::Result<Arc<Pd>> {
        // SAFETY: `ctx` is live.
        let pd = unsafe { sys::ibv_alloc_pd(ctx.ctx) };
        if pd.is_null() {
            return Err(last_error("ibv_alloc_pd"));
        }
        Ok(Arc::new(Pd {
            pd,
            _ctx: ctx.clone(),
        }))
    }

    /// Registers `len` bytes at `va` with `access` (`ibv_access_flags` bits).
    ///
    /// # Safety
    /// The range must stay mapped while the returned `Mr` lives: the device
    /// reads and writes it on behalf of local and (with remote access)
    /// remote requests.
    pub unsafe fn register(self: &Arc<Self>, va: u64, len: u64, access: u32) -> io::Result<Mr> {
        // SAFETY: `pd` is live; the caller keeps the range mapped (above).
        let mr = unsafe {
            sys::ibv_reg_mr(
                self.pd,
                va as *mut libc::c_void,
                len as usize,
                access as i32,
            )
        };
        if mr.is_null() {
            return Err(last_error("ibv_reg_mr"));
        }
        // SAFETY: `mr` is a live MR just returned.
        let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
        Ok(Mr {
            mr,
            addr: va,
            lkey,
            rkey,
            remote: access & (ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ) != 0,
            _pd: self.clone(),
        })
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: MRs and QPs hold an Arc of the PD, so none is left.
        unsafe { sys::ibv_dealloc_pd(self.pd) };
    }
}

/// A memory region.
pub(crate) struct Mr {
    mr: *mut sys::ibv_mr,
    /// First registered byte.
    pub addr: u64,
    /// Local key (our own work requests).
    pub lkey: u32,
    /// Remote key (peers' RDMA).
    pub rkey: u32,
    /// Registered with remote access (RDMA write or read).
    pub remote: bool,
    _pd: Arc<Pd>,
}

// SAFETY: see Context.
unsafe impl Send for Mr {}
// SAFETY: see Context.
unsafe impl Sync for Mr {}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: deregistered once; requests still using the keys fail
        // with a protection error (the device no longer touches the pages).
        let rc = unsafe { sys::ibv_dereg_mr(self.mr) };
        if rc != 0 {
            log::warn!("ibv_dereg_mr: {}", io::Error::from_raw_os_error(rc));
        }
    }
}

/// A completion channel: the one file descriptor where every CQ made with
/// it signals (for blocking). Its fd is non-blocking, so a stale readiness
/// never blocks the thread that takes the events.
pub(crate) struct Channel {
    channel: *mut sys::ibv_comp_channel,
    _ctx: Arc<Context>,
}

// SAFETY: see Context.
unsafe impl Send for Channel {}
// SAFETY: see Context.
unsafe impl Sync for Channel {}

impl Channel {
    /// A completion channel of `ctx`.
    pub fn new(ctx: &Arc<Context>) -> io::Result<Arc<Channel>> {
        // SAFETY: `ctx` is live.
        let channel = unsafe { sys::ibv_create_comp_channel(ctx.ctx) };
        if channel.is_null() {
            return Err(last_error("ibv_create_comp_channel"));
        }
        let c = Channel {
            channel,
            _ctx: ctx.clone(),
        };
        set_nonblocking(c.fd(), "completion channel")?;
        Ok(Arc::new(c))
    }

    /// The channel's file descriptor (readable: an event waits).
    pub fn fd(&self) -> RawFd {
        // SAFETY: `channel` is live.
        unsafe { (*self.channel).fd }
    }

    /// Takes and acknowledges every event waiting; how many.
    pub fn take_events(&self) -> usize {
        let mut n = 0;
        loop {
            let mut cq = ptr::null_mut();
            let mut cx = ptr::null_mut();
            // SAFETY: `channel` is live; out-pointers valid. The fd is
            // non-blocking: with no event waiting the call fails (EAGAIN).
            if unsafe { sys::ibv_get_cq_event(self.channel, &mut cq, &mut cx) } != 0 {
                return n;
            }
            // SAFETY: `cq` is a CQ of this channel, alive until its events
            // are acked (ibv_destroy_cq waits for them); acked once.
            unsafe { sys::ibv_ack_cq_events(cq, 1) };
            n += 1;
        }
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        // SAFETY: every CQ of the channel holds an Arc of it, so none is
        // left; destroyed once.
        unsafe { sys::ibv_destroy_comp_channel(self.channel) };
    }
}

/// Waits up to `ms` milliseconds for one of `fds` to be readable; which
/// are.
pub(crate) fn wait_readable<const N: usize>(fds: [RawFd; N], ms: i32) -> [bool; N] {
    let mut p = fds.map(|fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    });
    // SAFETY: `N` valid pollfds for the call.
    if unsafe { libc::poll(p.as_mut_ptr(), N as libc::nfds_t, ms) } <= 0 {
        return [false; N];
    }
    p.map(|p| p.revents != 0)
}

/// Makes `fd` non-blocking.
fn set_nonblocking(fd: RawFd, what: &str) -> io::Result<()> {
    // SAFETY: plain fcntl on a live fd of ours.
    let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if fl < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) } < 0 {
        return Err(last_error(&format!("fcntl(O_NONBLOCK) of the {what}")));
    }
    Ok(())
}

/// A completion queue, and how many of its entries no QP or SRQ has
/// reserved: a CQ overruns (the device loses completions, and on most
/// devices every QP on it fails) when more completions are outstanding
/// than it holds, so every user reserves its queue's depth first
/// ([`Cq::reserve`]).
pub(crate) struct Cq {
    cq: *mut sys::ibv_cq,
    capacity: u32,
    free: AtomicU32,
    _channel: Option<Arc<Channel>>,
    _ctx: Arc<Context>,
}

// SAFETY: see Context.
unsafe impl Send for Cq {}
// SAFETY: see Context.
unsafe impl Sync for Cq {}

/// Entries of a [`Cq`] reserved by one user (a QP, an SRQ), given back when
/// dropped.
pub(crate) struct CqShare {
    cq: Arc<Cq>,
    entries: u32,
}

impl CqShare {
    /// The CQ the entries are in.
    pub fn cq(&self) -> &Arc<Cq> {
        &self.cq
    }
}

impl Drop for CqShare {
    fn drop(&mut self) {
        self.cq.free.fetch_add(self.entries, Ordering::Relaxed);
    }
}

/// A work completion, as the kind needs it.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Wc {
    pub wr_id: u64,
    /// The QP the completion belongs to (which VI took a shared receive).
    pub qp_num: u32,
    pub status: u32,
    pub opcode: u32,
    pub byte_len: u32,
    /// Immediate data, host order, if the completion carries one.
    pub imm: Option<u32>,
}

impl Cq {
    /// A CQ of at least `entries` entries on `ctx` (the device may make it
    /// larger: [`Cq::capacity`]), signalling on `channel` if given.
    pub fn new(
        ctx: &Arc<Context>,
        entries: i32,
        channel: Option<&Arc<Channel>>,
    ) -> io::Result<Arc<Cq>> {
        let ch = channel.map_or(ptr::null_mut(), |c| c.channel);
        // SAFETY: `ctx` and the channel (if any) are live; the CQ keeps
        // them alive (Arcs).
        let cq = unsafe { sys::ibv_create_cq(ctx.ctx, entries, ptr::null_mut(), ch, 0) };
        if cq.is_null() {
            return Err(last_error("ibv_create_cq"));
        }
        // SAFETY: live CQ; `cqe` is what the device made (>= `entries`).
        let capacity = unsafe { (*cq).cqe }.max(0) as u32;
        Ok(Arc::new(Cq {
            cq,
            capacity,
            free: AtomicU32::new(capacity),
            _channel: channel.cloned(),
            _ctx: ctx.clone(),
        }))
    }

    /// Entries the CQ holds.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Reserves `n` entries for one user; `None` if fewer are free.
    pub fn reserve(self: &Arc<Self>, n: u32) -> Option<CqShare> {
        self.free
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |f| f.checked_sub(n))
            .ok()?;
        Some(CqShare {
            cq: self.clone(),
            entries: n,
        })
    }

    /// Whether this CQ is the one at `addr` (an asynchronous event's).
    pub fn is(&self, addr: usize) -> bool {
        self.cq.addr() == addr
    }

    /// Takes up to `max` completions (at most 16), handing each to `f` in
    /// order; how many. Nothing is zeroed first: a drain that finds one
    /// completion (the common case) would otherwise clear 16 of them.
    pub fn poll_each(&self, max: usize, mut f: impl FnMut(&Wc)) -> usize {
        const N: usize = 16;
        let mut raw = std::mem::MaybeUninit::<[sys::ibv_wc; N]>::uninit();
        let want = max.min(N) as i32;
        // SAFETY: `cq` is live; `raw` has room for `want` entries.
        let n = unsafe { sys::ibv_poll_cq(self.cq, want, raw.as_mut_ptr().cast()) };
        if n < 0 {
            log::error!("ibv_poll_cq failed ({n})");
            return 0;
        }
        let first: *const sys::ibv_wc = raw.as_ptr().cast();
        for i in 0..n as usize {
            // SAFETY: ibv_poll_cq wrote the first `n` (<= `want`) entries.
            let w = unsafe { &*first.add(i) };
            let with_imm = w.wc_flags & sys::ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0;
            f(&Wc {
                wr_id: w.wr_id,
                qp_num: w.qp_num,
                status: w.status,
                opcode: w.opcode,
                byte_len: w.byte_len,
                // SAFETY: the union holds imm_data when IBV_WC_WITH_IMM is set
                // (and any u32 is a valid value either way).
                imm: with_imm
                    .then(|| u32::from_be(unsafe { w.imm_data_invalidated_rkey_union.imm_data })),
            });
        }
        n as usize
    }

    /// Asks for an event on the channel at the next completion.
    pub fn arm(&self) {
        // SAFETY: `cq` is live.
        let rc = unsafe { sys::ibv_req_notify_cq(self.cq, 0) };
        if rc != 0 {
            log::error!("ibv_req_notify_cq failed ({rc})");
        }
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY: QPs and SRQ users hold an Arc of their CQs, so none is
        // left; events were acked as taken. Destroyed once, before the
        // channel (which it holds).
        unsafe { sys::ibv_destroy_cq(self.cq) };
    }
}

/// A shared receive queue.
pub(crate) struct Srq {
    srq: *mut sys::ibv_srq,
    _pd: Arc<Pd>,
}

// SAFETY: see Context.
unsafe impl Send for Srq {}
// SAFETY: see Context.
unsafe impl Sync for Srq {}

impl Srq {
    /// An SRQ of `depth` receives of up to `sges` segments in `pd`.
    pub fn new(pd: &Arc<Pd>, depth: u32, sges: u32) -> io::Result<Arc<Srq>> {
        let mut a = sys::ibv_srq_init_attr {
            srq_context: ptr::null_mut(),
            attr: sys::ibv_srq_attr {
                max_wr: depth,
                max_sge: sges,
                srq_limit: 0,
            },
        };
        // SAFETY: `pd` is live and kept alive by the SRQ; `a` valid.
        let srq = unsafe { sys::ibv_create_srq(pd.pd, &mut a) };
        if srq.is_null() {
            return Err(last_error("ibv_create_srq"));
        }
        Ok(Arc::new(Srq {
            srq,
            _pd: pd.clone(),
        }))
    }

    /// Whether this SRQ is the one at `addr` (an asynchronous event's).
    pub fn is(&self, addr: usize) -> bool {
        self.srq.addr() == addr
    }

    /// Its address, as an asynchronous event names it.
    pub fn addr(&self) -> usize {
        self.srq.addr()
    }

    /// Posts one receive of `sges` with `wr_id`.
    pub fn post_recv(&self, wr_id: u64, sges: &[Sge]) -> io::Result<()> {
        let mut wr = recv_wr(wr_id, sges);
        let mut bad = ptr::null_mut();
        // SAFETY: live SRQ; `wr` and `sges` live until the call returns.
        let rc = unsafe { sys::ibv_post_srq_recv(self.srq, &mut wr, &mut bad) };
        check(rc, "ibv_post_srq_recv")
    }
}

impl Drop for Srq {
    fn drop(&mut self) {
        // SAFETY: QPs attached hold an Arc of the SRQ, so none is left;
        // destroyed once.
        let rc = unsafe { sys::ibv_destroy_srq(self.srq) };
        if rc != 0 {
            log::warn!("ibv_destroy_srq: {}", io::Error::from_raw_os_error(rc));
        }
    }
}

/// The transport of a QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Transport {
    /// Reliable connection.
    Rc,
    /// Unreliable connection.
    Uc,
}

/// Where a connected QP's peer is.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Remote {
    pub qpn: u32,
    pub psn: u32,
    pub lid: u16,
    pub gid: [u8; 16],
    /// Use the GID (RoCE, or a routed IB fabric).
    pub global: bool,
}

/// One local data segment: laid out as `struct ibv_sge`, so that a list of
/// them is handed to the provider as it is (no copy per post).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Sge {
    pub addr: u64,
    pub len: u32,
    pub lkey: u32,
}

/// A scatter/gather list of at most `N` entries built on the stack
/// without clearing the entries it does not use (a send's list: 16
/// entries of 16 bytes zeroed per post otherwise).
pub(crate) struct SgeList<const N: usize> {
    buf: [std::mem::MaybeUninit<Sge>; N],
    len: usize,
}

impl<const N: usize> SgeList<N> {
    pub fn new() -> Self {
        SgeList {
            buf: [const { std::mem::MaybeUninit::uninit() }; N],
            len: 0,
        }
    }

    /// Appends `s` (panics when full: callers push at most `N`).
    pub fn push(&mut self, s: Sge) {
        self.buf[self.len].write(s);
        self.len += 1;
    }

    pub fn as_slice(&self) -> &[Sge] {
        // SAFETY: `push` wrote the first `len` entries.
        unsafe { std::slice::from_raw_parts(self.buf.as_ptr().cast::<Sge>(), self.len) }
    }
}

/// The local segments of a validated send as its scatter/gather list, on a
/// device whose local keys are the memory handles (`Verbs::keys_are_handles`):
/// a [`WrSeg`] is laid out as an [`Sge`] (asserted below), its handle where
/// the lkey goes, so the list is the request's own segments, not a copy.
pub(crate) fn sges_of(segs: &[WrSeg]) -> &[Sge] {
    // SAFETY: `WrSeg` and `Sge` have the same size, alignment and field
    // offsets (asserted below) and are plain integers: every bit pattern
    // of one is a valid other; the slice borrows `segs`.
    unsafe { std::slice::from_raw_parts(segs.as_ptr().cast::<Sge>(), segs.len()) }
}

const _: () = {
    assert!(size_of::<WrSeg>() == size_of::<Sge>());
    assert!(align_of::<WrSeg>() == align_of::<Sge>());
    assert!(std::mem::offset_of!(WrSeg, va) == std::mem::offset_of!(Sge, addr));
    assert!(std::mem::offset_of!(WrSeg, len) == std::mem::offset_of!(Sge, len));
    assert!(std::mem::offset_of!(WrSeg, handle) == std::mem::offset_of!(Sge, lkey));
    assert!(size_of::<Sge>() == size_of::<sys::ibv_sge>());
    assert!(align_of::<Sge>() == align_of::<sys::ibv_sge>());
    assert!(std::mem::offset_of!(Sge, addr) == std::mem::offset_of!(sys::ibv_sge, addr));
    assert!(std::mem::offset_of!(Sge, len) == std::mem::offset_of!(sys::ibv_sge, length));
    assert!(std::mem::offset_of!(Sge, lkey) == std::mem::offset_of!(sys::ibv_sge, lkey));
};

/// `sges` as the `sg_list` and `num_sge` of a work request (at most
/// [`MAX_SGE`] of them; the provider refuses more than the QP's limit).
/// The provider only reads the list (it copies it into its queue during
/// the post): the pointer is `*mut` because the C struct's is.
fn sg_list(sges: &[Sge]) -> (*mut sys::ibv_sge, i32) {
    // `Sge` and `ibv_sge` have the same layout (asserted above).
    (
        sges.as_ptr().cast::<sys::ibv_sge>().cast_mut(),
        sges.len().min(MAX_SGE) as i32,
    )
}

/// What a send work request does.
#[derive(Clone, Copy, Debug)]
pub(crate) enum SendOp {
    Send,
    Write { remote_va: u64, rkey: u32 },
    Read { remote_va: u64, rkey: u32 },
}

/// A send work request.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SendReq<'a> {
    pub wr_id: u64,
    pub op: SendOp,
    pub imm: Option<u32>,
    pub sges: &'a [Sge],
}

const MAX_SGE: usize = 16;

/// Fills work request `w` (zeroed) from `r`; its scatter list is `r`'s
/// (which must outlive the post).
fn fill_send(w: &mut sys::ibv_send_wr, r: &SendReq<'_>) {
    w.wr_id = r.wr_id;
    (w.sg_list, w.num_sge) = sg_list(r.sges);
    w.send_flags = sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
    w.opcode = match (r.op, r.imm.is_some()) {
        (SendOp::Send, false) => sys::ibv_wr_opcode::IBV_WR_SEND,
        (SendOp::Send, true) => sys::ibv_wr_opcode::IBV_WR_SEND_WITH_IMM,
        (SendOp::Write { .. }, false) => sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE,
        (SendOp::Write { .. }, true) => sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM,
        (SendOp::Read { .. }, _) => sys::ibv_wr_opcode::IBV_WR_RDMA_READ,
    };
    if let Some(i) = r.imm {
        w.imm_data_invalidated_rkey_union.imm_data = i.to_be();
    }
    if let SendOp::Write { remote_va, rkey } | SendOp::Read { remote_va, rkey } = r.op {
        w.wr.rdma = sys::rdma_t {
            remote_addr: remote_va,
            rkey,
        };
    }
}

/// A send opcode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Opcode(sys::ibv_wr_opcode::Type);

impl Opcode {
    pub const SEND: Opcode = Opcode(sys::ibv_wr_opcode::IBV_WR_SEND);
    pub const SEND_WITH_IMM: Opcode = Opcode(sys::ibv_wr_opcode::IBV_WR_SEND_WITH_IMM);
    pub const RDMA_WRITE: Opcode = Opcode(sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE);
    pub const RDMA_WRITE_WITH_IMM: Opcode = Opcode(sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM);
    pub const RDMA_READ: Opcode = Opcode(sys::ibv_wr_opcode::IBV_WR_RDMA_READ);
}

/// One send work request for [`Qp::post_send_one`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct OneReq {
    pub wr_id: u64,
    pub opcode: Opcode,
    /// Immediate data (host order), for the `WITH_IMM` opcodes.
    pub imm: u32,
    /// Remote address and key, for the RDMA opcodes.
    pub remote_va: u64,
    pub rkey: u32,
}

/// A queue pair.
pub(crate) struct Qp {
    qp: *mut sys::ibv_qp,
    /// Its number.
    pub qpn: u32,
    pub transport: Transport,
    _pd: Arc<Pd>,
    /// The entries reserved for its completions: of its send queue, and of
    /// its receive queue unless it takes receives from an SRQ.
    share: CqShare,
    /// With an SRQ: where its receives complete (the SRQ's CQ, which holds
    /// the entries for them).
    srq: Option<(Arc<Srq>, Arc<Cq>)>,
}

// SAFETY: see Context.
unsafe impl Send for Qp {}
// SAFETY: see Context.
unsafe impl Sync for Qp {}

impl Qp {
    /// Creates a QP of `transport` in `pd`, every send signalled, its
    /// completions on the CQ of `share` (which reserved the entries for
    /// them); its receives from `srq` when given (no receive queue of its
    /// own then), completing on the SRQ's CQ.
    pub fn new(
        pd: &Arc<Pd>,
        share: CqShare,
        transport: Transport,
        depth: u32,
        sges: u32,
        srq: Option<(&Arc<Srq>, &Arc<Cq>)>,
    ) -> io::Result<Qp> {
        // SAFETY: plain data; zero is valid for every field.
        let mut a: sys::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        a.send_cq = share.cq.cq;
        a.recv_cq = share.cq.cq;
        a.cap.max_send_wr = depth;
        a.cap.max_recv_wr = depth;
        a.cap.max_send_sge = sges;
        a.cap.max_recv_sge = sges;
        a.qp_type = match transport {
            Transport::Rc => sys::ibv_qp_type::IBV_QPT_RC,
            Transport::Uc => sys::ibv_qp_type::IBV_QPT_UC,
        };
        a.sq_sig_all = 1;
        if let Some((s, cq)) = srq {
            a.srq = s.srq;
            a.recv_cq = cq.cq;
            a.cap.max_recv_wr = 0;
            a.cap.max_recv_sge = 0;
        }
        // SAFETY: `pd`, the CQs and `srq` are live and kept alive by the QP.
        let qp = unsafe { sys::ibv_create_qp(pd.pd, &mut a) };
        if qp.is_null() {
            return Err(last_error("ibv_create_qp"));
        }
        // SAFETY: live QP.
        let qpn = unsafe { (*qp).qp_num };
        Ok(Qp {
            qp,
            qpn,
            transport,
            _pd: pd.clone(),
            share,
            srq: srq.map(|(s, cq)| (s.clone(), cq.clone())),
        })
    }

    /// Whether the QP's completions go to the CQ at `addr`.
    /// The CQs its sends and its receives complete on (the same but with
    /// an SRQ).
    pub fn cqs(&self) -> [&Arc<Cq>; 2] {
        let recv = self.srq.as_ref().map_or(&self.share.cq, |(_, cq)| cq);
        [&self.share.cq, recv]
    }

    pub fn completes_on(&self, addr: usize) -> bool {
        self.share.cq.is(addr) || self.srq.as_ref().is_some_and(|(_, cq)| cq.is(addr))
    }

    fn modify(&self, a: &mut sys::ibv_qp_attr, mask: u32, what: &str) -> io::Result<()> {
        // SAFETY: live QP; `a` valid for the call.
        check(unsafe { sys::ibv_modify_qp(self.qp, a, mask as i32) }, what)
    }

    /// RESET → INIT on `port` with the remote access `access` allows.
    pub fn init(&self, port: u8, access: u32) -> io::Result<()> {
        use sys::ibv_qp_attr_mask as m;
        // SAFETY: plain data.
        let mut a: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = sys::ibv_qp_state::IBV_QPS_INIT;
        a.port_num = port;
        a.pkey_index = 0;
        a.qp_access_flags = access;
        self.modify(
            &mut a,
            (m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_ACCESS_FLAGS).0,
            "modify QP to INIT",
        )
    }

    /// INIT → RTR → RTS towards `r`; `psn` is our first send PSN, `mtu` the
    /// path MTU code, `gid_index` the local GID of `port`.
    pub fn connect(
        &self,
        r: &Remote,
        psn: u32,
        mtu: u32,
        port: u8,
        gid_index: u8,
    ) -> io::Result<()> {
        use sys::ibv_qp_attr_mask as m;
        let rc = self.transport == Transport::Rc;
        // SAFETY: plain data.
        let mut a: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = sys::ibv_qp_state::IBV_QPS_RTR;
        a.path_mtu = mtu;
        a.dest_qp_num = r.qpn;
        a.rq_psn = r.psn;
        a.ah_attr.dlid = r.lid;
        a.ah_attr.port_num = port;
        if r.global {
            a.ah_attr.is_global = 1;
            a.ah_attr.grh.dgid = sys::ibv_gid { raw: r.gid };
            a.ah_attr.grh.sgid_index = gid_index;
            a.ah_attr.grh.hop_limit = 1;
        }
        let mut mask = m::IBV_QP_STATE
            | m::IBV_QP_AV
            | m::IBV_QP_PATH_MTU
            | m::IBV_QP_DEST_QPN
            | m::IBV_QP_RQ_PSN;
        if rc {
            a.max_dest_rd_atomic = 1;
            a.min_rnr_timer = 12;
            mask = mask | m::IBV_QP_MAX_DEST_RD_ATOMIC | m::IBV_QP_MIN_RNR_TIMER;
        }
        self.modify(&mut a, mask.0, "modify QP to RTR")?;
        failpoint!("verbs-connect-rts", |_| Err(io::Error::other(
            "fail point verbs-connect-rts"
        )));
        // SAFETY: plain data.
        let mut a: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = sys::ibv_qp_state::IBV_QPS_RTS;
        a.sq_psn = psn;
        let mut mask = m::IBV_QP_STATE | m::IBV_QP_SQ_PSN;
        if rc {
            a.timeout = 14;
            // Six retries, not seven: rxe reads 7 as "retry forever" (as
            // the spec does only for the RNR count), so a request whose
            // responder's QP went to ERROR silently (an RDMA read cut
            // short by a deregistration) would never complete.
            a.retry_cnt = 6;
            // VIA: a send that finds no receive descriptor on a reliable VI
            // breaks the connection; no RNR retry gives exactly that.
            a.rnr_retry = 0;
            a.max_rd_atomic = 1;
            mask = mask
                | m::IBV_QP_TIMEOUT
                | m::IBV_QP_RETRY_CNT
                | m::IBV_QP_RNR_RETRY
                | m::IBV_QP_MAX_QP_RD_ATOMIC;
        }
        self.modify(&mut a, mask.0, "modify QP to RTS")
    }

    /// Moves the QP to `state` (`IBV_QPS_ERR` or `IBV_QPS_RESET`).
    fn to_state(&self, state: u32, what: &str) -> io::Result<()> {
        // SAFETY: plain data.
        let mut a: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = state;
        self.modify(&mut a, sys::ibv_qp_attr_mask::IBV_QP_STATE.0, what)
    }

    /// To ERROR: outstanding work requests complete flushed.
    pub fn error(&self) -> io::Result<()> {
        self.to_state(sys::ibv_qp_state::IBV_QPS_ERR, "modify QP to ERR")
    }

    /// To RESET (after the flushes were taken), then INIT again.
    pub fn reset(&self, port: u8, access: u32) -> io::Result<()> {
        self.to_state(sys::ibv_qp_state::IBV_QPS_RESET, "modify QP to RESET")?;
        self.init(port, access)
    }

    /// Posts a chain of send requests with one doorbell (one
    /// `ibv_post_send`: the requests linked by `next`). The device reads
    /// and writes only memory of live MRs named by the keys.
    ///
    /// # Errors
    /// How many requests of the chain were posted before the first one the
    /// provider refused (those after it were not posted either), and why.
    /// Never inlined: the boundary the instruction counts of the post
    /// path are taken at (`tests/tests/verbs_bench.rs`).
    #[inline(never)]
    pub fn post_send(&self, reqs: &[SendReq<'_>]) -> Result<(), (usize, io::Error)> {
        if let [one] = reqs {
            // The common case without allocation.
            // SAFETY: plain data, zero is valid for every field.
            let mut wr: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
            fill_send(&mut wr, one);
            return self.post_chain(&mut wr, 1);
        }
        if reqs.is_empty() {
            return Ok(());
        }
        // A Vec not resized after linking: the pointers stay valid.
        // SAFETY: plain data, zero is valid for every field.
        let mut wrs: Vec<sys::ibv_send_wr> = (0..reqs.len())
            .map(|_| unsafe { std::mem::zeroed() })
            .collect();
        for (w, r) in wrs.iter_mut().zip(reqs) {
            fill_send(w, r);
        }
        let base = wrs.as_mut_ptr();
        for i in 1..reqs.len() {
            // SAFETY: `i < len`: both elements are in bounds of `wrs`, which
            // is neither moved nor borrowed otherwise until the post returns.
            unsafe { (*base.add(i - 1)).next = base.add(i) };
        }
        // SAFETY: `base` points to the first of `len` linked requests.
        self.post_chain(unsafe { &mut *base }, reqs.len())
    }

    /// Posts one signalled request: as [`Qp::post_send`] of one request,
    /// without its matching on the operation (the opcode is given), the
    /// immediate data and the RDMA address set unconditionally (the
    /// provider reads them only for the opcodes that have them).
    ///
    /// # Errors
    /// The provider's.
    #[inline]
    pub fn post_send_one(&self, r: &OneReq, sges: &[Sge]) -> io::Result<()> {
        // SAFETY: plain data, zero is valid for every field.
        let mut w: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
        w.send_flags = sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
        w.wr_id = r.wr_id;
        (w.sg_list, w.num_sge) = sg_list(sges);
        w.opcode = r.opcode.0;
        w.imm_data_invalidated_rkey_union.imm_data = r.imm.to_be();
        w.wr.rdma = sys::rdma_t {
            remote_addr: r.remote_va,
            rkey: r.rkey,
        };
        let mut bad = ptr::null_mut();
        // SAFETY: live QP; the request (`next` null) and its scatter list
        // live until the call returns (the provider copies them).
        let rc = unsafe { sys::ibv_post_send(self.qp, &mut w, &mut bad) };
        check(rc, "ibv_post_send")
    }

    /// Posts the chain that starts at `first` (`len` requests in one
    /// array, linked in order).
    fn post_chain(
        &self,
        first: &mut sys::ibv_send_wr,
        len: usize,
    ) -> Result<(), (usize, io::Error)> {
        let base: *mut sys::ibv_send_wr = first;
        let mut bad = ptr::null_mut();
        // SAFETY: live QP; the chain and its SGE lists live until the call
        // returns (the provider copies them into its queue).
        let rc = unsafe { sys::ibv_post_send(self.qp, base, &mut bad) };
        check(rc, "ibv_post_send").map_err(|e| {
            // `bad` is the first request not posted: an element of the
            // caller's array (or NULL from a provider that does not say).
            let posted = if bad.is_null() {
                0
            } else {
                (bad as usize).wrapping_sub(base as usize) / std::mem::size_of::<sys::ibv_send_wr>()
            };
            (posted.min(len), e)
        })
    }

    /// Posts one receive of `sges` with `wr_id` (never inlined, as
    /// `post_send`).
    #[inline(never)]
    pub fn post_recv(&self, wr_id: u64, sges: &[Sge]) -> io::Result<()> {
        let mut wr = recv_wr(wr_id, sges);
        let mut bad = ptr::null_mut();
        // SAFETY: live QP; `wr` and `sges` live until the call returns.
        let rc = unsafe { sys::ibv_post_recv(self.qp, &mut wr, &mut bad) };
        check(rc, "ibv_post_recv")
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: destroyed once; the PD, CQs and SRQ outlive it (fields,
        // dropped after this), and its CQ entries are given back after.
        let rc = unsafe { sys::ibv_destroy_qp(self.qp) };
        if rc != 0 {
            log::warn!("ibv_destroy_qp: {}", io::Error::from_raw_os_error(rc));
        }
    }
}

/// A receive work request of `sges` (at most [`MAX_SGE`]; they must
/// outlive the post), for `ibv_post_recv` and `ibv_post_srq_recv`.
fn recv_wr(wr_id: u64, sges: &[Sge]) -> sys::ibv_recv_wr {
    let (sg_list, num_sge) = sg_list(sges);
    sys::ibv_recv_wr {
        wr_id,
        next: ptr::null_mut(),
        sg_list,
        num_sge,
    }
}

/// `ibv_wc_status_str` of `status`.
pub(crate) fn status_str(status: u32) -> String {
    // SAFETY: returns a static string for any value.
    let p = unsafe { sys::ibv_wc_status_str(status) };
    if p.is_null() {
        return format!("status {status}");
    }
    // SAFETY: non-NULL static NUL-terminated string.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}
