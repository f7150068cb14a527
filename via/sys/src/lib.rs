//! Raw system calls used by the via-rs provider and by viad, each wrapped
//! in a safe function.
//!
//! With the provider's `shm/`, `mem/` and `ffi/` modules, this is where
//! via-rs calls into `libc` with raw pointers. Every wrapper checks its
//! result and turns `-1` into an `io::Error`. A crate of its own so that
//! viad, which needs these calls, does not link the provider.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn cvt_isize(r: isize) -> io::Result<usize> {
    if r == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// Creates an anonymous memory file (`memfd_create`, close-on-exec).
///
/// The name shows up in `/proc/<pid>/maps` as `/memfd:<name> (deleted)`,
/// which is how the registration path recognises its own arenas.
pub fn memfd_create(name: &str) -> io::Result<OwnedFd> {
    let cname = CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `cname` is a valid NUL-terminated string for the duration of the call.
    let fd = cvt(unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) })?;
    // SAFETY: memfd_create returned a fresh descriptor that nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Sets the size of a file.
pub fn ftruncate(fd: &OwnedFd, len: u64) -> io::Result<()> {
    let len =
        libc::off_t::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: plain syscall on an owned descriptor.
    cvt(unsafe { libc::ftruncate(fd.as_raw_fd(), len) })?;
    Ok(())
}

/// Size of the file behind `fd`.
pub fn file_size(fd: &OwnedFd) -> io::Result<u64> {
    // SAFETY: `st` is written by fstat before it is read.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid out-pointer.
    cvt(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
    Ok(st.st_size as u64)
}

/// The size of a page.
pub fn page_size() -> usize {
    static P: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *P.get_or_init(|| {
        // SAFETY: sysconf has no preconditions.
        let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if p > 0 { p as usize } else { 4096 }
    })
}

/// The size of the memory file behind `fd`: a regular file that lives in
/// memory (a memfd, or a tmpfs or hugetlbfs file: `F_GET_SEALS` works on
/// those and fails on every other kind of file). `InvalidInput` for
/// anything else.
pub fn memory_file_size(fd: &OwnedFd) -> io::Result<u64> {
    // SAFETY: `st` is written by fstat before it is read.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid out-pointer.
    cvt(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    // SAFETY: F_GET_SEALS takes no argument and changes nothing.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) } == -1 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a memory file (no seals)",
        ));
    }
    u64::try_from(st.st_size).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// A read-only shared mapping of the first `len` bytes of a file, locked
/// in memory (`mlock`) until it is dropped: its pages stay resident
/// whatever the other processes mapping the file do. Nothing reads through
/// it; it exists to hold the lock (counted in `VmLck` of this process).
#[derive(Debug)]
pub struct LockedMapping {
    addr: usize,
    len: usize,
}

impl LockedMapping {
    /// Maps and locks `len` (> 0) bytes of `fd`. The pages are faulted in
    /// (allocated where the file has holes) before it returns.
    pub fn lock(fd: &OwnedFd, len: usize) -> io::Result<LockedMapping> {
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty mapping"));
        }
        // SAFETY: a new read-only mapping at an address the kernel chooses
        // aliases no Rust object.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let m = LockedMapping {
            addr: p as usize,
            len,
        };
        // SAFETY: the range is the mapping made above; locking reads
        // nothing through Rust references (a failure leaves it unlocked,
        // and `m` unmaps it).
        cvt(unsafe { libc::mlock(p, len) })?;
        Ok(m)
    }

    /// Bytes mapped and locked.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is mapped (never: [`LockedMapping::lock`] refuses
    /// an empty range).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for LockedMapping {
    fn drop(&mut self) {
        // SAFETY: the mapping is ours alone and nothing refers to it;
        // unmapping also unlocks it.
        unsafe { libc::munmap(self.addr as *mut libc::c_void, self.len) };
    }
}

/// Direction of a cross-memory-attach transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmaDir {
    /// Remote process -> local memory (`process_vm_readv`).
    Read,
    /// Local memory -> remote process (`process_vm_writev`).
    Write,
}

