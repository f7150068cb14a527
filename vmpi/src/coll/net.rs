//! Internal messages of one collective call: the engine held for the
//! call, the communicator's collective context, ranks of the communicator.
//!
//! Slices are lent to the engine only here, and every request started
//! through a [`Net`] is waited for before the call returns ([`Net::finish`]
//! or drop), which is the crate rule of [`crate::buffer`]. A truncation
//! (a peer sent more than this process expected: counts differ between
//! the processes) is remembered and the algorithm goes on, so that no
//! process is left waiting; the call then returns `Truncate`.
#![forbid(unsafe_code)]

use doorbell::BiasedGuard;

use crate::buffer::UserBuf;
use crate::comm::Comm;
use crate::engine::{Engine, ReqId};
use crate::error::{Error, Result};

/// The engine and communicator of one collective call.
pub struct Net<'a> {
    e: BiasedGuard<'a, Engine>,
    context: u32,
    group: &'a [u32],
    rank: u32,
    live: Vec<ReqId>,
    err: Option<Error>,
}

impl<'a> Net<'a> {
    /// Takes the engine for a collective on `comm`.
    pub fn new(comm: &'a Comm) -> Net<'a> {
        let mut e = comm.engine();
        // The list of live requests is the engine's, kept between calls.
        let live = std::mem::take(&mut e.spare_ids);
        Net {
            e,
            context: comm.context + 1,
            group: &comm.group[..],
            rank: comm.rank,
            live,
            err: None,
        }
    }

    /// This process's rank.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Members.
    pub fn size(&self) -> u32 {
        self.group.len() as u32
    }

    /// Starts sending `buf` to member `to`.
    pub fn isend(&mut self, buf: &[u8], to: u32, tag: i32) -> Result<ReqId> {
        let id = self.e.isend(
            self.context,
            self.rank,
            self.group[to as usize],
            tag,
            UserBuf::lend(buf),
        )?;
        self.live.push(id);
        Ok(id)
    }

    /// Starts receiving into `buf` from member `from`.
    pub fn irecv(&mut self, buf: &mut [u8], from: u32, tag: i32) -> Result<ReqId> {
        let id = self
            .e
            .irecv(self.context, Some(from), Some(tag), UserBuf::lend_mut(buf))?;
        self.live.push(id);
        Ok(id)
    }

    /// Waits for `id`; a truncation is remembered, not returned.
    pub fn wait(&mut self, id: ReqId) -> Result<u64> {
        self.live.retain(|&x| x != id);
        let (st, _, err) = self.e.wait(id)?;
        if let Some(e) = err {
            self.err.get_or_insert(e);
        }
        Ok(st.bytes)
    }

    /// Waits for every request of `ids`.
    pub fn wait_all(&mut self, ids: &[ReqId]) -> Result<()> {
        for &id in ids {
            self.wait(id)?;
        }
        Ok(())
    }

    /// Sends (blocking).
    pub fn send(&mut self, buf: &[u8], to: u32, tag: i32) -> Result<()> {
        let to = self.group[to as usize];
        self.e.send(self.context, self.rank, to, tag, buf)
    }

    /// Receives (blocking); the bytes received. Direct (no request) when
    /// nothing else is posted ([`Engine::recv`]).
    pub fn recv(&mut self, buf: &mut [u8], from: u32, tag: i32) -> Result<u64> {
        let (st, err) = self.e.recv(self.context, Some(from), Some(tag), buf)?;
        if let Some(e) = err {
            self.err.get_or_insert(e);
        }
        Ok(st.bytes)
    }

    /// Exchanges with two members at once.
    pub fn sendrecv(
        &mut self,
        sbuf: &[u8],
        to: u32,
        rbuf: &mut [u8],
        from: u32,
        tag: i32,
    ) -> Result<()> {
        // An eager message that can go at once goes first, with no request;
        // then the receive, direct when nothing else is posted.
        let world = self.group[to as usize];
        if self.e.send_now(self.context, self.rank, world, tag, sbuf)? {
            self.recv(rbuf, from, tag)?;
            return Ok(());
        }
        // Otherwise the receive is posted first, so the blocking send (a
        // request) never waits on a peer that waits on us.
        let r = self.irecv(rbuf, from, tag)?;
        self.send(sbuf, to, tag)?;
        self.wait(r)?;
        Ok(())
    }

    /// Records an error found by this process (the call goes on).
    pub fn note(&mut self, e: Error) {
        self.err.get_or_insert(e);
    }

    /// Ends the call: waits for anything left, returns the first error.
    pub fn finish(mut self) -> Result<()> {
        self.drain();
        match self.err.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn drain(&mut self) {
        while let Some(id) = self.live.pop() {
            if self.e.wait(id).is_err() {
                // A broken connection completes nothing more; give up the
                // rest (they hold no slice once their channel is gone).
                break;
            }
        }
    }
}

impl Drop for Net<'_> {
    fn drop(&mut self) {
        self.drain();
        self.live.clear();
        self.e.spare_ids = std::mem::take(&mut self.live);
    }
}
