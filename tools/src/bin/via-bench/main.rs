//! via-bench: measurements of the provider against baselines run in the same
//! invocation.
//!
//! `via-bench` (or `via-bench report`) runs the main comparison: 8-byte
//! polling ping-pong latency against a bare shared-memory ping-pong (the
//! floor), and ping-pong and streaming bandwidth at 64 KiB, 1 MiB and 4 MiB
//! against `memcpy`. It starts its own peer process (this binary, in a
//! server role), prints a table, and writes JSON.
//!
//! Like fabtests, one binary is both client and server: the client spawns
//! `via-bench serve ...` and talks to it over VIA.

mod reg;

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;
use via::descriptor::status;
use via::shm::mapping::Mapping;
use via::{DescBuilder, Nic, Region, Reliability, Vi, ViAttributes};

const KIB: usize = 1024;
const MIB: usize = 1024 * 1024;

fn usage() -> ! {
    eprintln!(
        "usage: via-bench [report] [--quick] [--json FILE] [--reps N]\n\
         \x20      via-bench pingpong [--sizes a,b,..] [--iters N] [--wait poll|block] [--reliability u|rd|rr]\n\
         \x20      via-bench bw [--sizes a,b,..] [--iters N] [--window W]\n\
         \x20      via-bench reg|regpp|regcost|regscale|reuse|regbig [--quick] [--json FILE] [--size S]\n\
         \n\
         report: 8-byte latency vs a bare shared-memory ping-pong (the floor), and\n\
         ping-pong / streaming bandwidth at 64 KiB, 1 MiB, 4 MiB vs memcpy, all in one run.\n\
         Sizes accept K and M suffixes. Results: a table on stdout, JSON in --json (default\n\
         via-bench.json). Environment knobs of the provider (VIA_DOORBELL, VIA_CQ, VIA_INLINE,\n\
         VIA_SPIN_US, VIA_REGISTER) apply to both processes.\n\
         \n\
         reg: the registration benchmarks: regpp (register around every message vs once),\n\
         regcost (4K..256M, cache on and off), regscale (1..50,000 live registrations),\n\
         reuse (buffer reuse 0..100%), regbig (4 GiB: time and peak extra memory)."
    );
    std::process::exit(2)
}

#[derive(Clone)]
struct Opts {
    quick: bool,
    json: String,
    reps: usize,
    sizes: Option<Vec<usize>>,
    iters: Option<usize>,
    block: bool,
    rel: Reliability,
    window: usize,
}

fn parse_size(s: &str) -> usize {
    let s = s.trim();
    let (n, m) = if let Some(v) = s.strip_suffix(['K', 'k']) {
        (v, KIB)
    } else if let Some(v) = s.strip_suffix(['M', 'm']) {
        (v, MIB)
    } else {
        (s, 1)
    };
    n.parse::<usize>().unwrap_or_else(|_| usage()) * m
}