/// Moves `len` bytes between local memory at `local` and another process's
/// memory at `remote` (cross-memory attach). Returns bytes moved.
///
/// # Safety
/// `local..local + len` must stay valid for writes (`Read`) or reads
/// (`Write`) for the duration of the call.
pub unsafe fn process_vm_raw(
    pid: i32,
    local: *mut u8,
    len: usize,
    remote: u64,
    dir: CmaDir,
) -> io::Result<usize> {
    let l = libc::iovec {
        iov_base: local.cast(),
        iov_len: len,
    };
    let r = libc::iovec {
        iov_base: remote as usize as *mut libc::c_void,
        iov_len: len,
    };
    // SAFETY: the local iovec is valid by the caller's contract; the remote
    // one is only interpreted, and validated, by the kernel in the target.
    let n = unsafe {
        match dir {
            CmaDir::Read => libc::process_vm_readv(pid, &l, 1, &r, 1, 0),
            CmaDir::Write => libc::process_vm_writev(pid, &l, 1, &r, 1, 0),
        }
    };
    cvt_isize(n)
}

/// Reads into `local` from another process's memory at `remote`
/// (`process_vm_readv`, cross-memory attach). Returns bytes read.
pub fn process_vm_read(pid: i32, local: &mut [u8], remote: u64) -> io::Result<usize> {
    // SAFETY: `local` is borrowed mutably for the call.
    unsafe { process_vm_raw(pid, local.as_mut_ptr(), local.len(), remote, CmaDir::Read) }
}

/// Writes `local` into another process's memory at `remote`
/// (`process_vm_writev`). Returns bytes written.
pub fn process_vm_write(pid: i32, local: &[u8], remote: u64) -> io::Result<usize> {
    // SAFETY: `local` is borrowed for the call and only read by the kernel.
    unsafe {
        process_vm_raw(
            pid,
            local.as_ptr().cast_mut(),
            local.len(),
            remote,
            CmaDir::Write,
        )
    }
}

/// Credentials of the process at the other end of a Unix socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerCred {
    /// Process id.
    pub pid: i32,
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
}

/// `SO_PEERCRED` of a connected Unix socket.
pub fn peer_cred(fd: RawFd) -> io::Result<PeerCred> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid out-pointers of the right size.
    cvt(unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    })?;
    Ok(PeerCred {
        pid: cred.pid,
        uid: cred.uid,
        gid: cred.gid,
    })
}

/// A pidfd for `pid`: becomes readable when the whole process has exited.
pub fn pidfd_open(pid: i32) -> io::Result<OwnedFd> {
    // SAFETY: plain syscall with integer arguments.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pidfd_open returned a fresh descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(r as RawFd) })
}

/// Maximum number of descriptors passed in one message.
pub const MAX_FDS: usize = 4;

/// Sends one datagram with optional descriptors (`SCM_RIGHTS`).
pub fn send_with_fds(sock: RawFd, data: &[u8], fds: &[RawFd]) -> io::Result<usize> {
    assert!(fds.len() <= MAX_FDS, "at most {MAX_FDS} fds per message");
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let mut cbuf = [0u64; 8]; // 64 bytes, aligned for cmsghdr
    // SAFETY: zeroed msghdr is a valid empty header; the fields are set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        let payload = std::mem::size_of_val(fds) as u32;
        // SAFETY: CMSG_SPACE is a pure computation.
        let space = unsafe { libc::CMSG_SPACE(payload) } as usize;
        debug_assert!(space <= std::mem::size_of_val(&cbuf));
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = space;
        // SAFETY: msg_control points to `cbuf`, large enough for one cmsg
        // carrying `fds` (checked above); CMSG_FIRSTHDR/CMSG_DATA stay inside it.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(payload) as usize;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr(),
                libc::CMSG_DATA(cmsg).cast::<RawFd>(),
                fds.len(),
            );
        }
    }
    loop {
        // SAFETY: `msg` describes live buffers for the duration of the call.
        let r = unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) };
        match cvt_isize(r) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

/// One received datagram.
#[derive(Debug)]
pub struct Received {
    /// Bytes received (0 = orderly shutdown).
    pub len: usize,
    /// The descriptors that came with it.
    pub fds: Vec<OwnedFd>,
    /// The sender attached descriptors that the kernel could not install
    /// (this process is out of descriptors, `MSG_CTRUNC`): they are lost.
    pub fds_lost: bool,
}

/// Receives one datagram into `buf` with up to [`MAX_FDS`] descriptors.
/// Returns the byte count (0 = orderly shutdown) and the received fds.
pub fn recv_with_fds(sock: RawFd, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let r = recv_msg(sock, buf)?;
    if r.fds_lost {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "descriptors lost (out of file descriptors)",
        ));
    }
    Ok((r.len, r.fds))
}

