//! Results: one row type for every benchmark, printed as a table, written
//! as JSON (`--json`), CSV (`--csv`) and an SVG plot (`--plot`), and the
//! progress bar of long sweeps.

use std::collections::BTreeMap;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What a row's measurement came to.
pub const OK: &str = "ok";
/// The device kind has no such mechanism (e.g. fragments on shared memory).
pub const NOT_AVAILABLE: &str = "not available";
/// An external baseline that is not installed on this machine.
pub const NOT_INSTALLED: &str = "not installed";
/// The measurement failed (the note says why).
pub const ERROR: &str = "error";

/// One measurement. Metrics that a benchmark does not produce are `None`
/// (empty in CSV, `null` in JSON).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Row {
    /// The benchmark (`base`, `at`, `nd-vi`, `alt-cq`, `compare`, ...).
    pub bench: String,
    /// The configuration: one line of a plot.
    pub config: String,
    /// Message size in bytes, where the benchmark has one.
    pub bytes: Option<u64>,
    /// The swept parameter other than the size (VIs, queues, reuse %,
    /// entries, ...), named by `x_name`.
    pub x: Option<f64>,
    /// Name of `x` (empty when there is none).
    pub x_name: String,
    /// Timed iterations (round trips, messages, operations).
    pub iters: u64,
    /// Mean, microseconds (latency rows: half a round trip).
    pub mean_us: Option<f64>,
    /// Minimum, microseconds.
    pub min_us: Option<f64>,
    /// Median, microseconds.
    pub median_us: Option<f64>,
    /// 99th percentile, microseconds.
    pub p99_us: Option<f64>,
    /// Bandwidth, 10^6 bytes per second.
    pub mbps: Option<f64>,
    /// CPU time (user + system, getrusage) over wall time of the measuring
    /// process, percent (100 = one core busy).
    pub cpu_pct: Option<f64>,
    /// Operations (messages, transactions) per second.
    pub rate: Option<f64>,
    /// Against the baseline named in `note`, measured in the same run.
    pub ratio: Option<f64>,
    /// Any other quantity (a miss rate, a derived crossover), in `unit`.
    pub value: Option<f64>,
    /// Unit of `value` (empty when there is none).
    pub unit: String,
    /// `ok`, `not available`, `not installed` or `error`.
    pub status: String,
    /// Free text: the baseline of `ratio`, why a row is not `ok`, ...
    pub note: String,
}

impl Row {
    /// An `ok` row of `bench` / `config`.
    pub fn new(bench: &str, config: &str) -> Row {
        Row {
            bench: bench.into(),
            config: config.into(),
            status: OK.into(),
            ..Default::default()
        }
    }

    /// A row that has no measurement, with its status and reason.
    pub fn absent(bench: &str, config: &str, status: &str, note: &str) -> Row {
        Row {
            status: status.into(),
            note: note.into(),
            ..Row::new(bench, config)
        }
    }

    pub fn bytes(mut self, b: usize) -> Row {
        self.bytes = Some(b as u64);
        self
    }

    pub fn x(mut self, name: &str, v: f64) -> Row {
        self.x_name = name.into();
        self.x = Some(v);
        self
    }

    pub fn value(mut self, v: f64, unit: &str) -> Row {
        self.value = Some(v);
        self.unit = unit.into();
        self
    }

    pub fn note(mut self, n: &str) -> Row {
        self.note = n.into();
        self
    }

    /// Copies the metrics of a measurement in.
    pub fn with(mut self, m: &Measure) -> Row {
        self.iters = m.iters;
        self.mean_us = m.mean_us;
        self.min_us = m.min_us;
        self.median_us = m.median_us;
        self.p99_us = m.p99_us;
        self.mbps = m.mbps;
        self.cpu_pct = m.cpu_pct;
        self.rate = m.rate;
        self
    }
}

