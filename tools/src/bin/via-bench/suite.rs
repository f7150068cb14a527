//! The orchestrator: runs each point of a benchmark in a measuring child
//! process (`via-bench __point`, with the environment of its
//! configuration), collects rows, and the VIBe benchmarks and the design
//! alternatives built from points.

use std::collections::{BTreeMap, HashMap};
use std::process::Command;

use serde_json::{Value, json};

use crate::out::{self, Measure, NOT_AVAILABLE, Progress, Row};
use crate::xfer::{CqUse, Mode, Model, Notify, Op, Rel, Spec, Wait};
use crate::{Common, KIB, MIB};

/// Where points find their server.
#[derive(Clone)]
pub enum Remote {
    Local,
    Host { host: String, disc: String },
}

pub struct Ctx {
    pub c: Common,
    pub remote: Remote,
    pub rows: Vec<Row>,
    pub summary: BTreeMap<String, Value>,
    pub progress: Progress,
    /// Text printed after the tables (compact views).
    pub epilogue: Vec<String>,
    /// Base (polling) results of this run, per size: the baseline of the
    /// ratios of the other data-transfer benchmarks.
    base: HashMap<usize, Measure>,
    /// The kind of NIC measured, for the JSON document (`Nic::kind`,
    /// the soft NIC called by what it is).
    pub device_kind: &'static str,
}

pub fn default_sizes(quick: bool) -> Vec<usize> {
    if quick {
        vec![0, 8, 4 * KIB, 64 * KIB]
    } else {
        std::iter::once(0)
            .chain((0..=22).map(|p| 1usize << p))
            .collect()
    }
}

impl Ctx {
    pub fn new(c: Common, remote: Remote) -> Ctx {
        Ctx {
            c,
            remote,
            rows: Vec::new(),
            summary: BTreeMap::new(),
            progress: Progress::new(0, "via-bench"),
            epilogue: Vec::new(),
            base: HashMap::new(),
            device_kind: "shared-memory",
        }
    }

    pub fn sizes(&self) -> Vec<usize> {
        self.c
            .sizes
            .clone()
            .unwrap_or_else(|| default_sizes(self.c.quick))
    }

    /// Sizes of benchmarks that sweep something else: `--sizes`, else 8 B.
    pub fn few_sizes(&self) -> Vec<usize> {
        self.c.sizes.clone().unwrap_or_else(|| vec![8])
    }

    pub fn waits(&self) -> Vec<Wait> {
        self.c
            .wait
            .clone()
            .unwrap_or_else(|| vec![Wait::Poll, Wait::Block, Wait::Spin])
    }

    pub fn budget_ms(&self) -> u64 {
        self.c
            .time_ms
            .unwrap_or(if self.c.quick { 20 } else { 200 })
    }

    pub fn cpus(&self) -> (Option<usize>, Option<usize>) {
        if self.c.no_pin {
            return (None, None);
        }
        let v = self.c.cpus.clone().unwrap_or_else(|| vec![0, 1]);
        let n = via::sys::cpu_count();
        let a = v.first().copied().unwrap_or(0).min(n - 1);
        let b = v.get(1).copied().unwrap_or(1).min(n - 1);
        (Some(a), Some(b))
    }

    pub fn spec(&self, mode: Mode, size: usize) -> Spec {
        let mut s = Spec::new(mode, size);
        s.device = self.c.device.clone();
        s.budget_ms = self.budget_ms();
        s.iters = self.c.iters;
        (s.client_cpu, s.server_cpu) = self.cpus();
        s
    }

