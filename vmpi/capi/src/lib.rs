//! libvmpi: the C ABI of vmpi (`vmpi/include/mpi.h`) as a C library.
//!
//! Built as `libvmpi.so` and `libvmpi.a`. The
//! functions are defined in `vmpi::ffi`; re-exporting them makes them part
//! of this crate's interface, so the linker keeps and exports every `MPI_*`
//! symbol. Programs build with `vmpi/vmpicc` and run under `via-run`.

pub use vmpi::ffi::*;
