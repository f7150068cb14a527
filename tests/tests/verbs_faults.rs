//! Error paths of the verbs kind that a real device takes only by chance,
//! driven by fail points (feature `failpoints`, tikv's `fail`; built so by
//! `tools/verbs-vm.sh verbs_faults`, run on Soft-RoCE `rxe0`).
//!
//! An Unreliable VI whose peer sends a message longer than its receive
//! recovers (`backend/verbs`, `Recovery`): rxe moves the UC QP to ERROR and
//! flushes every request; the VI keeps its receives, brings the QP back
//! through RESET and posts them again. Two ways that can end otherwise:
//! * a `VipDisconnect` lands while the recovery is under way (a window of
//!   microseconds, held open here by `verbs-recovery-holds`): the failed
//!   receive completes with its length error, every kept one flushed, in
//!   order;
//! * the QP cannot come back (`verbs-repost` fails the second
//!   receive posted again): the VI breaks (`VIP_ERROR_CONN_LOST`), the
//!   failed receive completes with its length error and the others
//!   flushed, none lost.
//!
//! A connection whose QP cannot be brought up (`verbs-connect-rts` fails
//! the move to RTS, after RTR) after the peer accepted: the request fails
//! with `VIP_ERROR_RESOURCE`, the VI is idle with the receive posted before
//! (the QP is taken back to INIT through RESET, which drops it, and it is
//! posted again), and the peer hears `VIP_ERROR_CONN_LOST`.
//!
//! Objects the device refuses (`verbs-reg-mr`, `verbs-create-qp`: as
//! `ibv_reg_mr` does past `RLIMIT_MEMLOCK`, or `ibv_create_qp` past the
//! device's QPs): `VIP_ERROR_RESOURCE`, nothing left behind (more refusals
//! than the NIC has VIs, then a VI that works), the memory the program's
//! as it was.
//!
//! And one race: a deregistration while the completer is about to write a
//! send's status into the region (`verbs-send-status` stops it there).
//! The region covers part of a page, so its descriptor is written in place,
//! in the program's memory, which the program unmaps once
//! `VipDeregisterMem` returns: the deregistration must wait for the
//! completer (the test gives a deregistration that does not 2 s to show
//! it: the completer waits that long for it to return). And a send the
//! provider fails at posting: its VI is in ERROR before its status is
//! written (the same fail point stops the poster there).
//!
//! The device's link taken down under a connection: the send fails once
//! rxe's retries run out, and the VI is in ERROR when the program sees
//! that status, though the break itself is settled later
//! (`verbs-settle-breaks` holds it until the test looked).
//!
//! The device's asynchronous failures, which rxe raises none of by itself
//! (`verbs-device-event` injects them where the progress thread reads the
//! device's events): a QP that fails breaks its VI and no other; an SRQ
//! that fails breaks the VIs it serves; a device that fails is the NIC's
//! catastrophic error, and every VI breaks with every receive completed.
//!
//! Segments of several regions move whether posts hand the device the
//! memory handles as lkeys (rxe gives an MR one key) or look the lkeys up
//! (`verbs-keys-differ`: a device whose MRs have two keys).

#![cfg(feature = "failpoints")]

use std::time::Duration;

use via::descriptor::status::*;
use via::{DescBuilder, Error, ErrorCode, Reliability, ViState};
use via_tests::*;

const PEER: &str = env!("CARGO_BIN_EXE_via-peer");
const T: Duration = Duration::from_secs(20);

/// The test process and a connected peer, both Unreliable; a receive of
/// two 60-byte segments at descriptor 0 (shorter than the 121-byte
/// message the peer then sends) and two of 121 bytes behind it, at
/// descriptors 64 and 128.
fn recovering_pair(tag: &str) -> (Setup, Peer) {
    let s = Setup::with(
        open_nic(),
        Reliability::Unreliable,
        1 << 18,
        false,
        false,
        65536,
    );
    let mut p = Peer::serve(PEER);
    p.cmd_expect("open u 262144 0 0", "MEM");
    s.connect_to(&mut p, &disc_str(tag));
    post_short_recv(&s);
    post_recv(&s, 64, 16384, 121);
    post_recv(&s, 128, 20480, 121);
    (s, p)
}

/// The peer sends the 121-byte message (sent, as far as it can tell).
fn send_too_long(p: &mut Peer) {
    assert_eq!(p.cmd("send 0 4096:121"), "OK");
    let st = nums(&p.cmd_expect("wait_send", "SEND"))[0] as u32;
    assert_eq!(st, DONE | OP_SEND);
}

/// The next receive completion, which must be `status` on descriptor
/// offset `desc`.
fn expect_recv(s: &Setup, desc: usize, status: u32) {
    let c = s.vi.recv_wait(WAIT).unwrap();
    assert_eq!(
        (c.desc, c.status),
        (s.mem.addr(desc).unwrap(), status),
        "receive at {desc}: status {:#x}",
        c.status
    );
}

#[test]
fn a_disconnect_during_the_recovery_completes_every_receive() {
    if verbs_device().is_none() {
        return;
    }
    // One scenario at a time (the fail points are process-wide); removed
    // when it drops.
    let _scenario = fail::FailScenario::setup();
    let (began, begins) = std::sync::mpsc::channel();
    let began = std::sync::Mutex::new(began);
    fail::cfg_callback("verbs-recovery-begins", move || {
        let _ = began.lock().unwrap().send(());
    })
    .unwrap();
    fail::cfg("verbs-recovery-holds", "return").unwrap();
    let (s, mut p) = recovering_pair("fault-disc");
    send_too_long(&mut p);
    begins.recv_timeout(T).expect("no recovery began");
    // A receive posted during the recovery is kept with the others.
    post_recv(&s, 192, 24576, 121);
    // The failed receive waits for the recovery's end.
    assert_eq!(s.vi.recv_done().err(), Some(Error::NotDone));
    assert_eq!(s.vi.state(), ViState::Connected);
    s.vi.disconnect().unwrap();
    expect_recv(&s, 0, DONE | OP_RECEIVE | LENGTH_ERROR);
    for desc in [64, 128, 192] {
        expect_recv(&s, desc, DONE | OP_RECEIVE | DESC_FLUSHED_ERROR);
    }
    assert_eq!(s.vi.recv_done().err(), Some(Error::NotDone));
    assert_eq!(s.vi.queues_empty(), (true, true));
    assert_eq!(s.vi.state(), ViState::Idle);
    p.exit();
}

