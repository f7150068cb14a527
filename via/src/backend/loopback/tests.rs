//! The device-neutral object model on the loopback device: the VI state
//! machine, translation of descriptors, completion writing and error
//! reporting, without processes or viad.

use std::sync::mpsc;
use std::time::Duration;

use crate::api::{DescBuilder, Memory, Nic, Region, Vi};
use crate::attrs::{Ptag, Reliability, ViAttributes, ViState};
use crate::descriptor::control;
use crate::descriptor::status::*;
use crate::error::Error;
use crate::nic::{AsyncError, ErrorCode, NicInner};
use crate::process::Process;

const T: Duration = Duration::from_secs(10);

fn nic() -> Nic {
    let p = Process::without_daemon();
    Nic::over(NicInner::open_with(&p, "loopback", super::open).unwrap())
}

/// The asynchronous errors of `nic`, as they reach its callback.
fn errors(nic: &Nic) -> mpsc::Receiver<AsyncError> {
    let (tx, rx) = mpsc::channel();
    let tx = std::sync::Mutex::new(tx);
    nic.set_error_callback(move |e| {
        let _ = tx.lock().unwrap().send(*e);
    });
    rx
}

fn attrs(rel: Reliability, ptag: Ptag, rdma: bool) -> ViAttributes {
    let mut a = ViAttributes::new(rel, ptag);
    a.enable_rdma_write = rdma;
    a.enable_rdma_read = rdma && rel.is_reliable();
    a
}

/// Connects `a` and `b` the way the broker does, without one.
fn connect(nic: &Nic, a: &Vi, b: &Vi) {
    let n = &nic.inner;
    a.core().begin_connect().unwrap();
    b.core().begin_connect().unwrap();
    let (ea, eb) = (a.core().endpoint(n), b.core().endpoint(n));
    a.core().complete_connect(n, &eb).unwrap();
    b.core().complete_connect(n, &ea).unwrap();
}

struct Pair {
    nic: Nic,
    ptag: Ptag,
    a: Vi,
    b: Vi,
    mem: Region,
}

fn pair(rel: Reliability, rdma: bool) -> Pair {
    let nic = nic();
    let ptag = nic.create_ptag().unwrap();
    let a = nic.create_vi(&attrs(rel, ptag, rdma), None, None).unwrap();
    let b = nic.create_vi(&attrs(rel, ptag, rdma), None, None).unwrap();
    let mem = Region::new(&nic, 1 << 20, ptag, rdma, rdma).unwrap();
    connect(&nic, &a, &b);
    Pair {
        nic,
        ptag,
        a,
        b,
        mem,
    }
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
}

fn bytes(m: &Region, off: usize, n: usize) -> Vec<u8> {
    let mut b = vec![0u8; n];
    m.read(off, &mut b).unwrap();
    b
}

#[test]
fn the_state_machine_and_flushing() {
    let nic = nic();
    let ptag = nic.create_ptag().unwrap();
    let at = attrs(Reliability::ReliableDelivery, ptag, false);
    let a = nic.create_vi(&at, None, None).unwrap();
    let b = nic.create_vi(&at, None, None).unwrap();
    let m = Region::new(&nic, 65536, ptag, false, false).unwrap();
    assert_eq!(a.state(), ViState::Idle);
    // Sends need a connection; receives may be posted before.
    let d = DescBuilder::send()
        .segment(&m, 4096, 8)
        .write(&m, 0)
        .unwrap();
    assert_eq!(a.post_send(&m, d), Err(Error::InvalidState));
    let r = DescBuilder::recv()
        .segment(&m, 8192, 64)
        .write(&m, 64)
        .unwrap();
    b.post_recv(&m, r).unwrap();
    assert_eq!(b.queues_empty(), (true, false));
    // Attributes change only while idle.
    connect(&nic, &a, &b);
    assert_eq!(
        (a.state(), b.state()),
        (ViState::Connected, ViState::Connected)
    );
    assert_eq!(a.set_attributes(&at), Err(Error::InvalidState));
    assert_eq!(
        a.core().begin_connect(),
        Err(Error::InvalidState),
        "connecting twice"
    );
    // The receive posted while idle takes the first message.
    m.write(4096, b"8 bytes!").unwrap();
    a.post_send(&m, d).unwrap();
    assert_eq!(a.send_wait(Some(T)).unwrap().status, DONE | OP_SEND);
    let c = b.recv_wait(Some(T)).unwrap();
    assert_eq!((c.desc, c.status), (m.addr(64).unwrap(), DONE | OP_RECEIVE));
    assert_eq!(bytes(&m, 8192, 8), b"8 bytes!");
    for i in 0..3 {
        let r = DescBuilder::recv()
            .segment(&m, 8192, 64)
            .write(&m, 128 + 64 * i)
            .unwrap();
        b.post_recv(&m, r).unwrap();
    }
    // Disconnecting flushes the queued receives, in order, and goes idle.
    b.disconnect().unwrap();
    assert_eq!(b.state(), ViState::Idle);
    for i in 0..3 {
        let c = b.recv_done().unwrap();
        assert_eq!(c.desc, m.addr(128 + 64 * i).unwrap());
        assert_eq!(c.status, DONE | OP_RECEIVE | DESC_FLUSHED_ERROR);
        assert_eq!(m.status(128 + 64 * i), c.status, "written into memory");
    }
    assert_eq!(b.recv_done(), Err(Error::NotDone));
    assert_eq!(b.disconnect(), Err(Error::InvalidState), "already idle");
    // The broker tells the peer (viad's RemoteDisconnect): its VI breaks,
    // and a send there is flushed.
    a.core().peer_disconnected(&nic.inner);
    assert_eq!(a.state(), ViState::Error);
    a.post_send(&m, d).unwrap();
    assert_eq!(
        a.send_wait(Some(T)).unwrap().status,
        DONE | OP_SEND | DESC_FLUSHED_ERROR
    );
    a.disconnect().unwrap();
    // Idle with empty queues: both can go.
    a.destroy().map_err(|r| r.error).unwrap();
    b.destroy().map_err(|r| r.error).unwrap();
}

