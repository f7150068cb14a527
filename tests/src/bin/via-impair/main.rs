//! `via-impair`: a network impairment in user space, for kernels without
//! `tc netem` (this one has no `sch_netem`). An iptables rule sends the
//! packets to NFQUEUE queue `N`; this program decides the fate of each one:
//!
//! * dropped with probability `--loss`;
//! * otherwise held for `--delay-us` before it is accepted;
//! * with probability `--reorder` held `--hold-us` longer, so that the
//!   packets after it pass it (verdicts out of order);
//! * with probability `--dup` a copy is sent too, through a raw IPv4
//!   socket (`IP_HDRINCL`) with `SO_MARK` `--mark`: the rule must skip
//!   packets with that mark (`-m mark ! --mark X -j NFQUEUE`).
//!
//! The packets are real packets on the kernel's path (a veth pair between
//! namespaces in the tests); only the verdicts come from here.
//!
//! GSO: by default the kernel segments a GSO packet before queueing it, so
//! every loss, delay or copy applies to a wire-sized packet with complete
//! checksums, as on a link. `--gso` sets `NFQA_CFG_F_GSO` instead (fewer,
//! larger packets, up to 64 KiB; a copy then gets its transport checksum
//! computed here if the kernel had not, and a copy larger than the route's
//! MTU cannot be sent and counts as `dup_failed`).
//!
//! Protocol (stdout lines): `READY queue N` once the queue is bound; on
//! each stdin line `stats`, a `COUNTERS ...` line; at the end (stdin
//! closed or `stop`, SIGTERM, SIGINT) every held packet is accepted, the
//! queue unbound and a last `COUNTERS ...` line printed. Counters:
//! `seen dropped delayed held_back reordered duplicated dup_failed
//! accepted overflow max_held gso` (`reordered`: packets accepted after a
//! packet that arrived later; `overflow`: packets the kernel dropped
//! because the queue or our socket was full, from /proc; `gso`: packets
//! queued whole as GSO packets, only with `--gso`).
//!
//! Usage: `via-impair --queue N [--loss P] [--reorder P] [--dup P]
//! [--delay-us U] [--hold-us U] [--seed S] [--mark X] [--maxlen L] [--gso]`

mod nfq;
mod sys;

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use log::{debug, error, info, warn};

struct Args {
    queue: u16,
    loss: f64,
    reorder: f64,
    dup: f64,
    delay: Duration,
    hold: Duration,
    seed: u64,
    mark: u32,
    maxlen: u32,
    gso: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        queue: 0,
        loss: 0.0,
        reorder: 0.0,
        dup: 0.0,
        delay: Duration::ZERO,
        hold: Duration::from_millis(1),
        seed: 1,
        mark: 0x7e57,
        maxlen: 16384,
        gso: false,
    };
    let mut it = std::env::args().skip(1);
    let mut queue = None;
    while let Some(flag) = it.next() {
        if flag == "--gso" {
            a.gso = true;
            continue;
        }
        let v = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let bad = |e: &dyn std::fmt::Display| format!("{flag} {v}: {e}");
        let prob = |v: &str| -> Result<f64, String> {
            let p: f64 = v.parse().map_err(|e| bad(&e))?;
            if (0.0..=1.0).contains(&p) {
                Ok(p)
            } else {
                Err(format!("{flag} {v}: not a probability"))
            }
        };
        let num = |v: &str| -> Result<u64, String> {
            match v.strip_prefix("0x") {
                Some(h) => u64::from_str_radix(h, 16).map_err(|e| bad(&e)),
                None => v.parse().map_err(|e| bad(&e)),
            }
        };
        match flag.as_str() {
            "--queue" => queue = Some(u16::try_from(num(&v)?).map_err(|e| bad(&e))?),
            "--loss" => a.loss = prob(&v)?,
            "--reorder" => a.reorder = prob(&v)?,
            "--dup" => a.dup = prob(&v)?,
            "--delay-us" => a.delay = Duration::from_micros(num(&v)?),
            "--hold-us" => a.hold = Duration::from_micros(num(&v)?),
            "--seed" => a.seed = num(&v)?,
            "--mark" => a.mark = u32::try_from(num(&v)?).map_err(|e| bad(&e))?,
            "--maxlen" => a.maxlen = u32::try_from(num(&v)?).map_err(|e| bad(&e))?,
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    a.queue = queue.ok_or("--queue N is required")?;
    Ok(a)
}

/// splitmix64: small, seeded, reproducible.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// True with probability `p`.
    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && ((self.next() >> 11) as f64) < p * (1u64 << 53) as f64
    }
}

