//! What one process shares among its NICs: the viad session, the
//! registration arenas, the table of open NICs, and the mappings of peers.
#![forbid(unsafe_code)]

use std::io;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, RwLock};

use crate::agent::{Agent, DaemonInfo, Event};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::handle::Slab;
use crate::mem::arena::{self, ArenaPinner, Arenas, Publisher};
use crate::mem::monitor::{self, MemEvent, Monitor};
use crate::nic::NicInner;
use crate::proto::{ObjKey, ObjKind, Reply, Request};
use crate::sys;

/// Most NICs one process may open.
pub const MAX_NICS: u32 = 4095;

/// Process-wide provider state.
pub(crate) struct Process {
    pub pid: i32,
    /// The viad session (`None` only for the unit tests' private process).
    agent: Option<Arc<Agent>>,
    /// This host's VIA address and name.
    pub host: Vec<u8>,
    pub host_name: String,
    pub arenas: Arc<Arenas>,
    /// The registration path: registrations of this process, by page range.
    pub registrations: regcache::RegCache<ArenaPinner>,
    /// Memory events (unmap, discard, move) of this address space, if the
    /// kernel offers them.
    pub monitor: Option<Arc<Monitor>>,
    pub nics: RwLock<Slab<Arc<NicInner>>>,
    pub next_nic_id: Mutex<u32>,
    pub config: &'static Config,
}

struct AgentPublisher(Arc<Agent>);

impl Publisher for AgentPublisher {
    fn publish(&self, id: u32, fd: &OwnedFd) -> io::Result<()> {
        self.0.publish(arena_key(id), fd)
    }
    fn retire(&self, id: u32) {
        let _ = self.0.send(&Request::Retire { key: arena_key(id) });
        if let Some(p) = Process::current() {
            for nic in p.all_nics() {
                nic.dev.memory_retired();
            }
        }
    }
}

/// The viad name of arena `id`.
pub(crate) fn arena_key(id: u32) -> ObjKey {
    ObjKey {
        kind: ObjKind::Arena,
        nic: 0,
        id,
        generation: 0,
    }
}

static PROCESS: Mutex<Option<Arc<Process>>> = Mutex::new(None);

impl Process {
    /// The process state, created on first use (and again in a child after
    /// `fork`: VIA objects do not survive a fork).
    pub fn get() -> Result<Arc<Process>> {
        let mut g = PROCESS.lock().unwrap();
        if let Some(p) = g.as_ref() {
            if p.pid == sys::getpid() {
                if !p.agent.as_ref().is_some_and(|a| a.is_lost()) {
                    return Ok(p.clone());
                }
                // A new session only once nothing of the old one is left
                // (registrations and mappings belong to it).
                if !p.nics.read().unwrap().is_empty() {
                    log::error!(
                        "the viad session is lost and NICs of it are still open: close them all before opening a NIC"
                    );
                    return Err(Error::Resource);
                }
            }
        }
        let config = Config::get();
        let agent = Arc::new(Agent::connect(Box::new(on_event)).map_err(|e| {
            log::error!("cannot reach viad: {e}");
            Error::failed("reaching viad", e)
        })?);
        monitor::set_apply(on_memory_events);
        let p = Arc::new(Process::build(
            config,
            Some(agent.clone()),
            Box::new(AgentPublisher(agent)),
        ));
        crate::mem::fork::install(Arc::downgrade(&p.arenas));
        let old = g.replace(p.clone());
        drop(g);
        // A lost session's state is dropped with the lock released: its
        // registration cache retires its arenas, which looks the current
        // state up (dropping it under the lock deadlocked the reopening
        // thread when this was the last reference).
        drop(old);
        Ok(p)
    }

    /// The process state over `agent` (publishing arenas through
    /// `publisher`).
    fn build(
        config: &'static Config,
        agent: Option<Arc<Agent>>,
        publisher: Box<dyn Publisher>,
    ) -> Process {
        let monitor = Monitor::get();
        let mut cache = config.regcache;
        let arenas = Arc::new(Arenas::new(
            arena::Config {
                policy: config.register,
                chunk: config.move_chunk,
                restore_on_retire: cache.capacity_bytes == 0 || cache.capacity_regions == 0,
            },
            publisher,
            monitor.clone(),
        ));
        // Without memory events a hit cannot know that the memory under it
        // changed, nor with events alone can it know of an unmap whose event
        // is not queued yet (no unmap hooks): check each one against the
        // mappings.
        cache.validate_hits = !monitor.as_ref().is_some_and(|m| m.hooked());
        let registrations = regcache::RegCache::new(ArenaPinner(arenas.clone()), cache);
        let (host, host_name) = match &agent {
            Some(a) => (a.host.clone(), a.host_name.clone()),
            None => (b"localhost".to_vec(), "localhost".to_string()),
        };
        Process {
            pid: sys::getpid(),
            agent,
            host,
            host_name,
            arenas,
            registrations,
            monitor,
            nics: RwLock::new(Slab::new(MAX_NICS, 1)),
            next_nic_id: Mutex::new(1),
            config,
        }
    }