#[test]
fn destroy_is_refused_with_queued_descriptors() {
    let nic = nic();
    let ptag = nic.create_ptag().unwrap();
    let vi = nic
        .create_vi(&attrs(Reliability::Unreliable, ptag, false), None, None)
        .unwrap();
    let m = Region::new(&nic, 65536, ptag, false, false).unwrap();
    let r = DescBuilder::recv()
        .segment(&m, 4096, 8)
        .write(&m, 0)
        .unwrap();
    vi.post_recv(&m, r).unwrap();
    let vi = match vi.destroy() {
        Err(r) => {
            assert_eq!(r.error, Error::InvalidState);
            r.object
        }
        Ok(()) => panic!("destroyed with a posted receive"),
    };
    // The protection tag is in use while the VI and the region live.
    assert_eq!(nic.destroy_ptag(ptag), Err(Error::InvalidState));
    drop((vi, m));
}

#[test]
fn gather_scatter_immediate_and_cq_entries() {
    let p = pair(Reliability::ReliableReception, false);
    let cq = p.nic.create_cq(16).unwrap();
    let c = p
        .nic
        .create_vi(
            &attrs(Reliability::ReliableReception, p.ptag, false),
            None,
            Some(&cq),
        )
        .unwrap();
    let s = p
        .nic
        .create_vi(
            &attrs(Reliability::ReliableReception, p.ptag, false),
            None,
            None,
        )
        .unwrap();
    connect(&p.nic, &s, &c);
    let m = &p.mem;
    // 3 pieces gathered, scattered over 2 (the second longer than needed).
    let data = pattern(10_000, 7);
    m.write(100_000, &data[..1]).unwrap();
    m.write(200_001, &data[1..6000]).unwrap();
    m.write(300_003, &data[6000..]).unwrap();
    let r = DescBuilder::recv()
        .segment(m, 400_000, 4000)
        .segment(m, 500_007, 8000)
        .write(m, 64)
        .unwrap();
    c.post_recv(m, r).unwrap();
    let d = DescBuilder::send()
        .segment(m, 100_000, 1)
        .segment(m, 200_001, 5999)
        .segment(m, 300_003, 4000)
        .immediate(0xfeed_f00d)
        .write(m, 0)
        .unwrap();
    s.post_send(m, d).unwrap();
    assert_eq!(s.send_wait(Some(T)).unwrap().status, DONE | OP_SEND);
    // The CQ names the VI's receive queue; then the descriptor dequeues.
    assert_eq!(cq.wait(Some(T)).unwrap(), (c.slot(), true));
    let done = c.recv_done().unwrap();
    assert_eq!(done.status, DONE | OP_RECEIVE | IMMEDIATE);
    assert_eq!(m.word(64 + 24), 10_000, "Length");
    assert_eq!(m.word(64 + 20), 0xfeed_f00d, "ImmediateData");
    assert_eq!(bytes(m, 400_000, 4000), data[..4000]);
    assert_eq!(bytes(m, 500_007, 6000), data[4000..]);
    assert_eq!(bytes(m, 500_007 + 6000, 16), [0u8; 16], "nothing beyond");
    assert_eq!(cq.done(), Err(Error::NotDone));
}

