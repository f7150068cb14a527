//! The cost model the selector uses: LogGP with the reduction term of
//! seed 002 (`m·γ`), its parameters fitted to this provider's
//! measurements (`vmpi-bench fit`; docs/vmpi.md has the fit and the
//! formulas). Times in microseconds, sizes in bytes.
//!
//! * `L`: wire latency (post to visibility at the receiver);
//! * `o_s`, `o_r`: send and receive overhead per message (CPU time of the
//!   sender and the receiver; on this NIC the sender's engine also copies,
//!   so `o_s` includes its post and `G` its copy);
//! * `g`: the gap between two messages of one sender (the seeds' fan-out:
//!   on the software NIC the sender's thread does every send itself, so
//!   `g ≈ o_s` and LogfP's `f` is 1);
//! * `G`: time per byte moved; `γ`: time per byte reduced;
//! * `W`: the wake-up of a process that sleeps in its wait, added to `L`
//!   when the job has more processes than cores (they sleep instead of
//!   spinning, so each message on the critical path wakes one).
#![forbid(unsafe_code)]

use crate::coll::tree;

/// Cores of this machine, asked once (the query reads cgroup files: tens
/// of µs, too slow for every collective call).
pub fn cores() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Fitted parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Model {
    /// Latency (µs).
    pub l: f64,
    /// Send overhead (µs).
    pub o_s: f64,
    /// Receive overhead (µs).
    pub o_r: f64,
    /// Gap between consecutive sends of one process (µs).
    pub g: f64,
    /// Time per byte moved (µs/B).
    pub big_g: f64,
    /// Time per byte reduced (µs/B).
    pub gamma: f64,
    /// Wake-up of a sleeping process (µs), paid per hop when oversubscribed.
    pub wake: f64,
}

/// The parameters measured on the reference machine (2 cores, software
/// NIC; `vmpi-bench fit`, see docs/vmpi.md).
pub const FITTED: Model = Model {
    l: 0.35,
    o_s: 0.75,
    o_r: 0.45,
    g: 0.8,
    big_g: 0.000_12,
    gamma: 0.000_25,
    // A wake-up is ~30 µs here, but `vmpi-bench k` measured binomial
    // broadcasts fastest when oversubscribed all the same: children woken
    // together compete for the two cores. So the term is off by default.
    wake: 0.0,
};

impl Model {
    /// The fitted parameters, each overridable by `VMPI_MODEL_<NAME>`
    /// (`L`, `OS`, `OR`, `GAP`, `G`, `GAMMA`).
    pub fn from_env() -> Model {
        static MODEL: std::sync::OnceLock<Model> = std::sync::OnceLock::new();
        *MODEL.get_or_init(Model::read_env)
    }

    fn read_env() -> Model {
        let get = |k: &str, d: f64| {
            crate::coll::select::env(&format!("VMPI_MODEL_{k}"))
                .and_then(|v| v.parse().ok())
                .unwrap_or(d)
        };
        Model {
            l: get("L", FITTED.l),
            o_s: get("OS", FITTED.o_s),
            o_r: get("OR", FITTED.o_r),
            g: get("GAP", FITTED.g),
            big_g: get("G", FITTED.big_g),
            gamma: get("GAMMA", FITTED.gamma),
            wake: get("WAKE", FITTED.wake),
        }
    }

    /// The model for a job of `p` processes on this machine: `L + W` when
    /// the processes outnumber the cores.
    pub fn for_job(&self, p: u32) -> Model {
        let mut m = *self;
        if p as usize > cores() {
            m.l += m.wake;
        }
        m
    }

    /// One message of `m` bytes, end to end.
    pub fn p2p(&self, m: f64) -> f64 {
        self.l + self.o_s + self.o_r + m * self.big_g
    }

    /// k-nomial broadcast: per round, the last of `k-1` sends leaves after
    /// `k-2` gaps, then travels and is received.
    pub fn bcast_knomial(&self, p: u32, m: f64, k: u32) -> f64 {
        let per_send = self.g.max(self.o_s) + m * self.big_g;
        tree::depth(p, k) as f64 * ((k - 2) as f64 * per_send + self.p2p(m))
    }

    /// k-nomial reduce: per round a parent receives and reduces `k-1`
    /// contributions one after the other.
    pub fn reduce_knomial(&self, p: u32, m: f64, k: u32) -> f64 {
        let per_child = self.o_r + m * (self.big_g + self.gamma);
        tree::depth(p, k) as f64 * (self.l + self.o_s + (k - 1) as f64 * per_child)
    }

    /// Rabenseifner: `2 log p` latencies, `2 (p-1)/p` of the vector moved
    /// and `(p-1)/p` reduced.
    pub fn rabenseifner(&self, p: u32, m: f64) -> f64 {
        let lg = tree::depth(p, 2) as f64;
        let f = (p - 1) as f64 / p as f64;
        let pre = if p.is_power_of_two() {
            0.0
        } else {
            2.0 * self.p2p(m) + m * self.gamma
        };
        2.0 * lg * (self.l + self.o_s + self.o_r)
            + 2.0 * f * m * self.big_g
            + f * m * self.gamma
            + pre
    }

    /// Recursive doubling: `log p` exchanges of the whole vector.
    pub fn recursive_doubling(&self, p: u32, m: f64) -> f64 {
        let pre = if p.is_power_of_two() {
            0.0
        } else {
            2.0 * self.p2p(m) + m * self.gamma
        };
        tree::depth(p, 2) as f64 * (self.p2p(m) + m * self.gamma) + pre
    }

    /// Ring reduce-scatter + allgather.
    pub fn ring(&self, p: u32, m: f64) -> f64 {
        let f = (p - 1) as f64 / p as f64;
        2.0 * (p - 1) as f64 * (self.l + self.o_s + self.o_r)
            + 2.0 * f * m * self.big_g
            + f * m * self.gamma
    }

    /// The `k` in `2..=8` that the model says is fastest for a broadcast.
    pub fn best_k_bcast(&self, p: u32, m: f64) -> u32 {
        let s = self.for_job(p);
        (2..=8.min(p.max(2)))
            .min_by(|&a, &b| {
                s.bcast_knomial(p, m, a)
                    .total_cmp(&s.bcast_knomial(p, m, b))
            })
            .unwrap_or(2)
    }

    /// The `k` in `2..=8` that the model says is fastest for a reduce.
    pub fn best_k_reduce(&self, p: u32, m: f64) -> u32 {
        let s = self.for_job(p);
        (2..=8.min(p.max(2)))
            .min_by(|&a, &b| {
                s.reduce_knomial(p, m, a)
                    .total_cmp(&s.reduce_knomial(p, m, b))
            })
            .unwrap_or(2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fewer_rounds_win_when_each_round_costs_a_wake_up() {
        let m = Model {
            wake: 0.0,
            ..FITTED
        };
        // f = 1 (every send by the sender's own thread): binomial or k = 3.
        assert!(m.best_k_bcast(8, 8.0) <= 3);
        let woken = Model {
            wake: 30.0,
            ..FITTED
        };
        let p = 4 * std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
        assert!(
            woken.best_k_bcast(p, 8.0) > 2,
            "k {}",
            woken.best_k_bcast(p, 8.0)
        );
        // Large messages: the per-byte term dominates, binomial.
        assert_eq!(m.best_k_bcast(8, 1e6), 2);
        assert!(m.rabenseifner(8, 4e6) < m.recursive_doubling(8, 4e6));
        assert!(m.recursive_doubling(8, 8.0) < m.ring(8, 8.0));
    }
}
