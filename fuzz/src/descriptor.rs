//! `descriptor`: descriptor validation at post time, through the C ABI.
//!
//! Once per process: a real NIC (`VipOpenNic`, which starts a private viad),
//! two protection tags, one arena of [`PAGES`] pages of which three ranges
//! are registered, and for each reliability level two VIs (A sends, B
//! receives) connected to each other peer-to-peer in this process:
//!
//! | range | registration |
//! |---|---|
//! | page 0 | none (guard) |
//! | `R1` = page 1 + 256 .. page 9 - 256 | tag A, RDMA write and read; its first and last pages are only partly inside (they stay in place: cross-memory attach) |
//! | `R2` = pages 9..12 | tag A, no RDMA |
//! | `R3` = pages 12..14 | tag B (not the VIs' tag), RDMA write and read |
//! | pages 14..16 | none (guard; a deregistered handle pointed there) |
//!
//! Each input picks a level and up to [`MAX_OPS`] descriptors, receives
//! posted on B and sends / RDMA writes / RDMA reads posted on A, with
//! fuzzed placement (aligned or not, inside a region, another tag's, or
//! unregistered memory), post handle, control bits, `SegCount`, `Length`,
//! immediate data and segments (addresses in or around each range or raw,
//! live, dead, foreign or raw handles, any length). All descriptors are
//! written first, the arena is snapshotted, then each is posted
//! (`VipPostSend`/`VipPostRecv`) and every send waited for.
//!
//! Checked against a model of the documented rules (README "Behaviour"
//! table, `VipPostSend`'s return codes in `include/vipl.h`), re-read from
//! the bytes in memory right before each post:
//! * the post returns exactly the predicted code (`VIP_SUCCESS`,
//!   `VIP_INVALID_PARAMETER`, `VIP_INVALID_STATE`, `VIP_DESCRIPTOR_ERROR`);
//! * every accepted descriptor completes within [`WAIT_MS`] (no hang),
//!   is returned by `Vip*Wait`/`Vip*Done` in posting order, with a status
//!   that has `DONE`, the right operation bits, no reserved bits and only
//!   error bits documented for that operation; a descriptor with a local
//!   fault (bad segment handle, tag or bounds; `Length` not the sum of the
//!   segments or above `MaxTransferSize`; an RDMA operation on a receive)
//!   completes with exactly that fault, one posted on a VI in the error
//!   state with exactly `DESC_FLUSHED_ERROR`;
//! * no byte of the arena changes except the `ImmediateData`, `Length` and
//!   `Status` words of accepted descriptors, the segments of accepted
//!   receives and RDMA reads, and the part of `R1` an RDMA write names
//!   (guard bytes, in whole pages and beside `R1` in its partial pages);
//! * no panic anywhere (the hook aborts), no crash.
//!
//! After each input, receives still posted are flushed by disconnecting,
//! and a pair that broke (or was disconnected) is reconnected on next use.

use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::Mutex;

use via::descriptor::{control, status};
use via::ffi::types::*;
use via::ffi::*;

use crate::input::Input;

/// Pages in the arena.
pub const PAGES: usize = 16;
/// Descriptors per input at most.
pub const MAX_OPS: usize = 8;
/// Longest wait for one completion, in ms.
pub const WAIT_MS: VIP_ULONG = 5000;
/// MaxTransferSize of every VI.
pub const MTU: u32 = 8192;
/// Bytes between the descriptors of one input.
pub const DESC_STRIDE: u64 = 384;
/// Offset of the descriptor area in the arena (inside `R1`, whole pages).
pub const DESC_AREA: u64 = 2 * 4096;

const PAGE: u64 = 4096;

#[derive(Clone, Copy, Debug)]
struct Reg {
    handle: u32,
    start: u64,
    end: u64,
    tag: u8,
    rdma: bool,
}

impl Reg {
    fn covers(&self, va: u64, len: u64) -> bool {
        va >= self.start && va.checked_add(len).is_some_and(|e| e <= self.end)
    }
}

struct Pair {
    a: VIP_VI_HANDLE,
    b: VIP_VI_HANDLE,
    reliable: bool,
    connected: bool,
}

struct World {
    nic: VIP_NIC_HANDLE,
    base: u64,
    regs: [Reg; 3],
    dead: u32,
    pairs: Vec<Pair>,
    generation: u64,
}

