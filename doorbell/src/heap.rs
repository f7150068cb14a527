//! Heap-owned regions for `new_in_heap`: tests, loom models and single-process use.

use core::alloc::Layout;
use core::ptr::NonNull;

use crate::layout::CACHE_LINE;

/// Drops whatever a region's `format` wrote (a no-op for the `core` atomics; loom's objects
/// are released this way). Gets the base and the capacity.
pub(crate) type DropContents = unsafe fn(NonNull<u8>, u32);

/// A zero-filled, cache-line aligned heap allocation holding one formatted region.
///
/// Shared by every view of the region through an `Arc`; freed when the last view goes.
pub(crate) struct HeapRegion {
    base: NonNull<u8>,
    layout: Layout,
    capacity: u32,
    drop_contents: DropContents,
}

// SAFETY: the region is plain memory accessed only through atomics and the ring protocol;
// nothing in it is tied to the allocating thread.
unsafe impl Send for HeapRegion {}
// SAFETY: as above; shared access goes through the same atomics from any thread.
unsafe impl Sync for HeapRegion {}

impl HeapRegion {
    /// Allocates `bytes` zero-filled bytes aligned to a cache line.
    ///
    /// # Safety
    ///
    /// The caller must format the region (so that `drop_contents(base, capacity)` is sound)
    /// before the returned value is dropped.
    pub(crate) unsafe fn alloc(bytes: usize, capacity: u32, drop_contents: DropContents) -> Self {
        let layout = Layout::from_size_align(bytes, CACHE_LINE).expect("region size overflows");
        assert!(layout.size() > 0, "empty region");
        // SAFETY: `layout` has a non-zero size (checked above).
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let Some(base) = NonNull::new(raw) else {
            std::alloc::handle_alloc_error(layout)
        };
        Self {
            base,
            layout,
            capacity,
            drop_contents,
        }
    }

    /// Start of the region.
    pub(crate) fn base(&self) -> NonNull<u8> {
        self.base
    }
}

impl Drop for HeapRegion {
    fn drop(&mut self) {
        // SAFETY: `alloc`'s contract: the region was formatted for `capacity`, and this is the
        // last owner (the Arc is gone), so no view can touch it any more.
        unsafe { (self.drop_contents)(self.base, self.capacity) };
        // SAFETY: `base` came from `alloc_zeroed(self.layout)` and is freed once, here.
        unsafe { std::alloc::dealloc(self.base.as_ptr(), self.layout) };
    }
}
