//! `via-bench verbs`: VIA against raw verbs on one RDMA device (`rxe0`,
//! `mlx5_0`, `verbs` for the first). The 8-byte half round trip of an
//! `ibv_rc_pingpong`-style loop (`via::RawPingPong`: RC send/receive, a
//! receive re-posted before each send, both sides busy-polling the CQ)
//! and of VIA's ping-pong on the same device (the point `report`
//! measures: post a send, poll for the receive, Reliable Delivery), in one
//! run: each repetition measures both, every side in a process of its own
//! pinned as `--cpus` says; the medians and their ratio are reported.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdout, Command, Stdio};

use crate::out::{self, Row};
use crate::suite::Ctx;
use crate::xfer::Mode;

/// Round trips before the timed ones, on each side.
const WARMUP: u32 = 100;

/// The row names.
const RAW: &str = "raw verbs ping-pong (ibv_rc_pingpong-style)";
const VIA: &str = "VIA ping-pong";

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// One side of the raw loop (`via-bench __raw_verbs`): prints its endpoint,
/// reads the peer's from stdin, connects, runs `WARMUP + iters` round
/// trips; the initiator then prints the half round trip of the timed ones
/// in microseconds (`HALF <us>`). Exits 1 with the reason on stderr.
pub fn raw_side(device: &str, initiator: bool, iters: u32, cpu: Option<usize>) {
    let fail = |what: &str, e: &dyn std::fmt::Display| -> ! {
        eprintln!("via-bench __raw_verbs on {device}: {what}: {e}");
        std::process::exit(1);
    };
    crate::xfer::pin(cpu);
    let pp = via::RawPingPong::new(device).unwrap_or_else(|e| fail("set-up", &e));
    println!("EP {}", hex(&pp.endpoint()));
    let _ = std::io::stdout().flush();
    let mut line = String::new();
    if std::io::stdin().read_line(&mut line).is_err() {
        fail("reading the peer's endpoint", &"stdin closed");
    }
    let peer = line
        .trim()
        .strip_prefix("EP ")
        .and_then(unhex)
        .unwrap_or_else(|| fail("the peer's endpoint", &format!("{line:?}")));
    pp.connect(&peer).unwrap_or_else(|e| fail("connect", &e));
    pp.run(WARMUP, 8, initiator)
        .unwrap_or_else(|e| fail("warm-up", &e));
    let t = pp
        .run(iters, 8, initiator)
        .unwrap_or_else(|e| fail("ping-pong", &e));
    if initiator {
        println!(
            "HALF {}",
            t.as_secs_f64() * 1e6 / (2.0 * f64::from(iters.max(1)))
        );
    }
}

/// A side of the raw loop, started: killed and reaped if dropped before
/// [`Side::finish`] or [`Side::failed`] took its process.
struct Side {
    child: Option<Child>,
    out: BufReader<ChildStdout>,
    what: &'static str,
}

impl Side {
    fn spawn(ctx: &Ctx, initiator: bool, iters: u32, cpu: Option<usize>) -> Result<Side, String> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut cmd = Command::new(exe);
        cmd.args(["__raw_verbs", "--device", &ctx.c.device])
            .args(["--role", if initiator { "initiator" } else { "responder" }])
            .args(["--iters", &iters.to_string()]);
        if let Some(c) = cpu {
            cmd.args(["--cpu", &c.to_string()]);
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start via-bench __raw_verbs: {e}"))?;
        let out = BufReader::new(child.stdout.take().expect("piped stdout"));
        let what = if initiator { "initiator" } else { "responder" };
        Ok(Side {
            child: Some(child),
            out,
            what,
        })
    }

    /// The next line of its output that starts with `tag`, after the tag;
    /// `None` at the end of the output.
    fn line(&mut self, tag: &str) -> Option<String> {
        let mut l = String::new();
        loop {
            l.clear();
            if self.out.read_line(&mut l).ok()? == 0 {
                return None;
            }
            if let Some(x) = l.trim().strip_prefix(tag) {
                return Some(x.to_string());
            }
        }
    }

    /// Writes `line` to its stdin (a side that died meanwhile closed it:
    /// its error comes from its exit).
    fn send(&mut self, line: &str) {
        if let Some(c) = &mut self.child {
            let _ = writeln!(c.stdin.as_mut().expect("piped stdin"), "{line}");
        }
    }

