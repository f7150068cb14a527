//! Registration backing: moving registered pages into shared memory files.
//!
//! A peer can only write into our memory with one `memcpy` if the pages are
//! shared with it. [`Arenas::pin`] makes a page range shareable:
//!
//! 1. read `/proc/self/maps` for the range;
//! 2. pages already in one of our live arenas are reused as they are;
//! 3. private pages (heap, `.bss`, `.data`, anonymous `mmap`) are written into
//!    a new memfd (`pwrite` from their own address, so the kernel validates
//!    the range) which is then mapped over them with `MAP_FIXED` and the same
//!    protection: the program sees the same bytes at the same addresses;
//! 4. anything else (`MAP_SHARED` files, another process's arenas inherited
//!    through `fork`, the current thread's stack, special mappings) becomes a
//!    cross-memory-attach extent, reached with `process_vm_readv/writev`.
//!
//! Each arena also gets a library-owned *shadow* mapping: the engine reads
//! and writes local registered memory only through shadows (bounds-checked
//! [`Mapping`]s), never through application pointers.

use std::collections::HashMap;
use std::io;
use std::ops::Range;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, RwLock};

use super::mapping::Mapping;

/// Arena id of an extent reached by cross-memory attach instead of a mapping.
pub const CMA: u32 = u32::MAX;

/// Prefix of the memfd name of every arena.
pub const NAME_PREFIX: &str = "via-arena:";

/// A range of this process's memory offered for registration.
#[derive(Debug)]
pub struct UserRange {
    addr: usize,
    len: usize,
}

impl UserRange {
    /// Wraps `addr..addr + len`.
    ///
    /// # Safety
    /// The range must stay mapped while it is registered (the VIA rule for
    /// registered memory), and no other thread may write to the pages that
    /// cover it (rounded out to pages) while [`Arenas::pin`] runs: the pages
    /// are copied into a shared file and the copy replaces them.
    pub unsafe fn new(addr: usize, len: usize) -> UserRange {
        UserRange { addr, len }
    }

    /// First byte.
    pub fn addr(&self) -> usize {
        self.addr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the range is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A window on the part `va..va + len` of the range (clipped to it), for
    /// direct access by this process to registered bytes that stay where
    /// they are (cross-memory-attach extents). `None` if nothing is left.
    pub fn borrow(&self, va: u64, len: u64) -> Option<(u64, Mapping)> {
        let start = (va as usize).max(self.addr);
        let end = (va as usize)
            .saturating_add(len as usize)
            .min(self.addr + self.len);
        if start >= end {
            return None;
        }
        // SAFETY: `start..end` lies inside this range, which the creator of
        // the `UserRange` promised stays mapped while registered; the window
        // is dropped with the registration.
        let m = unsafe { Mapping::borrowed(start, end - start) }?;
        Some((start as u64, m))
    }
}

/// A piece of a pinned range: `va..va + len` lives in `arena` at `arena_off`
/// (or is reached by CMA when `arena == CMA`, then `arena_off == va`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    /// First virtual address of the piece.
    pub va: u64,
    /// Bytes.
    pub len: u64,
    /// Arena id, or [`CMA`].
    pub arena: u32,
    /// Offset of `va` inside the arena file.
    pub arena_off: u64,
}

/// How registration backs pages (`VIA_REGISTER`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Policy {
    /// Move private pages into arenas (default).
    #[default]
    Remap,
    /// Never move pages; every extent uses cross-memory attach.
    Cma,
}

impl std::str::FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "remap" => Ok(Policy::Remap),
            "cma" => Ok(Policy::Cma),
            _ => Err(format!("VIA_REGISTER must be 'remap' or 'cma', not '{s}'")),
        }
    }
}

/// Receives the fd of each new arena so that peers can map it.
pub trait Publisher: Send + Sync {
    /// Makes `fd` available to peers as arena `id`.
    fn publish(&self, id: u32, fd: &OwnedFd) -> io::Result<()>;
    /// The arena is no longer referenced by any region.
    fn retire(&self, id: u32);
}

