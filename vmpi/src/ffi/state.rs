//! The C side's state: handle tables (communicators, requests, user
//! operations), the call boundary, and the checked conversions of C
//! buffers and handles.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

use doorbell::{BiasedGuard, BiasedLock};

use crate::comm::Comm;
use crate::datatype::Datatype;
use crate::engine::{ReqId, Status};
use crate::error::{Error, Result};
use crate::op::{Builtin, Op};
use crate::world::World;

/// `MPI_Status` of `mpi.h`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MPI_Status {
    /// Source rank.
    pub MPI_SOURCE: i32,
    /// Tag.
    pub MPI_TAG: i32,
    /// Error class (multiple completions).
    pub MPI_ERROR: i32,
    /// Padding.
    pub vmpi_reserved: i32,
    /// Bytes received.
    pub vmpi_bytes: std::ffi::c_long,
}

const _: () = assert!(std::mem::size_of::<MPI_Status>() == 24);

/// `MPI_ANY_SOURCE`, `MPI_ANY_TAG`.
pub const ANY: i32 = -1;
/// `MPI_PROC_NULL`.
pub const PROC_NULL: i32 = -2;
/// `MPI_UNDEFINED`.
pub const UNDEFINED: i32 = -32766;
/// `MPI_ERRORS_ARE_FATAL`, `MPI_ERRORS_RETURN`.
pub const ERRORS_ARE_FATAL: i32 = 1;
/// `MPI_ERRORS_RETURN`.
pub const ERRORS_RETURN: i32 = 2;
/// First handle of a user operation.
const USER_OP: i32 = 100;

pub(crate) struct CComm {
    pub comm: Comm,
    pub fatal: bool,
}

pub(crate) enum CReq {
    /// A request of the engine.
    Live(Comm, ReqId),
    /// Complete at once (`MPI_PROC_NULL`).
    Null,
}

pub(crate) struct State {
    pub world: World,
    pub comms: Vec<Option<CComm>>,
    pub reqs: HashMap<i32, CReq>,
    pub next_req: i32,
    pub ops: Vec<Option<Op>>,
}

/// The C API's state, taken by every call: biased to the application's
/// thread, which then takes it without a locked instruction
/// (`doorbell::BiasedLock`).
pub(crate) static STATE: BiasedLock<Option<State>> = BiasedLock::new(None);
pub(crate) static FINALIZED: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);
/// Set once `MPI_Init` has succeeded (never cleared: `MPI_Initialized`
/// stays true after `MPI_Finalize`). Read without [`STATE`]'s lock, which a
/// blocking call may hold for long (see [`with_comm`]).
pub(crate) static INITIALIZED: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);
/// The job between `MPI_Init` and `MPI_Finalize`, for `MPI_Abort` and the
/// fatal error handler from any thread without [`STATE`]'s lock.
pub(crate) static JOB: Mutex<Option<World>> = Mutex::new(None);

/// The job, if initialised and not finalised (never waits for a call).
pub(crate) fn job() -> Option<World> {
    JOB.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

pub(crate) fn lock() -> BiasedGuard<'static, Option<State>> {
    STATE.lock()
}

/// Runs `f` on the initialised state.
pub(crate) fn with<R>(f: impl FnOnce(&mut State) -> Result<R>) -> Result<R> {
    match lock().as_mut() {
        Some(s) => f(s),
        None => Err(Error::Intern(
            "MPI_Init has not been called (or MPI_Finalize has)".into(),
        )),
    }
}

/// The communicator of handle `h`.
pub(crate) fn comm(h: i32) -> Result<Comm> {
    with(|s| {
        usize::try_from(h)
            .ok()
            .and_then(|i| s.comms.get(i))
            .and_then(Option::as_ref)
            .map(|c| c.comm.clone())
            .ok_or(Error::Comm)
    })
}

