//! The launch interface: a PMI-like key-value exchange (put, fence, get).
//!
//! A process started by a launcher finds in its environment its rank, the
//! job's size and id, and the address of the launcher's key-value service
//! (a unix socket). [`Pmi::put`] stages pairs locally; [`Pmi::fence`] sends
//! them and returns when every process of the job has fenced, with every
//! pair put by anyone before that fence; [`Pmi::get`] then reads locally.
//! That is PMI-1's model, so a resource manager's PMI can take this
//! module's place: only [`Pmi`] is used by the rest of the library.
//!
//! A process started without a launcher is a job of one (a "singleton").
//!
//! The wire protocol is line-based text (keys and values carry no blanks):
//!
//! | client → launcher | launcher → client |
//! |---|---|
//! | `hello <rank>` | |
//! | `fence <n>` then `n` lines `<key> <value>` | `kvs <m>` then `m` lines `<key> <value>` |
//! | `abort <code> <message>` | (the launcher ends the job) |
//! | `finalize` | |
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;

use crate::error::{Error, Result};

/// Environment variable: this process's rank.
pub const ENV_RANK: &str = "VMPI_RANK";
/// Environment variable: the number of processes of the job.
pub const ENV_SIZE: &str = "VMPI_SIZE";
/// Environment variable: the job's id (unique on the host while it runs).
pub const ENV_JOB: &str = "VMPI_JOB";
/// Environment variable: path of the launcher's key-value socket.
pub const ENV_ADDR: &str = "VMPI_PMI_ADDR";
/// How long an aborting process waits for its launcher to end it
/// ([`Pmi::abort`]); the launcher acts at once, so this only bounds a
/// launcher that is stuck.
pub const ABORT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// A process's connection to its launcher's key-value service.
pub struct Pmi {
    rank: u32,
    size: u32,
    job: String,
    conn: Option<(BufReader<UnixStream>, UnixStream)>,
    staged: Vec<(String, String)>,
    kvs: HashMap<String, String>,
}

fn env_u32(name: &str) -> Result<u32> {
    std::env::var(name)
        .map_err(|_| Error::Intern(format!("{name} is not set")))?
        .parse()
        .map_err(|_| Error::Intern(format!("{name} is not a number")))
}

fn broken(e: std::io::Error) -> Error {
    Error::Transport(format!("launcher connection: {e}"))
}

impl Pmi {
    /// Connects to the launcher named by the environment, or makes a
    /// singleton job when no launcher started this process.
    ///
    /// # Errors
    /// `Intern` for an inconsistent environment, `Transport` if the
    /// launcher cannot be reached.
    pub fn from_env() -> Result<Pmi> {
        let Ok(addr) = std::env::var(ENV_ADDR) else {
            return Ok(Pmi {
                rank: 0,
                size: 1,
                job: format!("single{}", std::process::id()),
                conn: None,
                staged: Vec::new(),
                kvs: HashMap::new(),
            });
        };
        let (rank, size) = (env_u32(ENV_RANK)?, env_u32(ENV_SIZE)?);
        if size == 0 || rank >= size {
            return Err(Error::Intern(format!("rank {rank} of a job of {size}")));
        }
        let job =
            std::env::var(ENV_JOB).map_err(|_| Error::Intern(format!("{ENV_JOB} is not set")))?;
        let stream = UnixStream::connect(&addr).map_err(broken)?;
        let mut w = stream.try_clone().map_err(broken)?;
        writeln!(w, "hello {rank}").map_err(broken)?;
        Ok(Pmi {
            rank,
            size,
            job,
            conn: Some((BufReader::new(stream), w)),
            staged: Vec::new(),
            kvs: HashMap::new(),
        })
    }

    /// This process's rank in the job.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Processes in the job.
    pub fn size(&self) -> u32 {
        self.size
    }

    /// The job's id.
    pub fn job(&self) -> &str {
        &self.job
    }

    /// Stages `key = value` for the next fence.
    ///
    /// # Errors
    /// `Arg` if the key or value is empty or holds a blank or newline.
    pub fn put(&mut self, key: &str, value: &str) -> Result<()> {
        let bad = |s: &str| s.is_empty() || s.chars().any(char::is_whitespace);
        if bad(key) || bad(value) {
            return Err(Error::Arg(format!("PMI key or value {key:?} = {value:?}")));
        }
        self.staged.push((key.to_string(), value.to_string()));
        Ok(())
    }

