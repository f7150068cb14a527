//! Errors of the provider, one per `VIP_RETURN` code.
#![forbid(unsafe_code)]

use std::fmt;
use std::sync::Arc;

/// What kind of failure: one per `VIP_RETURN` code (see [`ErrorKind::code`]);
/// `VIP_SUCCESS` is `Ok`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
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

impl ErrorKind {
    /// The `VIP_RETURN` value of this kind.
    pub const fn code(self) -> u32 {
        match self {
            ErrorKind::NotDone => 1,
            ErrorKind::InvalidParameter => 2,
            ErrorKind::Resource => 3,
            ErrorKind::Timeout => 4,
            ErrorKind::Reject => 5,
            ErrorKind::InvalidReliabilityLevel => 6,
            ErrorKind::InvalidMtu => 7,
            ErrorKind::InvalidQos => 8,
            ErrorKind::InvalidPtag => 9,
            ErrorKind::InvalidRdmaRead => 10,
            ErrorKind::DescriptorError => 11,
            ErrorKind::InvalidState => 12,
            ErrorKind::NameService => 13,
            ErrorKind::NoMatch => 14,
        }
    }

    /// The kind of a `VIP_RETURN` value (`None` for `VIP_SUCCESS` and
    /// unknown values).
    pub const fn from_code(code: u32) -> Option<ErrorKind> {
        Some(match code {
            1 => ErrorKind::NotDone,
            2 => ErrorKind::InvalidParameter,
            3 => ErrorKind::Resource,
            4 => ErrorKind::Timeout,
            5 => ErrorKind::Reject,
            6 => ErrorKind::InvalidReliabilityLevel,
            7 => ErrorKind::InvalidMtu,
            8 => ErrorKind::InvalidQos,
            9 => ErrorKind::InvalidPtag,
            10 => ErrorKind::InvalidRdmaRead,
            11 => ErrorKind::DescriptorError,
            12 => ErrorKind::InvalidState,
            13 => ErrorKind::NameService,
            14 => ErrorKind::NoMatch,
            _ => return None,
        })
    }

    fn describe(self) -> &'static str {
        match self {
            ErrorKind::NotDone => "not done",
            ErrorKind::InvalidParameter => "invalid parameter",
            ErrorKind::Resource => "out of resources",
            ErrorKind::Timeout => "timed out",
            ErrorKind::Reject => "connection rejected",
            ErrorKind::InvalidReliabilityLevel => "invalid reliability level",
            ErrorKind::InvalidMtu => "invalid MaxTransferSize",
            ErrorKind::InvalidQos => "invalid QoS",
            ErrorKind::InvalidPtag => "invalid protection tag",
            ErrorKind::InvalidRdmaRead => "RDMA read not supported here",
            ErrorKind::DescriptorError => "descriptor error",
            ErrorKind::InvalidState => "invalid state",
            ErrorKind::NameService => "name service error",
            ErrorKind::NoMatch => "no match",
        }
    }
}

/// The cause of an error, shared by its clones. A thin pointer (the box
/// holds the fat one): an `Error` is two words, so a `Result<()>` or
/// `Result` of a word comes back in registers on every call of the posting
/// path rather than through memory.
type Cause = Arc<Box<dyn std::error::Error + Send + Sync + 'static>>;

/// A failed VIA operation: its [`ErrorKind`] (one `VIP_RETURN` code) and,
/// when something below failed (a system call, the daemon), that cause as
/// [`std::error::Error::source`].
///
/// Errors compare by kind. Each kind is also a constant of this type, so
/// `Err(Error::Timeout)` reads as before; match on [`Error::kind`].
#[derive(Clone)]
pub struct Error {
    kind: ErrorKind,
    cause: Option<Cause>,
}

#[allow(non_upper_case_globals)]
impl Error {
    /// [`ErrorKind::NotDone`] without a cause.
    pub const NotDone: Error = Error::of(ErrorKind::NotDone);
    /// [`ErrorKind::InvalidParameter`] without a cause.
    pub const InvalidParameter: Error = Error::of(ErrorKind::InvalidParameter);
    /// [`ErrorKind::Resource`] without a cause.
    pub const Resource: Error = Error::of(ErrorKind::Resource);
    /// [`ErrorKind::Timeout`] without a cause.
    pub const Timeout: Error = Error::of(ErrorKind::Timeout);
    /// [`ErrorKind::Reject`] without a cause.
    pub const Reject: Error = Error::of(ErrorKind::Reject);
    /// [`ErrorKind::InvalidReliabilityLevel`] without a cause.
    pub const InvalidReliabilityLevel: Error = Error::of(ErrorKind::InvalidReliabilityLevel);
    /// [`ErrorKind::InvalidMtu`] without a cause.
    pub const InvalidMtu: Error = Error::of(ErrorKind::InvalidMtu);
    /// [`ErrorKind::InvalidQos`] without a cause.
    pub const InvalidQos: Error = Error::of(ErrorKind::InvalidQos);
    /// [`ErrorKind::InvalidPtag`] without a cause.
    pub const InvalidPtag: Error = Error::of(ErrorKind::InvalidPtag);
    /// [`ErrorKind::InvalidRdmaRead`] without a cause.
    pub const InvalidRdmaRead: Error = Error::of(ErrorKind::InvalidRdmaRead);
    /// [`ErrorKind::DescriptorError`] without a cause.
    pub const DescriptorError: Error = Error::of(ErrorKind::DescriptorError);
    /// [`ErrorKind::InvalidState`] without a cause.
    pub const InvalidState: Error = Error::of(ErrorKind::InvalidState);
    /// [`ErrorKind::NameService`] without a cause.
    pub const NameService: Error = Error::of(ErrorKind::NameService);
    /// [`ErrorKind::NoMatch`] without a cause.
    pub const NoMatch: Error = Error::of(ErrorKind::NoMatch);
}

