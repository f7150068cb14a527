//! `vmpi-check <scenario> [args]`: the multi-process test programs of
//! vmpi's integration tests, run under `via-run`. Each scenario checks its
//! results itself and exits non-zero (panics) on the first wrong one.
#![forbid(unsafe_code)]

use vmpi::datatype::{Datatype, Kind};
use vmpi::{Builtin, Comm, Op, World};

fn pattern(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Point-to-point across the eager/rendezvous boundary, both directions.
fn p2p(c: &Comm) {
    let (r, p) = (c.rank(), c.size());
    for &n in &[0usize, 1, 63, 64, 4096, 8128, 8129, 65536, 1 << 20, 3 << 20] {
        for peer in 0..p {
            if peer == r {
                continue;
            }
            let tag = (n % 1000) as i32;
            let mine = pattern((r * 1000 + peer) as u64 + n as u64, n);
            let want = pattern((peer * 1000 + r) as u64 + n as u64, n);
            let mut got = vec![0u8; n];
            let st = c
                .sendrecv_bytes(&mine, peer, tag, &mut got, Some(peer), Some(tag))
                .unwrap();
            assert_eq!(st.bytes as usize, n);
            assert_eq!(st.source, peer);
            assert!(got == want, "{n} bytes from {peer}");
        }
    }
    // Self-send.
    let s = c.isend(vec![7u8; 10], r, 5).unwrap();
    let mut b = [0u8; 10];
    c.recv_bytes(&mut b, Some(r), Some(5)).unwrap();
    s.wait().unwrap();
    assert_eq!(b, [7u8; 10]);
}

/// ANY_SOURCE / ANY_TAG matching with random sizes (eager and
/// rendezvous): the receiver picks random wildcard combinations (only ones
/// some message can satisfy) and checks that the messages of one sender
/// and tag arrive in the order they were sent (no overtaking).
fn matching(c: &Comm, seed: u64) {
    let (r, p) = (c.rank(), c.size());
    let per = 200u32;
    let mut rng = (seed ^ (r as u64) << 32) | 1;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    if r == 0 {
        let mut left = vec![[per / 2; 2]; p as usize];
        left[0] = [0, 0];
        let mut last = vec![[-1i64; 2]; p as usize];
        let mut buf = vec![0u8; 40000];
        for _ in 0..per * (p as u32 - 1) {
            let x = next();
            let s = (1 + x % (p as u64 - 1)) as usize;
            let t = ((x >> 8) % 2) as usize;
            let any_t = left.iter().any(|l| l[t] > 0);
            let (src, tag) = match (x >> 16) % 4 {
                0 => (None, None),
                1 if any_t => (None, Some(t as i32)),
                2 if left[s][0] + left[s][1] > 0 => (Some(s as i32), None),
                3 if left[s][t] > 0 => (Some(s as i32), Some(t as i32)),
                _ => (None, None),
            };
            let st = c.recv_bytes(&mut buf, src, tag).unwrap();
            let (s, t) = (st.source as usize, st.tag as usize);
            assert!(src.is_none_or(|x| x as usize == s) && tag.is_none_or(|x| x as usize == t));
            left[s][t] -= 1;
            let seq = u32::from_le_bytes(buf[..4].try_into().unwrap()) as i64;
            assert!(
                seq > last[s][t],
                "from {s} tag {t}: {seq} after {}",
                last[s][t]
            );
            last[s][t] = seq;
            let n = st.bytes as usize;
            assert!(
                buf[4..n] == pattern(seq as u64 + s as u64 * 7, n - 4)[..],
                "payload of {seq} from {s}"
            );
        }
        assert!(left.iter().all(|l| *l == [0, 0]));
    } else {
        // Non-blocking sends: a blocking rendezvous send could wait for a
        // receive that the receiver only posts after a later message.
        let mut reqs = Vec::new();
        for i in 0..per {
            let x = next();
            let n = 4 + if x % 4 == 0 {
                (x >> 10) as usize % 30000
            } else {
                (x >> 20) as usize % 200
            };
            let mut m = i.to_le_bytes().to_vec();
            m.extend(pattern(i as u64 + r as u64 * 7, n - 4));
            reqs.push(c.isend(m, 0, (i % 2) as i32).unwrap());
        }
        for q in reqs {
            q.wait().unwrap();
        }
    }
    c.barrier().unwrap();
}

/// The common case's short cuts and what they fall back to, between ranks
/// 0 and 1 (others idle): blocking exchanges of many small sizes in turn
/// (data read with its header or from the slot; send descriptors written
/// again only when the length changes, also after a rendezvous read or a
/// credit return used the slot), truncation of both, unexpected messages
/// received in another order, wildcards, and more outstanding sends than
/// receive slots.
fn fastpath(c: &Comm) {
    // The transport the test asked for (`VMPI_CHECK_RINGS`: write rings
    // expected in this process).
    if let Some(n) = std::env::var("VMPI_CHECK_RINGS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    {
        assert_eq!(c.write_rings(), n, "write rings in rank {}", c.rank());
    }
    let r = c.rank();
    if r > 1 {
        c.barrier().unwrap();
        return;
    }
    let peer = 1 - r;
    let big = 3 * 4096 + 5;
    let sizes = [
        8usize, 8, 8, 0, 1, 24, 32, 33, 31, 8, 100, 8, 1000, 8, big, 8, 8, 40, 40, 7,
    ];
    for round in 0..40u64 {
        for (k, &n) in sizes.iter().enumerate() {
            let seed = round * 100 + k as u64;
            let tag = (k % 3) as i32;
            let mut got = vec![0xeeu8; n];
            if r == 0 {
                c.send_bytes(&pattern(seed, n), peer, tag).unwrap();
                let st = c.recv_bytes(&mut got, Some(peer), Some(tag)).unwrap();
                assert_eq!((st.bytes as usize, st.source, st.tag), (n, peer, tag));
                assert!(got == pattern(seed + 7, n), "round {round}: {n} bytes back");
            } else {
                // Wildcards on one side: the same messages.
                let (src, t) = match k % 4 {
                    0 => (None, None),
                    1 => (Some(peer), None),
                    2 => (None, Some(tag)),
                    _ => (Some(peer), Some(tag)),
                };
                let st = c.recv_bytes(&mut got, src, t).unwrap();
                assert_eq!((st.bytes as usize, st.source, st.tag), (n, peer, tag));
                assert!(got == pattern(seed, n), "round {round}: {n} bytes");
                c.send_bytes(&pattern(seed + 7, n), peer, tag).unwrap();
            }
        }
    }
    // Truncation: the first bytes land, the error says so, and the next
    // message is intact.
    for &n in &[8usize, 33, 200, big] {
        if r == 0 {
            c.send_bytes(&pattern(n as u64, n), peer, 9).unwrap();
            c.send_bytes(&pattern(1, 8), peer, 9).unwrap();
        } else {
            let room = n / 2;
            let mut got = vec![0u8; room];
            match c.recv_bytes(&mut got, Some(peer), Some(9)) {
                Err(vmpi::Error::Truncate { got: g, room: m }) => {
                    assert_eq!((g as usize, m as usize), (n, room))
                }
                other => panic!("{n} bytes into {room}: {other:?}"),
            }
            assert!(got[..] == pattern(n as u64, n)[..room], "truncated {n}");
            let mut next = [0u8; 8];
            c.recv_bytes(&mut next, None, None).unwrap();
            assert_eq!(next[..], pattern(1, 8)[..]);
        }
    }
    // Unexpected messages: many outstanding sends (more than the receive
    // slots, some rendezvous), received in reverse tag order, then by
    // wildcards in order.
    let m = 48usize;
    if r == 0 {
        let reqs: Vec<_> = (0..m)
            .map(|i| {
                let n = if i % 11 == 5 { big } else { 8 + i % 3 };
                c.isend(pattern(500 + i as u64, n), peer, 100 + i as i32)
                    .unwrap()
            })
            .collect();
        for q in reqs {
            q.wait().unwrap();
        }
    } else {
        // The first receive takes every message before its own from the
        // channel into the unexpected queue.
        let mut got = vec![0u8; big];
        for i in (m / 2..m).rev() {
            let n = if i % 11 == 5 { big } else { 8 + i % 3 };
            let st = c
                .recv_bytes(&mut got, Some(peer), Some(100 + i as i32))
                .unwrap();
            assert_eq!(st.bytes as usize, n);
            assert!(got[..n] == pattern(500 + i as u64, n)[..], "unexpected {i}");
        }
        for i in 0..m / 2 {
            let n = if i % 11 == 5 { big } else { 8 + i % 3 };
            let st = c.recv_bytes(&mut got, None, None).unwrap();
            assert_eq!((st.tag, st.bytes as usize), (100 + i as i32, n));
            assert!(got[..n] == pattern(500 + i as u64, n)[..], "in order {i}");
        }
    }
    c.barrier().unwrap();
}

/// Element `j` of rank `r`'s contribution, for `dt`: small integers, so
/// that every reduction is exact in every order (floats included).
fn contribution(dt: Datatype, r: i32, j: usize, prod: bool) -> Vec<u8> {
    let v: i64 = if prod {
        1 + ((r as i64 + j as i64) % 2)
    } else {
        ((r as i64 * 31 + j as i64 * 7) % 11) - 5
    };
    match dt.kind {
        Kind::Int(1) | Kind::Uint(1) | Kind::Byte => vec![v as u8],
        Kind::Int(2) | Kind::Uint(2) => (v as i16).to_ne_bytes().to_vec(),
        Kind::Int(4) | Kind::Uint(4) => (v as i32).to_ne_bytes().to_vec(),
        Kind::Int(_) | Kind::Uint(_) => v.to_ne_bytes().to_vec(),
        Kind::F32 => (v as f32).to_ne_bytes().to_vec(),
        Kind::F64 => (v as f64).to_ne_bytes().to_vec(),
        _ => unreachable!(),
    }
}

fn vector(dt: Datatype, r: i32, count: usize, prod: bool) -> Vec<u8> {
    (0..count)
        .flat_map(|j| contribution(dt, r, j, prod))
        .collect()
}

/// `v_0 ∘ v_1 ∘ … ∘ v_{last}` computed serially, in rank order.
fn reference(dt: Datatype, op: &Op, last: i32, count: usize, prod: bool) -> Vec<u8> {
    let mut acc = vector(dt, 0, count, prod);
    for r in 1..=last {
        op.apply_right(dt, &mut acc, &vector(dt, r, count, prod))
            .unwrap();
    }
    acc
}

/// A non-commutative operation: 2×2 matrix product over i64 quadruples.
fn matmul() -> Op {
    Op::User {
        f: std::sync::Arc::new(|a: &[u8], b: &mut [u8], _dt| {
            let x: Vec<i64> = a
                .chunks_exact(8)
                .map(|c| i64::from_ne_bytes(c.try_into().unwrap()))
                .collect();
            for (m, y) in x.chunks_exact(4).zip(b.chunks_exact_mut(32)) {
                let n: Vec<i64> = y
                    .chunks_exact(8)
                    .map(|c| i64::from_ne_bytes(c.try_into().unwrap()))
                    .collect();
                let r = [
                    m[0].wrapping_mul(n[0])
                        .wrapping_add(m[1].wrapping_mul(n[2])),
                    m[0].wrapping_mul(n[1])
                        .wrapping_add(m[1].wrapping_mul(n[3])),
                    m[2].wrapping_mul(n[0])
                        .wrapping_add(m[3].wrapping_mul(n[2])),
                    m[2].wrapping_mul(n[1])
                        .wrapping_add(m[3].wrapping_mul(n[3])),
                ];
                for (k, v) in r.iter().enumerate() {
                    y[8 * k..8 * k + 8].copy_from_slice(&v.to_ne_bytes());
                }
            }
        }),
        commute: false,
    }
}

/// Every collective against its serial reference: counts (0, small,
/// around p, non-powers of two, large), roots, operations, datatypes, a
/// non-commutative user operation. `quick`: fewer combinations (for many
/// processes on 2 cores).
fn collectives(c: &Comm, quick: bool) {
    use vmpi::datatype::*;
    let (r, p) = (c.rank(), c.size());
    let pu = p as usize;
    let mut counts = vec![0usize, 1, 2, 7, pu.saturating_sub(1), pu, pu + 1, 1031];
    if !quick {
        counts.extend([4096, 40_000, 300_000]);
    }
    let types = if quick {
        vec![INT, DOUBLE]
    } else {
        vec![INT, DOUBLE, UNSIGNED_CHAR, LONG, FLOAT, SHORT]
    };
    let ops = [
        Builtin::Sum,
        Builtin::Max,
        Builtin::Min,
        Builtin::Prod,
        Builtin::Band,
        Builtin::Lxor,
    ];
    let roots: Vec<i32> = if quick {
        vec![0, p - 1]
    } else {
        vec![0, p / 2, p - 1]
    };
    for &n in &counts {
        for &dt in &types {
            for &b in &ops {
                let op = Op::Builtin(b);
                if op.check(dt).is_err() {
                    continue;
                }
                // Large vectors: two types and two operations are enough.
                if n >= 40_000
                    && !((dt == INT || dt == DOUBLE) && (b == Builtin::Sum || b == Builtin::Max))
                {
                    continue;
                }
                let prod = b == Builtin::Prod;
                let mine = vector(dt, r, n, prod);
                let want = reference(dt, &op, p - 1, n, prod);
                let mut got = vec![0u8; mine.len()];
                c.allreduce_bytes(&mine, &mut got, dt, &op).unwrap();
                assert!(got == want, "allreduce {b:?} {} x{n}", dt.name);
                for &root in &roots {
                    let mut got = vec![0u8; mine.len()];
                    let out = (r == root).then_some(&mut got[..]);
                    c.reduce_bytes(&mine, out, dt, &op, root).unwrap();
                    if r == root {
                        assert!(got == want, "reduce {b:?} {} x{n} root {root}", dt.name);
                    }
                }
                if b == Builtin::Sum || b == Builtin::Max {
                    let mut got = vec![0u8; mine.len()];
                    c.scan_bytes(&mine, &mut got, dt, &op).unwrap();
                    assert!(
                        got == reference(dt, &op, r, n, prod),
                        "scan {b:?} {} x{n}",
                        dt.name
                    );
                    // Reduce-scatter, uneven blocks (zeros included).
                    let rc: Vec<i32> = (0..p)
                        .map(|i| ((n + i as usize) % 3 * (n / pu.max(1) + 1)) as i32)
                        .collect();
                    let total: usize = rc.iter().map(|&x| x as usize).sum();
                    let mine = vector(dt, r, total, prod);
                    let want = reference(dt, &op, p - 1, total, prod);
                    let mut got = vec![0u8; rc[r as usize] as usize * dt.size];
                    c.reduce_scatter_bytes(&mine, &mut got, &rc, dt, &op)
                        .unwrap();
                    let at: usize =
                        rc[..r as usize].iter().map(|&x| x as usize).sum::<usize>() * dt.size;
                    assert!(
                        got == want[at..at + got.len()],
                        "reduce_scatter {b:?} {} x{total}",
                        dt.name
                    );
                }
            }
        }
        // Broadcast, allgather, alltoall of bytes.
        for &root in &roots {
            let mut buf = if r == root {
                pattern(root as u64 + n as u64, n)
            } else {
                vec![0u8; n]
            };
            c.bcast_bytes(&mut buf, root).unwrap();
            assert!(
                buf == pattern(root as u64 + n as u64, n),
                "bcast {n} from {root}"
            );
        }
        let block = n.min(20_000);
        let mine = pattern(r as u64 * 3 + 1, block);
        let mut all = vec![0u8; block * pu];
        c.allgather_bytes(&mine, &mut all).unwrap();
        for q in 0..pu {
            assert!(
                all[q * block..(q + 1) * block] == pattern(q as u64 * 3 + 1, block),
                "allgather {block}"
            );
        }
        let send: Vec<u8> = (0..pu)
            .flat_map(|q| pattern((r as u64) << 20 | q as u64, block))
            .collect();
        let mut recv = vec![0u8; send.len()];
        c.alltoall_bytes(&send, &mut recv).unwrap();
        for q in 0..pu {
            assert!(
                recv[q * block..(q + 1) * block] == pattern((q as u64) << 20 | r as u64, block),
                "alltoall {block}"
            );
        }
        // Non-commutative: the order of ranks is kept.
        let mm = matmul();
        let mat = |q: i32| -> Vec<u8> {
            (0..n.min(5000))
                .flat_map(|j| [1i64, q as i64 + j as i64 % 3, 0, 1 + (q as i64 % 2)])
                .flat_map(i64::to_ne_bytes)
                .collect()
        };
        let mut want = mat(0);
        let mut prefix = Vec::new();
        for q in 1..p {
            if q == r + 1 {
                prefix = want.clone();
            }
            mm.apply_right(LONG, &mut want, &mat(q)).unwrap();
        }
        if r == p - 1 {
            prefix = want.clone();
        }
        let mine = mat(r);
        let mut got = vec![0u8; mine.len()];
        c.allreduce_bytes(&mine, &mut got, LONG, &mm).unwrap();
        assert!(got == want, "non-commutative allreduce x{n}");
        for &root in &roots {
            let mut got = vec![0u8; mine.len()];
            let out = (r == root).then_some(&mut got[..]);
            c.reduce_bytes(&mine, out, LONG, &mm, root).unwrap();
            if r == root {
                assert!(got == want, "non-commutative reduce x{n} root {root}");
            }
        }
        let mut got = vec![0u8; mine.len()];
        c.scan_bytes(&mine, &mut got, LONG, &mm).unwrap();
        assert!(got == prefix, "non-commutative scan x{n}");
    }
    // MAXLOC over (double, int) pairs.
    let v = ((r + 3) % p) as f64;
    let mine = [
        v.to_ne_bytes().to_vec(),
        r.to_ne_bytes().to_vec(),
        vec![0u8; 4],
    ]
    .concat();
    let mut got = vec![0u8; 16];
    c.allreduce_bytes(&mine, &mut got, DOUBLE_INT, &Op::Builtin(Builtin::Maxloc))
        .unwrap();
    assert_eq!(
        f64::from_ne_bytes(got[..8].try_into().unwrap()),
        (p - 1) as f64
    );
    assert_eq!(
        i32::from_ne_bytes(got[8..12].try_into().unwrap()),
        (2 * p - 4) % p
    );
    // Communicators: split by parity, dup, collectives inside; a barrier
    // on each.
    let half = c.split(r % 2, -r).unwrap().unwrap();
    let d = half.dup().unwrap();
    let mut all = vec![0u8; 4 * d.size() as usize];
    d.allgather_bytes(&r.to_ne_bytes(), &mut all).unwrap();
    let members: Vec<i32> = all
        .chunks_exact(4)
        .map(|b| i32::from_ne_bytes(b.try_into().unwrap()))
        .collect();
    let mut want: Vec<i32> = (0..p).filter(|q| q % 2 == r % 2).collect();
    want.reverse();
    assert_eq!(members, want);
    assert!(c.split(-1, 0).unwrap().is_none());
    d.barrier().unwrap();
    half.barrier().unwrap();
    c.barrier().unwrap();
}

/// Barriers and small broadcasts many times (the offloaded operations),
/// interleaved with point-to-point traffic and on a second communicator.
fn offload(c: &Comm) {
    let (r, p) = (c.rank(), c.size());
    let d = c.dup().unwrap();
    for i in 0..300usize {
        let root = (i % p as usize) as i32;
        let n = [0, 1, 8, 100, 4000][i % 5];
        let mut buf = if r == root {
            pattern(i as u64, n)
        } else {
            vec![0u8; n]
        };
        c.bcast_bytes(&mut buf, root).unwrap();
        assert!(buf == pattern(i as u64, n), "bcast {i}");
        if i % 3 == 0 {
            c.barrier().unwrap();
        }
        if i % 7 == 0 {
            d.bcast_bytes(&mut buf, (root + 1) % p).unwrap();
            d.barrier().unwrap();
            let right = (r + 1) % p;
            let left = (r + p - 1) % p;
            let mut got = [0u8; 4];
            c.sendrecv_bytes(
                &(i as u32).to_le_bytes(),
                right,
                1,
                &mut got,
                Some(left),
                Some(1),
            )
            .unwrap();
            assert_eq!(u32::from_le_bytes(got), i as u32);
        }
    }
    c.barrier().unwrap();
}

/// Bad input through the Rust API gives the MPI error class a user
/// expects, and the communicator keeps working afterwards.
fn errors(c: &Comm) {
    use vmpi::Error;
    let (r, p) = (c.rank(), c.size());
    assert!(matches!(c.send_bytes(&[1], p, 0), Err(Error::Rank(_))));
    assert!(matches!(c.send_bytes(&[1], -1, 0), Err(Error::Rank(_))));
    assert!(matches!(c.send_bytes(&[1], 0, -4), Err(Error::Tag(-4))));
    assert!(matches!(
        c.send_bytes(&[1], 0, vmpi::TAG_UB + 1),
        Err(Error::Tag(_))
    ));
    assert!(matches!(
        c.recv_bytes(&mut [0], Some(p + 2), None),
        Err(Error::Rank(_))
    ));
    assert!(matches!(c.bcast_bytes(&mut [0], p), Err(Error::Root(_))));
    let sum = Op::Builtin(Builtin::Sum);
    let band = Op::Builtin(Builtin::Band);
    let mut out = [0u8; 8];
    assert!(matches!(
        c.allreduce_bytes(&[0u8; 8], &mut out, vmpi::datatype::DOUBLE, &band),
        Err(Error::Op(_))
    ));
    assert!(matches!(
        c.allreduce_bytes(&[0u8; 6], &mut out[..6], vmpi::datatype::DOUBLE, &sum),
        Err(Error::Count(_))
    ));
    assert!(matches!(
        c.allreduce_bytes(&[0u8; 8], &mut out[..4], vmpi::datatype::DOUBLE, &sum),
        Err(Error::Buffer(_))
    ));
    assert_eq!(vmpi::Error::Truncate { got: 2, room: 1 }.code(), 15);
    // Truncation, eager and rendezvous: the buffer holds the first bytes.
    for n in [10usize, 100_000] {
        let peer = (r + 1) % p;
        let from = (r + p - 1) % p;
        let s = c.isend(pattern(n as u64, n), peer, 3).unwrap();
        let mut small = vec![0u8; n / 2];
        match c.recv_bytes(&mut small, Some(from), Some(3)) {
            Err(Error::Truncate { got, room }) => assert_eq!((got, room), (n as u64, n as u64 / 2)),
            other => panic!("expected a truncation, got {other:?}"),
        }
        assert!(small == pattern(n as u64, n)[..n / 2]);
        s.wait().unwrap();
    }
    // Still usable.
    let mut total = [0i32];
    c.allreduce(&[1i32], &mut total, &sum).unwrap();
    assert_eq!(total[0], p);
    assert!(
        c.iprobe(None, None).unwrap().is_none(),
        "a message is left over"
    );
}

fn main() {
    env_logger::init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let world = World::init().expect("init");
    let c = world.comm();
    match args.first().map(String::as_str) {
        Some("p2p") => p2p(&c),
        Some("fastpath") => fastpath(&c),
        Some("matching") => matching(&c, args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1)),
        Some("no-finalize") => {
            // Rank 1 leaves without finalizing: the launcher ends the job.
            if c.rank() == 1 {
                std::process::exit(0);
            }
            // Rank 0 waits for a message that never comes (its receive
            // fails when rank 1's connections go): the launcher must end it.
            let mut b = [0u8; 1];
            let _ = c.recv_bytes(&mut b, Some(1), Some(0));
            loop {
                std::thread::park();
            }
        }
        Some("coll") => collectives(&c, args.get(1).is_some_and(|a| a == "quick")),
        Some("offload") => offload(&c),
        Some("errors") => errors(&c),
        Some("allreduce") => {
            let mut out = [0i64];
            c.allreduce(&[c.rank() as i64 + 1], &mut out, &Op::Builtin(Builtin::Sum))
                .unwrap();
            let p = c.size() as i64;
            assert_eq!(out[0], p * (p + 1) / 2);
        }
        other => panic!("unknown scenario {other:?}"),
    }
    world.finalize().expect("finalize");
    if c.rank() == 0 {
        println!("PASS {}", args.join(" "));
    }
}
