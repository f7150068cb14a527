//! Shared receive queues: `VipCreateSrq`, `VipDestroySrq`,
//! `VipPostSrqRecv`, `VipSrqDone`, `VipSrqWait`, `VipSetViSrq`. An
//! extension of via-rs, not VIPL 1.0 (`include/vipl.h` marks them); only
//! the verbs kind of NIC has them, the others answer
//! `VIP_INVALID_PARAMETER` (VIPL's answer for a NIC that cannot do what
//! is asked: it has no `VIP_NOT_SUPPORTED`).

use std::sync::{Arc, Mutex};

use crate::api::{Srq, SrqCompletion};
use crate::error::{Error, Result};
use crate::ffi::boundary::{Out, address, ffi_boundary, pointer, timeout};
use crate::ffi::handles::{nic_from, ptag_of, srq_decode, srq_handle, vi_from, vi_handle};
use crate::ffi::types::*;

/// The SRQs created through the C API: slot → (generation, SRQ).
static TABLE: Mutex<Vec<(u16, Option<Arc<Srq>>)>> = Mutex::new(Vec::new());

/// The SRQ of handle `h`.
fn srq_from(h: VIP_SRQ_HANDLE) -> Result<Arc<Srq>> {
    let (nic, slot, generation) = srq_decode(h)?;
    let t = TABLE.lock().unwrap();
    match t.get(slot as usize) {
        Some((g, Some(s))) if *g == generation && Arc::ptr_eq(s.nic(), &nic) => Ok(s.clone()),
        _ => Err(Error::InvalidParameter),
    }
}

fn report(s: &Srq, c: SrqCompletion, vh: Out<VIP_VI_HANDLE>, dp: Out<*mut VIP_DESCRIPTOR>) {
    vh.write(if c.vi == u32::MAX {
        std::ptr::null_mut()
    } else {
        vi_handle(s.nic(), c.vi, c.generation)
    });
    dp.write(pointer(c.desc));
}

/// Creates a shared receive queue of `EntryCount` descriptors of the tag
/// `PtagHandle` on `NicHandle`, in `*SrqHandle`.
///
/// Returns `VIP_SUCCESS`; `VIP_INVALID_PARAMETER` for a bad handle, NULL
/// `SrqHandle`, `EntryCount` 0 or a kind of NIC without SRQs;
/// `VIP_INVALID_PTAG`; `VIP_ERROR_RESOURCE` above `MaxDescriptorsPerQueue`
/// or the NIC's SRQs.
///
/// # Safety
/// `SrqHandle` is NULL or valid for writing one handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn VipCreateSrq(
    NicHandle: VIP_NIC_HANDLE,
    PtagHandle: VIP_PROTECTION_HANDLE,
    EntryCount: VIP_ULONG,
    SrqHandle: *mut VIP_SRQ_HANDLE,
) -> VIP_RETURN {
    ffi_boundary!("VipCreateSrq", {
        let nic = nic_from(NicHandle)?;
        // SAFETY: the caller's contract for `SrqHandle`.
        let out = unsafe { Out::new(SrqHandle) }?;
        let ptag = ptag_of(&nic, PtagHandle).ok_or(Error::InvalidPtag)?;
        let entries = u32::try_from(EntryCount).map_err(|_| Error::Resource)?;
        let srq = Arc::new(Srq::create(&nic, ptag, entries)?);
        let mut t = TABLE.lock().unwrap();
        let slot = match t.iter().position(|(_, s)| s.is_none()) {
            Some(i) => i,
            None if t.len() <= 0xffff => {
                t.push((0, None));
                t.len() - 1
            }
            None => return Err(Error::Resource),
        };
        let generation = t[slot].0.wrapping_add(1);
        t[slot] = (generation, Some(srq));
        out.write(srq_handle(&nic, slot as u32, generation));
        Ok(())
    })
}

/// Destroys a shared receive queue; descriptors still posted complete
/// with `VIP_STATUS_DESC_FLUSHED_ERROR` written into them.
///
/// Returns `VIP_SUCCESS`; `VIP_INVALID_PARAMETER` for a bad handle;
/// `VIP_INVALID_STATE` while a VI is attached.
///
/// # Safety
/// None (handles are checked values).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn VipDestroySrq(SrqHandle: VIP_SRQ_HANDLE) -> VIP_RETURN {
    ffi_boundary!("VipDestroySrq", {
        let (nic, slot, generation) = srq_decode(SrqHandle)?;
        let mut t = TABLE.lock().unwrap();
        let e = t.get_mut(slot as usize).ok_or(Error::InvalidParameter)?;
        let s = match &e.1 {
            Some(s) if e.0 == generation && Arc::ptr_eq(s.nic(), &nic) => s.clone(),
            _ => return Err(Error::InvalidParameter),
        };
        s.destroy_shared()?;
        e.1 = None;
        Ok(())
    })
}

