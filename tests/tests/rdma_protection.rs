//! RDMA protection: every way an RDMA write or read may be refused by the
//! target (wrong tag, another NIC's handle, out of bounds, RDMA disabled on
//! the VI or on the region, deregistered region). Each violation completes
//! the initiator's descriptor with RDMA_PROT_ERROR, leaves the target memory
//! untouched and reports RdmawProt/RdmarProt to the target; on reliable
//! connections it also breaks the connection.

use via::descriptor::status::*;
use via::{DescBuilder, Error, ErrorCode, Reliability, ViAttributes, ViState};
use via_tests::*;

const PEER: &str = env!("CARGO_BIN_EXE_via-peer");
const T: std::time::Duration = std::time::Duration::from_secs(20);

/// One refused target: how the peer prepares it, and where the test aims.
struct Case {
    name: &'static str,
    /// Commands for the peer; the answer of the last one, if `REGION`, names
    /// the target region.
    setup: Vec<String>,
    /// Offset from the target region's start, and length.
    off: i64,
    len: u32,
}

fn cases() -> Vec<Case> {
    let c = |name, setup: &[&str], off, len| Case {
        name,
        setup: setup.iter().map(|s| s.to_string()).collect(),
        off,
        len,
    };
    vec![
        c("wrong ptag", &["region 16384 new 1 1"], 0, 100),
        c("foreign handle", &["foreign 16384"], 0, 100),
        c(
            "out of bounds (end)",
            &["region 16384 same 1 1"],
            16384 - 50,
            100,
        ),
        c(
            "out of bounds (before start)",
            &["region 16384 same 1 1"],
            -8,
            100,
        ),
        c("disabled on region", &["region 16384 same 0 0"], 0, 100),
        c(
            "deregistered region",
            &["region 16384 same 1 1", "dereg LAST"],
            0,
            100,
        ),
    ]
}

/// Runs the peer commands of `c`; returns (region index, address, handle).
fn prepare(p: &mut Peer, c: &Case) -> (usize, u64, u32) {
    let mut last = (0, 0, 0);
    for cmd in &c.setup {
        let cmd = cmd.replace("LAST", &last.0.to_string());
        let a = p.cmd(&cmd);
        if let Some(r) = a.strip_prefix("REGION") {
            let v = nums(r);
            last = (v[0] as usize, v[1], v[2] as u32);
        } else {
            assert_eq!(a, "OK", "{}: {cmd}", c.name);
        }
    }
    last
}

/// The test process and an interpreter peer, connected at level `rel`.
fn pair(rel: Reliability, rel_s: &str, w: bool, r: bool) -> (Setup, Peer, RemoteMem) {
    let s = Setup::new(rel, 1 << 16, true, rel.is_reliable());
    let mut p = Peer::serve(PEER);
    let m = RemoteMem::parse(&p.cmd_expect(
        &format!("open {rel_s} 65536 {} {}", w as u8, r as u8),
        "MEM",
    ));
    s.connect_to(&mut p, &disc_str(&format!("prot-{rel_s}")));
    (s, p, m)
}

/// Both sides back to Idle, then connected again.
fn reconnect(s: &Setup, p: &mut Peer, tag: &str) {
    assert_eq!(p.cmd("disconnect"), "OK");
    s.vi.disconnect().unwrap();
    assert_eq!(s.vi.state(), ViState::Idle);
    s.connect_to(p, &disc_str(tag));
}

/// Posts an RDMA write of `len` bytes from offset 4096 to `addr`/`h`;
/// returns its final status.
fn write(s: &Setup, addr: u64, h: u32, len: u32) -> u32 {
    s.fill(4096, len as usize, 77);
    let d = DescBuilder::rdma_write(addr, h)
        .segment(&s.mem, 4096, len)
        .write(&s.mem, 0)
        .unwrap();
    s.vi.post_send(&s.mem, d).unwrap();
    s.vi.send_wait(WAIT).unwrap().status
}

/// Posts an RDMA read of `len` bytes from `addr`/`h` into offset 8192;
/// returns its final status.
fn read(s: &Setup, addr: u64, h: u32, len: u32) -> u32 {
    let d = DescBuilder::rdma_read(addr, h)
        .segment(&s.mem, 8192, len)
        .write(&s.mem, 0)
        .unwrap();
    s.vi.post_send(&s.mem, d).unwrap();
    s.vi.send_wait(WAIT).unwrap().status
}

fn target(base: u64, off: i64) -> u64 {
    base.wrapping_add_signed(off)
}

