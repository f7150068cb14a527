//! Shared helpers for the integration tests: spawning the peer program,
//! talking to it over its stdin/stdout, unique discriminators, and the
//! common VIA set-up.
//!
//! The peer (`via-peer serve`) is a small command interpreter: the test
//! sends one command line and reads one answer line (see
//! `src/bin/via-peer.rs` for the commands). Every wait in a test is bounded
//! by [`WAIT`] or an explicit deadline, and synchronises on a line from the
//! peer, a completion or an exit status, never on a sleep.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex, Once, mpsc};
use std::time::{Duration, Instant};

pub mod netns;

use via::{AsyncError, DescBuilder, ErrorCode, Nic, Ptag, Region, Reliability, Vi, ViAttributes};

/// A discriminator unique to this process, this test (thread) and `tag`,
/// short enough for `MaxDiscriminatorLen` (64).
pub fn disc(tag: &str) -> Vec<u8> {
    let name = std::thread::current().name().unwrap_or("t").to_string();
    // FNV-1a of the test name keeps the discriminator short.
    let h = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    let d = format!("{}-{}-{h:x}", tag, std::process::id());
    assert!(d.len() <= 64, "discriminator {d:?} too long");
    d.into_bytes()
}

/// [`disc`] as a string (for the peer's command line).
pub fn disc_str(tag: &str) -> String {
    String::from_utf8(disc(tag)).unwrap()
}

/// Makes sure an up-to-date `viad` binary is where the library looks for
/// it (beside the test executables): `cargo test -p via-tests` alone does
/// not build the `via-tools` package. Builds it into the same target
/// directory once per process (a no-op when it is current); if cargo is
/// not available, an existing `viad` is used as it is.
pub fn ensure_viad() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let exe = std::env::current_exe().expect("current exe");
        let mut dir = exe.parent().expect("exe dir").to_path_buf();
        if dir.ends_with("deps") {
            dir.pop();
        }
        let release = dir.file_name().is_some_and(|n| n == "release");
        let target = dir.parent().expect("target dir").to_path_buf();
        let mut cmd = Command::new(env!("CARGO"));
        cmd.args([
            "build",
            "-q",
            "-p",
            "via-tools",
            "--bin",
            "viad",
            "--manifest-path",
        ])
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml"))
        .arg("--target-dir")
        .arg(&target);
        if release {
            cmd.arg("--release");
        }
        match cmd.output() {
            Ok(out) if out.status.success() => {}
            Ok(out) => assert!(
                via::agent::find_viad().is_some(),
                "building viad failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ),
            Err(e) => assert!(
                via::agent::find_viad().is_some(),
                "no viad, and cannot run cargo: {e}"
            ),
        }
        assert!(
            via::agent::find_viad().is_some(),
            "viad not found after building it"
        );
    });
}

/// Opens the default NIC (building `viad` first if needed).
pub fn open_nic() -> Nic {
    ensure_viad();
    let _ = env_logger::builder().is_test(true).try_init();
    Nic::open(None).expect("open NIC")
}

/// Whether the registration cache is off (`VIA_REGCACHE=off`, or a zero
/// budget): checks of its hits are skipped then.
pub fn regcache_off() -> bool {
    let c = via::config::Config::get().regcache;
    c.capacity_bytes == 0 || c.capacity_regions == 0
}

/// The verbs device the tests run on (`VIA_DEVICE`, one of this host's
/// RDMA devices), or `None` (printing why) when this machine has none.
#[cfg(feature = "verbs")]
pub fn verbs_device() -> Option<String> {
    let devs = via::rdma_devices();
    match std::env::var("VIA_DEVICE") {
        Ok(d) if devs.contains(&d) => Some(d),
        _ => {
            println!(
                "SKIP: no RDMA device selected (VIA_DEVICE unset or not among {devs:?}); \
                 tools/verbs-vm.sh runs these tests on Soft-RoCE"
            );
            None
        }
    }
}

/// The peer program (`via-peer`), running one scenario.
pub struct Peer {
    pub child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
}

/// Longest wait for one line from the peer. The peer bounds its own waits
/// by [`WAIT`], so a peer that says nothing for this long is stuck.
pub const LINE_WAIT: Duration = Duration::from_secs(60);

