//! Several threads posting (and dequeuing) at once, on one VI and on
//! several: every message arrives exactly once, and each thread's messages
//! keep their order (the work queues are FIFO). The peer (`sink`) checks
//! the receiving side.

use std::collections::HashMap;

use via::descriptor::status::*;
use via::{DescBuilder, Region, Reliability, Vi};
use via_tests::*;

const PEER: &str = env!("CARGO_BIN_EXE_via-peer");
const SIZE: usize = 64;

/// Message `seq` of thread `t`: header then the pattern the sink expects.
fn message(t: u32, seq: u32) -> Vec<u8> {
    let mut m = t.to_le_bytes().to_vec();
    m.extend(seq.to_le_bytes());
    m.extend(pattern(SIZE - 8, t * 100_000 + seq));
    m
}

/// Slot of (thread, seq) in the region: descriptor at `k * 64`, payload at
/// `payload + k * SIZE`.
struct Layout {
    per_thread: usize,
    payload: usize,
}

impl Layout {
    fn slot(&self, t: usize, seq: usize) -> usize {
        t * self.per_thread + seq
    }
    /// (thread, seq) of the descriptor at `desc` (offset in the region).
    fn owner(&self, desc: usize) -> (usize, usize) {
        let k = desc / 64;
        (k / self.per_thread, k % self.per_thread)
    }
}

/// Thread `t` posts its messages on `vi`.
fn post_all(vi: &Vi, mem: &Region, l: &Layout, t: usize) {
    for seq in 0..l.per_thread {
        let k = l.slot(t, seq);
        mem.write(l.payload + k * SIZE, &message(t as u32, seq as u32))
            .unwrap();
        let d = DescBuilder::send()
            .segment(mem, l.payload + k * SIZE, SIZE as u32)
            .write(mem, k * 64)
            .unwrap();
        vi.post_send(mem, d)
            .unwrap_or_else(|e| panic!("thread {t} seq {seq}: {e:?}"));
    }
}

/// Dequeues `n` send completions of `vi`; checks each thread's order.
/// Returns how many came from each thread.
fn drain(vi: &Vi, mem: &Region, l: &Layout, n: usize) -> HashMap<usize, usize> {
    let base = mem.addr(0).unwrap();
    let mut last: HashMap<usize, usize> = HashMap::new();
    let mut count: HashMap<usize, usize> = HashMap::new();
    for _ in 0..n {
        let c = vi.send_wait(WAIT).expect("send completion");
        assert_eq!(c.status, DONE | OP_SEND);
        let (t, seq) = l.owner((c.desc - base) as usize);
        if let Some(p) = last.insert(t, seq) {
            assert!(seq > p, "thread {t}: completion of {p} before {seq}");
        }
        *count.entry(t).or_default() += 1;
    }
    count
}

#[test]
fn threads_post_on_one_vi() {
    const THREADS: usize = 4;
    const PER: usize = 128;
    let s = Setup::new(
        Reliability::ReliableDelivery,
        THREADS * PER * (64 + SIZE) + 4096,
        false,
        false,
    );
    let d = disc_str("thr1");
    let n = THREADS * PER;
    let mut p = Peer::spawn(
        PEER,
        &["sink", &d, "rd", "1", &n.to_string(), &SIZE.to_string()],
    );
    p.expect("LISTENING");
    s.vi.connect(&s.nic.address(b"c"), &s.nic.address(d.as_bytes()), WAIT)
        .expect("connect");
    let l = Layout {
        per_thread: PER,
        payload: n * 64,
    };
    std::thread::scope(|sc| {
        for t in 0..THREADS {
            let (s, l) = (&s, &l);
            sc.spawn(move || post_all(&s.vi, &s.mem, l, t));
        }
    });
    let count = drain(&s.vi, &s.mem, &l, n);
    assert!(count.values().all(|&c| c == PER), "{count:?}");
    assert_eq!(p.expect("VI 0"), THREADS.to_string());
    p.expect("DONE");
    p.say("bye");
    p.finish();
}

#[test]
fn threads_post_and_poll_on_several_vis() {
    const VIS: usize = 4;
    const THREADS: usize = 8;
    const PER: usize = 64;
    let per_vi = THREADS / VIS * PER;
    let s = Setup::new(
        Reliability::ReliableReception,
        THREADS * PER * (64 + SIZE) + 4096,
        false,
        false,
    );
    let mut vis = vec![];
    let d = disc_str("thrn");
    let mut p = Peer::spawn(
        PEER,
        &[
            "sink",
            &d,
            "rr",
            &VIS.to_string(),
            &per_vi.to_string(),
            &SIZE.to_string(),
        ],
    );
    p.expect("LISTENING");
    for i in 0..VIS {
        let v = s.nic.create_vi(&s.vi.attributes(), None, None).unwrap();
        v.connect(
            &s.nic.address(format!("c{i}").as_bytes()),
            &s.nic.address(d.as_bytes()),
            WAIT,
        )
        .expect("connect");
        vis.push(v);
    }
    let l = Layout {
        per_thread: PER,
        payload: THREADS * PER * 64,
    };
    // Thread t posts on VI t % VIS; threads 0..VIS also dequeue their VI's
    // completions while the others are still posting.
    let counts = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..THREADS)
            .map(|t| {
                let (vi, mem, l) = (&vis[t % VIS], &s.mem, &l);
                sc.spawn(move || {
                    post_all(vi, mem, l, t);
                    (t < VIS).then(|| drain(vi, mem, l, per_vi))
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    for (i, c) in counts.into_iter().take(VIS).enumerate() {
        let c = c.unwrap();
        let want: HashMap<usize, usize> = [(i, PER), (i + VIS, PER)].into();
        assert_eq!(c, want, "VI {i}");
    }
    for i in 0..VIS {
        assert_eq!(p.expect(&format!("VI {i}")), (THREADS / VIS).to_string());
    }
    p.expect("DONE");
    p.say("bye");
    p.finish();
}
