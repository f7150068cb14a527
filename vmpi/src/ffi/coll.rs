//! Collectives: `MPI_Barrier`, `MPI_Bcast`, `MPI_Reduce`, `MPI_Allreduce`,
//! `MPI_Scan`, `MPI_Reduce_scatter`, `MPI_Allgather`, `MPI_Alltoall`, and
//! user operations (`MPI_Op_create`, `MPI_Op_free`). `MPI_IN_PLACE` is
//! accepted where MPI allows it (reduce at the root, allreduce, scan,
//! allgather). Buffers that overlap otherwise give `MPI_ERR_BUFFER`.

use std::ffi::{c_int, c_void};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::ffi::state::{self, mpi_call, put};
use crate::op::Op;

fn in_place(p: *const c_void) -> bool {
    p as usize == 1
}

/// Blocks until every member of `comm` has called it.
///
/// # Safety
/// None.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn MPI_Barrier(comm: c_int) -> c_int {
    mpi_call!("MPI_Barrier", comm, { state::comm(comm)?.barrier() })
}

/// Broadcasts `count` elements from `root`.
///
/// # Safety
/// `buffer` holds `count` elements.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn MPI_Bcast(
    buffer: *mut c_void,
    count: c_int,
    datatype: c_int,
    root: c_int,
    comm: c_int,
) -> c_int {
    mpi_call!("MPI_Bcast", comm, {
        let c = state::comm(comm)?;
        let n = state::bytes(count, state::datatype(datatype)?)?;
        // SAFETY: the caller's contract; blocking call.
        let b = unsafe { state::slice_mut(buffer, n) }?;
        c.bcast_bytes(b, root)
    })
}

/// The send data of a reduction: `sendbuf`, or a copy of `recvbuf` for
/// `MPI_IN_PLACE`.
///
/// # Safety
/// As the collective's contract.
unsafe fn send_data(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    n: usize,
    owned: &mut Vec<u8>,
) -> Result<&[u8]> {
    if in_place(sendbuf) {
        // SAFETY: the caller's contract for `recvbuf`.
        *owned = unsafe { state::slice(recvbuf, n) }?.to_vec();
        return Ok(owned);
    }
    state::disjoint(sendbuf, n, recvbuf, n)?;
    // SAFETY: the caller's contract.
    unsafe { state::slice(sendbuf, n) }
}

/// The operands of a reduction whose result lands in `recvbuf`: the send
/// data ([`send_data`]) and the receive buffer, disjoint (checked, or the
/// send data is a copy).
///
/// # Safety
/// As the collective's contract.
#[inline(always)]
unsafe fn operands(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    n: usize,
    owned: &mut Vec<u8>,
) -> Result<(&[u8], &mut [u8])> {
    // SAFETY: the caller's contract.
    let s = unsafe { send_data(sendbuf, recvbuf, n, owned) }?;
    // SAFETY: the caller's contract; disjoint from `s` (checked or a copy).
    let r = unsafe { state::slice_mut(recvbuf, n) }?;
    Ok((s, r))
}

/// Reduces to `root`.
///
/// # Safety
/// `sendbuf` holds `count` elements (or is `MPI_IN_PLACE` at the root);
/// `recvbuf` has room for them at the root.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn MPI_Reduce(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: c_int,
    datatype: c_int,
    op: c_int,
    root: c_int,
    comm: c_int,
) -> c_int {
    mpi_call!("MPI_Reduce", comm, {
        let c = state::comm(comm)?;
        let dt = state::datatype(datatype)?;
        let n = state::bytes(count, dt)?;
        let o = state::op(op)?;
        let mut owned = Vec::new();
        if c.rank() == root {
            // SAFETY: the caller's contract.
            let (s, r) = unsafe { operands(sendbuf, recvbuf, n, &mut owned) }?;
            c.reduce_bytes(s, Some(r), dt, &o, root)
        } else {
            // SAFETY: the caller's contract.
            let s = unsafe { state::slice(sendbuf, n) }?;
            c.reduce_bytes(s, None, dt, &o, root)
        }
    })
}

