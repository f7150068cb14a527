//! `VipCreateVi`, `VipDestroyVi`, `VipQueryVi`, `VipSetViAttributes`, and
//! the conversion of `VIP_VI_ATTRIBUTES`.

use std::sync::Arc;

use crate::attrs::{Ptag, Reliability, ViAttributes};
use crate::error::{Error, Result};
use crate::ffi::boundary::{Out, boolean, ffi_boundary, opaque, opaque_value, read_in, vip_bool};
use crate::ffi::handles::{nic_from, optional_cq_of, ptag_handle, ptag_of, vi_from, vi_handle};
use crate::ffi::types::*;
use crate::nic::NicInner;
use crate::vi::ViCore;

/// Converts C VI attributes for `nic`, checking what the core does not:
/// the level is exactly one known `VIP_SERVICE_*` bit, `MaxTransferSize`
/// fits the provider's 32 bits, and `Ptag` is a live tag of this NIC.
pub(crate) fn vi_attrs_in(nic: &Arc<NicInner>, a: &VIP_VI_ATTRIBUTES) -> Result<ViAttributes> {
    let reliability = Reliability::from_bits(a.ReliabilityLevel as u32)?;
    let max_transfer_size = u32::try_from(a.MaxTransferSize).map_err(|_| Error::InvalidMtu)?;
    let ptag = ptag_of(nic, a.Ptag).ok_or(Error::InvalidPtag)?;
    Ok(ViAttributes {
        reliability,
        max_transfer_size,
        qos: opaque_value(a.QoS),
        ptag,
        enable_rdma_write: boolean(a.EnableRdmaWrite),
        enable_rdma_read: boolean(a.EnableRdmaRead),
    })
}

/// Converts attributes for C. The remote VI's attributes (from the
/// connection calls) carry no tag of ours: `Ptag` is NULL for them.
pub(crate) fn vi_attrs_out(nic: &NicInner, a: &ViAttributes, local: bool) -> VIP_VI_ATTRIBUTES {
    VIP_VI_ATTRIBUTES {
        ReliabilityLevel: a.reliability.bits() as VIP_RELIABILITY_LEVEL,
        MaxTransferSize: a.max_transfer_size as VIP_ULONG,
        QoS: opaque(a.qos),
        Ptag: if local && a.ptag != Ptag(0) {
            ptag_handle(nic, a.ptag)
        } else {
            core::ptr::null_mut()
        },
        EnableRdmaWrite: vip_bool(a.enable_rdma_write),
        EnableRdmaRead: vip_bool(a.enable_rdma_read),
    }
}

/// Creates an idle VI of `NicHandle` with the attributes `*ViAttribs`,
/// its send and receive queues associated with `SendCQHandle` and
/// `RecvCQHandle` (each may be NULL), and returns it in `*ViHandle`.
///
/// Returns `VIP_SUCCESS`; `VIP_INVALID_PARAMETER` for a bad NIC handle, a
/// NULL pointer, or a CQ handle that is not NULL and not a live CQ of this
/// NIC; `VIP_INVALID_RELIABILITY_LEVEL` if `ReliabilityLevel` is not
/// exactly one of the `VIP_SERVICE_*` levels; `VIP_INVALID_MTU` for a
/// `MaxTransferSize` of 0 or above the NIC's; `VIP_INVALID_PTAG` if `Ptag`
/// is not a live tag of this NIC; `VIP_INVALID_RDMAREAD` for
/// `EnableRdmaRead` on the unreliable level; `VIP_ERROR_RESOURCE` when
/// `MaxVI` VIs exist. `QoS` is ignored (kept and reported back).
///
/// # Safety
/// `ViAttribs` and `ViHandle` are NULL or valid for reading/writing one value.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn VipCreateVi(
    NicHandle: VIP_NIC_HANDLE,
    ViAttribs: *mut VIP_VI_ATTRIBUTES,
    SendCQHandle: VIP_CQ_HANDLE,
    RecvCQHandle: VIP_CQ_HANDLE,
    ViHandle: *mut VIP_VI_HANDLE,
) -> VIP_RETURN {
    ffi_boundary!("VipCreateVi", {
        let nic = nic_from(NicHandle)?;
        // SAFETY: the caller's contract for `ViAttribs` and `ViHandle`.
        let (attrs, out) = unsafe { (read_in(ViAttribs)?, Out::new(ViHandle)?) };
        let send_cq = optional_cq_of(&nic, SendCQHandle)?;
        let recv_cq = optional_cq_of(&nic, RecvCQHandle)?;
        let attrs = vi_attrs_in(&nic, &attrs)?;
        let vi = ViCore::create(&nic, attrs, send_cq, recv_cq)?;
        out.write(vi_handle(&nic, vi.slot, vi.generation));
        Ok(())
    })
}

