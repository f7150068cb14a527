//! Connection management between two processes: reject, timeout,
//! reliability mismatch, peer-to-peer, and disconnect (flushing both sides,
//! then connecting again).

use std::time::{Duration, Instant};

use via::descriptor::status::*;
use via::{DescBuilder, Error, ErrorCode, Reliability, ViState};
use via_tests::*;

const PEER: &str = env!("CARGO_BIN_EXE_via-peer");
const T: Duration = Duration::from_secs(20);

fn comp(s: &str) -> (u32, u32, u32) {
    let v = nums(s);
    (v[0] as u32, v[1] as u32, v[2] as u32)
}

#[test]
fn connect_rejected() {
    let s = Setup::new(Reliability::ReliableDelivery, 65536, false, false);
    let mut p = Peer::serve(PEER);
    p.cmd_expect("open rd 65536 0 0", "MEM");
    let d = disc_str("rej");
    p.say(&format!("listen {d} reject"));
    p.expect("LISTENING");
    let r =
        s.vi.connect(&s.nic.address(b"c"), &s.nic.address(d.as_bytes()), WAIT);
    assert_eq!(r.err(), Some(Error::Reject));
    assert_eq!(p.expect("REJECT"), "ok");
    assert_eq!(s.vi.state(), ViState::Idle);
    // The VI is usable again: the next attempt is accepted.
    s.connect_to(&mut p, &disc_str("rej2"));
    p.exit();
}

/// With nobody listening, a request with a timeout waits for a listener
/// that long, then answers `NoMatch` (M-VIA's answer, on which legacy
/// programs retry).
#[test]
fn connect_without_listener_is_no_match_after_the_timeout() {
    let s = Setup::new(Reliability::ReliableDelivery, 65536, false, false);
    let t = Duration::from_millis(400);
    let start = Instant::now();
    let r = s.vi.connect(
        &s.nic.address(b"c"),
        &s.nic.address(&disc("nobody")),
        Some(t),
    );
    let el = start.elapsed();
    assert_eq!(r.err(), Some(Error::NoMatch));
    assert!(
        el >= t - Duration::from_millis(5),
        "returned after {el:?}, before {t:?}"
    );
    assert!(el < t * 10, "returned after {el:?}");
    assert_eq!(s.vi.state(), ViState::Idle);
}

/// A listener took the request but did not accept in time: `Timeout`.
#[test]
fn connect_taken_but_not_accepted_times_out() {
    let s = Setup::new(Reliability::ReliableDelivery, 65536, false, false);
    let d = disc("slow-server");
    // Long enough that the server's listen (started first, in a thread) is
    // with viad well before the deadline.
    let t = Duration::from_millis(1500);
    std::thread::scope(|sc| {
        let nic = &s.nic;
        let d = &d;
        let server = sc.spawn(move || {
            // Takes the request, then never accepts it.
            nic.connect_wait(&nic.address(d), WAIT).map(|_req| ())
        });
        let r =
            s.vi.connect(&s.nic.address(b"c"), &s.nic.address(d), Some(t));
        assert_eq!(r.err(), Some(Error::Timeout));
        server.join().unwrap().expect("the server took the request");
    });
    assert_eq!(s.vi.state(), ViState::Idle);
}

#[test]
fn reliability_mismatch_refused_on_both_sides() {
    for (mine, theirs) in [
        (Reliability::ReliableReception, "rd"),
        (Reliability::Unreliable, "rr"),
    ] {
        let s = Setup::new(mine, 65536, false, false);
        let mut p = Peer::serve(PEER);
        p.cmd_expect(&format!("open {theirs} 65536 0 0"), "MEM");
        let d = disc_str("mismatch");
        p.say(&format!("listen {d} accept"));
        p.expect("LISTENING");
        let r =
            s.vi.connect(&s.nic.address(b"c"), &s.nic.address(d.as_bytes()), WAIT);
        assert_eq!(
            r.err(),
            Some(Error::InvalidReliabilityLevel),
            "{mine:?} vs {theirs}"
        );
        assert_eq!(p.expect("ACCEPT"), "InvalidReliabilityLevel");
        assert_eq!(s.vi.state(), ViState::Idle);
        assert_eq!(p.cmd_expect("state", "STATE"), "Idle");
        p.exit();
    }
}