impl Peer {
    /// Starts `via-peer <args>`; `exe` is `env!("CARGO_BIN_EXE_via-peer")`.
    pub fn spawn(exe: &str, args: &[&str]) -> Peer {
        Self::spawn_env(exe, args, &[])
    }

    /// Starts `via-peer <args>` with extra environment variables.
    pub fn spawn_env(exe: &str, args: &[&str], env: &[(&str, &str)]) -> Peer {
        ensure_viad();
        let mut cmd = Command::new(exe);
        cmd.args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn via-peer");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || pump(stdout, tx));
        Peer {
            child,
            stdin,
            lines,
        }
    }

    /// Starts a prepared command (stdin and stdout are piped here; stderr
    /// is inherited) and talks to it like a peer.
    pub fn from_command(mut cmd: Command) -> Peer {
        ensure_viad();
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = cmd.spawn().expect("spawn the peer command");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || pump(stdout, tx));
        Peer {
            child,
            stdin,
            lines,
        }
    }

    /// Starts the command interpreter (`via-peer serve`).
    pub fn serve(exe: &str) -> Peer {
        Self::spawn(exe, &["serve"])
    }

    /// The peer's process id.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Reads the next line the peer prints (at most [`LINE_WAIT`]).
    pub fn line(&mut self) -> String {
        self.line_within(LINE_WAIT)
    }

    /// Reads the next line the peer prints, waiting at most `limit` (for
    /// commands known to take longer than [`LINE_WAIT`]).
    pub fn line_within(&mut self, limit: Duration) -> String {
        match self.lines.recv_timeout(limit) {
            Ok(l) => l,
            Err(mpsc::RecvTimeoutError::Timeout) => panic!("peer silent for {limit:?}"),
            Err(mpsc::RecvTimeoutError::Disconnected) => panic!("peer exited early"),
        }
    }

    /// Reads the next line, which must start with `prefix`; returns the rest.
    pub fn expect(&mut self, prefix: &str) -> String {
        self.expect_within(prefix, LINE_WAIT)
    }

    /// [`Peer::expect`] waiting at most `limit`.
    pub fn expect_within(&mut self, prefix: &str, limit: Duration) -> String {
        let l = self.line_within(limit);
        match l.strip_prefix(prefix) {
            Some(rest) => rest.trim().to_string(),
            None => panic!("peer said {l:?}, expected {prefix:?}"),
        }
    }

    /// Sends a line to the peer.
    pub fn say(&mut self, s: &str) {
        writeln!(self.stdin, "{s}").expect("write to peer");
        self.stdin.flush().unwrap();
    }

    /// Sends a command and returns the one line that answers it.
    pub fn cmd(&mut self, s: &str) -> String {
        self.say(s);
        self.line()
    }

    /// Sends a command whose answer must start with `prefix`; returns the
    /// rest of the answer.
    pub fn cmd_expect(&mut self, s: &str, prefix: &str) -> String {
        let l = self.cmd(s);
        match l.strip_prefix(prefix) {
            Some(rest) => rest.trim().to_string(),
            None => panic!("peer answered {l:?} to {s:?}, expected {prefix:?}"),
        }
    }

    /// Waits for the peer to exit and checks it succeeded.
    pub fn finish(mut self) {
        let mut st = None;
        let exited = wait_until(LINE_WAIT, || {
            st = self.child.try_wait().expect("wait for peer");
            st.is_some()
        });
        assert!(exited, "peer did not exit within {LINE_WAIT:?}");
        let st = st.unwrap();
        assert!(st.success(), "peer failed: {st}");
    }

    /// Tells an interpreter peer to exit and checks that it succeeded.
    pub fn exit(mut self) {
        self.say("exit");
        self.finish();
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        // A test that failed half-way must not leave its peer running.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn pump(mut r: BufReader<ChildStdout>, tx: mpsc::Sender<String>) {
    loop {
        let mut s = String::new();
        match r.read_line(&mut s) {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                if tx.send(s.trim_end().to_string()).is_err() {
                    return;
                }
            }
        }
    }
}

/// Reads a command line from stdin (peer side); `None` at end of input.
pub fn read_cmd() -> Option<String> {
    let mut s = String::new();
    match std::io::stdin().read_line(&mut s) {
        Ok(0) => None,
        Ok(_) => Some(s.trim_end().to_string()),
        Err(e) => panic!("stdin: {e}"),
    }
}

