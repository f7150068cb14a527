//! Registration backing for the soft NIC: moving registered pages into
//! shared memory files ("arenas") that peers map.
//!
//! A peer can write into our memory with one `memcpy` only if the pages are
//! shared with it. [`Arenas::pin`] makes a page range shareable:
//!
//! 1. the mappings over the range come from `PROCMAP_QUERY` (one call per
//!    mapping: the cost does not grow with the number of mappings);
//! 2. pages already in one of our live arenas are reused as they are;
//! 3. whole pages of private anonymous memory (heap, `.bss`, anonymous
//!    `mmap`, thread stacks) move into a new memfd that is then mapped over
//!    them with `MAP_FIXED` and the same protection: the program sees the
//!    same bytes at the same addresses. The move goes chunk by chunk
//!    ([`Config::chunk`], 2 MiB): each chunk is write-protected with a
//!    userfaultfd first, its touched pages (per `/proc/self/pagemap`) are
//!    copied, the shared mapping replaces it, and the writers that waited
//!    are woken and retry into the shared pages. No write is lost, at most
//!    one chunk exists twice at any time, and pages never touched are never
//!    copied or allocated;
//! 4. everything else stays where it is and becomes a cross-memory-attach
//!    extent (`process_vm_readv/writev`): pages only partly inside the
//!    region (they hold other data, such as allocator metadata), files
//!    mapped shared or private, the current thread's stack, special
//!    mappings.
//!
//! Fork: the arena pages a live registration holds are left out of a child
//! (a child has no mapping there, as after verbs' `ibv_fork_init`: they
//! are `MADV_DONTFORK` for the time of the `fork`). Arena pages that no
//! registration holds are copied into private memory in the child by
//! [`child_after_fork`], so parent and child never share memory the
//! application owns.
//!
//! Each live arena also has a library-owned *shadow* mapping: the engine
//! reads and writes local registered memory only through shadows
//! (bounds-checked [`Mapping`]s), never through application pointers.

use std::collections::HashMap;
use std::io;
use std::ops::Range;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::monitor::Monitor;
use super::uffd::{self, Uffd};
use super::vma::{self, Vma};
use crate::shm::mapping::Mapping;

/// Arena id of an extent reached by cross-memory attach instead of a mapping.
pub const CMA: u32 = u32::MAX;

/// Prefix of the memfd name of every arena: `via-arena:<pid>:<id>`.
pub const NAME_PREFIX: &str = "via-arena:";

/// Arena ids are unique in the process (across re-created provider states).
static NEXT_ID: AtomicU32 = AtomicU32::new(1);

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
    /// registered memory).
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

/// Tuning of [`Arenas`].
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// How registration backs pages.
    pub policy: Policy,
    /// Bytes moved per write-protected step (rounded to pages, at least one,
    /// at most `vma::PageBits::MAX_PAGES` pages).
    pub chunk: usize,
    /// Move an arena's pages back into private memory when its last pin
    /// goes (the registration cache is off, so this happens in
    /// `VipDeregisterMem`, when the application may not unmap them).
    pub restore_on_retire: bool,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            policy: Policy::Remap,
            chunk: 2 << 20,
            restore_on_retire: false,
        }
    }
}

/// Counters of the backing layer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ArenaStats {
    /// Arenas created.
    pub created: u64,
    /// Arenas retired (no pin left).
    pub retired: u64,
    /// Bytes copied into arenas (touched pages only).
    pub bytes_moved: u64,
    /// Bytes of page ranges moved (touched or not).
    pub bytes_backed: u64,
    /// Write-protected steps.
    pub chunks: u64,
    /// Arenas moved back into private memory.
    pub restored: u64,
    /// Live arenas.
    pub live: u64,
}

struct Arena {
    /// Library-owned mapping of the whole file.
    shadow: Arc<Mapping>,
    /// Where the arena was created (it may since have been partly unmapped
    /// or moved by the application).
    base: usize,
    /// Pins (cache entries) that reference it.
    pins: usize,
}

#[derive(Default)]
struct Table {
    live: HashMap<u32, Arena, crate::regions::BuildHandleHasher>,
}

