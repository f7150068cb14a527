//! Error paths of send/receive: descriptors refused by the post call,
//! local protection and length errors completed in the status, a message
//! that finds no receive (Unreliable drop, reliable RECVQ_EMPTY break), a
//! message longer than the receive, and the states `post_*` accept.

use std::time::Duration;

use via::descriptor::status::*;
use via::{DescBuilder, Error, ErrorCode, Nic, Region, Reliability, ViAttributes, ViState};
use via_tests::*;

const PEER: &str = env!("CARGO_BIN_EXE_via-peer");
const T: Duration = Duration::from_secs(20);

fn rel_name(r: Reliability) -> &'static str {
    match r {
        Reliability::Unreliable => "u",
        Reliability::ReliableDelivery => "rd",
        Reliability::ReliableReception => "rr",
    }
}

/// The test process (MaxTransferSize 64 KiB) and a connected peer.
fn pair(rel: Reliability, tag: &str) -> (Setup, Peer) {
    let s = Setup::with(open_nic(), rel, 1 << 18, false, false, 65536);
    let mut p = Peer::serve(PEER);
    p.cmd_expect(&format!("open {} 262144 0 0", rel_name(rel)), "MEM");
    s.connect_to(&mut p, &disc_str(tag));
    (s, p)
}

/// `(status, length, immediate)` of a peer's completion answer.
fn comp(s: &str) -> (u32, u32, u32) {
    let v = nums(s);
    (v[0] as u32, v[1] as u32, v[2] as u32)
}

#[test]
fn bad_local_segments_complete_with_protection_error() {
    let (s, mut p) = pair(Reliability::Unreliable, "locprot");
    // A region of another tag, one of another NIC, and a dead one.
    let other_tag = s.nic.create_ptag().unwrap();
    let wrong_tag = Region::new(&s.nic, 4096, other_tag, false, false).unwrap();
    let nic2 = open_nic();
    let p2 = nic2.create_ptag().unwrap();
    let foreign = Region::new(&nic2, 4096, p2, false, false).unwrap();
    let dead = Region::new(&s.nic, 4096, s.ptag, false, false).unwrap();
    let (dead_addr, dead_h) = (dead.addr(0).unwrap(), dead.handle());
    dead.deregister().unwrap();
    let base = s.addr(0);
    let cases: Vec<(&str, DescBuilder)> = vec![
        (
            "bogus handle",
            DescBuilder::send().raw_segment(base + 4096, 0xdead_beef, 10),
        ),
        (
            "beyond the region",
            DescBuilder::send().raw_segment(base + (1 << 18) - 5, s.mem.handle(), 10),
        ),
        (
            "before the region",
            DescBuilder::send().raw_segment(base - 4, s.mem.handle(), 10),
        ),
        (
            "another tag",
            DescBuilder::send().segment(&wrong_tag, 0, 10),
        ),
        ("another NIC", DescBuilder::send().segment(&foreign, 0, 10)),
        (
            "deregistered",
            DescBuilder::send().raw_segment(dead_addr, dead_h, 10),
        ),
        (
            "good then bad",
            DescBuilder::send()
                .segment(&s.mem, 4096, 5)
                .raw_segment(base + 4096, 0xdead_beef, 5),
        ),
    ];
    assert_eq!(p.cmd("recv 0 4096:100"), "OK");
    for (name, b) in cases {
        let d = b.write(&s.mem, 0).unwrap();
        s.vi.post_send(&s.mem, d).unwrap();
        let c = s.vi.send_wait(WAIT).unwrap();
        assert_eq!(
            c.status,
            DONE | OP_SEND | PROTECTION_ERROR,
            "{name}: status {:#x}",
            c.status
        );
        assert_eq!(s.vi.state(), ViState::Connected, "{name}");
        assert_eq!(
            p.cmd("recv_done"),
            "WAITERR NotDone",
            "{name}: the peer got something"
        );
    }
    // The connection still carries data, into the receive posted first.
    s.send_arrives(&mut p, 0, 50, 3);
    let _ = nic2.close();
    p.exit();
}

