//! Cross-process tests: the ring lives in a memfd; a child process (this
//! test binary re-executed with `CQ_TEST_CHILD` set) attaches and pushes.
//!
//! * `child_pushes_parent_waits`: the parent blocks in `wait` (futex on
//!   shared memory) and receives every entry in order.
//! * `sigkill_mid_burst_then_repair`: the child pushes as fast as it can and
//!   is killed with SIGKILL in the middle; after `repair` the parent has
//!   every entry the child committed, and the ring takes new pushes.
#![cfg(not(any(loom, miri)))]

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::{Child, Command, Stdio};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cq::{EntryRing, PushError};

const CHILD_ENV: &str = "CQ_TEST_CHILD";
/// Generous bound for every wait, so a bug fails the test instead of hanging it.
const TIMEOUT: Duration = Duration::from_secs(30);

/// Bytes of the memfd for a ring of `capacity`: the ring, then one cache
/// line holding the child's "committed" counter.
const fn region_len(capacity: u32) -> usize {
    EntryRing::bytes_for(capacity).next_multiple_of(64) + 64
}

/// A `MAP_SHARED` mapping of a memfd.
struct Shm {
    fd: OwnedFd,
    mem: NonNull<u8>,
    len: usize,
}

impl Shm {
    /// A new zero-filled memfd of `len` bytes, inheritable by children.
    fn create(len: usize) -> Self {
        // SAFETY: the name is a NUL-terminated literal; no flags (so the fd
        // survives exec, which the child needs).
        let raw = unsafe { libc::memfd_create(c"cq-test".as_ptr(), 0) };
        assert!(
            raw >= 0,
            "memfd_create: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: `raw` is a fresh fd that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: plain syscall on an fd we own.
        let rc = unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) };
        assert_eq!(rc, 0, "ftruncate: {}", std::io::Error::last_os_error());
        Self::map(fd, len)
    }

    /// Maps `len` bytes of `fd` shared.
    fn map(fd: OwnedFd, len: usize) -> Self {
        // SAFETY: a new mapping chosen by the kernel; it aliases nothing of ours.
        let ptr = unsafe {
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
            ptr,
            libc::MAP_FAILED,
            "mmap: {}",
            std::io::Error::last_os_error()
        );
        Self {
            fd,
            mem: NonNull::new(ptr.cast()).unwrap(),
            len,
        }
    }

    /// Bytes before the counter line: the ring's part of the mapping.
    fn ring_len(&self) -> usize {
        self.len - 64
    }

    /// The ring of a region made by `create(region_len(capacity))`.
    fn init(&self, capacity: u32) -> EntryRing {
        assert_eq!(self.len, region_len(capacity));
        // SAFETY: our mapping, not yet shared with a child, and it outlives
        // the view (the tests drop the ring before the `Shm`).
        unsafe { EntryRing::init(self.mem, self.ring_len(), capacity) }.unwrap()
    }

    /// The child's "committed" counter, in the last cache line.
    fn counter(&self) -> &AtomicU64 {
        // SAFETY: `ring_len() + 8 <= len`, 64-aligned inside a page-aligned
        // mapping that lives as long as `self`; only ever accessed
        // atomically, by both processes.
        unsafe { self.mem.add(self.ring_len()).cast::<AtomicU64>().as_ref() }
    }
}

impl Drop for Shm {
    fn drop(&mut self) {
        // SAFETY: our own mapping; every ring view of it was dropped before
        // (the tests drop rings first).
        unsafe { libc::munmap(self.mem.as_ptr().cast(), self.len) };
    }
}

/// Starts this test binary as a child running `role` on `shm`.
fn spawn_child(role: &str, shm: &Shm) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, format!("{role}:{}", shm.fd.as_raw_fd()))
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn child")
}

