//! Posting: reserve a doorbell slot, fill it, commit it, ring.
//!
//! The physical descriptor goes to the central doorbell of the NIC (one
//! multi-producer ring the engine polls) or to the VI's own doorbell
//! (`VIA_DOORBELL=per-vi`; the engine then polls every VI's ring). The
//! caller holds the VI's send-queue lock, so one VI's descriptors enter the
//! doorbell in posting order.
#![forbid(unsafe_code)]

use crate::error::{Error, Result};
use crate::nic::NicInner;
use crate::shm::layout::SendPd;

use super::engine::Engine;

impl Engine {
    /// Hands `pd` to the engine. In thread mode this rings the doorbell
    /// (waking the engine thread if it sleeps); inline, the caller then
    /// kicks the engine (`Device::kick`).
    ///
    /// # Errors
    /// `Resource` if the doorbell stays full (only in thread mode, where the
    /// engine thread drains it concurrently).
    pub(crate) fn post(
        &self,
        nic: &NicInner,
        db: &doorbell::Doorbell<SendPd>,
        pd: SendPd,
    ) -> Result<()> {
        let mut pd = pd;
        for _ in 0..1_000_000 {
            // Reserve + fill + commit happen inside push (Release on the
            // slot stamp); a failed push publishes nothing.
            match db.push_quiet(pd) {
                Ok(_) => {
                    if self.threaded() {
                        // The doorbell proper: wake the engine thread if it sleeps.
                        self.wake_engine();
                    }
                    return Ok(());
                }
                Err(full) => {
                    // Full: drain it ourselves (inline), or let the engine
                    // thread catch up (backpressure).
                    pd = full.into_inner();
                    if self.threaded() {
                        self.wake_engine();
                    } else {
                        self.kick_inline(nic, None);
                    }
                    std::thread::yield_now();
                }
            }
        }
        Err(Error::Resource)
    }
}
