//! The packet header every message between two processes starts with.
//!
//! | bytes | field | meaning |
//! |---|---|---|
//! | 0 | kind | [`Kind`] |
//! | 4..8 | context | communicator context id |
//! | 8..12 | source | sender's rank in the communicator |
//! | 12..16 | tag | MPI tag |
//! | 16..24 | len | message length in bytes |
//! | 24..28 | freed | receive slots the sender has re-posted for the peer (cumulative, wrapping): piggybacked credits |
//! | 32..40 | sreq | sender's request id (rendezvous) |
//! | 40..48 | addr | sender's buffer address (RTS) |
//! | 48..52 | handle | its memory handle (RTS) |
//! | 52..56 | seq | offload: collective sequence number |
//! | 56..60 | aux | offload: operation-specific word |
//!
//! An eager message carries only the first [`SHORT`] bytes (bytes 32..64
//! are read as 0) and its data right after them: 8 bytes of data and the
//! header share one cache line.
#![forbid(unsafe_code)]

/// Header size; data of a message other than eager follows it.
pub const HEADER: usize = 64;

/// Header size of an eager message; its data follows.
pub const SHORT: usize = 32;

/// Packet kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Envelope and data.
    Eager = 1,
    /// Rendezvous request to send: envelope and where to read the data.
    Rts = 2,
    /// Rendezvous done: the receiver has read the data (`sreq` names the send).
    Fin = 3,
    /// Offloaded collective: a message of the progress context.
    Offload = 4,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Eager,
            2 => Kind::Rts,
            3 => Kind::Fin,
            4 => Kind::Offload,
            _ => return None,
        })
    }
}

/// A decoded header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Kind.
    pub kind: Kind,
    /// Context id.
    pub context: u32,
    /// Sender's rank in the communicator.
    pub source: u32,
    /// Tag.
    pub tag: i32,
    /// Message length.
    pub len: u64,
    /// Piggybacked credits (cumulative re-posted slots).
    pub freed: u32,
    /// Sender's request id.
    pub sreq: u64,
    /// Sender's buffer address (RTS).
    pub addr: u64,
    /// Sender's memory handle (RTS).
    pub handle: u32,
    /// Offload sequence number.
    pub seq: u32,
    /// Offload word.
    pub aux: u32,
}

impl Header {
    /// A header of `kind` with every other field 0.
    pub fn new(kind: Kind) -> Header {
        Header {
            kind,
            context: 0,
            source: 0,
            tag: 0,
            len: 0,
            freed: 0,
            sreq: 0,
            addr: 0,
            handle: 0,
            seq: 0,
            aux: 0,
        }
    }

    /// Bytes of this header on the wire (where the data starts).
    pub fn wire_len(&self) -> usize {
        if self.kind == Kind::Eager {
            SHORT
        } else {
            HEADER
        }
    }

    /// The wire bytes (the first [`Header::wire_len`] of them are sent).
    pub fn encode(&self) -> [u8; HEADER] {
        let mut b = self.encode_short();
        b[32..40].copy_from_slice(&self.sreq.to_le_bytes());
        b[40..48].copy_from_slice(&self.addr.to_le_bytes());
        b[48..52].copy_from_slice(&self.handle.to_le_bytes());
        b[52..56].copy_from_slice(&self.seq.to_le_bytes());
        b[56..60].copy_from_slice(&self.aux.to_le_bytes());
        b
    }

    /// The wire bytes of an eager header: only the first [`SHORT`] are
    /// written (the rest is left 0 for the data).
    #[inline]
    pub fn encode_short(&self) -> [u8; HEADER] {
        let mut b = [0u8; HEADER];
        b[0] = self.kind as u8;
        b[4..8].copy_from_slice(&self.context.to_le_bytes());
        b[8..12].copy_from_slice(&self.source.to_le_bytes());
        b[12..16].copy_from_slice(&self.tag.to_le_bytes());
        b[16..24].copy_from_slice(&self.len.to_le_bytes());
        b[24..28].copy_from_slice(&self.freed.to_le_bytes());
        b
    }

    /// Decodes; `None` for an unknown kind (the peer is a process of the
    /// same job, but a corrupt header must not be trusted).
    #[inline]
    pub fn decode(b: &[u8; HEADER]) -> Option<Header> {
        let u32_le = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        if b[0] == Kind::Eager as u8 {
            // The common case: the short header, nothing past it.
            return Some(Header {
                context: u32_le(4),
                source: u32_le(8),
                tag: u32_le(12) as i32,
                len: u64::from_le_bytes(b[16..24].try_into().unwrap()),
                freed: u32_le(24),
                ..Header::new(Kind::Eager)
            });
        }
        let kind = Kind::from_u8(b[0])?;
        // An eager header ends at SHORT: what follows is its data.
        let end = if kind == Kind::Eager { SHORT } else { HEADER };
        let u32_at = |o: usize| {
            if o < end {
                u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
            } else {
                0
            }
        };
        let u64_at = |o: usize| {
            if o < end {
                u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
            } else {
                0
            }
        };
        Some(Header {
            kind,
            context: u32_at(4),
            source: u32_at(8),
            tag: u32_at(12) as i32,
            len: u64_at(16),
            freed: u32_at(24),
            sreq: u64_at(32),
            addr: u64_at(40),
            handle: u32_at(48),
            seq: u32_at(52),
            aux: u32_at(56),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let mut h = Header::new(Kind::Rts);
        h.context = 7;
        h.source = 3;
        h.tag = -5;
        h.len = 1 << 40;
        h.freed = u32::MAX;
        h.sreq = 99;
        h.addr = 0xdead_beef_0000;
        h.handle = 42;
        h.seq = 9;
        h.aux = 11;
        assert_eq!(Header::decode(&h.encode()), Some(h));
        // Eager: the fields past SHORT are not carried (data is there).
        let mut e = h;
        e.kind = Kind::Eager;
        let mut b = e.encode();
        b[SHORT..].fill(0xab);
        let d = Header::decode(&b).unwrap();
        assert_eq!(
            (d.context, d.source, d.tag, d.len, d.freed),
            (7, 3, -5, 1 << 40, u32::MAX)
        );
        assert_eq!((d.sreq, d.addr, d.handle, d.seq, d.aux), (0, 0, 0, 0, 0));
        assert_eq!(e.encode_short()[..SHORT], e.encode()[..SHORT]);
        assert_eq!(Header::decode(&e.encode_short()), Some(d));
        assert_eq!(e.wire_len(), SHORT);
        assert_eq!(h.wire_len(), HEADER);
        let mut b = h.encode();
        b[0] = 77;
        assert_eq!(Header::decode(&b), None);
    }
}
