//! Data movement between two processes: gather/scatter, immediate data,
//! RDMA write, write-with-immediate and read, with the completion seen in
//! memory by a side that only spins (no library call).

use via::descriptor::status::*;
use via::{DescBuilder, Region, Reliability, ViState};
use via_tests::*;

const PEER: &str = env!("CARGO_BIN_EXE_via-peer");

/// `(status, length, immediate)` of a peer's `RECV`/`SEND`/`STATUS` answer.
fn comp(s: &str) -> (u32, u32, u32) {
    let v = nums(s);
    (v[0] as u32, v[1] as u32, v[2] as u32)
}

/// A test process and a connected interpreter peer (the peer listens).
fn pair(
    rel: Reliability,
    rel_s: &str,
    bytes: usize,
    w: bool,
    r: bool,
    tag: &str,
) -> (Setup, Peer, RemoteMem) {
    let s = Setup::new(rel, bytes, w, r);
    let mut p = Peer::serve(PEER);
    // The peer's MaxTransferSize is 1 MiB (the connection uses the smaller).
    let m = RemoteMem::parse(&p.cmd_expect(
        &format!("open {rel_s} {bytes} {} {} 1048576", w as u8, r as u8),
        "MEM",
    ));
    s.connect_to(&mut p, &disc_str(tag));
    (s, p, m)
}

/// Splits `data` over segments of the given sizes placed at `offs`,
/// writing each piece into `mem`; returns the builder with the segments.
fn gather(
    mut b: DescBuilder,
    mem: &Region,
    offs: &[usize],
    sizes: &[usize],
    data: &[u8],
) -> DescBuilder {
    let mut at = 0;
    for (&o, &n) in offs.iter().zip(sizes) {
        mem.write(o, &data[at..at + n]).unwrap();
        b = b.segment(mem, o, n as u32);
        at += n;
    }
    assert_eq!(at, data.len());
    b
}

