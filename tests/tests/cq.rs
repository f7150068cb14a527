//! Completion queues over 64 VIs, in both CQ mechanisms (`VIA_CQ=ring`,
//! CQ1, and `VIA_CQ=scan`, CQ2). The mechanism is read once per process,
//! so each mode runs in a child process of this test executable (and the
//! peer is started with the same setting).

use std::collections::HashMap;
use std::time::Duration;

use via::descriptor::status::*;
use via::{DescBuilder, Error, Region, Reliability, ViAttributes};
use via_tests::*;

const PEER: &str = env!("CARGO_BIN_EXE_via-peer");
const VIS: usize = 64;
const MSGS: usize = 8;
const MSG: usize = 64;
/// Set (to the mode) only in the child processes.
const CHILD: &str = "VIA_TESTS_CQ_CHILD";

#[test]
fn cq_over_64_vis_ring() {
    run_child_test(
        "cq_child",
        &[("VIA_CQ", "ring"), (CHILD, "ring")],
        Duration::from_secs(240),
    );
}

#[test]
fn cq_over_64_vis_scan() {
    run_child_test(
        "cq_child",
        &[("VIA_CQ", "scan"), (CHILD, "scan")],
        Duration::from_secs(240),
    );
}

/// The body of the two tests above; does nothing unless run by them.
#[test]
fn cq_child() {
    let Ok(mode) = std::env::var(CHILD) else {
        return;
    };
    assert_eq!(via::config::Config::get().cq.as_str(), mode);
    let nic = open_nic();
    let ptag = nic.create_ptag().unwrap();
    let n = VIS * MSGS;
    let bufs = (n + VIS) * 64;
    let mem = Region::new(&nic, bufs + (n + VIS) * MSG, ptag, false, false).unwrap();
    // One CQ for the send and receive queues of all 64 VIs.
    let cq = nic.create_cq((n + VIS) as u32).unwrap();
    let at = ViAttributes::new(Reliability::ReliableDelivery, ptag);
    let vis: Vec<_> = (0..VIS)
        .map(|_| nic.create_vi(&at, Some(&cq), Some(&cq)).unwrap())
        .collect();
    let by_slot: HashMap<u32, usize> = vis.iter().enumerate().map(|(i, v)| (v.slot(), i)).collect();
    for (i, v) in vis.iter().enumerate() {
        for j in 0..MSGS {
            let k = i * MSGS + j;
            let d = DescBuilder::recv()
                .segment(&mem, bufs + k * MSG, MSG as u32)
                .write(&mem, k * 64)
                .unwrap();
            v.post_recv(&mem, d).unwrap();
        }
    }
    let d = disc_str("cq64");
    let mut p = Peer::spawn_env(
        PEER,
        &["fan", &d, "rd", &VIS.to_string(), &MSGS.to_string()],
        &[("VIA_CQ", &mode)],
    );
    assert_eq!(p.expect("MODE"), mode);
    let local = nic.address(d.as_bytes());
    for _ in 0..VIS {
        let req = nic.connect_wait(&local, WAIT).expect("connect wait");
        let i: usize = std::str::from_utf8(&req.remote.discriminator).unwrap()["fan-".len()..]
            .parse()
            .unwrap();
        req.accept(&vis[i]).expect("accept");
    }
    p.expect("CONNECTED");
    assert_eq!(cq.done(), Err(Error::NotDone));
    p.say("GO");

    // Every message of every VI through the CQ, each VI in FIFO order.
    let mut next = [0usize; VIS];
    for _ in 0..n {
        let (slot, is_recv) = cq.wait(WAIT).expect("CQ wait");
        assert!(is_recv, "a send completion before any send");
        let i = by_slot[&slot];
        let c = vis[i].recv_done().expect("recv_done after the CQ said so");
        assert_eq!(c.status, DONE | OP_RECEIVE, "VI {i}");
        let k = ((c.desc - mem.addr(0).unwrap()) / 64) as usize;
        let j = next[i];
        assert_eq!(k, i * MSGS + j, "VI {i}: receive FIFO");
        let mut b = vec![0u8; MSG];
        mem.read(bufs + k * MSG, &mut b).unwrap();
        let mut want = pattern(MSG, (j * VIS + i) as u32);
        want[0..4].copy_from_slice(&(i as u32).to_le_bytes());
        want[4..8].copy_from_slice(&(j as u32).to_le_bytes());
        assert_eq!(b, want, "VI {i} message {j}");
        next[i] += 1;
    }
    assert!(next.iter().all(|&x| x == MSGS));
    assert_eq!(
        cq.done(),
        Err(Error::NotDone),
        "more completions than messages"
    );
    p.expect("SENT");

    // One reply per VI: send completions through the same CQ.
    for (i, v) in vis.iter().enumerate() {
        let at = bufs + (n + i) * MSG;
        mem.write(at, &pattern(MSG, 1000 + i as u32)).unwrap();
        let d = DescBuilder::send()
            .segment(&mem, at, MSG as u32)
            .write(&mem, (n + i) * 64)
            .unwrap();
        v.post_send(&mem, d).unwrap();
    }
    let mut sent = [false; VIS];
    for _ in 0..VIS {
        let (slot, is_recv) = cq.wait(WAIT).expect("CQ wait (sends)");
        assert!(!is_recv);
        let i = by_slot[&slot];
        let c = vis[i].send_done().expect("send_done after the CQ said so");
        assert_eq!(
            (c.desc, c.status),
            (mem.addr((n + i) * 64).unwrap(), DONE | OP_SEND)
        );
        assert!(!std::mem::replace(&mut sent[i], true), "VI {i} twice");
    }
    assert_eq!(cq.done(), Err(Error::NotDone));
    p.expect("GOT");
    p.say("bye");
    p.finish();
    let _ = nic.close();
}
