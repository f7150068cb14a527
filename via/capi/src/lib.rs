//! libvipl: the VIPL 1.0 C ABI (`include/vipl.h`) as a C library.
//!
//! Built as `libvipl.so.1` (soname set by `build.rs`) and `libvipl.a`.
//! The functions are defined in `via::ffi`; re-exporting them here makes
//! them part of this crate's public interface, so the linker keeps and
//! exports every `Vip*` symbol (`tools/check-header.sh` compares them with
//! the header). At run time the library needs only `viad`, which it finds
//! beside itself, in `../libexec/via-rs/` or `../bin/` relative to the
//! library, or in `$PATH` (or `$VIA_VIAD`). See `README.md` here for
//! installing and porting.

pub use via::ffi::*;
