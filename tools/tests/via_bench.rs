//! Every via-bench benchmark in a tiny configuration, so that none can rot:
//! each runs as a real process (with its real server processes), and its
//! JSON and CSV are checked against the schema below, its SVG plot parsed
//! and its lines counted. No number is asserted beyond its type and sign.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_via-bench");

/// The CSV columns, in order (= the fields of a JSON row).
const COLUMNS: [&str; 18] = [
    "bench",
    "config",
    "bytes",
    "x",
    "x_name",
    "iters",
    "mean_us",
    "min_us",
    "median_us",
    "p99_us",
    "mbps",
    "cpu_pct",
    "rate",
    "ratio",
    "value",
    "unit",
    "status",
    "note",
];
const NUMERIC: [&str; 12] = [
    "bytes",
    "x",
    "iters",
    "mean_us",
    "min_us",
    "median_us",
    "p99_us",
    "mbps",
    "cpu_pct",
    "rate",
    "ratio",
    "value",
];
const STATUSES: [&str; 4] = ["ok", "not available", "not installed", "error"];

fn columns() -> Vec<&'static str> {
    COLUMNS.to_vec()
}

struct Run {
    dir: PathBuf,
    out: Output,
}

impl Run {
    fn json(&self) -> Value {
        let text = std::fs::read_to_string(self.dir.join("out.json")).expect("the JSON file");
        serde_json::from_str(&text).expect("JSON parses")
    }
}

/// A private viad instance for the whole test process (tests share it).
fn instance() -> String {
    format!("via-bench-test-{}", std::process::id())
}

fn run(name: &str, args: &[&str]) -> Run {
    run_in(None, name, args)
}

/// `run`, inside network namespace `netns` when given.
fn run_in(netns: Option<&str>, name: &str, args: &[&str]) -> Run {
    let dir = std::env::temp_dir().join(format!("via-bench-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let j = dir.join("out.json");
    let c = dir.join("out.csv");
    let p = dir.join("out.svg");
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, BIN]);
            c
        }
        None => Command::new(BIN),
    };
    let out = cmd
        .args(args)
        .args(["--quick", "--time-ms", "5"])
        .arg("--json")
        .arg(&j)
        .arg("--csv")
        .arg(&c)
        .arg("--plot")
        .arg(&p)
        // A namespace gets its own daemon: the daemon's socket is a path,
        // reachable from every namespace, but its TCP listeners are not.
        .env(
            "VIA_INSTANCE",
            match netns {
                Some(ns) => format!("{}-{ns}", instance()),
                None => instance(),
            },
        )
        .stdin(Stdio::null())
        .output()
        .expect("run via-bench");
    assert!(
        out.status.success(),
        "via-bench {args:?} failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let r = Run { dir, out };
    check(&r, args);
    r
}

fn is_num_or_null(v: &Value) -> bool {
    v.is_null() || v.as_f64().is_some_and(|x| x.is_finite())
}

