//! What the send and receive queues share: posting, dequeuing, waiting and
//! notify handlers. `send.rs` and `recv.rs` hold the exports.

use crate::error::{Error, Result};
use crate::ffi::boundary::{CContext, Out, address, opaque, opaque_value, pointer, timeout};
use crate::ffi::handles::{nic_handle, vi_from, vi_handle, with_vi};
use crate::ffi::last_vi;
use crate::ffi::types::*;
use crate::nic::NicInner;
use crate::vi::ViCore;
use crate::vi::{Completion, Which};

/// Checks the descriptor pointer and posts it on queue `w` of `vi_h`.
///
/// The descriptor itself is read by the core through the library's view of
/// registered memory (never through `desc`), which checks that `handle`
/// covers it, its `SegCount` and its control bits. Inlined into each
/// export, so that `w` is a constant there.
#[inline(always)]
pub(crate) fn post(
    vi_h: VIP_VI_HANDLE,
    desc: *mut VIP_DESCRIPTOR,
    handle: VIP_MEM_HANDLE,
    w: Which,
) -> Result<()> {
    with_vi(vi_h, |nic, vi| {
        if desc.is_null() {
            return Err(Error::InvalidParameter);
        }
        if desc.addr() % VIP_DESCRIPTOR_ALIGNMENT != 0 {
            return Err(Error::DescriptorError);
        }
        let va = address(desc);
        match w {
            Which::Send => vi.post_send(nic, va, handle),
            Which::Recv => vi.post_recv(nic, va, handle),
        }
    })
}

/// The application's pointer to a completed descriptor.
fn descriptor(c: Completion) -> *mut VIP_DESCRIPTOR {
    pointer(c.desc)
}

/// Dequeues the head of queue `w` if it completed.
///
/// # Safety
/// `out` is NULL or valid for writing one pointer.
#[inline(always)]
pub(crate) unsafe fn done(
    vi_h: VIP_VI_HANDLE,
    out: *mut *mut VIP_DESCRIPTOR,
    w: Which,
) -> Result<()> {
    // SAFETY: the caller's contract for `out`.
    let out = unsafe { Out::new(out) }?;
    // The dequeue is written out in both branches: a poll that hits the
    // thread's cells (every poll of a polling loop) runs straight through,
    // without merging the two ways of holding the VI first.
    #[inline(always)]
    fn dequeue(nic: &NicInner, vi: &ViCore, w: Which, out: Out<*mut VIP_DESCRIPTOR>) -> Result<()> {
        let c = vi.done_polling(nic, w)?;
        out.write(descriptor(c));
        Ok(())
    }
    match last_vi::enter(opaque_value(vi_h)) {
        Some(e) => dequeue(e.nic(), e.vi(), w, out),
        None => {
            let (nic, vi) = vi_from(vi_h)?;
            dequeue(&nic, &vi, w, out)
        }
    }
}

/// Waits up to `ms` for the head of queue `w` and dequeues it.
///
/// # Safety
/// `out` is NULL or valid for writing one pointer.
pub(crate) unsafe fn wait(
    vi_h: VIP_VI_HANDLE,
    ms: VIP_ULONG,
    out: *mut *mut VIP_DESCRIPTOR,
    w: Which,
) -> Result<()> {
    let (nic, vi) = vi_from(vi_h)?;
    // SAFETY: the caller's contract for `out`.
    let out = unsafe { Out::new(out) }?;
    out.write(descriptor(vi.wait(&nic, w, timeout(ms))?));
    Ok(())
}

/// Arms a one-shot notify handler on queue `w`.
///
/// # Safety
/// `handler`, when it runs, may be called with `ctx` on a provider thread.
pub(crate) unsafe fn notify(
    vi_h: VIP_VI_HANDLE,
    ctx: VIP_PVOID,
    handler: VIP_NOTIFY_HANDLER,
    w: Which,
) -> Result<()> {
    let (nic, vi) = vi_from(vi_h)?;
    let handler = handler.ok_or(Error::InvalidParameter)?;
    let ctx = CContext::new(ctx);
    // Handles are plain values: computed now, so the handler needs no lookup.
    let (nh, vh) = (
        opaque_value(nic_handle(&nic)),
        opaque_value(vi_handle(&nic, vi.slot, vi.generation)),
    );
    vi.notify(
        &nic,
        w,
        Box::new(move |c: Completion| {
            // SAFETY: the application registered `handler` for exactly this
            // call shape and context; the descriptor pointer is the one it
            // posted, now dequeued. No provider lock is held here.
            unsafe { handler(ctx.get(), opaque(nh), opaque(vh), descriptor(c)) }
        }),
    );
    Ok(())
}
