//! Shared helpers of the integration tests: memfd mappings, child processes, futex probes.
#![allow(dead_code)]

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::process::{Child, Command, ExitStatus};
use std::ptr::NonNull;
use std::time::{Duration, Instant};

/// Environment variable naming the role a re-executed test binary plays.
pub const ROLE_ENV: &str = "DOORBELL_TEST_ROLE";
/// Environment variable carrying the inherited memfd number.
pub const FD_ENV: &str = "DOORBELL_TEST_FD";
/// Environment variable carrying the parent's waiting thread id.
pub const TID_ENV: &str = "DOORBELL_TEST_PARENT_TID";

/// A memfd mapped `MAP_SHARED` (page aligned, so 64-byte aligned); unmapped on drop.
pub struct SharedMem {
    fd: OwnedFd,
    ptr: NonNull<u8>,
    len: usize,
}

impl SharedMem {
    /// Creates a zero-filled memfd of `len` bytes that child processes inherit (no CLOEXEC).
    pub fn create(len: usize) -> Self {
        // SAFETY: the name is a NUL-terminated literal; flags 0 are valid (inheritable fd).
        let fd = unsafe { libc::memfd_create(c"doorbell-test".as_ptr(), 0) };
        assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
        // SAFETY: `fd` was just returned by memfd_create and nobody else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: plain syscall on an fd we own.
        let rc = unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) };
        assert_eq!(rc, 0, "ftruncate: {}", std::io::Error::last_os_error());
        Self::map(fd, len)
    }

    /// Maps a memfd inherited from the parent, whose number is in [`FD_ENV`].
    pub fn inherited() -> Self {
        let raw: RawFd = std::env::var(FD_ENV)
            .expect("fd variable")
            .parse()
            .expect("numeric fd");
        // SAFETY: the parent passed this fd number; it is open in this process (inherited
        // across exec) and nothing else in the child uses it.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let len = std::fs::metadata(format!("/proc/self/fd/{raw}"))
            .expect("stat memfd")
            .len() as usize;
        Self::map(fd, len)
    }

    fn map(fd: OwnedFd, len: usize) -> Self {
        // SAFETY: a fresh shared mapping of an fd we own; the kernel picks the address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        assert_ne!(
            p,
            libc::MAP_FAILED,
            "mmap: {}",
            std::io::Error::last_os_error()
        );
        Self {
            fd,
            ptr: NonNull::new(p.cast()).expect("mmap returned null"),
            len,
        }
    }

    pub fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Address `offset` bytes into the mapping.
    pub fn at(&self, offset: usize) -> NonNull<u8> {
        assert!(offset < self.len);
        NonNull::new(self.ptr.as_ptr().wrapping_add(offset)).unwrap()
    }
}

impl Drop for SharedMem {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` describe the mapping made in `map`, unmapped only here.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// The role this process plays if it is a re-executed child, from [`ROLE_ENV`].
pub fn child_role() -> Option<String> {
    std::env::var(ROLE_ENV).ok()
}

/// A child process running one test of this binary in `role`; killed if still running
/// when dropped, so a failing parent never leaves it behind.
pub struct ChildGuard {
    child: Option<Child>,
    /// pidfd of the child: waited on with a timeout and signalled without pid-reuse races.
    pidfd: OwnedFd,
}

impl ChildGuard {
    /// Re-executes this test binary to run only `test` with `role`, inheriting `mem`'s fd.
    pub fn spawn(test: &str, role: &str, mem: &SharedMem, parent_tid: u32) -> Self {
        let exe = std::env::current_exe().expect("current exe");
        let child = Command::new(exe)
            .args([test, "--exact", "--nocapture", "--test-threads=1", "-q"])
            .env(ROLE_ENV, role)
            .env(FD_ENV, mem.fd().to_string())
            .env(TID_ENV, parent_tid.to_string())
            .spawn()
            .expect("spawn child");
        // SAFETY: plain syscall; the child is not reaped yet, so its pid names it.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, child.id() as libc::pid_t, 0) };
        assert!(fd >= 0, "pidfd_open: {}", std::io::Error::last_os_error());
        // SAFETY: `fd` was just returned by pidfd_open and nobody else owns it.
        let pidfd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
        Self {
            child: Some(child),
            pidfd,
        }
    }

    /// Waits for the child to exit, blocking at most `timeout`; kills it and panics on timeout.
    pub fn wait(mut self, timeout: Duration) -> ExitStatus {
        let mut pfd = libc::pollfd {
            fd: self.pidfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let ms = left.as_millis().min(i32::MAX as u128) as libc::c_int;
            // SAFETY: `pfd` is a valid pollfd for the duration of the call; nfds is 1.
            let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
            if rc > 0 {
                return self
                    .child
                    .take()
                    .expect("child")
                    .wait()
                    .expect("reap child");
            }
            let interrupted =
                rc < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR);
            if !interrupted && Instant::now() >= deadline {
                self.kill();
                panic!("child did not exit within {timeout:?}");
            }
        }
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: plain syscall on our pidfd; the child is not reaped, so no pid reuse.
            unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    self.pidfd.as_raw_fd(),
                    libc::SIGKILL,
                    std::ptr::null::<libc::siginfo_t>(),
                    0,
                )
            };
            let _ = child.wait();
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The calling thread's kernel thread id, read from `/proc/thread-self`.
pub fn thread_id() -> u32 {
    let link = std::fs::read_link("/proc/thread-self").expect("read /proc/thread-self");
    link.file_name()
        .and_then(|s| s.to_str())
        .and_then(|s| s.parse().ok())
        .expect("numeric tid")
}

/// Polls until thread `tid` of process `pid` sleeps in a futex wait, or `deadline` passes.
/// Returns whether it was seen blocked (the kernel names the wait channel `futex_*`).
pub fn wait_blocked_in_futex(pid: u32, tid: u32, deadline: Instant) -> bool {
    let path = format!("/proc/{pid}/task/{tid}/wchan");
    while Instant::now() < deadline {
        if std::fs::read_to_string(&path).is_ok_and(|w| w.contains("futex")) {
            return true;
        }
        std::thread::yield_now();
    }
    false
}
