//! Completion: status and length into the user's descriptor, then the CQ
//! entry, then the wakeups.
//!
//! Order matters: the descriptor's `Status` is stored last with Release, so
//! a program that sees `DONE` (in `Vip*Done` or by spinning on memory) also
//! sees the data, `Length` and `ImmediateData`. The CQ entry follows the
//! status, so `VipCQDone` followed by `VipRecvDone` always finds the
//! descriptor done. Wakeups come last and cost one fence and one load when
//! nobody sleeps.
#![forbid(unsafe_code)]

use std::sync::atomic::Ordering;

use crate::backend::soft::memory::{self, Space};
use crate::backend::soft::remote::RemoteNic;
use crate::cq::entry;
use crate::nic::{AsyncError, ErrorCode, NicInner, ResourceCode};
use crate::shm::layout::{NicView, ViShared, interest};
use crate::shm::layout::SendPd;
use crate::tpt::Snapshot;
use crate::translate::{LocalSpace, StatusLoc};
use crate::vi::{ViCore, Which};

fn wake_vi(sh: &ViShared, w: Which, provider: &doorbell::EventCount) {
    let (ec, bit) = match w {
        Which::Send => (&sh.send_wake, interest::SEND_NOTIFY),
        Which::Recv => (&sh.recv_wake, interest::RECV_NOTIFY),
    };
    ec.notify_all();
    // `notify_all` fenced (SeqCst) after the status store; this load pairs
    // with the SeqCst update of `interest` in `ViCore::notify`.
    if sh.interest.load(Ordering::Relaxed) & bit != 0 {
        provider.notify_all();
    }
}

/// Completes a descriptor of one of our own queues.
pub(crate) fn local(nic: &NicInner, vi: &ViCore, w: Which, loc: &StatusLoc, status: u32, len: Option<u32>, imm: Option<u32>) {
    loc.complete(status, len, imm);
    let cq = match w {
        Which::Send => &vi.send_cq,
        Which::Recv => &vi.recv_cq,
    };
    if let Some(cq) = cq {
        cq.push(nic, entry(vi.slot, vi.generation, w == Which::Recv));
    }
    wake_vi(vi.shared(nic), w, &nic.view().header().notify);
}

/// Completes the local send descriptor of `pd` with `status`.
pub(crate) fn send(nic: &NicInner, vi: &ViCore, pd: &SendPd, status: u32) {
    let space = LocalSpace {
        arenas: &nic.process.arenas,
        pid: nic.process.pid,
    };
    let loc = nic.tpt.lookup(pd.desc_handle).and_then(|snap| {
        let off = pd.desc_va.checked_sub(snap.va)?;
        match memory::place(&space, &snap, off).ok()? {
            (memory::Place::Map(m, at), n) if n >= 32 => Some(StatusLoc::Map(m, at)),
            _ => Some(StatusLoc::Cma(nic.process.pid, pd.desc_va)),
        }
    });
    match loc {
        Some(loc) => local(nic, vi, Which::Send, &loc, status, None, None),
        None => {
            // Deregistered while posted: nothing to write into.
            log::warn!("VI {}: send descriptor {:#x} lost its registration", vi.slot, pd.desc_va);
            nic.report(AsyncError {
                resource: ResourceCode::Descriptor,
                code: ErrorCode::CompProt,
                vi: Some((vi.slot, vi.generation)),
                cq: None,
                descriptor: pd.desc_va,
            });
        }
    }
}

/// Completes a receive descriptor of a peer: `desc` is the region holding it
/// and `off` its offset there.
#[allow(clippy::too_many_arguments)]
pub(crate) fn remote_recv(
    remote: &RemoteNic,
    vi: (u32, u16),
    desc: &Snapshot,
    off: u64,
    status: u32,
    len: u32,
    imm: Option<u32>,
) {
    use crate::descriptor::offsets;
    let mut words = [0u8; 8];
    words[0..4].copy_from_slice(&imm.unwrap_or(0).to_ne_bytes());
    words[4..8].copy_from_slice(&len.to_ne_bytes());
    let ok = if imm.is_some() {
        memory::write(remote, desc, off + offsets::IMMEDIATE_DATA as u64, &words).is_ok()
    } else {
        memory::write(remote, desc, off + offsets::LENGTH as u64, &words[4..8]).is_ok()
    };
    if !ok || memory::store_release(remote, desc, off + offsets::STATUS as u64, status).is_err() {
        remote.post_error(AsyncError {
            resource: ResourceCode::Descriptor,
            code: ErrorCode::CompProt,
            vi: Some(vi),
            cq: None,
            descriptor: 0,
        });
        return;
    }
    let view = remote.view();
    let Some(sh) = view.vi(vi.0) else { return };
    remote_cq_push(remote, &view, sh.recv_cq.load(Ordering::Relaxed), entry(vi.0, vi.1, true));
    wake_vi(sh, Which::Recv, &view.header().notify);
}

fn remote_cq_push(remote: &RemoteNic, view: &NicView<'_>, cq1: u32, e: u64) {
    let Some(idx) = cq1.checked_sub(1) else { return };
    let Some(sh) = view.cq(idx) else { return };
    if sh.mode.load(Ordering::Relaxed) == 0 {
        let mut pushed = false;
        for _ in 0..4 {
            // Acquire: pairs with the owner's Release of a new generation.
            let generation = sh.generation.load(Ordering::Acquire);
            let Some(ring) = remote.cq_ring(idx, generation) else { break };
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
    crate::cq::wake(sh, &view.header().notify);
}

/// The space of the peer, for callers that only hold the link.
pub(crate) fn space(r: &RemoteNic) -> &dyn Space {
    r
}
