//! The registration path seen from outside: a peer does not keep the
//! memory of regions its owner retired, and the counters of the cache and
//! of the engine's translation cache tell what happened.

use via::descriptor::status::*;
use via::{DescBuilder, Region, Reliability};
use via_tests::*;

const PEER: &str = env!("CARGO_BIN_EXE_via-peer");

/// Status, length and immediate data of a `RECV`/`SEND` answer.
fn comp(s: &str) -> (u32, u32, u32) {
    let v = nums(s);
    (v[0] as u32, v[1] as u32, v[2] as u32)
}

/// Mappings of `pid`'s arenas in this process.
fn arenas_of(pid: i32) -> usize {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let tag = format!("/memfd:via-arena:{pid}:");
    maps.lines().filter(|l| l.contains(&tag)).count()
}

// The counters are per process: the two checks run one after the other.
#[test]
fn registration_in_this_process_and_a_peer() {
    repeated_registration_hits_and_unmap_invalidates();
    a_peer_unmaps_what_the_owner_retired();
    receives_into_registrations_that_come_back();
    receives_into_one_buffer_registered_around_each();
    a_send_after_the_receive_buffer_was_deregistered();
    ranges_without_a_whole_page_register_and_move();
}

/// The peer registers a new region, this side RDMA-writes into it (and so
/// maps its arena), the peer deregisters and frees it: 300 times. The
/// arenas of freed regions are retired by their owner; this side's
/// mappings of them must stay bounded instead of growing with the rounds.
fn a_peer_unmaps_what_the_owner_retired() {
    let s = Setup::new(Reliability::ReliableDelivery, 1 << 16, true, false);
    let mut p = Peer::serve(PEER);
    p.cmd_expect("open rd 65536 1 0", "MEM");
    s.connect_to(&mut p, &disc_str("retire"));
    let pid = p.pid();
    let mut at_100 = 0;
    for round in 0..300 {
        let r = nums(&p.cmd_expect("region 65536 same 1 0", "REGION"));
        let (idx, addr, h) = (r[0], r[1], r[2] as u32);
        s.fill(4096, 1000, round);
        let d = DescBuilder::rdma_write(addr + 100, h)
            .segment(&s.mem, 4096, 1000)
            .write(&s.mem, 0)
            .unwrap();
        s.vi.post_send(&s.mem, d).unwrap();
        let st = s.vi.send_wait(WAIT).unwrap().status;
        assert_eq!(st, DONE | OP_RDMA_WRITE, "round {round}: status {st:#x}");
        assert_eq!(p.cmd(&format!("check {idx} 100 1000 {round}")), "SAME");
        assert_eq!(p.cmd(&format!("dereg {idx}")), "OK");
        if round == 100 {
            at_100 = arenas_of(pid);
        }
    }
    let at_300 = arenas_of(pid);
    eprintln!("arenas of the peer mapped here: {at_100} after 100 rounds, {at_300} after 300");
    assert!(
        at_300 <= 24 && at_300 <= at_100 + 4,
        "arenas of the peer mapped here: {at_100} after 100 rounds, {at_300} after 300"
    );
    let t = s
        .nic
        .translation_stats()
        .expect("the soft NIC has a translation cache");
    assert_eq!(t.entries, 1024);
    assert_eq!(t.ways, 1);
    assert!(t.rdma.compulsory >= 300, "{t:?}");
    p.exit();
}

/// One message of 1,000 bytes (`round`'s fill) into a receive the peer
/// posts at `off` of its region `idx`: it completes on both sides and lands
/// whole.
fn message_into(s: &Setup, p: &mut Peer, idx: u64, off: usize, round: u32) {
    assert_eq!(p.cmd(&format!("recv 0 {off}:1000@{idx}")), "OK");
    s.fill(4096, 1000, round);
    let d = DescBuilder::send()
        .segment(&s.mem, 4096, 1000)
        .write(&s.mem, 0)
        .unwrap();
    s.vi.post_send(&s.mem, d).unwrap();
    let st = s.vi.send_wait(WAIT).unwrap().status;
    assert_eq!(st, DONE, "round {round}: send status {st:#x}");
    let got = comp(&p.cmd_expect("wait_recv", "RECV"));
    assert_eq!((got.0, got.1), (DONE | OP_RECEIVE, 1000), "round {round}");
    assert_eq!(
        p.cmd(&format!("check {idx} {off} 1000 {round}")),
        "SAME",
        "round {round}"
    );
}

