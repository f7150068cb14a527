//! Translation of a user descriptor into a checked physical descriptor.
//!
//! At post time the descriptor is read from registered memory (through the
//! library's shadow mappings, never through the application's pointer) and
//! every segment is checked against the translation and protection table:
//! the handle is live and belongs to this NIC, the region's protection tag is
//! the VI's, the bytes lie inside the region. What the engine needs is then
//! fixed in a [`SendWr`] or a [`RecvWr`]; errors found here either refuse the
//! post (the descriptor itself is unusable) or become a completion status
//! (the NIC would have found them while processing it).
#![forbid(unsafe_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::completion::StatusLoc;
use crate::descriptor::{MAX_SEGMENTS as MAX_SEGS, SEGMENT_SIZE, control, offsets, status};
use crate::error::{Error, Result};
use crate::mem::region::Resolved;
use crate::regions::{RegionCache, RegionTable};
use crate::shm::mapping::Mapping;

/// One local data segment of a work request: `len` bytes at virtual address
/// `va` in the region of `handle` (checked at post time).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct WrSeg {
    /// Virtual address in the posting process.
    pub va: u64,
    /// Bytes.
    pub len: u32,
    /// Memory handle.
    pub handle: u32,
}

/// A validated send, RDMA write or RDMA read: what every kind of NIC gets
/// from `VipPostSend`. Integers only, without padding, so that a kind may
/// carry it by value through a shared ring (the soft NIC's doorbell).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SendWr {
    /// VI slot.
    pub vi: u32,
    /// VI generation.
    pub vi_gen: u32,
    /// `CS.Control` of the descriptor (operation and flags).
    pub control: u16,
    /// Local segments in use.
    pub seg_count: u16,
    /// Error status found at post time (0 = none): the device completes
    /// the descriptor with it, in order.
    pub fault: u32,
    /// Immediate data.
    pub imm: u32,
    /// Total bytes of the local segments.
    pub length: u32,
    /// Virtual address of the user descriptor.
    pub desc_va: u64,
    /// Memory handle covering the user descriptor.
    pub desc_handle: u32,
    /// Position of the descriptor in its VI's send queue.
    pub seq: u32,
    /// Remote address of an RDMA operation.
    pub remote_va: u64,
    /// Remote memory handle of an RDMA operation.
    pub remote_handle: u32,
    _pad: u32,
    /// Local segments.
    pub segs: [WrSeg; MAX_SEGS],
}

impl Default for SendWr {
    fn default() -> Self {
        SendWr {
            vi: 0,
            vi_gen: 0,
            control: 0,
            seg_count: 0,
            fault: 0,
            imm: 0,
            length: 0,
            desc_va: 0,
            desc_handle: 0,
            seq: 0,
            remote_va: 0,
            remote_handle: 0,
            _pad: 0,
            segs: [WrSeg::default(); MAX_SEGS],
        }
    }
}

impl SendWr {
    /// The operation (`control::OP_*`).
    pub fn op(&self) -> u16 {
        self.control & control::OP_MASK
    }

    /// The local segments.
    pub fn local(&self) -> &[WrSeg] {
        &self.segs[..(self.seg_count as usize).min(MAX_SEGS)]
    }
}

/// One data or address segment as read from the descriptor.
#[derive(Clone, Copy, Default)]
pub(crate) struct RawSeg {
    pub addr: u64,
    pub handle: u32,
    pub len: u32,
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_ne_bytes(b[i..i + 4].try_into().unwrap())
}

/// Reads the `n` segments of the descriptor at `va` by copy (they straddle
/// extents, or the region is reached by cross-memory attach).
#[cold]
fn read_segs(region: &Resolved, va: u64, n: usize, segs: &mut [RawSeg; MAX_SEGS]) -> Result<()> {
    let mut buf = [0u8; MAX_SEGS * SEGMENT_SIZE];
    region
        .read(va + offsets::SEGMENTS as u64, &mut buf[..n * SEGMENT_SIZE])
        .map_err(|_| Error::DescriptorError)?;
    for (i, s) in segs.iter_mut().enumerate().take(n) {
        let b = &buf[i * SEGMENT_SIZE..];
        *s = RawSeg {
            addr: u64::from_ne_bytes(b[0..8].try_into().unwrap()),
            handle: u32_at(b, 8),
            len: u32_at(b, 12),
        };
    }
    Ok(())
}

