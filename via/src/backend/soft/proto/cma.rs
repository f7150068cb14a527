//! Cross-memory attach: `process_vm_readv/writev` for extents that are not
//! shared files (a `MAP_SHARED` mapping of the application, a stack).
#![forbid(unsafe_code)]

use crate::backend::soft::memory::{Fault, Place};

/// Copies `n` bytes between two places, at least one of them reached by CMA.
pub(crate) fn copy(src: &Place<'_>, dst: &Place<'_>, n: usize) -> Result<(), Fault> {
    let r = match (src, dst) {
        (Place::Map(s, so), Place::Cma(pid, va)) => s.cma_write_from(*so, n, *pid, *va),
        (Place::Cma(pid, va), Place::Map(d, doff)) => d.cma_read_into(*doff, n, *pid, *va),
        (Place::Cma(sp, sva), Place::Cma(dp, dva)) => {
            let mut bounce = vec![0u8; n];
            crate::sys::process_vm_read(*sp, &mut bounce, *sva)
                .and_then(|_| crate::sys::process_vm_write(*dp, &bounce, *dva))
                .map(|_| true)
        }
        (Place::Map(s, so), Place::Map(d, doff)) => {
            Ok(crate::shm::mapping::Mapping::copy(s, *so, d, *doff, n))
        }
    };
    match r {
        Ok(true) => Ok(()),
        Ok(false) => Err(Fault::Protection),
        Err(e) => {
            log::debug!("cross-memory attach failed: {e}");
            Err(Fault::Transport)
        }
    }
}