#[test]
fn peer_to_peer_connect_and_exchange() {
    let s = Setup::new(Reliability::ReliableReception, 65536, false, false);
    let mut p = Peer::serve(PEER);
    p.cmd_expect("open rr 65536 0 0", "MEM");
    let (a, b) = (disc_str("p2p-a"), disc_str("p2p-b"));
    // Receives may be posted before the connection exists.
    post_recv(&s, 0, 8192, 1000);
    s.vi.connect_peer(
        &s.nic.address(a.as_bytes()),
        &s.nic.address(b.as_bytes()),
        WAIT,
    )
    .unwrap();
    assert_eq!(s.vi.state(), ViState::ConnectPending);
    assert_eq!(
        s.vi.connect_peer_done().err(),
        Some(Error::NotDone),
        "nobody on the other side yet"
    );
    assert_eq!(p.cmd("recv 0 4096:1000"), "OK");
    assert_eq!(p.cmd(&format!("peer {b} {a}")), "PEER ok");
    let attrs = s.vi.connect_peer_wait().unwrap();
    assert_eq!(attrs.reliability, Reliability::ReliableReception);
    assert_eq!(s.vi.state(), ViState::Connected);
    // Both directions carry data.
    s.send_arrives(&mut p, 64, 700, 1);
    assert_eq!(p.cmd("fill 0 8192 999 2"), "OK");
    assert_eq!(p.cmd("send 64 8192:999"), "OK");
    assert_eq!(s.vi.recv_wait(WAIT).unwrap().status, DONE | OP_RECEIVE);
    assert_eq!(s.bytes(8192, 999), pattern(999, 2));
    assert_eq!(comp(&p.cmd_expect("wait_send", "SEND")).0, DONE | OP_SEND);
    p.exit();
}

#[test]
fn peer_to_peer_reliability_mismatch_and_timeout() {
    let s = Setup::new(Reliability::ReliableDelivery, 65536, false, false);
    let mut p = Peer::serve(PEER);
    p.cmd_expect("open u 65536 0 0", "MEM");
    let (a, b) = (disc_str("p2pm-a"), disc_str("p2pm-b"));
    s.vi.connect_peer(
        &s.nic.address(a.as_bytes()),
        &s.nic.address(b.as_bytes()),
        WAIT,
    )
    .unwrap();
    assert_eq!(
        p.cmd(&format!("peer {b} {a}")),
        "PEER InvalidReliabilityLevel"
    );
    assert_eq!(
        s.vi.connect_peer_wait().err(),
        Some(Error::InvalidReliabilityLevel)
    );
    assert_eq!(s.vi.state(), ViState::Idle);
    // Nobody on the other side: Timeout after the request's timeout.
    let t = Duration::from_millis(300);
    let start = Instant::now();
    s.vi.connect_peer(
        &s.nic.address(a.as_bytes()),
        &s.nic.address(&disc("p2p-none")),
        Some(t),
    )
    .unwrap();
    assert_eq!(s.vi.connect_peer_wait().err(), Some(Error::Timeout));
    let el = start.elapsed();
    assert!(
        el >= t - Duration::from_millis(5) && el < t * 10,
        "timeout after {el:?}"
    );
    assert_eq!(s.vi.state(), ViState::Idle);
    p.exit();
}

