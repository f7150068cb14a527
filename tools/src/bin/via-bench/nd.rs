//! Non-data-transfer benchmarks that need no peer (VIBe N1, N3, N4): VI
//! create/destroy, memory register/deregister, CQ create/destroy. Each
//! reports the first operation in the main fields and the second in
//! `extra.second`. (Connection set-up, N2, runs against a server: see
//! `xfer`.)

use std::time::{Duration, Instant};

use serde_json::json;
use via::{Memory, Region, Reliability, ViAttributes};

use crate::out::{Measure, stats};
use crate::xfer::{Mode, Spec, open_nic};

fn summary(mut v: Vec<f64>) -> (f64, f64, f64, f64) {
    let mean = v.iter().sum::<f64>() / v.len().max(1) as f64;
    stats(mean, &mut v)
}

fn measure(
    first: Vec<f64>,
    second: Vec<f64>,
    wall: Duration,
    cpu: Duration,
    extra: serde_json::Value,
) -> Measure {
    let n = first.len() as u64;
    let (m, mi, me, p) = summary(first);
    let (m2, mi2, me2, p2) = summary(second);
    let mut extra = extra;
    extra["second"] = json!({"mean_us": m2, "min_us": mi2, "median_us": me2, "p99_us": p2});
    Measure {
        iters: n,
        mean_us: Some(m),
        min_us: Some(mi),
        median_us: Some(me),
        p99_us: Some(p),
        mbps: None,
        cpu_pct: Some(cpu.as_secs_f64() / wall.as_secs_f64().max(1e-9) * 100.0),
        rate: None,
        extra,
    }
}

fn us(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e6
}

/// How many operations fit the budget, given the cost of one.
fn count(spec: &Spec, one: Duration, cap: usize) -> usize {
    if let Some(n) = spec.iters {
        return (n as usize).clamp(1, cap);
    }
    let b = Duration::from_millis(spec.budget_ms.max(1));
    ((b.as_secs_f64() / one.as_secs_f64().max(1e-7)) as usize).clamp(3, cap)
}

pub fn run_local(spec: &Spec) -> Measure {
    let nic = open_nic(&spec.device).unwrap_or_else(|e| panic!("{e}"));
    let ptag = nic.create_ptag().expect("ptag");
    let cpu0 = via::sys::rusage_cpu();
    let t0 = Instant::now();
    let (a, b, extra) = match spec.mode {
        Mode::ViCreate => {
            let attrs = ViAttributes::new(Reliability::ReliableDelivery, ptag);
            let t = Instant::now();
            nic.create_vi(&attrs, None, None)
                .unwrap()
                .destroy()
                .unwrap();
            // Batches of up to 512 live VIs (1,024 per NIC).
            let n = count(spec, t.elapsed() * 2, 4096);
            let (mut c, mut d) = (Vec::new(), Vec::new());
            while c.len() < n {
                let batch = (n - c.len()).min(512);
                let mut vis = Vec::with_capacity(batch);
                for _ in 0..batch {
                    let t = Instant::now();
                    vis.push(nic.create_vi(&attrs, None, None).expect("create VI"));
                    c.push(us(t));
                }
                for vi in vis {
                    let t = Instant::now();
                    vi.destroy().expect("destroy VI");
                    d.push(us(t));
                }
            }
            (c, d, json!({"first": "create", "second": "destroy"}))
        }
        Mode::CqCreate => {
            let entries = spec.size.max(1) as u32;
            let t = Instant::now();
            nic.create_cq(entries).unwrap().destroy().unwrap();
            let n = count(spec, t.elapsed(), 2000);
            let (mut c, mut d) = (Vec::new(), Vec::new());
            for _ in 0..n {
                let t = Instant::now();
                let cq = nic.create_cq(entries).expect("create CQ");
                c.push(us(t));
                let t = Instant::now();
                cq.destroy().expect("destroy CQ");
                d.push(us(t));
            }
            (
                c,
                d,
                json!({"first": "create", "second": "destroy", "entries": entries}),
            )
        }
        Mode::Mem { cached: _ } => {
            let size = spec.size.max(1);
            let mem = Memory::new(size).expect("memory");
            for off in (0..mem.len()).step_by(4096) {
                mem.write(off, &[1]).unwrap();
            }
            let t = Instant::now();
            Region::within(&nic, &mem, 0, size, ptag, false, false)
                .unwrap()
                .deregister()
                .unwrap();
            let one = t.elapsed();
            let n = count(spec, one, 1000);
            let (mut r, mut d) = (Vec::new(), Vec::new());
            // Without the cache (VIA_REGCACHE=off) each registration
            // moves the pages again; with it, the same buffer is found
            // cached (a hit).
            for _ in 0..n {
                let t = Instant::now();
                let reg =
                    Region::within(&nic, &mem, 0, size, ptag, false, false).expect("register");
                r.push(us(t));
                let t = Instant::now();
                reg.deregister().expect("deregister");
                d.push(us(t));
            }
            let s = nic.registration_stats();
            (
                r,
                d,
                json!({"first": "register", "second": "deregister",
                       "cache_hits": s.cache.hits, "cache_misses": s.cache.misses,
                       "first_time_us": one.as_secs_f64() * 1e6}),
            )
        }
        _ => unreachable!(),
    };
    let wall = t0.elapsed();
    let cpu = via::sys::rusage_cpu() - cpu0;
    measure(a, b, wall, cpu, extra)
}
