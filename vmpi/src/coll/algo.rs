//! The collective algorithms (host-based), each over a [`Net`].
//!
//! Ranks are the communicator's; `dt`/`op` describe elements; buffers are
//! bytes. Block splits (Rabenseifner, ring) are in whole elements.
#![forbid(unsafe_code)]

use crate::coll::net::Net;
use crate::coll::scratch;
use crate::coll::tree;
use crate::datatype::Datatype;
use crate::error::{Error, Result};
use crate::op::Op;

/// Tags of the algorithms' messages (in the collective context).
pub mod tag {
    /// Barrier.
    pub const BARRIER: i32 = 1;
    /// Broadcast.
    pub const BCAST: i32 = 2;
    /// Reduce.
    pub const REDUCE: i32 = 3;
    /// Allreduce.
    pub const ALLREDUCE: i32 = 4;
    /// Allgather.
    pub const ALLGATHER: i32 = 5;
    /// Alltoall.
    pub const ALLTOALL: i32 = 6;
    /// Scan.
    pub const SCAN: i32 = 7;
    /// Reduce-scatter.
    pub const REDUCE_SCATTER: i32 = 8;
}

fn rel(r: u32, root: u32, p: u32) -> u32 {
    (r + p - root) % p
}
fn abs(v: u32, root: u32, p: u32) -> u32 {
    (v + root) % p
}

/// Blocks of `count` elements over `n` parts: (first element, elements).
pub fn blocks(count: usize, n: usize) -> Vec<(usize, usize)> {
    let (q, r) = (count / n, count % n);
    let mut out = Vec::with_capacity(n);
    let mut at = 0;
    for i in 0..n {
        let c = q + usize::from(i < r);
        out.push((at, c));
        at += c;
    }
    out
}

/// Dissemination barrier: `ceil(log2 p)` rounds of empty messages.
pub fn barrier_dissemination(net: &mut Net) -> Result<()> {
    let (r, p) = (net.rank(), net.size());
    let mut d = 1;
    while d < p {
        net.sendrecv(&[], (r + d) % p, &mut [], (r + p - d) % p, tag::BARRIER)?;
        d *= 2;
    }
    Ok(())
}

/// Gather-and-broadcast barrier over a k-nomial tree (seed 000's shape).
pub fn barrier_tree(net: &mut Net, k: u32) -> Result<()> {
    let (r, p) = (net.rank(), net.size());
    let kids = tree::children(r, p, k);
    for &(c, _) in &kids {
        net.recv(&mut [], c, tag::BARRIER)?;
    }
    if let Some(parent) = tree::parent(r, k) {
        net.send(&[], parent, tag::BARRIER)?;
        net.recv(&mut [], parent, tag::BARRIER)?;
    }
    let ids: Vec<_> = kids
        .iter()
        .rev()
        .map(|&(c, _)| net.isend(&[], c, tag::BARRIER))
        .collect::<Result<_>>()?;
    net.wait_all(&ids)
}

/// k-nomial broadcast (binomial for `k = 2`): larger subtrees first.
pub fn bcast_knomial(net: &mut Net, buf: &mut [u8], root: u32, k: u32) -> Result<()> {
    let p = net.size();
    let v = rel(net.rank(), root, p);
    if let Some(parent) = tree::parent(v, k) {
        net.recv(buf, abs(parent, root, p), tag::BCAST)?;
    }
    let kids = tree::children(v, p, k);
    let ids: Vec<_> = kids
        .iter()
        .rev()
        .map(|&(c, _)| net.isend(buf, abs(c, root, p), tag::BCAST))
        .collect::<Result<_>>()?;
    net.wait_all(&ids)
}

/// Broadcast of a large buffer: binomial scatter of `p` blocks, then a
/// ring allgather (van de Geijn).
pub fn bcast_scatter_allgather(net: &mut Net, buf: &mut [u8], root: u32) -> Result<()> {
    let p = net.size();
    let v = rel(net.rank(), root, p);
    let bl = blocks(buf.len(), p as usize);
    // Binomial scatter in relative ranks: v holds blocks v..v+stride.
    let span = |lo: u32, hi: u32| {
        (
            bl[lo as usize].0,
            bl[(hi.min(p) - 1) as usize].0 + bl[(hi.min(p) - 1) as usize].1,
        )
    };
    if let Some(parent) = tree::parent(v, 2) {
        let mut s = 1;
        while v % (2 * s) == 0 {
            s *= 2;
        }
        let (a, b) = span(v, v + s);
        net.recv(&mut buf[a..b], abs(parent, root, p), tag::BCAST)?;
    }
    for &(c, s) in tree::children(v, p, 2).iter().rev() {
        let (a, b) = span(c, c + s);
        net.send(&buf[a..b], abs(c, root, p), tag::BCAST)?;
    }
    // Ring allgather of the blocks, in relative ranks.
    let (right, left) = (abs((v + 1) % p, root, p), abs((v + p - 1) % p, root, p));
    for s in 0..p - 1 {
        let sb = bl[((v + p - s) % p) as usize];
        let rb = bl[((v + p - s - 1) % p) as usize];
        let (send, recv) = split_pair(buf, sb, rb);
        net.sendrecv(send, right, recv, left, tag::BCAST)?;
    }
    Ok(())
}

