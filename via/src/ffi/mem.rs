//! `VipRegisterMem`, `VipDeregisterMem`, `VipQueryMem`, `VipSetMemAttributes`.

use std::sync::Arc;

use crate::attrs::MemAttributes;
use crate::error::{Error, Result};
use crate::ffi::boundary::{Out, address, boolean, ffi_boundary, read_in, vip_bool};
use crate::ffi::handles::{nic_from, nic_ref, ptag_handle, ptag_named_by, ptag_of};
use crate::ffi::types::*;
use crate::mem::arena::UserRange;
use crate::nic::NicInner;

/// Converts C memory attributes for `nic`.
fn mem_attrs_in(nic: &Arc<NicInner>, a: &VIP_MEM_ATTRIBUTES) -> Result<MemAttributes> {
    ptag_of(nic, a.Ptag).ok_or(Error::InvalidPtag)?;
    mem_attrs_named(nic, a)
}

/// The attributes `a` names, the tag not checked for liveness (for
/// `VipRegisterMem`: `NicInner::register` checks it, without a lock when
/// a parked registration of that tag comes back).
fn mem_attrs_named(nic: &NicInner, a: &VIP_MEM_ATTRIBUTES) -> Result<MemAttributes> {
    let ptag = ptag_named_by(nic, a.Ptag).ok_or(Error::InvalidPtag)?;
    // The limit itself: `attributes()` builds the whole set (a name, the
    // memory size) on a path every message may take.
    if boolean(a.EnableRdmaRead) && nic.limits.rdma_read == 0 {
        return Err(Error::InvalidRdmaRead);
    }
    Ok(MemAttributes {
        ptag,
        enable_rdma_write: boolean(a.EnableRdmaWrite),
        enable_rdma_read: boolean(a.EnableRdmaRead),
    })
}

/// The start of the region `handle` if `addr` lies inside it.
fn region_start(nic: &NicInner, addr: u64, handle: VIP_MEM_HANDLE) -> Result<u64> {
    let r = nic.regions.get(handle).ok_or(Error::InvalidParameter)?;
    if !r.covers(addr, 1) {
        return Err(Error::InvalidParameter);
    }
    Ok(r.va)
}

/// Registers `Length` bytes at `VirtualAddress` with the attributes
/// `*MemAttrs` and returns the region's handle in `*MemHandle`.
///
/// The whole pages are moved into shared memory at the same address, their
/// contents kept, in write-protected steps (another thread may write the
/// memory meanwhile: no write is lost). Regions may overlap. After `fork`
/// the pages of live registrations are absent in the child, the rest is
/// its private copy (`docs/registration.md`).
///
/// Returns `VIP_SUCCESS`; `VIP_INVALID_PARAMETER` for a bad handle, a NULL
/// pointer, zero `Length`, or a range that is not mapped;
/// `VIP_INVALID_PTAG` if `MemAttrs->Ptag` is not a live tag of this NIC;
/// `VIP_INVALID_RDMAREAD` for `EnableRdmaRead` on a NIC without RDMA read;
/// `VIP_ERROR_RESOURCE` when a registration limit is reached.
///
/// # Safety
/// `MemAttrs` and `MemHandle` are NULL or valid for reading/writing one
/// value. The range stays mapped while it is registered (if the program
/// unmaps it anyway, the registration loses its translation).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn VipRegisterMem(
    NicHandle: VIP_NIC_HANDLE,
    VirtualAddress: VIP_PVOID,
    Length: VIP_ULONG,
    MemAttrs: *mut VIP_MEM_ATTRIBUTES,
    MemHandle: *mut VIP_MEM_HANDLE,
) -> VIP_RETURN {
    ffi_boundary!("VipRegisterMem", {
        let nic = nic_ref(NicHandle)?;
        // SAFETY: the caller's contract for `MemAttrs` and `MemHandle`.
        let (attrs, out) = unsafe { (read_in(MemAttrs)?, Out::new(MemHandle)?) };
        let addr = address(VirtualAddress);
        if addr == 0 || Length == 0 || addr.checked_add(Length).is_none() {
            return Err(Error::InvalidParameter);
        }
        let attrs = mem_attrs_named(&nic, &attrs)?;
        // SAFETY: the C caller's contract (see `# Safety`) is the one
        // `UserRange::new` requires.
        let range = unsafe { UserRange::new(addr as usize, Length as usize) };
        out.write(nic.register(range, &attrs)?);
        Ok(())
    })
}