/// Receives one datagram into `buf` with up to [`MAX_FDS`] descriptors,
/// reporting descriptors the kernel dropped instead of failing.
pub fn recv_msg(sock: RawFd, buf: &mut [u8]) -> io::Result<Received> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut cbuf = [0u64; 16];
    // SAFETY: zeroed msghdr is a valid empty header; the fields are set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cbuf);
    let n = loop {
        // SAFETY: `msg` describes live buffers for the duration of the call.
        let r = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC) };
        match cvt_isize(r) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => break other?,
        }
    };
    let mut fds = Vec::new();
    // SAFETY: the kernel filled msg_control/msg_controllen; the CMSG_* macros
    // walk only within that buffer, and every fd in an SCM_RIGHTS payload is
    // a fresh descriptor owned by us.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                let bytes = (*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                for i in 0..bytes / std::mem::size_of::<RawFd>() {
                    let fd = std::ptr::read_unaligned(data.add(i));
                    fds.push(OwnedFd::from_raw_fd(fd));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    if msg.msg_flags & libc::MSG_TRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "message truncated",
        ));
    }
    Ok(Received {
        len: n,
        fds,
        fds_lost: msg.msg_flags & libc::MSG_CTRUNC != 0,
    })
}

/// This process's id, cached: every `Vip*` call asks (handles belong to
/// the process that made them). A child of `fork` forgets the cached value
/// in a fork handler and asks the kernel again.
pub fn getpid() -> i32 {
    static PID: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);
    static HANDLER: std::sync::Once = std::sync::Once::new();
    extern "C" fn forget() {
        PID.store(0, std::sync::atomic::Ordering::Relaxed);
    }
    let p = PID.load(std::sync::atomic::Ordering::Relaxed);
    if p != 0 {
        return p;
    }
    HANDLER.call_once(|| {
        // SAFETY: a plain function valid for the whole process.
        unsafe { libc::pthread_atfork(None, None, Some(forget)) };
    });
    // SAFETY: getpid cannot fail.
    let p = unsafe { libc::getpid() };
    PID.store(p, std::sync::atomic::Ordering::Relaxed);
    p
}

/// Real user id.
pub fn getuid() -> u32 {
    // SAFETY: getuid cannot fail.
    unsafe { libc::getuid() }
}

/// Whether process `pid` exists (signal 0).
pub fn process_alive(pid: i32) -> bool {
    // SAFETY: kill with signal 0 only checks for existence.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Raises `RLIMIT_NOFILE` as far as this process may (viad holds one fd
/// per shared object of every client): the hard limit up to
/// `/proc/sys/fs/nr_open` where permitted (root), the soft limit to the
/// hard one. Returns the soft limit in force.
pub fn raise_nofile_limit() -> io::Result<u64> {
    // SAFETY: `lim` is a valid out-pointer.
    let mut lim: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer to an rlimit.
    cvt(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) })?;
    let nr_open: Option<libc::rlim_t> = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse().ok());
    if let Some(max) = nr_open.filter(|&m| m > lim.rlim_max) {
        let up = libc::rlimit {
            rlim_cur: max,
            rlim_max: max,
        };
        // SAFETY: valid pointer to an rlimit. Failing (no privilege) is fine.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &up) } == 0 {
            return Ok(max);
        }
    }
    lim.rlim_cur = lim.rlim_max;
    // SAFETY: valid pointer to an rlimit.
    cvt(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) })?;
    Ok(lim.rlim_cur)
}

/// The soft `RLIMIT_NOFILE`.
pub fn nofile_limit() -> io::Result<u64> {
    // SAFETY: `lim` is a valid out-pointer.
    let mut lim: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer to an rlimit.
    cvt(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) })?;
    Ok(lim.rlim_cur as u64)
}

/// Bounds of the calling thread's stack (`pthread_getattr_np`), asked once
/// per thread: for the main thread glibc reads `/proc/self/maps` to answer,
/// a cost that grows with the number of mappings.
pub fn current_thread_stack() -> Option<std::ops::Range<usize>> {
    thread_local! {
        static STACK: std::cell::OnceCell<Option<std::ops::Range<usize>>> =
            const { std::cell::OnceCell::new() };
    }
    STACK.with(|s| s.get_or_init(thread_stack_now).clone())
}

fn thread_stack_now() -> Option<std::ops::Range<usize>> {
    // SAFETY: `attr` is initialised by pthread_getattr_np before use and
    // destroyed afterwards; the out-pointers are valid.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
            return None;
        }
        let mut addr: *mut libc::c_void = std::ptr::null_mut();
        let mut size: libc::size_t = 0;
        let r = libc::pthread_attr_getstack(&attr, &mut addr, &mut size);
        libc::pthread_attr_destroy(&mut attr);
        if r != 0 {
            return None;
        }
        Some(addr as usize..addr as usize + size)
    }
}