/// Prints a line for the test (peer side) and flushes.
pub fn tell(s: &str) {
    println!("{s}");
    std::io::stdout().flush().unwrap();
}

/// The asynchronous errors a NIC reported to its error callback.
#[derive(Default)]
pub struct ErrorLog {
    seen: Mutex<Vec<(AsyncError, String, Instant)>>,
    cv: Condvar,
    /// While set ([`ErrorLog::hold`]), the callback does not return.
    held: Mutex<bool>,
    held_cv: Condvar,
}

/// While alive, the error callback of an [`ErrorLog`] keeps the thread it
/// runs on (the provider thread) once it has recorded an error.
pub struct Held(Arc<ErrorLog>);

impl Drop for Held {
    fn drop(&mut self) {
        *self.0.held.lock().unwrap() = false;
        self.0.held_cv.notify_all();
    }
}

impl ErrorLog {
    /// Installs a callback on `nic` that records every error (with the name
    /// of the thread it ran on and when).
    pub fn install(nic: &Nic) -> Arc<ErrorLog> {
        let log = Arc::new(ErrorLog::default());
        let l = log.clone();
        nic.set_error_callback(move |e| {
            let t = std::thread::current().name().unwrap_or("?").to_string();
            l.seen.lock().unwrap().push((*e, t, Instant::now()));
            l.cv.notify_all();
            let mut held = l.held.lock().unwrap();
            while *held {
                held = l.held_cv.wait(held).unwrap();
            }
        });
        log
    }

    /// Keeps the callback's thread in the callback, once it has recorded an
    /// error, until the returned guard is dropped: a slow error callback,
    /// which holds up what the provider thread would do next.
    pub fn hold(self: &Arc<Self>) -> Held {
        *self.held.lock().unwrap() = true;
        Held(self.clone())
    }

    /// Every error so far.
    pub fn all(&self) -> Vec<AsyncError> {
        self.seen.lock().unwrap().iter().map(|x| x.0).collect()
    }

    /// Waits up to `t` for an error with `code`; returns it, the thread it
    /// was reported on and when.
    pub fn wait_for(&self, code: ErrorCode, t: Duration) -> Option<(AsyncError, String, Instant)> {
        self.wait_seen(t, |seen| {
            let i = seen.iter().position(|x| x.0.code == code)?;
            Some(seen[i].clone())
        })
    }

    /// Like [`ErrorLog::wait_for`], but removes the error it returns, so
    /// that a later wait needs a new report.
    pub fn take(&self, code: ErrorCode, t: Duration) -> Option<(AsyncError, String, Instant)> {
        self.wait_seen(t, |seen| {
            let i = seen.iter().position(|x| x.0.code == code)?;
            Some(seen.remove(i))
        })
    }

    /// Waits up to `t` for any error; removes and returns the first seen.
    pub fn take_first(&self, t: Duration) -> Option<(AsyncError, String, Instant)> {
        self.wait_seen(t, |seen| (!seen.is_empty()).then(|| seen.remove(0)))
    }

    /// Waits up to `t` until `pick` finds something in the errors seen.
    fn wait_seen<R>(
        &self,
        t: Duration,
        mut pick: impl FnMut(&mut Vec<(AsyncError, String, Instant)>) -> Option<R>,
    ) -> Option<R> {
        let deadline = Instant::now() + t;
        let mut g = self.seen.lock().unwrap();
        loop {
            if let Some(r) = pick(&mut g) {
                return Some(r);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            g = self.cv.wait_timeout(g, deadline - now).unwrap().0;
        }
    }

    /// Forgets every error seen so far.
    pub fn clear(&self) {
        self.seen.lock().unwrap().clear();
    }

    /// Waits up to `t` for an error with `code`, panicking if none comes.
    pub fn expect(&self, code: ErrorCode, t: Duration) -> AsyncError {
        match self.wait_for(code, t) {
            Some(x) => x.0,
            None => panic!("no {code:?} reported within {t:?}; seen {:?}", self.all()),
        }
    }
}

/// A NIC, a tag, a region and a VI: the usual start.
pub struct Setup {
    pub nic: Nic,
    pub ptag: Ptag,
    pub mem: Region,
    pub vi: Vi,
}

impl Setup {
    /// A VI of level `rel` with `MaxTransferSize` as large as the NIC allows
    /// and a region of `bytes` (RDMA enables on both as given).
    pub fn new(rel: Reliability, bytes: usize, rdma_write: bool, rdma_read: bool) -> Setup {
        let nic = open_nic();
        let mtu = nic.attributes().max_transfer_size.min(u32::MAX as u64) as u32;
        Self::with(nic, rel, bytes, rdma_write, rdma_read, mtu)
    }

