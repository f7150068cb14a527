//! Measurements of the verbs kind on a real device (Soft-RoCE `rxe0` in the
//! VM of `tools/verbs-vm.sh verbs_bench`): printed, not asserted, except
//! that every operation completes successfully.
//!
//! * `doorbell_posts_per_second`: posts per second of 8-byte RDMA writes
//!   over 1..64 active VIs (each its own RC QP), with direct posting per
//!   VI (`VIA_DOORBELL=per-vi`) and through the central send queue
//!   (`VIA_DOORBELL=central`), each mode in a child process of the same
//!   run; a table and a JSON line.
//!
//! Under QEMU TCG absolute times mean nothing; the ratios within one run
//! are the figures.
#![cfg(feature = "verbs")]

use std::time::{Duration, Instant};

use via::descriptor::status::ERROR_MASK;
use via::{DescBuilder, Error, Reliability, ViAttributes};
use via_tests::*;

const COUNTS: [usize; 7] = [1, 2, 4, 8, 16, 32, 64];
/// Sends outstanding per VI (a streaming application's window).
const WINDOW: usize = 16;
/// Posts per measurement.
const POSTS: usize = 4096;

/// One measurement of a child: `DOORBELL-BENCH <mode> <vis> <posts> <secs>
/// <mean ns in post_send> <wrs> <chains>`.
fn parse(out: &str) -> Vec<(String, usize, f64, f64, u64, u64)> {
    out.lines()
        .filter_map(|l| l.split_once("DOORBELL-BENCH ").map(|x| x.1))
        .map(|l| {
            let v: Vec<&str> = l.split_whitespace().collect();
            let posts: f64 = v[2].parse().unwrap();
            let secs: f64 = v[3].parse().unwrap();
            (
                v[0].to_string(),
                v[1].parse().unwrap(),
                posts / secs,
                v[4].parse().unwrap(),
                v[5].parse().unwrap(),
                v[6].parse().unwrap(),
            )
        })
        .collect()
}

#[test]
fn doorbell_posts_per_second() {
    if verbs_device().is_none() {
        return;
    }
    let limit = Duration::from_secs(900);
    let direct = run_child_test(
        "doorbell_bench_child",
        &[("VIA_DOORBELL", "per-vi"), ("VIA_BENCH_CHILD", "1")],
        limit,
    );
    let central = run_child_test(
        "doorbell_bench_child",
        &[("VIA_DOORBELL", "central"), ("VIA_BENCH_CHILD", "1")],
        limit,
    );
    let d = parse(&direct);
    let c = parse(&central);
    assert_eq!(d.len(), COUNTS.len(), "{direct}");
    assert_eq!(c.len(), COUNTS.len(), "{central}");
    println!(
        "DOORBELL posts per second, 8-byte RDMA writes, window {WINDOW} per VI, {POSTS} posts per row"
    );
    println!(
        "DOORBELL {:>4} {:>12} {:>12} {:>8} {:>14} {:>14} {:>10}",
        "VIs", "direct/s", "central/s", "ratio", "direct ns/post", "central ns/post", "chain len"
    );
    let mut json = Vec::new();
    for (x, y) in d.iter().zip(&c) {
        let chain = if y.5 > 0 {
            y.4 as f64 / y.5 as f64
        } else {
            0.0
        };
        println!(
            "DOORBELL {:>4} {:>12.0} {:>12.0} {:>8.2} {:>14.0} {:>14.0} {:>10.2}",
            x.1,
            x.2,
            y.2,
            y.2 / x.2,
            x.3,
            y.3,
            chain
        );
        json.push(format!(
            "{{\"vis\":{},\"direct_posts_per_s\":{:.1},\"central_posts_per_s\":{:.1},\"central_over_direct\":{:.3},\"direct_ns_in_post\":{:.0},\"central_ns_in_post\":{:.0},\"central_wrs_per_chain\":{:.2}}}",
            x.1,
            x.2,
            y.2,
            y.2 / x.2,
            x.3,
            y.3,
            chain
        ));
    }
    println!("DOORBELL-JSON [{}]", json.join(","));
}

