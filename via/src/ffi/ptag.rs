//! `VipCreatePtag`, `VipDestroyPtag`.

use crate::error::Error;
use crate::ffi::boundary::{Out, ffi_boundary};
use crate::ffi::handles::{nic_from, ptag_handle, ptag_of};
use crate::ffi::types::*;

/// Creates a protection tag of `NicHandle` and returns it in
/// `*ProtectionTag`.
///
/// Returns `VIP_SUCCESS`; `VIP_INVALID_PARAMETER` for a bad handle or NULL
/// `ProtectionTag`; `VIP_ERROR_RESOURCE` when `MaxPtags` tags exist.
///
/// # Safety
/// `ProtectionTag` is NULL or valid for writing one handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn VipCreatePtag(
    NicHandle: VIP_NIC_HANDLE,
    ProtectionTag: *mut VIP_PROTECTION_HANDLE,
) -> VIP_RETURN {
    ffi_boundary!("VipCreatePtag", {
        let nic = nic_from(NicHandle)?;
        // SAFETY: the caller's contract for `ProtectionTag`.
        let out = unsafe { Out::new(ProtectionTag) }?;
        let p = nic.create_ptag()?;
        out.write(ptag_handle(&nic, p));
        Ok(())
    })
}

/// Destroys the protection tag `ProtectionTag` of `NicHandle`.
///
/// Returns `VIP_SUCCESS`; `VIP_INVALID_PARAMETER` for a bad NIC handle or
/// a tag that is not a live tag of this NIC (NULL, destroyed, another
/// NIC's); `VIP_INVALID_STATE` while a VI or a memory region uses the tag;
/// `VIP_ERROR_RESOURCE`.
///
/// # Safety
/// None (handles are checked values).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn VipDestroyPtag(
    NicHandle: VIP_NIC_HANDLE,
    ProtectionTag: VIP_PROTECTION_HANDLE,
) -> VIP_RETURN {
    ffi_boundary!("VipDestroyPtag", {
        let nic = nic_from(NicHandle)?;
        let p = ptag_of(&nic, ProtectionTag).ok_or(Error::InvalidParameter)?;
        nic.destroy_ptag(p)
    })
}