/// Destroys the VI `ViHandle`, which must be idle with both work queues
/// empty (dequeue flushed descriptors first); the handle becomes stale.
///
/// Returns `VIP_SUCCESS`; `VIP_INVALID_PARAMETER` for a bad handle;
/// `VIP_INVALID_STATE` if the VI is not idle (connected, pending, or in
/// the error state) or a work queue holds descriptors;
/// `VIP_ERROR_RESOURCE`.
///
/// # Safety
/// None (handles are checked values).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn VipDestroyVi(ViHandle: VIP_VI_HANDLE) -> VIP_RETURN {
    ffi_boundary!("VipDestroyVi", {
        let (nic, vi) = vi_from(ViHandle)?;
        vi.destroy(&nic)
    })
}

/// Writes the VI's state, attributes, and whether each work queue is
/// empty (no descriptor posted and not yet dequeued).
///
/// Returns `VIP_SUCCESS`; `VIP_INVALID_PARAMETER` for a bad handle or any
/// NULL pointer; `VIP_ERROR_RESOURCE`.
///
/// # Safety
/// Each pointer is NULL or valid for writing one value of its type.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn VipQueryVi(
    ViHandle: VIP_VI_HANDLE,
    State: *mut VIP_VI_STATE,
    Attrs: *mut VIP_VI_ATTRIBUTES,
    SendQueueEmpty: *mut VIP_BOOLEAN,
    RecvQueueEmpty: *mut VIP_BOOLEAN,
) -> VIP_RETURN {
    ffi_boundary!("VipQueryVi", {
        let (nic, vi) = vi_from(ViHandle)?;
        // SAFETY: the caller's contract for the four out-parameters.
        let (st, at, se, re) = unsafe {
            (
                Out::new(State)?,
                Out::new(Attrs)?,
                Out::new(SendQueueEmpty)?,
                Out::new(RecvQueueEmpty)?,
            )
        };
        let (state, attrs, send_empty, recv_empty) = vi.query(&nic);
        st.write(state.code());
        at.write(vi_attrs_out(&nic, &attrs, true));
        se.write(vip_bool(send_empty));
        re.write(vip_bool(recv_empty));
        Ok(())
    })
}

/// Changes the attributes of the idle VI `ViHandle` to `*Attrs`.
///
/// Returns `VIP_SUCCESS`; `VIP_INVALID_PARAMETER` for a bad handle or NULL
/// `Attrs`; `VIP_INVALID_STATE` if the VI is not idle;
/// `VIP_INVALID_RELIABILITY_LEVEL`, `VIP_INVALID_MTU`, `VIP_INVALID_PTAG`,
/// `VIP_INVALID_RDMAREAD` as for `VipCreateVi`; `VIP_ERROR_RESOURCE`.
/// The state is checked first.
///
/// # Safety
/// `Attrs` is NULL or valid for reading one `VIP_VI_ATTRIBUTES`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn VipSetViAttributes(
    ViHandle: VIP_VI_HANDLE,
    Attrs: *mut VIP_VI_ATTRIBUTES,
) -> VIP_RETURN {
    ffi_boundary!("VipSetViAttributes", {
        let (nic, vi) = vi_from(ViHandle)?;
        // SAFETY: the caller's contract for `Attrs`.
        let attrs = unsafe { read_in(Attrs) }?;
        if vi.vi_state() != crate::attrs::ViState::Idle {
            return Err(Error::InvalidState);
        }
        let attrs = vi_attrs_in(&nic, &attrs)?;
        vi.set_attributes(&nic, attrs)
    })
}