#[test]
fn length_errors_local() {
    let (s, mut p) = pair(Reliability::Unreliable, "loclen");
    assert_eq!(p.cmd("recv 0 4096:100000"), "OK");
    // CS.Length different from the sum of the segments (both ways).
    for len in [9u32, 11, 0] {
        let d = DescBuilder::send()
            .segment(&s.mem, 4096, 10)
            .length(len)
            .write(&s.mem, 0)
            .unwrap();
        s.vi.post_send(&s.mem, d).unwrap();
        assert_eq!(
            s.vi.send_wait(WAIT).unwrap().status,
            DONE | OP_SEND | LENGTH_ERROR,
            "length {len}"
        );
    }
    // Above MaxTransferSize (64 KiB on this VI), consistent length.
    let d = DescBuilder::send()
        .segment(&s.mem, 4096, 65537)
        .write(&s.mem, 0)
        .unwrap();
    s.vi.post_send(&s.mem, d).unwrap();
    assert_eq!(
        s.vi.send_wait(WAIT).unwrap().status,
        DONE | OP_SEND | LENGTH_ERROR
    );
    assert_eq!(p.cmd("recv_done"), "WAITERR NotDone");
    // Exactly MaxTransferSize passes.
    s.send_arrives(&mut p, 0, 65536, 4);
    assert_eq!(s.vi.state(), ViState::Connected);
    p.exit();
}

#[test]
fn local_descriptor_error_breaks_reliable_connections() {
    for (rel, bad_len) in [
        (Reliability::ReliableDelivery, false),
        (Reliability::ReliableReception, true),
    ] {
        let (s, mut p) = pair(rel, "locbrk");
        let errs = ErrorLog::install(&s.nic);
        assert_eq!(p.cmd("recv 0 4096:100"), "OK");
        post_recv(&s, 128, 8192, 100);
        let b = if bad_len {
            DescBuilder::send().segment(&s.mem, 4096, 10).length(20)
        } else {
            DescBuilder::send().raw_segment(s.addr(4096), 0xdead_beef, 10)
        };
        s.vi.post_send(&s.mem, b.write(&s.mem, 0).unwrap()).unwrap();
        let want = if bad_len {
            LENGTH_ERROR
        } else {
            PROTECTION_ERROR
        };
        assert_eq!(
            s.vi.send_wait(WAIT).unwrap().status,
            DONE | OP_SEND | want,
            "{rel:?}"
        );
        let e = errs.expect(ErrorCode::PostDesc, T);
        assert_eq!(e.vi, Some((s.vi.slot(), e.vi.unwrap().1)));
        assert_eq!(s.vi.state(), ViState::Error);
        assert_eq!(
            s.vi.recv_wait(WAIT).unwrap().status,
            DONE | OP_RECEIVE | DESC_FLUSHED_ERROR
        );
        assert_eq!(
            p.cmd("wait_error ConnLost").split(' ').nth(1),
            Some("ConnLost")
        );
        assert_eq!(p.cmd_expect("state", "STATE"), "Error");
        assert_eq!(
            comp(&p.cmd_expect("wait_recv", "RECV")).0,
            DONE | OP_RECEIVE | DESC_FLUSHED_ERROR
        );
        p.exit();
    }
}

