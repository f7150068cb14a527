//! Raw system calls: the shared futex.
//!
//! The futex word lives in `MAP_SHARED` memory mapped by several processes, so these use
//! `FUTEX_WAIT` / `FUTEX_WAKE` *without* `FUTEX_PRIVATE_FLAG`: the kernel then keys the wait
//! queue by the backing page (memfd inode and offset), not by this process's address space,
//! and a wake from any process that maps the page reaches the sleepers of every other one.

use core::ptr;
use core::sync::atomic::AtomicBool;
use core::time::Duration;

use crate::sync::{AtomicU32, FutexWait, Ordering};

/// `FUTEX_WAIT`, shared variant (no `FUTEX_PRIVATE_FLAG`).
const FUTEX_WAIT_SHARED: libc::c_int = libc::FUTEX_WAIT;
/// `FUTEX_WAKE`, shared variant (no `FUTEX_PRIVATE_FLAG`).
const FUTEX_WAKE_SHARED: libc::c_int = libc::FUTEX_WAKE;

/// Set once an unexpected futex error has been logged, so a broken futex does not flood logs.
static FUTEX_ERROR_LOGGED: AtomicBool = AtomicBool::new(false);

fn log_futex_error(op: &str, errno: i32) {
    // Relaxed: only rate-limits a log line.
    if !FUTEX_ERROR_LOGGED.swap(true, Ordering::Relaxed) {
        log::error!("futex {op} failed: errno {errno}; waits degrade to polling");
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Converts a relative timeout to a `timespec`, capping absurd values at about 68 years.
fn timespec(timeout: Duration) -> libc::timespec {
    let secs = timeout.as_secs().min(i32::MAX as u64);
    libc::timespec {
        tv_sec: secs as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    }
}

/// Sleeps while `*word == expected`, for at most `timeout` (`None`: no limit).
///
/// Returns why the call came back; the caller re-checks its condition in every case.
pub(crate) fn futex_wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) -> FutexWait {
    let ts = timeout.map(timespec);
    let ts_ptr = ts
        .as_ref()
        .map_or(ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `word` is a live, 4-byte aligned `AtomicU32` for the whole call (it is borrowed),
    // and the kernel only reads it atomically. `ts_ptr` is null or points to `ts`, which lives
    // until the call returns. The unused `uaddr2`/`val3` arguments are ignored by FUTEX_WAIT.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            FUTEX_WAIT_SHARED,
            expected,
            ts_ptr,
            ptr::null::<u32>(),
            0u32,
        )
    };
    if rc == 0 {
        return FutexWait::Woken;
    }
    match errno() {
        libc::EAGAIN => FutexWait::Changed,
        libc::EINTR => FutexWait::Interrupted,
        libc::ETIMEDOUT => FutexWait::TimedOut,
        e => {
            log_futex_error("wait", e);
            FutexWait::Failed(e)
        }
    }
}

/// Wakes up to `count` sleepers on `word`; returns how many were woken.
pub(crate) fn futex_wake(word: &AtomicU32, count: i32) -> usize {
    // SAFETY: `word` is a live, aligned `AtomicU32`; FUTEX_WAKE only uses its address as a key
    // and never dereferences the remaining (null/zero) arguments.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            FUTEX_WAKE_SHARED,
            count,
            ptr::null::<libc::timespec>(),
            ptr::null::<u32>(),
            0u32,
        )
    };
    if rc < 0 {
        log_futex_error("wake", errno());
        return 0;
    }
    rc as usize
}

/// `membarrier(2)` commands (linux/membarrier.h).
const MEMBARRIER_CMD_QUERY: libc::c_int = 0;
const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_int = 1 << 3;
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_int = 1 << 4;
const MEMBARRIER_CMD_GLOBAL_EXPEDITED: libc::c_int = 1 << 1;
const MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED: libc::c_int = 1 << 2;

/// The process (by pid: a forked child registers again) that registered for
/// `MEMBARRIER_CMD_PRIVATE_EXPEDITED`; 0: none, -1: unsupported here.
static MEMBARRIER_PID: core::sync::atomic::AtomicI32 = core::sync::atomic::AtomicI32::new(0);

