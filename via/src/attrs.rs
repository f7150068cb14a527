//! Attributes of NICs, VIs and memory regions, and the VI state.
#![forbid(unsafe_code)]

use crate::error::{Error, Result};

/// Reliability level of a VI (`VIP_RELIABILITY_LEVEL`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reliability {
    /// Messages may be lost; a message without a posted receive is dropped.
    Unreliable,
    /// Exactly once, in order; a send completes once the data is on its way.
    ReliableDelivery,
    /// Exactly once, in order; a send completes once the data is placed.
    ReliableReception,
}

impl Reliability {
    /// The `VIP_SERVICE_*` bit.
    pub const fn bits(self) -> u32 {
        match self {
            Reliability::Unreliable => 1,
            Reliability::ReliableDelivery => 2,
            Reliability::ReliableReception => 4,
        }
    }

    /// Parses a `VIP_SERVICE_*` value (exactly one bit).
    pub fn from_bits(b: u32) -> Result<Reliability> {
        match b {
            1 => Ok(Reliability::Unreliable),
            2 => Ok(Reliability::ReliableDelivery),
            4 => Ok(Reliability::ReliableReception),
            _ => Err(Error::InvalidReliabilityLevel),
        }
    }

    /// Whether the level breaks the connection on errors.
    pub const fn is_reliable(self) -> bool {
        !matches!(self, Reliability::Unreliable)
    }
}

/// A protection tag (`VIP_PROTECTION_HANDLE`): an id valid on one NIC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ptag(pub(crate) u32);

impl Ptag {
    /// The id stored in shared tables (index and generation).
    pub fn id(self) -> u32 {
        self.0
    }
}

/// Attributes of a VI (`VIP_VI_ATTRIBUTES`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ViAttributes {
    /// Reliability level.
    pub reliability: Reliability,
    /// Largest message one descriptor may carry.
    pub max_transfer_size: u32,
    /// Opaque QoS value (VIA defines none; carried unchanged).
    pub qos: u64,
    /// Protection tag of the VI.
    pub ptag: Ptag,
    /// Accept incoming RDMA writes.
    pub enable_rdma_write: bool,
    /// Accept incoming RDMA reads.
    pub enable_rdma_read: bool,
}

/// Attributes of a registered region (`VIP_MEM_ATTRIBUTES`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemAttributes {
    /// Protection tag of the region.
    pub ptag: Ptag,
    /// Remote RDMA writes may target the region.
    pub enable_rdma_write: bool,
    /// Remote RDMA reads may source the region.
    pub enable_rdma_read: bool,
}

/// State of a VI (`VIP_VI_STATE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ViState {
    /// Not connected.
    Idle,
    /// A connection is being set up.
    ConnectPending,
    /// Connected to a peer VI.
    Connected,
    /// The connection broke; outstanding descriptors were flushed.
    Error,
}

impl ViState {
    /// The `VIP_STATE_*` value (IDLE 0, CONNECTED 1, CONNECT_PENDING 2, ERROR 3).
    pub const fn code(self) -> u32 {
        match self {
            ViState::Idle => 0,
            ViState::Connected => 1,
            ViState::ConnectPending => 2,
            ViState::Error => 3,
        }
    }
}

/// Attributes of a NIC (`VIP_NIC_ATTRIBUTES`), as reported by `VipQueryNic`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NicAttributes {
    /// Device name.
    pub name: String,
    /// Hardware version.
    pub hardware_version: u64,
    /// Provider version.
    pub provider_version: u64,
    /// This host's VIA address.
    pub local_address: Vec<u8>,
    /// The provider is thread-safe.
    pub thread_safe: bool,
    /// Longest discriminator.
    pub max_discriminator_len: u16,
    /// Total bytes that may be registered.
    pub max_register_bytes: u64,
    /// Regions that may be registered.
    pub max_register_regions: u64,
    /// Largest single region.
    pub max_register_block_bytes: u64,
    /// VIs per NIC.
    pub max_vi: u64,
    /// Outstanding descriptors per work queue.
    pub max_descriptors_per_queue: u64,
    /// Data segments per descriptor.
    pub max_segments_per_desc: u64,
    /// CQs per NIC.
    pub max_cq: u64,
    /// Entries per CQ.
    pub max_cq_entries: u64,
    /// Largest message.
    pub max_transfer_size: u64,
    /// Native MTU of the transport.
    pub native_mtu: u64,
    /// Protection tags per NIC.
    pub max_ptags: u64,
    /// Supported reliability levels (bit set).
    pub reliability_level_support: u32,
    /// Levels on which RDMA read is supported (bit set).
    pub rdma_read_support: u32,
}
