//! Inline payloads: bytes carried in the doorbell entry.
#![forbid(unsafe_code)]

use crate::backend::soft::memory::{Fault, Place};

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
