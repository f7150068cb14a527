//! Application buffers the library reads or writes after the call that
//! named them returned (non-blocking operations, C callers) or while it
//! blocks: the only place the core turns addresses into slices.
//!
//! A [`UserBuf`] is `len` bytes at `addr` that stay valid, and untouched
//! by the application, until the operation using them completes. Three
//! ways to get one, each keeping that promise differently:
//! * [`UserBuf::owned`]: the buffer owns a `Vec` (safe Rust non-blocking calls);
//! * [`UserBuf::raw`]: `unsafe`, the C caller's promise (MPI's rule for buffers);
//! * [`UserBuf::lend`] / [`UserBuf::lend_mut`]: a slice lent for one
//!   blocking call. Crate rule: only the engine's blocking calls lend, and
//!   they return only once no request holds the buffer any more.

use via::mem::arena::UserRange;

/// An application buffer in use by an operation.
#[derive(Debug)]
pub struct UserBuf {
    addr: usize,
    len: usize,
    owned: Option<Vec<u8>>,
}

impl UserBuf {
    /// A buffer owning its bytes.
    pub fn owned(v: Vec<u8>) -> UserBuf {
        UserBuf {
            addr: v.as_ptr() as usize,
            len: v.len(),
            owned: Some(v),
        }
    }

    /// An empty buffer.
    pub fn empty() -> UserBuf {
        UserBuf::owned(Vec::new())
    }

    /// `len` bytes at `addr`.
    ///
    /// # Safety
    /// Unless `len` is 0, `addr..addr + len` is valid for reads and writes
    /// (reads only, if the buffer is only sent) and is not accessed by the
    /// caller until the operation using the buffer completes.
    pub unsafe fn raw(addr: usize, len: usize) -> UserBuf {
        UserBuf {
            addr,
            len,
            owned: None,
        }
    }

    /// A slice lent to a blocking call (crate rule above: the call returns
    /// only once no request holds it).
    pub(crate) fn lend(s: &[u8]) -> UserBuf {
        UserBuf {
            addr: s.as_ptr() as usize,
            len: s.len(),
            owned: None,
        }
    }

    /// A mutable slice lent to a blocking call (same rule).
    pub(crate) fn lend_mut(s: &mut [u8]) -> UserBuf {
        UserBuf {
            addr: s.as_mut_ptr() as usize,
            len: s.len(),
            owned: None,
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Address of the first byte.
    pub fn addr(&self) -> usize {
        self.addr
    }

    /// The bytes `off..off + n` (clipped to the buffer).
    pub fn slice(&self, off: usize, n: usize) -> &[u8] {
        let off = off.min(self.len);
        let n = n.min(self.len - off);
        if n == 0 {
            return &[];
        }
        // SAFETY: inside the buffer (clipped above), valid for reads per the
        // constructor's contract; the caller of `raw`/`lend` does not write
        // it while the operation runs.
        unsafe { std::slice::from_raw_parts((self.addr + off) as *const u8, n) }
    }

    /// The bytes `off..off + n` (clipped), for writing.
    pub fn slice_mut(&mut self, off: usize, n: usize) -> &mut [u8] {
        let off = off.min(self.len);
        let n = n.min(self.len - off);
        if n == 0 {
            return &mut [];
        }
        // SAFETY: inside the buffer (clipped above), valid for writes per the
        // constructor's contract, and nobody else accesses it while the
        // operation runs; `&mut self` makes this the only live slice.
        unsafe { std::slice::from_raw_parts_mut((self.addr + off) as *mut u8, n) }
    }

    /// The range, for registration (`None` when empty).
    pub fn user_range(&self) -> Option<UserRange> {
        // SAFETY: the buffer stays valid while the operation runs, and the
        // engine drops the registration made from it before it completes
        // the operation (so before the buffer may go).
        (self.len > 0).then(|| unsafe { UserRange::new(self.addr, self.len) })
    }

    /// The owned bytes back, if the buffer owns them.
    pub fn into_vec(self) -> Option<Vec<u8>> {
        self.owned
    }
}