#[test]
fn gather_scatter_uneven_splits_both_directions() {
    let (s, mut p, _) = pair(
        Reliability::ReliableDelivery,
        "rd",
        1 << 20,
        false,
        false,
        "gs",
    );
    // A second region of the same tag: a message may gather from several.
    let extra = Region::new(&s.nic, 1 << 16, s.ptag, false, false).unwrap();

    // Test -> peer: 6 uneven pieces (one empty) from two regions; the peer
    // scatters into 3 pieces of other sizes, the last one only partly used.
    let sizes = [1usize, 7, 4093, 10000, 0, 3000];
    let n: usize = sizes.iter().sum();
    let data = pattern(n, 11);
    let mut b = DescBuilder::send();
    let mut at = 0;
    for (i, &k) in sizes.iter().enumerate() {
        let (mem, off) = if i % 2 == 0 {
            (&s.mem, 65536 + i * 20000 + 3)
        } else {
            (&extra, i * 5000 + 1)
        };
        mem.write(off, &data[at..at + k]).unwrap();
        b = b.segment(mem, off, k as u32);
        at += k;
    }
    assert_eq!(p.cmd("recv 0 100000:5000 200003:1 300001:13000"), "OK");
    s.vi.post_send(&s.mem, b.write(&s.mem, 0).unwrap()).unwrap();
    assert_eq!(s.vi.send_wait(WAIT).unwrap().status, DONE | OP_SEND);
    let (st, len, _) = comp(&p.cmd_expect("wait_recv", "RECV"));
    assert_eq!((st, len as usize), (DONE | OP_RECEIVE, n));
    let mut got = Vec::new();
    for (off, k) in [(100000, 5000), (200003, 1), (300001, n - 5001)] {
        got.extend(unhex(&p.cmd_expect(&format!("peek 0 {off} {k}"), "DATA")));
    }
    assert!(got == data, "scattered data differs");

    // The maximum, 16 segments on both sides, with different splits.
    let sizes_s: Vec<usize> = (0..16).map(|i| 1 + i * 997 % 4001).collect();
    let n: usize = sizes_s.iter().sum();
    let data = pattern(n, 12);
    let offs: Vec<usize> = (0..16).map(|i| 65536 + i * 8192 + i).collect();
    let b = gather(DescBuilder::send(), &s.mem, &offs, &sizes_s, &data);
    let mut sizes_r: Vec<usize> = (0..15).map(|i| 1 + (i * 1231) % 3001).collect();
    sizes_r.push(n - sizes_r.iter().sum::<usize>());
    let roffs: Vec<usize> = (0..16).map(|i| 100000 + i * 9000 + 2 * i).collect();
    let segs: Vec<String> = roffs
        .iter()
        .zip(&sizes_r)
        .map(|(o, k)| format!("{o}:{k}"))
        .collect();
    assert_eq!(p.cmd(&format!("recv 0 {}", segs.join(" "))), "OK");
    s.vi.post_send(&s.mem, b.write(&s.mem, 0).unwrap()).unwrap();
    assert_eq!(s.vi.send_wait(WAIT).unwrap().status, DONE | OP_SEND);
    let (st, len, _) = comp(&p.cmd_expect("wait_recv", "RECV"));
    assert_eq!((st, len as usize), (DONE | OP_RECEIVE, n));
    let mut got = Vec::new();
    for (o, k) in roffs.iter().zip(&sizes_r) {
        got.extend(unhex(&p.cmd_expect(&format!("peek 0 {o} {k}"), "DATA")));
    }
    assert!(got == data, "16-segment data differs");

    // Peer -> test: 4 pieces gathered by the peer, scattered here over 16
    // uneven pieces (capacity larger than the message).
    let sizes_p = [3usize, 20000, 1, 9999];
    let n: usize = sizes_p.iter().sum();
    let mut at = 0;
    let mut segs = Vec::new();
    let data = pattern(n, 13);
    for (i, &k) in sizes_p.iter().enumerate() {
        let off = 500000 + i * 30000 + 5;
        assert_eq!(
            p.cmd(&format!("poke 0 {off} {}", hex(&data[at..at + k]))),
            "OK"
        );
        segs.push(format!("{off}:{k}"));
        at += k;
    }
    let mut sizes_t: Vec<usize> = (0..16)
        .map(|i| if i == 7 { 0 } else { 1 + i * 311 % 2900 })
        .collect();
    sizes_t[15] = n + 10000 - sizes_t[..15].iter().sum::<usize>();
    let toffs: Vec<usize> = (0..16).map(|i| 600000 + i * 16384 + 7 * i).collect();
    let mut b = DescBuilder::recv();
    for (o, k) in toffs.iter().zip(&sizes_t) {
        b = b.segment(&s.mem, *o, *k as u32);
    }
    s.vi.post_recv(&s.mem, b.write(&s.mem, 64).unwrap())
        .unwrap();
    assert_eq!(p.cmd(&format!("send 0 {}", segs.join(" "))), "OK");
    let (st, _, _) = comp(&p.cmd_expect("wait_send", "SEND"));
    assert_eq!(st, DONE | OP_SEND);
    let c = s.vi.recv_wait(WAIT).unwrap();
    assert_eq!(c.status, DONE | OP_RECEIVE);
    assert_eq!(s.mem.word(64 + 24) as usize, n);
    let mut got = Vec::new();
    let mut left = n;
    for (o, k) in toffs.iter().zip(&sizes_t) {
        let k = (*k).min(left);
        got.extend(s.bytes(*o, k));
        left -= k;
    }
    assert!(got == data, "data scattered here differs");
    p.exit();
}

#[test]
fn immediate_data_on_send() {
    let (s, mut p, _) = pair(
        Reliability::ReliableReception,
        "rr",
        1 << 16,
        false,
        false,
        "imm",
    );
    // With immediate data and a payload.
    let data = s.fill(8192, 100, 5);
    assert_eq!(p.cmd("recv 0 4096:200"), "OK");
    let d = DescBuilder::send()
        .immediate(0xdead_beef)
        .segment(&s.mem, 8192, 100)
        .write(&s.mem, 0)
        .unwrap();
    s.vi.post_send(&s.mem, d).unwrap();
    assert_eq!(s.vi.send_wait(WAIT).unwrap().status, DONE | OP_SEND);
    assert_eq!(
        comp(&p.cmd_expect("wait_recv", "RECV")),
        (DONE | OP_RECEIVE | IMMEDIATE, 100, 0xdead_beef)
    );
    assert_eq!(unhex(&p.cmd_expect("peek 0 4096 100", "DATA")), data);

    // Immediate data alone (no payload, no segment on either side).
    assert_eq!(p.cmd("recv 0"), "OK");
    let d = DescBuilder::send().immediate(7).write(&s.mem, 0).unwrap();
    s.vi.post_send(&s.mem, d).unwrap();
    assert_eq!(s.vi.send_wait(WAIT).unwrap().status, DONE | OP_SEND);
    assert_eq!(
        comp(&p.cmd_expect("wait_recv", "RECV")),
        (DONE | OP_RECEIVE | IMMEDIATE, 0, 7)
    );

    // Without immediate data: no IMMEDIATE bit.
    assert_eq!(p.cmd("recv 0 4096:200"), "OK");
    post_send(&s, 0, 8192, 10);
    s.vi.send_wait(WAIT).unwrap();
    let (st, len, _) = comp(&p.cmd_expect("wait_recv", "RECV"));
    assert_eq!((st, len), (DONE | OP_RECEIVE, 10));

    // Peer -> test, value 0 still flagged.
    post_recv(&s, 64, 16384, 64);
    assert_eq!(p.cmd("send 0 imm=0 4096:3"), "OK");
    let c = s.vi.recv_wait(WAIT).unwrap();
    assert_eq!(c.status, DONE | OP_RECEIVE | IMMEDIATE);
    assert_eq!((s.mem.word(64 + 24), s.mem.word(64 + 20)), (3, 0));
    assert_eq!(comp(&p.cmd_expect("wait_send", "SEND")).0, DONE | OP_SEND);
    p.exit();
}

