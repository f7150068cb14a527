//! The receive queue: `VipPostRecv`, `VipRecvDone`, `VipRecvWait`, `VipRecvNotify`.

use crate::ffi::boundary::ffi_boundary;
use crate::ffi::post;
use crate::ffi::types::*;
use crate::vi::Which;

/// Posts the descriptor at `DescriptorPtr` on the receive queue of
/// `ViHandle`; `MemHandle` is the region holding the descriptor itself.
///
/// Receives may be posted in every state, before the connection exists
/// too. In `VIP_STATE_ERROR` the descriptor completes at once with
/// `VIP_STATUS_DESC_FLUSHED_ERROR`; a data segment outside its region (or
/// of another protection tag) completes it at once with
/// `VIP_STATUS_PROTECTION_ERROR`, and a non-receive operation with
/// `VIP_STATUS_FORMAT_ERROR`.
///
/// Returns `VIP_SUCCESS`; `VIP_INVALID_PARAMETER` for a bad `ViHandle`, a
/// NULL `DescriptorPtr`, or a `MemHandle` that is not a live region of the
/// VI's NIC; `VIP_DESCRIPTOR_ERROR` if the descriptor is not 64-byte
/// aligned, not inside `MemHandle`'s region (or the region has another
/// protection tag than the VI), has `SegCount` above `MaxSegmentsPerDesc`,
/// or a reserved operation or `Control` bit; `VIP_ERROR_RESOURCE` when
/// `MaxDescriptorsPerQueue` are outstanding.
///
/// # Safety
/// As for `VipPostSend`: the descriptor is the application's, in
/// registered memory, and not touched by it until dequeued.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn VipPostRecv(
    ViHandle: VIP_VI_HANDLE,
    DescriptorPtr: *mut VIP_DESCRIPTOR,
    MemHandle: VIP_MEM_HANDLE,
) -> VIP_RETURN {
    ffi_boundary!("VipPostRecv", {
        post::post(ViHandle, DescriptorPtr, MemHandle, Which::Recv)
    })
}

/// Dequeues the oldest receive descriptor of `ViHandle` if it has
/// completed, and returns it in `*DescriptorPtr`.
///
/// Returns `VIP_SUCCESS`; `VIP_NOT_DONE` if the queue is empty or its head
/// has not completed; `VIP_INVALID_PARAMETER` for a bad handle or NULL
/// `DescriptorPtr`; `VIP_ERROR_RESOURCE`.
///
/// # Safety
/// `DescriptorPtr` is NULL or valid for writing one pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn VipRecvDone(
    ViHandle: VIP_VI_HANDLE,
    DescriptorPtr: *mut *mut VIP_DESCRIPTOR,
) -> VIP_RETURN {
    ffi_boundary!("VipRecvDone", {
        // SAFETY: the caller's contract, forwarded.
        unsafe { post::done(ViHandle, DescriptorPtr, Which::Recv) }
    })
}

/// Waits up to `Timeout` ms (`VIP_INFINITE`: forever) for the oldest
/// receive descriptor of `ViHandle` to complete, dequeues it and returns
/// it in `*DescriptorPtr`.
///
/// Returns `VIP_SUCCESS`; `VIP_TIMEOUT`; `VIP_INVALID_PARAMETER` for a bad
/// handle or NULL `DescriptorPtr`; `VIP_ERROR_RESOURCE`.
///
/// # Safety
/// `DescriptorPtr` is NULL or valid for writing one pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn VipRecvWait(
    ViHandle: VIP_VI_HANDLE,
    Timeout: VIP_ULONG,
    DescriptorPtr: *mut *mut VIP_DESCRIPTOR,
) -> VIP_RETURN {
    ffi_boundary!("VipRecvWait", {
        // SAFETY: the caller's contract, forwarded.
        unsafe { post::wait(ViHandle, Timeout, DescriptorPtr, Which::Recv) }
    })
}

/// Runs `Handler(Context, NicHandle, ViHandle, Descriptor)` once, on the
/// NIC's provider thread, for the next receive descriptor of `ViHandle` to
/// complete; the descriptor is dequeued for the handler. See
/// `VipSendNotify`.
///
/// Returns `VIP_SUCCESS`; `VIP_INVALID_PARAMETER` for a bad handle or NULL
/// `Handler`; `VIP_ERROR_RESOURCE`.
///
/// # Safety
/// `Handler` may be called with `Context` on another thread, at any time
/// until the VI is destroyed or the NIC closed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn VipRecvNotify(
    ViHandle: VIP_VI_HANDLE,
    Context: VIP_PVOID,
    Handler: VIP_NOTIFY_HANDLER,
) -> VIP_RETURN {
    ffi_boundary!("VipRecvNotify", {
        // SAFETY: the caller's contract, forwarded.
        unsafe { post::notify(ViHandle, Context, Handler, Which::Recv) }
    })
}
