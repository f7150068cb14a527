//! Owned mappings of shared memory files, with bounds-checked access.
//!
//! Every byte the provider moves between processes goes through a
//! [`Mapping`]: the offsets come from memory another process can write, so
//! each access checks `off + len <= self.len()` and fails instead of touching
//! memory outside the mapping.

use crate::sys::CmaDir;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64};

/// A type that may be viewed in place in shared memory.
///
/// # Safety
/// The implementor is `#[repr(C)]`, every field is an atomic integer, an
/// array of them, or another `Shared` type (so concurrent writes by other
/// processes are not data races), every bit pattern is a valid value (all-zero
/// is the initial state of a fresh memory file), and its alignment is at most
/// 64.
pub unsafe trait Shared: Sync {}

// SAFETY: atomics are valid for every bit pattern and tolerate concurrent access.
unsafe impl Shared for AtomicU32 {}
// SAFETY: as above.
unsafe impl Shared for AtomicU64 {}

/// Hints the CPU to start fetching the cache line of `r` (a line another
/// core is likely to own), so that a later access finds it sooner. Never
/// faults and changes nothing observable.
#[inline]
pub fn prefetch<T>(r: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `prefetcht0` is part of SSE, which every x86_64 CPU has; a
    // prefetch of a valid reference has no side effect besides the cache.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(
            (r as *const T).cast(),
        )
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = r;
}

/// [`prefetch`] for every cache line of `r` (for a `T` larger than one line).
#[inline]
pub fn prefetch_lines<T>(r: &T) {
    let base = r as *const T as usize;
    let mut off = 0;
    while off < size_of::<T>() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as in `prefetch`: a hint on an address inside a valid
        // reference, with no side effect besides the cache.
        unsafe {
            core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(
                (base + off) as *const i8,
            )
        };
        off += 64;
    }
    let _ = base;
}

/// An owned `mmap` of (part of) a memory file, unmapped on drop; or a
/// borrowed window on registered memory of this process (see
/// [`UserRange::borrow`](crate::mem::arena::UserRange::borrow)), never unmapped.
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    owned: bool,
}