    /// Runs one point in a child process with `env` added.
    pub fn point(&mut self, spec: &Spec, env: &[(String, String)]) -> Result<Measure, String> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut cmd = Command::new(exe);
        cmd.arg("__point").arg(serde_json::to_string(spec).unwrap());
        if let Remote::Host { host, disc } = &self.remote {
            cmd.args(["--host", host, "--disc", disc]);
        }
        let mut env: Vec<(String, String)> = env.to_vec();
        env.extend(spec.wait.env());
        cmd.envs(env.iter().map(|(a, b)| (a.as_str(), b.as_str())));
        let out = cmd.output().map_err(|e| e.to_string())?;
        self.progress.inc();
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            // The panic message: the line after "panicked at".
            let lines: Vec<&str> = err.lines().collect();
            let why = lines
                .iter()
                .position(|l| l.contains("panicked at"))
                .and_then(|i| lines.get(i + 1))
                .or_else(|| lines.iter().rfind(|l| !l.trim().is_empty()))
                .map(|l| l.trim().to_string())
                .unwrap_or_default();
            log::warn!("point {spec:?} {env:?} failed: {err}");
            return Err(format!("measuring process failed ({}): {why}", out.status));
        }
        let line = text.lines().last().unwrap_or("");
        serde_json::from_str(line).map_err(|e| format!("bad output {line:?}: {e}"))
    }

    pub fn push(&mut self, r: Row) {
        self.rows.push(r);
    }

    /// A row from a point, or an error row.
    pub fn measured(&mut self, row: Row, spec: &Spec, env: &[(String, String)]) -> Option<Measure> {
        match self.point(spec, env) {
            Ok(m) => {
                self.push(row.with(&m));
                Some(m)
            }
            Err(e) => {
                self.push(Row {
                    status: out::ERROR.into(),
                    note: e,
                    ..row
                });
                None
            }
        }
    }

    /// Base latency (polling ping-pong) of this run at `size`.
    fn base_mean(&mut self, size: usize) -> Option<f64> {
        if !self.base.contains_key(&size) {
            self.progress.grow(1);
            let s = self.spec(Mode::PingPong, size);
            let m = self.point(&s, &[]).ok()?;
            self.base.insert(size, m);
        }
        self.base[&size].mean_us
    }

    /// Ping-pong (latency, CPU) and, with `stream`, streaming (bandwidth,
    /// rate) of `spec` at every size: one row per size, with the ratio of
    /// its mean latency to base's.
    fn lat_bw(
        &mut self,
        bench: &str,
        config: &str,
        spec: &Spec,
        env: &[(String, String)],
        sizes: &[usize],
        stream: bool,
    ) {
        self.progress.grow(sizes.len() * (1 + stream as usize));
        for &size in sizes {
            self.progress
                .step(&format!("{bench} {config} {}", out::fmt_size(size as u64)));
            let mut s = spec.clone();
            s.size = size;
            s.reply = if spec.reply == spec.size {
                size
            } else {
                spec.reply
            };
            s.pool = pool_for(spec.pool, size);
            let row = Row::new(bench, config).bytes(size);
            let pp = match self.point(&s, env) {
                Ok(m) => m,
                Err(e) => {
                    self.push(Row {
                        status: out::ERROR.into(),
                        note: e,
                        ..row
                    });
                    if stream {
                        self.progress.inc();
                    }
                    continue;
                }
            };
            let mut row = row.with(&pp);
            row.mbps = None;
            row.rate = None;
            if stream {
                let mut st = s.clone();
                st.mode = Mode::Stream;
                match self.point(&st, env) {
                    Ok(m) => {
                        row.mbps = m.mbps;
                        row.rate = m.rate;
                    }
                    Err(e) => row.note = format!("stream failed: {e}"),
                }
            }
            if let Some(t) = pp.extra.get("tcache").filter(|t| !t.is_null()) {
                let h = t["send_hits"].as_f64().unwrap_or(0.0);
                let m = t["send_compulsory"].as_f64().unwrap_or(0.0)
                    + t["send_other"].as_f64().unwrap_or(0.0);
                if s.reuse_pct.is_some() {
                    row = row.value(
                        100.0 * m / (h + m).max(1.0),
                        "% translation-cache misses (send)",
                    );
                }
            }
            if bench != "base" || config != Wait::Poll.name() {
                if let (Some(b), Some(x)) = (self.base_mean(size), row.mean_us) {
                    row.ratio = Some(x / b);
                    if row.note.is_empty() {
                        row.note = "ratio: mean latency / base (polling)".into();
                    }
                }
            } else {
                self.base.insert(size, pp.clone());
                row.ratio = Some(1.0);
            }
            self.push(row);
        }
    }
}

/// Buffers of a pool at `size`: at most 256 MiB in all (and 2 at least).
fn pool_for(pool: usize, size: usize) -> usize {
    if pool <= 1 {
        return 1;
    }
    let each = size.max(8).next_multiple_of(4096) * 2;
    pool.min((256 * MIB / each).max(2))
}

fn env1(k: &str, v: &str) -> Vec<(String, String)> {
    vec![(k.to_string(), v.to_string())]
}

// ------------------------------------------------------------------ VIBe

pub fn base(ctx: &mut Ctx) {
    let sizes = ctx.sizes();
    for w in ctx.waits() {
        let mut s = ctx.spec(Mode::PingPong, 0);
        s.wait = w;
        ctx.lat_bw("base", w.name(), &s, &[], &sizes, true);
    }
}

