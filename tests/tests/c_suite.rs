//! The VIPL C conformance suite, driven from Rust.
//!
//! Once per run, `tools/install.sh` installs libvipl (header, `libvipl.so*`,
//! `libvipl.a`, `vipl.pc`, `viad`) into a temporary prefix under the cargo
//! target directory, building in the same target directory and with the
//! same profile as this test (`--debug` unless `cargo test --release`).
//! Each program of `tests/c/suite` is then compiled against that prefix the
//! way a legacy program is built (`cc -std=c99 -Wall -Wextra -Werror
//! -pedantic ... -lvipl`), run, and must print `PASS <name>` and exit 0;
//! otherwise the test fails with the program's output. Some programs are
//! also built with AddressSanitizer and UndefinedBehaviorSanitizer, some run
//! again with the scanning CQ (`VIA_CQ=scan`). Programs run one at a time
//! (timing checks on 2 cores), each with a `viad` of its own
//! (`VIA_INSTANCE`), found by the installed library relative to itself.
//!
//! Other tests here: the header checks (`tools/check-header.sh` against the
//! installed library), the install layout (symlinks, soname, `DESTDIR`),
//! building through `pkg-config`, static linking with `libvipl.a`, and the
//! regression programs for bugs found on the way.
//!
//! `CC` selects the compiler.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// Longest a program may run (each also has its own `alarm()`).
const RUN_LIMIT: Duration = Duration::from_secs(400);

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// The cargo target directory this test was built in.
fn target_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("target dir")
        .to_path_buf()
}

fn cc() -> String {
    std::env::var("CC").unwrap_or_else(|_| "cc".into())
}

/// Runs `cmd`, returning its combined output, or an error with it.
fn run(cmd: &mut Command, what: &str) -> Result<String, String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{what}: cannot run {cmd:?}: {e}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(format!("{what} failed ({}):\n{cmd:?}\n{text}", out.status))
    }
}

/// The installed prefix and a directory for built programs.
struct Install {
    prefix: PathBuf,
    bin: PathBuf,
}

fn install() -> &'static Install {
    static INSTALL: OnceLock<Result<Install, String>> = OnceLock::new();
    let r = INSTALL.get_or_init(|| {
        let profile = if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        };
        let base = target_dir().join("tmp").join(format!("c-suite-{profile}"));
        let prefix = base.join("prefix");
        let bin = base.join("bin");
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&bin).map_err(|e| format!("mkdir {}: {e}", bin.display()))?;
        let mut cmd = Command::new(root().join("tools/install.sh"));
        if cfg!(debug_assertions) {
            cmd.arg("--debug");
        }
        cmd.arg(&prefix)
            .env("CARGO_TARGET_DIR", target_dir())
            .env_remove("DESTDIR")
            .current_dir(root());
        run(&mut cmd, "tools/install.sh")?;
        Ok(Install { prefix, bin })
    });
    match r {
        Ok(i) => i,
        Err(e) => panic!("installing libvipl into a temporary prefix failed:\n{e}"),
    }
}

/// One program at a time: the programs check timings and use both cores.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

const WARN: &[&str] = &[
    "-std=c99",
    "-Wall",
    "-Wextra",
    "-Werror",
    "-pedantic",
    "-g",
    "-pthread",
];
const SAN: &[&str] = &[
    "-fsanitize=address,undefined",
    "-fno-sanitize-recover=all",
    "-fno-omit-frame-pointer",
];

/// Compiles `dir/<name>.c` (with the suite's `common.c`) against the
/// installed prefix; `extra` adds flags (sanitizers). Returns the binary.
fn build(dir: &str, name: &str, extra: &[&str], tag: &str) -> PathBuf {
    let inst = install();
    let suite = root().join("tests/c/suite");
    let out = inst.bin.join(format!("{name}{tag}"));
    let lib = inst.prefix.join("lib");
    let mut cmd = Command::new(cc());
    cmd.args(WARN)
        .args(extra)
        .arg(format!("-I{}", inst.prefix.join("include").display()))
        .arg(format!("-I{}", suite.display()))
        .arg("-o")
        .arg(&out)
        .arg(root().join(dir).join(format!("{name}.c")))
        .arg(suite.join("common.c"))
        .arg(format!("-L{}", lib.display()))
        .arg("-lvipl")
        .arg(format!("-Wl,-rpath,{}", lib.display()));
    if let Err(e) = run(&mut cmd, &format!("compiling {name}.c")) {
        panic!("{e}");
    }
    out
}