/// A connection's MaxTransferSize is the smaller of its two VIs'. A send
/// within this VI's (64 KiB) but above the peer's (4 KiB) is the local
/// length error a send above this VI's own is: `LENGTH_ERROR`, nothing
/// delivered, and on the reliable levels the connection breaks
/// (`POST_DESC`) as for any local descriptor error (README's behaviour
/// table). Until stop 36 the soft and verbs kinds completed it with the
/// connection left up; the sockets kind broke it.
#[test]
fn a_send_above_the_peers_max_transfer_size_is_a_local_length_error() {
    for rel in [
        Reliability::Unreliable,
        Reliability::ReliableDelivery,
        Reliability::ReliableReception,
    ] {
        let s = Setup::with(open_nic(), rel, 1 << 18, false, false, 65536);
        let mut p = Peer::serve(PEER);
        p.cmd_expect(&format!("open {} 262144 0 0 4096", rel_name(rel)), "MEM");
        s.connect_to(&mut p, &disc_str(&format!("mtspeer-{}", rel_name(rel))));
        let errs = ErrorLog::install(&s.nic);
        assert_eq!(p.cmd("recv 0 4096:4096"), "OK");
        s.fill(4096, 8192, 3);
        post_send(&s, 0, 4096, 8192);
        assert_eq!(
            s.vi.send_wait(WAIT).unwrap().status,
            DONE | OP_SEND | LENGTH_ERROR,
            "{rel:?}"
        );
        if rel.is_reliable() {
            let e = errs.expect(ErrorCode::PostDesc, T);
            assert_eq!(e.vi.map(|v| v.0), Some(s.vi.slot()), "{rel:?}");
            assert_eq!(s.vi.state(), ViState::Error, "{rel:?}");
            assert_eq!(
                p.cmd("wait_error ConnLost").split(' ').nth(1),
                Some("ConnLost"),
                "{rel:?}"
            );
            assert_eq!(
                comp(&p.cmd_expect("wait_recv", "RECV")).0,
                DONE | OP_RECEIVE | DESC_FLUSHED_ERROR,
                "{rel:?}"
            );
        } else {
            // Nothing arrived; 4 KiB still goes through (the same bytes as
            // the first 4 KiB of the refused send: `pattern` is one sequence).
            assert_eq!(p.cmd("recv_done"), "WAITERR NotDone", "{rel:?}");
            s.send_arrives(&mut p, 0, 4096, 3);
            assert_eq!(s.vi.state(), ViState::Connected);
            assert!(errs.all().is_empty(), "{:?}", errs.all());
        }
        p.exit();
    }
}

#[test]
fn bad_receive_segments_complete_at_once_and_are_skipped() {
    let (s, mut p) = pair(Reliability::ReliableDelivery, "badrecv");
    let d = DescBuilder::recv()
        .raw_segment(s.addr(4096), 0xdead_beef, 100)
        .write(&s.mem, 0)
        .unwrap();
    s.vi.post_recv(&s.mem, d).unwrap();
    let c = s.vi.recv_done().expect("completed at post time");
    assert_eq!(c.status, DONE | OP_RECEIVE | PROTECTION_ERROR);
    // The next good receive takes the next message; the connection is fine.
    post_recv(&s, 64, 8192, 100);
    assert_eq!(p.cmd("fill 0 4096 100 6"), "OK");
    assert_eq!(p.cmd("send 0 4096:100"), "OK");
    assert_eq!(comp(&p.cmd_expect("wait_send", "SEND")).0, DONE | OP_SEND);
    let c = s.vi.recv_wait(WAIT).unwrap();
    assert_eq!((c.desc, c.status), (s.addr(64), DONE | OP_RECEIVE));
    assert_eq!(s.bytes(8192, 100), pattern(100, 6));
    assert_eq!(s.vi.state(), ViState::Connected);
    p.exit();
}