/// The child of [`doorbell_posts_per_second`] (does nothing unless
/// `VIA_BENCH_CHILD` is set): 64 pairs of RC VIs connected peer to peer
/// inside this process, then for each count of active VIs a stream of
/// 8-byte RDMA writes, every descriptor signalled (VIA completes each).
#[test]
fn doorbell_bench_child() {
    if std::env::var_os("VIA_BENCH_CHILD").is_none() || verbs_device().is_none() {
        return;
    }
    let mode = std::env::var("VIA_DOORBELL").unwrap();
    let nic = open_nic();
    assert_eq!(nic.kind(), "verbs");
    let ptag = nic.create_ptag().unwrap();
    let n_max = *COUNTS.last().unwrap();
    let desc_bytes = n_max * WINDOW * 64;
    let mem = via::Region::new(&nic, desc_bytes + 65536, ptag, true, false).unwrap();
    let target = mem.addr(desc_bytes + 4096).unwrap();
    let mut senders = Vec::new();
    let mut receivers = Vec::new();
    for i in 0..n_max {
        let (s, r) = rc_pair(&nic, ptag, &format!("db{i}"));
        senders.push(s);
        receivers.push(r);
    }
    // WINDOW descriptors per VI, written once (posting clears the status).
    let descs: Vec<Vec<usize>> = (0..n_max)
        .map(|v| {
            (0..WINDOW)
                .map(|k| {
                    DescBuilder::rdma_write(target + 8 * v as u64, mem.handle())
                        .segment(&mem, desc_bytes + 8 * v, 8)
                        .write(&mem, (v * WINDOW + k) * 64)
                        .unwrap()
                })
                .collect()
        })
        .collect();
    for &n in &COUNTS {
        let before = via::verbs_central_counts();
        let mut out = vec![0usize; n];
        let mut next = vec![0usize; n];
        let (mut posted, mut done) = (0, 0);
        let mut in_post = Duration::ZERO;
        let t0 = Instant::now();
        let deadline = t0 + Duration::from_secs(120);
        while done < POSTS {
            for v in 0..n {
                while out[v] > 0 {
                    match senders[v].send_done() {
                        Ok(c) => {
                            assert_eq!(c.status & ERROR_MASK, 0, "VI {v}: {:#x}", c.status);
                            out[v] -= 1;
                            done += 1;
                        }
                        Err(e) if e == Error::NotDone => break,
                        Err(e) => panic!("VI {v}: {e}"),
                    }
                }
                while out[v] < WINDOW && posted < POSTS {
                    let d = descs[v][next[v]];
                    next[v] = (next[v] + 1) % WINDOW;
                    let t = Instant::now();
                    senders[v].post_send(&mem, d).unwrap();
                    in_post += t.elapsed();
                    out[v] += 1;
                    posted += 1;
                }
            }
            assert!(
                Instant::now() < deadline,
                "{mode}, {n} VIs: {done} of {POSTS} completed in 120 s"
            );
        }
        let secs = t0.elapsed().as_secs_f64();
        let after = via::verbs_central_counts();
        println!(
            "DOORBELL-BENCH {mode} {n} {POSTS} {secs:.6} {:.0} {} {}",
            in_post.as_nanos() as f64 / POSTS as f64,
            after.0 - before.0,
            after.1 - before.1
        );
    }
    for (s, r) in senders.iter().zip(&receivers) {
        s.disconnect().unwrap();
        let _ = r.disconnect();
    }
    nic.close().unwrap();
}

/// Sizes of the post-cost table (`VIA_BENCH_SIZES=8,65536` to choose).
fn sizes() -> Vec<u32> {
    match std::env::var("VIA_BENCH_SIZES") {
        Ok(s) => s.split(',').map(|x| x.trim().parse().unwrap()).collect(),
        Err(_) => vec![8, 512, 4096, 65536],
    }
}

