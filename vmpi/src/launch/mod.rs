//! The local launcher behind `via-run`: starts the processes of a job on
//! this host with their rank and the job's rendezvous data, serves their
//! key-value exchange ([`kvs`]), forwards SIGINT/SIGTERM/SIGHUP to them, and
//! ends the job when one fails: the others are terminated (SIGTERM, then
//! SIGKILL after a grace period), every child is reaped, and the job's exit
//! code is the failed process's (`128 + signal` for a signal).
//!
//! No orphans: children die with the launcher (`PR_SET_PDEATHSIG`), even
//! when it is killed with SIGKILL. A process that initialised the library
//! and exits without finalizing counts as failed (its peers could wait for
//! it forever otherwise).
#![deny(unsafe_code)]

pub mod kvs;
#[allow(unsafe_code)]
pub mod sys;

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::pmi;
use sys::Exit;

/// How long terminated processes get before SIGKILL.
pub const GRACE: Duration = Duration::from_secs(3);

/// What to run.
#[derive(Clone, Debug)]
pub struct Spec {
    /// Processes.
    pub n: u32,
    /// Program and arguments.
    pub argv: Vec<String>,
    /// Extra environment for every process.
    pub env: Vec<(String, String)>,
}

struct Proc {
    rank: u32,
    child: Option<Child>,
    exit: Option<Exit>,
    hello: bool,
    finalized: bool,
    /// Its PMI connection closed: every event it sent has been seen.
    closed: bool,
}

impl Proc {
    /// Exited with 0 after MPI_Init, and whether it finalized is not known
    /// yet (its `finalize` may still be in the socket).
    fn undecided(&self) -> bool {
        self.exit == Some(Exit::Code(0)) && self.hello && !self.finalized && !self.closed
    }
}

/// A private directory for the job's socket, removed on drop.
struct JobDir(PathBuf);

impl Drop for JobDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn job_id() -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    format!("{:x}{:x}", std::process::id(), t & 0xffff_ffff)
}