/// The peer registers two buffers in turn around every receive, as a
/// message layer does: each registration after the first of a buffer comes
/// back (parked) in the same table entry with the same extents, under the
/// handle it had, and this side's engine, whose cached translation of that
/// handle fails its check (the entry was written twice since), reuses the
/// region it resolved before. Every message must land in the buffer of its
/// own registration, never in the other one, and the other buffer must
/// keep what it last received; the two buffers never share a handle.
fn receives_into_registrations_that_come_back() {
    let s = Setup::new(Reliability::ReliableDelivery, 1 << 16, false, false);
    let mut p = Peer::serve(PEER);
    p.cmd_expect("open rd 65536 0 0", "MEM");
    s.connect_to(&mut p, &disc_str("revive"));
    let mems: Vec<u64> = (0..2)
        .map(|_| nums(&p.cmd_expect("memory 16384", "MEMORY"))[0])
        .collect();
    let mut handles = [
        std::collections::HashSet::new(),
        std::collections::HashSet::new(),
    ];
    for round in 0..200u32 {
        let which = round as usize % 2;
        let m = mems[which];
        let r = nums(&p.cmd_expect(&format!("try_region_in {m}"), "REGION"));
        let (idx, h) = (r[0], r[2] as u32);
        handles[which].insert(h);
        assert!(
            !handles[1 - which].contains(&h),
            "round {round}: handle {h:#x} of the other buffer"
        );
        let off = 100 + (round as usize % 7) * 1000;
        message_into(&s, &mut p, idx, off, round);
        if round > 0 {
            // The other buffer still holds the previous round's message.
            let prev = nums(&p.cmd_expect(
                &format!("try_region_in {}", mems[(round as usize + 1) % 2]),
                "REGION",
            ))[0];
            let poff = 100 + ((round - 1) as usize % 7) * 1000;
            assert_eq!(
                p.cmd(&format!("check {prev} {poff} 1000 {}", round - 1)),
                "SAME",
                "round {round}: the other buffer changed"
            );
            assert_eq!(p.cmd(&format!("dereg {prev}")), "OK");
        }
        assert_eq!(p.cmd(&format!("dereg {idx}")), "OK");
    }
    p.exit();
}

/// The peer registers one buffer around every receive, as a message layer
/// does: its parked registration comes back each time under its handle,
/// its table entry written twice since this side's engine last used it,
/// and the engine finds it in place holding the same again (the lane, not
/// the translation cache). Every message must land whole at its offset,
/// the bytes around it untouched.
fn receives_into_one_buffer_registered_around_each() {
    let s = Setup::new(Reliability::ReliableDelivery, 1 << 16, false, false);
    let mut p = Peer::serve(PEER);
    p.cmd_expect("open rd 65536 0 0", "MEM");
    s.connect_to(&mut p, &disc_str("again"));
    let mem = nums(&p.cmd_expect("memory 16384", "MEMORY"))[0];
    let mut handles = std::collections::HashSet::new();
    for round in 0..200u32 {
        let r = nums(&p.cmd_expect(&format!("try_region_in {mem}"), "REGION"));
        let (idx, h) = (r[0], r[2] as u32);
        handles.insert(h);
        let off = 100 + (round as usize % 5) * 2000;
        message_into(&s, &mut p, idx, off, round);
        if round >= 4 {
            // The next slot still holds what it got four rounds ago.
            let next = 100 + ((round as usize + 1) % 5) * 2000;
            assert_eq!(
                p.cmd(&format!("check {idx} {next} 1000 {}", round - 4)),
                "SAME",
                "round {round}: another slot changed"
            );
        }
        assert_eq!(p.cmd(&format!("dereg {idx}")), "OK");
    }
    eprintln!(
        "{} handles for 200 registrations of one buffer",
        handles.len()
    );
    p.exit();
}

/// Sends land in a peer buffer 50 times (the engine keeps the regions of
/// that connection's receives at hand), then the peer posts one more
/// receive into the buffer and deregisters it before the send: the send
/// must find the registration gone, never write the buffer (its memory is
/// still there, in the same arena), and the receive must not complete as
/// received. (Reliable reception: the sender hears of the failure too.)
fn a_send_after_the_receive_buffer_was_deregistered() {
    let s = Setup::new(Reliability::ReliableReception, 1 << 16, false, false);
    let mut p = Peer::serve(PEER);
    p.cmd_expect("open rr 65536 0 0", "MEM");
    s.connect_to(&mut p, &disc_str("lane"));
    let mem = nums(&p.cmd_expect("memory 16384", "MEMORY"))[0];
    let idx = nums(&p.cmd_expect(&format!("try_region_in {mem}"), "REGION"))[0];
    let send = |round: u32| {
        s.fill(4096, 8, round);
        let d = DescBuilder::send()
            .segment(&s.mem, 4096, 8)
            .write(&s.mem, 0)
            .unwrap();
        s.vi.post_send(&s.mem, d).unwrap();
        s.vi.send_wait(WAIT).unwrap().status
    };
    for round in 0..50u32 {
        assert_eq!(p.cmd(&format!("recv 0 100:8@{idx}")), "OK");
        assert_eq!(send(round), DONE, "round {round}");
        let got = comp(&p.cmd_expect("wait_recv", "RECV"));
        assert_eq!((got.0, got.1), (DONE | OP_RECEIVE, 8), "round {round}");
        assert_eq!(p.cmd(&format!("check {idx} 100 8 {round}")), "SAME");
    }
    assert_eq!(p.cmd(&format!("recv 0 100:8@{idx}")), "OK");
    assert_eq!(p.cmd(&format!("dereg {idx}")), "OK");
    let st = send(50);
    let got = comp(&p.cmd_expect("wait_recv", "RECV"));
    let again = nums(&p.cmd_expect(&format!("try_region_in {mem}"), "REGION"))[0];
    let data = p.cmd(&format!("check {again} 100 8 49"));
    assert_eq!(data, "SAME", "the deregistered buffer was written");
    assert_eq!(
        st,
        DONE | REMOTE_DESC_ERROR,
        "send into a deregistered buffer"
    );
    assert_eq!(
        (got.0, got.1),
        (DONE | OP_RECEIVE | PROTECTION_ERROR, 0),
        "receive into a deregistered buffer"
    );
    p.exit();
}