    /// A process state of its own, with no viad session (arenas are not
    /// published): for the unit tests' loopback NICs.
    #[cfg(test)]
    pub fn without_daemon() -> Arc<Process> {
        struct Nowhere;
        impl Publisher for Nowhere {
            fn publish(&self, _id: u32, _fd: &OwnedFd) -> io::Result<()> {
                Ok(())
            }
            fn retire(&self, _id: u32) {}
        }
        Arc::new(Process::build(Config::get(), None, Box::new(Nowhere)))
    }

    /// The viad session.
    ///
    /// # Errors
    /// `Resource` for a process state without one (unit tests).
    pub fn agent(&self) -> Result<&Arc<Agent>> {
        self.agent.as_ref().ok_or_else(|| {
            log::error!("no viad session in this process state");
            Error::resource("no viad session in this process state")
        })
    }

    /// The viad session's id (0 without one).
    pub fn session(&self) -> u64 {
        self.agent.as_ref().map_or(0, |a| a.session)
    }

    /// Which daemon serves this process.
    pub fn daemon(&self) -> Option<DaemonInfo> {
        self.agent.as_ref().map(|a| a.daemon)
    }

    /// The current process state if it exists.
    pub fn current() -> Option<Arc<Process>> {
        PROCESS.lock().unwrap().clone()
    }

    /// The NIC in slot (`index`, `generation`).
    pub fn nic(&self, index: u32, generation: u16) -> Option<Arc<NicInner>> {
        self.nics.read().unwrap().get(index, generation).cloned()
    }

    pub fn all_nics(&self) -> Vec<Arc<NicInner>> {
        self.nics
            .read()
            .unwrap()
            .iter()
            .map(|(_, _, n)| n.clone())
            .collect()
    }
}

/// Applies memory events (on the monitor's applier thread, or in a
/// registration that syncs first): cache entries over memory that went away
/// are dropped, registrations over it lose their translation.
fn on_memory_events(evs: &[MemEvent]) {
    let Some(p) = Process::current() else { return };
    if p.pid != sys::getpid() {
        return;
    }
    for ev in evs {
        log::debug!("memory event {ev:x?}");
        let r = match ev {
            MemEvent::Unmap(r) | MemEvent::Remove(r) => r.clone(),
            MemEvent::Remap { from, .. } => from.clone(),
            MemEvent::Everything => {
                log::error!(
                    "memory events were lost: every cached registration is dropped (live \
                     registrations keep their translation)"
                );
                p.registrations.invalidate(0, usize::MAX);
                for nic in p.all_nics() {
                    nic.drop_parked();
                }
                continue;
            }
        };
        p.registrations.invalidate(r.start, r.len());
        // An unmap or a move may be applied late (its thread was held past
        // `Monitor::sync`'s deadline), after new memory was mapped at the
        // address and registered: only registrations whose pages left the
        // address lose their translation. Discarded contents (`Remove`)
        // leave the mapping in place: every registration over them goes.
        let mapping_gone = !matches!(ev, MemEvent::Remove(_));
        for nic in p.all_nics() {
            nic.revoke_overlapping(&r, mapping_gone);
        }
    }
}

/// Applies `ev` now, as the memory monitor does when it reads one: for
/// tests of an event applied late (after the address was mapped and
/// registered again).
#[doc(hidden)]
pub fn apply_memory_event(ev: MemEvent) {
    on_memory_events(&[ev]);
}

/// Runs on the agent's event thread for every daemon event.
fn on_event(ev: Event) {
    let Some(p) = Process::current() else { return };
    match ev {
        Event::Daemon(Reply::PeerDied { session }) => {
            log::info!("viad: session {session} died");
            for nic in p.all_nics() {
                nic.peer_died(session);
            }
        }
        Event::Daemon(Reply::RemoteDisconnect { me, token, reason }) => {
            if me.session == p.session() {
                for nic in p.all_nics().into_iter().filter(|n| n.id == me.nic) {
                    nic.remote_disconnect(&me, reason);
                }
            }
            if let Ok(a) = p.agent() {
                let _ = a.send(&Request::DisconnectAck { token });
            }
        }
        // Without viad, a peer's death would go unnoticed: every connection
        // breaks now, as for a peer that died.
        Event::Lost if p.agent.as_ref().is_some_and(|a| a.is_lost()) => {
            for nic in p.all_nics() {
                nic.daemon_lost();
            }
        }
        Event::Lost => {}
        Event::Daemon(other) => log::warn!("unexpected event from viad: {other:?}"),
    }
}