    /// Why it ended early: its stderr and status, once it exited.
    fn failed(&mut self) -> String {
        let Some(mut child) = self.child.take() else {
            return format!("raw verbs {} failed", self.what);
        };
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut err);
        }
        let status = child.wait().map(|s| s.to_string()).unwrap_or_default();
        format!("raw verbs {} failed ({status}): {}", self.what, err.trim())
    }

    /// Waits for it; an error unless it succeeded.
    fn finish(&mut self) -> Result<(), String> {
        let ok = self
            .child
            .as_mut()
            .is_some_and(|c| c.wait().is_ok_and(|s| s.success()));
        if ok {
            self.child = None;
            Ok(())
        } else {
            Err(self.failed())
        }
    }
}

impl Drop for Side {
    fn drop(&mut self) {
        if let Some(c) = &mut self.child {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Half round trip (us) of the raw loop between two processes, the
/// endpoints relayed through their stdin and stdout.
fn raw_half_rtt(ctx: &Ctx, iters: u32) -> Result<f64, String> {
    let (c0, c1) = ctx.cpus();
    let mut ini = Side::spawn(ctx, true, iters, c0)?;
    let mut res = Side::spawn(ctx, false, iters, c1)?;
    let ep_ini = ini.line("EP ").ok_or_else(|| ini.failed())?;
    let ep_res = res.line("EP ").ok_or_else(|| res.failed())?;
    ini.send(&format!("EP {ep_res}"));
    res.send(&format!("EP {ep_ini}"));
    let half = ini.line("HALF ").ok_or_else(|| ini.failed())?;
    res.finish()?;
    ini.finish()?;
    half.parse::<f64>()
        .map_err(|e| format!("raw verbs initiator printed {half:?}: {e}"))
}

fn median(v: &[f64]) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => None,
        n if n % 2 == 1 => Some(v[n / 2]),
        n => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// The comparison (see the module doc): `reps` repetitions of `iters`
/// round trips each (default 2,000; 200 with `--quick`).
pub fn verbs(ctx: &mut Ctx, reps: usize) {
    let iters = ctx
        .c
        .iters
        .map(|n| n.clamp(1, u64::from(u32::MAX)) as u32)
        .unwrap_or(if ctx.c.quick { 200 } else { 2000 });
    ctx.progress.grow(2 * reps);
    let (mut raw, mut via) = (Vec::new(), Vec::new());
    let mut errors: Vec<(&str, String)> = Vec::new();
    for rep in 0..reps {
        ctx.progress
            .step(&format!("repetition {}/{reps}: raw verbs", rep + 1));
        match raw_half_rtt(ctx, iters) {
            Ok(us) => raw.push(us),
            Err(e) => errors.push((RAW, e)),
        }
        ctx.progress.inc();
        ctx.progress
            .step(&format!("repetition {}/{reps}: VIA", rep + 1));
        let mut s = ctx.spec(Mode::PingPong, 8);
        s.iters = Some(u64::from(iters));
        match ctx.point(&s, &[]) {
            Ok(m) => via.extend(m.mean_us),
            Err(e) => errors.push((VIA, e)),
        }
    }
    let (r, v) = (median(&raw), median(&via));
    let note =
        format!("8 B half round trip, busy polling, median of {reps}; ratio: latency / raw verbs");
    for (who, x) in [(RAW, r), (VIA, v)] {
        if let Some(x) = x {
            let mut row = Row::new("verbs", who).bytes(8).note(&note);
            row.mean_us = Some(x);
            row.iters = u64::from(iters);
            row.ratio = r.map(|r| x / r);
            ctx.push(row);
        }
    }
    // One error row per contender (the first reason).
    for who in [RAW, VIA] {
        if let Some((_, e)) = errors.iter().find(|(w, _)| *w == who) {
            ctx.push(Row::absent("verbs", who, out::ERROR, e));
        }
    }
    ctx.epilogue.push(match (r, v) {
        (Some(r), Some(v)) => format!(
            "{}: VIA {v:.2} us against raw verbs {r:.2} us, {:.2}x (8 B half round trip, median of {reps})",
            ctx.c.device,
            v / r
        ),
        _ => format!("{}: no ratio (see the errors above)", ctx.c.device),
    });
    ctx.summary.insert(
        "verbs".into(),
        serde_json::json!({
            "device": ctx.c.device,
            "bytes": 8,
            "iters": iters,
            "repetitions": reps,
            "raw_verbs_half_rtt_us": raw,
            "via_half_rtt_us": via,
            "raw_verbs_median_us": r,
            "via_median_us": v,
            "via_over_raw": r.zip(v).map(|(r, v)| v / r),
        }),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_survive_the_hex_relay() {
        let b: Vec<u8> = (0..=255).collect();
        assert_eq!(unhex(&hex(&b)).unwrap(), b);
        assert_eq!(unhex("0"), None);
        assert_eq!(unhex("zz"), None);
        assert_eq!(unhex(""), Some(vec![]));
    }

    #[test]
    fn medians() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
    }
}
