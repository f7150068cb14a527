//! Registration benchmarks (the registration issue, #8), each against a
//! baseline measured in the same run:
//!
//! * `regpp`: a ping-pong that registers and deregisters its buffers around
//!   every message (as legacy message-passing libraries do), against the
//!   same ping-pong with buffers registered once, in alternating blocks of
//!   rounds of one pair of processes; 64 KiB and 1 MiB, with the
//!   registration cache on and off.
//! * `regcost`: register + deregister of 4 KiB .. 256 MiB: the first time
//!   (pages move into shared memory) and repeated, cache on and off.
//! * `regscale`: the cost of a registration (a miss, and a hit) with 1 ..
//!   50,000 registrations already live.
//! * `reuse`: the thesis's buffer-reuse ping-pong: every message from a
//!   buffer registered around it, a share of them (0 .. 100 %) reused,
//!   cache on and off, with the hit rates of the registration cache and of
//!   the engine's translation cache.
//! * `regbig`: registering 4 GiB: time and peak extra memory.
//!
//! Settings that are per process (the cache on or off) run in a child
//! process of this binary (`... --inner`), which prints one JSON line.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use via::{DescBuilder, Memory, Nic, Ptag, Region, Reliability, Vi, ViAttributes};

use super::{Child, KIB, MIB, done_or_wait, pin, unique, write_json};

/// Options of the registration benchmarks.
pub struct RegOpts {
    pub quick: bool,
    pub inner: bool,
    pub json: Option<String>,
    pub size: Option<usize>,
}

/// Runs `via-bench <cmd> --inner [args]` with `env`; returns its JSON line.
fn variant(cmd: &str, args: &[&str], env: &[(&str, &str)]) -> Value {
    let exe = std::env::current_exe().expect("own path");
    let out = Command::new(exe)
        .arg(cmd)
        .arg("--inner")
        .args(args)
        .envs(env.iter().copied())
        .stderr(Stdio::inherit())
        .output()
        .expect("run the measuring process");
    assert!(out.status.success(), "{cmd} {args:?} {env:?} failed");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().unwrap_or("");
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{cmd}: bad output {line:?}: {e}"))
}

fn setup() -> (Nic, Ptag) {
    let nic = Nic::open(None).expect("open NIC");
    nic.set_error_callback(|e| {
        if e.code != via::ErrorCode::ConnLost {
            log::error!("asynchronous error {:?}", e.code);
        }
    });
    let ptag = nic.create_ptag().unwrap();
    (nic, ptag)
}

fn touch(mem: &Memory) {
    let page = 4096;
    for off in (0..mem.len()).step_by(page) {
        mem.write(off, &[1]).unwrap();
    }
}

fn us(d: Duration, n: usize) -> f64 {
    d.as_secs_f64() * 1e6 / n.max(1) as f64
}

// ------------------------------------------------------------------ regcost

fn regcost_inner(o: &RegOpts) {
    let (nic, ptag) = setup();
    let top = if o.quick { 16 * MIB } else { 256 * MIB };
    let mut rows = Vec::new();
    let mut size = 4 * KIB;
    while size <= top {
        let mem = Memory::new(size).unwrap();
        touch(&mem);
        let t = Instant::now();
        Region::within(&nic, &mem, 0, size, ptag, false, false)
            .unwrap()
            .deregister()
            .unwrap();
        let first = t.elapsed();
        let n = (((256 * MIB) / size).clamp(5, 2000) / if o.quick { 4 } else { 1 }).max(3);
        let t = Instant::now();
        for _ in 0..n {
            Region::within(&nic, &mem, 0, size, ptag, false, false)
                .unwrap()
                .deregister()
                .unwrap();
        }
        let again = t.elapsed();
        rows.push(json!({"bytes": size, "first_us": us(first, 1), "again_us": us(again, n)}));
        size *= 4;
    }
    let s = nic.registration_stats();
    println!(
        "{}",
        json!({"rows": rows, "hits": s.cache.hits, "misses": s.cache.misses})
    );
}