#[test]
fn receiver_polls_status_in_memory() {
    let (s, mut p, _) = pair(
        Reliability::ReliableDelivery,
        "rd",
        1 << 20,
        false,
        false,
        "poll",
    );
    // The peer spins on CS.Status of its receive, calling nothing.
    let data = s.fill(65536, 70000, 21);
    assert_eq!(p.cmd("recv 0 4096:100000"), "OK");
    p.say("spin_status 0");
    p.expect("SPINNING");
    post_send(&s, 0, 65536, 70000);
    assert_eq!(comp(&p.expect("STATUS")), (DONE | OP_RECEIVE, 70000, 0));
    assert_eq!(s.vi.send_wait(WAIT).unwrap().status, DONE | OP_SEND);
    assert_eq!(unhex(&p.cmd_expect("peek 0 4096 70000", "DATA")), data);
    // The library still dequeues it afterwards.
    assert_eq!(
        comp(&p.cmd_expect("recv_done", "RECV")).0,
        DONE | OP_RECEIVE
    );

    // The test spins on its own descriptor: only memory loads in the loop.
    post_recv(&s, 128, 300000, 8192);
    assert_eq!(s.mem.status(128), 0);
    assert_eq!(p.cmd("fill 0 4096 5000 22"), "OK");
    assert_eq!(p.cmd("send 64 4096:5000"), "OK");
    let deadline = std::time::Instant::now() + WAIT.unwrap();
    let st = loop {
        let st = s.mem.status(128);
        if st & DONE != 0 {
            break st;
        }
        assert!(std::time::Instant::now() < deadline, "no DONE in memory");
        std::hint::spin_loop();
    };
    assert_eq!(st, DONE | OP_RECEIVE);
    assert_eq!(s.mem.word(128 + 24), 5000);
    assert_eq!(s.bytes(300000, 5000), pattern(5000, 22));
    let c = s.vi.recv_done().unwrap();
    assert_eq!((c.desc, c.status), (s.addr(128), DONE | OP_RECEIVE));
    assert_eq!(comp(&p.cmd_expect("wait_send", "SEND")).0, DONE | OP_SEND);
    p.exit();
}

#[test]
fn rdma_write_lands_while_target_spins_on_memory() {
    let (s, mut p, m) = pair(
        Reliability::ReliableDelivery,
        "rd",
        1 << 20,
        true,
        false,
        "rdmaw",
    );
    assert_eq!(p.cmd("fill 0 0 1048576 90"), "OK");
    // 100000 bytes gathered from 3 local pieces into the peer at 8195.
    let n = 100_000;
    let data = pattern(n, 91);
    let b = gather(
        DescBuilder::rdma_write(m.addr + 8195, m.handle),
        &s.mem,
        &[65536, 200001, 400000],
        &[1, 60000, n - 60001],
        &data,
    );
    let d = b.write(&s.mem, 0).unwrap();
    // The peer spins until its memory holds the whole message, making no
    // library call; the write lands while it spins.
    p.say(&format!("spin_mem 0 8195 {n} 91"));
    p.expect("SPINNING");
    s.vi.post_send(&s.mem, d).unwrap();
    assert_eq!(p.line(), "SEEN");
    assert_eq!(s.vi.send_wait(WAIT).unwrap().status, DONE | OP_RDMA_WRITE);
    // Nothing around the target range changed.
    let before = pattern(1 << 20, 90);
    assert_eq!(
        unhex(&p.cmd_expect("peek 0 8131 64", "DATA")),
        before[8131..8195]
    );
    let end = 8195 + n;
    assert_eq!(
        unhex(&p.cmd_expect(&format!("peek 0 {end} 64"), "DATA")),
        before[end..end + 64]
    );
    // No receive was consumed, no error reported.
    assert_eq!(p.cmd("errors"), "ERRORS none");
    assert_eq!(p.cmd_expect("state", "STATE"), "Connected");
    p.exit();
}