#[derive(Default)]
struct Counters {
    seen: u64,
    dropped: u64,
    delayed: u64,
    held_back: u64,
    reordered: u64,
    duplicated: u64,
    dup_failed: u64,
    accepted: u64,
    overflow: u64,
    max_held: u64,
    gso: u64,
}

impl Counters {
    fn line(&self) -> String {
        format!(
            "COUNTERS seen={} dropped={} delayed={} held_back={} reordered={} duplicated={} dup_failed={} accepted={} overflow={} max_held={} gso={}",
            self.seen,
            self.dropped,
            self.delayed,
            self.held_back,
            self.reordered,
            self.duplicated,
            self.dup_failed,
            self.accepted,
            self.overflow,
            self.max_held,
            self.gso
        )
    }
}

/// A packet waiting for its verdict.
struct Held {
    release: Instant,
    /// Arrival order.
    seq: u64,
    id: u32,
    /// The copy to send when it is accepted, if it is duplicated.
    copy: Option<Vec<u8>>,
}

impl PartialEq for Held {
    fn eq(&self, o: &Self) -> bool {
        (self.release, self.seq) == (o.release, o.seq)
    }
}
impl Eq for Held {}
impl PartialOrd for Held {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Held {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.release, self.seq).cmp(&(o.release, o.seq))
    }
}

/// The ones' complement sum of `b` (big-endian 16-bit words) added to `s`.
fn sum16(mut s: u32, b: &[u8]) -> u32 {
    let mut chunks = b.chunks_exact(2);
    for c in &mut chunks {
        s += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        s += u32::from(*last) << 8;
    }
    s
}

fn fold(mut s: u32) -> u16 {
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

/// The destination of an IPv4 packet, after filling in its TCP or UDP
/// checksum if `fix_checksum` (a packet queued with `NFQA_CFG_F_GSO` may
/// carry only the pseudo-header sum). `None` for anything that is not a
/// well-formed IPv4 packet.
fn prepare_copy(p: &mut [u8], fix_checksum: bool) -> Option<[u8; 4]> {
    if p.len() < 20 || p[0] >> 4 != 4 {
        return None;
    }
    let ihl = usize::from(p[0] & 0xf) * 4;
    let total = usize::from(u16::from_be_bytes([p[2], p[3]]));
    // GSO packets past 64 KiB carry 0 as their total length: not handled.
    if ihl < 20 || total < ihl || total > p.len() {
        return None;
    }
    let dst = [p[16], p[17], p[18], p[19]];
    let fragment = u16::from_be_bytes([p[6], p[7]]) & 0x3fff != 0;
    if !fix_checksum || fragment {
        return Some(dst);
    }
    let proto = p[9];
    let off = match proto {
        6 => 16,
        17 => 6,
        _ => return Some(dst),
    };
    let l4len = total - ihl;
    if l4len < off + 2 {
        return None;
    }
    let (ip, l4) = p[..total].split_at_mut(ihl);
    l4[off..off + 2].copy_from_slice(&[0, 0]);
    let mut s = sum16(0, &ip[12..20]);
    s += u32::from(proto) + l4len as u32;
    let mut c = fold(sum16(s, l4));
    if proto == 17 && c == 0 {
        c = 0xffff;
    }
    l4[off..off + 2].copy_from_slice(&c.to_be_bytes());
    Some(dst)
}

/// `queue_dropped + user_dropped` of queue `num` in this namespace.
fn kernel_overflow(num: u16) -> u64 {
    let Ok(s) = std::fs::read_to_string("/proc/self/net/netfilter/nfnetlink_queue") else {
        return 0;
    };
    for line in s.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.first().and_then(|q| q.parse::<u16>().ok()) == Some(num) && f.len() >= 7 {
            let n = |i: usize| f[i].parse::<u64>().unwrap_or(0);
            return n(5) + n(6);
        }
    }
    0
}

fn say(s: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{s}");
    let _ = out.flush();
}

