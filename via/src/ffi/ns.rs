//! The name service: `VipNSInit`, `VipNSGetHostByName`,
//! `VipNSGetHostByAddr`, `VipNSShutdown`.
//!
//! The names come from `viad`: this host's name and `localhost` (this
//! host's NIC address), plus the entries of the hosts file `viad` read at
//! start (`$VIA_HOSTS`, default `/etc/via_hosts`, lines `name hexaddress`).
//! Each name has one address (`NameIndex` 0). Lookups work without
//! `VipNSInit`, which only records that the application opened the
//! service; `InitInfo` is ignored.

use core::ffi::{CStr, c_char};
use std::sync::atomic::Ordering;

use crate::error::Error;
use crate::ffi::boundary::{ffi_boundary, read_in, read_net_address, write_host_address};
use crate::ffi::handles::nic_from;
use crate::ffi::types::*;
use crate::ns;
use crate::proto::MAX_NAME;

/// Opens the name service of `NicHandle`. `InitInfo` is ignored (may be
/// NULL); calling it again is harmless.
///
/// Returns `VIP_SUCCESS`; `VIP_INVALID_PARAMETER` for a bad handle;
/// `VIP_ERROR_RESOURCE`.
///
/// # Safety
/// None (`InitInfo` is not dereferenced).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn VipNSInit(NicHandle: VIP_NIC_HANDLE, InitInfo: VIP_PVOID) -> VIP_RETURN {
    let _ = InitInfo;
    ffi_boundary!("VipNSInit", {
        let nic = nic_from(NicHandle)?;
        nic.ns_open.store(true, Ordering::Release);
        Ok(())
    })
}

/// Writes the host address of `Name` into `*HostAddress`: sets
/// `HostAddressLen` and the host address bytes, and leaves
/// `DiscriminatorLen` alone (the application appends its discriminator).
/// `HostAddress` must have room for `NicAddressLen` bytes (at most 16 for
/// addresses from the hosts file). Only `NameIndex` 0 exists.
///
/// Returns `VIP_SUCCESS`; `VIP_INVALID_PARAMETER` for a bad handle or a
/// NULL pointer; `VIP_ERROR_NAMESERVICE` for an unknown name or a
/// `NameIndex` other than 0; `VIP_ERROR_RESOURCE`.
///
/// # Safety
/// `Name` is NULL or NUL-terminated; `HostAddress` is NULL or has the room
/// above.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn VipNSGetHostByName(
    NicHandle: VIP_NIC_HANDLE,
    Name: *mut VIP_CHAR,
    HostAddress: *mut VIP_NET_ADDRESS,
    NameIndex: VIP_ULONG,
) -> VIP_RETURN {
    ffi_boundary!("VipNSGetHostByName", {
        let nic = nic_from(NicHandle)?;
        if Name.is_null() || HostAddress.is_null() {
            return Err(Error::InvalidParameter);
        }
        // SAFETY: a non-NULL `Name` is NUL-terminated (contract).
        let name = unsafe { CStr::from_ptr(Name as *const c_char) };
        let Ok(name) = name.to_str() else {
            return Err(Error::NameService);
        };
        if NameIndex != 0 || name.len() > MAX_NAME {
            return Err(Error::NameService);
        }
        let host = ns::by_name(&nic, name)?;
        // SAFETY: not NULL, room for the address (contract).
        unsafe { write_host_address(HostAddress, &host) };
        Ok(())
    })
}

/// Writes the host name of the host address in `*HostAddress` (its
/// discriminator is ignored), NUL-terminated, into `Name`, a buffer of
/// `*NameLen` bytes; `*NameLen` becomes the bytes written including the
/// NUL.
///
/// Returns `VIP_SUCCESS`; `VIP_INVALID_PARAMETER` for a bad handle, a NULL
/// pointer, an address longer than the NIC accepts, or a name that does
/// not fit (nothing is written then); `VIP_ERROR_NAMESERVICE` for an
/// unknown address; `VIP_ERROR_RESOURCE`.
///
/// # Safety
/// `HostAddress` is NULL or a readable address; `NameLen` is NULL or
/// readable and writable; `Name` is NULL or has `*NameLen` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn VipNSGetHostByAddr(
    NicHandle: VIP_NIC_HANDLE,
    HostAddress: *mut VIP_NET_ADDRESS,
    Name: *mut VIP_CHAR,
    NameLen: *mut VIP_ULONG,
) -> VIP_RETURN {
    ffi_boundary!("VipNSGetHostByAddr", {
        let nic = nic_from(NicHandle)?;
        // SAFETY: the caller's contract for `HostAddress` and `NameLen`.
        let (addr, room) = unsafe { (read_net_address(HostAddress)?, read_in(NameLen)?) };
        if Name.is_null() {
            return Err(Error::InvalidParameter);
        }
        let name = ns::by_addr(&nic, &addr.host)?;
        let n = name.len() + 1;
        if (room as usize) < n {
            return Err(Error::InvalidParameter);
        }
        // SAFETY: `Name` has `room >= n` writable bytes and `NameLen` is
        // writable (contract).
        unsafe {
            core::ptr::copy_nonoverlapping(name.as_ptr(), Name.cast::<u8>(), name.len());
            Name.cast::<u8>().add(name.len()).write(0);
            NameLen.write_unaligned(n as VIP_ULONG);
        }
        Ok(())
    })
}

/// Closes the name service of `NicHandle` (lookups keep working).
///
/// Returns `VIP_SUCCESS`; `VIP_INVALID_PARAMETER` for a bad handle;
/// `VIP_ERROR_RESOURCE`.
///
/// # Safety
/// None (handles are checked values).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn VipNSShutdown(NicHandle: VIP_NIC_HANDLE) -> VIP_RETURN {
    ffi_boundary!("VipNSShutdown", {
        let nic = nic_from(NicHandle)?;
        nic.ns_open.store(false, Ordering::Release);
        Ok(())
    })
}
