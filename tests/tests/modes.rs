//! The non-default data paths, end to end between two processes: payload
//! inline in the doorbell entry (`VIA_INLINE`), cross-memory attach for all
//! registered memory (`VIA_REGISTER=cma`), per-VI doorbells
//! (`VIA_DOORBELL=per-vi`) and a dedicated engine thread
//! (`VIA_PROGRESS=thread`). The configuration is read once per process, so
//! each mode runs in a child process of this test executable; the peers it
//! starts inherit the setting. Each run does a ping-pong over sizes around
//! the inline threshold with the data checked, a gathered send scattered on
//! the other side, and an RDMA write and read with the target memory
//! checked.

use std::time::Duration;

use via::config::{Config, Progress};
use via::descriptor::status::*;
use via::{DescBuilder, Reliability};
use via_tests::*;

const PEER: &str = env!("CARGO_BIN_EXE_via-peer");
/// Set (to the mode's name) only in the child processes.
const CHILD: &str = "VIA_TESTS_MODE_CHILD";
const LIMIT: Duration = Duration::from_secs(240);

fn run(mode: &str, env: &[(&str, &str)]) {
    let mut all = env.to_vec();
    all.push((CHILD, mode));
    run_child_test("mode_child", &all, LIMIT);
}

#[test]
fn inline_payloads() {
    run("inline", &[("VIA_INLINE", "64")]);
}

#[test]
fn cross_memory_attach_registration() {
    run("cma", &[("VIA_REGISTER", "cma")]);
}

#[test]
fn per_vi_doorbells() {
    run("per-vi", &[("VIA_DOORBELL", "per-vi")]);
}

#[test]
fn engine_thread() {
    run("thread", &[("VIA_PROGRESS", "thread")]);
}

/// Checks that the child really runs in `mode`.
fn check_mode(mode: &str) {
    let c = Config::get();
    match mode {
        "inline" => assert_eq!(c.inline, 64),
        "cma" => assert_eq!(c.register, via::mem::arena::Policy::Cma),
        "per-vi" => assert_eq!(c.doorbell.as_str(), "per-vi"),
        "thread" => assert_eq!(c.progress, Progress::Thread),
        _ => panic!("unknown mode {mode}"),
    }
}

/// The body of the tests above; does nothing unless run by them.
#[test]
fn mode_child() {
    let Ok(mode) = std::env::var(CHILD) else {
        return;
    };
    check_mode(&mode);
    pingpong();
    gather_scatter_and_rdma();
}

/// Echo ping-pong over sizes on both sides of the inline threshold.
fn pingpong() {
    let sizes = [0usize, 1, 7, 8, 63, 64, 65, 100, 4095, 4097, 65536, 300_000];
    let max = 300_000;
    let d = disc_str("mode-pp");
    let mut peer = Peer::spawn(
        PEER,
        &["echo", &d, "rd", &max.to_string(), &sizes.len().to_string()],
    );
    peer.expect("LISTENING");
    let s = Setup::new(Reliability::ReliableDelivery, 2 * max + 8192, false, false);
    s.vi.connect(
        &s.nic.address(b"client"),
        &s.nic.address(d.as_bytes()),
        WAIT,
    )
    .expect("connect");
    let (sbuf, rbuf) = (4096, 4096 + max);
    for (r, &n) in sizes.iter().enumerate() {
        let data = s.fill(sbuf, n, r as u32);
        post_recv(&s, 0, rbuf, max as u32);
        post_send(&s, 128, sbuf, n as u32);
        assert_eq!(s.vi.send_wait(WAIT).unwrap().status, DONE | OP_SEND);
        let c = s.vi.recv_wait(WAIT).unwrap();
        assert_eq!(c.status, DONE | OP_RECEIVE, "size {n}");
        assert_eq!(s.mem.word(24) as usize, n, "length");
        assert!(s.bytes(rbuf, n) == data, "data mismatch at size {n}");
    }
    peer.expect("DONE");
    peer.finish();
}

/// A small gathered send into a scattered receive (inline-sized), then an
/// RDMA write and an RDMA read, against the interpreter peer.
fn gather_scatter_and_rdma() {
    let bytes = 1 << 20;
    let s = Setup::new(Reliability::ReliableDelivery, bytes, true, true);
    let mut p = Peer::serve(PEER);
    let m = RemoteMem::parse(&p.cmd_expect(&format!("open rd {bytes} 1 1 1048576"), "MEM"));
    s.connect_to(&mut p, &disc_str("mode-rdma"));
    assert_eq!(p.cmd("fill 0 0 1048576 50"), "OK");
    let before = pattern(1 << 20, 50);

    // 40 bytes gathered from 3 pieces, scattered over 2 on the peer.
    let data = pattern(40, 51);
    s.mem.write(8192, &data[..5]).unwrap();
    s.mem.write(9000, &data[5..30]).unwrap();
    s.mem.write(10001, &data[30..]).unwrap();
    assert_eq!(p.cmd("recv 0 4096:17 5000:100"), "OK");
    let d = DescBuilder::send()
        .segment(&s.mem, 8192, 5)
        .segment(&s.mem, 9000, 25)
        .segment(&s.mem, 10001, 10)
        .write(&s.mem, 0)
        .unwrap();
    s.vi.post_send(&s.mem, d).unwrap();
    assert_eq!(s.vi.send_wait(WAIT).unwrap().status, DONE | OP_SEND);
    let v = nums(&p.cmd_expect("wait_recv", "RECV"));
    assert_eq!((v[0] as u32, v[1]), (DONE | OP_RECEIVE, 40));
    assert_eq!(unhex(&p.cmd_expect("peek 0 4096 17", "DATA")), data[..17]);
    assert_eq!(unhex(&p.cmd_expect("peek 0 5000 23", "DATA")), data[17..]);
    assert_eq!(
        unhex(&p.cmd_expect("peek 0 5023 16", "DATA")),
        before[5023..5039],
        "scatter wrote past the message"
    );

    // RDMA write: 24 bytes (inline-sized) and 200000 bytes.
    for (n, at, seed) in [(24usize, 300_001usize, 52u32), (200_000, 500_000, 53)] {
        let data = s.fill(65536, n, seed);
        let d = DescBuilder::rdma_write(m.addr + at as u64, m.handle)
            .segment(&s.mem, 65536, n as u32)
            .write(&s.mem, 0)
            .unwrap();
        s.vi.post_send(&s.mem, d).unwrap();
        assert_eq!(s.vi.send_wait(WAIT).unwrap().status, DONE | OP_RDMA_WRITE);
        let got = unhex(&p.cmd_expect(&format!("peek 0 {at} {n}"), "DATA"));
        assert!(got == data, "RDMA write of {n} bytes differs");
        let after = unhex(&p.cmd_expect(&format!("peek 0 {} 64", at + n), "DATA"));
        assert_eq!(after, before[at + n..at + n + 64], "written past the end");
    }

    // RDMA read of 100000 bytes from an untouched part of the peer.
    let (at, n) = (700_003usize, 100_000usize);
    let d = DescBuilder::rdma_read(m.addr + at as u64, m.handle)
        .segment(&s.mem, 400_000, n as u32)
        .write(&s.mem, 0)
        .unwrap();
    s.vi.post_send(&s.mem, d).unwrap();
    assert_eq!(s.vi.send_wait(WAIT).unwrap().status, DONE | OP_RDMA_READ);
    assert!(
        s.bytes(400_000, n) == before[at..at + n],
        "RDMA read differs"
    );
    assert_eq!(p.cmd("errors"), "ERRORS none");
    p.exit();
}
