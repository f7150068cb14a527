//! A registration of new memory at an address another thread has just
//! unmapped must not find the old memory's cached or parked registration.
//!
//! KNOWN FAILURE, ignored until fixed (#8, "never a stale translation"):
//! the kernel frees the address at `munmap` and only afterwards holds the
//! unmapping thread until the userfaultfd event is read, so a thread that
//! maps and registers at that address in between finds no event pending and
//! hits the stale entry: 112 and 967 of 3,000 rounds in two runs here. See
//! `docs/registration.md` §2, "Known limits". Run it with
//! `cargo test -p via-tests --test registration_reuse_race -- --ignored`.

use via::mem::arena::UserRange;
use via::{Nic, Region};

const LEN: usize = 256 * 1024;

fn map(at: usize, fixed: bool) -> Option<usize> {
    let flags =
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | if fixed { libc::MAP_FIXED_NOREPLACE } else { 0 };
    // SAFETY: a new anonymous mapping, at `at` only if nothing is mapped
    // there (`MAP_FIXED_NOREPLACE`): it aliases no Rust object.
    let p = unsafe {
        libc::mmap(
            at as *mut libc::c_void,
            LEN,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            -1,
            0,
        )
    };
    (p != libc::MAP_FAILED).then_some(p as usize)
}

fn unmap(at: usize) {
    // SAFETY: a mapping of this test that nothing references any more.
    unsafe { libc::munmap(at as *mut libc::c_void, LEN) };
}

fn register(nic: &Nic, ptag: via::Ptag, at: usize) -> Region {
    // SAFETY: the mapping stays until after the region is dropped.
    let range = unsafe { UserRange::new(at, LEN) };
    Region::of_user_range(nic, range, ptag, false, false).unwrap()
}

#[test]
#[ignore = "known race (#8): an address reused before its unmap event is read"]
fn new_memory_at_a_just_unmapped_address_is_registered_anew() {
    let nic = Nic::open(None).unwrap();
    let ptag = nic.create_ptag().unwrap();
    let mut stale = 0;
    let rounds = 3000;
    for _ in 0..rounds {
        let a = map(0, false).unwrap();
        drop(register(&nic, ptag, a));
        let t = std::thread::spawn(move || unmap(a));
        // The same address as soon as it is free.
        let b = loop {
            if let Some(b) = map(a, true) {
                break b;
            }
        };
        let before = nic.registration_stats().cache.hits;
        let r = register(&nic, ptag, b);
        if nic.registration_stats().cache.hits > before {
            stale += 1;
        }
        drop(r);
        t.join().unwrap();
        unmap(b);
    }
    assert_eq!(
        stale, 0,
        "{stale} of {rounds} registrations of new memory found the old memory's registration"
    );
}
