//! Connection set-up of the sockets NIC between hosts.
//!
//! A requester's library opens a TCP connection to the viad of the remote
//! host ([`port`], on the remote NIC's IPv4 address) and sends one
//! [`SetupRequest`]. That viad matches it against its local listeners like
//! a local `Connect` and hands the TCP connection to the listener process
//! (`SCM_RIGHTS`), which accepts or rejects. viad writes the one
//! [`SetupAnswer`]; after an accept the same connection carries the VI's
//! data frames (`via::backend::sockets`).
//!
//! Both messages are a `u32` length and a little-endian body of at most
//! [`MAX_SETUP`] bytes. viad decodes requests from the network as hostile
//! input (bounded, checked, no trailing bytes) and within a deadline.
#![forbid(unsafe_code)]

use crate::proto::{DecodeError, INFINITE, NetAddr, R, Refusal, W};

/// Default TCP port of viad's listener for other hosts (`$VIA_TCP_PORT`).
pub const DEFAULT_PORT: u16 = 7170;
/// Largest set-up message body.
pub const MAX_SETUP: usize = 512;
/// Magic of the set-up messages: "VIAT".
pub const SETUP_MAGIC: u32 = 0x5441_4956;
/// Version of the set-up messages and of the data frames behind them.
pub const SETUP_VERSION: u32 = 2;

/// The TCP port of viad's listener: `$VIA_TCP_PORT` or [`DEFAULT_PORT`].
pub fn port() -> u16 {
    match std::env::var("VIA_TCP_PORT") {
        Ok(v) => match v.parse::<u16>() {
            Ok(p) if p > 0 => p,
            _ => {
                log::warn!("ignoring VIA_TCP_PORT={v:?}: not a port number");
                DEFAULT_PORT
            }
        },
        Err(_) => DEFAULT_PORT,
    }
}

/// A connection request from another host's library.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetupRequest {
    /// The requester's address (its NIC's IPv4 address and discriminator).
    pub local: NetAddr,
    /// The server's address on this host.
    pub remote: NetAddr,
    /// Reliability level bits of the requesting VI.
    pub reliability: u32,
    /// Its MaxTransferSize.
    pub mtu: u32,
    /// RDMA write enabled on it.
    pub rdma_write: bool,
    /// RDMA read enabled on it.
    pub rdma_read: bool,
    /// Milliseconds, or [`INFINITE`].
    pub timeout_ms: u32,
    /// A peer-to-peer request (`VipConnectPeerRequest`), else client/server.
    pub peer: bool,
}

/// viad's answer to a [`SetupRequest`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SetupAnswer {
    /// A listener accepted with a VI of these attributes.
    Accepted {
        /// Reliability level bits.
        reliability: u32,
        /// MaxTransferSize.
        mtu: u32,
        /// RDMA write enabled.
        rdma_write: bool,
        /// RDMA read enabled.
        rdma_read: bool,
    },
    /// Refused (timeout, reject, reliability mismatch, limits).
    Refused(Refusal),
}

fn framed(body: W) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + body.0.len());
    out.extend_from_slice(&(body.0.len() as u32).to_le_bytes());
    out.extend_from_slice(&body.0);
    out
}

/// The body length announced by the first 4 bytes of a set-up message.
///
/// # Errors
/// A length over [`MAX_SETUP`].
pub fn body_len(head: [u8; 4]) -> Result<usize, DecodeError> {
    let n = u32::from_le_bytes(head) as usize;
    if n > MAX_SETUP {
        return Err(DecodeError("set-up message too long"));
    }
    Ok(n)
}

fn head(r: &mut R<'_>) -> Result<(), DecodeError> {
    if r.u32()? != SETUP_MAGIC {
        return Err(DecodeError("set-up magic"));
    }
    if r.u32()? != SETUP_VERSION {
        return Err(DecodeError("set-up version"));
    }
    Ok(())
}