/// The arenas of this process.
pub struct Arenas {
    config: Config,
    publisher: Box<dyn Publisher>,
    /// Write protection during moves (`None`: moves are not protected, and a
    /// concurrent write to a moving page may be lost: logged at start).
    mover: Option<Uffd>,
    /// How a chunk is registered with `mover` while it moves: `WP`, or
    /// `WP | MISSING` on a kernel without `WP_UNPOPULATED` (before 6.4),
    /// whose write protection does not cover pages never touched: a first
    /// touch of one of those waits as a missing-page fault instead.
    move_mode: u64,
    monitor: Option<Arc<Monitor>>,
    table: Mutex<Table>,
    created: AtomicU64,
    retired: AtomicU64,
    bytes_moved: AtomicU64,
    bytes_backed: AtomicU64,
    chunks: AtomicU64,
    restored: AtomicU64,
}

#[derive(Debug, Clone, PartialEq)]
enum Piece {
    Arena { id: u32, off: u64 },
    Movable { prot: i32 },
    Foreign,
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, what.to_string())
}

/// The arena id in a memfd mapping name of this process, if it is one.
fn arena_of(v: &Vma) -> Option<u32> {
    let rest = v.name.strip_prefix("/memfd:")?.strip_prefix(NAME_PREFIX)?;
    let mut it = rest.split([':', ' ']);
    let pid: i32 = it.next()?.parse().ok()?;
    let id: u32 = it.next()?.parse().ok()?;
    (pid == crate::sys::getpid()).then_some(id)
}

/// The userfaultfd that protects moves, and the mode a moving chunk is
/// registered in: write protection covering pages never touched (Linux
/// 6.4+), else write protection plus missing-page faults (Linux 5.7+: a
/// first touch of an empty page waits for the move too).
fn open_mover() -> io::Result<(Uffd, u64)> {
    let wp = uffd::feature::WP_HUGETLBFS_SHMEM;
    match Uffd::open(uffd::feature::WP_UNPOPULATED | wp) {
        Ok(u) => Ok((u, uffd::mode::WP)),
        Err(e) if e.kind() == io::ErrorKind::Unsupported => {
            log::debug!("{e}: pages never touched are held by missing-page faults while they move");
            // Shmem protection (5.19+) only serves `restore`; moves need none.
            let u = Uffd::open(wp).or_else(|_| Uffd::open(0))?;
            Ok((u, uffd::mode::WP | uffd::mode::MISSING))
        }
        Err(e) => Err(e),
    }
}

