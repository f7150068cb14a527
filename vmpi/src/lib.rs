//! vmpi: message passing (the common MPI subset) over the via provider.
//!
//! ```no_run
//! let world = vmpi::World::init().unwrap();
//! let comm = world.comm();
//! let mut sum = [0i64];
//! comm.allreduce(&[comm.rank() as i64], &mut sum, &vmpi::Op::Builtin(vmpi::Builtin::Sum)).unwrap();
//! world.finalize().unwrap();
//! ```
//!
//! | module | what |
//! |---|---|
//! | `pmi` | the launch interface (put, fence, get) |
//! | `launch` | the local launcher behind `via-run` |
//! | `channel` | one connection: VI, slots, credits |
//! | `engine` | requests, matching, eager and rendezvous, progress |
//! | `comm` | communicators and point-to-point calls |
//! | `coll` | collectives, their model and selector |
//! | `offload` | collectives forwarded by a progress thread |
//! | `mailbox` | DECK-style mailboxes between threads of a process |
//! | `datatype`, `op` | predefined datatypes, reduction operations |
//! | `buffer` | application buffers held by operations (the core's only unsafe) |
//! | `ffi` | the C ABI (`mpi.h`), built into libvmpi by `vmpi/capi` |
#![deny(unsafe_code)]

#[allow(unsafe_code)]
pub mod buffer;
pub mod channel;
pub mod coll;
pub mod comm;
pub mod datatype;
pub mod engine;
pub mod error;
#[allow(unsafe_code)]
pub mod ffi;
pub mod launch;
pub mod mailbox;
pub mod offload;
pub mod op;
pub mod pmi;
pub mod wire;
pub mod world;

pub use comm::{Comm, Request, TAG_UB};
pub use datatype::{Datatype, Element};
pub use engine::Status;
pub use error::{Error, Result};
pub use mailbox::{Mailbox, PostOffice};
pub use op::{Builtin, Op};
pub use world::World;
