//! Collective operations: entry points on [`Comm`], argument checks, the
//! selector's choice, and the offloaded variants.
//!
//! | module | what |
//! |---|---|
//! | `net` | the engine and communicator of one call |
//! | `tree` | k-nomial trees |
//! | `algo` | the algorithms (seeds 000 and 002) |
//! | `model` | the LogGP cost model and its fitted parameters |
//! | `select` | algorithm by size and process count |
#![forbid(unsafe_code)]

pub mod algo;
pub mod model;
pub mod net;
pub mod scratch;
pub mod select;
pub mod tree;

use crate::comm::Comm;
use crate::datatype::{Datatype, Element};
use crate::error::{Error, Result};
use crate::op::Op;
use net::Net;

/// Who forwards the messages of barrier and small broadcasts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The calling threads (host-based).
    Host,
    /// The offload context's progress thread (`VMPI_COLL=offload`).
    Offload,
}

impl Mode {
    /// From `VMPI_COLL` (`host`, the default, or `offload`).
    pub fn from_env() -> Mode {
        match std::env::var("VMPI_COLL").as_deref() {
            Ok("offload") => Mode::Offload,
            _ => Mode::Host,
        }
    }
}

fn check_root(comm: &Comm, root: i32) -> Result<u32> {
    if root < 0 || root >= comm.size() {
        return Err(Error::Root(root));
    }
    Ok(root as u32)
}

fn check_count(bytes: usize, dt: Datatype) -> Result<()> {
    if bytes % dt.size != 0 {
        return Err(Error::Count(format!(
            "{bytes} bytes are not whole {}",
            dt.name
        )));
    }
    Ok(())
}

impl Comm {
    /// Blocks until every member has called it (`MPI_Barrier`).
    ///
    /// # Errors
    /// The transport's errors.
    pub fn barrier(&self) -> Result<()> {
        if self.size() == 1 {
            return Ok(());
        }
        if let Some(o) = &self.world.offload {
            return o.barrier(self.context);
        }
        let mut net = Net::new(self);
        match select::barrier() {
            select::Barrier::Dissemination => algo::barrier_dissemination(&mut net)?,
            select::Barrier::Tree(k) => algo::barrier_tree(&mut net, k)?,
        }
        net.finish()
    }

    /// Broadcasts `buf` from `root` (`MPI_Bcast`).
    ///
    /// # Errors
    /// `Root`; `Truncate` where a member's buffer is shorter than the root's.
    pub fn bcast_bytes(&self, buf: &mut [u8], root: i32) -> Result<()> {
        let root = check_root(self, root)?;
        if self.size() == 1 {
            return Ok(());
        }
        if let Some(o) = &self.world.offload {
            if buf.len() <= crate::offload::MAX_BCAST {
                return o.bcast(self.context, buf, root);
            }
        }
        let model = model::Model::from_env();
        let mut net = Net::new(self);
        match select::bcast(&model, net.size(), buf.len()) {
            select::Bcast::Knomial(k) => algo::bcast_knomial(&mut net, buf, root, k)?,
            select::Bcast::ScatterAllgather => algo::bcast_scatter_allgather(&mut net, buf, root)?,
        }
        net.finish()
    }

    /// Broadcasts elements.
    ///
    /// # Errors
    /// As [`Comm::bcast_bytes`].
    pub fn bcast<T: Element>(&self, buf: &mut [T], root: i32) -> Result<()> {
        self.bcast_bytes(bytemuck::cast_slice_mut(buf), root)
    }

    /// Reduces `send` of every member into `recv` at `root` (`MPI_Reduce`);
    /// `recv` is used only at the root and must be as long as `send`.
    ///
    /// # Errors
    /// `Root`, `Op` (not defined for `dt`), `Count`/`Buffer` for lengths.
    pub fn reduce_bytes(
        &self,
        send: &[u8],
        recv: Option<&mut [u8]>,
        dt: Datatype,
        op: &Op,
        root: i32,
    ) -> Result<()> {
        let root = check_root(self, root)?;
        check_count(send.len(), dt)?;
        op.check(dt)?;
        if self.rank == root {
            match recv.as_deref() {
                Some(r) if r.len() == send.len() => {}
                _ => {
                    return Err(Error::Buffer(
                        "the root's receive buffer must match the send buffer".into(),
                    ));
                }
            }
        }
        let model = model::Model::from_env();
        let mut net = Net::new(self);
        let p = net.size();
        let result = if p == 1 {
            let mut b = scratch::take(send.len());
            b.copy_from_slice(send);
            Some(b)
        } else {
            match select::reduce(&model, p, send.len(), op.commutative()) {
                select::Reduce::Knomial(k) => {
                    algo::reduce_knomial(&mut net, send, dt, op, root, k)?
                }
                select::Reduce::Pipeline(seg) => {
                    algo::reduce_pipeline(&mut net, send, dt, op, root, seg)?
                }
                select::Reduce::Rabenseifner => {
                    // Reduce-scatter + gather: the allreduce's first half,
                    // then the blocks to the root.
                    let mut buf = scratch::take(send.len());
                    buf.copy_from_slice(send);
                    let bl = algo::blocks(send.len() / dt.size, p as usize);
                    algo::ring_reduce_scatter(&mut net, &mut buf, dt, op, &bl, false)?;
                    gather_blocks(&mut net, &mut buf, &bl, dt, root)?;
                    (net.rank() == root).then_some(buf)
                }
            }
        };
        if let (Some(res), Some(r)) = (result, recv) {
            r.copy_from_slice(&res);
        }
        net.finish()
    }

