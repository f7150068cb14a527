//! via-bench: the VIBe micro-benchmark suite over this provider, the
//! thesis's design alternatives, and comparisons against baselines
//! measured in the same run.
//!
//! `via-bench` with no command runs `report`: 8-byte polling ping-pong
//! latency against a bare shared-memory ping-pong (the floor), and
//! ping-pong and streaming bandwidth at 64 KiB, 1 MiB and 4 MiB against
//! `memcpy`, and writes `via-bench.json`. `via-bench --help` lists the
//! rest; every command has `--help`.
//!
//! Like fabtests, one binary plays every role: each measurement point runs
//! in a child process (`__point`, with the environment of its
//! configuration: `VIA_*` variables are read once per process), which
//! starts its server (`via-bench server`) or connects to one running
//! elsewhere (`via-bench client`).

mod compare;
mod nd;
mod out;
mod reg;
mod suite;
mod syscost;
mod tcache;
mod verbs;
mod xfer;

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand, ValueEnum};
use via::descriptor::status;
use via::shm::mapping::Mapping;
use via::{DescBuilder, Region, Reliability, Vi, ViAttributes};

use crate::suite::{Ctx, Remote};
use crate::xfer::{Model, Notify, Op, Rel, Wait};

pub const KIB: usize = 1024;
pub const MIB: usize = 1024 * 1024;

/// Sizes with K and M suffixes (`4K`, `1M`).
fn parse_size(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let (n, m) = if let Some(v) = s.strip_suffix(['K', 'k']) {
        (v, KIB)
    } else if let Some(v) = s.strip_suffix(['M', 'm']) {
        (v, MIB)
    } else {
        (s, 1)
    };
    n.parse::<usize>()
        .map(|n| n * m)
        .map_err(|e| format!("{s:?}: {e}"))
}

#[derive(Parser)]
#[command(
    name = "via-bench",
    version,
    about = "VIBe benchmarks, the thesis's design alternatives and side-by-side comparisons for via-rs",
    long_about = "VIBe benchmarks, the thesis's design alternatives and side-by-side comparisons for via-rs.\n\n\
        With no command: `report` (8-byte latency vs a bare shared-memory ping-pong, ping-pong and \
        streaming bandwidth vs memcpy; JSON in via-bench.json).\n\n\
        Every measurement point runs in its own pair of processes (client pinned to the first of \
        --cpus, server to the second). Results: a table on stdout, --json, --csv, --plot (SVG). \
        A progress bar is drawn on a terminal (stderr) only. The provider's VIA_* variables apply \
        to every process; the design-alternative commands set them per configuration."
)]
struct Cli {
    #[command(flatten)]
    common: Common,
    #[command(subcommand)]
    cmd: Option<Cmd>,
}

/// Options of every command.
#[derive(Args, Clone, Debug, Default)]
pub struct Common {
    /// The NIC, as `VipOpenNic` names it: via_lo, /dev/via_lo, via_<interface>, /dev/via_<interface>; with the verbs kind an RDMA device (rxe0, mlx5_0, verbs)
    #[arg(long, global = true, default_value = "via_lo")]
    pub device: String,
    /// Short runs: fewer sizes, iterations and configurations
    #[arg(long, global = true)]
    pub quick: bool,
    /// Write the results as JSON
    #[arg(long, global = true, value_name = "FILE")]
    pub json: Option<String>,
    /// Write the results as CSV
    #[arg(long, global = true, value_name = "FILE")]
    pub csv: Option<String>,
    /// Draw latency and bandwidth against size, one line per configuration (SVG)
    #[arg(long, global = true, value_name = "FILE.svg")]
    pub plot: Option<String>,
    /// Message sizes, comma-separated, K/M suffixes (default: 0 and 1 B..4 MiB in powers of two)
    #[arg(long, global = true, value_delimiter = ',', value_parser = parse_size)]
    pub sizes: Option<Vec<usize>>,
    /// Completion modes (default: all three where the benchmark sweeps them)
    #[arg(long, global = true, value_delimiter = ',', value_enum)]
    pub wait: Option<Vec<Wait>>,
    /// Time budget of one measurement point, ms (default 200; 20 with --quick)
    #[arg(long = "time-ms", global = true)]
    pub time_ms: Option<u64>,
    /// A fixed number of iterations per point instead of the time budget
    #[arg(long, global = true)]
    pub iters: Option<u64>,
    /// Cores of the client and the server side (default 0,1)
    #[arg(long, global = true, value_delimiter = ',')]
    pub cpus: Option<Vec<usize>>,
    /// Do not pin the processes to cores
    #[arg(long = "no-pin", global = true)]
    pub no_pin: bool,
    /// Repetitions of report and compare (interleaved; the median is reported; default 5 and 3)
    #[arg(long, global = true)]
    pub reps: Option<usize>,
}