fn regcost(o: &RegOpts) -> Value {
    let q: &[&str] = if o.quick { &["--quick"] } else { &[] };
    let on = variant("regcost", q, &[("VIA_REGCACHE", "on")]);
    let off = variant("regcost", q, &[("VIA_REGCACHE", "off")]);
    println!(
        "\nregister + deregister, microseconds (first: the pages move; again: the mean of repeats)"
    );
    println!(
        "{:>8} {:>14} {:>14} {:>14} {:>14}",
        "size", "first (on)", "again (on)", "first (off)", "again (off)"
    );
    let (a, b) = (
        on["rows"].as_array().unwrap(),
        off["rows"].as_array().unwrap(),
    );
    for (x, y) in a.iter().zip(b) {
        println!(
            "{:>8} {:>14.1} {:>14.2} {:>14.1} {:>14.1}",
            fmt_size(x["bytes"].as_u64().unwrap() as usize),
            x["first_us"].as_f64().unwrap(),
            x["again_us"].as_f64().unwrap(),
            y["first_us"].as_f64().unwrap(),
            y["again_us"].as_f64().unwrap()
        );
    }
    json!({"cache_on": on, "cache_off": off})
}

fn fmt_size(s: usize) -> String {
    if s >= MIB {
        format!("{}M", s / MIB)
    } else {
        format!("{}K", s / KIB)
    }
}

// ------------------------------------------------------------------ regscale

fn regscale_inner(o: &RegOpts) {
    let (nic, ptag) = setup();
    let counts: &[usize] = if o.quick {
        &[1, 100, 5_000]
    } else {
        &[1, 10, 100, 1000, 5_000, 10_000, 50_000]
    };
    let m = if o.quick { 50 } else { 200 };
    let mut rows = Vec::new();
    for &n in counts {
        for kind in ["small", "pages"] {
            // One arena (and one fd held by viad) per page-sized region:
            // viad's per-process fd budget (half its RLIMIT_NOFILE) bounds
            // these; 5,000 fits the 20,000 of a small container.
            if kind == "pages" && n > 5_000 {
                continue;
            }
            // n live registrations: 128-byte buffers 256 bytes apart (no
            // pages move), or one page each, a page apart (an arena each).
            let stride = if kind == "small" { 256 } else { 8192 };
            let len = if kind == "small" { 128 } else { 4096 };
            let live_mem = Memory::new(n * stride).unwrap();
            let live: Vec<Region> = (0..n)
                .map(|i| {
                    Region::within(&nic, &live_mem, i * stride, len, ptag, false, false).unwrap()
                })
                .collect();
            // Misses: fresh 64 KiB buffers, each registered for the first time.
            let fresh = Memory::new(m * 64 * KIB).unwrap();
            touch(&fresh);
            let t = Instant::now();
            for i in 0..m {
                Region::within(&nic, &fresh, i * 64 * KIB, 64 * KIB, ptag, false, false)
                    .unwrap()
                    .deregister()
                    .unwrap();
            }
            let miss = us(t.elapsed(), m);
            // Hits: the same buffer again.
            let t = Instant::now();
            for _ in 0..m {
                Region::within(&nic, &fresh, 0, 64 * KIB, ptag, false, false)
                    .unwrap()
                    .deregister()
                    .unwrap();
            }
            let hit = us(t.elapsed(), m);
            rows.push(json!({"live": n, "kind": kind, "miss_us": miss, "hit_us": hit}));
            drop(live);
        }
    }
    println!("{}", json!({ "rows": rows }));
}

fn regscale(o: &RegOpts) -> Value {
    let q: &[&str] = if o.quick { &["--quick"] } else { &[] };
    let v = variant("regscale", q, &[]);
    println!("\nregistration of a 64 KiB buffer with n registrations live, microseconds");
    println!(
        "{:>8} {:>8} {:>16} {:>16}",
        "n", "live", "miss (1st time)", "hit (again)"
    );
    for r in v["rows"].as_array().unwrap() {
        println!(
            "{:>8} {:>8} {:>16.1} {:>16.2}",
            r["live"].as_u64().unwrap(),
            r["kind"].as_str().unwrap(),
            r["miss_us"].as_f64().unwrap(),
            r["hit_us"].as_f64().unwrap()
        );
    }
    v
}

// ------------------------------------------------------------------ regbig

