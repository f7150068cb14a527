//! A thin, safe wrapper over `userfaultfd(2)`: the only `unsafe` of the
//! memory-event machinery.
//!
//! The registration path uses two descriptors of this kind (see the module
//! docs of [`super`]): one with the non-cooperative events (`UNMAP`,
//! `REMOVE`, `REMAP`) that tell the registration cache when memory goes
//! away, and one without events that write-protects pages while they move
//! into shared memory, so that writers wait instead of losing their writes.
//!
//! The constants are those of `<linux/userfaultfd.h>` (Linux 6.4+ for
//! `WP_UNPOPULATED`); they are spelled out here because the C headers of
//! older distributions lack some of them.

use std::io;
use std::ops::Range;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

const UFFD_API: u64 = 0xAA;
const UFFD_USER_MODE_ONLY: libc::c_int = 1;

const fn ioc(dir: u64, nr: u64, size: u64) -> u64 {
    (dir << 30) | (size << 16) | (0xAA << 8) | nr
}
const IOC_WRITE: u64 = 1;
const IOC_READ: u64 = 2;
const UFFDIO_API: u64 = ioc(IOC_READ | IOC_WRITE, 0x3F, 24);
const UFFDIO_REGISTER: u64 = ioc(IOC_READ | IOC_WRITE, 0x00, 32);
const UFFDIO_UNREGISTER: u64 = ioc(IOC_READ, 0x01, 16);
const UFFDIO_WAKE: u64 = ioc(IOC_READ, 0x02, 16);
const UFFDIO_WRITEPROTECT: u64 = ioc(IOC_READ | IOC_WRITE, 0x06, 24);

/// Feature bits (`UFFD_FEATURE_*`).
pub mod feature {
    /// `UFFD_EVENT_REMAP` on `mremap`.
    pub const EVENT_REMAP: u64 = 1 << 2;
    /// `UFFD_EVENT_REMOVE` on `madvise(MADV_DONTNEED/REMOVE/FREE)`.
    pub const EVENT_REMOVE: u64 = 1 << 3;
    /// `UFFD_EVENT_UNMAP` on `munmap`, `brk` shrink, `mmap(MAP_FIXED)` over a range.
    pub const EVENT_UNMAP: u64 = 1 << 6;
    /// Write protection of shmem (and hugetlbfs) mappings (Linux 5.19+).
    pub const WP_HUGETLBFS_SHMEM: u64 = 1 << 12;
    /// Write protection also covers pages never touched (Linux 6.4+).
    pub const WP_UNPOPULATED: u64 = 1 << 13;
}

/// Registration modes (`UFFDIO_REGISTER_MODE_*`).
pub mod mode {
    /// Faults on pages never touched (none mapped yet) go to the
    /// descriptor.
    pub const MISSING: u64 = 1;
    /// Write-protect faults go to the descriptor.
    pub const WP: u64 = 2;
}

const EVENT_PAGEFAULT: u8 = 0x12;
const EVENT_FORK: u8 = 0x13;
const EVENT_REMAP: u8 = 0x14;
const EVENT_REMOVE: u8 = 0x15;
const EVENT_UNMAP: u8 = 0x16;

/// Size of one `struct uffd_msg`.
pub const MSG_SIZE: usize = 32;

/// One message read from a userfaultfd.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A fault (here: a write to a write-protected page) at `addr`.
    PageFault {
        /// Faulting address.
        addr: u64,
    },
    /// `start..end` was unmapped (munmap, brk shrink, MAP_FIXED over it).
    Unmap {
        /// First byte.
        start: u64,
        /// End (exclusive).
        end: u64,
    },
    /// `madvise(MADV_DONTNEED/FREE/REMOVE)` on `start..end`.
    Remove {
        /// First byte.
        start: u64,
        /// End (exclusive).
        end: u64,
    },
    /// `mremap` moved `len` bytes from `from` to `to`.
    Remap {
        /// Old address.
        from: u64,
        /// New address.
        to: u64,
        /// Old length.
        len: u64,
    },
    /// Anything else (a fork event, a future kind): ignored, but counted.
    Other(u8),
}

impl Event {
    /// Decodes one `struct uffd_msg`.
    pub fn parse(m: &[u8; MSG_SIZE]) -> Event {
        let u = |i: usize| u64::from_ne_bytes(m[8 + 8 * i..16 + 8 * i].try_into().unwrap());
        match m[0] {
            EVENT_PAGEFAULT => Event::PageFault { addr: u(1) },
            EVENT_UNMAP => Event::Unmap {
                start: u(0),
                end: u(1),
            },
            EVENT_REMOVE => Event::Remove {
                start: u(0),
                end: u(1),
            },
            EVENT_REMAP => Event::Remap {
                from: u(0),
                to: u(1),
                len: u(2),
            },
            k @ EVENT_FORK => Event::Other(k),
            k => Event::Other(k),
        }
    }
}

/// An open userfaultfd with its negotiated features.
#[derive(Debug)]
pub struct Uffd {
    fd: OwnedFd,
    /// Whether faults raised by the kernel itself (a `read(2)` into a
    /// protected page) are handled too; `false` for a user-mode-only
    /// descriptor, where such a system call fails with `EFAULT` instead.
    pub kernel_faults: bool,
}

#[repr(C)]
struct Range64 {
    start: u64,
    len: u64,
}

fn range64(r: &Range<usize>) -> Range64 {
    Range64 {
        start: r.start as u64,
        len: (r.end - r.start) as u64,
    }
}