// SAFETY: the mapping is plain memory; all access goes through atomics or
// bounds-checked byte copies, so it may be shared and sent between threads.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `fd` at `offset`, shared and read-write.
    pub fn map_shared(fd: &OwnedFd, offset: u64, len: usize) -> io::Result<Mapping> {
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty mapping"));
        }
        let off = libc::off_t::try_from(offset)
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: a new mapping at an address chosen by the kernel does not
        // alias any Rust object.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                off,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping {
            ptr: NonNull::new(p.cast()).expect("mmap returned NULL"),
            len,
            owned: true,
        })
    }

    /// Creates a memory file of `len` bytes (zero-filled) and maps it.
    pub fn create(name: &str, len: usize) -> io::Result<(OwnedFd, Mapping)> {
        let fd = crate::sys::memfd_create(name)?;
        crate::sys::ftruncate(&fd, len as u64)?;
        let map = Mapping::map_shared(&fd, 0, len)?;
        Ok((fd, map))
    }

    /// Maps `len` bytes of private anonymous memory (for registered memory).
    pub fn anonymous(len: usize) -> io::Result<Mapping> {
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty mapping"));
        }
        // SAFETY: a new mapping at an address chosen by the kernel does not
        // alias any Rust object.
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
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping {
            ptr: NonNull::new(p.cast()).expect("mmap returned NULL"),
            len,
            owned: true,
        })
    }

    /// `len` bytes at `off` of this mapping as a range to register, if
    /// inside it. Safe: the pages belong to this mapping alone (no other data
    /// shares them), and access goes through copies; the caller keeps `self`
    /// alive until the registration is gone.
    pub fn user_range_of(&self, off: usize, len: usize) -> Option<crate::mem::arena::UserRange> {
        if !self.check(off, len) {
            return None;
        }
        // SAFETY: inside this mapping (checked), whose pages hold nothing but
        // what its owner puts there and stay mapped while it lives.
        Some(unsafe { crate::mem::arena::UserRange::new(self.addr() + off, len) })
    }

    /// A window on `len` bytes of this process's memory at `addr`, which the
    /// window does not own (dropping it unmaps nothing).
    ///
    /// # Safety
    /// `addr..addr + len` must stay mapped and readable/writable by this
    /// process for as long as the window (and any clone of an `Arc` holding
    /// it) is used.
    pub(crate) unsafe fn borrowed(addr: usize, len: usize) -> Option<Mapping> {
        Some(Mapping {
            ptr: NonNull::new(addr as *mut u8)?,
            len,
            owned: false,
        })
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether this is a window on memory the library does not own
    /// ([`Mapping::borrowed`]): valid only while its owner keeps it mapped.
    pub fn is_borrowed(&self) -> bool {
        !self.owned
    }

    /// Whether the mapping is empty (never true: mappings are non-empty).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Address of the first byte (for logs and tests).
    pub fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    fn check(&self, off: usize, len: usize) -> bool {
        off.checked_add(len).is_some_and(|end| end <= self.len)
    }

    /// Views a `T` at byte offset `off`; `None` if out of bounds or misaligned.
    pub fn view<T: Shared>(&self, off: usize) -> Option<&T> {
        if !self.check(off, size_of::<T>()) || (self.addr() + off) % align_of::<T>() != 0 {
            return None;
        }
        // SAFETY: in bounds and aligned (checked above); `T: Shared` makes any
        // bit pattern valid and concurrent access race-free; the reference
        // borrows `self`, so the memory stays mapped while it lives.
        Some(unsafe { &*self.ptr.as_ptr().add(off).cast::<T>() })
    }

    /// Views a `T` at byte offset `off` without a check, for a caller that
    /// checked the bounds and alignment once for many views (a NIC
    /// segment's tables: `layout::Segment`).
    ///
    /// # Safety
    /// `off + size_of::<T>() <= self.len()`, and `self.addr() + off` is
    /// aligned for `T`.
    #[inline(always)]
    pub unsafe fn view_unchecked<T: Shared>(&self, off: usize) -> &T {
        // SAFETY: in bounds and aligned (the caller's contract); otherwise
        // as in `view`.
        unsafe { &*self.ptr.as_ptr().add(off).cast::<T>() }
    }

    /// Views `count` consecutive `T`s at `off`.
    pub fn slice<T: Shared>(&self, off: usize, count: usize) -> Option<&[T]> {
        let bytes = size_of::<T>().checked_mul(count)?;
        if !self.check(off, bytes) || (self.addr() + off) % align_of::<T>() != 0 {
            return None;
        }
        // SAFETY: as in `view`, for `count` elements.
        Some(unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(off).cast::<T>(), count) })
    }

    /// Loads the 8-byte word at `off` (relaxed; `off` 8-aligned), or 0 out of bounds.
    pub fn load_u64(&self, off: usize) -> u64 {
        self.view::<AtomicU64>(off)
            .map_or(0, |w| w.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Loads the 4-byte word at `off` (relaxed; `off` 4-aligned), or 0 out of bounds.
    pub fn load_u32(&self, off: usize) -> u32 {
        self.view::<AtomicU32>(off)
            .map_or(0, |w| w.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Stores the 4-byte word at `off` (4-aligned) with `order`; false out of bounds.
    pub fn store_u32(&self, off: usize, v: u32, order: std::sync::atomic::Ordering) -> bool {
        self.view::<AtomicU32>(off)
            .map(|w| w.store(v, order))
            .is_some()
    }

    /// The atomic word at `off` (must be 4-byte aligned).
    pub fn u32_at(&self, off: usize) -> Option<&AtomicU32> {
        self.view::<AtomicU32>(off)
    }

    /// The atomic 8-byte word at `off` (must be 8-byte aligned).
    pub fn u64_at(&self, off: usize) -> Option<&AtomicU64> {
        self.view::<AtomicU64>(off)
    }

    /// Stores the last 8 bytes of an RDMA write, after the rest: one
    /// Release store of the word at `off` where it is 8-byte aligned (a
    /// reader that sees it with an Acquire load sees the bytes written
    /// before it), else as bytes. `false` if out of bounds.
    pub fn store_tail(&self, off: usize, tail: [u8; 8]) -> bool {
        match self.u64_at(off) {
            Some(w) => {
                w.store(
                    u64::from_ne_bytes(tail),
                    std::sync::atomic::Ordering::Release,
                );
                true
            }
            None => self.write(off, &tail),
        }
    }

    /// Copies `dst.len()` bytes out of the mapping. `false` if out of bounds.
    pub fn read(&self, off: usize, dst: &mut [u8]) -> bool {
        if !self.check(off, dst.len()) {
            return false;
        }
        // SAFETY: the source range is inside the mapping (checked); `dst` is a
        // distinct Rust buffer. Another process may write the source
        // concurrently: the bytes read are then unspecified, never unsafe.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(off), dst.as_mut_ptr(), dst.len())
        };
        true
    }

    /// Copies `src` into the mapping. `false` if out of bounds.
    pub fn write(&self, off: usize, src: &[u8]) -> bool {
        if !self.check(off, src.len()) {
            return false;
        }
        // SAFETY: the destination range is inside the mapping (checked);
        // `src` is a distinct Rust buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr().add(off), src.len())
        };
        true
    }

    /// Copies `len` bytes from `src[src_off..]` to `dst[dst_off..]`.
    /// `false` (and nothing copied) if either range is out of bounds.
    pub fn copy(src: &Mapping, src_off: usize, dst: &Mapping, dst_off: usize, len: usize) -> bool {
        if !src.check(src_off, len) || !dst.check(dst_off, len) {
            return false;
        }
        // SAFETY: both ranges are inside their mappings (checked). They may
        // be two views of the same pages, so use `copy` (memmove semantics).
        unsafe {
            std::ptr::copy(
                src.ptr.as_ptr().add(src_off),
                dst.ptr.as_ptr().add(dst_off),
                len,
            )
        };
        true
    }

    /// [`Mapping::write`] of a message that another process reads next (as
    /// [`Mapping::copy_for_reader`]).
    pub fn write_for_reader(&self, off: usize, src: &[u8]) -> bool {
        if !self.write(off, src) {
            return false;
        }
        super::demote(self.addr() + off, src.len());
        true
    }

    /// [`Mapping::copy`] of a message that another process reads next: its
    /// lines are then pushed towards the shared cache ([`super::demote`]).
    #[inline(always)]
    pub fn copy_for_reader(
        src: &Mapping,
        src_off: usize,
        dst: &Mapping,
        dst_off: usize,
        len: usize,
    ) -> bool {
        if !src.check(src_off, len) || !dst.check(dst_off, len) {
            return false;
        }
        // SAFETY: as in `copy`.
        let to = unsafe { dst.ptr.as_ptr().add(dst_off) };
        // SAFETY: as in `copy`: both ranges are inside their mappings.
        unsafe { std::ptr::copy(src.ptr.as_ptr().add(src_off), to, len) };
        super::demote(to.addr(), len);
        true
    }

    /// Fills `len` bytes at `off` with zero.
    pub fn zero(&self, off: usize, len: usize) -> bool {
        if !self.check(off, len) {
            return false;
        }
        // SAFETY: the range is inside the mapping (checked).
        unsafe { std::ptr::write_bytes(self.ptr.as_ptr().add(off), 0, len) };
        true
    }

    /// Pointer to `off` if `off + len` is inside the mapping. Using it is the
    /// caller's business (ring views in `shm::rings`).
    pub fn raw(&self, off: usize, len: usize) -> Option<NonNull<u8>> {
        // SAFETY: in bounds (checked), so the pointer stays inside the mapping.
        self.check(off, len)
            .then(|| unsafe { NonNull::new_unchecked(self.ptr.as_ptr().add(off)) })
    }

    /// Moves `len` bytes from another process's memory at `remote` into the
    /// mapping at `off` (`process_vm_readv`). `Ok(false)` if out of bounds.
    pub fn cma_read_into(&self, off: usize, len: usize, pid: i32, remote: u64) -> io::Result<bool> {
        self.cma(off, len, pid, remote, CmaDir::Read)
    }

    /// Moves `len` bytes at `off` of the mapping into another process's
    /// memory at `remote` (`process_vm_writev`). `Ok(false)` if out of bounds.
    pub fn cma_write_from(
        &self,
        off: usize,
        len: usize,
        pid: i32,
        remote: u64,
    ) -> io::Result<bool> {
        self.cma(off, len, pid, remote, CmaDir::Write)
    }

    fn cma(&self, off: usize, len: usize, pid: i32, remote: u64, dir: CmaDir) -> io::Result<bool> {
        if !self.check(off, len) {
            return Ok(false);
        }
        // SAFETY: `off..off + len` lies inside the mapping (checked above),
        // which lives as long as `self`.
        let n = unsafe {
            crate::sys::process_vm_raw(pid, self.ptr.as_ptr().add(off), len, remote, dir)
        }?;
        if n != len {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "short cross-memory transfer",
            ));
        }
        Ok(true)
    }

    /// Creates a second mapping of the same pages (`mremap` with
    /// `old_size == 0`), used to get a library-owned view of pages that are
    /// also mapped elsewhere.
    pub fn duplicate(&self, off: usize, len: usize) -> io::Result<Mapping> {
        if !self.check(off, len) || len == 0 {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        }
        // SAFETY: the source is a shared mapping we own; mremap with
        // old_size 0 creates a new mapping and leaves the old one intact.
        unsafe { dup_mapping(self.ptr.as_ptr().add(off) as usize, len) }
    }
}

