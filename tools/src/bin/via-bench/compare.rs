//! `via-bench compare` (and `report`, its own-baselines part): our
//! ping-pong and streaming against baselines that do not use this project,
//! run in one invocation, interleaved (each repetition runs every
//! contender once), on the same cores.

use std::collections::BTreeMap;
use std::io::{BufRead, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::out::{NOT_INSTALLED, Row};
use crate::suite::Ctx;
use crate::xfer::{Mode, Spec};
use crate::{KIB, MIB};

/// (half round trip us, bandwidth MB/s) of one contender at one size.
type Res = (Option<f64>, Option<f64>);

/// Contender -> size -> (latencies, bandwidths) of the repetitions.
type Results = BTreeMap<String, BTreeMap<usize, (Vec<f64>, Vec<f64>)>>;

fn which(p: &str) -> Option<String> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(p))
        .find(|f| f.is_file())
        .map(|f| f.display().to_string())
}

fn iters(size: usize, quick: bool) -> u64 {
    let n = match size {
        0..=4096 => 100_000,
        4097..=65536 => 10_000,
        65537..=1048576 => 1_000,
        _ => 250,
    };
    if quick { (n / 20).max(20) } else { n }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(47_592)
}

fn taskset(cpu: Option<usize>, prog: &str) -> Command {
    match (cpu, which("taskset")) {
        (Some(c), Some(t)) => {
            let mut cmd = Command::new(t);
            cmd.args(["-c", &c.to_string(), prog]);
            cmd
        }
        _ => Command::new(prog),
    }
}