/// The schema: the document's fields and types, every row's fields and
/// types, statuses, and the CSV mirroring the rows.
fn check(r: &Run, args: &[&str]) {
    let doc = r.json();
    let o = doc.as_object().expect("an object");
    let keys: BTreeSet<&str> = o.keys().map(String::as_str).collect();
    let want: BTreeSet<&str> = [
        "tool",
        "version",
        "command",
        "device",
        "device_kind",
        "pinning",
        "env",
        "started_unix",
        "rows",
        "summary",
    ]
    .into();
    assert_eq!(keys, want, "document fields");
    assert_eq!(doc["tool"], "via-bench");
    assert!(
        doc["version"].is_string() && doc["device"].is_string() && doc["device_kind"].is_string()
    );
    // The kind of the NIC measured, as it opened (not a fixed string).
    let want_kind = match doc["device"].as_str().unwrap() {
        d if d.starts_with("via_lo") || d.starts_with("/dev/via_lo") => "shared-memory",
        d if d.starts_with("via_") || d.starts_with("/dev/via_") => "sockets",
        _ => "verbs",
    };
    assert_eq!(doc["device_kind"], want_kind, "device_kind");
    assert!(
        doc["command"]
            .as_array()
            .unwrap()
            .iter()
            .all(Value::is_string)
    );
    let pin = doc["pinning"].as_object().expect("pinning");
    for k in ["client_cpu", "server_cpu", "cpus"] {
        assert!(pin[k].as_u64().is_some(), "pinning.{k}");
    }
    assert!(pin["pinned"].is_boolean());
    assert!(
        doc["env"]
            .as_object()
            .unwrap()
            .values()
            .all(Value::is_string)
    );
    assert!(doc["started_unix"].as_u64().is_some());
    assert!(doc["summary"].is_object());
    let rows = doc["rows"].as_array().expect("rows");
    assert!(!rows.is_empty(), "{args:?}: no rows");
    for row in rows {
        let ro = row.as_object().expect("a row object");
        let got: Vec<&str> = ro.keys().map(String::as_str).collect();
        let mut want = columns();
        want.sort();
        let mut g = got.clone();
        g.sort();
        assert_eq!(g, want, "row fields");
        for k in ["bench", "config", "x_name", "unit", "status", "note"] {
            assert!(row[k].is_string(), "{k} of {row}");
        }
        for k in NUMERIC {
            assert!(is_num_or_null(&row[k]), "{k} of {row}");
            if let Some(x) = row[k].as_f64() {
                assert!(x >= 0.0, "{k} negative in {row}");
            }
        }
        let st = row["status"].as_str().unwrap();
        assert!(STATUSES.contains(&st), "status {st}");
        // Only external baselines may be missing or fail (a tool of
        // another project that breaks is reported, not hidden); nothing of
        // this project may fail.
        let ours = ["VIA", "bare shared-memory", "memcpy", "TCP loopback"]
            .iter()
            .any(|p| row["config"].as_str().unwrap().starts_with(p));
        if st == "error" {
            assert!(
                row["bench"] == "compare" && !ours,
                "{args:?}: a failed measurement: {row}"
            );
        }
        if st == "ok" {
            assert!(
                NUMERIC[3..].iter().any(|k| row[*k].is_number()),
                "an ok row without a measurement: {row}"
            );
        } else {
            assert!(
                !row["note"].as_str().unwrap().is_empty(),
                "a row {st} without a reason"
            );
        }
    }
    // CSV: the header, then the same rows.
    let mut rd = csv::Reader::from_path(r.dir.join("out.csv")).expect("the CSV file");
    let header: Vec<String> = rd.headers().unwrap().iter().map(String::from).collect();
    assert_eq!(header, columns(), "CSV header");
    let recs: Vec<csv::StringRecord> = rd.records().map(|x| x.expect("a CSV record")).collect();
    assert_eq!(recs.len(), rows.len(), "CSV and JSON rows");
    for (rec, row) in recs.iter().zip(rows) {
        assert_eq!(&rec[0], row["bench"].as_str().unwrap());
        assert_eq!(&rec[1], row["config"].as_str().unwrap());
        for k in NUMERIC {
            let i = header.iter().position(|h| h == k).unwrap();
            let f = &rec[i];
            match row[k].as_f64() {
                None => assert!(f.is_empty(), "{k}: {f:?} for null"),
                Some(x) => {
                    let y: f64 = f.parse().expect("a number");
                    assert!((x - y).abs() <= 1e-9 * x.abs().max(1.0), "{k}: {x} vs {y}");
                }
            }
        }
    }
    check_svg(r, rows);
}

/// The lines the plot must have: one per configuration (bench + config)
/// with at least two ok points, in each of its two panels.
fn expected_lines(rows: &[Value]) -> usize {
    let mut lat: std::collections::BTreeMap<String, usize> = Default::default();
    let mut bw: std::collections::BTreeMap<String, usize> = Default::default();
    for r in rows.iter().filter(|r| r["status"] == "ok") {
        if !(r["bytes"].is_number() || r["x"].is_number()) {
            continue;
        }
        let key = format!("{} {}", r["bench"], r["config"]);
        let pos = |k: &str| r[k].as_f64().is_some_and(|x| x > 0.0);
        if pos("median_us")
            || (r["median_us"].is_null() && pos("mean_us"))
            || (r["median_us"].is_null() && r["mean_us"].is_null() && pos("value"))
        {
            *lat.entry(key.clone()).or_default() += 1;
        }
        if pos("mbps") || (r["mbps"].is_null() && pos("rate")) {
            *bw.entry(key).or_default() += 1;
        }
    }
    lat.values().filter(|&&n| n >= 2).count() + bw.values().filter(|&&n| n >= 2).count()
}

