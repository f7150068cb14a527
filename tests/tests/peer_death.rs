//! A peer killed with SIGKILL while it streams RDMA writes into this
//! process: viad notices, this side's VI goes to Error within a bounded
//! time, the error callback reports ConnLost, outstanding receives complete
//! flushed, and nothing of the dead process remains (no /dev/shm file, no
//! mapping of its memory files here, no fd of its objects in viad).
//!
//! Alone in its file: it inspects this process's mappings, which other
//! tests running in parallel would change.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use via::descriptor::status::*;
use via::proto::{ObjKey, ObjKind};
use via::{ErrorCode, Reliability, ViState};
use via_tests::*;

const PEER: &str = env!("CARGO_BIN_EXE_via-peer");
/// Bound on the time from SIGKILL to the survivor's ConnLost.
const DETECT: Duration = Duration::from_secs(5);

/// `via-*` memory files (`memfd:<name>`) in a maps file, as names.
fn via_memfds(maps: &str) -> BTreeSet<String> {
    maps.lines()
        .filter_map(|l| l.split_once("/memfd:").map(|x| x.1))
        .filter(|n| n.starts_with("via-"))
        .map(|n| n.trim_end_matches(" (deleted)").to_string())
        .collect()
}

/// Whether a memory-file name belongs to the process `pid` of viad session
/// `session`: `via-arena:<pid>:...` (arenas are named by process),
/// `via-<kind>:<session>:...` (everything else).
fn of_peer(name: &str, (session, pid): (u64, i32)) -> bool {
    let owner = name.split(':').nth(1);
    if name.starts_with("via-arena:") {
        owner == Some(&pid.to_string())
    } else {
        owner == Some(&session.to_string())
    }
}