fn iters() -> u32 {
    std::env::var("VIA_BENCH_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024)
}

/// Two VIs of this process connected peer to peer (RC, RDMA write on).
fn rc_pair(nic: &via::Nic, ptag: via::Ptag, tag: &str) -> (via::Vi, via::Vi) {
    let mut a = ViAttributes::new(Reliability::ReliableDelivery, ptag);
    a.enable_rdma_write = true;
    local_pair(nic, &a, tag, |_| {})
}

fn wait_ok(vi: &via::Vi, send: bool) {
    let c = if send {
        vi.send_wait(WAIT)
    } else {
        vi.recv_wait(WAIT)
    }
    .unwrap();
    assert_eq!(c.status & ERROR_MASK, 0, "{:#x}", c.status);
}

/// The host-side cost of `Vi::post_send` (an RDMA write) and
/// `Vi::post_recv` against bare `ibv_post_send` / `ibv_post_recv` on the
/// same device in the same run, 8 B..64 KiB: batches of 32 timed posts,
/// completions taken untimed. Twice: taking completions by polling, as
/// the bare loop does (`poll`), and by blocking waits (`wait`), with
/// which the progress thread sleeps with the CQ armed, so that a
/// completion rxe makes inside the post's system call also wakes it.
/// Under callgrind (`tools/verbs-vm.sh callgrind`) the same code gives
/// the instructions per post.
#[test]
fn post_cost_by_size() {
    let Some(dev) = verbs_device() else { return };
    const B: usize = 32;
    let n = iters();
    let nic = open_nic();
    let ptag = nic.create_ptag().unwrap();
    // Descriptors (2 x 32 x 64 B), then a 64 KiB source, then 32 receive
    // buffers of up to 64 KiB... the receive buffers share one 64 KiB area
    // (their contents do not matter), then the RDMA target.
    let (descs, src, dst, target) = (0usize, 8192usize, 8192 + 65536, 8192 + 2 * 65536);
    let mem = via::Region::new(&nic, target + 65536, ptag, true, false).unwrap();
    let (s, r) = rc_pair(&nic, ptag, "pc");
    let mut rows = Vec::new();
    for size in sizes() {
        // Two baselines: completions taken by polling, and by a thread
        // sleeping on a completion channel (the wait mode's like for like:
        // on rxe the post that completes a request wakes that thread).
        let bare_send = via::bare_ibv_post_cost(&dev, n, size, false, false).unwrap();
        let bare_recv = via::bare_ibv_post_cost(&dev, n, size, true, false).unwrap();
        let events_send = via::bare_ibv_post_cost(&dev, n, size, false, true).unwrap();
        let events_recv = via::bare_ibv_post_cost(&dev, n, size, true, true).unwrap();
        let writes: Vec<usize> = (0..B)
            .map(|i| {
                DescBuilder::rdma_write(mem.addr(target).unwrap(), mem.handle())
                    .segment(&mem, src, size)
                    .write(&mem, descs + 64 * i)
                    .unwrap()
            })
            .collect();
        let recvs: Vec<usize> = (0..B)
            .map(|i| {
                DescBuilder::recv()
                    .segment(&mem, dst, size)
                    .write(&mem, descs + 64 * (B + i))
                    .unwrap()
            })
            .collect();
        let sends: Vec<usize> = (0..B)
            .map(|i| {
                DescBuilder::send()
                    .segment(&mem, src, 8)
                    .write(&mem, descs + 64 * (2 * B + i))
                    .unwrap()
            })
            .collect();
        for polling in [true, false] {
            let take = |vi: &via::Vi, send: bool| {
                if polling {
                    let c = match send {
                        true => poll(|| vi.send_done()),
                        false => poll(|| vi.recv_done()),
                    };
                    assert_eq!(c.status & ERROR_MASK, 0, "{:#x}", c.status);
                } else {
                    wait_ok(vi, send);
                }
            };
            let (mut t_send, mut t_recv) = (Duration::ZERO, Duration::ZERO);
            // The writes, then the receives, each in a loop of its own, as
            // the bare loops run them. Timed receives that each followed a
            // batch of 32 writes of 64 KiB took twice the time of 8-byte
            // ones, with the same instructions (1,857 against 905 ns in
            // one VM run; apart, 1,154 against 872 ns).
            for _ in 0..(n as usize).div_ceil(B) {
                for &d in &writes {
                    let t = Instant::now();
                    s.post_send(&mem, d).unwrap();
                    t_send += t.elapsed();
                }
                for _ in 0..B {
                    take(&s, true);
                }
            }
            for _ in 0..(n as usize).div_ceil(B) {
                for &d in &recvs {
                    let t = Instant::now();
                    r.post_recv(&mem, d).unwrap();
                    t_recv += t.elapsed();
                }
                for &d in &sends {
                    s.post_send(&mem, d).unwrap();
                }
                for _ in 0..B {
                    take(&s, true);
                    take(&r, false);
                }
            }
            let posts = ((n as usize).div_ceil(B) * B) as u32;
            let (vs, vr) = (t_send / posts, t_recv / posts);
            let mode = if polling { "poll" } else { "wait" };
            let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
            // With blocking waits, also against a bare post whose
            // completions a thread takes the same way (text, JSON).
            let (events, events_json) = if polling {
                (String::new(), String::new())
            } else {
                (
                    format!(
                        " (bare with a completion thread: post_send {} ns ratio {:.2}; post_recv {} ns ratio {:.2})",
                        events_send.as_nanos(),
                        ratio(vs, events_send),
                        events_recv.as_nanos(),
                        ratio(vr, events_recv)
                    ),
                    format!(
                        ",\"bare_events_post_send_ns\":{},\"bare_events_post_recv_ns\":{}",
                        events_send.as_nanos(),
                        events_recv.as_nanos()
                    ),
                )
            };
            println!(
                "POST-COST-SIZE {dev} {size} B {mode}: post_send via {} ns bare {} ns ratio {:.2}; post_recv via {} ns bare {} ns ratio {:.2}{events}",
                vs.as_nanos(),
                bare_send.as_nanos(),
                ratio(vs, bare_send),
                vr.as_nanos(),
                bare_recv.as_nanos(),
                ratio(vr, bare_recv)
            );
            rows.push(format!(
                "{{\"size\":{size},\"completions\":\"{mode}\",\"via_post_send_ns\":{},\"bare_post_send_ns\":{},\"via_post_recv_ns\":{},\"bare_post_recv_ns\":{}{events_json}}}",
                vs.as_nanos(),
                bare_send.as_nanos(),
                vr.as_nanos(),
                bare_recv.as_nanos()
            ));
        }
    }
    println!("POST-COST-JSON [{}]", rows.join(","));
    s.disconnect().unwrap();
    let _ = r.disconnect();
    nic.close().unwrap();
}

/// The time of a poll that finds nothing (`Vi::recv_done` with no receive
/// completed, as `VipRecvDone` in a polling loop) with 1 to 128 VIs open:
/// every 15 VIs take one more device CQ (`cqs.rs`), and a poll drains the
/// device inline (`Device::poll`).
#[test]
fn poll_miss_cost_by_vis() {
    let Some(dev) = verbs_device() else { return };
    const POLLS: u32 = 20_000;
    let nic = open_nic();
    let ptag = nic.create_ptag().unwrap();
    let at = ViAttributes::new(Reliability::ReliableDelivery, ptag);
    let mut vis = Vec::new();
    let mut rows = Vec::new();
    for n in [1usize, 16, 32, 64, 128] {
        while vis.len() < n {
            vis.push(nic.create_vi(&at, None, None).unwrap());
        }
        let v = &vis[0];
        for _ in 0..1000 {
            assert_eq!(v.recv_done().err(), Some(Error::NotDone));
        }
        let t = Instant::now();
        for _ in 0..POLLS {
            assert_eq!(v.recv_done().err(), Some(Error::NotDone));
        }
        let per = t.elapsed() / POLLS;
        println!(
            "POLL-MISS {dev} {n} VIs: {} ns per Vi::recv_done that finds nothing",
            per.as_nanos()
        );
        rows.push(format!("{{\"vis\":{n},\"ns\":{}}}", per.as_nanos()));
    }
    println!("POLL-MISS-JSON [{}]", rows.join(","));
    drop(vis);
    nic.close().unwrap();
}

const PP_WARMUP: u32 = 100;

fn pp_iters() -> u32 {
    std::env::var("VIA_BENCH_PP_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
}

/// Spawns this test binary running `test` with `env`, stdin and stdout
/// piped.
fn spawn_child(test: &str, env: &[(&str, &str)]) -> std::process::Child {
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", test, "--nocapture", "--test-threads=1"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().unwrap()
}

/// The next line of `r` that contains `tag`, after it.
fn line_after(r: &mut impl std::io::BufRead, tag: &str) -> String {
    let mut l = String::new();
    loop {
        l.clear();
        assert!(r.read_line(&mut l).unwrap() > 0, "child ended before {tag}");
        if let Some((_, x)) = l.split_once(tag) {
            return x.trim().to_string();
        }
    }
}

/// Half round trip of 8-byte messages between two processes on the
/// device: a raw verbs loop (`ibv_rc_pingpong`-style, busy polling)
/// against via's (`Vi::post_send` / `Vi::recv_done` polling, the path of
/// `VipPostSend` / `VipRecvDone`), in the same run.
#[test]
fn latency_via_against_raw_verbs() {
    use std::io::Write;
    let Some(dev) = verbs_device() else { return };
    let iters = pp_iters();
    // Raw verbs: endpoints through the child's stdin and stdout.
    let raw = via::RawPingPong::new(&dev).unwrap();
    let mut child = spawn_child("raw_pong_child", &[("VIA_BENCH_ROLE", "raw")]);
    writeln!(child.stdin.as_mut().unwrap(), "EP {}", hex(&raw.endpoint())).unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let theirs = unhex(&line_after(&mut out, "EP "));
    raw.connect(&theirs).unwrap();
    raw.run(PP_WARMUP, 8, true).unwrap();
    let t_raw = raw.run(iters, 8, true).unwrap();
    assert!(child.wait().unwrap().success());
    drop(raw);
    // via: a VI of each process, connected peer to peer.
    let pp = ViPingPong::new();
    let (ping, pong) = (disc_str("pp-ping"), disc_str("pp-pong"));
    let mut child = spawn_child(
        "via_pong_child",
        &[
            ("VIA_BENCH_ROLE", "via"),
            ("VIA_BENCH_PING", &ping),
            ("VIA_BENCH_PONG", &pong),
        ],
    );
    pp.connect(&ping, &pong);
    let run = |n: u32| {
        let t = Instant::now();
        for _ in 0..n {
            pp.post_send();
            pp.take(Which::Recv);
            pp.post_recv();
            pp.take(Which::Send);
        }
        t.elapsed()
    };
    run(PP_WARMUP);
    let t_via = run(iters);
    assert!(child.wait().unwrap().success());
    let half = |t: Duration| t.as_secs_f64() * 1e6 / (2.0 * iters as f64);
    let (r, v) = (half(t_raw), half(t_via));
    println!(
        "LATENCY {dev} 8 B half round trip ({iters} round trips, busy polling, two processes): raw verbs {r:.1} us, via {v:.1} us, ratio {:.2}",
        v / r
    );
    println!(
        "LATENCY-JSON {{\"device\":\"{dev}\",\"size\":8,\"iters\":{iters},\"raw_verbs_half_rtt_us\":{r:.2},\"via_half_rtt_us\":{v:.2},\"via_over_raw\":{:.3}}}",
        v / r
    );
    let _ = pp.vi.disconnect();
    pp.nic.close().unwrap();
}

/// One process's side of via's ping-pong: a VI, a receive posted, and
/// the descriptors of the loop (an 8-byte send, a 64-byte receive).
struct ViPingPong {
    nic: via::Nic,
    mem: via::Region,
    vi: via::Vi,
    recv: usize,
    send: usize,
}

impl ViPingPong {
    fn new() -> ViPingPong {
        let nic = open_nic();
        let ptag = nic.create_ptag().unwrap();
        let mem = via::Region::new(&nic, 16384, ptag, false, false).unwrap();
        let a = ViAttributes::new(Reliability::ReliableDelivery, ptag);
        let vi = nic.create_vi(&a, None, None).unwrap();
        let recv = DescBuilder::recv()
            .segment(&mem, 8192, 64)
            .write(&mem, 0)
            .unwrap();
        let send = DescBuilder::send()
            .segment(&mem, 4096, 8)
            .write(&mem, 128)
            .unwrap();
        vi.post_recv(&mem, recv).unwrap();
        ViPingPong {
            nic,
            mem,
            vi,
            recv,
            send,
        }
    }

    /// Connects to the peer at discriminator `remote` from `local`.
    fn connect(&self, local: &str, remote: &str) {
        let addr = |d: &str| self.nic.address(d.as_bytes());
        self.vi
            .connect_peer(&addr(local), &addr(remote), WAIT)
            .unwrap();
        self.vi.connect_peer_wait().unwrap();
    }

    fn post_send(&self) {
        self.vi.post_send(&self.mem, self.send).unwrap();
    }

    fn post_recv(&self) {
        self.vi.post_recv(&self.mem, self.recv).unwrap();
    }

    /// Polls for the next completion of queue `w`, which must succeed.
    fn take(&self, w: Which) {
        let c = match w {
            Which::Send => poll(|| self.vi.send_done()),
            Which::Recv => poll(|| self.vi.recv_done()),
        };
        assert_eq!(c.status & ERROR_MASK, 0, "{:#x}", c.status);
    }
}

/// A work queue of a VI.
#[derive(Clone, Copy)]
enum Which {
    Send,
    Recv,
}

/// Polls `f` until it gives a completion (panics after 30 s).
fn poll(mut f: impl FnMut() -> via::Result<via::Completion>) -> via::Completion {
    let mut spins = 0u32;
    let mut deadline = None;
    loop {
        match f() {
            Ok(c) => return c,
            Err(e) if e == Error::NotDone => {}
            Err(e) => panic!("{e}"),
        }
        spins += 1;
        if spins % 4096 == 0 {
            let d = *deadline.get_or_insert_with(|| Instant::now() + Duration::from_secs(30));
            assert!(Instant::now() < d, "no completion in 30 s");
        }
    }
}

/// The responder of the raw loop (only with `VIA_BENCH_ROLE=raw`).
#[test]
fn raw_pong_child() {
    if std::env::var("VIA_BENCH_ROLE").as_deref() != Ok("raw") {
        return;
    }
    let dev = verbs_device().unwrap();
    let raw = via::RawPingPong::new(&dev).unwrap();
    let mut stdin = std::io::stdin().lock();
    let theirs = unhex(&line_after(&mut stdin, "EP "));
    raw.connect(&theirs).unwrap();
    // Printed once connected: the first ping finds our receive.
    println!("EP {}", hex(&raw.endpoint()));
    raw.run(PP_WARMUP + pp_iters(), 8, false).unwrap();
}

/// The responder of via's loop (only with `VIA_BENCH_ROLE=via`).
#[test]
fn via_pong_child() {
    if std::env::var("VIA_BENCH_ROLE").as_deref() != Ok("via") {
        return;
    }
    let pp = ViPingPong::new();
    let ping = std::env::var("VIA_BENCH_PING").unwrap();
    let pong = std::env::var("VIA_BENCH_PONG").unwrap();
    pp.connect(&pong, &ping);
    for _ in 0..PP_WARMUP + pp_iters() {
        pp.take(Which::Recv);
        pp.post_recv();
        pp.post_send();
        pp.take(Which::Send);
    }
    // The initiator disconnects; wait for it rather than break its last
    // completion.
    let _ = pp.nic.close();
}
