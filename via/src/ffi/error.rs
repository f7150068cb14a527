//! `VipErrorCallback`: asynchronous errors as `VIP_ERROR_DESCRIPTOR`s.

use std::sync::{Arc, Weak};

use crate::ffi::boundary::{CContext, ffi_boundary, pointer};
use crate::ffi::handles::{cq_handle, nic_from, nic_handle, vi_handle};
use crate::ffi::types::*;
use crate::nic::{AsyncError, NicInner};

/// The C view of an asynchronous error of `nic`.
fn error_descriptor(nic: &NicInner, e: &AsyncError) -> VIP_ERROR_DESCRIPTOR {
    let vi = e.vi.map_or(core::ptr::null_mut(), |(slot, generation)| {
        vi_handle(nic, slot, generation)
    });
    let cq = e.cq.map_or(core::ptr::null_mut(), |(slot, generation)| {
        // A peer's report names the slot only (generation 0): the CQ in
        // that slot now is the one it was about.
        let generation = if generation == 0 {
            nic.cqs
                .read()
                .unwrap()
                .iter()
                .find(|c| c.0 == slot)
                .map_or(0, |c| c.1)
        } else {
            generation
        };
        cq_handle(nic, slot, generation)
    });
    VIP_ERROR_DESCRIPTOR {
        NicHandle: nic_handle(nic),
        ViHandle: vi,
        CQHandle: cq,
        DescriptorPtr: if e.descriptor == 0 {
            core::ptr::null_mut()
        } else {
            pointer(e.descriptor)
        },
        // The operation is not recorded with the error.
        OpCode: 0,
        ResourceCode: e.resource as VIP_RESOURCE_CODE,
        ErrorCode: e.code as VIP_ERROR_CODE,
    }
}

/// Installs `Handler` for the asynchronous errors of `NicHandle`,
/// replacing any earlier one; a NULL `Handler` removes it (errors are then
/// logged to stderr). The handler runs on the NIC's provider thread as
/// `Handler(Context, ErrorDesc)`; `*ErrorDesc` is valid only during the
/// call. Its `NicHandle` is this NIC, `ViHandle` / `CQHandle` the VI or CQ
/// concerned (or NULL), `DescriptorPtr` the descriptor when the error is
/// about one of ours (else NULL), and `OpCode` 0.
///
/// Errors reported: `VIP_ERROR_CONN_LOST` (peer gone, disconnected, or the
/// connection broke on our side), `VIP_ERROR_RECVQ_EMPTY` (a message found
/// no receive on a reliable VI), `VIP_ERROR_RDMAW_PROT` /
/// `VIP_ERROR_RDMAR_PROT` (a peer's RDMA violated protection at this VI),
/// `VIP_ERROR_POST_DESC` (a reliable VI's send failed locally),
/// `VIP_ERROR_COMP_PROT` (a completion could not be written),
/// `VIP_ERROR_CATASTROPHIC` (a CQ overflowed).
///
/// Returns `VIP_SUCCESS`; `VIP_INVALID_PARAMETER` for a bad handle;
/// `VIP_ERROR_RESOURCE`.
///
/// # Safety
/// `Handler` may be called with `Context` on another thread until the NIC
/// is closed or the handler replaced.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn VipErrorCallback(
    NicHandle: VIP_NIC_HANDLE,
    Context: VIP_PVOID,
    Handler: VIP_ERROR_HANDLER,
) -> VIP_RETURN {
    ffi_boundary!("VipErrorCallback", {
        let nic = nic_from(NicHandle)?;
        let cb: Option<crate::nic::ErrorHandler> = Handler.map(|handler| {
            let ctx = CContext::new(Context);
            // Weak: the callback is stored in the NIC itself.
            let weak: Weak<NicInner> = Arc::downgrade(&nic);
            Arc::new(move |e: &AsyncError| {
                let Some(nic) = weak.upgrade() else { return };
                let mut d = error_descriptor(&nic, e);
                drop(nic);
                // SAFETY: the application registered `handler` with this
                // context; `d` lives until the call returns. The NIC's
                // callback lock was released before this closure was called.
                unsafe { handler(ctx.get(), &mut d) }
            }) as crate::nic::ErrorHandler
        });
        *nic.error_cb.lock().unwrap() = cb;
        Ok(())
    })
}
