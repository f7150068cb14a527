//! Connection management: client/server and peer-to-peer, brokered by viad.
//!
//! Client/server: the server's `VipConnectWait` asks viad for the next
//! request on its discriminator; the client's `VipConnectRequest` waits
//! until a server accepts, rejects, or the timeout passes (viad keeps the
//! deadline, so both sides agree on the outcome). The server checks the
//! reliability levels before accepting. Peer-to-peer: both sides ask viad,
//! which matches the pair (each one's remote address is the other's local
//! address) and checks the levels.
#![forbid(unsafe_code)]

use std::sync::Arc;
use std::time::Duration;

use crate::attrs::{Ptag, Reliability, ViAttributes};
use crate::error::{Error, Result};
use crate::nic::{Incoming, NicInner};
use crate::proto::{self, Endpoint, NetAddr, Refusal, Reply, Request};
use crate::vi::ViCore;

/// `VIP_INFINITE` as a duration: `None`.
pub fn timeout_ms(t: Option<Duration>) -> u32 {
    match t {
        None => proto::INFINITE,
        Some(d) => d.as_millis().min((proto::INFINITE - 1) as u128) as u32,
    }
}

/// The attributes of the remote VI as `VipConnect*` report them.
pub fn remote_attributes(ep: &Endpoint) -> ViAttributes {
    ViAttributes {
        reliability: Reliability::from_bits(ep.reliability).unwrap_or(Reliability::Unreliable),
        max_transfer_size: ep.mtu,
        qos: 0,
        ptag: Ptag(0),
        enable_rdma_write: ep.rdma_write,
        enable_rdma_read: ep.rdma_read,
    }
}

fn check_addr(a: &NetAddr) -> Result<()> {
    if a.host.len() > proto::MAX_HOST || a.discriminator.len() > proto::MAX_DISCRIMINATOR {
        return Err(Error::InvalidParameter);
    }
    Ok(())
}

fn refused(r: Reply) -> Error {
    match r {
        Reply::Refused(r) => Error::from(r),
        other => {
            log::error!("unexpected answer from viad: {other:?}");
            Error::resource(format!("unexpected answer from viad: {other:?}"))
        }
    }
}

fn viad_gone(e: std::io::Error) -> Error {
    log::error!("viad: {e}");
    Error::failed("asking viad", e)
}

/// `VipConnectWait`: the next request for `local`. Returns the connection
/// handle (slot, generation), the requester's address and VI attributes.
pub fn wait(
    nic: &NicInner,
    local: NetAddr,
    timeout: Option<Duration>,
) -> Result<((u32, u16), NetAddr, ViAttributes)> {
    check_addr(&local)?;
    let req = Request::Listen {
        local,
        timeout_ms: timeout_ms(timeout),
    };
    match nic.process.agent()?.call(&req, None).map_err(viad_gone)?.0 {
        Reply::Incoming { conn, peer, remote } => {
            let attrs = remote_attributes(&peer);
            let h = nic
                .conns
                .lock()
                .unwrap()
                .insert(Incoming { conn, peer })
                .ok_or(Error::Resource)?;
            Ok((h, remote, attrs))
        }
        other => Err(refused(other)),
    }
}

/// `VipConnectAccept`.
pub fn accept(nic: &NicInner, conn: (u32, u16), vi: &Arc<ViCore>) -> Result<()> {
    let agent = nic.process.agent()?;
    let inc = nic
        .conns
        .lock()
        .unwrap()
        .remove(conn.0, conn.1)
        .ok_or(Error::InvalidParameter)?;
    if let Err(e) = vi.begin_connect() {
        // Keep the request: the server may accept it with another VI.
        let _ = nic.conns.lock().unwrap().insert(inc);
        return Err(e);
    }
    if vi.reliability().bits() != inc.peer.reliability {
        vi.abort_connect();
        let _ = agent.call(
            &Request::Reject {
                conn: inc.conn,
                reason: Refusal::Reliability,
            },
            None,
        );
        return Err(Error::InvalidReliabilityLevel);
    }
    // Set up our side before telling the peer we accept: once it hears, it
    // may send.
    match nic.dev.connect(nic, vi, &inc.peer) {
        Ok(()) => {}
        Err(e) => {
            vi.abort_connect();
            let _ = agent.call(
                &Request::Reject {
                    conn: inc.conn,
                    reason: Refusal::Reject,
                },
                None,
            );
            return Err(e);
        }
    }
    let me = vi.endpoint(nic);
    match agent.call(&Request::Accept { conn: inc.conn, me }, None) {
        Ok((Reply::Ok, _)) => {
            vi.install(nic, &inc.peer);
            Ok(())
        }
        Ok((other, _)) => {
            nic.dev.disconnect(nic, vi, false);
            vi.abort_connect();
            Err(refused(other))
        }
        Err(e) => {
            nic.dev.disconnect(nic, vi, false);
            vi.abort_connect();
            Err(viad_gone(e))
        }
    }
}