pub fn at(ctx: &mut Ctx, reuse: &[u32], pool: usize) {
    let sizes = ctx.sizes();
    for &r in reuse {
        let mut s = ctx.spec(Mode::PingPong, 0);
        s.reuse_pct = Some(r.min(100));
        s.pool = pool.max(2);
        ctx.lat_bw("at", &format!("reuse {r}%"), &s, &[], &sizes, true);
    }
}

pub fn mds(ctx: &mut Ctx, segs: &[usize]) {
    let sizes = ctx.sizes();
    for &k in segs {
        let mut s = ctx.spec(Mode::PingPong, 0);
        s.segs = k.clamp(1, 16);
        ctx.lat_bw(
            "mds",
            &format!("{} segments", s.segs),
            &s,
            &[],
            &sizes,
            true,
        );
    }
}

pub fn cq(ctx: &mut Ctx) {
    let sizes = ctx.sizes();
    for (name, u) in [
        ("receives via CQ", CqUse::Recv),
        ("sends and receives via CQ", CqUse::Both),
    ] {
        let mut s = ctx.spec(Mode::PingPong, 0);
        s.cq = u;
        ctx.lat_bw("cq", name, &s, &[], &sizes, true);
    }
}

pub fn mvis(ctx: &mut Ctx, vis: &[usize], one: bool, all: bool) {
    let sizes = ctx.few_sizes();
    for (active, on) in [("one active", one), ("all active", all)] {
        if !on {
            continue;
        }
        for &n in vis {
            let n = n.clamp(1, 1024);
            let mut s = ctx.spec(Mode::PingPong, 0);
            s.vis = n;
            s.connected = if active == "all active" { n } else { 1 };
            for &size in &sizes {
                let mut s = s.clone();
                s.size = size;
                s.reply = size;
                ctx.progress.grow(1);
                let row = Row::new("mvis", &format!("{active}, {}", out::fmt_size(size as u64)))
                    .bytes(size)
                    .x("VIs", n as f64);
                if let Some(m) = ctx.measured(row, &s, &[]) {
                    let b = ctx.base_mean(size);
                    let r = ctx.rows.last_mut().unwrap();
                    r.ratio = b.and_then(|b| m.mean_us.map(|x| x / b));
                    r.note = "ratio: mean latency / base (polling)".into();
                }
            }
        }
    }
}

pub fn async_(ctx: &mut Ctx, modes: &[Notify], bench: &str) {
    let sizes = ctx.few_sizes();
    for &mode in modes {
        for &size in &sizes {
            let mut s = ctx.spec(Mode::Async(mode), size);
            s.wait = ctx
                .c
                .wait
                .as_ref()
                .and_then(|w| w.first().copied())
                .unwrap_or(Wait::Poll);
            if mode == Notify::Timer {
                // About 5 ms a round trip: a longer budget, fewer rounds.
                s.budget_ms = s.budget_ms.max(if ctx.c.quick { 60 } else { 500 });
            }
            ctx.progress.grow(1);
            let name = match mode {
                Notify::Event => "Notify handler (event wake-up)",
                Notify::Thread => "communication thread (blocking wait)",
                Notify::Poll => "polling between work chunks",
                Notify::Timer => "10 ms timer",
            };
            let row = Row::new(bench, name).bytes(size);
            if let Some(m) = ctx.measured(row, &s, &[]) {
                let b = ctx.base_mean(size);
                let r = ctx.rows.last_mut().unwrap();
                r.ratio = b.and_then(|b| m.mean_us.map(|x| x / b));
                r.note = "server computes meanwhile; ratio: mean latency / base (polling)".into();
            }
        }
    }
}

pub fn rdma(ctx: &mut Ctx, ops: &[Op]) {
    let sizes = ctx.sizes();
    for &op in ops {
        let mut s = ctx.spec(Mode::PingPong, 0);
        s.op = op;
        let mut ok = Vec::new();
        for &size in &sizes {
            if op == Op::Write && size < 8 {
                ctx.push(
                    Row::absent(
                        "rdma",
                        op.name(),
                        NOT_AVAILABLE,
                        "the target polls the last 8 bytes: needs 8 bytes or more",
                    )
                    .bytes(size),
                );
            } else {
                ok.push(size);
            }
        }
        ctx.lat_bw("rdma", op.name(), &s, &[], &ok, true);
    }
}