/// Refuses a segment count or control word no descriptor may have.
#[inline(always)]
fn check_head(n: usize, control: u16) -> Result<()> {
    if n > MAX_SEGS
        || control & control::RESERVED != 0
        || control & control::OP_MASK == control::OP_RESERVED
    {
        return Err(Error::DescriptorError);
    }
    Ok(())
}

/// What a post knows of the descriptor's region once its control segment
/// is read: the segments in the same region (the common layout) are
/// checked against it without a second lookup (its tag is the VI's: that
/// was checked first).
#[derive(Clone, Copy)]
struct DescRegion {
    handle: u32,
    va: u64,
    len: u64,
}

impl DescRegion {
    /// Whether `len` bytes at `addr` lie in the region.
    #[inline(always)]
    fn holds(&self, addr: u64, len: u32) -> bool {
        addr >= self.va
            && addr
                .checked_add(len as u64)
                .is_some_and(|e| e <= self.va + self.len)
    }
}

/// The control segment's words a post uses.
#[derive(Clone, Copy)]
struct Head {
    n: usize,
    control: u16,
    imm: u32,
    length: u32,
}

/// Where a descriptor's segments are copied when they cannot be read in
/// place (a work queue keeps one, untouched on the common path).
pub(crate) struct SegCopy([AtomicU64; 2 * MAX_SEGS]);

impl Default for SegCopy {
    fn default() -> Self {
        SegCopy(std::array::from_fn(|_| AtomicU64::new(0)))
    }
}

/// The arena extent a work queue's last descriptor was read from, with
/// what the checks need of its region: a post of the next descriptor in
/// the same extent (the common case: a program's descriptors sit in one
/// registered area) checks the handle, the region's change count, the tag,
/// the alignment and the bounds against it, and reads the descriptor's
/// words in place through one bounds check, without the region lookup
/// and extent search of [`locate_desc`]'s full path. Valid while the
/// table's change count for the handle is the one read before the region
/// was looked up (as [`RegionCache`] entries are).
#[derive(Default)]
pub(crate) struct DescCache {
    /// Memory handle (0: empty; never a region's).
    handle: u32,
    /// The table's change count for `handle` when filled.
    stamp: u64,
    /// The region's tag, first address and length.
    ptag: u32,
    va: u64,
    len: u64,
    /// The extent the descriptor was read from (`None`: empty).
    ext: Option<MappedExtent>,
    /// The region other than the descriptor's that the queue's segments
    /// lay in last.
    data: DataRegion,
}

/// The last region other than the descriptor's that a work queue's
/// segments lay in: a program's data buffers, registered apart from its
/// descriptors (a common layout). When a descriptor's other segments all
/// lie in it, they are checked against this entry inline, without the
/// out-of-line region cache lookups of [`check_others`] / [`recv_others`].
/// Valid while the table's change count for the handle is the one read
/// before the region was looked up (as [`RegionCache`] entries are), for
/// the tag it was checked against.
#[derive(Default)]
struct DataRegion {
    /// Memory handle (0: empty; never a region's).
    handle: u32,
    stamp: u64,
    ptag: u32,
    va: u64,
    len: u64,
    /// The mapped extent of the region that held the address it was
    /// filled for (`None`: not in one mapped extent), so that a device
    /// running a one-segment send at once finds its bytes here.
    ext: Option<MappedExtent>,
}

/// The part of one arena extent of a region that is mapped and inside the
/// region: `ext_va..ext_end`, at `map_off` in `map`.
struct MappedExtent {
    map: Arc<Mapping>,
    map_off: usize,
    ext_va: u64,
    ext_end: u64,
}

