//! `sys-costs`: this machine's analogue of the thesis's table of basic
//! operation costs (Table 2.1): the cache-line transfer between cores
//! (the analogue of a PIO word to the NIC), a system call (the user/kernel
//! crossing), futex and eventfd wake-ups (interrupt latency), and the
//! start-up of a cross-process copy (DMA start-up).

use std::io::{BufRead, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::out::{Row, stats};
use crate::suite::Ctx;

/// Runs `f` for about `budget` (at least 100 times, in batches); returns
/// per-call microseconds of the batches.
fn bench(budget: Duration, batch: u64, mut f: impl FnMut()) -> (f64, Vec<f64>) {
    // A warm-up batch, not counted.
    for _ in 0..batch {
        f();
    }
    let t0 = Instant::now();
    let mut samples = Vec::new();
    let mut total = Duration::ZERO;
    let mut n = 0u64;
    while t0.elapsed() < budget || samples.len() < 20 {
        let t = Instant::now();
        for _ in 0..batch {
            f();
        }
        let d = t.elapsed();
        total += d;
        n += batch;
        samples.push(d.as_secs_f64() * 1e6 / batch as f64);
        if samples.len() > 200_000 {
            break;
        }
    }
    (total.as_secs_f64() * 1e6 / n as f64, samples)
}

fn row(name: &str, note: &str, mean: f64, mut s: Vec<f64>) -> Row {
    let n = s.len() as u64;
    let (mean, min, med, p99) = stats(mean, &mut s);
    Row {
        iters: n,
        mean_us: Some(mean),
        min_us: Some(min),
        median_us: Some(med),
        p99_us: Some(p99),
        note: note.into(),
        ..Row::new("sys-costs", name)
    }
}

/// Ping-pong between two pinned threads; `half` gives the one-way cost.
fn two_threads(
    ctx: &Ctx,
    budget: Duration,
    ping: impl Fn(u64) + Send + Sync,
    wait_pong: impl Fn(u64) + Send + Sync,
    serve: impl Fn(&dyn Fn() -> bool) + Send + Sync,
) -> (f64, Vec<f64>) {
    let (a, b) = ctx.cpus();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|sc| {
        let h = sc.spawn(|| {
            crate::xfer::pin(b);
            serve(&|| stop.load(Ordering::Acquire));
        });
        crate::xfer::pin(a);
        let mut i = 0u64;
        let r = bench(budget, 64, || {
            i += 1;
            ping(i);
            wait_pong(i);
        });
        stop.store(true, Ordering::Release);
        ping(u64::MAX);
        h.join().unwrap();
        (r.0 / 2.0, r.1.into_iter().map(|x| x / 2.0).collect())
    })
}

