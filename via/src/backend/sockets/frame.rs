//! The data frames of a sockets connection: a fixed 32-byte header, then
//! `len` payload bytes for `SEND`, `WRITE` and `READ_RESP`.
//!
//! | bytes | field |
//! |---|---|
//! | 0 | `op` |
//! | 1 | `flags` ([`IMM`], [`WANT_ACK`]) |
//! | 2..4 | zero |
//! | 4..8 | `len`: payload bytes (`READ_REQ`: bytes asked for) |
//! | 8..12 | `imm`: immediate data (`SEND`, `WRITE`); `status`: the target's error bits (`ACK`, `READ_RESP`) |
//! | 12..16 | `handle`: remote memory handle (`WRITE`, `READ_REQ`) |
//! | 16..24 | `va`: remote address (`WRITE`, `READ_REQ`) |
//! | 24..28 | `seq`: requests: the requests sent on the connection before this one; `READ_RESP` and `ACK` with an error: the `seq` of the request answered |
//! | 28..32 | `ack`: in every frame, the sender's cumulative acknowledgement: every request of the peer numbered below it was placed (or was answered with an error before) |
//!
//! Acknowledgements (Reliable Reception sends, RDMA writes) are
//! cumulative and ride on whatever frame goes out next; an `ACK` frame
//! (status 0) carries nothing else and goes out alone only when no other
//! frame took the acknowledgement soon enough (`$VIA_SOCK_ACK_DELAY_US`).
//! An error answers one request by its `seq`: an `ACK` with the error
//! status, whose `ack` stops below that request.
//!
//! The peer is untrusted input: [`Header::decode`] refuses unknown ops and
//! flags, and the receiver bounds `len` by its MaxTransferSize and checks
//! `seq` (TCP keeps order; a gap means a corrupt stream) and `ack` (never
//! backwards, never beyond the requests sent).
#![forbid(unsafe_code)]

/// Header bytes.
pub(crate) const HEADER: usize = 32;

/// A message for the next posted receive.
pub(crate) const SEND: u8 = 1;
/// RDMA write into (`handle`, `va`).
pub(crate) const WRITE: u8 = 2;
/// RDMA read of `len` bytes at (`handle`, `va`).
pub(crate) const READ_REQ: u8 = 3;
/// The bytes of the oldest unanswered `READ_REQ` (or its error status).
pub(crate) const READ_RESP: u8 = 4;
/// Status 0: nothing but the `ack` field (an acknowledgement no other
/// frame carried in time). Else the request numbered `seq` was refused
/// with `status`.
pub(crate) const ACK: u8 = 5;
/// Nothing; keeps an idle connection proven alive.
pub(crate) const HEARTBEAT: u8 = 6;
/// The sender disconnects (`VipDisconnect`).
pub(crate) const BYE: u8 = 7;

/// `imm` is valid.
pub(crate) const IMM: u8 = 1;
/// The initiator waits for the acknowledgement of this request.
pub(crate) const WANT_ACK: u8 = 2;

/// A decoded header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Header {
    pub op: u8,
    pub flags: u8,
    pub len: u32,
    pub imm: u32,
    pub handle: u32,
    pub va: u64,
    pub seq: u32,
    pub status: u32,
    pub ack: u32,
}

/// Why a header was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BadFrame(pub &'static str);

impl Header {
    /// The 32 bytes.
    pub fn encode(&self) -> [u8; HEADER] {
        let mut b = [0u8; HEADER];
        b[0] = self.op;
        b[1] = self.flags;
        b[4..8].copy_from_slice(&self.len.to_le_bytes());
        let word = if self.answer() { self.status } else { self.imm };
        b[8..12].copy_from_slice(&word.to_le_bytes());
        b[12..16].copy_from_slice(&self.handle.to_le_bytes());
        b[16..24].copy_from_slice(&self.va.to_le_bytes());
        b[24..28].copy_from_slice(&self.seq.to_le_bytes());
        b[28..32].copy_from_slice(&self.ack.to_le_bytes());
        b
    }

    /// An answer (`ACK`, `READ_RESP`): bytes 8..12 are `status`.
    fn answer(&self) -> bool {
        matches!(self.op, ACK | READ_RESP)
    }

    /// Decodes and checks the fields that do not depend on the connection.
    pub fn decode(b: &[u8; HEADER]) -> Result<Header, BadFrame> {
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        let mut h = Header {
            op: b[0],
            flags: b[1],
            len: u32_at(4),
            imm: 0,
            handle: u32_at(12),
            va: u64::from_le_bytes(b[16..24].try_into().unwrap()),
            seq: u32_at(24),
            status: 0,
            ack: u32_at(28),
        };
        if h.answer() {
            h.status = u32_at(8);
        } else {
            h.imm = u32_at(8);
        }
        if !(SEND..=BYE).contains(&h.op) {
            return Err(BadFrame("unknown op"));
        }
        if h.flags & !(IMM | WANT_ACK) != 0 || b[2] != 0 || b[3] != 0 {
            return Err(BadFrame("unknown flags"));
        }
        if h.answer() && h.flags != 0 {
            return Err(BadFrame("flags on an answer"));
        }
        Ok(h)
    }

    /// Payload bytes that follow this header on the wire.
    pub fn payload(&self) -> usize {
        match self.op {
            SEND | WRITE | READ_RESP => self.len as usize,
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip_and_refusals() {
        let h = Header {
            op: WRITE,
            flags: IMM | WANT_ACK,
            len: 70000,
            imm: 0xdead_beef,
            handle: 7,
            va: 0x7fff_0000_1234,
            seq: 42,
            status: 0,
            ack: 17,
        };
        assert_eq!(Header::decode(&h.encode()), Ok(h));
        // Answers carry a status where requests carry immediate data.
        let a = Header {
            op: ACK,
            seq: 41,
            status: 0x800,
            ack: 41,
            ..Header::default()
        };
        assert_eq!(Header::decode(&a.encode()), Ok(a));
        let mut b = a.encode();
        b[1] = IMM;
        assert!(Header::decode(&b).is_err());
        assert_eq!(h.payload(), 70000);
        let r = Header {
            op: READ_REQ,
            len: 9,
            ..h
        };
        assert_eq!(r.payload(), 0);
        let mut b = h.encode();
        b[0] = 0;
        assert!(Header::decode(&b).is_err());
        b[0] = BYE + 1;
        assert!(Header::decode(&b).is_err());
        let mut b = h.encode();
        b[1] = 4;
        assert!(Header::decode(&b).is_err());
        let mut b = h.encode();
        b[3] = 1;
        assert!(Header::decode(&b).is_err());
    }
}
