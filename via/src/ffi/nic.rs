//! `VipOpenNic`, `VipCloseNic`, `VipQueryNic`.

use core::ffi::{CStr, c_char};

use crate::error::Error;
use crate::ffi::boundary::{Out, ffi_boundary, init_logging, vip_bool};
use crate::ffi::handles::{nic_from, nic_handle};
use crate::ffi::types::*;
use crate::nic::NicInner;

/// Opens the NIC named `DeviceName` and returns its handle in `*NicHandle`.
///
/// Names: NULL or `""` (the default NIC), `via_lo`, `/dev/via_lo`, and
/// `via_<if>` / `/dev/via_<if>` for a network interface `<if>` of this
/// host (the M-VIA names); all are served by the shared-memory NIC. Each
/// call opens a new NIC instance with its own handle.
///
/// Returns `VIP_SUCCESS`; `VIP_INVALID_PARAMETER` for a NULL `NicHandle` or
/// an unknown device name; `VIP_ERROR_RESOURCE` if the NIC cannot be opened
/// (e.g. `viad` cannot be found or started).
///
/// # Safety
/// `DeviceName` is NULL or a NUL-terminated string; `NicHandle` is NULL or
/// valid for writing one handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn VipOpenNic(
    DeviceName: *const VIP_CHAR,
    NicHandle: *mut VIP_NIC_HANDLE,
) -> VIP_RETURN {
    ffi_boundary!("VipOpenNic", {
        init_logging();
        // SAFETY: the caller's contract for `NicHandle`.
        let out = unsafe { Out::new(NicHandle) }?;
        let name = if DeviceName.is_null() {
            None
        } else {
            // SAFETY: a non-NULL `DeviceName` is NUL-terminated (contract).
            let c = unsafe { CStr::from_ptr(DeviceName as *const c_char) };
            Some(c.to_str().map_err(|_| Error::InvalidParameter)?)
        };
        let nic = NicInner::open(name)?;
        out.write(nic_handle(&nic));
        Ok(())
    })
}

/// Closes `NicHandle`: disconnects and destroys its VIs, CQs, regions and
/// tags, and stops its provider thread. Every handle of the NIC becomes
/// stale.
///
/// Returns `VIP_SUCCESS`; `VIP_INVALID_PARAMETER` for a bad (NULL, stale,
/// already closed) handle; `VIP_ERROR_RESOURCE`.
///
/// May be called from a handler of this NIC; the provider thread ends when
/// the handler returns.
///
/// # Safety
/// None beyond the handle being a value from this library (any value is
/// checked).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn VipCloseNic(NicHandle: VIP_NIC_HANDLE) -> VIP_RETURN {
    ffi_boundary!("VipCloseNic", {
        let nic = nic_from(NicHandle)?;
        nic.close()
    })
}

/// Writes the NIC's attributes and limits into `*Attrs`.
///
/// `Name` is the canonical device name (`via_lo`, `via_eth0`, ...);
/// `LocalNicAddress` points to `NicAddressLen` bytes owned by the library,
/// valid until the NIC is closed.
///
/// Returns `VIP_SUCCESS`; `VIP_INVALID_PARAMETER` for a bad handle or NULL
/// `Attrs`; `VIP_ERROR_RESOURCE`.
///
/// # Safety
/// `Attrs` is NULL or valid for writing one `VIP_NIC_ATTRIBUTES`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn VipQueryNic(
    NicHandle: VIP_NIC_HANDLE,
    Attrs: *mut VIP_NIC_ATTRIBUTES,
) -> VIP_RETURN {
    ffi_boundary!("VipQueryNic", {
        let nic = nic_from(NicHandle)?;
        // SAFETY: the caller's contract for `Attrs`.
        let out = unsafe { Out::new(Attrs) }?;
        let a = nic.attributes();
        let mut name = [0 as VIP_CHAR; 64];
        for (d, s) in name.iter_mut().zip(a.name.bytes().take(63)) {
            *d = s as VIP_CHAR;
        }
        // The NIC's copy of its host address (the interface's on a sockets
        // NIC) lives as long as the NIC, unlike `a.local_address`.
        let host = &nic.host;
        out.write(VIP_NIC_ATTRIBUTES {
            Name: name,
            HardwareVersion: a.hardware_version as VIP_ULONG,
            ProviderVersion: a.provider_version as VIP_ULONG,
            NicAddressLen: host.len() as VIP_UINT16,
            LocalNicAddress: host.as_ptr(),
            ThreadSafe: vip_bool(a.thread_safe),
            MaxDiscriminatorLen: a.max_discriminator_len,
            MaxRegisterBytes: a.max_register_bytes as VIP_ULONG,
            MaxRegisterRegions: a.max_register_regions as VIP_ULONG,
            MaxRegisterBlockBytes: a.max_register_block_bytes as VIP_ULONG,
            MaxVI: a.max_vi as VIP_ULONG,
            MaxDescriptorsPerQueue: a.max_descriptors_per_queue as VIP_ULONG,
            MaxSegmentsPerDesc: a.max_segments_per_desc as VIP_ULONG,
            MaxCQ: a.max_cq as VIP_ULONG,
            MaxCQEntries: a.max_cq_entries as VIP_ULONG,
            MaxTransferSize: a.max_transfer_size as VIP_ULONG,
            NativeMTU: a.native_mtu as VIP_ULONG,
            MaxPtags: a.max_ptags as VIP_ULONG,
            ReliabilityLevelSupport: a.reliability_level_support as VIP_RELIABILITY_LEVEL,
            RDMAReadSupport: a.rdma_read_support as VIP_RELIABILITY_LEVEL,
        });
        Ok(())
    })
}
