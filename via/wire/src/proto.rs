//! The viad wire protocol, shared by the library and the daemon.
//!
//! One message per `SOCK_SEQPACKET` datagram: a 12-byte header
//! (`magic: u16`, `kind: u16`, `id: u32`, `len: u32`) and a little-endian
//! body. Descriptors travel beside the body in `SCM_RIGHTS`. Requests carry
//! a non-zero id echoed by the reply; events from the daemon carry id 0.
//!
//! Decoding treats every byte as hostile: lengths are bounded, unknown kinds
//! and trailing bytes are errors, and nothing is allocated beyond
//! [`MAX_FRAME`]. The daemon disconnects a client whose frame does not
//! decode.

#![forbid(unsafe_code)]

use std::fmt;

/// Protocol magic: "VD".
pub const MAGIC: u16 = 0x4456;
/// Protocol version, sent in `Hello` (3: the `Welcome` tells the mode and
/// the session's limits, `Refused(Quota)`; 4: an [`Endpoint`] carries an
/// opaque device part instead of the soft NIC's receive ring position;
/// 5: a disconnect carries the error its peer reports).
pub const VERSION: u32 = 5;
/// [`Request::Disconnect`]'s `reason` of a plain disconnect: the peer
/// reports `VIP_ERROR_CONN_LOST` (the library's `ErrorCode` values).
pub const REASON_CONN_LOST: u8 = 1;
/// Largest datagram either side accepts.
pub const MAX_FRAME: usize = 4096;
/// Largest host address in bytes.
pub const MAX_HOST: usize = 16;
/// Longest device part of an [`Endpoint`].
pub const MAX_DEVICE_BLOB: usize = 64;
/// Largest discriminator in bytes (`MaxDiscriminatorLen`).
pub const MAX_DISCRIMINATOR: usize = 64;
/// Largest host name in bytes.
pub const MAX_NAME: usize = 255;
/// "No limit" in a [`SessionLimits`] field.
pub const UNLIMITED: u64 = u64::MAX;
/// "Wait forever" in a timeout field.
pub const INFINITE: u32 = u32::MAX;
/// How long the daemon waits for a peer to acknowledge a disconnect.
pub const DISCONNECT_ACK: std::time::Duration = std::time::Duration::from_secs(2);

/// Kinds of shared objects the daemon stores for peers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ObjKind {
    /// A NIC segment (`id` = 0).
    Nic = 1,
    /// A registration arena (`nic` = 0, `id` = arena id).
    Arena = 2,
    /// A CQ ring (`id` = CQ index, `generation` = ring generation).
    CqRing = 3,
    /// A TCP connection from another host waiting for a listener of the
    /// sockets NIC (`id` = the remote request; held by viad's remote
    /// sessions only).
    Stream = 4,
}

impl TryFrom<u8> for ObjKind {
    type Error = DecodeError;
    fn try_from(v: u8) -> Result<Self, DecodeError> {
        match v {
            1 => Ok(ObjKind::Nic),
            2 => Ok(ObjKind::Arena),
            3 => Ok(ObjKind::CqRing),
            4 => Ok(ObjKind::Stream),
            _ => Err(DecodeError("object kind")),
        }
    }
}

/// Names a shared object of a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ObjKey {
    /// What it is.
    pub kind: ObjKind,
    /// NIC id within the session (0 for arenas).
    pub nic: u32,
    /// Object id.
    pub id: u32,
    /// Generation.
    pub generation: u32,
}

/// A VIA network address: host address bytes and a discriminator.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct NetAddr {
    /// Host address.
    pub host: Vec<u8>,
    /// Discriminator.
    pub discriminator: Vec<u8>,
}