#[test]
fn translation_refuses_unusable_descriptors() {
    let p = pair(Reliability::Unreliable, false);
    let (a, m) = (&p.a, &p.mem);
    let ok = DescBuilder::send().segment(m, 4096, 8);
    // Misaligned: the descriptor must start on 64 bytes.
    let d = ok.write(m, 128).unwrap();
    let raw = bytes(m, d, 48);
    m.write(8, &raw).unwrap();
    assert_eq!(a.post_send(m, 8), Err(Error::DescriptorError));
    // Segments running past the end of the region.
    let mut cs = [0u8; 32];
    cs[12..14].copy_from_slice(&3u16.to_ne_bytes());
    m.write(m.len() - 64, &cs).unwrap();
    assert_eq!(a.post_send(m, m.len() - 64), Err(Error::DescriptorError));
    // More segments than a descriptor may have.
    let mut many = DescBuilder::send();
    for i in 0..17 {
        many = many.segment(m, 4096 + i, 1);
    }
    let d = many.write(m, 256).unwrap();
    assert_eq!(a.post_send(m, d), Err(Error::DescriptorError));
    // A reserved operation.
    let d = DescBuilder::send()
        .control(control::OP_RESERVED)
        .write(m, 1024)
        .unwrap();
    assert_eq!(a.post_send(m, d), Err(Error::DescriptorError));
    // RDMA without its address segment; RDMA read with immediate data.
    let d = DescBuilder::send()
        .control(control::OP_RDMAWRITE)
        .write(m, 1088)
        .unwrap();
    assert_eq!(a.post_send(m, d), Err(Error::DescriptorError));
    // RDMA read on an unreliable VI: refused at creation and at post time.
    let mut at = attrs(Reliability::Unreliable, p.ptag, false);
    at.enable_rdma_read = true;
    assert_eq!(
        p.nic.create_vi(&at, None, None).err(),
        Some(Error::InvalidRdmaRead)
    );
    let d = DescBuilder::rdma_read(m.addr(0).unwrap(), m.handle())
        .segment(m, 4096, 8)
        .write(m, 1152)
        .unwrap();
    assert_eq!(a.post_send(m, d), Err(Error::DescriptorError));
    // A handle that is not live: the descriptor cannot even be read.
    let gone = Region::new(&p.nic, 4096, p.ptag, false, false).unwrap();
    let d = ok.write(&gone, 0).unwrap();
    let h = gone.handle();
    let addr = gone.addr(d).unwrap();
    gone.deregister().unwrap();
    assert_eq!(
        a.core().post_send(&p.nic.inner, addr, h),
        Err(Error::InvalidParameter)
    );
    // Nothing was queued by any refused post.
    assert_eq!(a.queues_empty(), (true, true));
}

#[test]
fn a_queue_s_descriptor_cache_follows_the_region_table() {
    // A work queue remembers the extent its last descriptor came from
    // (`translate::DescCache`); the answers must be those of a cold post:
    // a deregistered region's handle is refused, a descriptor running past
    // the region's end is a descriptor error, a segment outside the region
    // a protection error.
    let p = pair(Reliability::Unreliable, false);
    let (a, b) = (&p.a, &p.b);
    let r = Region::new(&p.nic, 8192, p.ptag, false, false).unwrap();
    let send = DescBuilder::send().segment(&r, 4096, 8);
    for at in [0, 64, 0] {
        let d = send.write(&r, at).unwrap();
        a.post_send(&r, d).unwrap();
        let c = a.send_wait(Some(T)).unwrap();
        assert_eq!((c.desc, c.status), (r.addr(d).unwrap(), DONE | OP_SEND));
    }
    // Past the end, with the cache warm for this region.
    let mut cs = [0u8; 32];
    cs[12..14].copy_from_slice(&3u16.to_ne_bytes());
    r.write(r.len() - 64, &cs).unwrap();
    assert_eq!(a.post_send(&r, r.len() - 64), Err(Error::DescriptorError));
    // Misaligned, warm.
    assert_eq!(a.post_send(&r, 8), Err(Error::DescriptorError));
    // A segment outside the region, warm: a protection error at once.
    let d = DescBuilder::recv()
        .segment(&r, 8192 - 4, 8)
        .write(&r, 128)
        .unwrap();
    b.post_recv(&r, d).unwrap();
    let c = b.recv_wait(Some(T)).unwrap();
    assert_eq!(c.status, DONE | OP_RECEIVE | PROTECTION_ERROR);
    // Deregistered: the handle is dead.
    let d = send.write(&r, 192).unwrap();
    let (h, addr) = (r.handle(), r.addr(d).unwrap());
    r.deregister().unwrap();
    assert_eq!(
        a.core().post_send(&p.nic.inner, addr, h),
        Err(Error::InvalidParameter)
    );
    assert_eq!(a.queues_empty(), (true, true));
    assert_eq!(b.queues_empty(), (true, true));
}