/// `poll(2)` on a set of descriptors. Returns the number ready.
pub fn poll(fds: &mut [libc::pollfd], timeout_ms: i32) -> io::Result<usize> {
    // SAFETY: `fds` is a valid slice of pollfd for the call.
    let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    Ok(cvt(r)? as usize)
}

/// `ppoll(2)`: [`poll`] with a timeout finer than a millisecond (`None`:
/// no timeout).
pub fn ppoll(fds: &mut [libc::pollfd], timeout: Option<std::time::Duration>) -> io::Result<usize> {
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs().min(i32::MAX as u64) as libc::time_t,
        tv_nsec: t.subsec_nanos() as libc::c_long,
    });
    let tp = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `fds` is a valid slice of pollfd for the call; `tp` is null or
    // points to `ts`, alive across the call; no signal mask.
    let r = unsafe {
        libc::ppoll(
            fds.as_mut_ptr(),
            fds.len() as libc::nfds_t,
            tp,
            std::ptr::null(),
        )
    };
    Ok(cvt(r)? as usize)
}

/// CPU time (user + system) of this process, for benchmarks.
pub fn rusage_cpu() -> std::time::Duration {
    // SAFETY: `ru` is a valid out-pointer.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| std::time::Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn abstract_addr(name: &[u8]) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: all-zero is a valid sockaddr_un.
    let mut sa: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if name.len() + 1 > sa.sun_path.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "socket name too long",
        ));
    }
    sa.sun_family = libc::AF_UNIX as libc::sa_family_t;
    // Abstract namespace: sun_path[0] stays 0, the name follows.
    for (i, b) in name.iter().enumerate() {
        sa.sun_path[i + 1] = *b as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + 1 + name.len();
    Ok((sa, len as libc::socklen_t))
}

fn path_addr(path: &std::path::Path) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    use std::os::unix::ffi::OsStrExt;
    let name = path.as_os_str().as_bytes();
    // SAFETY: all-zero is a valid sockaddr_un.
    let mut sa: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if name.is_empty() || name.contains(&0) || name.len() + 1 > sa.sun_path.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "socket path {} is empty, too long (at most {} bytes) or contains NUL",
                path.display(),
                sa.sun_path.len() - 1
            ),
        ));
    }
    sa.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (i, b) in name.iter().enumerate() {
        sa.sun_path[i] = *b as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + name.len() + 1;
    Ok((sa, len as libc::socklen_t))
}

fn seqpacket_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain syscall.
    let fd =
        cvt(unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: fresh descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn bind_listen(fd: &OwnedFd, sa: &libc::sockaddr_un, len: libc::socklen_t) -> io::Result<()> {
    // SAFETY: `sa` is a valid sockaddr_un of `len` bytes.
    cvt(unsafe { libc::bind(fd.as_raw_fd(), (sa as *const libc::sockaddr_un).cast(), len) })?;
    // SAFETY: plain syscall.
    cvt(unsafe { libc::listen(fd.as_raw_fd(), 128) })?;
    Ok(())
}

/// Binds and listens on an abstract `SOCK_SEQPACKET` socket (any local user
/// can take any abstract name: the library no longer uses them; tests bind
/// the old name to show that nothing reaches it).
pub fn seqpacket_listen_abstract(name: &[u8]) -> io::Result<OwnedFd> {
    let fd = seqpacket_socket()?;
    let (sa, len) = abstract_addr(name)?;
    bind_listen(&fd, &sa, len)?;
    Ok(fd)
}

/// Binds a `SOCK_SEQPACKET` socket at `path` (which must not exist), gives
/// the socket file `mode` (so that, say, every user may connect: 0666),
/// then listens. Nobody can connect before the mode is set: until `listen`
/// a connection is refused whatever the mode.
pub fn seqpacket_listen_path_mode(path: &std::path::Path, mode: u32) -> io::Result<OwnedFd> {
    use std::os::unix::fs::PermissionsExt;
    let fd = seqpacket_socket()?;
    let (sa, len) = path_addr(path)?;
    // SAFETY: `sa` is a valid sockaddr_un of `len` bytes.
    cvt(unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&sa as *const libc::sockaddr_un).cast(),
            len,
        )
    })?;
    if let Err(e) = std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)) {
        let _ = std::fs::remove_file(path);
        return Err(e);
    }
    // SAFETY: plain syscall.
    cvt(unsafe { libc::listen(fd.as_raw_fd(), 128) })?;
    Ok(fd)
}

