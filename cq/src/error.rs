//! Errors of the ring operations.
#![forbid(unsafe_code)]

use core::fmt;

/// Why [`EntryRing::push`](crate::EntryRing::push) did not add the entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PushError {
    /// The ring holds `limit` entries: the VIA "CQ overrun".
    Overrun,
    /// The ring was closed (it is being resized or destroyed); the producer
    /// must look up the ring that replaces it.
    Closed,
    /// The shared header is inconsistent (for example the tail is more than
    /// `capacity` ahead of the head): a peer wrote garbage into it.
    Corrupt,
    /// The retry budget ran out: a slot stayed unavailable for a long time
    /// (a consumer stalled between claiming and releasing it, or the slot
    /// stamps were overwritten) or the entry was tombstoned again and again.
    Stuck,
}

impl fmt::Display for PushError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Overrun => "completion queue overrun",
            Self::Closed => "completion queue closed",
            Self::Corrupt => "completion queue header corrupt",
            Self::Stuck => "completion queue slot stuck",
        })
    }
}

impl std::error::Error for PushError {}

/// Why [`EntryRing::init`](crate::EntryRing::init) or
/// [`EntryRing::attach`](crate::EntryRing::attach) refused a mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayoutError {
    /// The mapping is not aligned to 64 bytes.
    Misaligned,
    /// The mapping is shorter than the ring needs.
    TooSmall {
        /// Bytes the ring needs.
        need: usize,
        /// Bytes the mapping has.
        have: usize,
    },
    /// The capacity is zero, not a power of two, or above
    /// [`MAX_CAPACITY`](crate::layout::MAX_CAPACITY).
    BadCapacity(u32),
    /// The first word is not [`MAGIC`](crate::layout::MAGIC).
    BadMagic(u64),
    /// The version is not [`VERSION`](crate::layout::VERSION).
    BadVersion(u32),
}

impl fmt::Display for LayoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Misaligned => f.write_str("ring mapping is not 64-byte aligned"),
            Self::TooSmall { need, have } => {
                write!(f, "ring mapping too small: need {need} bytes, have {have}")
            }
            Self::BadCapacity(c) => write!(f, "bad ring capacity {c}"),
            Self::BadMagic(m) => write!(f, "bad ring magic {m:#018x}"),
            Self::BadVersion(v) => write!(f, "unsupported ring version {v}"),
        }
    }
}

impl std::error::Error for LayoutError {}

/// Why [`EntryRing::set_limit`](crate::EntryRing::set_limit) refused a limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LimitError {
    /// The limit is larger than the physical capacity.
    AboveCapacity {
        /// Requested limit.
        limit: usize,
        /// Physical capacity.
        capacity: usize,
    },
    /// The ring already holds more entries than the limit.
    BelowLen {
        /// Requested limit.
        limit: usize,
        /// Entries in the ring when the limit was checked.
        len: usize,
    },
}

impl fmt::Display for LimitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::AboveCapacity { limit, capacity } => {
                write!(f, "limit {limit} above capacity {capacity}")
            }
            Self::BelowLen { limit, len } => write!(f, "limit {limit} below current length {len}"),
        }
    }
}

impl std::error::Error for LimitError {}