    /// As [`Setup::new`] on an open `nic` with `MaxTransferSize` `mtu`.
    pub fn with(
        nic: Nic,
        rel: Reliability,
        bytes: usize,
        rdma_write: bool,
        rdma_read: bool,
        mtu: u32,
    ) -> Setup {
        let ptag = nic.create_ptag().unwrap();
        let mem = Region::new(&nic, bytes, ptag, rdma_write, rdma_read).unwrap();
        let mut a = ViAttributes::new(rel, ptag);
        a.max_transfer_size = mtu;
        a.enable_rdma_write = rdma_write;
        a.enable_rdma_read = rdma_read;
        let vi = nic.create_vi(&a, None, None).unwrap();
        Setup { nic, ptag, mem, vi }
    }

    /// Address of byte `off` of the region.
    pub fn addr(&self, off: usize) -> u64 {
        self.mem.addr(off).unwrap()
    }

    /// Connects the VI as a client to the interpreter peer, which listens
    /// on `d` and accepts.
    pub fn connect_to(&self, peer: &mut Peer, d: &str) {
        peer.say(&format!("listen {d} accept"));
        peer.expect("LISTENING");
        let local = self.nic.address(b"client");
        self.vi
            .connect(&local, &self.nic.address(d.as_bytes()), WAIT)
            .expect("connect");
        assert_eq!(peer.expect("ACCEPT"), "ok");
        assert_eq!(self.vi.state(), via::ViState::Connected);
    }

    /// Sends `len` bytes of `pattern(len, seed)` from byte 4096 of this
    /// side's memory (the send descriptor at `desc`) to `peer`, whose
    /// receive at its byte 4096 is posted: the send completes, the receive
    /// completes with `len` bytes, and they are the ones sent.
    pub fn send_arrives(&self, peer: &mut Peer, desc: usize, len: u32, seed: u32) {
        use via::descriptor::status::{DONE, OP_RECEIVE, OP_SEND};
        self.fill(4096, len as usize, seed);
        post_send(self, desc, 4096, len);
        assert_eq!(self.vi.send_wait(WAIT).unwrap().status, DONE | OP_SEND);
        let r = nums(&peer.cmd_expect("wait_recv", "RECV"));
        assert_eq!(
            (r[0] as u32, r[1] as u32, r[2] as u32),
            (DONE | OP_RECEIVE, len, 0)
        );
        assert_eq!(peer.cmd(&format!("check 0 4096 {len} {seed}")), "SAME");
    }

    /// Fills `len` bytes at `off` with `pattern(len, seed)`; returns them.
    pub fn fill(&self, off: usize, len: usize, seed: u32) -> Vec<u8> {
        let p = pattern(len, seed);
        self.mem.write(off, &p).unwrap();
        p
    }

    /// Reads `len` bytes at `off`.
    pub fn bytes(&self, off: usize, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len];
        self.mem.read(off, &mut b).unwrap();
        b
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        // `Nic` has no `Drop` (the process keeps every open NIC until
        // `close`): close it so that tests do not accumulate NICs.
        let _ = self.nic.close();
    }
}

/// Default timeout for waits in tests: long enough for a loaded 2-core
/// machine, short enough that a hang fails the test.
pub const WAIT: Option<Duration> = Some(Duration::from_secs(20));

/// Posts a receive of `len` bytes at `buf` using the descriptor at `desc`.
pub fn post_recv(s: &Setup, desc: usize, buf: usize, len: u32) {
    let d = DescBuilder::recv()
        .segment(&s.mem, buf, len)
        .write(&s.mem, desc)
        .unwrap();
    s.vi.post_recv(&s.mem, d).unwrap();
}