pub fn mts(ctx: &mut Ctx, mts: &[usize]) {
    let sizes = ctx.sizes();
    for &m in mts {
        let m = m.max(1);
        let mut s = ctx.spec(Mode::PingPong, 0);
        s.mts = Some(m);
        let name = format!("MTS {}", out::fmt_size(m as u64));
        let mut ok = Vec::new();
        for &size in &sizes {
            if size.div_ceil(m) > 512 {
                ctx.push(
                    Row::absent(
                        "mts",
                        &name,
                        NOT_AVAILABLE,
                        "needs more than 512 descriptors per message",
                    )
                    .bytes(size),
                );
            } else {
                ok.push(size);
            }
        }
        for size in ok {
            let nf = size.div_ceil(m).max(1);
            s.window = (512 / nf).clamp(1, 16);
            ctx.lat_bw("mts", &name, &s, &[], &[size], true);
        }
    }
}

pub fn rl(ctx: &mut Ctx, levels: &[Rel]) {
    let sizes = ctx.sizes();
    // With --wait, each level with each completion mode (polling and
    // blocking reported apart); else polling only.
    let waits = ctx.c.wait.clone();
    for &l in levels {
        match &waits {
            None => {
                let mut s = ctx.spec(Mode::PingPong, 0);
                s.rel = l;
                ctx.lat_bw("rl", l.name(), &s, &[], &sizes, true);
            }
            Some(ws) => {
                for &w in ws {
                    let mut s = ctx.spec(Mode::PingPong, 0);
                    s.rel = l;
                    s.wait = w;
                    let config = format!("{} {}", l.name(), w.name());
                    ctx.lat_bw("rl", &config, &s, &[], &sizes, true);
                }
            }
        }
    }
}

pub fn spl(ctx: &mut Ctx, depths: &[usize], bench: &str) {
    let sizes = ctx.sizes();
    for &d in depths {
        let d = d.clamp(1, 1024);
        let mut s = ctx.spec(Mode::Stream, 0);
        s.window = d;
        ctx.progress.grow(sizes.len());
        for &size in &sizes {
            let mut s = s.clone();
            s.size = size;
            s.reply = size;
            let row = Row::new(bench, &format!("depth {d}"))
                .bytes(size)
                .note("latency columns: time per message");
            ctx.measured(row, &s, &[]);
        }
    }
}

pub fn txn(ctx: &mut Ctx, req: usize) {
    let sizes = ctx.sizes();
    let mut s = ctx.spec(Mode::PingPong, req);
    s.reply = usize::MAX; // marks "swept" for lat_bw
    ctx.progress.grow(sizes.len());
    for &size in &sizes {
        let mut s = s.clone();
        s.reply = size;
        s.size = req;
        let row = Row::new("cs-txn", &format!("request {} B", req))
            .bytes(size)
            .note("bytes: reply size; ops/s: transactions per second; latency: half a transaction");
        if let Some(m) = ctx.measured(row, &s, &[]) {
            let r = ctx.rows.last_mut().unwrap();
            r.mbps = None;
            r.rate = m.rate;
        }
    }
}

pub fn threads(ctx: &mut Ctx, models: &[Model], clients: &[usize], workers: usize, size: usize) {
    for &model in models {
        for &c in clients {
            let c = c.clamp(1, 256);
            let mut s = ctx.spec(Mode::Server { model, workers }, size);
            s.vis = c;
            s.connected = c;
            s.pool = c;
            s.cq = CqUse::Recv;
            s.wait = ctx
                .c
                .wait
                .as_ref()
                .and_then(|w| w.first().copied())
                .unwrap_or(Wait::Spin);
            ctx.progress.grow(1);
            let name = match model {
                Model::Master => format!("master + {workers} workers"),
                Model::Pool => format!("pool of {workers} workers"),
            };
            let row = Row::new("cs-server", &name)
                .bytes(size)
                .x("clients", c as f64)
                .note("client threads in one process; ops/s: transactions per second, all clients");
            ctx.measured(row, &s, &[]);
        }
    }
}

