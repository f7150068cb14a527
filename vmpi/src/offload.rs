//! Offloaded collectives: seed 000's NIC-level forwarding, done by a
//! progress context. Each process gets a second set of channels (the
//! "collective microchannels") served by a progress thread, which blocks
//! on their completion queue and forwards barrier and broadcast messages
//! along the tree the moment they arrive, whether or not the application
//! is inside the call; the application only starts its part and waits for
//! its flag (seed 000's `CommStart`/`CommCheck`).
//!
//! * Barrier: gather and release over the binomial tree (the host-based
//!   `VMPI_BARRIER=tree` uses the same tree, for A/B).
//! * Broadcast up to [`MAX_BCAST`] bytes: binomial tree from the root;
//!   an intermediate process's thread forwards to its children as soon as
//!   the data arrives and keeps a copy for the application.
//!
//! Messages carry (context, sequence number): each communicator numbers
//! its offloaded collectives, so messages of a later call, or of a
//! communicator this process has not registered yet, wait in a table
//! instead of overtaking. The broadcast returns early at the root and is
//! not synchronising (the copy replaces seed 000's ACKs and busy COCE).
#![forbid(unsafe_code)]

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use via::Cq;

use crate::channel::{Channel, Shape};
use crate::coll::tree;
use crate::error::{Error, Result};
use crate::pmi::Pmi;
use crate::wire::{HEADER, Header, Kind};

/// Largest broadcast the progress context forwards.
pub const MAX_BCAST: usize = 8192 - HEADER;

/// How long the end of the job waits for the context's last messages.
const FINISH: Duration = Duration::from_secs(10);

const UP: u32 = 1;
const DOWN: u32 = 2;
const BCAST: u32 = 3;

#[derive(Default)]
struct Op {
    children_in: u32,
    entered: bool,
    sent_up: bool,
    released: bool,
    data: Option<Vec<u8>>,
}

struct CommInfo {
    group: Arc<Vec<u32>>,
    rank: u32,
}

struct State {
    channels: Vec<Option<Channel>>,
    by_vi: HashMap<u32, u32>,
    comms: HashMap<u32, CommInfo>,
    ops: HashMap<(u32, u32), Op>,
    next_seq: HashMap<u32, u32>,
    early: Vec<(Header, Vec<u8>)>,
    pending: Vec<VecDeque<(Header, Vec<u8>)>>,
    error: Option<Error>,
}

struct Shared {
    state: Mutex<State>,
    done: Condvar,
    stop: AtomicBool,
}

/// The offload context of a process.
pub struct Offload {
    shared: Arc<Shared>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// The context's own NIC, open until the context is dropped: closing
    /// it disconnects the channels and flushes their send queues, which
    /// [`Offload::stop`] must do only once the last messages are out (the
    /// progress thread used to own it, and closed it as it ended, before
    /// `stop` looked at what was still queued).
    _nic: via::Nic,
}