/// Two VIs of this process with attributes `a`, connected peer to peer
/// (discriminators `<tag>-s` and `<tag>-r`); `attach` runs on the second
/// before the connection (an SRQ is attached while the VI is idle).
pub fn local_pair(nic: &Nic, a: &ViAttributes, tag: &str, attach: impl FnOnce(&Vi)) -> (Vi, Vi) {
    let s = nic.create_vi(a, None, None).unwrap();
    let r = nic.create_vi(a, None, None).unwrap();
    attach(&r);
    connect_pair(nic, (&s, &r), tag);
    (s, r)
}

/// Connects the idle VIs `s` and `r` of this process peer to peer
/// (discriminators `<tag>-s` and `<tag>-r`).
pub fn connect_pair(nic: &Nic, (s, r): (&Vi, &Vi), tag: &str) {
    let (x, y) = (
        nic.address(&disc(&format!("{tag}-s"))),
        nic.address(&disc(&format!("{tag}-r"))),
    );
    s.connect_peer(&x, &y, WAIT).unwrap();
    r.connect_peer(&y, &x, WAIT).unwrap();
    s.connect_peer_wait().unwrap();
    r.connect_peer_wait().unwrap();
}

/// Posts, at descriptor 0 of `s`, a receive of two 60-byte segments (at
/// 8192 and 9000): one byte short of a 121-byte message.
pub fn post_short_recv(s: &Setup) {
    let d = DescBuilder::recv()
        .segment(&s.mem, 8192, 60)
        .segment(&s.mem, 9000, 60)
        .write(&s.mem, 0)
        .unwrap();
    s.vi.post_recv(&s.mem, d).unwrap();
}

/// Posts a send of `len` bytes at `buf` using the descriptor at `desc`.
pub fn post_send(s: &Setup, desc: usize, buf: usize, len: u32) {
    let d = DescBuilder::send()
        .segment(&s.mem, buf, len)
        .write(&s.mem, desc)
        .unwrap();
    s.vi.post_send(&s.mem, d).unwrap();
}

/// A deterministic byte pattern for size `n` and round `r`.
pub fn pattern(n: usize, r: u32) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u32).wrapping_mul(31).wrapping_add(r * 7) as u8)
        .collect()
}

/// Parses a number written in decimal or `0x` hexadecimal.
pub fn num(s: &str) -> u64 {
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    }
    .unwrap_or_else(|_| panic!("not a number: {s:?}"))
}

/// The whitespace-separated fields of a peer answer, as numbers.
pub fn nums(s: &str) -> Vec<u64> {
    s.split_whitespace().map(num).collect()
}

/// A region of the peer: address, handle, length (from `MEM`/`REGION`).
#[derive(Clone, Copy, Debug)]
pub struct RemoteMem {
    pub addr: u64,
    pub handle: u32,
    pub len: u64,
}

impl RemoteMem {
    /// Parses `<addr> <handle> <len>`.
    pub fn parse(s: &str) -> RemoteMem {
        let v = nums(s);
        RemoteMem {
            addr: v[0],
            handle: v[1] as u32,
            len: v[2],
        }
    }
}