pub fn nd(ctx: &mut Ctx, vi: bool, conn: bool, mem: bool, cq: bool) {
    let second = |m: &Measure, r: Row| -> Row {
        let s = &m.extra["second"];
        Row {
            iters: m.iters,
            mean_us: s["mean_us"].as_f64(),
            min_us: s["min_us"].as_f64(),
            median_us: s["median_us"].as_f64(),
            p99_us: s["p99_us"].as_f64(),
            ..r
        }
    };
    let run = |ctx: &mut Ctx,
               bench: &str,
               a: &str,
               b: &str,
               spec: &Spec,
               env: &[(String, String)],
               size: Option<usize>,
               x: Option<(&str, f64)>| {
        ctx.progress.grow(1);
        let mut r1 = Row::new(bench, a);
        let mut r2 = Row::new(bench, b);
        if let Some(s) = size {
            r1 = r1.bytes(s);
            r2 = r2.bytes(s);
        }
        if let Some((n, v)) = x {
            r1 = r1.x(n, v);
            r2 = r2.x(n, v);
        }
        match ctx.point(spec, env) {
            Ok(m) => {
                ctx.push(r1.with(&m));
                ctx.push(second(&m, r2));
            }
            Err(e) => {
                ctx.push(Row {
                    status: out::ERROR.into(),
                    note: e.clone(),
                    ..r1
                });
                ctx.push(Row {
                    status: out::ERROR.into(),
                    note: e,
                    ..r2
                });
            }
        }
    };
    if vi {
        let s = ctx.spec(Mode::ViCreate, 0);
        run(ctx, "nd-vi", "create VI", "destroy VI", &s, &[], None, None);
    }
    if conn {
        for peer in [false, true] {
            let n = ctx
                .c
                .iters
                .map(|n| n as usize)
                .unwrap_or(if ctx.c.quick { 5 } else { 100 });
            let s = ctx.spec(Mode::Conn { peer, n }, 0);
            let (a, b) = if peer {
                ("peer-to-peer connect", "peer-to-peer disconnect")
            } else {
                ("client/server connect", "client/server disconnect")
            };
            run(ctx, "nd-conn", a, b, &s, &[], None, None);
        }
    }
    if mem {
        let top = if ctx.c.quick { MIB } else { 256 * MIB };
        let mut size = 4 * KIB;
        while size <= top {
            for (cache, on) in [("cache off", "off"), ("cache on, hit", "on")] {
                let s = ctx.spec(Mode::Mem { cached: on == "on" }, size);
                run(
                    ctx,
                    "nd-mem",
                    &format!("register ({cache})"),
                    &format!("deregister ({cache})"),
                    &s,
                    &env1("VIA_REGCACHE", on),
                    Some(size),
                    None,
                );
            }
            size *= 4;
        }
    }
    if cq {
        for entries in [16usize, 256, 4096, 65536] {
            let s = ctx.spec(Mode::CqCreate, entries);
            run(
                ctx,
                "nd-cq",
                "create CQ",
                "destroy CQ",
                &s,
                &[],
                None,
                Some(("entries", entries as f64)),
            );
        }
    }
}

/// Every VIBe benchmark, each with its default parameters.
pub fn suite(ctx: &mut Ctx) {
    let q = ctx.c.quick;
    nd(ctx, true, true, true, true);
    base(ctx);
    at(ctx, &[0, 25, 50, 75, 100], if q { 64 } else { 2048 });
    mds(ctx, if q { &[1, 4] } else { &[1, 2, 4, 8, 16] });
    cq(ctx);
    mvis(
        ctx,
        if q { &[1, 16] } else { &[1, 16, 128, 1024] },
        true,
        true,
    );
    async_(
        ctx,
        &[Notify::Event, Notify::Thread, Notify::Poll, Notify::Timer],
        "async",
    );
    rdma(ctx, &[Op::Write, Op::WriteImm, Op::Read]);
    mts(
        ctx,
        if q {
            &[4 * KIB]
        } else {
            &[4 * KIB, 16 * KIB, 64 * KIB, 256 * KIB, MIB]
        },
    );
    rl(ctx, &[Rel::U, Rel::Rd, Rel::Rr]);
    spl(
        ctx,
        if q {
            &[1, 16]
        } else {
            &[1, 2, 4, 8, 16, 32, 64, 128]
        },
        "spl",
    );
    rate(ctx);
    txn(ctx, 64);
    threads(
        ctx,
        &[Model::Master, Model::Pool],
        if q { &[2] } else { &[1, 2, 4, 8] },
        2,
        64,
    );
}

pub fn rate(ctx: &mut Ctx) {
    let saved = ctx.c.sizes.clone();
    if saved.is_none() {
        ctx.c.sizes = Some(if ctx.c.quick {
            vec![0, 64]
        } else {
            vec![0, 8, 64, 256, 1024, 4096]
        });
    }
    spl(ctx, &[64], "rate");
    ctx.c.sizes = saved;
}

// ------------------------------------------------------------------ design alternatives