#[test]
fn a_queue_s_data_region_entry_follows_the_region_table() {
    // A work queue remembers the region its last segments outside the
    // descriptor's region lay in (`translate::DataRegion`); the answers
    // must be those of a cold post: a segment past that region's end is a
    // protection error, one of a third region is checked on its own, and
    // once the region is deregistered a segment naming its handle is a
    // protection error, for sends and receives alike.
    let p = pair(Reliability::Unreliable, false);
    let (a, b, m) = (&p.a, &p.b, &p.mem);
    let data = Region::new(&p.nic, 8192, p.ptag, false, false).unwrap();
    let third = Region::new(&p.nic, 8192, p.ptag, false, false).unwrap();
    // Moves `n` bytes at `src` of `from` into `dst` of `to`; the
    // descriptors in `m`. Returns the send's and the receive's status.
    let move_bytes = |from: &Region, src: usize, to: &Region, dst: usize, n: u32| {
        let r = DescBuilder::recv().segment(to, dst, n).write(m, 0).unwrap();
        b.post_recv(m, r).unwrap();
        let d = DescBuilder::send()
            .segment(from, src, n)
            .write(m, 64)
            .unwrap();
        a.post_send(m, d).unwrap();
        let s = a.send_wait(Some(T)).unwrap().status;
        let r = match s & PROTECTION_ERROR {
            0 => b.recv_wait(Some(T)).unwrap().status,
            // The send never left: the receive is still posted.
            _ => {
                let d = DescBuilder::send()
                    .segment(m, 8192, 0)
                    .write(m, 64)
                    .unwrap();
                a.post_send(m, d).unwrap();
                a.send_wait(Some(T)).unwrap();
                b.recv_wait(Some(T)).unwrap().status
            }
        };
        (s, r)
    };
    for round in 0..3u8 {
        data.write(0, &pattern(64, round)).unwrap();
        assert_eq!(
            move_bytes(&data, 0, &data, 4096, 64),
            (DONE | OP_SEND, DONE | OP_RECEIVE)
        );
        assert_eq!(bytes(&data, 4096, 64), pattern(64, round));
    }
    // Past the end of the remembered region: a send's and a receive's.
    assert_eq!(
        move_bytes(&data, 8192 - 8, &data, 0, 16).0,
        DONE | OP_SEND | PROTECTION_ERROR
    );
    assert_eq!(
        move_bytes(&data, 0, &data, 8192 - 8, 16),
        (DONE | OP_SEND, DONE | OP_RECEIVE | PROTECTION_ERROR)
    );
    // A third region, and back.
    third.write(0, &pattern(32, 7)).unwrap();
    assert_eq!(
        move_bytes(&third, 0, &data, 0, 32),
        (DONE | OP_SEND, DONE | OP_RECEIVE)
    );
    assert_eq!(bytes(&data, 0, 32), pattern(32, 7));
    assert_eq!(
        move_bytes(&data, 0, &third, 4096, 32),
        (DONE | OP_SEND, DONE | OP_RECEIVE)
    );
    assert_eq!(bytes(&third, 4096, 32), pattern(32, 7));
    // Deregistered while remembered (the last segments were in it).
    assert_eq!(
        move_bytes(&data, 0, &data, 4096, 8),
        (DONE | OP_SEND, DONE | OP_RECEIVE)
    );
    let (h, va) = (data.handle(), data.addr(0).unwrap());
    data.deregister().unwrap();
    let d = DescBuilder::send()
        .raw_segment(va, h, 8)
        .write(m, 128)
        .unwrap();
    a.post_send(m, d).unwrap();
    assert_eq!(
        a.send_wait(Some(T)).unwrap().status,
        DONE | OP_SEND | PROTECTION_ERROR
    );
    let r = DescBuilder::recv()
        .raw_segment(va + 4096, h, 8)
        .write(m, 192)
        .unwrap();
    b.post_recv(m, r).unwrap();
    assert_eq!(
        b.recv_wait(Some(T)).unwrap().status,
        DONE | OP_RECEIVE | PROTECTION_ERROR
    );
    assert_eq!(a.queues_empty(), (true, true));
    assert_eq!(b.queues_empty(), (true, true));
}

#[test]
fn segments_in_the_data_region_and_a_third_region_in_one_descriptor() {
    // With the queue's data region current, a descriptor whose segments
    // lie in the descriptor's region, the data region and a third region
    // is checked in two steps: the first two inline, the third on its own
    // (`translate::recv_others`, which must leave the segments already
    // made offsets alone). Every piece lands where its segment says.
    let p = pair(Reliability::Unreliable, false);
    let (a, b, m) = (&p.a, &p.b, &p.mem);
    let data = Region::new(&p.nic, 8192, p.ptag, false, false).unwrap();
    let third = Region::new(&p.nic, 8192, p.ptag, false, false).unwrap();
    for round in 0..3u8 {
        // Warm: one segment in the data region each way.
        data.write(0, &pattern(16, round)).unwrap();
        let r = DescBuilder::recv()
            .segment(&data, 4096, 16)
            .write(m, 0)
            .unwrap();
        b.post_recv(m, r).unwrap();
        let d = DescBuilder::send()
            .segment(&data, 0, 16)
            .write(m, 64)
            .unwrap();
        a.post_send(m, d).unwrap();
        assert_eq!(a.send_wait(Some(T)).unwrap().status, DONE | OP_SEND);
        assert_eq!(b.recv_wait(Some(T)).unwrap().status, DONE | OP_RECEIVE);
        // Three pieces from the data region, the descriptors' region and
        // the third, into the descriptors' region, the data region and
        // the third.
        let msg = pattern(48, round + 10);
        data.write(64, &msg[..16]).unwrap();
        m.write(8192, &msg[16..32]).unwrap();
        third.write(128, &msg[32..]).unwrap();
        let r = DescBuilder::recv()
            .segment(m, 12288, 16)
            .segment(&data, 5000, 16)
            .segment(&third, 6000, 16)
            .write(m, 128)
            .unwrap();
        b.post_recv(m, r).unwrap();
        let d = DescBuilder::send()
            .segment(&data, 64, 16)
            .segment(m, 8192, 16)
            .segment(&third, 128, 16)
            .write(m, 192)
            .unwrap();
        a.post_send(m, d).unwrap();
        assert_eq!(a.send_wait(Some(T)).unwrap().status, DONE | OP_SEND);
        assert_eq!(b.recv_wait(Some(T)).unwrap().status, DONE | OP_RECEIVE);
        assert_eq!(bytes(m, 12288, 16), msg[..16]);
        assert_eq!(bytes(&data, 5000, 16), msg[16..32]);
        assert_eq!(bytes(&third, 6000, 16), msg[32..]);
    }
    assert_eq!(a.queues_empty(), (true, true));
    assert_eq!(b.queues_empty(), (true, true));
}

