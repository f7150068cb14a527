//! via: a user-level Virtual Interface Architecture (VIA) provider.
//!
//! Processes post descriptors to the work queues of a Virtual Interface; the
//! NIC moves the data and completes the descriptors in memory; completion
//! queues merge completions. This crate implements the VIA model over a
//! software NIC (shared memory between the processes of a host), exposes it
//! as a safe Rust API ([`Nic`], [`Vi`], [`Cq`], [`Region`]) and as the VIPL
//! 1.0 C ABI (`ffi`, built into `libvipl` by the `vipl` package).
//!
//! Where things are: the data path of a send is described in
//! [`backend::soft`](crate::backend) (module docs), the shared-memory
//! contract in `shm::layout`, the daemon protocol in [`proto`].
//!
//! Configuration comes from the environment; see [`config`].

/// A fail point (feature `failpoints`, tikv's `fail`): `failpoint!(name)`
/// runs what a test configured for `name` (a callback, a pause),
/// `failpoint!(name, |arg| value)` also returns `value` from the enclosing
/// function when the test asks for `return`. Without the feature: nothing.
// (Its points are all in the verbs kind so far.)
#[cfg_attr(not(feature = "verbs"), allow(unused_macros))]
macro_rules! failpoint {
    ($($t:tt)*) => {
        #[cfg(feature = "failpoints")]
        fail::fail_point!($($t)*);
    };
}

pub mod agent;
pub use via_sys as sys;
pub use via_wire::proto;
mod api;
mod attrs;
pub(crate) mod backend;
mod completion;
pub mod config;
mod conn;
mod cq;
pub mod descriptor;
mod error;
pub mod ffi;
pub mod handle;
mod handle_map;
pub mod mem;
mod nic;
mod notify;
pub mod ns;
mod parked;
mod process;
mod regions;
pub mod shm;
mod translate;
mod vi;

pub use api::{
    ConnRequest, Cq, DescBuilder, Memory, Nic, Refused, Region, RegistrationStats, Srq,
    SrqCompletion, Vi,
};
pub use attrs::{MemAttributes, NicAttributes, Ptag, Reliability, ViAttributes, ViState};
pub use backend::{CacheCounts, TranslationStats};
pub use error::{Error, ErrorKind, Result};
pub use nic::{AsyncError, ErrorCode, ResourceCode};
pub use proto::NetAddr;

/// Applies a memory event now, as the memory monitor does when it reads
/// one (tests of an event applied late).
#[doc(hidden)]
pub use process::apply_memory_event;
pub use vi::{Completion, Which};

/// The RDMA devices the verbs kind of NIC can open (empty: none, or no
/// libibverbs on this machine).
#[cfg(feature = "verbs")]
pub fn rdma_devices() -> Vec<String> {
    backend::verbs::devices()
}

/// The mean time of one bare `ibv_post_send` (an 8-byte RDMA write on an
/// RC QP connected to itself) on RDMA device `name`: the baseline of the
/// verbs kind's post cost (`tests/tests/verbs.rs`).
///
/// # Errors
/// The device's, if it cannot be opened or set up.
#[cfg(feature = "verbs")]
#[doc(hidden)]
pub fn bare_ibv_post(name: &str, iters: u32) -> std::io::Result<std::time::Duration> {
    backend::verbs::bench::bare_post(name, iters)
}

/// The mean time of one bare post on RDMA device `name`: `ibv_post_send`
/// of a `size`-byte RDMA write, or (`recv`) `ibv_post_recv` of a
/// `size`-byte buffer, on an RC QP connected to itself, its completions
/// taken by polling or (`events`) by a thread sleeping on a completion
/// channel; the baseline of the verbs kind's post cost by size
/// (`tests/tests/verbs_bench.rs`).
///
/// # Errors
/// The device's, if it cannot be opened or set up.
#[cfg(feature = "verbs")]
#[doc(hidden)]
pub fn bare_ibv_post_cost(
    name: &str,
    iters: u32,
    size: u32,
    recv: bool,
    events: bool,
) -> std::io::Result<std::time::Duration> {
    use backend::verbs::bench::Reap;
    let reap = if events { Reap::Events } else { Reap::Poll };
    backend::verbs::bench::bare_post_cost(name, iters, size, recv, reap)
}

/// An `ibv_rc_pingpong`-style loop on raw verbs, the baseline of via's
/// ping-pong latency on a verbs device (`tests/tests/verbs_bench.rs`,
/// `via-bench verbs`).
#[cfg(feature = "verbs")]
#[doc(hidden)]
pub use backend::verbs::bench::RawPingPong;

/// [`RawPingPong`] in a build without the verbs kind: the same interface,
/// whose constructor says that the kind is missing, so that tools build
/// either way (cargo unifies the feature: a workspace built with
/// `--features via/verbs` gives every tool the real one).
#[cfg(not(feature = "verbs"))]
#[doc(hidden)]
pub struct RawPingPong(std::convert::Infallible);

#[cfg(not(feature = "verbs"))]
#[doc(hidden)]
impl RawPingPong {
    /// Always `Unsupported`: this build has no verbs kind.
    ///
    /// # Errors
    /// Always.
    pub fn new(_name: &str) -> std::io::Result<RawPingPong> {
        Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "this build has no verbs kind (build with the cargo feature via/verbs)",
        ))
    }

    /// Never reached (no value exists).
    pub fn endpoint(&self) -> Vec<u8> {
        match self.0 {}
    }

    /// Never reached (no value exists).
    ///
    /// # Errors
    /// None.
    pub fn connect(&self, _peer: &[u8]) -> std::io::Result<()> {
        match self.0 {}
    }

    /// Never reached (no value exists).
    ///
    /// # Errors
    /// None.
    pub fn run(
        &self,
        _iters: u32,
        _size: u32,
        _initiator: bool,
    ) -> std::io::Result<std::time::Duration> {
        match self.0 {}
    }
}

/// Whether this build has the verbs kind of NIC (cargo feature `verbs`).
pub const HAS_VERBS: bool = cfg!(feature = "verbs");

/// Whether RDMA device `name` supports XRC (`ibv_open_xrcd`), and the
/// device's error if not (Soft-RoCE: "Operation not supported").
///
/// # Errors
/// The device's.
#[cfg(feature = "verbs")]
#[doc(hidden)]
pub fn rdma_xrc_supported(name: &str) -> std::io::Result<()> {
    backend::verbs::xrc_supported(name)
}

/// Work requests the verbs kind's central send queue (`VIA_DOORBELL=central`)
/// posted in this process, and the `ibv_post_send` calls (chains) they took.
#[cfg(feature = "verbs")]
#[doc(hidden)]
pub fn verbs_central_counts() -> (u64, u64) {
    backend::verbs::central_counts()
}