#[test]
fn malformed_descriptors_are_refused_by_post() {
    let (s, mut p) = pair(Reliability::ReliableDelivery, "descerr");
    let nic2 = open_nic();
    let p2 = nic2.create_ptag().unwrap();
    let foreign = Region::new(&nic2, 8192, p2, false, false).unwrap();
    let len = s.mem.len();
    // A control segment written by hand at `off` (SegCount, Control).
    let raw = |off: usize, segs: u16, ctl: u16| {
        let mut b = [0u8; 32];
        b[12..14].copy_from_slice(&segs.to_ne_bytes());
        b[14..16].copy_from_slice(&ctl.to_ne_bytes());
        s.mem.write(off, &b).unwrap();
        off
    };
    let one = |ctl: u16| {
        DescBuilder::send()
            .control(ctl)
            .segment(&s.mem, 4096, 8)
            .write(&s.mem, 0)
            .unwrap()
    };
    let cases: Vec<(&str, usize, Error)> = vec![
        ("misaligned", raw(64 + 32, 0, 0), Error::DescriptorError),
        (
            "misaligned by 8",
            raw(128 + 8, 0, 0),
            Error::DescriptorError,
        ),
        ("17 segments", raw(192, 17, 0), Error::DescriptorError),
        (
            "segments past the region",
            raw(len - 64, 3, 0),
            Error::DescriptorError,
        ),
        (
            "reserved control bit 0x10",
            one(0x10),
            Error::DescriptorError,
        ),
        (
            "reserved control bit 0x8000",
            one(0x8000),
            Error::DescriptorError,
        ),
        ("reserved operation 3", one(3), Error::DescriptorError),
    ];
    for (name, off, err) in &cases {
        assert_eq!(
            s.vi.post_send(&s.mem, *off),
            Err(err.clone()),
            "send: {name}"
        );
        assert_eq!(
            s.vi.post_recv(&s.mem, *off),
            Err(err.clone()),
            "recv: {name}"
        );
    }
    // The descriptor in another NIC's region: its handle means nothing here.
    let d = DescBuilder::send().write(&foreign, 0).unwrap();
    assert_eq!(s.vi.post_send(&foreign, d), Err(Error::InvalidParameter));
    assert_eq!(s.vi.post_recv(&foreign, d), Err(Error::InvalidParameter));
    // The descriptor in a region of another tag.
    let t2 = s.nic.create_ptag().unwrap();
    let other = Region::new(&s.nic, 8192, t2, false, false).unwrap();
    let d = DescBuilder::send().write(&other, 0).unwrap();
    assert_eq!(
        s.vi.post_send(&other, d),
        Err(Error::DescriptorError),
        "descriptor of another tag"
    );
    // RDMA without its address segment.
    let mut b = [0u8; 32];
    b[14..16].copy_from_slice(&1u16.to_ne_bytes());
    s.mem.write(256, &b).unwrap();
    assert_eq!(
        s.vi.post_send(&s.mem, 256),
        Err(Error::DescriptorError),
        "RDMA write with no segment"
    );

    // Nothing was queued: the queues are empty, the connection is intact and
    // the next good descriptor is the first to complete.
    assert_eq!(s.vi.queues_empty(), (true, true));
    assert_eq!(s.vi.send_done(), Err(Error::NotDone));
    assert_eq!(s.vi.state(), ViState::Connected);
    assert_eq!(p.cmd("recv 0 4096:100"), "OK");
    s.fill(4096, 8, 7);
    post_send(&s, 320, 4096, 8);
    let c = s.vi.send_wait(WAIT).unwrap();
    assert_eq!((c.desc, c.status), (s.addr(320), DONE | OP_SEND));
    assert_eq!(
        comp(&p.cmd_expect("wait_recv", "RECV")),
        (DONE | OP_RECEIVE, 8, 0)
    );
    let _ = nic2.close();
    p.exit();
}

