//! The C boundary: the panic guard, checked access to C pointers, and the
//! conversions every export shares.
//!
//! Every `Vip*` body is one [`ffi_boundary!`]: the body returns a
//! [`Status`] (`Ok(())` is `VIP_SUCCESS`, `Err(e)` is `e.code()`), and a
//! panic inside it becomes `VIP_ERROR_RESOURCE` plus a `log::error!` line
//! instead of unwinding into C (the library keeps `panic = "unwind"` so the
//! guard can catch it).
//!
//! Pointers from C are read and written only through [`read_in`] and
//! [`Out`]: NULL is `VIP_INVALID_PARAMETER`, and the accesses are unaligned
//! so that a C caller's packing mistake is not undefined behaviour here.

use core::ffi::c_void;
use std::sync::Once;
use std::time::Duration;

use crate::error::{Error, ErrorKind, Result};
use crate::ffi::types::*;
use crate::proto::{MAX_DISCRIMINATOR, MAX_HOST, NetAddr};

/// What an export's body returns: `Ok(())` for `VIP_SUCCESS`, or the error
/// whose [`Error::code`] is the `VIP_RETURN`.
pub(crate) type Status = Result<()>;

/// Runs an export's body (a block evaluating to [`Status`]) and converts
/// the outcome to a `VIP_RETURN`; a panic becomes `VIP_ERROR_RESOURCE` and
/// a log line naming the export.
macro_rules! ffi_boundary {
    ($name:literal, $body:block) => {{
        let r = ::std::panic::catch_unwind(::std::panic::AssertUnwindSafe(|| {
            // A closure of its own: `return` and `?` in the body end the
            // body, as in a function.
            #[allow(clippy::redundant_closure_call)]
            let s = (|| -> $crate::ffi::boundary::Status { $body })();
            $crate::ffi::boundary::code($name, s)
        }));
        $crate::ffi::boundary::finish($name, r)
    }};
}
pub(crate) use ffi_boundary;

/// The `VIP_RETURN` of an export's body, computed inside the panic guard
/// so that only a register leaves it. Success and `VIP_NOT_DONE` are
/// answered inline: the first is the common path of every call, the
/// second every failed poll of a polling loop, whose length is how late a
/// completion is noticed (handed whole to the cold path, the result was
/// copied through memory in pieces that the load after could not take
/// from the store buffer: a stall on every poll).
#[inline(always)]
pub(crate) fn code(name: &str, s: Status) -> VIP_RETURN {
    match s {
        Ok(()) => VIP_SUCCESS,
        Err(e) if e.is_plain(ErrorKind::NotDone) => VIP_NOT_DONE,
        Err(e) => failed(name, e),
    }
}

/// [`code`] of an error: its cause, if any, goes to the log.
#[cold]
#[inline(never)]
fn failed(name: &str, e: Error) -> VIP_RETURN {
    if std::error::Error::source(&e).is_some() {
        // The code is all C sees; the cause goes to the log.
        log::debug!("{name}: {e}");
    }
    e.code()
}

/// The `VIP_RETURN` of an export: its body's, or `VIP_ERROR_RESOURCE` if
/// the body panicked.
#[inline(always)]
pub(crate) fn finish(name: &str, r: std::thread::Result<VIP_RETURN>) -> VIP_RETURN {
    match r {
        Ok(c) => c,
        Err(p) => panicked(name, p),
    }
}

/// [`finish`] for a panic.
#[cold]
#[inline(never)]
fn panicked(name: &str, p: Box<dyn std::any::Any + Send>) -> VIP_RETURN {
    let msg = p
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| p.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)");
    log::error!("{name}: internal error (panic: {msg}); returning VIP_ERROR_RESOURCE");
    VIP_ERROR_RESOURCE
}

/// Reads the C input `*p` by copy.
///
/// # Errors
/// `InvalidParameter` if `p` is NULL.
///
/// # Safety
/// If `p` is not NULL it must point to a readable, initialised `T` (any
/// alignment).
pub(crate) unsafe fn read_in<T: Copy>(p: *const T) -> Result<T> {
    if p.is_null() {
        return Err(Error::InvalidParameter);
    }
    // SAFETY: not NULL, and readable per this function's contract.
    Ok(unsafe { p.read_unaligned() })
}

