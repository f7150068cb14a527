//! Point to point: `MPI_Send`, `MPI_Recv`, `MPI_Sendrecv`, `MPI_Isend`,
//! `MPI_Irecv`, `MPI_Wait`, `MPI_Waitall`, `MPI_Test`, `MPI_Probe`,
//! `MPI_Iprobe`, `MPI_Get_count`.

use std::ffi::{c_int, c_void};

use crate::buffer::UserBuf;
use crate::comm::Comm;
use crate::engine::Status;
use crate::error::{Error, Result};
use crate::ffi::state::{
    self, ANY, CReq, MPI_Status, PROC_NULL, UNDEFINED, mpi_call, put, put_status,
};

fn source_of(s: c_int) -> Option<i32> {
    (s != ANY).then_some(s)
}

fn tag_of(t: c_int) -> Option<i32> {
    (t != ANY).then_some(t)
}

fn null_status() -> Status {
    Status {
        source: PROC_NULL,
        tag: ANY,
        bytes: 0,
    }
}

/// Waits for request `id` of `c` and reports it in `status`.
///
/// # Safety
/// `status` is NULL or writable.
unsafe fn finish_req(c: &Comm, id: u64, status: *mut MPI_Status) -> Result<()> {
    let (st, _, err) = c.engine().wait(id)?;
    // SAFETY: the caller's contract.
    unsafe { put_status(status, &st, err.as_ref().map_or(0, Error::code)) };
    err.map_or(Ok(()), Err)
}

/// Sends `count` elements (blocking: returns when `buf` may be reused).
/// Errors: `MPI_ERR_COMM`, `MPI_ERR_TYPE`, `MPI_ERR_COUNT`, `MPI_ERR_RANK`,
/// `MPI_ERR_TAG`, `MPI_ERR_BUFFER`, `MPI_ERR_OTHER`.
///
/// # Safety
/// `buf` holds `count` elements of `datatype`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn MPI_Send(
    buf: *const c_void,
    count: c_int,
    datatype: c_int,
    dest: c_int,
    tag: c_int,
    comm: c_int,
) -> c_int {
    mpi_call!("MPI_Send", comm, {
        state::with_comm(comm, |c| {
            let n = state::bytes(count, state::datatype(datatype)?)?;
            if dest == PROC_NULL {
                return Ok(());
            }
            // SAFETY: the caller's contract; the call waits for completion.
            let b = unsafe { state::slice(buf, n) }?;
            c.send_bytes(b, dest, tag)
        })
    })
}

/// Receives up to `count` elements (blocking). A longer message gives
/// `MPI_ERR_TRUNCATE` (the buffer holds its first bytes). Errors also as
/// `MPI_Send`.
///
/// # Safety
/// `buf` has room for `count` elements; `status` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn MPI_Recv(
    buf: *mut c_void,
    count: c_int,
    datatype: c_int,
    source: c_int,
    tag: c_int,
    comm: c_int,
    status: *mut MPI_Status,
) -> c_int {
    mpi_call!("MPI_Recv", comm, {
        state::with_comm(comm, |c| {
            let n = state::bytes(count, state::datatype(datatype)?)?;
            if source == PROC_NULL {
                // SAFETY: the caller's contract.
                unsafe { put_status(status, &null_status(), 0) };
                return Ok(());
            }
            // SAFETY: the caller's contract; checked for NULL; the call
            // waits for completion.
            let b = unsafe { state::slice_mut(buf, n) }?;
            let (st, err) = c.recv_status(b, source_of(source), tag_of(tag))?;
            // SAFETY: the caller's contract.
            unsafe { put_status(status, &st, err.as_ref().map_or(0, Error::code)) };
            err.map_or(Ok(()), Err)
        })
    })
}