pub fn alt_doorbell(ctx: &mut Ctx, vis: &[usize]) {
    let size = ctx.few_sizes()[0];
    let mut central: HashMap<usize, f64> = HashMap::new();
    // The two doorbell designs, with the posting thread running the engine
    // (inline progress, the default) and with an engine thread (the
    // doorbell proper: every post crosses it).
    for (mode, progress) in [
        ("central", "inline"),
        ("per-vi", "inline"),
        ("central", "thread"),
        ("per-vi", "thread"),
    ] {
        let name = if progress == "inline" {
            mode.to_string()
        } else {
            format!("{mode}, engine thread")
        };
        for &n in vis {
            let n = n.clamp(1, 1024);
            let mut s = ctx.spec(Mode::PingPong, size);
            s.vis = n;
            s.connected = n;
            ctx.progress.grow(1);
            let row = Row::new("alt-doorbell", &name)
                .x("active VIs", n as f64)
                .bytes(size);
            let env = vec![
                ("VIA_DOORBELL".to_string(), mode.to_string()),
                ("VIA_PROGRESS".to_string(), progress.to_string()),
            ];
            if let Some(m) = ctx.measured(row, &s, &env) {
                let x = m.mean_us.unwrap_or(f64::NAN);
                if mode == "central" && progress == "inline" {
                    central.insert(n, x);
                }
                let r = ctx.rows.last_mut().unwrap();
                r.ratio = central.get(&n).map(|c| x / c);
                r.note = "all VIs connected, used round robin; ratio: / central, inline".into();
            }
        }
    }
}

pub fn alt_cq(ctx: &mut Ctx, queues: &[usize]) {
    let size = ctx.few_sizes()[0];
    let mut lat: BTreeMap<(String, usize), f64> = BTreeMap::new();
    for (mode, name) in [("ring", "CQ1 entry ring"), ("scan", "CQ2 work-queue scan")] {
        for &n in queues {
            let n = n.clamp(1, 1024);
            let mut s = ctx.spec(Mode::PingPong, size);
            s.vis = n;
            s.connected = 1;
            s.cq = CqUse::Recv;
            ctx.progress.grow(1);
            let row = Row::new("alt-cq", name)
                .x("work queues per CQ", n as f64)
                .bytes(size);
            if let Some(m) = ctx.measured(row, &s, &env1("VIA_CQ", mode)) {
                let x = m.median_us.unwrap_or(f64::NAN);
                lat.insert((mode.into(), n), x);
                let ring = lat.get(&("ring".to_string(), n)).copied();
                let r = ctx.rows.last_mut().unwrap();
                r.ratio = ring.map(|g| m.mean_us.unwrap_or(f64::NAN) / g);
                r.note = "receive queues of n VIs on one CQ, one VI active; ratio: median / CQ1's"
                    .into();
            }
        }
    }
    // Break-even: the first n from which the scan's median is above the ring's.
    let even = queues
        .iter()
        .find(
            |&&n| match (lat.get(&("scan".into(), n)), lat.get(&("ring".into(), n))) {
                (Some(s), Some(r)) => s > r,
                _ => false,
            },
        )
        .copied();
    let v = json!({
        "break_even_queues": even,
        "meaning": "smallest number of work queues per CQ at which CQ2 (scan) is slower than CQ1 (ring), median half round trip; null: never within the sweep",
        "thesis": "about 18 (Myrinet) to 20 (SP-NT) work queues",
    });
    ctx.summary.insert("alt-cq".into(), v);
    if let Some(n) = even {
        ctx.push(Row::new("alt-cq", "break-even").value(n as f64, "work queues"));
    }
}

pub fn alt_inline(ctx: &mut Ctx, thresholds: &[usize]) {
    let sizes = ctx.c.sizes.clone().unwrap_or_else(|| {
        if ctx.c.quick {
            vec![8, 64, 256]
        } else {
            vec![0, 4, 8, 16, 32, 64, 128, 256]
        }
    });
    let max = via::config::MAX_INLINE;
    let mut at0: HashMap<usize, f64> = HashMap::new();
    let mut wins: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for &t in thresholds {
        let name = format!("inline <= {t} B");
        if t > max {
            ctx.push(Row::absent(
                "alt-inline",
                &name,
                NOT_AVAILABLE,
                &format!("the provider carries at most {max} bytes inline (VIA_INLINE is clamped to MAX_INLINE)"),
            ));
            continue;
        }
        ctx.progress.grow(sizes.len());
        for &size in &sizes {
            let s = ctx.spec(Mode::PingPong, size);
            let row = Row::new("alt-inline", &name)
                .bytes(size)
                .x("threshold", t as f64);
            if let Some(m) = ctx.measured(row, &s, &env1("VIA_INLINE", &t.to_string())) {
                let x = m.median_us.unwrap_or(f64::NAN);
                if t == 0 {
                    at0.insert(size, x);
                }
                let r = ctx.rows.last_mut().unwrap();
                if let Some(b) = at0.get(&size) {
                    r.ratio = Some(x / b);
                    r.note = "ratio: median / threshold 0 (by reference)".into();
                    if t > 0 && size <= t && x < *b {
                        wins.entry(t).or_default().push(size);
                    }
                }
            }
        }
    }
    ctx.summary.insert(
        "alt-inline".into(),
        json!({
            "sizes_where_inline_beats_by_reference": wins,
            "max_inline": max,
            "meaning": "for each threshold, the message sizes (<= threshold) whose median half round trip is below the same size by reference (threshold 0) in this run",
        }),
    );
}