#[test]
fn unreliable_message_without_receive_is_dropped() {
    let (s, mut p) = pair(Reliability::Unreliable, "udrop");
    let errs = ErrorLog::install(&s.nic);
    assert_eq!(p.cmd("fill 0 4096 100 1"), "OK");
    assert_eq!(p.cmd("send 0 4096:100"), "OK");
    assert_eq!(
        comp(&p.cmd_expect("wait_send", "SEND")).0,
        DONE | OP_SEND,
        "sender sees success"
    );
    // Now a receive: the next message arrives, the dropped one never does.
    post_recv(&s, 0, 8192, 100);
    assert_eq!(s.vi.recv_done(), Err(Error::NotDone));
    assert_eq!(p.cmd("fill 0 4096 100 2"), "OK");
    assert_eq!(p.cmd("send 0 4096:100"), "OK");
    assert_eq!(comp(&p.cmd_expect("wait_send", "SEND")).0, DONE | OP_SEND);
    assert_eq!(s.vi.recv_wait(WAIT).unwrap().status, DONE | OP_RECEIVE);
    assert_eq!(s.bytes(8192, 100), pattern(100, 2));
    assert_eq!(s.vi.state(), ViState::Connected);
    assert_eq!(p.cmd_expect("state", "STATE"), "Connected");
    assert_eq!(p.cmd("errors"), "ERRORS none");
    assert!(errs.all().is_empty(), "errors reported: {:?}", errs.all());
    p.exit();
}

#[test]
fn reliable_message_without_receive_breaks_the_connection() {
    for rel in [
        Reliability::ReliableDelivery,
        Reliability::ReliableReception,
    ] {
        let (s, mut p) = pair(rel, "rqempty");
        let errs = ErrorLog::install(&s.nic);
        // The peer (sender) has a receive outstanding, which gets flushed.
        assert_eq!(p.cmd("recv 64 8192:100"), "OK");
        assert_eq!(p.cmd("send 0 4096:100"), "OK");
        let want = if rel == Reliability::ReliableReception {
            REMOTE_DESC_ERROR
        } else {
            0
        };
        assert_eq!(
            comp(&p.cmd_expect("wait_send", "SEND")).0,
            DONE | OP_SEND | want,
            "{rel:?}"
        );
        let e = errs.expect(ErrorCode::RecvqEmpty, T);
        assert_eq!(e.vi.map(|v| v.0), Some(s.vi.slot()));
        assert_eq!(s.vi.state(), ViState::Error);
        assert!(
            p.cmd("wait_error ConnLost").starts_with("ERROR ConnLost"),
            "{rel:?}"
        );
        assert_eq!(p.cmd_expect("state", "STATE"), "Error");
        assert_eq!(
            comp(&p.cmd_expect("wait_recv", "RECV")).0,
            DONE | OP_RECEIVE | DESC_FLUSHED_ERROR
        );
        // In Error: a receive completes flushed at once, a send is accepted
        // and completes flushed.
        post_recv(&s, 0, 8192, 100);
        assert_eq!(
            s.vi.recv_done().unwrap().status,
            DONE | OP_RECEIVE | DESC_FLUSHED_ERROR
        );
        post_send(&s, 64, 4096, 10);
        assert_eq!(
            s.vi.send_wait(WAIT).unwrap().status,
            DONE | OP_SEND | DESC_FLUSHED_ERROR
        );
        assert_eq!(s.vi.state(), ViState::Error);
        p.exit();
    }
}

