//! What the via-rs library and viad say to each other, shared by both
//! (viad links this crate and `via-sys`, not the provider):
//!
//! | module | what |
//! |---|---|
//! | [`proto`] | the messages, their encoding, and the limits both sides check |
//! | [`place`] | where the daemon listens, and whether a place can be trusted |
//! | [`hosts`] | the hosts file of the name service |
//! | [`tcp`] | connection set-up of the sockets NIC between hosts (library to a remote viad) |
#![forbid(unsafe_code)]

pub mod hosts;
pub mod place;
pub mod proto;
pub mod tcp;

use std::sync::OnceLock;
use std::time::Duration;

/// Default of `VIA_VIAD_TIMEOUT_MS`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(5000);

/// How long the daemon may take to accept a connection, answer the Hello,
/// or answer a request that needs no other process
/// (`VIA_VIAD_TIMEOUT_MS`, default 5000).
pub fn timeout() -> Duration {
    static T: OnceLock<Duration> = OnceLock::new();
    *T.get_or_init(|| match std::env::var("VIA_VIAD_TIMEOUT_MS") {
        Ok(v) => match v.parse::<u64>() {
            Ok(ms) if ms > 0 => Duration::from_millis(ms),
            _ => {
                log::warn!("ignoring VIA_VIAD_TIMEOUT_MS={v:?}: not a positive number");
                DEFAULT_TIMEOUT
            }
        },
        Err(_) => DEFAULT_TIMEOUT,
    })
}