/// One end of a connection as the other end needs to know it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Endpoint {
    /// Session of the owning process.
    pub session: u64,
    /// NIC id within that session.
    pub nic: u32,
    /// VI slot.
    pub vi: u32,
    /// VI generation.
    pub vi_gen: u32,
    /// Reliability level bits.
    pub reliability: u32,
    /// MaxTransferSize of the VI.
    pub mtu: u32,
    /// RDMA write enabled on the VI.
    pub rdma_write: bool,
    /// RDMA read enabled on the VI.
    pub rdma_read: bool,
    /// What the VI's kind of NIC needs its peer to know to reach it on the
    /// wire (for the soft NIC: the first receive ring position the peer's
    /// engine may consume), opaque to the broker; at most
    /// [`MAX_DEVICE_BLOB`] bytes.
    pub device: Vec<u8>,
}

/// Why a connection attempt failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Nobody matched before the deadline.
    Timeout = 1,
    /// The server rejected the request.
    Reject = 2,
    /// Reliability levels differ.
    Reliability = 3,
    /// The connection handle is unknown or already settled.
    Gone = 4,
    /// The remote host is not reachable through this daemon.
    NoMatch = 5,
    /// A name or address could not be resolved.
    NameService = 6,
    /// The daemon refused the request (bad argument).
    Invalid = 7,
    /// The client is over one of the daemon's limits (descriptors held,
    /// pending requests, connections): refused, the client keeps its session.
    Limit = 8,
    /// A `Publish` of an arena would take the process or its user beyond
    /// the pinning quota of the system daemon (or the daemon could not lock
    /// the memory): refused, the client keeps its session.
    Quota = 9,
}

/// Which kind of daemon serves a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DaemonMode {
    /// The per-user daemon the library starts on demand: serves one uid,
    /// locks nothing.
    User = 1,
    /// The privileged system daemon (`viad --system`): serves every uid,
    /// locks published arenas against a quota, keeps users apart.
    System = 2,
}

impl TryFrom<u8> for DaemonMode {
    type Error = DecodeError;
    fn try_from(v: u8) -> Result<Self, DecodeError> {
        match v {
            1 => Ok(DaemonMode::User),
            2 => Ok(DaemonMode::System),
            _ => Err(DecodeError("daemon mode")),
        }
    }
}

/// What the daemon lets one session hold, as the `Welcome` tells it
/// ([`UNLIMITED`]: no limit of that kind).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SessionLimits {
    /// Bytes of arenas the process may have locked (per-process pinning
    /// quota).
    pub pin_process: u64,
    /// Bytes of arenas all processes of the user may have locked together
    /// (per-user pinning quota).
    pub pin_user: u64,
    /// Shared objects (fds) the session may store.
    pub max_objects: u64,
}

impl SessionLimits {
    /// No pinning quota, at most `max_objects` objects.
    pub const fn unpinned(max_objects: u64) -> SessionLimits {
        SessionLimits {
            pin_process: UNLIMITED,
            pin_user: UNLIMITED,
            max_objects,
        }
    }
}

impl TryFrom<u8> for Refusal {
    type Error = DecodeError;
    fn try_from(v: u8) -> Result<Self, DecodeError> {
        Ok(match v {
            1 => Refusal::Timeout,
            2 => Refusal::Reject,
            3 => Refusal::Reliability,
            4 => Refusal::Gone,
            5 => Refusal::NoMatch,
            6 => Refusal::NameService,
            7 => Refusal::Invalid,
            8 => Refusal::Limit,
            9 => Refusal::Quota,
            _ => return Err(DecodeError("refusal")),
        })
    }
}