/// Runs a built program with its own viad instance; returns (success, output).
fn execute(exe: &Path, instance: &str, env: &[(&str, &str)]) -> (bool, String) {
    execute_cmd(Command::new(exe), instance, env)
}

/// [`execute`] of a prepared command (`exe` or `ip netns exec <ns> exe`).
fn execute_cmd(mut cmd: Command, instance: &str, env: &[(&str, &str)]) -> (bool, String) {
    let exe = format!("{cmd:?}");
    cmd.env(
        "VIA_INSTANCE",
        format!("csuite-{}-{instance}", std::process::id()),
    )
    // The installed library must find its own viad.
    .env_remove("VIA_VIAD")
    .env_remove("VIA_HOSTS")
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {exe}: {e}"));
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
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait for the program") {
            break Some(st);
        }
        if start.elapsed() > RUN_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = format!("{}{}", t_out.join().unwrap(), t_err.join().unwrap());
    match status {
        None => (false, format!("{text}\n(killed after {RUN_LIMIT:?})")),
        Some(st) => (st.success(), format!("{text}\n(exit: {st})")),
    }
}

/// Builds and runs suite program `name`; panics with its output on failure.
fn suite(name: &str, sanitize: bool, env: &[(&str, &str)]) {
    let _g = serial();
    let tag = if sanitize { "-asan" } else { "" };
    let exe = build("tests/c/suite", name, if sanitize { SAN } else { &[] }, tag);
    let instance = format!(
        "{name}{tag}{}",
        env.iter()
            .map(|(k, v)| format!("-{k}={v}"))
            .collect::<String>()
    );
    let (ok, text) = execute(&exe, &instance, env);
    let passed = text.lines().any(|l| l == format!("PASS {name}"));
    assert!(
        ok && passed,
        "C program {name}{tag} {env:?} failed:\n{text}"
    );
}

macro_rules! programs {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                suite(stringify!($name), false, &[]);
            }
        )*
    };
}

programs!(
    nic, ptag, mem, vi, connect, peer, sendrecv, gather, immediate, rdma, cq, notify, timeout,
    disconnect, kill, errcb, ns, smi, threads, badinput, reuse, regreuse, regrace, regfork,
    forkopen, handles, srq, failstate,
);