impl MappedExtent {
    /// The extent of `region` holding `va`, if it is mapped.
    fn of(region: &Resolved, va: u64) -> Option<MappedExtent> {
        let e = region
            .extents
            .iter()
            .find(|e| va >= e.va && va - e.va < e.len)?;
        let (m, off) = (e.map.as_ref()?, usize::try_from(e.map_off).ok()?);
        // What of the extent is mapped (the mapping may end first), and
        // inside the region (an extent may be wider).
        let mapped = (m.len().saturating_sub(off) as u64).min(e.len);
        let first = e.va.max(region.va);
        let end = (e.va + mapped).min(region.va + region.len);
        (first < end).then(|| MappedExtent {
            map: m.clone(),
            map_off: off + (first - e.va) as usize,
            ext_va: first,
            ext_end: end,
        })
    }

    /// Where `len` bytes at `va` are, if they lie in the extent: the
    /// mapping and the offset in it.
    #[inline(always)]
    fn place(&self, va: u64, len: u64) -> Option<(&Mapping, usize)> {
        if va < self.ext_va || va > self.ext_end || self.ext_end - va < len {
            return None;
        }
        Some((&self.map, self.map_off + (va - self.ext_va) as usize))
    }
}

impl DataRegion {
    /// The region, if the entry holds one and it is current for `ptag`.
    #[inline(always)]
    fn current(&self, table: &RegionTable, ptag: u32) -> Option<DescRegion> {
        (self.handle != 0 && self.ptag == ptag && table.changes(self.handle) == self.stamp)
            .then_some(DescRegion {
                handle: self.handle,
                va: self.va,
                len: self.len,
            })
    }

    /// The entry as a post of a VI of tag `ptag` checks segments against
    /// it.
    #[inline(always)]
    fn check<'a>(&'a self, table: &'a RegionTable, ptag: u32) -> DataCheck<'a> {
        DataCheck {
            data: self,
            table,
            ptag,
        }
    }
}

/// The queue's data region as a post checks its segments against it.
#[derive(Clone, Copy)]
struct DataCheck<'a> {
    data: &'a DataRegion,
    table: &'a RegionTable,
    ptag: u32,
}

impl DataCheck<'_> {
    /// The data region if segments of `handle` are checked against it:
    /// the table's change count is read only for a segment of its handle.
    #[inline(always)]
    fn region(self, handle: u32) -> Option<DescRegion> {
        if handle != self.data.handle {
            return None;
        }
        self.data.current(self.table, self.ptag)
    }
}

impl DescCache {
    /// The control segment of the descriptor at `va`, and its offset in
    /// the cached mapping, if it lies with its segments in the cached
    /// extent of `handle` and the entry is current (`None`: take the full
    /// path, which gives the same answers and refills the entry).
    #[inline(always)]
    fn head(
        &self,
        table: &RegionTable,
        va: u64,
        handle: u32,
        ptag: u32,
    ) -> Option<Result<(Head, usize, &[AtomicU64])>> {
        let x = self.ext.as_ref()?;
        if handle != self.handle
            || ptag != self.ptag
            || va % crate::descriptor::ALIGNMENT as u64 != 0
            || va < x.ext_va
            || va >= x.ext_end
            || table.changes(handle) != self.stamp
        {
            return None;
        }
        // Everything from `va` to the end of the mapped extent, at most a
        // full descriptor: one bounds check for the header and segments.
        let room = (((x.ext_end - va) / 8) as usize).min(4 + 2 * MAX_SEGS);
        let at = x.map_off + (va - x.ext_va) as usize;
        let words = x.map.slice::<AtomicU64>(at, room)?;
        if room < 4 {
            return None;
        }
        let (w1, w2, w3) = (
            words[1].load(Ordering::Relaxed),
            words[2].load(Ordering::Relaxed),
            words[3].load(Ordering::Relaxed),
        );
        // Bytes 12..16: SegCount, Control; 20..24 ImmediateData; 24..28
        // Length.
        let h = if cfg!(target_endian = "little") {
            Head {
                n: (w1 >> 32) as u16 as usize,
                control: (w1 >> 48) as u16,
                imm: (w2 >> 32) as u32,
                length: w3 as u32,
            }
        } else {
            Head {
                n: (w1 >> 16) as u16 as usize,
                control: w1 as u16,
                imm: w2 as u32,
                length: (w3 >> 32) as u32,
            }
        };
        if let Err(e) = check_head(h.n, h.control) {
            return Some(Err(e));
        }
        // The segments, from the words already checked against the
        // mapping (no second bounds and alignment test).
        let segs = words.get(4..4 + 2 * h.n)?;
        Some(Ok((h, at, segs)))
    }

