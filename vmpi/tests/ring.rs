//! The write ring of a channel (`vmpi::channel`), without the engine: two
//! channels of one process connected to each other over the default NIC
//! (shared memory), messages of every size class through the ring (its
//! wrap-around, credits returned by RDMA write and piggybacked, header,
//! data and trailer), and a broken connection seen by a receiver that
//! only polls memory.

mod common;

use std::time::{Duration, Instant};

use vmpi::channel::{Channel, Shape};
use vmpi::wire::{Header, Kind};

/// Two connected channels, `a` (rank 0's end) and `b` (rank 1's), both
/// switched to the ring.
fn pair(tag: &str, shape: Shape) -> (via::Nic, Channel, Channel) {
    common::build(false);
    let nic = via::Nic::open(None).expect("open the default NIC");
    assert!(
        nic.writes_tail_last(),
        "the soft NIC stores a write's last word last"
    );
    let ptag = nic.create_ptag().unwrap();
    let mut a = Channel::new(&nic, ptag, None, 1, shape).unwrap();
    let mut b = Channel::new(&nic, ptag, None, 0, shape).unwrap();
    let (ca, cb) = (a.credit_word().unwrap(), b.credit_word().unwrap());
    a.set_remote_credit(cb.0, cb.1);
    b.set_remote_credit(ca.0, ca.1);
    let (ra, rb) = (a.ring_base().unwrap(), b.ring_base().unwrap());
    a.use_ring(rb, cb.1).unwrap();
    b.use_ring(ra, ca.1).unwrap();
    let d = |s: &str| format!("ring-{tag}-{s}").into_bytes();
    std::thread::scope(|s| {
        let t = s.spawn(|| {
            let req = nic
                .connect_wait(&nic.address(&d("b")), Some(Duration::from_secs(20)))
                .unwrap();
            b.accept(req).unwrap();
        });
        a.connect(
            &nic.address(&d("a")),
            &nic.address(&d("b")),
            Some(Duration::from_secs(20)),
        )
        .unwrap();
        t.join().unwrap();
    });
    (nic, a, b)
}

fn payload(seed: u64, n: usize) -> Vec<u8> {
    (0..n).map(|i| (seed as usize * 31 + i * 7) as u8).collect()
}

/// Takes the next message from `ch` (within 10 s): its header and data.
fn take(ch: &mut Channel) -> (Header, Vec<u8>) {
    let i = ch
        .ring_wait(Duration::from_secs(10), Duration::from_micros(20))
        .unwrap()
        .expect("a message within 10 s");
    let h = *ch.header();
    let mut data = vec![
        0u8;
        if h.kind == Kind::Eager {
            h.len as usize
        } else {
            0
        }
    ];
    ch.read_data(i, &h, 0, &mut data).unwrap();
    ch.repost(i).unwrap();
    ch.return_credits(false).unwrap();
    (h, data)
}

/// Checks a message of the test below: an RTS as sent, an eager message
/// with its data.
fn verify(h: &Header, data: &[u8], n: u64) {
    if h.kind == Kind::Rts {
        assert_eq!(
            (h.tag, h.len, h.addr, h.handle),
            (-1, 1 << 30, 0x1234_5678, 77)
        );
        assert!(data.is_empty());
    } else {
        assert_eq!(h.context, 5);
        assert!(
            data == payload(h.tag as u64, h.len as usize),
            "message {n}: data"
        );
    }
}

#[test]
fn messages_of_every_size_through_the_ring_in_order() {
    let shape = Shape {
        recv: 4,
        send: 4,
        slot: 1024,
    };
    let (_nic, mut a, mut b) = pair("sizes", shape);
    assert!(a.is_ring() && b.is_ring());
    // Sizes around the one-write case (header, data and trailer in 64
    // bytes), the line boundary and the slot's room; 4 slots, so the ring
    // wraps every 4 messages and the sender waits for credits.
    let room = shape.eager_room();
    let sizes = [
        0usize,
        1,
        7,
        8,
        23,
        24,
        25,
        31,
        32,
        33,
        100,
        255,
        256,
        room - 8,
        room,
    ];
    let mut sent = 0u64;
    let mut got = 0u64;
    for round in 0..50u64 {
        for &n in &sizes {
            let seed = round * 1000 + n as u64;
            // Credits: wait for the receiver as a sender of the engine does.
            let start = Instant::now();
            while !b.can_send() {
                let (h, data) = take(&mut a);
                verify(&h, &data, got);
                got += 1;
                assert!(start.elapsed() < Duration::from_secs(10), "no credit");
            }
            let mut h = Header::new(Kind::Eager);
            h.tag = seed as i32;
            h.len = n as u64;
            h.context = 5;
            b.send(&mut h, &payload(seed, n)).unwrap();
            sent += 1;
        }
        // A rendezvous header (64 bytes, no data) in between.
        while !b.can_send() {
            let (h, data) = take(&mut a);
            verify(&h, &data, got);
            got += 1;
        }
        let mut h = Header::new(Kind::Rts);
        h.tag = -1;
        h.len = 1 << 30;
        h.addr = 0x1234_5678;
        h.handle = 77;
        h.sreq = round;
        b.send(&mut h, &[]).unwrap();
        sent += 1;
    }
    while got < sent {
        let (h, data) = take(&mut a);
        verify(&h, &data, got);
        got += 1;
    }
    // Nothing more: a poll finds nothing, a bounded wait ends empty.
    assert_eq!(a.ring_poll().unwrap(), None);
    assert_eq!(
        a.ring_wait(Duration::from_millis(20), Duration::ZERO)
            .unwrap(),
        None
    );
    b.reap().unwrap();
}

#[test]
fn a_ring_receiver_hears_of_a_broken_connection() {
    let shape = Shape {
        recv: 4,
        send: 4,
        slot: 256,
    };
    let (_nic, mut a, b) = pair("break", shape);
    let mut b = b;
    // A message written before the peer leaves is still taken first.
    let mut h = Header::new(Kind::Eager);
    h.len = 8;
    b.send(&mut h, &payload(1, 8)).unwrap();
    b.finish_sends(Instant::now() + Duration::from_secs(10))
        .unwrap();
    b.disconnect();
    let (_, data) = take(&mut a);
    assert_eq!(data, payload(1, 8));
    // Then the wait ends with the break, well before its timeout (the
    // bound is for a loaded machine, not a claim about time).
    let start = Instant::now();
    match a.ring_wait(Duration::from_secs(20), Duration::from_micros(20)) {
        Err(vmpi::Error::Transport(m)) => assert!(m.contains("broke"), "{m}"),
        other => panic!("a wait on a broken ring: {other:?}"),
    }
    assert!(
        start.elapsed() < Duration::from_secs(15),
        "{:?}",
        start.elapsed()
    );
}
