//! Two "hosts" for the sockets NIC: network namespaces joined by a veth
//! pair, each with its own viad (started by the library inside it).
//!
//! [`Hosts::new`] needs root; without it, it prints a loud `SKIPPED` line
//! and returns `None`. Dropping [`Hosts`] kills every process left in the
//! namespaces and deletes them (and so the veth pair), also when the test
//! failed half-way.

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::Peer;

/// One side of the pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    A,
    B,
}

/// Two namespaces joined by a veth pair.
pub struct Hosts {
    ns: [String; 2],
    ifs: [String; 2],
    addrs: [String; 2],
}

/// Runs `ip <args>`; panics with its output if it fails.
pub fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Hosts {
    /// Creates the namespaces `via-<tag>-<pid>-{a,b}` with `10.X.Y.1/24`
    /// and `.2` on the two ends; `None` (after a loud `SKIPPED` line) when
    /// not root.
    pub fn new(tag: &str) -> Option<Hosts> {
        if !crate::have_root(&format!("sockets NIC between network namespaces ({tag})")) {
            return None;
        }
        crate::ensure_viad();
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let h = Hosts {
            ns: [format!("via-{tag}-{pid}-a"), format!("via-{tag}-{pid}-b")],
            // Interface names: at most 15 bytes, unique on the host.
            ifs: [
                format!("vs{}x{n}a", pid % 100_000),
                format!("vs{}x{n}b", pid % 100_000),
            ],
            addrs: [
                format!("10.{}.{}.1", 100 + n % 100, pid % 250),
                format!("10.{}.{}.2", 100 + n % 100, pid % 250),
            ],
        };
        for ns in &h.ns {
            ip(&["netns", "add", ns]);
        }
        ip(&[
            "link", "add", &h.ifs[0], "type", "veth", "peer", "name", &h.ifs[1],
        ]);
        for i in 0..2 {
            ip(&["link", "set", &h.ifs[i], "netns", &h.ns[i]]);
            let cidr = format!("{}/24", h.addrs[i]);
            ip(&["-n", &h.ns[i], "addr", "add", &cidr, "dev", &h.ifs[i]]);
            ip(&["-n", &h.ns[i], "link", "set", &h.ifs[i], "up"]);
            ip(&["-n", &h.ns[i], "link", "set", "lo", "up"]);
        }
        Some(h)
    }

    fn i(s: Side) -> usize {
        match s {
            Side::A => 0,
            Side::B => 1,
        }
    }

    /// The network namespace of side `s`.
    pub fn namespace(&self, s: Side) -> &str {
        &self.ns[Self::i(s)]
    }

    /// The IPv4 address of side `s`.
    pub fn addr(&self, s: Side) -> &str {
        &self.addrs[Self::i(s)]
    }

    /// The VIA device name of side `s` (`via_<if>`).
    pub fn device(&self, s: Side) -> String {
        format!("via_{}", self.ifs[Self::i(s)])
    }

    /// A `via-peer serve` interpreter on side `s`, opening its sockets NIC
    /// and connecting to the other side; `env` is added to its environment.
    pub fn peer(&self, s: Side, exe: &str, env: &[(&str, &str)]) -> Peer {
        let i = Self::i(s);
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.ns[i], exe, "serve"])
            .env("VIA_INSTANCE", &self.ns[i])
            .env("VIA_PEER_DEVICE", self.device(s))
            .env("VIA_PEER_REMOTE", &self.addrs[1 - i]);
        for (k, v) in env {
            cmd.env(k, v);
        }
        Peer::from_command(cmd)
    }

    /// Drops each packet arriving at side `s` with probability `p`
    /// (`iptables -m statistic`). `false` (after a loud `SKIPPED` line) if
    /// iptables or its statistic match is missing. [`Hosts::impair`]
    /// injects delay, reordering and duplication as well.
    pub fn drop_incoming(&self, s: Side, p: f64) -> bool {
        let i = Self::i(s);
        let prob = format!("{p}");
        let ok = Command::new("ip")
            .args(["netns", "exec", &self.ns[i], "iptables", "-A", "INPUT"])
            .args([
                "-m",
                "statistic",
                "--mode",
                "random",
                "--probability",
                &prob,
            ])
            .args(["-j", "DROP"])
            .status()
            .is_ok_and(|st| st.success());
        if !ok {
            eprintln!("SKIPPED (no iptables statistic match): random loss on {s:?}");
        }
        ok
    }

    /// Impairs every packet arriving at side `s` from the link: `via-impair`
    /// (`exe`, `env!("CARGO_BIN_EXE_via-impair")`) runs in the namespace on
    /// NFQUEUE queue 7, and an iptables rule on INPUT sends it the packets
    /// from the veth that do not carry its mark (its duplicates). Returns
    /// once the queue is bound and the rule installed. `None` (after a loud
    /// `SKIPPED` line) if NFQUEUE, the mark match or iptables is missing.
    /// The kernel here has no `tc netem`, the usual tool for this.
    pub fn impair(&self, s: Side, exe: &str, imp: Impairment) -> Option<Impaired> {
        let i = Self::i(s);
        let mut args = vec![
            "netns".to_string(),
            "exec".into(),
            self.ns[i].clone(),
            exe.into(),
            "--queue".into(),
            IMPAIR_QUEUE.to_string(),
            "--mark".into(),
            format!("{IMPAIR_MARK:#x}"),
        ];
        for (flag, v) in [
            ("--loss", imp.loss.to_string()),
            ("--reorder", imp.reorder.to_string()),
            ("--dup", imp.dup.to_string()),
            ("--delay-us", imp.delay.as_micros().to_string()),
            ("--hold-us", imp.hold.as_micros().to_string()),
            ("--seed", imp.seed.to_string()),
        ] {
            args.push(flag.into());
            args.push(v);
        }
        if imp.gso {
            args.push("--gso".into());
        }
        let mut cmd = Command::new("ip");
        cmd.args(&args);
        let mut tool = Peer::from_command(cmd);
        let ready = tool.line();
        if !ready.starts_with("READY") {
            eprintln!("SKIPPED (NFQUEUE unavailable: {ready}): impairment on {s:?}");
            return None;
        }
        let rule = self.impair_rule(s);
        let ok = Command::new("ip")
            .args(["netns", "exec", &self.ns[i], "iptables", "-A"])
            .args(&rule)
            .status()
            .is_ok_and(|st| st.success());
        if !ok {
            eprintln!("SKIPPED (iptables NFQUEUE or mark match missing): impairment on {s:?}");
            return None;
        }
        Some(Impaired {
            tool: Some(tool),
            ns: self.ns[i].clone(),
            rule,
        })
    }

    /// The INPUT rule that sends side `s`'s arriving packets to the queue.
    fn impair_rule(&self, s: Side) -> Vec<String> {
        let i = Self::i(s);
        [
            "INPUT",
            "-i",
            &self.ifs[i],
            "-m",
            "mark",
            "!",
            "--mark",
            &format!("{IMPAIR_MARK:#x}"),
            "-j",
            "NFQUEUE",
            "--queue-num",
            &IMPAIR_QUEUE.to_string(),
        ]
        .iter()
        .map(|a| a.to_string())
        .collect()
    }

    /// The kernel's TCP counters in side `s`'s namespace (`/proc/net/snmp`
    /// and `/proc/net/netstat`, as `Tcp:RetransSegs`, `TcpExt:TCPOFOQueue`,
    /// ...): what the packets did to the TCP connections underneath.
    pub fn tcp_counters(&self, s: Side) -> std::collections::HashMap<String, u64> {
        let mut m = std::collections::HashMap::new();
        for file in ["/proc/net/snmp", "/proc/net/netstat"] {
            let out = Command::new("ip")
                .args(["netns", "exec", &self.ns[Self::i(s)], "cat", file])
                .output()
                .expect("run ip netns exec cat");
            let text = String::from_utf8_lossy(&out.stdout);
            let lines: Vec<&str> = text.lines().collect();
            // Pairs of lines: names, then values, both led by `Group:`.
            for pair in lines.chunks_exact(2) {
                let (names, values) = (pair[0].split_whitespace(), pair[1].split_whitespace());
                let mut names = names.peekable();
                let group = names.next().unwrap_or("").trim_end_matches(':').to_string();
                for (n, v) in names.zip(values.skip(1)) {
                    if let Ok(v) = v.parse() {
                        m.insert(format!("{group}:{n}"), v);
                    }
                }
            }
        }
        m
    }

    /// `exe args...` on side `s` (no NIC environment), as a peer.
    pub fn exec(&self, s: Side, exe: &str, args: &[&str]) -> Peer {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.ns[Self::i(s)], exe])
            .args(args);
        Peer::from_command(cmd)
    }

    /// Takes side `s`'s end of the link down (a cut cable).
    pub fn cut(&self, s: Side) {
        let i = Self::i(s);
        ip(&["-n", &self.ns[i], "link", "set", &self.ifs[i], "down"]);
    }
}

