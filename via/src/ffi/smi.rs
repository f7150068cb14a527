//! `VipQuerySystemManagementInfo`: VIA 1.0 defines one information type,
//! `VIP_SMI_AUTODISCOVERY`, the NIC addresses the provider can discover.
//!
//! What "discovered" means here: the first address is always this NIC's
//! own host address; with `NumberOfHops >= 1` the hosts the name service
//! knows follow (the names of the hosts file, `$VIA_HOSTS` or
//! `/etc/via_hosts`, each resolved by the name service), without
//! duplicates. Each address has
//! `DiscriminatorLen` 0.

use std::collections::HashSet;

use crate::error::Error;
use crate::ffi::boundary::{ffi_boundary, read_in, write_host_address};
use crate::ffi::handles::nic_from;
use crate::ffi::types::*;
use crate::nic::NicInner;
use crate::ns;

/// Host names of this process's hosts file.
fn host_file_names() -> Vec<String> {
    ns::host_table().into_iter().map(|(n, _)| n).collect()
}

/// The discovered host addresses, this NIC's first.
fn discover(nic: &NicInner, hops: VIP_ULONG) -> Vec<Vec<u8>> {
    let own = nic.host.clone();
    let mut seen: HashSet<Vec<u8>> = HashSet::from([own.clone()]);
    let mut out = vec![own];
    if hops > 0 {
        for name in host_file_names() {
            if let Ok(a) = ns::by_name(nic, &name) {
                if seen.insert(a.clone()) {
                    out.push(a);
                }
            }
        }
    }
    out
}

/// Queries system management information of type `InfoType`; only
/// `VIP_SMI_AUTODISCOVERY` exists, with `Info` pointing to a
/// `VIP_AUTODISCOVERY_LIST`:
///
/// * in: `NumberOfHops` (0: this NIC only; 1 or more: also the hosts the
///   name service knows), `ADAddrArray` (NULL, or `NumAdAddrs` pointers to
///   caller-allocated `VIP_NET_ADDRESS`es with room for `NicAddressLen`
///   host address bytes each);
/// * out: with `ADAddrArray` NULL, `NumAdAddrs` is set to the number of
///   addresses found (a sizing call); otherwise the first `NumAdAddrs`
///   addresses found are written (`HostAddressLen` and bytes,
///   `DiscriminatorLen` 0) and `NumAdAddrs` is set to the number written.
///   Addresses longer than `NicAddressLen` are not listed.
///
/// Returns `VIP_SUCCESS`; `VIP_INVALID_PARAMETER` for a bad handle, an
/// `InfoType` other than `VIP_SMI_AUTODISCOVERY`, a NULL `Info`, or a NULL
/// entry among the first `NumAdAddrs` of `ADAddrArray`;
/// `VIP_ERROR_RESOURCE`.
///
/// # Safety
/// `Info` is NULL or a readable and writable `VIP_AUTODISCOVERY_LIST`
/// whose `ADAddrArray`, if not NULL, has `NumAdAddrs` readable entries,
/// each NULL or pointing to the room described above.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn VipQuerySystemManagementInfo(
    NicHandle: VIP_NIC_HANDLE,
    InfoType: VIP_ULONG,
    Info: VIP_PVOID,
) -> VIP_RETURN {
    ffi_boundary!("VipQuerySystemManagementInfo", {
        let nic = nic_from(NicHandle)?;
        if InfoType != VIP_SMI_AUTODISCOVERY {
            return Err(Error::InvalidParameter);
        }
        let info = Info.cast::<VIP_AUTODISCOVERY_LIST>();
        // SAFETY: the caller's contract for `Info`.
        let list = unsafe { read_in(info) }?;
        let room = nic.host.len();
        let found: Vec<Vec<u8>> = discover(&nic, list.NumberOfHops)
            .into_iter()
            .filter(|a| a.len() <= room)
            .collect();
        let count_out = |n: usize| {
            // SAFETY: `info` is not NULL (read above) and writable (contract).
            unsafe { (&raw mut (*info).NumAdAddrs).write_unaligned(n as VIP_ULONG) }
        };
        if list.ADAddrArray.is_null() {
            count_out(found.len());
            return Ok(());
        }
        let n = (list.NumAdAddrs as usize).min(found.len());
        let mut entries = Vec::with_capacity(n);
        for i in 0..n {
            // SAFETY: `ADAddrArray` has `NumAdAddrs > i` readable entries.
            let e = unsafe { list.ADAddrArray.add(i).read_unaligned() };
            if e.is_null() {
                return Err(Error::InvalidParameter);
            }
            entries.push(e);
        }
        for (e, a) in entries.into_iter().zip(&found) {
            // SAFETY: `e` is not NULL and has room for `room >= a.len()`
            // host bytes (contract).
            unsafe {
                write_host_address(e, a);
                (&raw mut (*e).DiscriminatorLen).write_unaligned(0);
            }
        }
        count_out(n);
        Ok(())
    })
}