#[test]
fn disconnect_flushes_both_sides_and_allows_reconnect() {
    let s = Setup::new(Reliability::ReliableDelivery, 65536, false, false);
    let errs = ErrorLog::install(&s.nic);
    let mut p = Peer::serve(PEER);
    p.cmd_expect("open rd 65536 0 0", "MEM");
    s.connect_to(&mut p, &disc_str("disc1"));
    // Outstanding receives on both sides.
    for i in 0..3 {
        post_recv(&s, i * 64, 8192 + i * 1024, 1000);
        assert_eq!(
            p.cmd(&format!("recv {} {}:1000", i * 64, 8192 + i * 1024)),
            "OK"
        );
    }
    s.vi.disconnect().unwrap();
    assert_eq!(s.vi.state(), ViState::Idle);
    for i in 0..3 {
        let c = s.vi.recv_wait(WAIT).unwrap();
        assert_eq!(
            (c.desc, c.status),
            (s.addr(i * 64), DONE | OP_RECEIVE | DESC_FLUSHED_ERROR)
        );
        assert_eq!(
            comp(&p.cmd_expect("wait_recv", "RECV")).0,
            DONE | OP_RECEIVE | DESC_FLUSHED_ERROR
        );
    }
    assert!(
        p.cmd("wait_error ConnLost")
            .starts_with("ERROR ConnLost Vi")
    );
    assert_eq!(p.cmd_expect("state", "STATE"), "Error");
    assert!(
        errs.all().is_empty(),
        "the disconnecting side reported {:?}",
        errs.all()
    );
    // Disconnecting an idle VI is refused.
    assert_eq!(s.vi.disconnect(), Err(Error::InvalidState));
    // The peer returns to Idle; both connect again and move data.
    assert_eq!(p.cmd("disconnect"), "OK");
    assert_eq!(p.cmd_expect("state", "STATE"), "Idle");
    s.connect_to(&mut p, &disc_str("disc2"));
    assert_eq!(p.cmd("recv 0 4096:100"), "OK");
    s.send_arrives(&mut p, 256, 100, 3);
    // And the peer may be the one that disconnects.
    post_recv(&s, 0, 8192, 100);
    assert_eq!(p.cmd("disconnect"), "OK");
    assert_eq!(
        s.vi.recv_wait(WAIT).unwrap().status,
        DONE | OP_RECEIVE | DESC_FLUSHED_ERROR
    );
    errs.expect(ErrorCode::ConnLost, T);
    assert_eq!(s.vi.state(), ViState::Error);
    s.vi.disconnect().unwrap();
    assert_eq!(s.vi.state(), ViState::Idle);
    p.exit();
}

#[test]
fn disconnect_while_the_peer_streams() {
    // The peer sends 64 KiB messages as fast as credits allow: message r
    // waits until the receiver has RDMA-written a credit of at least r
    // into the peer's memory, one credit per posted receive, so every
    // message finds a receive. The last four receives get no credit: the
    // disconnect races with the four messages still allowed, and the
    // other four receives are flushed whatever the timing. Every receive
    // is either whole and correct or flushed, in that order.
    const N: usize = 65536;
    const RECVS: usize = 8;
    const CREDIT_AT: usize = 64; // in the peer's region
    const CREDIT_SRC: usize = 1024; // in ours
    const ROUNDS: usize = 24;
    const WITHHELD: usize = 4;
    let buf = |i: usize| 65536 + i * N;
    let s = Setup::new(Reliability::Unreliable, buf(RECVS), false, false);
    let mut p = Peer::serve(PEER);
    let peer_mem = p.cmd_expect(&format!("open u {} 1 0 1048576", N + 8192), "MEM");
    let peer_mem: Vec<&str> = peer_mem.split_whitespace().collect();
    let (peer_addr, peer_handle) = (
        u64::from_str_radix(peer_mem[0].trim_start_matches("0x"), 16).unwrap(),
        peer_mem[1].parse::<u32>().unwrap(),
    );
    s.connect_to(&mut p, &disc_str("discstream"));
    // Writes the credit into the peer's memory; the write's completion is
    // reaped before the next one (the send queue holds only these).
    let grant = |credit: u64| {
        s.mem.write(CREDIT_SRC, &credit.to_ne_bytes()).unwrap();
        let d = DescBuilder::rdma_write(peer_addr + CREDIT_AT as u64, peer_handle)
            .segment(&s.mem, CREDIT_SRC, 8)
            .write(&s.mem, 512)
            .unwrap();
        s.vi.post_send(&s.mem, d).unwrap();
        assert_eq!(s.vi.send_wait(WAIT).unwrap().status, DONE | OP_RDMA_WRITE);
    };
    for i in 0..RECVS {
        post_recv(&s, i * 64, buf(i), N as u32);
    }
    let check = |i: usize| -> u64 {
        assert_eq!(s.mem.word(i * 64 + 24) as usize, N);
        let b = s.bytes(buf(i), N);
        let r = u64::from_ne_bytes(b[..8].try_into().unwrap());
        assert!(
            b[8..] == pattern(N - 8, r as u32)[..],
            "receive {i}: torn or wrong data"
        );
        r
    };
    p.say(&format!("stream_send {N} {CREDIT_AT}"));
    p.expect("STREAMING");
    let mut credit = RECVS as u64;
    grant(credit);
    for k in 0..ROUNDS {
        let i = k % RECVS;
        let c = s.vi.recv_wait(WAIT).unwrap();
        assert_eq!((c.desc, c.status), (s.addr(i * 64), DONE | OP_RECEIVE));
        // Credits match receives: nothing is dropped, nothing skipped.
        assert_eq!(check(i), k as u64 + 1);
        post_recv(&s, i * 64, buf(i), N as u32);
        if k < ROUNDS - WITHHELD {
            credit += 1;
            grant(credit);
        }
    }
    s.vi.disconnect().unwrap();
    assert_eq!(s.vi.state(), ViState::Idle);
    let (mut flushed, mut last) = (0, ROUNDS as u64);
    for k in ROUNDS..ROUNDS + RECVS {
        let i = k % RECVS;
        let c = s.vi.recv_wait(WAIT).unwrap();
        assert_eq!(c.desc, s.addr(i * 64));
        if c.status == DONE | OP_RECEIVE | DESC_FLUSHED_ERROR {
            flushed += 1;
        } else {
            assert_eq!(c.status, DONE | OP_RECEIVE);
            assert_eq!(flushed, 0, "a delivered message after a flushed one");
            assert_eq!(check(i), last + 1);
            last += 1;
        }
    }
    assert!(last <= credit, "message {last} sent beyond credit {credit}");
    assert!(flushed >= WITHHELD, "only {flushed} receives flushed");
    assert_eq!(s.vi.queues_empty(), (true, true));
    // The peer's stream ends (waiting for credit, or on a flushed send);
    // its VI is in Error.
    assert_eq!(p.line(), "STREAMEND");
    assert_eq!(p.cmd_expect("state", "STATE"), "Error");
    p.exit();
}

