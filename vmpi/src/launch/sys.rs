//! The system calls the launcher needs that std does not wrap: signal
//! masks and synchronous signal waits, kill, non-blocking reaping, and the
//! child-side set-up before `exec`.

use std::time::Duration;

/// The signals the launcher handles synchronously (blocked in every
/// thread, taken with [`wait_signal`]).
pub const HANDLED: [i32; 5] = [
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGCHLD,
    libc::SIGUSR1,
];

fn set_of(sigs: &[i32]) -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset initialise and fill a local sigset_t;
    // a zeroed sigset_t is a valid argument to sigemptyset.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &s in sigs {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

/// Blocks [`HANDLED`] in the calling thread (and the threads it starts
/// afterwards, which inherit the mask).
pub fn block_handled() {
    let set = set_of(&HANDLED);
    // SAFETY: `set` is initialised; the old mask is not wanted (NULL).
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
}

/// Waits up to `timeout` for one of [`HANDLED`]; `None` on timeout.
pub fn wait_signal(timeout: Duration) -> Option<i32> {
    let set = set_of(&HANDLED);
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `set` and `ts` are initialised locals; the siginfo is not wanted.
    let r = unsafe { libc::sigtimedwait(&set, std::ptr::null_mut(), &ts) };
    (r > 0).then_some(r)
}

/// Sends `sig` to process `pid` (errors, such as a process already gone,
/// are ignored: the caller reaps and learns the outcome there).
pub fn kill(pid: u32, sig: i32) {
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(pid as libc::pid_t, sig) };
}

/// Raises `SIGUSR1` for this process: wakes the launcher's signal wait.
pub fn wake_launcher() {
    // SAFETY: kill of our own pid has no memory-safety preconditions.
    unsafe { libc::kill(libc::getpid(), libc::SIGUSR1) };
}

/// How a child ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// Exited with this code.
    Code(i32),
    /// Killed by this signal.
    Signal(i32),
}

impl Exit {
    /// The shell's exit code for this outcome (`128 + signal`).
    pub fn code(self) -> i32 {
        match self {
            Exit::Code(c) => c,
            Exit::Signal(s) => 128 + s,
        }
    }
}

/// Reaps one exited child without blocking.
pub fn reap() -> Option<(u32, Exit)> {
    let mut status = 0;
    // SAFETY: `status` is a valid out-pointer; WNOHANG never blocks.
    let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
    if pid <= 0 {
        return None;
    }
    let exit = if libc::WIFEXITED(status) {
        Exit::Code(libc::WEXITSTATUS(status))
    } else {
        Exit::Signal(libc::WTERMSIG(status))
    };
    Some((pid as u32, exit))
}

/// Set-up of a child between `fork` and `exec`: the launcher's blocked
/// signals unblocked, its own process group (signals reach it only through
/// the launcher), and death when the launcher dies (no orphans even if the
/// launcher is killed with SIGKILL).
///
/// `cpu`: the CPU the child is bound to (`sched_setaffinity`), if any.
pub fn prepare_child(cmd: &mut std::process::Command, launcher: u32, cpu: Option<usize>) {
    use std::os::unix::process::CommandExt;
    let bind = cpu.map(|c| {
        // SAFETY: CPU_ZERO/CPU_SET fill a zeroed local cpu_set_t; `c` is
        // below CPU_SETSIZE (checked).
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_ZERO(&mut set);
            if c < libc::CPU_SETSIZE as usize {
                libc::CPU_SET(c, &mut set);
            }
            set
        }
    });
    // SAFETY: the closure runs in the forked child before exec and calls
    // only async-signal-safe functions (sigprocmask, setpgid, prctl,
    // sched_setaffinity, getppid, _exit) on local data.
    unsafe {
        cmd.pre_exec(move || {
            if let Some(set) = &bind {
                // Best effort: a failure leaves the child unbound.
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set);
            }
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
            libc::setpgid(0, 0);
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            // The launcher may have died between fork and prctl.
            if libc::getppid() as u32 != launcher {
                libc::_exit(127);
            }
            Ok(())
        });
    }
}

/// The CPUs this process may run on, in order (its affinity mask).
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: sched_getaffinity fills a zeroed local cpu_set_t of the size
    // given; CPU_ISSET reads it for indices below CPU_SETSIZE.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

/// The number of online CPUs.
pub fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}
