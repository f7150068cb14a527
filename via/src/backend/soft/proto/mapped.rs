//! Both ends mapped: one `memcpy` between two mappings.
#![forbid(unsafe_code)]

use crate::backend::soft::memory::Fault;
use crate::shm::mapping::Mapping;

/// Copies `n` bytes from `src[so..]` to `dst[doff..]`.
pub(crate) fn copy(
    src: &Mapping,
    so: usize,
    dst: &Mapping,
    doff: usize,
    n: usize,
) -> Result<(), Fault> {
    if Mapping::copy(src, so, dst, doff, n) {
        Ok(())
    } else {
        Err(Fault::Protection)
    }
}