#[test]
fn message_longer_than_the_receive() {
    for rel in [
        Reliability::Unreliable,
        Reliability::ReliableDelivery,
        Reliability::ReliableReception,
    ] {
        let (s, mut p) = pair(rel, "lenerr");
        let errs = ErrorLog::install(&s.nic);
        // Two segments of 60 bytes; the message is 121 bytes.
        post_short_recv(&s);
        if rel == Reliability::Unreliable {
            // Two more receives behind the short one: they stay posted, in
            // order (on verbs the QP goes through ERROR and back, and they
            // are posted again).
            post_recv(&s, 64, 16384, 121);
            post_recv(&s, 128, 20480, 121);
        }
        assert_eq!(p.cmd("send 0 4096:121"), "OK");
        let sst = comp(&p.cmd_expect("wait_send", "SEND")).0;
        let c = s.vi.recv_wait(WAIT).unwrap();
        assert_eq!(c.status, DONE | OP_RECEIVE | LENGTH_ERROR, "{rel:?}");
        match rel {
            Reliability::Unreliable => {
                assert_eq!(sst, DONE | OP_SEND);
                assert_eq!(s.vi.state(), ViState::Connected);
                // Still works: the next messages land in the receives
                // posted behind, in order, then in one posted now.
                for (seed, buf, desc) in [(8, 16384, 64), (9, 20480, 128)] {
                    assert_eq!(p.cmd(&format!("fill 0 4096 121 {seed}")), "OK");
                    assert_eq!(p.cmd("send 0 4096:121"), "OK");
                    let c = s.vi.recv_wait(WAIT).unwrap();
                    assert_eq!(c.status, DONE | OP_RECEIVE);
                    assert_eq!(c.desc, s.mem.addr(desc).unwrap());
                    assert_eq!(s.bytes(buf, 121), pattern(121, seed));
                }
                post_recv(&s, 0, 8192, 121);
                assert_eq!(p.cmd("fill 0 4096 121 10"), "OK");
                assert_eq!(p.cmd("send 0 4096:121"), "OK");
                assert_eq!(s.vi.recv_wait(WAIT).unwrap().status, DONE | OP_RECEIVE);
                assert_eq!(s.bytes(8192, 121), pattern(121, 10));
            }
            _ => {
                let want = if rel == Reliability::ReliableReception {
                    REMOTE_DESC_ERROR
                } else {
                    0
                };
                assert_eq!(sst, DONE | OP_SEND | want, "{rel:?}: sender status");
                // Both sides break; the receiver's callback names the cause.
                let seen = errs
                    .wait_for(ErrorCode::ConnLost, T)
                    .or_else(|| errs.wait_for(ErrorCode::RecvqEmpty, T));
                assert!(seen.is_some(), "{rel:?}: receiver not told");
                assert_eq!(s.vi.state(), ViState::Error);
                assert!(p.cmd("wait_error ConnLost").starts_with("ERROR ConnLost"));
                assert_eq!(p.cmd_expect("state", "STATE"), "Error");
            }
        }
        p.exit();
    }
}

/// A receive the peer's engine failed (a message longer than it) is seen
/// with its VI in ERROR, while the break is still on its way to this
/// process: its provider thread, which would act on it, is held in a slow
/// error callback (over another connection's break) meanwhile.
#[test]
fn a_failed_receive_is_seen_with_its_vi_in_error_before_the_break_arrives() {
    for rel in [
        Reliability::ReliableDelivery,
        Reliability::ReliableReception,
    ] {
        let (s, mut p) = pair(rel, "rcverr");
        let errs = ErrorLog::install(&s.nic);
        let held = errs.hold();
        // Another connection of this process breaks (a message that finds
        // no receive): the provider thread stays in its callback. Both ends
        // of it report, in either order (the sender's break is settled by
        // its posting thread, the receiver's reaches the provider thread
        // through the error ring): whichever comes first holds the thread.
        let a = ViAttributes::new(Reliability::ReliableReception, s.ptag);
        let (x, y) = local_pair(&s.nic, &a, &disc_str("rcverr-other"), |_| {});
        let d = DescBuilder::send()
            .segment(&s.mem, 4096, 10)
            .write(&s.mem, 64)
            .unwrap();
        x.post_send(&s.mem, d).unwrap();
        let first = errs.take_first(T).expect("the other break");
        assert!(
            [Some(x.slot()), Some(y.slot())].contains(&first.0.vi.map(|v| v.0)),
            "{rel:?}: the first report is not of the other connection: {:?}",
            first.0
        );
        post_short_recv(&s);
        assert_eq!(p.cmd("send 0 4096:121"), "OK");
        let c = s.vi.recv_wait(WAIT).unwrap();
        assert_eq!(c.status, DONE | OP_RECEIVE | LENGTH_ERROR, "{rel:?}");
        assert_eq!(
            s.vi.state(),
            ViState::Error,
            "{rel:?}: as the status is seen"
        );
        // A VI seen in ERROR sends nothing more: a send posted now is
        // flushed, not run towards the peer (where it would find no
        // receive, and Reliable Delivery would report it sent).
        post_send(&s, 256, 4096, 8);
        assert_eq!(
            s.vi.send_wait(WAIT).unwrap().status,
            DONE | OP_SEND | DESC_FLUSHED_ERROR,
            "{rel:?}: a send after the failed receive"
        );
        // The break itself lands once the provider thread is let go.
        drop(held);
        let ours = |e: &via::AsyncError| {
            e.code == ErrorCode::ConnLost && e.vi.map(|v| v.0) == Some(s.vi.slot())
        };
        assert!(
            wait_until(T, || errs.all().iter().any(ours)),
            "{rel:?}: the break was not reported: {:?}",
            errs.all()
        );
        assert_eq!(s.vi.state(), ViState::Error);
        assert!(p.cmd("wait_error ConnLost").starts_with("ERROR ConnLost"));
        p.exit();
    }
}