/// Reduces and gives the result to every member.
///
/// # Safety
/// `sendbuf` holds `count` elements (or is `MPI_IN_PLACE`); `recvbuf` has
/// room for them.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn MPI_Allreduce(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: c_int,
    datatype: c_int,
    op: c_int,
    comm: c_int,
) -> c_int {
    mpi_call!("MPI_Allreduce", comm, {
        let run = |c: &crate::comm::Comm| {
            let dt = state::datatype(datatype)?;
            let n = state::bytes(count, dt)?;
            let o = state::op(op)?;
            let mut owned = Vec::new();
            // SAFETY: the caller's contract.
            let (s, r) = unsafe { operands(sendbuf, recvbuf, n, &mut owned) }?;
            c.allreduce_bytes(s, r, dt, &o)
        };
        if state::is_builtin_op(op) {
            // No user function runs: the communicator is borrowed.
            state::with_comm(comm, run)
        } else {
            run(&state::comm(comm)?)
        }
    })
}

/// Inclusive prefix reduction.
///
/// # Safety
/// As `MPI_Allreduce`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn MPI_Scan(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: c_int,
    datatype: c_int,
    op: c_int,
    comm: c_int,
) -> c_int {
    mpi_call!("MPI_Scan", comm, {
        let c = state::comm(comm)?;
        let dt = state::datatype(datatype)?;
        let n = state::bytes(count, dt)?;
        let o = state::op(op)?;
        let mut owned = Vec::new();
        // SAFETY: the caller's contract.
        let (s, r) = unsafe { operands(sendbuf, recvbuf, n, &mut owned) }?;
        c.scan_bytes(s, r, dt, &o)
    })
}

/// Reduces `sum(recvcounts)` elements and scatters `recvcounts[i]` to member `i`.
///
/// # Safety
/// `recvcounts` has one entry per member; the buffers hold the counts.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn MPI_Reduce_scatter(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    recvcounts: *const c_int,
    datatype: c_int,
    op: c_int,
    comm: c_int,
) -> c_int {
    mpi_call!("MPI_Reduce_scatter", comm, {
        let c = state::comm(comm)?;
        let dt = state::datatype(datatype)?;
        let o = state::op(op)?;
        if recvcounts.is_null() {
            return Err(Error::Count("NULL recvcounts".into()));
        }
        // SAFETY: one entry per member per the contract.
        let counts = unsafe { std::slice::from_raw_parts(recvcounts, c.size() as usize) };
        if counts.iter().any(|&x| x < 0) {
            return Err(Error::Count("negative count".into()));
        }
        let total: usize = counts.iter().map(|&x| x as usize).sum::<usize>() * dt.size;
        let mine = counts[c.rank() as usize] as usize * dt.size;
        let owned: Vec<u8>;
        let s = if in_place(sendbuf) {
            // SAFETY: in place, `recvbuf` holds the whole vector.
            owned = unsafe { state::slice(recvbuf, total) }?.to_vec();
            &owned[..]
        } else {
            state::disjoint(sendbuf, total, recvbuf, mine)?;
            // SAFETY: the caller's contract.
            unsafe { state::slice(sendbuf, total) }?
        };
        // SAFETY: the caller's contract; disjoint from `s`.
        let r = unsafe { state::slice_mut(recvbuf, mine) }?;
        c.reduce_scatter_bytes(s, r, counts, dt, &o)
    })
}

/// Gathers `sendcount` elements of every member at every member.
///
/// # Safety
/// The buffers hold the counts; `recvbuf` has room for `size` blocks.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn MPI_Allgather(
    sendbuf: *const c_void,
    sendcount: c_int,
    sendtype: c_int,
    recvbuf: *mut c_void,
    recvcount: c_int,
    recvtype: c_int,
    comm: c_int,
) -> c_int {
    mpi_call!("MPI_Allgather", comm, {
        let c = state::comm(comm)?;
        let rn = state::bytes(recvcount, state::datatype(recvtype)?)?;
        let total = rn * c.size() as usize;
        let owned: Vec<u8>;
        let s = if in_place(sendbuf) {
            // SAFETY: in place: this member's block of `recvbuf`.
            owned = unsafe {
                state::slice(
                    (recvbuf as usize + rn * c.rank() as usize) as *const c_void,
                    rn,
                )
            }?
            .to_vec();
            &owned[..]
        } else {
            let sn = state::bytes(sendcount, state::datatype(sendtype)?)?;
            if sn != rn {
                return Err(Error::Count(format!(
                    "sending {sn} bytes per member, receiving {rn}"
                )));
            }
            state::disjoint(sendbuf, sn, recvbuf, total)?;
            // SAFETY: the caller's contract.
            unsafe { state::slice(sendbuf, sn) }?
        };
        // SAFETY: the caller's contract; disjoint from `s`.
        let r = unsafe { state::slice_mut(recvbuf, total) }?;
        c.allgather_bytes(s, r)
    })
}