#[test]
fn a_refused_post_leaves_nothing_in_the_slot_the_next_post_fills() {
    // A post refused after its descriptor was read (an RDMA write without
    // its address segment; a receive with a reserved operation) has already
    // resolved its status location into the ring slot that the next post
    // fills. The next post, of a descriptor in another region (another
    // mapping), must complete there, and the refused descriptors' status
    // words must stay as they were. Several rounds, so slots are reused.
    let p = pair(Reliability::ReliableReception, false);
    let m = &p.mem;
    let other = Region::new(&p.nic, 1 << 16, p.ptag, false, false).unwrap();
    let marker = 0x5a5a_5a50u32;
    for round in 0..20u8 {
        let bad = DescBuilder::send()
            .control(control::OP_RDMAWRITE)
            .write(m, 1024)
            .unwrap();
        m.write(bad + 28, &marker.to_ne_bytes()).unwrap();
        assert_eq!(p.a.post_send(m, bad), Err(Error::DescriptorError));
        let bad_recv = DescBuilder::recv()
            .control(control::OP_RESERVED)
            .segment(m, 8192, 64)
            .write(m, 2048)
            .unwrap();
        m.write(bad_recv + 28, &marker.to_ne_bytes()).unwrap();
        assert_eq!(p.b.post_recv(m, bad_recv), Err(Error::DescriptorError));
        let r = DescBuilder::recv()
            .segment(&other, 8192, 64)
            .write(&other, 0)
            .unwrap();
        p.b.post_recv(&other, r).unwrap();
        let data = pattern(8, round);
        m.write(4096, &data).unwrap();
        let d = DescBuilder::send()
            .segment(m, 4096, 8)
            .write(&other, 128)
            .unwrap();
        p.a.post_send(&other, d).unwrap();
        let c = p.a.send_wait(Some(T)).unwrap();
        assert_eq!((c.desc, c.status), (other.addr(d).unwrap(), DONE | OP_SEND));
        let c = p.b.recv_wait(Some(T)).unwrap();
        assert_eq!(
            (c.desc, c.status),
            (other.addr(r).unwrap(), DONE | OP_RECEIVE)
        );
        assert_eq!(other.word(r + 24), 8, "Length");
        assert_eq!(bytes(&other, 8192, 8), data);
        assert_eq!(m.word(bad + 28), marker, "refused send's status");
        assert_eq!(m.word(bad_recv + 28), marker, "refused receive's status");
    }
    assert_eq!(p.a.queues_empty(), (true, true));
    assert_eq!(p.b.queues_empty(), (true, true));
}

#[test]
fn post_time_faults_complete_in_order_and_break_reliable_connections() {
    // Unreliable: the faulty descriptor completes with its error, the
    // connection stays.
    let p = pair(Reliability::Unreliable, false);
    let (a, b, m) = (&p.a, &p.b, &p.mem);
    let other = p.nic.create_ptag().unwrap();
    let foreign = Region::new(&p.nic, 4096, other, false, false).unwrap();
    let r = DescBuilder::recv()
        .segment(m, 8192, 64)
        .write(m, 512)
        .unwrap();
    b.post_recv(m, r).unwrap();
    let faults = [
        // A segment of a region with another protection tag.
        DescBuilder::send()
            .segment(&foreign, 0, 8)
            .write(m, 0)
            .unwrap(),
        // CS.Length that is not the sum of the segments.
        DescBuilder::send()
            .segment(m, 4096, 8)
            .length(9)
            .write(m, 64)
            .unwrap(),
        // A message longer than MaxTransferSize (64 KiB).
        DescBuilder::send()
            .segment(m, 4096, 65537)
            .write(m, 128)
            .unwrap(),
        // A good one last: it still runs, after the others.
        DescBuilder::send()
            .segment(m, 4096, 8)
            .write(m, 192)
            .unwrap(),
    ];
    for d in faults {
        a.post_send(m, d).unwrap();
    }
    let got: Vec<u32> = (0..4).map(|_| a.send_done().unwrap().status).collect();
    assert_eq!(
        got,
        [
            DONE | OP_SEND | PROTECTION_ERROR,
            DONE | OP_SEND | LENGTH_ERROR,
            DONE | OP_SEND | LENGTH_ERROR,
            DONE | OP_SEND
        ]
    );
    assert_eq!(b.recv_done().unwrap().status, DONE | OP_RECEIVE);
    assert_eq!(a.state(), ViState::Connected);
    drop(foreign);

    // Reliable: the same fault breaks the connection, both sides hear.
    let p = pair(Reliability::ReliableDelivery, false);
    let errs = errors(&p.nic);
    let m = &p.mem;
    let d = DescBuilder::send()
        .segment(m, 4096, 8)
        .length(9)
        .write(m, 0)
        .unwrap();
    p.a.post_send(m, d).unwrap();
    assert_eq!(
        p.a.send_done().unwrap().status,
        DONE | OP_SEND | LENGTH_ERROR
    );
    assert_eq!(p.a.state(), ViState::Error);
    let mut heard = Vec::new();
    while heard.len() < 2 {
        let e = errs.recv_timeout(T).expect("both VIs report the break");
        heard.push((e.vi.unwrap().0, e.code));
    }
    heard.sort_by_key(|(slot, code)| (*slot, *code as u8));
    assert_eq!(
        heard,
        [
            (p.a.slot(), ErrorCode::PostDesc),
            (p.b.slot(), ErrorCode::ConnLost)
        ]
    );
    assert_eq!(p.b.state(), ViState::Error);
}

