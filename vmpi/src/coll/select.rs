//! The selector: which algorithm for a collective, by message size and
//! process count, from the [`Model`]; every choice can be forced through
//! the environment for measurements (`VMPI_<OP>=<algorithm>`, `VMPI_K`,
//! `VMPI_SEGMENT`).
#![forbid(unsafe_code)]

use crate::coll::model::Model;

/// A broadcast algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bcast {
    /// k-nomial tree (binomial for 2).
    Knomial(u32),
    /// Binomial scatter then ring allgather.
    ScatterAllgather,
}

/// A reduce algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reduce {
    /// k-nomial tree.
    Knomial(u32),
    /// Rabenseifner (reduce-scatter + binomial gather); commutative only.
    Rabenseifner,
    /// Segmented chain with overlap.
    Pipeline(usize),
}

/// An allreduce algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Allreduce {
    /// Recursive doubling.
    RecursiveDoubling,
    /// Rabenseifner; commutative only.
    Rabenseifner,
    /// Ring reduce-scatter + ring allgather; commutative only.
    Ring,
    /// k-nomial reduce then k-nomial broadcast.
    ReduceBcast(u32),
}

/// A barrier algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Barrier {
    /// Dissemination.
    Dissemination,
    /// Gather and broadcast over a k-nomial tree.
    Tree(u32),
}

/// A `VMPI_*` variable, read once per process (the selector runs on
/// every call).
pub fn env(name: &str) -> Option<String> {
    static VARS: std::sync::OnceLock<std::collections::HashMap<String, String>> =
        std::sync::OnceLock::new();
    VARS.get_or_init(|| {
        std::env::vars()
            .filter(|(k, v)| k.starts_with("VMPI_") && !v.is_empty())
            .collect()
    })
    .get(name)
    .cloned()
}

fn env_usize(name: &str) -> Option<usize> {
    env(name).and_then(|v| v.parse().ok())
}

/// The segment size of pipelined algorithms.
pub fn segment() -> usize {
    env_usize("VMPI_SEGMENT").unwrap_or(32 * 1024)
}

fn forced_k() -> Option<u32> {
    env_usize("VMPI_K").map(|k| (k as u32).max(2))
}

/// The broadcast for `m` bytes over `p` processes.
pub fn bcast(model: &Model, p: u32, m: usize) -> Bcast {
    match env("VMPI_BCAST").as_deref() {
        Some("scatter_allgather") => return Bcast::ScatterAllgather,
        Some("binomial") => return Bcast::Knomial(2),
        Some("knomial") => {
            return Bcast::Knomial(forced_k().unwrap_or_else(|| model.best_k_bcast(p, m as f64)));
        }
        _ => {}
    }
    // Scatter + allgather is only used when forced: `vmpi-bench` measured
    // the binomial tree faster at every size here (the allgather's p-1
    // steps each wait for a process to be scheduled).
    Bcast::Knomial(forced_k().unwrap_or_else(|| model.best_k_bcast(p, m as f64)))
}

/// The reduce for `m` bytes over `p` processes.
pub fn reduce(model: &Model, p: u32, m: usize, commutative: bool) -> Reduce {
    let k = forced_k().unwrap_or_else(|| model.best_k_reduce(p, m as f64));
    match env("VMPI_REDUCE").as_deref() {
        Some("knomial") => return Reduce::Knomial(k),
        Some("binomial") => return Reduce::Knomial(2),
        Some("rabenseifner") if commutative => return Reduce::Rabenseifner,
        Some("pipeline") => return Reduce::Pipeline(segment()),
        _ => {}
    }
    if m >= 64 * 1024 && commutative && p > 2 {
        Reduce::Rabenseifner
    } else if m >= 256 * 1024 && p > 2 {
        Reduce::Pipeline(segment())
    } else {
        Reduce::Knomial(k)
    }
}

/// Whether an allreduce of two processes is one exchange and a local
/// reduction ([`crate::coll::algo::allreduce_pair`]): unless
/// `VMPI_ALLREDUCE` forces an algorithm.
pub fn pair_allreduce() -> bool {
    static PAIR: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *PAIR.get_or_init(|| matches!(env("VMPI_ALLREDUCE").as_deref(), None | Some("pair")))
}

/// The allreduce for `m` bytes over `p` processes.
pub fn allreduce(model: &Model, p: u32, m: usize, commutative: bool) -> Allreduce {
    match env("VMPI_ALLREDUCE").as_deref() {
        Some("recursive_doubling") => return Allreduce::RecursiveDoubling,
        Some("rabenseifner") if commutative => return Allreduce::Rabenseifner,
        Some("ring") if commutative => return Allreduce::Ring,
        Some("reduce_bcast") => return Allreduce::ReduceBcast(forced_k().unwrap_or(2)),
        _ => {}
    }
    if !commutative {
        return if m >= 64 * 1024 {
            Allreduce::ReduceBcast(2)
        } else {
            Allreduce::RecursiveDoubling
        };
    }
    let m = m as f64;
    let model = &model.for_job(p);
    // The ring's 2(p-1) steps each wait for a process to be scheduled
    // when processes outnumber cores: measured slowest then, so left out.
    let oversubscribed = p as usize > crate::coll::model::cores();
    let ring = if oversubscribed {
        f64::INFINITY
    } else {
        model.ring(p, m)
    };
    let cands = [
        (Allreduce::RecursiveDoubling, model.recursive_doubling(p, m)),
        (Allreduce::Rabenseifner, model.rabenseifner(p, m)),
        (Allreduce::Ring, ring),
    ];
    cands
        .iter()
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|c| c.0)
        .unwrap_or(Allreduce::RecursiveDoubling)
}

/// The barrier.
pub fn barrier() -> Barrier {
    match env("VMPI_BARRIER").as_deref() {
        Some("tree") => Barrier::Tree(forced_k().unwrap_or(2)),
        _ => Barrier::Dissemination,
    }
}