#[test]
fn rdma_write_violations_unreliable_keep_the_connection() {
    let (s, mut p, m) = pair(Reliability::Unreliable, "u", true, false);
    let errs = ErrorLog::install(&s.nic);
    for c in cases() {
        let (idx, addr, h) = prepare(&mut p, &c);
        // The target region (or region 0 when it is gone) holds a pattern.
        let chk = if c.name.starts_with("dereg") { 0 } else { idx };
        assert_eq!(p.cmd(&format!("fill {chk} 0 16384 5")), "OK");
        let st = write(&s, target(addr, c.off), h, c.len);
        assert_eq!(
            st,
            DONE | OP_RDMA_WRITE | RDMA_PROT_ERROR,
            "{}: status {st:#x}",
            c.name
        );
        assert_eq!(
            p.cmd(&format!("check {chk} 0 16384 5")),
            "SAME",
            "{}: target memory changed",
            c.name
        );
        assert!(
            p.cmd("wait_error RdmawProt")
                .starts_with("ERROR RdmawProt Vi"),
            "{}: target not told",
            c.name
        );
        assert_eq!(p.cmd_expect("state", "STATE"), "Connected", "{}", c.name);
        assert_eq!(s.vi.state(), ViState::Connected, "{}", c.name);
    }
    // Region 0 of the peer (RDMA write enabled, same tag) stays usable.
    assert_eq!(
        write(&s, m.addr + 100, m.handle, 1000),
        DONE | OP_RDMA_WRITE
    );
    assert_eq!(
        unhex(&p.cmd_expect("peek 0 100 1000", "DATA")),
        pattern(1000, 77)
    );
    assert!(
        errs.wait_for(ErrorCode::ConnLost, std::time::Duration::ZERO)
            .is_none()
    );
    // Memory attributes changed while connected take effect at once.
    assert_eq!(p.cmd("set_mem 0 0 0"), "OK");
    assert_eq!(p.cmd("fill 0 0 16384 7"), "OK");
    assert_eq!(
        write(&s, m.addr, m.handle, 100),
        DONE | OP_RDMA_WRITE | RDMA_PROT_ERROR
    );
    assert_eq!(p.cmd("check 0 0 16384 7"), "SAME");
    assert!(p.cmd("wait_error RdmawProt").starts_with("ERROR RdmawProt"));
    assert_eq!(p.cmd("set_mem 0 1 0"), "OK");
    assert_eq!(write(&s, m.addr, m.handle, 100), DONE | OP_RDMA_WRITE);
    assert_eq!(
        unhex(&p.cmd_expect("peek 0 0 100", "DATA")),
        pattern(100, 77)
    );

    // RDMA write disabled on the target VI (region 0 allows it).
    s.vi.disconnect().unwrap();
    assert!(p.cmd("disconnect") == "OK");
    assert_eq!(p.cmd("set_vi 0 0"), "OK");
    s.connect_to(&mut p, &disc_str("prot-u-2"));
    assert_eq!(p.cmd("fill 0 0 16384 6"), "OK");
    assert_eq!(
        write(&s, m.addr, m.handle, 100),
        DONE | OP_RDMA_WRITE | RDMA_PROT_ERROR
    );
    assert_eq!(p.cmd("check 0 0 16384 6"), "SAME");
    assert!(p.cmd("wait_error RdmawProt").starts_with("ERROR RdmawProt"));
    assert_eq!(s.vi.state(), ViState::Connected);
    p.exit();
}

#[test]
fn rdma_write_violation_reliable_breaks_the_connection() {
    for (rel, rs) in [
        (Reliability::ReliableDelivery, "rd"),
        (Reliability::ReliableReception, "rr"),
    ] {
        let (s, mut p, m) = pair(rel, rs, true, false);
        let errs = ErrorLog::install(&s.nic);
        let (_, addr, h) = prepare(&mut p, &cases()[0]);
        assert_eq!(p.cmd("fill 1 0 16384 8"), "OK");
        // Outstanding receives on both sides get flushed by the break.
        post_recv(&s, 256, 32768, 100);
        assert_eq!(p.cmd("recv 0 4096:100"), "OK");
        assert_eq!(
            write(&s, addr, h, 100),
            DONE | OP_RDMA_WRITE | RDMA_PROT_ERROR
        );
        assert_eq!(p.cmd("check 1 0 16384 8"), "SAME");
        assert!(
            p.cmd("wait_error RdmawProt")
                .starts_with("ERROR RdmawProt Vi")
        );
        errs.expect(ErrorCode::ConnLost, T);
        assert_eq!(s.vi.state(), ViState::Error);
        assert_eq!(p.cmd_expect("state", "STATE"), "Error");
        assert_eq!(
            s.vi.recv_wait(WAIT).unwrap().status,
            DONE | OP_RECEIVE | DESC_FLUSHED_ERROR
        );
        let (st, _, _) = {
            let v = nums(&p.cmd_expect("wait_recv", "RECV"));
            (v[0] as u32, v[1], v[2])
        };
        assert_eq!(st, DONE | OP_RECEIVE | DESC_FLUSHED_ERROR);
        let _ = m;
        p.exit();
    }
}