/// Waits, at most `t`, for `cond` to hold, re-checking every millisecond
/// (for conditions no event announces, such as another process exiting
/// elsewhere or a mapping disappearing). Returns whether it held.
pub fn wait_until(t: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + t;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Lower-case hexadecimal of `b`.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Parses [`hex`] output.
pub fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// Runs the test `name` of the current test executable in a child process
/// with extra environment variables (for configuration that is read once
/// per process, such as `VIA_CQ`). Returns its combined output; panics if
/// it fails or runs longer than `limit`.
pub fn run_child_test(name: &str, env: &[(&str, &str)], limit: Duration) -> String {
    let exe = std::env::current_exe().unwrap();
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let log = std::env::temp_dir().join(format!("via-tests-{}-{n}-{name}.log", std::process::id()));
    let file = std::fs::File::create(&log).unwrap();
    let mut cmd = Command::new(exe);
    cmd.args(["--exact", name, "--nocapture", "--test-threads=1"])
        .stdin(Stdio::null())
        .stdout(file.try_clone().unwrap())
        .stderr(file);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn child test");
    let mut st = None;
    let done = wait_until(limit, || {
        st = child.try_wait().unwrap();
        st.is_some()
    });
    if !done {
        let _ = child.kill();
        let _ = child.wait();
    }
    let out = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    assert!(done, "child test {name} ran over {limit:?}:\n{out}");
    let st = st.unwrap();
    assert!(st.success(), "child test {name} failed ({st}):\n{out}");
    assert!(
        out.contains("1 passed"),
        "child test {name} did not run:\n{out}"
    );
    out
}

/// Whether the tests run as root; if not, prints a loud
/// `SKIPPED (needs root): <what>` line to stderr (the test then passes
/// without checking anything: CI runs as root and runs it).
pub fn have_root(what: &str) -> bool {
    if via::sys::getuid() == 0 {
        return true;
    }
    eprintln!("SKIPPED (needs root): {what}");
    false
}

/// A uid at or above `from` that no account in `/etc/passwd` has and that
/// differs from every uid in `taken`.
pub fn unused_uid(from: u32, taken: &[u32]) -> u32 {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let used: Vec<u32> = passwd
        .lines()
        .filter_map(|l| l.split(':').nth(2)?.parse().ok())
        .collect();
    (from..)
        .find(|u| !used.contains(u) && !taken.contains(u))
        .unwrap()
}

/// Copies of `via-peer` (at `peer`) and `viad` that any user can run (the
/// build directory may be private to its owner, as a CI checkout in a 0700
/// temporary directory is), made once per test process in
/// `/tmp/via-id-bin-<pid>` (earlier runs' copies are removed):
/// `(via-peer, viad)`.
pub fn runnable_by_all(peer: &str) -> &'static (std::path::PathBuf, std::path::PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    use std::path::{Path, PathBuf};
    static BINS: std::sync::OnceLock<(PathBuf, PathBuf)> = std::sync::OnceLock::new();
    BINS.get_or_init(|| {
        ensure_viad();
        for e in std::fs::read_dir("/tmp").into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(pid) = name.strip_prefix("via-id-bin-") {
                if !Path::new(&format!("/proc/{pid}")).exists() {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        let dir = PathBuf::from(format!("/tmp/via-id-bin-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let copy = |from: &Path, name: &str| {
            let to = dir.join(name);
            std::fs::copy(from, &to).unwrap();
            std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755)).unwrap();
            to
        };
        (
            copy(Path::new(peer), "via-peer"),
            copy(&via::agent::find_viad().expect("viad"), "viad"),
        )
    })
}

/// `VmLck` of process `pid` in KiB (memory it holds locked), if it lives.
pub fn locked_kib(pid: i32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("VmLck:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// The socket of this process's viad (`VIA_INSTANCE`).
pub fn viad_socket() -> std::path::PathBuf {
    via::agent::place::user_socket().expect("viad socket path")
}

/// The pid of the process listening on the Unix socket at `path` (the
/// viad of an instance: [`viad_socket`]), found through `/proc/net/unix`
/// and the fd tables in `/proc`. (`SO_PEERCRED` on a connection names the
/// process that called `listen`, which for a daemonized viad is its
/// parent, gone since.)
pub fn listener_pid(path: &std::path::Path) -> Option<i32> {
    let want = path.to_string_lossy().into_owned();
    let table = std::fs::read_to_string("/proc/net/unix").ok()?;
    let inodes: Vec<String> = table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // Flags 00010000: listening.
            (f.len() >= 8 && f[7] == want && f[3] == "00010000").then(|| f[6].to_string())
        })
        .collect();
    let targets: Vec<String> = inodes.iter().map(|i| format!("socket:[{i}]")).collect();
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(e.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(l) = std::fs::read_link(fd.path()) {
                if targets.iter().any(|t| l.as_os_str() == t.as_str()) {
                    return Some(pid);
                }
            }
        }
    }
    None
}

/// A client of viad that speaks the protocol itself (no library session):
/// for measuring the daemon's service and for abusing it.
pub mod raw {
    use std::io;
    use std::os::fd::{AsRawFd, OwnedFd, RawFd};
    use std::time::{Duration, Instant};

    use via::proto::{self, Reply, Request};

    /// One connection to the daemon of `VIA_INSTANCE`.
    pub struct Client {
        pub fd: OwnedFd,
        pub session: u64,
        /// Events (id 0) skipped while waiting for replies.
        pub events: usize,
        next: u32,
    }

    /// Connects without saying Hello.
    pub fn connect() -> io::Result<OwnedFd> {
        connect_at(&super::viad_socket())
    }

