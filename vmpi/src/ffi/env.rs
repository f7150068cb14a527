//! Environment and communicators: `MPI_Init`, `MPI_Finalize`, `MPI_Abort`,
//! errors and error handlers, `MPI_Comm_*`, `MPI_Wtime`.

use std::ffi::{c_char, c_int};

use crate::error::{Error, class_string};
use crate::ffi::state::{self, CComm, ERRORS_ARE_FATAL, ERRORS_RETURN, State, mpi_call, put};
use crate::world::World;

/// Initialises the library (connects to the launcher and every process).
///
/// Returns `MPI_SUCCESS`; `MPI_ERR_OTHER` if called twice or after
/// `MPI_Finalize`, or if the launcher or the provider fails.
///
/// # Safety
/// `argc` and `argv` are ignored (may be NULL).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn MPI_Init(_argc: *mut c_int, _argv: *mut *mut *mut c_char) -> c_int {
    state::init_logging();
    mpi_call!("MPI_Init", 1, {
        let mut g = state::lock();
        if g.is_some() || state::FINALIZED.load(std::sync::atomic::Ordering::Acquire) {
            return Err(Error::Transport("MPI_Init called twice".into()));
        }
        let world = World::init()?;
        let comm = world.comm();
        let me = world.comm_self();
        *state::JOB.lock().unwrap_or_else(|e| e.into_inner()) = Some(world.clone());
        state::INITIALIZED.store(true, std::sync::atomic::Ordering::Release);
        *g = Some(State {
            world,
            comms: vec![
                None,
                Some(CComm { comm, fatal: true }),
                Some(CComm {
                    comm: me,
                    fatal: true,
                }),
            ],
            reqs: Default::default(),
            next_req: 1,
            ops: Vec::new(),
        });
        Ok(())
    })
}

/// `MPI_Init`; `*provided` is `MPI_THREAD_SINGLE`... up to `FUNNELED`
/// (calls from one thread at a time are safe; `MULTIPLE` is not offered).
///
/// # Safety
/// `provided` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn MPI_Init_thread(
    argc: *mut c_int,
    argv: *mut *mut *mut c_char,
    required: c_int,
    provided: *mut c_int,
) -> c_int {
    // SAFETY: forwarded contract.
    let r = unsafe { MPI_Init(argc, argv) };
    if r == 0 && !provided.is_null() {
        // SAFETY: not NULL, writable per the contract.
        unsafe { provided.write_unaligned(required.clamp(0, 2)) };
    }
    r
}

/// `*flag` = whether `MPI_Init` was called.
///
/// # Safety
/// `flag` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn MPI_Initialized(flag: *mut c_int) -> c_int {
    // Not the state's lock: another thread's blocking call may hold it.
    let v = state::INITIALIZED.load(std::sync::atomic::Ordering::Acquire);
    // SAFETY: the caller's contract.
    mpi_call!("MPI_Initialized", 1, { unsafe { put(flag, v as c_int) } })
}

/// `*flag` = whether `MPI_Finalize` was called.
///
/// # Safety
/// `flag` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn MPI_Finalized(flag: *mut c_int) -> c_int {
    let v = state::FINALIZED.load(std::sync::atomic::Ordering::Acquire);
    // SAFETY: the caller's contract.
    unsafe { put(flag, v as c_int) }.map_or(13, |_| 0)
}

/// Waits for every process, then disconnects. Returns `MPI_SUCCESS`.
///
/// # Safety
/// No MPI call may follow (except `MPI_Initialized`/`MPI_Finalized`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn MPI_Finalize() -> c_int {
    mpi_call!("MPI_Finalize", 1, {
        let s = state::lock()
            .take()
            .ok_or_else(|| Error::Intern("MPI_Finalize without MPI_Init".into()))?;
        state::FINALIZED.store(true, std::sync::atomic::Ordering::Release);
        state::JOB.lock().unwrap_or_else(|e| e.into_inner()).take();
        drop(s.comms);
        drop(s.reqs);
        s.world.finalize()
    })
}