/// Two disjoint element blocks of `buf` as (shared, mutable) slices.
fn split_pair(buf: &mut [u8], a: (usize, usize), b: (usize, usize)) -> (&[u8], &mut [u8]) {
    if a.0 < b.0 {
        let (lo, hi) = buf.split_at_mut(b.0);
        (&lo[a.0..a.0 + a.1], &mut hi[..b.1])
    } else {
        let (lo, hi) = buf.split_at_mut(a.0);
        (&hi[..a.1], &mut lo[b.0..b.0 + b.1])
    }
}

/// k-nomial reduce. Commutative: the tree is rooted at `root` in relative
/// ranks. Otherwise it is rooted at 0 in absolute ranks (children visited
/// in rank order keep the operand order) and 0 forwards to `root`.
/// Each parent posts every child's receive first, then reduces them in
/// order as they arrive. Returns the result at `root`.
pub fn reduce_knomial(
    net: &mut Net,
    send: &[u8],
    dt: Datatype,
    op: &Op,
    root: u32,
    k: u32,
) -> Result<Option<scratch::Scratch>> {
    let p = net.size();
    let tree_root = if op.commutative() { root } else { 0 };
    let v = rel(net.rank(), tree_root, p);
    let mut acc = scratch::take(send.len());
    acc.copy_from_slice(send);
    let kids = tree::children(v, p, k);
    let mut tmps: Vec<scratch::Scratch> = kids.iter().map(|_| scratch::take(send.len())).collect();
    let mut ids = Vec::with_capacity(kids.len());
    for (t, &(c, _)) in tmps.iter_mut().zip(&kids) {
        ids.push(net.irecv(t, abs(c, tree_root, p), tag::REDUCE)?);
    }
    for (t, id) in tmps.iter().zip(ids) {
        let got = net.wait(id)?;
        if (got as usize) < send.len() {
            net.note(Error::Count(format!(
                "a reduce contribution of {got} bytes, expected {}",
                send.len()
            )));
        }
        op.apply_right(dt, &mut acc, t)?;
    }
    match tree::parent(v, k) {
        Some(parent) => {
            net.send(&acc, abs(parent, tree_root, p), tag::REDUCE)?;
            if net.rank() == root {
                // Non-commutative, root != 0: the result comes from 0.
                net.recv(&mut acc, 0, tag::REDUCE)?;
                return Ok(Some(acc));
            }
            Ok(None)
        }
        None if net.rank() == root => Ok(Some(acc)),
        None => {
            net.send(&acc, root, tag::REDUCE)?;
            Ok(None)
        }
    }
}

/// Pipelined chain reduce: ranks `p-1 → … → 0` pass segments of `seg`
/// bytes; each reduces segment `i` (own on the left, so any operation)
/// while later segments are already arriving (all receives are posted
/// first). 0 forwards the result to `root`.
pub fn reduce_pipeline(
    net: &mut Net,
    send: &[u8],
    dt: Datatype,
    op: &Op,
    root: u32,
    seg: usize,
) -> Result<Option<scratch::Scratch>> {
    let (r, p) = (net.rank(), net.size());
    let seg = seg.max(dt.size) / dt.size * dt.size;
    let mut acc = scratch::take(send.len());
    acc.copy_from_slice(send);
    let mut tmp = scratch::take(send.len());
    let n = send.len().div_ceil(seg).max(1);
    let mut rids = Vec::new();
    if r + 1 < p {
        for (i, chunk) in tmp.chunks_mut(seg).enumerate() {
            let _ = i;
            rids.push(net.irecv(chunk, r + 1, tag::REDUCE)?);
        }
        if send.is_empty() {
            rids.push(net.irecv(&mut [], r + 1, tag::REDUCE)?);
        }
    }
    let mut sids = Vec::new();
    for i in 0..n {
        let (a, b) = (i * seg, ((i + 1) * seg).min(send.len()));
        if let Some(&id) = rids.get(i) {
            net.wait(id)?;
            op.apply_right(dt, &mut acc[a..b], &tmp[a..b])?;
        }
        if r > 0 {
            sids.push(net.isend(&acc[a..b], r - 1, tag::REDUCE)?);
        }
    }
    net.wait_all(&sids)?;
    if r == 0 && root != 0 {
        net.send(&acc, root, tag::REDUCE)?;
        return Ok(None);
    }
    if r == root && root != 0 {
        net.recv(&mut acc, 0, tag::REDUCE)?;
    }
    Ok((r == root).then_some(acc))
}

