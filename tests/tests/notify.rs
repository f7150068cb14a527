//! Notify handlers: `recv_notify`/`send_notify` run once, on a provider
//! thread, with the descriptor already dequeued; handlers registered after
//! the completion run too; several handlers take completions in order.

use std::sync::mpsc;
use std::time::Duration;

use via::descriptor::status::*;
use via::{Completion, Error, Reliability};
use via_tests::*;

const PEER: &str = env!("CARGO_BIN_EXE_via-peer");
const T: Duration = Duration::from_secs(20);

type Got = (Completion, String, std::thread::ThreadId);

fn handler(tx: &mpsc::Sender<Got>) -> impl FnOnce(Completion) + Send + 'static {
    let tx = tx.clone();
    move |c| {
        let t = std::thread::current();
        let _ = tx.send((c, t.name().unwrap_or("?").to_string(), t.id()));
    }
}

/// Has the peer send, and checks its send completes.
fn psend(p: &mut Peer, cmd: &str) {
    assert_eq!(p.cmd(cmd), "OK");
    let st = nums(&p.cmd_expect("wait_send", "SEND"))[0] as u32;
    assert_eq!(st, DONE | OP_SEND, "{cmd}");
}

#[test]
fn recv_and_send_notify() {
    let s = Setup::new(Reliability::ReliableDelivery, 1 << 16, false, false);
    let mut p = Peer::serve(PEER);
    p.cmd_expect("open rd 65536 0 0", "MEM");
    s.connect_to(&mut p, &disc_str("notify"));
    let me = std::thread::current().id();
    let (tx, rx) = mpsc::channel::<Got>();

    // Registered before the message arrives.
    post_recv(&s, 0, 8192, 100);
    s.vi.recv_notify(handler(&tx));
    assert!(rx.try_recv().is_err(), "ran before any completion");
    assert_eq!(p.cmd("fill 0 4096 100 1"), "OK");
    psend(&mut p, "send 0 4096:100");
    let (c, name, id) = rx.recv_timeout(T).expect("recv notify ran");
    assert_eq!((c.desc, c.status), (s.addr(0), DONE | OP_RECEIVE));
    assert_ne!(id, me, "handler ran on the caller's thread");
    assert_eq!(name, "via-provider");
    assert_eq!(s.bytes(8192, 100), pattern(100, 1));
    assert_eq!(
        s.vi.recv_done(),
        Err(Error::NotDone),
        "handed to the handler, so dequeued"
    );

    // Registered after the completion is already there.
    post_recv(&s, 64, 8192, 100);
    psend(&mut p, "send 0 4096:50");
    s.vi.recv_notify(handler(&tx));
    let (c, _, _) = rx.recv_timeout(T).expect("late recv notify ran");
    assert_eq!((c.desc, c.status), (s.addr(64), DONE | OP_RECEIVE));
    assert_eq!(s.mem.word(64 + 24), 50);

    // Once: one handler, two messages; the second stays queued.
    post_recv(&s, 128, 8192, 100);
    post_recv(&s, 192, 16384, 100);
    s.vi.recv_notify(handler(&tx));
    psend(&mut p, "send 0 4096:10");
    psend(&mut p, "send 64 4096:20");
    let (c, _, _) = rx.recv_timeout(T).unwrap();
    assert_eq!(c.desc, s.addr(128));
    let c2 = s.vi.recv_wait(WAIT).unwrap();
    assert_eq!((c2.desc, s.mem.word(192 + 24)), (s.addr(192), 20));
    assert!(
        rx.recv_timeout(Duration::from_millis(100)).is_err(),
        "a handler ran twice"
    );

    // Two handlers, two completions: in order.
    post_recv(&s, 0, 8192, 100);
    post_recv(&s, 64, 16384, 100);
    let (tx1, rx1) = mpsc::channel::<Got>();
    let (tx2, rx2) = mpsc::channel::<Got>();
    s.vi.recv_notify(handler(&tx1));
    s.vi.recv_notify(handler(&tx2));
    psend(&mut p, "send 0 4096:1");
    psend(&mut p, "send 64 4096:2");
    assert_eq!(rx1.recv_timeout(T).unwrap().0.desc, s.addr(0));
    assert_eq!(rx2.recv_timeout(T).unwrap().0.desc, s.addr(64));

    // Send notify.
    assert_eq!(p.cmd("recv 0 4096:100"), "OK");
    s.fill(4096, 30, 2);
    s.vi.send_notify(handler(&tx));
    post_send(&s, 256, 4096, 30);
    let (c, name, id) = rx.recv_timeout(T).expect("send notify ran");
    assert_eq!((c.desc, c.status), (s.addr(256), DONE | OP_SEND));
    assert_ne!(id, me);
    assert_eq!(name, "via-provider");
    assert_eq!(s.vi.send_done(), Err(Error::NotDone));
    assert_eq!(p.cmd("check 0 4096 30 2"), "SAME");

    // A handler waiting when the connection goes gets the flushed receive.
    post_recv(&s, 0, 8192, 100);
    s.vi.recv_notify(handler(&tx));
    s.vi.disconnect().unwrap();
    let (c, _, _) = rx.recv_timeout(T).expect("notify after disconnect");
    assert_eq!(
        (c.desc, c.status),
        (s.addr(0), DONE | OP_RECEIVE | DESC_FLUSHED_ERROR)
    );
    p.exit();
}
