//! `vmpi-bench`: vmpi against Open MPI (ob1/vader) on this host, from the
//! same benchmark C source (`vmpi/bench/mpibench.c`) built once with
//! `vmpicc` and once with Open MPI's `mpicc`, measured in the same run
//! (rounds alternate between the two; the median of the rounds is kept).
//! Prints a table and writes JSON (`vmpi-bench.json`).
//!
//! ```text
//! cargo build --release -p vmpi -p vmpi-capi -p via-tools && target/release/vmpi-bench
//! target/release/vmpi-bench k        # k of the k-nomial trees: model vs measured
//! target/release/vmpi-bench algos    # allreduce: each algorithm by size
//! target/release/vmpi-bench eager    # ping-pong across the eager limit
//! ```
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use clap::Parser;
use serde_json::json;

/// vmpi against Open MPI, same source, same run.
#[derive(Parser, Debug)]
#[command(name = "vmpi-bench")]
struct Args {
    /// `all` (default), `k`, `algos`, `eager`.
    #[arg(default_value = "all")]
    what: String,
    /// Rounds per configuration (median kept).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Process counts.
    #[arg(long, value_delimiter = ',', default_value = "2,4,8")]
    np: Vec<u32>,
    /// JSON output file.
    #[arg(long, default_value = "vmpi-bench.json")]
    json: PathBuf,
}

/// (test, np, bytes) → microseconds per operation.
type Results = BTreeMap<(String, u32, u64), Vec<f64>>;

struct Setup {
    bin_dir: PathBuf,
    vmpi: PathBuf,
    ompi: Option<PathBuf>,
}

