//! The NFQUEUE protocol over netlink (linux/netfilter/nfnetlink_queue.h),
//! as plain bytes: configuration messages, verdicts, and parsing of the
//! packets the kernel queues. Malformed input is an error, never a panic.

use std::io;

use crate::sys::Netlink;

const NLMSG_HDRLEN: usize = 16;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;

const NFNL_SUBSYS_QUEUE: u16 = 3;
const NFQNL_MSG_PACKET: u16 = 0;
const NFQNL_MSG_VERDICT: u16 = 1;
const NFQNL_MSG_CONFIG: u16 = 2;

const NFQA_PACKET_HDR: u16 = 1;
const NFQA_VERDICT_HDR: u16 = 2;
const NFQA_PAYLOAD: u16 = 10;
const NFQA_SKB_INFO: u16 = 14;

const NFQA_CFG_CMD: u16 = 1;
const NFQA_CFG_PARAMS: u16 = 2;
const NFQA_CFG_QUEUE_MAXLEN: u16 = 3;
const NFQA_CFG_MASK: u16 = 4;
const NFQA_CFG_FLAGS: u16 = 5;

const NFQNL_CFG_CMD_BIND: u8 = 1;
const NFQNL_CFG_CMD_UNBIND: u8 = 2;
const NFQNL_COPY_PACKET: u8 = 2;

/// `NFQA_CFG_F_GSO`: the kernel queues GSO packets whole (up to 64 KiB,
/// their checksum possibly not computed) instead of segmenting them first.
pub const NFQA_CFG_F_GSO: u32 = 4;
/// `NFQA_SKB_CSUMNOTREADY` in `NFQA_SKB_INFO`: the transport checksum of
/// the payload is not filled in yet (only with `NFQA_CFG_F_GSO`).
pub const NFQA_SKB_CSUMNOTREADY: u32 = 1;
/// `NFQA_SKB_GSO` in `NFQA_SKB_INFO`.
pub const NFQA_SKB_GSO: u32 = 2;

pub const NF_DROP: u32 = 0;
pub const NF_ACCEPT: u32 = 1;

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// A netlink message to the queue subsystem, built attribute by attribute.
struct Msg {
    buf: Vec<u8>,
}

impl Msg {
    fn new(kind: u16, flags: u16, queue: u16, seq: u32) -> Msg {
        let mut buf = Vec::with_capacity(64);
        buf.extend_from_slice(&0u32.to_ne_bytes()); // length, set in done()
        buf.extend_from_slice(&((NFNL_SUBSYS_QUEUE << 8) | kind).to_ne_bytes());
        buf.extend_from_slice(&(NLM_F_REQUEST | flags).to_ne_bytes());
        buf.extend_from_slice(&seq.to_ne_bytes());
        buf.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel's
        // struct nfgenmsg: family AF_UNSPEC, version 0, res_id (big endian).
        buf.extend_from_slice(&[0, 0]);
        buf.extend_from_slice(&queue.to_be_bytes());
        Msg { buf }
    }

    fn attr(mut self, ty: u16, data: &[u8]) -> Msg {
        let len = 4 + data.len();
        self.buf.extend_from_slice(&(len as u16).to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(data);
        self.buf.resize(align4(self.buf.len()), 0);
        self
    }

    fn done(mut self) -> Vec<u8> {
        let n = self.buf.len() as u32;
        self.buf[..4].copy_from_slice(&n.to_ne_bytes());
        self.buf
    }
}

/// One queued packet.
pub struct Packet {
    pub id: u32,
    /// The packet from its network header on (may be empty).
    pub payload: Vec<u8>,
    /// `NFQA_SKB_INFO` flags (0 if absent).
    pub skb_info: u32,
}

/// What one received datagram held.
pub enum Event {
    Packet(Packet),
    /// An acknowledgement (errno 0) or error answer to one of our requests.
    Answer {
        seq: u32,
        errno: i32,
    },
}

/// A queue bound on a netlink socket.
pub struct Queue {
    pub nl: Netlink,
    pub num: u16,
    seq: u32,
    buf: Vec<u8>,
}

impl Queue {
    /// Binds queue `num`: whole packets (up to 64 KiB), at most `maxlen`
    /// waiting in the kernel, `flags` (`NFQA_CFG_F_*`) set. Fails if
    /// another process holds the queue or NFQUEUE is missing.
    pub fn bind(num: u16, maxlen: u32, flags: u32) -> io::Result<Queue> {
        let mut q = Queue {
            nl: Netlink::open(32 << 20)?,
            num,
            seq: 0,
            buf: vec![0; 256 << 10],
        };
        q.config(|m| m.attr(NFQA_CFG_CMD, &[NFQNL_CFG_CMD_BIND, 0, 0, 0]))?;
        let mut params = 0xffffu32.to_be_bytes().to_vec();
        params.push(NFQNL_COPY_PACKET);
        q.config(|m| m.attr(NFQA_CFG_PARAMS, &params))?;
        q.config(|m| m.attr(NFQA_CFG_QUEUE_MAXLEN, &maxlen.to_be_bytes()))?;
        q.config(|m| {
            m.attr(NFQA_CFG_FLAGS, &flags.to_be_bytes())
                .attr(NFQA_CFG_MASK, &NFQA_CFG_F_GSO.to_be_bytes())
        })?;
        Ok(q)
    }

