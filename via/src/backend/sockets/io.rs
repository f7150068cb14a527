//! Vectored system calls between a socket and registered memory: a
//! frame's payload goes from the sender's registered segments into the
//! socket (`writev`) and from the socket into the target's registered
//! memory (`readv`), with no bounce buffer on either side.
//!
//! Every call here passes `MSG_DONTWAIT` (and `MSG_NOSIGNAL` on sends)
//! rather than relying on the socket's `O_NONBLOCK`: that flag belongs to
//! the open file description, which the acceptor shares with viad (it
//! fetched the connection from viad, whose copy writes the set-up answer in
//! blocking mode and may do so after the library set the flag). A read on
//! an empty socket then blocked the reader until the peer's next frame (its
//! heartbeat, a second later): the stall of polling 1 MiB ping-pongs.
//!
//! The lists hold raw addresses, so building them is where the care is:
//! every range is either a Rust byte slice borrowed for the list's
//! lifetime (gather lists only), or bytes of a registered region
//! ([`Resolved`], also borrowed for the lifetime, which keeps its mappings
//! alive) found through its extents and checked in bounds. The kernel
//! checks every address again: a range that went away is an `EFAULT`,
//! never a fault in this process. No Rust reference to registered bytes
//! exists during a call (registered memory is only ever accessed by raw
//! copies; another process may write it concurrently).

use std::io;
use std::marker::PhantomData;
use std::os::fd::RawFd;

use crate::mem::region::{Place, Resolved};

/// Most ranges one system call takes (Linux's `IOV_MAX`).
const IOV_MAX: usize = 1024;

/// A list of byte ranges and how far a sequence of calls got through it.
struct List {
    iov: Vec<libc::iovec>,
    /// First range not done (its base and length already advanced past
    /// the bytes done).
    first: usize,
    /// Bytes not done.
    left: usize,
}

impl List {
    fn new() -> List {
        List {
            iov: Vec::with_capacity(4),
            first: 0,
            left: 0,
        }
    }

    fn push(&mut self, base: *mut u8, len: usize) {
        if len > 0 {
            self.iov.push(libc::iovec {
                iov_base: base.cast(),
                iov_len: len,
            });
            self.left += len;
        }
    }

    /// Pushes `len` bytes at `va` of `r`; `false` (the list must then be
    /// dropped) if a piece is outside the region or not reachable at an
    /// address of this process.
    fn push_region(&mut self, r: &Resolved, va: u64, len: u64) -> bool {
        pieces(r, va, len, |p, n| self.push(p, n))
    }

    /// Marks `n` more bytes done.
    fn advance(&mut self, mut n: usize) {
        debug_assert!(n <= self.left);
        self.left -= n;
        while n > 0 {
            let v = &mut self.iov[self.first];
            if n >= v.iov_len {
                n -= v.iov_len;
                v.iov_len = 0;
                self.first += 1;
            } else {
                v.iov_base = v.iov_base.cast::<u8>().wrapping_add(n).cast();
                v.iov_len -= n;
                n = 0;
            }
        }
        while self.first < self.iov.len() && self.iov[self.first].iov_len == 0 {
            self.first += 1;
        }
    }

    /// The ranges of the next call: at most `IOV_MAX`, and at most `max`
    /// bytes when `max` is not 0 (then in a copy, the last range cut).
    fn next(&self, max: usize) -> std::borrow::Cow<'_, [libc::iovec]> {
        let end = (self.first + IOV_MAX).min(self.iov.len());
        let v = &self.iov[self.first..end];
        if max == 0 || max >= self.left {
            return v.into();
        }
        let mut out = Vec::new();
        let mut room = max;
        for x in v {
            if room == 0 {
                break;
            }
            let k = x.iov_len.min(room);
            out.push(libc::iovec {
                iov_base: x.iov_base,
                iov_len: k,
            });
            room -= k;
        }
        out.into()
    }
}

/// Calls `f` with the address and length of each contiguous piece of the
/// `len` bytes at `va` of `r`; `false` if they are not all inside the
/// region and reachable at an address of this process.
fn pieces(r: &Resolved, va: u64, len: u64, mut f: impl FnMut(*mut u8, usize)) -> bool {
    if !r.covers(va, len) {
        return false;
    }
    let mut done = 0u64;
    while done < len {
        let Some((p, n)) = r.place(va + done) else {
            return false;
        };
        let n = n.min(len - done);
        match p {
            Place::Map(m, at) => {
                let Some(ptr) = m.raw(at, n as usize) else {
                    return false;
                };
                f(ptr.as_ptr(), n as usize);
            }
            // Registered memory of this process that stays where it is
            // (cross-memory-attach extents): its own address.
            Place::Cma(pid, a) if pid == via_sys::getpid() => f(a as usize as *mut u8, n as usize),
            Place::Cma(..) => return false,
        }
        done += n;
    }
    true
}

/// Whether the `len` bytes at `va` of `r` can go into a list: inside the
/// region and reachable at an address of this process.
pub(crate) fn reachable(r: &Resolved, va: u64, len: u64) -> bool {
    pieces(r, va, len, |_, _| {})
}

/// A message header for the ranges `v` (no address, no control data).
fn msghdr(v: &[libc::iovec]) -> libc::msghdr {
    // SAFETY: msghdr is plain data; all-zero is a valid value (no name,
    // no control buffer), the fields set below give the ranges.
    let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
    m.msg_iov = v.as_ptr().cast_mut();
    m.msg_iovlen = v.len() as _;
    m
}