#[test]
fn two_nics_of_one_process_keep_their_connections_apart() {
    // One process, two NICs, VI slot 0 on each, each connected to its own
    // peer process. Events of one connection (the peer disconnecting, the
    // NIC closing) must reach that connection only: the other keeps
    // working, and its own disconnect still flushes its receives.
    let a = Setup::new(Reliability::ReliableDelivery, 65536, false, false);
    let b = Setup::with(
        via::Nic::open(None).unwrap(),
        Reliability::ReliableDelivery,
        65536,
        false,
        false,
        65536,
    );
    assert_eq!((a.vi.slot(), b.vi.slot()), (0, 0), "both VIs in slot 0");
    let mut pa = Peer::serve(PEER);
    let mut pb = Peer::serve(PEER);
    pa.cmd_expect("open rd 65536 0 0", "MEM");
    pb.cmd_expect("open rd 65536 0 0", "MEM");
    a.connect_to(&mut pa, &disc_str("twonic-a"));
    b.connect_to(&mut pb, &disc_str("twonic-b"));
    post_recv(&b, 0, 4096, 100);
    // A's peer disconnects: A breaks, B does not.
    assert_eq!(pa.cmd("disconnect"), "OK");
    let deadline = Instant::now() + T;
    while a.vi.state() != ViState::Error {
        assert!(
            Instant::now() < deadline,
            "A never heard its peer's disconnect"
        );
        std::thread::yield_now();
    }
    assert_eq!(b.vi.state(), ViState::Connected, "B broke with A");
    // Closing A's NIC leaves B alone too.
    a.vi.disconnect().unwrap();
    a.nic.close().unwrap();
    assert_eq!(
        b.vi.state(),
        ViState::Connected,
        "B broke when A's NIC closed"
    );
    // B still moves data both ways.
    assert_eq!(pb.cmd("send 0 4096:100"), "OK");
    let c = b.vi.recv_wait(WAIT).unwrap();
    assert_eq!(c.status, DONE | OP_RECEIVE);
    // And B's peer's disconnect flushes B's posted receive.
    post_recv(&b, 0, 4096, 100);
    assert_eq!(pb.cmd("disconnect"), "OK");
    let c = b.vi.recv_wait(WAIT).unwrap();
    assert_eq!(c.status, DONE | OP_RECEIVE | DESC_FLUSHED_ERROR);
    assert_eq!(b.vi.state(), ViState::Error);
    pa.exit();
    pb.exit();
}