/// Ends the job: every process is killed, the launcher exits with
/// `errorcode`. Does not return.
///
/// # Safety
/// None.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn MPI_Abort(_comm: c_int, errorcode: c_int) -> c_int {
    // Not the state's lock: this thread may abort while another blocks
    // in a call that holds it.
    let world = state::job();
    match world {
        Some(w) => w.abort(errorcode, "MPI_Abort"),
        None => std::process::exit(errorcode),
    }
}

/// Seconds since an arbitrary time in the past.
///
/// # Safety
/// None.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn MPI_Wtime() -> f64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_secs_f64()
}

/// Resolution of `MPI_Wtime` (1 ns).
///
/// # Safety
/// None.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn MPI_Wtick() -> f64 {
    1e-9
}

/// Copies text (NUL-terminated, at most 255 bytes) into `out`.
///
/// # Safety
/// `out` has room for `MPI_MAX_*` (256) bytes; `len` is writable.
unsafe fn put_text(out: *mut c_char, len: *mut c_int, text: &str) -> crate::error::Result<()> {
    if out.is_null() {
        return Err(Error::Arg("NULL string".into()));
    }
    let b = &text.as_bytes()[..text.len().min(255)];
    // SAFETY: room for 256 bytes per the contract; b.len() + 1 <= 256.
    unsafe {
        std::ptr::copy_nonoverlapping(b.as_ptr(), out.cast::<u8>(), b.len());
        *out.add(b.len()) = 0;
        put(len, b.len() as c_int)
    }
}

/// The host's name.
///
/// # Safety
/// `name` has room for `MPI_MAX_PROCESSOR_NAME` bytes; `resultlen` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn MPI_Get_processor_name(name: *mut c_char, resultlen: *mut c_int) -> c_int {
    mpi_call!("MPI_Get_processor_name", 1, {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .unwrap_or_else(|_| "localhost".into());
        // SAFETY: the caller's contract.
        unsafe { put_text(name, resultlen, host.trim()) }
    })
}

/// The text of an error class.
///
/// # Safety
/// `string` has room for `MPI_MAX_ERROR_STRING` bytes; `resultlen` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn MPI_Error_string(
    errorcode: c_int,
    string: *mut c_char,
    resultlen: *mut c_int,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { put_text(string, resultlen, class_string(errorcode)) }.map_or(13, |_| 0)
}

/// The class of an error code (codes are classes here).
///
/// # Safety
/// `errorclass` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn MPI_Error_class(errorcode: c_int, errorclass: *mut c_int) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { put(errorclass, errorcode) }.map_or(13, |_| 0)
}

/// Sets a communicator's error handler (`MPI_ERRORS_ARE_FATAL` or
/// `MPI_ERRORS_RETURN`). Returns `MPI_ERR_COMM`, `MPI_ERR_ARG`.
///
/// # Safety
/// None.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn MPI_Comm_set_errhandler(comm: c_int, errhandler: c_int) -> c_int {
    mpi_call!("MPI_Comm_set_errhandler", comm, {
        let fatal = match errhandler {
            ERRORS_ARE_FATAL => true,
            ERRORS_RETURN => false,
            _ => return Err(Error::Arg(format!("unknown error handler {errhandler}"))),
        };
        state::with(|s| {
            let c = usize::try_from(comm)
                .ok()
                .and_then(|i| s.comms.get_mut(i))
                .and_then(Option::as_mut)
                .ok_or(Error::Comm)?;
            c.fatal = fatal;
            Ok(())
        })
    })
}

/// A communicator's error handler.
///
/// # Safety
/// `errhandler` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn MPI_Comm_get_errhandler(comm: c_int, errhandler: *mut c_int) -> c_int {
    mpi_call!("MPI_Comm_get_errhandler", comm, {
        let fatal = state::with(|s| {
            usize::try_from(comm)
                .ok()
                .and_then(|i| s.comms.get(i))
                .and_then(Option::as_ref)
                .map(|c| c.fatal)
                .ok_or(Error::Comm)
        })?;
        // SAFETY: the caller's contract.
        unsafe {
            put(
                errhandler,
                if fatal {
                    ERRORS_ARE_FATAL
                } else {
                    ERRORS_RETURN
                },
            )
        }
    })
}