/// Messages from a client to the daemon.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// First message of a session.
    Hello {
        /// [`VERSION`].
        version: u32,
    },
    /// Store the attached fd as `key` of this session.
    Publish {
        /// Object name.
        key: ObjKey,
    },
    /// Forget `key` of this session (no reply).
    Retire {
        /// Object name.
        key: ObjKey,
    },
    /// Send me the fd of `key` of `session`.
    Fetch {
        /// Owner session.
        session: u64,
        /// Object name.
        key: ObjKey,
    },
    /// VipConnectWait: wait for a request on `local`.
    Listen {
        /// Local address (host + discriminator).
        local: NetAddr,
        /// Milliseconds, or [`INFINITE`].
        timeout_ms: u32,
    },
    /// VipConnectRequest.
    Connect {
        /// The requesting VI.
        me: Endpoint,
        /// Requester's address.
        local: NetAddr,
        /// Server's address.
        remote: NetAddr,
        /// Milliseconds, or [`INFINITE`].
        timeout_ms: u32,
    },
    /// VipConnectAccept.
    Accept {
        /// Connection handle from `Incoming`.
        conn: u64,
        /// The accepting VI.
        me: Endpoint,
    },
    /// VipConnectReject, or an accept refused locally for `reason`.
    Reject {
        /// Connection handle from `Incoming`.
        conn: u64,
        /// What the requester is told.
        reason: Refusal,
    },
    /// VipConnectPeerRequest.
    PeerConnect {
        /// The requesting VI.
        me: Endpoint,
        /// Own address.
        local: NetAddr,
        /// Peer's address.
        remote: NetAddr,
        /// Milliseconds, or [`INFINITE`].
        timeout_ms: u32,
    },
    /// VipDisconnect: tell the peer of `peer` and wait for its ack.
    Disconnect {
        /// The remote end of the connection being closed.
        peer: Endpoint,
        /// The local end.
        me: Endpoint,
        /// The asynchronous error the peer's VI reports (the library's
        /// `ErrorCode` value): [`REASON_CONN_LOST`], or why the connection
        /// broke where only this side saw it (an RDMA protection violation
        /// at the peer, a message that found no receive there).
        reason: u8,
    },
    /// Ack of a `RemoteDisconnect` event (no reply).
    DisconnectAck {
        /// Token from the event.
        token: u64,
    },
    /// A sockets NIC opened on the interface with address `host` (IPv4):
    /// listen for connection requests from other hosts there, on
    /// [`crate::tcp::port`] (answer `Ok`, or `Refused(Limit)` if the port
    /// cannot be opened).
    OpenTcp {
        /// IPv4 address, 4 bytes.
        host: Vec<u8>,
    },
    /// VipNSGetHostByName.
    ResolveName {
        /// Host name.
        name: String,
    },
    /// VipNSGetHostByAddr.
    ResolveAddr {
        /// Host address.
        host: Vec<u8>,
    },
}

impl Request {
    /// The request's name, for messages.
    pub fn name(&self) -> &'static str {
        match self {
            Request::Hello { .. } => "Hello",
            Request::Publish { .. } => "Publish",
            Request::Retire { .. } => "Retire",
            Request::Fetch { .. } => "Fetch",
            Request::Listen { .. } => "Listen",
            Request::Connect { .. } => "Connect",
            Request::Accept { .. } => "Accept",
            Request::Reject { .. } => "Reject",
            Request::PeerConnect { .. } => "PeerConnect",
            Request::Disconnect { .. } => "Disconnect",
            Request::DisconnectAck { .. } => "DisconnectAck",
            Request::ResolveName { .. } => "ResolveName",
            Request::ResolveAddr { .. } => "ResolveAddr",
            Request::OpenTcp { .. } => "OpenTcp",
        }
    }
}

