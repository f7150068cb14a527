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
    /// iptables or its statistic match is missing. The kernel here has no
    /// `netem`: reordering, duplication and delay cannot be injected.
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