/// Entry point of the child processes; a no-op in the parent's run.
#[test]
fn child_entry() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let (role, fd) = spec.split_once(':').expect("role:fd");
    let fd: i32 = fd.parse().expect("fd");
    // SAFETY: the parent passed us this inherited memfd and nothing else in
    // this process uses it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let len = std::fs::File::from(fd.try_clone().unwrap())
        .metadata()
        .unwrap()
        .len();
    let shm = Shm::map(fd, len as usize);
    // SAFETY: the mapping stays until `exit` (we never unmap it). `attach`
    // validates the header the parent wrote, capacity included.
    let ring = unsafe { EntryRing::attach(shm.mem, shm.ring_len()) }.expect("attach");
    let deadline = Instant::now() + TIMEOUT;
    let push = |e: u64| loop {
        match ring.push(e) {
            Ok(()) => return,
            Err(PushError::Overrun) => {
                assert!(Instant::now() < deadline, "child: parent stopped consuming");
                std::thread::yield_now();
            }
            Err(err) => panic!("child push: {err}"),
        }
    };
    match role {
        "push" => {
            for i in 0..2000 {
                push(i);
            }
        }
        "burst" => {
            // Until killed: push, then record that it was committed.
            for i in 0.. {
                push(i);
                shm.counter().store(i + 1, Ordering::Release);
            }
        }
        other => panic!("unknown child role {other}"),
    }
    std::mem::forget(shm);
    std::process::exit(0);
}

#[test]
fn child_pushes_parent_waits() {
    // A small ring: the child overruns and waits for the parent often.
    let shm = Shm::create(region_len(64));
    let ring = shm.init(64);
    let mut child = spawn_child("push", &shm);
    for i in 0..2000u64 {
        // Zero spin: the parent really sleeps on the futex in the memfd.
        let got = ring.wait(Duration::ZERO, Some(TIMEOUT));
        assert_eq!(got, Some(i), "entry {i}");
    }
    assert!(child.wait().unwrap().success());
    assert_eq!(ring.pop(), None);
    drop(ring);
}

#[test]
fn sigkill_mid_burst_then_repair() {
    const ROUNDS: u64 = 10;
    // A large ring, so that the child is pushing (not waiting for room) when
    // the signal lands.
    const CAPACITY: u32 = 1 << 16;
    let mut tombstones = 0;
    for round in 0..ROUNDS {
        let shm = Shm::create(region_len(CAPACITY));
        let ring = shm.init(CAPACITY);
        let mut child = spawn_child("burst", &shm);
        let mut got = Vec::new();
        // Consume while the child pushes; kill it at a point that varies
        // with the round, while it is busy pushing.
        let kill_after = 3000 + 1777 * round as usize;
        while got.len() < kill_after {
            match ring.wait(Duration::from_micros(50), Some(TIMEOUT)) {
                Some(e) => got.push(e),
                None => panic!("round {round}: child stopped pushing"),
            }
        }
        // SAFETY: plain syscall; `child.id()` is our unreaped child.
        let rc = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGKILL) };
        assert_eq!(rc, 0);
        let status = child.wait().unwrap();
        assert!(!status.success());
        // The child is gone (reaped): its memory and registers with it.
        let committed = shm.counter().load(Ordering::Acquire);
        tombstones += ring.repair(Duration::ZERO);
        while let Some(e) = ring.pop() {
            got.push(e);
        }
        // Every committed entry arrived, in order, once. The child may have
        // died after committing entry `committed` but before counting it.
        let n = got.len() as u64;
        assert!(
            n == committed || n == committed + 1,
            "round {round}: got {n}, child committed {committed}"
        );
        assert!(
            got.iter().copied().eq(0..n),
            "round {round}: entries out of order or lost"
        );
        // The ring keeps working for new pushes, across a full lap.
        for i in 0..u64::from(CAPACITY) * 2 {
            ring.push(1_000_000 + i).unwrap();
            assert_eq!(ring.pop(), Some(1_000_000 + i));
        }
        assert!(ring.is_empty());
        drop(ring);
    }
    // Informational: how often the kill landed between reserve and commit.
    eprintln!("sigkill_mid_burst_then_repair: {tombstones} slots tombstoned in {ROUNDS} rounds");
}
