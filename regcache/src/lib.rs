//! Memory registration for via-rs: page rounding, the [`Pinner`] interface that backends
//! implement, and [`RegCache`], a pin-down registration cache.
//!
//! `VipRegisterMem` rounds a region out to pages with [`page_range`] and has the backend pin
//! them. Higher layers (an MPI-like layer) register the same buffers over and over; they go
//! through a [`RegCache`] instead, which keeps pages pinned after their last use so that the
//! next registration of a covered range is a lookup (the "pin-down cache" of Tezuka et al., as
//! in MVAPICH and Open MPI).
//!
//! The crate knows nothing of any NIC: the soft backend implements [`Pinner`] by moving pages
//! into shared arenas, the verbs backend by `ibv_reg_mr`.
//!
//! Invalidation is explicit: whoever unmaps or remaps memory calls [`RegCache::invalidate`].
//! Automatic invalidation (a munmap hook or userfaultfd) comes later.
//!
//! ```
//! use std::ops::Range;
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use regcache::{Config, Pinner, RegCache};
//!
//! /// Counts the pages it has pinned; a real backend would register them with the NIC.
//! #[derive(Default)]
//! struct Toy {
//!     pinned_pages: AtomicUsize,
//! }
//!
//! impl Pinner for Toy {
//!     type Pinned = usize; // number of pages, standing in for a memory handle
//!     type Error = std::io::Error;
//!
//!     fn pin(&self, pages: Range<usize>) -> Result<usize, std::io::Error> {
//!         let n = pages.len() / regcache::page_size();
//!         self.pinned_pages.fetch_add(n, Ordering::Relaxed);
//!         Ok(n)
//!     }
//!
//!     fn unpin(&self, _pages: Range<usize>, n: usize) {
//!         self.pinned_pages.fetch_sub(n, Ordering::Relaxed);
//!     }
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let cache = RegCache::new(Toy::default(), Config { capacity_bytes: 1 << 20, ..Config::default() });
//! let buf = vec![0u8; 3 * regcache::page_size()];
//! let addr = buf.as_ptr() as usize;
//!
//! let whole = cache.acquire(addr, buf.len())?; // miss: pins the pages
//! let part = cache.acquire(addr + 100, 200)?; // hit: covered by the first entry
//! assert_eq!(part.pages(), whole.pages());
//! assert_eq!(cache.stats().misses, 1);
//! assert_eq!(cache.stats().hits, 1);
//!
//! cache.release(whole);
//! cache.release(part);
//! // Unreferenced but still cached, so the next acquire is a hit again.
//! assert!(cache.pinner().pinned_pages.load(Ordering::Relaxed) >= 3);
//!
//! // The buffer is about to be freed: forget its pages.
//! assert_eq!(cache.invalidate(addr, buf.len()), 1);
//! assert_eq!(cache.pinner().pinned_pages.load(Ordering::Relaxed), 0);
//! # Ok(())
//! # }
//! ```
// `forbid` cannot be lifted for `sys.rs`, so the root denies and every other module forbids.
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod cache;
mod interval;
mod range;
mod sys;

use std::ops::Range;

pub use cache::{Config, Error, Lease, RegCache, Stats};
pub use range::{RangeError, page_range, page_size};

/// A backend's way to pin page ranges, so that the NIC can reach them, and to unpin them.
///
/// [`RegCache`] calls it without holding its lock, so calls can come from several threads at
/// once. Because cache entries may overlap and duplicate pins can race, the same pages may be
/// pinned more than once at a time: each pin must be an independent handle.
pub trait Pinner: Send + Sync {
    /// What the backend returns for a pinned page range (a memory handle, a list of extents...).
    type Pinned: Send + Sync;
    /// Why a pin failed.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Pins `pages`, a page-aligned range that may be empty (a zero-length registration).
    ///
    /// # Errors
    ///
    /// Whatever keeps the backend from pinning; the cache passes it on as [`Error::Pin`].
    fn pin(&self, pages: Range<usize>) -> Result<Self::Pinned, Self::Error>;

    /// Pins `pages` for a registration of exactly `bytes` (inside `pages`).
    /// A backend that must treat pages only partly inside `bytes` differently
    /// (they may hold other data) overrides this; the default pins `pages`.
    ///
    /// # Errors
    ///
    /// As [`Pinner::pin`].
    fn pin_bytes(
        &self,
        pages: Range<usize>,
        bytes: Range<usize>,
    ) -> Result<Self::Pinned, Self::Error> {
        let _ = bytes;
        self.pin(pages)
    }

    /// Unpins what [`Pinner::pin`] or [`Pinner::pin_bytes`] returned for `pages`. The cache calls it exactly once per
    /// successful pin, with the same range.
    fn unpin(&self, pages: Range<usize>, pinned: Self::Pinned);

    /// Whether `pinned`, made for `pages`, still describes the memory there (the pages were not
    /// unmapped or replaced since). Asked on every hit when [`Config::validate_hits`] is set;
    /// the default says yes.
    fn is_current(&self, pages: Range<usize>, pinned: &Self::Pinned) -> bool {
        let _ = (pages, pinned);
        true
    }
}
