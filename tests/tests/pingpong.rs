//! Ping-pong between two processes on the default NIC, every size.

use via::Reliability;
use via_tests::*;

const PEER: &str = env!("CARGO_BIN_EXE_via-peer");

#[test]
fn pingpong_sizes_data_checked() {
    let sizes: Vec<usize> = (0..=20)
        .map(|p| 1usize << p)
        .chain([0, 1, 3, 100, 4095, 4097, 65535, 65537, 1_000_000])
        .collect();
    let max = 1 << 20;
    let d = String::from_utf8(disc("pp")).unwrap();
    let mut peer = Peer::spawn(
        PEER,
        &["echo", &d, "rd", &max.to_string(), &sizes.len().to_string()],
    );
    peer.expect("LISTENING");
    let s = Setup::new(Reliability::ReliableDelivery, 2 * max + 8192, false, false);
    let remote = s.nic.address(d.as_bytes());
    let local = s.nic.address(b"client");
    s.vi.connect(&local, &remote, WAIT).expect("connect");
    let (sbuf, rbuf) = (4096, 4096 + max);
    for (r, &n) in sizes.iter().enumerate() {
        let data = pattern(n, r as u32);
        s.mem.write(sbuf, &data).unwrap();
        post_recv(&s, 0, rbuf, max as u32);
        post_send(&s, 128, sbuf, n as u32);
        let c = s.vi.send_wait(WAIT).expect("send");
        assert_eq!(c.status & via::descriptor::status::ERROR_MASK, 0);
        let c = s.vi.recv_wait(WAIT).expect("recv");
        assert_eq!(
            c.status & via::descriptor::status::ERROR_MASK,
            0,
            "status {:#x}",
            c.status
        );
        assert_eq!(s.mem.word(24) as usize, n, "length");
        let mut got = vec![0u8; n];
        s.mem.read(rbuf, &mut got).unwrap();
        assert!(got == data, "data mismatch at size {n}");
    }
    peer.expect("DONE");
    peer.finish();
}