/// Sends and receives at once.
///
/// # Safety
/// As `MPI_Send` and `MPI_Recv`; the buffers do not overlap.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn MPI_Sendrecv(
    sendbuf: *const c_void,
    sendcount: c_int,
    sendtype: c_int,
    dest: c_int,
    sendtag: c_int,
    recvbuf: *mut c_void,
    recvcount: c_int,
    recvtype: c_int,
    source: c_int,
    recvtag: c_int,
    comm: c_int,
    status: *mut MPI_Status,
) -> c_int {
    mpi_call!("MPI_Sendrecv", comm, {
        let c = state::comm(comm)?;
        let sn = state::bytes(sendcount, state::datatype(sendtype)?)?;
        let rn = state::bytes(recvcount, state::datatype(recvtype)?)?;
        state::disjoint(sendbuf, sn, recvbuf, rn)?;
        // SAFETY: the caller's contract; checked for NULL.
        unsafe { (state::slice(sendbuf, sn)?, state::slice_mut(recvbuf, rn)?) };
        let r = if source == PROC_NULL {
            None
        } else {
            // SAFETY: valid (above); waited for below.
            Some(c.irecv_buf(
                unsafe { UserBuf::raw(recvbuf as usize, rn) },
                source_of(source),
                tag_of(recvtag),
            )?)
        };
        let s = if dest == PROC_NULL {
            None
        } else {
            // SAFETY: valid (above); waited for below.
            Some(c.isend_buf(unsafe { UserBuf::raw(sendbuf as usize, sn) }, dest, sendtag)?)
        };
        if let Some(s) = s {
            c.engine().wait(s)?;
        }
        match r {
            // SAFETY: the caller's contract.
            Some(r) => unsafe { finish_req(&c, r, status) },
            None => {
                // SAFETY: the caller's contract.
                unsafe { put_status(status, &null_status(), 0) };
                Ok(())
            }
        }
    })
}

fn add_req(r: CReq) -> Result<c_int> {
    state::with(|s| {
        let h = s.next_req;
        s.next_req = if s.next_req == i32::MAX {
            1
        } else {
            s.next_req + 1
        };
        s.reqs.insert(h, r);
        Ok(h)
    })
}

/// Starts a send; `*request` names it until `MPI_Wait`/`MPI_Test`.
///
/// # Safety
/// `buf` holds `count` elements and is not modified until the request
/// completes; `request` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn MPI_Isend(
    buf: *const c_void,
    count: c_int,
    datatype: c_int,
    dest: c_int,
    tag: c_int,
    comm: c_int,
    request: *mut c_int,
) -> c_int {
    mpi_call!("MPI_Isend", comm, {
        let c = state::comm(comm)?;
        let n = state::bytes(count, state::datatype(datatype)?)?;
        if request.is_null() {
            return Err(Error::Request);
        }
        // SAFETY: checked for NULL.
        unsafe { state::slice(buf, n) }?;
        let r = if dest == PROC_NULL {
            CReq::Null
        } else {
            // SAFETY: the caller's contract: valid until the request completes.
            let id = c.isend_buf(unsafe { UserBuf::raw(buf as usize, n) }, dest, tag)?;
            CReq::Live(c, id)
        };
        // SAFETY: the caller's contract.
        unsafe { put(request, add_req(r)?) }
    })
}

/// Starts a receive.
///
/// # Safety
/// `buf` has room for `count` elements and is not accessed until the
/// request completes; `request` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn MPI_Irecv(
    buf: *mut c_void,
    count: c_int,
    datatype: c_int,
    source: c_int,
    tag: c_int,
    comm: c_int,
    request: *mut c_int,
) -> c_int {
    mpi_call!("MPI_Irecv", comm, {
        let c = state::comm(comm)?;
        let n = state::bytes(count, state::datatype(datatype)?)?;
        if request.is_null() {
            return Err(Error::Request);
        }
        // SAFETY: checked for NULL.
        unsafe { state::slice_mut(buf, n) }?;
        let r = if source == PROC_NULL {
            CReq::Null
        } else {
            // SAFETY: the caller's contract: valid until the request completes.
            let id = c.irecv_buf(
                unsafe { UserBuf::raw(buf as usize, n) },
                source_of(source),
                tag_of(tag),
            )?;
            CReq::Live(c, id)
        };
        // SAFETY: the caller's contract.
        unsafe { put(request, add_req(r)?) }
    })
}

/// Completes `*request` (waiting if `block`); whether it completed.
///
/// # Safety
/// `request` readable and writable; `status` NULL or writable.
unsafe fn complete(request: *mut c_int, status: *mut MPI_Status, block: bool) -> Result<bool> {
    if request.is_null() {
        return Err(Error::Request);
    }
    // SAFETY: not NULL, readable per the contract.
    let h = unsafe { request.read_unaligned() };
    if h == 0 {
        // SAFETY: the caller's contract.
        unsafe { put_status(status, &null_status(), 0) };
        return Ok(true);
    }
    let r = state::with(|s| s.reqs.remove(&h).ok_or(Error::Request))?;
    match r {
        CReq::Null => {
            // SAFETY: the caller's contract.
            unsafe { put_status(status, &null_status(), 0) };
        }
        CReq::Live(c, id) => {
            if !block && !c.engine().test_done(id)? {
                state::with(|s| {
                    s.reqs.insert(h, CReq::Live(c.clone(), id));
                    Ok(())
                })?;
                return Ok(false);
            }
            // SAFETY: not NULL, writable per the contract.
            unsafe { request.write_unaligned(0) };
            // SAFETY: the caller's contract.
            unsafe { finish_req(&c, id, status) }?;
            return Ok(true);
        }
    }
    // SAFETY: not NULL, writable per the contract.
    unsafe { request.write_unaligned(0) };
    Ok(true)
}