/// Fragment size of the sockets NIC (`VIA_SOCK_FRAGMENT`: the most bytes
/// one system call writes), as the thesis swept the fragment size of its
/// Ethernet VIA: ping-pong latency and bandwidth per fragment size, against
/// whole frames (one call writes as much as the socket takes).
pub fn alt_fragment(ctx: &mut Ctx) {
    let dev = ctx.c.device.clone();
    let base = dev.strip_prefix("/dev/").unwrap_or(&dev);
    if base.strip_prefix("via_").is_none_or(|i| i == "lo") {
        ctx.push(Row::absent(
            "alt-fragment",
            "fragment size 512 B..64 KiB",
            NOT_AVAILABLE,
            &format!(
                "device {dev} is not a sockets NIC: the shared-memory NIC moves a message with one copy and has no fragments; run with --device via_<interface>"
            ),
        ));
        return;
    }
    let q = ctx.c.quick;
    let fragments: &[usize] = if q {
        &[0, 4 * KIB]
    } else {
        &[0, 512, KIB, 4 * KIB, 16 * KIB, 64 * KIB]
    };
    let sizes = ctx.c.sizes.clone().unwrap_or_else(|| {
        if q {
            vec![64 * KIB]
        } else {
            vec![8, 64 * KIB, MIB]
        }
    });
    let mut whole: HashMap<usize, f64> = HashMap::new();
    for &f in fragments {
        let name = if f == 0 {
            "whole frames".to_string()
        } else {
            format!("fragment {}", crate::out::fmt_size(f as u64))
        };
        ctx.progress.grow(sizes.len());
        for &size in &sizes {
            let s = ctx.spec(Mode::PingPong, size);
            let row = Row::new("alt-fragment", &name)
                .bytes(size)
                .x("fragment", f as f64);
            if let Some(m) = ctx.measured(row, &s, &env1("VIA_SOCK_FRAGMENT", &f.to_string())) {
                let x = m.median_us.unwrap_or(f64::NAN);
                if f == 0 {
                    whole.insert(size, x);
                }
                let r = ctx.rows.last_mut().unwrap();
                if let Some(b) = whole.get(&size) {
                    r.ratio = Some(x / b);
                    r.note = "ratio: median half round trip / whole frames".into();
                }
            }
        }
    }
}

pub fn alt_notify(ctx: &mut Ctx) {
    async_(
        ctx,
        &[Notify::Thread, Notify::Event, Notify::Poll, Notify::Timer],
        "alt-notify",
    );
}