fn membarrier_call(cmd: libc::c_int) -> libc::c_long {
    // SAFETY: membarrier takes no pointers; unknown commands fail with EINVAL.
    unsafe {
        libc::syscall(
            libc::SYS_membarrier,
            cmd,
            0 as libc::c_uint,
            0 as libc::c_int,
        )
    }
}

/// Whether [`membarrier`] works in this process, registering it if needed
/// (once per process; a system call to look at the pid otherwise). False
/// where the kernel lacks private expedited barriers or a filter forbids
/// the call.
pub(crate) fn membarrier_ready() -> bool {
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    // Relaxed: a racing first call only registers twice (idempotent).
    match MEMBARRIER_PID.load(Ordering::Relaxed) {
        -1 => return false,
        p if p == pid => return true,
        _ => {}
    }
    let ok = membarrier_register(
        MEMBARRIER_CMD_PRIVATE_EXPEDITED,
        MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED,
        "private",
    );
    MEMBARRIER_PID.store(if ok { pid } else { -1 }, Ordering::Relaxed);
    ok
}

/// Registers this process for barrier command `cmd` with `register` if the
/// kernel offers `cmd`; false (logged) where it does not or a filter forbids.
fn membarrier_register(cmd: libc::c_int, register: libc::c_int, what: &str) -> bool {
    let q = membarrier_call(MEMBARRIER_CMD_QUERY);
    let ok = q >= 0 && q & cmd as libc::c_long != 0 && membarrier_call(register) == 0;
    if !ok {
        log::debug!(
            "membarrier: {what} expedited barriers unavailable (errno {})",
            errno()
        );
    }
    ok
}

