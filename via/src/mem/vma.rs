//! What backs an address range of this process: the mappings (VMAs) over it
//! and which of their pages were ever touched.
//!
//! Mappings come from the `PROCMAP_QUERY` ioctl on `/proc/self/maps`
//! (Linux 6.11+): one call per mapping, in time logarithmic in the number of
//! mappings, so registering costs the same with 50 or 50,000 mappings. Older
//! kernels fall back to reading `/proc/self/maps`, whose cost grows with the
//! number of mappings (measured in the README). Touched pages come from
//! `/proc/self/pagemap` (present or swapped bits; no privilege needed).

use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::sync::OnceLock;

/// One mapping, restricted to what the registration path needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Vma {
    /// Addresses it covers.
    pub range: Range<usize>,
    /// Readable.
    pub read: bool,
    /// Writable.
    pub write: bool,
    /// Executable.
    pub exec: bool,
    /// `MAP_SHARED`.
    pub shared: bool,
    /// Offset in the file (bytes) of `range.start`.
    pub offset: u64,
    /// Inode of the file, 0 for anonymous memory.
    pub inode: u64,
    /// Name (`[heap]`, `[stack]`, a path, `/memfd:name (deleted)`, or empty).
    pub name: String,
}

impl Vma {
    /// `PROT_*` bits of the mapping.
    pub fn prot(&self) -> i32 {
        (if self.read { libc::PROT_READ } else { 0 })
            | (if self.write { libc::PROT_WRITE } else { 0 })
            | (if self.exec { libc::PROT_EXEC } else { 0 })
    }

    /// Private anonymous memory that registration may move into shared
    /// memory: heap, `.bss`, anonymous `mmap`, thread stacks. Not special
    /// mappings, files, or shared memory.
    pub fn movable(&self) -> bool {
        !self.shared
            && self.inode == 0
            && (self.name.is_empty() || self.name == "[heap]" || self.name.starts_with("[anon"))
    }
}

#[repr(C)]
#[derive(Default)]
struct ProcmapQuery {
    size: u64,
    query_flags: u64,
    query_addr: u64,
    vma_start: u64,
    vma_end: u64,
    vma_flags: u64,
    vma_page_size: u64,
    vma_offset: u64,
    inode: u64,
    dev_major: u32,
    dev_minor: u32,
    vma_name_size: u32,
    build_id_size: u32,
    vma_name_addr: u64,
    build_id_addr: u64,
}

const PROCMAP_QUERY: u64 = (3 << 30) | (104 << 16) | ((b'f' as u64) << 8) | 17;
const COVERING_OR_NEXT_VMA: u64 = 0x10;

fn maps_file() -> Option<&'static File> {
    static F: OnceLock<Option<File>> = OnceLock::new();
    F.get_or_init(|| File::open("/proc/self/maps").ok())
        .as_ref()
}

/// The mapping that contains `addr`, or the first one after it. `Ok(None)`
/// past the last mapping; `Unsupported` if the kernel has no `PROCMAP_QUERY`.
fn query(addr: usize) -> io::Result<Option<Vma>> {
    let f = maps_file().ok_or_else(|| io::Error::from(io::ErrorKind::Unsupported))?;
    let mut name = [0u8; 256];
    let mut q = ProcmapQuery {
        size: std::mem::size_of::<ProcmapQuery>() as u64,
        query_flags: COVERING_OR_NEXT_VMA,
        query_addr: addr as u64,
        vma_name_size: name.len() as u32,
        vma_name_addr: name.as_mut_ptr() as u64,
        ..Default::default()
    };
    // SAFETY: `q` is a live #[repr(C)] struct of the size encoded in the
    // request; the kernel writes at most `vma_name_size` bytes to `name`,
    // which outlives the call.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), PROCMAP_QUERY as _, &mut q) };
    if r == -1 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENOENT) => Ok(None),
            Some(libc::ENOTTY) | Some(libc::EINVAL) => {
                Err(io::Error::from(io::ErrorKind::Unsupported))
            }
            _ => Err(e),
        };
    }
    let n = (q.vma_name_size as usize).min(name.len());
    let name = &name[..n];
    let name = name.strip_suffix(&[0]).unwrap_or(name);
    Ok(Some(Vma {
        range: q.vma_start as usize..q.vma_end as usize,
        read: q.vma_flags & 1 != 0,
        write: q.vma_flags & 2 != 0,
        exec: q.vma_flags & 4 != 0,
        shared: q.vma_flags & 8 != 0,
        offset: q.vma_offset,
        inode: q.inode,
        name: String::from_utf8_lossy(name).into_owned(),
    }))
}