    /// Sends a configuration message and waits for its acknowledgement
    /// (packets that arrive meanwhile are accepted: none should, the rule
    /// is installed after we are ready).
    fn config(&mut self, f: impl FnOnce(Msg) -> Msg) -> io::Result<()> {
        self.seq += 1;
        let seq = self.seq;
        let msg = f(Msg::new(NFQNL_MSG_CONFIG, NLM_F_ACK, self.num, seq)).done();
        self.nl.send(&msg)?;
        loop {
            for ev in self.recv(true)? {
                match ev {
                    Event::Answer { seq: s, errno } if s == seq => {
                        return if errno == 0 {
                            Ok(())
                        } else {
                            Err(io::Error::from_raw_os_error(errno))
                        };
                    }
                    Event::Answer { .. } => {}
                    Event::Packet(p) => self.verdict(p.id, NF_ACCEPT)?,
                }
            }
        }
    }

    /// Unbinds the queue (packets still waiting in the kernel are dropped
    /// by it; the rule should be gone by then).
    pub fn unbind(&mut self) -> io::Result<()> {
        self.config(|m| m.attr(NFQA_CFG_CMD, &[NFQNL_CFG_CMD_UNBIND, 0, 0, 0]))
    }

    /// The verdict `verdict` (`NF_ACCEPT`, `NF_DROP`) on packet `id`. Any
    /// order of ids is fine: the kernel looks each one up.
    pub fn verdict(&self, id: u32, verdict: u32) -> io::Result<()> {
        let mut hdr = verdict.to_be_bytes().to_vec();
        hdr.extend_from_slice(&id.to_be_bytes());
        let msg = Msg::new(NFQNL_MSG_VERDICT, 0, self.num, 0)
            .attr(NFQA_VERDICT_HDR, &hdr)
            .done();
        self.nl.send(&msg)
    }

    /// Reads one datagram (waiting for it if `block`) and parses it; an
    /// empty list when nothing was there.
    pub fn recv(&mut self, block: bool) -> io::Result<Vec<Event>> {
        let Some(n) = self.nl.recv(&mut self.buf, block)? else {
            return Ok(Vec::new());
        };
        parse(&self.buf[..n])
    }
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn bad(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("malformed netlink message: {what}"),
    )
}

/// Parses a datagram of netlink messages.
pub fn parse(mut b: &[u8]) -> io::Result<Vec<Event>> {
    let mut out = Vec::new();
    while b.len() >= NLMSG_HDRLEN {
        let len = u32_at(b, 0).ok_or_else(|| bad("header"))? as usize;
        let ty = u16_at(b, 4).ok_or_else(|| bad("header"))?;
        let seq = u32_at(b, 8).ok_or_else(|| bad("header"))?;
        if len < NLMSG_HDRLEN || len > b.len() {
            return Err(bad("length"));
        }
        let body = &b[NLMSG_HDRLEN..len];
        match ty {
            NLMSG_ERROR => {
                let e = u32_at(body, 0).ok_or_else(|| bad("error"))? as i32;
                out.push(Event::Answer { seq, errno: -e });
            }
            NLMSG_DONE => {}
            t if t == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET => {
                out.push(Event::Packet(parse_packet(body)?));
            }
            _ => {}
        }
        b = &b[align4(len).min(b.len())..];
    }
    Ok(out)
}

/// Parses a packet message's body (nfgenmsg, then attributes).
fn parse_packet(body: &[u8]) -> io::Result<Packet> {
    let mut attrs = body.get(4..).ok_or_else(|| bad("nfgenmsg"))?;
    let mut id = None;
    let mut payload = Vec::new();
    let mut skb_info = 0;
    while attrs.len() >= 4 {
        let len = u16_at(attrs, 0).unwrap_or(0) as usize;
        let ty = u16_at(attrs, 2).unwrap_or(0) & 0x3fff;
        if len < 4 || len > attrs.len() {
            return Err(bad("attribute length"));
        }
        let data = &attrs[4..len];
        match ty {
            NFQA_PACKET_HDR => {
                let raw = data.get(..4).ok_or_else(|| bad("packet header"))?;
                id = Some(u32::from_be_bytes(raw.try_into().unwrap_or_default()));
            }
            NFQA_PAYLOAD => payload = data.to_vec(),
            NFQA_SKB_INFO => {
                if let Some(raw) = data.get(..4) {
                    skb_info = u32::from_be_bytes(raw.try_into().unwrap_or_default());
                }
            }
            _ => {}
        }
        attrs = &attrs[align4(len).min(attrs.len())..];
    }
    let id = id.ok_or_else(|| bad("no packet header"))?;
    Ok(Packet {
        id,
        payload,
        skb_info,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_packet_and_rejects_garbage() {
        // A packet message as the kernel builds it.
        let mut m = Msg::new(NFQNL_MSG_PACKET, 0, 5, 0);
        m = m.attr(NFQA_PACKET_HDR, &[0, 0, 1, 2, 8, 0, 1]);
        m = m.attr(NFQA_SKB_INFO, &NFQA_SKB_GSO.to_be_bytes());
        m = m.attr(NFQA_PAYLOAD, &[0x45, 1, 2]);
        let msg = m.done();
        let evs = parse(&msg).unwrap();
        match &evs[..] {
            [Event::Packet(p)] => {
                assert_eq!((p.id, p.skb_info), (0x102, NFQA_SKB_GSO));
                assert_eq!(p.payload, [0x45, 1, 2]);
            }
            _ => panic!("one packet expected"),
        }
        // Every truncation is an error or nothing, never a panic.
        for n in 0..msg.len() {
            let _ = parse(&msg[..n]);
        }
        let mut bad = msg.clone();
        bad[NLMSG_HDRLEN + 4] = 0xff; // attribute length past the end
        assert!(parse(&bad).is_err());
    }
}
