//! Shared helpers for the integration tests: spawning the peer program,
//! talking to it over its stdin/stdout, unique discriminators, and the
//! common VIA set-up.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use via::{DescBuilder, Nic, Ptag, Region, Reliability, Vi, ViAttributes};

/// A discriminator unique to this process and `tag`.
pub fn disc(tag: &str) -> Vec<u8> {
    format!("{}-{}-{}", tag, std::process::id(), std::thread::current().name().unwrap_or("t")).into_bytes()
}

/// The peer program (`via-peer`), running one scenario.
pub struct Peer {
    pub child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Peer {
    /// Starts `via-peer <args>`; `exe` is `env!("CARGO_BIN_EXE_via-peer")`.
    pub fn spawn(exe: &str, args: &[&str]) -> Peer {
        let mut child = Command::new(exe)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn via-peer");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Peer { child, stdin, stdout }
    }

    /// Reads the next line the peer prints (blocks until it does).
    pub fn line(&mut self) -> String {
        let mut s = String::new();
        let n = self.stdout.read_line(&mut s).expect("read from peer");
        assert!(n > 0, "peer exited early");
        s.trim_end().to_string()
    }

    /// Reads lines until one starts with `prefix`; returns the rest.
    pub fn expect(&mut self, prefix: &str) -> String {
        loop {
            let l = self.line();
            if let Some(rest) = l.strip_prefix(prefix) {
                return rest.trim().to_string();
            }
        }
    }

    /// Sends a line to the peer.
    pub fn say(&mut self, s: &str) {
        writeln!(self.stdin, "{s}").expect("write to peer");
        self.stdin.flush().unwrap();
    }

    /// Waits for the peer to exit and checks it succeeded.
    pub fn finish(mut self) {
        let st = self.child.wait().expect("wait for peer");
        assert!(st.success(), "peer failed: {st}");
    }
}

/// Reads a command line from stdin (peer side).
pub fn read_cmd() -> String {
    let mut s = String::new();
    std::io::stdin().read_line(&mut s).expect("stdin");
    s.trim_end().to_string()
}

/// Prints a line for the test (peer side) and flushes.
pub fn tell(s: &str) {
    println!("{s}");
    std::io::stdout().flush().unwrap();
}

/// A NIC, a tag, a region and a VI: the usual start.
pub struct Setup {
    pub nic: Nic,
    pub ptag: Ptag,
    pub mem: Region,
    pub vi: Vi,
}

impl Setup {
    pub fn new(rel: Reliability, bytes: usize, rdma_write: bool, rdma_read: bool) -> Setup {
        let _ = env_logger::builder().is_test(true).try_init();
        let nic = Nic::open(None).expect("open NIC");
        let ptag = nic.create_ptag().unwrap();
        let mem = Region::new(&nic, bytes, ptag, rdma_write, rdma_read).unwrap();
        let mut a = ViAttributes::new(rel, ptag);
        a.max_transfer_size = via::Nic::open(None).unwrap().attributes().max_transfer_size as u32;
        a.enable_rdma_write = rdma_write;
        a.enable_rdma_read = rdma_read;
        let vi = nic.create_vi(&a, None, None).unwrap();
        Setup { nic, ptag, mem, vi }
    }
}

/// Default timeout for waits in tests: long enough for a loaded 2-core
/// machine, short enough that a hang fails the test.
pub const WAIT: Option<Duration> = Some(Duration::from_secs(20));

/// Posts a receive of `len` bytes at `buf` using the descriptor at `desc`.
pub fn post_recv(s: &Setup, desc: usize, buf: usize, len: u32) {
    let d = DescBuilder::recv().segment(&s.mem, buf, len).write(&s.mem, desc).unwrap();
    s.vi.post_recv(&s.mem, d).unwrap();
}

/// Posts a send of `len` bytes at `buf` using the descriptor at `desc`.
pub fn post_send(s: &Setup, desc: usize, buf: usize, len: u32) {
    let d = DescBuilder::send().segment(&s.mem, buf, len).write(&s.mem, desc).unwrap();
    s.vi.post_send(&s.mem, d).unwrap();
}

/// A deterministic byte pattern for size `n` and round `r`.
pub fn pattern(n: usize, r: u32) -> Vec<u8> {
    (0..n).map(|i| (i as u32).wrapping_mul(31).wrapping_add(r * 7) as u8).collect()
}