/// `Nic::writes_tail_last`: a target polling the last word of each write
/// sees the whole write once the word has its new value. 200-byte writes:
/// glibc's `memcpy` stores the last 32 bytes of 129..256 before part of
/// the middle, so with a plain copy the watcher finds stale bytes (with a
/// plain copy in either of the engine's two paths, this test failed in 7
/// runs of 9: 1 to 30 torn writes).
#[test]
fn rdma_write_stores_its_last_word_last() {
    let (s, mut p, m) = pair(
        Reliability::ReliableDelivery,
        "rd",
        16 << 20,
        true,
        false,
        "tailw",
    );
    // Only the shared-memory NIC makes the promise (a device places an RDMA
    // write's bytes in any order): the query must say so, and the watcher
    // runs where it is promised. The write gathered to an aligned end
    // below holds on every kind.
    let kind = s.nic.kind();
    assert_eq!(
        s.nic.writes_tail_last(),
        kind == "soft",
        "writes_tail_last of the {kind} kind"
    );
    let (slot, len, rounds) = (256usize, 200usize, 60_000u64);
    if s.nic.writes_tail_last() {
        watch_tail(&s, &mut p, &m, slot, len, rounds);
    } else {
        eprintln!("the {kind} kind does not promise the last word last: no watcher");
    }
    // The last word gathered from two local segments (the last holds 3 of
    // its bytes), to an aligned end: every byte lands, nothing around it.
    let data = pattern(200, 7);
    let at = rounds * slot as u64 + 56;
    let b = gather(
        DescBuilder::rdma_write(m.addr + at, m.handle),
        &s.mem,
        &[65536, 70001, 80003],
        &[100, 97, 3],
        &data,
    );
    let d = b.write(&s.mem, 0).unwrap();
    s.vi.post_send(&s.mem, d).unwrap();
    assert_eq!(s.vi.send_wait(WAIT).unwrap().status, DONE | OP_RDMA_WRITE);
    assert_eq!((m.addr + at + 200) % 8, 0);
    let got = unhex(&p.cmd_expect(&format!("peek 0 {} 216", at - 8), "DATA"));
    assert_eq!(&got[8..208], &data[..]);
    assert_eq!((&got[..8], &got[208..]), (&[0u8; 8][..], &[0u8; 8][..]));
    p.exit();
}

/// The watcher part of [`rdma_write_stores_its_last_word_last`]: `rounds`
/// writes of `len` bytes, each ending at the end of its `slot`-byte slot,
/// while the peer polls each slot's last word and counts torn writes.
fn watch_tail(s: &Setup, p: &mut Peer, m: &RemoteMem, slot: usize, len: usize, rounds: u64) {
    p.say(&format!(
        "tail_watch 0 {} {slot} {len} {rounds}",
        slot - len
    ));
    p.expect("WATCHING");
    // Two sources and descriptors in turn: one is filled while the other
    // may still be in flight.
    for k in 0..rounds {
        let i = (k % 2) as usize;
        let src = 4096 + i * 4096;
        let mut b = vec![(k + 1) as u8; len];
        b[len - 8..].copy_from_slice(&(k + 1).to_ne_bytes());
        if k >= 2 {
            let c = s.vi.send_wait(WAIT).unwrap();
            assert_eq!(c.status, DONE | OP_RDMA_WRITE);
        }
        s.mem.write(src, &b).unwrap();
        let to = DescBuilder::rdma_write(m.addr + k * slot as u64 + (slot - len) as u64, m.handle);
        // Odd rounds in two segments: the engine's general path (cursors);
        // even rounds in one: its one-copy path.
        let to = if k % 2 == 1 {
            to.segment(&s.mem, src, 100)
                .segment(&s.mem, src + 100, len as u32 - 100)
        } else {
            to.segment(&s.mem, src, len as u32)
        };
        let d = to.write(&s.mem, i * 64).unwrap();
        s.vi.post_send(&s.mem, d).unwrap();
    }
    assert_eq!(
        p.line(),
        "TAIL 0",
        "a watcher saw the last word before the rest"
    );
    for _ in 0..2 {
        assert_eq!(s.vi.send_wait(WAIT).unwrap().status, DONE | OP_RDMA_WRITE);
    }
}