    /// Where `len` bytes at `va` in the region of `handle` are, if they lie
    /// in the cached extent: the mapping and the offset in it. Only right
    /// after a descriptor of `handle` was read through this entry (which
    /// checked, or refilled, it against the table's change count).
    #[inline(always)]
    fn place(&self, handle: u32, va: u64, len: u64) -> Option<(&Mapping, usize)> {
        let x = self.ext.as_ref()?;
        if handle != self.handle || va < x.ext_va || va > x.ext_end || x.ext_end - va < len {
            return None;
        }
        Some((&x.map, x.map_off + (va - x.ext_va) as usize))
    }

    /// [`DescCache::place`] in the data region: only right after the
    /// segments of a descriptor were checked against it (which checked, or
    /// refilled, it against the table's change count). Out of line: inlined,
    /// its result merged with [`DescCache::place`]'s and cost the common
    /// layout (data in the descriptor's region) five instructions a send.
    #[inline(never)]
    fn data_place(&self, handle: u32, va: u64, len: u64) -> Option<(&Mapping, usize)> {
        if handle != self.data.handle {
            return None;
        }
        self.data.ext.as_ref()?.place(va, len)
    }

    /// Fills the entry with the extent of `region` holding `va`, the
    /// region looked up after the table's change count was `stamp`.
    #[cold]
    fn fill(&mut self, region: &Resolved, va: u64, stamp: u64) {
        self.ext = MappedExtent::of(region, va);
        self.handle = region.handle;
        self.stamp = stamp;
        self.ptag = region.ptag;
        self.va = region.va;
        self.len = region.len;
    }
}

/// Locates the descriptor at `va` in the region of `handle`, checks it
/// against the VI's tag `ptag`, reads its control segment and resolves its
/// status location into `status`; and runs `read` on its head, its region
/// and its segments as 64-bit words, two per segment. A descriptor in the
/// extent of the previous one takes [`DescCache::head`]; otherwise the
/// cache resolves the region ([`locate_full`]). `read` is inlined into
/// both paths, so that the common one hands it what it found in
/// registers rather than through a merged result on the stack.
///
/// # Errors
/// `InvalidParameter` for a dead or foreign handle; `DescriptorError` for a
/// misaligned descriptor, one outside the region or of another protection
/// tag, more than [`MAX_SEGS`] segments, or a reserved control bit or
/// operation; and `read`'s.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn with_desc<R>(
    table: &RegionTable,
    cache: &mut RegionCache,
    descs: &mut DescCache,
    va: u64,
    handle: u32,
    ptag: u32,
    status: &mut StatusLoc,
    copy: &mut SegCopy,
    read: impl FnOnce(Head, DescRegion, Segs<'_>, &DataRegion) -> Result<R>,
) -> Result<R> {
    match descs.head(table, va, handle, ptag) {
        Some(Ok((h, at, segs))) => {
            // `head` found the words in the mapping: this cannot fail.
            let m = descs.ext.as_ref().ok_or(Error::DescriptorError)?;
            if !status.set_map(&m.map, at) {
                return Err(Error::DescriptorError);
            }
            let dr = DescRegion {
                handle,
                va: descs.va,
                len: descs.len,
            };
            read(h, dr, Segs(segs), &descs.data)
        }
        Some(Err(e)) => Err(e),
        None => {
            let (h, dr, segs) = locate_full(table, cache, descs, va, handle, ptag, status, copy)?;
            read(h, dr, segs, &descs.data)
        }
    }
}

