//! A map from memory handles (nonzero `u32`s) to values, for the paths that
//! every registration and deregistration take.
//!
//! Open addressing with linear probing, at most half full, deletion by
//! backward shift (no tombstones, so lookups stay short however many
//! registrations came and went). An insert or a removal costs a multiply
//! and usually one probe: about a fifth of the instructions of a `HashMap`
//! with a cheap hasher, measured on `VipRegisterMem`'s hit path.
#![forbid(unsafe_code)]

/// Values by nonzero `u32` key.
pub(crate) struct HandleMap<V> {
    /// 0: empty (no handle of any kind of NIC is 0).
    keys: Vec<u32>,
    values: Vec<Option<V>>,
    len: usize,
    /// 64 minus log2 of the number of slots.
    shift: u32,
}

impl<V> Default for HandleMap<V> {
    fn default() -> Self {
        HandleMap::with_slots(16)
    }
}

impl<V> HandleMap<V> {
    fn with_slots(slots: usize) -> Self {
        debug_assert!(slots.is_power_of_two());
        HandleMap {
            keys: vec![0; slots],
            values: (0..slots).map(|_| None).collect(),
            len: 0,
            shift: 64 - slots.trailing_zeros(),
        }
    }

    fn mask(&self) -> usize {
        self.keys.len() - 1
    }

    fn home(&self, k: u32) -> usize {
        // The top bits of a multiplicative hash: handles of other kinds of
        // NIC (verbs keys) need not be spread in their low bits.
        ((u64::from(k)).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> self.shift) as usize
    }

    fn find(&self, k: u32) -> Option<usize> {
        if k == 0 {
            return None;
        }
        let mut p = self.home(k);
        loop {
            match self.keys[p] {
                0 => return None,
                x if x == k => return Some(p),
                _ => p = (p + 1) & self.mask(),
            }
        }
    }

    /// Entries.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The value of `k`.
    pub fn get(&self, k: u32) -> Option<&V> {
        self.find(k).and_then(|p| self.values[p].as_ref())
    }

    /// The value of `k`, to change.
    pub fn get_mut(&mut self, k: u32) -> Option<&mut V> {
        self.find(k).and_then(|p| self.values[p].as_mut())
    }

    /// Sets the value of `k` (nonzero); returns the one it replaces.
    pub fn insert(&mut self, k: u32, v: V) -> Option<V> {
        assert_ne!(k, 0, "handle 0");
        if let Some(p) = self.find(k) {
            return self.values[p].replace(v);
        }
        if (self.len + 1) * 2 > self.keys.len() {
            self.grow();
        }
        let mut p = self.home(k);
        while self.keys[p] != 0 {
            p = (p + 1) & self.mask();
        }
        self.keys[p] = k;
        self.values[p] = Some(v);
        self.len += 1;
        None
    }

    fn grow(&mut self) {
        let old = std::mem::replace(self, HandleMap::with_slots(self.keys.len() * 2));
        for (k, v) in old.keys.into_iter().zip(old.values) {
            if let Some(v) = v {
                self.insert(k, v);
            }
        }
    }

    /// Takes the value of `k` out.
    pub fn remove(&mut self, k: u32) -> Option<V> {
        let p = self.find(k)?;
        let v = self.values[p].take();
        self.len -= 1;
        // Backward shift: move back the entries after the hole that would
        // no longer be found past it.
        let mask = self.mask();
        let mut hole = p;
        let mut q = (p + 1) & mask;
        while self.keys[q] != 0 {
            let home = self.home(self.keys[q]);
            // Movable unless its home lies cyclically in (hole, q].
            if q.wrapping_sub(home) & mask >= q.wrapping_sub(hole) & mask {
                self.keys[hole] = self.keys[q];
                self.values[hole] = self.values[q].take();
                hole = q;
            }
            q = (q + 1) & mask;
        }
        self.keys[hole] = 0;
        v
    }

    /// The values, in no particular order.
    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.values.iter().filter_map(Option::as_ref)
    }

    /// The entries, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &V)> {
        self.keys
            .iter()
            .zip(self.values.iter())
            .filter_map(|(&k, v)| v.as_ref().map(|v| (k, v)))
    }

    /// Takes every entry out.
    pub fn drain(&mut self) -> Vec<(u32, V)> {
        let old = std::mem::take(self);
        old.keys
            .into_iter()
            .zip(old.values)
            .filter_map(|(k, v)| v.map(|v| (k, v)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Random inserts, lookups and removals against `HashMap`, on few keys
    /// that share probe sequences, across growth.
    #[test]
    fn agrees_with_a_hashmap() {
        let mut m = HandleMap::default();
        let mut model = HashMap::new();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for n in 0..50_000u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Up to 200 keys live: the map grows from 16 slots to 512.
            let k = 1 + (x % 300) as u32 * if n < 25_000 { 1 } else { 0x1_0000 };
            match x >> 40 & 3 {
                0 | 1 => assert_eq!(m.insert(k, n), model.insert(k, n), "insert {k}"),
                2 => assert_eq!(m.remove(k), model.remove(&k), "remove {k}"),
                _ => assert_eq!(m.get(k), model.get(&k), "get {k}"),
            }
            assert_eq!(m.len(), model.len());
        }
        if let Some((&k, _)) = model.iter().next() {
            *m.get_mut(k).unwrap() += 1;
            *model.get_mut(&k).unwrap() += 1;
        }
        let mut all = m.drain();
        all.sort();
        let mut want: Vec<_> = model.into_iter().collect();
        want.sort();
        assert_eq!(all, want);
        assert!(m.is_empty());
        assert_eq!(m.get(0), None, "0 is never a key");
    }
}