impl Error {
    /// An error of `kind` without a cause.
    pub const fn of(kind: ErrorKind) -> Error {
        Error { kind, cause: None }
    }

    /// An error of `kind` caused by `cause`.
    pub fn caused_by(
        kind: ErrorKind,
        cause: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Error {
        Error {
            kind,
            cause: Some(Arc::new(cause.into())),
        }
    }

    /// `VIP_ERROR_RESOURCE` caused by `cause` (a failed system call, an
    /// unreachable daemon).
    pub fn resource(cause: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>) -> Error {
        Error::caused_by(ErrorKind::Resource, cause)
    }

    /// `VIP_ERROR_RESOURCE` because `what` failed with `cause`.
    pub(crate) fn failed(
        what: impl Into<String>,
        cause: impl std::error::Error + Send + Sync + 'static,
    ) -> Error {
        Error::resource(Context {
            what: what.into(),
            cause: Box::new(cause),
        })
    }

    /// Whether this is an error of `kind` with no cause (nothing to log, and
    /// nothing to drop: the C boundary answers it inline).
    #[inline(always)]
    pub(crate) fn is_plain(&self, kind: ErrorKind) -> bool {
        self.kind == kind && self.cause.is_none()
    }

    /// The kind.
    pub const fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The `VIP_RETURN` value of this error.
    pub const fn code(&self) -> u32 {
        self.kind.code()
    }

    /// The error for a `VIP_RETURN` value (`None` for `VIP_SUCCESS` and unknown values).
    pub const fn from_code(code: u32) -> Option<Error> {
        match ErrorKind::from_code(code) {
            Some(k) => Some(Error::of(k)),
            None => None,
        }
    }
}

impl From<ErrorKind> for Error {
    fn from(kind: ErrorKind) -> Error {
        Error::of(kind)
    }
}

impl PartialEq for Error {
    fn eq(&self, other: &Error) -> bool {
        self.kind == other.kind
    }
}

impl Eq for Error {}

impl std::hash::Hash for Error {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.kind.hash(h)
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.cause {
            None => write!(f, "{:?}", self.kind),
            Some(c) => write!(f, "{:?}({c})", self.kind),
        }
    }
}

/// What the provider was doing when a call below it failed.
#[derive(Debug)]
struct Context {
    what: String,
    cause: Box<dyn std::error::Error + Send + Sync + 'static>,
}

impl fmt::Display for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.what, self.cause)
    }
}

impl std::error::Error for Context {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.cause)
    }
}

/// Shorthand for results of this crate.
pub type Result<T> = std::result::Result<T, Error>;

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kind.describe())?;
        if let Some(c) = &self.cause {
            write!(f, ": {c}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.cause
            .as_deref()
            .map(|c| &**c as &(dyn std::error::Error + 'static))
    }
}

impl From<crate::proto::Refusal> for Error {
    fn from(r: crate::proto::Refusal) -> Error {
        use crate::proto::Refusal;
        let kind = match r {
            Refusal::Timeout | Refusal::Gone => ErrorKind::Timeout,
            Refusal::Reject => ErrorKind::Reject,
            Refusal::Reliability => ErrorKind::InvalidReliabilityLevel,
            Refusal::NoMatch => ErrorKind::NoMatch,
            Refusal::NameService => ErrorKind::NameService,
            Refusal::Invalid | Refusal::Limit | Refusal::Quota => ErrorKind::Resource,
        };
        Error::caused_by(kind, format!("viad refused: {r:?}"))
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

    #[test]
    fn a_cause_is_kept_and_does_not_change_the_code() {
        use std::error::Error as _;
        let io = std::io::Error::from_raw_os_error(libc::ENOMEM);
        let e = Error::resource(io);
        assert_eq!(e, Error::Resource, "errors compare by kind");
        assert_eq!(e.code(), 3);
        let src = e.source().expect("the cause");
        assert!(src.to_string().contains("memory"), "{src}");
        assert!(e.to_string().starts_with("out of resources: "), "{e}");
        assert!(Error::Timeout.source().is_none());
        let r: Error = crate::proto::Refusal::Quota.into();
        assert_eq!(r.kind(), ErrorKind::Resource);
        assert!(r.source().unwrap().to_string().contains("Quota"));
        // A clone shares the cause.
        let c = e.clone();
        assert!(c.source().unwrap().to_string().contains("memory"));
    }

    #[test]
    fn a_result_of_a_word_fits_in_two_registers() {
        // The posting path returns these through every layer: two words
        // come back in registers, three through memory.
        assert_eq!(size_of::<Error>(), 16);
        assert_eq!(size_of::<Result<()>>(), 16);
        assert_eq!(size_of::<Result<u64>>(), 16);
    }
}