/// Messages from the daemon to a client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// Answer to `Hello`.
    Welcome {
        /// This client's session id.
        session: u64,
        /// This host's VIA address.
        host: Vec<u8>,
        /// This host's name.
        name: String,
        /// Which daemon this is.
        mode: DaemonMode,
        /// What the session may hold.
        limits: SessionLimits,
    },
    /// Success without data.
    Ok,
    /// Answer to `Fetch`: the fd is attached.
    Fd,
    /// A failure.
    Refused(Refusal),
    /// Answer to `Listen`: a request arrived.
    Incoming {
        /// Handle for `Accept`/`Reject`.
        conn: u64,
        /// The requesting VI.
        peer: Endpoint,
        /// Requester's address.
        remote: NetAddr,
    },
    /// Answer to `Connect`/`PeerConnect`: connected to `peer`.
    Connected {
        /// The other VI.
        peer: Endpoint,
    },
    /// Answer to `ResolveName`.
    Address {
        /// Host address.
        host: Vec<u8>,
    },
    /// Answer to `ResolveAddr`.
    Name {
        /// Host name.
        name: String,
    },
    /// Event: the process of `session` is gone.
    PeerDied {
        /// Its session.
        session: u64,
    },
    /// Event: the peer of one of my VIs disconnected; ack with `token`.
    RemoteDisconnect {
        /// My VI (NIC, slot, generation) as my endpoint described it.
        me: Endpoint,
        /// Ack token.
        token: u64,
        /// The `reason` of the peer's [`Request::Disconnect`].
        reason: u8,
    },
}

/// A frame that does not decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeError(pub &'static str);

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "malformed viad frame: {}", self.0)
    }
}

impl std::error::Error for DecodeError {}

pub(crate) struct W(pub(crate) Vec<u8>);

impl W {
    pub(crate) fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    pub(crate) fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub(crate) fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub(crate) fn bytes(&mut self, b: &[u8]) {
        self.u32(b.len() as u32);
        self.0.extend_from_slice(b);
    }
    fn key(&mut self, k: &ObjKey) {
        self.u8(k.kind as u8);
        self.u32(k.nic);
        self.u32(k.id);
        self.u32(k.generation);
    }
    pub(crate) fn addr(&mut self, a: &NetAddr) {
        self.bytes(&a.host);
        self.bytes(&a.discriminator);
    }
    fn ep(&mut self, e: &Endpoint) {
        self.u64(e.session);
        self.u32(e.nic);
        self.u32(e.vi);
        self.u32(e.vi_gen);
        self.u32(e.reliability);
        self.u32(e.mtu);
        self.u8(e.rdma_write as u8);
        self.u8(e.rdma_read as u8);
        self.bytes(&e.device);
    }
}

pub(crate) struct R<'a>(pub(crate) &'a [u8]);

impl<'a> R<'a> {
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.0.len() < n {
            return Err(DecodeError("short body"));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    pub(crate) fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    pub(crate) fn bool(&mut self) -> Result<bool, DecodeError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(DecodeError("bool")),
        }
    }
    pub(crate) fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    pub(crate) fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    pub(crate) fn bytes(&mut self, max: usize) -> Result<Vec<u8>, DecodeError> {
        let n = self.u32()? as usize;
        if n > max {
            return Err(DecodeError("field too long"));
        }
        Ok(self.take(n)?.to_vec())
    }
    fn string(&mut self, max: usize) -> Result<String, DecodeError> {
        String::from_utf8(self.bytes(max)?).map_err(|_| DecodeError("utf-8"))
    }
    fn key(&mut self) -> Result<ObjKey, DecodeError> {
        Ok(ObjKey {
            kind: ObjKind::try_from(self.u8()?)?,
            nic: self.u32()?,
            id: self.u32()?,
            generation: self.u32()?,
        })
    }
    pub(crate) fn addr(&mut self) -> Result<NetAddr, DecodeError> {
        Ok(NetAddr {
            host: self.bytes(MAX_HOST)?,
            discriminator: self.bytes(MAX_DISCRIMINATOR)?,
        })
    }
    fn ep(&mut self) -> Result<Endpoint, DecodeError> {
        Ok(Endpoint {
            session: self.u64()?,
            nic: self.u32()?,
            vi: self.u32()?,
            vi_gen: self.u32()?,
            reliability: self.u32()?,
            mtu: self.u32()?,
            rdma_write: self.bool()?,
            rdma_read: self.bool()?,
            device: self.bytes(MAX_DEVICE_BLOB)?,
        })
    }
    pub(crate) fn end(self) -> Result<(), DecodeError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(DecodeError("trailing bytes"))
        }
    }
}