#[test]
fn a_missing_or_short_receive_follows_the_reliability_level() {
    for rel in [
        Reliability::Unreliable,
        Reliability::ReliableDelivery,
        Reliability::ReliableReception,
    ] {
        let p = pair(rel, false);
        let errs = errors(&p.nic);
        let m = &p.mem;
        // A receive shorter than the message.
        let r = DescBuilder::recv()
            .segment(m, 8192, 4)
            .write(m, 512)
            .unwrap();
        p.b.post_recv(m, r).unwrap();
        let d = DescBuilder::send().segment(m, 4096, 8).write(m, 0).unwrap();
        p.a.post_send(m, d).unwrap();
        let sent = p.a.send_done().unwrap().status;
        let got = p.b.recv_done().unwrap().status;
        assert_eq!(got, DONE | OP_RECEIVE | LENGTH_ERROR, "{rel:?}");
        match rel {
            Reliability::Unreliable => {
                assert_eq!(sent, DONE | OP_SEND);
                // No receive at all: dropped, silently.
                p.a.post_send(m, d).unwrap();
                assert_eq!(p.a.send_done().unwrap().status, DONE | OP_SEND);
                assert_eq!(p.a.state(), ViState::Connected);
                assert!(errs.recv_timeout(Duration::from_millis(50)).is_err());
            }
            Reliability::ReliableDelivery | Reliability::ReliableReception => {
                let want = if rel == Reliability::ReliableReception {
                    REMOTE_DESC_ERROR
                } else {
                    0
                };
                assert_eq!(sent, DONE | OP_SEND | want, "{rel:?}");
                assert_eq!(p.a.state(), ViState::Error);
                let e = errs.recv_timeout(T).unwrap();
                assert_eq!(e.code, ErrorCode::ConnLost);
            }
        }
    }
}

#[test]
fn rdma_is_checked_against_the_target() {
    let p = pair(Reliability::ReliableDelivery, true);
    let errs = errors(&p.nic);
    let m = &p.mem;
    let data = pattern(5000, 3);
    m.write(100_000, &data).unwrap();
    // Write, then read back elsewhere.
    let target = m.addr(600_001).unwrap();
    let d = DescBuilder::rdma_write(target, m.handle())
        .segment(m, 100_000, 5000)
        .write(m, 0)
        .unwrap();
    p.a.post_send(m, d).unwrap();
    assert_eq!(p.a.send_done().unwrap().status, DONE | OP_RDMA_WRITE);
    assert_eq!(bytes(m, 600_001, 5000), data);
    let d = DescBuilder::rdma_read(target, m.handle())
        .segment(m, 700_000, 5000)
        .write(m, 64)
        .unwrap();
    p.a.post_send(m, d).unwrap();
    assert_eq!(p.a.send_done().unwrap().status, DONE | OP_RDMA_READ);
    assert_eq!(bytes(m, 700_000, 5000), data);
    // A write with immediate data consumes a receive, with no data.
    let r = DescBuilder::recv().write(m, 192).unwrap();
    p.b.post_recv(m, r).unwrap();
    let d = DescBuilder::rdma_write(target, m.handle())
        .segment(m, 100_000, 16)
        .immediate(42)
        .write(m, 128)
        .unwrap();
    p.a.post_send(m, d).unwrap();
    assert_eq!(p.a.send_done().unwrap().status, DONE | OP_RDMA_WRITE);
    assert_eq!(
        p.b.recv_done().unwrap().status,
        DONE | OP_REMOTE_RDMA_WRITE | IMMEDIATE
    );
    assert_eq!(m.word(192 + 20), 42);
    // Beyond the region: a protection violation; the target hears, the
    // reliable connection breaks, the target's memory is untouched.
    let before = bytes(m, m.len() - 100, 100);
    let d = DescBuilder::rdma_write(m.addr(m.len() - 100).unwrap(), m.handle())
        .segment(m, 100_000, 200)
        .write(m, 256)
        .unwrap();
    p.a.post_send(m, d).unwrap();
    assert_eq!(
        p.a.send_done().unwrap().status,
        DONE | OP_RDMA_WRITE | RDMA_PROT_ERROR
    );
    assert_eq!(bytes(m, m.len() - 100, 100), before);
    let mut codes = Vec::new();
    while codes.len() < 2 {
        codes.push(errs.recv_timeout(T).unwrap().code);
    }
    codes.sort_by_key(|c| *c as u8);
    assert_eq!(codes, [ErrorCode::ConnLost, ErrorCode::RdmawProt]);
    assert_eq!(p.a.state(), ViState::Error);
}