// SAFETY: the handles are plain values the library checks on every call;
// the arena is owned by the world for the life of the process.
unsafe impl Send for World {}

static WORLD: Mutex<Option<World>> = Mutex::new(None);

fn ok(what: &str, r: VIP_RETURN) {
    assert_eq!(r, VIP_SUCCESS, "{what} failed");
}

fn ptag(nic: VIP_NIC_HANDLE) -> VIP_PROTECTION_HANDLE {
    let mut p = null_mut();
    // SAFETY: `p` is valid for writing one handle.
    ok("VipCreatePtag", unsafe { VipCreatePtag(nic, &mut p) });
    p
}

fn register(nic: VIP_NIC_HANDLE, va: u64, len: u64, tag: VIP_PROTECTION_HANDLE, rdma: bool) -> u32 {
    let mut at = VIP_MEM_ATTRIBUTES {
        Ptag: tag,
        EnableRdmaWrite: rdma as VIP_BOOLEAN,
        EnableRdmaRead: rdma as VIP_BOOLEAN,
    };
    let mut h = 0;
    // SAFETY: the range lies in the world's arena, mapped for the life of
    // the process; no other thread touches it during the call.
    ok("VipRegisterMem", unsafe {
        VipRegisterMem(nic, va as *mut c_void, len as VIP_ULONG, &mut at, &mut h)
    });
    h
}

fn create_vi(nic: VIP_NIC_HANDLE, level: u16, tag: VIP_PROTECTION_HANDLE) -> VIP_VI_HANDLE {
    let reliable = level != VIP_SERVICE_UNRELIABLE;
    let mut at = VIP_VI_ATTRIBUTES {
        ReliabilityLevel: level,
        MaxTransferSize: MTU as VIP_ULONG,
        QoS: null_mut(),
        Ptag: tag,
        EnableRdmaWrite: 1,
        EnableRdmaRead: reliable as VIP_BOOLEAN,
    };
    let mut v = null_mut();
    // SAFETY: both pointers are valid for one value.
    ok("VipCreateVi", unsafe {
        VipCreateVi(nic, &mut at, null_mut(), null_mut(), &mut v)
    });
    v
}

