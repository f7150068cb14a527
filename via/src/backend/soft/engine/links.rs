//! The engine's view of each VI's connection, validated by the VI's link
//! epoch (one load) instead of taking the link lock per request.
//!
//! Tearing a connection down bumps the epoch and then waits for the engine
//! lock (`Device::quiesce`), so no request runs on a stale link.
#![forbid(unsafe_code)]

use std::sync::Arc;

use crate::backend::soft::SoftNic;
use crate::backend::soft::remote::PeerLink;

use super::lane::Lane;
use crate::vi::ViCore;

/// (VI generation, link epoch, link, the link's lane).
type CachedLink = (u16, u32, Option<Arc<PeerLink>>, Lane);

/// The links the engine used last, by VI slot.
#[derive(Default)]
pub(crate) struct Links {
    slots: Vec<Option<CachedLink>>,
}

impl Links {
    /// The current link of `vi`, if it is connected, with its lane.
    #[inline]
    pub fn get(&mut self, soft: &SoftNic, vi: &ViCore) -> Option<(&PeerLink, &mut Lane)> {
        let slot = soft.vi_link(vi.slot)?;
        let epoch = slot.epoch();
        let i = vi.slot as usize;
        let fresh = matches!(self.slots.get(i), Some(Some((g, e, _, _))) if *g == vi.generation && *e == epoch);
        if !fresh {
            return self.refresh(i, vi.generation, epoch, slot.link());
        }
        // Nothing between the test above and this index writes the slots
        // (a refresh returns on its own), so the compiler keeps what the
        // test loaded: the entry is looked up once.
        self.slots[i].as_mut().and_then(Self::link)
    }

    /// The link and lane of an entry, if it has a link.
    #[inline(always)]
    fn link(e: &mut CachedLink) -> Option<(&PeerLink, &mut Lane)> {
        match e {
            (_, _, Some(l), lane) => Some((&**l, lane)),
            _ => None,
        }
    }

    /// Replaces entry `i` with the link of the current epoch, and returns
    /// it as [`Links::get`] does.
    #[cold]
    fn refresh(
        &mut self,
        i: usize,
        generation: u16,
        epoch: u32,
        link: Option<Arc<PeerLink>>,
    ) -> Option<(&PeerLink, &mut Lane)> {
        if self.slots.len() <= i {
            self.slots.resize_with(i + 1, || None);
        }
        Self::link(self.slots[i].insert((generation, epoch, link, Lane::default())))
    }

    /// Forgets the links to `session` (it died).
    pub fn forget(&mut self, session: u64) {
        for l in self.slots.iter_mut() {
            if l.as_ref()
                .and_then(|(_, _, l, _)| l.as_ref())
                .is_some_and(|l| l.remote.session == session)
            {
                *l = None;
            }
        }
    }
}