/// A checked C out-parameter: not NULL, written at most once, on success.
pub(crate) struct Out<T>(*mut T);

impl<T> Out<T> {
    /// Checks `p` up front, before the call does any work.
    ///
    /// # Errors
    /// `InvalidParameter` if `p` is NULL.
    ///
    /// # Safety
    /// If `p` is not NULL it must be valid for one write of a `T` (any
    /// alignment) until [`Out::write`] is called.
    pub unsafe fn new(p: *mut T) -> Result<Out<T>> {
        if p.is_null() {
            Err(Error::InvalidParameter)
        } else {
            Ok(Out(p))
        }
    }

    /// Stores the result (call only on success).
    pub fn write(self, v: T) {
        // SAFETY: not NULL and writable per the contract of `Out::new`.
        unsafe { self.0.write_unaligned(v) }
    }
}

/// The C context pointer of a handler, carried to the provider thread.
#[derive(Clone, Copy)]
pub(crate) struct CContext(VIP_PVOID);

// SAFETY: the pointer is never dereferenced by the library; it is only
// handed back to the application's handler, which VIPL runs on a provider
// thread. Registering a handler is the application's statement that the
// context may be used from that thread.
unsafe impl Send for CContext {}
// SAFETY: as for `Send`: the library only copies the pointer value.
unsafe impl Sync for CContext {}

impl CContext {
    /// Wraps the application's context.
    pub fn new(p: VIP_PVOID) -> CContext {
        CContext(p)
    }

    /// The pointer, to pass back to C. (A method, so that closures capture
    /// the whole `Send` wrapper rather than the raw field.)
    pub fn get(self) -> VIP_PVOID {
        self.0
    }
}

/// A VIPL timeout: `VIP_INFINITE` (or anything larger) waits forever,
/// other values are milliseconds.
pub(crate) fn timeout(ms: VIP_ULONG) -> Option<Duration> {
    if ms >= VIP_INFINITE {
        None
    } else {
        Some(Duration::from_millis(ms))
    }
}

/// A VIPL boolean as a Rust one: any non-zero value is true.
pub(crate) fn boolean(b: VIP_BOOLEAN) -> bool {
    b != 0
}

/// A Rust boolean as a VIPL one.
pub(crate) fn vip_bool(b: bool) -> VIP_BOOLEAN {
    if b { VIP_TRUE } else { VIP_FALSE }
}

/// Reads a `VIP_NET_ADDRESS` (header, host address, discriminator).
///
/// # Errors
/// `InvalidParameter` for NULL, or a host address or discriminator longer
/// than the provider accepts.
///
/// # Safety
/// If `p` is not NULL it must point to a `VIP_NET_ADDRESS` header followed
/// by `HostAddressLen + DiscriminatorLen` readable bytes from `HostAddress`.
pub(crate) unsafe fn read_net_address(p: *const VIP_NET_ADDRESS) -> Result<NetAddr> {
    // SAFETY: the header is readable per this function's contract.
    let h = unsafe { read_in(p) }?;
    let (hl, dl) = (h.HostAddressLen as usize, h.DiscriminatorLen as usize);
    if hl > MAX_HOST || dl > MAX_DISCRIMINATOR {
        return Err(Error::InvalidParameter);
    }
    // SAFETY: `HostAddress` starts 4 bytes into the header, and the caller
    // guarantees `hl + dl` readable bytes there.
    let bytes = unsafe {
        let start = p
            .cast::<u8>()
            .add(core::mem::offset_of!(VIP_NET_ADDRESS, HostAddress));
        core::slice::from_raw_parts(start, hl + dl)
    };
    Ok(NetAddr {
        host: bytes[..hl].to_vec(),
        discriminator: bytes[hl..].to_vec(),
    })
}

