//! A biased lock across `fork`: the child's only thread is the forking one
//! (same thread pointer, so it keeps the bias), and a thread the child
//! starts revokes it with a `membarrier` in the child (the kernels seen here
//! keep the registration across fork; where one does not, the library
//! registers the child again). Its own binary: the fork happens with no
//! other test's threads alive (one of them could hold the allocator's lock
//! in the child).
#![cfg(not(loom))]

use std::sync::Arc;

use doorbell::BiasedLock;

#[test]
fn a_forked_child_keeps_the_bias_and_revokes_it() {
    let l = Arc::new(BiasedLock::new(0u64));
    for _ in 0..64 {
        *l.lock() += 1;
    }
    if !l.is_biased() {
        eprintln!("SKIPPED: membarrier unavailable here, no bias is granted");
        return;
    }
    // SAFETY: fork in a process whose other threads (the test harness's
    // main thread) wait in a join; the child only uses this crate, spawns
    // one thread and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let code = {
            // The forking thread still holds the bias in the child.
            let kept = l.is_biased() && {
                *l.lock() += 1;
                l.is_biased()
            };
            // Another thread of the child revokes it.
            let l2 = l.clone();
            let revoked = std::thread::spawn(move || {
                *l2.lock() += 1;
                !l2.is_biased()
            })
            .join()
            .unwrap_or(false);
            let total = *l.lock();
            if kept && revoked && total == 66 { 0 } else { 1 }
        };
        // SAFETY: leaves the child without running the parent's exit code.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waits for the child just forked.
    let r = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(r, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child status {status:#x}"
    );
    // The parent's lock is untouched by the child's revocation.
    assert!(l.is_biased());
    assert_eq!(*l.lock(), 64);
}
