//! Completion queues: `VipCreateCQ`, `VipDestroyCQ`, `VipResizeCQ`,
//! `VipCQDone`, `VipCQWait`, `VipCQNotify`.

use std::sync::Arc;

use crate::cq::CqCore;
use crate::error::Error;
use crate::ffi::boundary::{CContext, Out, ffi_boundary, opaque, opaque_value, timeout, vip_bool};
use crate::ffi::handles::{cq_from, cq_handle, nic_from, nic_handle, vi_handle};
use crate::ffi::types::*;
use crate::nic::{MAX_CQ_ENTRIES, NicInner};
use crate::vi::ViCore;

/// Checks an entry count: 0 is a bad parameter, more than the NIC has is
/// a resource error (as the header documents).
fn entries(n: VIP_ULONG) -> crate::error::Result<u32> {
    if n == 0 {
        return Err(Error::InvalidParameter);
    }
    if n > MAX_CQ_ENTRIES as VIP_ULONG {
        return Err(Error::Resource);
    }
    Ok(n as u32)
}

/// Writes a (VI, queue) completion for C.
fn report(nic: &NicInner, vi: &ViCore, recv: bool, vh: Out<VIP_VI_HANDLE>, rq: Out<VIP_BOOLEAN>) {
    vh.write(vi_handle(nic, vi.slot, vi.generation));
    rq.write(vip_bool(recv));
}

/// Creates a completion queue of `EntryCount` entries on `NicHandle` and
/// returns it in `*CQHandle`.
///
/// Returns `VIP_SUCCESS`; `VIP_INVALID_PARAMETER` for a bad handle, NULL
/// `CQHandle` or `EntryCount` 0; `VIP_ERROR_RESOURCE` when `MaxCQ` CQs
/// exist or `EntryCount` is above `MaxCQEntries`.
///
/// # Safety
/// `CQHandle` is NULL or valid for writing one handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn VipCreateCQ(
    NicHandle: VIP_NIC_HANDLE,
    EntryCount: VIP_ULONG,
    CQHandle: *mut VIP_CQ_HANDLE,
) -> VIP_RETURN {
    ffi_boundary!("VipCreateCQ", {
        let nic = nic_from(NicHandle)?;
        // SAFETY: the caller's contract for `CQHandle`.
        let out = unsafe { Out::new(CQHandle) }?;
        let cq = CqCore::create(&nic, entries(EntryCount)?)?;
        out.write(cq_handle(&nic, cq.slot, cq.generation));
        Ok(())
    })
}

/// Destroys the completion queue `CQHandle`; no VI may use it.
///
/// Returns `VIP_SUCCESS`; `VIP_INVALID_PARAMETER` for a bad handle;
/// `VIP_INVALID_STATE` while a VI's queue is associated with it;
/// `VIP_ERROR_RESOURCE`.
///
/// # Safety
/// None (handles are checked values).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn VipDestroyCQ(CQHandle: VIP_CQ_HANDLE) -> VIP_RETURN {
    ffi_boundary!("VipDestroyCQ", {
        let (nic, cq) = cq_from(CQHandle)?;
        cq.destroy(&nic)
    })
}

/// Changes the number of entries of `CQHandle` to `EntryCount`; the
/// completions it holds are kept.
///
/// Returns `VIP_SUCCESS`; `VIP_INVALID_PARAMETER` for a bad handle or
/// `EntryCount` 0; `VIP_INVALID_STATE` if the CQ holds more than
/// `EntryCount` completions; `VIP_ERROR_RESOURCE` for `EntryCount` above
/// `MaxCQEntries`.
///
/// # Safety
/// None (handles are checked values).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn VipResizeCQ(CQHandle: VIP_CQ_HANDLE, EntryCount: VIP_ULONG) -> VIP_RETURN {
    ffi_boundary!("VipResizeCQ", {
        let (nic, cq) = cq_from(CQHandle)?;
        cq.resize(&nic, entries(EntryCount)?)
    })
}