fn frame(kind: u16, id: u32, body: W) -> Vec<u8> {
    let mut out = Vec::with_capacity(12 + body.0.len());
    out.extend_from_slice(&MAGIC.to_le_bytes());
    out.extend_from_slice(&kind.to_le_bytes());
    out.extend_from_slice(&id.to_le_bytes());
    out.extend_from_slice(&(body.0.len() as u32).to_le_bytes());
    out.extend_from_slice(&body.0);
    out
}

fn unframe(buf: &[u8]) -> Result<(u16, u32, R<'_>), DecodeError> {
    if buf.len() < 12 || buf.len() > MAX_FRAME {
        return Err(DecodeError("frame size"));
    }
    let mut r = R(buf);
    let magic = u16::from_le_bytes(r.take(2)?.try_into().unwrap());
    if magic != MAGIC {
        return Err(DecodeError("magic"));
    }
    let kind = u16::from_le_bytes(r.take(2)?.try_into().unwrap());
    let id = r.u32()?;
    let len = r.u32()? as usize;
    if len != r.0.len() {
        return Err(DecodeError("length"));
    }
    Ok((kind, id, r))
}

impl Request {
    /// Encodes with request id `id`.
    pub fn encode(&self, id: u32) -> Vec<u8> {
        let mut w = W(Vec::new());
        let kind = match self {
            Request::Hello { version } => {
                w.u32(*version);
                1
            }
            Request::Publish { key } => {
                w.key(key);
                2
            }
            Request::Retire { key } => {
                w.key(key);
                3
            }
            Request::Fetch { session, key } => {
                w.u64(*session);
                w.key(key);
                4
            }
            Request::Listen { local, timeout_ms } => {
                w.addr(local);
                w.u32(*timeout_ms);
                5
            }
            Request::Connect {
                me,
                local,
                remote,
                timeout_ms,
            } => {
                w.ep(me);
                w.addr(local);
                w.addr(remote);
                w.u32(*timeout_ms);
                6
            }
            Request::Accept { conn, me } => {
                w.u64(*conn);
                w.ep(me);
                7
            }
            Request::Reject { conn, reason } => {
                w.u64(*conn);
                w.u8(*reason as u8);
                8
            }
            Request::PeerConnect {
                me,
                local,
                remote,
                timeout_ms,
            } => {
                w.ep(me);
                w.addr(local);
                w.addr(remote);
                w.u32(*timeout_ms);
                9
            }
            Request::Disconnect { peer, me, reason } => {
                w.ep(peer);
                w.ep(me);
                w.u8(*reason);
                10
            }
            Request::DisconnectAck { token } => {
                w.u64(*token);
                11
            }
            Request::ResolveName { name } => {
                w.bytes(name.as_bytes());
                12
            }
            Request::ResolveAddr { host } => {
                w.bytes(host);
                13
            }
            Request::OpenTcp { host } => {
                w.bytes(host);
                14
            }
        };
        frame(kind, id, w)
    }