/// Bytes of one element of a datatype.
///
/// # Safety
/// `size` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn MPI_Type_size(datatype: c_int, size: *mut c_int) -> c_int {
    mpi_call!("MPI_Type_size", 1, {
        let dt = state::datatype(datatype)?;
        // SAFETY: the caller's contract.
        unsafe { put(size, dt.size as c_int) }
    })
}

/// This process's rank in `comm`.
///
/// # Safety
/// `rank` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn MPI_Comm_rank(comm: c_int, rank: *mut c_int) -> c_int {
    mpi_call!("MPI_Comm_rank", comm, {
        let c = state::comm(comm)?;
        // SAFETY: the caller's contract.
        unsafe { put(rank, c.rank()) }
    })
}

/// Members of `comm`.
///
/// # Safety
/// `size` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn MPI_Comm_size(comm: c_int, size: *mut c_int) -> c_int {
    mpi_call!("MPI_Comm_size", comm, {
        let c = state::comm(comm)?;
        // SAFETY: the caller's contract.
        unsafe { put(size, c.size()) }
    })
}

fn add_comm(c: crate::comm::Comm, fatal: bool) -> crate::error::Result<c_int> {
    state::with(|s| {
        s.comms.push(Some(CComm { comm: c, fatal }));
        Ok(s.comms.len() as c_int - 1)
    })
}

fn is_fatal(comm: c_int) -> bool {
    state::with(|s| {
        Ok(s.comms
            .get(comm as usize)
            .and_then(Option::as_ref)
            .is_none_or(|c| c.fatal))
    })
    .unwrap_or(true)
}

/// Duplicates a communicator (collective).
///
/// # Safety
/// `newcomm` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn MPI_Comm_dup(comm: c_int, newcomm: *mut c_int) -> c_int {
    mpi_call!("MPI_Comm_dup", comm, {
        if newcomm.is_null() {
            return Err(Error::Arg("NULL newcomm".into()));
        }
        let c = state::comm(comm)?.dup()?;
        let h = add_comm(c, is_fatal(comm))?;
        // SAFETY: the caller's contract.
        unsafe { put(newcomm, h) }
    })
}

/// Splits a communicator by color and key (collective); a color of
/// `MPI_UNDEFINED` gives `MPI_COMM_NULL`.
///
/// # Safety
/// `newcomm` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn MPI_Comm_split(
    comm: c_int,
    color: c_int,
    key: c_int,
    newcomm: *mut c_int,
) -> c_int {
    mpi_call!("MPI_Comm_split", comm, {
        if newcomm.is_null() {
            return Err(Error::Arg("NULL newcomm".into()));
        }
        if color < 0 && color != state::UNDEFINED {
            return Err(Error::Arg(format!("negative color {color}")));
        }
        let c = state::comm(comm)?.split(color, key)?;
        let h = match c {
            Some(c) => add_comm(c, is_fatal(comm))?,
            None => 0,
        };
        // SAFETY: the caller's contract.
        unsafe { put(newcomm, h) }
    })
}

/// Frees a communicator; `*comm` becomes `MPI_COMM_NULL`.
///
/// # Safety
/// `comm` is readable and writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn MPI_Comm_free(comm: *mut c_int) -> c_int {
    // SAFETY: checked for NULL; readable per the contract.
    let h = if comm.is_null() {
        0
    } else {
        // SAFETY: not NULL, readable per the contract.
        unsafe { comm.read_unaligned() }
    };
    mpi_call!("MPI_Comm_free", h, {
        if h <= 2 {
            return Err(Error::Comm);
        }
        state::with(|s| {
            let slot = s
                .comms
                .get_mut(h as usize)
                .filter(|c| c.is_some())
                .ok_or(Error::Comm)?;
            *slot = None;
            Ok(())
        })?;
        // SAFETY: the caller's contract.
        unsafe { put(comm, 0) }
    })
}
