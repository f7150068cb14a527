//! Hooks on the C library's `munmap`, `mremap` and `shmdt`, so that the
//! registration path knows when an unmap is *in flight*.
//!
//! Why: the userfaultfd events ([`super::monitor`]) come too late for one
//! case. The kernel frees the address first and queues the event after, so
//! another thread can map new memory at that address and register it before
//! any event exists: the lookup then hits the old memory's registration.
//! With the hooks, the unmapping thread counts itself in flight *before* its
//! system call and out after it returns (which is after its event was read),
//! and [`Monitor::sync`](super::monitor::Monitor::sync) waits until no unmap
//! is in flight before it applies the events read: a thread that found the
//! address free can only have found it after some hooked unmap began.
//!
//! Mechanism (UCX's "bistro" hooks, narrowed to whole replacements): the
//! first instruction of each function in libc becomes a 5-byte `jmp` to a
//! trampoline page allocated within ±2 GiB, which jumps to the replacement
//! here. The replacement makes the system call itself through `syscall(2)`
//! and never returns into the original, so nothing of the original is copied
//! or relocated. glibc's own `free` of a large block and its heap shrinking
//! of thread arenas call the same code (`__munmap` is `munmap`), so they are
//! covered; a raw `syscall(SYS_munmap)`, a static binary or another C
//! library is not (the registration path then checks every hit against the
//! mappings: [`installed`] is false).
//!
//! Only recognised shapes are patched (x86-64; an optional `endbr64`, then a
//! system-call stub `mov $nr,%eax; syscall`, or for `mremap` a frame set-up
//! `sub $imm8,%rsp`), and only when the 5 bytes lie in one aligned 8-byte
//! word, which is written with one atomic store: a thread entering the
//! function at that instant runs either the old code or the jump.
//!
//! `brk` is not hooked (glibc keeps its break in a private variable that a
//! replacement cannot update). glibc shrinks the main heap under the main
//! arena's lock, held until the unmapping thread's event was read, so its
//! `malloc` cannot hand out the address in the window; a program that calls
//! `sbrk` itself from two threads can.

use std::ffi::{CStr, c_int, c_void};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Hooked unmaps between their count in and out.
static IN_FLIGHT: AtomicU64 = AtomicU64::new(0);
/// The patched words (address, value written), to notice another tool
/// patching the same functions after us.
static PATCHED: OnceLock<Vec<(usize, u64)>> = OnceLock::new();
/// The functions hooked (`Err`: why none are).
static INSTALLED: OnceLock<Result<Vec<&'static str>, String>> = OnceLock::new();

/// Hooks the C library's unmapping functions (once per process; a child of
/// `fork` inherits them). Returns the names hooked, or why none were.
pub fn install() -> Result<&'static [&'static str], &'static str> {
    match INSTALLED.get_or_init(|| {
        let r = patch::install_all();
        match &r {
            Ok(names) => log::debug!("unmap hooks installed on {names:?}"),
            Err(e) => log::warn!(
                "no unmap hooks ({e}): registration-cache hits are checked against the mappings"
            ),
        }
        r
    }) {
        Ok(v) => Ok(v.as_slice()),
        Err(e) => Err(e.as_str()),
    }
}

/// Whether every hook is in place, so that [`settle`] closes the window.
pub fn installed() -> bool {
    matches!(INSTALLED.get(), Some(Ok(_)))
}

/// Waits until no hooked unmap is in flight. `false` if one still was at
/// `deadline` from now (a thread stopped inside `munmap`, or one blocked by
/// another userfaultfd): the caller must then check hits against the
/// mappings. Cheap when nothing is in flight: one load.
pub fn settle(deadline: Duration) -> bool {
    if !intact() {
        return false;
    }
    // SeqCst: pairs with the unmapping thread's count in, which precedes its
    // system call; the kernel orders that call before any `mmap` that reuses
    // the address, and that `mmap` before this load (see the module doc).
    if IN_FLIGHT.load(Ordering::SeqCst) == 0 {
        return true;
    }
    let start = Instant::now();
    let mut spins = 0u32;
    while IN_FLIGHT.load(Ordering::SeqCst) != 0 {
        if spins < 64 {
            std::hint::spin_loop();
            spins += 1;
            continue;
        }
        if start.elapsed() >= deadline {
            return false;
        }
        std::thread::yield_now();
    }
    true
}