    /// Publishes the staged pairs and waits until every process has fenced;
    /// afterwards [`Pmi::get`] sees every pair put before this fence.
    ///
    /// # Errors
    /// `Transport` if the launcher went away.
    pub fn fence(&mut self) -> Result<()> {
        let staged = std::mem::take(&mut self.staged);
        let Some((r, w)) = self.conn.as_mut() else {
            self.kvs.extend(staged);
            return Ok(());
        };
        let mut out = format!("fence {}\n", staged.len());
        for (k, v) in &staged {
            out.push_str(&format!("{k} {v}\n"));
        }
        w.write_all(out.as_bytes()).map_err(broken)?;
        let mut line = String::new();
        let read_line = |r: &mut BufReader<UnixStream>, line: &mut String| -> Result<()> {
            line.clear();
            match r.read_line(line) {
                Ok(0) => Err(Error::Transport("launcher closed the connection".into())),
                Ok(_) => Ok(()),
                Err(e) => Err(broken(e)),
            }
        };
        read_line(r, &mut line)?;
        let n: usize = line
            .trim()
            .strip_prefix("kvs ")
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| Error::Transport(format!("launcher said {line:?}")))?;
        for _ in 0..n {
            read_line(r, &mut line)?;
            if let Some((k, v)) = line.trim_end().split_once(' ') {
                self.kvs.insert(k.to_string(), v.to_string());
            }
        }
        Ok(())
    }

    /// The value of `key` as of the last fence.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.kvs.get(key).map(String::as_str)
    }

    /// Asks the launcher to end the job with `code` (it kills every
    /// process, this one included), and waits for that. Returns if there is
    /// no launcher, when the launcher closes the connection, or after
    /// [`ABORT_WAIT`].
    ///
    /// Waiting keeps this process, and so its connections to the other
    /// ranks, alive until the launcher has the abort: a rank that sees a
    /// connection to this one break, and aborts in turn, cannot reach the
    /// launcher first and make its consequence the job's exit code.
    pub fn abort(&mut self, code: i32, msg: &str) {
        self.abort_within(code, msg, ABORT_WAIT);
    }

    /// [`Pmi::abort`], waiting at most `bound`.
    fn abort_within(&mut self, code: i32, msg: &str, bound: std::time::Duration) {
        if let Some((r, w)) = self.conn.as_mut() {
            let msg: String = msg
                .chars()
                .map(|c| if c == '\n' { ' ' } else { c })
                .collect();
            if writeln!(w, "abort {code} {msg}").is_err() {
                return;
            }
            // The launcher writes nothing more: the read ends with its
            // kill, its exit (end of file), or the bound (one deadline for
            // the whole wait, whatever the launcher still sends).
            let deadline = std::time::Instant::now() + bound;
            let mut rest = String::new();
            loop {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() || r.get_ref().set_read_timeout(Some(left)).is_err() {
                    return;
                }
                match r.read_line(&mut rest) {
                    Ok(n) if n > 0 => rest.clear(),
                    _ => return,
                }
            }
        }
    }

    /// Tells the launcher that this process finished cleanly.
    pub fn finalize(&mut self) {
        if let Some((_, w)) = self.conn.as_mut() {
            let _ = writeln!(w, "finalize");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    fn on(stream: UnixStream) -> Pmi {
        Pmi {
            rank: 0,
            size: 2,
            job: "test".into(),
            conn: Some((BufReader::new(stream.try_clone().unwrap()), stream)),
            staged: Vec::new(),
            kvs: HashMap::new(),
        }
    }

    #[test]
    fn an_abort_waits_until_the_launcher_ends_the_process() {
        let (ours, launcher) = UnixStream::pair().unwrap();
        let (done, returned) = mpsc::channel();
        let t = std::thread::spawn(move || {
            on(ours).abort(15, "message truncated\nin MPI_Recv");
            done.send(()).unwrap();
        });
        let mut r = BufReader::new(launcher.try_clone().unwrap());
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        assert_eq!(line, "abort 15 message truncated in MPI_Recv\n");
        // The launcher has the abort and has not acted yet: the process
        // (and its connections to the other ranks) is still there.
        assert!(
            returned.recv_timeout(Duration::from_millis(500)).is_err(),
            "abort returned before the launcher ended the process"
        );
        // The launcher goes (its end closes): the abort returns.
        drop(r);
        drop(launcher);
        returned
            .recv_timeout(ABORT_WAIT + Duration::from_secs(10))
            .unwrap();
        t.join().unwrap();
    }

    #[test]
    fn an_abort_waits_no_longer_than_its_bound_whatever_the_launcher_sends() {
        let (ours, launcher) = UnixStream::pair().unwrap();
        // A launcher that keeps writing lines and does not end the
        // process, for far longer than the bound (5 s; then its end
        // closes, so a wait that each line restarted ends too and fails
        // below instead of hanging).
        let (stop, stopped) = mpsc::channel::<()>();
        let chatter = std::thread::spawn(move || {
            let mut w = launcher;
            let end = std::time::Instant::now() + Duration::from_secs(5);
            while std::time::Instant::now() < end
                && stopped.recv_timeout(Duration::from_millis(20)).is_err()
            {
                if writeln!(w, "kvs-noise").is_err() {
                    return;
                }
            }
        });
        let t = std::time::Instant::now();
        on(ours).abort_within(15, "bounded", Duration::from_millis(300));
        let took = t.elapsed();
        let _ = stop.send(()); // the chatter may have ended already
        chatter.join().unwrap();
        assert!(
            took >= Duration::from_millis(300),
            "returned before the bound: {took:?}"
        );
        assert!(
            took < Duration::from_secs(5),
            "each line restarted the wait: {took:?}"
        );
    }

    #[test]
    fn an_abort_returns_at_once_without_a_launcher_or_when_it_is_gone() {
        // Either would take ABORT_WAIT if it waited; half is far above
        // any scheduling delay.
        let t = std::time::Instant::now();
        let mut single = on(UnixStream::pair().unwrap().0);
        single.conn = None;
        single.abort(3, "alone");
        assert!(t.elapsed() < ABORT_WAIT / 2, "waited without a launcher");
        // The launcher's end closed before the abort: no wait.
        let t = std::time::Instant::now();
        let (ours, launcher) = UnixStream::pair().unwrap();
        drop(launcher);
        on(ours).abort(3, "launcher gone");
        assert!(
            t.elapsed() < ABORT_WAIT / 2,
            "waited for a launcher that is gone"
        );
    }
}
