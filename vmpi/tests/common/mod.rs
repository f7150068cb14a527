//! Shared by vmpi's integration tests: jobs under the real `via-run`,
//! each with a private viad instance, bounded in time.
#![allow(dead_code)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Longest a job may run before the test fails (and kills it).
pub const LIMIT: Duration = Duration::from_secs(120);

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The cargo target directory and profile directory of this test build.
pub fn target_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

pub fn profile() -> &'static str {
    if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    }
}

/// Builds (once) what the jobs need beside the test binaries: viad (the
/// library starts it from beside the program) and, if `capi`, libvmpi.
pub fn build(capi: bool) {
    static VIAD: OnceLock<()> = OnceLock::new();
    static CAPI: OnceLock<()> = OnceLock::new();
    let cargo = |args: &[&str]| {
        let mut c = Command::new(env!("CARGO"));
        c.args(["build", "-q"])
            .args(args)
            .env("CARGO_TARGET_DIR", target_dir())
            .current_dir(root());
        if profile() == "release" {
            c.arg("--release");
        }
        let out = c.output().expect("cargo");
        assert!(
            out.status.success(),
            "cargo build {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    VIAD.get_or_init(|| cargo(&["-p", "via-tools", "--bin", "viad"]));
    if capi {
        CAPI.get_or_init(|| cargo(&["-p", "vmpi-capi"]));
    }
}

/// What a finished job did.
pub struct Outcome {
    pub code: Option<i32>,
    pub output: String,
    pub elapsed: Duration,
}

/// `via-run` with a private viad instance named after `name`.
pub fn via_run(name: &str) -> Command {
    build(false);
    let mut c = Command::new(env!("CARGO_BIN_EXE_via-run"));
    c.env(
        "VIA_INSTANCE",
        format!("vmpi-{}-{name}", std::process::id()),
    )
    .env_remove("VMPI_COLL")
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    c
}

/// Waits for `child` up to [`LIMIT`], collecting its output.
pub fn finish(mut child: Child) -> Outcome {
    let start = Instant::now();
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if start.elapsed() > LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let output = format!("{}{}", t_out.join().unwrap(), t_err.join().unwrap());
    Outcome {
        code: status.and_then(|s| s.code()),
        output,
        elapsed: start.elapsed(),
    }
}

/// Runs `vmpi-check <args>` on `n` processes with `env`; asserts success
/// and `PASS` on stdout.
pub fn check(name: &str, n: u32, env: &[(&str, &str)], args: &[&str]) {
    let mut c = via_run(name);
    c.arg("-n").arg(n.to_string());
    for (k, v) in env {
        c.env(k, v);
    }
    c.arg(env!("CARGO_BIN_EXE_vmpi-check")).args(args);
    let o = finish(c.spawn().expect("via-run"));
    assert!(
        o.code == Some(0) && o.output.contains("PASS"),
        "vmpi-check {args:?} on {n} ({env:?}) failed (exit {:?} after {:?}):\n{}",
        o.code,
        o.elapsed,
        o.output
    );
}

/// Whether process `pid` exists (and is not a zombie).
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(false)
}

/// Waits up to `limit` for `cond`.
pub fn wait_for(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    cond()
}

/// A network namespace with a veth pair (both ends inside, the first with
/// an IPv4 address), removed with every process in it on drop: a sockets
/// NIC (`via_<ifname>`) for jobs run inside it.
pub struct Netns {
    pub name: String,
    /// The interface with the address.
    pub ifname: String,
}

impl Netns {
    fn ip(args: &[&str]) {
        let out = Command::new("ip").args(args).output().expect("run ip");
        assert!(
            out.status.success(),
            "ip {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `None` (after a loud SKIPPED line) when not root.
    pub fn new(tag: &str) -> Option<Netns> {
        let uid = Command::new("id").arg("-u").output().expect("id -u");
        if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
            eprintln!("SKIPPED (needs root to create a network namespace): {tag}");
            return None;
        }
        let pid = std::process::id();
        let (a, b) = (
            format!("vm{}a", pid % 100_000),
            format!("vm{}b", pid % 100_000),
        );
        let n = Netns {
            name: format!("vmpi-{tag}-{pid}"),
            ifname: a.clone(),
        };
        Self::ip(&["netns", "add", &n.name]);
        Self::ip(&[
            "link", "add", &a, "netns", &n.name, "type", "veth", "peer", "name", &b, "netns",
            &n.name,
        ]);
        let cidr = format!("10.252.{}.1/24", pid % 250);
        Self::ip(&["-n", &n.name, "addr", "add", &cidr, "dev", &a]);
        for i in [a.as_str(), b.as_str(), "lo"] {
            Self::ip(&["-n", &n.name, "link", "set", i, "up"]);
        }
        Some(n)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Ok(out) = Command::new("ip")
            .args(["netns", "pids", &self.name])
            .output()
        {
            for p in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                let _ = Command::new("kill").args(["-9", p]).status();
            }
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}