fn parse_opts(args: &[String]) -> Opts {
    let mut o = Opts {
        quick: false,
        json: "via-bench.json".into(),
        reps: 5,
        sizes: None,
        iters: None,
        block: false,
        rel: Reliability::ReliableDelivery,
        window: 16,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || it.next().cloned().unwrap_or_else(|| usage());
        match a.as_str() {
            "--quick" => o.quick = true,
            "--json" => o.json = val(),
            "--reps" => o.reps = val().parse().unwrap_or_else(|_| usage()),
            "--sizes" => o.sizes = Some(val().split(',').map(parse_size).collect()),
            "--iters" => o.iters = Some(val().parse().unwrap_or_else(|_| usage())),
            "--wait" => {
                o.block = match val().as_str() {
                    "poll" => false,
                    "block" => true,
                    _ => usage(),
                }
            }
            "--reliability" => {
                o.rel = match val().as_str() {
                    "u" => Reliability::Unreliable,
                    "rd" => Reliability::ReliableDelivery,
                    "rr" => Reliability::ReliableReception,
                    _ => usage(),
                }
            }
            "--window" => o.window = val().parse().unwrap_or_else(|_| usage()),
            _ => usage(),
        }
    }
    o
}

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (cmd, rest) = match args.first().map(String::as_str) {
        None => ("report", &args[..]),
        Some(c) if !c.starts_with("--") => (c, &args[1..]),
        Some(_) => ("report", &args[..]),
    };
    match cmd {
        "serve" => serve(rest),
        "loopback" => loopback(rest.first().and_then(|v| v.parse().ok()).unwrap_or(100_000)),
        "report" => report(&parse_opts(rest)),
        "regpp" | "regcost" | "regscale" | "reuse" | "regbig" | "reg" => reg::main(cmd, rest),
        "pingpong" => {
            let o = parse_opts(rest);
            let sizes = o
                .sizes
                .clone()
                .unwrap_or_else(|| (0..=22).step_by(2).map(|p| 1 << p).collect());
            println!(
                "{:>10} {:>12} {:>10} {:>10} {:>12} {:>8}",
                "bytes", "half-RTT us", "median", "p99", "MB/s", "cpu %"
            );
            let mut rows = Vec::new();
            for s in sizes {
                eprintln!("  {s} bytes...");
                let r = via_pingpong(&o, s, o.iters.unwrap_or(iters_for(s, o.quick)));
                println!(
                    "{:>10} {:>12.3} {:>10.3} {:>10.3} {:>12.1} {:>8.0}",
                    s,
                    r.half_rtt_us,
                    r.median_us,
                    r.p99_us,
                    r.mbps(s),
                    r.cpu_pct
                );
                rows.push(json!({
                    "bytes": s, "half_rtt_us": r.half_rtt_us, "median_us": r.median_us,
                    "p99_us": r.p99_us, "mbps": r.mbps(s), "cpu_pct": r.cpu_pct,
                }));
            }
            write_json(
                &o.json,
                json!({
                    "tool": "via-bench pingpong",
                    "wait": if o.block { "block" } else { "poll" },
                    "reliability": rel_name(o.rel),
                    "rows": rows,
                }),
            );
        }
        "bw" => {
            let o = parse_opts(rest);
            let sizes = o
                .sizes
                .clone()
                .unwrap_or_else(|| vec![4 * KIB, 64 * KIB, MIB, 4 * MIB]);
            println!("{:>10} {:>12}", "bytes", "MB/s");
            let mut rows = Vec::new();
            for s in sizes {
                eprintln!("  {s} bytes...");
                let gbps = via_stream(&o, s, o.iters.unwrap_or(iters_for(s, o.quick)));
                println!("{:>10} {:>12.1}", s, gbps * 1000.0);
                rows.push(json!({"bytes": s, "gbps": gbps}));
            }
            write_json(
                &o.json,
                json!({
                    "tool": "via-bench bw",
                    "window": o.window,
                    "reliability": rel_name(o.rel),
                    "rows": rows,
                }),
            );
        }
        _ => usage(),
    }
}

/// Rounds timed one by one for the percentiles.
fn sample_count(iters: usize) -> usize {
    (iters / 4).max(iters.min(1000))
}

fn write_json(path: &str, v: serde_json::Value) {
    match std::fs::write(path, serde_json::to_string_pretty(&v).unwrap()) {
        Ok(()) => println!("JSON: {path}"),
        Err(e) => eprintln!("cannot write {path}: {e}"),
    }
}

fn iters_for(size: usize, quick: bool) -> usize {
    let n = match size {
        0..=4096 => 100_000,
        4097..=65536 => 10_000,
        65537..=1048576 => 1_000,
        _ => 250,
    };
    if quick { (n / 10).max(20) } else { n }
}

fn pin(cpu: usize) {
    if via::sys::cpu_count() > cpu && std::env::var_os("VIA_BENCH_NOPIN").is_none() {
        let _ = via::sys::pin_to_cpu(cpu);
    }
}

// ---------------------------------------------------------------- server side

/// `via-bench serve via <disc> <max> <rel> <block> | serve shm <pid> <fd> <iters> | serve stream <disc> <max> <window> <rel>`
fn serve(args: &[String]) {
    pin(1);
    match args.first().map(String::as_str) {
        Some("via") => serve_echo(
            &args[1],
            args[2].parse().unwrap(),
            rel_of(&args[3]),
            args[4] == "block",
        ),
        Some("shm") => serve_shm(
            args[1].parse().unwrap(),
            args[2].parse().unwrap(),
            args[3].parse().unwrap(),
        ),
        Some("regpp") => reg::serve_regpp(&args[1], args[2].parse().unwrap(), args[3] == "each"),
        Some("stream") => serve_stream(
            &args[1],
            args[2].parse().unwrap(),
            args[3].parse().unwrap(),
            rel_of(&args[4]),
        ),
        _ => usage(),
    }
}

