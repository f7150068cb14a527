//! Registered memory: how pages become reachable by peers, and how the
//! provider learns that the application unmapped, discarded or moved them.
//!
//! | module | job |
//! |---|---|
//! | [`arena`] | the soft NIC's backing: moves pages into shared files, without losing writes |
//! | [`monitor`] | memory events (userfaultfd): invalidates the registration cache before memory is reused |
//! | [`fork`] | what a child gets of registered memory |
//! | [`vma`] | what maps an address range, which pages were touched |
//! | [`uffd`] | the userfaultfd system calls |
//! | [`unmap_hook`] | hooks on libc's `munmap`/`mremap`/`shmdt`: an unmap known before the address is free |
//! | `region` | a registered region as this process reaches it: reading, writing, scatter/gather copies |
//! | `copy` | the copy mechanisms (`memcpy` between mappings, cross-memory attach) |
//!
//! The design and its comparison with UCX's rcache and libfabric's MR cache
//! are in `docs/registration.md`.

pub mod arena;
pub(crate) mod copy;
pub mod fork;
pub mod monitor;
pub(crate) mod region;
pub mod uffd;
pub mod unmap_hook;
pub mod vma;