/// [`with_desc`] through the region cache; refills `descs`.
#[inline(never)]
#[allow(clippy::too_many_arguments)]
fn locate_full<'a>(
    table: &RegionTable,
    cache: &'a mut RegionCache,
    descs: &mut DescCache,
    va: u64,
    handle: u32,
    ptag: u32,
    status: &mut StatusLoc,
    copy: &'a mut SegCopy,
) -> Result<(Head, DescRegion, Segs<'a>)> {
    let stamp = table.changes(handle);
    let region: &'a Resolved = cache.get(table, handle).ok_or(Error::InvalidParameter)?;
    if va % crate::descriptor::ALIGNMENT as u64 != 0
        || region.ptag != ptag
        || !region.covers(va, 32)
    {
        return Err(Error::DescriptorError);
    }
    descs.fill(region, va, stamp);
    let dr = DescRegion {
        handle,
        va: region.va,
        len: region.len,
    };
    let Some((m, at, room)) = region.locate(va, 32) else {
        return locate_cold(region, va, dr, status, copy);
    };
    let head = m.slice::<AtomicU32>(at, 8).ok_or(Error::DescriptorError)?;
    let word = |o: usize| head[o / 4].load(Ordering::Relaxed);
    let w = word(offsets::SEG_COUNT);
    let (first, second) = if cfg!(target_endian = "little") {
        (w as u16, (w >> 16) as u16)
    } else {
        ((w >> 16) as u16, w as u16)
    };
    let h = Head {
        n: first as usize,
        control: second,
        imm: word(offsets::IMMEDIATE_DATA),
        length: word(offsets::LENGTH),
    };
    check_head(h.n, h.control)?;
    let end = (offsets::SEGMENTS + h.n * SEGMENT_SIZE) as u64;
    if !region.covers(va, end) {
        return Err(Error::DescriptorError);
    }
    if room < end {
        return locate_cold(region, va, dr, status, copy);
    }
    let words = m
        .slice::<AtomicU64>(at + offsets::SEGMENTS, 2 * h.n)
        .ok_or(Error::DescriptorError)?;
    if !status.set_map(m, at) {
        return Err(Error::DescriptorError);
    }
    Ok((h, dr, Segs(words)))
}

/// The segments of a descriptor as 64-bit words, two per segment (the
/// descriptor's memory, or a copy of it).
#[derive(Clone, Copy)]
struct Segs<'a>(&'a [AtomicU64]);

impl Segs<'_> {
    /// Segment `i` (in bounds: the count was checked).
    #[inline(always)]
    fn get(self, i: usize) -> RawSeg {
        let hl = self.0[2 * i + 1].load(Ordering::Relaxed);
        // Bytes 8..12 of a segment: its handle; 12..16: its length.
        let (handle, len) = if cfg!(target_endian = "little") {
            (hl as u32, (hl >> 32) as u32)
        } else {
            ((hl >> 32) as u32, hl as u32)
        };
        RawSeg {
            addr: self.0[2 * i].load(Ordering::Relaxed),
            handle,
            len,
        }
    }
}

/// [`with_desc`] for a descriptor read by copy (it straddles extents,
/// or the region is reached by cross-memory attach).
#[cold]
fn locate_cold<'a>(
    region: &Resolved,
    va: u64,
    dr: DescRegion,
    status: &mut StatusLoc,
    copy: &'a mut SegCopy,
) -> Result<(Head, DescRegion, Segs<'a>)> {
    let mut cs = [0u8; 32];
    region
        .read(va, &mut cs)
        .map_err(|_| Error::DescriptorError)?;
    let at = |o: usize| [cs[o], cs[o + 1]];
    let h = Head {
        n: u16::from_ne_bytes(at(offsets::SEG_COUNT)) as usize,
        control: u16::from_ne_bytes(at(offsets::CONTROL)),
        imm: u32_at(&cs, offsets::IMMEDIATE_DATA),
        length: u32_at(&cs, offsets::LENGTH),
    };
    check_head(h.n, h.control)?;
    let end = offsets::SEGMENTS + h.n * SEGMENT_SIZE;
    if !region.covers(va, end as u64) {
        return Err(Error::DescriptorError);
    }
    let mut segs = [RawSeg::default(); MAX_SEGS];
    read_segs(region, va, h.n, &mut segs)?;
    for (w, s) in copy.0.chunks_exact_mut(2).zip(&segs[..h.n]) {
        *w[0].get_mut() = s.addr;
        // As the descriptor's memory holds them (`Segs::get`).
        *w[1].get_mut() = u64::from_ne_bytes(
            [s.handle.to_ne_bytes(), s.len.to_ne_bytes()]
                .concat()
                .try_into()
                .unwrap(),
        );
    }
    *status = StatusLoc::of(region, va);
    Ok((h, dr, Segs(&copy.0[..2 * h.n])))
}

