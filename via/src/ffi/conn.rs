//! Connections: client/server (`VipConnectWait`, `VipConnectAccept`,
//! `VipConnectReject`, `VipConnectRequest`), peer-to-peer
//! (`VipConnectPeerRequest`, `VipConnectPeerDone`, `VipConnectPeerWait`),
//! and `VipDisconnect`.
//!
//! Addresses are `VIP_NET_ADDRESS` values the application allocates; the
//! host part of a local address is informational (the soft NIC reaches
//! the processes of this host), the discriminator is what servers and
//! peers are matched on.

use std::sync::Arc;

use crate::attrs::ViState;
use crate::conn;
use crate::error::Error;
use crate::ffi::boundary::{Out, ffi_boundary, read_net_address, timeout, write_net_address};
use crate::ffi::handles::{conn_from, conn_handle, nic_from, vi_from};
use crate::ffi::types::*;
use crate::ffi::vi::vi_attrs_out;

/// Waits up to `Timeout` ms for a connection request addressed to
/// `LocalAddr`'s discriminator on this host. On success `*RemoteAddr`
/// holds the requester's address (host address and discriminator),
/// `*RemoteViAttribs` its VI's attributes (`Ptag` NULL), and
/// `*ConnHandle` the request, for `VipConnectAccept` or
/// `VipConnectReject`. `RemoteAddr` must have room for
/// `NicAddressLen + MaxDiscriminatorLen` bytes after the header (or at
/// least for the address the requester used as its own).
///
/// Returns `VIP_SUCCESS`; `VIP_TIMEOUT`; `VIP_INVALID_PARAMETER` for a bad
/// handle, a NULL pointer, or a host address or discriminator longer than
/// the NIC accepts; `VIP_ERROR_RESOURCE`.
///
/// # Safety
/// `LocalAddr` is NULL or a readable address (header and its bytes); the
/// other pointers are NULL or writable (`RemoteAddr` with the room above).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn VipConnectWait(
    NicHandle: VIP_NIC_HANDLE,
    LocalAddr: *mut VIP_NET_ADDRESS,
    Timeout: VIP_ULONG,
    RemoteAddr: *mut VIP_NET_ADDRESS,
    RemoteViAttribs: *mut VIP_VI_ATTRIBUTES,
    ConnHandle: *mut VIP_CONN_HANDLE,
) -> VIP_RETURN {
    ffi_boundary!("VipConnectWait", {
        let nic = nic_from(NicHandle)?;
        // SAFETY: the caller's contract for the four pointers.
        let (local, attrs_out, conn_out) = unsafe {
            (
                read_net_address(LocalAddr)?,
                Out::new(RemoteViAttribs)?,
                Out::new(ConnHandle)?,
            )
        };
        if RemoteAddr.is_null() {
            return Err(Error::InvalidParameter);
        }
        let (h, remote, attrs) = conn::wait(&nic, local, timeout(Timeout))?;
        // SAFETY: `RemoteAddr` is not NULL and has room (caller's contract).
        unsafe { write_net_address(RemoteAddr, &remote) };
        attrs_out.write(vi_attrs_out(&nic, &attrs, false));
        conn_out.write(conn_handle(&nic, h));
        Ok(())
    })
}

/// Accepts the request `ConnHandle` with the idle VI `ViHandle` of the
/// same NIC; the VI becomes connected and the requester's
/// `VipConnectRequest` returns `VIP_SUCCESS`.
///
/// Returns `VIP_SUCCESS`; `VIP_INVALID_PARAMETER` for a bad or already
/// used `ConnHandle`, a bad `ViHandle`, or a VI of another NIC;
/// `VIP_INVALID_STATE` if the VI is not idle (the request stays pending
/// and `ConnHandle` valid); `VIP_INVALID_RELIABILITY_LEVEL` if the two
/// VIs' levels differ (the request is refused: the requester gets the
/// same code, and `ConnHandle` is used up); `VIP_TIMEOUT` if the
/// requester gave up meanwhile; `VIP_ERROR_RESOURCE`.
///
/// # Safety
/// None (handles are checked values).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn VipConnectAccept(
    ConnHandle: VIP_CONN_HANDLE,
    ViHandle: VIP_VI_HANDLE,
) -> VIP_RETURN {
    ffi_boundary!("VipConnectAccept", {
        let (nic, h) = conn_from(ConnHandle)?;
        let (vnic, vi) = vi_from(ViHandle)?;
        if !Arc::ptr_eq(&nic, &vnic) || nic.conns.lock().unwrap().get(h.0, h.1).is_none() {
            return Err(Error::InvalidParameter);
        }
        // Checked here as well as in the core: the core puts a refused
        // request back under a new handle, which would strand `ConnHandle`.
        if vi.vi_state() != ViState::Idle || vi.state.lock().unwrap().peer_request.is_some() {
            return Err(Error::InvalidState);
        }
        conn::accept(&nic, h, &vi)
    })
}