struct Arena {
    shadow: Arc<Mapping>,
    refs: usize,
}

/// The arenas of this process.
pub struct Arenas {
    session: u64,
    policy: Policy,
    publisher: Box<dyn Publisher>,
    table: RwLock<Table>,
}

#[derive(Default)]
struct Table {
    next_id: u32,
    live: HashMap<u32, Arena>,
}

/// One line of `/proc/self/maps` restricted to what classification needs.
#[derive(Debug, Clone)]
struct MapLine {
    range: Range<usize>,
    perms: [u8; 4],
    offset: u64,
    path: String,
}

#[derive(Debug, Clone, PartialEq)]
enum Piece {
    Arena { id: u32, off: u64 },
    Movable { prot: i32 },
    Foreign,
}

impl Arenas {
    /// Arenas for `session`, publishing new ones through `publisher`.
    pub fn new(session: u64, policy: Policy, publisher: Box<dyn Publisher>) -> Arenas {
        Arenas {
            session,
            policy,
            publisher,
            table: RwLock::new(Table {
                next_id: 1,
                ..Table::default()
            }),
        }
    }

    /// The shadow mapping of a live arena.
    pub fn shadow(&self, id: u32) -> Option<Arc<Mapping>> {
        self.table
            .read()
            .unwrap()
            .live
            .get(&id)
            .map(|a| a.shadow.clone())
    }

    /// Number of live arenas.
    pub fn live(&self) -> usize {
        self.table.read().unwrap().live.len()
    }