/// Reads the send, RDMA write or RDMA read descriptor at `va` (in the
/// region of `cx.desc_handle`) straight into the work request `wr`,
/// checking each segment as it goes, and resolves its status location into
/// `status`: the descriptor read and the request built in one pass, with
/// no copy of the descriptor in between. Problems the NIC would
/// report in the status become `wr.fault`.
///
/// # Errors
/// `InvalidParameter` for a dead or foreign handle; `DescriptorError` for a
/// descriptor [`with_desc`] refuses, an RDMA descriptor without address
/// segment, RDMA read with immediate data, or RDMA read on an unreliable
/// VI.
#[inline(always)]
pub(crate) fn read_send(
    table: &RegionTable,
    cache: &mut RegionCache,
    descs: &mut DescCache,
    cx: &SendCtx,
    wr: &mut SendWr,
    status: &mut StatusLoc,
    copy: &mut SegCopy,
) -> Result<()> {
    let others = with_desc(
        table,
        cache,
        descs,
        cx.desc_va,
        cx.desc_handle,
        cx.ptag,
        status,
        copy,
        #[inline(always)]
        |h, dr, seg, data| fill_send(cx, wr, h, dr, seg, data.check(table, cx.ptag)),
    )?;
    if others {
        check_others(table, cache, &mut descs.data, cx.ptag, wr);
    }
    Ok(())
}

/// [`read_send`] once the descriptor is found: its words into `wr`, each
/// segment in the descriptor's region or in the queue's data region
/// checked. True if a segment lies in neither (to be checked by the
/// caller).
#[inline(always)]
fn fill_send(
    cx: &SendCtx,
    wr: &mut SendWr,
    h: Head,
    dr: DescRegion,
    seg: Segs<'_>,
    data: DataCheck<'_>,
) -> Result<bool> {
    let op = h.control & control::OP_MASK;
    let first = if op == control::OP_SENDRECV {
        0
    } else {
        // RDMA: the address segment comes first.
        if h.n == 0
            || (op == control::OP_RDMAREAD && (!cx.reliable || h.control & control::IMMEDIATE != 0))
        {
            return Err(Error::DescriptorError);
        }
        let a = seg.get(0);
        wr.remote_va = a.addr;
        wr.remote_handle = a.handle;
        1
    };
    wr.vi = cx.vi.0;
    wr.vi_gen = cx.vi.1 as u32;
    wr.control = h.control;
    wr.imm = h.imm;
    wr.desc_va = cx.desc_va;
    wr.desc_handle = cx.desc_handle;
    wr.seq = cx.seq;
    let mut fault = 0;
    let mut others = false;
    let mut total: u64 = 0;
    for (i, d) in (first..h.n).zip(wr.segs.iter_mut()) {
        let s = seg.get(i);
        if s.handle == dr.handle {
            if !dr.holds(s.addr, s.len) {
                fault = status::PROTECTION_ERROR;
            }
        } else if let Some(r) = data.region(s.handle) {
            if !r.holds(s.addr, s.len) {
                fault = status::PROTECTION_ERROR;
            }
        } else {
            others = true;
        }
        *d = WrSeg {
            va: s.addr,
            len: s.len,
            handle: s.handle,
        };
        total += s.len as u64;
    }
    wr.seg_count = (h.n - first) as u16;
    if total > cx.mtu as u64 || (op != control::OP_RDMAREAD && total != h.length as u64) {
        fault |= status::LENGTH_ERROR;
    }
    wr.fault = fault;
    wr.length = total.min(u32::MAX as u64) as u32;
    Ok(others)
}

/// Checks the segments of `wr` in other regions than its descriptor's
/// (the descriptor's own region was checked while reading; a segment in
/// the data region is checked again here, to the same answer); the last
/// region found becomes the queue's data region `data`.
#[cold]
fn check_others(
    table: &RegionTable,
    cache: &mut RegionCache,
    data: &mut DataRegion,
    ptag: u32,
    wr: &mut SendWr,
) {
    let n = (wr.seg_count as usize).min(MAX_SEGS);
    for s in &wr.segs[..n] {
        if s.handle != wr.desc_handle
            && other_base(table, cache, data, ptag, s.handle, s.va, s.len).is_none()
        {
            wr.fault |= status::PROTECTION_ERROR;
        }
    }
}