/// Runs `f` on the communicator of handle `h`, borrowed under the state's
/// lock (no clone of it, and one lock for the lookup and the call): for
/// the calls of the common case (`MPI_Send`, `MPI_Recv`, `MPI_Allreduce`
/// with a predefined operation), whose work never enters the C state
/// again. `f` must not call back into the application (a user operation
/// could call MPI, which would wait for this lock).
pub(crate) fn with_comm<R>(h: i32, f: impl FnOnce(&Comm) -> Result<R>) -> Result<R> {
    with(|s| {
        let c = usize::try_from(h)
            .ok()
            .and_then(|i| s.comms.get(i))
            .and_then(Option::as_ref)
            .ok_or(Error::Comm)?;
        f(&c.comm)
    })
}

/// Whether `h` names a predefined operation (no user function runs).
pub(crate) fn is_builtin_op(h: i32) -> bool {
    (1..USER_OP).contains(&h)
}

/// The operation of handle `h`.
pub(crate) fn op(h: i32) -> Result<Op> {
    if (1..USER_OP).contains(&h) {
        return Ok(Op::Builtin(Builtin::from_id(h)?));
    }
    with(|s| {
        usize::try_from(h - USER_OP)
            .ok()
            .and_then(|i| s.ops.get(i))
            .and_then(Option::clone)
            .ok_or_else(|| Error::Op(format!("unknown operation {h}")))
    })
}

/// Registers a user operation; its handle.
pub(crate) fn add_op(o: Op) -> Result<i32> {
    with(|s| {
        s.ops.push(Some(o));
        Ok(USER_OP + s.ops.len() as i32 - 1)
    })
}

/// Frees a user operation.
pub(crate) fn free_op(h: i32) -> Result<()> {
    with(|s| {
        let slot = usize::try_from(h - USER_OP)
            .ok()
            .and_then(|i| s.ops.get_mut(i))
            .filter(|o| o.is_some())
            .ok_or_else(|| Error::Op(format!("{h} is not a user operation")))?;
        *slot = None;
        Ok(())
    })
}

/// The datatype of handle `h`.
pub(crate) fn datatype(h: i32) -> Result<Datatype> {
    Datatype::from_id(h)
}

/// Bytes of `count` elements of `dt`.
pub(crate) fn bytes(count: i32, dt: Datatype) -> Result<usize> {
    if count < 0 {
        return Err(Error::Count(format!("negative count {count}")));
    }
    dt.bytes(count)
}

/// The C buffer `p` of `n` bytes as a slice.
///
/// # Safety
/// If `n > 0` and `p` is not NULL, `p..p+n` is readable for `'a`.
pub(crate) unsafe fn slice<'a>(p: *const c_void, n: usize) -> Result<&'a [u8]> {
    if n == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(Error::Buffer("NULL buffer".into()));
    }
    // SAFETY: not NULL, `n` readable bytes per this function's contract.
    Ok(unsafe { std::slice::from_raw_parts(p.cast::<u8>(), n) })
}

/// The C buffer `p` of `n` bytes as a mutable slice.
///
/// # Safety
/// If `n > 0` and `p` is not NULL, `p..p+n` is writable for `'a` and not
/// accessed through any other pointer meanwhile.
pub(crate) unsafe fn slice_mut<'a>(p: *mut c_void, n: usize) -> Result<&'a mut [u8]> {
    if n == 0 {
        return Ok(&mut []);
    }
    if p.is_null() {
        return Err(Error::Buffer("NULL buffer".into()));
    }
    // SAFETY: not NULL, `n` writable bytes per this function's contract.
    Ok(unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), n) })
}

/// Refuses a send and a receive buffer that overlap (MPI forbids it, and
/// Rust must never hold a shared and a mutable view of one byte).
pub(crate) fn disjoint(a: *const c_void, an: usize, b: *const c_void, bn: usize) -> Result<()> {
    let (a, b) = (a as usize, b as usize);
    if an > 0 && bn > 0 && a < b + bn && b < a + an {
        return Err(Error::Buffer(
            "send and receive buffers overlap (use MPI_IN_PLACE)".into(),
        ));
    }
    Ok(())
}

