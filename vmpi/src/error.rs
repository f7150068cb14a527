//! Errors of the library, one per MPI error class.
#![forbid(unsafe_code)]

/// A failed operation. Each variant is one MPI error class
/// ([`Error::code`] is the `MPI_ERR_*` value of `mpi.h`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// `MPI_ERR_BUFFER`: a NULL or overlapping buffer.
    #[error("invalid buffer: {0}")]
    Buffer(String),
    /// `MPI_ERR_COUNT`: a negative or inconsistent count.
    #[error("invalid count: {0}")]
    Count(String),
    /// `MPI_ERR_TYPE`: an unknown datatype.
    #[error("invalid datatype")]
    Type,
    /// `MPI_ERR_TAG`: a negative tag (other than `ANY_TAG` where allowed) or one above `TAG_UB`.
    #[error("invalid tag {0}")]
    Tag(i32),
    /// `MPI_ERR_COMM`: an unknown or freed communicator.
    #[error("invalid communicator")]
    Comm,
    /// `MPI_ERR_RANK`: a rank outside the communicator.
    #[error("invalid rank {0}")]
    Rank(i32),
    /// `MPI_ERR_REQUEST`: an unknown request.
    #[error("invalid request")]
    Request,
    /// `MPI_ERR_ROOT`: a root outside the communicator.
    #[error("invalid root {0}")]
    Root(i32),
    /// `MPI_ERR_OP`: an unknown operation, or one not defined for the datatype.
    #[error("invalid operation: {0}")]
    Op(String),
    /// `MPI_ERR_ARG`: another invalid argument.
    #[error("invalid argument: {0}")]
    Arg(String),
    /// `MPI_ERR_TRUNCATE`: a message longer than the receive buffer (the
    /// buffer holds its first bytes).
    #[error("message truncated: {got} bytes for a buffer of {room}")]
    Truncate {
        /// Bytes sent.
        got: u64,
        /// Bytes the receive buffer holds.
        room: u64,
    },
    /// `MPI_ERR_IN_STATUS`: see the statuses of a multiple completion.
    #[error("an operation failed; see its status")]
    InStatus,
    /// `MPI_ERR_OTHER`: the transport failed (a peer died, a connection broke).
    #[error("transport: {0}")]
    Transport(String),
    /// `MPI_ERR_INTERN`: out of resources or an internal failure.
    #[error("internal: {0}")]
    Intern(String),
}

/// Shorthand for results of this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// `MPI_SUCCESS`.
pub const SUCCESS: i32 = 0;

impl Error {
    /// The `MPI_ERR_*` class value (as in `mpi.h`).
    pub fn code(&self) -> i32 {
        match self {
            Error::Buffer(_) => 1,
            Error::Count(_) => 2,
            Error::Type => 3,
            Error::Tag(_) => 4,
            Error::Comm => 5,
            Error::Rank(_) => 6,
            Error::Request => 7,
            Error::Root(_) => 8,
            Error::Op(_) => 10,
            Error::Arg(_) => 13,
            Error::Truncate { .. } => 15,
            Error::Transport(_) => 16,
            Error::Intern(_) => 17,
            Error::InStatus => 18,
        }
    }
}

/// The text of an error class (`MPI_Error_string`).
pub fn class_string(code: i32) -> &'static str {
    match code {
        0 => "MPI_SUCCESS: no error",
        1 => "MPI_ERR_BUFFER: invalid buffer pointer",
        2 => "MPI_ERR_COUNT: invalid count argument",
        3 => "MPI_ERR_TYPE: invalid datatype",
        4 => "MPI_ERR_TAG: invalid tag",
        5 => "MPI_ERR_COMM: invalid communicator",
        6 => "MPI_ERR_RANK: invalid rank",
        7 => "MPI_ERR_REQUEST: invalid request",
        8 => "MPI_ERR_ROOT: invalid root",
        9 => "MPI_ERR_GROUP: invalid group",
        10 => "MPI_ERR_OP: invalid reduce operation",
        13 => "MPI_ERR_ARG: invalid argument of some other kind",
        14 => "MPI_ERR_UNKNOWN: unknown error",
        15 => "MPI_ERR_TRUNCATE: message truncated",
        16 => "MPI_ERR_OTHER: known error not in this list",
        17 => "MPI_ERR_INTERN: internal error",
        18 => "MPI_ERR_IN_STATUS: error code is in status",
        19 => "MPI_ERR_PENDING: pending request",
        _ => "unknown error code",
    }
}

impl From<via::Error> for Error {
    fn from(e: via::Error) -> Error {
        Error::Transport(format!("via: {e:?}"))
    }
}