/// Resident anonymous + shared memory of this process, bytes.
fn resident() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kb = |k: &str| -> u64 {
        s.lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    (kb("RssAnon:") + kb("RssShmem:")) * 1024
}

fn regbig(o: &RegOpts) -> Value {
    let size = o
        .size
        .unwrap_or(if o.quick { 256 * MIB } else { 4096 * MIB });
    let (nic, ptag) = setup();
    eprintln!("regbig: touching {} MiB", size / MIB);
    let mem = Memory::new(size).unwrap();
    touch(&mem);
    let before = resident();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut peak = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                peak = peak.max(resident());
                std::thread::sleep(Duration::from_millis(2));
            }
            peak.max(resident())
        })
    };
    let t = Instant::now();
    let r = Region::within(&nic, &mem, 0, size, ptag, false, false).unwrap();
    let took = t.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let peak = sampler.join().unwrap();
    let extra = peak.saturating_sub(before);
    r.deregister().unwrap();
    println!(
        "\nregistering {} MiB (all pages touched): {:.2} s, peak extra memory {:.1} MiB ({:.3} of the region)",
        size / MIB,
        took.as_secs_f64(),
        extra as f64 / MIB as f64,
        extra as f64 / size as f64
    );
    json!({"bytes": size, "seconds": took.as_secs_f64(), "peak_extra_bytes": extra})
}

// ------------------------------------------------------------------ regpp

/// Immediate data of a `regpp` message that switches the echo server to
/// registering around every message ([`MODE_FIXED`]: back to buffers
/// registered once).
const MODE_EACH: u32 = 1;
const MODE_FIXED: u32 = 2;

/// The echo server of `regpp` and `reuse`: with `each`, it registers its
/// receive buffer before posting it and its send buffer before sending,
/// and deregisters both after their completions; otherwise it uses buffers
/// registered once. A message with immediate data switches the mode
/// ([`MODE_EACH`], [`MODE_FIXED`]) from its answer on.
pub fn serve_regpp(disc: &str, max: usize, each: bool) {
    pin(1);
    let (nic, ptag) = setup();
    let ctl = Region::new(&nic, 8192, ptag, false, false).unwrap();
    let mem = Memory::new(2 * max + 8192).unwrap();
    let (roff, soff) = (0, max + 4096);
    let region =
        |off: usize, len: usize| Region::within(&nic, &mem, off, len, ptag, false, false).unwrap();
    // The buffers registered once, while the fixed way runs (registered
    // only then: with the cache off, a live registration of the same bytes
    // would spare the other way its page moves).
    let fixed_regions = || (region(roff, max), region(soff, max));
    let mut each = each;
    let mut fixed = (!each).then(fixed_regions);
    let mut a = ViAttributes::new(Reliability::ReliableDelivery, ptag);
    a.max_transfer_size = max.max(8) as u32;
    let vi = nic.create_vi(&a, None, None).unwrap();
    let post_recv = |vi: &Vi, fixed: Option<&(Region, Region)>| -> Option<Region> {
        let own = fixed.is_none().then(|| region(roff, max));
        let reg = own.as_ref().or(fixed.map(|f| &f.0)).unwrap();
        let d = DescBuilder::recv()
            .segment(reg, 0, max as u32)
            .write(&ctl, 0)
            .unwrap();
        vi.post_recv(&ctl, d).unwrap();
        own
    };
    let mut recv_reg = post_recv(&vi, fixed.as_ref());
    println!("READY");
    std::io::stdout().flush().unwrap();
    let req = nic
        .connect_wait(&nic.address(disc.as_bytes()), Some(Duration::from_secs(30)))
        .expect("wait");
    req.accept(&vi).expect("accept");
    loop {
        let st = done_or_wait(&vi, true, false);
        if st & via::descriptor::status::DESC_FLUSHED_ERROR != 0 {
            break;
        }
        let len = ctl.word(24);
        // The receive completed and the last send too: no descriptor
        // uses a buffer now.
        drop(recv_reg.take());
        if st & via::descriptor::status::IMMEDIATE != 0 {
            each = ctl.word(20) == MODE_EACH;
            fixed = None;
            if !each {
                fixed = Some(fixed_regions());
            }
        }
        recv_reg = post_recv(&vi, fixed.as_ref());
        let send_reg = each.then(|| region(soff, len.max(1) as usize));
        let d = DescBuilder::send()
            .segment(
                send_reg.as_ref().or(fixed.as_ref().map(|f| &f.1)).unwrap(),
                0,
                len,
            )
            .write(&ctl, 128)
            .unwrap();
        vi.post_send(&ctl, d).unwrap();
        done_or_wait(&vi, false, false);
        drop(send_reg);
    }
}