impl World {
    fn new() -> World {
        crate::abort_on_panic();
        crate::env::private_instance("desc");
        let mut nic = null_mut();
        // SAFETY: NULL name (the default NIC); `nic` valid for writing.
        ok("VipOpenNic", unsafe {
            VipOpenNic(std::ptr::null(), &mut nic)
        });
        // Breaks are expected by the thousand: report them to a handler that
        // ignores them rather than to the log.
        unsafe extern "C" fn quiet(_: VIP_PVOID, _: *mut VIP_ERROR_DESCRIPTOR) {}
        // SAFETY: `quiet` ignores its arguments and may run on any thread.
        ok("VipErrorCallback", unsafe {
            VipErrorCallback(nic, null_mut(), Some(quiet))
        });
        let (ta, tb) = (ptag(nic), ptag(nic));
        let len = PAGES * PAGE as usize;
        // SAFETY: a fresh anonymous private mapping, never unmapped.
        let p = unsafe {
            libc::mmap(
                null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED, "mmap");
        let base = p as u64;
        let r1 = (base + PAGE + 256, base + 9 * PAGE - 256);
        let r2 = (base + 9 * PAGE, base + 12 * PAGE);
        let r3 = (base + 12 * PAGE, base + 14 * PAGE);
        let regs = [
            Reg {
                handle: register(nic, r1.0, r1.1 - r1.0, ta, true),
                start: r1.0,
                end: r1.1,
                tag: 0,
                rdma: true,
            },
            Reg {
                handle: register(nic, r2.0, r2.1 - r2.0, ta, false),
                start: r2.0,
                end: r2.1,
                tag: 0,
                rdma: false,
            },
            Reg {
                handle: register(nic, r3.0, r3.1 - r3.0, tb, true),
                start: r3.0,
                end: r3.1,
                tag: 1,
                rdma: true,
            },
        ];
        let dead = register(nic, base + 14 * PAGE, PAGE, ta, false);
        // SAFETY: a handle this NIC returned, deregistered once.
        ok("VipDeregisterMem", unsafe {
            VipDeregisterMem(nic, (base + 14 * PAGE) as *mut c_void, dead)
        });
        let pairs = [
            VIP_SERVICE_UNRELIABLE,
            VIP_SERVICE_RELIABLE_DELIVERY,
            VIP_SERVICE_RELIABLE_RECEPTION,
        ]
        .iter()
        .map(|&l| Pair {
            a: create_vi(nic, l, ta),
            b: create_vi(nic, l, ta),
            reliable: l != VIP_SERVICE_UNRELIABLE,
            connected: false,
        })
        .collect();
        World {
            nic,
            base,
            regs,
            dead,
            pairs,
            generation: 0,
        }
    }

    fn live(&self, h: u32) -> Option<&Reg> {
        self.regs.iter().find(|r| r.handle == h)
    }

    fn in_arena(&self, va: u64, len: u64) -> bool {
        va >= self.base
            && va
                .checked_add(len)
                .is_some_and(|e| e <= self.base + PAGES as u64 * PAGE)
    }

    fn read(&self, va: u64, out: &mut [u8]) {
        assert!(self.in_arena(va, out.len() as u64));
        // SAFETY: inside the arena (checked), which stays mapped; nothing
        // else writes it while no descriptor is outstanding.
        unsafe { std::ptr::copy_nonoverlapping(va as *const u8, out.as_mut_ptr(), out.len()) }
    }

    fn write(&self, va: u64, b: &[u8]) {
        assert!(self.in_arena(va, b.len() as u64));
        // SAFETY: as in `read`.
        unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), va as *mut u8, b.len()) }
    }

    fn snapshot(&self) -> Vec<u8> {
        let mut v = vec![0u8; PAGES * PAGE as usize];
        self.read(self.base, &mut v);
        v
    }

    fn connect(&mut self, k: usize) {
        if self.pairs[k].connected {
            return;
        }
        self.generation += 1;
        let host = host_address(self.nic);
        let da = format!("fz{k}a{}", self.generation);
        let db = format!("fz{k}b{}", self.generation);
        let (mut la, mut lb) = (net_address(&host, &da), net_address(&host, &db));
        let p = &self.pairs[k];
        // SAFETY: the addresses are valid VIP_NET_ADDRESS buffers; the
        // attribute outputs are valid for one value each.
        unsafe {
            let (a, b) = (la.as_mut_ptr().cast(), lb.as_mut_ptr().cast());
            ok(
                "VipConnectPeerRequest",
                VipConnectPeerRequest(p.a, a, b, WAIT_MS),
            );
            ok(
                "VipConnectPeerRequest",
                VipConnectPeerRequest(p.b, b, a, WAIT_MS),
            );
            let mut at = std::mem::zeroed();
            ok("VipConnectPeerWait", VipConnectPeerWait(p.a, &mut at));
            ok("VipConnectPeerWait", VipConnectPeerWait(p.b, &mut at));
        }
        self.pairs[k].connected = true;
    }
}

fn host_address(nic: VIP_NIC_HANDLE) -> Vec<u8> {
    // SAFETY: `at` is valid for writing; LocalNicAddress points to
    // NicAddressLen bytes owned by the open NIC.
    unsafe {
        let mut at: VIP_NIC_ATTRIBUTES = std::mem::zeroed();
        ok("VipQueryNic", VipQueryNic(nic, &mut at));
        std::slice::from_raw_parts(at.LocalNicAddress, at.NicAddressLen as usize).to_vec()
    }
}

/// A `VIP_NET_ADDRESS` in a u64 buffer (for alignment).
fn net_address(host: &[u8], disc: &str) -> Vec<u64> {
    let mut b = Vec::new();
    b.extend_from_slice(&(host.len() as u16).to_ne_bytes());
    b.extend_from_slice(&(disc.len() as u16).to_ne_bytes());
    b.extend_from_slice(host);
    b.extend_from_slice(disc.as_bytes());
    let mut v = vec![0u64; b.len().div_ceil(8) + 1];
    // SAFETY: `v` holds at least `b.len()` bytes.
    unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), v.as_mut_ptr().cast::<u8>(), b.len()) };
    v
}

fn state(vi: VIP_VI_HANDLE) -> (VIP_VI_STATE, bool, bool) {
    // SAFETY: every output is valid for one value.
    unsafe {
        let (mut st, mut at, mut se, mut re) = (0, std::mem::zeroed(), 0, 0);
        ok(
            "VipQueryVi",
            VipQueryVi(vi, &mut st, &mut at, &mut se, &mut re),
        );
        (st, se != 0, re != 0)
    }
}