#[test]
fn a_qp_that_cannot_come_back_breaks_the_vi_with_every_receive_completed() {
    if verbs_device().is_none() {
        return;
    }
    let _scenario = fail::FailScenario::setup();
    // The first kept receive is posted again, the second is refused: one
    // receive on the QP (flushed when it goes to ERROR again), one kept.
    fail::cfg("verbs-repost", "1*off->return").unwrap();
    let (s, mut p) = recovering_pair("fault-back");
    let errs = ErrorLog::install(&s.nic);
    send_too_long(&mut p);
    expect_recv(&s, 0, DONE | OP_RECEIVE | LENGTH_ERROR);
    assert!(
        errs.wait_for(ErrorCode::ConnLost, T).is_some(),
        "the VI's break was not reported"
    );
    assert_eq!(s.vi.state(), ViState::Error);
    s.vi.disconnect().unwrap();
    for desc in [64, 128] {
        expect_recv(&s, desc, DONE | OP_RECEIVE | DESC_FLUSHED_ERROR);
    }
    assert_eq!(s.vi.recv_done().err(), Some(Error::NotDone));
    assert_eq!(s.vi.state(), ViState::Idle);
    p.exit();
}

/// A send the provider fails by itself at posting (a local length error:
/// 20 bytes named, one segment of 10) breaks a reliable connection, and
/// the VI is in ERROR before the status is written, so that a thread
/// polling the descriptor sees the two together. `verbs-send-status`
/// stops the poster where it writes the status; the state is read there.
/// (errors.rs's two-thread test saw `CONNECTED` with the failed status in
/// 3 of 120 runs on rxe0 when the VI went to ERROR only at the settle.)
#[test]
fn a_send_failed_at_posting_is_written_with_its_vi_in_error() {
    send_failed_at_posting("posterr", Some(20), None, LENGTH_ERROR);
}

/// The same for a send the device refuses to post (`verbs-post-send`: as
/// `ibv_post_send` fails on a full send queue): `TRANSPORT_ERROR`, the VI
/// in ERROR where the status is written, the peer told.
#[test]
fn a_send_the_device_refuses_is_written_with_its_vi_in_error() {
    send_failed_at_posting(
        "postrefused",
        None,
        Some("verbs-post-send"),
        TRANSPORT_ERROR,
    );
}

/// A Reliable Delivery pair whose send of 10 bytes (named `length`, if
/// given) fails with `error` while it is posted (`refuse`: a fail point
/// set to fail once on the way): the sender's VI reads ERROR where the
/// status is written, the status is `error`, the peer breaks.
fn send_failed_at_posting(tag: &str, length: Option<u32>, refuse: Option<&str>, error: u32) {
    if verbs_device().is_none() {
        return;
    }
    let _scenario = fail::FailScenario::setup();
    let nic = open_nic();
    let ptag = nic.create_ptag().unwrap();
    let (a, b) = rd_pair(&nic, ptag, tag);
    let m = via::Region::new(&nic, 4096, ptag, false, false).unwrap();
    let mut d = DescBuilder::send().segment(&m, 1024, 10);
    if let Some(n) = length {
        d = d.length(n);
    }
    let d = d.write(&m, 0).unwrap();
    if let Some(f) = refuse {
        fail::cfg(f, "1*return").unwrap();
    }
    let stop = StopAt::new("verbs-send-status");
    std::thread::scope(|sc| {
        let poster = sc.spawn(|| a.post_send(&m, d));
        stop.reached("the send was never completed");
        let seen = a.state();
        stop.release();
        poster.join().unwrap().unwrap();
        assert_eq!(seen, ViState::Error, "the status was written first");
    });
    drop(stop);
    let c = a.send_wait(WAIT).unwrap();
    assert_eq!(c.status, DONE | OP_SEND | error, "{:#x}", c.status);
    // The break itself follows: the peer hears of it.
    assert!(
        wait_until(T, || b.state() == ViState::Error),
        "the peer's VI did not break"
    );
    nic.close().unwrap();
}

/// Holds the thread that reaches fail point `name` there (once
/// [`StopAt::reached`] saw it) until [`StopAt::release`]; the fail point
/// is removed when this drops.
struct StopAt {
    name: &'static str,
    reached: std::sync::mpsc::Receiver<()>,
    go: std::sync::mpsc::Sender<()>,
}

impl StopAt {
    fn new(name: &'static str) -> StopAt {
        let (reached_tx, reached) = std::sync::mpsc::channel();
        let (go, go_rx) = std::sync::mpsc::channel::<()>();
        let chans = std::sync::Mutex::new((reached_tx, go_rx));
        fail::cfg_callback(name, move || {
            let g = chans.lock().unwrap();
            let _ = g.0.send(());
            let _ = g.1.recv_timeout(T);
        })
        .unwrap();
        StopAt { name, reached, go }
    }

    /// Waits until a thread stopped at the fail point (`what` if none).
    fn reached(&self, what: &str) {
        self.reached.recv_timeout(T).expect(what);
    }

    fn release(&self) {
        self.go.send(()).unwrap();
    }
}

impl Drop for StopAt {
    fn drop(&mut self) {
        fail::remove(self.name);
    }
}

/// The same for a receive of a shared receive queue that fails (a message
/// longer than it, on Reliable Delivery): the VI it was for is in ERROR
/// before the status is written (`verbs-srq-status` stops the completer
/// there).
#[test]
fn a_failed_srq_receive_is_written_with_its_vi_in_error() {
    if verbs_device().is_none() {
        return;
    }
    let _scenario = fail::FailScenario::setup();
    let nic = open_nic();
    let ptag = nic.create_ptag().unwrap();
    let mem = via::Region::new(&nic, 65536, ptag, false, false).unwrap();
    let srq = nic.create_srq(ptag, 16).unwrap();
    let (a, b) = rd_srq_pair(&nic, ptag, &srq, &disc_str("srq-err"));
    let stop = StopAt::new("verbs-srq-status");
    let r = DescBuilder::recv()
        .segment(&mem, 8192, 60)
        .write(&mem, 0)
        .unwrap();
    srq.post_recv(&mem, r).unwrap();
    let d = DescBuilder::send()
        .segment(&mem, 4096, 100)
        .write(&mem, 64)
        .unwrap();
    a.post_send(&mem, d).unwrap();
    // The progress thread completes it (this thread does not poll).
    stop.reached("the receive was never completed");
    let seen = b.state();
    stop.release();
    assert_eq!(seen, ViState::Error, "the status was written first");
    drop(stop);
    let mut got = None;
    assert!(wait_until(T, || {
        got = srq.done().ok();
        got.is_some()
    }));
    let got = got.unwrap();
    assert_eq!(
        (got.vi, got.status),
        (b.slot(), DONE | OP_RECEIVE | LENGTH_ERROR),
        "{:#x}",
        got.status
    );
    disconnect_all_and_close(nic, &[&a, &b]);
}