/// Takes the oldest completion of `CQHandle`: the VI in `*ViHandle`, and
/// in `*RecvQueue` whether it is the VI's receive queue. The descriptor
/// stays queued: dequeue it with `VipRecvDone` / `VipSendDone`.
///
/// Returns `VIP_SUCCESS`; `VIP_NOT_DONE` if the CQ is empty;
/// `VIP_INVALID_PARAMETER` for a bad handle or a NULL pointer;
/// `VIP_ERROR_RESOURCE`.
///
/// # Safety
/// `ViHandle` and `RecvQueue` are NULL or valid for writing one value.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn VipCQDone(
    CQHandle: VIP_CQ_HANDLE,
    ViHandle: *mut VIP_VI_HANDLE,
    RecvQueue: *mut VIP_BOOLEAN,
) -> VIP_RETURN {
    ffi_boundary!("VipCQDone", {
        let (nic, cq) = cq_from(CQHandle)?;
        // SAFETY: the caller's contract for the out-parameters.
        let (vh, rq) = unsafe { (Out::new(ViHandle)?, Out::new(RecvQueue)?) };
        let (vi, recv) = cq.done(&nic)?;
        report(&nic, &vi, recv, vh, rq);
        Ok(())
    })
}

/// Waits up to `Timeout` ms (`VIP_INFINITE`: forever) for a completion of
/// `CQHandle` and takes it, as `VipCQDone`. Several threads may wait at
/// once; each completion goes to one of them.
///
/// Returns `VIP_SUCCESS`; `VIP_TIMEOUT`; `VIP_INVALID_PARAMETER` for a bad
/// handle or a NULL pointer; `VIP_ERROR_RESOURCE`.
///
/// # Safety
/// `ViHandle` and `RecvQueue` are NULL or valid for writing one value.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn VipCQWait(
    CQHandle: VIP_CQ_HANDLE,
    Timeout: VIP_ULONG,
    ViHandle: *mut VIP_VI_HANDLE,
    RecvQueue: *mut VIP_BOOLEAN,
) -> VIP_RETURN {
    ffi_boundary!("VipCQWait", {
        let (nic, cq) = cq_from(CQHandle)?;
        // SAFETY: the caller's contract for the out-parameters.
        let (vh, rq) = unsafe { (Out::new(ViHandle)?, Out::new(RecvQueue)?) };
        let (vi, recv) = cq.wait(&nic, timeout(Timeout))?;
        report(&nic, &vi, recv, vh, rq);
        Ok(())
    })
}

/// Runs `Handler(Context, NicHandle, ViHandle, RecvQueue)` once, on the
/// NIC's provider thread, for the next completion of `CQHandle`; the
/// completion is taken from the CQ for the handler (the descriptor stays
/// on its work queue). Re-arm from inside the handler to keep being
/// notified.
///
/// Returns `VIP_SUCCESS`; `VIP_INVALID_PARAMETER` for a bad handle or NULL
/// `Handler`; `VIP_ERROR_RESOURCE`.
///
/// # Safety
/// `Handler` may be called with `Context` on another thread, at any time
/// until the CQ is destroyed or the NIC closed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn VipCQNotify(
    CQHandle: VIP_CQ_HANDLE,
    Context: VIP_PVOID,
    Handler: VIP_CQ_NOTIFY_HANDLER,
) -> VIP_RETURN {
    ffi_boundary!("VipCQNotify", {
        let (nic, cq) = cq_from(CQHandle)?;
        let handler = Handler.ok_or(Error::InvalidParameter)?;
        let ctx = CContext::new(Context);
        let nh = opaque_value(nic_handle(&nic));
        // Weak: the handler is stored in the CQ, which the NIC owns.
        let weak = Arc::downgrade(&nic);
        cq.notify(
            &nic,
            Box::new(move |vi: Arc<ViCore>, recv: bool| {
                let Some(nic) = weak.upgrade() else { return };
                let vh = vi_handle(&nic, vi.slot, vi.generation);
                drop(nic);
                // SAFETY: the application registered `handler` for this call
                // shape and context. No provider lock is held here.
                unsafe { handler(ctx.get(), opaque(nh), vh, vip_bool(recv)) }
            }),
        );
        Ok(())
    })
}