/// Blocks of rounds per `regpp` measurement, the two ways in turn.
const REGPP_BLOCKS: usize = 40;

/// Half round trips (us) of a ping-pong of `size` bytes with buffers
/// registered once and with both sides registering and deregistering
/// their buffers around every message, and the ratio. One pair of
/// processes runs both ways in alternating blocks of rounds (the first
/// round of a block, which switches the server, untimed): the host's speed
/// moves within seconds here, so each block of the second way is compared
/// with the block just before it, and the ratio is the median of those
/// comparisons.
fn regpp_one(size: usize, iters: usize) -> (f64, f64, f64) {
    pin(0);
    let disc = unique("regpp");
    let child = Child::start(&[
        "regpp".into(),
        disc.clone(),
        size.to_string(),
        "fixed".into(),
    ]);
    let (nic, ptag) = setup();
    let ctl = Region::new(&nic, 8192, ptag, false, false).unwrap();
    let mem = Memory::new(2 * size + 8192).unwrap();
    let (roff, soff) = (0, size + 4096);
    let mut a = ViAttributes::new(Reliability::ReliableDelivery, ptag);
    a.max_transfer_size = size.max(8) as u32;
    let vi = nic.create_vi(&a, None, None).unwrap();
    vi.connect(
        &nic.address(b"client"),
        &nic.address(disc.as_bytes()),
        Some(Duration::from_secs(30)),
    )
    .expect("connect");
    let regions = || {
        (
            Region::within(&nic, &mem, roff, size, ptag, false, false).unwrap(),
            Region::within(&nic, &mem, soff, size, ptag, false, false).unwrap(),
        )
    };
    // Registered for the blocks of the fixed way only (see `serve_regpp`;
    // the ways alternate, so one is dropped before the other registers).
    let mut fixed: Option<(Region, Region)>;
    let prof = std::env::var_os("VIA_BENCH_PROFILE").is_some();
    // Per way: register, post, wait, deregister (ns), rounds.
    let mut acc = [[0u128; 5]; 2];
    let mut round = |fixed: Option<&(Region, Region)>, switch: bool| {
        let each = fixed.is_none();
        let t0 = Instant::now();
        let own = each.then(regions);
        let (rreg, sreg) = own.as_ref().or(fixed).unwrap();
        let t1 = Instant::now();
        let rd = DescBuilder::recv()
            .segment(rreg, 0, size as u32)
            .write(&ctl, 0)
            .unwrap();
        vi.post_recv(&ctl, rd).unwrap();
        let mut sd = DescBuilder::send().segment(sreg, 0, size as u32);
        if switch {
            sd = sd.immediate(if each { MODE_EACH } else { MODE_FIXED });
        }
        vi.post_send(&ctl, sd.write(&ctl, 128).unwrap()).unwrap();
        let t2 = Instant::now();
        done_or_wait(&vi, true, false);
        done_or_wait(&vi, false, false);
        let t3 = Instant::now();
        drop(own);
        let t4 = Instant::now();
        if prof {
            let a = &mut acc[usize::from(each)];
            a[0] += (t1 - t0).as_nanos();
            a[1] += (t2 - t1).as_nanos();
            a[2] += (t3 - t2).as_nanos();
            a[3] += (t4 - t3).as_nanos();
            a[4] += 1;
        }
    };
    // Warm-up: both ways.
    for each in [false, true] {
        fixed = (!each).then(regions);
        round(fixed.as_ref(), true);
        for _ in 0..(iters / 10).max(5) {
            round(fixed.as_ref(), false);
        }
    }
    // Each way runs `iters` rounds in all.
    let per = (2 * iters / REGPP_BLOCKS).max(10);
    let mut halves = [Vec::new(), Vec::new()];
    for b in 0..REGPP_BLOCKS {
        let each = b % 2 == 1;
        fixed = (!each).then(regions);
        round(fixed.as_ref(), true);
        let t = Instant::now();
        for _ in 0..per {
            round(fixed.as_ref(), false);
        }
        halves[usize::from(each)].push(t.elapsed().as_secs_f64() * 1e6 / per as f64 / 2.0);
    }
    if prof {
        for (each, a) in acc.iter().enumerate() {
            let n = a[4].max(1);
            eprintln!(
                "regpp {size} {}: register {} ns, post {} ns, wait {} ns, deregister {} ns per round",
                if each == 1 { "each" } else { "fixed" },
                a[0] / n,
                a[1] / n,
                a[2] / n,
                a[3] / n
            );
        }
        eprintln!("{:?}", nic.registration_stats());
    }
    vi.disconnect().expect("disconnect");
    child.finish();
    let ratios: Vec<f64> = halves[1]
        .iter()
        .zip(&halves[0])
        .map(|(e, f)| e / f)
        .collect();
    (median(&halves[0]), median(&halves[1]), median(&ratios))
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn regpp_inner(o: &RegOpts) {
    let mut rows = Vec::new();
    for size in [64 * KIB, MIB] {
        // Rounds of each way.
        let iters = if size <= 64 * KIB { 3000 } else { 500 } / if o.quick { 10 } else { 1 };
        let (fixed, each, ratio) = regpp_one(size, iters);
        rows.push(json!({"bytes": size, "fixed_us": fixed, "each_us": each, "ratio": ratio}));
    }
    println!("{}", json!({ "rows": rows }));
}

fn regpp(o: &RegOpts) -> Value {
    let q: &[&str] = if o.quick { &["--quick"] } else { &[] };
    let on = variant("regpp", q, &[("VIA_REGCACHE", "on")]);
    let off = variant("regpp", q, &[("VIA_REGCACHE", "off")]);
    println!(
        "\nping-pong registering around every message vs buffers registered once, half round trip, us"
    );
    println!(
        "{:>8} {:>10} {:>12} {:>12} {:>10}   (goal: ratio <= 1.25 with the cache)",
        "size", "cache", "fixed", "each msg", "ratio"
    );
    for (label, v) in [("on", &on), ("off", &off)] {
        for r in v["rows"].as_array().unwrap() {
            println!(
                "{:>8} {:>10} {:>12.2} {:>12.2} {:>10.2}",
                fmt_size(r["bytes"].as_u64().unwrap() as usize),
                label,
                r["fixed_us"].as_f64().unwrap(),
                r["each_us"].as_f64().unwrap(),
                r["ratio"].as_f64().unwrap()
            );
        }
    }
    json!({"cache_on": on, "cache_off": off})
}

// ------------------------------------------------------------------ reuse

/// The thesis's buffer-reuse ping-pong (its benchmark AT with registration
/// around each message): message `i` goes out of buffer `b(i)`, registered
/// for it; with probability `reuse` %, `b(i)` is one of 4 buffers used
/// recently, else one never used before.
fn reuse_inner(o: &RegOpts) {
    let size = 16 * KIB;
    let iters = if o.quick { 300 } else { 2000 };
    let mut rows = Vec::new();
    for reuse in [0u64, 25, 50, 75, 100] {
        pin(0);
        let disc = unique("reuse");
        let child = Child::start(&[
            "regpp".into(),
            disc.clone(),
            size.to_string(),
            "fixed".into(),
        ]);
        let (nic, ptag) = setup();
        let ctl = Region::new(&nic, 8192, ptag, false, false).unwrap();
        let rbuf = Region::new(&nic, size, ptag, false, false).unwrap();
        // One fresh buffer per message at most, 4 KiB apart (no two share pages).
        let stride = size + 4 * KIB;
        let pool = Memory::new((iters + 8) * stride).unwrap();
        touch(&pool);
        let mut a = ViAttributes::new(Reliability::ReliableDelivery, ptag);
        a.max_transfer_size = size as u32;
        let vi = nic.create_vi(&a, None, None).unwrap();
        vi.connect(
            &nic.address(b"client"),
            &nic.address(disc.as_bytes()),
            Some(Duration::from_secs(30)),
        )
        .expect("connect");
        let rd = DescBuilder::recv()
            .segment(&rbuf, 0, size as u32)
            .write(&ctl, 0)
            .unwrap();
        let (r0, t0) = (nic.registration_stats(), nic.translation_stats().unwrap());
        let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ reuse;
        let mut fresh = 4usize;
        let t = Instant::now();
        for i in 0..iters {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let b = if i < 4 || rng % 100 < reuse {
                (rng >> 8) as usize % 4
            } else {
                fresh += 1;
                fresh
            };
            let sreg = Region::within(&nic, &pool, b * stride, size, ptag, false, false).unwrap();
            vi.post_recv(&ctl, rd).unwrap();
            let sd = DescBuilder::send()
                .segment(&sreg, 0, size as u32)
                .write(&ctl, 128)
                .unwrap();
            vi.post_send(&ctl, sd).unwrap();
            done_or_wait(&vi, true, false);
            done_or_wait(&vi, false, false);
            sreg.deregister().unwrap();
        }
        let half = t.elapsed().as_secs_f64() * 1e6 / iters as f64 / 2.0;
        let (r1, t1) = (nic.registration_stats(), nic.translation_stats().unwrap());
        vi.disconnect().expect("disconnect");
        child.finish();
        let hits = r1.cache.hits - r0.cache.hits;
        let misses = r1.cache.misses - r0.cache.misses;
        let th = t1.send.hits - t0.send.hits;
        let tm = (t1.send.compulsory + t1.send.other) - (t0.send.compulsory + t0.send.other);
        rows.push(json!({
            "reuse_pct": reuse, "half_rtt_us": half,
            "regcache_hit_rate": hits as f64 / (hits + misses).max(1) as f64,
            "tcache_send_hit_rate": th as f64 / (th + tm).max(1) as f64,
        }));
    }
    println!("{}", json!({ "rows": rows }));
}

fn reuse(o: &RegOpts) -> Value {
    let q: &[&str] = if o.quick { &["--quick"] } else { &[] };
    let on = variant("reuse", q, &[("VIA_REGCACHE", "on")]);
    let off = variant("reuse", q, &[("VIA_REGCACHE", "off")]);
    println!("\nbuffer-reuse ping-pong (16 KiB, send buffer registered around each message)");
    println!(
        "{:>7} {:>10} {:>12} {:>14} {:>14}",
        "reuse", "cache", "half RTT us", "regcache hits", "tcache hits"
    );
    for (label, v) in [("on", &on), ("off", &off)] {
        for r in v["rows"].as_array().unwrap() {
            println!(
                "{:>6}% {:>10} {:>12.2} {:>13.0}% {:>13.0}%",
                r["reuse_pct"].as_u64().unwrap(),
                label,
                r["half_rtt_us"].as_f64().unwrap(),
                r["regcache_hit_rate"].as_f64().unwrap() * 100.0,
                r["tcache_send_hit_rate"].as_f64().unwrap() * 100.0
            );
        }
    }
    json!({"cache_on": on, "cache_off": off})
}

/// `via-bench <regpp|regcost|regscale|reuse|regbig|reg> [--quick] [--json FILE]`.
pub fn main(cmd: &str, o: RegOpts) {
    if o.inner {
        match cmd {
            "regcost" => regcost_inner(&o),
            "regscale" => regscale_inner(&o),
            "regpp" => regpp_inner(&o),
            "reuse" => reuse_inner(&o),
            _ => unreachable!("unknown registration benchmark {cmd}"),
        }
        return;
    }
    let v = match cmd {
        "regpp" => json!({ "regpp": regpp(&o) }),
        "regcost" => json!({ "regcost": regcost(&o) }),
        "regscale" => json!({ "regscale": regscale(&o) }),
        "reuse" => json!({ "reuse": reuse(&o) }),
        "regbig" => json!({ "regbig": regbig(&o) }),
        "reg" => json!({
            "regpp": regpp(&o),
            "regcost": regcost(&o),
            "regscale": regscale(&o),
            "reuse": reuse(&o),
            "regbig": regbig(&o),
        }),
        _ => unreachable!("unknown registration benchmark {cmd}"),
    };
    write_json(o.json.as_deref().unwrap_or("via-bench-reg.json"), v);
}