fn rel_of(s: &str) -> Reliability {
    match s {
        "u" => Reliability::Unreliable,
        "rr" => Reliability::ReliableReception,
        _ => Reliability::ReliableDelivery,
    }
}

fn rel_name(r: Reliability) -> &'static str {
    match r {
        Reliability::Unreliable => "u",
        Reliability::ReliableDelivery => "rd",
        Reliability::ReliableReception => "rr",
    }
}

struct Ends {
    nic: Nic,
    mem: Region,
    vi: Vi,
}

fn ends(bytes: usize, rel: Reliability) -> Ends {
    let nic = Nic::open(None).expect("open NIC");
    // The end of a run is a disconnect, which the peer sees as a lost
    // connection: expected here, not worth an error line.
    nic.set_error_callback(|e| {
        if e.code != via::ErrorCode::ConnLost {
            log::error!("asynchronous error {:?}", e.code);
        }
    });
    let ptag = nic.create_ptag().unwrap();
    let mem = Region::new(&nic, bytes, ptag, false, false).expect("register");
    let mut a = ViAttributes::new(rel, ptag);
    a.max_transfer_size = nic.attributes().max_transfer_size as u32;
    let vi = nic.create_vi(&a, None, None).expect("create VI");
    Ends { nic, mem, vi }
}

fn done_or_wait(vi: &Vi, recv: bool, block: bool) -> u32 {
    let r = if block {
        if recv {
            vi.recv_wait(Some(Duration::from_secs(30)))
        } else {
            vi.send_wait(Some(Duration::from_secs(30)))
        }
    } else {
        let t0 = Instant::now();
        loop {
            match if recv { vi.recv_done() } else { vi.send_done() } {
                Err(e) if e.kind() == via::ErrorKind::NotDone => {
                    if t0.elapsed() > Duration::from_secs(30) {
                        panic!("no completion in 30 s");
                    }
                    std::hint::spin_loop();
                }
                r => break r,
            }
        }
    };
    let c = r.expect("completion");
    assert_eq!(
        c.status & status::ERROR_MASK & !status::DESC_FLUSHED_ERROR,
        0,
        "completion status {:#x}",
        c.status
    );
    c.status
}

fn serve_echo(disc: &str, max: usize, rel: Reliability, block: bool) {
    let e = ends(2 * max + 8192, rel);
    let (rbuf, sbuf) = (4096, 4096 + max);
    let rd = DescBuilder::recv()
        .segment(&e.mem, rbuf, max as u32)
        .write(&e.mem, 0)
        .unwrap();
    e.vi.post_recv(&e.mem, rd).unwrap();
    println!("READY");
    std::io::stdout().flush().unwrap();
    let req = e
        .nic
        .connect_wait(
            &e.nic.address(disc.as_bytes()),
            Some(Duration::from_secs(30)),
        )
        .expect("wait");
    req.accept(&e.vi).expect("accept");
    // The reply has the request's length; rebuild its descriptor when it changes.
    let mut sd_len = u32::MAX;
    loop {
        if done_or_wait(&e.vi, true, block) & status::DESC_FLUSHED_ERROR != 0 {
            // The client disconnected.
            break;
        }
        let len = e.mem.word(rd + 24);
        e.vi.post_recv(&e.mem, rd).unwrap();
        if len != sd_len {
            DescBuilder::send()
                .segment(&e.mem, sbuf, len)
                .write(&e.mem, 128)
                .unwrap();
            sd_len = len;
        }
        e.vi.post_send(&e.mem, 128).unwrap();
        done_or_wait(&e.vi, false, block);
    }
}