/// `VipConnectReject`.
pub fn reject(nic: &NicInner, conn: (u32, u16)) -> Result<()> {
    let inc = nic
        .conns
        .lock()
        .unwrap()
        .remove(conn.0, conn.1)
        .ok_or(Error::InvalidParameter)?;
    match nic
        .process
        .agent()?
        .call(
            &Request::Reject {
                conn: inc.conn,
                reason: Refusal::Reject,
            },
            None,
        )
        .map_err(viad_gone)?
        .0
    {
        // The requester may have given up already; rejecting is still done.
        Reply::Ok | Reply::Refused(Refusal::Gone) => Ok(()),
        other => Err(refused(other)),
    }
}

/// `VipConnectRequest`: returns the server VI's attributes.
pub fn request(
    nic: &NicInner,
    vi: &Arc<ViCore>,
    local: NetAddr,
    remote: NetAddr,
    timeout: Option<Duration>,
) -> Result<ViAttributes> {
    check_addr(&local)?;
    check_addr(&remote)?;
    vi.begin_connect()?;
    // A kind of NIC that reaches other hosts asks their viad itself.
    if let Some(answer) = nic
        .dev
        .request_connection(nic, vi, &local, &remote, timeout)
    {
        return match answer {
            Ok(peer) => finish(nic, vi, Ok(Reply::Connected { peer })),
            Err(e) => {
                vi.abort_connect();
                Err(e)
            }
        };
    }
    let agent = match nic.process.agent() {
        Ok(a) => a,
        Err(e) => {
            vi.abort_connect();
            return Err(e);
        }
    };
    let req = Request::Connect {
        me: vi.endpoint(nic),
        local,
        remote,
        timeout_ms: timeout_ms(timeout),
    };
    let answer = agent.call(&req, None);
    finish(nic, vi, answer.map(|a| a.0))
}

fn finish(
    nic: &NicInner,
    vi: &Arc<ViCore>,
    answer: std::io::Result<Reply>,
) -> Result<ViAttributes> {
    match answer {
        Ok(Reply::Connected { peer }) => {
            if peer.reliability != vi.reliability().bits() {
                vi.abort_connect();
                return Err(Error::InvalidReliabilityLevel);
            }
            if let Err(e) = vi.complete_connect(nic, &peer) {
                vi.abort_connect();
                // The peer accepted and may use the connection already: it
                // hears that it is lost, as if we had disconnected.
                if let Err(d) = vi.tell_peer_lost(nic, peer) {
                    log::warn!("connect: the peer of a connection that failed was not told ({d})");
                }
                return Err(e);
            }
            Ok(remote_attributes(&peer))
        }
        Ok(other) => {
            vi.abort_connect();
            Err(refused(other))
        }
        Err(e) => {
            vi.abort_connect();
            Err(viad_gone(e))
        }
    }
}

/// `VipConnectPeerRequest`: starts a peer-to-peer connection.
pub fn peer_request(
    nic: &NicInner,
    vi: &Arc<ViCore>,
    local: NetAddr,
    remote: NetAddr,
    timeout: Option<Duration>,
) -> Result<()> {
    check_addr(&local)?;
    check_addr(&remote)?;
    vi.begin_connect()?;
    // A kind of NIC that reaches other hosts may ask their viad itself.
    if let Some(r) = nic.dev.request_peer(nic, vi, &local, &remote, timeout) {
        return match r {
            Ok(p) => {
                vi.state.lock().unwrap().peer_request = Some(p);
                Ok(())
            }
            Err(e) => {
                vi.abort_connect();
                Err(e)
            }
        };
    }
    let agent = match nic.process.agent() {
        Ok(a) => a,
        Err(e) => {
            vi.abort_connect();
            return Err(e);
        }
    };
    let req = Request::PeerConnect {
        me: vi.endpoint(nic),
        local,
        remote,
        timeout_ms: timeout_ms(timeout),
    };
    match agent.request(&req, None) {
        Ok(p) => {
            vi.state.lock().unwrap().peer_request = Some(p);
            Ok(())
        }
        Err(e) => {
            vi.abort_connect();
            Err(viad_gone(e))
        }
    }
}

/// `VipConnectPeerDone` (`block == false`) / `VipConnectPeerWait`.
pub fn peer_done(nic: &NicInner, vi: &Arc<ViCore>, block: bool) -> Result<ViAttributes> {
    let pending = vi
        .state
        .lock()
        .unwrap()
        .peer_request
        .take()
        .ok_or(Error::InvalidState)?;
    let answer = if block {
        pending.wait()
    } else {
        match pending.poll() {
            Ok(Some(a)) => Ok(a),
            Ok(None) => {
                vi.state.lock().unwrap().peer_request = Some(pending);
                return Err(Error::NotDone);
            }
            Err(e) => Err(e),
        }
    };
    finish(nic, vi, answer.map(|a| a.0))
}
