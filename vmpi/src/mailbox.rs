//! Mailboxes between the threads of one process, without the NIC (seed
//! 003, DECK): a [`PostOffice`] holds named mailboxes, created on first use
//! by either side; [`Mailbox::post`] copies a message into a message object
//! and appends it (asynchronous, bounded: it waits while the mailbox is
//! full); [`Mailbox::retrieve`] takes the oldest message, copies it out and
//! keeps the object for reuse, so a steady exchange allocates nothing.
//!
//! DECK's two lists per mailbox are kept (the posted FIFO and the
//! recycled objects), with two changes: the recycled list is capped
//! ([`RECYCLE_CAP`]), and the posted FIFO is bounded ([`CAPACITY`]) so a
//! fast poster cannot exhaust memory. Waits block on condition variables
//! (no spinning: threads may outnumber cores).
#![forbid(unsafe_code)]

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Messages a mailbox holds before `post` waits.
pub const CAPACITY: usize = 1024;
/// Recycled message objects a mailbox keeps.
pub const RECYCLE_CAP: usize = 64;

#[derive(Default)]
struct Queues {
    posted: VecDeque<Vec<u8>>,
    recycled: Vec<Vec<u8>>,
    /// Message objects allocated (not taken from `recycled`).
    allocated: u64,
}

#[derive(Default)]
struct Inner {
    q: Mutex<Queues>,
    arrived: Condvar,
    room: Condvar,
}

/// A named mailbox (clones are the same mailbox).
#[derive(Clone)]
pub struct Mailbox {
    name: Arc<str>,
    inner: Arc<Inner>,
}

/// The mailboxes of a process (clones share them).
#[derive(Clone, Default)]
pub struct PostOffice {
    boxes: Arc<Mutex<HashMap<String, Mailbox>>>,
}

impl PostOffice {
    /// An empty post office.
    pub fn new() -> PostOffice {
        PostOffice::default()
    }

    /// The mailbox `name`, created if nobody used it yet.
    pub fn mailbox(&self, name: &str) -> Mailbox {
        self.boxes
            .lock()
            .unwrap()
            .entry(name.to_string())
            .or_insert_with(|| Mailbox {
                name: name.into(),
                inner: Arc::default(),
            })
            .clone()
    }
}

impl Mailbox {
    /// The mailbox's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Copies `msg` into a message object (a recycled one if any) and
    /// appends it; waits while the mailbox holds [`CAPACITY`] messages.
    pub fn post(&self, msg: &[u8]) {
        let mut q = self
            .inner
            .room
            .wait_while(self.inner.q.lock().unwrap(), |q| q.posted.len() >= CAPACITY)
            .unwrap();
        let mut obj = match q.recycled.pop() {
            Some(o) => o,
            None => {
                q.allocated += 1;
                Vec::with_capacity(msg.len())
            }
        };
        obj.clear();
        obj.extend_from_slice(msg);
        q.posted.push_back(obj);
        drop(q);
        self.inner.arrived.notify_one();
    }

    /// Takes the oldest message into `out` (resized to it), waiting for
    /// one; the message object is kept for reuse.
    pub fn retrieve(&self, out: &mut Vec<u8>) {
        self.retrieve_timeout(out, None);
    }

    /// As [`Mailbox::retrieve`], giving up after `timeout`; whether a
    /// message came.
    pub fn retrieve_timeout(&self, out: &mut Vec<u8>, timeout: Option<Duration>) -> bool {
        let q = self.inner.q.lock().unwrap();
        let mut q = match timeout {
            None => self
                .inner
                .arrived
                .wait_while(q, |q| q.posted.is_empty())
                .unwrap(),
            Some(t) => {
                self.inner
                    .arrived
                    .wait_timeout_while(q, t, |q| q.posted.is_empty())
                    .unwrap()
                    .0
            }
        };
        let Some(obj) = q.posted.pop_front() else {
            return false;
        };
        out.clear();
        out.extend_from_slice(&obj);
        if q.recycled.len() < RECYCLE_CAP {
            q.recycled.push(obj);
        }
        drop(q);
        self.inner.room.notify_one();
        true
    }

    /// Message objects allocated so far (the rest were recycled).
    pub fn allocated(&self) -> u64 {
        self.inner.q.lock().unwrap().allocated
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_exchange_in_order_and_objects_are_recycled() {
        let po = PostOffice::new();
        let (a, b) = (po.mailbox("ping"), po.mailbox("pong"));
        let po2 = po.clone();
        let t = std::thread::spawn(move || {
            // Created by the first user, whichever side it is.
            let (a, b) = (po2.mailbox("ping"), po2.mailbox("pong"));
            let mut m = Vec::new();
            for _ in 0..1000 {
                a.retrieve(&mut m);
                b.post(&m);
            }
        });
        let mut m = Vec::new();
        for i in 0u32..1000 {
            a.post(&i.to_le_bytes());
            b.retrieve(&mut m);
            assert_eq!(m, i.to_le_bytes());
        }
        t.join().unwrap();
        assert!(a.allocated() <= 2, "ping allocated {}", a.allocated());
        assert!(!a.retrieve_timeout(&mut m, Some(Duration::from_millis(1))));
    }

    #[test]
    fn many_posters_one_retriever_keep_each_posters_order() {
        let po = PostOffice::new();
        let mut ts = Vec::new();
        for p in 0u8..4 {
            let mb = po.mailbox("sink");
            ts.push(std::thread::spawn(move || {
                for i in 0u32..2000 {
                    mb.post(&[&[p][..], &i.to_le_bytes()].concat());
                }
            }));
        }
        let sink = po.mailbox("sink");
        let mut next = [0u32; 4];
        let mut m = Vec::new();
        for _ in 0..8000 {
            sink.retrieve(&mut m);
            let i = u32::from_le_bytes(m[1..5].try_into().unwrap());
            assert_eq!(i, next[m[0] as usize]);
            next[m[0] as usize] += 1;
        }
        for t in ts {
            t.join().unwrap();
        }
    }
}