fn serve_stream(disc: &str, max: usize, window: usize, rel: Reliability) {
    let e = ends(max + 8192 + window * 64, rel);
    let rbuf = 4096 + window * 64;
    let descs: Vec<usize> = (0..window)
        .map(|i| {
            DescBuilder::recv()
                .segment(&e.mem, rbuf, max as u32)
                .write(&e.mem, i * 64)
                .unwrap()
        })
        .collect();
    let ack = 4096 + window * 64 - 64;
    let ack = DescBuilder::send().write(&e.mem, ack - (ack % 64)).unwrap();
    for d in &descs {
        e.vi.post_recv(&e.mem, *d).unwrap();
    }
    println!("READY");
    std::io::stdout().flush().unwrap();
    let req = e
        .nic
        .connect_wait(
            &e.nic.address(disc.as_bytes()),
            Some(Duration::from_secs(30)),
        )
        .expect("wait");
    req.accept(&e.vi).expect("accept");
    loop {
        let mut last = 0;
        for d in &descs {
            done_or_wait(&e.vi, true, false);
            last = e.mem.word(d + 24);
        }
        for d in &descs {
            e.vi.post_recv(&e.mem, *d).unwrap();
        }
        e.vi.post_send(&e.mem, ack).unwrap();
        done_or_wait(&e.vi, false, false);
        if last == 0 {
            break;
        }
    }
}

fn serve_shm(pid: u32, fd: i32, iters: u64) {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/{pid}/fd/{fd}"))
        .expect("open the shared page");
    let map = Mapping::map_shared(&std::os::fd::OwnedFd::from(f), 0, 4096).unwrap();
    let ping = map.view::<AtomicU64>(0).unwrap();
    let ping_data = map.view::<AtomicU64>(8).unwrap();
    let pong = map.view::<AtomicU64>(128).unwrap();
    let pong_data = map.view::<AtomicU64>(136).unwrap();
    println!("READY");
    std::io::stdout().flush().unwrap();
    for i in 1..=iters {
        // Acquire/Release: the payload word travels with the sequence word.
        while ping.load(Ordering::Acquire) != i {
            std::hint::spin_loop();
        }
        pong_data.store(ping_data.load(Ordering::Relaxed), Ordering::Relaxed);
        pong.store(i, Ordering::Release);
    }
}

// ---------------------------------------------------------------- client side

struct Child {
    child: std::process::Child,
}

impl Child {
    fn start(args: &[String]) -> Child {
        let exe = std::env::current_exe().expect("own path");
        let mut child = Command::new(exe)
            .arg("serve")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn server");
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        std::io::BufRead::read_line(&mut out, &mut line).unwrap();
        assert_eq!(line.trim(), "READY", "server did not start");
        Child { child }
    }

    fn finish(mut self) {
        let st = self.child.wait().unwrap();
        assert!(st.success(), "server failed: {st}");
    }
}

struct Lat {
    half_rtt_us: f64,
    median_us: f64,
    p99_us: f64,
    cpu_pct: f64,
}

impl Lat {
    fn mbps(&self, size: usize) -> f64 {
        if self.half_rtt_us == 0.0 {
            0.0
        } else {
            size as f64 / self.half_rtt_us
        }
    }
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() - 1) as f64 * p) as usize]
}