#[test]
fn rdma_read_violations_break_reliable_connections() {
    let (s, mut p, m) = pair(Reliability::ReliableDelivery, "rd", true, true);
    let errs = ErrorLog::install(&s.nic);
    let mut all = cases();
    // For reads "disabled on region" means read disabled (write allowed).
    all[4].setup = vec!["region 16384 same 1 0".into()];
    for (i, c) in all.iter().enumerate() {
        let (_, addr, h) = prepare(&mut p, c);
        s.fill(8192, 16384, 9);
        let st = read(&s, target(addr, c.off), h, c.len);
        assert_eq!(
            st,
            DONE | OP_RDMA_READ | RDMA_PROT_ERROR,
            "{}: status {st:#x}",
            c.name
        );
        assert_eq!(
            s.bytes(8192, 16384),
            pattern(16384, 9),
            "{}: local memory changed",
            c.name
        );
        assert!(
            p.cmd("wait_error RdmarProt")
                .starts_with("ERROR RdmarProt Vi"),
            "{}: target not told",
            c.name
        );
        assert!(
            errs.take(ErrorCode::ConnLost, T).is_some(),
            "{}: no ConnLost",
            c.name
        );
        assert_eq!(s.vi.state(), ViState::Error, "{}", c.name);
        assert_eq!(p.cmd_expect("state", "STATE"), "Error", "{}", c.name);
        reconnect(&s, &mut p, &format!("prot-r-{i}"));
    }
    // RDMA read disabled on the target VI (region 0 allows it).
    assert_eq!(p.cmd("disconnect"), "OK");
    s.vi.disconnect().unwrap();
    assert_eq!(p.cmd("set_vi 1 0"), "OK");
    s.connect_to(&mut p, &disc_str("prot-r-vi"));
    s.fill(8192, 100, 9);
    assert_eq!(
        read(&s, m.addr, m.handle, 100),
        DONE | OP_RDMA_READ | RDMA_PROT_ERROR
    );
    assert_eq!(s.bytes(8192, 100), pattern(100, 9));
    assert!(p.cmd("wait_error RdmarProt").starts_with("ERROR RdmarProt"));
    errs.expect(ErrorCode::ConnLost, T);
    // And with read enabled again, a read works and moves the data.
    reconnect_with(&s, &mut p, "set_vi 1 1", "prot-r-ok");
    assert_eq!(p.cmd("fill 0 0 4096 10"), "OK");
    assert_eq!(read(&s, m.addr, m.handle, 4096), DONE | OP_RDMA_READ);
    assert_eq!(s.bytes(8192, 4096), pattern(4096, 10));
    p.exit();
}

fn reconnect_with(s: &Setup, p: &mut Peer, between: &str, tag: &str) {
    assert_eq!(p.cmd("disconnect"), "OK");
    s.vi.disconnect().unwrap();
    assert_eq!(p.cmd(between), "OK");
    s.connect_to(p, &disc_str(tag));
}

#[test]
fn rdma_read_only_on_reliable_vis() {
    let nic = open_nic();
    let ptag = nic.create_ptag().unwrap();
    let mut a = ViAttributes::new(Reliability::Unreliable, ptag);
    a.enable_rdma_read = true;
    assert_eq!(
        nic.create_vi(&a, None, None).err(),
        Some(Error::InvalidRdmaRead)
    );
    assert!(nic.attributes().rdma_read_support & Reliability::Unreliable.bits() == 0);
    let _ = nic.close();

    // Posting an RDMA read on a connected unreliable VI is refused.
    let (s, p, m) = pair(Reliability::Unreliable, "u", true, false);
    let d = DescBuilder::rdma_read(m.addr, m.handle)
        .segment(&s.mem, 8192, 8)
        .write(&s.mem, 0)
        .unwrap();
    assert_eq!(s.vi.post_send(&s.mem, d), Err(Error::DescriptorError));
    assert_eq!(s.vi.queues_empty(), (true, true));
    assert_eq!(s.vi.state(), ViState::Connected);
    p.exit();
}

#[test]
fn rdma_write_with_immediate_needs_a_receive() {
    for (rel, rs) in [
        (Reliability::ReliableDelivery, "rd"),
        (Reliability::ReliableReception, "rr"),
    ] {
        let (s, mut p, m) = pair(rel, rs, true, false);
        let errs = ErrorLog::install(&s.nic);
        assert_eq!(p.cmd("fill 0 0 16384 12"), "OK");
        s.fill(4096, 100, 13);
        let d = DescBuilder::rdma_write(m.addr, m.handle)
            .immediate(5)
            .segment(&s.mem, 4096, 100)
            .write(&s.mem, 0)
            .unwrap();
        s.vi.post_send(&s.mem, d).unwrap();
        let st = s.vi.send_wait(WAIT).unwrap().status;
        let want = if rel == Reliability::ReliableReception {
            REMOTE_DESC_ERROR
        } else {
            0
        };
        assert_eq!(st, DONE | OP_RDMA_WRITE | want, "{rel:?}");
        // No receive to consume: no data lands, the connection breaks.
        assert_eq!(p.cmd("check 0 0 16384 12"), "SAME", "{rel:?}: data landed");
        assert!(
            p.cmd("wait_error RecvqEmpty")
                .starts_with("ERROR RecvqEmpty")
        );
        errs.expect(ErrorCode::ConnLost, T);
        assert_eq!(s.vi.state(), ViState::Error);
        assert_eq!(p.cmd_expect("state", "STATE"), "Error");
        p.exit();
    }
}