/// The first address of the region of `handle` if `len` bytes at `addr`
/// lie in it and its tag is `ptag`. A region of tag `ptag` becomes the
/// queue's data region `data`.
#[inline(never)]
fn other_base(
    table: &RegionTable,
    cache: &mut RegionCache,
    data: &mut DataRegion,
    ptag: u32,
    handle: u32,
    addr: u64,
    len: u32,
) -> Option<u64> {
    // Read before the lookup: a change after it makes the entry stale.
    let stamp = table.changes(handle);
    let r = cache.get(table, handle).filter(|r| r.ptag == ptag);
    let Some(r) = r else {
        // The entry no longer answers for this handle (nor offers its
        // extent to `DescCache::data_place`).
        if data.handle == handle {
            *data = DataRegion::default();
        }
        return None;
    };
    // The extent is kept when it is the region's at the same change count
    // and holds `addr` (no reference count change per post).
    let ext = match data.ext.take() {
        Some(x) if data.handle == handle && data.stamp == stamp && x.place(addr, 0).is_some() => {
            Some(x)
        }
        _ => MappedExtent::of(r, addr),
    };
    *data = DataRegion {
        handle,
        stamp,
        ptag,
        va: r.va,
        len: r.len,
        ext,
    };
    let inside = addr >= r.va
        && addr
            .checked_add(len as u64)
            .is_some_and(|e| e <= r.va + r.len);
    inside.then_some(r.va)
}

/// Reads the receive descriptor at `desc_va` (in the region of `handle`)
/// straight into the work request `pd`, checking each segment as it goes,
/// and resolves its status location into `status`, in one pass. A bad
/// segment or operation becomes `pd.fault`
/// (the receive then completes at once; its segments do not matter).
///
/// # Errors
/// As [`with_desc`].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn read_recv(
    table: &RegionTable,
    cache: &mut RegionCache,
    descs: &mut DescCache,
    desc_va: u64,
    handle: u32,
    ptag: u32,
    pd: &mut RecvWr,
    status: &mut StatusLoc,
    copy: &mut SegCopy,
) -> Result<()> {
    let others = with_desc(
        table,
        cache,
        descs,
        desc_va,
        handle,
        ptag,
        status,
        copy,
        #[inline(always)]
        |h, dr, seg, data| {
            Ok(fill_recv(
                desc_va,
                handle,
                pd,
                h,
                dr,
                seg,
                data.check(table, ptag),
            ))
        },
    )?;
    if others {
        recv_others(table, cache, &mut descs.data, ptag, pd);
    }
    Ok(())
}

/// [`read_recv`] once the descriptor is found: its segments into `pd`,
/// those in the descriptor's region or in the queue's data region checked
/// and made offsets (`pd.data_handle` names the data region if a segment
/// was in it, else is 0). True if a segment lies in neither (to be checked
/// by the caller).
#[inline(always)]
fn fill_recv(
    desc_va: u64,
    handle: u32,
    pd: &mut RecvWr,
    h: Head,
    dr: DescRegion,
    seg: Segs<'_>,
    data: DataCheck<'_>,
) -> bool {
    pd.desc_off = desc_va - dr.va;
    pd.desc_base = dr.va;
    pd.desc_handle = handle;
    pd.data_handle = 0;
    let mut fault = if h.control & control::OP_MASK != control::OP_SENDRECV {
        status::FORMAT_ERROR
    } else {
        0
    };
    let mut others = false;
    for (i, d) in pd.segs.iter_mut().enumerate().take(h.n) {
        let s = seg.get(i);
        if s.handle == dr.handle {
            if !dr.holds(s.addr, s.len) {
                fault |= status::PROTECTION_ERROR;
            }
            *d = (s.addr.wrapping_sub(dr.va), s.len, s.handle);
        } else if let Some(r) = data.region(s.handle) {
            if !r.holds(s.addr, s.len) {
                fault |= status::PROTECTION_ERROR;
            }
            *d = (s.addr.wrapping_sub(r.va), s.len, s.handle);
            pd.data_handle = r.handle;
            pd.data_base = r.va;
        } else {
            others = true;
            // The address until `recv_others` makes it an offset.
            *d = (s.addr, s.len, s.handle);
        }
    }
    pd.n = h.n;
    pd.fault = fault;
    others
}