/// Binds and listens on a `SOCK_SEQPACKET` socket at `path` (which must not
/// exist: `AddrInUse` otherwise).
pub fn seqpacket_listen_path(path: &std::path::Path) -> io::Result<OwnedFd> {
    let fd = seqpacket_socket()?;
    let (sa, len) = path_addr(path)?;
    bind_listen(&fd, &sa, len)?;
    Ok(fd)
}

/// Connects to an abstract `SOCK_SEQPACKET` socket (blocking).
pub fn seqpacket_connect_abstract(name: &[u8]) -> io::Result<OwnedFd> {
    let fd = seqpacket_socket()?;
    let (sa, len) = abstract_addr(name)?;
    loop {
        // SAFETY: `sa` is a valid sockaddr_un of `len` bytes.
        let r = unsafe {
            libc::connect(
                fd.as_raw_fd(),
                (&sa as *const libc::sockaddr_un).cast(),
                len,
            )
        };
        match cvt(r) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
            Ok(_) => return Ok(fd),
        }
    }
}

/// Connects to the `SOCK_SEQPACKET` socket at `path` within `timeout`.
///
/// The connect is non-blocking: a listener whose backlog is full (one that
/// never accepts) makes a blocking connect wait forever; here the attempt
/// is retried until `timeout` and then fails with `TimedOut`. The returned
/// socket is blocking again.
pub fn seqpacket_connect_path(
    path: &std::path::Path,
    timeout: std::time::Duration,
) -> io::Result<OwnedFd> {
    let (sa, len) = path_addr(path)?;
    let deadline = std::time::Instant::now() + timeout;
    let mut backoff = std::time::Duration::from_millis(1);
    loop {
        let fd = seqpacket_socket()?;
        set_nonblocking(fd.as_raw_fd(), true)?;
        // SAFETY: `sa` is a valid sockaddr_un of `len` bytes.
        let r = unsafe {
            libc::connect(
                fd.as_raw_fd(),
                (&sa as *const libc::sockaddr_un).cast(),
                len,
            )
        };
        let err = match cvt(r) {
            Ok(_) => {
                set_nonblocking(fd.as_raw_fd(), false)?;
                return Ok(fd);
            }
            Err(e) => e,
        };
        match err.raw_os_error() {
            Some(libc::EINPROGRESS) => {
                // Not what AF_UNIX does today, but allowed: wait for
                // writability, then read the outcome.
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                let mut p = [libc::pollfd {
                    fd: fd.as_raw_fd(),
                    events: libc::POLLOUT,
                    revents: 0,
                }];
                if poll(&mut p, left.as_millis().min(i32::MAX as u128) as i32)? == 0 {
                    return Err(timed_out(path, timeout));
                }
                let e = socket_error(fd.as_raw_fd())?;
                if e != 0 {
                    return Err(io::Error::from_raw_os_error(e));
                }
                set_nonblocking(fd.as_raw_fd(), false)?;
                return Ok(fd);
            }
            // Backlog full (the listener does not accept), or interrupted:
            // try again until the deadline.
            Some(libc::EAGAIN) | Some(libc::EINTR) => {
                let now = std::time::Instant::now();
                if now >= deadline {
                    return Err(timed_out(path, timeout));
                }
                std::thread::sleep(backoff.min(deadline - now));
                backoff = (backoff * 2).min(std::time::Duration::from_millis(50));
            }
            _ => return Err(err),
        }
    }
}

fn timed_out(path: &std::path::Path, t: std::time::Duration) -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!(
            "{} did not take the connection within {t:?}",
            path.display()
        ),
    )
}

/// `SO_ERROR` of a socket.
fn socket_error(fd: RawFd) -> io::Result<i32> {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `v` and `len` are valid out-pointers of the right size.
    cvt(unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ERROR,
            (&mut v as *mut libc::c_int).cast(),
            &mut len,
        )
    })?;
    Ok(v)
}

/// Takes an exclusive `flock` on `fd` without waiting: `Ok(false)` if
/// another open file description holds it.
pub fn try_lock_exclusive(fd: RawFd) -> io::Result<bool> {
    loop {
        // SAFETY: plain syscall on a descriptor the caller holds.
        let r = unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) };
        match cvt(r) {
            Ok(_) => return Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Accepts a connection (non-blocking listener: `WouldBlock` when none).
pub fn accept(listener: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: null address pointers are allowed by accept4.
    let fd = cvt(unsafe {
        libc::accept4(
            listener,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_CLOEXEC,
        )
    })?;
    // SAFETY: fresh descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Duplicates a descriptor (close-on-exec).
pub fn dup(fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: fcntl on a descriptor the caller holds; the result is fresh.
    let r = cvt(unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) })?;
    // SAFETY: fresh descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(r) })
}