#[test]
fn a_region_without_rdma_enables_refuses_rdma() {
    let p = pair(Reliability::Unreliable, true);
    let errs = errors(&p.nic);
    let m = &p.mem;
    let plain = Region::new(&p.nic, 4096, p.ptag, false, false).unwrap();
    let d = DescBuilder::rdma_write(plain.addr(0).unwrap(), plain.handle())
        .segment(m, 100_000, 8)
        .write(m, 0)
        .unwrap();
    p.a.post_send(m, d).unwrap();
    assert_eq!(
        p.a.send_done().unwrap().status,
        DONE | OP_RDMA_WRITE | RDMA_PROT_ERROR
    );
    // Unreliable: the target hears, the connection stays.
    assert_eq!(errs.recv_timeout(T).unwrap().code, ErrorCode::RdmawProt);
    assert_eq!(p.a.state(), ViState::Connected);
    // Enabling it afterwards (VipSetMemAttributes) lets the write in.
    plain.set_attributes(p.ptag, true, false).unwrap();
    p.a.post_send(m, d).unwrap();
    assert_eq!(p.a.send_done().unwrap().status, DONE | OP_RDMA_WRITE);
}

/// A segment in the region that holds its descriptor (checked without a
/// second lookup: `translate::check_local`) is bounds-checked like any
/// other: past the region's end it completes with a protection error, on
/// both queues; inside it runs.
#[test]
fn segments_in_the_descriptors_own_region_are_bounds_checked() {
    let p = pair(Reliability::Unreliable, false);
    let (a, b, m) = (&p.a, &p.b, &p.mem);
    let end = 1 << 20;
    // Receives: the bad one completes at post time, the good one is taken.
    let bad = DescBuilder::recv()
        .segment(m, end - 4, 8)
        .write(m, 0)
        .unwrap();
    b.post_recv(m, bad).unwrap();
    let good = DescBuilder::recv()
        .segment(m, end - 8, 8)
        .write(m, 64)
        .unwrap();
    b.post_recv(m, good).unwrap();
    assert_eq!(
        b.recv_done().unwrap().status,
        DONE | OP_RECEIVE | PROTECTION_ERROR
    );
    // Sends: past the end, then at the very end.
    let bad = DescBuilder::send()
        .segment(m, end - 4, 8)
        .write(m, 128)
        .unwrap();
    a.post_send(m, bad).unwrap();
    let ok = DescBuilder::send()
        .segment(m, 8192, 8)
        .write(m, 192)
        .unwrap();
    a.post_send(m, ok).unwrap();
    let got: Vec<u32> = (0..2).map(|_| a.send_done().unwrap().status).collect();
    assert_eq!(got, [DONE | OP_SEND | PROTECTION_ERROR, DONE | OP_SEND]);
    assert_eq!(b.recv_done().unwrap().status, DONE | OP_RECEIVE);
}

#[test]
fn a_parked_registration_comes_back_under_a_fresh_handle_on_a_kind_that_keeps_no_entry() {
    // The loopback kind keeps no device entry for a deregistered region: a
    // parked registration taken back is added to it anew, under a fresh
    // handle; the old handle stays dead, and the bytes move through the
    // new one.
    let p = pair(Reliability::Unreliable, false);
    if !p.nic.inner.parks() {
        eprintln!("SKIPPED (no memory-event monitor here: nothing is parked)");
        return;
    }
    let mem = crate::api::Memory::new(8192).unwrap();
    let hits = p.nic.inner.parked_hits();
    let mut seen = std::collections::HashSet::new();
    let mut old = None;
    for round in 0..20u8 {
        let r = Region::within(&p.nic, &mem, 0, 4096, p.ptag, false, false).unwrap();
        assert!(seen.insert(r.handle()), "round {round}: a handle came back");
        if let Some((h, addr)) = old {
            // The previous handle is dead: a descriptor through it is not read.
            assert_eq!(
                p.a.core().post_send(&p.nic.inner, addr, h),
                Err(Error::InvalidParameter)
            );
        }
        // A message out of the region taken back arrives whole.
        let d = DescBuilder::recv()
            .segment(&p.mem, 4096, 64)
            .write(&p.mem, 128)
            .unwrap();
        p.b.post_recv(&p.mem, d).unwrap();
        r.write(256, &[round; 64]).unwrap();
        let d = DescBuilder::send()
            .segment(&r, 256, 64)
            .write(&r, 0)
            .unwrap();
        p.a.post_send(&r, d).unwrap();
        assert_eq!(p.a.send_wait(Some(T)).unwrap().status, DONE | OP_SEND);
        assert_eq!(p.b.recv_wait(Some(T)).unwrap().status, DONE | OP_RECEIVE);
        let mut got = [0u8; 64];
        p.mem.read(4096, &mut got).unwrap();
        assert_eq!(got, [round; 64], "round {round}");
        old = Some((r.handle(), r.addr(d).unwrap()));
        r.deregister().unwrap();
    }
    assert_eq!(
        p.nic.inner.parked_hits() - hits,
        19,
        "every registration after the first"
    );
}