/// A reliable connection's failed sends and receives are seen with their
/// VI in ERROR, by a thread other than the poster: another thread polls
/// the descriptors while the posting thread runs the request and its
/// break (which it settles only after the failed status is written). The
/// window is short: with the VI marked broken only by the break, this
/// fails about every second run here, not every time.
#[test]
fn a_failed_request_is_seen_with_its_vi_in_error_by_other_threads() {
    let nic = open_nic();
    let ptag = nic.create_ptag().unwrap();
    let mem = via::Memory::new(1 << 16).unwrap();
    let r = Region::within(&nic, &mem, 0, 1 << 16, ptag, false, false).unwrap();
    for (rel, bad_len) in [
        (Reliability::ReliableReception, false),
        (Reliability::ReliableDelivery, true),
    ] {
        let a = ViAttributes::new(rel, ptag);
        let (s, v) = local_pair(&nic, &a, &format!("seenerr-{}", rel_name(rel)), |_| {});
        // A receive of 60 bytes; the send is 100 (or names 20 bytes in one
        // segment of 10: a local length error).
        let d = DescBuilder::recv()
            .segment(&r, 8192, 60)
            .write(&r, 0)
            .unwrap();
        v.post_recv(&r, d).unwrap();
        let b = if bad_len {
            DescBuilder::send().segment(&r, 4096, 10).length(20)
        } else {
            DescBuilder::send().segment(&r, 4096, 100)
        };
        let d = b.write(&r, 64).unwrap();
        let (send_seen, recv_seen) = std::thread::scope(|sc| {
            let watcher = sc.spawn(|| {
                // The state read right as the completion is dequeued.
                let seen = |done: &dyn Fn() -> Option<(u32, ViState)>| {
                    let end = std::time::Instant::now() + T;
                    while std::time::Instant::now() < end {
                        if let Some(c) = done() {
                            return c;
                        }
                        std::hint::spin_loop();
                    }
                    panic!("{rel:?}: no completion");
                };
                let send = seen(&|| s.send_done().ok().map(|c| (c.status, s.state())));
                let recv =
                    (!bad_len).then(|| seen(&|| v.recv_done().ok().map(|c| (c.status, v.state()))));
                (send, recv)
            });
            s.post_send(&r, d).unwrap();
            watcher.join().unwrap()
        });
        let send_want = match (rel, bad_len) {
            (_, true) => LENGTH_ERROR,
            (Reliability::ReliableReception, _) => REMOTE_DESC_ERROR,
            _ => 0,
        };
        assert_eq!(
            send_seen,
            (DONE | OP_SEND | send_want, ViState::Error),
            "{rel:?}"
        );
        if let Some(seen) = recv_seen {
            assert_eq!(
                seen,
                (DONE | OP_RECEIVE | LENGTH_ERROR, ViState::Error),
                "{rel:?}"
            );
        }
        assert!(
            wait_until(T, || v.state() == ViState::Error),
            "{rel:?}: receiver"
        );
    }
}

