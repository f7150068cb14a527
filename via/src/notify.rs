//! The provider thread: runs Notify handlers and the error callback.
//!
//! One thread per NIC sleeps on the device's provider event count.
//! Completers (our engine, a peer's engine) wake it when a queue or CQ has a
//! handler armed (`interest` bits); peers also wake it after reporting an
//! asynchronous error to the NIC. Handlers run on this thread with no
//! provider lock held, so they may call any VIPL function; they delay other
//! notifications while they run, so they should not block for long.
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::nic::{AsyncError, NicInner};

enum Armed {
    Vi(u32, u16),
    Cq(u32, u16),
}

/// The provider thread of one NIC.
pub(crate) struct Provider {
    /// Errors for the callback, and whether each is an orderly event.
    errors: Mutex<VecDeque<(AsyncError, bool)>>,
    armed: Mutex<Vec<Armed>>,
    stop: AtomicBool,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Provider {
    pub fn new() -> Provider {
        Provider {
            errors: Mutex::new(VecDeque::new()),
            armed: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            thread: Mutex::new(None),
        }
    }

    /// Starts the thread.
    pub fn start(&self, nic: &Arc<NicInner>) {
        let weak = Arc::downgrade(nic);
        let t = std::thread::Builder::new()
            .name("via-provider".into())
            .spawn(move || {
                loop {
                    let Some(nic) = weak.upgrade() else { return };
                    // Look first: registering as a sleeper runs a heavy
                    // fence (`membarrier`), worth paying only when about to
                    // sleep.
                    if nic.provider.stop.load(Ordering::Acquire) {
                        return;
                    }
                    if nic.provider.run_once(&nic) {
                        continue;
                    }
                    let ec = nic.dev.provider_wake();
                    let key = ec.prepare_wait();
                    if nic.provider.stop.load(Ordering::Acquire) {
                        ec.cancel_wait(key);
                        return;
                    }
                    if nic.provider.run_once(&nic) {
                        ec.cancel_wait(key);
                        continue;
                    }
                    let dev = nic.dev.arc().clone();
                    drop(nic);
                    // Hold the device (not the NIC) while asleep, so that
                    // closing the NIC can drop it.
                    dev.provider_wake().wait(key, None);
                }
            })
            .expect("spawn provider thread");
        *self.thread.lock().unwrap() = Some(t);
    }

    /// Stops the thread (not from the thread itself).
    pub fn stop(&self, nic: &NicInner) {
        self.stop.store(true, Ordering::Release);
        nic.dev.provider_wake().notify_all();
        if let Some(t) = self.thread.lock().unwrap().take() {
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }

    /// Queues an error for the callback and wakes the thread.
    pub fn post_error(&self, nic: &NicInner, e: AsyncError, orderly: bool) {
        self.errors.lock().unwrap().push_back((e, orderly));
        nic.dev.provider_wake().notify_all();
    }

    /// Watches VI (`slot`, `generation`) for notify handlers.
    pub fn arm(&self, nic: &NicInner, slot: u32, generation: u16) {
        let mut a = self.armed.lock().unwrap();
        if !a
            .iter()
            .any(|x| matches!(x, Armed::Vi(s, g) if *s == slot && *g == generation))
        {
            a.push(Armed::Vi(slot, generation));
        }
        drop(a);
        nic.dev.provider_wake().notify_all();
    }

    /// Watches CQ (`slot`, `generation`) for notify handlers.
    pub fn arm_cq(&self, nic: &NicInner, slot: u32, generation: u16) {
        let mut a = self.armed.lock().unwrap();
        if !a
            .iter()
            .any(|x| matches!(x, Armed::Cq(s, g) if *s == slot && *g == generation))
        {
            a.push(Armed::Cq(slot, generation));
        }
        drop(a);
        nic.dev.provider_wake().notify_all();
    }

    /// One pass; returns whether anything was done.
    fn run_once(&self, nic: &NicInner) -> bool {
        let mut did = false;
        nic.drain_async_errors();
        loop {
            let e = self.errors.lock().unwrap().pop_front();
            let Some((e, orderly)) = e else { break };
            nic.run_error_callback(&e, orderly);
            did = true;
        }
        let armed: Vec<(bool, u32, u16)> = self
            .armed
            .lock()
            .unwrap()
            .iter()
            .map(|a| match a {
                Armed::Vi(s, g) => (true, *s, *g),
                Armed::Cq(s, g) => (false, *s, *g),
            })
            .collect();
        let mut gone = Vec::new();
        for (is_vi, s, g) in armed {
            let r = if is_vi {
                nic.vi(s, g).map(|vi| vi.run_notifies(nic))
            } else {
                nic.cq(s, g).map(|cq| cq.run_notifies(nic))
            };
            match r {
                Some((ran, _pending)) => did |= ran,
                None => gone.push((is_vi, s, g)),
            }
        }
        if !gone.is_empty() {
            self.armed.lock().unwrap().retain(|x| {
                let k = match x {
                    Armed::Vi(s, g) => (true, *s, *g),
                    Armed::Cq(s, g) => (false, *s, *g),
                };
                !gone.contains(&k)
            });
        }
        did
    }
}