/// Whether the patched words still hold the jumps (another tool, such as
/// UCX's hooks, may patch the same functions later): a few loads.
fn intact() -> bool {
    let Some(words) = PATCHED.get() else {
        return true;
    };
    for &(addr, value) in words {
        // SAFETY: `addr` is an aligned word of libc's text, mapped for the
        // life of the process; an atomic load reads it whole.
        let now = unsafe { AtomicU64::from_ptr(addr as *mut u64) }.load(Ordering::Relaxed);
        if now != value {
            static ONCE: std::sync::Once = std::sync::Once::new();
            ONCE.call_once(|| {
                log::warn!(
                    "libc's unmap functions were patched again by someone else: registration-cache \
                     hits are checked against the mappings from now on"
                )
            });
            return false;
        }
    }
    true
}

/// In a child of `fork`: the threads that were inside an unmap are gone.
pub fn reset_in_child() {
    IN_FLIGHT.store(0, Ordering::Relaxed);
}

/// Counts a hooked call in flight for its duration.
struct InFlight;

impl InFlight {
    fn enter() -> InFlight {
        // SeqCst: before the system call (module doc, `settle`).
        IN_FLIGHT.fetch_add(1, Ordering::SeqCst);
        InFlight
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        // AcqRel: the count out (after the event was read) is a release that
        // a `settle` seeing zero acquires, whichever thread counted out last
        // (the decrements form one release sequence).
        IN_FLIGHT.fetch_sub(1, Ordering::AcqRel);
    }
}

/// `munmap` as glibc defines it, with its count in flight.
extern "C" fn munmap_hook(addr: *mut c_void, len: usize) -> c_int {
    let _f = InFlight::enter();
    // SAFETY: the application's own `munmap`, made as the system call it
    // stands for; `syscall` sets `errno` and returns -1 on failure.
    unsafe { libc::syscall(libc::SYS_munmap, addr, len) as c_int }
}

/// `mremap(old, old_len, new_len, flags, ...)`: the fifth argument is read
/// only with `MREMAP_FIXED`, as glibc does (otherwise its register holds
/// whatever the caller left there, and is not used).
extern "C" fn mremap_hook(
    old: *mut c_void,
    old_len: usize,
    new_len: usize,
    flags: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    let new_addr = if flags & libc::MREMAP_FIXED != 0 {
        new_addr
    } else {
        std::ptr::null_mut()
    };
    let _f = InFlight::enter();
    // SAFETY: the application's own `mremap`, made as the system call; -1
    // (with `errno` set) is `MAP_FAILED`.
    unsafe {
        libc::syscall(libc::SYS_mremap, old, old_len, new_len, flags, new_addr) as *mut c_void
    }
}

/// `shmdt`.
extern "C" fn shmdt_hook(addr: *const c_void) -> c_int {
    let _f = InFlight::enter();
    // SAFETY: the application's own `shmdt`, made as the system call.
    unsafe { libc::syscall(libc::SYS_shmdt, addr) as c_int }
}

/// What a function's first bytes must look like to be replaced.
#[derive(Clone, Copy)]
enum Shape {
    /// `mov $nr,%eax; syscall` (glibc's system-call stubs).
    Stub(u8),
    /// `sub $imm8,%rsp` (a C function's frame).
    Frame,
}

const HOOKS: [(&CStr, &str, Shape); 3] = [
    (c"munmap", "munmap", Shape::Stub(libc::SYS_munmap as u8)),
    (c"mremap", "mremap", Shape::Frame),
    (c"shmdt", "shmdt", Shape::Stub(libc::SYS_shmdt as u8)),
];

fn hook_address(name: &str) -> usize {
    match name {
        "munmap" => munmap_hook as *const () as usize,
        "mremap" => mremap_hook as *const () as usize,
        _ => shmdt_hook as *const () as usize,
    }
}