/// An address in or around one of the arena's ranges, or raw.
fn gen_addr(i: &mut Input, w: &World) -> u64 {
    let sel = i.u8();
    let off = i.u16() as i16 as i64;
    let r = &w.regs;
    let base = match sel % 10 {
        0 | 1 => r[0].start,
        2 => r[0].end,
        3 => r[1].start,
        4 => r[2].start,
        5 => w.base,
        6 => w.base + 14 * PAGE,
        7 => w.base + DESC_AREA,
        8 => 0,
        _ => return i.u64(),
    };
    base.wrapping_add_signed(off)
}

fn gen_handle(i: &mut Input, w: &World, natural: u32) -> u32 {
    let sel = i.u8();
    match sel % 10 {
        0..=3 => natural,
        4 => w.regs[0].handle,
        5 => w.regs[1].handle,
        6 => w.regs[2].handle,
        7 => w.dead,
        8 => 0,
        _ => i.u32(),
    }
}

/// The handle of the range holding `va`, else R1's.
fn natural(w: &World, va: u64) -> u32 {
    w.regs
        .iter()
        .find(|r| r.covers(va, 1))
        .map_or(w.regs[0].handle, |r| r.handle)
}

/// What one descriptor looks like in memory.
struct Desc {
    va: u64,
    bytes: Vec<u8>,
}

fn gen_desc(i: &mut Input, w: &World, k: usize) -> (Desc, u32) {
    let place = i.u8();
    let mis = i.u8() as u64 % 64;
    let slot = k as u64 * DESC_STRIDE;
    let mut va = match place % 8 {
        0..=4 => w.base + DESC_AREA + slot,
        5 => w.regs[1].start + slot,
        6 => w.regs[2].start + slot,
        _ => w.base + slot,
    };
    if place & 0x80 != 0 {
        va += mis;
    }
    if place & 0x40 != 0 && place % 8 == 7 {
        va = gen_addr(i, w);
    }
    let post_handle = gen_handle(i, w, natural(w, va));
    let csel = i.u8();
    let raw_control = i.u16();
    let control = if csel % 4 == 0 {
        raw_control
    } else {
        ((csel >> 2) & 3) as u16
            | if csel & 0x40 != 0 {
                control::IMMEDIATE
            } else {
                0
            }
            | if csel & 0x80 != 0 { control::QFENCE } else { 0 }
    };
    let nsel = i.u8();
    let seg_count = if nsel & 0x80 != 0 {
        i.u16()
    } else {
        (nsel % 18) as u16
    };
    let imm = i.u32();
    let lsel = i.u8();
    let raw_len = i.u32();
    let written = (seg_count as usize).min(17);
    let mut segs = Vec::new();
    for _ in 0..written {
        let addr = gen_addr(i, w);
        let handle = gen_handle(i, w, natural(w, addr));
        let len = if i.u8() & 0x80 != 0 {
            i.u32()
        } else {
            i.u16() as u32 % 4097
        };
        segs.push((addr, handle, len));
    }
    let rdma = control & control::OP_MASK != control::OP_SENDRECV;
    let sum: u64 = segs.iter().skip(rdma as usize).map(|s| s.2 as u64).sum();
    let length = match lsel % 4 {
        0 => raw_len,
        1 => (sum as u32).wrapping_add(raw_len % 3).wrapping_sub(1),
        _ => sum as u32,
    };
    let mut b = vec![0u8; 32 + written * 16];
    b[12..14].copy_from_slice(&seg_count.to_ne_bytes());
    b[14..16].copy_from_slice(&control.to_ne_bytes());
    b[20..24].copy_from_slice(&imm.to_ne_bytes());
    b[24..28].copy_from_slice(&length.to_ne_bytes());
    b[28..32].copy_from_slice(&0xffff_ffffu32.to_ne_bytes());
    for (j, (a, h, l)) in segs.iter().enumerate() {
        let o = 32 + j * 16;
        b[o..o + 8].copy_from_slice(&a.to_ne_bytes());
        b[o + 8..o + 12].copy_from_slice(&h.to_ne_bytes());
        b[o + 12..o + 16].copy_from_slice(&l.to_ne_bytes());
    }
    (Desc { va, bytes: b }, post_handle)
}

/// The model's reading of a descriptor in memory.
struct Model {
    ret: VIP_RETURN,
    op: u16,
    /// Local fault bits the completion must carry (when not flushed).
    fault: u32,
    /// Bytes the provider may write for this descriptor.
    writes: Vec<(u64, u64)>,
}

fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_ne_bytes(b[o..o + 2].try_into().unwrap())
}
fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_ne_bytes(b[o..o + 4].try_into().unwrap())
}
fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_ne_bytes(b[o..o + 8].try_into().unwrap())
}

fn model(w: &World, va: u64, handle: u32, send: bool, st: VIP_VI_STATE, reliable: bool) -> Model {
    let refuse = |ret| Model {
        ret,
        op: 0,
        fault: 0,
        writes: vec![],
    };
    if va == 0 {
        return refuse(VIP_INVALID_PARAMETER);
    }
    if va % 64 != 0 {
        return refuse(VIP_DESCRIPTOR_ERROR);
    }
    if send && (st == VIP_STATE_IDLE || st == VIP_STATE_CONNECT_PENDING) {
        return refuse(VIP_INVALID_STATE);
    }
    let Some(r) = w.live(handle) else {
        return refuse(VIP_INVALID_PARAMETER);
    };
    if !r.covers(va, 32) || r.tag != 0 {
        return refuse(VIP_DESCRIPTOR_ERROR);
    }
    let mut cs = [0u8; 32];
    w.read(va, &mut cs);
    let n = u16_at(&cs, 12) as usize;
    let control = u16_at(&cs, 14);
    let op = control & control::OP_MASK;
    if n > 16 || control & control::RESERVED != 0 || op == control::OP_RESERVED {
        return refuse(VIP_DESCRIPTOR_ERROR);
    }
    if !r.covers(va, 32 + 16 * n as u64) {
        return refuse(VIP_DESCRIPTOR_ERROR);
    }
    if send
        && ((op == control::OP_RDMAREAD && !reliable)
            || (op != control::OP_SENDRECV && n == 0)
            || (op == control::OP_RDMAREAD && control & control::IMMEDIATE != 0))
    {
        return refuse(VIP_DESCRIPTOR_ERROR);
    }
    let mut segs = vec![0u8; 16 * n];
    w.read(va + 32, &mut segs);
    let seg = |j: usize| {
        (
            u64_at(&segs, 16 * j),
            u32_at(&segs, 16 * j + 8),
            u32_at(&segs, 16 * j + 12),
        )
    };
    let first_local = (send && op != control::OP_SENDRECV) as usize;
    let mut fault = 0;
    let mut total = 0u64;
    let mut local = Vec::new();
    for j in first_local..n {
        let (a, h, l) = seg(j);
        total += l as u64;
        match w.live(h) {
            Some(r) if r.tag == 0 && r.covers(a, l as u64) => local.push((a, l as u64)),
            _ => fault |= status::PROTECTION_ERROR,
        }
    }
    let mut writes = vec![(va + 20, 12)];
    if send {
        if total > MTU as u64 || (op != control::OP_RDMAREAD && total != u32_at(&cs, 24) as u64) {
            fault |= status::LENGTH_ERROR;
        }
        if fault == 0 {
            match op {
                control::OP_RDMAREAD => writes.extend(local),
                control::OP_RDMAWRITE => {
                    let (ra, rh, _) = seg(0);
                    if w.live(rh)
                        .is_some_and(|r| r.tag == 0 && r.rdma && r.covers(ra, total))
                    {
                        writes.push((ra, total));
                    }
                }
                _ => {}
            }
        }
    } else {
        if op != control::OP_SENDRECV {
            fault |= status::FORMAT_ERROR;
        }
        if fault == 0 {
            writes.extend(local);
        }
    }
    Model {
        ret: VIP_SUCCESS,
        op,
        fault,
        writes,
    }
}

struct Posted {
    va: u64,
    send: bool,
    op: u16,
    /// The completion that must come (exact), if the model knows it.
    exact: Option<u32>,
    /// The control segment may be overwritten by data (status unchecked).
    clobbered: bool,
}