/// The mappings that overlap `range`, in address order (whole mappings:
/// they may extend beyond `range`).
///
/// # Errors
/// Errors of the query or of reading `/proc/self/maps`.
pub fn mappings(range: &Range<usize>) -> io::Result<Vec<Vma>> {
    let mut out = Vec::new();
    let mut at = range.start;
    while at < range.end {
        match query(at) {
            Ok(Some(v)) => {
                if v.range.start >= range.end {
                    break;
                }
                at = v.range.end;
                out.push(v);
            }
            Ok(None) => break,
            Err(e) if e.kind() == io::ErrorKind::Unsupported => return read_maps(range),
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// Whether the fast query works on this kernel (for logs and the README).
pub fn fast_query() -> bool {
    !matches!(query(0), Err(ref e) if e.kind() == io::ErrorKind::Unsupported)
}

/// Fallback for kernels before 6.11: parses `/proc/self/maps`.
fn read_maps(range: &Range<usize>) -> io::Result<Vec<Vma>> {
    let text = std::fs::read_to_string("/proc/self/maps")?;
    let mut out = Vec::new();
    for line in text.lines() {
        let Some(v) = parse_maps_line(line) else {
            continue;
        };
        if v.range.end <= range.start {
            continue;
        }
        if v.range.start >= range.end {
            break;
        }
        out.push(v);
    }
    Ok(out)
}

/// Parses one line of `/proc/<pid>/maps`.
pub fn parse_maps_line(line: &str) -> Option<Vma> {
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
    let inode = it.next()?.parse().ok()?;
    let name = it.next().unwrap_or("").trim_start().to_string();
    Some(Vma {
        range: start..end,
        read: p[0] == b'r',
        write: p[1] == b'w',
        exec: p[2] == b'x',
        shared: p[3] == b's',
        offset,
        inode,
        name,
    })
}

/// Runs of pages in `range` (page aligned) that hold data: present in
/// memory or swapped out. Pages never touched read as zero and need no copy.
///
/// # Errors
/// Errors reading `/proc/self/pagemap`; callers then copy everything.
pub fn touched(range: &Range<usize>) -> io::Result<Vec<Range<usize>>> {
    let page = regcache::page_size();
    let mut runs: Vec<Range<usize>> = Vec::new();
    scan_pagemap(range, TOUCHED, |i| {
        let a = range.start + i * page;
        match runs.last_mut() {
            Some(r) if r.end == a => r.end = a + page,
            _ => runs.push(a..a + page),
        }
    })?;
    Ok(runs)
}

/// Pagemap bits of a page holding data (present or swapped).
pub const TOUCHED: u64 = 3 << 62;
/// Pagemap bit of a present page.
pub const PRESENT: u64 = 1 << 63;

/// Calls `f(i)`, in order, for each page `i` of `range` (counted from its
/// start) with any of `bits` set in `/proc/self/pagemap`. Reads through a
/// buffer on the stack: allocates nothing and writes no heap memory.
fn scan_pagemap(range: &Range<usize>, bits: u64, mut f: impl FnMut(usize)) -> io::Result<()> {
    static F: OnceLock<Option<File>> = OnceLock::new();
    let file = F
        .get_or_init(|| File::open("/proc/self/pagemap").ok())
        .as_ref()
        .ok_or_else(|| io::Error::from(io::ErrorKind::Unsupported))?;
    let page = regcache::page_size();
    let first = range.start / page;
    let pages = (range.end - range.start) / page;
    let mut buf = [0u8; 8 * 64];
    let mut done = 0usize;
    while done < pages {
        let n = (pages - done).min(buf.len() / 8);
        let bytes = &mut buf[..n * 8];
        file.read_exact_at(bytes, ((first + done) * 8) as u64)?;
        for (i, e) in bytes.chunks_exact(8).enumerate() {
            if u64::from_ne_bytes(e.try_into().unwrap()) & bits != 0 {
                f(done + i);
            }
        }
        done += n;
    }
    Ok(())
}

/// Pages of one chunk being moved (at most [`PageBits::MAX_PAGES`]), one
/// bit each, kept on the mover's stack.
///
/// Why not a heap buffer: while a chunk is write-protected, any write into
/// it waits for the mover, which is this thread. The chunk may hold heap
/// blocks of the library itself (a merged cache entry spans memory the
/// application freed and the allocator handed out again), so a scratch
/// buffer on the heap could be inside it, and the mover would wait for
/// itself forever. The current thread's stack is never moved (`arena.rs`).
pub struct PageBits {
    words: [u64; PageBits::MAX_PAGES / 64],
    pages: usize,
}

impl PageBits {
    /// The largest chunk, in pages (16 MiB of 4 KiB pages: 512 bytes of bits).
    pub const MAX_PAGES: usize = 4096;

    /// No page of a chunk of `pages` pages set; `pages` at most
    /// [`PageBits::MAX_PAGES`].
    pub fn new(pages: usize) -> PageBits {
        assert!(pages <= Self::MAX_PAGES, "chunk of {pages} pages");
        PageBits {
            words: [0; Self::MAX_PAGES / 64],
            pages,
        }
    }

    /// Every page set.
    pub fn all(pages: usize) -> PageBits {
        let mut b = PageBits::new(pages);
        (0..pages).for_each(|i| b.set(i));
        b
    }

    fn set(&mut self, i: usize) {
        self.words[i / 64] |= 1 << (i % 64);
    }

    fn get(&self, i: usize) -> bool {
        self.words[i / 64] & (1 << (i % 64)) != 0
    }

    /// Sets the pages of `range` (the chunk, page aligned) with any of
    /// `bits` in `/proc/self/pagemap`. Writes only `self`.
    pub fn scan(&mut self, range: &Range<usize>, bits: u64) -> io::Result<()> {
        debug_assert_eq!(
            (range.end - range.start) / regcache::page_size(),
            self.pages
        );
        scan_pagemap(range, bits, |i| self.set(i))
    }

    /// Calls `f` with each maximal run of set pages, as page indices.
    pub fn for_each_run<E>(
        &self,
        mut f: impl FnMut(Range<usize>) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut i = 0;
        while i < self.pages {
            if !self.get(i) {
                i += 1;
                continue;
            }
            let start = i;
            while i < self.pages && self.get(i) {
                i += 1;
            }
            f(start..i)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_number() {
        // _IOWR('f', 17, struct procmap_query) from <linux/fs.h>.
        assert_eq!(PROCMAP_QUERY, 0xc0686611);
        assert_eq!(std::mem::size_of::<ProcmapQuery>(), 104);
    }

    #[test]
    fn parses_maps_lines() {
        let v =
            parse_maps_line("7f00-7f10 rw-s 00002000 00:01 123   /memfd:via-arena:7:3 (deleted)")
                .unwrap();
        assert_eq!(v.range, 0x7f00..0x7f10);
        assert!(v.read && v.write && !v.exec && v.shared);
        assert_eq!((v.offset, v.inode), (0x2000, 123));
        assert_eq!(v.name, "/memfd:via-arena:7:3 (deleted)");
        let v = parse_maps_line("55d0-55e0 rw-p 00000000 00:00 0 ").unwrap();
        assert!(v.movable());
        assert!(parse_maps_line("garbage").is_none());
    }

    #[test]
    fn query_agrees_with_the_maps_file() {
        let len = 3 * regcache::page_size();
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
        let r = p as usize..p as usize + len;
        let fast = mappings(&r).unwrap();
        let slow = read_maps(&r).unwrap();
        assert_eq!(fast.len(), 1, "{fast:?}");
        assert!(fast[0].range.start <= r.start && fast[0].range.end >= r.end);
        assert!(fast[0].movable());
        assert_eq!(fast[0].range, slow[0].range);
        // Nothing touched yet; then the middle page.
        assert!(touched(&r).unwrap().is_empty());
        // SAFETY: inside the mapping created above.
        unsafe { *(p as *mut u8).add(regcache::page_size()) = 1 };
        assert_eq!(
            touched(&r).unwrap(),
            vec![r.start + regcache::page_size()..r.start + 2 * regcache::page_size()]
        );
        let mut bits = PageBits::new(3);
        bits.scan(&r, TOUCHED).unwrap();
        let mut runs = Vec::new();
        bits.for_each_run(|x| {
            runs.push(x);
            Ok::<(), ()>(())
        })
        .unwrap();
        assert_eq!(runs, vec![1..2]);
        let mut runs = Vec::new();
        PageBits::all(3)
            .for_each_run(|x| {
                runs.push(x);
                Ok::<(), ()>(())
            })
            .unwrap();
        assert_eq!(runs, vec![0..3]);
        // SAFETY: we own the mapping.
        unsafe { libc::munmap(p, len) };
        assert!(
            mappings(&r)
                .unwrap()
                .iter()
                .all(|v| v.range != fast[0].range)
        );
    }
}