fn ioctl<T>(fd: RawFd, req: u64, arg: &mut T) -> io::Result<()> {
    // SAFETY: `arg` is a live, exclusively borrowed #[repr(C)] struct whose
    // size is encoded in `req`; the kernel reads and writes only within it.
    let r = unsafe { libc::ioctl(fd, req as _, arg as *mut T) };
    if r == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

impl Uffd {
    /// Opens a non-blocking, close-on-exec userfaultfd with `features`.
    /// Tries a descriptor that also handles kernel faults first (root, or
    /// `vm.unprivileged_userfaultfd = 1`), then a user-mode-only one.
    ///
    /// # Errors
    /// The system call's error (`ENOSYS`, `EPERM` under seccomp), or
    /// `Unsupported` if the kernel lacks one of `features`.
    pub fn open(features: u64) -> io::Result<Uffd> {
        let base = libc::O_CLOEXEC | libc::O_NONBLOCK;
        let mut last = None;
        for (flags, kernel_faults) in [(base, true), (base | UFFD_USER_MODE_ONLY, false)] {
            // SAFETY: plain system call with integer arguments.
            let r = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) };
            if r < 0 {
                last = Some(io::Error::last_os_error());
                continue;
            }
            // SAFETY: the system call returned a fresh descriptor we own.
            let fd = unsafe { OwnedFd::from_raw_fd(r as RawFd) };
            #[repr(C)]
            struct Api {
                api: u64,
                features: u64,
                ioctls: u64,
            }
            let mut api = Api {
                api: UFFD_API,
                features,
                ioctls: 0,
            };
            if let Err(e) = ioctl(fd.as_raw_fd(), UFFDIO_API, &mut api) {
                let e = if e.raw_os_error() == Some(libc::EINVAL) {
                    io::Error::new(
                        io::ErrorKind::Unsupported,
                        format!("userfaultfd lacks features {features:#x}"),
                    )
                } else {
                    e
                };
                return Err(e);
            }
            return Ok(Uffd { fd, kernel_faults });
        }
        Err(last.unwrap_or_else(|| io::Error::from(io::ErrorKind::Unsupported)))
    }

    /// Registers `range` (page aligned) in `mode` ([`mode`]).
    pub fn register(&self, range: &Range<usize>, mode: u64) -> io::Result<()> {
        #[repr(C)]
        struct Reg {
            range: Range64,
            mode: u64,
            ioctls: u64,
        }
        let mut r = Reg {
            range: range64(range),
            mode,
            ioctls: 0,
        };
        ioctl(self.fd.as_raw_fd(), UFFDIO_REGISTER, &mut r)
    }

    /// Unregisters `range` (write protection in it is dropped).
    pub fn unregister(&self, range: &Range<usize>) -> io::Result<()> {
        let mut r = range64(range);
        ioctl(self.fd.as_raw_fd(), UFFDIO_UNREGISTER, &mut r)
    }

    /// Write-protects `range` (`on`) or removes the protection (and wakes
    /// the writers waiting in it).
    pub fn write_protect(&self, range: &Range<usize>, on: bool) -> io::Result<()> {
        #[repr(C)]
        struct Wp {
            range: Range64,
            mode: u64,
        }
        let mut w = Wp {
            range: range64(range),
            mode: if on { 1 } else { 0 },
        };
        ioctl(self.fd.as_raw_fd(), UFFDIO_WRITEPROTECT, &mut w)
    }

    /// Wakes the threads waiting on faults in `range` (they retry the access).
    pub fn wake(&self, range: &Range<usize>) -> io::Result<()> {
        let mut r = range64(range);
        ioctl(self.fd.as_raw_fd(), UFFDIO_WAKE, &mut r)
    }

    /// Reads pending messages into `buf` without blocking; returns how many.
    /// Allocates nothing (the event reader must never free memory: a free
    /// can unmap, and an unmap waits for this reader).
    pub fn read(&self, buf: &mut [[u8; MSG_SIZE]]) -> io::Result<usize> {
        // SAFETY: `buf` is valid for writes of its whole length.
        let n = unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                std::mem::size_of_val(buf),
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock => Ok(0),
                _ => Err(e),
            };
        }
        Ok(n as usize / MSG_SIZE)
    }

    /// The descriptor, for `poll`.
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_numbers_match_the_kernel_headers() {
        // Values from <linux/userfaultfd.h> on x86_64.
        assert_eq!(UFFDIO_API, 0xc018aa3f);
        assert_eq!(UFFDIO_REGISTER, 0xc020aa00);
        assert_eq!(UFFDIO_UNREGISTER, 0x8010aa01);
        assert_eq!(UFFDIO_WAKE, 0x8010aa02);
        assert_eq!(UFFDIO_WRITEPROTECT, 0xc018aa06);
    }

    #[test]
    fn parses_messages() {
        let mut m = [0u8; MSG_SIZE];
        m[0] = EVENT_UNMAP;
        m[8..16].copy_from_slice(&0x1000u64.to_ne_bytes());
        m[16..24].copy_from_slice(&0x3000u64.to_ne_bytes());
        assert_eq!(
            Event::parse(&m),
            Event::Unmap {
                start: 0x1000,
                end: 0x3000
            }
        );
        m[0] = EVENT_REMAP;
        m[24..32].copy_from_slice(&0x2000u64.to_ne_bytes());
        assert_eq!(
            Event::parse(&m),
            Event::Remap {
                from: 0x1000,
                to: 0x3000,
                len: 0x2000
            }
        );
        m[0] = 0x77;
        assert_eq!(Event::parse(&m), Event::Other(0x77));
    }
}