fn check_status(p: &Posted, st: u32, level: usize) {
    let what = if p.send { "send" } else { "receive" };
    assert_eq!(
        st & status::RESERVED,
        0,
        "{what} {:#x}: reserved status bits in {st:#x}",
        p.va
    );
    assert_ne!(
        st & status::DONE,
        0,
        "{what} {:#x}: completed without DONE: {st:#x}",
        p.va
    );
    if let Some(x) = p.exact {
        assert_eq!(st, x, "{what} {:#x}: status {st:#x}, expected {x:#x}", p.va);
        return;
    }
    let errs = st & status::ERROR_MASK;
    let op = st & status::OP_MASK;
    if p.send {
        let want = match p.op {
            control::OP_RDMAWRITE => status::OP_RDMA_WRITE,
            control::OP_RDMAREAD => status::OP_RDMA_READ,
            _ => status::OP_SEND,
        };
        assert_eq!(op, want, "send {:#x}: operation bits of {st:#x}", p.va);
        assert_eq!(
            st & status::IMMEDIATE,
            0,
            "send {:#x}: IMMEDIATE in {st:#x}",
            p.va
        );
        let allowed = match (p.op, level) {
            // Unreliable and reliable delivery: a send that is locally fine
            // completes DONE whatever happens at the receiver.
            (control::OP_SENDRECV, 0 | 1) => status::DESC_FLUSHED_ERROR,
            (control::OP_SENDRECV, _) => status::DESC_FLUSHED_ERROR | status::REMOTE_DESC_ERROR,
            (control::OP_RDMAWRITE, _) => {
                status::DESC_FLUSHED_ERROR | status::RDMA_PROT_ERROR | status::REMOTE_DESC_ERROR
            }
            _ => status::DESC_FLUSHED_ERROR | status::RDMA_PROT_ERROR,
        };
        assert_eq!(
            errs & !allowed,
            0,
            "send {:#x} (op {}, level {level}): status {st:#x}",
            p.va,
            p.op
        );
    } else {
        assert!(
            op == status::OP_RECEIVE || op == status::OP_REMOTE_RDMA_WRITE,
            "receive {:#x}: operation bits of {st:#x}",
            p.va
        );
        let allowed = status::PROTECTION_ERROR | status::LENGTH_ERROR | status::DESC_FLUSHED_ERROR;
        assert_eq!(errs & !allowed, 0, "receive {:#x}: status {st:#x}", p.va);
    }
}

fn overlaps(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.0.saturating_add(b.1) && b.0 < a.0.saturating_add(a.1)
}

/// Dequeues the next completion of `vi` (send or receive queue), waiting
/// at most [`WAIT_MS`]; its descriptor address.
fn wait(vi: VIP_VI_HANDLE, send: bool) -> Result<u64, VIP_RETURN> {
    let mut d: *mut VIP_DESCRIPTOR = null_mut();
    // SAFETY: `d` is valid for writing one pointer.
    let r = unsafe {
        if send {
            VipSendWait(vi, WAIT_MS, &mut d)
        } else {
            VipRecvWait(vi, WAIT_MS, &mut d)
        }
    };
    if r == VIP_SUCCESS {
        Ok(d as u64)
    } else {
        Err(r)
    }
}

fn done(vi: VIP_VI_HANDLE, send: bool) -> Result<u64, VIP_RETURN> {
    let mut d: *mut VIP_DESCRIPTOR = null_mut();
    // SAFETY: `d` is valid for writing one pointer.
    let r = unsafe {
        if send {
            VipSendDone(vi, &mut d)
        } else {
            VipRecvDone(vi, &mut d)
        }
    };
    if r == VIP_SUCCESS {
        Ok(d as u64)
    } else {
        Err(r)
    }
}

fn status_of(w: &World, va: u64) -> u32 {
    let mut b = [0u8; 4];
    w.read(va + 28, &mut b);
    u32::from_ne_bytes(b)
}