fn exe_dir() -> PathBuf {
    std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf()
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn build() -> Setup {
    let bin_dir = exe_dir();
    let out = bin_dir.join("vmpi-bench-programs");
    std::fs::create_dir_all(&out).unwrap();
    let src = root().join("vmpi/bench/mpibench.c");
    let vmpi = out.join("mpibench-vmpi");
    let st = Command::new(root().join("vmpi/vmpicc"))
        .env("VMPI_LIBDIR", &bin_dir)
        .args(["-O2", "-o"])
        .arg(&vmpi)
        .arg(&src)
        .status()
        .expect("vmpicc");
    assert!(
        st.success(),
        "vmpicc failed (build libvmpi first: cargo build --release -p vmpi-capi)"
    );
    let ompi = out.join("mpibench-ompi");
    let has_ompi = Command::new("mpicc")
        .args(["-O2", "-o"])
        .arg(&ompi)
        .arg(&src)
        .status()
        .is_ok_and(|s| s.success());
    if !has_ompi {
        eprintln!(
            "vmpi-bench: Open MPI's mpicc not found (apt-get install openmpi-bin libopenmpi-dev): vmpi only"
        );
    }
    Setup {
        bin_dir,
        vmpi,
        ompi: has_ompi.then_some(ompi),
    }
}

fn parse(out: &str, into: &mut Results) {
    for l in out.lines() {
        let w: Vec<&str> = l.split_whitespace().collect();
        if w.len() == 5 && w[0] == "RESULT" {
            if let (Ok(np), Ok(b), Ok(us)) = (w[2].parse(), w[3].parse(), w[4].parse()) {
                into.entry((w[1].to_string(), np, b)).or_default().push(us);
            }
        }
    }
}

fn run_vmpi(s: &Setup, np: u32, env: &[(&str, String)], tests: &[&str], into: &mut Results) {
    let mut c = Command::new(s.bin_dir.join("via-run"));
    c.args(["-n", &np.to_string()]);
    for (k, v) in env {
        c.env(k, v);
    }
    c.env("VIA_INSTANCE", format!("vmpi-bench-{}", std::process::id()));
    let out = c.arg(&s.vmpi).args(tests).output().expect("via-run");
    if !out.status.success() {
        eprintln!("vmpi run failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    parse(&String::from_utf8_lossy(&out.stdout), into);
}

fn run_ompi(s: &Setup, np: u32, tests: &[&str], into: &mut Results) {
    let Some(bin) = &s.ompi else { return };
    let out = Command::new("mpirun")
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .args([
            "-np",
            &np.to_string(),
            "--oversubscribe",
            "--mca",
            "pml",
            "ob1",
            "--mca",
            "btl",
            "self,vader",
        ])
        .arg(bin)
        .args(tests)
        .output()
        .expect("mpirun");
    if !out.status.success() {
        eprintln!(
            "Open MPI run failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    parse(&String::from_utf8_lossy(&out.stdout), into);
}

fn median(v: &[f64]) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    (!v.is_empty()).then(|| v[v.len() / 2])
}

fn fmt(x: Option<f64>) -> String {
    x.map_or("-".into(), |v| {
        if v >= 100.0 {
            format!("{v:.0}")
        } else {
            format!("{v:.2}")
        }
    })
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    Some(a? / b?)
}

fn main_all(a: &Args, s: &Setup) -> serde_json::Value {
    let (mut host, mut tree, mut off, mut ompi) = (
        Results::new(),
        Results::new(),
        Results::new(),
        Results::new(),
    );
    for round in 0..a.rounds {
        for &np in &a.np {
            let mut tests = vec!["barrier", "bcast", "allreduce"];
            if np == 2 {
                tests.splice(0..0, ["pingpong", "bw"]);
            }
            eprintln!("round {} np {np}", round + 1);
            run_vmpi(s, np, &[], &tests, &mut host);
            run_ompi(s, np, &tests, &mut ompi);
            run_vmpi(
                s,
                np,
                &[
                    ("VMPI_BARRIER", "tree".into()),
                    ("VMPI_BCAST", "binomial".into()),
                ],
                &["barrier", "bcast"],
                &mut tree,
            );
            run_vmpi(
                s,
                np,
                &[("VMPI_COLL", "offload".into())],
                &["barrier", "bcast"],
                &mut off,
            );
        }
    }
    println!(
        "{:<10} {:>3} {:>8} | {:>9} {:>9} {:>7} | {:>9} {:>9} {:>8}",
        "test", "np", "bytes", "vmpi us", "OMPI us", "v/OMPI", "tree us", "offl us", "off/tree"
    );
    let mut rows = Vec::new();
    for (key, v) in &host {
        let h = median(v);
        let o = ompi.get(key).and_then(|v| median(v));
        let t = tree.get(key).and_then(|v| median(v));
        let f = off.get(key).and_then(|v| median(v));
        let (test, np, bytes) = key;
        let (shown_h, shown_o) = if test == "bw" {
            // MB/s for the bandwidth line.
            (
                h.map(|us| *bytes as f64 / us),
                o.map(|us| *bytes as f64 / us),
            )
        } else {
            (h, o)
        };
        println!(
            "{:<10} {:>3} {:>8} | {:>9} {:>9} {:>7} | {:>9} {:>9} {:>8}",
            if test == "bw" { "bw MB/s" } else { test },
            np,
            bytes,
            fmt(shown_h),
            fmt(shown_o),
            fmt(ratio(h, o)),
            fmt(t),
            fmt(f),
            fmt(ratio(f, t))
        );
        rows.push(json!({
            "test": test, "np": np, "bytes": bytes,
            "vmpi_us": h, "ompi_us": o, "vmpi_over_ompi": ratio(h, o),
            "vmpi_tree_us": t, "vmpi_offload_us": f, "offload_over_tree": ratio(f, t),
            "rounds": v.len(),
        }));
    }
    println!(
        "(us per operation, median of {} rounds; v/OMPI > 1: vmpi slower; bw: MB/s, ratio of times)",
        a.rounds
    );
    json!({ "results": rows })
}

fn main_k(a: &Args, s: &Setup) -> serde_json::Value {
    let model = vmpi::coll::model::Model::from_env();
    let mut rows = Vec::new();
    println!(
        "{:<7} {:>3} {:>6} | us per k = 2..8 | best measured | model's k",
        "op", "np", "bytes"
    );
    for &np in &a.np {
        for (op, var) in [("bcast", "VMPI_BCAST"), ("reduce", "VMPI_REDUCE")] {
            let mut by_k: BTreeMap<u32, Results> = BTreeMap::new();
            for _ in 0..a.rounds {
                for k in 2..=8u32.min(np.max(2)) {
                    let env = [(var, "knomial".to_string()), ("VMPI_K", k.to_string())];
                    run_vmpi(s, np, &env, &[op], by_k.entry(k).or_default());
                }
            }
            for bytes in [8u64, 512, 4096] {
                let key = (op.to_string(), np, bytes);
                let t: Vec<(u32, Option<f64>)> = by_k
                    .iter()
                    .map(|(k, r)| (*k, r.get(&key).and_then(|v| median(v))))
                    .collect();
                let best = t
                    .iter()
                    .filter_map(|(k, v)| v.map(|v| (*k, v)))
                    .min_by(|x, y| x.1.total_cmp(&y.1));
                let mk = if op == "bcast" {
                    model.best_k_bcast(np, bytes as f64)
                } else {
                    model.best_k_reduce(np, bytes as f64)
                };
                println!(
                    "{op:<7} {np:>3} {bytes:>6} | {} | {:?} | {mk}",
                    t.iter().map(|(_, v)| fmt(*v)).collect::<Vec<_>>().join(" "),
                    best.map(|b| b.0)
                );
                rows.push(json!({"op": op, "np": np, "bytes": bytes,
                    "us_by_k": t.iter().map(|(k, v)| json!({"k": k, "us": v})).collect::<Vec<_>>(),
                    "best_k": best.map(|b| b.0), "model_k": mk}));
            }
        }
    }
    json!({ "k": rows })
}

fn main_algos(a: &Args, s: &Setup) -> serde_json::Value {
    let algos = ["recursive_doubling", "rabenseifner", "ring", "reduce_bcast"];
    let mut rows = Vec::new();
    for &np in &a.np {
        let mut by: BTreeMap<&str, Results> = BTreeMap::new();
        for _ in 0..a.rounds {
            for al in algos {
                run_vmpi(
                    s,
                    np,
                    &[("VMPI_ALLREDUCE", al.to_string())],
                    &["allreduce"],
                    by.entry(al).or_default(),
                );
            }
            run_vmpi(
                s,
                np,
                &[],
                &["allreduce"],
                by.entry("selected").or_default(),
            );
        }
        println!("allreduce np {np}: us per algorithm");
        println!(
            "{:>8} {}",
            "bytes",
            by.keys().map(|k| format!("{k:>19}")).collect::<String>()
        );
        let sizes: Vec<u64> = by["selected"].keys().map(|k| k.2).collect();
        for b in sizes {
            let key = ("allreduce".to_string(), np, b);
            let t: Vec<(String, Option<f64>)> = by
                .iter()
                .map(|(k, r)| (k.to_string(), r.get(&key).and_then(|v| median(v))))
                .collect();
            println!(
                "{b:>8} {}",
                t.iter()
                    .map(|(_, v)| format!("{:>19}", fmt(*v)))
                    .collect::<String>()
            );
            rows.push(json!({"np": np, "bytes": b, "us": t.iter().map(|(k, v)| json!({"algorithm": k, "us": v})).collect::<Vec<_>>()}));
        }
    }
    json!({ "algos": rows })
}

fn main_eager(a: &Args, s: &Setup) -> serde_json::Value {
    let mut rows = Vec::new();
    let limits = [4096usize, 16384, 65536];
    let mut by: BTreeMap<usize, Results> = BTreeMap::new();
    let mut om = Results::new();
    for _ in 0..a.rounds {
        for l in limits {
            run_vmpi(
                s,
                2,
                &[("VMPI_EAGER_LIMIT", l.to_string())],
                &["sweep"],
                by.entry(l).or_default(),
            );
        }
        run_ompi(s, 2, &["sweep"], &mut om);
    }
    println!("ping-pong half round trip (us) by eager limit; Open MPI");
    for b in by[&limits[0]].keys().map(|k| k.2).collect::<Vec<_>>() {
        let key = ("pingpong".to_string(), 2, b);
        let t: Vec<Option<f64>> = limits
            .iter()
            .map(|l| by[l].get(&key).and_then(|v| median(v)))
            .collect();
        let o = om.get(&key).and_then(|v| median(v));
        println!(
            "{b:>8} {} | {}",
            t.iter()
                .map(|v| format!("{:>9}", fmt(*v)))
                .collect::<String>(),
            fmt(o)
        );
        rows.push(json!({"bytes": b, "us_by_limit": limits.iter().zip(&t).map(|(l, v)| json!({"limit": l, "us": v})).collect::<Vec<_>>(), "ompi_us": o}));
    }
    json!({ "eager": rows })
}

fn main() {
    let a = Args::parse();
    let s = build();
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let v = match a.what.as_str() {
        "k" => main_k(&a, &s),
        "algos" => main_algos(&a, &s),
        "eager" => main_eager(&a, &s),
        _ => main_all(&a, &s),
    };
    let doc = json!({
        "host": host.trim(), "cpus": std::thread::available_parallelism().map_or(1, |n| n.get()),
        "what": a.what, "rounds": a.rounds, "data": v,
        "baseline": if s.ompi.is_some() { "Open MPI (mpirun --mca pml ob1 --mca btl self,vader)" } else { "none" },
    });
    std::fs::write(&a.json, serde_json::to_string_pretty(&doc).unwrap()).unwrap();
    eprintln!("wrote {}", a.json.display());
}
