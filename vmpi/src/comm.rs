//! Communicators: a group of processes and a context id. Point-to-point
//! operations, communicator management (dup, split) and the entry points
//! of the collectives.
//!
//! A communicator owns two contexts: `2k` for point-to-point messages and
//! `2k + 1` for the collectives' internal messages, so user messages never
//! match collective ones (seed 000's reserved collective tags).
#![forbid(unsafe_code)]

use std::sync::Arc;

use crate::buffer::UserBuf;
use crate::datatype::Element;
use crate::engine::{Engine, ReqId, Status};
use crate::error::{Error, Result};
use crate::op::Op;
use crate::world::Inner;

/// `ANY_SOURCE` / `ANY_TAG` in the Rust API are `None`.
pub const TAG_UB: i32 = (1 << 30) - 1;

/// A communicator.
#[derive(Clone)]
pub struct Comm {
    pub(crate) world: Arc<Inner>,
    /// Base context id (even).
    pub(crate) context: u32,
    /// World rank of each member.
    pub(crate) group: Arc<Vec<u32>>,
    pub(crate) rank: u32,
}

/// A non-blocking operation on an owned buffer.
pub struct Request {
    world: Arc<Inner>,
    id: ReqId,
}

impl Request {
    /// Waits; returns the buffer and the status.
    ///
    /// # Errors
    /// `Truncate` (the buffer then holds the message's first bytes) or the
    /// transport's errors.
    pub fn wait(self) -> Result<(Vec<u8>, Status)> {
        let (st, buf, err) = self.world.engine().wait(self.id)?;
        match err {
            Some(e) => Err(e),
            None => Ok((buf.into_vec().unwrap_or_default(), st)),
        }
    }
}

fn check_tag(tag: i32) -> Result<()> {
    if (0..=TAG_UB).contains(&tag) {
        Ok(())
    } else {
        Err(Error::Tag(tag))
    }
}

impl Comm {
    pub(crate) fn world(world: Arc<Inner>, rank: u32, size: u32) -> Comm {
        Comm::new(world, 0, Arc::new((0..size).collect()), rank)
    }

    pub(crate) fn new(world: Arc<Inner>, context: u32, group: Arc<Vec<u32>>, rank: u32) -> Comm {
        Comm {
            world,
            context,
            group,
            rank,
        }
    }

    /// This process's rank.
    pub fn rank(&self) -> i32 {
        self.rank as i32
    }

    /// How many of this process's connections take messages through a
    /// write ring (`crate::channel`): 1 in a two-process job on a NIC that
    /// stores a write's last word last, unless `VMPI_RING=off`; else 0.
    pub fn write_rings(&self) -> usize {
        self.world.engine().write_rings()
    }

    /// Members.
    pub fn size(&self) -> i32 {
        self.group.len() as i32
    }

    /// The world rank of member `r`.
    #[inline]
    pub(crate) fn world_rank(&self, r: i32) -> Result<u32> {
        usize::try_from(r)
            .ok()
            .and_then(|r| self.group.get(r).copied())
            .ok_or(Error::Rank(r))
    }