/// `recv` into `buf`, never blocking.
pub(crate) fn recv(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is a valid, exclusively borrowed buffer of its length.
    let r = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
    result(r)
}

/// `send` of `buf`, never blocking, no `SIGPIPE` on a closed connection.
pub(crate) fn send(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: `buf` is a valid buffer of its length; send only reads it.
    let r = unsafe {
        libc::send(
            fd,
            buf.as_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    result(r)
}

fn result(r: isize) -> io::Result<usize> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// What a frame's writer sends: byte slices and registered bytes, in order.
pub(crate) struct Gather<'a> {
    list: List,
    _borrows: PhantomData<&'a [u8]>,
}

impl<'a> Gather<'a> {
    pub fn new() -> Gather<'a> {
        Gather {
            list: List::new(),
            _borrows: PhantomData,
        }
    }

    pub fn push_bytes(&mut self, b: &'a [u8]) {
        // The pointer is only read from (writev).
        self.list.push(b.as_ptr().cast_mut(), b.len());
    }

    /// Adds `len` bytes at `va` of `r`; `false` if they are not all inside
    /// the region and reachable here (the list must then be dropped).
    pub fn push_region(&mut self, r: &'a Resolved, va: u64, len: u64) -> bool {
        self.list.push_region(r, va, len)
    }

    /// Bytes not written yet.
    pub fn left(&self) -> usize {
        self.list.left
    }

    /// One `sendmsg` of the next bytes (at most `max` when not 0), never
    /// blocking; marks what the socket took as done.
    pub fn write_to(&mut self, fd: RawFd, max: usize) -> io::Result<usize> {
        let v = self.list.next(max);
        let msg = msghdr(&v);
        // SAFETY: every range is a slice or registered bytes borrowed for
        // 'a (see the module doc), inside its memory; sendmsg only reads
        // them, and the kernel checks each address. `msg` points at `v`,
        // which outlives the call.
        let r = unsafe { libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
        let n = result(r)?;
        drop(v);
        self.list.advance(n);
        Ok(n)
    }
}

/// Where a payload's bytes land: registered bytes only.
pub(crate) struct Scatter<'a> {
    list: List,
    _borrows: PhantomData<&'a Resolved>,
}

impl<'a> Scatter<'a> {
    pub fn new() -> Scatter<'a> {
        Scatter {
            list: List::new(),
            _borrows: PhantomData,
        }
    }

    /// Adds `len` bytes at `va` of `r`; `false` if they are not all inside
    /// the region and reachable here (the list must then be dropped).
    pub fn push_region(&mut self, r: &'a Resolved, va: u64, len: u64) -> bool {
        self.list.push_region(r, va, len)
    }

    /// One `recvmsg` into the ranges, in order, never blocking.
    pub fn read_from(&mut self, fd: RawFd) -> io::Result<usize> {
        let v = self.list.next(0);
        let mut msg = msghdr(&v);
        // SAFETY: every range lies inside registered memory of a region
        // borrowed for 'a (mapped, checked in bounds; see the module doc),
        // the target the caller chose after the target-side checks. No
        // Rust reference to those bytes exists; the kernel checks each
        // address (EFAULT if the memory went away). `msg` points at `v`,
        // which outlives the call.
        let r = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_DONTWAIT) };
        let n = result(r)?;
        drop(v);
        self.list.advance(n);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advance_and_cut() {
        let (a, b, c) = ([1u8; 3], [2u8; 4], [3u8; 5]);
        let mut g = Gather::new();
        g.push_bytes(&a);
        g.push_bytes(&[]);
        g.push_bytes(&b);
        g.push_bytes(&c);
        assert_eq!(g.left(), 12);
        let lens = |v: &[libc::iovec]| v.iter().map(|s| s.iov_len).collect::<Vec<_>>();
        assert_eq!(lens(&g.list.next(5)), [3, 2]);
        assert_eq!(lens(&g.list.next(0)), [3, 4, 5]);
        g.list.advance(4);
        assert_eq!(g.left(), 8);
        assert_eq!(lens(&g.list.next(0)), [3, 5]);
        assert_eq!(g.list.next(0)[0].iov_base as usize, b.as_ptr() as usize + 1);
        g.list.advance(3);
        assert_eq!(lens(&g.list.next(2)), [2]);
        g.list.advance(5);
        assert_eq!(g.left(), 0);
        assert!(g.list.next(0).is_empty());
    }

    #[test]
    fn sendmsg_through_a_socket_in_pieces() {
        use std::io::Read;
        use std::os::fd::AsRawFd;
        let (mut r, w) = std::os::unix::net::UnixStream::pair().unwrap();
        let (a, b) = (b"head".to_vec(), (0..=255u8).collect::<Vec<u8>>());
        let mut g = Gather::new();
        g.push_bytes(&a);
        g.push_bytes(&b);
        let mut sent = 0;
        while g.left() > 0 {
            sent += g.write_to(w.as_raw_fd(), 7).unwrap();
        }
        drop(w);
        let mut got = Vec::new();
        r.read_to_end(&mut got).unwrap();
        assert_eq!(sent, 260);
        assert_eq!(&got[..4], b"head");
        assert_eq!(&got[4..], &b[..]);
    }

    #[test]
    fn reads_never_block_on_a_blocking_socket() {
        use std::os::fd::AsRawFd;
        // The socket is in blocking mode (as viad may leave a shared one).
        let (r, _w) = std::os::unix::net::UnixStream::pair().unwrap();
        r.set_nonblocking(false).unwrap();
        let mut b = [0u8; 8];
        let e = recv(r.as_raw_fd(), &mut b).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
    }
}
