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

use crate::backend::soft::memory::Resolved;
use crate::backend::soft::remote::RemoteNic;
use crate::cq::entry;
use crate::nic::{AsyncError, ErrorCode, NicInner, ResourceCode};
use crate::shm::layout::SendPd;
use crate::shm::layout::{NicView, ViShared, interest};
use crate::translate::StatusLoc;
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
pub(crate) fn local(
    nic: &NicInner,
    vi: &ViCore,
    w: Which,
    loc: &StatusLoc,
    status: u32,
    len: Option<u32>,
    imm: Option<u32>,
) {
    loc.complete(status, len, imm);
    after_local(nic, vi, w);
}

/// The CQ entry and wakeups after a completion on one of our queues.
fn after_local(nic: &NicInner, vi: &ViCore, w: Which) {
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
/// `desc` is the region holding the descriptor (`None` if it was
/// deregistered since the post).
pub(crate) fn send(nic: &NicInner, vi: &ViCore, pd: &SendPd, desc: Option<&Resolved>, status: u32) {
    match desc {
        Some(r) => {
            if r.store_release(
                pd.desc_va + crate::descriptor::offsets::STATUS as u64,
                status,
            )
            .is_err()
            {
                log::warn!(
                    "VI {}: cannot write send status at {:#x}",
                    vi.slot,
                    pd.desc_va
                );
            }
            after_local(nic, vi, Which::Send);
        }
        None => {
            // Deregistered while posted: nothing to write into.
            log::warn!(
                "VI {}: send descriptor {:#x} lost its registration",
                vi.slot,
                pd.desc_va
            );
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

/// Completes a receive descriptor of a peer, at `desc_va` in the peer's
/// region `desc`.
pub(crate) fn remote_recv(
    remote: &RemoteNic,
    vi: (u32, u16),
    desc: &Resolved,
    desc_va: u64,
    status: u32,
    len: u32,
    imm: Option<u32>,
) {
    use crate::descriptor::offsets;
    let words = match desc.span(desc_va, 32) {
        Some((m, at)) => {
            // One arena: store the words directly.
            if let Some(i) = imm {
                m.store_u32(at + offsets::IMMEDIATE_DATA, i, Ordering::Relaxed);
            }
            m.store_u32(at + offsets::LENGTH, len, Ordering::Relaxed);
            // Release: the data and the words above are visible to whoever
            // sees the status (VipRecvDone's Acquire, or a program spinning
            // on memory).
            m.store_u32(at + offsets::STATUS, status, Ordering::Release);
            Ok(())
        }
        None => imm
            .map_or(Ok(()), |i| {
                desc.store_relaxed(desc_va + offsets::IMMEDIATE_DATA as u64, i)
            })
            .and_then(|_| desc.store_relaxed(desc_va + offsets::LENGTH as u64, len))
            .and_then(|_| desc.store_release(desc_va + offsets::STATUS as u64, status)),
    };
    if words.is_err() {
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
    remote_cq_push(
        remote,
        &view,
        sh.recv_cq.load(Ordering::Relaxed),
        entry(vi.0, vi.1, true),
    );
    wake_vi(sh, Which::Recv, &view.header().notify);
}

fn remote_cq_push(remote: &RemoteNic, view: &NicView<'_>, cq1: u32, e: u64) {
    let Some(idx) = cq1.checked_sub(1) else {
        return;
    };
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
    crate::cq::wake(sh, &view.header().notify);
}