/// Sets or clears `O_NONBLOCK`.
pub fn set_nonblocking(fd: RawFd, on: bool) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we hold.
    let flags = cvt(unsafe { libc::fcntl(fd, libc::F_GETFL) })?;
    let flags = if on {
        flags | libc::O_NONBLOCK
    } else {
        flags & !libc::O_NONBLOCK
    };
    // SAFETY: as above.
    cvt(unsafe { libc::fcntl(fd, libc::F_SETFL, flags) })?;
    Ok(())
}

/// Sets a receive timeout on a socket.
pub fn set_recv_timeout(fd: RawFd, t: std::time::Duration) -> io::Result<()> {
    let tv = libc::timeval {
        tv_sec: t.as_secs() as libc::time_t,
        tv_usec: t.subsec_micros() as libc::suseconds_t,
    };
    // SAFETY: `tv` is a valid timeval of the stated size.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    })?;
    Ok(())
}

/// Sets a send timeout on a socket (a blocking send then fails with
/// `WouldBlock` after `t` instead of waiting for a reader that never reads).
pub fn set_send_timeout(fd: RawFd, t: std::time::Duration) -> io::Result<()> {
    let tv = libc::timeval {
        tv_sec: t.as_secs() as libc::time_t,
        tv_usec: t.subsec_micros() as libc::suseconds_t,
    };
    // SAFETY: `tv` is a valid timeval of the stated size.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_SNDTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    })?;
    Ok(())
}

/// Blocks `SIGTERM`, `SIGINT` and `SIGHUP` in the calling thread (call it
/// while the process has one thread, so that every later thread inherits
/// the mask) and returns a non-blocking `signalfd` that becomes readable
/// when one arrives: a daemon polls it to exit cleanly.
pub fn termination_signals() -> io::Result<OwnedFd> {
    // SAFETY: `set` is written by sigemptyset before it is read.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset; the calls only write it.
    unsafe {
        libc::sigemptyset(&mut set);
        for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaddset(&mut set, sig);
        }
    }
    // SAFETY: `set` is initialised; the old mask is not asked for.
    let r = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if r != 0 {
        return Err(io::Error::from_raw_os_error(r));
    }
    // SAFETY: `set` is initialised; -1 asks for a new descriptor.
    let fd = cvt(unsafe { libc::signalfd(-1, &set, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC) })?;
    // SAFETY: signalfd returned a fresh descriptor that nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Reads one pending signal from a [`termination_signals`] descriptor:
/// its number, or `None` if none is pending.
pub fn read_signal(fd: &OwnedFd) -> Option<i32> {
    // SAFETY: an all-zero signalfd_siginfo is a valid value.
    let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
    let len = std::mem::size_of::<libc::signalfd_siginfo>();
    // SAFETY: `info` is a writable buffer of `len` bytes.
    let n = unsafe {
        libc::read(
            fd.as_raw_fd(),
            (&mut info as *mut libc::signalfd_siginfo).cast(),
            len,
        )
    };
    (n == len as isize).then_some(info.ssi_signo as i32)
}

/// Detaches the calling process from its session and terminal (`setsid`).
pub fn setsid() -> io::Result<()> {
    // SAFETY: plain syscall.
    cvt(unsafe { libc::setsid() })?;
    Ok(())
}

/// Host name (`gethostname`).
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: `buf` is valid for its length.
    let r = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if r != 0 {
        return "localhost".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// Number of threads in this process (from `/proc/self/status`).
pub fn thread_count() -> Option<usize> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Forks; the parent exits at once with status 0 and the child returns,
/// detached from the session and with stdio on `/dev/null` (or on `log`).
/// Only allowed while the process has a single thread.
pub fn daemonize(log: Option<&std::path::Path>) -> io::Result<()> {
    if thread_count() != Some(1) {
        return Err(io::Error::other(
            "daemonize needs a single-threaded process",
        ));
    }
    // SAFETY: the process has one thread (checked above), so the child is a
    // complete copy and may run arbitrary code.
    let pid = unsafe { libc::fork() };
    match pid {
        -1 => Err(io::Error::last_os_error()),
        0 => {
            setsid()?;
            let null = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/null")?;
            let out = match log {
                Some(p) => std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)?,
                None => null.try_clone()?,
            };
            for (src, dst) in [
                (null.as_raw_fd(), 0),
                (out.as_raw_fd(), 1),
                (out.as_raw_fd(), 2),
            ] {
                // SAFETY: dup2 onto the standard descriptors, which we own.
                cvt(unsafe { libc::dup2(src, dst) })?;
            }
            Ok(())
        }
        // SAFETY: _exit skips atexit handlers and destructors that belong to the child now.
        _ => unsafe { libc::_exit(0) },
    }
}