/// Maps the same pages as the shared mapping at `addr` a second time.
///
/// # Safety
/// `addr..addr + len` must lie in a `MAP_SHARED` mapping of this process.
pub(crate) unsafe fn dup_mapping(addr: usize, len: usize) -> io::Result<Mapping> {
    // SAFETY: guaranteed by the caller; the new mapping is chosen by the kernel.
    let p = unsafe { libc::mremap(addr as *mut libc::c_void, 0, len, libc::MREMAP_MAYMOVE) };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(Mapping {
        ptr: NonNull::new(p.cast()).expect("mremap returned NULL"),
        len,
        owned: true,
    })
}

/// Eight 32-bit words of a mapping (a descriptor's control segment),
/// checked once to lie in it aligned, then reached through a kept pointer
/// without a check each time: a work queue's status location is cleared at
/// post, polled by every `Vip*Done`, and completed, and each of those
/// would otherwise repeat the same bounds and alignment test.
#[derive(Clone, Debug)]
pub struct Block {
    map: Arc<Mapping>,
    words: NonNull<[AtomicU32; 8]>,
}

// SAFETY: a `Block` is an `Arc<Mapping>` (Send and Sync) plus a pointer
// into that mapping's memory, which is accessed only as atomics.
unsafe impl Send for Block {}
// SAFETY: as above.
unsafe impl Sync for Block {}

