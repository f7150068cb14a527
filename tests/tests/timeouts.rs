//! Blocking waits with a timeout return `Error::Timeout` after about the
//! timeout (not earlier, not hugely later) and sleep rather than spin.

use std::time::{Duration, Instant};

use via::{Error, Reliability, ViAttributes};
use via_tests::*;

const PEER: &str = env!("CARGO_BIN_EXE_via-peer");

/// CPU time used so far by the calling thread, in clock ticks (1/100 s).
fn thread_ticks() -> u64 {
    let s = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
    // Fields after the command name (which is in parentheses).
    let rest = &s[s.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 here.
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// Runs `f`, which must fail with Timeout after `t`: checks the elapsed
/// time and that the thread slept (less than half the time on a CPU).
fn timed<R: std::fmt::Debug>(what: &str, t: Duration, f: impl FnOnce() -> via::Result<R>) {
    timed_err(what, t, Error::Timeout, f)
}

/// As [`timed`], failing with `want`.
fn timed_err<R: std::fmt::Debug>(
    what: &str,
    t: Duration,
    want: Error,
    f: impl FnOnce() -> via::Result<R>,
) {
    let (c0, start) = (thread_ticks(), Instant::now());
    let r = f();
    let (el, cpu) = (start.elapsed(), thread_ticks() - c0);
    assert_eq!(r.err(), Some(want), "{what}");
    assert!(
        el + Duration::from_millis(2) >= t,
        "{what}: returned after {el:?}, timeout {t:?}"
    );
    assert!(el < t * 10, "{what}: returned after {el:?}, timeout {t:?}");
    let cpu = Duration::from_millis(cpu * 10);
    assert!(
        cpu < el / 2 + Duration::from_millis(20),
        "{what}: {cpu:?} of CPU in {el:?}: spinning, not sleeping"
    );
}

#[test]
fn waits_time_out() {
    let t = Duration::from_millis(300);
    let s = Setup::new(Reliability::ReliableDelivery, 65536, false, false);
    let mut p = Peer::serve(PEER);
    p.cmd_expect("open rd 65536 0 0", "MEM");
    s.connect_to(&mut p, &disc_str("tmo"));

    // A posted receive that nothing completes, and an empty send queue.
    post_recv(&s, 0, 4096, 100);
    timed("recv_wait", t, || s.vi.recv_wait(Some(t)));
    timed("send_wait", t, || s.vi.send_wait(Some(t)));
    // A zero timeout is a poll.
    let start = Instant::now();
    assert_eq!(
        s.vi.recv_wait(Some(Duration::ZERO)).err(),
        Some(Error::Timeout)
    );
    assert!(start.elapsed() < Duration::from_millis(500));

    // The receive still completes afterwards, and a wait with a timeout
    // returns it as soon as it comes.
    assert_eq!(p.cmd("send 0 4096:10"), "OK");
    let c = s.vi.recv_wait(Some(Duration::from_secs(20))).unwrap();
    assert_eq!(c.status & via::descriptor::status::ERROR_MASK, 0);

    // CQ wait.
    let cq = s.nic.create_cq(8).unwrap();
    let at = ViAttributes::new(Reliability::ReliableDelivery, s.ptag);
    let _v = s.nic.create_vi(&at, Some(&cq), Some(&cq)).unwrap();
    timed("cq.wait", t, || cq.wait(Some(t)));

    // Connection waits: nobody connects, nobody listens.
    let here = s.nic.address(&disc("tmo-listen"));
    timed("connect_wait", t, || {
        s.nic.connect_wait(&here, Some(t)).map(|_| ())
    });
    let v2 = s.nic.create_vi(&at, None, None).unwrap();
    // Nobody listens: NO_MATCH, after the timeout.
    timed_err("connect", t, Error::NoMatch, || {
        v2.connect(&here, &s.nic.address(&disc("tmo-nobody")), Some(t))
    });
    timed("connect_peer_wait", t, || {
        v2.connect_peer(&here, &s.nic.address(&disc("tmo-nopeer")), Some(t))?;
        v2.connect_peer_wait()
    });
    p.exit();
}

#[test]
fn long_wait_sleeps() {
    // One second: a spinning implementation would burn about 100 ticks.
    let t = Duration::from_secs(1);
    let nic = open_nic();
    let ptag = nic.create_ptag().unwrap();
    let mem = via::Region::new(&nic, 8192, ptag, false, false).unwrap();
    let vi = nic
        .create_vi(
            &ViAttributes::new(Reliability::Unreliable, ptag),
            None,
            None,
        )
        .unwrap();
    let d = via::DescBuilder::recv()
        .segment(&mem, 4096, 8)
        .write(&mem, 0)
        .unwrap();
    vi.post_recv(&mem, d).unwrap();
    timed("recv_wait on an idle VI", t, || vi.recv_wait(Some(t)));
    let _ = nic.close();
}