/// Checks the segments of `pd` in other regions than its descriptor's and
/// its data region (whose segments are offsets already) and turns their
/// addresses into offsets; the last region found becomes the queue's data
/// region `data`.
#[cold]
fn recv_others(
    table: &RegionTable,
    cache: &mut RegionCache,
    data: &mut DataRegion,
    ptag: u32,
    pd: &mut RecvWr,
) {
    let n = pd.n.min(MAX_SEGS);
    let handle = pd.desc_handle;
    let converted = std::mem::take(&mut pd.data_handle);
    for s in &mut pd.segs[..n] {
        if s.2 == handle || (s.2 == converted && converted != 0) {
            continue;
        }
        match other_base(table, cache, data, ptag, s.2, s.0, s.1) {
            Some(base) => s.0 -= base,
            None => pd.fault |= status::PROTECTION_ERROR,
        }
    }
}

/// What translation found while reading a request into the send queue:
/// the queue's region cache (the regions of segments outside the
/// descriptor's region, just validated), the extent the descriptor was
/// read from, and where its status goes. A device that runs the request
/// at once takes [`WrRegions`] from it.
#[derive(Clone, Copy)]
pub(crate) struct Translated<'a> {
    pub cache: &'a RegionCache,
    pub descs: &'a DescCache,
    pub status: &'a StatusLoc,
}

/// What a device that runs a request at once need not look up again.
#[derive(Clone, Copy, Default)]
pub(crate) struct WrRegions<'a> {
    /// The bytes of a send's one data segment: the mapping and the offset
    /// in it (`None`: another shape, or not in one mapped extent).
    pub src: Option<(&'a Mapping, usize)>,
    /// Where the descriptor's status is written (found by [`read_send`]).
    pub status: Option<&'a StatusLoc>,
}

impl<'a> WrRegions<'a> {
    /// What `t` holds for `wr`, just translated. The common layout (data
    /// in the descriptor's own region, in the extent the descriptor was
    /// read from) costs no lookup at all; a segment elsewhere is found in
    /// the cache, which validated it while translating: directly, or
    /// through the queue's data region, which is current only at the
    /// change count the cache validated its region at (it is filled right
    /// after the cache's lookup; an entry the cache dropped since is not
    /// found, and the device looks the region up itself).
    #[inline(always)]
    pub fn of(wr: &SendWr, t: Translated<'a>) -> WrRegions<'a> {
        let src = match wr.local() {
            // A send's or an RDMA write's source (the two opcodes below
            // OP_RDMAREAD): one comparison on the path of every send.
            [s] if wr.op() < control::OP_RDMAREAD => {
                let len = s.len as u64;
                t.descs
                    .place(s.handle, s.va, len)
                    .or_else(|| t.descs.data_place(s.handle, s.va, len))
                    .or_else(|| t.cache.peek(s.handle).and_then(|r| r.span(s.va, len)))
            }
            _ => None,
        };
        WrRegions {
            src,
            status: Some(t.status),
        }
    }
}

/// What [`read_send`] needs to know about the VI and the post.
pub(crate) struct SendCtx {
    pub vi: (u32, u16),
    pub ptag: u32,
    pub mtu: u32,
    pub reliable: bool,
    pub desc_va: u64,
    pub desc_handle: u32,
    pub seq: u32,
}

/// A validated receive: what every kind of NIC gets from `VipPostRecv`.
#[derive(Clone, Default)]
pub(crate) struct RecvWr {
    pub desc_off: u64,
    /// First address of the descriptor's region (segments of that region
    /// are at this plus their offset).
    pub desc_base: u64,
    /// The one other region the segments lie in, when translation found
    /// them all in the queue's data region (`DataRegion`): its handle (0:
    /// none) and first address.
    pub data_handle: u32,
    pub data_base: u64,
    pub desc_handle: u32,
    pub n: usize,
    /// (offset in region, length, handle) per segment.
    pub segs: [(u64, u32, u32); MAX_SEGS],
    pub fault: u32,
}