/// Writes `st` to `*out` unless `out` is `MPI_STATUS_IGNORE`.
///
/// # Safety
/// `out` is NULL or valid for writing one `MPI_Status`.
pub(crate) unsafe fn put_status(out: *mut MPI_Status, st: &Status, err: i32) {
    if out.is_null() {
        return;
    }
    let s = MPI_Status {
        MPI_SOURCE: st.source,
        MPI_TAG: st.tag,
        MPI_ERROR: err,
        vmpi_reserved: 0,
        vmpi_bytes: st.bytes as std::ffi::c_long,
    };
    // SAFETY: not NULL, writable per the contract.
    unsafe { out.write_unaligned(s) };
}

/// Writes `v` to `*out`.
///
/// # Safety
/// `out` is NULL or valid for writing one `T`.
pub(crate) unsafe fn put<T>(out: *mut T, v: T) -> Result<()> {
    if out.is_null() {
        return Err(Error::Arg("NULL output argument".into()));
    }
    // SAFETY: not NULL, writable per the contract.
    unsafe { out.write_unaligned(v) };
    Ok(())
}

/// Whether errors on communicator `h` end the job.
fn fatal(h: i32) -> bool {
    lock()
        .as_ref()
        .and_then(|s| {
            let world = s.comms.get(1).and_then(Option::as_ref).map(|c| c.fatal);
            usize::try_from(h)
                .ok()
                .and_then(|i| s.comms.get(i))
                .and_then(Option::as_ref)
                .map(|c| c.fatal)
                .or(world)
        })
        .unwrap_or(true)
}

/// Applies communicator `h`'s error handler to the outcome of `name`
/// (after a call that did not simply succeed: [`mpi_call`] returns 0
/// for those itself).
#[cold]
#[inline(never)]
pub(crate) fn finish(name: &str, h: i32, r: std::thread::Result<Result<()>>) -> i32 {
    let e = match r {
        Ok(Ok(())) => return 0,
        Ok(Err(e)) => e,
        Err(p) => {
            let msg = p
                .downcast_ref::<&str>()
                .copied()
                .or_else(|| p.downcast_ref::<String>().map(String::as_str))
                .unwrap_or("(no message)");
            Error::Intern(format!("panic: {msg}"))
        }
    };
    let code = e.code();
    if !fatal(h) {
        log::debug!("{name}: {e}");
        return code;
    }
    log::error!("{name}: {e} (error class {code}); MPI_ERRORS_ARE_FATAL ends the job");
    let world = job();
    match world {
        Some(w) => w.abort(code, &format!("{name}: {e}")),
        None => std::process::exit(code),
    }
}

/// The body of an export: a block evaluating to `Result<()>`, its errors
/// handled by communicator `$comm`'s error handler, panics caught.
macro_rules! mpi_call {
    ($name:literal, $comm:expr, $body:block) => {{
        let r = ::std::panic::catch_unwind(::std::panic::AssertUnwindSafe(
            || -> $crate::error::Result<()> { $body },
        ));
        match r {
            Ok(Ok(())) => 0,
            r => $crate::ffi::state::finish($name, $comm, r),
        }
    }};
}
pub(crate) use mpi_call;

/// Logs to stderr for C programs (no Rust logger): `VMPI_LOG` or
/// `RUST_LOG` as a level, else warnings.
struct StderrLogger;

impl log::Log for StderrLogger {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::max_level()
    }
    fn log(&self, r: &log::Record<'_>) {
        if self.enabled(r.metadata()) {
            eprintln!("vmpi[{}] {}: {}", std::process::id(), r.level(), r.args());
        }
    }
    fn flush(&self) {}
}

/// Installs the stderr logger once unless the process has one.
pub(crate) fn init_logging() {
    static LOGGER: StderrLogger = StderrLogger;
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if log::set_logger(&LOGGER).is_ok() {
            let level = ["VMPI_LOG", "RUST_LOG"]
                .iter()
                .find_map(|k| {
                    std::env::var(k)
                        .ok()?
                        .trim()
                        .parse::<log::LevelFilter>()
                        .ok()
                })
                .unwrap_or(log::LevelFilter::Warn);
            log::set_max_level(level);
        }
    });
}