/// Writes `a` as a `VIP_NET_ADDRESS` (both lengths and all bytes).
///
/// # Safety
/// `p` is not NULL and has room for the header and `a.host.len() +
/// a.discriminator.len()` bytes from `HostAddress`.
pub(crate) unsafe fn write_net_address(p: *mut VIP_NET_ADDRESS, a: &NetAddr) {
    // SAFETY: room for the header and the bytes per the contract; the
    // lengths fit in u16 (bounded by MAX_HOST and MAX_DISCRIMINATOR).
    unsafe {
        write_host_address(p, &a.host);
        (&raw mut (*p).DiscriminatorLen).write_unaligned(a.discriminator.len() as u16);
        let start = p
            .cast::<u8>()
            .add(core::mem::offset_of!(VIP_NET_ADDRESS, HostAddress));
        core::ptr::copy_nonoverlapping(
            a.discriminator.as_ptr(),
            start.add(a.host.len()),
            a.discriminator.len(),
        );
    }
}

/// Writes `HostAddressLen` and the host address bytes only.
///
/// # Safety
/// `p` is not NULL and has room for the header and `host.len()` bytes from
/// `HostAddress`; `host.len()` fits in a u16.
pub(crate) unsafe fn write_host_address(p: *mut VIP_NET_ADDRESS, host: &[u8]) {
    // SAFETY: room for the header and the bytes per the contract.
    unsafe {
        (&raw mut (*p).HostAddressLen).write_unaligned(host.len() as u16);
        let start = p
            .cast::<u8>()
            .add(core::mem::offset_of!(VIP_NET_ADDRESS, HostAddress));
        core::ptr::copy_nonoverlapping(host.as_ptr(), start, host.len());
    }
}

/// The address of a C pointer, keeping its provenance exposed so that the
/// pointer can be rebuilt by [`pointer`] when it is handed back to C.
pub(crate) fn address<T>(p: *mut T) -> u64 {
    p.expose_provenance() as u64
}

/// Rebuilds a pointer the application gave us earlier (see [`address`]).
pub(crate) fn pointer<T>(addr: u64) -> *mut T {
    core::ptr::with_exposed_provenance_mut(addr as usize)
}

/// An opaque C value (handle, QoS) from an integer; never dereferenced.
pub(crate) fn opaque(v: u64) -> *mut c_void {
    core::ptr::without_provenance_mut(v as usize)
}

/// The integer inside an opaque C value.
pub(crate) fn opaque_value(p: *mut c_void) -> u64 {
    p.addr() as u64
}

/// Logs to stderr for C programs, which have no Rust logger: installed on
/// the first `VipOpenNic` unless the process already has a logger.
struct StderrLogger;

impl log::Log for StderrLogger {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::max_level()
    }

    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) {
            eprintln!(
                "libvipl[{}] {}: {}",
                std::process::id(),
                r.level(),
                r.args()
            );
        }
    }

    fn flush(&self) {}
}

/// The log level of C programs: `$VIA_LOG` (`off`, `error`, `warn`,
/// `info`, `debug`, `trace`), else `$RUST_LOG` when it is a bare level or
/// names one for `via` (`via=debug`), else `warn`.
fn log_level() -> log::LevelFilter {
    let parse = |v: &str| v.trim().parse::<log::LevelFilter>().ok();
    if let Some(l) = std::env::var("VIA_LOG").ok().and_then(|v| parse(&v)) {
        return l;
    }
    if let Ok(v) = std::env::var("RUST_LOG") {
        for part in v.split(',') {
            let level = match part.split_once('=') {
                Some((target, level)) if target.trim() == "via" => level,
                Some(_) => continue,
                None => part,
            };
            if let Some(l) = parse(level) {
                return l;
            }
        }
    }
    log::LevelFilter::Warn
}

/// Installs [`StderrLogger`] once, at [`log_level`], unless the process
/// already has a logger (a Rust program using the library).
pub(crate) fn init_logging() {
    static ONCE: Once = Once::new();
    static LOGGER: StderrLogger = StderrLogger;
    ONCE.call_once(|| {
        if log::set_logger(&LOGGER).is_ok() {
            log::set_max_level(log_level());
        }
    });
}