/// The NFQUEUE queue of [`Hosts::impair`] (one per namespace).
const IMPAIR_QUEUE: u16 = 7;
/// The mark of `via-impair`'s duplicates, which its rule lets pass.
const IMPAIR_MARK: u32 = 0x7e57;

/// What [`Hosts::impair`] does to each packet: dropped with probability
/// `loss`; otherwise held `delay`, and with probability `reorder` `hold`
/// longer (later packets pass it); with probability `dup` sent twice.
#[derive(Clone, Copy, Debug)]
pub struct Impairment {
    pub loss: f64,
    pub reorder: f64,
    pub dup: f64,
    pub delay: std::time::Duration,
    pub hold: std::time::Duration,
    pub seed: u64,
    /// GSO packets (up to 64 KiB) are queued and impaired whole
    /// (`via-impair --gso`) rather than segmented by the kernel first.
    pub gso: bool,
}

/// `via-impair`'s counters (see its documentation).
#[derive(Clone, Debug, Default)]
pub struct ImpairCounters {
    pub seen: u64,
    pub dropped: u64,
    pub delayed: u64,
    pub held_back: u64,
    pub reordered: u64,
    pub duplicated: u64,
    pub dup_failed: u64,
    pub accepted: u64,
    pub overflow: u64,
    pub max_held: u64,
    pub gso: u64,
}