/// libvipl loaded at run time, as a dependency of a plugin the program
/// `dlopen()`s (an MPI device, a language binding) rather than with the
/// program: its thread-local storage (the per-thread handle cache every
/// `Vip*` call reads, through TLS descriptors: `.cargo/config.toml`) is
/// then set up by `dlopen`, for the threads that exist and those created
/// later. The suite's `sendrecv` and `threads` are built as such plugins
/// (`main` renamed `plugin_main`, linked with `-lvipl`) and run by
/// `tests/c/dlopen_host.c`; once as glibc chooses, once with no static TLS
/// to spare (`glibc.rtld.optional_static_tls=0`), so that the library's
/// block is allocated per thread on first use.
#[test]
fn loaded_at_run_time() {
    let inst = install();
    let _g = serial();
    let suite = root().join("tests/c/suite");
    let lib = inst.prefix.join("lib");
    let host = inst.bin.join("dlopen_host");
    run(
        Command::new(cc())
            .args(WARN)
            .arg("-o")
            .arg(&host)
            .arg(root().join("tests/c/dlopen_host.c"))
            .arg("-ldl"),
        "compiling dlopen_host.c",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let ldd = run(Command::new("ldd").arg(&host), "ldd").unwrap_or_default();
    assert!(
        !ldd.contains("libvipl"),
        "the host program loads libvipl at start-up:\n{ldd}"
    );
    for name in ["sendrecv", "threads"] {
        let plugin = inst.bin.join(format!("{name}-plugin.so"));
        run(
            Command::new(cc())
                .args(WARN)
                .args(["-fPIC", "-shared", "-Dmain=plugin_main"])
                .arg(format!("-I{}", inst.prefix.join("include").display()))
                .arg(format!("-I{}", suite.display()))
                .arg("-o")
                .arg(&plugin)
                .arg(suite.join(format!("{name}.c")))
                .arg(suite.join("common.c"))
                .arg(format!("-L{}", lib.display()))
                .arg("-lvipl")
                .arg(format!("-Wl,-rpath,{}", lib.display())),
            &format!("building {name} as a plugin"),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        for (tag, env) in [
            ("", &[][..]),
            (
                "-nostatic",
                &[("GLIBC_TUNABLES", "glibc.rtld.optional_static_tls=0")][..],
            ),
        ] {
            let mut cmd = Command::new(&host);
            cmd.arg(&plugin);
            let (ok, text) = execute_cmd(cmd, &format!("dlopen-{name}{tag}"), env);
            assert!(
                ok && text.lines().any(|l| l == format!("PASS {name}")),
                "{name} loaded with dlopen {env:?} failed:\n{text}"
            );
        }
    }
}

#[test]
fn regfork_without_cache() {
    suite("regfork", false, &[("VIA_REGCACHE", "off")]);
}

#[test]
fn reuse_without_cache() {
    suite("reuse", false, &[("VIA_REGCACHE", "off")]);
}

#[test]
fn reuse_with_parked_registrations() {
    suite("reuse", false, &[("VIA_PARKED", "on")]);
}

#[test]
fn asan_sendrecv() {
    suite("sendrecv", true, &[]);
}

#[test]
fn asan_rdma() {
    suite("rdma", true, &[]);
}

#[test]
fn asan_notify() {
    suite("notify", true, &[]);
}

#[test]
fn asan_threads() {
    suite("threads", true, &[]);
}

#[test]
fn asan_badinput() {
    suite("badinput", true, &[]);
}

// The programs whose results depend on the CQ mechanism, with the scanning
// CQ (CQ2).
#[test]
fn scan_cq_timeout() {
    suite("timeout", false, &[("VIA_CQ", "scan")]);
}

#[test]
fn scan_cq_kill() {
    suite("kill", false, &[("VIA_CQ", "scan")]);
}

#[test]
fn scan_cq_threads() {
    suite("threads", false, &[("VIA_CQ", "scan")]);
}

/// `tools/check-header.sh` on the installed library: the header compiles as
/// C89/C99/C11/C++, its layouts match, and its functions are exactly the
/// library's `Vip*` symbols.
#[test]
fn header() {
    let inst = install();
    let _g = serial();
    let lib = inst.prefix.join("lib/libvipl.so");
    let mut cmd = Command::new(root().join("tools/check-header.sh"));
    cmd.arg(&lib).env("CC", cc());
    if let Err(e) = run(&mut cmd, "tools/check-header.sh") {
        panic!("{e}");
    }
}

/// The files the install step promises, the soname, and DESTDIR staging.
#[test]
fn install_layout() {
    let inst = install();
    let p = &inst.prefix;
    for f in [
        "include/vipl.h",
        "lib/libvipl.so.1.0.0",
        "lib/libvipl.a",
        "lib/pkgconfig/vipl.pc",
        "libexec/via-rs/viad",
    ] {
        assert!(p.join(f).is_file(), "{f} is not installed");
    }
    assert_eq!(
        std::fs::read_link(p.join("lib/libvipl.so.1")).unwrap(),
        Path::new("libvipl.so.1.0.0")
    );
    assert_eq!(
        std::fs::read_link(p.join("lib/libvipl.so")).unwrap(),
        Path::new("libvipl.so.1")
    );
    let header = std::fs::read(root().join("include/vipl.h")).unwrap();
    assert_eq!(
        std::fs::read(p.join("include/vipl.h")).unwrap(),
        header,
        "installed header differs"
    );
    let dynamic = run(
        Command::new("readelf")
            .arg("-d")
            .arg(p.join("lib/libvipl.so.1.0.0")),
        "readelf",
    )
    .unwrap();
    assert!(
        dynamic.contains("Library soname: [libvipl.so.1]"),
        "soname:\n{dynamic}"
    );
    let needed: Vec<&str> = dynamic.lines().filter(|l| l.contains("(NEEDED)")).collect();
    for l in &needed {
        assert!(
            [
                "libc.so",
                "libgcc_s.so",
                "ld-linux",
                "libm.so",
                "libpthread.so",
                "libdl.so",
                "librt.so"
            ]
            .iter()
            .any(|ok| l.contains(ok)),
            "libvipl.so needs more than the C runtime: {l}"
        );
    }
    let pc = std::fs::read_to_string(p.join("lib/pkgconfig/vipl.pc")).unwrap();
    assert!(
        pc.contains(&format!("prefix={}", p.display())),
        "vipl.pc:\n{pc}"
    );

    // DESTDIR: files under DESTDIR/PREFIX, vipl.pc naming PREFIX.
    let dest = inst.prefix.parent().unwrap().join("destdir");
    let _ = std::fs::remove_dir_all(&dest);
    let mut cmd = Command::new(root().join("tools/install.sh"));
    if cfg!(debug_assertions) {
        cmd.arg("--debug");
    }
    cmd.arg("/opt/vipl-test")
        .env("DESTDIR", &dest)
        .env("CARGO_TARGET_DIR", target_dir())
        .current_dir(root());
    run(&mut cmd, "tools/install.sh with DESTDIR").unwrap_or_else(|e| panic!("{e}"));
    let staged = dest.join("opt/vipl-test");
    assert!(staged.join("lib/libvipl.so.1.0.0").is_file());
    assert!(staged.join("libexec/via-rs/viad").is_file());
    let pc = std::fs::read_to_string(staged.join("lib/pkgconfig/vipl.pc")).unwrap();
    assert!(
        pc.contains("prefix=/opt/vipl-test\n"),
        "staged vipl.pc:\n{pc}"
    );
    // The system daemon's unit names the prefix's viad, and the example
    // configuration comes along.
    let unit =
        std::fs::read_to_string(staged.join("lib/systemd/system/via-rs-viad.service")).unwrap();
    assert!(
        unit.contains("ExecStart=/opt/vipl-test/libexec/via-rs/viad --system\n")
            && !unit.contains("/usr/local/"),
        "staged unit:\n{unit}"
    );
    assert!(staged.join("share/via-rs/viad.toml").is_file());
    let _ = std::fs::remove_dir_all(&dest);
}

fn pkg_config(args: &[&str]) -> Vec<String> {
    let inst = install();
    let mut cmd = Command::new("pkg-config");
    cmd.args(args)
        .arg("vipl")
        .env("PKG_CONFIG_PATH", inst.prefix.join("lib/pkgconfig"));
    let out = run(&mut cmd, "pkg-config").unwrap_or_else(|e| panic!("{e}"));
    out.split_whitespace().map(str::to_string).collect()
}

/// A program built with `pkg-config --cflags --libs vipl` only.
#[test]
fn pkg_config_build() {
    let inst = install();
    let flags = pkg_config(&["--cflags", "--libs"]);
    assert!(flags.iter().any(|f| f == "-lvipl"), "{flags:?}");
    let version = pkg_config(&["--modversion"]);
    assert_eq!(version, ["1.0.0"]);
    let _g = serial();
    let suite = root().join("tests/c/suite");
    let exe = inst.bin.join("nic-pkgconfig");
    let mut cmd = Command::new(cc());
    cmd.args(WARN)
        .arg(format!("-I{}", suite.display()))
        .arg("-o")
        .arg(&exe)
        .arg(suite.join("nic.c"))
        .arg(suite.join("common.c"))
        .args(&flags)
        .arg(format!("-Wl,-rpath,{}", inst.prefix.join("lib").display()));
    run(&mut cmd, "building with pkg-config flags").unwrap_or_else(|e| panic!("{e}"));
    let (ok, text) = execute(&exe, "pkgconfig", &[]);
    assert!(ok && text.contains("PASS nic"), "{text}");
}

/// A program linked statically with `libvipl.a` and `Libs.private`. It
/// cannot locate viad relative to a library, so `VIA_VIAD` names it.
#[test]
fn static_link() {
    let inst = install();
    let private: Vec<String> = pkg_config(&["--static", "--libs"])
        .into_iter()
        .filter(|f| f != "-lvipl" && !f.starts_with("-L"))
        .collect();
    let _g = serial();
    let suite = root().join("tests/c/suite");
    let exe = inst.bin.join("sendrecv-static");
    let mut cmd = Command::new(cc());
    cmd.args(WARN)
        .arg(format!("-I{}", inst.prefix.join("include").display()))
        .arg(format!("-I{}", suite.display()))
        .arg("-o")
        .arg(&exe)
        .arg(suite.join("sendrecv.c"))
        .arg(suite.join("common.c"))
        .arg(inst.prefix.join("lib/libvipl.a"))
        .args(&private);
    run(&mut cmd, "static link").unwrap_or_else(|e| panic!("{e}"));
    let ldd = run(Command::new("ldd").arg(&exe), "ldd").unwrap_or_default();
    assert!(
        !ldd.contains("libvipl"),
        "the static program loads libvipl.so:\n{ldd}"
    );
    let viad = inst.prefix.join("libexec/via-rs/viad");
    let (ok, text) = execute(&exe, "static", &[("VIA_VIAD", viad.to_str().unwrap())]);
    assert!(ok && text.contains("PASS sendrecv"), "{text}");
}

/// The suite's programs that apply between hosts, run with each process on
/// its own host: two network namespaces joined by a veth pair
/// (`via_tests::netns`, removed afterwards also when a program fails), the
/// parent in one, the forked child in the other (`SUITE_PEER_NETNS`: it
/// enters it before opening anything), each on the sockets NIC of its end
/// of the pair and with the viad of its own namespace (one instance per
/// namespace, shared by the programs in turn).
const BETWEEN_HOSTS: &[&str] = &[
    "nic",
    "ptag",
    "mem",
    "vi",
    "connect",
    "peer",
    "sendrecv",
    "gather",
    "immediate",
    "rdma",
    "cq",
    "notify",
    "timeout",
    "disconnect",
    "kill",
    "threads",
    "badinput",
    "reuse",
    "regreuse",
    "handles",
    "accept_disconnect",
    "quiet_disconnect",
    "regrace",
    "failstate",
];

/// The programs that do not apply between hosts, and why.
const ONE_HOST_ONLY: &[(&str, &str)] = &[
    (
        "ns",
        "local name-service files: VIA_HOSTS written by the parent, with addresses of this host",
    ),
    (
        "regfork",
        "fork semantics of registrations: the child inherits the parent's registered memory \
         and NIC, it must stay in the parent's process tree and host",
    ),
    (
        "forkopen",
        "fork semantics of the library's state: the worker is a child of the process that \
         used VIA, on its host",
    ),
    (
        "smi",
        "local name-service files (VIA_HOSTS with 6-byte addresses of the shared-memory NIC)",
    ),
    (
        "errcb",
        "an Unreliable send completes once written: only on one host does that mean the message \
         reached (and was dropped by) the target before the receive the program posts next",
    ),
    (
        "viad_inherits_fds",
        "what the viad started by the library inherits from this process: one host's daemon",
    ),
];

#[test]
fn between_two_hosts_over_the_sockets_nic() {
    use via_tests::netns::{Hosts, Side};
    let Some(h) = Hosts::new("csuite") else {
        return;
    };
    let _g = serial();
    for (name, why) in ONE_HOST_ONLY {
        eprintln!("c_suite between hosts: {name} not run: {why}");
    }
    let netns = |s: Side| format!("/run/netns/{}", h.namespace(s));
    let (dev_a, dev_b) = (h.device(Side::A), h.device(Side::B));
    let (ns_b, peer_dev) = (netns(Side::B), dev_b.as_str());
    let env: Vec<(&str, &str)> = vec![
        ("VIA_INSTANCE", h.namespace(Side::A)),
        ("SUITE_DEVICE", &dev_a),
        ("SUITE_REMOTE_HOST", h.addr(Side::B)),
        ("SUITE_PEER_NETNS", &ns_b),
        ("SUITE_PEER_DEVICE", peer_dev),
        ("SUITE_PEER_INSTANCE", h.namespace(Side::B)),
        ("SUITE_PEER_REMOTE_HOST", h.addr(Side::A)),
    ];
    let mut failed = Vec::new();
    for name in BETWEEN_HOSTS {
        let exe = build("tests/c/suite", name, &[], "");
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", h.namespace(Side::A)]).arg(&exe);
        let t = Instant::now();
        let (ok, text) = execute_cmd(cmd, name, &env);
        let passed = ok && text.lines().any(|l| l == format!("PASS {name}"));
        eprintln!(
            "c_suite between hosts: {name}: {} ({:.1} s)",
            if passed { "PASS" } else { "FAIL" },
            t.elapsed().as_secs_f64()
        );
        if !passed {
            failed.push(format!("== {name}\n{text}"));
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {} programs failed between hosts:\n{}",
        failed.len(),
        BETWEEN_HOSTS.len(),
        failed.join("\n")
    );
}

/// A disconnect that reaches a client while its VipConnectRequest is still
/// completing must not be lost.
#[test]
fn accept_disconnect() {
    suite("accept_disconnect", false, &[]);
}

/// An orderly disconnect by the peer is not logged as an error in a program
/// without an error callback; a killed peer still is.
#[test]
fn quiet_disconnect() {
    suite("quiet_disconnect", false, &[]);
}

/// The viad that the library starts must not keep the application's
/// descriptors open.
#[test]
fn viad_inherits_fds() {
    suite("viad_inherits_fds", false, &[]);
}

/// `cq` with the scanning CQ (CQ2), including VipResizeCQ below the
/// completions it holds.
#[test]
fn scan_cq_cq() {
    suite("cq", false, &[("VIA_CQ", "scan")]);
}

/// A legacy client started before its server: one retries
/// `VipConnectRequest` (500 ms timeout) on `VIP_NO_MATCH`, the other waits
/// with `VIP_INFINITE`. The servers (`via-peer`, listen and accept) are
/// started only once the retrying client has had 4 NO_MATCH answers, i.e.
/// at least 2 s after the waiting client said it was waiting, and the
/// waiting client is checked to be still waiting then. Both connect.
#[test]
fn late_server() {
    let _g = serial();
    let exe = build("tests/c/suite", "late_client", &[], "");
    let pid = std::process::id();
    let inst = format!("csuite-{pid}-late");
    let (d_retry, d_wait) = (format!("late-r-{pid}"), format!("late-w-{pid}"));
    let spawn = |args: &[&str]| {
        let mut cmd = Command::new(&exe);
        cmd.args(args)
            .env("VIA_INSTANCE", &inst)
            .env_remove("VIA_VIAD")
            .env_remove("VIA_HOSTS")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = cmd.spawn().expect("run late_client");
        let out = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    return;
                }
            }
        });
        (child, rx)
    };
    let line = |rx: &std::sync::mpsc::Receiver<String>| {
        rx.recv_timeout(Duration::from_secs(60))
            .expect("late_client silent for 60 s")
    };
    let (mut waiter, wait_rx) = spawn(&["wait", &d_wait]);
    assert_eq!(line(&wait_rx), "WAITING");
    let t0 = Instant::now();
    let (mut retrier, retry_rx) = spawn(&["retry", &d_retry, "500"]);
    for n in 1..=4 {
        assert_eq!(line(&retry_rx), format!("NOMATCH {n}"));
    }
    let late = t0.elapsed();
    assert!(late >= Duration::from_millis(1900), "only {late:?} late");
    // The waiting client is still waiting, having said nothing more.
    assert!(
        waiter.try_wait().unwrap().is_none(),
        "the waiting client exited"
    );
    assert!(
        wait_rx.try_recv().is_err(),
        "the waiting client stopped waiting"
    );
    let peer = Path::new(env!("CARGO_BIN_EXE_via-peer"));
    let server = |d: &str| {
        let mut s = Command::new(peer)
            .arg("serve")
            .env("VIA_INSTANCE", &inst)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("via-peer");
        {
            use std::io::Write;
            let w = s.stdin.as_mut().unwrap();
            writeln!(w, "open rd 65536 0 0").unwrap();
            writeln!(w, "listen {d} accept").unwrap();
            w.flush().unwrap();
        }
        s
    };
    let mut s1 = server(&d_wait);
    let mut s2 = server(&d_retry);
    assert_eq!(line(&wait_rx), "CONNECTED VIP_SUCCESS");
    let got = line(&retry_rx);
    assert!(
        got == "CONNECTED VIP_SUCCESS" || got.starts_with("NOMATCH"),
        "retrying client: {got}"
    );
    let mut got = got;
    while got.starts_with("NOMATCH") {
        got = line(&retry_rx);
    }
    assert_eq!(got, "CONNECTED VIP_SUCCESS");
    eprintln!("servers started {late:?} after the clients began waiting; both connected");
    for c in [&mut waiter, &mut retrier] {
        let st = c.wait().unwrap();
        assert!(st.success(), "late_client: {st}");
    }
    for s in [&mut s1, &mut s2] {
        drop(s.stdin.take());
        let _ = s.wait();
    }
}