/// Whether `code` (a function's first 16 bytes) has `shape`, after an
/// optional `endbr64`.
fn recognise(code: &[u8; 16], shape: Shape) -> bool {
    const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];
    let o = if code[..4] == ENDBR64 { 4 } else { 0 };
    match shape {
        Shape::Stub(nr) => {
            code[o..o + 5] == [0xb8, nr, 0, 0, 0] && code[o + 5..o + 7] == [0x0f, 0x05]
        }
        Shape::Frame => code[o..o + 3] == [0x48, 0x83, 0xec],
    }
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod patch {
    use super::{HOOKS, hook_address, recognise};
    use std::sync::atomic::{AtomicU64, Ordering};

    /// One trampoline: `movabs $hook,%r11; jmp *%r11` (13 bytes, in 16).
    const SLOT: usize = 16;

    pub(super) fn install_all() -> Result<Vec<&'static str>, String> {
        // SAFETY: `dlopen` with `RTLD_NOLOAD` only looks the library up;
        // the handle is never closed (libc stays loaded).
        let libc_handle =
            unsafe { libc::dlopen(c"libc.so.6".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
        if libc_handle.is_null() {
            return Err("libc.so.6 is not loaded".into());
        }
        // Every function first, so that nothing is patched unless all are.
        let mut targets = Vec::new();
        for (sym, name, shape) in HOOKS {
            // SAFETY: a symbol lookup in libc by a NUL-terminated name.
            let f = unsafe { libc::dlsym(libc_handle, sym.as_ptr()) } as usize;
            if f == 0 {
                return Err(format!("libc has no {name}"));
            }
            let mut code = [0u8; 16];
            // SAFETY: `f` is the start of a function in libc's text, mapped
            // readable; every libc function is longer than 16 bytes plus
            // its padding, which stays inside the text mapping.
            unsafe { std::ptr::copy_nonoverlapping(f as *const u8, code.as_mut_ptr(), 16) };
            if !recognise(&code, shape) {
                return Err(format!(
                    "{name} does not start as expected ({:02x?})",
                    &code[..8]
                ));
            }
            if f % 8 > 3 {
                return Err(format!(
                    "{name} at {f:#x}: its first 5 bytes span two words"
                ));
            }
            targets.push((f, name));
        }
        let tramp = near_page(targets[0].0)?;
        for (i, &(f, name)) in targets.iter().enumerate() {
            let slot = tramp + i * SLOT;
            if (slot as i64 - (f as i64 + 5)).unsigned_abs() >= 1 << 31 {
                return Err(format!("no trampoline within 2 GiB of {name}"));
            }
        }
        // The trampolines, then the page made executable (never writable
        // and executable at once).
        let mut code = [0xccu8; 4096];
        for (i, &(_, name)) in targets.iter().enumerate() {
            let s = &mut code[i * SLOT..(i + 1) * SLOT];
            s[0..2].copy_from_slice(&[0x49, 0xbb]);
            s[2..10].copy_from_slice(&(hook_address(name) as u64).to_le_bytes());
            s[10..13].copy_from_slice(&[0x41, 0xff, 0xe3]);
        }
        // SAFETY: `tramp` is the page `near_page` mapped for us, readable
        // and writable, 4096 bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(code.as_ptr(), tramp as *mut u8, code.len());
            if libc::mprotect(
                tramp as *mut libc::c_void,
                4096,
                libc::PROT_READ | libc::PROT_EXEC,
            ) != 0
            {
                return Err(format!("mprotect: {}", std::io::Error::last_os_error()));
            }
        }
        let mut names = Vec::new();
        let mut words = Vec::new();
        for (i, &(f, name)) in targets.iter().enumerate() {
            let slot = tramp + i * SLOT;
            let rel = (slot as i64 - (f as i64 + 5)) as i32;
            // SAFETY: `f` is a recognised libc function whose first 5 bytes
            // lie in one aligned word (checked above); `jump_to` writes only
            // those 5 bytes, with one atomic store.
            let word = unsafe { jump_to(f, rel) }.map_err(|e| format!("patching {name}: {e}"))?;
            words.push(word);
            names.push(name);
        }
        let _ = super::PATCHED.set(words);
        Ok(names)
    }

    /// A page within ±2 GiB of `near` (below it first: shared libraries sit
    /// at the top of the mmap area), readable and writable.
    fn near_page(near: usize) -> Result<usize, String> {
        const STEP: usize = 1 << 20;
        let base = near & !(STEP - 1);
        for i in 1..2000usize {
            for cand in [base.checked_sub(i * STEP), base.checked_add(i * STEP)] {
                let Some(at) = cand else { continue };
                // SAFETY: a new anonymous page at `at` only if nothing is
                // mapped there (`MAP_FIXED_NOREPLACE`): it replaces nothing.
                let p = unsafe {
                    libc::mmap(
                        at as *mut libc::c_void,
                        4096,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                        -1,
                        0,
                    )
                };
                if p == libc::MAP_FAILED {
                    continue;
                }
                if p as usize == at {
                    return Ok(at);
                }
                // A kernel without MAP_FIXED_NOREPLACE took it as a hint.
                // SAFETY: the page just mapped, referenced by nothing.
                unsafe { libc::munmap(p, 4096) };
            }
        }
        Err("no free page within 2 GiB of libc".into())
    }

    /// Replaces the 5 bytes at `f` with `jmp rel32`.
    ///
    /// # Safety
    /// `f` is the start of a function whose first 5 bytes lie in one aligned
    /// 8-byte word and that nothing jumps into after its first byte.
    unsafe fn jump_to(f: usize, rel: i32) -> std::io::Result<(usize, u64)> {
        let word = f & !7;
        let off = f - word;
        let page = word & !4095;
        // SAFETY: libc's text page holding `word`; it stays executable
        // throughout, so threads running in it are not disturbed.
        if unsafe {
            libc::mprotect(
                page as *mut libc::c_void,
                4096,
                libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC,
            )
        } != 0
        {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `word` is 8-aligned and now writable; the atomic view
        // makes the write one store (x86-64 stores aligned words atomically).
        let cell = unsafe { AtomicU64::from_ptr(word as *mut u64) };
        let mut bytes = cell.load(Ordering::Relaxed).to_le_bytes();
        bytes[off] = 0xe9;
        bytes[off + 1..off + 5].copy_from_slice(&rel.to_le_bytes());
        let value = u64::from_le_bytes(bytes);
        cell.store(value, Ordering::SeqCst);
        // SAFETY: as above; back to the text's own protection.
        if unsafe {
            libc::mprotect(
                page as *mut libc::c_void,
                4096,
                libc::PROT_READ | libc::PROT_EXEC,
            )
        } != 0
        {
            return Err(std::io::Error::last_os_error());
        }
        Ok((word, value))
    }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
mod patch {
    pub(super) fn install_all() -> Result<Vec<&'static str>, String> {
        Err("unmap hooks exist for x86-64 Linux only".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_are_recognised() {
        let mut stub = [0u8; 16];
        stub[..7].copy_from_slice(&[0xb8, 11, 0, 0, 0, 0x0f, 0x05]);
        assert!(recognise(&stub, Shape::Stub(11)));
        assert!(!recognise(&stub, Shape::Stub(67)));
        let mut endbr = [0u8; 16];
        endbr[..11].copy_from_slice(&[0xf3, 0x0f, 0x1e, 0xfa, 0xb8, 11, 0, 0, 0, 0x0f, 0x05]);
        assert!(recognise(&endbr, Shape::Stub(11)));
        let mut frame = [0u8; 16];
        frame[..4].copy_from_slice(&[0x48, 0x83, 0xec, 0x58]);
        assert!(recognise(&frame, Shape::Frame));
        assert!(!recognise(&frame, Shape::Stub(11)));
    }

    /// The hooks are in place and behave as the functions they replace:
    /// results, `errno`, and the in-flight count back at zero.
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    #[test]
    fn hooked_functions_still_work() {
        install().expect("hooks on this machine's glibc");
        assert!(installed());
        // SAFETY: a fresh anonymous mapping of this test, unmapped below;
        // nothing else refers to it.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                8192,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            (p as *mut u8).write(7);
            let q = libc::mremap(p, 8192, 4 * 8192, libc::MREMAP_MAYMOVE);
            assert_ne!(q, libc::MAP_FAILED);
            assert_eq!((q as *const u8).read(), 7, "mremap kept the contents");
            assert_eq!(libc::munmap(q, 4 * 8192), 0);
            // Errors come back as -1 with errno, as from libc.
            assert_eq!(libc::munmap(4097 as *mut c_void, 4096), -1);
            assert_eq!(
                std::io::Error::last_os_error().raw_os_error(),
                Some(libc::EINVAL)
            );
            assert_eq!(
                libc::mremap(4097 as *mut c_void, 4096, 8192, 0),
                libc::MAP_FAILED
            );
            assert_eq!(
                std::io::Error::last_os_error().raw_os_error(),
                Some(libc::EINVAL)
            );
            assert_eq!(libc::shmdt(4097 as *const c_void), -1);
            assert_eq!(
                std::io::Error::last_os_error().raw_os_error(),
                Some(libc::EINVAL)
            );
        }
        assert!(settle(Duration::from_secs(10)));
    }

    /// A thread inside a hooked unmap holds `settle` back.
    #[test]
    fn settle_waits_for_an_unmap_in_flight() {
        let f = InFlight::enter();
        assert!(!settle(Duration::from_millis(1)));
        drop(f);
        assert!(settle(Duration::from_secs(10)));
    }
}
