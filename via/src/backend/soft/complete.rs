//! Completion of a peer's receive descriptor: the words through the one
//! writer (`crate::completion`), then the entry in the peer's CQ ring, then
//! the wakeups in the peer's NIC segment.
#![forbid(unsafe_code)]

use std::sync::atomic::Ordering;

use crate::backend::{CqSignals, ViSignals};
use crate::completion::{self, wake_cq, wake_queue};
use crate::cq::entry;
use crate::mem::region::Resolved;
use crate::nic::{AsyncError, ErrorCode, ResourceCode};
use crate::shm::mapping::Mapping;
use crate::vi::Which;

use super::layout::{CqShared, NicView, ViShared};
use super::remote::RemoteNic;

/// The signals of a VI's entry in a NIC segment.
pub(crate) fn vi_signals(sh: &ViShared) -> ViSignals<'_> {
    ViSignals {
        send_wake: &sh.send_wake,
        recv_wake: &sh.recv_wake,
        interest: &sh.interest,
    }
}

/// The signals of a CQ's entry in a NIC segment.
pub(crate) fn cq_signals(sh: &CqShared) -> CqSignals<'_> {
    CqSignals {
        wake: &sh.wake,
        interest: &sh.interest,
    }
}

/// Completes a receive descriptor of a peer, at `desc_va` in the peer's
/// region `desc`; `sh` is the peer VI's entry in its NIC segment.
#[allow(clippy::too_many_arguments)]
pub(crate) fn remote_recv(
    remote: &RemoteNic,
    vi: (u32, u16),
    sh: Option<&ViShared>,
    desc: &Resolved,
    desc_va: u64,
    status: u32,
    len: u32,
    imm: Option<u32>,
) {
    if completion::write_in_region(desc, desc_va, status, Some(len), imm).is_err() {
        remote.post_error(AsyncError {
            resource: ResourceCode::Descriptor,
            code: ErrorCode::CompProt,
            vi: Some(vi),
            cq: None,
            descriptor: 0,
        });
        return;
    }
    remote_recv_signal(remote, vi, sh);
}

/// Completes a receive descriptor of a peer whose control segment lies at
/// `at` in the peer's arena `m` (found by the caller in one span).
#[inline(always)]
pub(crate) fn remote_recv_at(
    remote: &RemoteNic,
    vi: (u32, u16),
    sh: Option<&ViShared>,
    (m, at): (&Mapping, usize),
    status: u32,
    len: u32,
    imm: Option<u32>,
) {
    completion::write(m, at, status, Some(len), imm);
    remote_recv_signal(remote, vi, sh);
}

/// After a peer's receive descriptor is written: its CQ entry and wakeups.
/// Inlined: on every send, and without a CQ it is a few loads.
#[inline(always)]
fn remote_recv_signal(remote: &RemoteNic, vi: (u32, u16), sh: Option<&ViShared>) {
    let Some(sh) = sh else { return };
    let view = remote.view();
    let cq1 = sh.recv_cq.load(Ordering::Relaxed);
    if cq1 != 0 {
        remote_cq_push(remote, &view, cq1 - 1, entry(vi.0, vi.1, true));
    }
    wake_queue(&vi_signals(sh), Which::Recv, &view.header().notify);
}

/// Pushes `e` into the peer's CQ `idx`.
#[inline(never)]
fn remote_cq_push(remote: &RemoteNic, view: &NicView<'_>, idx: u32, e: u64) {
    let Some(sh) = view.cq(idx) else { return };
    if sh.mode.load(Ordering::Relaxed) == 0 {
        let mut pushed = false;
        for _ in 0..4 {
            // Acquire: pairs with the owner's Release of a new generation.
            let generation = sh.generation.load(Ordering::Acquire);
            let Some(ring) = remote.cq_ring(idx, generation) else {
                break;
            };
            match ring.get().push(e) {
                Ok(()) => {
                    pushed = true;
                    break;
                }
                Err(cq::PushError::Closed) => continue,
                Err(err) => {
                    log::warn!("peer CQ {idx}: {err}");
                    remote.post_error(AsyncError {
                        resource: ResourceCode::Cq,
                        code: ErrorCode::Catastrophic,
                        vi: None,
                        cq: Some((idx, 0)),
                        descriptor: 0,
                    });
                    pushed = true;
                    break;
                }
            }
        }
        if !pushed {
            log::warn!("peer CQ {idx} unreachable; completion not queued");
        }
    }
    wake_cq(&cq_signals(sh), &view.header().notify);
}