impl ImpairCounters {
    /// Parses a `COUNTERS key=value...` line (after the prefix).
    pub fn parse(s: &str) -> ImpairCounters {
        let mut c = ImpairCounters::default();
        for kv in s.split_whitespace() {
            let Some((k, v)) = kv.split_once('=') else {
                continue;
            };
            let v: u64 = v.parse().unwrap_or_else(|_| panic!("counter {kv:?}"));
            match k {
                "seen" => c.seen = v,
                "dropped" => c.dropped = v,
                "delayed" => c.delayed = v,
                "held_back" => c.held_back = v,
                "reordered" => c.reordered = v,
                "duplicated" => c.duplicated = v,
                "dup_failed" => c.dup_failed = v,
                "accepted" => c.accepted = v,
                "overflow" => c.overflow = v,
                "max_held" => c.max_held = v,
                "gso" => c.gso = v,
                _ => {}
            }
        }
        c
    }
}

/// A running impairment; [`Impaired::stop`] removes the rule, stops the
/// tool and returns its counters. Dropping it removes the rule and kills
/// the tool.
pub struct Impaired {
    tool: Option<Peer>,
    ns: String,
    rule: Vec<String>,
}

impl Impaired {
    /// The counters so far.
    pub fn counters(&mut self) -> ImpairCounters {
        let tool = self.tool.as_mut().expect("tool running");
        ImpairCounters::parse(&tool.cmd_expect("stats", "COUNTERS"))
    }

    fn remove_rule(&self) {
        let _ = Command::new("ip")
            .args(["netns", "exec", &self.ns, "iptables", "-D"])
            .args(&self.rule)
            .status();
    }

    /// Removes the rule (traffic flows unimpaired from here on), stops the
    /// tool (it accepts what it still holds) and returns its counters.
    pub fn stop(mut self) -> ImpairCounters {
        self.remove_rule();
        let mut tool = self.tool.take().expect("tool running");
        let c = ImpairCounters::parse(&tool.cmd_expect("stop", "COUNTERS"));
        tool.finish();
        c
    }
}

impl Drop for Impaired {
    fn drop(&mut self) {
        if self.tool.is_some() {
            // Rule first: an unbound queue drops every packet.
            self.remove_rule();
        }
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for ns in &self.ns {
            // Processes keep a namespace (and its end of the link) alive.
            if let Ok(out) = Command::new("ip").args(["netns", "pids", ns]).output() {
                for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                    if let Ok(p) = pid.parse::<i32>() {
                        // SIGKILL through the kill command: no unsafe here.
                        let _ = Command::new("kill").args(["-9", &p.to_string()]).status();
                    }
                }
            }
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}