    /// Connects to the daemon at `path` without saying Hello.
    pub fn connect_at(path: &std::path::Path) -> io::Result<OwnedFd> {
        let s = via::sys::seqpacket_connect_path(path, Duration::from_secs(10))?;
        via::sys::set_recv_timeout(s.as_raw_fd(), Duration::from_secs(20))?;
        Ok(s)
    }

    /// Receives one frame (at most the receive timeout of the socket).
    pub fn recv(fd: RawFd) -> io::Result<(u32, Reply, Vec<OwnedFd>)> {
        let mut buf = vec![0u8; proto::MAX_FRAME + 1];
        let (n, fds) = via::sys::recv_with_fds(fd, &mut buf)?;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "viad closed"));
        }
        let (id, r) =
            Reply::decode(&buf[..n]).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        Ok((id, r, fds))
    }

    impl Client {
        /// Connects and says Hello.
        pub fn open() -> io::Result<Client> {
            Self::hello(connect()?)
        }

        /// Connects to the daemon at `path` and says Hello.
        pub fn open_at(path: &std::path::Path) -> io::Result<Client> {
            Self::hello(connect_at(path)?)
        }

        fn hello(fd: OwnedFd) -> io::Result<Client> {
            let hello = Request::Hello {
                version: proto::VERSION,
            };
            via::sys::send_with_fds(fd.as_raw_fd(), &hello.encode(1), &[])?;
            match recv(fd.as_raw_fd())? {
                (1, Reply::Welcome { session, .. }, _) => Ok(Client {
                    fd,
                    session,
                    events: 0,
                    next: 2,
                }),
                (_, other, _) => Err(io::Error::other(format!("Hello answered {other:?}"))),
            }
        }

        /// Sends `req` (with `fd`) and returns its id.
        pub fn send(&mut self, req: &Request, fd: Option<RawFd>) -> io::Result<u32> {
            let id = self.next;
            self.next += 1;
            let fds: Vec<RawFd> = fd.into_iter().collect();
            via::sys::send_with_fds(self.fd.as_raw_fd(), &req.encode(id), &fds)?;
            Ok(id)
        }

        /// Sends `req` and waits for its reply (skipping events).
        pub fn call(
            &mut self,
            req: &Request,
            fd: Option<RawFd>,
        ) -> io::Result<(Reply, Vec<OwnedFd>)> {
            let id = self.send(req, fd)?;
            loop {
                let (rid, r, fds) = recv(self.fd.as_raw_fd())?;
                if rid == id {
                    return Ok((r, fds));
                }
                if rid == 0 {
                    self.events += 1;
                }
            }
        }

        /// One name-service round trip; its duration.
        pub fn round_trip(&mut self) -> io::Result<Duration> {
            let t = Instant::now();
            match self.call(
                &Request::ResolveName {
                    name: "localhost".into(),
                },
                None,
            )? {
                (Reply::Address { .. }, _) => Ok(t.elapsed()),
                (other, _) => Err(io::Error::other(format!("ResolveName: {other:?}"))),
            }
        }
    }

    /// Round trips measured by a thread until it is told to stop, one
    /// about every millisecond.
    pub struct Probe {
        stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
        t: std::thread::JoinHandle<Result<Vec<Duration>, String>>,
    }

    impl Probe {
        /// Starts measuring on a new session.
        pub fn start() -> Probe {
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let s2 = stop.clone();
            let mut c = Client::open().expect("probe session");
            let t = std::thread::spawn(move || {
                let mut v = Vec::new();
                while !s2.load(std::sync::atomic::Ordering::Relaxed) {
                    v.push(
                        c.round_trip()
                            .map_err(|e| format!("probe: {e} after {} round trips", v.len()))?,
                    );
                    // Paced (about 1000 a second), so that the probe itself
                    // is not what keeps the daemon busy.
                    std::thread::sleep(Duration::from_micros(500));
                }
                Ok(v)
            });
            Probe { stop, t }
        }

        /// Stops; returns (count, median, p99, max) of the round trips.
        pub fn stop(self) -> (usize, Duration, Duration, Duration) {
            self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
            let mut v = self.t.join().unwrap().unwrap_or_else(|e| panic!("{e}"));
            assert!(!v.is_empty(), "no round trip completed");
            v.sort();
            let p = |q: f64| v[((v.len() - 1) as f64 * q) as usize];
            (v.len(), p(0.5), p(0.99), *v.last().unwrap())
        }
    }
}