impl Arenas {
    /// Arenas publishing new ones through `publisher`, watched by `monitor`.
    pub fn new(
        config: Config,
        publisher: Box<dyn Publisher>,
        monitor: Option<Arc<Monitor>>,
    ) -> Arenas {
        let (mover, move_mode) = match config.policy {
            Policy::Cma => (None, uffd::mode::WP),
            Policy::Remap => match open_mover() {
                Ok((u, mode)) => {
                    if !u.kernel_faults {
                        log::debug!(
                            "userfaultfd in user mode only: a system call writing into pages \
                             while they are registered fails with EFAULT"
                        );
                    }
                    (Some(u), mode)
                }
                Err(e) => {
                    log::warn!(
                        "no write protection for registration ({e}): another thread must not \
                         write to memory while it is being registered"
                    );
                    (None, uffd::mode::WP)
                }
            },
        };
        Arenas {
            config,
            publisher,
            mover,
            move_mode,
            monitor,
            table: Mutex::new(Table::default()),
            created: AtomicU64::new(0),
            retired: AtomicU64::new(0),
            bytes_moved: AtomicU64::new(0),
            bytes_backed: AtomicU64::new(0),
            chunks: AtomicU64::new(0),
            restored: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The shadow mapping of a live arena.
    pub fn shadow(&self, id: u32) -> Option<Arc<Mapping>> {
        self.lock().live.get(&id).map(|a| a.shadow.clone())
    }

    /// Number of live arenas.
    pub fn live(&self) -> usize {
        self.lock().live.len()
    }

    /// Address ranges of every shadow mapping (for the fork handler).
    pub fn shadow_ranges(&self) -> Vec<Range<usize>> {
        self.lock()
            .live
            .values()
            .map(|a| a.shadow.addr()..a.shadow.addr() + a.shadow.len())
            .collect()
    }

    /// Counters.
    pub fn stats(&self) -> ArenaStats {
        ArenaStats {
            created: self.created.load(Ordering::Relaxed),
            retired: self.retired.load(Ordering::Relaxed),
            bytes_moved: self.bytes_moved.load(Ordering::Relaxed),
            bytes_backed: self.bytes_backed.load(Ordering::Relaxed),
            chunks: self.chunks.load(Ordering::Relaxed),
            restored: self.restored.load(Ordering::Relaxed),
            live: self.live() as u64,
        }
    }

    /// Backs the pages covering `range` and returns the extents, in address
    /// order, covering exactly the page-rounded range. Takes one pin on
    /// every arena in the result (given back by [`Arenas::unpin`]).
    ///
    /// # Errors
    /// `InvalidInput` if part of the range is not mapped or not readable;
    /// other errors from the system calls (nothing stays pinned then).
    pub fn pin(&self, range: &UserRange) -> io::Result<Vec<Extent>> {
        let pages =
            regcache::page_range(range.addr, range.len).map_err(|e| invalid(&e.to_string()))?;
        if pages.is_empty() {
            return Ok(Vec::new());
        }
        let _fork = super::fork::enter();
        let vmas = vma::mappings(&pages)?;
        let stack = crate::sys::current_thread_stack();
        let page = regcache::page_size();
        let inner_start = range.addr.div_ceil(page) * page;
        let inner_end = ((range.addr + range.len) / page * page).max(inner_start);
        let mut table = self.lock();
        // Classify, and check the whole range is mapped and readable.
        let mut pieces: Vec<(Range<usize>, Piece)> = Vec::new();
        let mut cursor = pages.start;
        for v in &vmas {
            let start = v.range.start.max(pages.start);
            let end = v.range.end.min(pages.end);
            if start != cursor {
                return Err(invalid("range not mapped"));
            }
            if !v.read {
                return Err(invalid("range not readable"));
            }
            // Pages only partly inside the range hold bytes that are not the
            // caller's: they stay in place (see the module doc).
            let mut cuts = vec![start];
            for c in [inner_start, inner_end] {
                // Once: a range with no whole page has both cuts at the
                // same boundary (an empty piece would become an empty arena).
                if c > start && c < end && cuts.last() != Some(&c) {
                    cuts.push(c);
                }
            }
            cuts.push(end);
            for w in cuts.windows(2) {
                let (a, b) = (w[0], w[1]);
                let partial = a < inner_start || b > inner_end;
                let on_stack = stack.as_ref().is_some_and(|s| s.start < b && a < s.end);
                let piece = match arena_of(v) {
                    Some(id) if table.live.contains_key(&id) => Piece::Arena {
                        id,
                        off: v.offset + (a - v.range.start) as u64,
                    },
                    // One of our retired arenas: shared with nobody, movable.
                    Some(_) if !partial && !on_stack && self.config.policy == Policy::Remap => {
                        Piece::Movable { prot: v.prot() }
                    }
                    Some(_) => Piece::Foreign,
                    None if v.movable()
                        && !partial
                        && !on_stack
                        && self.config.policy == Policy::Remap =>
                    {
                        Piece::Movable { prot: v.prot() }
                    }
                    None => Piece::Foreign,
                };
                push_piece(&mut pieces, a..b, piece);
            }
            cursor = end;
        }
        if cursor != pages.end {
            return Err(invalid("range not mapped"));
        }

        let mut extents: Vec<Extent> = Vec::with_capacity(pieces.len());
        let mut i = 0;
        let mut failed = None;
        while i < pieces.len() {
            let r = pieces[i].0.clone();
            match pieces[i].1.clone() {
                Piece::Arena { id, off } => {
                    table.live.get_mut(&id).expect("classified live").pins += 1;
                    extents.push(Extent {
                        va: r.start as u64,
                        len: r.len() as u64,
                        arena: id,
                        arena_off: off,
                    });
                    i += 1;
                }
                Piece::Foreign => {
                    extents.push(Extent {
                        va: r.start as u64,
                        len: r.len() as u64,
                        arena: CMA,
                        arena_off: r.start as u64,
                    });
                    i += 1;
                }
                Piece::Movable { .. } => {
                    let mut j = i;
                    while j < pieces.len() && matches!(pieces[j].1, Piece::Movable { .. }) {
                        j += 1;
                    }
                    let run: Vec<(Range<usize>, i32)> = pieces[i..j]
                        .iter()
                        .map(|(r, p)| match p {
                            Piece::Movable { prot } => (r.clone(), *prot),
                            _ => unreachable!(),
                        })
                        .collect();
                    match self.create_arena(&run) {
                        Ok((id, arena)) => {
                            let base = run[0].0.start;
                            let len = run[run.len() - 1].0.end - base;
                            table.live.insert(id, arena);
                            extents.push(Extent {
                                va: base as u64,
                                len: len as u64,
                                arena: id,
                                arena_off: 0,
                            });
                        }
                        Err(e) => {
                            failed = Some(e);
                            break;
                        }
                    }
                    i = j;
                }
            }
        }
        if let Some(e) = failed {
            let retired = Self::drop_pins(&mut table, &extents);
            drop(table);
            self.retire_all(retired);
            return Err(e);
        }
        drop(table);
        if let Some(m) = &self.monitor {
            m.watch(&pages);
        }
        Ok(extents)
    }

    /// Drops the pins [`Arenas::pin`] took for `extents`.
    pub fn unpin(&self, extents: &[Extent]) {
        let _fork = super::fork::enter();
        let retired = Self::drop_pins(&mut self.lock(), extents);
        self.retire_all(retired);
    }

    fn drop_pins(table: &mut Table, extents: &[Extent]) -> Vec<(u32, Arena)> {
        let mut retired = Vec::new();
        for e in extents.iter().filter(|e| e.arena != CMA) {
            if let Some(a) = table.live.get_mut(&e.arena) {
                a.pins -= 1;
                if a.pins == 0 {
                    let a = table.live.remove(&e.arena).expect("present");
                    retired.push((e.arena, a));
                }
            }
        }
        retired
    }

    fn retire_all(&self, retired: Vec<(u32, Arena)>) {
        for (id, a) in retired {
            log::debug!("arena {id} retired");
            self.retired.fetch_add(1, Ordering::Relaxed);
            if self.config.restore_on_retire {
                self.restore(id, &a);
            }
            self.publisher.retire(id);
        }
    }

    /// Whether `extents` (from [`Arenas::pin`]) still describe the memory:
    /// each arena extent is still mapped from its arena at its offset, each
    /// other extent still mapped at all. For caches that get no memory
    /// events; anonymous memory unmapped and mapped again at the same
    /// address cannot be told apart here.
    pub fn is_current(&self, extents: &[Extent]) -> bool {
        extents.iter().all(|e| {
            let r = e.va as usize..(e.va + e.len) as usize;
            let Ok(vmas) = vma::mappings(&r) else {
                return false;
            };
            let mut at = r.start;
            for v in &vmas {
                if v.range.start > at {
                    return false;
                }
                if e.arena != CMA
                    && (arena_of(v) != Some(e.arena)
                        || v.offset + (at - v.range.start) as u64
                            != e.arena_off + (at as u64 - e.va))
                {
                    return false;
                }
                at = v.range.end;
            }
            at >= r.end
        }) && extents
            .iter()
            .filter(|e| e.arena != CMA)
            .all(|e| self.lock().live.contains_key(&e.arena))
    }

    /// Moves `run` (adjacent whole pages with their protections) into a new
    /// arena; see the module doc for the steps.
    fn create_arena(&self, run: &[(Range<usize>, i32)]) -> io::Result<(u32, Arena)> {
        let base = run[0].0.start;
        let len = run[run.len() - 1].0.end - base;
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        if id == CMA {
            return Err(io::Error::new(
                io::ErrorKind::OutOfMemory,
                "arena ids exhausted",
            ));
        }
        let name = format!("{NAME_PREFIX}{}:{id}", crate::sys::getpid());
        let fd = crate::sys::memfd_create(&name)?;
        crate::sys::ftruncate(&fd, len as u64)?;
        let shadow = Mapping::map_shared(&fd, 0, len)?;
        let page = regcache::page_size();
        // At most what a mover's page bits hold (`move_chunk`).
        let chunk = (self.config.chunk / page).clamp(1, vma::PageBits::MAX_PAGES) * page;
        for (r, prot) in run {
            let mut at = r.start;
            while at < r.end {
                let c = at..(at + chunk).min(r.end);
                self.move_chunk(&fd, base, &c, *prot)?;
                at = c.end;
            }
        }
        self.publisher.publish(id, &fd)?;
        self.created.fetch_add(1, Ordering::Relaxed);
        self.bytes_backed.fetch_add(len as u64, Ordering::Relaxed);
        log::debug!("arena {id}: {len} bytes at {base:#x}");
        Ok((
            id,
            Arena {
                shadow: Arc::new(shadow),
                base,
                pins: 1,
            },
        ))
    }

    /// Moves one chunk `c` of the run starting at `base` into `fd`.
    ///
    /// Between the write protection and the wake-up this thread writes no
    /// heap memory and allocates nothing: the chunk may hold heap blocks
    /// (a merged cache entry spans freed and reused memory), and a write
    /// into it would wait for this very thread. Scratch lives on the stack
    /// (`PageBits`), counters are updated after the wake-up. (Before Linux
    /// 6.4 a read of a page never touched waits too, `move_mode`: the
    /// mover reads only pages it found touched.)
    fn move_chunk(&self, fd: &OwnedFd, base: usize, c: &Range<usize>, prot: i32) -> io::Result<()> {
        // Events for this range would be the library's own doing.
        if let Some(m) = &self.monitor {
            m.unwatch(c);
        }
        let pages = c.len() / regcache::page_size();
        // Pages with data, read before the protection (afterwards the
        // kernel reports protected empty pages like swapped ones).
        let mut touched = vma::PageBits::new(pages);
        let before = touched.scan(c, vma::TOUCHED);
        let protected = match &self.mover {
            Some(u) => match u
                .register(c, self.move_mode)
                .and_then(|_| u.write_protect(c, true))
            {
                Ok(()) => true,
                Err(e) => {
                    let _ = u.unregister(c);
                    log::debug!("cannot write-protect {c:#x?} ({e}); moving unprotected");
                    false
                }
            },
            None => false,
        };
        // Pages present now: touched between the first look and the
        // protection (a page touched then and already swapped out again
        // within those microseconds would be missed: not a practical case).
        let known = before.is_ok() && (!protected || touched.scan(c, vma::PRESENT).is_ok());
        if !known {
            touched = vma::PageBits::all(pages);
        }
        let result = Self::copy_and_map(fd, base, c, prot, &touched);
        if protected {
            let u = self.mover.as_ref().expect("protected");
            if result.is_err() {
                // The old pages are still there: let the writers go on.
                let _ = u.write_protect(c, false);
                let _ = u.unregister(c);
            }
            // Writers that waited retry, into the shared pages (or the old ones).
            let _ = u.wake(c);
        }
        self.chunks.fetch_add(1, Ordering::Relaxed);
        let moved = result?;
        self.bytes_moved.fetch_add(moved as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Copies the `touched` pages of chunk `c` into `fd` and maps `fd` over
    /// `c`; returns the bytes copied.
    fn copy_and_map(
        fd: &OwnedFd,
        base: usize,
        c: &Range<usize>,
        prot: i32,
        touched: &vma::PageBits,
    ) -> io::Result<usize> {
        let page = regcache::page_size();
        let mut moved = 0;
        touched.for_each_run(|run| {
            let (start, len) = (c.start + run.start * page, run.len() * page);
            moved += len;
            crate::sys::pwrite_from_memory(fd, start, len, (start - base) as u64)
        })?;
        // SAFETY: `c` is whole pages of the application's registered memory
        // whose contents were just copied into `fd` at the same offsets; no
        // writer changed them since (write protection), so the program sees
        // the same bytes at the same addresses.
        unsafe { crate::sys::map_fixed_shared(c, prot, fd, (c.start - base) as u64)? };
        Ok(moved)
    }

    /// Moves the pages of a retired arena back into private memory.
    fn restore(&self, id: u32, a: &Arena) {
        let len = a.shadow.len();
        let Ok(vmas) = vma::mappings(&(a.base..a.base + len)) else {
            return;
        };
        for v in vmas.iter().filter(|v| arena_of(v) == Some(id)) {
            let r = v.range.start.max(a.base)..v.range.end.min(a.base + len);
            if let Some(m) = &self.monitor {
                m.unwatch(&r);
            }
            let protected = self.mover.as_ref().is_some_and(|u| {
                u.register(&r, uffd::mode::WP)
                    .and_then(|_| u.write_protect(&r, true))
                    .is_ok()
            });
            // SAFETY: `r` maps arena `id`, which no registration uses any
            // more; the application may not unmap it during
            // `VipDeregisterMem` (the only caller, with the cache off), and
            // writers wait (protection) while the contents move.
            let res = unsafe { crate::sys::replace_with_private_copy(&r, v.prot()) };
            if let Some(u) = self.mover.as_ref().filter(|_| protected) {
                if res.is_err() {
                    let _ = u.write_protect(&r, false);
                    let _ = u.unregister(&r);
                }
                let _ = u.wake(&r);
            }
            match res {
                Ok(()) => {
                    self.restored.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => log::warn!("cannot move {r:#x?} back to private memory: {e}"),
            }
        }
    }
}

/// The arenas as a `regcache::Pinner`: the registration path of
/// `VipRegisterMem` goes through a `regcache::RegCache` of these.
///
/// Only ranges of [`UserRange`]s reach it: the cache that owns it is private
/// to the process state and fed only by the registration path, which holds a
/// `UserRange` for every range it asks for.
pub struct ArenaPinner(pub Arc<Arenas>);

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

    fn is_current(&self, _pages: Range<usize>, extents: &Vec<Extent>) -> bool {
        self.0.is_current(extents)
    }
}

fn push_piece(pieces: &mut Vec<(Range<usize>, Piece)>, r: Range<usize>, p: Piece) {
    if let Some((last, lp)) = pieces.last_mut() {
        let merge = match (&*lp, &p) {
            (Piece::Arena { id: a, off: ao }, Piece::Arena { id: b, off: bo }) => {
                a == b && ao + (last.len() as u64) == *bo
            }
            (Piece::Foreign, Piece::Foreign) => true,
            (Piece::Movable { prot: a }, Piece::Movable { prot: b }) => a == b,
            _ => false,
        };
        if merge && last.end == r.start {
            last.end = r.end;
            return;
        }
    }
    pieces.push((r, p));
}

/// In a child after `fork` (single-threaded): every mapping of this
/// process's arenas that reached the child (pages no live registration
/// held) becomes a private copy, so the child shares nothing with its
/// parent; library shadows (`shadows`) and peers' arenas are unmapped.
pub fn child_after_fork(parent_pid: i32, shadows: &[Range<usize>]) {
    let Ok(text) = std::fs::read_to_string("/proc/self/maps") else {
        return;
    };
    let own = format!("/memfd:{NAME_PREFIX}{parent_pid}:");
    for line in text.lines() {
        let Some(v) = vma::parse_maps_line(line) else {
            continue;
        };
        if !v.name.starts_with(&format!("/memfd:{NAME_PREFIX}")) {
            continue;
        }
        let library = !v.name.starts_with(&own)
            || shadows
                .iter()
                .any(|s| s.start <= v.range.start && v.range.end <= s.end);
        if library {
            // SAFETY: a library-owned mapping (a shadow, or a peer's arena);
            // the child's provider state is discarded, nothing uses it.
            unsafe { crate::sys::munmap_range(&v.range) };
        } else {
            // SAFETY: application memory backed by one of our arenas; the
            // child is single-threaded here, so nothing writes it meanwhile.
            if let Err(e) = unsafe { crate::sys::replace_with_private_copy(&v.range, v.prot()) } {
                log::error!("child after fork: cannot copy {:#x?}: {e}", v.range);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    struct NoPublish;
    impl Publisher for NoPublish {
        fn publish(&self, _: u32, _: &OwnedFd) -> io::Result<()> {
            Ok(())
        }
        fn retire(&self, _: u32) {}
    }

    fn arenas(policy: Policy) -> Arenas {
        Arenas::new(
            Config {
                policy,
                chunk: 2 * regcache::page_size(),
                restore_on_retire: false,
            },
            Box::new(NoPublish),
            None,
        )
    }

    /// Anonymous private pages owned by the test.
    struct Anon {
        ptr: *mut u8,
        len: usize,
    }
    // SAFETY: the test threads only access the mapping through raw
    // volatile/atomic accesses.
    unsafe impl Send for Anon {}
    // SAFETY: as above.
    unsafe impl Sync for Anon {}
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
        #[allow(clippy::mut_from_ref)]
        fn bytes(&self) -> &mut [u8] {
            // SAFETY: the mapping is live for `self` and only this test uses
            // it, from one thread at a time (tests with a writer thread use
            // `word` instead).
            unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
        }
        fn word(&self, i: usize) -> &std::sync::atomic::AtomicU64 {
            assert!((i + 1) * 8 <= self.len);
            // SAFETY: in bounds, aligned (page-aligned base), live for `self`;
            // all concurrent accesses go through atomics.
            unsafe { &*(self.ptr as *const std::sync::atomic::AtomicU64).add(i) }
        }
        fn range(&self) -> UserRange {
            // SAFETY: `self` outlives the registrations of the tests.
            unsafe { UserRange::new(self.ptr as usize, self.len) }
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
        let a = arenas(Policy::Remap);
        let page = regcache::page_size();
        let mem = Anon::new(4 * page);
        let base = mem.ptr as usize;
        for (i, b) in mem.bytes().iter_mut().enumerate() {
            *b = i as u8;
        }
        // SAFETY: `mem` outlives the registration.
        let r = unsafe { UserRange::new(base, 2 * page) };
        let ext = a.pin(&r).unwrap();
        assert_eq!(ext.len(), 1);
        assert_ne!(ext[0].arena, CMA);
        assert_eq!(ext[0].len as usize, 2 * page);
        for (i, b) in mem.bytes().iter().enumerate() {
            assert_eq!(*b, i as u8, "contents preserved");
        }
        let shadow = a.shadow(ext[0].arena).unwrap();
        assert!(shadow.write(100, b"Z"));
        assert_eq!(mem.bytes()[100], b'Z');
        // Inside the arena: reused, even where it covers pages partly.
        // SAFETY: as above.
        let r2 = unsafe { UserRange::new(base + 10, 16) };
        let ext2 = a.pin(&r2).unwrap();
        assert_eq!(ext2.len(), 1);
        assert_eq!(ext2[0].arena, ext[0].arena);
        // Past the arena: its last page, only partly covered, stays in place.
        // SAFETY: as above.
        let r3 = unsafe { UserRange::new(base, 2 * page + 10) };
        let ext3 = a.pin(&r3).unwrap();
        assert_eq!(ext3.len(), 2);
        assert_eq!(ext3[0].arena, ext[0].arena);
        assert_eq!(ext3[1].arena, CMA);
        a.unpin(&ext3);
        a.unpin(&ext2);
        assert_eq!(a.live(), 1);
        a.unpin(&ext);
        assert_eq!(a.live(), 0);
        mem.bytes()[5] = 9;
        assert_eq!(mem.bytes()[5], 9);
    }

    #[test]
    fn untouched_pages_are_not_copied() {
        let a = arenas(Policy::Remap);
        let page = regcache::page_size();
        let mem = Anon::new(64 * page);
        mem.bytes()[3 * page] = 7;
        let ext = a.pin(&mem.range()).unwrap();
        let s = a.stats();
        assert_eq!(s.bytes_backed as usize, 64 * page);
        assert_eq!(s.bytes_moved as usize, page, "only the touched page");
        assert_eq!(mem.bytes()[3 * page], 7);
        assert_eq!(mem.bytes()[5 * page], 0);
        mem.bytes()[5 * page] = 1;
        let shadow = a.shadow(ext[0].arena).unwrap();
        let mut b = [0u8];
        assert!(shadow.read(5 * page, &mut b));
        assert_eq!(b[0], 1, "a page touched after the move lands in the arena");
        a.unpin(&ext);
    }

    #[test]
    fn partly_covered_pages_stay_in_place() {
        let a = arenas(Policy::Remap);
        let page = regcache::page_size();
        let mem = Anon::new(4 * page);
        let base = mem.ptr as usize;
        for (i, b) in mem.bytes().iter_mut().enumerate() {
            *b = (i * 7) as u8;
        }
        // SAFETY: `mem` outlives the registration.
        let r = unsafe { UserRange::new(base + 100, 3 * page) };
        let ext = a.pin(&r).unwrap();
        let kinds: Vec<bool> = ext.iter().map(|e| e.arena == CMA).collect();
        assert_eq!(kinds, [true, false, true]);
        assert_eq!(ext[1].va as usize, base + page);
        assert_eq!(ext[1].len as usize, 2 * page);
        assert_eq!(ext.iter().map(|e| e.len).sum::<u64>() as usize, 4 * page);
        for (i, b) in mem.bytes().iter().enumerate() {
            assert_eq!(*b, (i * 7) as u8, "contents preserved");
        }
        a.unpin(&ext);
        assert_eq!(a.live(), 0);
    }

    #[test]
    fn cma_policy_moves_nothing() {
        let a = arenas(Policy::Cma);
        let mem = Anon::new(3 * regcache::page_size());
        let ext = a.pin(&mem.range()).unwrap();
        assert!(ext.iter().all(|e| e.arena == CMA));
        assert_eq!(a.live(), 0);
    }

    #[test]
    fn unmapped_range_is_refused() {
        let a = arenas(Policy::Remap);
        // SAFETY: the range is never touched: pin must refuse it.
        let r = unsafe { UserRange::new(0x1000, 4096) };
        assert_eq!(a.pin(&r).unwrap_err().kind(), io::ErrorKind::InvalidInput);
    }

    /// A writer thread stores a distinct value, once, into every 8th word
    /// of the range, in a scattered order, while the range moves into an
    /// arena (many write-protected chunks). Afterwards every word holds its
    /// value: no write went to the old pages. (Without the protection this
    /// loses writes: a store between the copy of a chunk and the mapping
    /// that replaces it lands in the page being dropped.)
    ///
    /// The writer holds its last store until the move has ended, so it is
    /// still writing then whatever the scheduling. A round in which it made
    /// no progress at all during the move (starved on a loaded machine)
    /// proves nothing and is run again, a few times at most.
    #[test]
    fn no_write_is_lost_while_pages_move() {
        no_write_is_lost(|| arenas(Policy::Remap));
    }

    /// [`no_write_is_lost_while_pages_move`] with the mover of a kernel
    /// without `WP_UNPOPULATED` (before 6.4), whatever this kernel has:
    /// write protection plus missing-page faults. About half the pages
    /// are still empty when the move starts, so many stores are first
    /// touches, which write protection alone lets through. (Here the
    /// window is narrow: with write protection alone this test lost no
    /// write on Linux 6.18. The C program `regrace` on the Soft-RoCE VM's
    /// Linux 6.1 lost 12,479 of 524,288 without any protection; it loses
    /// none with this mover: `tools/verbs-vm.sh c`.)
    #[test]
    fn no_write_is_lost_while_pages_move_without_wp_unpopulated() {
        no_write_is_lost(|| {
            let mut a = arenas(Policy::Remap);
            a.mover = Uffd::open(uffd::feature::WP_HUGETLBFS_SHMEM)
                .or_else(|_| Uffd::open(0))
                .ok();
            a.move_mode = uffd::mode::WP | uffd::mode::MISSING;
            a
        });
    }

    fn no_write_is_lost(make: impl Fn() -> Arenas) {
        let page = regcache::page_size();
        for _ in 0..5 {
            let a = make();
            if a.mover.is_none() {
                eprintln!("SKIPPED (no userfaultfd write protection on this kernel)");
                return;
            }
            let mem = Arc::new(Anon::new(2048 * page));
            let slots = mem.len / 64;
            let done = Arc::new(AtomicU64::new(0));
            let moved = Arc::new(AtomicBool::new(false));
            let writer = {
                let (mem, done, moved) = (mem.clone(), done.clone(), moved.clone());
                std::thread::spawn(move || {
                    // A fixed odd multiplier walks every slot once, scattered.
                    for k in 0..slots {
                        if k == slots - 1 {
                            // Acquire: pairs with the Release after the move.
                            while !moved.load(Ordering::Acquire) {
                                std::hint::spin_loop();
                            }
                        }
                        let i = (k * 40503) % slots;
                        mem.word(i * 8).store(i as u64 + 1, Ordering::Relaxed);
                        done.store(k as u64 + 1, Ordering::Release);
                        for _ in 0..20 {
                            std::hint::spin_loop();
                        }
                    }
                })
            };
            while done.load(Ordering::Acquire) < (slots / 100) as u64 {
                std::hint::spin_loop();
            }
            let before = done.load(Ordering::Acquire);
            let ext = a.pin(&mem.range()).unwrap();
            let during = done.load(Ordering::Acquire);
            // Release: the writer's last store comes after the move.
            moved.store(true, Ordering::Release);
            writer.join().unwrap();
            assert!(a.stats().chunks >= 1000, "moved in many protected steps");
            assert!(during < slots as u64, "the last store waits for the move");
            let lost: Vec<usize> = (0..slots)
                .filter(|&i| mem.word(i * 8).load(Ordering::Relaxed) != i as u64 + 1)
                .collect();
            assert!(lost.is_empty(), "{} of {slots} writes lost", lost.len());
            // And the arena is what the program sees.
            let shadow = a.shadow(ext[0].arena).unwrap();
            assert_eq!(shadow.load_u64(64), 2);
            a.unpin(&ext);
            if during > before {
                return;
            }
            eprintln!("the writer made no progress during the move; again");
        }
        panic!("in five rounds the writer never wrote while the pages moved");
    }
}