    /// Backs the pages covering `range` and returns the extents, in address
    /// order, covering exactly the page-rounded range.
    ///
    /// # Errors
    /// `InvalidInput` if part of the range is not mapped or not readable;
    /// other errors from the system calls.
    pub fn pin(&self, range: &UserRange) -> io::Result<Vec<Extent>> {
        let pages = regcache::page_range(range.addr, range.len)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        if pages.is_empty() {
            return Ok(Vec::new());
        }
        let lines = read_maps(&pages)?;
        let stack = crate::sys::current_thread_stack();
        // Classify, and check the whole range is mapped and readable.
        let mut pieces: Vec<(Range<usize>, Piece)> = Vec::new();
        let mut cursor = pages.start;
        let mut table = self.table.write().unwrap();
        for l in &lines {
            let start = l.range.start.max(pages.start);
            let end = l.range.end.min(pages.end);
            if start != cursor {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "range not mapped",
                ));
            }
            if l.perms[0] != b'r' {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "range not readable",
                ));
            }
            // Pages only partly inside the range hold bytes that are not the
            // caller's (allocator metadata, other objects): moving them could
            // lose a concurrent write to those bytes, so they stay where they
            // are and are reached by cross-memory attach. Split this line at
            // the bounds of the fully covered pages.
            let page = regcache::page_size();
            let inner_start = range.addr.div_ceil(page) * page;
            let inner_end = ((range.addr + range.len) / page * page).max(inner_start);
            let mut cuts = vec![start];
            for c in [inner_start, inner_end] {
                if c > start && c < end {
                    cuts.push(c);
                }
            }
            cuts.push(end);
            for w in cuts.windows(2) {
                let (a, b) = (w[0], w[1]);
                let partial = a < inner_start || b > inner_end;
                let piece = match self.classify(l, a, &table) {
                    Piece::Movable { .. } if self.policy == Policy::Cma || partial => {
                        Piece::Foreign
                    }
                    Piece::Movable { .. }
                        if stack.as_ref().is_some_and(|s| s.start < b && a < s.end) =>
                    {
                        Piece::Foreign
                    }
                    p => p,
                };
                push_piece(&mut pieces, a..b, piece);
            }
            cursor = end;
        }
        if cursor != pages.end {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "range not mapped",
            ));
        }

        // Move each run of movable pages into a fresh arena.
        let mut extents = Vec::with_capacity(pieces.len());
        let mut i = 0;
        while i < pieces.len() {
            match &pieces[i].1 {
                Piece::Arena { id, off } => {
                    let (id, off) = (*id, *off);
                    table.live.get_mut(&id).expect("classified live").refs += 1;
                    extents.push(Extent {
                        va: pieces[i].0.start as u64,
                        len: pieces[i].0.len() as u64,
                        arena: id,
                        arena_off: off,
                    });
                    i += 1;
                }
                Piece::Foreign => {
                    extents.push(Extent {
                        va: pieces[i].0.start as u64,
                        len: pieces[i].0.len() as u64,
                        arena: CMA,
                        arena_off: pieces[i].0.start as u64,
                    });
                    i += 1;
                }
                Piece::Movable { .. } => {
                    let mut j = i;
                    while j < pieces.len() && matches!(pieces[j].1, Piece::Movable { .. }) {
                        j += 1;
                    }
                    let run = &pieces[i..j];
                    let id = table.next_id;
                    table.next_id = table
                        .next_id
                        .checked_add(1)
                        .filter(|&n| n != CMA)
                        .ok_or_else(|| {
                            io::Error::new(io::ErrorKind::OutOfMemory, "arena ids exhausted")
                        })?;
                    let shadow = self.create_arena(id, run)?;
                    let base = run[0].0.start;
                    let len = run[run.len() - 1].0.end - base;
                    table.live.insert(
                        id,
                        Arena {
                            shadow: Arc::new(shadow),
                            refs: 1,
                        },
                    );
                    extents.push(Extent {
                        va: base as u64,
                        len: len as u64,
                        arena: id,
                        arena_off: 0,
                    });
                    i = j;
                }
            }
        }
        Ok(extents)
    }

    /// Drops the references `pin` took for `extents`.
    pub fn unpin(&self, extents: &[Extent]) {
        let mut retired = Vec::new();
        {
            let mut table = self.table.write().unwrap();
            for e in extents.iter().filter(|e| e.arena != CMA) {
                if let Some(a) = table.live.get_mut(&e.arena) {
                    a.refs -= 1;
                    if a.refs == 0 {
                        table.live.remove(&e.arena);
                        retired.push(e.arena);
                    }
                }
            }
        }
        for id in retired {
            log::debug!("arena {id} retired");
            self.publisher.retire(id);
        }
    }

    fn classify(&self, l: &MapLine, start: usize, table: &Table) -> Piece {
        let shared = l.perms[3] == b's';
        if let Some(rest) = l
            .path
            .strip_prefix("/memfd:")
            .and_then(|p| p.strip_prefix(NAME_PREFIX))
        {
            let mut it = rest.split([':', ' ']);
            let session = it.next().and_then(|s| s.parse::<u64>().ok());
            let id = it.next().and_then(|s| s.parse::<u32>().ok());
            if let (Some(session), Some(id)) = (session, id) {
                if session == self.session && table.live.contains_key(&id) {
                    return Piece::Arena {
                        id,
                        off: l.offset + (start - l.range.start) as u64,
                    };
                }
                if session == self.session {
                    // A retired arena of ours: nobody else relies on its sharing.
                    return Piece::Movable {
                        prot: prot_of(&l.perms),
                    };
                }
            }
            return Piece::Foreign;
        }
        let special = matches!(
            l.path.as_str(),
            "[vvar]" | "[vdso]" | "[vsyscall]" | "[stack]"
        ) || l.path.starts_with("/dev/")
            || l.path.contains("hugepage");
        if shared || special {
            Piece::Foreign
        } else {
            Piece::Movable {
                prot: prot_of(&l.perms),
            }
        }
    }

    fn create_arena(&self, id: u32, run: &[(Range<usize>, Piece)]) -> io::Result<Mapping> {
        let base = run[0].0.start;
        let len = run[run.len() - 1].0.end - base;
        let fd = crate::sys::memfd_create(&format!("{NAME_PREFIX}{}:{id}", self.session))?;
        crate::sys::ftruncate(&fd, len as u64)?;
        // Copy the current contents in. pwrite reads our own memory in the
        // kernel, which validates the range.
        let mut done = 0usize;
        while done < len {
            // SAFETY: pwrite only reads `base + done ..` in the kernel (EFAULT if
            // unmapped); no Rust reference is created.
            let r = unsafe {
                libc::pwrite(
                    fd.as_raw_fd(),
                    (base + done) as *const libc::c_void,
                    len - done,
                    done as libc::off_t,
                )
            };
            if r < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            done += r as usize;
        }
        // Replace the pages by the file, piece by piece with each piece's
        // protection. Contents are identical, so the program sees no change.
        for (r, p) in run {
            let Piece::Movable { prot } = p else {
                unreachable!()
            };
            // SAFETY: `UserRange::new`'s contract: the range is the caller's
            // registered memory and no other thread writes these pages during
            // the call; the bytes were copied into `fd` just above.
            let m = unsafe {
                libc::mmap(
                    r.start as *mut libc::c_void,
                    r.len(),
                    *prot,
                    libc::MAP_SHARED | libc::MAP_FIXED,
                    fd.as_raw_fd(),
                    (r.start - base) as libc::off_t,
                )
            };
            if m == libc::MAP_FAILED {
                return Err(io::Error::last_os_error());
            }
        }
        let shadow = Mapping::map_shared(&fd, 0, len)?;
        self.publisher.publish(id, &fd)?;
        log::debug!("arena {id}: {len} bytes at {base:#x}");
        Ok(shadow)
    }
}