/// Runs a server/client pair of an external tool; the client is retried
/// while the server is not listening yet (at most 10 s).
fn pair(
    ctx: &Ctx,
    prog: &str,
    server: &[String],
    client: &[String],
    env: &[(&str, &str)],
) -> Result<String, String> {
    let (ccpu, scpu) = ctx.cpus();
    let mut s = taskset(scpu, prog);
    let mut srv = s
        .args(server)
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| e.to_string())?;
    let t0 = Instant::now();
    let out = loop {
        let o = taskset(ccpu, prog)
            .args(client)
            .envs(env.iter().copied())
            .output()
            .map_err(|e| e.to_string())?;
        if o.status.success() || t0.elapsed() > Duration::from_secs(10) {
            break o;
        }
        // The server is not listening yet: the tool has no readiness signal.
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = srv.kill();
    let _ = srv.wait();
    if !out.status.success() {
        return Err(format!(
            "{prog} failed: {}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn ucx(ctx: &Ctx, test: &str, size: usize) -> Result<Res, String> {
    let n = iters(size, ctx.c.quick).to_string();
    let port = free_port().to_string();
    let s = size.max(1).to_string();
    let args = ["-t", test, "-s", &s, "-n", &n, "-p", &port].map(String::from);
    let mut client = vec!["127.0.0.1".to_string()];
    client.extend(args.iter().cloned());
    let out = pair(ctx, "ucx_perftest", &args, &client, &[])?;
    let f: Vec<f64> = out
        .lines()
        .find(|l| l.starts_with("Final:"))
        .ok_or("no Final: line")?
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // iterations, latency 50%ile, average, overall (us), bandwidth
    // average, overall (MB/s of 2^20 bytes), message rates.
    if f.len() < 6 {
        return Err(format!("unexpected output: {out}"));
    }
    Ok(if test == "tag_lat" {
        (Some(f[3]), Some(size as f64 / f[3]))
    } else {
        (None, Some(f[5] * 1.048576))
    })
}

fn libfabric(ctx: &Ctx, prov: &str, size: usize) -> Result<Res, String> {
    let n = iters(size, ctx.c.quick).min(20_000).to_string();
    let port = free_port().to_string();
    let ep = if prov == "shm" { "rdm" } else { "msg" };
    let s = size.max(1).to_string();
    let args = ["-p", prov, "-e", ep, "-S", &s, "-I", &n, "-B", &port].map(String::from);
    let client = [
        "-p",
        prov,
        "-e",
        ep,
        "-S",
        &s,
        "-I",
        &n,
        "-P",
        &port,
        "127.0.0.1",
    ]
    .map(String::from);
    let out = pair(ctx, "fi_pingpong", &args, &client, &[])?;
    // bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec
    let line = out
        .lines()
        .find(|l| l.split_whitespace().nth(7).is_some() && !l.starts_with("bytes"))
        .ok_or_else(|| format!("unexpected output: {out}"))?;
    let f: Vec<&str> = line.split_whitespace().collect();
    let us: f64 = f[6].parse().map_err(|_| format!("bad line {line}"))?;
    Ok((Some(us), Some(size as f64 / us)))
}

/// The bandwidth floor's row: [`crate::shm_copy_pingpong`].
const COPY_FLOOR: &str = "bare copy ping-pong (one copy each way)";

const MPI_PINGPONG: &str = r#"
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
    int rank; MPI_Init(&argc, &argv); MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    long size = atol(argv[1]), n = atol(argv[2]);
    char *buf = malloc(size > 0 ? size : 1);
    for (int phase = 0; phase < 2; phase++) {
        long iters = phase ? n : n / 10 + 1;
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (long i = 0; i < iters; i++) {
            if (rank == 0) { MPI_Send(buf, size, MPI_BYTE, 1, 0, MPI_COMM_WORLD); MPI_Recv(buf, size, MPI_BYTE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE); }
            else { MPI_Recv(buf, size, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE); MPI_Send(buf, size, MPI_BYTE, 0, 0, MPI_COMM_WORLD); }
        }
        double t = MPI_Wtime() - t0;
        if (phase && rank == 0) printf("%ld %.6f\n", size, t * 1e6 / iters / 2);
    }
    free(buf); MPI_Finalize(); return 0;
}
"#;

fn mpi_build() -> Result<String, String> {
    let dir = std::env::temp_dir().join(format!("via-bench-mpi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let src = dir.join("pingpong.c");
    let exe = dir.join("pingpong");
    std::fs::write(&src, MPI_PINGPONG).map_err(|e| e.to_string())?;
    let o = Command::new("mpicc")
        .arg("-O2")
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output()
        .map_err(|e| e.to_string())?;
    if !o.status.success() {
        return Err(format!("mpicc: {}", String::from_utf8_lossy(&o.stderr)));
    }
    Ok(exe.display().to_string())
}

fn mpi(ctx: &Ctx, exe: &str, size: usize) -> Result<Res, String> {
    let (a, b) = ctx.cpus();
    let n = iters(size, ctx.c.quick).to_string();
    let mut cmd = Command::new("mpirun");
    cmd.args(["-np", "2", "--oversubscribe"]);
    if let (Some(a), Some(b)) = (a, b) {
        cmd.args(["--cpu-set", &format!("{a},{b}"), "--bind-to", "core"]);
    }
    let o = cmd
        .args([exe, &size.to_string(), &n])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| e.to_string())?;
    if !o.status.success() {
        return Err(format!(
            "mpirun: {}",
            String::from_utf8_lossy(&o.stderr)
                .lines()
                .last()
                .unwrap_or("")
        ));
    }
    let text = String::from_utf8_lossy(&o.stdout);
    let us: f64 = text
        .lines()
        .last()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|x| x.parse().ok())
        .ok_or_else(|| format!("unexpected output {text}"))?;
    Ok((Some(us), Some(size as f64 / us)))
}

// ------------------------------------------------------------------ TCP

/// `via-bench __tcp`: a TCP echo server on 127.0.0.1 or `bind` (prints
/// its port). Requests: mode (0 ping-pong, 1 stream), size, count, as u64s.
pub fn tcp_server(cpu: Option<usize>, bind: Option<&str>) {
    crate::xfer::pin(cpu);
    let l = TcpListener::bind(bind.unwrap_or("127.0.0.1:0")).expect("bind");
    println!("{}", l.local_addr().unwrap().port());
    std::io::stdout().flush().unwrap();
    let (mut s, _) = l.accept().expect("accept");
    s.set_nodelay(true).unwrap();
    let mut buf = vec![0u8; 4 * MIB];
    let mut h = [0u8; 24];
    while s.read_exact(&mut h).is_ok() {
        let word = |i: usize| u64::from_ne_bytes(h[i * 8..i * 8 + 8].try_into().unwrap()) as usize;
        let (mode, size, count) = (word(0), word(1), word(2));
        for _ in 0..count {
            s.read_exact(&mut buf[..size]).unwrap();
            if mode == 0 {
                s.write_all(&buf[..size]).unwrap();
            }
        }
        if mode == 1 {
            s.write_all(&[1]).unwrap();
        }
    }
}

/// `via-bench __tcp_client`: the plain TCP baseline against a remote
/// `__tcp --bind` server: prints `tcp pingpong <size> <half round trip us>`
/// and `tcp stream <size> <MB/s>` (medians of 5 runs) per size.
pub fn tcp_client(connect: &str, sizes: &str, time_ms: u64) {
    let mut s = TcpStream::connect(connect).expect("connect");
    s.set_nodelay(true).unwrap();
    let mut buf = vec![3u8; 4 * MIB];
    let mut run = |mode: u64, size: usize, count: u64| {
        let mut h = Vec::new();
        for w in [mode, size as u64, count] {
            h.extend_from_slice(&w.to_ne_bytes());
        }
        let t0 = Instant::now();
        s.write_all(&h).unwrap();
        for _ in 0..count {
            s.write_all(&buf[..size]).unwrap();
            if mode == 0 {
                s.read_exact(&mut buf[..size]).unwrap();
            }
        }
        if mode == 1 {
            s.read_exact(&mut buf[..1]).unwrap();
        }
        t0.elapsed()
    };
    for size in sizes.split(',') {
        let size = crate::parse_size(size).expect("size");
        for mode in [0u64, 1] {
            // Calibrate a count that takes about a fifth of the budget.
            let mut count = 4u64;
            while run(mode, size, count) < Duration::from_millis(time_ms / 25 + 1)
                && count < 1 << 24
            {
                count *= 2;
            }
            let mut v: Vec<f64> = (0..5)
                .map(|_| run(mode, size, count).as_secs_f64() / count as f64)
                .collect();
            v.sort_by(|a, b| a.total_cmp(b));
            let per = v[2];
            if mode == 0 {
                println!("tcp pingpong {size} {:.2}", per / 2.0 * 1e6);
            } else {
                println!("tcp stream {size} {:.1}", size as f64 / per / 1e6);
            }
        }
    }
}

struct Tcp {
    child: std::process::Child,
    s: TcpStream,
    buf: Vec<u8>,
}

impl Tcp {
    fn start(ctx: &Ctx) -> Result<Tcp, String> {
        let (ccpu, scpu) = ctx.cpus();
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut cmd = Command::new(exe);
        cmd.arg("__tcp");
        if let Some(c) = scpu {
            cmd.args(["--cpu", &c.to_string()]);
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| e.to_string())?;
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .map_err(|e| e.to_string())?;
        let port: u16 = line
            .trim()
            .parse()
            .map_err(|_| format!("tcp server said {line:?}"))?;
        crate::xfer::pin(ccpu);
        let s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
        s.set_nodelay(true).unwrap();
        Ok(Tcp {
            child,
            s,
            buf: vec![3u8; 4 * MIB],
        })
    }

    fn run(&mut self, mode: u64, size: usize, count: u64) -> Duration {
        let mut h = Vec::new();
        for w in [mode, size as u64, count] {
            h.extend_from_slice(&w.to_ne_bytes());
        }
        let t0 = Instant::now();
        self.s.write_all(&h).unwrap();
        for _ in 0..count {
            self.s.write_all(&self.buf[..size]).unwrap();
            if mode == 0 {
                self.s.read_exact(&mut self.buf[..size]).unwrap();
            }
        }
        if mode == 1 {
            self.s.read_exact(&mut self.buf[..1]).unwrap();
        }
        t0.elapsed()
    }

    fn finish(self) {
        drop(self.s);
        let mut c = self.child;
        let _ = c.wait();
    }
}

// ------------------------------------------------------------------ the comparison

fn med(v: &[f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    Some(v[v.len() / 2])
}

/// `external`: also UCX, libfabric, Open MPI, TCP (compare); else only the
/// floor, memcpy and VIA (report).
pub fn compare(ctx: &mut Ctx, reps: usize, external: bool) {
    let lat_size = 8usize;
    let bw_sizes = ctx
        .c
        .sizes
        .clone()
        .unwrap_or_else(|| vec![64 * KIB, MIB, 4 * MIB]);
    let mut sizes = vec![lat_size];
    sizes.extend(bw_sizes.iter().copied().filter(|&s| s != lat_size));
    // contender -> size -> (latencies, bandwidths)
    let mut res: Results = BTreeMap::new();
    let mut absent: Vec<(String, String, String)> = Vec::new();
    // The floors first: the bandwidth floor's row beside the latency's,
    // though it is measured only at the bandwidth sizes.
    let order = std::cell::RefCell::new(Vec::<String>::new());
    if sizes.iter().any(|&s| s != lat_size) {
        order.borrow_mut().extend(
            [
                "bare shared-memory ping-pong (floor)",
                "bare ping-pong, VIA's 3 lines",
                COPY_FLOOR,
            ]
            .map(String::from),
        );
    }
    let add = |res: &mut Results, who: &str, size: usize, r: Res| {
        if !order.borrow().iter().any(|o| o == who) {
            order.borrow_mut().push(who.to_string());
        }
        let e = res
            .entry(who.to_string())
            .or_default()
            .entry(size)
            .or_default();
        if let Some(l) = r.0 {
            e.0.push(l);
        }
        if let Some(b) = r.1 {
            e.1.push(b);
        }
    };
    let ucx_ok = external && which("ucx_perftest").is_some();
    let fi_ok = external && which("fi_pingpong").is_some();
    let mpi_exe = if external && which("mpicc").is_some() && which("mpirun").is_some() {
        Some(mpi_build())
    } else {
        None
    };
    if external {
        if !ucx_ok {
            absent.push((
                "UCX (ucx_perftest)".into(),
                NOT_INSTALLED.into(),
                "ucx_perftest not found (Debian: ucx-utils)".into(),
            ));
        }
        if !fi_ok {
            absent.push((
                "libfabric (fi_pingpong)".into(),
                NOT_INSTALLED.into(),
                "fi_pingpong not found (Debian: libfabric-bin)".into(),
            ));
        }
        match &mpi_exe {
            None => absent.push((
                "Open MPI ping-pong".into(),
                NOT_INSTALLED.into(),
                "mpicc/mpirun not found (Debian: openmpi-bin libopenmpi-dev)".into(),
            )),
            Some(Err(e)) => absent.push((
                "Open MPI ping-pong".into(),
                crate::out::ERROR.into(),
                e.clone(),
            )),
            Some(Ok(_)) => {}
        }
    }
    let per_rep = sizes.len() * (4 + if external { 7 } else { 0 });
    ctx.progress.grow(reps * per_rep);
    let mut errors: BTreeMap<String, String> = BTreeMap::new();
    for rep in 0..reps {
        ctx.progress
            .step(&format!("repetition {}/{reps}: floor", rep + 1));
        let floor = crate::shm_floor(iters(8, ctx.c.quick), ctx.cpus());
        add(
            &mut res,
            "bare shared-memory ping-pong (floor)",
            8,
            (Some(floor), None),
        );
        let lines = crate::shm_floor_via_lines(iters(8, ctx.c.quick), ctx.cpus());
        add(
            &mut res,
            "bare ping-pong, VIA's 3 lines",
            8,
            (Some(lines), None),
        );
        ctx.progress.inc();
        for &size in &sizes {
            ctx.progress
                .step(&format!("repetition {}/{reps}: {} B", rep + 1, size));
            if size != lat_size || bw_sizes.contains(&size) {
                let m = crate::memcpy_mbps(size, iters(size, ctx.c.quick) as usize, ctx.cpus().0);
                add(&mut res, "memcpy", size, (None, Some(m)));
            }
            ctx.progress.inc();
            let mut s = ctx.spec(Mode::PingPong, size);
            s.iters = Some(iters(size, ctx.c.quick));
            match ctx.point(&s, &[]) {
                Ok(m) => add(&mut res, "VIA ping-pong", size, (m.mean_us, m.mbps)),
                Err(e) => {
                    errors.insert("VIA ping-pong".into(), e);
                }
            }
            if size != lat_size {
                let m = crate::shm_copy_pingpong(size, iters(size, ctx.c.quick), ctx.cpus());
                add(&mut res, COPY_FLOOR, size, (None, Some(m)));
            }
            let mut st: Spec = s.clone();
            st.mode = Mode::Stream;
            st.iters = Some((iters(size, ctx.c.quick) / 16).max(2));
            match ctx.point(&st, &[]) {
                Ok(m) => add(&mut res, "VIA streaming", size, (None, m.mbps)),
                Err(e) => {
                    errors.insert("VIA streaming".into(), e);
                }
            }
            if !external {
                continue;
            }
            match Tcp::start(ctx) {
                Ok(mut t) => {
                    let n = iters(size, ctx.c.quick);
                    t.run(0, size, (n / 10).max(2));
                    let d = t.run(0, size, n);
                    let half = d.as_secs_f64() * 1e6 / n as f64 / 2.0;
                    add(
                        &mut res,
                        "TCP loopback ping-pong",
                        size,
                        (Some(half), Some(size as f64 / half)),
                    );
                    let n = (n / 4).max(16);
                    let d = t.run(1, size, n);
                    add(
                        &mut res,
                        "TCP loopback streaming",
                        size,
                        (None, Some((size as u64 * n) as f64 / d.as_secs_f64() / 1e6)),
                    );
                    t.finish();
                }
                Err(e) => {
                    errors.insert("TCP".into(), e);
                }
            }
            ctx.progress.inc();
            let mut ext = |who: &str, r: Result<Res, String>, res: &mut BTreeMap<_, _>| match r {
                Ok(r) => add(res, who, size, r),
                Err(e) => {
                    errors.insert(who.to_string(), e);
                }
            };
            if ucx_ok {
                ext(
                    "UCX tag_lat (ucx_perftest)",
                    ucx(ctx, "tag_lat", size),
                    &mut res,
                );
                ctx.progress.inc();
                if size != lat_size {
                    ext(
                        "UCX tag_bw (ucx_perftest)",
                        ucx(ctx, "tag_bw", size),
                        &mut res,
                    );
                }
                ctx.progress.inc();
            }
            if fi_ok {
                ext(
                    "libfabric shm (fi_pingpong)",
                    libfabric(ctx, "shm", size),
                    &mut res,
                );
                ctx.progress.inc();
                ext(
                    "libfabric tcp (fi_pingpong)",
                    libfabric(ctx, "tcp", size),
                    &mut res,
                );
                ctx.progress.inc();
            }
            if let Some(Ok(exe)) = &mpi_exe {
                ext("Open MPI ping-pong", mpi(ctx, exe, size), &mut res);
                ctx.progress.inc();
            }
        }
    }
    if let Some(Ok(exe)) = &mpi_exe {
        if let Some(dir) = std::path::Path::new(exe).parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
    let floor = res
        .get("bare shared-memory ping-pong (floor)")
        .and_then(|m| m.get(&8))
        .and_then(|x| med(&x.0));
    let memcpy: BTreeMap<usize, f64> = res
        .get("memcpy")
        .map(|m| {
            m.iter()
                .filter_map(|(s, x)| med(&x.1).map(|v| (*s, v)))
                .collect()
        })
        .unwrap_or_default();
    let mut summary = serde_json::Map::new();
    for who in order.borrow().iter() {
        let Some(by) = res.get(who) else { continue };
        for (&size, (l, b)) in by {
            let mut row = Row::new("compare", who).bytes(size);
            row.iters = reps as u64;
            if size == lat_size {
                row.mean_us = med(l);
                if let (Some(x), Some(f)) = (row.mean_us, floor) {
                    row.ratio = Some(x / f);
                    row.note = "median of repetitions; ratio: latency / floor".into();
                }
            }
            if size != lat_size || bw_sizes.contains(&size) {
                row.mbps = med(b);
                if size != lat_size {
                    row.mean_us = None;
                }
                if let (Some(x), Some(m)) = (row.mbps, memcpy.get(&size)) {
                    row.ratio = Some(x / m);
                    row.note = "median of repetitions; ratio: bandwidth / memcpy".into();
                }
            }
            if row.mean_us.is_none() && row.mbps.is_none() {
                continue;
            }
            summary.insert(
                format!("{who} {size}"),
                serde_json::json!({"us": row.mean_us, "mbps": row.mbps, "ratio": row.ratio}),
            );
            ctx.push(row);
        }
    }
    // Side by side: one line per stack, the ratios in parentheses.
    let mut t = format!(
        "side by side (median of {reps}; latency: half round trip, x the floor; bandwidth: MB/s, x memcpy)\n{:<38} {:>18}",
        "",
        format!("{lat_size} B us")
    );
    for s in &bw_sizes {
        t += &format!(
            " {:>18}",
            format!("{} MB/s", crate::out::fmt_size(*s as u64))
        );
    }
    for r in ctx.rows.iter().filter(|r| r.bench == "compare") {
        if r.bytes != Some(lat_size as u64)
            && ctx.rows.iter().any(|x| {
                x.bench == "compare" && x.config == r.config && x.bytes == Some(lat_size as u64)
            })
        {
            continue;
        }
        if t.contains(&format!("\n{:<38}", r.config)) {
            continue;
        }
        let cell = |size: usize| -> String {
            ctx.rows
                .iter()
                .find(|x| {
                    x.bench == "compare" && x.config == r.config && x.bytes == Some(size as u64)
                })
                .and_then(|x| {
                    let v = if size == lat_size && !bw_sizes.contains(&size) {
                        x.mean_us
                    } else {
                        x.mbps
                    };
                    v.map(|v| {
                        let v = if v >= 100.0 {
                            format!("{v:.0}")
                        } else {
                            format!("{v:.3}")
                        };
                        match x.ratio {
                            Some(q) => format!("{v} ({q:.2}x)"),
                            None => v,
                        }
                    })
                })
                .unwrap_or_else(|| "-".into())
        };
        t += &format!("\n{:<38} {:>18}", r.config, cell(lat_size));
        for s in &bw_sizes {
            t += &format!(" {:>18}", cell(*s));
        }
    }
    ctx.epilogue.push(t);
    for (who, st, why) in absent {
        ctx.push(Row::absent("compare", &who, &st, &why));
    }
    for (who, e) in errors {
        ctx.push(Row::absent("compare", &who, crate::out::ERROR, &e));
    }
    ctx.summary.insert(
        "compare".into(),
        serde_json::json!({
            "repetitions": reps,
            "interleaved": true,
            "latency_bytes": lat_size,
            "floor_us": floor,
            "results": summary,
        }),
    );
}