/// Path of the shared object (or executable) that contains this code, from
/// `dladdr`: lets `libvipl.so` find the `viad` installed beside it.
pub fn own_object_path() -> Option<std::path::PathBuf> {
    // SAFETY: `info` is written by dladdr before it is read; the address is
    // that of a function in this object.
    unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        let addr = own_object_path as *const () as *const libc::c_void;
        if libc::dladdr(addr, &mut info) == 0 || info.dli_fname.is_null() {
            return None;
        }
        let c = std::ffi::CStr::from_ptr(info.dli_fname);
        Some(std::path::PathBuf::from(
            std::ffi::OsStr::from_encoded_bytes_unchecked(c.to_bytes()),
        ))
    }
}

/// Pins the calling thread to `cpu` (`sched_setaffinity`).
pub fn pin_to_cpu(cpu: usize) -> io::Result<()> {
    // SAFETY: `set` is a plain bit set initialised by CPU_ZERO/CPU_SET.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_ZERO(&mut set);
        libc::CPU_SET(cpu, &mut set);
        cvt(libc::sched_setaffinity(
            0,
            std::mem::size_of::<libc::cpu_set_t>(),
            &set,
        ))?;
    }
    Ok(())
}

/// Lets the calling thread run on every CPU (undoes a pinning it
/// inherited from the thread that created it).
pub fn allow_all_cpus() -> io::Result<()> {
    // SAFETY: `set` is a plain bit set initialised by CPU_ZERO/CPU_SET.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_ZERO(&mut set);
        for cpu in 0..cpu_count().min(libc::CPU_SETSIZE as usize) {
            libc::CPU_SET(cpu, &mut set);
        }
        cvt(libc::sched_setaffinity(
            0,
            std::mem::size_of::<libc::cpu_set_t>(),
            &set,
        ))?;
    }
    Ok(())
}

/// Number of online CPUs (not limited by this process's affinity mask).
pub fn cpu_count() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    if n < 1 { 1 } else { n as usize }
}

/// Clears `FD_CLOEXEC` so that a child process inherits `fd`.
pub fn clear_cloexec(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor the caller holds.
    let flags = cvt(unsafe { libc::fcntl(fd, libc::F_GETFD) })?;
    // SAFETY: as above.
    cvt(unsafe { libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) })?;
    Ok(())
}

/// Closes every descriptor above 2 (a daemon started by a library must not
/// keep the application's pipes and sockets open).
pub fn close_inherited_fds() {
    // SAFETY: close_range has no memory arguments; closing descriptors we
    // inherited and do not use is the point.
    let r = unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) };
    if r == 0 {
        return;
    }
    // Kernels before 5.9: walk /proc/self/fd.
    let fds: Vec<RawFd> = std::fs::read_dir("/proc/self/fd")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    for fd in fds.into_iter().filter(|&fd| fd > 2) {
        // SAFETY: as above.
        unsafe { libc::close(fd) };
    }
}

/// `madvise(2)` on a page-aligned range.
pub fn madvise(r: &std::ops::Range<usize>, advice: libc::c_int) -> io::Result<()> {
    // SAFETY: madvise with DONTFORK/DOFORK/REMOVE-like advice changes no
    // memory this process reads through Rust references; the kernel
    // validates the range.
    cvt(unsafe { libc::madvise(r.start as *mut libc::c_void, r.end - r.start, advice) })?;
    Ok(())
}

