//! Connection requests from other hosts (the sockets NIC).
//!
//! When a process opens a sockets NIC on an interface, the library asks
//! viad to listen on that interface's IPv4 address and `$VIA_TCP_PORT`
//! (`Request::OpenTcp`). A requester on another host (or this one) connects
//! there and sends one `via_wire::tcp::SetupRequest`. Everything it sends
//! is untrusted: the request is bounded (`MAX_SETUP`), must arrive within
//! [`REQUEST_DEADLINE`], at most [`MAX_PENDING`] wait at once, and viad
//! never touches memory for it. The requester's host address must be the
//! TCP peer's address (the only thing checked about a remote host: nothing
//! is cryptographically authenticated).
//!
//! A complete request becomes a broker session of its own (`remote`: no
//! Hello, nobody watches it) that publishes the TCP connection as an
//! object (`ObjKind::Stream`) and sends a `Connect` like a local client.
//! The listener that accepts fetches the connection from viad, then
//! accepts through the broker; the broker's `Connected` (or `Refused`) to
//! the remote session becomes the `SetupAnswer` written here, and the
//! session ends (viad's copy of the connection is closed; the listener's
//! copy carries the data).

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use via_wire::proto::{Endpoint, ObjKey, ObjKind, Refusal, Reply, Request};
use via_wire::tcp::{self, SetupAnswer, SetupRequest};

use crate::broker::{Broker, Cred, Out};

/// How long a requester may take to send its request.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(5);
/// Requests from the network waiting at once (read, or matched and
/// waiting for a listener).
pub const MAX_PENDING: usize = 256;

/// The device part of the endpoint of a remote request: `b'T'` and the
/// broker session that holds the connection (the listener's library
/// fetches `stream_key()` of that session).
pub fn device_blob(session: u64) -> Vec<u8> {
    let mut b = vec![b'T'];
    b.extend_from_slice(&session.to_le_bytes());
    b
}

/// The object name of a remote session's TCP connection.
pub fn stream_key() -> ObjKey {
    ObjKey {
        kind: ObjKind::Stream,
        nic: 0,
        id: 0,
        generation: 0,
    }
}

/// A connection whose request has not fully arrived.
struct Unread {
    stream: TcpStream,
    got: Vec<u8>,
    deadline: Instant,
}

/// Listeners and requests from other hosts.
#[derive(Default)]
pub struct Tcp {
    listeners: Vec<(Vec<u8>, TcpListener)>,
    unread: HashMap<u64, Unread>,
    next_unread: u64,
    /// Remote sessions of the broker and their connections.
    sessions: HashMap<u64, TcpStream>,
    /// Remote sessions whose connection a listener fetched.
    fetched: std::collections::HashSet<u64>,
    /// Remote sessions answered (accepted) whose connection nobody fetched
    /// yet (a peer-to-peer match: the local side fetches it after hearing),
    /// kept until then or the deadline.
    answered: HashMap<u64, Instant>,
}

/// What `poll` should watch for this module.
#[derive(Clone, Copy)]
pub enum Watch {
    Listener(usize),
    Unread(u64),
    Session(u64),
}

impl Tcp {
    /// Opens the listener on `host` (IPv4, 4 bytes), if not open yet.
    pub fn open(&mut self, host: &[u8]) -> io::Result<()> {
        if self.listeners.iter().any(|(h, _)| h == host) {
            return Ok(());
        }
        let ip = Ipv4Addr::new(host[0], host[1], host[2], host[3]);
        let l = TcpListener::bind(SocketAddr::new(IpAddr::V4(ip), tcp::port()))?;
        l.set_nonblocking(true)?;
        log::info!("listening for other hosts on {}", l.local_addr()?);
        self.listeners.push((host.to_vec(), l));
        Ok(())
    }

    /// The fds to poll, with what each is.
    pub fn fds(&self, out: &mut Vec<(RawFd, Watch)>) {
        for (i, (_, l)) in self.listeners.iter().enumerate() {
            out.push((l.as_raw_fd(), Watch::Listener(i)));
        }
        for (&k, u) in &self.unread {
            out.push((u.stream.as_raw_fd(), Watch::Unread(k)));
        }
        for (&s, c) in &self.sessions {
            out.push((c.as_raw_fd(), Watch::Session(s)));
        }
    }

