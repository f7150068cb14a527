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

/// The verbs device the tests run on, or `None` (printing why).
fn device() -> Option<String> {
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
    if device().is_none() {
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
    if std::env::var_os("VIA_BENCH_CHILD").is_none() || device().is_none() {
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
    let mut a = ViAttributes::new(Reliability::ReliableDelivery, ptag);
    a.enable_rdma_write = true;
    let mut senders = Vec::new();
    let mut receivers = Vec::new();
    for i in 0..n_max {
        let s = nic.create_vi(&a, None, None).unwrap();
        let r = nic.create_vi(&a, None, None).unwrap();
        let (x, y) = (
            nic.address(&disc(&format!("db-s{i}"))),
            nic.address(&disc(&format!("db-r{i}"))),
        );
        s.connect_peer(&x, &y, WAIT).unwrap();
        r.connect_peer(&y, &x, WAIT).unwrap();
        s.connect_peer_wait().unwrap();
        r.connect_peer_wait().unwrap();
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
