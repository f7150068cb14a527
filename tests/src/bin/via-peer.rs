//! The other process of the integration tests: `via-peer <scenario> <args>`.
//! It talks to the test over stdin/stdout lines.

use via::Reliability;
use via_tests::*;

fn rel(s: &str) -> Reliability {
    match s {
        "u" => Reliability::Unreliable,
        "rd" => Reliability::ReliableDelivery,
        "rr" => Reliability::ReliableReception,
        _ => panic!("reliability {s}"),
    }
}

fn main() {
    let _ = env_logger::try_init();
    let args: Vec<String> = std::env::args().collect();
    match args[1].as_str() {
        // Echo server: accept on <disc>, then echo every message back.
        "echo" => echo(&args[2], rel(&args[3]), args[4].parse().unwrap(), args[5].parse().unwrap()),
        other => panic!("unknown scenario {other}"),
    }
}

/// Echoes every message back. Two receive buffers alternate, so the next
/// receive is posted before the reply goes out (a reliable connection breaks
/// on a message that finds no receive).
fn echo(disc: &str, r: Reliability, max: usize, rounds: u32) {
    let s = Setup::new(r, 2 * max + 8192, false, false);
    let bufs = [4096, 4096 + max];
    let descs = [0, 256];
    post_recv(&s, descs[0], bufs[0], max as u32);
    let local = s.nic.address(disc.as_bytes());
    tell("LISTENING");
    let req = s.nic.connect_wait(&local, WAIT).expect("connect wait");
    req.accept(&s.vi).expect("accept");
    for i in 0..rounds as usize {
        let c = s.vi.recv_wait(WAIT).expect("recv");
        assert_eq!(c.status & via::descriptor::status::ERROR_MASK, 0, "recv status {:#x}", c.status);
        let len = s.mem.word(descs[i % 2] + 24);
        post_recv(&s, descs[(i + 1) % 2], bufs[(i + 1) % 2], max as u32);
        post_send(&s, 128, bufs[i % 2], len);
        s.vi.send_wait(WAIT).expect("send");
    }
    tell("DONE");
}