    /// The earliest request deadline.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.unread
            .values()
            .map(|u| u.deadline)
            .chain(self.answered.values().copied())
            .min()
    }

    fn pending(&self) -> usize {
        self.unread.len() + self.sessions.len() + self.answered.len()
    }

    /// Whether `s` is a remote session.
    pub fn is_session(&self, s: u64) -> bool {
        self.sessions.contains_key(&s)
    }

    /// Accepts what waits on listener `i`.
    pub fn accept(&mut self, i: usize) {
        loop {
            let Some((_, l)) = self.listeners.get(i) else {
                return;
            };
            match l.accept() {
                Ok((stream, peer)) => {
                    if self.pending() >= MAX_PENDING {
                        log::warn!("refusing {peer}: {MAX_PENDING} requests from the network wait");
                        continue;
                    }
                    if stream.set_nonblocking(true).is_err() {
                        continue;
                    }
                    log::debug!("connection request from {peer}");
                    let k = self.next_unread;
                    self.next_unread += 1;
                    self.unread.insert(
                        k,
                        Unread {
                            stream,
                            got: Vec::new(),
                            deadline: Instant::now() + REQUEST_DEADLINE,
                        },
                    );
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    log::warn!("accept on the TCP listener: {e}");
                    return;
                }
            }
        }
    }

    /// Reads more of request `k`; once complete, hands it to the broker.
    ///
    /// `uid`: the user requests are served as (the per-user daemon's); in
    /// system mode `None`: the requester's own, found by its socket.
    pub fn read(&mut self, k: u64, broker: &mut Broker, uid: Option<u32>, out: &mut Vec<Out>) {
        let Some(u) = self.unread.get_mut(&k) else {
            return;
        };
        let mut buf = [0u8; 4 + tcp::MAX_SETUP];
        let want = if u.got.len() < 4 {
            4 - u.got.len()
        } else {
            match tcp::body_len(u.got[..4].try_into().unwrap()) {
                Ok(n) => 4 + n - u.got.len(),
                Err(e) => {
                    log::warn!("request from the network: {e}; dropped");
                    self.unread.remove(&k);
                    return;
                }
            }
        };
        match u.stream.read(&mut buf[..want]) {
            Ok(0) => {
                self.unread.remove(&k);
                return;
            }
            Ok(n) => u.got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Err(_) => {
                self.unread.remove(&k);
                return;
            }
        }
        if u.got.len() < 4 {
            return;
        }
        let n = match tcp::body_len(u.got[..4].try_into().unwrap()) {
            Ok(n) => n,
            Err(e) => {
                log::warn!("request from the network: {e}; dropped");
                self.unread.remove(&k);
                return;
            }
        };
        if u.got.len() < 4 + n {
            return;
        }
        let u = self.unread.remove(&k).unwrap();
        let req = match SetupRequest::decode(&u.got[4..]) {
            Ok(r) => r,
            Err(e) => {
                log::warn!("request from the network: {e}; dropped");
                return;
            }
        };
        self.start(u.stream, req, broker, uid, out);
    }

    /// Checks a decoded request and enters it in the broker.
    fn start(
        &mut self,
        mut stream: TcpStream,
        req: SetupRequest,
        broker: &mut Broker,
        uid: Option<u32>,
        out: &mut Vec<Out>,
    ) {
        // The one thing checked about the other host: its address is the
        // one the kernel saw, and the request is for the address it reached.
        let (peer, here) = match (stream.peer_addr(), stream.local_addr()) {
            (Ok(SocketAddr::V4(p)), Ok(SocketAddr::V4(h))) => (p, h),
            _ => return,
        };
        if req.local.host != peer.ip().octets() || req.remote.host != here.ip().octets() {
            log::warn!(
                "request from {peer} says it comes from {:?} for {:?}: refused",
                req.local.host,
                req.remote.host
            );
            let _ = stream.write_all(&SetupAnswer::Refused(Refusal::Invalid).encode());
            return;
        }
        // The system daemon serves every user of this host: a request is
        // served as the user whose socket it came from, which the kernel
        // knows for connections within this host; another host's users are
        // not known (nothing authenticates them), so it serves none.
        let uid = match uid.or_else(|| local_owner(peer, here)) {
            Some(u) => u,
            None => {
                log::warn!(
                    "request from {peer}: not from this host, and the system daemon serves only this host's users: refused"
                );
                let _ = stream.write_all(&SetupAnswer::Refused(Refusal::Reject).encode());
                return;
            }
        };
        let Ok(dup) = stream.try_clone().map(OwnedFd::from) else {
            return;
        };
        let s = broker.open_remote_session(Cred { uid, pid: 0 });
        self.sessions.insert(s, stream);
        let now = Instant::now();
        out.extend(broker.on_request(s, 1, Request::Publish { key: stream_key() }, vec![dup], now));
        let me = Endpoint {
            session: s,
            nic: 0,
            vi: 0,
            vi_gen: 0,
            reliability: req.reliability,
            mtu: req.mtu,
            rdma_write: req.rdma_write,
            rdma_read: req.rdma_read,
            device: device_blob(s),
        };
        let r = if req.peer {
            Request::PeerConnect {
                me,
                local: req.local,
                remote: req.remote,
                timeout_ms: req.timeout_ms,
            }
        } else {
            Request::Connect {
                me,
                local: req.local,
                remote: req.remote,
                timeout_ms: req.timeout_ms,
            }
        };
        out.extend(broker.on_request(s, 2, r, Vec::new(), now));
    }

    /// The connection of remote session `s` was handed to a local process:
    /// `true` if the session is over.
    pub fn fetched(&mut self, s: u64) -> bool {
        if self.answered.remove(&s).is_some() {
            return true;
        }
        self.fetched.insert(s);
        false
    }

    /// Whether `s` is a remote session answered but not fetched yet.
    pub fn is_answered(&self, s: u64) -> bool {
        self.answered.contains_key(&s)
    }

    /// A reply of the broker to remote session `s`: `true` if the session
    /// is over (answered).
    pub fn reply(&mut self, s: u64, reply: &Reply) -> bool {
        let accepted = matches!(reply, Reply::Connected { .. });
        let answer = match reply {
            Reply::Connected { peer } => SetupAnswer::Accepted {
                reliability: peer.reliability,
                mtu: peer.mtu,
                rdma_write: peer.rdma_write,
                rdma_read: peer.rdma_read,
            },
            Reply::Refused(r) => SetupAnswer::Refused(*r),
            _ => return false,
        };
        if let Some(mut c) = self.sessions.remove(&s) {
            // A fresh connection's socket buffer takes these few bytes; the
            // listener sends nothing before the broker's `Ok` that follows.
            let _ = c.set_nonblocking(false);
            let _ = c.set_write_timeout(Some(Duration::from_secs(1)));
            if let Err(e) = c.write_all(&answer.encode()) {
                log::debug!("remote session {s}: answer lost: {e}");
            }
        }
        if accepted && !self.fetched.remove(&s) {
            self.answered.insert(s, Instant::now() + REQUEST_DEADLINE);
            return false;
        }
        self.fetched.remove(&s);
        true
    }

    /// Remote session `s` is readable: the requester sent more (not
    /// allowed before the answer) or gave up.
    pub fn readable(&mut self, s: u64) -> bool {
        let Some(c) = self.sessions.get_mut(&s) else {
            return false;
        };
        let mut b = [0u8; 1];
        match c.read(&mut b) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => false,
            _ => {
                self.sessions.remove(&s);
                true
            }
        }
    }

    /// Forgets remote session `s` (the broker ended it).
    pub fn end(&mut self, s: u64) {
        self.sessions.remove(&s);
        self.fetched.remove(&s);
        self.answered.remove(&s);
    }

    /// Drops requests past their deadline; returns the answered sessions
    /// whose connection nobody fetched in time (to end).
    pub fn expire(&mut self, now: Instant) -> Vec<u64> {
        self.unread.retain(|_, u| u.deadline > now);
        let late: Vec<u64> = self
            .answered
            .iter()
            .filter(|(_, t)| **t <= now)
            .map(|(&s, _)| s)
            .collect();
        for s in &late {
            self.answered.remove(s);
        }
        late
    }
}