#[test]
fn post_send_and_recv_by_state() {
    let nic = open_nic();
    let ptag = nic.create_ptag().unwrap();
    let mem = Region::new(&nic, 65536, ptag, false, false).unwrap();
    let vi = nic
        .create_vi(
            &ViAttributes::new(Reliability::ReliableDelivery, ptag),
            None,
            None,
        )
        .unwrap();
    let d = DescBuilder::send()
        .segment(&mem, 4096, 8)
        .write(&mem, 0)
        .unwrap();
    // Idle: sends refused, receives accepted (and not completed).
    assert_eq!(vi.state(), ViState::Idle);
    assert_eq!(vi.post_send(&mem, d), Err(Error::InvalidState));
    let r = DescBuilder::recv()
        .segment(&mem, 8192, 8)
        .write(&mem, 64)
        .unwrap();
    vi.post_recv(&mem, r).unwrap();
    assert_eq!(vi.recv_done(), Err(Error::NotDone));
    assert_eq!(vi.queues_empty(), (true, false));
    // ConnectPending (a peer-to-peer request nobody answers).
    let vi2 = nic
        .create_vi(
            &ViAttributes::new(Reliability::ReliableDelivery, ptag),
            None,
            None,
        )
        .unwrap();
    let here = nic.address(&disc("pend-a"));
    vi2.connect_peer(
        &here,
        &nic.address(&disc("pend-b")),
        Some(Duration::from_millis(300)),
    )
    .unwrap();
    assert_eq!(vi2.state(), ViState::ConnectPending);
    assert_eq!(vi2.post_send(&mem, d), Err(Error::InvalidState));
    let r2 = DescBuilder::recv()
        .segment(&mem, 8192, 8)
        .write(&mem, 128)
        .unwrap();
    vi2.post_recv(&mem, r2).unwrap();
    assert_eq!(vi2.connect_peer_wait().err(), Some(Error::Timeout));
    assert_eq!(vi2.state(), ViState::Idle);
    let _ = nic.close();
}

#[test]
fn destroy_needs_idle_empty_unused_objects() {
    let nic: Nic = open_nic();
    let ptag = nic.create_ptag().unwrap();
    let mem = Region::new(&nic, 4096, ptag, false, false).unwrap();
    let at = ViAttributes::new(Reliability::Unreliable, ptag);
    let r = DescBuilder::recv().write(&mem, 0).unwrap();
    // A tag in use by a VI and a region.
    let idle = nic.create_vi(&at, None, None).unwrap();
    assert_eq!(nic.destroy_ptag(ptag), Err(Error::InvalidState));
    // A VI with a queued receive stays, and is given back usable.
    let busy = nic.create_vi(&at, None, None).unwrap();
    busy.post_recv(&mem, r).unwrap();
    let refused = busy.destroy().unwrap_err();
    assert_eq!(refused.error, Error::InvalidState);
    let busy = refused.object;
    assert_eq!(busy.state(), ViState::Idle);
    // An idle VI with empty queues goes.
    assert!(idle.destroy().is_ok());
    // A CQ some VI uses stays; once the VI is gone it can go.
    let cq = nic.create_cq(16).unwrap();
    let user = nic.create_vi(&at, None, Some(&cq)).unwrap();
    let refused = cq.destroy().unwrap_err();
    assert_eq!(refused.error, Error::InvalidState);
    let cq = refused.object;
    assert!(user.destroy().is_ok());
    assert!(cq.destroy().is_ok());
    let unused = nic.create_cq(16).unwrap();
    assert!(unused.destroy().is_ok());
    let _ = nic.close();
}
