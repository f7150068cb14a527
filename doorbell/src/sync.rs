//! The crate's synchronisation primitives, in one place so that loom can replace them.
//!
//! Normally these are `core` atomics, a transparent `UnsafeCell` with loom's closure API, and
//! the kernel futex ([`crate::sys`]) behind [`WaitQueue`]. Under `cfg(loom)` they are loom's
//! atomics, loom's checked `UnsafeCell`, and a model of the futex built from a loom `Mutex`
//! and `Condvar`: the check of the futex word and going to sleep are atomic with respect to a
//! wake, exactly what `FUTEX_WAIT` guarantees.
#![forbid(unsafe_code)]

use core::time::Duration;

#[cfg(not(loom))]
pub(crate) use core::hint::spin_loop;
#[cfg(not(loom))]
pub(crate) use core::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};

#[cfg(loom)]
pub(crate) use loom::cell::UnsafeCell;
#[cfg(loom)]
pub(crate) use loom::hint::spin_loop;
#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};

/// Interior-mutable cell with loom's access API (`with`, `with_mut`), layout of `T`.
#[cfg(not(loom))]
#[repr(transparent)]
pub(crate) struct UnsafeCell<T>(core::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T> UnsafeCell<T> {
    /// Wraps `value`.
    pub(crate) const fn new(value: T) -> Self {
        Self(core::cell::UnsafeCell::new(value))
    }

    /// Runs `f` with a shared raw pointer to the contents.
    pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    /// Runs `f` with a mutable raw pointer to the contents.
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

/// Result of one futex wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
// The loom model never fails or gets interrupted.
#[cfg_attr(loom, allow(dead_code))]
pub(crate) enum FutexWait {
    /// Woken by a wake (or spuriously).
    Woken,
    /// The word no longer held the expected value (`EAGAIN`).
    Changed,
    /// A signal interrupted the wait (`EINTR`).
    Interrupted,
    /// The timeout expired (`ETIMEDOUT`).
    TimedOut,
    /// Any other errno: the wait did not happen.
    Failed(i32),
}

/// The queue a futex word's waiters sleep on.
///
/// For the kernel futex this is zero-sized: the kernel keys the queue by the word's physical
/// location (inode and offset for `MAP_SHARED` memory), so it is shared by every process that
/// maps the word.
#[cfg(not(loom))]
#[derive(Debug, Default)]
#[repr(C)]
pub(crate) struct WaitQueue;

#[cfg(not(loom))]
impl WaitQueue {
    /// An empty queue.
    pub(crate) const fn new() -> Self {
        Self
    }

    /// Sleeps while `*word == expected`, for at most `timeout`.
    pub(crate) fn wait(
        &self,
        word: &AtomicU32,
        expected: u32,
        timeout: Option<Duration>,
    ) -> FutexWait {
        crate::sys::futex_wait(word, expected, timeout)
    }

    /// Wakes every sleeper on `word`.
    pub(crate) fn wake_all(&self, word: &AtomicU32) {
        crate::sys::futex_wake(word, i32::MAX);
    }
}

/// Loom model of the futex queue: a mutex makes "check the word, then sleep" atomic with
/// respect to `wake_all`, which takes the same mutex.
#[cfg(loom)]
#[derive(Debug, Default)]
pub(crate) struct WaitQueue {
    lock: loom::sync::Mutex<()>,
    cond: loom::sync::Condvar,
}

#[cfg(loom)]
impl WaitQueue {
    /// An empty queue.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Sleeps while `*word == expected`. A timed wait models the timeout expiring at once
    /// (loom has no clock): it never sleeps, which is one of the schedules a real timeout allows.
    pub(crate) fn wait(
        &self,
        word: &AtomicU32,
        expected: u32,
        timeout: Option<Duration>,
    ) -> FutexWait {
        let guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        // Relaxed: the mutex orders this load after any wake_all that already ran, and the
        // notifier changes the word before taking the mutex.
        if word.load(Ordering::Relaxed) != expected {
            return FutexWait::Changed;
        }
        if timeout.is_some() {
            return FutexWait::TimedOut;
        }
        drop(self.cond.wait(guard).unwrap_or_else(|e| e.into_inner()));
        FutexWait::Woken
    }

    /// Wakes every sleeper.
    pub(crate) fn wake_all(&self, _word: &AtomicU32) {
        let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        self.cond.notify_all();
    }
}