/// Recursive-doubling allreduce (non-powers of two: the first `2r` ranks
/// pair up first, and the odd ones get the result at the end). Operand
/// order is kept (the lower rank's data on the left), so any operation.
pub fn allreduce_recursive_doubling(
    net: &mut Net,
    buf: &mut [u8],
    dt: Datatype,
    op: &Op,
) -> Result<()> {
    let (r, p) = (net.rank(), net.size());
    let pof2 = 1u32 << (31 - p.leading_zeros());
    let rem = p - pof2;
    let mut tmp = scratch::take(buf.len());
    let newrank: Option<u32> = if r < 2 * rem {
        if r % 2 == 0 {
            net.send(buf, r + 1, tag::ALLREDUCE)?;
            None
        } else {
            net.recv(&mut tmp, r - 1, tag::ALLREDUCE)?;
            op.apply(dt, &tmp, buf)?;
            Some(r / 2)
        }
    } else {
        Some(r - rem)
    };
    let real = |nr: u32| if nr < rem { nr * 2 + 1 } else { nr + rem };
    if let Some(nr) = newrank {
        let mut mask = 1;
        while mask < pof2 {
            let partner = real(nr ^ mask);
            net.sendrecv(buf, partner, &mut tmp, partner, tag::ALLREDUCE)?;
            if partner < r {
                op.apply(dt, &tmp, buf)?;
            } else {
                op.apply_right(dt, buf, &tmp)?;
            }
            mask <<= 1;
        }
    }
    if r < 2 * rem {
        if r % 2 == 1 {
            net.send(buf, r - 1, tag::ALLREDUCE)?;
        } else {
            net.recv(buf, r + 1, tag::ALLREDUCE)?;
        }
    }
    Ok(())
}

/// Allreduce of two processes: one exchange, straight from `send` into
/// `recv`, then one local reduction into `recv` (rank 0's contribution on
/// the left). No tree, no temporary, no copy of `send` into `recv` first.
pub fn allreduce_pair(
    net: &mut Net,
    send: &[u8],
    recv: &mut [u8],
    dt: Datatype,
    op: &Op,
) -> Result<()> {
    let peer = 1 - net.rank();
    net.sendrecv(send, peer, recv, peer, tag::ALLREDUCE)?;
    pair_combine(net.rank(), send, recv, dt, op)
}

/// The reduction of [`allreduce_pair`] once `recv` holds the peer's data:
/// rank 0's contribution on the left.
pub fn pair_combine(rank: u32, send: &[u8], recv: &mut [u8], dt: Datatype, op: &Op) -> Result<()> {
    if rank == 0 || op.commutative() {
        // recv = send ∘ recv
        op.apply(dt, send, recv)
    } else {
        // recv = recv ∘ send (rank 1: the peer's data is on the left)
        op.apply_right(dt, recv, send)
    }
}