/// Deregisters the region `MemHandle`, registered at `VirtualAddress`.
///
/// Returns `VIP_SUCCESS`; `VIP_INVALID_PARAMETER` for a bad NIC handle, a
/// handle that is not a live region of this NIC, or a `VirtualAddress`
/// other than the region's start; `VIP_ERROR_RESOURCE`.
///
/// # Safety
/// None (the address is compared, never dereferenced).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn VipDeregisterMem(
    NicHandle: VIP_NIC_HANDLE,
    VirtualAddress: VIP_PVOID,
    MemHandle: VIP_MEM_HANDLE,
) -> VIP_RETURN {
    ffi_boundary!("VipDeregisterMem", {
        let nic = nic_ref(NicHandle)?;
        nic.deregister(address(VirtualAddress), MemHandle)
    })
}

/// Writes the attributes of region `MemHandle` into `*MemAttrs`.
/// `VirtualAddress` may be any address inside the region.
///
/// Returns `VIP_SUCCESS`; `VIP_INVALID_PARAMETER` for a bad NIC or memory
/// handle, an address outside the region, or NULL `MemAttrs`;
/// `VIP_ERROR_RESOURCE`.
///
/// # Safety
/// `MemAttrs` is NULL or valid for writing one `VIP_MEM_ATTRIBUTES`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn VipQueryMem(
    NicHandle: VIP_NIC_HANDLE,
    VirtualAddress: VIP_PVOID,
    MemHandle: VIP_MEM_HANDLE,
    MemAttrs: *mut VIP_MEM_ATTRIBUTES,
) -> VIP_RETURN {
    ffi_boundary!("VipQueryMem", {
        let nic = nic_from(NicHandle)?;
        // SAFETY: the caller's contract for `MemAttrs`.
        let out = unsafe { Out::new(MemAttrs) }?;
        let start = region_start(&nic, address(VirtualAddress), MemHandle)?;
        let a = nic.query_mem(start, MemHandle)?;
        out.write(VIP_MEM_ATTRIBUTES {
            Ptag: ptag_handle(&nic, a.ptag),
            EnableRdmaWrite: vip_bool(a.enable_rdma_write),
            EnableRdmaRead: vip_bool(a.enable_rdma_read),
        });
        Ok(())
    })
}

/// Changes the attributes of region `MemHandle` to `*MemAttrs`; RDMA
/// operations checked afterwards see the new attributes. `VirtualAddress`
/// may be any address inside the region.
///
/// Returns `VIP_SUCCESS`; `VIP_INVALID_PARAMETER` for a bad NIC or memory
/// handle, an address outside the region, or NULL `MemAttrs`;
/// `VIP_INVALID_PTAG` if `MemAttrs->Ptag` is not a live tag of this NIC;
/// `VIP_INVALID_RDMAREAD` for `EnableRdmaRead` on a NIC without RDMA read;
/// `VIP_ERROR_RESOURCE`.
///
/// # Safety
/// `MemAttrs` is NULL or valid for reading one `VIP_MEM_ATTRIBUTES`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn VipSetMemAttributes(
    NicHandle: VIP_NIC_HANDLE,
    VirtualAddress: VIP_PVOID,
    MemHandle: VIP_MEM_HANDLE,
    MemAttrs: *mut VIP_MEM_ATTRIBUTES,
) -> VIP_RETURN {
    ffi_boundary!("VipSetMemAttributes", {
        let nic = nic_from(NicHandle)?;
        // SAFETY: the caller's contract for `MemAttrs`.
        let attrs = unsafe { read_in(MemAttrs) }?;
        let start = region_start(&nic, address(VirtualAddress), MemHandle)?;
        let attrs = mem_attrs_in(&nic, &attrs)?;
        nic.set_mem_attributes(start, MemHandle, &attrs)
    })
}