pub fn descriptor(data: &[u8]) {
    let mut g = WORLD.lock().unwrap_or_else(|e| e.into_inner());
    let w = g.get_or_insert_with(World::new);
    let mut i = Input(data);
    let level = i.u8() as usize % 3;
    w.connect(level);
    let (a, b, reliable) = {
        let p = &w.pairs[level];
        (p.a, p.b, p.reliable)
    };

    // Reset the arena to a known pattern, then write every descriptor.
    let pattern: Vec<u8> = (0..PAGES * PAGE as usize)
        .map(|k| (k as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3])
        .collect();
    w.write(w.base, &pattern);
    let mut plan = Vec::new();
    while !i.is_empty() && plan.len() < MAX_OPS {
        let send = i.u8() % 3 != 0;
        let (d, handle) = gen_desc(&mut i, w, plan.len());
        if w.in_arena(d.va, d.bytes.len() as u64) {
            w.write(d.va, &d.bytes);
        }
        plan.push((send, d.va, handle));
    }
    let before = w.snapshot();

    let mut allowed: Vec<(u64, u64)> = Vec::new();
    let mut data_writes: Vec<(u64, u64)> = Vec::new();
    let mut posted: Vec<Posted> = Vec::new();
    let mut recvs: Vec<usize> = Vec::new();
    let mut outstanding: Vec<(u64, Vec<(u64, u64)>)> = Vec::new();
    for &(send, va, handle) in &plan {
        let vi = if send { a } else { b };
        let (st, _, _) = state(vi);
        let m = model(w, va, handle, send, st, reliable);
        // VIA's rule for the application (this harness): the memory of a
        // posted descriptor is not touched until it is dequeued. A
        // descriptor that shares its control segment with a posted
        // receive, whose data would land on a posted receive's control
        // segment, or whose own control segment a posted receive's data
        // may land on, is not posted (receives stay posted to the end;
        // sends are dequeued before the next post).
        if m.ret == VIP_SUCCESS
            && outstanding
                .iter()
                .any(|(ova, ow): &(u64, Vec<(u64, u64)>)| {
                    overlaps((va, 32), (*ova, 32))
                        || m.writes[1..].iter().any(|&r| overlaps(r, (*ova, 32)))
                        || ow.iter().any(|&r| overlaps(r, (va, 32)))
                })
        {
            if trace() {
                eprintln!("skip {va:#x}: would overwrite a posted descriptor");
            }
            continue;
        }
        // SAFETY: the library reads the descriptor through its own mapping
        // of the region `handle` names (never through the pointer), and
        // checks that the region covers it.
        let r = unsafe {
            if send {
                VipPostSend(vi, va as *mut VIP_DESCRIPTOR, handle)
            } else {
                VipPostRecv(vi, va as *mut VIP_DESCRIPTOR, handle)
            }
        };
        assert_eq!(
            r,
            m.ret,
            "post {} of descriptor {va:#x} with handle {handle:#x} (VI state {st}): returned {r}, expected {}",
            if send { "send" } else { "receive" },
            m.ret
        );
        if trace() && w.in_arena(va, 32) {
            let mut cs = [0u8; 32];
            w.read(va, &mut cs);
            let n = (u16_at(&cs, 12) as usize).min(17);
            let mut segs = vec![0u8; 16 * n];
            if w.in_arena(va + 32, segs.len() as u64) {
                w.read(va + 32, &mut segs);
            }
            eprintln!(
                "  control {:#x} segs {} imm {:#x} length {}",
                u16_at(&cs, 14),
                u16_at(&cs, 12),
                u32_at(&cs, 20),
                u32_at(&cs, 24)
            );
            for j in 0..segs.len() / 16 {
                let a = u64_at(&segs, 16 * j);
                eprintln!(
                    "  seg {j}: {a:#x} (arena {:+#x}) handle {:#x} len {}",
                    a.wrapping_sub(w.base) as i64,
                    u32_at(&segs, 16 * j + 8),
                    u32_at(&segs, 16 * j + 12)
                );
            }
        }
        if trace() {
            eprintln!(
                "post {} {va:#x} handle {handle:#x} state {st}: {r} (op {}, fault {:#x})",
                if send { "send" } else { "recv" },
                m.op,
                m.fault
            );
        }
        if r != VIP_SUCCESS {
            continue;
        }
        allowed.extend(&m.writes);
        data_writes.extend(&m.writes[1..]);
        let exact = if st == VIP_STATE_ERROR && send {
            Some(status::DONE | status::DESC_FLUSHED_ERROR | send_op(m.op))
        } else if m.fault != 0 {
            Some(
                status::DONE
                    | m.fault
                    | if send {
                        send_op(m.op)
                    } else {
                        status::OP_RECEIVE
                    },
            )
        } else {
            None
        };
        posted.push(Posted {
            va,
            send,
            op: m.op,
            exact,
            clobbered: false,
        });
        if send {
            let got = wait(a, true).unwrap_or_else(|e| {
                panic!("send {va:#x}: no completion within {WAIT_MS} ms (returned {e})")
            });
            assert_eq!(got, va, "send completions out of order");
            // Checked now: once dequeued, the descriptor may be reused.
            let p = posted.last_mut().unwrap();
            p.clobbered = data_writes.iter().any(|&r| overlaps(r, (va + 20, 12)));
            if !p.clobbered {
                check_status(p, status_of(w, va), level);
            }
        } else {
            recvs.push(posted.len() - 1);
            outstanding.push((va, m.writes[1..].to_vec()));
        }
    }

    // Receives: those completed, in order; then flush the rest.
    let mut flushed = false;
    let mut got_recv = Vec::new();
    while let Ok(d) = done(b, false) {
        got_recv.push(d);
    }
    if got_recv.len() < recvs.len() {
        disconnect(w, level);
        flushed = true;
        while got_recv.len() < recvs.len() {
            match wait(b, false) {
                Ok(d) => got_recv.push(d),
                Err(e) => panic!(
                    "receive {:#x}: not flushed within {WAIT_MS} ms of a disconnect ({e})",
                    posted[recvs[got_recv.len()]].va
                ),
            }
        }
    }
    assert_eq!(
        done(b, false),
        Err(VIP_NOT_DONE),
        "more receive completions than receives"
    );
    assert_eq!(
        done(a, true),
        Err(VIP_NOT_DONE),
        "more send completions than sends"
    );
    for (k, &j) in recvs.iter().enumerate() {
        assert_eq!(
            got_recv[k], posted[j].va,
            "receive completions out of order"
        );
    }

    // Statuses (unless data landed on the control segment).
    for (k, p) in posted.iter().enumerate() {
        // Receives only (sends were checked when dequeued); skip one whose
        // status words data landed on, or whose memory another descriptor
        // reused while it was posted.
        let words = (p.va + 20, 12);
        if p.send
            || data_writes.iter().any(|&r| overlaps(r, words))
            || posted
                .iter()
                .enumerate()
                .any(|(j, q)| j != k && overlaps((q.va + 20, 12), words))
        {
            continue;
        }
        if flushed && !p.send && p.exact.is_none() {
            // A receive still posted at the disconnect: flushed, or
            // completed just before.
            let st = status_of(w, p.va);
            if st & status::DESC_FLUSHED_ERROR != 0 {
                assert_eq!(
                    st,
                    status::DONE | status::OP_RECEIVE | status::DESC_FLUSHED_ERROR,
                    "flushed receive {:#x}",
                    p.va
                );
                continue;
            }
        }
        if trace() {
            eprintln!("  {:#x}: status {:#x}", p.va, status_of(w, p.va));
        }
        check_status(p, status_of(w, p.va), level);
    }

    // Nothing written outside what the descriptors allow.
    let after = w.snapshot();
    for (k, (x, y)) in before.iter().zip(&after).enumerate() {
        if x != y {
            let va = w.base + k as u64;
            assert!(
                allowed.iter().any(|&r| overlaps(r, (va, 1))),
                "byte {va:#x} (arena offset {k:#x}) changed from {x:#x} to {y:#x}, \
                 outside every buffer the descriptors name"
            );
        }
    }

    // A pair that broke is taken down; queues must be empty.
    if !flushed {
        let (sa, ..) = state(a);
        let (sb, ..) = state(b);
        if sa != VIP_STATE_CONNECTED || sb != VIP_STATE_CONNECTED {
            disconnect(w, level);
        }
    }
    for vi in [a, b] {
        let (_, se, re) = state(vi);
        assert!(se && re, "a work queue is not empty after the input");
    }
}

/// `VIA_FUZZ_TRACE=1`: print each post and completion (for reading a
/// crash input).
fn trace() -> bool {
    static T: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *T.get_or_init(|| std::env::var_os("VIA_FUZZ_TRACE").is_some())
}

fn send_op(op: u16) -> u32 {
    match op {
        control::OP_RDMAWRITE => status::OP_RDMA_WRITE,
        control::OP_RDMAREAD => status::OP_RDMA_READ,
        _ => status::OP_SEND,
    }
}

/// Disconnects both VIs of pair `k` (whatever their state), dequeues what
/// the disconnect flushed, and marks the pair for reconnection.
fn disconnect(w: &mut World, k: usize) {
    let p = &mut w.pairs[k];
    for vi in [p.a, p.b] {
        // SAFETY: a live VI handle.
        let r = unsafe { VipDisconnect(vi) };
        assert!(
            r == VIP_SUCCESS || r == VIP_INVALID_STATE,
            "VipDisconnect returned {r}"
        );
    }
    for vi in [p.a, p.b] {
        let (st, ..) = state(vi);
        assert_eq!(st, VIP_STATE_IDLE, "a VI is not idle after VipDisconnect");
    }
    p.connected = false;
}