fn push_piece(pieces: &mut Vec<(Range<usize>, Piece)>, r: Range<usize>, p: Piece) {
    if let Some((last, lp)) = pieces.last_mut() {
        let merge = match (&*lp, &p) {
            (Piece::Arena { id: a, off: ao }, Piece::Arena { id: b, off: bo }) => {
                a == b && ao + (last.len() as u64) == *bo
            }
            (Piece::Foreign, Piece::Foreign) => true,
            _ => false,
        };
        if merge && last.end == r.start {
            last.end = r.end;
            return;
        }
    }
    pieces.push((r, p));
}

fn prot_of(perms: &[u8; 4]) -> i32 {
    let mut p = 0;
    if perms[0] == b'r' {
        p |= libc::PROT_READ;
    }
    if perms[1] == b'w' {
        p |= libc::PROT_WRITE;
    }
    if perms[2] == b'x' {
        p |= libc::PROT_EXEC;
    }
    p
}

/// The lines of `/proc/self/maps` that overlap `range`, in address order.
fn read_maps(range: &Range<usize>) -> io::Result<Vec<MapLine>> {
    let text = std::fs::read_to_string("/proc/self/maps")?;
    let mut out = Vec::new();
    for line in text.lines() {
        let Some(l) = parse_line(line) else { continue };
        if l.range.end <= range.start {
            continue;
        }
        if l.range.start >= range.end {
            break;
        }
        out.push(l);
    }
    Ok(out)
}

fn parse_line(line: &str) -> Option<MapLine> {
    let mut it = line.splitn(6, ' ');
    let (a, b) = it.next()?.split_once('-')?;
    let start = usize::from_str_radix(a, 16).ok()?;
    let end = usize::from_str_radix(b, 16).ok()?;
    let p = it.next()?.as_bytes();
    if p.len() != 4 {
        return None;
    }
    let offset = u64::from_str_radix(it.next()?, 16).ok()?;
    let _dev = it.next()?;
    let _inode = it.next()?;
    let path = it.next().unwrap_or("").trim_start().to_string();
    Some(MapLine {
        range: start..end,
        perms: [p[0], p[1], p[2], p[3]],
        offset,
        path,
    })
}

