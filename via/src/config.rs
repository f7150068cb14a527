//! Run-time configuration, read once from the environment.
//!
//! | variable | values | default |
//! |---|---|---|
//! | `VIA_DOORBELL` | `central`, `per-vi` | `central` |
//! | `VIA_CQ` | `ring` (CQ1), `scan` (CQ2) | `ring` |
//! | `VIA_SPIN_US` | microseconds a blocking wait spins before sleeping | `20` |
//! | `VIA_REGISTER` | `remap`, `cma` | `remap` |
//! | `VIA_INLINE` | bytes carried inside the doorbell entry | `0` |
//! | `VIA_PROGRESS` | `inline` (posting thread runs the engine), `thread` | `inline` |
#![forbid(unsafe_code)]

use std::sync::OnceLock;
use std::time::Duration;

use doorbell::DoorbellMode;

use crate::shm::arena::Policy;

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
    /// CQ1 or CQ2.
    pub cq: cq::Mode,
    /// Spin before blocking.
    pub spin: Duration,
    /// Registration backing.
    pub register: Policy,
    /// Largest payload carried inline in the doorbell.
    pub inline: usize,
    /// Engine driving mode.
    pub progress: Progress,
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
            cq: var("VIA_CQ", cq::Mode::Ring),
            spin: Duration::from_micros(var("VIA_SPIN_US", 20u64)),
            register: var("VIA_REGISTER", Policy::Remap),
            inline: var::<usize>("VIA_INLINE", 0).min(crate::shm::layout::MAX_INLINE),
            progress,
        }
    }

    /// The process-wide configuration (read on first use).
    pub fn get() -> &'static Config {
        static C: OnceLock<Config> = OnceLock::new();
        C.get_or_init(Config::from_env)
    }
}