fn unique(tag: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "bench-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

fn via_pingpong(o: &Opts, size: usize, iters: usize) -> Lat {
    pin(0);
    let max = size.max(8);
    let disc = unique("pp");
    let child = Child::start(&[
        "via".into(),
        disc.clone(),
        max.to_string(),
        rel_name(o.rel).into(),
        if o.block { "block" } else { "poll" }.into(),
    ]);
    let e = ends(2 * max + 8192, o.rel);
    e.vi.connect(
        &e.nic.address(b"client"),
        &e.nic.address(disc.as_bytes()),
        Some(Duration::from_secs(30)),
    )
    .expect("connect");
    let (rbuf, sbuf) = (4096, 4096 + max);
    let rd = DescBuilder::recv()
        .segment(&e.mem, rbuf, max as u32)
        .write(&e.mem, 0)
        .unwrap();
    let sd = DescBuilder::send()
        .segment(&e.mem, sbuf, size as u32)
        .write(&e.mem, 128)
        .unwrap();
    let prof = std::env::var_os("VIA_BENCH_PROFILE").is_some();
    let acc = std::cell::Cell::new([0u128; 4]);
    let hist = std::cell::RefCell::new(Vec::<(u32, u32, u32)>::new());
    let round = || {
        let t0 = Instant::now();
        e.vi.post_recv(&e.mem, rd).unwrap();
        let t1 = Instant::now();
        e.vi.post_send(&e.mem, sd).unwrap();
        let t2 = Instant::now();
        done_or_wait(&e.vi, true, o.block);
        let t3 = Instant::now();
        done_or_wait(&e.vi, false, o.block);
        if prof {
            let mut a = acc.get();
            a[0] += (t1 - t0).as_nanos();
            a[1] += (t2 - t1).as_nanos();
            a[2] += (t3 - t2).as_nanos();
            a[3] += 1;
            acc.set(a);
            hist.borrow_mut().push((
                (t1 - t0).as_nanos() as u32,
                (t2 - t1).as_nanos() as u32,
                (t3 - t2).as_nanos() as u32,
            ));
        }
    };
    for _ in 0..(iters / 10).max(10) {
        round();
    }
    // The mean comes from a run with no clock read per round; the
    // percentiles from a shorter run that times each round.
    let cpu0 = via::sys::rusage_cpu();
    let t0 = Instant::now();
    for _ in 0..iters {
        round();
    }
    let total = t0.elapsed();
    let cpu = via::sys::rusage_cpu() - cpu0;
    let sampled = sample_count(iters);
    let mut samples = Vec::with_capacity(sampled);
    for _ in 0..sampled {
        let t = Instant::now();
        round();
        samples.push(t.elapsed().as_secs_f64() * 1e6 / 2.0);
    }
    if prof {
        let a = acc.get();
        eprintln!(
            "profile: post_recv {} ns, post_send {} ns, wait {} ns (per round)",
            a[0] / a[3].max(1),
            a[1] / a[3].max(1),
            a[2] / a[3].max(1)
        );
        let h = hist.borrow();
        for k in 0..3 {
            let mut v: Vec<u32> = h.iter().map(|x| [x.0, x.1, x.2][k]).collect();
            v.sort();
            eprintln!(
                "  part {k}: min {} p50 {} p90 {} p99 {} max {}",
                v[0],
                v[v.len() / 2],
                v[v.len() * 9 / 10],
                v[v.len() * 99 / 100],
                v[v.len() - 1]
            );
        }
    }
    // Disconnecting flushes the server's receive: its signal to stop.
    e.vi.disconnect().expect("disconnect");
    child.finish();
    Lat {
        half_rtt_us: total.as_secs_f64() * 1e6 / iters as f64 / 2.0,
        median_us: percentile(&mut samples.clone(), 0.5),
        p99_us: percentile(&mut samples, 0.99),
        cpu_pct: cpu.as_secs_f64() / total.as_secs_f64() * 100.0,
    }
}

fn via_stream(o: &Opts, size: usize, iters: usize) -> f64 {
    pin(0);
    let w = o.window.max(1);
    let rounds = (iters / w).max(2);
    let disc = unique("bw");
    let child = Child::start(&[
        "stream".into(),
        disc.clone(),
        size.max(8).to_string(),
        w.to_string(),
        rel_name(o.rel).into(),
    ]);
    let e = ends(size.max(8) + 8192, o.rel);
    e.vi.connect(
        &e.nic.address(b"client"),
        &e.nic.address(disc.as_bytes()),
        Some(Duration::from_secs(30)),
    )
    .expect("connect");
    let sbuf = 4096;
    let sd = DescBuilder::send()
        .segment(&e.mem, sbuf, size as u32)
        .write(&e.mem, 0)
        .unwrap();
    let last = DescBuilder::send()
        .segment(&e.mem, sbuf, 0)
        .write(&e.mem, 64)
        .unwrap();
    let ack = DescBuilder::recv().write(&e.mem, 128).unwrap();
    let run = |n: usize, stop: bool| {
        let t0 = Instant::now();
        for r in 0..n {
            e.vi.post_recv(&e.mem, ack).unwrap();
            for i in 0..w {
                let d = if stop && r == n - 1 && i == w - 1 {
                    last
                } else {
                    sd
                };
                e.vi.post_send(&e.mem, d).unwrap();
            }
            for _ in 0..w {
                done_or_wait(&e.vi, false, false);
            }
            done_or_wait(&e.vi, true, false);
        }
        t0.elapsed()
    };
    run(1, false);
    let t = run(rounds, true);
    child.finish();
    (size * w * rounds) as f64 / t.as_secs_f64() / 1e9
}

fn shm_floor(iters: u64) -> Lat {
    pin(0);
    let (fd, map) = Mapping::create("via-bench-floor", 4096).expect("memfd");
    let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
    via::sys::clear_cloexec(raw).ok();
    let child = Child::start(&[
        "shm".into(),
        std::process::id().to_string(),
        raw.to_string(),
        (iters + sample_count(iters as usize) as u64).to_string(),
    ]);
    let ping = map.view::<AtomicU64>(0).unwrap();
    let ping_data = map.view::<AtomicU64>(8).unwrap();
    let pong = map.view::<AtomicU64>(128).unwrap();
    let pong_data = map.view::<AtomicU64>(136).unwrap();
    let sampled = sample_count(iters as usize) as u64;
    let mut samples = Vec::with_capacity(sampled as usize);
    let mut sum = 0u64;
    let mut round = |i: u64| {
        ping_data.store(i * 3, Ordering::Relaxed);
        ping.store(i, Ordering::Release);
        while pong.load(Ordering::Acquire) != i {
            std::hint::spin_loop();
        }
        sum = sum.wrapping_add(pong_data.load(Ordering::Relaxed));
    };
    // As for VIA: the mean without clock reads, then timed rounds.
    let t0 = Instant::now();
    for i in 1..=iters {
        round(i);
    }
    let total = t0.elapsed();
    for i in iters + 1..=iters + sampled {
        let t = Instant::now();
        round(i);
        samples.push(t.elapsed().as_secs_f64() * 1e6 / 2.0);
    }
    assert_eq!(
        sum,
        (1..=iters + sampled).map(|i| i * 3).sum::<u64>(),
        "payload check"
    );
    child.finish();
    Lat {
        half_rtt_us: total.as_secs_f64() * 1e6 / iters as f64 / 2.0,
        median_us: percentile(&mut samples.clone(), 0.5),
        p99_us: percentile(&mut samples, 0.99),
        cpu_pct: 0.0,
    }
}

fn memcpy_gbps(size: usize, iters: usize) -> f64 {
    pin(0);
    let a = vec![1u8; size];
    let mut b = vec![2u8; size];
    for _ in 0..iters.min(10) {
        b.copy_from_slice(&a);
    }
    let t0 = Instant::now();
    for _ in 0..iters {
        b.copy_from_slice(std::hint::black_box(&a));
        std::hint::black_box(&mut b);
    }
    (size * iters) as f64 / t0.elapsed().as_secs_f64() / 1e9
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn report(o: &Opts) {
    let reps = if o.quick { o.reps.min(3) } else { o.reps };
    let lat_iters = if o.quick { 20_000 } else { 100_000 };
    let sizes = [64 * KIB, MIB, 4 * MIB];
    eprintln!("via-bench report: {reps} repetitions, interleaved; progress on stderr");
    let mut floor = Vec::new();
    let mut via_lat = Vec::new();
    let mut via_med = Vec::new();
    let mut floor_med = Vec::new();
    for r in 0..reps {
        eprintln!("  [{}/{}] latency: floor, VIA", r + 1, reps);
        let f = shm_floor(lat_iters as u64);
        floor.push(f.half_rtt_us);
        floor_med.push(f.median_us);
        let v = via_pingpong(o, 8, lat_iters);
        via_lat.push(v.half_rtt_us);
        via_med.push(v.median_us);
    }
    let mut rows = Vec::new();
    for &s in &sizes {
        let it = iters_for(s, o.quick);
        let (mut m, mut pp, mut st) = (Vec::new(), Vec::new(), Vec::new());
        for r in 0..reps {
            eprintln!(
                "  [{}/{}] {} KiB: memcpy, ping-pong, stream",
                r + 1,
                reps,
                s / KIB
            );
            m.push(memcpy_gbps(s, it));
            pp.push(via_pingpong(o, s, it).mbps(s) / 1000.0);
            st.push(via_stream(o, s, it));
        }
        rows.push((s, median(m), median(pp), median(st)));
    }
    let (fl, vl) = (median(floor.clone()), median(via_lat.clone()));
    println!();
    println!("8-byte half round trip (polling), median of {reps} runs of {lat_iters} iterations");
    println!("{:<32} {:>10} {:>10}", "", "mean us", "median us");
    println!(
        "{:<32} {:>10.3} {:>10.3}",
        "bare shared-memory ping-pong",
        fl,
        median(floor_med)
    );
    println!(
        "{:<32} {:>10.3} {:>10.3}",
        "VIA send/recv",
        vl,
        median(via_med)
    );
    println!(
        "{:<32} {:>10.2}   (goal <= 1.5)",
        "ratio VIA / floor",
        vl / fl
    );
    println!();
    println!("bandwidth, GB/s (10^9 bytes/s), median of {reps} runs");
    println!(
        "{:>8} {:>10} {:>12} {:>10} {:>10} {:>10}",
        "size", "memcpy", "VIA pp", "VIA stream", "pp/memcpy", "st/memcpy"
    );
    for (s, m, pp, st) in &rows {
        println!(
            "{:>8} {:>10.2} {:>12.2} {:>10.2} {:>10.2} {:>10.2}",
            format!("{}K", s / KIB),
            m,
            pp,
            st,
            pp / m,
            st / m
        );
    }
    let one_mib = rows.iter().find(|r| r.0 == MIB).unwrap();
    println!(
        "\ngoals: 8-byte latency <= 1.5x floor: {}; 1 MiB ping-pong >= 0.45x memcpy: {}",
        if vl / fl <= 1.5 { "met" } else { "NOT met" },
        if one_mib.2 / one_mib.1 >= 0.45 {
            "met"
        } else {
            "NOT met"
        }
    );
    let j = json!({
        "tool": "via-bench report",
        "reps": reps,
        "cpus": via::sys::cpu_count(),
        "config": {
            "doorbell": std::env::var("VIA_DOORBELL").unwrap_or_else(|_| "central".into()),
            "cq": std::env::var("VIA_CQ").unwrap_or_else(|_| "ring".into()),
            "inline": std::env::var("VIA_INLINE").unwrap_or_else(|_| "0".into()),
            "register": std::env::var("VIA_REGISTER").unwrap_or_else(|_| "remap".into()),
        },
        "latency_8b": {
            "floor_us": fl, "via_us": vl, "ratio": vl / fl, "goal_max_ratio": 1.5,
            "floor_runs_us": floor, "via_runs_us": via_lat,
        },
        "bandwidth": rows.iter().map(|(s, m, pp, st)| json!({
            "bytes": s, "memcpy_gbps": m, "pingpong_gbps": pp, "stream_gbps": st,
            "pingpong_ratio": pp / m, "stream_ratio": st / m,
        })).collect::<Vec<_>>(),
        "goal_bw_min_ratio_1mib": 0.45,
    });
    write_json(&o.json, j);
}

/// One process, two connected VIs, one thread: the cost of the calls
/// without any cross-core traffic (`via-bench loopback [iters]`).
fn loopback(iters: usize) {
    let a = ends(1 << 20, Reliability::ReliableDelivery);
    let ptag = a.nic.create_ptag().unwrap();
    let mem_b = Region::new(&a.nic, 1 << 20, ptag, false, false).unwrap();
    let vi_b = a
        .nic
        .create_vi(
            &ViAttributes::new(Reliability::ReliableDelivery, ptag),
            None,
            None,
        )
        .unwrap();
    let disc = unique("lo");
    std::thread::scope(|sc| {
        let h = sc.spawn(|| {
            let req = a
                .nic
                .connect_wait(
                    &a.nic.address(disc.as_bytes()),
                    Some(Duration::from_secs(10)),
                )
                .unwrap();
            req.accept(&vi_b).unwrap();
        });
        a.vi.connect(
            &a.nic.address(b"c"),
            &a.nic.address(disc.as_bytes()),
            Some(Duration::from_secs(10)),
        )
        .unwrap();
        h.join().unwrap();
    });
    let rd = DescBuilder::recv()
        .segment(&mem_b, 4096, 64)
        .write(&mem_b, 0)
        .unwrap();
    let sd = DescBuilder::send()
        .segment(&a.mem, 4096, 8)
        .write(&a.mem, 0)
        .unwrap();
    let mut t = [Duration::ZERO; 4];
    for i in 0..iters + 1000 {
        let t0 = Instant::now();
        vi_b.post_recv(&mem_b, rd).unwrap();
        let t1 = Instant::now();
        a.vi.post_send(&a.mem, sd).unwrap();
        let t2 = Instant::now();
        vi_b.recv_done().unwrap();
        let t3 = Instant::now();
        a.vi.send_done().unwrap();
        let t4 = Instant::now();
        if i >= 1000 {
            t[0] += t1 - t0;
            t[1] += t2 - t1;
            t[2] += t3 - t2;
            t[3] += t4 - t3;
        }
    }
    let n = iters as u32;
    println!(
        "post_recv {:?}  post_send {:?}  recv_done {:?}  send_done {:?}",
        t[0] / n,
        t[1] / n,
        t[2] / n,
        t[3] / n
    );
}
