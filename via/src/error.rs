//! Errors of the provider, one per `VIP_RETURN` code.
#![forbid(unsafe_code)]

use std::fmt;

/// A failed VIA operation. Each variant is one `VIP_RETURN` code (see
/// [`Error::code`]); `VIP_SUCCESS` is `Ok`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Error {
    /// `VIP_NOT_DONE`: nothing completed (non-blocking calls).
    NotDone,
    /// `VIP_INVALID_PARAMETER`: a NULL, stale, foreign or malformed argument.
    InvalidParameter,
    /// `VIP_ERROR_RESOURCE`: out of VIs, descriptors, memory, ...
    Resource,
    /// `VIP_TIMEOUT`: the wait expired.
    Timeout,
    /// `VIP_REJECT`: the server rejected the connection.
    Reject,
    /// `VIP_INVALID_RELIABILITY_LEVEL`: unsupported or mismatched level.
    InvalidReliabilityLevel,
    /// `VIP_INVALID_MTU`: MaxTransferSize out of range.
    InvalidMtu,
    /// `VIP_INVALID_QOS`: QoS not supported.
    InvalidQos,
    /// `VIP_INVALID_PTAG`: protection tag of another NIC, or destroyed.
    InvalidPtag,
    /// `VIP_INVALID_RDMAREAD`: RDMA read requested where it is not supported.
    InvalidRdmaRead,
    /// `VIP_DESCRIPTOR_ERROR`: the descriptor itself is unusable.
    DescriptorError,
    /// `VIP_INVALID_STATE`: the object is in the wrong state for the call.
    InvalidState,
    /// `VIP_ERROR_NAMESERVICE`: name or address not known.
    NameService,
    /// `VIP_NO_MATCH`: the remote host is not reachable.
    NoMatch,
}

/// Shorthand for results of this crate.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// The `VIP_RETURN` value of this error.
    pub const fn code(self) -> u32 {
        match self {
            Error::NotDone => 1,
            Error::InvalidParameter => 2,
            Error::Resource => 3,
            Error::Timeout => 4,
            Error::Reject => 5,
            Error::InvalidReliabilityLevel => 6,
            Error::InvalidMtu => 7,
            Error::InvalidQos => 8,
            Error::InvalidPtag => 9,
            Error::InvalidRdmaRead => 10,
            Error::DescriptorError => 11,
            Error::InvalidState => 12,
            Error::NameService => 13,
            Error::NoMatch => 14,
        }
    }

    /// The error for a `VIP_RETURN` value (`None` for `VIP_SUCCESS` and unknown values).
    pub const fn from_code(code: u32) -> Option<Error> {
        Some(match code {
            1 => Error::NotDone,
            2 => Error::InvalidParameter,
            3 => Error::Resource,
            4 => Error::Timeout,
            5 => Error::Reject,
            6 => Error::InvalidReliabilityLevel,
            7 => Error::InvalidMtu,
            8 => Error::InvalidQos,
            9 => Error::InvalidPtag,
            10 => Error::InvalidRdmaRead,
            11 => Error::DescriptorError,
            12 => Error::InvalidState,
            13 => Error::NameService,
            14 => Error::NoMatch,
            _ => return None,
        })
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Error::NotDone => "not done",
            Error::InvalidParameter => "invalid parameter",
            Error::Resource => "out of resources",
            Error::Timeout => "timed out",
            Error::Reject => "connection rejected",
            Error::InvalidReliabilityLevel => "invalid reliability level",
            Error::InvalidMtu => "invalid MaxTransferSize",
            Error::InvalidQos => "invalid QoS",
            Error::InvalidPtag => "invalid protection tag",
            Error::InvalidRdmaRead => "RDMA read not supported here",
            Error::DescriptorError => "descriptor error",
            Error::InvalidState => "invalid state",
            Error::NameService => "name service error",
            Error::NoMatch => "no match",
        };
        f.write_str(s)
    }
}

impl std::error::Error for Error {}

impl From<crate::proto::Refusal> for Error {
    fn from(r: crate::proto::Refusal) -> Error {
        use crate::proto::Refusal;
        match r {
            Refusal::Timeout | Refusal::Gone => Error::Timeout,
            Refusal::Reject => Error::Reject,
            Refusal::Reliability => Error::InvalidReliabilityLevel,
            Refusal::NoMatch => Error::NoMatch,
            Refusal::NameService => Error::NameService,
            Refusal::Invalid | Refusal::Limit | Refusal::Quota => Error::Resource,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_in_vipl_order() {
        for c in 1..=14 {
            assert_eq!(Error::from_code(c).unwrap().code(), c);
        }
        assert_eq!(Error::from_code(0), None);
        assert_eq!(Error::from_code(15), None);
        assert_eq!(Error::NoMatch.code(), 14);
    }
}