/// Rabenseifner's allreduce (commutative operations): reduce-scatter by
/// recursive halving, allgather by recursive doubling, with the
/// non-power-of-two pre- and post-steps. Returns at every rank.
pub fn allreduce_rabenseifner(net: &mut Net, buf: &mut [u8], dt: Datatype, op: &Op) -> Result<()> {
    let (r, p) = (net.rank(), net.size());
    let pof2 = 1u32 << (31 - p.leading_zeros());
    let rem = p - pof2;
    let count = buf.len() / dt.size;
    let mut tmp = scratch::take(buf.len());
    let newrank: Option<u32> = if r < 2 * rem {
        if r % 2 == 0 {
            net.send(buf, r + 1, tag::ALLREDUCE)?;
            None
        } else {
            net.recv(&mut tmp, r - 1, tag::ALLREDUCE)?;
            op.apply(dt, &tmp, buf)?;
            Some(r / 2)
        }
    } else {
        Some(r - rem)
    };
    let real = |nr: u32| if nr < rem { nr * 2 + 1 } else { nr + rem };
    if let Some(nr) = newrank {
        let bl = blocks(count, pof2 as usize);
        let bytes =
            |lo: usize, hi: usize| (bl[lo].0 * dt.size, (bl[hi - 1].0 + bl[hi - 1].1) * dt.size);
        // Reduce-scatter: the window [lo, hi) of blocks halves each step.
        let (mut lo, mut hi) = (0usize, pof2 as usize);
        let mut mask = pof2 / 2;
        let mut steps = Vec::new();
        while mask > 0 {
            let partner = nr ^ mask;
            let mid = (lo + hi) / 2;
            let (keep, give) = if nr < partner {
                ((lo, mid), (mid, hi))
            } else {
                ((mid, hi), (lo, mid))
            };
            let (ka, kb) = bytes(keep.0, keep.1);
            let (ga, gb) = bytes(give.0, give.1);
            {
                let (send, recv) = split_pair_bytes(buf, &mut tmp, (ga, gb), (ka, kb));
                net.sendrecv(send, real(partner), recv, real(partner), tag::ALLREDUCE)?;
            }
            op.apply(dt, &tmp[ka..kb], &mut buf[ka..kb])?;
            steps.push((partner, keep, give));
            lo = keep.0;
            hi = keep.1;
            mask /= 2;
        }
        // Allgather: the steps in reverse, windows doubling.
        for &(partner, keep, give) in steps.iter().rev() {
            let (ka, kb) = bytes(keep.0, keep.1);
            let (ga, gb) = bytes(give.0, give.1);
            let (send, recv) = split_pair(buf, (ka, kb - ka), (ga, gb - ga));
            net.sendrecv(send, real(partner), recv, real(partner), tag::ALLREDUCE)?;
        }
    }
    if r < 2 * rem {
        if r % 2 == 1 {
            net.send(buf, r - 1, tag::ALLREDUCE)?;
        } else {
            net.recv(buf, r + 1, tag::ALLREDUCE)?;
        }
    }
    Ok(())
}

/// `buf[send]` as the outgoing slice and `tmp[recv]` as the incoming one.
fn split_pair_bytes<'b>(
    buf: &'b [u8],
    tmp: &'b mut [u8],
    send: (usize, usize),
    recv: (usize, usize),
) -> (&'b [u8], &'b mut [u8]) {
    (&buf[send.0..send.1], &mut tmp[recv.0..recv.1])
}

/// Ring reduce-scatter over `bl` (element blocks) followed, if `gather`,
/// by a ring allgather: the bandwidth-optimal allreduce for large vectors
/// (commutative operations).
pub fn ring_reduce_scatter(
    net: &mut Net,
    buf: &mut [u8],
    dt: Datatype,
    op: &Op,
    bl: &[(usize, usize)],
    gather: bool,
) -> Result<()> {
    let (r, p) = (net.rank(), net.size());
    let by = |b: (usize, usize)| (b.0 * dt.size, b.1 * dt.size);
    let (right, left) = ((r + 1) % p, (r + p - 1) % p);
    let mut tmp = scratch::take(bl.iter().map(|b| b.1).max().unwrap_or(0) * dt.size);
    for s in 0..p - 1 {
        let sb = by(bl[((r + 2 * p - s - 1) % p) as usize]);
        let rb = by(bl[((r + 2 * p - s - 2) % p) as usize]);
        net.sendrecv(
            &buf[sb.0..sb.0 + sb.1],
            right,
            &mut tmp[..rb.1],
            left,
            tag::REDUCE_SCATTER,
        )?;
        op.apply(dt, &tmp[..rb.1], &mut buf[rb.0..rb.0 + rb.1])?;
    }
    if gather {
        for s in 0..p - 1 {
            let sb = by(bl[((r + p - s) % p) as usize]);
            let rb = by(bl[((r + 2 * p - s - 1) % p) as usize]);
            let (send, recv) = split_pair(buf, sb, rb);
            net.sendrecv(send, right, recv, left, tag::ALLREDUCE)?;
        }
    }
    Ok(())
}

/// Ring allgather: `p - 1` steps, each passing one block to the right.
pub fn allgather_ring(net: &mut Net, buf: &mut [u8], block: usize) -> Result<()> {
    let (r, p) = (net.rank(), net.size());
    let (right, left) = ((r + 1) % p, (r + p - 1) % p);
    for s in 0..p - 1 {
        let sb = (((r + p - s) % p) as usize * block, block);
        let rb = (((r + p - s - 1) % p) as usize * block, block);
        let (send, recv) = split_pair(buf, sb, rb);
        net.sendrecv(send, right, recv, left, tag::ALLGATHER)?;
    }
    Ok(())
}

