//! The launcher's side of the PMI protocol (see [`crate::pmi`]): one
//! thread per process, a shared key-value store, fences that release when
//! every process has fenced.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Condvar, Mutex};

/// What a process told the launcher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// It said hello (it initialised the library).
    Hello(u32),
    /// It asked to end the job with this code.
    Abort(u32, i32, String),
    /// It finished cleanly.
    Finalize(u32),
    /// Its connection closed (after any `Finalize` it sent).
    Closed(u32),
}

struct Store {
    pairs: HashMap<String, String>,
    /// Processes that have entered the current fence.
    arrived: u32,
    /// Completed fences.
    generation: u64,
}

/// The key-value service of one job.
pub struct Kvs {
    size: u32,
    store: Mutex<Store>,
    released: Condvar,
}

impl Kvs {
    /// Serves `listener` for a job of `size` processes; events go to `tx`
    /// (each followed by a wake-up of the launcher's signal wait).
    pub fn serve(listener: UnixListener, size: u32, tx: Sender<Event>) {
        let kvs = Arc::new(Kvs {
            size,
            store: Mutex::new(Store {
                pairs: HashMap::new(),
                arrived: 0,
                generation: 0,
            }),
            released: Condvar::new(),
        });
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let kvs = kvs.clone();
                let tx = tx.clone();
                std::thread::spawn(move || {
                    if let Err(e) = kvs.client(stream, &tx) {
                        log::debug!("PMI client: {e}");
                    }
                });
            }
        });
    }

    fn client(&self, stream: UnixStream, tx: &Sender<Event>) -> std::io::Result<()> {
        let mut w = stream.try_clone()?;
        let mut r = BufReader::new(stream);
        let mut line = String::new();
        let mut rank = u32::MAX;
        let send = |e: Event| {
            let _ = tx.send(e);
            super::sys::wake_launcher();
        };
        loop {
            line.clear();
            if r.read_line(&mut line)? == 0 {
                if rank != u32::MAX {
                    send(Event::Closed(rank));
                }
                return Ok(());
            }
            let mut words = line.trim_end().splitn(3, ' ');
            match (words.next(), words.next(), words.next()) {
                (Some("hello"), Some(n), None) => {
                    rank = n.parse().unwrap_or(u32::MAX);
                    send(Event::Hello(rank));
                }
                (Some("fence"), Some(n), None) => {
                    let n: usize = n.parse().unwrap_or(0);
                    let mut pairs = Vec::with_capacity(n);
                    for _ in 0..n {
                        line.clear();
                        if r.read_line(&mut line)? == 0 {
                            return Ok(());
                        }
                        if let Some((k, v)) = line.trim_end().split_once(' ') {
                            pairs.push((k.to_string(), v.to_string()));
                        }
                    }
                    let all = self.fence(pairs);
                    let mut out = format!("kvs {}\n", all.len());
                    for (k, v) in all {
                        out.push_str(&format!("{k} {v}\n"));
                    }
                    w.write_all(out.as_bytes())?;
                }
                (Some("abort"), Some(code), msg) => {
                    send(Event::Abort(
                        rank,
                        code.parse().unwrap_or(1),
                        msg.unwrap_or("").to_string(),
                    ));
                }
                (Some("finalize"), None, None) => send(Event::Finalize(rank)),
                _ => log::warn!("PMI: unknown request {:?}", line.trim_end()),
            }
        }
    }

    /// Adds `pairs`, waits for every process to fence, returns the store.
    fn fence(&self, pairs: Vec<(String, String)>) -> Vec<(String, String)> {
        let mut s = self.store.lock().unwrap();
        s.pairs.extend(pairs);
        s.arrived += 1;
        let generation = s.generation;
        if s.arrived == self.size {
            s.arrived = 0;
            s.generation += 1;
            self.released.notify_all();
        } else {
            s = self
                .released
                .wait_while(s, |s| s.generation == generation)
                .unwrap();
        }
        s.pairs
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}