/// The translation cache against a trace of buffer handles: a trace
/// recorded from the buffer-reuse ping-pong (and synthetic NAS-like ones)
/// replayed against models of several sizes and associativities, and the
/// live engine run with a few of the same shapes.
pub fn alt_tcache(ctx: &mut Ctx, reuse: u32, pool: usize, entries: &[usize], ways: &[usize]) {
    let n = ctx
        .c
        .iters
        .unwrap_or(if ctx.c.quick { 2000 } else { 20000 });
    let mut s = ctx.spec(Mode::PingPong, 64);
    s.reuse_pct = Some(reuse.min(100));
    s.pool = pool.max(2);
    s.trace = true;
    s.iters = Some(n);
    ctx.progress.grow(1);
    let rec = Row::new("alt-tcache", "recording (live, default cache)")
        .bytes(64)
        .x("entries", 1024.0);
    let Some(m) = ctx.measured(rec, &s, &[]) else {
        return;
    };
    let trace: Vec<u64> = m.extra["trace"]
        .as_array()
        .map(|a| a.iter().filter_map(|v| v.as_u64()).collect())
        .unwrap_or_default();
    {
        let r = ctx.rows.last_mut().unwrap();
        if let Some(t) = m.extra.get("tcache").filter(|t| !t.is_null()) {
            let h = t["send_hits"].as_f64().unwrap_or(0.0);
            let mi = t["send_compulsory"].as_f64().unwrap_or(0.0)
                + t["send_other"].as_f64().unwrap_or(0.0);
            *r = r
                .clone()
                .value(100.0 * mi / (h + mi).max(1.0), "% misses (send)");
        }
        r.note = format!(
            "{} sends, reuse {reuse}%, pool {pool}; the trace replayed below",
            trace.len()
        );
    }
    let mut traces: Vec<(String, Vec<u64>)> =
        vec![(format!("recorded reuse {reuse}%"), trace.clone())];
    traces.extend(crate::tcache::nas_like(if ctx.c.quick { 1 } else { 4 }));
    let mut model = BTreeMap::new();
    for (name, t) in &traces {
        for &w in ways {
            for &e in entries {
                let r = crate::tcache::replay(t, e, w);
                let row = Row::new("alt-tcache", &format!("model {name}, {w}-way"))
                    .x("entries", e as f64)
                    .value(r.miss_pct(), "% misses")
                    .note(&format!(
                        "{} lookups, {} compulsory, {} other misses",
                        r.lookups, r.compulsory, r.other
                    ));
                ctx.push(Row {
                    iters: r.lookups,
                    ..row
                });
                model.insert(format!("{name}/{e}/{w}"), r.miss_pct());
            }
        }
    }
    // The live engine with the same trace pattern (same seed) and cache shapes.
    for &w in ways.iter().filter(|&&w| w == 1 || w == 8) {
        for &e in entries.iter().filter(|&&e| e == 128 || e == 1024) {
            let env = vec![
                ("VIA_TCACHE_ENTRIES".to_string(), e.to_string()),
                ("VIA_TCACHE_WAYS".to_string(), w.to_string()),
            ];
            let mut s2 = s.clone();
            s2.trace = false;
            ctx.progress.grow(1);
            let row = Row::new("alt-tcache", &format!("live engine, {w}-way"))
                .bytes(64)
                .x("entries", e as f64);
            if let Some(m) = ctx.measured(row, &s2, &env) {
                let t = &m.extra["tcache"];
                let h = t["send_hits"].as_f64().unwrap_or(0.0);
                let mi = t["send_compulsory"].as_f64().unwrap_or(0.0)
                    + t["send_other"].as_f64().unwrap_or(0.0);
                let pred = model
                    .get(&format!("recorded reuse {reuse}%/{e}/{w}"))
                    .copied();
                let r = ctx.rows.last_mut().unwrap();
                *r = r
                    .clone()
                    .value(100.0 * mi / (h + mi).max(1.0), "% misses (send)");
                r.note = format!(
                    "model predicted {}; the engine also looks up descriptor regions",
                    pred.map(|p| format!("{p:.1}%"))
                        .unwrap_or_else(|| "-".into())
                );
            }
        }
    }
    ctx.summary.insert(
        "alt-tcache".into(),
        json!({
            "method": "the buffer handles of every send of a ping-pong with reuse% from a pool of pre-registered buffers, recorded live, replayed offline against set-associative LRU models indexed as the engine indexes (handle & (sets-1)); NAS-like traces are synthetic patterns, not NAS runs",
            "model_miss_pct": model,
        }),
    );
}

// ------------------------------------------------------------------ output

pub fn finish(ctx: Ctx, title: &str, default_json: Option<&str>) {
    ctx.progress.finish();
    let mut title = format!(
        "{title}: via-bench {}",
        std::env::args().skip(1).collect::<Vec<_>>().join(" ")
    );
    title.truncate(120);
    out::print_tables(&ctx.rows);
    for (k, v) in &ctx.summary {
        println!("\nsummary {k}: {v}");
    }
    for t in &ctx.epilogue {
        println!("\n{t}");
    }
    let (client_cpu, server_cpu) = ctx.cpus();
    let doc = out::Doc {
        tool: "via-bench".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        command: std::env::args().skip(1).collect(),
        device: ctx.c.device.clone(),
        device_kind: ctx.device_kind.into(),
        pinning: out::Pinning {
            pinned: !ctx.c.no_pin,
            client_cpu: client_cpu.unwrap_or(0),
            server_cpu: server_cpu.unwrap_or(0),
            cpus: via::sys::cpu_count(),
        },
        env: out::provider_env(),
        started_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        rows: ctx.rows,
        summary: ctx.summary,
    };
    if let Some(p) = ctx.c.json.as_deref().or(default_json) {
        if let Err(e) = out::write_json(p, &doc) {
            eprintln!("cannot write {p}: {e}");
        }
    }
    if let Some(p) = &ctx.c.csv {
        if let Err(e) = out::write_csv(p, &doc.rows) {
            eprintln!("cannot write {p}: {e}");
        }
    }
    if let Some(p) = &ctx.c.plot {
        if let Err(e) = out::write_plot(p, &title, &doc.rows) {
            eprintln!("cannot draw {p}: {e}");
        }
    }
}