/// Recursive-doubling allgather (powers of two): the held range doubles.
pub fn allgather_recursive_doubling(net: &mut Net, buf: &mut [u8], block: usize) -> Result<()> {
    let (r, p) = (net.rank(), net.size());
    let mut mask = 1;
    while mask < p {
        let partner = r ^ mask;
        let mine = ((r & !(mask - 1)) as usize * block, mask as usize * block);
        let theirs = (
            (partner & !(mask - 1)) as usize * block,
            mask as usize * block,
        );
        let (send, recv) = split_pair(buf, mine, theirs);
        net.sendrecv(send, partner, recv, partner, tag::ALLGATHER)?;
        mask <<= 1;
    }
    Ok(())
}

/// Alltoall by pairwise exchange: step `i` sends to `r + i`, receives
/// from `r - i`.
pub fn alltoall_pairwise(net: &mut Net, send: &[u8], recv: &mut [u8], block: usize) -> Result<()> {
    let (r, p) = (net.rank(), net.size());
    for i in 0..p {
        let (to, from) = ((r + i) % p, (r + p - i) % p);
        let sb = &send[to as usize * block..(to as usize + 1) * block];
        let rb = &mut recv[from as usize * block..(from as usize + 1) * block];
        if to == r {
            rb.copy_from_slice(sb);
        } else {
            net.sendrecv(sb, to, rb, from, tag::ALLTOALL)?;
        }
    }
    Ok(())
}

/// Alltoall for small blocks: every receive and send posted at once.
pub fn alltoall_linear(net: &mut Net, send: &[u8], recv: &mut [u8], block: usize) -> Result<()> {
    let (r, p) = (net.rank(), net.size());
    let mut ids = Vec::new();
    let mut rest: &mut [u8] = recv;
    for i in 0..p as usize {
        let (chunk, tail) = std::mem::take(&mut rest).split_at_mut(block);
        rest = tail;
        if i as u32 != r {
            ids.push(net.irecv(chunk, i as u32, tag::ALLTOALL)?);
        } else {
            chunk.copy_from_slice(&send[i * block..(i + 1) * block]);
        }
    }
    for i in 1..p {
        let to = (r + i) % p;
        ids.push(net.isend(
            &send[to as usize * block..(to as usize + 1) * block],
            to,
            tag::ALLTOALL,
        )?);
    }
    net.wait_all(&ids)
}

/// Inclusive scan by recursive doubling (seed 002's pseudocode): the lower
/// rank's data is always the left operand.
pub fn scan_recursive_doubling(
    net: &mut Net,
    send: &[u8],
    recv: &mut [u8],
    dt: Datatype,
    op: &Op,
) -> Result<()> {
    let (r, p) = (net.rank(), net.size());
    recv.copy_from_slice(send);
    let mut partial = scratch::take(send.len());
    partial.copy_from_slice(send);
    let mut tmp = scratch::take(send.len());
    let mut mask = 1;
    while mask < p {
        let dst = r ^ mask;
        if dst < p {
            net.sendrecv(&partial, dst, &mut tmp, dst, tag::SCAN)?;
            if r > dst {
                op.apply(dt, &tmp, &mut partial)?;
                op.apply(dt, &tmp, recv)?;
            } else {
                op.apply_right(dt, &mut partial, &tmp)?;
            }
        }
        mask <<= 1;
    }
    Ok(())
}

/// Pipelined scan: prefixes flow `0 → p-1` in segments; rank `r` reduces
/// segment `i` while later ones arrive.
pub fn scan_pipeline(
    net: &mut Net,
    send: &[u8],
    recv: &mut [u8],
    dt: Datatype,
    op: &Op,
    seg: usize,
) -> Result<()> {
    let (r, p) = (net.rank(), net.size());
    let seg = seg.max(dt.size) / dt.size * dt.size;
    recv.copy_from_slice(send);
    let mut tmp = scratch::take(send.len());
    let mut rids = Vec::new();
    if r > 0 {
        for chunk in tmp.chunks_mut(seg) {
            rids.push(net.irecv(chunk, r - 1, tag::SCAN)?);
        }
    }
    let mut sids = Vec::new();
    let n = send.len().div_ceil(seg);
    for i in 0..n {
        let (a, b) = (i * seg, ((i + 1) * seg).min(send.len()));
        if let Some(&id) = rids.get(i) {
            net.wait(id)?;
            op.apply(dt, &tmp[a..b], &mut recv[a..b])?;
        }
        if r + 1 < p {
            sids.push(net.isend(&recv[a..b], r + 1, tag::SCAN)?);
        }
    }
    net.wait_all(&sids)
}