pub fn sys_costs(ctx: &mut Ctx) {
    let budget = Duration::from_millis(ctx.budget_ms().max(20));
    ctx.progress.grow(8);
    // Cache line between cores.
    let line = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
    let (m, s) = two_threads(
        ctx,
        budget,
        |i| line[0].store(i, Ordering::Release),
        |i| {
            while line[1].load(Ordering::Acquire) != i {
                std::hint::spin_loop();
            }
        },
        |stop| {
            let mut last = 0;
            loop {
                let v = line[0].load(Ordering::Acquire);
                if v == u64::MAX {
                    break;
                }
                if v != last {
                    last = v;
                    line[1].store(v, Ordering::Release);
                } else if stop() {
                    break;
                }
                std::hint::spin_loop();
            }
        },
    );
    let line_us = crate::out::stats(m, &mut s.clone()).2;
    ctx.push(row(
        "cache-line transfer between cores (one way)",
        "analogue of a PIO word to the NIC; half of a flag ping-pong",
        m,
        s,
    ));
    ctx.progress.inc();
    // System calls.
    let (m, s) = bench(budget, 256, || {
        std::hint::black_box(via::sys::getuid());
    });
    ctx.push(row(
        "system call (getuid)",
        "analogue of the user-to-kernel crossing",
        m,
        s,
    ));
    let (m, s) = bench(budget, 256, std::thread::yield_now);
    ctx.push(row(
        "system call (sched_yield, nothing else runnable)",
        "",
        m,
        s,
    ));
    ctx.progress.inc();
    ctx.progress.inc();
    // Futex wake-up: park/unpark (futex on Linux) ping-pong.
    let flags = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
    let main = std::thread::current();
    let server: std::sync::OnceLock<std::thread::Thread> = std::sync::OnceLock::new();
    let (m, s) = two_threads(
        ctx,
        budget / 2,
        |i| {
            flags[0].store(i, Ordering::Release);
            // The server publishes its handle first thing; until then it
            // looks again every 50 ms.
            if let Some(t) = server.get() {
                t.unpark();
            }
        },
        |i| {
            while flags[1].load(Ordering::Acquire) != i {
                std::thread::park();
            }
        },
        |stop| {
            let _ = server.set(std::thread::current());
            let mut last = 0;
            loop {
                let v = flags[0].load(Ordering::Acquire);
                if v == u64::MAX || (v == last && stop()) {
                    break;
                }
                if v != last {
                    last = v;
                    flags[1].store(v, Ordering::Release);
                    main.unpark();
                } else {
                    std::thread::park_timeout(Duration::from_millis(50));
                }
            }
        },
    );
    ctx.push(row(
        "futex wake-up (thread park/unpark, one way)",
        "analogue of interrupt latency: a sleeping thread woken",
        m,
        s,
    ));
    ctx.progress.inc();
    // eventfd wake-up.
    match eventfd_pingpong(ctx, budget / 2) {
        Ok((m, s)) => ctx.push(row(
            "eventfd wake-up (blocking read, one way)",
            "analogue of interrupt latency",
            m,
            s,
        )),
        Err(e) => ctx.push(Row::absent(
            "sys-costs",
            "eventfd wake-up",
            crate::out::ERROR,
            &e,
        )),
    }
    ctx.progress.inc();
    // Copies.
    // Page-aligned, as VIA's buffers (see `memcpy_mbps`).
    let src_v = vec![7u8; 68 * 1024];
    let mut dst_v = vec![0u8; 68 * 1024];
    let so = src_v.as_ptr().align_offset(4096);
    let doff = dst_v.as_ptr().align_offset(4096);
    let src = &src_v[so..so + 64 * 1024];
    let dst = &mut dst_v[doff..doff + 64 * 1024];
    for n in [8usize, 4096] {
        let (m, s) = bench(budget / 4, 1024, || {
            dst[..n].copy_from_slice(std::hint::black_box(&src[..n]));
            std::hint::black_box(&mut *dst);
        });
        ctx.push(row(
            &format!("memcpy {n} B (same process)"),
            "the soft NIC's copy between mappings",
            m,
            s,
        ));
    }
    ctx.progress.inc();
    let mut cma8 = None;
    match Sink::start() {
        Ok(sink) => {
            for n in [8usize, 4096, 65536] {
                let (m, s) = bench(budget / 4, 64, || {
                    via::sys::process_vm_write(sink.pid, &src[..n], sink.addr)
                        .expect("process_vm_writev");
                });
                if n == 8 {
                    cma8 = Some(crate::out::stats(m, &mut s.clone()).2);
                }
                ctx.push(row(
                    &format!("cross-process copy {n} B (process_vm_writev)"),
                    "analogue of DMA start-up (8 B: the start-up alone)",
                    m,
                    s,
                ));
            }
            sink.finish();
        }
        Err(e) => ctx.push(Row::absent(
            "sys-costs",
            "cross-process copy",
            crate::out::ERROR,
            &e,
        )),
    }
    ctx.progress.inc();
    if let Some(c) = cma8 {
        let words = c / (line_us / 8.0);
        ctx.push(
            Row::new("sys-costs", "derived: copy start-up / (cache-line transfer / 8 words), medians")
                .value(words, "words")
                .note("the thesis's PIO-vs-DMA crossover (5 words SP-NT, 10 Myrinet), computed the same way from this machine's costs"),
        );
        ctx.summary.insert(
            "sys-costs".into(),
            serde_json::json!({"pio_dma_crossover_words": words}),
        );
    }
    ctx.progress.inc();
}

fn eventfd_pingpong(ctx: &Ctx, budget: Duration) -> Result<(f64, Vec<f64>), String> {
    use rustix::event::{EventfdFlags, eventfd};
    let a = eventfd(0, EventfdFlags::empty()).map_err(|e| e.to_string())?;
    let b = eventfd(0, EventfdFlags::empty()).map_err(|e| e.to_string())?;
    let read = |fd: &std::os::fd::OwnedFd| {
        let mut x = [0u8; 8];
        rustix::io::read(fd, &mut x).expect("eventfd read");
    };
    let write = |fd: &std::os::fd::OwnedFd| {
        rustix::io::write(fd, &1u64.to_ne_bytes()).expect("eventfd write");
    };
    Ok(two_threads(
        ctx,
        budget,
        |_| write(&a),
        |_| read(&b),
        |stop| loop {
            read(&a);
            if stop() {
                break;
            }
            write(&b);
        },
    ))
}

/// A child process holding a buffer that cross-process copies write into.
struct Sink {
    child: std::process::Child,
    pid: i32,
    addr: u64,
}

impl Sink {
    fn start() -> Result<Sink, String> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut child = Command::new(exe)
            .arg("__sink")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| e.to_string())?;
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).map_err(|e| e.to_string())?;
        let addr =
            u64::from_str_radix(line.trim(), 16).map_err(|e| format!("sink said {line:?}: {e}"))?;
        let pid = child.id() as i32;
        Ok(Sink { child, pid, addr })
    }

    fn finish(mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

/// `via-bench __sink`: prints the address of a 64 KiB buffer, then waits
/// for the end of its standard input.
pub fn sink() {
    let buf = vec![0u8; 64 * 1024];
    println!("{:x}", buf.as_ptr() as u64);
    std::io::stdout().flush().unwrap();
    let mut s = String::new();
    while std::io::stdin()
        .read_line(&mut s)
        .map(|n| n > 0)
        .unwrap_or(false)
    {}
    std::hint::black_box(&buf);
}