struct Impair {
    a: Args,
    q: nfq::Queue,
    raw: Option<sys::RawIp>,
    rng: Rng,
    c: Counters,
    held: BinaryHeap<Reverse<Held>>,
    next_seq: u64,
    /// Arrival index of the latest-arrived packet accepted so far.
    newest_accepted: Option<u64>,
}

impl Impair {
    fn packet(&mut self, p: nfq::Packet, now: Instant) {
        self.c.seen += 1;
        if p.skb_info & nfq::NFQA_SKB_GSO != 0 {
            self.c.gso += 1;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        if self.rng.chance(self.a.loss) {
            self.c.dropped += 1;
            if let Err(e) = self.q.verdict(p.id, nfq::NF_DROP) {
                warn!("drop verdict on packet {}: {e}", p.id);
            }
            return;
        }
        let mut release = now + self.a.delay;
        if self.rng.chance(self.a.reorder) {
            self.c.held_back += 1;
            release += self.a.hold;
        }
        let mut copy = None;
        if self.rng.chance(self.a.dup) {
            let mut c = p.payload;
            let fix = p.skb_info & nfq::NFQA_SKB_CSUMNOTREADY != 0;
            if prepare_copy(&mut c, fix).is_some() {
                copy = Some(c);
            } else {
                debug!("packet {}: not IPv4, not copied", p.id);
                self.c.dup_failed += 1;
            }
        }
        let h = Held {
            release,
            seq,
            id: p.id,
            copy,
        };
        if release <= now {
            self.accept(h, now);
        } else {
            self.held.push(Reverse(h));
            self.c.max_held = self.c.max_held.max(self.held.len() as u64);
        }
    }

    fn accept(&mut self, h: Held, now: Instant) {
        if let Some(mut copy) = h.copy {
            let dst = prepare_copy(&mut copy, false);
            match (dst, &self.raw) {
                (Some(dst), Some(raw)) => match raw.send(&copy, dst) {
                    Ok(()) => self.c.duplicated += 1,
                    Err(e) => {
                        debug!("copy of packet {} ({} bytes): {e}", h.id, copy.len());
                        self.c.dup_failed += 1;
                    }
                },
                _ => self.c.dup_failed += 1,
            }
        }
        match self.q.verdict(h.id, nfq::NF_ACCEPT) {
            Ok(()) => self.c.accepted += 1,
            Err(e) => warn!("accept verdict on packet {}: {e}", h.id),
        }
        if !self.a.delay.is_zero() && now >= h.release {
            self.c.delayed += 1;
        }
        match self.newest_accepted {
            Some(n) if n > h.seq => self.c.reordered += 1,
            _ => self.newest_accepted = Some(h.seq),
        }
    }

    /// Accepts every held packet due at `now` (all of them if `all`).
    fn release(&mut self, now: Instant, all: bool) {
        while let Some(Reverse(top)) = self.held.peek() {
            if !all && top.release > now {
                break;
            }
            let Some(Reverse(h)) = self.held.pop() else {
                break;
            };
            self.accept(h, now);
        }
    }

    fn counters(&mut self) -> String {
        self.c.overflow = kernel_overflow(self.a.queue);
        self.c.line()
    }

    fn run(&mut self) -> std::io::Result<()> {
        let mut line = Vec::new();
        let mut buf = [0u8; 512];
        loop {
            if sys::stopped() {
                info!("signal: stopping");
                return Ok(());
            }
            let now = Instant::now();
            self.release(now, false);
            let wait = match self.held.peek() {
                Some(Reverse(h)) => h.release.saturating_duration_since(now),
                None => Duration::from_millis(200),
            };
            let r = sys::poll(self.q.nl.fd(), Some(0), wait)?;
            if r.netlink {
                // Everything queued now, without blocking.
                loop {
                    let evs = match self.q.recv(false) {
                        Ok(evs) => evs,
                        Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                            warn!("{e}");
                            continue;
                        }
                        Err(e) => return Err(e),
                    };
                    if evs.is_empty() {
                        break;
                    }
                    let now = Instant::now();
                    for ev in evs {
                        match ev {
                            nfq::Event::Packet(p) => self.packet(p, now),
                            nfq::Event::Answer { errno, .. } if errno != 0 => {
                                warn!(
                                    "netlink error: {}",
                                    std::io::Error::from_raw_os_error(errno)
                                )
                            }
                            nfq::Event::Answer { .. } => {}
                        }
                    }
                }
            }
            if r.stdin {
                let n = sys::read(0, &mut buf).unwrap_or(0);
                if n == 0 {
                    info!("stdin closed: stopping");
                    return Ok(());
                }
                line.extend_from_slice(&buf[..n]);
                while let Some(i) = line.iter().position(|&b| b == b'\n') {
                    let cmd: Vec<u8> = line.drain(..=i).collect();
                    match String::from_utf8_lossy(&cmd).trim() {
                        "stats" => {
                            let s = self.counters();
                            say(&s);
                        }
                        "stop" => return Ok(()),
                        "" => {}
                        other => say(&format!("ERROR unknown command {other:?}")),
                    }
                }
            }
        }
    }
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let a = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("via-impair: {e}");
            eprintln!(
                "usage: via-impair --queue N [--loss P] [--reorder P] [--dup P] [--delay-us U] [--hold-us U] [--seed S] [--mark X] [--maxlen L] [--gso]"
            );
            return ExitCode::from(2);
        }
    };
    if let Err(e) = sys::catch_stop_signals() {
        error!("signals: {e}");
        return ExitCode::FAILURE;
    }
    let flags = if a.gso { nfq::NFQA_CFG_F_GSO } else { 0 };
    let q = match nfq::Queue::bind(a.queue, a.maxlen, flags) {
        Ok(q) => q,
        Err(e) => {
            error!("bind NFQUEUE queue {}: {e}", a.queue);
            say(&format!("FAILED bind queue {}: {e}", a.queue));
            return ExitCode::FAILURE;
        }
    };
    let raw = if a.dup > 0.0 {
        match sys::RawIp::open(a.mark) {
            Ok(r) => Some(r),
            Err(e) => {
                error!("raw socket for duplicates: {e}");
                say(&format!("FAILED raw socket: {e}"));
                return ExitCode::FAILURE;
            }
        }
    } else {
        None
    };
    info!(
        "queue {}: loss {} reorder {} (hold {:?}) dup {} delay {:?} seed {} mark {:#x}{}",
        a.queue,
        a.loss,
        a.reorder,
        a.hold,
        a.dup,
        a.delay,
        a.seed,
        a.mark,
        if a.gso { " gso" } else { "" }
    );
    let seed = a.seed;
    let mut im = Impair {
        a,
        q,
        raw,
        rng: Rng(seed),
        c: Counters::default(),
        held: BinaryHeap::new(),
        next_seq: 0,
        newest_accepted: None,
    };
    say(&format!("READY queue {}", im.a.queue));
    let r = im.run();
    im.release(Instant::now(), true);
    // Late arrivals until the unbind: accepted at once.
    if let Err(e) = im.q.unbind() {
        warn!("unbind: {e}");
    }
    let s = im.counters();
    info!("{s}");
    say(&s);
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_of_a_tcp_copy() {
        // IPv4 + TCP with payload "hi", checksum computed by hand elsewhere:
        // recompute twice, the second must not change it, and a wrong
        // checksum must be replaced by the same value.
        let mut p = vec![
            0x45, 0, 0, 42, 0, 1, 0x40, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2, // IP
            0x30, 0x39, 0, 80, 0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x18, 0xff, 0xff, 0, 0, 0,
            0, // TCP
            b'h', b'i',
        ];
        assert_eq!(prepare_copy(&mut p, true), Some([10, 0, 0, 2]));
        let c = [p[36], p[37]];
        // Verify: the sum over pseudo-header and segment folds to 0.
        let mut s = sum16(0, &p[12..20]);
        s += 6 + 22;
        assert_eq!(fold(sum16(s, &p[20..])), 0);
        p[36] ^= 0x55;
        prepare_copy(&mut p, true);
        assert_eq!([p[36], p[37]], c);
        // Garbage is refused, never a panic.
        for n in 0..p.len() {
            let mut q = p[..n].to_vec();
            let _ = prepare_copy(&mut q, true);
        }
        assert_eq!(prepare_copy(&mut [0x60; 40], true), None);
    }

    #[test]
    fn chance_follows_the_probability() {
        let mut r = Rng(7);
        let n = (0..100_000).filter(|_| r.chance(0.25)).count();
        assert!((24_000..26_000).contains(&n), "{n}");
        assert!(!(0..1000).any(|_| r.chance(0.0)));
        assert!((0..1000).all(|_| r.chance(1.0)));
    }
}