/// Writes `len` bytes of this process's memory at `addr` into `fd` at
/// `off` (`pwrite`): the kernel validates the source, so an unmapped
/// source is an `EFAULT`, never a crash.
pub fn pwrite_from_memory(fd: &OwnedFd, addr: usize, len: usize, off: u64) -> io::Result<()> {
    let mut done = 0usize;
    while done < len {
        // SAFETY: pwrite only reads `addr + done ..` in the kernel, which
        // checks the range; no Rust reference is created.
        let r = unsafe {
            libc::pwrite(
                fd.as_raw_fd(),
                (addr + done) as *const libc::c_void,
                len - done,
                (off + done as u64) as libc::off_t,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if r == 0 {
            return Err(io::Error::from(io::ErrorKind::WriteZero));
        }
        done += r as usize;
    }
    Ok(())
}

/// Maps `fd` at `off` shared over the page-aligned range `r` (`MAP_FIXED`).
///
/// # Safety
/// `r` must be memory of this process whose contents the caller has
/// copied into `fd` at `off`, and that no Rust reference points into
/// (the pages are replaced).
pub unsafe fn map_fixed_shared(
    r: &std::ops::Range<usize>,
    prot: i32,
    fd: &OwnedFd,
    off: u64,
) -> io::Result<()> {
    // SAFETY: the caller's contract.
    let m = unsafe {
        libc::mmap(
            r.start as *mut libc::c_void,
            r.end - r.start,
            prot,
            libc::MAP_SHARED | libc::MAP_FIXED,
            fd.as_raw_fd(),
            off as libc::off_t,
        )
    };
    if m == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Replaces the mapping over the page-aligned range `r` by private
/// anonymous memory with the same contents and protection `prot`: a copy
/// is built aside and moved over `r` with one `mremap` (atomic for other
/// threads: they see the old or the new pages, never a hole).
///
/// # Safety
/// `r` must be readable memory of this process that nobody writes while
/// the copy is made, and that no Rust reference points into.
pub unsafe fn replace_with_private_copy(r: &std::ops::Range<usize>, prot: i32) -> io::Result<()> {
    let len = r.end - r.start;
    // SAFETY: a fresh private anonymous mapping aliases nothing.
    let tmp = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if tmp == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `r` is readable (caller), `tmp` is ours and writable; they do
    // not overlap (the kernel chose `tmp` in free space).
    unsafe { std::ptr::copy_nonoverlapping(r.start as *const u8, tmp.cast::<u8>(), len) };
    let fix = || -> io::Result<()> {
        if prot != libc::PROT_READ | libc::PROT_WRITE {
            // SAFETY: `tmp` is our own mapping.
            cvt(unsafe { libc::mprotect(tmp, len, prot) })?;
        }
        // SAFETY: moves our mapping `tmp` over `r` (the caller's contract).
        let m = unsafe {
            libc::mremap(
                tmp,
                len,
                len,
                libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                r.start as *mut libc::c_void,
            )
        };
        if m == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    };
    let res = fix();
    if res.is_err() {
        // SAFETY: `tmp` is still our own mapping (the move failed).
        unsafe { libc::munmap(tmp, len) };
    }
    res
}

/// Unmaps the page-aligned range `r`.
///
/// # Safety
/// Nothing may use `r` afterwards (no Rust reference, no mapping object
/// that would unmap it again).
pub unsafe fn munmap_range(r: &std::ops::Range<usize>) {
    // SAFETY: the caller's contract.
    unsafe { libc::munmap(r.start as *mut libc::c_void, r.end - r.start) };
}

/// Installs fork handlers (`pthread_atfork`).
pub fn atfork(
    prepare: unsafe extern "C" fn(),
    parent: unsafe extern "C" fn(),
    child: unsafe extern "C" fn(),
) -> io::Result<()> {
    // SAFETY: the handlers are plain functions valid for the whole process.
    let r = unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
    if r != 0 {
        return Err(io::Error::from_raw_os_error(r));
    }
    Ok(())
}

/// The IPv4 addresses of network interface `ifname` (`getifaddrs`), in the
/// order the kernel lists them.
pub fn interface_ipv4(ifname: &str) -> io::Result<Vec<std::net::Ipv4Addr>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `head` is a valid out-pointer; on success the list is freed
    // below with `freeifaddrs`.
    cvt(unsafe { libc::getifaddrs(&mut head) })?;
    let mut out = Vec::new();
    let mut p = head;
    while !p.is_null() {
        // SAFETY: `p` is a node of the list `getifaddrs` returned, alive
        // until `freeifaddrs`; its name is a NUL-terminated string and its
        // address, when not NULL and of family AF_INET, a `sockaddr_in`.
        unsafe {
            let ifa = &*p;
            let name = std::ffi::CStr::from_ptr(ifa.ifa_name);
            if !ifa.ifa_addr.is_null()
                && (*ifa.ifa_addr).sa_family as libc::c_int == libc::AF_INET
                && name.to_bytes() == ifname.as_bytes()
            {
                let sin = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                out.push(std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)));
            }
            p = ifa.ifa_next;
        }
    }
    // SAFETY: `head` came from a successful `getifaddrs` and is freed once.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}
