//! The send queue: `VipPostSend`, `VipSendDone`, `VipSendWait`, `VipSendNotify`.
//!
//! The data path of a send starts here: [`VipPostSend`] checks the handle
//! and the descriptor pointer, then calls `ViCore::post_send` (`vi.rs`).

use crate::ffi::boundary::ffi_boundary;
use crate::ffi::post;
use crate::ffi::types::*;
use crate::vi::Which;

/// Posts the descriptor at `DescriptorPtr` on the send queue of
/// `ViHandle`; `MemHandle` is the region holding the descriptor itself.
///
/// The VI must be connected. In `VIP_STATE_ERROR` the post is accepted and
/// the descriptor completes at once with `VIP_STATUS_DESC_FLUSHED_ERROR`.
/// Problems the NIC finds while processing (a segment outside its region,
/// a length above the VI's `MaxTransferSize`, a protection violation at
/// the target) complete the descriptor with error bits in `CS.Status`.
///
/// Returns `VIP_SUCCESS`; `VIP_INVALID_PARAMETER` for a bad `ViHandle`, a
/// NULL `DescriptorPtr`, or a `MemHandle` that is not a live region of the
/// VI's NIC; `VIP_INVALID_STATE` if the VI is idle or connect-pending;
/// `VIP_DESCRIPTOR_ERROR` if the descriptor is not 64-byte aligned, not
/// inside `MemHandle`'s region (or the region has another protection tag
/// than the VI), has `SegCount` above `MaxSegmentsPerDesc`, a reserved
/// operation or `Control` bit, an RDMA operation without address segment,
/// or RDMA read on an unreliable VI or with immediate data;
/// `VIP_ERROR_RESOURCE` when `MaxDescriptorsPerQueue` are outstanding.
///
/// # Safety
/// The descriptor is the application's, in registered memory, and not
/// written by it until it is dequeued (VIA's rule); the library reads it
/// through its own mapping of the region, never through `DescriptorPtr`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn VipPostSend(
    ViHandle: VIP_VI_HANDLE,
    DescriptorPtr: *mut VIP_DESCRIPTOR,
    MemHandle: VIP_MEM_HANDLE,
) -> VIP_RETURN {
    ffi_boundary!("VipPostSend", {
        post::post(ViHandle, DescriptorPtr, MemHandle, Which::Send)
    })
}

/// Dequeues the oldest send descriptor of `ViHandle` if it has completed,
/// and returns it in `*DescriptorPtr`.
///
/// Returns `VIP_SUCCESS`; `VIP_NOT_DONE` if the queue is empty or its head
/// has not completed; `VIP_INVALID_PARAMETER` for a bad handle or NULL
/// `DescriptorPtr`; `VIP_ERROR_RESOURCE`.
///
/// # Safety
/// `DescriptorPtr` is NULL or valid for writing one pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn VipSendDone(
    ViHandle: VIP_VI_HANDLE,
    DescriptorPtr: *mut *mut VIP_DESCRIPTOR,
) -> VIP_RETURN {
    ffi_boundary!("VipSendDone", {
        // SAFETY: the caller's contract, forwarded.
        unsafe { post::done(ViHandle, DescriptorPtr, Which::Send) }
    })
}

/// Waits up to `Timeout` ms (`VIP_INFINITE`: forever) for the oldest send
/// descriptor of `ViHandle` to complete, dequeues it and returns it in
/// `*DescriptorPtr`. Several threads may wait at once; each completion is
/// returned to one of them.
///
/// Returns `VIP_SUCCESS`; `VIP_TIMEOUT`; `VIP_INVALID_PARAMETER` for a bad
/// handle or NULL `DescriptorPtr`; `VIP_ERROR_RESOURCE`.
///
/// # Safety
/// `DescriptorPtr` is NULL or valid for writing one pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn VipSendWait(
    ViHandle: VIP_VI_HANDLE,
    Timeout: VIP_ULONG,
    DescriptorPtr: *mut *mut VIP_DESCRIPTOR,
) -> VIP_RETURN {
    ffi_boundary!("VipSendWait", {
        // SAFETY: the caller's contract, forwarded.
        unsafe { post::wait(ViHandle, Timeout, DescriptorPtr, Which::Send) }
    })
}

/// Runs `Handler(Context, NicHandle, ViHandle, Descriptor)` once, on the
/// NIC's provider thread, for the next send descriptor of `ViHandle` to
/// complete; the descriptor is dequeued for the handler. Handlers armed
/// several times run for successive completions, in order. Re-arm from
/// inside the handler to keep being notified.
///
/// Returns `VIP_SUCCESS`; `VIP_INVALID_PARAMETER` for a bad handle or NULL
/// `Handler`; `VIP_ERROR_RESOURCE`.
///
/// # Safety
/// `Handler` may be called with `Context` on another thread, at any time
/// until the VI is destroyed or the NIC closed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn VipSendNotify(
    ViHandle: VIP_VI_HANDLE,
    Context: VIP_PVOID,
    Handler: VIP_NOTIFY_HANDLER,
) -> VIP_RETURN {
    ffi_boundary!("VipSendNotify", {
        // SAFETY: the caller's contract, forwarded.
        unsafe { post::notify(ViHandle, Context, Handler, Which::Send) }
    })
}