impl Offload {
    /// Connects the collective channels and starts the progress thread.
    ///
    /// # Errors
    /// The provider's.
    pub fn start(pmi: &mut Pmi) -> Result<Offload> {
        let shape = Shape {
            recv: 16,
            send: 16,
            slot: MAX_BCAST + HEADER,
        };
        let (nic, _ptag, cq, channels) =
            crate::engine::connect_all(pmi, "off", shape, true, false)?;
        let cq = cq.ok_or_else(|| Error::Intern("offload channels without a CQ".into()))?;
        let mut by_vi = HashMap::new();
        for ch in channels.iter().flatten() {
            by_vi.insert(ch.vi_slot(), ch.peer());
        }
        let n = channels.len();
        let mut comms = HashMap::new();
        comms.insert(
            0,
            CommInfo {
                group: Arc::new((0..pmi.size()).collect()),
                rank: pmi.rank(),
            },
        );
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                channels,
                by_vi,
                comms,
                ops: HashMap::new(),
                next_seq: HashMap::new(),
                early: Vec::new(),
                pending: (0..n).map(|_| VecDeque::new()).collect(),
                error: None,
            }),
            done: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("vmpi-offload".into())
            .spawn(move || run(&s, &cq))
            .map_err(|e| Error::Intern(format!("progress thread: {e}")))?;
        Ok(Offload {
            shared,
            thread: Mutex::new(Some(thread)),
            _nic: nic,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes communicator `context` known (messages for it may already wait).
    pub fn register(&self, context: u32, group: Arc<Vec<u32>>, rank: u32) {
        let mut st = self.lock();
        st.comms.insert(context, CommInfo { group, rank });
        let early = std::mem::take(&mut st.early);
        for (h, d) in early {
            handle(&mut st, h, d);
        }
        self.shared.done.notify_all();
    }

    fn start_op(&self, context: u32) -> (MutexGuard<'_, State>, u32) {
        let mut st = self.lock();
        let seq = st.next_seq.entry(context).or_insert(0);
        let s = *seq;
        *seq = seq.wrapping_add(1);
        (st, s)
    }

    /// Offloaded barrier on communicator `context`.
    ///
    /// # Errors
    /// A transport error met by the progress thread.
    pub fn barrier(&self, context: u32) -> Result<()> {
        let (mut st, seq) = self.start_op(context);
        st.ops.entry((context, seq)).or_default().entered = true;
        try_up(&mut st, context, seq);
        let mut st = self
            .shared
            .done
            .wait_while(st, |st| {
                st.ops.get(&(context, seq)).is_none_or(|o| !o.released)
            })
            .unwrap_or_else(|e| e.into_inner());
        // Released: done, even if a connection broke since (peers that
        // finished first disconnect).
        match st.ops.remove(&(context, seq)) {
            Some(o) if o.released => Ok(()),
            _ => st.error.clone().map_or(Ok(()), Err),
        }
    }

    /// Offloaded broadcast of `buf` (at most [`MAX_BCAST`] bytes) from `root`.
    ///
    /// # Errors
    /// `Truncate` if the root sent more than `buf` holds; transport errors.
    pub fn bcast(&self, context: u32, buf: &mut [u8], root: u32) -> Result<()> {
        let (mut st, seq) = self.start_op(context);
        let info = st.comms.get(&context).ok_or(Error::Comm)?;
        let (rank, p) = (info.rank, info.group.len() as u32);
        if rank == root {
            let mut h = Header::new(Kind::Offload);
            h.context = context;
            h.seq = seq;
            h.aux = BCAST;
            h.len = buf.len() as u64;
            h.source = root;
            forward_bcast(&mut st, context, &h, buf);
            return st.error.clone().map_or(Ok(()), Err);
        }
        let _ = p;
        st.ops.entry((context, seq)).or_default().entered = true;
        let mut st = self
            .shared
            .done
            .wait_while(st, |st| {
                st.ops.get(&(context, seq)).is_none_or(|o| o.data.is_none())
            })
            .unwrap_or_else(|e| e.into_inner());
        let Some(data) = st.ops.remove(&(context, seq)).and_then(|o| o.data) else {
            return Err(st
                .error
                .clone()
                .unwrap_or_else(|| Error::Intern("broadcast lost".into())));
        };
        let n = data.len().min(buf.len());
        buf[..n].copy_from_slice(&data[..n]);
        if data.len() > buf.len() {
            return Err(Error::Truncate {
                got: data.len() as u64,
                room: buf.len() as u64,
            });
        }
        Ok(())
    }

    /// Stops the progress thread.
    pub fn stop(&self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.lock().unwrap().take() {
            let _ = t.join();
        }
        // What the last operations sent (a barrier's release, a
        // broadcast's forwards) must arrive before the disconnect flushes
        // it: messages still waiting for credits go first (credits come by
        // RDMA write, no progress thread needed), then every send must
        // complete ([`Channel::finish_sends`]).
        let mut st = self.lock();
        let deadline = std::time::Instant::now() + FINISH;
        let mut b = crate::engine::Backoff::new();
        while flush(&mut st) {
            if std::time::Instant::now() > deadline {
                log::warn!("finalize: offloaded messages still wait for credits; dropped");
                break;
            }
            b.snooze();
        }
        for ch in st.channels.iter_mut().flatten() {
            if let Err(e) = ch.finish_sends(deadline) {
                log::debug!("offload finish: {e}");
            }
        }
        for ch in st.channels.iter().flatten() {
            ch.disconnect();
        }
    }
}

/// Sends `h`+`data` to world rank `to`, or queues it behind earlier ones.
fn send(st: &mut State, to: u32, h: Header, data: &[u8]) {
    let q = &mut st.pending[to as usize];
    if q.is_empty() {
        if let Some(ch) = st.channels[to as usize].as_mut() {
            if ch.can_send() {
                let mut h = h;
                if let Err(e) = ch.send(&mut h, data) {
                    st.error.get_or_insert(e);
                }
                return;
            }
        }
    }
    st.pending[to as usize].push_back((h, data.to_vec()));
}

fn flush(st: &mut State) -> bool {
    let mut left = false;
    for to in 0..st.pending.len() {
        while let Some((mut h, d)) = st.pending[to].pop_front() {
            let Some(ch) = st.channels[to].as_mut() else {
                break;
            };
            if !ch.can_send() {
                st.pending[to].push_front((h, d));
                left = true;
                break;
            }
            if let Err(e) = ch.send(&mut h, &d) {
                st.error.get_or_insert(e);
            }
        }
    }
    left
}

fn info(st: &State, context: u32) -> Option<(Arc<Vec<u32>>, u32)> {
    st.comms.get(&context).map(|c| (c.group.clone(), c.rank))
}

/// Sends the barrier's up message (or, at the root, the release) once the
/// application has entered and every child has arrived.
fn try_up(st: &mut State, context: u32, seq: u32) {
    let Some((group, rank)) = info(st, context) else {
        return;
    };
    let p = group.len() as u32;
    let kids = tree::children(rank, p, 2);
    let op = st.ops.entry((context, seq)).or_default();
    if !op.entered || op.sent_up || op.children_in < kids.len() as u32 {
        return;
    }
    op.sent_up = true;
    let mut h = Header::new(Kind::Offload);
    h.context = context;
    h.seq = seq;
    h.source = rank;
    match tree::parent(rank, 2) {
        Some(parent) => {
            h.aux = UP;
            send(st, group[parent as usize], h, &[]);
        }
        None => release(st, context, seq),
    }
}

/// Marks the barrier released here and forwards the release down.
fn release(st: &mut State, context: u32, seq: u32) {
    let Some((group, rank)) = info(st, context) else {
        return;
    };
    st.ops.entry((context, seq)).or_default().released = true;
    let mut h = Header::new(Kind::Offload);
    h.context = context;
    h.seq = seq;
    h.source = rank;
    h.aux = DOWN;
    for (c, _) in tree::children(rank, group.len() as u32, 2)
        .into_iter()
        .rev()
    {
        send(st, group[c as usize], h, &[]);
    }
}

fn forward_bcast(st: &mut State, context: u32, h: &Header, data: &[u8]) {
    let Some((group, rank)) = info(st, context) else {
        return;
    };
    let p = group.len() as u32;
    let root = h.source;
    let v = (rank + p - root) % p;
    for (c, _) in tree::children(v, p, 2).into_iter().rev() {
        send(st, group[((c + root) % p) as usize], *h, data);
    }
}

/// A message of the progress context.
fn handle(st: &mut State, h: Header, data: Vec<u8>) {
    if !st.comms.contains_key(&h.context) {
        st.early.push((h, data));
        return;
    }
    let key = (h.context, h.seq);
    match h.aux {
        UP => {
            st.ops.entry(key).or_default().children_in += 1;
            try_up(st, h.context, h.seq);
        }
        DOWN => release(st, h.context, h.seq),
        BCAST => {
            forward_bcast(st, h.context, &h, &data);
            st.ops.entry(key).or_default().data = Some(data);
        }
        _ => log::warn!("offload: unknown message {}", h.aux),
    }
}

fn on_cq(st: &mut State, vi: u32, recv: bool) -> Result<()> {
    let Some(&peer) = st.by_vi.get(&vi) else {
        return Ok(());
    };
    let ch = st.channels[peer as usize].as_mut().expect("channel");
    if recv {
        if let Some(i) = ch.recv_done()? {
            let h = *ch.header();
            let mut data = vec![0u8; (h.len as usize).min(MAX_BCAST)];
            ch.read_data(i, &h, 0, &mut data)?;
            ch.repost(i)?;
            ch.return_credits(false)?;
            handle(st, h, data);
        }
    } else {
        // Send queues are not on the CQ (reaped when their slots run out).
        ch.reap()?;
    }
    Ok(())
}

/// The progress thread: waits on the collective channels' CQ, forwards.
fn run(shared: &Shared, cq: &Cq) {
    let mut idle = Duration::from_millis(50);
    while !shared.stop.load(Ordering::Acquire) {
        let got = cq.wait(Some(idle));
        let mut st = shared.state.lock().unwrap_or_else(|e| e.into_inner());
        let mut r = match got {
            Ok((vi, recv)) => on_cq(&mut st, vi, recv),
            Err(e) if e.kind() == via::ErrorKind::Timeout => Ok(()),
            Err(e) => Err(e.into()),
        };
        while r.is_ok() {
            match cq.done() {
                Ok((vi, recv)) => r = on_cq(&mut st, vi, recv),
                Err(_) => break,
            }
        }
        // Credits come back by RDMA write, without a completion: poll
        // while something waits for them.
        idle = if flush(&mut st) {
            Duration::from_micros(100)
        } else {
            Duration::from_millis(50)
        };
        if let Err(e) = r {
            // A peer that finished first disconnects; a peer that died ends
            // the job (the launcher), so waits go on: the error is logged.
            if !shared.stop.load(Ordering::Acquire) {
                log::debug!("offload progress: {e}");
            }
        }
        shared.done.notify_all();
    }
}