fn check_svg(r: &Run, rows: &[Value]) {
    let text = std::fs::read_to_string(r.dir.join("out.svg")).expect("the SVG file");
    let doc = roxmltree::Document::parse(&text).expect("the SVG parses as XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    // Data lines are the polylines of width 2 (axes and ticks are width 1).
    let lines = doc
        .descendants()
        .filter(|n| n.tag_name().name() == "polyline" && n.attribute("stroke-width") == Some("2"))
        .count();
    assert_eq!(
        lines,
        expected_lines(rows),
        "one line per configuration and panel"
    );
}

fn rows_of(r: &Run, bench: &str) -> Vec<Value> {
    r.json()["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["bench"] == bench)
        .cloned()
        .collect()
}

#[test]
fn base_in_every_completion_mode() {
    let r = run(
        "base",
        &["base", "--sizes", "8,4K", "--wait", "poll,block,spin"],
    );
    let rows = rows_of(&r, "base");
    assert_eq!(rows.len(), 6);
    let configs: BTreeSet<&str> = rows.iter().map(|x| x["config"].as_str().unwrap()).collect();
    assert_eq!(configs, ["poll", "block", "spin-then-block"].into());
    for x in &rows {
        for k in [
            "mean_us",
            "min_us",
            "median_us",
            "p99_us",
            "mbps",
            "cpu_pct",
        ] {
            assert!(x[k].is_number(), "{k} in {x}");
        }
    }
    let text = String::from_utf8_lossy(&r.out.stdout);
    assert!(text.contains("== base"), "a table on stdout: {text}");
}

#[test]
fn data_transfer_variants() {
    for (name, args, bench) in [
        (
            "at",
            &["at", "--reuse", "0,100", "--pool", "8", "--sizes", "8,4K"][..],
            "at",
        ),
        ("mds", &["mds", "--segs", "1,4", "--sizes", "8,4K"], "mds"),
        ("cq", &["cq", "--sizes", "8,4K"], "cq"),
        ("mvis", &["mvis", "--vis", "1,1024", "--sizes", "8"], "mvis"),
        ("rdma", &["rdma", "--sizes", "4,64,4K"], "rdma"),
        ("mts", &["mts", "--mts", "1K", "--sizes", "8,4K"], "mts"),
        ("rl", &["rl", "--sizes", "8,64"], "rl"),
        ("spl", &["spl", "--depth", "1,4", "--sizes", "8,4K"], "spl"),
        ("rate", &["rate", "--sizes", "8,64"], "rate"),
    ] {
        let r = run(name, args);
        assert!(!rows_of(&r, bench).is_empty(), "{name}: no {bench} rows");
    }
}

#[test]
fn asynchronous_and_client_server() {
    let r = run("async", &["async", "--sizes", "8"]);
    assert_eq!(rows_of(&r, "async").len(), 4);
    let r = run("txn", &["cs", "txn", "--req", "64", "--sizes", "8,4K"]);
    assert!(rows_of(&r, "cs-txn").iter().all(|x| x["rate"].is_number()));
    let r = run(
        "threads",
        &["cs", "server", "--clients", "1,2", "--workers", "2"],
    );
    assert_eq!(rows_of(&r, "cs-server").len(), 4);
}

#[test]
fn non_data_transfer() {
    let r = run("nd", &["nd", "vi,conn,cq"]);
    for b in ["nd-vi", "nd-conn", "nd-cq"] {
        assert!(!rows_of(&r, b).is_empty(), "{b}");
    }
    let r = run("ndmem", &["nd", "mem"]);
    assert!(!rows_of(&r, "nd-mem").is_empty());
}

#[test]
fn design_alternatives() {
    let r = run(
        "doorbell",
        &["alt", "doorbell", "--vis", "1,4", "--sizes", "8"],
    );
    // Central and per-VI, inline progress and an engine thread, 1 and 4 VIs.
    let rows = rows_of(&r, "alt-doorbell");
    assert_eq!(rows.len(), 8);
    assert!(
        rows.iter()
            .filter(|x| x["config"]
                .as_str()
                .is_some_and(|c| c.contains("engine thread")))
            .all(|x| x["status"] == "ok"),
        "thread progress works: {rows:?}"
    );
    let r = run("altcq", &["alt", "cq", "--queues", "1,4", "--sizes", "8"]);
    assert!(r.json()["summary"]["alt-cq"].is_object());
    let r = run(
        "inline",
        &[
            "alt",
            "inline",
            "--thresholds",
            "0,8,128,512",
            "--sizes",
            "8,64",
        ],
    );
    let rows = rows_of(&r, "alt-inline");
    // 128 bytes inline runs; 512 is above the provider's maximum (256).
    assert!(
        rows.iter()
            .any(|x| x["status"] == "ok" && x["config"].as_str().is_some_and(|c| c.contains("128"))),
        "a threshold of 128 bytes runs: {rows:?}"
    );
    assert!(
        rows.iter().any(|x| x["status"] == "not available"),
        "thresholds above the provider's maximum"
    );
    let r = run("fragment", &["alt", "fragment"]);
    assert_eq!(rows_of(&r, "alt-fragment")[0]["status"], "not available");
    let r = run(
        "tcache",
        &[
            "alt",
            "tcache",
            "--pool",
            "16",
            "--entries",
            "8,128",
            "--ways",
            "1,8",
            "--iters",
            "200",
        ],
    );
    let rows = rows_of(&r, "alt-tcache");
    assert!(
        rows.iter()
            .any(|x| x["config"].as_str().unwrap().starts_with("live engine"))
    );
    assert!(
        rows.iter()
            .any(|x| x["config"].as_str().unwrap().starts_with("model is-like"))
    );
    let r = run("notify", &["alt", "notify", "--sizes", "8"]);
    assert_eq!(rows_of(&r, "alt-notify").len(), 4);
}

#[test]
fn system_costs_report_and_compare() {
    let r = run("syscosts", &["sys-costs"]);
    assert!(rows_of(&r, "sys-costs").len() >= 8);
    let r = run("report", &["report", "--reps", "1", "--sizes", "4K"]);
    let rows = rows_of(&r, "compare");
    for who in [
        "bare shared-memory ping-pong (floor)",
        "memcpy",
        "VIA ping-pong",
        "VIA streaming",
    ] {
        assert!(
            rows.iter().any(|x| x["config"] == who),
            "{who} in the report"
        );
    }
    // The bandwidth floor is measured at the bandwidth sizes, and moved the
    // bytes (its processes check them).
    let copy = rows
        .iter()
        .find(|x| x["config"] == "bare copy ping-pong (one copy each way)")
        .expect("the bare copy ping-pong in the report");
    assert_eq!(copy["bytes"], 4096);
    assert!(copy["mbps"].as_f64().is_some_and(|m| m > 0.0), "{copy}");
    // Baselines that are not installed are rows too, never skipped.
    let r = run("compare", &["compare", "--reps", "1", "--sizes", "4K"]);
    let rows = rows_of(&r, "compare");
    for who in ["UCX", "libfabric", "Open MPI", "TCP"] {
        assert!(
            rows.iter()
                .any(|x| x["config"].as_str().unwrap().contains(who)),
            "{who}: neither measured nor reported missing"
        );
    }
}

#[test]
fn server_and_client_as_separate_processes() {
    let disc = format!("vbt-{}", std::process::id());
    let mut server = Command::new(BIN)
        .args(["server", "--disc", &disc, "--count", "2", "--cpu", "1"])
        .env("VIA_INSTANCE", instance())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    // The client's connection request waits for the server to listen.
    let r = run(
        "client",
        &[
            "client",
            "--host",
            "localhost",
            "--disc",
            &disc,
            "base",
            "--sizes",
            "8",
            "--wait",
            "poll",
        ],
    );
    assert_eq!(rows_of(&r, "base").len(), 1);
    assert!(
        server.wait().unwrap().success(),
        "the server served both points"
    );
}

#[test]
fn unknown_devices_fail_cleanly() {
    let out = Command::new(BIN)
        .args(["base", "--device", "mlx5_0", "--sizes", "8"])
        .env("VIA_INSTANCE", instance())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no such NIC"), "{err}");
}

/// `verbs` compares on an RDMA device only: the shared-memory NIC, and a
/// device this host does not have (none here), are refused with a reason
/// and exit code 2 before anything runs.
#[test]
fn verbs_needs_an_rdma_device() {
    for (dev, why) in [("via_lo", "shared-memory kind"), ("mlx5_0", "no such NIC")] {
        let out = Command::new(BIN)
            .args(["verbs", "--device", dev, "--quick"])
            .env("VIA_INSTANCE", instance())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{dev}: {err}");
        assert!(err.contains(why), "{dev}: {err}");
    }
}

#[test]
fn every_command_has_help() {
    let cmds: &[&[&str]] = &[
        &[],
        &["report"],
        &["compare"],
        &["suite"],
        &["nd"],
        &["base"],
        &["at"],
        &["mds"],
        &["cq"],
        &["mvis"],
        &["async"],
        &["rdma"],
        &["mts"],
        &["rl"],
        &["spl"],
        &["rate"],
        &["cs"],
        &["cs", "txn"],
        &["cs", "server"],
        &["alt"],
        &["alt", "doorbell"],
        &["alt", "cq"],
        &["alt", "inline"],
        &["alt", "fragment"],
        &["alt", "tcache"],
        &["alt", "notify"],
        &["alt", "all"],
        &["sys-costs"],
        &["verbs"],
        &["reg"],
        &["regpp"],
        &["regcost"],
        &["regscale"],
        &["reuse"],
        &["regbig"],
        &["server"],
        &["client"],
    ];
    for c in cmds {
        let out = Command::new(BIN).args(*c).arg("--help").output().unwrap();
        assert!(out.status.success(), "{c:?} --help");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("Usage:"),
            "{c:?}"
        );
    }
}

#[test]
fn registration_benchmarks() {
    let dir = std::env::temp_dir().join(format!("via-bench-test-{}-reg", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let j = dir.join("reg.json");
    let out = Command::new(BIN)
        .args(["reg", "--quick", "--size", "16M", "--json"])
        .arg(&j)
        .env("VIA_INSTANCE", instance())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&j).unwrap()).unwrap();
    for k in ["regpp", "regcost", "regscale", "reuse", "regbig"] {
        assert!(v[k].is_object(), "{k}");
    }
}

/// A network namespace with a veth pair (both ends inside), removed with
/// every process in it on drop.
struct Netns {
    name: String,
}

impl Netns {
    fn ip(args: &[&str]) {
        let out = Command::new("ip").args(args).output().expect("run ip");
        assert!(
            out.status.success(),
            "ip {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `None` (after a loud SKIPPED line) when not root.
    fn new(tag: &str) -> Option<(Netns, String)> {
        if !is_root(tag) {
            return None;
        }
        let pid = std::process::id();
        let n = Netns {
            name: format!("via-bench-{tag}-{pid}"),
        };
        let (a, b) = (
            format!("vb{}a", pid % 100_000),
            format!("vb{}b", pid % 100_000),
        );
        Self::ip(&["netns", "add", &n.name]);
        Self::ip(&[
            "link", "add", &a, "netns", &n.name, "type", "veth", "peer", "name", &b, "netns",
            &n.name,
        ]);
        let cidr = format!("10.251.{}.1/24", pid % 250);
        Self::ip(&["-n", &n.name, "addr", "add", &cidr, "dev", &a]);
        for i in [a.as_str(), b.as_str(), "lo"] {
            Self::ip(&["-n", &n.name, "link", "set", i, "up"]);
        }
        Some((n, a))
    }
}

/// Whether this runs as root; if not, a loud SKIPPED line for `tag`.
fn is_root(tag: &str) -> bool {
    let uid = Command::new("id").arg("-u").output().expect("id -u");
    let root = String::from_utf8_lossy(&uid.stdout).trim() == "0";
    if !root {
        eprintln!("SKIPPED (needs root to create network namespaces): {tag}");
    }
    root
}

/// Kills every process in namespace `ns` (they keep it alive) and deletes it.
fn remove_netns(ns: &str) {
    if let Ok(out) = Command::new("ip").args(["netns", "pids", ns]).output() {
        for p in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            let _ = Command::new("kill").args(["-9", p]).status();
        }
    }
    let _ = Command::new("ip").args(["netns", "del", ns]).status();
}

impl Drop for Netns {
    fn drop(&mut self) {
        remove_netns(&self.name);
    }
}

/// The fragment-size alternative on a real sockets NIC (a veth interface in
/// a network namespace; needs root, skipped loudly otherwise): one row per
/// fragment size, measured, with the ratio against whole frames.
#[test]
fn fragment_sweep_on_a_sockets_nic() {
    let Some((ns, ifname)) = Netns::new("frag") else {
        return;
    };
    let dev = format!("via_{ifname}");
    let r = run_in(
        Some(&ns.name),
        "fragment-sockets",
        &["alt", "fragment", "--device", &dev, "--sizes", "65536"],
    );
    let rows = rows_of(&r, "alt-fragment");
    let configs: Vec<&str> = rows.iter().filter_map(|x| x["config"].as_str()).collect();
    assert_eq!(configs, ["whole frames", "fragment 4K"], "{rows:?}");
    for x in &rows {
        assert_eq!(x["status"], "ok", "{x}");
        assert!(x["ratio"].as_f64().is_some_and(|v| v > 0.0), "{x}");
    }
}

/// Two hosts: network namespaces joined by a veth pair (`10.250.N.1` on
/// the first, `.2` on the second), removed with every process in them on
/// drop.
struct TwoHosts {
    ns: [String; 2],
    ifs: [String; 2],
    addrs: [String; 2],
}

impl TwoHosts {
    /// `None` (after a loud SKIPPED line) when not root.
    fn new(tag: &str) -> Option<TwoHosts> {
        if !is_root(tag) {
            return None;
        }
        let pid = std::process::id();
        let h = TwoHosts {
            ns: [0, 1].map(|i| format!("via-bench-{tag}-{pid}-{i}")),
            ifs: [0, 1].map(|i| format!("vh{}{}", pid % 100_000, ["a", "b"][i])),
            addrs: [1, 2].map(|i| format!("10.250.{}.{i}", pid % 250)),
        };
        for ns in &h.ns {
            Netns::ip(&["netns", "add", ns]);
        }
        Netns::ip(&[
            "link", "add", &h.ifs[0], "netns", &h.ns[0], "type", "veth", "peer", "name", &h.ifs[1],
            "netns", &h.ns[1],
        ]);
        for i in 0..2 {
            let cidr = format!("{}/24", h.addrs[i]);
            Netns::ip(&["-n", &h.ns[i], "addr", "add", &cidr, "dev", &h.ifs[i]]);
            Netns::ip(&["-n", &h.ns[i], "link", "set", &h.ifs[i], "up"]);
            Netns::ip(&["-n", &h.ns[i], "link", "set", "lo", "up"]);
        }
        Some(h)
    }
}

impl Drop for TwoHosts {
    fn drop(&mut self) {
        for ns in &self.ns {
            remove_netns(ns);
        }
    }
}

/// `via-bench server` on one host and `via-bench client` on another, over
/// their sockets NICs (two network namespaces; needs root, skipped loudly
/// otherwise): the client's points are measured against the remote server.
#[test]
fn server_and_client_on_two_hosts() {
    let Some(h) = TwoHosts::new("hosts") else {
        return;
    };
    let disc = format!("vbh-{}", std::process::id());
    let mut server = Command::new("ip")
        .args(["netns", "exec", &h.ns[0], BIN])
        .args(["server", "--disc", &disc, "--count", "1", "--cpu", "1"])
        .arg("--device")
        .arg(format!("via_{}", h.ifs[0]))
        .env("VIA_INSTANCE", format!("{}-server", instance()))
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let dev = format!("via_{}", h.ifs[1]);
    let r = run_in(
        Some(&h.ns[1]),
        "client-hosts",
        &[
            "client",
            "--device",
            &dev,
            "--host",
            &h.addrs[0],
            "--disc",
            &disc,
            "base",
            "--sizes",
            "8",
            "--wait",
            "poll",
        ],
    );
    let rows = rows_of(&r, "base");
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["status"], "ok", "{rows:?}");
    assert!(
        server.wait().unwrap().success(),
        "the server served the point"
    );
}