    /// Reduces and gives the result to every member (`MPI_Allreduce`).
    ///
    /// # Errors
    /// `Op`, `Count`/`Buffer`.
    pub fn allreduce_bytes(
        &self,
        send: &[u8],
        recv: &mut [u8],
        dt: Datatype,
        op: &Op,
    ) -> Result<()> {
        check_count(send.len(), dt)?;
        if recv.len() != send.len() {
            return Err(Error::Buffer(
                "send and receive buffers differ in length".into(),
            ));
        }
        op.check(dt)?;
        if self.size() == 2 && select::pair_allreduce() {
            // The common case: the message goes at once (eager, a credit)
            // and the receive is direct, straight on the engine.
            let peer = 1 - self.rank;
            let (ctx, tag) = (self.context + 1, algo::tag::ALLREDUCE);
            let mut e = self.engine();
            if e.send_now(ctx, self.rank, self.group[peer as usize], tag, send)? {
                let (_, err) = e.recv(ctx, Some(peer), Some(tag), recv)?;
                drop(e);
                if let Some(err) = err {
                    return Err(err);
                }
                return algo::pair_combine(self.rank, send, recv, dt, op);
            }
            drop(e);
            let mut net = Net::new(self);
            algo::allreduce_pair(&mut net, send, recv, dt, op)?;
            return net.finish();
        }
        recv.copy_from_slice(send);
        if self.size() == 1 {
            return Ok(());
        }
        let model = model::Model::from_env();
        let mut net = Net::new(self);
        let p = net.size();
        let count = send.len() / dt.size;
        match select::allreduce(&model, p, send.len(), op.commutative()) {
            select::Allreduce::RecursiveDoubling => {
                algo::allreduce_recursive_doubling(&mut net, recv, dt, op)?
            }
            select::Allreduce::Rabenseifner if count >= p as usize => {
                algo::allreduce_rabenseifner(&mut net, recv, dt, op)?
            }
            select::Allreduce::Ring if count >= p as usize => {
                let bl = algo::blocks(count, p as usize);
                algo::ring_reduce_scatter(&mut net, recv, dt, op, &bl, true)?
            }
            select::Allreduce::ReduceBcast(k) => {
                let r = algo::reduce_knomial(&mut net, send, dt, op, 0, k)?;
                if let Some(r) = r {
                    recv.copy_from_slice(&r);
                }
                algo::bcast_knomial(&mut net, recv, 0, k)?;
            }
            _ => algo::allreduce_recursive_doubling(&mut net, recv, dt, op)?,
        }
        net.finish()
    }

    /// Allreduce of elements.
    ///
    /// # Errors
    /// As [`Comm::allreduce_bytes`].
    pub fn allreduce<T: Element>(&self, send: &[T], recv: &mut [T], op: &Op) -> Result<()> {
        self.allreduce_bytes(
            bytemuck::cast_slice(send),
            bytemuck::cast_slice_mut(recv),
            T::DATATYPE,
            op,
        )
    }

    /// Inclusive prefix reduction (`MPI_Scan`).
    ///
    /// # Errors
    /// As [`Comm::allreduce_bytes`].
    pub fn scan_bytes(&self, send: &[u8], recv: &mut [u8], dt: Datatype, op: &Op) -> Result<()> {
        check_count(send.len(), dt)?;
        if recv.len() != send.len() {
            return Err(Error::Buffer(
                "send and receive buffers differ in length".into(),
            ));
        }
        op.check(dt)?;
        let mut net = Net::new(self);
        let pipeline = match select::env("VMPI_SCAN").as_deref() {
            Some("pipeline") => true,
            Some("recursive_doubling") => false,
            _ => send.len() >= 128 * 1024 && net.size() > 2,
        };
        if pipeline {
            algo::scan_pipeline(&mut net, send, recv, dt, op, select::segment())?;
        } else {
            algo::scan_recursive_doubling(&mut net, send, recv, dt, op)?;
        }
        net.finish()
    }

