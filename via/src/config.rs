//! Run-time configuration, read once from the environment.
//!
//! | variable | values | default |
//! |---|---|---|
//! | `VIA_DOORBELL` | `central`, `per-vi` | `central` (soft NIC); verbs kind: `per-vi` (direct posting per QP) |
//! | `VIA_CQ` | `ring` (CQ1), `scan` (CQ2) | `ring` |
//! | `VIA_SPIN_US` | microseconds a blocking wait spins before sleeping | `20` |
//! | `VIA_REGISTER` | `remap`, `cma` | `remap` |
//! | `VIA_INLINE` | bytes of a send carried inside its doorbell entry (at most 256) | `0` |
//! | `VIA_PROGRESS` | `inline` (posting thread runs the engine), `thread` | `inline` |
//! | `VIA_REGCACHE` | `on` (deregistered regions stay cached), `off` | `on` |
//! | `VIA_REGCACHE_BYTES` | bytes of deregistered regions kept cached | 256 MiB |
//! | `VIA_REGCACHE_REGIONS` | deregistered regions kept cached | 16384 |
//! | `VIA_REGCACHE_MERGE` | `on` (a miss pins the union with touching entries), `off` | `on` |
//! | `VIA_PARKED` | `on`: the last 64 deregistered registrations of each NIC are kept whole for the same bytes again (needs the memory-event monitor) | `on` |
//! | `VIA_MOVE_CHUNK` | bytes moved per write-protected step of a registration (one page .. 16 MiB) | 2 MiB |
//! | `VIA_TCACHE_ENTRIES` | entries of the engine's translation cache | 1024 |
//! | `VIA_TCACHE_WAYS` | its associativity (1 = direct-mapped) | 1 |
//! | `VIA_LIGHT_FENCES` | `on`: the frequent side of the wake-up and engine handshakes is a compiler fence, the rare side `membarrier` (`doorbell::asymmetric`; not with `VIA_PROGRESS=thread`); `off`: a full fence on every completion | `off` |
#![forbid(unsafe_code)]

use std::sync::OnceLock;
use std::time::Duration;

use crate::mem::arena::Policy;

/// Most bytes of a send `VIA_INLINE` may carry inside its doorbell entry.
pub const MAX_INLINE: usize = 256;

/// How posts reach the soft NIC's engine when they cannot run at once: two
/// uses of the same `doorbell::Doorbell` type, the two designs the thesis
/// compares.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DoorbellMode {
    /// One multi-producer doorbell per NIC, shared by all its VIs (`central`).
    #[default]
    Central,
    /// One doorbell per VI, polled in turn (`per-vi`).
    PerVi,
}

impl DoorbellMode {
    /// The name `VIA_DOORBELL` takes.
    pub const fn as_str(self) -> &'static str {
        match self {
            DoorbellMode::Central => "central",
            DoorbellMode::PerVi => "per-vi",
        }
    }
}

impl std::str::FromStr for DoorbellMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "central" => Ok(DoorbellMode::Central),
            "per-vi" => Ok(DoorbellMode::PerVi),
            _ => Err(format!("unknown doorbell mode {s:?} (central or per-vi)")),
        }
    }
}

/// How a CQ collects completions (the thesis's CQ1 and CQ2).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CqMode {
    /// CQ1: completers push an entry into the CQ's ring (`ring`, `cq1`).
    #[default]
    Ring,
    /// CQ2: the CQ scans its work queues for completions (`scan`, `cq2`).
    Scan,
}

impl CqMode {
    /// The name `VIA_CQ` takes.
    pub const fn as_str(self) -> &'static str {
        match self {
            CqMode::Ring => "ring",
            CqMode::Scan => "scan",
        }
    }
}

impl std::str::FromStr for CqMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "ring" | "cq1" => Ok(CqMode::Ring),
            "scan" | "cq2" => Ok(CqMode::Scan),
            _ => Err(format!("unknown CQ mode {s:?} (ring, scan, cq1 or cq2)")),
        }
    }
}

/// How the engine is driven.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Progress {
    /// The thread that posts runs the engine (no extra thread; default).
    #[default]
    Inline,
    /// A dedicated engine thread sleeps on the doorbell.
    Thread,
}