/// Waits for a request; `*request` becomes `MPI_REQUEST_NULL`.
///
/// # Safety
/// `request` readable and writable; `status` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn MPI_Wait(request: *mut c_int, status: *mut MPI_Status) -> c_int {
    mpi_call!("MPI_Wait", 1, {
        // SAFETY: the caller's contract.
        unsafe { complete(request, status, true) }.map(|_| ())
    })
}

/// Whether a request is complete (`*flag`); if so as `MPI_Wait`.
///
/// # Safety
/// `request` readable and writable; `flag` writable; `status` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn MPI_Test(
    request: *mut c_int,
    flag: *mut c_int,
    status: *mut MPI_Status,
) -> c_int {
    mpi_call!("MPI_Test", 1, {
        if flag.is_null() {
            return Err(Error::Arg("NULL flag".into()));
        }
        // SAFETY: the caller's contract.
        let done = unsafe { complete(request, status, false) }?;
        // SAFETY: the caller's contract.
        unsafe { put(flag, done as c_int) }
    })
}

/// Waits for every request. If any fails: `MPI_ERR_IN_STATUS`, with each
/// status's `MPI_ERROR` set.
///
/// # Safety
/// `requests` holds `count` handles; `statuses` is NULL or holds `count`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn MPI_Waitall(
    count: c_int,
    requests: *mut c_int,
    statuses: *mut MPI_Status,
) -> c_int {
    mpi_call!("MPI_Waitall", 1, {
        if count < 0 || (count > 0 && requests.is_null()) {
            return Err(Error::Arg("bad request array".into()));
        }
        let mut failed = false;
        for i in 0..count as usize {
            // SAFETY: `count` entries per the contract.
            let (rq, st) = unsafe {
                (
                    requests.add(i),
                    if statuses.is_null() {
                        statuses
                    } else {
                        statuses.add(i)
                    },
                )
            };
            // SAFETY: the caller's contract.
            match unsafe { complete(rq, st, true) } {
                Ok(_) => {}
                Err(Error::Truncate { .. }) if !st.is_null() => failed = true,
                Err(e) => return Err(e),
            }
        }
        if failed { Err(Error::InStatus) } else { Ok(()) }
    })
}

/// Waits for a matching message and reports it without receiving it.
///
/// # Safety
/// `status` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn MPI_Probe(
    source: c_int,
    tag: c_int,
    comm: c_int,
    status: *mut MPI_Status,
) -> c_int {
    mpi_call!("MPI_Probe", comm, {
        let c = state::comm(comm)?;
        let st = if source == PROC_NULL {
            null_status()
        } else {
            c.probe(source_of(source), tag_of(tag))?
        };
        // SAFETY: the caller's contract.
        unsafe { put_status(status, &st, 0) };
        Ok(())
    })
}

/// Whether a matching message is there (`*flag`), and its status.
///
/// # Safety
/// `flag` writable; `status` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn MPI_Iprobe(
    source: c_int,
    tag: c_int,
    comm: c_int,
    flag: *mut c_int,
    status: *mut MPI_Status,
) -> c_int {
    mpi_call!("MPI_Iprobe", comm, {
        let c = state::comm(comm)?;
        let st = if source == PROC_NULL {
            Some(null_status())
        } else {
            c.iprobe(source_of(source), tag_of(tag))?
        };
        if let Some(st) = &st {
            // SAFETY: the caller's contract.
            unsafe { put_status(status, st, 0) };
        }
        // SAFETY: the caller's contract.
        unsafe { put(flag, st.is_some() as c_int) }
    })
}

/// Elements received (`MPI_UNDEFINED` if the bytes are not whole elements).
///
/// # Safety
/// `status` readable; `count` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn MPI_Get_count(
    status: *const MPI_Status,
    datatype: c_int,
    count: *mut c_int,
) -> c_int {
    mpi_call!("MPI_Get_count", 1, {
        if status.is_null() {
            return Err(Error::Arg("NULL status".into()));
        }
        let dt = state::datatype(datatype)?;
        // SAFETY: not NULL, readable per the contract.
        let b = unsafe { status.read_unaligned() }.vmpi_bytes as usize;
        let n = if b % dt.size == 0 {
            (b / dt.size) as c_int
        } else {
            UNDEFINED
        };
        // SAFETY: the caller's contract.
        unsafe { put(count, n) }
    })
}