/// One buffer registered and deregistered over and over: after the first
/// registration every one is a cache hit that moves nothing; with the
/// arena's pages unmapped by the application, the next registration is a
/// miss (the memory event invalidated the entry).
fn repeated_registration_hits_and_unmap_invalidates() {
    if regcache_off() {
        eprintln!("SKIPPED (VIA_REGCACHE=off): the registration cache's hits and invalidation");
        return;
    }
    let nic = open_nic();
    let ptag = nic.create_ptag().unwrap();
    let mem = via::Memory::new(1 << 20).unwrap();
    let before = nic.registration_stats();
    let mut handles = std::collections::HashSet::new();
    for _ in 0..100 {
        let r = Region::within(&nic, &mem, 4096, 512 << 10, ptag, false, false).unwrap();
        handles.insert(r.handle());
        r.deregister().unwrap();
    }
    let after = nic.registration_stats();
    assert_eq!(after.cache.misses - before.cache.misses, 1);
    assert_eq!(after.cache.hits - before.cache.hits, 99);
    assert_eq!(after.arenas.created - before.arenas.created, 1);
    // With memory events, each hit took the deregistered registration back
    // whole (parked), under the handle it had (the C suite's `handles`
    // checks that the handle is dead while deregistered, and `reuse` that
    // memory that went away gets a new one); without, each is a new
    // registration under a new handle.
    if after.monitor.is_some() && via::config::Config::get().parked {
        assert_eq!(after.parked_hits - before.parked_hits, 99);
        assert_eq!(handles.len(), 1, "the parked registration's handle");
    } else {
        assert_eq!(handles.len(), 100, "a handle came back");
    }
    if after.monitor.is_none() {
        eprintln!("SKIPPED (no memory-event monitor on this kernel): the invalidation part");
        return;
    }
    // The application unmaps the memory: the cached entry goes away.
    drop(mem);
    let mem = via::Memory::new(1 << 20).unwrap();
    let r = Region::within(&nic, &mem, 0, 4096, ptag, false, false).unwrap();
    let s = nic.registration_stats();
    assert!(s.cache.invalidations > before.cache.invalidations, "{s:?}");
    assert!(s.monitor.unwrap().unmaps > 0);
    r.deregister().unwrap();
}

/// Ranges that hold no whole page (they straddle a page boundary, or sit
/// inside one page), as a message layer registers pieces of malloc'd
/// buffers: they register, and their bytes move. (A range across a
/// boundary with no whole page used to give an empty arena and
/// `VIP_INVALID_PARAMETER`.)
fn ranges_without_a_whole_page_register_and_move() {
    let s = Setup::new(Reliability::ReliableDelivery, 1 << 16, false, false);
    let mut p = Peer::serve(PEER);
    let m = nums(&p.cmd_expect("open rd 65536 1 0", "MEM"));
    let (peer_addr, peer_h) = (m[0], m[1] as u32);
    s.connect_to(&mut p, &disc_str("nowhole"));
    let page = 4096;
    let mem = via::Memory::new(4 * page).unwrap();
    let cases = [
        (page - 100, 200),
        (page - 1, 2),
        (2 * page - 4000, 5000),
        (100, 200),
        (3 * page - 8, 16),
    ];
    for (k, &(off, len)) in cases.iter().enumerate() {
        let data = pattern(len, k as u32 + 1);
        mem.write(off, &data).unwrap();
        let r = Region::within(&s.nic, &mem, off, len, s.ptag, false, false)
            .unwrap_or_else(|e| panic!("register {len} bytes at page offset {off}: {e}"));
        let d = DescBuilder::rdma_write(peer_addr + 8192, peer_h)
            .segment(&r, 0, len as u32)
            .write(&s.mem, 0)
            .unwrap();
        s.vi.post_send(&s.mem, d).unwrap();
        assert_eq!(s.vi.send_wait(WAIT).unwrap().status, DONE | OP_RDMA_WRITE);
        assert_eq!(
            p.cmd(&format!("check 0 8192 {len} {}", k + 1)),
            "SAME",
            "{len} bytes at {off}"
        );
        r.deregister().unwrap();
    }
    p.exit();
}