fn dev_shm() -> BTreeSet<String> {
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The kernel id of the calling thread.
fn own_tid() -> i32 {
    let s = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
    s.split_whitespace().next().unwrap().parse().unwrap()
}

/// The scheduler state letter of thread `tid` of this process.
fn thread_state(tid: i32) -> Option<char> {
    let s = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    s[s.rfind(')')? + 2..].chars().next()
}

/// The pid of the viad serving this process.
fn viad_pid() -> i32 {
    listener_pid(&viad_socket()).expect("viad's pid")
}

/// The `via-*` memory files viad holds open for `session`.
fn viad_fds_of(viad: i32, peer: (u64, i32)) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{viad}/fd"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .map(|p| p.to_string_lossy().into_owned())
                .filter_map(|p| {
                    p.strip_prefix("/memfd:")
                        .map(|n| n.trim_end_matches(" (deleted)").to_string())
                })
                .filter(|n| n.starts_with("via-") && of_peer(n, peer))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn peer_killed_mid_stream() {
    let shm_before = dev_shm();
    let s = Setup::new(Reliability::ReliableDelivery, 1 << 20, true, false);
    let errs = ErrorLog::install(&s.nic);
    let mut p = Peer::serve(PEER);
    p.cmd_expect("open rd 262144 0 0 1048576", "MEM");
    // Sixteen receives posted; the peer's messages take the first four.
    for i in 0..16 {
        post_recv(&s, i * 64, 65536 + i * 1024, 1024);
    }
    s.connect_to(&mut p, &disc_str("kill"));

    // Who the peer is to viad. Each process maps the NIC segments of both
    // (`via-nic:<session>:<nic>`), but only its own engine doorbell
    // (`via-engine:<session>:<nic>`).
    let peer_pid = p.pid();
    let peer_maps = via_memfds(&std::fs::read_to_string(format!("/proc/{peer_pid}/maps")).unwrap());
    let own = |maps: &BTreeSet<String>| -> (u64, u32) {
        let e = maps
            .iter()
            .find(|n| n.starts_with("via-engine:"))
            .expect("engine doorbell");
        let f: Vec<&str> = e.split(':').collect();
        (f[1].parse().unwrap(), f[2].parse().unwrap())
    };
    let (session, nic_id) = own(&peer_maps);
    let (my_session, _) = own(&via_memfds(
        &std::fs::read_to_string("/proc/self/maps").unwrap(),
    ));
    assert_ne!(session, my_session);
    assert!(
        peer_maps.contains(&format!("via-nic:{session}:{nic_id}")),
        "{peer_maps:?}"
    );

    // Data both ways first (so that this side maps the peer's arenas too).
    for r in 0..4 {
        assert_eq!(p.cmd(&format!("fill 0 8192 1000 {r}")), "OK");
        assert_eq!(p.cmd("send 0 8192:1000"), "OK");
        let c = s.vi.recv_wait(WAIT).unwrap();
        assert_eq!((c.desc, c.status), (s.addr(r * 64), DONE | OP_RECEIVE));
        assert_eq!(s.bytes(65536 + r * 1024, 1000), pattern(1000, r as u32));
        assert_eq!(
            nums(&p.cmd_expect("wait_send", "SEND"))[0] as u32,
            DONE | OP_SEND
        );
    }
    assert_eq!(p.cmd("recv 1024 16384:100"), "OK");
    s.fill(4096, 100, 9);
    post_send(&s, 2048, 4096, 100);
    assert_eq!(s.vi.send_wait(WAIT).unwrap().status, DONE | OP_SEND);
    assert_eq!(
        nums(&p.cmd_expect("wait_recv", "RECV"))[0] as u32,
        DONE | OP_RECEIVE
    );
    let mine = via_memfds(&std::fs::read_to_string("/proc/self/maps").unwrap());
    assert!(
        mine.iter()
            .any(|n| n.starts_with("via-nic:") && of_peer(n, (session, peer_pid))),
        "the peer's NIC segment is not mapped here: {mine:?}"
    );
    assert!(
        mine.iter()
            .any(|n| n.starts_with("via-arena:") && of_peer(n, (session, peer_pid))),
        "no arena of the peer is mapped here: {mine:?}"
    );
    let viad = viad_pid();
    assert!(
        !viad_fds_of(viad, (session, peer_pid)).is_empty(),
        "viad {viad} holds nothing of the peer (session {session}): {:?}",
        std::fs::read_dir(format!("/proc/{viad}/fd")).map(|d| d
            .filter_map(|e| e.ok())
            .filter_map(|e| std::fs::read_link(e.path()).ok())
            .collect::<Vec<_>>())
    );
    let agent = via::agent::Agent::connect(Box::new(|_| {})).expect("second viad session");
    let key = ObjKey {
        kind: ObjKind::Nic,
        nic: nic_id,
        id: 0,
        generation: 0,
    };
    assert!(
        agent.fetch(session, key).is_ok(),
        "the peer's segment is not in viad"
    );

    // The peer streams RDMA writes into [4096, 4096 + 32 KiB) and the round
    // number into [0, 8). Kill it once the stream is well under way.
    let (addr, h) = (s.addr(0), s.mem.handle());
    p.say(&format!("stream {addr:#x} {h} 32768"));
    p.expect("STREAMING");
    let round = || u64::from_ne_bytes(s.bytes(0, 8).try_into().unwrap());
    let deadline = Instant::now() + WAIT.unwrap();
    while round() < 50 {
        assert!(Instant::now() < deadline, "the stream did not start");
        std::hint::spin_loop();
    }
    assert!(s.vi.state() == ViState::Connected);

    // A thread sleeps in recv_wait (on receive 4) when the peer dies.
    let (tx, rx) = std::sync::mpsc::channel();
    let (killed, first, woke) = std::thread::scope(|sc| {
        let h = sc.spawn(|| {
            tx.send(own_tid()).unwrap();
            let c = s.vi.recv_wait(WAIT);
            (c, Instant::now())
        });
        let tid = rx.recv().unwrap();
        assert!(
            wait_until(DETECT, || thread_state(tid) == Some('S')),
            "the waiter never went to sleep"
        );
        let killed = Instant::now();
        p.child.kill().unwrap();
        let (c, woke) = h.join().unwrap();
        (killed, c, woke)
    });

    // Detection: the callback reports ConnLost, the VI is in Error, the
    // sleeping waiter wakes with the flushed receive.
    let (e, thread, at) = errs
        .wait_for(ErrorCode::ConnLost, Duration::from_secs(30))
        .expect("ConnLost never reported");
    let took = at - killed;
    eprintln!(
        "SIGKILL detected after {took:?} (callback on thread {thread:?}); waiter woke after {:?}",
        woke - killed
    );
    assert!(took < DETECT, "detection took {took:?}");
    assert!(
        woke - killed < DETECT,
        "the waiter slept {:?} after the death",
        woke - killed
    );
    let c = first.expect("the sleeping waiter got a completion");
    assert_eq!(
        (c.desc, c.status),
        (s.addr(4 * 64), DONE | OP_RECEIVE | DESC_FLUSHED_ERROR)
    );
    assert_eq!(e.vi.map(|v| v.0), Some(s.vi.slot()));
    assert_eq!(s.vi.state(), ViState::Error);
    let _ = p.child.wait();
    // The other eleven outstanding receives complete flushed, in order.
    for i in 5..16 {
        let c = s.vi.recv_wait(WAIT).expect("flushed receive");
        assert_eq!(
            (c.desc, c.status),
            (s.addr(i * 64), DONE | OP_RECEIVE | DESC_FLUSHED_ERROR),
            "receive {i}"
        );
    }
    assert_eq!(s.vi.queues_empty(), (true, true));
    // A send now completes flushed.
    post_send(&s, 2048, 4096, 10);
    assert_eq!(
        s.vi.send_wait(WAIT).unwrap().status,
        DONE | OP_SEND | DESC_FLUSHED_ERROR
    );
    // The stream's data that landed is whole rounds of the pattern (the
    // last one may be partial): check the round counter is sane.
    assert!(round() >= 50);

    // Nothing of the dead process remains.
    let shm_after = dev_shm();
    let new: Vec<_> = shm_after.difference(&shm_before).collect();
    assert!(new.is_empty(), "new files in /dev/shm: {new:?}");
    assert!(
        !shm_after.iter().any(|n| n.contains("via")),
        "via files in /dev/shm: {shm_after:?}"
    );
    let mut left = BTreeSet::new();
    let unmapped = wait_until(DETECT, || {
        left = via_memfds(&std::fs::read_to_string("/proc/self/maps").unwrap())
            .into_iter()
            .filter(|n| of_peer(n, (session, peer_pid)))
            .collect();
        left.is_empty()
    });
    assert!(
        unmapped,
        "mappings of the dead session {session} remain here: {left:?}"
    );
    let mut held = Vec::new();
    let released = wait_until(DETECT, || {
        held = viad_fds_of(viad, (session, peer_pid));
        held.is_empty()
    });
    assert!(
        released,
        "viad still holds {held:?} of the dead session {session}"
    );
    assert!(
        agent.fetch(session, key).is_err(),
        "viad still serves the dead session's segment"
    );

    // The survivor's VI is reusable: back to Idle, then a new connection.
    s.vi.disconnect().unwrap();
    assert_eq!(s.vi.state(), ViState::Idle);
    let mut p2 = Peer::serve(PEER);
    p2.cmd_expect("open rd 65536 0 0", "MEM");
    s.connect_to(&mut p2, &disc_str("kill2"));
    assert_eq!(p2.cmd("recv 0 4096:100"), "OK");
    s.fill(4096, 100, 10);
    post_send(&s, 2048, 4096, 100);
    assert_eq!(s.vi.send_wait(WAIT).unwrap().status, DONE | OP_SEND);
    assert_eq!(
        nums(&p2.cmd_expect("wait_recv", "RECV"))[0] as u32,
        DONE | OP_RECEIVE
    );
    assert_eq!(p2.cmd("check 0 4096 100 10"), "SAME");
    p2.exit();
}

#[test]
fn peer_killed_while_sending_into_posted_receives() {
    const N: usize = 256 * 1024;
    const RECVS: usize = 16;
    let buf = |i: usize| 65536 + i * N;
    let s = Setup::new(Reliability::Unreliable, buf(RECVS), false, false);
    let errs = ErrorLog::install(&s.nic);
    let mut p = Peer::serve(PEER);
    p.cmd_expect(&format!("open u {} 0 0 1048576", N + 8192), "MEM");
    s.connect_to(&mut p, &disc_str("killsend"));
    let peer_pid = p.pid();
    let session = {
        let maps = via_memfds(&std::fs::read_to_string(format!("/proc/{peer_pid}/maps")).unwrap());
        let e = maps
            .iter()
            .find(|n| n.starts_with("via-engine:"))
            .expect("engine doorbell")
            .clone();
        e.split(':').nth(1).unwrap().parse::<u64>().unwrap()
    };
    for i in 0..RECVS {
        post_recv(&s, i * 64, buf(i), N as u32);
    }
    // Checks a delivered message; returns its round.
    let check = |i: usize| -> u64 {
        assert_eq!(s.mem.word(i * 64 + 24) as usize, N, "receive {i}: length");
        let b = s.bytes(buf(i), N);
        let r = u64::from_ne_bytes(b[..8].try_into().unwrap());
        assert!(
            b[8..] == pattern(N - 8, r as u32)[..],
            "receive {i}: torn or wrong data (round {r})"
        );
        r
    };
    p.say(&format!("stream_send {N}"));
    p.expect("STREAMING");
    // Unreliable: messages that find no receive are dropped, so rounds
    // increase with gaps.
    let mut last = 0;
    for k in 0..40 {
        let i = k % RECVS;
        let c = s.vi.recv_wait(WAIT).expect("message");
        assert_eq!((c.desc, c.status), (s.addr(i * 64), DONE | OP_RECEIVE));
        let r = check(i);
        assert!(r > last, "round {r} after {last}");
        last = r;
        post_recv(&s, i * 64, buf(i), N as u32);
    }
    let killed = Instant::now();
    p.child.kill().unwrap();
    let (_, _, at) = errs
        .wait_for(ErrorCode::ConnLost, Duration::from_secs(30))
        .expect("ConnLost never reported");
    assert!(at - killed < DETECT, "detection took {:?}", at - killed);
    assert_eq!(s.vi.state(), ViState::Error);
    let _ = p.child.wait();
    // Every outstanding receive completes: whole messages first (if the
    // peer delivered them before dying), then flushed ones.
    let mut flushed = 0;
    for k in 40..40 + RECVS {
        let i = k % RECVS;
        let c = s.vi.recv_wait(WAIT).expect("outstanding receive completes");
        assert_eq!(c.desc, s.addr(i * 64));
        if c.status == DONE | OP_RECEIVE | DESC_FLUSHED_ERROR {
            flushed += 1;
        } else {
            assert_eq!(c.status, DONE | OP_RECEIVE, "receive {i}");
            assert_eq!(flushed, 0, "a delivered message after a flushed one");
            let r = check(i);
            assert!(r > last);
            last = r;
        }
    }
    assert!(
        flushed > 0,
        "every receive was filled: the kill came too late to matter"
    );
    assert_eq!(s.vi.queues_empty(), (true, true));
    let mut left = BTreeSet::new();
    let unmapped = wait_until(DETECT, || {
        left = via_memfds(&std::fs::read_to_string("/proc/self/maps").unwrap())
            .into_iter()
            .filter(|n| of_peer(n, (session, peer_pid)))
            .collect();
        left.is_empty()
    });
    assert!(
        unmapped,
        "mappings of the dead session {session} remain here: {left:?}"
    );
}

/// Streams sends on `s.vi` until `stop`, reusing eight descriptors (each
/// only after its own completion was dequeued: one thread does it all).
/// Returns (posted, delivered, flushed).
fn stream_sends(
    s: &Setup,
    n: usize,
    stop: &std::sync::atomic::AtomicBool,
) -> (usize, usize, usize) {
    let (mut posted, mut drained, mut done, mut flushed) = (0usize, 0usize, 0usize, 0usize);
    let mut complete = || {
        let c = s.vi.send_wait(WAIT).unwrap_or_else(|e| {
            let st: Vec<String> = (0..8)
                .map(|k| format!("{:#x}", s.mem.status(k * 64)))
                .collect();
            panic!(
                "a posted send never completed ({e:?}): VI {:?}, statuses in memory {st:?} \
                 (descriptor left in the doorbell: the kick of its post was lost)",
                s.vi.state()
            )
        });
        match c.status {
            st if st == DONE | OP_SEND => done += 1,
            st if st == DONE | OP_SEND | DESC_FLUSHED_ERROR => flushed += 1,
            st => panic!("send status {st:#x}"),
        }
    };
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        if posted - drained == 8 {
            complete();
            drained += 1;
        }
        let d = via::DescBuilder::send()
            .segment(&s.mem, 65536, n as u32)
            .write(&s.mem, (posted % 8) * 64)
            .unwrap();
        s.vi.post_send(&s.mem, d).expect("post_send");
        posted += 1;
    }
    while drained < posted {
        complete();
        drained += 1;
    }
    (posted, done, flushed)
}

