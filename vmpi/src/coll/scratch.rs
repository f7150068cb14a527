//! Scratch buffers of the collectives, kept between calls (seed 002's
//! per-communicator staging buffers): a temporary that is registered for a
//! rendezvous is the same memory next time, so its registration is a
//! cache hit instead of moving fresh pages into shared memory. Buffers
//! start on a page boundary (whole pages register without cross-memory
//! attach).
#![forbid(unsafe_code)]

use std::ops::{Deref, DerefMut};
use std::sync::Mutex;

const PAGE: usize = 4096;
/// Buffers kept at most.
const KEEP: usize = 16;

static POOL: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

/// A scratch buffer of `len` bytes (contents unspecified); back to the
/// pool on drop.
pub struct Scratch {
    v: Vec<u8>,
    off: usize,
    len: usize,
}

/// A scratch buffer of `len` bytes.
pub fn take(len: usize) -> Scratch {
    let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
    let pick = pool
        .iter()
        .enumerate()
        .filter(|(_, v)| v.len() >= len + PAGE)
        .min_by_key(|(_, v)| v.len())
        .map(|(i, _)| i);
    let v = match pick {
        Some(i) => pool.swap_remove(i),
        None => vec![0u8; (len + PAGE).next_multiple_of(PAGE)],
    };
    drop(pool);
    let off = (PAGE - v.as_ptr() as usize % PAGE) % PAGE;
    Scratch { v, off, len }
}

impl Deref for Scratch {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.v[self.off..self.off + self.len]
    }
}

impl DerefMut for Scratch {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.v[self.off..self.off + self.len]
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let v = std::mem::take(&mut self.v);
        if v.is_empty() {
            return;
        }
        let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
        if pool.len() >= KEEP {
            // Drop the smallest to keep the large ones.
            if let Some((i, _)) = pool.iter().enumerate().min_by_key(|(_, x)| x.len()) {
                if pool[i].len() < v.len() {
                    pool.swap_remove(i);
                } else {
                    return;
                }
            }
        }
        pool.push(v);
    }
}