/// Rejects the request `ConnHandle`; the requester's `VipConnectRequest`
/// returns `VIP_REJECT`. The handle is used up.
///
/// Returns `VIP_SUCCESS`; `VIP_INVALID_PARAMETER` for a bad or already
/// used handle; `VIP_ERROR_RESOURCE`.
///
/// # Safety
/// None (handles are checked values).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn VipConnectReject(ConnHandle: VIP_CONN_HANDLE) -> VIP_RETURN {
    ffi_boundary!("VipConnectReject", {
        let (nic, h) = conn_from(ConnHandle)?;
        conn::reject(&nic, h)
    })
}

/// Connects the idle VI `ViHandle` to the server listening on
/// `RemoteAddr`'s discriminator, waiting up to `Timeout` ms for it to
/// accept or reject. `LocalAddr` is what the server sees as the
/// requester's address. On success `*RemoteViAttribs` holds the server
/// VI's attributes (`Ptag` NULL).
///
/// Returns `VIP_SUCCESS`; `VIP_NO_MATCH` if nobody listened on the
/// discriminator until the timeout (the request waits for a listener that
/// long; with `VIP_INFINITE` it waits for one forever) or if `RemoteAddr`'s
/// host is not reachable; `VIP_TIMEOUT` if a server took the request but
/// did not accept or reject it in time; `VIP_REJECT`; `VIP_INVALID_PARAMETER` for a bad handle, a NULL
/// pointer, or an address longer than the NIC accepts;
/// `VIP_INVALID_STATE` if the VI is not idle;
/// `VIP_INVALID_RELIABILITY_LEVEL` if the levels differ;
/// `VIP_ERROR_RESOURCE`. On failure the VI is idle again.
///
/// # Safety
/// `LocalAddr` and `RemoteAddr` are NULL or readable addresses;
/// `RemoteViAttribs` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn VipConnectRequest(
    ViHandle: VIP_VI_HANDLE,
    LocalAddr: *mut VIP_NET_ADDRESS,
    RemoteAddr: *mut VIP_NET_ADDRESS,
    Timeout: VIP_ULONG,
    RemoteViAttribs: *mut VIP_VI_ATTRIBUTES,
) -> VIP_RETURN {
    ffi_boundary!("VipConnectRequest", {
        let (nic, vi) = vi_from(ViHandle)?;
        // SAFETY: the caller's contract for the three pointers.
        let (local, remote, out) = unsafe {
            (
                read_net_address(LocalAddr)?,
                read_net_address(RemoteAddr)?,
                Out::new(RemoteViAttribs)?,
            )
        };
        let attrs = conn::request(&nic, &vi, local, remote, timeout(Timeout))?;
        out.write(vi_attrs_out(&nic, &attrs, false));
        Ok(())
    })
}

/// Breaks the connection of `ViHandle` (connected or in the error state):
/// the peer's VI enters `VIP_STATE_ERROR` (its error callback gets
/// `VIP_ERROR_CONN_LOST`), outstanding descriptors of this VI complete
/// with `VIP_STATUS_DESC_FLUSHED_ERROR`, and the VI becomes idle.
///
/// Returns `VIP_SUCCESS`; `VIP_INVALID_PARAMETER` for a bad handle;
/// `VIP_INVALID_STATE` if the VI is idle or connect-pending;
/// `VIP_ERROR_RESOURCE`.
///
/// # Safety
/// None (handles are checked values).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn VipDisconnect(ViHandle: VIP_VI_HANDLE) -> VIP_RETURN {
    ffi_boundary!("VipDisconnect", {
        let (nic, vi) = vi_from(ViHandle)?;
        vi.disconnect(&nic)
    })
}