    /// Reduces and scatters `counts[i]` elements to member `i`
    /// (`MPI_Reduce_scatter`).
    ///
    /// # Errors
    /// `Count` if `counts` has not one entry per member or a negative one.
    pub fn reduce_scatter_bytes(
        &self,
        send: &[u8],
        recv: &mut [u8],
        counts: &[i32],
        dt: Datatype,
        op: &Op,
    ) -> Result<()> {
        let p = self.size() as usize;
        if counts.len() != p || counts.iter().any(|&c| c < 0) {
            return Err(Error::Count("one non-negative count per member".into()));
        }
        let total: usize = counts.iter().map(|&c| c as usize).sum();
        if send.len() < total * dt.size
            || recv.len() < counts[self.rank as usize] as usize * dt.size
        {
            return Err(Error::Buffer("buffers shorter than the counts".into()));
        }
        op.check(dt)?;
        let mut bl = Vec::with_capacity(p);
        let mut at = 0;
        for &c in counts {
            bl.push((at, c as usize));
            at += c as usize;
        }
        let mine = bl[self.rank as usize];
        let mut buf = scratch::take(total * dt.size);
        buf.copy_from_slice(&send[..total * dt.size]);
        let mut net = Net::new(self);
        if p == 1 {
        } else if op.commutative() {
            algo::ring_reduce_scatter(&mut net, &mut buf, dt, op, &bl, false)?;
        } else {
            // Order kept: reduce to 0 in rank order, then the blocks out.
            let r = algo::reduce_knomial(&mut net, send, dt, op, 0, 2)?;
            if let Some(r) = r {
                buf.copy_from_slice(&r);
            }
            scatter_blocks(&mut net, &mut buf, &bl, dt)?;
        }
        recv[..mine.1 * dt.size]
            .copy_from_slice(&buf[mine.0 * dt.size..(mine.0 + mine.1) * dt.size]);
        net.finish()
    }

    /// Gathers every member's `send` into `recv` in rank order at every
    /// member (`MPI_Allgather`).
    ///
    /// # Errors
    /// `Buffer` if `recv` is not `size` times `send`.
    pub fn allgather_bytes(&self, send: &[u8], recv: &mut [u8]) -> Result<()> {
        let (p, n) = (self.size() as usize, send.len());
        if recv.len() != p * n {
            return Err(Error::Buffer(
                "the receive buffer must hold size × the send buffer".into(),
            ));
        }
        let r = self.rank as usize;
        recv[r * n..(r + 1) * n].copy_from_slice(send);
        let mut net = Net::new(self);
        let rd = match select::env("VMPI_ALLGATHER").as_deref() {
            Some("ring") => false,
            Some("recursive_doubling") => p.is_power_of_two(),
            _ => p.is_power_of_two() && n * p <= 64 * 1024,
        };
        if rd {
            algo::allgather_recursive_doubling(&mut net, recv, n)?;
        } else if p > 1 {
            algo::allgather_ring(&mut net, recv, n)?;
        }
        net.finish()
    }

    /// Sends block `i` of `send` to member `i` and receives block `j` of
    /// `recv` from member `j` (`MPI_Alltoall`).
    ///
    /// # Errors
    /// `Buffer` if the buffers are not `size` equal blocks.
    pub fn alltoall_bytes(&self, send: &[u8], recv: &mut [u8]) -> Result<()> {
        let p = self.size() as usize;
        if send.len() != recv.len() || send.len() % p != 0 {
            return Err(Error::Buffer(
                "send and receive must be size equal blocks".into(),
            ));
        }
        let block = send.len() / p;
        let mut net = Net::new(self);
        if block <= 1024 {
            algo::alltoall_linear(&mut net, send, recv, block)?;
        } else {
            algo::alltoall_pairwise(&mut net, send, recv, block)?;
        }
        net.finish()
    }
}

/// Gathers the reduced blocks of a reduce-scatter to `root`.
fn gather_blocks(
    net: &mut Net,
    buf: &mut [u8],
    bl: &[(usize, usize)],
    dt: Datatype,
    root: u32,
) -> Result<()> {
    let r = net.rank();
    let by = |b: (usize, usize)| (b.0 * dt.size, (b.0 + b.1) * dt.size);
    if r == root {
        let mut ids = Vec::new();
        let mut rest: &mut [u8] = buf;
        let mut base = 0;
        for (i, &b) in bl.iter().enumerate() {
            let (a, e) = by(b);
            let (_, tail) = std::mem::take(&mut rest).split_at_mut(a - base);
            let (mine, tail) = tail.split_at_mut(e - a);
            rest = tail;
            base = e;
            if i as u32 != root {
                ids.push(net.irecv(mine, i as u32, algo::tag::REDUCE)?);
            }
        }
        net.wait_all(&ids)
    } else {
        let (a, e) = by(bl[r as usize]);
        net.send(&buf[a..e], root, algo::tag::REDUCE)
    }
}

/// Sends block `i` of 0's buffer to member `i`.
fn scatter_blocks(
    net: &mut Net,
    buf: &mut [u8],
    bl: &[(usize, usize)],
    dt: Datatype,
) -> Result<()> {
    let r = net.rank();
    let by = |b: (usize, usize)| (b.0 * dt.size, (b.0 + b.1) * dt.size);
    if r == 0 {
        let mut ids = Vec::new();
        for (i, &b) in bl.iter().enumerate().skip(1) {
            let (a, e) = by(b);
            ids.push(net.isend(&buf[a..e], i as u32, algo::tag::REDUCE_SCATTER)?);
        }
        net.wait_all(&ids)
    } else {
        let (a, e) = by(bl[r as usize]);
        net.recv(&mut buf[a..e], 0, algo::tag::REDUCE_SCATTER)
            .map(|_| ())
    }
}
