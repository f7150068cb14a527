//! The library's per-process state: the launch interface, the engine, the
//! offload context, and the communicator `WORLD`.
#![forbid(unsafe_code)]

use std::sync::{Arc, Mutex};

use doorbell::{BiasedGuard, BiasedLock};

use crate::comm::Comm;
use crate::engine::{Config, Engine};
use crate::error::Result;
use crate::offload::Offload;
use crate::pmi::Pmi;

pub(crate) struct Inner {
    /// Taken by every call; biased to the application's thread, which then
    /// takes it without a locked instruction (`doorbell::BiasedLock`).
    pub engine: BiasedLock<Engine>,
    pub pmi: Mutex<Pmi>,
    /// Context ids below this are taken (communicator creation agrees on
    /// the maximum over the group, as LAM's `topid`).
    pub next_context: Mutex<u32>,
    pub offload: Option<Offload>,
    pub start: std::time::Instant,
}

impl Inner {
    pub fn engine(&self) -> BiasedGuard<'_, Engine> {
        self.engine.lock()
    }
}

/// An initialised job: this process's handle on the library.
#[derive(Clone)]
pub struct World {
    pub(crate) inner: Arc<Inner>,
}

impl World {
    /// Initialises the library: connects to the launcher (or makes a job of
    /// one) and to every other process.
    ///
    /// # Errors
    /// `Transport`/`Intern` if the launcher or the provider fails.
    pub fn init() -> Result<World> {
        let mut pmi = Pmi::from_env()?;
        let cfg = Config::from_env(pmi.size());
        let engine = Engine::new(&mut pmi, cfg)?;
        let offload = match crate::coll::Mode::from_env() {
            crate::coll::Mode::Offload if pmi.size() > 1 => Some(Offload::start(&mut pmi)?),
            _ => None,
        };
        log::debug!(
            "rank {} of {}: connected (eager limit {}, offload {})",
            pmi.rank(),
            pmi.size(),
            engine.eager_limit(),
            offload.is_some()
        );
        Ok(World {
            inner: Arc::new(Inner {
                engine: BiasedLock::new(engine),
                pmi: Mutex::new(pmi),
                next_context: Mutex::new(2),
                offload,
                start: std::time::Instant::now(),
            }),
        })
    }

    /// The communicator of every process (`MPI_COMM_WORLD`).
    pub fn comm(&self) -> Comm {
        let e = self.inner.engine();
        Comm::world(self.inner.clone(), e.rank(), e.size())
    }

    /// A communicator of this process alone (`MPI_COMM_SELF`).
    pub fn comm_self(&self) -> Comm {
        let rank = self.inner.engine().rank();
        Comm::new(self.inner.clone(), 1, Arc::new(vec![rank]), 0)
    }

    /// Seconds since an arbitrary time in the past (`MPI_Wtime`).
    pub fn wtime(&self) -> f64 {
        self.inner.start.elapsed().as_secs_f64()
    }

    /// Ends the job for this process: waits for every process to arrive,
    /// then disconnects.
    ///
    /// # Errors
    /// The errors of the final barrier.
    pub fn finalize(self) -> Result<()> {
        let comm = self.comm();
        self.inner.engine().set_closing();
        let r = comm.barrier();
        if let Some(o) = &self.inner.offload {
            o.stop();
        }
        {
            let mut e = self.inner.engine();
            e.drain()?;
            e.close();
        }
        self.inner
            .pmi
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .finalize();
        r
    }

    /// Ends the whole job with `code` (`MPI_Abort`): the launcher kills
    /// every process. Does not return.
    pub fn abort(&self, code: i32, msg: &str) -> ! {
        abort_job(&self.inner, code, msg)
    }
}

pub(crate) fn abort_job(inner: &Inner, code: i32, msg: &str) -> ! {
    log::error!("aborting the job (code {code}): {msg}");
    if let Ok(mut p) = inner.pmi.lock() {
        p.abort(code, msg);
    }
    std::process::exit(if code == 0 { 1 } else { code & 0xff });
}