/// viad's `RemoteDisconnect` with a reason (the verbs kind: the initiator
/// saw our RDMA violation, or its message found no receive here): the VI
/// breaks with that error; if it broke already (its device saw the
/// connection fail first), the callback still hears the reason; a plain
/// or unknown reason is a disconnect (`CONN_LOST`).
#[test]
fn a_peer_reported_error_breaks_with_its_reason() {
    let p = pair(Reliability::ReliableDelivery, true);
    let errs = errors(&p.nic);
    let me = p.b.core().endpoint(&p.nic.inner);
    p.nic
        .inner
        .remote_disconnect(&me, ErrorCode::RdmawProt as u8);
    assert_eq!(errs.recv_timeout(T).unwrap().code, ErrorCode::RdmawProt);
    assert_eq!(p.b.state(), ViState::Error);
    // Already broken: only the report.
    p.nic
        .inner
        .remote_disconnect(&me, ErrorCode::RecvqEmpty as u8);
    let e = errs.recv_timeout(T).unwrap();
    assert_eq!(
        (e.code, e.vi.map(|v| v.0)),
        (ErrorCode::RecvqEmpty, Some(p.b.core().slot))
    );
    assert_eq!(p.b.state(), ViState::Error);
    // On a connected VI, a reason that is not one a peer reports (200,
    // or a catastrophic error) is a plain disconnect.
    let q = pair(Reliability::ReliableDelivery, true);
    let errs = errors(&q.nic);
    let me = q.a.core().endpoint(&q.nic.inner);
    q.nic
        .inner
        .remote_disconnect(&me, ErrorCode::Catastrophic as u8);
    assert_eq!(errs.recv_timeout(T).unwrap().code, ErrorCode::ConnLost);
    assert_eq!(q.a.state(), ViState::Error);
    // Broken already, a plain disconnect adds nothing: the next report is
    // the one after it.
    q.nic.inner.remote_disconnect(&me, 200);
    q.nic
        .inner
        .remote_disconnect(&me, ErrorCode::RdmarProt as u8);
    assert_eq!(errs.recv_timeout(T).unwrap().code, ErrorCode::RdmarProt);
}

/// A reason that arrives once the VI left its connection (idle again) is
/// not reported: it was about the connection it left.
#[test]
fn a_peer_reported_error_after_the_disconnect_is_ignored() {
    let p = pair(Reliability::ReliableDelivery, true);
    let errs = errors(&p.nic);
    let me = p.b.core().endpoint(&p.nic.inner);
    p.b.disconnect().unwrap();
    assert_eq!(p.b.state(), ViState::Idle);
    p.nic
        .inner
        .remote_disconnect(&me, ErrorCode::RdmawProt as u8);
    assert_eq!(p.b.state(), ViState::Idle);
    // The next report is the one after it (`a`'s break by its peer).
    p.a.core().peer_disconnected(&p.nic.inner);
    let e = errs.recv_timeout(T).unwrap();
    assert_eq!(
        (e.code, e.vi.map(|v| v.0)),
        (ErrorCode::ConnLost, Some(p.a.core().slot))
    );
}

#[test]
fn descriptors_deregistered_and_unmapped_while_posted_flush_into_a_copy() {
    // A program frees the memory of descriptors it still has posted
    // (deregisters it, then unmaps it), then tears the connection down and
    // drains the queue. The region covers part of a page only, so the
    // library reads it in place (a window it does not own): flushing or
    // dequeuing through that window after the unmap crashed the process.
    // Now the deregistration moves the posted descriptors' control
    // segments into copies: the flush completes them there, and the
    // program dequeues them as usual.
    let nic = nic();
    let ptag = nic.create_ptag().unwrap();
    let at = attrs(Reliability::ReliableDelivery, ptag, false);
    let a = nic.create_vi(&at, None, None).unwrap();
    let b = nic.create_vi(&at, None, None).unwrap();
    connect(&nic, &a, &b);
    let mem = Memory::new(4096).unwrap();
    let m = Region::within(&nic, &mem, 64, 2048, ptag, false, false).unwrap();
    let descs: Vec<u64> = (0..3)
        .map(|i| {
            let d = DescBuilder::recv()
                .segment(&m, 1024, 64)
                .write(&m, 64 * i)
                .unwrap();
            b.post_recv(&m, d).unwrap();
            m.addr(d).unwrap()
        })
        .collect();
    drop(m);
    drop(mem);
    b.disconnect().unwrap();
    for d in descs {
        let c = b.recv_done().unwrap();
        assert_eq!(c.desc, d);
        assert_eq!(c.status, DONE | OP_RECEIVE | DESC_FLUSHED_ERROR);
    }
    assert_eq!(b.recv_done(), Err(Error::NotDone));
    b.destroy().map_err(|r| r.error).unwrap();
    a.disconnect().unwrap();
}