/// Sends block `i` to member `i`, receives block `j` from member `j`.
///
/// # Safety
/// Each buffer holds `size` blocks of its count.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn MPI_Alltoall(
    sendbuf: *const c_void,
    sendcount: c_int,
    sendtype: c_int,
    recvbuf: *mut c_void,
    recvcount: c_int,
    recvtype: c_int,
    comm: c_int,
) -> c_int {
    mpi_call!("MPI_Alltoall", comm, {
        let c = state::comm(comm)?;
        let p = c.size() as usize;
        let rn = state::bytes(recvcount, state::datatype(recvtype)?)? * p;
        let owned: Vec<u8>;
        let s = if in_place(sendbuf) {
            // SAFETY: in place: `recvbuf` holds the data.
            owned = unsafe { state::slice(recvbuf, rn) }?.to_vec();
            &owned[..]
        } else {
            let sn = state::bytes(sendcount, state::datatype(sendtype)?)? * p;
            if sn != rn {
                return Err(Error::Count(format!("sending {sn} bytes, receiving {rn}")));
            }
            state::disjoint(sendbuf, sn, recvbuf, rn)?;
            // SAFETY: the caller's contract.
            unsafe { state::slice(sendbuf, sn) }?
        };
        // SAFETY: the caller's contract; disjoint from `s`.
        let r = unsafe { state::slice_mut(recvbuf, rn) }?;
        c.alltoall_bytes(s, r)
    })
}

/// A C user function, callable from the library.
#[derive(Clone, Copy)]
struct CFunction(unsafe extern "C" fn(*mut c_void, *mut c_void, *mut c_int, *mut c_int));

/// Creates a user operation (`commute` non-zero: commutative).
///
/// # Safety
/// `function` computes `inoutvec[i] = invec[i] op inoutvec[i]` for `*len`
/// elements of `*datatype` and may be called from any MPI call of this
/// process; `op` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn MPI_Op_create(
    function: Option<unsafe extern "C" fn(*mut c_void, *mut c_void, *mut c_int, *mut c_int)>,
    commute: c_int,
    op: *mut c_int,
) -> c_int {
    mpi_call!("MPI_Op_create", 1, {
        let f = CFunction(function.ok_or_else(|| Error::Arg("NULL function".into()))?);
        let o = Op::User {
            f: Arc::new(move |input: &[u8], inout: &mut [u8], dt| {
                let mut len = (input.len() / dt.size) as c_int;
                let mut id = dt.id;
                let f = f;
                // SAFETY: the C function's contract (MPI_Op_create's):
                // `input` and `inout` hold `len` elements of `dt`; `input`
                // is not written (MPI's invec is read-only in practice).
                unsafe {
                    (f.0)(
                        input.as_ptr() as *mut c_void,
                        inout.as_mut_ptr().cast(),
                        &mut len,
                        &mut id,
                    )
                }
            }),
            commute: commute != 0,
        };
        let h = state::add_op(o)?;
        // SAFETY: the caller's contract.
        unsafe { put(op, h) }
    })
}

/// Frees a user operation; `*op` becomes `MPI_OP_NULL`.
///
/// # Safety
/// `op` is readable and writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn MPI_Op_free(op: *mut c_int) -> c_int {
    mpi_call!("MPI_Op_free", 1, {
        if op.is_null() {
            return Err(Error::Op("NULL op".into()));
        }
        // SAFETY: not NULL, readable per the contract.
        state::free_op(unsafe { op.read_unaligned() })?;
        // SAFETY: the caller's contract.
        unsafe { put(op, 0) }
    })
}
