//! Raw system calls: the only `unsafe` code in this crate.
#![allow(unsafe_code)]

/// Size of a virtual memory page in bytes, as `sysconf(_SC_PAGESIZE)` reports it.
///
/// # Panics
///
/// If `sysconf` fails, which POSIX does not allow for `_SC_PAGESIZE`.
pub(crate) fn page_size() -> usize {
    // SAFETY: `sysconf` takes an integer name and no pointers; it has no memory-safety
    // preconditions and touches no caller state.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).expect("sysconf(_SC_PAGESIZE) failed")
}
