//! Ring views placed inside owned mappings.
//!
//! `doorbell::Doorbell` and `cq::EntryRing` are views over raw memory whose
//! constructors are `unsafe` (the memory must outlive the view). The types
//! here pair each view with the `Arc<Mapping>` it lives in, so the mapping
//! outlives the view by construction.

use std::io;
use std::sync::Arc;

use doorbell::{Doorbell, Plain};

use super::mapping::Mapping;

/// A doorbell in its own memory file.
pub struct MappedDoorbell<T: Plain> {
    db: Doorbell<T>,
    _map: Arc<Mapping>,
}

impl<T: Plain> MappedDoorbell<T> {
    /// Creates a memory file named `name` holding a doorbell of `capacity`.
    pub fn create(name: &str, capacity: u32) -> io::Result<MappedDoorbell<T>> {
        let len = Doorbell::<T>::bytes_for(capacity);
        let (_fd, map) = Mapping::create(name, len)?;
        let ptr = map
            .raw(0, len)
            .ok_or_else(|| io::Error::other("doorbell mapping too short"))?;
        // SAFETY: `ptr..ptr+len` is inside `map` (checked by `raw`), page
        // aligned, and `map` is kept alive in the returned value for as long
        // as the view exists; only the doorbell protocol touches it.
        let db = unsafe { Doorbell::init(ptr, len, capacity) }
            .map_err(|e| io::Error::other(format!("{e:?}")))?;
        Ok(MappedDoorbell {
            db,
            _map: Arc::new(map),
        })
    }

    /// The doorbell.
    pub fn get(&self) -> &Doorbell<T> {
        &self.db
    }
}

/// A completion entry ring inside a mapping (a CQ file or the error ring of a
/// NIC segment).
pub struct MappedRing {
    ring: cq::EntryRing,
    map: Arc<Mapping>,
}

impl MappedRing {
    /// Formats `len` bytes at `off` of `map` as a ring of `capacity`.
    pub fn init(
        map: Arc<Mapping>,
        off: usize,
        len: usize,
        capacity: u32,
    ) -> io::Result<MappedRing> {
        let ptr = map
            .raw(off, len)
            .ok_or_else(|| io::Error::other("ring outside its mapping"))?;
        // SAFETY: in bounds (checked by `raw`); `map` lives as long as the view
        // (kept in the returned value); the offset is page aligned by the
        // callers' layouts.
        let ring = unsafe { cq::EntryRing::init(ptr, len, capacity) }
            .map_err(|e| io::Error::other(format!("{e:?}")))?;
        Ok(MappedRing { ring, map })
    }

    /// Attaches to a ring another process formatted (validated by `attach`).
    pub fn attach(map: Arc<Mapping>, off: usize, len: usize) -> io::Result<MappedRing> {
        let ptr = map
            .raw(off, len)
            .ok_or_else(|| io::Error::other("ring outside its mapping"))?;
        // SAFETY: as in `init`; `attach` validates the header it finds.
        let ring = unsafe { cq::EntryRing::attach(ptr, len) }
            .map_err(|e| io::Error::other(format!("{e:?}")))?;
        Ok(MappedRing { ring, map })
    }

    /// The ring.
    pub fn get(&self) -> &cq::EntryRing {
        &self.ring
    }

    /// The mapping it lives in.
    pub fn mapping(&self) -> &Arc<Mapping> {
        &self.map
    }
}