/// The user owning the local TCP socket `peer` connected to `here` (both
/// ends on this host, in this network namespace), from the kernel's socket
/// table (`/proc/net/tcp`); `None` for a connection from another host.
fn local_owner(peer: std::net::SocketAddrV4, here: std::net::SocketAddrV4) -> Option<u32> {
    // The table prints an address as the in-memory u32 of its network-order
    // bytes, and the port in host order, both in hex.
    let fmt = |a: std::net::SocketAddrV4| {
        format!(
            "{:08X}:{:04X}",
            u32::from_ne_bytes(a.ip().octets()),
            a.port()
        )
    };
    let (local, remote) = (fmt(peer), fmt(here));
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    owner_in(&table, &local, &remote)
}

/// The uid column of the line of `table` with these local and remote
/// addresses.
fn owner_in(table: &str, local: &str, remote: &str) -> Option<u32> {
    table.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() > 7 && f[1] == local && f[2] == remote)
            .then(|| f[7].parse().ok())
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_owner_of_a_local_connection_is_read_from_the_socket_table() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (_s, _) = l.accept().unwrap();
        let (SocketAddr::V4(peer), SocketAddr::V4(here)) =
            (c.local_addr().unwrap(), l.local_addr().unwrap())
        else {
            panic!("IPv4")
        };
        assert_eq!(local_owner(peer, here), Some(via_sys::getuid()));
        // A peer that is not in the table: another host.
        let other = std::net::SocketAddrV4::new(Ipv4Addr::new(192, 0, 2, 7), 4000);
        assert_eq!(local_owner(other, here), None);
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   0: 0100007F:9C40 0100007F:1C02 01 00000000:00000000 00:00000000 00000000  1001        0 1234 1 0 20 4 30 10 -1\n";
        assert_eq!(
            owner_in(table, "0100007F:9C40", "0100007F:1C02"),
            Some(1001)
        );
        assert_eq!(owner_in(table, "0100007F:9C41", "0100007F:1C02"), None);
    }
}
