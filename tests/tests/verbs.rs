//! The verbs kind of NIC. On a machine without an RDMA device, opening one
//! fails cleanly (`InvalidParameter`, no crash). Where a device exists (the
//! Soft-RoCE VM of `tools/verbs-vm.sh`, `VIA_DEVICE=rxe0`), two processes
//! move data over it: send/receive with gather/scatter and immediate data,
//! RDMA write, write with immediate (consuming a receive), RDMA read, a
//! protection violation and a peer killed mid-stream.
#![cfg(feature = "verbs")]

use std::time::Duration;

use via::descriptor::status::*;
use via::{DescBuilder, ErrorCode, ErrorKind, Nic, Reliability, ViState};
use via_tests::*;

const PEER: &str = env!("CARGO_BIN_EXE_via-peer");
const T: Duration = Duration::from_secs(20);

#[test]
fn open_without_device_fails_cleanly() {
    ensure_viad();
    if !via::rdma_devices().is_empty() {
        println!("SKIP: this machine has RDMA devices");
        return;
    }
    for name in ["rxe0", "mlx5_0", "verbs", "/dev/via_rxe0"] {
        let e = Nic::open(Some(name)).err().expect(name);
        assert_eq!(e.kind(), ErrorKind::InvalidParameter, "{name}: {e}");
    }
    // The default kind is unaffected.
    let nic = Nic::open(None).unwrap();
    nic.close().unwrap();
}