    /// Decodes a frame; returns the request id and the request.
    pub fn decode(buf: &[u8]) -> Result<(u32, Request), DecodeError> {
        let (kind, id, mut r) = unframe(buf)?;
        let req = match kind {
            1 => Request::Hello { version: r.u32()? },
            2 => Request::Publish { key: r.key()? },
            3 => Request::Retire { key: r.key()? },
            4 => Request::Fetch {
                session: r.u64()?,
                key: r.key()?,
            },
            5 => Request::Listen {
                local: r.addr()?,
                timeout_ms: r.u32()?,
            },
            6 => Request::Connect {
                me: r.ep()?,
                local: r.addr()?,
                remote: r.addr()?,
                timeout_ms: r.u32()?,
            },
            7 => Request::Accept {
                conn: r.u64()?,
                me: r.ep()?,
            },
            8 => Request::Reject {
                conn: r.u64()?,
                reason: Refusal::try_from(r.u8()?)?,
            },
            9 => Request::PeerConnect {
                me: r.ep()?,
                local: r.addr()?,
                remote: r.addr()?,
                timeout_ms: r.u32()?,
            },
            10 => Request::Disconnect {
                peer: r.ep()?,
                me: r.ep()?,
                reason: r.u8()?,
            },
            11 => Request::DisconnectAck { token: r.u64()? },
            12 => Request::ResolveName {
                name: r.string(MAX_NAME)?,
            },
            13 => Request::ResolveAddr {
                host: r.bytes(MAX_HOST)?,
            },
            14 => Request::OpenTcp {
                host: r.bytes(MAX_HOST)?,
            },
            _ => return Err(DecodeError("request kind")),
        };
        r.end()?;
        if id == 0 && !matches!(req, Request::Retire { .. } | Request::DisconnectAck { .. }) {
            return Err(DecodeError("request id 0"));
        }
        Ok((id, req))
    }
}

impl Reply {
    /// Encodes with id `id` (0 for events).
    pub fn encode(&self, id: u32) -> Vec<u8> {
        let mut w = W(Vec::new());
        let kind = match self {
            Reply::Welcome {
                session,
                host,
                name,
                mode,
                limits,
            } => {
                w.u64(*session);
                w.bytes(host);
                w.bytes(name.as_bytes());
                w.u8(*mode as u8);
                w.u64(limits.pin_process);
                w.u64(limits.pin_user);
                w.u64(limits.max_objects);
                1
            }
            Reply::Ok => 2,
            Reply::Fd => 3,
            Reply::Refused(r) => {
                w.u8(*r as u8);
                4
            }
            Reply::Incoming { conn, peer, remote } => {
                w.u64(*conn);
                w.ep(peer);
                w.addr(remote);
                5
            }
            Reply::Connected { peer } => {
                w.ep(peer);
                6
            }
            Reply::Address { host } => {
                w.bytes(host);
                7
            }
            Reply::Name { name } => {
                w.bytes(name.as_bytes());
                8
            }
            Reply::PeerDied { session } => {
                w.u64(*session);
                9
            }
            Reply::RemoteDisconnect { me, token, reason } => {
                w.ep(me);
                w.u64(*token);
                w.u8(*reason);
                10
            }
        };
        frame(kind, id, w)
    }