/// Runs a job to its end; returns the job's exit code.
///
/// # Errors
/// A message if the job could not be started (no such program, no socket).
pub fn run(spec: &Spec) -> Result<i32, String> {
    if spec.n == 0 || spec.argv.is_empty() {
        return Err("nothing to run".into());
    }
    // Before any thread exists, so that every thread inherits the mask.
    sys::block_handled();
    let job = job_id();
    let dir = std::env::temp_dir().join(format!("via-run-{job}"));
    std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let dir = JobDir(dir);
    let sock = dir.0.join("pmi.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock)
        .map_err(|e| format!("{}: {e}", sock.display()))?;
    let (tx, rx) = mpsc::channel();
    kvs::Kvs::serve(listener, spec.n, tx);

    let oversubscribed = spec.n as usize > sys::cpus();
    // With a core per process, rank r is bound to the r-th CPU this
    // launcher may use (as Open MPI's mpirun binds to cores by default):
    // on a loaded machine an unbound pair of polling processes can share a
    // core while the other runs something else. VMPI_BIND=none: unbound.
    let cpus = sys::allowed_cpus();
    let bind = spec.n as usize <= cpus.len()
        && !matches!(std::env::var("VMPI_BIND").as_deref(), Ok("none"));
    let me = std::process::id();
    let mut procs: Vec<Proc> = Vec::new();
    let mut by_pid: HashMap<u32, usize> = HashMap::new();
    let mut failure: Option<(u32, Exit)> = None;
    for rank in 0..spec.n {
        let mut cmd = Command::new(&spec.argv[0]);
        cmd.args(&spec.argv[1..])
            .env(pmi::ENV_RANK, rank.to_string())
            .env(pmi::ENV_SIZE, spec.n.to_string())
            .env(pmi::ENV_JOB, &job)
            .env(pmi::ENV_ADDR, &sock);
        if oversubscribed {
            // More processes than cores: waits block early (docs/vmpi.md).
            cmd.env("VMPI_OVERSUBSCRIBED", "1");
            if std::env::var_os("VIA_SPIN_US").is_none() {
                cmd.env("VIA_SPIN_US", "2");
            }
        }
        for (k, v) in &spec.env {
            cmd.env(k, v);
        }
        if rank != 0 {
            cmd.stdin(Stdio::null());
        }
        sys::prepare_child(&mut cmd, me, bind.then(|| cpus[rank as usize]));
        match cmd.spawn() {
            Ok(child) => {
                by_pid.insert(child.id(), procs.len());
                procs.push(Proc {
                    rank,
                    child: Some(child),
                    exit: None,
                    hello: false,
                    finalized: false,
                    closed: false,
                });
            }
            Err(e) => {
                log::error!("cannot start {}: {e}", spec.argv[0]);
                failure = Some((rank, Exit::Code(127)));
                break;
            }
        }
    }

    let mut kill_at: Option<Instant> = None;
    let mut signalled: Option<i32> = None;
    let terminate = |procs: &[Proc], sig: i32| {
        for p in procs.iter().filter(|p| p.exit.is_none()) {
            if let Some(c) = &p.child {
                sys::kill(c.id(), sig);
            }
        }
    };
    if failure.is_some() {
        terminate(&procs, libc::SIGTERM);
        kill_at = Some(Instant::now() + GRACE);
    }
    while procs.iter().any(|p| p.exit.is_none() || p.undecided()) {
        let timeout = kill_at.map_or(Duration::from_secs(3600), |t| {
            t.saturating_duration_since(Instant::now())
        });
        let sig = sys::wait_signal(timeout);
        if kill_at.is_some_and(|t| Instant::now() >= t) {
            terminate(&procs, libc::SIGKILL);
        }
        match sig {
            Some(s) if s == libc::SIGINT || s == libc::SIGTERM || s == libc::SIGHUP => {
                if signalled.is_some() {
                    terminate(&procs, libc::SIGKILL);
                } else {
                    signalled = Some(s);
                    terminate(&procs, s);
                    kill_at.get_or_insert(Instant::now() + GRACE);
                }
            }
            _ => {}
        }
        // PMI events (SIGUSR1) and exits (SIGCHLD): look at both every time.
        while let Ok(ev) = rx.try_recv() {
            match ev {
                kvs::Event::Hello(r) => {
                    if let Some(p) = procs.iter_mut().find(|p| p.rank == r) {
                        p.hello = true;
                    }
                }
                kvs::Event::Finalize(r) => {
                    if let Some(p) = procs.iter_mut().find(|p| p.rank == r) {
                        p.finalized = true;
                    }
                }
                kvs::Event::Closed(r) => {
                    if let Some(p) = procs.iter_mut().find(|p| p.rank == r) {
                        p.closed = true;
                        if p.exit == Some(Exit::Code(0))
                            && !p.finalized
                            && failure.is_none()
                            && signalled.is_none()
                        {
                            log::error!("rank {r} exited without finalizing");
                            failure = Some((r, Exit::Code(1)));
                            terminate(&procs, libc::SIGTERM);
                            kill_at = Some(Instant::now() + GRACE);
                        }
                    }
                }
                kvs::Event::Abort(r, code, msg) => {
                    log::error!("rank {r} aborted the job (code {code}): {msg}");
                    if failure.is_none() {
                        failure = Some((r, Exit::Code(code)));
                        terminate(&procs, libc::SIGKILL);
                    }
                }
            }
        }
        while let Some((pid, exit)) = sys::reap() {
            let Some(&i) = by_pid.get(&pid) else { continue };
            let p = &mut procs[i];
            p.exit = Some(exit);
            p.child.take();
            // An exit 0 without finalize is judged when the connection
            // closes (the `finalize` line may still be on its way).
            let failed = match exit {
                Exit::Code(0) => p.hello && !p.finalized && p.closed,
                _ => true,
            };
            if failed && failure.is_none() && signalled.is_none() {
                let exit = if exit == Exit::Code(0) {
                    log::error!("rank {} exited without finalizing", p.rank);
                    Exit::Code(1)
                } else {
                    log::error!("rank {} failed ({exit:?}); ending the job", p.rank);
                    exit
                };
                failure = Some((p.rank, exit));
                terminate(&procs, libc::SIGTERM);
                kill_at = Some(Instant::now() + GRACE);
            }
        }
    }
    Ok(match (failure, signalled) {
        (Some((_, e)), _) => e.code().max(1),
        (None, Some(s)) => 128 + s,
        (None, None) => 0,
    })
}