/// The arenas as a `regcache::Pinner`: the registration path of
/// `VipRegisterMem` goes through a `regcache::RegCache` of these, so
/// overlapping registrations share their pinned pages.
///
/// Only ranges of [`UserRange`]s reach it: the cache that owns it is private
/// to the process state and fed only by the registration path, which holds a
/// `UserRange` for every range it asks for (that contract is what makes
/// [`Arenas::pin`] sound here).
pub struct ArenaPinner(pub std::sync::Arc<Arenas>);

impl regcache::Pinner for ArenaPinner {
    type Pinned = Vec<Extent>;
    type Error = io::Error;

    fn pin(&self, pages: Range<usize>) -> io::Result<Vec<Extent>> {
        self.pin_bytes(pages.clone(), pages)
    }

    fn pin_bytes(&self, _pages: Range<usize>, bytes: Range<usize>) -> io::Result<Vec<Extent>> {
        // SAFETY: see the type's doc: `bytes` is the range of a `UserRange`
        // the registration path holds, whose contract carries over.
        let range = unsafe { UserRange::new(bytes.start, bytes.len()) };
        self.0.pin(&range)
    }

    fn unpin(&self, _pages: Range<usize>, extents: Vec<Extent>) {
        self.0.unpin(&extents)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct NoPublish;
    impl Publisher for NoPublish {
        fn publish(&self, _: u32, _: &OwnedFd) -> io::Result<()> {
            Ok(())
        }
        fn retire(&self, _: u32) {}
    }

    #[test]
    fn parses_maps_lines() {
        let l = parse_line("7f00-7f10 rw-s 00002000 00:01 123   /memfd:via-arena:7:3 (deleted)")
            .unwrap();
        assert_eq!(l.range, 0x7f00..0x7f10);
        assert_eq!(&l.perms, b"rw-s");
        assert_eq!(l.offset, 0x2000);
        assert_eq!(l.path, "/memfd:via-arena:7:3 (deleted)");
        let l = parse_line("55d0-55e0 rw-p 00000000 00:00 0 ").unwrap();
        assert_eq!(l.path, "");
        assert!(parse_line("garbage").is_none());
    }

    /// Anonymous private pages owned by the test (not the shared heap, whose
    /// pages other test threads write while `pin` runs).
    struct Anon {
        ptr: *mut u8,
        len: usize,
    }
    impl Anon {
        fn new(len: usize) -> Anon {
            // SAFETY: a fresh private anonymous mapping aliases nothing.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(p, libc::MAP_FAILED);
            Anon { ptr: p.cast(), len }
        }
        fn bytes(&mut self) -> &mut [u8] {
            // SAFETY: the mapping is live for `self` and only this test uses it.
            unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
        }
    }
    impl Drop for Anon {
        fn drop(&mut self) {
            // SAFETY: we own the mapping.
            unsafe { libc::munmap(self.ptr.cast(), self.len) };
        }
    }

    #[test]
    fn private_pages_move_and_keep_contents() {
        let arenas = Arenas::new(424242, Policy::Remap, Box::new(NoPublish));
        let page = regcache::page_size();
        let mut mem = Anon::new(4 * page);
        let base = mem.ptr as usize;
        for (i, b) in mem.bytes().iter_mut().enumerate() {
            *b = i as u8;
        }
        // Two whole pages: one arena, contents preserved.
        // SAFETY: `mem` outlives the registration and no other thread touches it.
        let r = unsafe { UserRange::new(base, 2 * page) };
        let ext = arenas.pin(&r).unwrap();
        assert_eq!(ext.len(), 1);
        assert_ne!(ext[0].arena, CMA);
        assert_eq!(ext[0].len as usize, 2 * page);
        for (i, b) in mem.bytes().iter().enumerate() {
            assert_eq!(*b, i as u8, "contents preserved");
        }
        // A write through the shadow is seen by the program.
        let shadow = arenas.shadow(ext[0].arena).unwrap();
        assert!(shadow.write(100, b"Z"));
        assert_eq!(mem.bytes()[100], b'Z');
        // A range inside pages already in the arena reuses it, even where it
        // covers pages partly (nothing moves).
        // SAFETY: as above.
        let r2 = unsafe { UserRange::new(base + 10, 16) };
        let ext2 = arenas.pin(&r2).unwrap();
        assert_eq!(ext2.len(), 1);
        assert_eq!(ext2[0].arena, ext[0].arena);
        // A range that extends past the arena: the arena, then its last
        // page, only partly covered, stays in place (CMA).
        // SAFETY: as above.
        let r3 = unsafe { UserRange::new(base, 2 * page + 10) };
        let ext3 = arenas.pin(&r3).unwrap();
        assert_eq!(ext3.len(), 2);
        assert_eq!(ext3[0].arena, ext[0].arena);
        assert_eq!(ext3[1].arena, CMA);
        arenas.unpin(&ext3);
        arenas.unpin(&ext2);
        assert_eq!(arenas.live(), 1);
        arenas.unpin(&ext);
        assert_eq!(arenas.live(), 0);
        mem.bytes()[5] = 9;
        assert_eq!(mem.bytes()[5], 9);
    }

    #[test]
    fn partly_covered_pages_stay_in_place() {
        let arenas = Arenas::new(424243, Policy::Remap, Box::new(NoPublish));
        let page = regcache::page_size();
        let mut mem = Anon::new(4 * page);
        let base = mem.ptr as usize;
        for (i, b) in mem.bytes().iter_mut().enumerate() {
            *b = (i * 7) as u8;
        }
        // Head and tail pages partly covered: CMA; the two pages between: an arena.
        // SAFETY: `mem` outlives the registration and no other thread touches it.
        let r = unsafe { UserRange::new(base + 100, 3 * page) };
        let ext = arenas.pin(&r).unwrap();
        let kinds: Vec<bool> = ext.iter().map(|e| e.arena == CMA).collect();
        assert_eq!(kinds, [true, false, true]);
        assert_eq!(ext[1].va as usize, base + page);
        assert_eq!(ext[1].len as usize, 2 * page);
        assert_eq!(ext.iter().map(|e| e.len).sum::<u64>() as usize, 4 * page);
        for (i, b) in mem.bytes().iter().enumerate() {
            assert_eq!(*b, (i * 7) as u8, "contents preserved");
        }
        arenas.unpin(&ext);
        // Less than a page, unaligned: nothing moves.
        // SAFETY: as above.
        let small = unsafe { UserRange::new(base + 3 * page + 64, 128) };
        let ext = arenas.pin(&small).unwrap();
        assert_eq!(ext.len(), 1);
        assert_eq!(ext[0].arena, CMA);
        assert_eq!(arenas.live(), 0);
        // A borrowed window is clipped to the range.
        let (at, w) = small.borrow(base as u64, 8 * page as u64).unwrap();
        assert_eq!(at as usize, base + 3 * page + 64);
        assert_eq!(w.len(), 128);
        let mut b = [0u8; 1];
        assert!(w.read(0, &mut b));
        assert_eq!(b[0], ((3 * page + 64) * 7) as u8);
        drop(w);
        assert_eq!(
            mem.bytes()[3 * page + 64],
            ((3 * page + 64) * 7) as u8,
            "borrowing unmaps nothing"
        );
    }

    #[test]
    fn cma_policy_moves_nothing() {
        let arenas = Arenas::new(1, Policy::Cma, Box::new(NoPublish));
        let mem = Anon::new(3 * regcache::page_size());
        // SAFETY: `mem` outlives the registration.
        let r = unsafe { UserRange::new(mem.ptr as usize, mem.len) };
        let ext = arenas.pin(&r).unwrap();
        assert!(ext.iter().all(|e| e.arena == CMA));
        assert_eq!(arenas.live(), 0);
    }

    #[test]
    fn unmapped_range_is_refused() {
        let arenas = Arenas::new(1, Policy::Remap, Box::new(NoPublish));
        // SAFETY: the range is never touched: pin must refuse it.
        let r = unsafe { UserRange::new(0x1000, 4096) };
        assert_eq!(
            arenas.pin(&r).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
    }
}
