//! The C ABI (`vmpi/include/mpi.h`), exported by `libvmpi` (`vmpi/capi`).
//!
//! Modelled on via's `ffi` and rustls-ffi: each export is
//! `#[unsafe(no_mangle)] pub unsafe extern "C" fn MPI_*`, checks its C
//! arguments, converts them, and calls the safe Rust API inside one
//! [`mpi_call!`] (a panic becomes `MPI_ERR_INTERN`). Errors go through the
//! communicator's error handler: `MPI_ERRORS_ARE_FATAL` (the default) ends
//! the job with the error class as exit code, `MPI_ERRORS_RETURN` returns
//! the class. Handles are ints indexing tables, never pointers, so a
//! stale or foreign handle is refused, not dereferenced.
//!
//! | file | calls |
//! |---|---|
//! | `state.rs` | the handle tables, the call boundary, buffer checks |
//! | `env.rs` | init, finalize, abort, errors, communicators, `Wtime` |
//! | `p2p.rs` | send, receive, requests, probe |
//! | `coll.rs` | collectives and user operations |
#![allow(non_snake_case)]

pub mod coll;
pub mod env;
pub mod p2p;
pub(crate) mod state;

pub use coll::*;
pub use env::*;
pub use p2p::*;
pub use state::MPI_Status;