/// The configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// Central or per-VI doorbells.
    pub doorbell: DoorbellMode,
    /// The verbs kind's send path: `PerVi` posts each descriptor straight
    /// to its QP (one doorbell per post, the default), `Central` gathers
    /// the posts of all VIs in one queue that a poster thread hands to the
    /// device as one chain per QP. Same variable (`VIA_DOORBELL`), another
    /// default: direct (the measurements under emulation disagree from run
    /// to run; docs/design.md §8).
    pub verbs_doorbell: DoorbellMode,
    /// CQ1 or CQ2.
    pub cq: CqMode,
    /// Spin before blocking.
    pub spin: Duration,
    /// Registration backing.
    pub register: Policy,
    /// Largest payload carried inline in the doorbell.
    pub inline: usize,
    /// Engine driving mode.
    pub progress: Progress,
    /// The registration cache.
    pub regcache: regcache::Config,
    /// Deregistered registrations kept whole per NIC (`parked.rs`).
    pub parked: bool,
    /// Bytes per write-protected step when pages move into an arena.
    pub move_chunk: usize,
    /// Entries of the engine's translation cache.
    pub tcache_entries: usize,
    /// Its associativity.
    pub tcache_ways: usize,
    /// Asymmetric fences in the wake-up and engine handshakes
    /// (`VIA_LIGHT_FENCES`, off by default).
    pub light_fences: bool,
}

/// `on`/`off` switches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Switch(bool);

impl std::str::FromStr for Switch {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "on" | "1" | "yes" => Ok(Switch(true)),
            "off" | "0" | "no" => Ok(Switch(false)),
            _ => Err(format!("'{s}' is neither on nor off")),
        }
    }
}

fn var<T: std::str::FromStr>(name: &str, default: T) -> T
where
    T::Err: std::fmt::Display,
{
    match std::env::var(name) {
        Ok(v) => match v.parse() {
            Ok(x) => x,
            Err(e) => {
                log::warn!("ignoring {name}={v:?}: {e}");
                default
            }
        },
        Err(_) => default,
    }
}

impl Config {
    /// Reads the environment.
    pub fn from_env() -> Config {
        let progress = match std::env::var("VIA_PROGRESS").as_deref() {
            Ok("thread") => Progress::Thread,
            Ok("inline") | Err(_) => Progress::Inline,
            Ok(v) => {
                log::warn!("ignoring VIA_PROGRESS={v:?}: use inline or thread");
                Progress::Inline
            }
        };
        Config {
            doorbell: var("VIA_DOORBELL", DoorbellMode::Central),
            verbs_doorbell: var("VIA_DOORBELL", DoorbellMode::PerVi),
            cq: var("VIA_CQ", CqMode::Ring),
            spin: Duration::from_micros(var("VIA_SPIN_US", 20u64)),
            register: var("VIA_REGISTER", Policy::Remap),
            inline: var::<usize>("VIA_INLINE", 0),
            progress,
            regcache: {
                let on = var("VIA_REGCACHE", Switch(true)).0;
                regcache::Config {
                    capacity_bytes: if on {
                        var("VIA_REGCACHE_BYTES", 256usize << 20)
                    } else {
                        0
                    },
                    capacity_regions: if on {
                        var("VIA_REGCACHE_REGIONS", 16384usize)
                    } else {
                        0
                    },
                    merge: var("VIA_REGCACHE_MERGE", Switch(true)).0,
                    validate_hits: false,
                }
            },
            parked: var("VIA_PARKED", Switch(true)).0,
            move_chunk: var("VIA_MOVE_CHUNK", 2usize << 20).max(1),
            tcache_entries: var("VIA_TCACHE_ENTRIES", 1024usize).clamp(1, 1 << 20),
            tcache_ways: var("VIA_TCACHE_WAYS", 1usize).clamp(1, 64),
            light_fences: var("VIA_LIGHT_FENCES", Switch(false)).0,
        }
    }

    /// The process-wide configuration (read on first use).
    pub fn get() -> &'static Config {
        static C: OnceLock<Config> = OnceLock::new();
        C.get_or_init(|| {
            let c = Config::from_env();
            // Off by default: the registration for global expedited
            // barriers slows this process's sleeps and wake-ups (README,
            // "Asymmetric fences"). An engine thread sleeps once per
            // message: never with thread progress.
            if c.light_fences && c.progress == Progress::Thread {
                log::info!("VIA_LIGHT_FENCES=on is ignored with VIA_PROGRESS=thread");
            }
            if c.light_fences && c.progress == Progress::Inline {
                if !doorbell::asymmetric::register() {
                    log::info!("VIA_LIGHT_FENCES=on: this process cannot register for global expedited barriers; full fences");
                }
            } else {
                doorbell::asymmetric::disable();
            }
            c
        })
    }
}