#[test]
fn opens_the_device_by_every_name() {
    let Some(dev) = verbs_device() else { return };
    ensure_viad();
    for name in [dev.as_str(), "verbs", &format!("/dev/via_{dev}")] {
        let nic = Nic::open(Some(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        nic.close().unwrap();
    }
}

fn pair(rel: Reliability, rel_s: &str) -> (Setup, Peer, RemoteMem) {
    let s = Setup::new(rel, 1 << 16, true, rel.is_reliable());
    assert_eq!(s.nic.kind(), "verbs");
    let mut p = Peer::serve(PEER);
    let m = RemoteMem::parse(&p.cmd_expect(
        &format!("open {rel_s} 65536 1 {}", rel.is_reliable() as u8),
        "MEM",
    ));
    s.connect_to(&mut p, &disc_str(rel_s));
    (s, p, m)
}

/// A NIC of the verbs kind in this process, or `None` (printing why)
/// when this machine has no RDMA device.
fn verbs_nic() -> Option<Nic> {
    verbs_device()?;
    let nic = open_nic();
    assert_eq!(nic.kind(), "verbs");
    Some(nic)
}

/// `RECV|SEND <status> <len> <imm>` as numbers.
fn completion(line: &str) -> (u32, u32, u32) {
    let v = nums(line);
    (v[0] as u32, v[1] as u32, v[2] as u32)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn send_recv_gather_scatter_immediate() {
    if verbs_device().is_none() {
        return;
    }
    for (rel, rel_s) in [
        (Reliability::ReliableDelivery, "rd"),
        (Reliability::ReliableReception, "rr"),
        (Reliability::Unreliable, "u"),
    ] {
        let (s, mut p, _m) = pair(rel, rel_s);
        // Scatter into two segments of the peer.
        assert_eq!(p.cmd("recv 0 8192:1000 12288:2000"), "OK");
        let data = s.fill(4096, 3000, 7);
        // Gather from two segments, with immediate data.
        let d = DescBuilder::send()
            .segment(&s.mem, 4096, 1000)
            .segment(&s.mem, 5096, 2000)
            .immediate(0xdead_beef)
            .write(&s.mem, 0)
            .unwrap();
        s.vi.post_send(&s.mem, d).unwrap();
        let c = s.vi.send_wait(WAIT).unwrap();
        assert_eq!(c.status & ERROR_MASK, 0, "{rel_s}: send {:#x}", c.status);
        let (st, len, imm) = completion(&p.cmd_expect("wait_recv", "RECV"));
        assert_eq!(st & ERROR_MASK, 0, "{rel_s}: receive status {st:#x}");
        assert_eq!(st & OP_MASK, OP_RECEIVE, "{rel_s}");
        assert_ne!(st & IMMEDIATE, 0, "{rel_s}: immediate flag");
        assert_eq!((len, imm), (3000, 0xdead_beef), "{rel_s}");
        let a = p.cmd_expect("peek 0 8192 1000", "DATA");
        assert_eq!(a.trim(), hex(&data[..1000]), "{rel_s}: first segment");
        let b = p.cmd_expect("peek 0 12288 2000", "DATA");
        assert_eq!(b.trim(), hex(&data[1000..]), "{rel_s}: second segment");
        // And back: the peer sends, we receive.
        post_recv(&s, 64, 16384, 4096);
        assert_eq!(p.cmd("fill 0 20000 777 9"), "OK");
        assert_eq!(p.cmd("send 128 20000:777"), "OK");
        let (st, _, _) = completion(&p.cmd_expect("wait_send", "SEND"));
        assert_eq!(st & ERROR_MASK, 0, "{rel_s}: peer send {st:#x}");
        let c = s.vi.recv_wait(WAIT).unwrap();
        assert_eq!(c.status & ERROR_MASK, 0, "{rel_s}: {:#x}", c.status);
        assert_eq!(s.mem.word(64 + 24), 777);
        assert_eq!(s.bytes(16384, 777), pattern(777, 9), "{rel_s}: data back");
        p.exit();
    }
}

#[test]
fn rdma_write_write_immediate_and_read() {
    if verbs_device().is_none() {
        return;
    }
    let (s, mut p, m) = pair(Reliability::ReliableDelivery, "rd");
    // RDMA write: no receive consumed, data lands in the peer's region.
    s.fill(8192, 5000, 3);
    let d = DescBuilder::rdma_write(m.addr + 1000, m.handle)
        .segment(&s.mem, 8192, 5000)
        .write(&s.mem, 0)
        .unwrap();
    s.vi.post_send(&s.mem, d).unwrap();
    let c = s.vi.send_wait(WAIT).unwrap();
    assert_eq!(c.status & ERROR_MASK, 0, "write {:#x}", c.status);
    assert_eq!(c.status & OP_MASK, OP_RDMA_WRITE);
    assert_eq!(p.cmd("check 0 1000 5000 3"), "SAME");
    // Write with immediate consumes a receive of the peer.
    assert_eq!(p.cmd("recv 0"), "OK");
    s.fill(8192, 300, 4);
    let d = DescBuilder::rdma_write(m.addr + 30000, m.handle)
        .segment(&s.mem, 8192, 300)
        .immediate(0x1234_5678)
        .write(&s.mem, 0)
        .unwrap();
    s.vi.post_send(&s.mem, d).unwrap();
    let c = s.vi.send_wait(WAIT).unwrap();
    assert_eq!(c.status & ERROR_MASK, 0, "write+imm {:#x}", c.status);
    let (st, len, imm) = completion(&p.cmd_expect("wait_recv", "RECV"));
    assert_eq!(st & ERROR_MASK, 0, "receive of write+imm {st:#x}");
    assert_eq!(st & OP_MASK, OP_REMOTE_RDMA_WRITE);
    assert_ne!(st & IMMEDIATE, 0);
    assert_eq!((len, imm), (300, 0x1234_5678));
    assert_eq!(p.cmd("check 0 30000 300 4"), "SAME");
    // RDMA read into two local segments.
    assert_eq!(p.cmd("fill 0 40000 3000 5"), "OK");
    let d = DescBuilder::rdma_read(m.addr + 40000, m.handle)
        .segment(&s.mem, 20000, 1000)
        .segment(&s.mem, 24000, 2000)
        .write(&s.mem, 0)
        .unwrap();
    s.vi.post_send(&s.mem, d).unwrap();
    let c = s.vi.send_wait(WAIT).unwrap();
    assert_eq!(c.status & ERROR_MASK, 0, "read {:#x}", c.status);
    assert_eq!(c.status & OP_MASK, OP_RDMA_READ);
    let want = pattern(3000, 5);
    assert_eq!(s.bytes(20000, 1000), want[..1000]);
    assert_eq!(s.bytes(24000, 2000), want[1000..]);
    p.exit();
}

#[test]
fn protection_violation_leaves_target_unchanged() {
    if verbs_device().is_none() {
        return;
    }
    let (s, mut p, _m) = pair(Reliability::ReliableDelivery, "rd");
    let errors = ErrorLog::install(&s.nic);
    // A region of the peer with RDMA disabled, holding a known pattern.
    let r = nums(&p.cmd_expect("region 16384 same 0 0", "REGION"));
    let (idx, addr, handle) = (r[0], r[1], r[2] as u32);
    assert_eq!(p.cmd(&format!("fill {idx} 0 4096 11")), "OK");
    s.fill(8192, 4096, 12);
    let d = DescBuilder::rdma_write(addr, handle)
        .segment(&s.mem, 8192, 4096)
        .write(&s.mem, 0)
        .unwrap();
    s.vi.post_send(&s.mem, d).unwrap();
    let c = s.vi.send_wait(WAIT).unwrap();
    assert_ne!(c.status & RDMA_PROT_ERROR, 0, "status {:#x}", c.status);
    assert_eq!(p.cmd(&format!("check {idx} 0 4096 11")), "SAME");
    // A reliable connection breaks, on both sides; the target hears why,
    // told by the initiator through viad (verbs tells only the initiator).
    // Its own QP may have failed first: CONN_LOST then comes too.
    errors.expect(ErrorCode::ConnLost, T);
    assert_eq!(s.vi.state(), ViState::Error);
    assert!(
        p.cmd("wait_error RdmawProt")
            .starts_with("ERROR RdmawProt Vi")
    );
    assert_eq!(p.cmd("state"), "STATE Error");
    p.exit();
}

#[test]
fn send_without_receive_breaks_reliable_connections() {
    if verbs_device().is_none() {
        return;
    }
    for (rel, rel_s, want) in [
        (Reliability::ReliableReception, "rr", REMOTE_DESC_ERROR),
        (Reliability::ReliableDelivery, "rd", 0),
    ] {
        let (s, mut p, _m) = pair(rel, rel_s);
        let errors = ErrorLog::install(&s.nic);
        post_send(&s, 0, 4096, 100);
        let c = s.vi.send_wait(WAIT).unwrap();
        assert_eq!(c.status, DONE | OP_SEND | want, "{rel_s}: {:#x}", c.status);
        errors.expect(ErrorCode::ConnLost, T);
        assert_eq!(s.vi.state(), ViState::Error, "{rel_s}");
        // The receiver hears that a message found no receive (as from the
        // soft NIC), told by the sender through viad.
        assert!(
            p.cmd("wait_error RecvqEmpty")
                .starts_with("ERROR RecvqEmpty Vi"),
            "{rel_s}"
        );
        assert_eq!(p.cmd("state"), "STATE Error", "{rel_s}");
        p.exit();
    }
}

#[test]
fn disconnect_then_connect_again() {
    if verbs_device().is_none() {
        return;
    }
    let (s, mut p, _m) = pair(Reliability::ReliableDelivery, "rd");
    // A receive posted before the disconnect is flushed by it.
    post_recv(&s, 64, 16384, 100);
    s.vi.disconnect().unwrap();
    let c = s.vi.recv_wait(WAIT).unwrap();
    assert_ne!(c.status & DESC_FLUSHED_ERROR, 0, "{:#x}", c.status);
    assert_eq!(s.vi.state(), ViState::Idle);
    assert!(p.cmd("wait_error ConnLost").starts_with("ERROR ConnLost"));
    assert_eq!(p.cmd("disconnect"), "OK");
    // Receives posted while idle are kept for the next connection.
    post_recv(&s, 64, 16384, 100);
    s.connect_to(&mut p, &disc_str("again"));
    assert_eq!(p.cmd("fill 0 20000 100 3"), "OK");
    assert_eq!(p.cmd("send 128 20000:100"), "OK");
    let c = s.vi.recv_wait(WAIT).unwrap();
    assert_eq!(c.status & ERROR_MASK, 0, "{:#x}", c.status);
    assert_eq!(s.bytes(16384, 100), pattern(100, 3));
    p.exit();
}

#[test]
fn peer_killed_mid_stream_is_conn_lost() {
    if verbs_device().is_none() {
        return;
    }
    let (s, mut p, _m) = pair(Reliability::ReliableReception, "rr");
    let errors = ErrorLog::install(&s.nic);
    for i in 0..4 {
        assert_eq!(
            p.cmd(&format!("recv {} {}:1024", i * 64, 8192 + i * 1024)),
            "OK"
        );
    }
    // Receives of our own that the break must flush.
    post_recv(&s, 1024, 16384, 1024);
    post_send(&s, 0, 4096, 1024);
    let c = s.vi.send_wait(WAIT).unwrap();
    assert_eq!(c.status & ERROR_MASK, 0, "{:#x}", c.status);
    p.child.kill().unwrap();
    let _ = p.child.wait();
    errors.expect(ErrorCode::ConnLost, T);
    assert_eq!(s.vi.state(), ViState::Error);
    let c = s.vi.recv_wait(WAIT).unwrap();
    assert_ne!(c.status & DESC_FLUSHED_ERROR, 0, "{:#x}", c.status);
    // Posting now completes flushed.
    post_send(&s, 0, 4096, 1024);
    let c = s.vi.send_wait(WAIT).unwrap();
    assert_ne!(c.status & DESC_FLUSHED_ERROR, 0, "{:#x}", c.status);
}

/// The host-side cost of a post on verbs: `Vi::post_send` (what
/// `VipPostSend` runs after its handle checks) against a bare
/// `ibv_post_send`, both an 8-byte RDMA write, measured in one run. Under
/// emulation absolute times mean little; the ratio is the figure. Printed,
/// not asserted.
#[test]
fn post_cost_against_bare_ibv_post_send() {
    let Some(dev) = verbs_device() else { return };
    const N: u32 = 2048;
    let bare = via::bare_ibv_post(&dev, N).unwrap();
    let (s, p, m) = pair(Reliability::ReliableDelivery, "rd");
    let d = DescBuilder::rdma_write(m.addr, m.handle)
        .segment(&s.mem, 4096, 8)
        .write(&s.mem, 0)
        .unwrap();
    // As the bare loop: batches of 32 timed posts, then their completions.
    let mut total = Duration::ZERO;
    let descs: Vec<usize> = (0..32)
        .map(|i| {
            DescBuilder::rdma_write(m.addr, m.handle)
                .segment(&s.mem, 4096, 8)
                .write(&s.mem, d + 64 * i)
                .unwrap()
        })
        .collect();
    for _ in 0..N / 32 {
        for &d in &descs {
            let t = std::time::Instant::now();
            s.vi.post_send(&s.mem, d).unwrap();
            total += t.elapsed();
        }
        for _ in &descs {
            let c = s.vi.send_wait(WAIT).unwrap();
            assert_eq!(c.status & ERROR_MASK, 0);
        }
    }
    let via = total / N;
    println!(
        "POST-COST {dev}: Vi::post_send {} ns, bare ibv_post_send {} ns, ratio {:.2} ({N} posts each, 8-byte RDMA write)",
        via.as_nanos(),
        bare.as_nanos(),
        via.as_secs_f64() / bare.as_secs_f64()
    );
    p.exit();
}

/// [`local_pair`] of Reliable Reception VIs.
fn rr_pair(
    nic: &Nic,
    ptag: via::Ptag,
    tag: &str,
    attach: impl FnOnce(&via::Vi),
) -> (via::Vi, via::Vi) {
    let a = via::ViAttributes::new(Reliability::ReliableReception, ptag);
    local_pair(nic, &a, tag, attach)
}

/// Shared receive queue (extension): three VIs take their receives from
/// one SRQ; each completion names the VI that received, in the order the
/// messages came, with the data, length and immediate data in the
/// descriptor; the refusals are clean statuses.
#[test]
fn srq_shared_by_several_vis() {
    let Some(nic) = verbs_nic() else { return };
    let ptag = nic.create_ptag().unwrap();
    let mem = via::Region::new(&nic, 1 << 16, ptag, false, false).unwrap();
    let srq = nic.create_srq(ptag, 16).unwrap();
    // Receives: descriptors at 64 * i, buffers of 512 B at 8192 + 512 * i.
    let post = |i: usize| {
        let d = DescBuilder::recv()
            .segment(&mem, 8192 + 512 * i, 512)
            .write(&mem, 64 * i)
            .unwrap();
        srq.post_recv(&mem, d).unwrap();
    };
    for i in 0..6 {
        post(i);
    }
    let pairs: Vec<_> = (0..3)
        .map(|k| {
            rr_pair(&nic, ptag, &format!("srq{k}"), |r| {
                r.set_srq(Some(&srq)).unwrap()
            })
        })
        .collect();
    // An attached VI has no receive queue of its own.
    let d = DescBuilder::recv()
        .segment(&mem, 20000, 64)
        .write(&mem, 4096)
        .unwrap();
    assert_eq!(
        pairs[0].1.post_recv(&mem, d).err(),
        Some(via::Error::InvalidState)
    );
    // Nor can a connected VI change its receive queue.
    assert_eq!(
        pairs[0].1.set_srq(None).err(),
        Some(via::Error::InvalidState)
    );
    // Sends: VI 0 two messages, VI 1 three, VI 2 one; immediate = message.
    let plan = [0usize, 1, 1, 0, 2, 1];
    for (m, &k) in plan.iter().enumerate() {
        let len = 100 + 10 * m;
        mem.write(32768 + 1024 * m, &pattern(len, m as u32))
            .unwrap();
        let d = DescBuilder::send()
            .segment(&mem, 32768 + 1024 * m, len as u32)
            .immediate(m as u32)
            .write(&mem, 16384 + 64 * m)
            .unwrap();
        pairs[k].0.post_send(&mem, d).unwrap();
        let c = pairs[k].0.send_wait(WAIT).unwrap();
        assert_eq!(c.status & ERROR_MASK, 0, "send {m}: {:#x}", c.status);
        // The SRQ's oldest receive took it.
        let c = srq.wait(WAIT).unwrap();
        assert_eq!(c.status & ERROR_MASK, 0, "receive {m}: {:#x}", c.status);
        assert_eq!(c.status & OP_MASK, OP_RECEIVE);
        assert_ne!(c.status & IMMEDIATE, 0);
        assert_eq!(c.vi, pairs[k].1.slot(), "message {m} came through VI {k}");
        assert_eq!(c.desc, mem.addr(64 * m).unwrap(), "in order of posting");
        let off = 64 * m;
        assert_eq!(mem.word(off + 24) as usize, len, "length of {m}");
        let mut got = vec![0u8; len];
        mem.read(8192 + 512 * m, &mut got).unwrap();
        assert_eq!(got, pattern(len, m as u32), "data of {m}");
    }
    assert_eq!(srq.done().err(), Some(via::Error::NotDone));
    // A message longer than the SRQ's next buffer: LENGTH_ERROR there.
    post(6);
    mem.write(40960, &pattern(600, 9)).unwrap();
    let d = DescBuilder::send()
        .segment(&mem, 40960, 600)
        .write(&mem, 16384)
        .unwrap();
    pairs[2].0.post_send(&mem, d).unwrap();
    let c = srq.wait(WAIT).unwrap();
    assert_ne!(c.status & LENGTH_ERROR, 0, "{:#x}", c.status);
    let _ = pairs[2].0.send_wait(WAIT);
    // Refusals: destroy while attached; another tag; Unreliable.
    post(7);
    let srq = match srq.destroy() {
        Err(r) => {
            assert_eq!(r.error, via::Error::InvalidState);
            r.object
        }
        Ok(()) => panic!("an SRQ with VIs attached was destroyed"),
    };
    let other = nic.create_ptag().unwrap();
    let v = nic
        .create_vi(
            &via::ViAttributes::new(Reliability::ReliableDelivery, other),
            None,
            None,
        )
        .unwrap();
    assert_eq!(v.set_srq(Some(&srq)).err(), Some(via::Error::InvalidPtag));
    let u = nic
        .create_vi(
            &via::ViAttributes::new(Reliability::Unreliable, ptag),
            None,
            None,
        )
        .unwrap();
    assert_eq!(
        u.set_srq(Some(&srq)).err(),
        Some(via::Error::InvalidReliabilityLevel)
    );
    // Detached (after a disconnect), the SRQ goes; the receive still
    // posted completes flushed.
    for (s, r) in &pairs {
        let _ = s.disconnect();
        let _ = r.disconnect();
        r.set_srq(None).unwrap();
    }
    assert!(srq.destroy().is_ok());
    assert_ne!(
        mem.word(64 * 7 + 28) & DESC_FLUSHED_ERROR,
        0,
        "flushed status"
    );
    nic.close().unwrap();
}

/// XRC (one connection per remote node shared by its processes) needs
/// `ibv_open_xrcd`; Soft-RoCE does not implement it (`EOPNOTSUPP`), so the
/// XRC extension cannot be built and tested here (docs/design.md §8).
#[test]
fn xrc_support_of_the_device() {
    let Some(dev) = verbs_device() else { return };
    let r = via::rdma_xrc_supported(&dev);
    println!("XRC on {dev}: {r:?}");
    if dev.starts_with("rxe") {
        let e = r.expect_err("rxe now opens XRC domains: implement the XRC extension");
        // EOPNOTSUPP (ibv_open_xrcd of a provider without the verb).
        assert_eq!(e.kind(), std::io::ErrorKind::Unsupported, "{e}");
    }
}

/// Kinds of NIC without shared receive queues refuse them cleanly.
#[test]
fn srq_on_other_kinds_is_invalid_parameter() {
    ensure_viad();
    // By name: VIA_DEVICE may make a verbs device the default.
    let nic = Nic::open(Some("via_lo")).unwrap();
    assert_ne!(nic.kind(), "verbs");
    let ptag = nic.create_ptag().unwrap();
    assert_eq!(
        nic.create_srq(ptag, 16).err(),
        Some(via::Error::InvalidParameter)
    );
    nic.close().unwrap();
}

/// A parked registration keeps its memory region on verbs when only this
/// process can reach it: the same buffer registered around each message
/// comes back under the handle it had without `ibv_reg_mr`, and its bytes
/// move each time; while parked its handle is dead. A registration with
/// remote access is deregistered at once (the peer's device checks the
/// rkey alone): an RDMA write to its old handle is refused and leaves the
/// memory as it was. Prints the cost of a registration cycle both ways.
#[test]
fn parked_registrations_keep_their_memory_region() {
    use std::time::Instant;
    use via::Region;
    let Some(nic) = verbs_nic() else { return };
    if nic.registration_stats().monitor.is_none() || !via::config::Config::get().parked {
        eprintln!("SKIPPED (no memory-event monitor, or VIA_PARKED=off): parking on verbs");
        return;
    }
    let ptag = nic.create_ptag().unwrap();
    let mut a = via::ViAttributes::new(Reliability::ReliableDelivery, ptag);
    a.enable_rdma_write = true;
    let (s, r) = local_pair(&nic, &a, "park", |_| {});
    // Descriptors at 0 (receive) and 64 (send); received bytes at 8192.
    let ring = Region::new(&nic, 1 << 16, ptag, false, false).unwrap();
    let mem = via::Memory::new(1 << 20).unwrap();
    let n = 4096u32;
    let exchange = |seg: (u64, u32), round: u32| -> u32 {
        let d = DescBuilder::recv()
            .segment(&ring, 8192, n)
            .write(&ring, 0)
            .unwrap();
        r.post_recv(&ring, d).unwrap();
        let d = DescBuilder::send()
            .raw_segment(seg.0, seg.1, n)
            .write(&ring, 64)
            .unwrap();
        s.post_send(&ring, d).unwrap();
        let st = s.send_wait(Some(T)).unwrap().status;
        if st & ERROR_MASK == 0 {
            let c = r.recv_wait(Some(T)).unwrap();
            assert_eq!(c.status & ERROR_MASK, 0, "receive {round}: {:#x}", c.status);
            let mut got = vec![0u8; n as usize];
            ring.read(8192, &mut got).unwrap();
            assert_eq!(got, pattern(n as usize, round), "round {round}");
        }
        st
    };
    let before = nic.registration_stats();
    let mut handles = std::collections::HashSet::new();
    for round in 1..=50 {
        mem.write(0, &pattern(n as usize, round)).unwrap();
        let buf = Region::within(&nic, &mem, 0, 64 << 10, ptag, false, false).unwrap();
        handles.insert(buf.handle());
        let st = exchange((buf.addr(0).unwrap(), buf.handle()), round);
        assert_eq!(st & ERROR_MASK, 0, "send {round}: {st:#x}");
        buf.deregister().unwrap();
    }
    let after = nic.registration_stats();
    assert_eq!(after.parked_hits - before.parked_hits, 49);
    assert_eq!(handles.len(), 1, "the parked registration's handle");
    // Dead while parked: a receive into it is refused at the post (a
    // protection error, the connection unharmed), and the next
    // registration takes it back and moves bytes again.
    let h = *handles.iter().next().unwrap();
    let d = DescBuilder::recv()
        .raw_segment(mem.addr(), h, n)
        .write(&ring, 128)
        .unwrap();
    r.post_recv(&ring, d).unwrap();
    let st = r.recv_wait(Some(T)).unwrap().status;
    assert_ne!(
        st & PROTECTION_ERROR,
        0,
        "receive into a parked handle: {st:#x}"
    );
    let buf = Region::within(&nic, &mem, 0, 64 << 10, ptag, false, false).unwrap();
    assert_eq!(buf.handle(), h);
    mem.write(0, &pattern(n as usize, 99)).unwrap();
    assert_eq!(exchange((buf.addr(0).unwrap(), h), 99) & ERROR_MASK, 0);
    buf.deregister().unwrap();
    // The cost of a cycle (register, deregister) of the same 64 KiB, the
    // MR kept against made each time (remote access).
    let cycle = |remote: bool| {
        let t = Instant::now();
        for _ in 0..200 {
            Region::within(&nic, &mem, 0, 64 << 10, ptag, remote, false)
                .unwrap()
                .deregister()
                .unwrap();
        }
        t.elapsed().as_nanos() as f64 / 200.0
    };
    let (kept, made) = (cycle(false), cycle(true));
    println!(
        "register+deregister 64 KiB on verbs: {kept:.0} ns with the MR kept, {made:.0} ns with an MR made each time ({:.1}x)",
        made / kept
    );
    // Remote access: out of reach once deregistered.
    let far = Region::within(&nic, &mem, 65536, 4096, ptag, true, false).unwrap();
    let (far_addr, far_h) = (far.addr(0).unwrap(), far.handle());
    mem.write(65536, &[0x11; 4096]).unwrap();
    far.deregister().unwrap();
    ring.write(16384, &[0x22; 4096]).unwrap();
    let d = DescBuilder::rdma_write(far_addr, far_h)
        .segment(&ring, 16384, 4096)
        .write(&ring, 64)
        .unwrap();
    s.post_send(&ring, d).unwrap();
    let st = s.send_wait(Some(T)).unwrap().status;
    assert_ne!(
        st & ERROR_MASK,
        0,
        "RDMA write to a deregistered region: {st:#x}"
    );
    let mut got = vec![0u8; 4096];
    mem.read(65536, &mut got).unwrap();
    assert_eq!(got, vec![0x11; 4096], "the deregistered region was written");
}