/// What a measuring process reports (one JSON line on its stdout).
#[derive(Serialize, Deserialize, Clone, Debug, Default)]
pub struct Measure {
    pub iters: u64,
    pub mean_us: Option<f64>,
    pub min_us: Option<f64>,
    pub median_us: Option<f64>,
    pub p99_us: Option<f64>,
    pub mbps: Option<f64>,
    pub cpu_pct: Option<f64>,
    pub rate: Option<f64>,
    /// Benchmark-specific values (counters, traces, ...).
    #[serde(default)]
    pub extra: Value,
}

/// Latency statistics of samples in microseconds, with the mean from a
/// separate run without clock reads (`mean`).
pub fn stats(mean: f64, samples: &mut [f64]) -> (f64, f64, f64, f64) {
    samples.sort_by(|a, b| a.total_cmp(b));
    if samples.is_empty() {
        return (mean, mean, mean, mean);
    }
    let at = |p: f64| samples[((samples.len() - 1) as f64 * p).round() as usize];
    (mean, samples[0], at(0.5), at(0.99))
}

/// A result document: what every command writes with `--json`.
#[derive(Serialize, Deserialize, Clone, Debug)]
#[serde(deny_unknown_fields)]
pub struct Doc {
    /// Always `via-bench`.
    pub tool: String,
    /// The crate version.
    pub version: String,
    /// The command line (after the program name).
    pub command: Vec<String>,
    /// The NIC (`--device`) and its kind.
    pub device: String,
    pub device_kind: String,
    /// Core pinning of the two processes (or threads) of a measurement.
    pub pinning: Pinning,
    /// The provider's configuration variables of this run (`VIA_*`).
    pub env: BTreeMap<String, String>,
    /// Seconds since the epoch at the start.
    pub started_unix: u64,
    /// Every measurement.
    pub rows: Vec<Row>,
    /// Derived values (break-even points, crossovers, ...), per benchmark.
    pub summary: BTreeMap<String, Value>,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
#[serde(deny_unknown_fields)]
pub struct Pinning {
    /// Whether pinning was asked for (`--no-pin` clears it).
    pub pinned: bool,
    /// The core of the measuring (client) side.
    pub client_cpu: usize,
    /// The core of the serving side.
    pub server_cpu: usize,
    /// Online cores.
    pub cpus: usize,
}

/// Progress of a sweep: a bar on a terminal (stderr), nothing otherwise.
pub struct Progress(ProgressBar);

impl Progress {
    pub fn new(total: usize, what: &str) -> Progress {
        let pb = ProgressBar::with_draw_target(Some(total as u64), ProgressDrawTarget::stderr());
        pb.set_style(
            ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {elapsed} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        pb.set_prefix(what.to_string());
        Progress(pb)
    }

    pub fn step(&self, msg: &str) {
        self.0.set_message(msg.to_string());
    }

    pub fn inc(&self) {
        self.0.inc(1);
    }

    pub fn grow(&self, n: usize) {
        self.0.inc_length(n as u64);
    }

    pub fn finish(&self) {
        self.0.finish_and_clear();
    }
}

fn num(v: Option<f64>) -> String {
    match v {
        None => "-".into(),
        Some(x) if x.abs() >= 1000.0 => format!("{x:.0}"),
        Some(x) if x.abs() >= 10.0 => format!("{x:.1}"),
        Some(x) => format!("{x:.3}"),
    }
}

/// `4K`, `1M`, `100`.
pub fn fmt_size(b: u64) -> String {
    if b >= 1 << 20 && b % (1 << 20) == 0 {
        format!("{}M", b >> 20)
    } else if b >= 1024 && b % 1024 == 0 {
        format!("{}K", b >> 10)
    } else {
        b.to_string()
    }
}

/// Prints the rows of each benchmark as a table on stdout: the columns
/// that at least one row of the benchmark fills.
pub fn print_tables(rows: &[Row]) {
    let mut benches: Vec<&str> = Vec::new();
    for r in rows {
        if !benches.contains(&r.bench.as_str()) {
            benches.push(&r.bench);
        }
    }
    for b in benches {
        let rs: Vec<&Row> = rows.iter().filter(|r| r.bench == b).collect();
        type Col = (&'static str, fn(&Row) -> Option<f64>);
        let metric: [Col; 10] = [
            ("mean us", |r| r.mean_us),
            ("min us", |r| r.min_us),
            ("median us", |r| r.median_us),
            ("p99 us", |r| r.p99_us),
            ("MB/s", |r| r.mbps),
            ("cpu %", |r| r.cpu_pct),
            ("ops/s", |r| r.rate),
            ("ratio", |r| r.ratio),
            ("value", |r| r.value),
            ("iters", |r| (r.iters > 0).then_some(r.iters as f64)),
        ];
        let cols: Vec<&Col> = metric
            .iter()
            .filter(|(_, f)| rs.iter().any(|r| f(r).is_some()))
            .collect();
        let has_bytes = rs.iter().any(|r| r.bytes.is_some());
        let x_name = rs.iter().find(|r| r.x.is_some()).map(|r| r.x_name.clone());
        let cw = rs.iter().map(|r| r.config.len()).max().unwrap_or(6).max(6);
        println!("\n== {b}");
        let mut head = format!("{:<cw$}", "config");
        if has_bytes {
            head += &format!(" {:>8}", "bytes");
        }
        if let Some(x) = &x_name {
            head += &format!(" {:>10}", x);
        }
        for (n, _) in &cols {
            head += &format!(" {n:>11}");
        }
        head += "  note";
        println!("{head}");
        for r in rs {
            let mut line = format!("{:<cw$}", r.config);
            if has_bytes {
                line += &format!(
                    " {:>8}",
                    r.bytes.map(fmt_size).unwrap_or_else(|| "-".into())
                );
            }
            if x_name.is_some() {
                line += &format!(" {:>10}", num(r.x));
            }
            for (_, f) in &cols {
                line += &format!(" {:>11}", num(f(r)));
            }
            let mut note = String::new();
            if r.status != OK {
                note = format!("[{}] ", r.status);
            }
            note += &r.note;
            if !r.unit.is_empty() {
                note = format!("{} (value: {})", note.trim_end(), r.unit);
            }
            if !note.is_empty() {
                line += &format!("  {}", note.trim_end());
            }
            println!("{line}");
        }
    }
}

/// The environment variables of the provider's configuration in force.
pub fn provider_env() -> BTreeMap<String, String> {
    std::env::vars()
        .filter(|(k, _)| k.starts_with("VIA_") && !k.starts_with("VIA_BENCH_"))
        .collect()
}

pub fn write_json(path: &str, doc: &Doc) -> std::io::Result<()> {
    std::fs::write(path, serde_json::to_string_pretty(doc)? + "\n")?;
    println!("JSON: {path}");
    Ok(())
}

/// CSV: one line per row, the fields of [`Row`] in order.
pub fn write_csv(path: &str, rows: &[Row]) -> std::io::Result<()> {
    let mut w = csv::Writer::from_path(path)?;
    for r in rows {
        w.serialize(r)?;
    }
    w.flush()?;
    println!("CSV: {path}");
    Ok(())
}

/// The lines a plot of `rows` draws: (panel, config) in order, with their
/// points. Panel 0: latency (median, else mean) against the size or `x`;
/// panel 1: bandwidth (or rate) against the same.
pub type Series = Vec<(String, Vec<(f64, f64)>)>;

pub fn plot_series(rows: &[Row]) -> (Series, Series) {
    let mut lat: Series = Vec::new();
    let mut bw: Series = Vec::new();
    let key = |r: &Row| {
        if r.bench == r.config {
            r.bench.clone()
        } else {
            format!("{} {}", r.bench, r.config)
        }
    };
    let xval = |r: &Row| -> Option<f64> {
        // The swept parameter if there is one, else the size.
        r.x.map(|x| x.max(1e-3))
            .or(r.bytes.map(|b| (b.max(1)) as f64))
    };
    for r in rows.iter().filter(|r| r.status == OK) {
        let Some(x) = xval(r) else { continue };
        let push = |s: &mut Series, y: f64| {
            if !(y.is_finite() && y > 0.0) {
                return;
            }
            let k = key(r);
            match s.iter_mut().find(|(n, _)| *n == k) {
                Some((_, v)) => v.push((x, y)),
                None => s.push((k, vec![(x, y)])),
            }
        };
        if let Some(y) = r.median_us.or(r.mean_us).or(r.value) {
            push(&mut lat, y);
        }
        if let Some(y) = r.mbps.or(r.rate) {
            push(&mut bw, y);
        }
    }
    // A line needs two points.
    lat.retain(|(_, v)| v.len() >= 2);
    bw.retain(|(_, v)| v.len() >= 2);
    (lat, bw)
}

/// Draws latency and bandwidth against size (log scales), one polyline per
/// configuration in each panel, into an SVG file.
pub fn write_plot(path: &str, title: &str, rows: &[Row]) -> Result<(), String> {
    use plotters::prelude::*;
    let (lat, bw) = plot_series(rows);
    let root = SVGBackend::new(path, (1200, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let root = root
        .titled(title, ("sans-serif", 20))
        .map_err(|e| e.to_string())?;
    let panels = root.split_evenly((1, 2));
    let x_name = rows
        .iter()
        .find(|r| r.x.is_some())
        .map(|r| r.x_name.clone());
    let x_label = match x_name {
        None => "message size, bytes".to_string(),
        Some(n) if rows.iter().all(|r| r.x.is_some()) => n,
        Some(n) => format!("message size, bytes; {n}"),
    };
    for (i, (series, ylab)) in [
        (&lat, "latency, us (median; half round trip)"),
        (&bw, "bandwidth, MB/s (or ops/s)"),
    ]
    .into_iter()
    .enumerate()
    {
        let area = &panels[i];
        let pts = series.iter().flat_map(|(_, v)| v.iter());
        let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
        for &(x, y) in pts {
            x0 = x0.min(x);
            x1 = x1.max(x);
            y0 = y0.min(y);
            y1 = y1.max(y);
        }
        if series.is_empty() {
            (x0, x1, y0, y1) = (1.0, 2.0, 1.0, 2.0);
        }
        let (x1, y1) = (x1.max(x0 * 2.0), y1.max(y0 * 2.0));
        let mut chart = ChartBuilder::on(area)
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d((x0..x1).log_scale(), (y0 * 0.8..y1 * 1.25).log_scale())
            .map_err(|e| e.to_string())?;
        chart
            .configure_mesh()
            .x_desc(x_label.as_str())
            .y_desc(ylab)
            .x_label_formatter(&|v| fmt_size(v.round() as u64))
            .draw()
            .map_err(|e| e.to_string())?;
        for (j, (name, v)) in series.iter().enumerate() {
            let c = Palette99::pick(j).to_rgba();
            chart
                .draw_series(LineSeries::new(v.iter().copied(), c.stroke_width(2)))
                .map_err(|e| e.to_string())?
                .label(name.as_str())
                // Legend marks are rectangles, so that the polylines of the
                // SVG are exactly the lines of the data.
                .legend(move |(x, y)| Rectangle::new([(x, y - 3), (x + 14, y + 3)], c.filled()));
        }
        if !series.is_empty() {
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .position(SeriesLabelPosition::UpperLeft)
                .draw()
                .map_err(|e| e.to_string())?;
        }
    }
    root.present().map_err(|e| e.to_string())?;
    println!("plot: {path}");
    Ok(())
}