impl Block {
    /// The 32 bytes at `off` of `map`; `None` if out of bounds or not
    /// 4-byte aligned.
    #[inline]
    pub fn new(map: &Arc<Mapping>, off: usize) -> Option<Block> {
        Some(Block {
            words: Self::words_at(map, off)?,
            map: map.clone(),
        })
    }

    #[inline(always)]
    fn words_at(map: &Mapping, off: usize) -> Option<NonNull<[AtomicU32; 8]>> {
        let s = map.slice::<AtomicU32>(off, 8)?;
        Some(NonNull::from(s).cast())
    }

    /// Moves to the 32 bytes at `off` of `map`, keeping the reference to
    /// the mapping when it is the same one (no count change: the common
    /// case of a work queue's slot reused for a descriptor of the same
    /// region). False, and unchanged, if out of bounds or misaligned.
    #[inline(always)]
    pub fn set(&mut self, map: &Arc<Mapping>, off: usize) -> bool {
        let Some(words) = Self::words_at(map, off) else {
            return false;
        };
        if !Arc::ptr_eq(&self.map, map) {
            self.map = map.clone();
        }
        self.words = words;
        true
    }

    /// The eight words.
    /// The mapping the block is in.
    pub fn mapping(&self) -> &Arc<Mapping> {
        &self.map
    }

