//! How bytes move between two places, one function per mechanism.
//!
//! * [`mapped`]: both sides are in arena files this process maps: one
//!   `memcpy`. The common case: registration moves private pages into arenas.
//! * [`cma`]: one side is only reachable by cross-memory attach
//!   (`process_vm_readv/writev`): one copy in the kernel.
//! * [`deliver`]: bytes from a buffer of ours (an inline payload carried in
//!   the doorbell entry, `VIA_INLINE`) into a place; [`fetch`] the other
//!   way (the last word of an RDMA write, stored after the rest).
#![forbid(unsafe_code)]

use crate::mem::region::{Fault, Place};
use crate::shm::mapping::Mapping;

/// Copies `n` bytes from `src[so..]` to `dst[doff..]` (both mapped).
pub(crate) fn mapped(
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

/// Copies `n` bytes between two places, at least one of them reached by
/// cross-memory attach.
pub(crate) fn cma(src: &Place<'_>, dst: &Place<'_>, n: usize) -> Result<(), Fault> {
    let r = match (src, dst) {
        (Place::Map(s, so), Place::Cma(pid, va)) => s.cma_write_from(*so, n, *pid, *va),
        (Place::Cma(pid, va), Place::Map(d, doff)) => d.cma_read_into(*doff, n, *pid, *va),
        (Place::Cma(sp, sva), Place::Cma(dp, dva)) => {
            let mut bounce = vec![0u8; n];
            crate::sys::process_vm_read(*sp, &mut bounce, *sva)
                .and_then(|_| crate::sys::process_vm_write(*dp, &bounce, *dva))
                .map(|_| true)
        }
        (Place::Map(s, so), Place::Map(d, doff)) => Ok(Mapping::copy(s, *so, d, *doff, n)),
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

/// Reads `out.len()` bytes at `src`.
pub(crate) fn fetch(src: &Place<'_>, out: &mut [u8]) -> Result<(), Fault> {
    match src {
        Place::Map(m, off) => {
            if m.read(*off, out) {
                Ok(())
            } else {
                Err(Fault::Protection)
            }
        }
        Place::Cma(pid, va) => crate::sys::process_vm_read(*pid, out, *va)
            .map(|_| ())
            .map_err(|_| Fault::Transport),
    }
}

/// Writes `bytes` to `dst`.
pub(crate) fn deliver(bytes: &[u8], dst: &Place<'_>) -> Result<(), Fault> {
    match dst {
        Place::Map(m, off) => {
            if m.write(*off, bytes) {
                Ok(())
            } else {
                Err(Fault::Protection)
            }
        }
        Place::Cma(pid, va) => crate::sys::process_vm_write(*pid, bytes, *va)
            .map(|_| ())
            .map_err(|_| Fault::Transport),
    }
}