    /// Decodes a frame; returns the id and the reply or event.
    pub fn decode(buf: &[u8]) -> Result<(u32, Reply), DecodeError> {
        let (kind, id, mut r) = unframe(buf)?;
        let rep = match kind {
            1 => Reply::Welcome {
                session: r.u64()?,
                host: r.bytes(MAX_HOST)?,
                name: r.string(MAX_NAME)?,
                mode: DaemonMode::try_from(r.u8()?)?,
                limits: SessionLimits {
                    pin_process: r.u64()?,
                    pin_user: r.u64()?,
                    max_objects: r.u64()?,
                },
            },
            2 => Reply::Ok,
            3 => Reply::Fd,
            4 => Reply::Refused(Refusal::try_from(r.u8()?)?),
            5 => Reply::Incoming {
                conn: r.u64()?,
                peer: r.ep()?,
                remote: r.addr()?,
            },
            6 => Reply::Connected { peer: r.ep()? },
            7 => Reply::Address {
                host: r.bytes(MAX_HOST)?,
            },
            8 => Reply::Name {
                name: r.string(MAX_NAME)?,
            },
            9 => Reply::PeerDied { session: r.u64()? },
            10 => Reply::RemoteDisconnect {
                me: r.ep()?,
                token: r.u64()?,
                reason: r.u8()?,
            },
            _ => return Err(DecodeError("reply kind")),
        };
        r.end()?;
        Ok((id, rep))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ep() -> Endpoint {
        Endpoint {
            session: 9,
            nic: 1,
            vi: 2,
            vi_gen: 3,
            reliability: 4,
            mtu: 65536,
            rdma_write: true,
            rdma_read: false,
            device: 77u64.to_le_bytes().to_vec(),
        }
    }

    fn addr() -> NetAddr {
        NetAddr {
            host: vec![1, 2, 3, 4, 5, 6],
            discriminator: b"disc".to_vec(),
        }
    }

    #[test]
    fn every_request_round_trips() {
        let key = ObjKey {
            kind: ObjKind::Arena,
            nic: 0,
            id: 5,
            generation: 1,
        };
        let all = vec![
            Request::Hello { version: VERSION },
            Request::Publish { key },
            Request::Retire { key },
            Request::Fetch { session: 3, key },
            Request::Listen {
                local: addr(),
                timeout_ms: INFINITE,
            },
            Request::Connect {
                me: ep(),
                local: addr(),
                remote: addr(),
                timeout_ms: 10,
            },
            Request::Accept { conn: 8, me: ep() },
            Request::Reject {
                conn: 8,
                reason: Refusal::Reliability,
            },
            Request::PeerConnect {
                me: ep(),
                local: addr(),
                remote: addr(),
                timeout_ms: 0,
            },
            Request::Disconnect {
                peer: ep(),
                me: ep(),
                reason: 4,
            },
            Request::DisconnectAck { token: 4 },
            Request::ResolveName { name: "h".into() },
            Request::ResolveAddr { host: vec![1] },
        ];
        for r in all {
            assert_eq!(Request::decode(&r.encode(42)).unwrap(), (42, r));
        }
    }

    #[test]
    fn every_reply_round_trips() {
        let all = vec![
            Reply::Welcome {
                session: 1,
                host: vec![1, 2],
                name: "n".into(),
                mode: DaemonMode::System,
                limits: SessionLimits {
                    pin_process: 1 << 20,
                    pin_user: UNLIMITED,
                    max_objects: 7,
                },
            },
            Reply::Welcome {
                session: 2,
                host: vec![],
                name: String::new(),
                mode: DaemonMode::User,
                limits: SessionLimits::unpinned(1),
            },
            Reply::Refused(Refusal::Quota),
            Reply::Ok,
            Reply::Fd,
            Reply::Refused(Refusal::Timeout),
            Reply::Incoming {
                conn: 1,
                peer: ep(),
                remote: addr(),
            },
            Reply::Connected { peer: ep() },
            Reply::Address { host: vec![9] },
            Reply::Name { name: "x".into() },
            Reply::PeerDied { session: 5 },
            Reply::RemoteDisconnect {
                me: ep(),
                token: 6,
                reason: REASON_CONN_LOST,
            },
        ];
        for r in all {
            assert_eq!(Reply::decode(&r.encode(7)).unwrap(), (7, r));
        }
    }

    #[test]
    fn malformed_frames_are_errors() {
        let good = Request::Hello { version: 1 }.encode(1);
        assert!(Request::decode(&good[..good.len() - 1]).is_err());
        let mut bad = good.clone();
        bad[0] ^= 1;
        assert_eq!(Request::decode(&bad), Err(DecodeError("magic")));
        let mut extra = good.clone();
        extra.push(0);
        assert!(Request::decode(&extra).is_err());
        assert!(Request::decode(&Request::Hello { version: 1 }.encode(0)).is_err());
        let long = Request::ResolveName {
            name: "x".repeat(300),
        }
        .encode(1);
        assert!(Request::decode(&long).is_err());
    }

    proptest! {
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = Request::decode(&bytes);
            let _ = Reply::decode(&bytes);
        }

        #[test]
        fn corrupted_frames_never_panic(flip in 0usize..200, val in any::<u8>()) {
            let mut f = Request::Connect { me: ep(), local: addr(), remote: addr(), timeout_ms: 5 }.encode(3);
            let i = flip % f.len();
            f[i] = val;
            let _ = Request::decode(&f);
        }
    }
}
