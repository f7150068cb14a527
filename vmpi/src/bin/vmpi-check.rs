//! `vmpi-check <scenario> [args]`: the multi-process test programs of
//! vmpi's integration tests, run under `via-run`. Each scenario checks its
//! results itself and exits non-zero (panics) on the first wrong one.
#![forbid(unsafe_code)]

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

fn main() {
    env_logger::init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let world = World::init().expect("init");
    let c = world.comm();
    match args.first().map(String::as_str) {
        Some("p2p") => p2p(&c),
        Some("matching") => matching(&c, args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1)),
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