#[test]
fn rdma_write_with_immediate_consumes_a_receive() {
    let (s, mut p, m) = pair(
        Reliability::ReliableReception,
        "rr",
        1 << 20,
        true,
        false,
        "rdmawi",
    );
    assert_eq!(p.cmd("fill 0 0 1048576 30"), "OK");
    // The receive has a buffer: it must stay untouched (the data goes to
    // the RDMA address).
    assert_eq!(p.cmd("recv 0 4096:1000"), "OK");
    p.say("spin_status 0");
    p.expect("SPINNING");
    let data = s.fill(65536, 5000, 31);
    let d = DescBuilder::rdma_write(m.addr + 100_000, m.handle)
        .immediate(0x1234_5678)
        .segment(&s.mem, 65536, 5000)
        .write(&s.mem, 0)
        .unwrap();
    s.vi.post_send(&s.mem, d).unwrap();
    assert_eq!(
        comp(&p.expect("STATUS")),
        (DONE | OP_REMOTE_RDMA_WRITE | IMMEDIATE, 5000, 0x1234_5678)
    );
    assert_eq!(s.vi.send_wait(WAIT).unwrap().status, DONE | OP_RDMA_WRITE);
    assert_eq!(unhex(&p.cmd_expect("peek 0 100000 5000", "DATA")), data);
    let whole = pattern(1 << 20, 30);
    assert_eq!(
        unhex(&p.cmd_expect("peek 0 4096 1000", "DATA")),
        whole[4096..5096],
        "receive buffer written"
    );
    assert_eq!(
        comp(&p.cmd_expect("recv_done", "RECV")).0,
        DONE | OP_REMOTE_RDMA_WRITE | IMMEDIATE
    );
    // A plain RDMA write consumes nothing.
    assert_eq!(p.cmd("recv 0 4096:1000"), "OK");
    let d = DescBuilder::rdma_write(m.addr + 200_000, m.handle)
        .segment(&s.mem, 65536, 100)
        .write(&s.mem, 0)
        .unwrap();
    s.vi.post_send(&s.mem, d).unwrap();
    assert_eq!(s.vi.send_wait(WAIT).unwrap().status, DONE | OP_RDMA_WRITE);
    assert_eq!(p.cmd("recv_done"), "WAITERR NotDone");
    assert_eq!(
        unhex(&p.cmd_expect("peek 0 200000 100", "DATA")),
        data[..100]
    );
    p.exit();
}

#[test]
fn rdma_read_while_target_spins_on_memory() {
    let (s, mut p, m) = pair(
        Reliability::ReliableDelivery,
        "rd",
        1 << 20,
        true,
        true,
        "rdmar",
    );
    assert_eq!(p.cmd("fill 0 0 1048576 40"), "OK");
    let src = pattern(1 << 20, 40);
    // The peer spins on a flag in its own memory for the whole read.
    p.say("spin_mem 0 0 8 41");
    p.expect("SPINNING");
    let n = 70_000usize;
    let (at, sizes, offs) = (
        12_345usize,
        [10usize, 50_000, n - 50_010],
        [65536usize, 200_003, 400_000],
    );
    let mut b = DescBuilder::rdma_read(m.addr + at as u64, m.handle);
    for (o, k) in offs.iter().zip(&sizes) {
        b = b.segment(&s.mem, *o, *k as u32);
    }
    s.vi.post_send(&s.mem, b.write(&s.mem, 0).unwrap()).unwrap();
    let c = s.vi.send_wait(WAIT).unwrap();
    assert_eq!(c.status, DONE | OP_RDMA_READ);
    let mut got = Vec::new();
    for (o, k) in offs.iter().zip(&sizes) {
        got.extend(s.bytes(*o, *k));
    }
    assert!(got == src[at..at + n], "read data differs");
    // Release the spinner with an RDMA write of its flag.
    s.fill(8192, 8, 41);
    let d = DescBuilder::rdma_write(m.addr, m.handle)
        .segment(&s.mem, 8192, 8)
        .write(&s.mem, 64)
        .unwrap();
    s.vi.post_send(&s.mem, d).unwrap();
    assert_eq!(p.line(), "SEEN");
    assert_eq!(s.vi.send_wait(WAIT).unwrap().status, DONE | OP_RDMA_WRITE);
    assert_eq!(p.cmd_expect("state", "STATE"), "Connected");
    assert_eq!(s.vi.state(), ViState::Connected);
    p.exit();
}