    #[inline(always)]
    pub fn words(&self) -> &[AtomicU32; 8] {
        // SAFETY: `words` points at 32 bytes inside `map`, 4-byte aligned
        // (checked when set); the `Arc` keeps the mapping alive as long as
        // `self`, and the reference borrows `self`. Atomics make concurrent
        // access by other processes race-free.
        unsafe { self.words.as_ref() }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if self.owned {
            // SAFETY: we own the mapping; no reference derived from it
            // outlives `self` (views borrow `self`).
            unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_checked() {
        let (_fd, m) = Mapping::create("via-test", 4096).unwrap();
        assert!(m.write(4090, &[1; 6]));
        assert!(!m.write(4091, &[1; 6]));
        assert!(!m.write(usize::MAX, &[1]));
        let mut b = [0u8; 6];
        assert!(m.read(4090, &mut b));
        assert_eq!(b, [1; 6]);
        assert!(m.view::<AtomicU64>(4096).is_none());
        assert!(m.view::<AtomicU64>(4).is_none(), "misaligned");
        assert!(m.slice::<AtomicU64>(0, 512).is_some());
        assert!(m.slice::<AtomicU64>(0, 513).is_none());
    }

    #[test]
    fn a_block_is_checked_once_where_it_is_set() {
        let a = Arc::new(Mapping::anonymous(4096).unwrap());
        let b = Arc::new(Mapping::anonymous(4096).unwrap());
        assert!(Block::new(&a, 4096 - 28).is_none(), "past the end");
        assert!(Block::new(&a, 2).is_none(), "misaligned");
        assert!(Block::new(&a, usize::MAX).is_none());
        let mut k = Block::new(&a, 4096 - 32).unwrap();
        k.words()[7].store(7, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(a.load_u32(4092), 7);
        assert!(!k.set(&b, 4096 - 31), "refused, and unchanged");
        k.words()[0].store(1, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(a.load_u32(4096 - 32), 1);
        assert!(k.set(&b, 64));
        k.words()[1].store(5, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(b.load_u32(68), 5);
        drop(b);
        // The block keeps its mapping alive.
        assert_eq!(k.words()[1].load(std::sync::atomic::Ordering::Relaxed), 5);
    }

    #[test]
    fn a_copy_for_a_reader_is_a_checked_copy() {
        // Lengths on one line, across lines, many lines and beyond what is
        // demoted; offsets aligned and not: each copies exactly its bytes
        // (the demotion changes nothing the program sees).
        let (_fd, m) = Mapping::create("via-test", 8192).unwrap();
        let src: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 1) as u8).collect();
        assert!(m.write(0, &src));
        for (i, &(off, len)) in [
            (4096, 1),
            (4096 + 60, 8),
            (4096 + 3, 200),
            (4096 + 64, 1024),
        ]
        .iter()
        .chain(&[(4096 + 5, 2000), (4096, 4096)])
        .enumerate()
        {
            assert!(m.zero(4096, 4096));
            let from = i.min(4096 - len);
            assert!(
                Mapping::copy_for_reader(&m, from, &m, off, len),
                "{off} {len}"
            );
            let mut got = vec![0u8; 4096];
            assert!(m.read(4096, &mut got));
            let at = off - 4096;
            assert_eq!(&got[at..at + len], &src[from..from + len], "{off} {len}");
            assert!(
                got[..at].iter().chain(&got[at + len..]).all(|&b| b == 0),
                "{off} {len}"
            );
        }
        // The same for a write from a buffer.
        assert!(m.zero(4096, 4096));
        assert!(m.write_for_reader(4096 + 70, &src[..300]));
        let mut got = vec![0u8; 300];
        assert!(m.read(4096 + 70, &mut got));
        assert_eq!(got, src[..300]);
        assert!(!m.write_for_reader(8192 - 4, &src[..8]));
        // Out of bounds: refused, nothing written.
        assert!(m.zero(4096, 4096));
        assert!(!Mapping::copy_for_reader(&m, 0, &m, 8192 - 4, 8));
        assert!(!Mapping::copy_for_reader(&m, 8190, &m, 4096, 8));
        assert!(!Mapping::copy_for_reader(&m, 0, &m, usize::MAX, 1));
        let mut got = vec![1u8; 4096];
        assert!(m.read(4096, &mut got));
        assert!(got.iter().all(|&b| b == 0));
    }

    #[test]
    fn two_mappings_share_pages() {
        let (fd, a) = Mapping::create("via-test", 8192).unwrap();
        let b = Mapping::map_shared(&fd, 4096, 4096).unwrap();
        assert!(a.write(4096 + 10, b"hello"));
        let mut out = [0u8; 5];
        assert!(b.read(10, &mut out));
        assert_eq!(&out, b"hello");
        let c = a.duplicate(4096, 4096).unwrap();
        assert!(c.write(0, b"x"));
        let mut one = [0u8; 1];
        assert!(b.read(0, &mut one));
        assert_eq!(&one, b"x");
        assert!(Mapping::copy(&a, 4096, &a, 0, 16));
        assert!(!Mapping::copy(&a, 8190, &a, 0, 16));
    }
}