    pub(crate) fn engine(&self) -> doorbell::BiasedGuard<'_, Engine> {
        self.world.engine()
    }

    /// Starts a send of `buf` (crate level: the buffer's contract is the caller's).
    pub(crate) fn isend_buf(&self, buf: UserBuf, dest: i32, tag: i32) -> Result<ReqId> {
        check_tag(tag)?;
        let to = self.world_rank(dest)?;
        self.engine().isend(self.context, self.rank, to, tag, buf)
    }

    /// A receive's source and tag checked (`None`: any); the source as the
    /// engine matches it.
    #[inline]
    fn recv_filter(&self, source: Option<i32>, tag: Option<i32>) -> Result<Option<u32>> {
        if let Some(t) = tag {
            check_tag(t)?;
        }
        match source {
            Some(s) => {
                self.world_rank(s)?;
                Ok(Some(s as u32))
            }
            None => Ok(None),
        }
    }

    /// Starts a receive into `buf` (`None`: any source / any tag).
    pub(crate) fn irecv_buf(
        &self,
        buf: UserBuf,
        source: Option<i32>,
        tag: Option<i32>,
    ) -> Result<ReqId> {
        let src = self.recv_filter(source, tag)?;
        self.engine().irecv(self.context, src, tag, buf)
    }

    /// Sends bytes (blocking: returns when `buf` may be reused).
    ///
    /// # Errors
    /// `Rank`, `Tag`, or the transport's errors.
    #[inline]
    pub fn send_bytes(&self, buf: &[u8], dest: i32, tag: i32) -> Result<()> {
        check_tag(tag)?;
        let to = self.world_rank(dest)?;
        self.engine().send(self.context, self.rank, to, tag, buf)
    }

    /// Receives bytes (blocking); `None` for any source or any tag.
    ///
    /// # Errors
    /// `Truncate` if the message is longer than `buf` (which then holds its
    /// first bytes); `Rank`, `Tag`; the transport's errors.
    pub fn recv_bytes(
        &self,
        buf: &mut [u8],
        source: Option<i32>,
        tag: Option<i32>,
    ) -> Result<Status> {
        let (st, err) = self.recv_status(buf, source, tag)?;
        err.map_or(Ok(st), Err)
    }

    /// Receives bytes (blocking): the status, and the message's error
    /// (truncation) apart, for `MPI_Recv`'s status.
    #[inline]
    pub(crate) fn recv_status(
        &self,
        buf: &mut [u8],
        source: Option<i32>,
        tag: Option<i32>,
    ) -> Result<(Status, Option<Error>)> {
        let src = self.recv_filter(source, tag)?;
        self.engine().recv(self.context, src, tag, buf)
    }

    /// Sends a slice of elements.
    ///
    /// # Errors
    /// As [`Comm::send_bytes`].
    pub fn send<T: Element>(&self, buf: &[T], dest: i32, tag: i32) -> Result<()> {
        self.send_bytes(bytemuck::cast_slice(buf), dest, tag)
    }

    /// Receives a slice of elements.
    ///
    /// # Errors
    /// As [`Comm::recv_bytes`].
    pub fn recv<T: Element>(
        &self,
        buf: &mut [T],
        source: Option<i32>,
        tag: Option<i32>,
    ) -> Result<Status> {
        self.recv_bytes(bytemuck::cast_slice_mut(buf), source, tag)
    }

    /// Starts a send of an owned buffer.
    ///
    /// # Errors
    /// `Rank`, `Tag`.
    pub fn isend(&self, buf: Vec<u8>, dest: i32, tag: i32) -> Result<Request> {
        Ok(Request {
            world: self.world.clone(),
            id: self.isend_buf(UserBuf::owned(buf), dest, tag)?,
        })
    }

    /// Starts a receive into an owned buffer.
    ///
    /// # Errors
    /// `Rank`, `Tag`.
    pub fn irecv(&self, buf: Vec<u8>, source: Option<i32>, tag: Option<i32>) -> Result<Request> {
        Ok(Request {
            world: self.world.clone(),
            id: self.irecv_buf(UserBuf::owned(buf), source, tag)?,
        })
    }

    /// Waits for a matching message and returns its status (`MPI_Probe`).
    ///
    /// # Errors
    /// `Rank`, `Tag`; the transport's errors.
    pub fn probe(&self, source: Option<i32>, tag: Option<i32>) -> Result<Status> {
        let src = self.probe_args(source, tag)?;
        self.engine().probe(self.context, src, tag)
    }

    /// A matching message's status if one is there (`MPI_Iprobe`).
    ///
    /// # Errors
    /// As [`Comm::probe`].
    pub fn iprobe(&self, source: Option<i32>, tag: Option<i32>) -> Result<Option<Status>> {
        let src = self.probe_args(source, tag)?;
        self.engine().iprobe(self.context, src, tag)
    }

    fn probe_args(&self, source: Option<i32>, tag: Option<i32>) -> Result<Option<u32>> {
        if let Some(t) = tag {
            check_tag(t)?;
        }
        source
            .map(|s| self.world_rank(s).map(|_| s as u32))
            .transpose()
    }

    /// Sends and receives at once (no deadlock between two processes that
    /// exchange).
    ///
    /// # Errors
    /// As send and receive.
    pub fn sendrecv_bytes(
        &self,
        send: &[u8],
        dest: i32,
        stag: i32,
        recv: &mut [u8],
        source: Option<i32>,
        rtag: Option<i32>,
    ) -> Result<Status> {
        let r = self.irecv_buf(UserBuf::lend_mut(recv), source, rtag)?;
        let s = self.isend_buf(UserBuf::lend(send), dest, stag);
        let mut e = self.engine();
        let s = match s {
            Ok(s) => s,
            Err(err) => {
                e.wait(r)?;
                return Err(err);
            }
        };
        let mut all = e.wait_all(&[r, s])?;
        let (st, _, err) = all.swap_remove(0);
        err.map_or(Ok(st), Err)
    }

    fn next_context(&self) -> Result<u32> {
        let mine = *self.world.next_context.lock().unwrap();
        let mut v = mine.to_ne_bytes().to_vec();
        let mut out = vec![0u8; 4];
        self.allreduce_bytes(
            &v,
            &mut out,
            crate::datatype::UNSIGNED,
            &Op::Builtin(crate::op::Builtin::Max),
        )?;
        v.copy_from_slice(&out);
        let ctx = u32::from_ne_bytes(out[..4].try_into().unwrap());
        *self.world.next_context.lock().unwrap() = ctx + 2;
        Ok(ctx)
    }

    /// A communicator with the same group and a new context (`MPI_Comm_dup`).
    ///
    /// # Errors
    /// The collective's errors.
    pub fn dup(&self) -> Result<Comm> {
        let ctx = self.next_context()?;
        let c = Comm::new(self.world.clone(), ctx, self.group.clone(), self.rank);
        c.register_offload();
        Ok(c)
    }

    /// Splits by `color`, ordering by `key` then rank (`MPI_Comm_split`);
    /// `None` for a negative color (`MPI_UNDEFINED`).
    ///
    /// # Errors
    /// The collective's errors.
    pub fn split(&self, color: i32, key: i32) -> Result<Option<Comm>> {
        let mine = [color.to_ne_bytes(), key.to_ne_bytes()].concat();
        let mut all = vec![0u8; 8 * self.group.len()];
        self.allgather_bytes(&mine, &mut all)?;
        let ctx = self.next_context()?;
        if color < 0 {
            return Ok(None);
        }
        let mut members: Vec<(i32, u32)> = Vec::new();
        for r in 0..self.group.len() {
            let c = i32::from_ne_bytes(all[8 * r..8 * r + 4].try_into().unwrap());
            let k = i32::from_ne_bytes(all[8 * r + 4..8 * r + 8].try_into().unwrap());
            if c == color {
                members.push((k, r as u32));
            }
        }
        members.sort();
        let group: Vec<u32> = members
            .iter()
            .map(|&(_, r)| self.group[r as usize])
            .collect();
        let rank = members.iter().position(|&(_, r)| r == self.rank).unwrap() as u32;
        let c = Comm::new(self.world.clone(), ctx, Arc::new(group), rank);
        c.register_offload();
        Ok(Some(c))
    }

    pub(crate) fn register_offload(&self) {
        if let Some(o) = &self.world.offload {
            o.register(self.context, self.group.clone(), self.rank);
        }
    }

    /// Seconds since an arbitrary time (`MPI_Wtime`).
    pub fn wtime(&self) -> f64 {
        self.world.start.elapsed().as_secs_f64()
    }
}