impl SetupRequest {
    /// The message (length and body).
    pub fn encode(&self) -> Vec<u8> {
        let mut w = W(Vec::new());
        w.u32(SETUP_MAGIC);
        w.u32(SETUP_VERSION);
        w.addr(&self.local);
        w.addr(&self.remote);
        w.u32(self.reliability);
        w.u32(self.mtu);
        w.u8(self.rdma_write as u8);
        w.u8(self.rdma_read as u8);
        w.u32(self.timeout_ms);
        w.u8(self.peer as u8);
        framed(w)
    }

    /// Decodes a body (after the length).
    ///
    /// # Errors
    /// Anything malformed.
    pub fn decode(body: &[u8]) -> Result<SetupRequest, DecodeError> {
        if body.len() > MAX_SETUP {
            return Err(DecodeError("set-up message too long"));
        }
        let mut r = R(body);
        head(&mut r)?;
        let req = SetupRequest {
            local: r.addr()?,
            remote: r.addr()?,
            reliability: r.u32()?,
            mtu: r.u32()?,
            rdma_write: r.bool()?,
            rdma_read: r.bool()?,
            timeout_ms: r.u32()?,
            peer: r.bool()?,
        };
        r.end()?;
        Ok(req)
    }

    /// Whether the request waits forever.
    pub fn infinite(&self) -> bool {
        self.timeout_ms == INFINITE
    }
}

impl SetupAnswer {
    /// The message (length and body).
    pub fn encode(&self) -> Vec<u8> {
        let mut w = W(Vec::new());
        w.u32(SETUP_MAGIC);
        w.u32(SETUP_VERSION);
        match self {
            SetupAnswer::Accepted {
                reliability,
                mtu,
                rdma_write,
                rdma_read,
            } => {
                w.u8(0);
                w.u32(*reliability);
                w.u32(*mtu);
                w.u8(*rdma_write as u8);
                w.u8(*rdma_read as u8);
            }
            SetupAnswer::Refused(r) => w.u8(*r as u8),
        }
        framed(w)
    }

    /// Decodes a body (after the length).
    ///
    /// # Errors
    /// Anything malformed.
    pub fn decode(body: &[u8]) -> Result<SetupAnswer, DecodeError> {
        let mut r = R(body);
        head(&mut r)?;
        let a = match r.u8()? {
            0 => SetupAnswer::Accepted {
                reliability: r.u32()?,
                mtu: r.u32()?,
                rdma_write: r.bool()?,
                rdma_read: r.bool()?,
            },
            x => SetupAnswer::Refused(Refusal::try_from(x)?),
        };
        r.end()?;
        Ok(a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_hostile_input() {
        let req = SetupRequest {
            local: NetAddr {
                host: vec![10, 0, 0, 1],
                discriminator: b"client".to_vec(),
            },
            remote: NetAddr {
                host: vec![10, 0, 0, 2],
                discriminator: b"server".to_vec(),
            },
            reliability: 2,
            mtu: 65536,
            rdma_write: true,
            rdma_read: false,
            timeout_ms: 1000,
            peer: true,
        };
        let m = req.encode();
        let n = body_len(m[..4].try_into().unwrap()).unwrap();
        assert_eq!(SetupRequest::decode(&m[4..4 + n]).unwrap(), req);
        // Truncated, extended, or with a bad magic: refused.
        assert!(SetupRequest::decode(&m[4..4 + n - 1]).is_err());
        let mut long = m[4..].to_vec();
        long.push(0);
        assert!(SetupRequest::decode(&long).is_err());
        let mut bad = m[4..].to_vec();
        bad[0] ^= 1;
        assert!(SetupRequest::decode(&bad).is_err());
        assert!(body_len((MAX_SETUP as u32 + 1).to_le_bytes()).is_err());
        for a in [
            SetupAnswer::Accepted {
                reliability: 4,
                mtu: 1 << 20,
                rdma_write: false,
                rdma_read: true,
            },
            SetupAnswer::Refused(Refusal::Reject),
        ] {
            let m = a.encode();
            assert_eq!(SetupAnswer::decode(&m[4..]).unwrap(), a);
        }
    }
}