/// Posts the receive descriptor `DescriptorPtr` (in the region of
/// `MemHandle`) to a shared receive queue.
///
/// Returns `VIP_SUCCESS`; `VIP_INVALID_PARAMETER` for a bad handle or NULL
/// descriptor; `VIP_DESCRIPTOR_ERROR` for a malformed or misaligned one;
/// `VIP_ERROR_RESOURCE` when the SRQ is full.
///
/// # Safety
/// None beyond VipPostRecv's: the descriptor is read through its
/// registration, never dereferenced unchecked.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn VipPostSrqRecv(
    SrqHandle: VIP_SRQ_HANDLE,
    DescriptorPtr: *mut VIP_DESCRIPTOR,
    MemHandle: VIP_MEM_HANDLE,
) -> VIP_RETURN {
    ffi_boundary!("VipPostSrqRecv", {
        let s = srq_from(SrqHandle)?;
        if DescriptorPtr.is_null() {
            return Err(Error::InvalidParameter);
        }
        if DescriptorPtr.addr() % VIP_DESCRIPTOR_ALIGNMENT != 0 {
            return Err(Error::DescriptorError);
        }
        s.post_at(address(DescriptorPtr), MemHandle)
    })
}

/// Takes the oldest completed descriptor of a shared receive queue: the
/// VI that received (NULL for a descriptor completed at post time) and the
/// descriptor.
///
/// Returns `VIP_SUCCESS`; `VIP_NOT_DONE`; `VIP_INVALID_PARAMETER` for a
/// bad handle or a NULL pointer.
///
/// # Safety
/// `ViHandle` and `DescriptorPtr` are NULL or valid for writing one value.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn VipSrqDone(
    SrqHandle: VIP_SRQ_HANDLE,
    ViHandle: *mut VIP_VI_HANDLE,
    DescriptorPtr: *mut *mut VIP_DESCRIPTOR,
) -> VIP_RETURN {
    ffi_boundary!("VipSrqDone", {
        let s = srq_from(SrqHandle)?;
        // SAFETY: the caller's contract for the out-parameters.
        let (vh, dp) = unsafe { (Out::new(ViHandle)?, Out::new(DescriptorPtr)?) };
        let c = s.done()?;
        report(&s, c, vh, dp);
        Ok(())
    })
}

/// Waits up to `Timeout` ms (`VIP_INFINITE`: forever) for a completed
/// descriptor of a shared receive queue, as `VipSrqDone`.
///
/// Returns `VIP_SUCCESS`; `VIP_TIMEOUT`; `VIP_INVALID_PARAMETER` for a bad
/// handle or a NULL pointer.
///
/// # Safety
/// `ViHandle` and `DescriptorPtr` are NULL or valid for writing one value.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn VipSrqWait(
    SrqHandle: VIP_SRQ_HANDLE,
    Timeout: VIP_ULONG,
    ViHandle: *mut VIP_VI_HANDLE,
    DescriptorPtr: *mut *mut VIP_DESCRIPTOR,
) -> VIP_RETURN {
    ffi_boundary!("VipSrqWait", {
        let s = srq_from(SrqHandle)?;
        // SAFETY: the caller's contract for the out-parameters.
        let (vh, dp) = unsafe { (Out::new(ViHandle)?, Out::new(DescriptorPtr)?) };
        let c = s.wait(timeout(Timeout))?;
        report(&s, c, vh, dp);
        Ok(())
    })
}

/// Attaches an idle VI without posted receives to a shared receive queue
/// (`SrqHandle` NULL: its own receive queue again). While attached,
/// `VipPostRecv` on the VI is `VIP_INVALID_STATE` and its receives are
/// reported by `VipSrqDone`/`VipSrqWait` (not by the VI's queue or CQ).
///
/// Returns `VIP_SUCCESS`; `VIP_INVALID_PARAMETER` for a bad handle, an SRQ
/// of another NIC, or a kind of NIC without SRQs; `VIP_INVALID_STATE`: the
/// VI is not idle or has receives posted; `VIP_INVALID_PTAG`: the SRQ's
/// tag is not the VI's; `VIP_INVALID_RELIABILITY_LEVEL`: an Unreliable VI.
///
/// # Safety
/// None (handles are checked values).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn VipSetViSrq(
    ViHandle: VIP_VI_HANDLE,
    SrqHandle: VIP_SRQ_HANDLE,
) -> VIP_RETURN {
    ffi_boundary!("VipSetViSrq", {
        let (nic, vi) = vi_from(ViHandle)?;
        let s = if SrqHandle.is_null() {
            None
        } else {
            Some(srq_from(SrqHandle)?)
        };
        Srq::attach(&nic, &vi, s.as_deref())
    })
}