/// Runs a full memory barrier on every thread of this process that is
/// running now (the others pass one as they are switched back in): the
/// heavy side of an asymmetric Dekker handshake whose light side is a
/// compiler fence. Only called after [`membarrier_ready`] said yes in this
/// process.
///
/// # Panics
/// If the kernel refuses a barrier it accepted the registration for: the
/// caller could not exclude the light side then.
pub(crate) fn membarrier() {
    if membarrier_call(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0 {
        return;
    }
    // A child forked since the registration: register it, then again.
    if membarrier_ready() && membarrier_call(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0 {
        return;
    }
    panic!("membarrier failed: errno {}", errno());
}

/// Registers this process for `MEMBARRIER_CMD_GLOBAL_EXPEDITED`: from the
/// return on, a global expedited barrier issued by any process runs a full
/// memory barrier on every thread of this one that is running (the others
/// pass one as they are switched back in). The registration belongs to the
/// address space: kept by `fork`'s child (its own copy), dropped by `exec`.
/// False where the kernel lacks the command or a filter forbids it.
pub(crate) fn membarrier_register_global() -> bool {
    membarrier_register(
        MEMBARRIER_CMD_GLOBAL_EXPEDITED,
        MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED,
        "global",
    )
}

/// Runs a full memory barrier on every running thread of every process
/// registered with [`membarrier_register_global`] (this one's included when
/// registered), and on the caller. False when the call failed: no process's
/// light side is covered then.
pub(crate) fn membarrier_global() -> bool {
    membarrier_call(MEMBARRIER_CMD_GLOBAL_EXPEDITED) == 0
}

/// `pthread_atfork` with a handler for the child only.
pub(crate) fn atfork_child(child: extern "C" fn()) -> bool {
    // SAFETY: `child` is a safe function with no arguments, valid for the
    // life of the process (a static item); no prepare or parent handler.
    unsafe { libc::pthread_atfork(None, None, Some(child)) == 0 }
}

/// Test support: memfd mappings and a probe for threads blocked in a futex.
#[cfg(test)]
pub(crate) mod testing {
    use core::ptr::NonNull;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::time::Instant;

    /// A memfd of a given size.
    pub(crate) struct Memfd {
        fd: OwnedFd,
        len: usize,
    }

    impl Memfd {
        /// Creates a zero-filled memfd of `len` bytes.
        pub(crate) fn new(len: usize) -> Self {
            // SAFETY: the name is a NUL-terminated literal; flags are valid.
            let fd = unsafe { libc::memfd_create(c"doorbell-unit".as_ptr(), libc::MFD_CLOEXEC) };
            assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
            // SAFETY: `fd` was just returned by memfd_create and is owned by nobody else.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            // SAFETY: plain syscall on an fd we own.
            let rc = unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) };
            assert_eq!(rc, 0, "ftruncate: {}", std::io::Error::last_os_error());
            Self { fd, len }
        }

        /// Maps the whole memfd `MAP_SHARED` at a fresh address.
        pub(crate) fn map(&self) -> Mapping {
            // SAFETY: a fresh shared mapping of an fd we own; the kernel picks the address.
            let p = unsafe {
                libc::mmap(
                    core::ptr::null_mut(),
                    self.len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    self.fd.as_raw_fd(),
                    0,
                )
            };
            assert_ne!(
                p,
                libc::MAP_FAILED,
                "mmap: {}",
                std::io::Error::last_os_error()
            );
            Mapping {
                ptr: NonNull::new(p.cast()).expect("mmap returned null"),
                len: self.len,
            }
        }
    }

    /// One `MAP_SHARED` mapping, unmapped on drop (page aligned, so 64-byte aligned).
    pub(crate) struct Mapping {
        ptr: NonNull<u8>,
        len: usize,
    }

    impl Mapping {
        pub(crate) fn ptr(&self) -> NonNull<u8> {
            self.ptr
        }

        pub(crate) fn len(&self) -> usize {
            self.len
        }
    }

    impl Drop for Mapping {
        fn drop(&mut self) {
            // SAFETY: `ptr`/`len` describe a mapping created in `Memfd::map` and unmapped only here.
            unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
        }
    }

    /// The calling thread's kernel thread id, read from `/proc/thread-self`.
    pub(crate) fn thread_id() -> u32 {
        let link = std::fs::read_link("/proc/thread-self").expect("read /proc/thread-self");
        let tid = link.file_name().expect("tid").to_str().expect("utf-8");
        tid.parse().expect("numeric tid")
    }

    /// Polls until thread `tid` of this process sleeps in a futex wait, or `deadline` passes.
    ///
    /// Returns whether it was seen blocked. Polling `/proc` is a condition check, not a sleep.
    pub(crate) fn wait_blocked_in_futex(tid: u32, deadline: Instant) -> bool {
        let path = format!("/proc/self/task/{tid}/wchan");
        while Instant::now() < deadline {
            if std::fs::read_to_string(&path).is_ok_and(|w| w.contains("futex")) {
                return true;
            }
            std::thread::yield_now();
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    #[cfg_attr(miri, ignore = "memfd, futex or /proc are outside Miri")]
    fn wait_returns_changed_when_word_differs() {
        let word = AtomicU32::new(5);
        assert_eq!(futex_wait(&word, 4, None), FutexWait::Changed);
    }

    #[test]
    #[cfg_attr(miri, ignore = "memfd, futex or /proc are outside Miri")]
    fn wait_times_out() {
        let word = AtomicU32::new(0);
        let start = Instant::now();
        let r = futex_wait(&word, 0, Some(Duration::from_millis(20)));
        // A signal could interrupt the wait; the caller loops in that case.
        assert!(
            matches!(r, FutexWait::TimedOut | FutexWait::Interrupted),
            "{r:?}"
        );
        if r == FutexWait::TimedOut {
            assert!(start.elapsed() >= Duration::from_millis(20));
        }
    }

    #[test]
    #[cfg_attr(miri, ignore = "memfd, futex or /proc are outside Miri")]
    fn wake_without_sleepers_wakes_nobody() {
        let word = AtomicU32::new(0);
        assert_eq!(futex_wake(&word, i32::MAX), 0);
    }

    #[test]
    fn timespec_caps_huge_timeouts() {
        let ts = timespec(Duration::MAX);
        assert_eq!(ts.tv_sec, i32::MAX as libc::time_t);
        assert!(ts.tv_nsec < 1_000_000_000);
    }
}