#[derive(Subcommand)]
enum Cmd {
    /// The main comparison (the default): VIA against the floor and memcpy
    Report,
    /// VIA against baselines outside this project: the floor, memcpy, TCP, and where installed UCX, libfabric, Open MPI
    Compare,
    /// The complete VIBe suite, every benchmark with its defaults
    Suite,
    /// Non-data-transfer: VI, connection, memory registration, CQ
    Nd {
        /// Which (comma-separated)
        #[arg(value_enum, value_delimiter = ',', default_value = "all")]
        what: Vec<NdWhat>,
    },
    #[command(flatten)]
    Bench(Bench),
    /// The thesis's design alternatives, each as a table (and --plot)
    Alt {
        #[command(subcommand)]
        what: Alt,
    },
    /// This machine's analogue of the thesis's table of system costs
    SysCosts,
    /// VIA against raw verbs on an RDMA device (--device rxe0, mlx5_0, verbs): 8-byte half round trip of an ibv_rc_pingpong-style loop and of VIA's ping-pong, same run
    Verbs,
    /// All registration benchmarks (regpp, regcost, regscale, reuse, regbig)
    Reg(RegArgs),
    /// Registering around every message vs once, cache on and off
    Regpp(RegArgs),
    /// Register + deregister 4 KiB..256 MiB, first time and again, cache on and off
    Regcost(RegArgs),
    /// Registration cost with 1..50,000 registrations live
    Regscale(RegArgs),
    /// Buffer reuse 0..100% with registration around each message
    Reuse(RegArgs),
    /// Registering 4 GiB: time and peak extra memory
    Regbig(RegArgs),
    /// Serve benchmark points to `via-bench client` (across hosts)
    Server {
        /// The discriminator to listen on
        #[arg(long, default_value = "via-bench")]
        disc: String,
        /// Serve this many points, then exit (default: for ever)
        #[arg(long)]
        count: Option<u64>,
        /// Print READY once listening (for the local client)
        #[arg(long, hide = true)]
        ready: bool,
        /// The core to pin to
        #[arg(long)]
        cpu: Option<usize>,
    },
    /// Run a data-transfer benchmark against a `via-bench server` elsewhere
    Client {
        /// The server's host (name service: localhost, this host's name, $VIA_HOSTS)
        #[arg(long)]
        host: String,
        /// The server's discriminator
        #[arg(long, default_value = "via-bench")]
        disc: String,
        #[command(subcommand)]
        bench: Bench,
    },
    #[command(name = "__point", hide = true)]
    Point {
        spec: String,
        #[arg(long)]
        host: Option<String>,
        #[arg(long)]
        disc: Option<String>,
    },
    /// Internal roles of the registration benchmarks.
    #[command(hide = true)]
    Serve {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// One process, two connected VIs, one thread: the cost of the calls
    /// without cross-core traffic (for instruction counts under callgrind).
    #[command(hide = true)]
    Loopback { rounds: Option<usize> },
    #[command(name = "__sink", hide = true)]
    Sink,
    /// One side of `verbs`'s raw loop.
    #[command(name = "__raw_verbs", hide = true)]
    RawVerbs {
        #[arg(long)]
        role: String,
        #[arg(long)]
        cpu: Option<usize>,
    },
    #[command(name = "__tcp", hide = true)]
    Tcp {
        #[arg(long)]
        cpu: Option<usize>,
        /// Address to listen on (default 127.0.0.1, any port).
        #[arg(long)]
        bind: Option<String>,
    },
    /// The plain TCP baseline against a `__tcp --bind` server elsewhere:
    /// ping-pong half round trip and streaming bandwidth per size (the
    /// sockets NIC's comparison over the same link).
    #[command(name = "__tcp_client", hide = true)]
    TcpClient {
        /// `address:port` of the server.
        #[arg(long)]
        connect: String,
        /// Message sizes (K/M suffixes).
        #[arg(long, default_value = "8,64K,1M")]
        lens: String,
        /// Time budget per size and pattern, ms.
        #[arg(long, default_value_t = 1000)]
        budget_ms: u64,
    },
}

#[derive(Subcommand, Clone)]
enum Bench {
    /// Base: ping-pong latency and CPU, streaming bandwidth; one buffer, one segment, no CQ, one VI
    #[command(alias = "pingpong")]
    Base,
    /// Address translation: a different buffer (pre-registered pool) for a share of the messages
    At {
        /// Reuse percentages
        #[arg(long, value_delimiter = ',', default_values_t = [0u32, 25, 50, 75, 100])]
        reuse: Vec<u32>,
        /// Buffers in the pool (capped at 256 MiB in all)
        #[arg(long, default_value_t = 2048)]
        pool: usize,
    },
    /// Multiple data segments per descriptor
    Mds {
        #[arg(long, value_delimiter = ',', default_values_t = [1usize, 2, 4, 8, 16])]
        segs: Vec<usize>,
    },
    /// Completions through a CQ (receives, or sends and receives)
    Cq,
    /// Multiple VIs: n created, one or all active
    Mvis {
        #[arg(long, value_delimiter = ',', default_values_t = [1usize, 16, 128, 1024])]
        vis: Vec<usize>,
        #[arg(long, value_enum, default_value = "both")]
        active: Active,
    },
    /// Asynchronous: the server answers while it computes
    Async {
        #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Notify::Event, Notify::Thread, Notify::Poll, Notify::Timer])]
        notify: Vec<Notify>,
    },
    /// RDMA write, write with immediate data, read
    Rdma {
        #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Op::Write, Op::WriteImm, Op::Read])]
        op: Vec<Op>,
    },
    /// MaxTransferSize: messages above it go as several descriptors
    Mts {
        #[arg(long, value_delimiter = ',', value_parser = parse_size, default_values_t = [4 * KIB, 16 * KIB, 64 * KIB, 256 * KIB, MIB])]
        mts: Vec<usize>,
    },
    /// Each reliability level
    Rl {
        #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Rel::U, Rel::Rd, Rel::Rr])]
        levels: Vec<Rel>,
    },
    /// Sender pipeline depth (streaming bandwidth)
    Spl {
        #[arg(long, value_delimiter = ',', default_values_t = [1usize, 2, 4, 8, 16, 32, 64, 128])]
        depth: Vec<usize>,
    },
    /// Message rate: small messages streamed 64 deep
    Rate,
    /// Client/server: transactions, multi-threaded server
    Cs {
        #[command(subcommand)]
        what: Cs,
    },
}

#[derive(Subcommand, Clone)]
enum Cs {
    /// Request/reply transactions per second: fixed request, reply swept over --sizes
    Txn {
        #[arg(long, value_parser = parse_size, default_value = "64")]
        req: usize,
    },
    /// A multi-threaded server (master/worker, worker pool) with several clients
    Server {
        #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Model::Master, Model::Pool])]
        model: Vec<Model>,
        #[arg(long, value_delimiter = ',', default_values_t = [1usize, 2, 4, 8])]
        clients: Vec<usize>,
        #[arg(long, default_value_t = 2)]
        workers: usize,
        /// Request and reply bytes
        #[arg(long, value_parser = parse_size, default_value = "64")]
        size: usize,
    },
}

#[derive(Subcommand, Clone)]
enum Alt {
    /// Central send queue vs per-VI doorbells, 1..1,024 active VIs (VIA_DOORBELL)
    Doorbell {
        #[arg(long, value_delimiter = ',', default_values_t = [1usize, 4, 16, 64, 256, 1024])]
        vis: Vec<usize>,
    },
    /// CQ1 entry ring vs CQ2 work-queue scan, 1..64 queues per CQ: the break-even (VIA_CQ)
    Cq {
        #[arg(long, value_delimiter = ',', default_values_t = [1usize, 2, 4, 8, 12, 16, 20, 24, 32, 48, 64])]
        queues: Vec<usize>,
    },
    /// Inline payload threshold 0..256 B (VIA_INLINE): PIO vs DMA
    Inline {
        #[arg(long, value_delimiter = ',', default_values_t = [0usize, 8, 16, 32, 64, 128, 256])]
        thresholds: Vec<usize>,
    },
    /// Fragment size of the sockets kind of NIC
    Fragment,
    /// Translation cache size and associativity against a recorded trace (VIA_TCACHE_*)
    Tcache {
        #[arg(long, default_value_t = 50)]
        reuse: u32,
        #[arg(long, default_value_t = 2048)]
        pool: usize,
        #[arg(long, value_delimiter = ',', default_values_t = [64usize, 128, 256, 512, 1024, 2048, 4096])]
        entries: Vec<usize>,
        #[arg(long, value_delimiter = ',', default_values_t = [1usize, 2, 8])]
        ways: Vec<usize>,
    },
    /// Notify by thread vs event wake-up vs polling vs a 10 ms timer
    Notify,
    /// Every alternative
    All,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum NdWhat {
    Vi,
    Conn,
    Mem,
    Cq,
    All,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Active {
    One,
    All,
    Both,
}

#[derive(Args, Clone)]
struct RegArgs {
    #[arg(long, hide = true)]
    inner: bool,
    /// Bytes (regbig)
    #[arg(long, value_parser = parse_size)]
    size: Option<usize>,
}

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    let c = cli.common;
    match cli.cmd.unwrap_or(Cmd::Report) {
        Cmd::Point { spec, host, disc } => {
            let spec: xfer::Spec = serde_json::from_str(&spec).expect("a spec");
            let peer = match (host, disc) {
                (Some(h), Some(d)) => xfer::Peer::Remote(h, d),
                _ => xfer::Peer::Local,
            };
            let m = xfer::run_point(spec, &peer);
            println!("{}", serde_json::to_string(&m).unwrap());
        }
        Cmd::Server {
            disc,
            count,
            ready,
            cpu,
        } => {
            let cpu = if c.no_pin { None } else { cpu };
            xfer::server(&c.device, &disc, count, ready, cpu)
        }
        Cmd::Serve { args } => serve(&args),
        Cmd::Loopback { rounds } => loopback(rounds.unwrap_or(100_000)),
        Cmd::Sink => syscost::sink(),
        Cmd::RawVerbs { role, cpu } => {
            let iters = c.iters.unwrap_or(1).clamp(1, u64::from(u32::MAX)) as u32;
            verbs::raw_side(&c.device, role == "initiator", iters, cpu)
        }
        Cmd::Tcp { cpu, bind } => compare::tcp_server(cpu, bind.as_deref()),
        Cmd::TcpClient {
            connect,
            lens,
            budget_ms,
        } => compare::tcp_client(&connect, &lens, budget_ms),
        Cmd::Reg(a) => run_reg("reg", &c, a),
        Cmd::Regpp(a) => run_reg("regpp", &c, a),
        Cmd::Regcost(a) => run_reg("regcost", &c, a),
        Cmd::Regscale(a) => run_reg("regscale", &c, a),
        Cmd::Reuse(a) => run_reg("reuse", &c, a),
        Cmd::Regbig(a) => run_reg("regbig", &c, a),
        Cmd::Report => {
            let mut ctx = start(c, Remote::Local, "report");
            let reps = ctx.c.reps.unwrap_or(if ctx.c.quick { 3 } else { 5 });
            compare::compare(&mut ctx, reps, false);
            suite::finish(
                ctx,
                "VIA against the floor and memcpy",
                Some("via-bench.json"),
            );
        }
        Cmd::Compare => {
            let mut ctx = start(c, Remote::Local, "compare");
            let reps = ctx.c.reps.unwrap_or(3);
            compare::compare(&mut ctx, reps, true);
            suite::finish(ctx, "VIA against other stacks", None);
        }
        Cmd::Suite => {
            let mut ctx = start(c, Remote::Local, "suite");
            suite::suite(&mut ctx);
            suite::finish(ctx, "VIBe suite", None);
        }
        Cmd::Nd { what } => {
            let mut ctx = start(c, Remote::Local, "nd");
            let has = |w: NdWhat| what.contains(&w) || what.contains(&NdWhat::All);
            suite::nd(
                &mut ctx,
                has(NdWhat::Vi),
                has(NdWhat::Conn),
                has(NdWhat::Mem),
                has(NdWhat::Cq),
            );
            suite::finish(ctx, "non-data-transfer", None);
        }
        Cmd::Bench(b) => {
            let mut ctx = start(c, Remote::Local, "bench");
            run_bench(&mut ctx, &b);
            suite::finish(ctx, "via-bench", None);
        }
        Cmd::Client { host, disc, bench } => {
            let mut ctx = start(c, Remote::Host { host, disc }, "client");
            run_bench(&mut ctx, &bench);
            suite::finish(ctx, "via-bench (client)", None);
        }
        Cmd::Alt { what } => {
            let mut ctx = start(c, Remote::Local, "alt");
            let q = ctx.c.quick;
            let all = matches!(what, Alt::All);
            if let Alt::Doorbell { vis } = &what {
                suite::alt_doorbell(&mut ctx, vis);
            } else if all {
                suite::alt_doorbell(
                    &mut ctx,
                    if q {
                        &[1, 16]
                    } else {
                        &[1, 4, 16, 64, 256, 1024]
                    },
                );
            }
            if let Alt::Cq { queues } = &what {
                suite::alt_cq(&mut ctx, queues);
            } else if all {
                suite::alt_cq(
                    &mut ctx,
                    if q {
                        &[1, 16, 64]
                    } else {
                        &[1, 2, 4, 8, 12, 16, 20, 24, 32, 48, 64]
                    },
                );
            }
            if let Alt::Inline { thresholds } = &what {
                suite::alt_inline(&mut ctx, thresholds);
            } else if all {
                suite::alt_inline(
                    &mut ctx,
                    if q {
                        &[0, 64, 128]
                    } else {
                        &[0, 8, 16, 32, 64, 128, 256]
                    },
                );
            }
            if matches!(what, Alt::Fragment) || all {
                suite::alt_fragment(&mut ctx);
            }
            if let Alt::Tcache {
                reuse,
                pool,
                entries,
                ways,
            } = &what
            {
                suite::alt_tcache(&mut ctx, *reuse, *pool, entries, ways);
            } else if all {
                let e: &[usize] = if q {
                    &[128, 1024]
                } else {
                    &[64, 128, 256, 512, 1024, 2048, 4096]
                };
                suite::alt_tcache(&mut ctx, 50, if q { 256 } else { 2048 }, e, &[1, 2, 8]);
            }
            if matches!(what, Alt::Notify) || all {
                suite::alt_notify(&mut ctx);
            }
            suite::finish(ctx, "design alternatives", None);
        }
        Cmd::Verbs => {
            let mut ctx = start(c, Remote::Local, "verbs");
            if ctx.device_kind != "verbs" {
                eprintln!(
                    "via-bench verbs: device {:?} is of the {} kind: name an RDMA device (--device rxe0, mlx5_0, verbs)",
                    ctx.c.device, ctx.device_kind
                );
                std::process::exit(2);
            }
            let reps = ctx.c.reps.unwrap_or(3);
            verbs::verbs(&mut ctx, reps);
            suite::finish(ctx, "VIA against raw verbs", None);
        }
        Cmd::SysCosts => {
            let mut ctx = start(c, Remote::Local, "sys-costs");
            syscost::sys_costs(&mut ctx);
            suite::finish(ctx, "system costs", None);
        }
    }
}

/// Checks the device, then the context of an orchestrating command.
fn start(c: Common, remote: Remote, what: &str) -> Ctx {
    // The device is opened here once: to refuse a bad one before anything
    // runs (locally; a client's points report their own errors), and to
    // name its kind in the results.
    let kind = match xfer::open_nic(&c.device) {
        Ok(nic) => Some(nic.kind()),
        Err(e) if matches!(remote, Remote::Local) => {
            eprintln!("via-bench {what}: {e}");
            std::process::exit(2);
        }
        Err(_) => None,
    };
    let mut ctx = Ctx::new(c, remote);
    if let Some(k) = kind {
        ctx.device_kind = match k {
            "soft" => "shared-memory",
            k => k,
        };
    }
    ctx
}

fn run_bench(ctx: &mut Ctx, b: &Bench) {
    match b {
        Bench::Base => suite::base(ctx),
        Bench::At { reuse, pool } => suite::at(ctx, reuse, *pool),
        Bench::Mds { segs } => suite::mds(ctx, segs),
        Bench::Cq => suite::cq(ctx),
        Bench::Mvis { vis, active } => {
            suite::mvis(ctx, vis, *active != Active::All, *active != Active::One)
        }
        Bench::Async { notify } => suite::async_(ctx, notify, "async"),
        Bench::Rdma { op } => suite::rdma(ctx, op),
        Bench::Mts { mts } => suite::mts(ctx, mts),
        Bench::Rl { levels } => suite::rl(ctx, levels),
        Bench::Spl { depth } => suite::spl(ctx, depth, "spl"),
        Bench::Rate => suite::rate(ctx),
        Bench::Cs {
            what: Cs::Txn { req },
        } => suite::txn(ctx, *req),
        Bench::Cs {
            what:
                Cs::Server {
                    model,
                    clients,
                    workers,
                    size,
                },
        } => suite::threads(ctx, model, clients, *workers, *size),
    }
}

fn run_reg(cmd: &str, c: &Common, a: RegArgs) {
    reg::main(
        cmd,
        reg::RegOpts {
            quick: c.quick,
            inner: a.inner,
            json: c.json.clone(),
            size: a.size,
        },
    )
}

// ---------------------------------------------------------------- shared helpers of reg.rs

fn write_json(path: &str, v: serde_json::Value) {
    match std::fs::write(path, serde_json::to_string_pretty(&v).unwrap()) {
        Ok(()) => println!("JSON: {path}"),
        Err(e) => eprintln!("cannot write {path}: {e}"),
    }
}

fn pin(cpu: usize) {
    if std::env::var_os("VIA_BENCH_NOPIN").is_none() {
        xfer::pin(Some(cpu));
    }
}

/// `via-bench serve shm <pid> <fd> <iters>` | `serve shmcopy <pid> <fd> <iters> <size>` | `serve regpp <disc> <max> <each|fixed>`
fn serve(args: &[String]) {
    match args.first().map(String::as_str) {
        Some(role @ ("shm" | "shmvia")) => {
            if let Some(c) = args.get(4).and_then(|c| c.parse().ok()) {
                xfer::pin(Some(c));
            }
            serve_shm(
                role == "shmvia",
                args[1].parse().unwrap(),
                args[2].parse().unwrap(),
                args[3].parse().unwrap(),
            )
        }
        Some("shmcopy") => {
            if let Some(c) = args.get(5).and_then(|c| c.parse().ok()) {
                xfer::pin(Some(c));
            }
            serve_copy(
                args[1].parse().unwrap(),
                args[2].parse().unwrap(),
                args[3].parse().unwrap(),
                args[4].parse().unwrap(),
            )
        }
        Some("regpp") => {
            pin(1);
            reg::serve_regpp(&args[1], args[2].parse().unwrap(), args[3] == "each")
        }
        _ => {
            eprintln!("via-bench serve: unknown role {args:?}");
            std::process::exit(2)
        }
    }
}

fn done_or_wait(vi: &Vi, recv: bool, block: bool) -> u32 {
    let r = if block {
        if recv {
            vi.recv_wait(Some(Duration::from_secs(30)))
        } else {
            vi.send_wait(Some(Duration::from_secs(30)))
        }
    } else {
        let mut spin = xfer::Spin::new(65536);
        loop {
            match if recv { vi.recv_done() } else { vi.send_done() } {
                Err(e) if e.kind() == via::ErrorKind::NotDone => spin.failed("no completion"),
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

/// A shared mapping of `len` bytes, prepared by `init`, and the server
/// process that maps it too: `via-bench serve <role> <pid> <fd> <iters>
/// [extra...] [cpu]` ([`open_shared`] on its side).
fn shm_server(
    role: &str,
    len: usize,
    iters: u64,
    extra: &[String],
    cpu: Option<usize>,
    init: impl FnOnce(&Mapping),
) -> (Mapping, Child) {
    let (fd, map) = Mapping::create(&format!("via-bench-{role}"), len).expect("memfd");
    let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
    via::sys::clear_cloexec(raw).ok();
    init(&map);
    let mut args = vec![
        role.to_string(),
        std::process::id().to_string(),
        raw.to_string(),
        iters.to_string(),
    ];
    args.extend_from_slice(extra);
    args.extend(cpu.map(|c| c.to_string()));
    // The server has mapped it once it says READY: the fd may close after.
    let child = Child::start(&args);
    (map, child)
}

/// The server's side of [`shm_server`]: the client's mapping of `len`
/// bytes, through its fd `fd`.
fn open_shared(pid: u32, fd: i32, len: usize) -> Mapping {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/{pid}/fd/{fd}"))
        .expect("open the shared mapping");
    Mapping::map_shared(&std::os::fd::OwnedFd::from(f), 0, len).unwrap()
}

fn serve_shm(via_shaped: bool, pid: u32, fd: i32, iters: u64) {
    let map = open_shared(pid, fd, 4096);
    let ping = map.view::<AtomicU64>(0).unwrap();
    let ping_data = map.view::<AtomicU64>(8).unwrap();
    let pong = map.view::<AtomicU64>(128).unwrap();
    let pong_data = map.view::<AtomicU64>(136).unwrap();
    println!("READY");
    std::io::stdout().flush().unwrap();
    if via_shaped {
        let (from, to) = (via_lines(&map, 0), via_lines(&map, 1));
        for i in 1..=iters {
            let v = via_lines_recv(from, i);
            via_lines_send(to, i, v);
        }
        return;
    }
    for i in 1..=iters {
        // Acquire/Release: the payload word travels with the sequence word.
        while ping.load(Ordering::Acquire) != i {
            std::hint::spin_loop();
        }
        pong_data.store(ping_data.load(Ordering::Relaxed), Ordering::Relaxed);
        pong.store(i, Ordering::Release);
    }
}

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

fn unique(tag: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "bench-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// The floor: a bare shared-memory ping-pong of one 8-byte word between
/// two processes; mean half round trip, microseconds.
pub fn shm_floor(iters: u64, cpus: (Option<usize>, Option<usize>)) -> f64 {
    shm_pingpong("shm", iters, cpus)
}

/// A bare ping-pong with the cache-line pattern a VIA send cannot avoid
/// on shared memory: the sender reads the line where the receiver posted
/// its receive, stores the payload into the receive buffer and the status
/// into the receive descriptor (three lines), and the receiver, seeing the
/// status, reads the payload and posts its next receive. No library code:
/// the lower bound of VIA's semantics here, beside the one-line floor.
pub fn shm_floor_via_lines(iters: u64, cpus: (Option<usize>, Option<usize>)) -> f64 {
    shm_pingpong("shmvia", iters, cpus)
}

/// The bandwidth floor of a ping-pong of `size` bytes: two processes, two
/// page-aligned buffers in one shared mapping (the client's and the
/// server's, as a VIA ping-pong's), and per message one copy from the
/// sender's buffer into the receiver's, then a flag. No library code: what
/// the cores and caches of this host give a one-copy ping-pong, against
/// which `memcpy` in one core's cache is no bound. Bytes of one direction
/// per half round trip, 10^6 bytes/s (as `VIA ping-pong`).
pub fn shm_copy_pingpong(size: usize, iters: u64, (a, b): (Option<usize>, Option<usize>)) -> f64 {
    xfer::pin(a);
    let (mine, theirs) = (PAGE, PAGE + copy_span(size));
    let (map, child) = shm_server(
        "shmcopy",
        copy_layout(size),
        iters,
        &[size.to_string()],
        b,
        |m| assert!(m.write(mine, &vec![0xa5; size])),
    );
    let ping = map.view::<AtomicU64>(0).unwrap();
    let pong = map.view::<AtomicU64>(128).unwrap();
    let warm = iters / 10;
    let mut t0 = Instant::now();
    for i in 1..=iters {
        if i == warm + 1 {
            t0 = Instant::now();
        }
        assert!(Mapping::copy(&map, mine, &map, theirs, size));
        // Release/Acquire: the bytes travel with the sequence word.
        ping.store(i, Ordering::Release);
        while pong.load(Ordering::Acquire) != i {
            std::hint::spin_loop();
        }
    }
    let total = t0.elapsed();
    child.finish();
    let mut last = [0u8; 1];
    assert!(map.read(theirs + size.max(1) - 1, &mut last));
    assert!(size == 0 || last[0] == 0xa5, "copy check");
    let half_us = total.as_secs_f64() * 1e6 / (iters - warm) as f64 / 2.0;
    size as f64 / half_us
}

const PAGE: usize = 4096;

/// Bytes of one buffer of the copy ping-pong, whole pages.
fn copy_span(size: usize) -> usize {
    size.max(1).div_ceil(PAGE) * PAGE
}

/// Bytes of the copy ping-pong's mapping: a page of flags, two buffers.
fn copy_layout(size: usize) -> usize {
    PAGE + 2 * copy_span(size)
}

/// The server of [`shm_copy_pingpong`].
fn serve_copy(pid: u32, fd: i32, iters: u64, size: usize) {
    let map = open_shared(pid, fd, copy_layout(size));
    let (theirs, mine) = (PAGE, PAGE + copy_span(size));
    let ping = map.view::<AtomicU64>(0).unwrap();
    let pong = map.view::<AtomicU64>(128).unwrap();
    println!("READY");
    std::io::stdout().flush().unwrap();
    for i in 1..=iters {
        while ping.load(Ordering::Acquire) != i {
            std::hint::spin_loop();
        }
        assert!(Mapping::copy(&map, mine, &map, theirs, size));
        pong.store(i, Ordering::Release);
    }
}

/// Lines of the VIA-shaped floor, 256 bytes apart (no adjacent-line
/// prefetch between them): direction `d` (0: to the server, 1: back).
fn via_lines(map: &Mapping, d: usize) -> [&AtomicU64; 3] {
    let base = 1024 + d * 768;
    [0, 256, 512].map(|o| map.view::<AtomicU64>(base + o).unwrap())
}

/// One direction of the VIA-shaped floor: wait for the posted receive
/// `i`, store payload and status.
fn via_lines_send(l: [&AtomicU64; 3], i: u64, payload: u64) {
    let [slot, data, status] = l;
    while slot.load(Ordering::Acquire) < i {
        std::hint::spin_loop();
    }
    data.store(payload, Ordering::Relaxed);
    status.store(i, Ordering::Release);
}

/// The other: wait for status `i`, read the payload, post receive `i + 1`.
fn via_lines_recv(l: [&AtomicU64; 3], i: u64) -> u64 {
    let [slot, data, status] = l;
    while status.load(Ordering::Acquire) != i {
        std::hint::spin_loop();
    }
    let v = data.load(Ordering::Relaxed);
    slot.store(i + 1, Ordering::Release);
    v
}

fn shm_pingpong(role: &str, iters: u64, (a, b): (Option<usize>, Option<usize>)) -> f64 {
    xfer::pin(a);
    let (map, child) = shm_server(role, 4096, iters, &[], b, |m| {
        if role == "shmvia" {
            // Receive 1 is posted in both directions before the first round.
            via_lines(m, 0)[0].store(1, Ordering::Relaxed);
            via_lines(m, 1)[0].store(1, Ordering::Relaxed);
        }
    });
    let ping = map.view::<AtomicU64>(0).unwrap();
    let ping_data = map.view::<AtomicU64>(8).unwrap();
    let pong = map.view::<AtomicU64>(128).unwrap();
    let pong_data = map.view::<AtomicU64>(136).unwrap();
    let (to, from) = (via_lines(&map, 0), via_lines(&map, 1));
    let mut sum = 0u64;
    let warm = iters / 10;
    let mut t0 = Instant::now();
    for i in 1..=iters {
        if i == warm + 1 {
            t0 = Instant::now();
        }
        if role == "shmvia" {
            via_lines_send(to, i, i * 3);
            sum = sum.wrapping_add(via_lines_recv(from, i));
            continue;
        }
        ping_data.store(i * 3, Ordering::Relaxed);
        ping.store(i, Ordering::Release);
        while pong.load(Ordering::Acquire) != i {
            std::hint::spin_loop();
        }
        sum = sum.wrapping_add(pong_data.load(Ordering::Relaxed));
    }
    let total = t0.elapsed();
    assert_eq!(
        sum,
        (1..=iters).map(|i| i * 3).sum::<u64>(),
        "payload check"
    );
    child.finish();
    total.as_secs_f64() * 1e6 / (iters - warm) as f64 / 2.0
}

/// `memcpy` bandwidth (10^6 bytes/s) of `size` bytes in this process,
/// between page-aligned buffers as VIA's are (on AMD Zen with FSRM, glibc's
/// `rep movsb` copies 16-byte-misaligned destinations at about a tenth of
/// the speed: 3 GB/s instead of 30-90 at 4 KiB..256 KiB on this machine).
pub fn memcpy_mbps(size: usize, iters: usize, cpu: Option<usize>) -> f64 {
    xfer::pin(cpu);
    let n = size.max(1);
    let a = vec![1u8; n + 4096];
    let mut b = vec![2u8; n + 4096];
    let (ao, bo) = (a.as_ptr().align_offset(4096), b.as_ptr().align_offset(4096));
    let src = &a[ao..ao + n];
    for _ in 0..iters.min(10) {
        b[bo..bo + n].copy_from_slice(src);
    }
    let t0 = Instant::now();
    for _ in 0..iters {
        b[bo..bo + n].copy_from_slice(std::hint::black_box(src));
        std::hint::black_box(&mut b);
    }
    (size * iters) as f64 / t0.elapsed().as_secs_f64() / 1e6
}

/// One process, two connected VIs, one thread: the cost of the calls
/// without any cross-core traffic (`via-bench loopback [iters]`).
fn loopback(iters: usize) {
    let nic = xfer::open_nic("via_lo").expect("NIC");
    let ptag = nic.create_ptag().unwrap();
    let mem_a = Region::new(&nic, 1 << 20, ptag, false, false).unwrap();
    let mem_b = Region::new(&nic, 1 << 20, ptag, false, false).unwrap();
    let attrs = ViAttributes::new(Reliability::ReliableDelivery, ptag);
    let vi_a = nic.create_vi(&attrs, None, None).unwrap();
    let vi_b = nic.create_vi(&attrs, None, None).unwrap();
    let disc = unique("lo");
    std::thread::scope(|sc| {
        let h = sc.spawn(|| {
            let req = nic
                .connect_wait(&nic.address(disc.as_bytes()), Some(Duration::from_secs(10)))
                .unwrap();
            req.accept(&vi_b).unwrap();
        });
        vi_a.connect(
            &nic.address(b"c"),
            &nic.address(disc.as_bytes()),
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
        .segment(&mem_a, 4096, 8)
        .write(&mem_a, 0)
        .unwrap();
    let mut t = [Duration::ZERO; 4];
    for i in 0..iters + 1000 {
        let t0 = Instant::now();
        vi_b.post_recv(&mem_b, rd).unwrap();
        let t1 = Instant::now();
        vi_a.post_send(&mem_a, sd).unwrap();
        let t2 = Instant::now();
        vi_b.recv_done().unwrap();
        let t3 = Instant::now();
        vi_a.send_done().unwrap();
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