#[test]
fn peer_killed_while_receiving_from_here() {
    // A thread here streams sends at a peer that dies (Unreliable, so
    // messages beyond the peer's receives are dropped, not fatal): no post
    // fails or blocks, every send completes (delivered or flushed), and the
    // VI ends in Error. Four rounds, each with a new peer: the death races
    // with the posts differently each time.
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    const N: usize = 65536;
    let s = Setup::new(Reliability::Unreliable, 1 << 20, false, false);
    let errs = ErrorLog::install(&s.nic);
    s.fill(65536, N, 3);
    for round in 0..4 {
        let mut p = Peer::serve(PEER);
        p.cmd_expect("open u 1048576 0 0 1048576", "MEM");
        s.connect_to(&mut p, &disc_str(&format!("killrecv{round}")));
        for j in 0..64 {
            let cmd = format!("recv {} {}:{N}", j * 64, 65536 + (j % 8) * N);
            assert_eq!(p.cmd(&cmd), "OK");
        }
        let stop = AtomicBool::new(false);
        let (posted, done, flushed) = std::thread::scope(|sc| {
            let h = sc.spawn(|| stream_sends(&s, N, &stop));
            // Kill the peer once messages arrive there, data checked.
            let v = nums(&p.cmd_expect("wait_recv", "RECV"));
            assert_eq!((v[0] as u32, v[1] as usize), (DONE | OP_RECEIVE, N));
            assert_eq!(p.cmd(&format!("check 0 65536 {N} 3")), "SAME");
            let killed = Instant::now();
            p.child.kill().unwrap();
            let (_, _, at) = errs
                .take(ErrorCode::ConnLost, Duration::from_secs(30))
                .expect("ConnLost never reported");
            assert!(at - killed < DETECT, "detection took {:?}", at - killed);
            // Let the sender post on the broken VI for a while.
            let mut n = 0;
            wait_until(DETECT, || {
                n += 1;
                n > 50
            });
            stop.store(true, Relaxed);
            h.join().unwrap()
        });
        eprintln!("round {round}: {posted} sends, {done} delivered, {flushed} flushed");
        assert_eq!(posted, done + flushed);
        assert!(done > 0 && flushed > 0, "the kill did not land mid-stream");
        assert_eq!(s.vi.state(), ViState::Error);
        assert_eq!(s.vi.queues_empty(), (true, true));
        let _ = p.child.wait();
        s.vi.disconnect().unwrap();
    }
}
