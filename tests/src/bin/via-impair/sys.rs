//! The system calls of `via-impair`, the only unsafe code of the tool: a
//! netlink socket (NETLINK_NETFILTER), a raw IPv4 socket for duplicates,
//! `ppoll`, `read` of stdin and a SIGTERM/SIGINT flag. Everything above
//! this module builds and parses messages as plain bytes.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// `NETLINK_NETFILTER` (linux/netlink.h).
const NETLINK_NETFILTER: libc::c_int = 12;

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn cvt_size(r: libc::ssize_t) -> io::Result<usize> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

fn socket(domain: libc::c_int, ty: libc::c_int, proto: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: socket(2) takes no pointers; a non-negative result is a new
    // descriptor that nothing else owns.
    let fd = cvt(unsafe { libc::socket(domain, ty | libc::SOCK_CLOEXEC, proto) })?;
    // SAFETY: `fd` was just returned by socket(2) and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn setsockopt_int(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    v: libc::c_int,
) -> io::Result<()> {
    // SAFETY: the option value points at a live c_int of the size passed.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    })?;
    Ok(())
}

/// A netlink socket of the netfilter family, bound to a kernel-chosen port.
pub struct Netlink {
    fd: OwnedFd,
}

impl Netlink {
    pub fn open(rcvbuf: usize) -> io::Result<Netlink> {
        let fd = socket(libc::AF_NETLINK, libc::SOCK_RAW, NETLINK_NETFILTER)?;
        // SAFETY: an all-zero sockaddr_nl is valid (family set below).
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        // SAFETY: `addr` is a live sockaddr_nl of the size passed.
        cvt(unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        })?;
        let raw = fd.as_raw_fd();
        // A large receive buffer: a burst of packets must not overflow it
        // (the kernel would drop them and count them as `user_dropped`).
        // FORCE needs CAP_NET_ADMIN, which we have; fall back quietly.
        let n = rcvbuf.min(i32::MAX as usize) as libc::c_int;
        if setsockopt_int(raw, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, n).is_err() {
            let _ = setsockopt_int(raw, libc::SOL_SOCKET, libc::SO_RCVBUF, n);
        }
        // Overflows are read from /proc at the end, not as ENOBUFS errors.
        setsockopt_int(raw, libc::SOL_NETLINK, libc::NETLINK_NO_ENOBUFS, 1)?;
        Ok(Netlink { fd })
    }

    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Sends one netlink message (to the kernel, port 0).
    pub fn send(&self, msg: &[u8]) -> io::Result<()> {
        // SAFETY: an all-zero sockaddr_nl is valid (family set below).
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        // SAFETY: `msg` and `addr` are live for the call, of the sizes passed.
        cvt_size(unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                msg.as_ptr().cast(),
                msg.len(),
                0,
                (&addr as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        })?;
        Ok(())
    }

    /// Receives one datagram (possibly several messages) without blocking;
    /// `Ok(None)` when there is none. A datagram longer than `buf` is an
    /// error (`MSG_TRUNC` tells its real size).
    pub fn recv(&self, buf: &mut [u8], block: bool) -> io::Result<Option<usize>> {
        let flags = libc::MSG_TRUNC | if block { 0 } else { libc::MSG_DONTWAIT };
        // SAFETY: `buf` is live and writable for its whole length.
        let r = unsafe {
            libc::recv(
                self.fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                flags,
            )
        };
        match cvt_size(r) {
            Ok(n) if n > buf.len() => Err(io::Error::other(format!(
                "netlink datagram of {n} bytes truncated to {}",
                buf.len()
            ))),
            Ok(n) => Ok(Some(n)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// A raw IPv4 socket (`IPPROTO_RAW`, so `IP_HDRINCL`) whose packets carry
/// `SO_MARK` `mark`, so the NFQUEUE rule lets them pass.
pub struct RawIp {
    fd: OwnedFd,
}

impl RawIp {
    pub fn open(mark: u32) -> io::Result<RawIp> {
        let fd = socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW)?;
        setsockopt_int(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_MARK,
            mark as libc::c_int,
        )?;
        Ok(RawIp { fd })
    }

    /// Sends a whole IPv4 packet (header included) to `dst`.
    pub fn send(&self, packet: &[u8], dst: [u8; 4]) -> io::Result<()> {
        // SAFETY: an all-zero sockaddr_in is valid (fields set below).
        let mut addr: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        addr.sin_family = libc::AF_INET as libc::sa_family_t;
        addr.sin_addr.s_addr = u32::from_ne_bytes(dst);
        // SAFETY: `packet` and `addr` are live for the call, of the sizes passed.
        cvt_size(unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                packet.as_ptr().cast(),
                packet.len(),
                libc::MSG_DONTWAIT,
                (&addr as *const libc::sockaddr_in).cast(),
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        })?;
        Ok(())
    }
}

/// Readiness of [`poll`]'s two descriptors.
pub struct Ready {
    pub netlink: bool,
    pub stdin: bool,
}

/// Waits at most `timeout` for `nl` or `stdin` (if given) to be readable.
/// A signal ends the wait early (no error).
pub fn poll(nl: RawFd, stdin: Option<RawFd>, timeout: Duration) -> io::Result<Ready> {
    let mut fds = [
        libc::pollfd {
            fd: nl,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: stdin.unwrap_or(-1),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `fds` (2 entries, as passed) and `ts` are live for the call;
    // a negative fd is ignored by ppoll; no signal mask is passed.
    let r = unsafe { libc::ppoll(fds.as_mut_ptr(), 2, &ts, std::ptr::null()) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(Ready {
                netlink: false,
                stdin: false,
            });
        }
        return Err(e);
    }
    let hit = |p: &libc::pollfd| p.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0;
    Ok(Ready {
        netlink: hit(&fds[0]),
        stdin: hit(&fds[1]),
    })
}

/// `read(2)` of a descriptor we do not own (stdin).
pub fn read(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is live and writable for its whole length.
    cvt_size(unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) })
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    // Async-signal-safe: one atomic store.
    STOP.store(true, Ordering::SeqCst);
}

/// SIGTERM and SIGINT set the flag [`stopped`] reads; without SA_RESTART,
/// so a `ppoll` in progress returns at once.
pub fn catch_stop_signals() -> io::Result<()> {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: an all-zero sigaction is valid (empty mask, no flags).
        let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
        sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        // SAFETY: `sa` is live and its handler only does an atomic store.
        cvt(unsafe { libc::sigaction(sig, &sa, std::ptr::null_mut()) })?;
    }
    Ok(())
}

/// Whether SIGTERM or SIGINT arrived.
pub fn stopped() -> bool {
    STOP.load(Ordering::SeqCst)
}