#[test]
fn a_deregistration_waits_for_the_completer_writing_into_the_region() {
    if verbs_device().is_none() {
        return;
    }
    let _scenario = fail::FailScenario::setup();
    let nic = open_nic();
    let ptag = nic.create_ptag().unwrap();
    let (a, b) = rd_pair(&nic, ptag, "drain");
    let dst = via::Region::new(&nic, 4096, ptag, false, false).unwrap();
    let r = DescBuilder::recv()
        .segment(&dst, 1024, 64)
        .write(&dst, 0)
        .unwrap();
    b.post_recv(&dst, r).unwrap();
    // Part of a page: the library reads and writes it in place.
    let mem = via::Memory::new(4096).unwrap();
    let m = via::Region::within(&nic, &mem, 64, 2048, ptag, false, false).unwrap();
    let d = DescBuilder::send()
        .segment(&m, 1024, 8)
        .write(&m, 0)
        .unwrap();
    // The completer stops after looking the region up, before writing,
    // and waits there for the deregistration below to return. It must
    // not: while a completer holds the region, the deregistration
    // waits. After 2 s without it, the completer goes on.
    let (reached_tx, reached) = std::sync::mpsc::channel();
    let (returned_tx, returned) = std::sync::mpsc::channel::<()>();
    let early = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop = std::sync::Mutex::new((reached_tx, returned, early.clone()));
    fail::cfg_callback("verbs-send-status", move || {
        let g = stop.lock().unwrap();
        let _ = g.0.send(());
        if g.1.recv_timeout(Duration::from_secs(2)).is_ok() {
            g.2.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    })
    .unwrap();
    a.post_send(&m, d).unwrap();
    reached.recv_timeout(T).expect("no send completion");
    // The program deregisters and unmaps the memory meanwhile.
    let freer = std::thread::spawn(move || {
        m.deregister().unwrap();
        let _ = returned_tx.send(());
        drop(mem);
    });
    freer.join().unwrap();
    assert!(
        !early.load(std::sync::atomic::Ordering::SeqCst),
        "VipDeregisterMem returned while a completion was writing into the region"
    );
    fail::remove("verbs-send-status");
    // Written before the deregistration returned, and kept (in a copy
    // of the control segment) for the program to dequeue.
    let c = a.send_wait(WAIT).unwrap();
    assert_eq!(c.status, DONE | OP_SEND, "{:#x}", c.status);
    assert_eq!(b.recv_wait(WAIT).unwrap().status, DONE | OP_RECEIVE);
    a.disconnect().unwrap();
    let _ = b.disconnect();
    nic.close().unwrap();
}

#[test]
fn a_connection_whose_qp_cannot_come_up_leaves_the_vi_idle_with_its_receives() {
    if verbs_device().is_none() {
        return;
    }
    let _scenario = fail::FailScenario::setup();
    let s = Setup::with(
        open_nic(),
        Reliability::ReliableDelivery,
        1 << 18,
        false,
        false,
        65536,
    );
    let mut p = Peer::serve(PEER);
    p.cmd_expect("open rd 262144 0 0", "MEM");
    // Posted before the connection: it must survive the failed attempt.
    post_recv(&s, 0, 8192, 64);
    fail::cfg("verbs-connect-rts", "return").unwrap();
    p.say("listen fault-conn accept");
    p.expect("LISTENING");
    let local = s.nic.address(b"client");
    let remote = s.nic.address(b"fault-conn");
    assert_eq!(
        s.vi.connect(&local, &remote, WAIT).err(),
        Some(Error::Resource)
    );
    assert_eq!(s.vi.state(), ViState::Idle);
    assert_eq!(p.expect("ACCEPT"), "ok");
    // The peer, which accepted, hears that the connection is lost.
    assert!(
        p.cmd("wait_error ConnLost").starts_with("ERROR ConnLost"),
        "the peer was not told"
    );
    assert_eq!(p.cmd_expect("state", "STATE"), "Error");
    assert_eq!(p.cmd("disconnect"), "OK");
    assert_eq!(s.vi.recv_done().err(), Some(Error::NotDone));
    fail::remove("verbs-connect-rts");
    // The next attempt connects, and the receive posted before the failed
    // one takes the peer's first message.
    s.connect_to(&mut p, &disc_str("fault-conn2"));
    assert_eq!(p.cmd("fill 0 4096 64 7"), "OK");
    assert_eq!(p.cmd("send 0 4096:64"), "OK");
    expect_recv(&s, 0, DONE | OP_RECEIVE);
    assert_eq!(s.bytes(8192, 64), pattern(64, 7));
    p.exit();
}

/// Sends `len` bytes at `off` of `src` (its descriptor at `desc` there)
/// over the pair `(a, b)` into a region of `ptag` of `b`'s, both completing
/// successfully; the bytes that arrived.
fn send_through(
    nic: &via::Nic,
    ptag: via::Ptag,
    (a, b): (&via::Vi, &via::Vi),
    src: &via::Region,
    off: usize,
    len: usize,
    desc: usize,
) -> Vec<u8> {
    let dst = via::Region::new(nic, 4096 + len, ptag, false, false).unwrap();
    let r = DescBuilder::recv()
        .segment(&dst, 4096, len as u32)
        .write(&dst, 0)
        .unwrap();
    b.post_recv(&dst, r).unwrap();
    let d = DescBuilder::send()
        .segment(src, off, len as u32)
        .write(src, desc)
        .unwrap();
    a.post_send(src, d).unwrap();
    assert_eq!(a.send_wait(WAIT).unwrap().status, DONE | OP_SEND);
    assert_eq!(b.recv_wait(WAIT).unwrap().status, DONE | OP_RECEIVE);
    let mut got = vec![0u8; len];
    dst.read(4096, &mut got).unwrap();
    got
}

/// Two VIs of this process connected to each other (Reliable Delivery,
/// MaxTransferSize 64 KiB).
/// The progress thread of the NICs of this process, stopped at the top of
/// its loop (fail point `verbs-progress`) until this is dropped.
struct ProgressStopped(std::sync::Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>);

impl ProgressStopped {
    /// Stops the thread at its next round; returns once it is there.
    fn now() -> ProgressStopped {
        let stopped = std::sync::Arc::new((std::sync::Mutex::new(true), std::sync::Condvar::new()));
        let (reached_tx, reached) = std::sync::mpsc::channel();
        let hold = stopped.clone();
        let reached_tx = std::sync::Mutex::new(reached_tx);
        fail::cfg_callback("verbs-progress", move || {
            let _ = reached_tx.lock().unwrap().send(());
            let (flag, cv) = &*hold;
            let mut g = flag.lock().unwrap();
            while *g {
                g = cv.wait(g).unwrap();
            }
        })
        .unwrap();
        reached
            .recv_timeout(T)
            .expect("the progress thread did not stop");
        ProgressStopped(stopped)
    }
}

impl Drop for ProgressStopped {
    fn drop(&mut self) {
        fail::remove("verbs-progress");
        *self.0.0.lock().unwrap() = false;
        self.0.1.notify_all();
    }
}

/// A thread that polls one VI takes the completions of the other device
/// CQs too, one in turn per poll, not those of its VI's CQs only: with one
/// CQ per VI (`verbs-cq-entries`) and the progress thread stopped, polling
/// a VI that gets nothing completes another pair's send and receive
/// (their statuses read in memory, never polled for).
#[test]
fn a_vi_poller_takes_the_other_cqs_in_turn() {
    if verbs_device().is_none() {
        return;
    }
    let _scenario = fail::FailScenario::setup();
    fail::cfg("verbs-cq-entries", "return(2048)").unwrap();
    let nic = open_nic();
    let ptag = nic.create_ptag().unwrap();
    let mem = via::Region::new(&nic, 65536, ptag, false, false).unwrap();
    let (a, b) = rd_pair(&nic, ptag, &disc_str("turn-a"));
    let (_c, _d) = rd_pair(&nic, ptag, &disc_str("turn-c"));
    let (e, f) = rd_pair(&nic, ptag, &disc_str("turn-e"));
    let stopped = ProgressStopped::now();
    one_message(&mem, 0, 3, |d| f.post_recv(&mem, d).unwrap(), &e);
    let mut polls = 0u32;
    let both = wait_until(T, || {
        assert_eq!(a.recv_done().err(), Some(Error::NotDone));
        polls += 1;
        mem.status(0) & DONE != 0 && mem.status(64) & DONE != 0
    });
    assert!(
        both,
        "{polls} polls of another VI did not take the pair's completions (send {:#x}, receive {:#x})",
        mem.status(64),
        mem.status(0)
    );
    assert_eq!(mem.status(64), DONE | OP_SEND);
    assert_eq!(mem.status(0), DONE | OP_RECEIVE);
    assert_eq!(bytes_of(&mem, 8192, 64), pattern(64, 3));
    drop(stopped);
    disconnect_all_and_close(nic, &[&a, &b, &e, &f]);
}

/// A program that polls a CQ or a shared receive queue takes its
/// completions itself, as one polling a VI does: with the progress thread
/// stopped (at the top of its loop), a receive reported through a CQ, and
/// one of a shared receive queue, complete for `VipCQDone` and
/// `VipSrqDone`. Until stop 35 neither poll progressed the device: a CQ
/// poller waited for the progress thread to wake (an 8-byte round trip
/// through a CQ took 145 us against 22 us polling the VI, `via-bench cq`
/// on rxe0 in the VM), and with the thread stopped this test failed.
#[test]
fn cq_and_srq_pollers_take_their_completions_while_the_progress_thread_is_stopped() {
    if verbs_device().is_none() {
        return;
    }
    let _scenario = fail::FailScenario::setup();
    let nic = open_nic();
    let ptag = nic.create_ptag().unwrap();
    let mem = via::Region::new(&nic, 65536, ptag, false, false).unwrap();
    let cq = nic.create_cq(16).unwrap();
    let mut at = via::ViAttributes::new(Reliability::ReliableDelivery, ptag);
    at.max_transfer_size = 65536;
    let a = nic.create_vi(&at, None, None).unwrap();
    let b = nic.create_vi(&at, None, Some(&cq)).unwrap();
    connect_pair(&nic, (&a, &b), &disc_str("cq-stopped"));
    let srq = nic.create_srq(ptag, 16).unwrap();
    let (c, d) = rd_srq_pair(&nic, ptag, &srq, &disc_str("srq-stopped"));
    let stopped = ProgressStopped::now();
    // Through the CQ.
    one_message(&mem, 0, 1, |d| b.post_recv(&mem, d).unwrap(), &a);
    let mut got = None;
    let polled = wait_until(T, || {
        got = cq.done().ok();
        got.is_some()
    });
    assert!(
        polled,
        "VipCQDone found nothing while the progress thread was stopped"
    );
    assert_eq!(got, Some((b.slot(), true)));
    assert_eq!(b.recv_done().unwrap().status, DONE | OP_RECEIVE);
    assert_eq!(bytes_of(&mem, 8192, 64), pattern(64, 1));
    // Through the shared receive queue.
    one_message(&mem, 16384, 2, |d| srq.post_recv(&mem, d).unwrap(), &c);
    let mut got = None;
    let polled = wait_until(T, || {
        got = srq.done().ok();
        got.is_some()
    });
    assert!(
        polled,
        "VipSrqDone found nothing while the progress thread was stopped"
    );
    let got = got.unwrap();
    assert_eq!((got.vi, got.status), (d.slot(), DONE | OP_RECEIVE));
    assert_eq!(bytes_of(&mem, 16384 + 8192, 64), pattern(64, 2));
    drop(stopped);
    disconnect_all_and_close(nic, &[&a, &b, &c, &d]);
}

/// One 64-byte message through `mem` from `base`: a receive (descriptor
/// at `base`, buffer at `base + 8192`) posted by `post_recv` (given the
/// descriptor's offset), then the send on `s` of `pattern(64, seed)`
/// (descriptor at `base + 64`, data at `base + 4096`).
fn one_message(
    mem: &via::Region,
    base: usize,
    seed: u32,
    post_recv: impl FnOnce(usize),
    s: &via::Vi,
) {
    let r = DescBuilder::recv()
        .segment(mem, base + 8192, 64)
        .write(mem, base)
        .unwrap();
    post_recv(r);
    mem.write(base + 4096, &pattern(64, seed)).unwrap();
    let d = DescBuilder::send()
        .segment(mem, base + 4096, 64)
        .write(mem, base + 64)
        .unwrap();
    s.post_send(mem, d).unwrap();
}

/// `len` bytes of `mem` at `off`.
fn bytes_of(mem: &via::Region, off: usize, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    mem.read(off, &mut b).unwrap();
    b
}

fn rd_pair(nic: &via::Nic, ptag: via::Ptag, tag: &str) -> (via::Vi, via::Vi) {
    rd_pair_attached(nic, ptag, tag, |_| {})
}

/// [`rd_pair`] whose receiver takes its receives from `srq`.
fn rd_srq_pair(nic: &via::Nic, ptag: via::Ptag, srq: &via::Srq, tag: &str) -> (via::Vi, via::Vi) {
    rd_pair_attached(nic, ptag, tag, |r| r.set_srq(Some(srq)).unwrap())
}

fn rd_pair_attached(
    nic: &via::Nic,
    ptag: via::Ptag,
    tag: &str,
    attach: impl FnOnce(&via::Vi),
) -> (via::Vi, via::Vi) {
    let mut at = via::ViAttributes::new(Reliability::ReliableDelivery, ptag);
    at.max_transfer_size = 65536;
    local_pair(nic, &at, tag, attach)
}

/// The end of a test: its VIs disconnected (whatever state they are in),
/// then the NIC closed.
fn disconnect_all_and_close(nic: via::Nic, vis: &[&via::Vi]) {
    for v in vis {
        let _ = v.disconnect();
    }
    nic.close().unwrap();
}

#[test]
fn a_registration_the_device_refuses_leaves_the_memory_as_it_was() {
    if verbs_device().is_none() {
        return;
    }
    let _scenario = fail::FailScenario::setup();
    let nic = open_nic();
    let ptag = nic.create_ptag().unwrap();
    const N: usize = 65536;
    let mem = via::Memory::new(N + 4096).unwrap();
    let data = pattern(N, 3);
    mem.write(0, &data).unwrap();
    fail::cfg("verbs-reg-mr", "return").unwrap();
    for _ in 0..100 {
        let r = via::Region::within(&nic, &mem, 0, N + 4096, ptag, false, false);
        assert_eq!(r.err(), Some(Error::Resource));
    }
    fail::remove("verbs-reg-mr");
    // The memory holds what it held, and is still the program's to write.
    let mut back = vec![0u8; N];
    mem.read(0, &mut back).unwrap();
    assert!(back == data, "the refused registrations changed the memory");
    mem.write(N, b"still mine").unwrap();
    // Registered now, its bytes travel.
    let m = via::Region::within(&nic, &mem, 0, N + 4096, ptag, false, false).unwrap();
    let (a, b) = rd_pair(&nic, ptag, "regfail");
    let got = send_through(&nic, ptag, (&a, &b), &m, 0, N, N + 64);
    assert!(got == data, "the registered memory sent other bytes");
    a.disconnect().unwrap();
    let _ = b.disconnect();
    nic.close().unwrap();
}

#[test]
fn a_vi_the_device_cannot_create_leaves_nothing_behind() {
    if verbs_device().is_none() {
        return;
    }
    let _scenario = fail::FailScenario::setup();
    let nic = open_nic();
    let ptag = nic.create_ptag().unwrap();
    let at = via::ViAttributes::new(Reliability::ReliableDelivery, ptag);
    fail::cfg("verbs-create-qp", "return").unwrap();
    // More refusals than the NIC has VIs: a slot kept by each would leave
    // none for the VIs below.
    let refusals = nic.attributes().max_vi as usize + 16;
    for i in 0..refusals {
        let r = nic.create_vi(&at, None, None);
        assert_eq!(r.err(), Some(Error::Resource), "attempt {i}");
    }
    fail::remove("verbs-create-qp");
    let ptag2 = nic.create_ptag().unwrap();
    let (a, b) = rd_pair(&nic, ptag2, "qpfail");
    let mem = via::Region::new(&nic, 8192, ptag2, false, false).unwrap();
    mem.write(4096, b"after the refusals").unwrap();
    let got = send_through(&nic, ptag2, (&a, &b), &mem, 4096, 18, 64);
    assert_eq!(got, b"after the refusals");
    a.disconnect().unwrap();
    let _ = b.disconnect();
    // The refused VIs left their protection tag no user.
    nic.destroy_ptag(ptag).unwrap();
    nic.close().unwrap();
}

/// Counter `name` of port 1 of `dev` (rxe counts every packet of the VM's
/// QPs: here, only this test's).
fn counter(dev: &str, name: &str) -> u64 {
    let p = format!("/sys/class/infiniband/{dev}/ports/1/hw_counters/{name}");
    let s = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{p}: {e}"));
    s.trim().parse().unwrap()
}

/// Full queues on `pairs` pairs of VIs of `nic`: every receive queue of
/// the second VIs, then every send queue of the first, 8-byte messages
/// (pair `k`, message `i`: the bytes of `k * 65536 + i`), posted with
/// the completer kept from the device's CQs (`verbs-drain`). Returns the
/// pairs, their regions, and how many messages there are.
#[allow(clippy::type_complexity)]
fn full_queues(
    nic: &via::Nic,
    ptag: via::Ptag,
    pairs: usize,
    tag: &str,
) -> (
    Vec<(via::Vi, via::Vi)>,
    Vec<(via::Region, via::Region)>,
    usize,
) {
    let depth = nic.attributes().max_descriptors_per_queue as usize;
    let data = depth * 64;
    let vis: Vec<_> = (0..pairs)
        .map(|k| rd_pair(nic, ptag, &format!("{tag}{k}")))
        .collect();
    let mems: Vec<_> = (0..pairs)
        .map(|_| {
            let r = || via::Region::new(nic, data + depth * 8, ptag, false, false).unwrap();
            (r(), r())
        })
        .collect();
    for (k, ((a, b), (sm, rm))) in vis.iter().zip(&mems).enumerate() {
        for i in 0..depth {
            let d = DescBuilder::recv()
                .segment(rm, data + i * 8, 8)
                .write(rm, i * 64)
                .unwrap();
            b.post_recv(rm, d).unwrap();
        }
        for i in 0..depth {
            sm.write(data + i * 8, &((k * 65536 + i) as u64).to_le_bytes())
                .unwrap();
            let d = DescBuilder::send()
                .segment(sm, data + i * 8, 8)
                .write(sm, i * 64)
                .unwrap();
            a.post_send(sm, d).unwrap();
        }
    }
    (vis, mems, pairs * depth)
}

#[test]
fn full_queues_of_many_vis_lose_no_completion_while_the_completer_is_held() {
    let Some(dev) = verbs_device() else { return };
    let _scenario = fail::FailScenario::setup();
    // CQs of 2,048 entries asked (rxe makes 4,095): one VI's two queues
    // each, so the 10 VIs below are spread over 10 CQs.
    fail::cfg("verbs-cq-entries", "return(2048)").unwrap();
    let nic = open_nic();
    let errors = ErrorLog::install(&nic);
    let ptag = nic.create_ptag().unwrap();
    let (sent, rcvd) = (counter(&dev, "sent_pkts"), counter(&dev, "rcvd_pkts"));
    // No completion taken from the device until every one is there.
    fail::cfg("verbs-drain", "return").unwrap();
    let (vis, mems, n) = full_queues(&nic, ptag, 5, "full");
    // Each message and its acknowledgement sent, and received: rxe sends
    // the acknowledgement after the receive's completion is in its CQ, so
    // every receive completion (5,120, more than one CQ holds) is there,
    // and the send completions follow the acknowledgements.
    let n2 = 2 * n as u64;
    assert!(
        wait_until(T, || counter(&dev, "sent_pkts") >= sent + n2
            && counter(&dev, "rcvd_pkts") >= rcvd + n2),
        "rxe did not deliver and acknowledge the {n} messages (sent {}, received {} packets of {n2})",
        counter(&dev, "sent_pkts") - sent,
        counter(&dev, "rcvd_pkts") - rcvd
    );
    fail::remove("verbs-drain");
    // Every completion arrives, in order, with its bytes.
    let depth = n / vis.len();
    for (k, ((a, b), (sm, rm))) in vis.iter().zip(&mems).enumerate() {
        for i in 0..depth {
            let c = a.send_wait(WAIT).unwrap();
            assert_eq!(
                (c.desc, c.status),
                (sm.addr(i * 64).unwrap(), DONE | OP_SEND)
            );
            let c = b.recv_wait(WAIT).unwrap();
            assert_eq!(
                (c.desc, c.status),
                (rm.addr(i * 64).unwrap(), DONE | OP_RECEIVE)
            );
            let mut got = [0u8; 8];
            rm.read(depth * 64 + i * 8, &mut got).unwrap();
            assert_eq!(
                u64::from_le_bytes(got),
                (k * 65536 + i) as u64,
                "pair {k} message {i}"
            );
        }
    }
    let seen = errors.all();
    assert!(seen.is_empty(), "asynchronous errors: {seen:?}");
    for (a, b) in &vis {
        a.disconnect().unwrap();
        let _ = b.disconnect();
    }
    drop(mems);
    nic.close().unwrap();
}

#[test]
fn a_device_cq_that_overruns_is_the_nics_catastrophic_error_and_no_descriptor_hangs() {
    if verbs_device().is_none() {
        return;
    }
    let _scenario = fail::FailScenario::setup();
    // As one device CQ for every VI was: every QP on the first CQ (4,095
    // entries here), reserving nothing.
    fail::cfg("verbs-cq-entries", "return(2048)").unwrap();
    fail::cfg("verbs-cq-overcommit", "return").unwrap();
    let nic = open_nic();
    let errors = ErrorLog::install(&nic);
    let ptag = nic.create_ptag().unwrap();
    fail::cfg("verbs-drain", "return").unwrap();
    // 3,072 receives and as many sends: more completions than the CQ holds.
    let (vis, mems, n) = full_queues(&nic, ptag, 3, "overrun");
    // rxe reports the overrun (IBV_EVENT_CQ_ERR), read by the progress
    // thread: the NIC's catastrophic error.
    let catastrophic = expect_error(&errors, ErrorCode::Catastrophic);
    assert_eq!(catastrophic.resource, via::ResourceCode::Nic);
    // The VIs it breaks read ERROR by the time it is reported (the rest
    // of their breaks is settled later).
    for (a, b) in &vis {
        assert_eq!((a.state(), b.state()), (ViState::Error, ViState::Error));
    }
    fail::remove("verbs-drain");
    // Every VI on the CQ breaks; every descriptor completes (the lost
    // completions' descriptors flushed), none is left waiting.
    let long = Some(Duration::from_secs(120));
    let mut failed = 0;
    for (a, b) in &vis {
        for _ in 0..n / vis.len() {
            for c in [a.send_wait(long).unwrap(), b.recv_wait(long).unwrap()] {
                assert_ne!(c.status & DONE, 0);
                failed += (c.status & ERROR_MASK != 0) as usize;
            }
        }
        assert_eq!(a.state(), ViState::Error);
    }
    assert!(failed > 0, "an overrun CQ lost no completion");
    drop(mems);
    nic.close().unwrap();
}

#[test]
fn a_disconnect_whose_flushes_never_come_still_completes_every_descriptor() {
    if verbs_device().is_none() {
        return;
    }
    let _scenario = fail::FailScenario::setup();
    let nic = open_nic();
    let ptag = nic.create_ptag().unwrap();
    let (a, b) = rd_pair(&nic, ptag, "noflush");
    let (am, bm) = (
        via::Region::new(&nic, 8192, ptag, false, false).unwrap(),
        via::Region::new(&nic, 8192, ptag, false, false).unwrap(),
    );
    let r = DescBuilder::recv()
        .segment(&am, 4096, 64)
        .write(&am, 0)
        .unwrap();
    a.post_recv(&am, r).unwrap();
    // The device's completions stay in its CQ, as completions it lost
    // would never come: B's send (which arrives), and the flushes of B's
    // receives at the disconnect.
    fail::cfg("verbs-drain", "return").unwrap();
    bm.write(4096, b"sent before the disconnect").unwrap();
    let s = DescBuilder::send()
        .segment(&bm, 4096, 26)
        .write(&bm, 0)
        .unwrap();
    b.post_send(&bm, s).unwrap();
    for i in 1..4 {
        let r = DescBuilder::recv()
            .segment(&bm, 4096 + i * 64, 64)
            .write(&bm, i * 64)
            .unwrap();
        b.post_recv(&bm, r).unwrap();
    }
    // The message is in A's memory before B disconnects: the device ran
    // the send (with the central send queue, posting is the poster
    // thread's, after `post_send` returned; a disconnect before it would
    // flush the send instead, and A's receive with it).
    assert!(
        wait_until(T, || {
            let mut got = [0u8; 26];
            am.read(4096, &mut got).unwrap();
            &got == b"sent before the disconnect"
        }),
        "the message never reached A's memory"
    );
    // The disconnect gives the flushes 5 s, then completes what is left:
    // every descriptor of B is done when it returns.
    b.disconnect().unwrap();
    let c = b.send_done().expect("the send completed by the disconnect");
    assert_eq!(
        (c.desc, c.status),
        (bm.addr(0).unwrap(), DONE | OP_SEND | DESC_FLUSHED_ERROR)
    );
    for i in 1..4 {
        let c = b
            .recv_done()
            .expect("a receive completed by the disconnect");
        assert_eq!(
            (c.desc, c.status),
            (
                bm.addr(i * 64).unwrap(),
                DONE | OP_RECEIVE | DESC_FLUSHED_ERROR
            )
        );
    }
    // B connects again, to a new VI, before the completions the device
    // kept come out: they are stale, for nobody on B's side (its failed
    // receives must not break the new connection); A's receive took the
    // message.
    let c = nic
        .create_vi(
            &via::ViAttributes::new(Reliability::ReliableDelivery, ptag),
            None,
            None,
        )
        .unwrap();
    connect_pair(&nic, (&b, &c), "noflush-again");
    fail::remove("verbs-drain");
    let d = a.recv_wait(WAIT).unwrap();
    assert_eq!((d.desc, d.status), (am.addr(0).unwrap(), DONE | OP_RECEIVE));
    let mut got = [0u8; 26];
    am.read(4096, &mut got).unwrap();
    assert_eq!(&got, b"sent before the disconnect");
    assert!(b.send_done().is_err() && b.recv_done().is_err());
    // The new connection carries data both ways.
    bm.write(4096, b"on the new connection").unwrap();
    let got = send_through(&nic, ptag, (&b, &c), &bm, 4096, 21, 512);
    assert_eq!(got, b"on the new connection");
    let cm = via::Region::new(&nic, 8192, ptag, false, false).unwrap();
    cm.write(4096, b"and back").unwrap();
    assert_eq!(
        send_through(&nic, ptag, (&c, &b), &cm, 4096, 8, 0),
        b"and back"
    );
    assert_eq!(b.state(), ViState::Connected);
    let _ = a.disconnect();
    b.disconnect().unwrap();
    let _ = c.disconnect();
    nic.close().unwrap();
}

/// The network device under `dev` (rxe's port 1), set down; up again when
/// dropped.
struct LinkDown(String);

impl LinkDown {
    fn new(dev: &str) -> LinkDown {
        let p = format!("/sys/class/infiniband/{dev}/ports/1/gid_attrs/ndevs/0");
        let ndev = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{p}: {e}"));
        let ndev = ndev.trim().to_string();
        ip_link(&ndev, "down");
        LinkDown(ndev)
    }
}

impl Drop for LinkDown {
    fn drop(&mut self) {
        ip_link(&self.0, "up");
    }
}

fn ip_link(ndev: &str, state: &str) {
    let st = std::process::Command::new("ip")
        .args(["link", "set", "dev", ndev, state])
        .status()
        .expect("ip (iproute2) runs");
    assert!(st.success(), "ip link set dev {ndev} {state}: {st}");
}

/// The device's link goes down under a connection (`ip link set dev
/// dummy0 down` in the VM: rxe reports the port down, which the progress
/// thread logs): the send fails once rxe's retries run out, both VIs
/// break, every descriptor completes; once the link is back, new
/// connections carry data.
/// The state of port 1 of `dev` (`4: ACTIVE`, `1: DOWN`).
fn port_state(dev: &str) -> String {
    let p = format!("/sys/class/infiniband/{dev}/ports/1/state");
    std::fs::read_to_string(&p)
        .unwrap_or_default()
        .trim()
        .to_string()
}

#[test]
fn a_link_that_goes_down_breaks_the_connection_and_the_nic_works_once_it_is_back() {
    let Some(dev) = verbs_device() else { return };
    // Alone: the link is every test's.
    let _scenario = fail::FailScenario::setup();
    let nic = open_nic();
    let ptag = nic.create_ptag().unwrap();
    let (a, b) = rd_pair(&nic, ptag, "linkdown");
    let mem = via::Region::new(&nic, 8192, ptag, false, false).unwrap();
    mem.write(4096, b"before").unwrap();
    assert_eq!(
        send_through(&nic, ptag, (&a, &b), &mem, 4096, 6, 64),
        b"before"
    );
    {
        let _down = LinkDown::new(&dev);
        assert!(
            wait_until(T, || port_state(&dev).ends_with("DOWN")),
            "port 1 of {dev} did not go down"
        );
        let dst = via::Region::new(&nic, 8192, ptag, false, false).unwrap();
        let r = DescBuilder::recv()
            .segment(&dst, 4096, 64)
            .write(&dst, 0)
            .unwrap();
        b.post_recv(&dst, r).unwrap();
        let d = DescBuilder::send()
            .segment(&mem, 4096, 6)
            .write(&mem, 128)
            .unwrap();
        // The break is settled after the failed send's status is written
        // (`settle`, no lock held): held there until the test looked, the
        // VI must be in ERROR all the same.
        let (release, held) = std::sync::mpsc::channel::<()>();
        let held = std::sync::Mutex::new(held);
        fail::cfg_callback("verbs-settle-breaks", move || {
            let _ = held.lock().unwrap().recv_timeout(T);
        })
        .unwrap();
        a.post_send(&mem, d).unwrap();
        // rxe retries, then gives up: the send fails, the VI breaks, and
        // the peer, told through viad, flushes its receive.
        let long = Some(Duration::from_secs(120));
        let c = a.send_wait(long).unwrap();
        assert_eq!(
            (c.desc, c.status),
            (mem.addr(128).unwrap(), DONE | OP_SEND | TRANSPORT_ERROR)
        );
        assert_eq!(a.state(), ViState::Error);
        fail::remove("verbs-settle-breaks");
        drop(release);
        let c = b.recv_wait(long).unwrap();
        assert_eq!(
            (c.desc, c.status),
            (dst.addr(0).unwrap(), DONE | OP_RECEIVE | DESC_FLUSHED_ERROR)
        );
        assert_eq!(b.state(), ViState::Error);
    }
    assert!(
        wait_until(T, || port_state(&dev).ends_with("ACTIVE")),
        "port 1 of {dev} did not come back"
    );
    let ptag2 = nic.create_ptag().unwrap();
    let (c, d) = rd_pair(&nic, ptag2, "linkup");
    let m2 = via::Region::new(&nic, 8192, ptag2, false, false).unwrap();
    m2.write(4096, b"after").unwrap();
    assert_eq!(
        send_through(&nic, ptag2, (&c, &d), &m2, 4096, 5, 64),
        b"after"
    );
    nic.close().unwrap();
}

/// Writes the pieces of `data` into the segments `segs` (region, offset,
/// length) and adds them to `b`.
fn pieces(mut b: DescBuilder, segs: &[(&via::Region, usize, usize)], data: &[u8]) -> DescBuilder {
    let mut at = 0;
    for &(m, off, len) in segs {
        m.write(off, &data[at..at + len]).unwrap();
        b = b.segment(m, off, len as u32);
        at += len;
    }
    b
}

#[test]
fn segments_of_several_regions_move_whether_lkeys_are_the_handles_or_looked_up() {
    // rxe gives an MR one key, so posts hand the validated segments to the
    // device as they are (their memory handles as lkeys); a device whose
    // MRs have two keys takes the lookup path (`verbs-keys-differ`, read
    // when the NIC opens). Both gather from and scatter into the
    // descriptor's region and another one, twice: the second time
    // translation finds the other region remembered (its first address
    // handed on with the request: no lookup on either path).
    if verbs_device().is_none() {
        return;
    }
    let _scenario = fail::FailScenario::setup();
    for lookup in [false, true] {
        if lookup {
            fail::cfg("verbs-keys-differ", "return").unwrap();
        }
        let nic = open_nic();
        fail::remove("verbs-keys-differ");
        let ptag = nic.create_ptag().unwrap();
        let region = || via::Region::new(&nic, 65536, ptag, false, false).unwrap();
        let (a_mem, a_extra, b_mem, b_extra) = (region(), region(), region(), region());
        let (a, b) = rd_pair(&nic, ptag, if lookup { "keys-l" } else { "keys-h" });
        let sends = [
            (&a_extra, 10, 2000),
            (&a_mem, 4096, 1500),
            (&a_extra, 30000, 500),
        ];
        let recvs = [
            (&b_mem, 4096, 1000),
            (&b_extra, 100, 2500),
            (&b_mem, 20000, 1000),
        ];
        let n = 4000;
        for round in 0..2u32 {
            let data = pattern(n, if lookup { 21 } else { 22 } + round);
            let r = pieces(DescBuilder::recv(), &recvs, &[0; 4500]);
            b.post_recv(&b_mem, r.write(&b_mem, 0).unwrap()).unwrap();
            let s = pieces(DescBuilder::send(), &sends, &data);
            a.post_send(&a_mem, s.write(&a_mem, 0).unwrap()).unwrap();
            assert_eq!(a.send_wait(WAIT).unwrap().status, DONE | OP_SEND);
            assert_eq!(b.recv_wait(WAIT).unwrap().status, DONE | OP_RECEIVE);
            assert_eq!(b_mem.word(24) as usize, n, "the received length");
            let mut got = Vec::new();
            for &(m, off, len) in &recvs {
                let mut piece = vec![0u8; len];
                m.read(off, &mut piece).unwrap();
                got.extend(piece);
            }
            assert!(
                got[..n] == data,
                "the scattered bytes differ (lookup: {lookup}, round {round})"
            );
        }
        a.disconnect().unwrap();
        let _ = b.disconnect();
        nic.close().unwrap();
    }
}

/// The first error with `code` the NIC reported (waiting up to a minute:
/// rxe takes a while to fill a CQ under emulation).
fn expect_error(errors: &ErrorLog, code: ErrorCode) -> via::AsyncError {
    match errors.wait_for(code, Duration::from_secs(60)) {
        Some((e, _, _)) => e,
        None => panic!("no {code:?} reported: {:?}", errors.all()),
    }
}

/// The NIC reported `vi`'s connection lost.
fn expect_break(errors: &ErrorLog, vi: &via::Vi) {
    let e = expect_error(errors, ErrorCode::ConnLost);
    assert_eq!(
        (e.resource, e.vi.map(|v| v.0)),
        (via::ResourceCode::Vi, Some(vi.slot()))
    );
}

/// `vi` goes to ERROR.
fn in_error(vi: &via::Vi) {
    assert!(
        wait_until(T, || vi.state() == ViState::Error),
        "{:?}",
        vi.state()
    );
}

/// Posts a receive of 64 bytes at `off` (descriptor at `off`, buffer
/// behind it) on `vi`.
fn post_recv_at(vi: &via::Vi, mem: &via::Region, off: usize) {
    let d = DescBuilder::recv()
        .segment(mem, off + 64, 64)
        .write(mem, off)
        .unwrap();
    vi.post_recv(mem, d).unwrap();
}

/// The receive at `off` of `vi` ([`post_recv_at`]) completes flushed, and
/// the VI goes to ERROR.
fn flushed_in_error(vi: &via::Vi, mem: &via::Region, off: usize) {
    let got = vi.recv_wait(Some(Duration::from_secs(60))).unwrap();
    assert_eq!(
        (got.desc, got.status),
        (
            mem.addr(off).unwrap(),
            DONE | OP_RECEIVE | DESC_FLUSHED_ERROR
        )
    );
    in_error(vi);
}

/// The connection `(c, d)` was not touched: still connected, it carries
/// data.
fn untouched(nic: &via::Nic, ptag: via::Ptag, (c, d): (&via::Vi, &via::Vi), mem: &via::Region) {
    mem.write(4096, b"untouched").unwrap();
    assert_eq!(
        send_through(nic, ptag, (c, d), mem, 4096, 9, 2048),
        b"untouched"
    );
    assert_eq!(c.state(), ViState::Connected);
}

// rxe raises no QP or SRQ failure and no DEVICE_FATAL by itself (its QPs
// go to ERROR without an event): the events are injected where the
// progress thread reads the device's (`verbs-device-event`), and the
// handling is the real one.

/// What the injected-failure tests start from, on the selected device: the
/// fail scenario (held for the test), the NIC with its error log, a tag,
/// and an 8 KiB region; `None` without a device.
fn injected_setup() -> Option<(
    fail::FailScenario<'static>,
    via::Nic,
    std::sync::Arc<ErrorLog>,
    via::Ptag,
    via::Region,
)> {
    verbs_device()?;
    let scenario = fail::FailScenario::setup();
    let nic = open_nic();
    let errors = ErrorLog::install(&nic);
    let ptag = nic.create_ptag().unwrap();
    let mem = via::Region::new(&nic, 8192, ptag, false, false).unwrap();
    Some((scenario, nic, errors, ptag, mem))
}

#[test]
fn a_qp_that_fails_by_itself_breaks_its_vi_and_no_other() {
    let Some((_scenario, nic, errors, ptag, mem)) = injected_setup() else {
        return;
    };
    let (a, b) = rd_pair(&nic, ptag, "qpfatal");
    let (c, d) = rd_pair(&nic, ptag, "qpfine");
    post_recv_at(&a, &mem, 0);
    post_recv_at(&b, &mem, 256);
    fail::cfg(
        "verbs-device-event",
        &format!("1*return(QP_FATAL {})", a.slot()),
    )
    .unwrap();
    expect_break(&errors, &a);
    // Its receive flushed, the VI in ERROR; the peer, told through viad,
    // the same.
    flushed_in_error(&a, &mem, 0);
    flushed_in_error(&b, &mem, 256);
    untouched(&nic, ptag, (&c, &d), &mem);
    nic.close().unwrap();
}

#[test]
fn an_srq_that_fails_breaks_the_vis_it_serves_and_no_other() {
    let Some((_scenario, nic, errors, ptag, mem)) = injected_setup() else {
        return;
    };
    // The NIC's first SRQ: id 0.
    let srq = nic.create_srq(ptag, 16).unwrap();
    let d = DescBuilder::recv()
        .segment(&mem, 1024, 64)
        .write(&mem, 0)
        .unwrap();
    srq.post_recv(&mem, d).unwrap();
    let mut at = via::ViAttributes::new(Reliability::ReliableReception, ptag);
    at.max_transfer_size = 65536;
    let (s, r) = local_pair(&nic, &at, "srqerr", |r| r.set_srq(Some(&srq)).unwrap());
    let (c, d) = rd_pair(&nic, ptag, "srqfine");
    fail::cfg("verbs-device-event", "1*return(SRQ_ERR 0)").unwrap();
    expect_break(&errors, &r);
    in_error(&r);
    in_error(&s);
    untouched(&nic, ptag, (&c, &d), &mem);
    r.disconnect().unwrap();
    r.set_srq(None).unwrap();
    let _ = s.disconnect();
    nic.close().unwrap();
}

#[test]
fn a_device_that_fails_is_the_nics_catastrophic_error_and_no_descriptor_hangs() {
    let Some((_scenario, nic, errors, ptag, mem)) = injected_setup() else {
        return;
    };
    let pairs = [rd_pair(&nic, ptag, "fatal1"), rd_pair(&nic, ptag, "fatal2")];
    for (i, (a, b)) in pairs.iter().enumerate() {
        post_recv_at(a, &mem, 512 * i);
        post_recv_at(b, &mem, 512 * i + 256);
    }
    fail::cfg("verbs-device-event", "1*return(DEVICE_FATAL)").unwrap();
    let e = expect_error(&errors, ErrorCode::Catastrophic);
    assert_eq!(e.resource, via::ResourceCode::Nic);
    // Every VI breaks; every receive completes, flushed: a failed device
    // sends no flush, and none is waited for.
    for (i, (a, b)) in pairs.iter().enumerate() {
        flushed_in_error(a, &mem, 512 * i);
        flushed_in_error(b, &mem, 512 * i + 256);
    }
    for (a, b) in &pairs {
        a.disconnect().unwrap();
        b.disconnect().unwrap();
    }
    nic.close().unwrap();
}