/// Starts a peer-to-peer connection of the idle VI `ViHandle` with the VI
/// that calls `VipConnectPeerRequest` with the addresses swapped (its
/// `LocalAddr` discriminator is our `RemoteAddr`'s and the other way
/// round); the pair must meet within `Timeout` ms. The VI is
/// connect-pending until `VipConnectPeerDone` / `VipConnectPeerWait`
/// reports the outcome.
///
/// Returns `VIP_SUCCESS` (the request is pending); `VIP_INVALID_PARAMETER`
/// for a bad handle, a NULL pointer, or an address longer than the NIC
/// accepts; `VIP_INVALID_STATE` if the VI is not idle;
/// `VIP_ERROR_RESOURCE`.
///
/// # Safety
/// `LocalAddr` and `RemoteAddr` are NULL or readable addresses.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn VipConnectPeerRequest(
    ViHandle: VIP_VI_HANDLE,
    LocalAddr: *mut VIP_NET_ADDRESS,
    RemoteAddr: *mut VIP_NET_ADDRESS,
    Timeout: VIP_ULONG,
) -> VIP_RETURN {
    ffi_boundary!("VipConnectPeerRequest", {
        let (nic, vi) = vi_from(ViHandle)?;
        // SAFETY: the caller's contract for the two addresses.
        let (local, remote) =
            unsafe { (read_net_address(LocalAddr)?, read_net_address(RemoteAddr)?) };
        conn::peer_request(&nic, &vi, local, remote, timeout(Timeout))
    })
}

/// Polls the pending peer connection of `ViHandle`.
///
/// Returns `VIP_SUCCESS` (connected; `*RemoteViAttribs` holds the peer
/// VI's attributes, `Ptag` NULL); `VIP_NOT_DONE` (still pending);
/// `VIP_TIMEOUT` (the request's timeout expired; the VI is idle again);
/// `VIP_INVALID_PARAMETER` for a bad handle or NULL `RemoteViAttribs`;
/// `VIP_INVALID_STATE` if no peer request is pending on the VI;
/// `VIP_INVALID_RELIABILITY_LEVEL` if the levels differ;
/// `VIP_ERROR_RESOURCE`.
///
/// # Safety
/// `RemoteViAttribs` is NULL or valid for writing one value.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn VipConnectPeerDone(
    ViHandle: VIP_VI_HANDLE,
    RemoteViAttribs: *mut VIP_VI_ATTRIBUTES,
) -> VIP_RETURN {
    ffi_boundary!("VipConnectPeerDone", {
        let (nic, vi) = vi_from(ViHandle)?;
        // SAFETY: the caller's contract for `RemoteViAttribs`.
        let out = unsafe { Out::new(RemoteViAttribs) }?;
        let attrs = conn::peer_done(&nic, &vi, false)?;
        out.write(vi_attrs_out(&nic, &attrs, false));
        Ok(())
    })
}

/// Waits for the pending peer connection of `ViHandle` (until the
/// request's own timeout); codes as `VipConnectPeerDone` without
/// `VIP_NOT_DONE`.
///
/// # Safety
/// `RemoteViAttribs` is NULL or valid for writing one value.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn VipConnectPeerWait(
    ViHandle: VIP_VI_HANDLE,
    RemoteViAttribs: *mut VIP_VI_ATTRIBUTES,
) -> VIP_RETURN {
    ffi_boundary!("VipConnectPeerWait", {
        let (nic, vi) = vi_from(ViHandle)?;
        // SAFETY: the caller's contract for `RemoteViAttribs`.
        let out = unsafe { Out::new(RemoteViAttribs) }?;
        let attrs = conn::peer_done(&nic, &vi, true)?;
        out.write(vi_attrs_out(&nic, &attrs, false));
        Ok(())
    })
}
