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

/// The verbs device the tests run on, or `None` (printing why) when this
/// machine has none.
fn device() -> Option<String> {
    let devs = via::rdma_devices();
    match std::env::var("VIA_DEVICE") {
        Ok(d) if devs.contains(&d) => Some(d),
        _ => {
            println!(
                "SKIP: no RDMA device selected (VIA_DEVICE unset or not among {devs:?}); \
                 tools/verbs-vm.sh runs these tests on Soft-RoCE"
            );
            None
        }
    }
}

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
    let Some(dev) = device() else { return };
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
    if device().is_none() {
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
    if device().is_none() {
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
    if device().is_none() {
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
    // A reliable connection breaks.
    errors.expect(ErrorCode::ConnLost, T);
    assert_eq!(s.vi.state(), ViState::Error);
    p.exit();
}

#[test]
fn peer_killed_mid_stream_is_conn_lost() {
    if device().is_none() {
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
