//! Handles: indices with a generation, so stale or foreign handles are
//! refused instead of dereferenced.
//!
//! A C handle (`VIP_VI_HANDLE`, ...) is a [`Handle`] encoded in a pointer-sized
//! integer: kind (4 bits), NIC slot (12), generation (16), index (32). It is
//! never a Rust pointer.
#![forbid(unsafe_code)]

/// What a handle names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// `VIP_NIC_HANDLE`.
    Nic = 1,
    /// `VIP_VI_HANDLE`.
    Vi = 2,
    /// `VIP_CQ_HANDLE`.
    Cq = 3,
    /// `VIP_PROTECTION_HANDLE`.
    Ptag = 4,
    /// `VIP_CONN_HANDLE`.
    Conn = 5,
    /// `VIP_SRQ_HANDLE` (an extension, not VIPL 1.0).
    Srq = 6,
}

/// A decoded handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Handle {
    /// What it names.
    pub kind: Kind,
    /// Slot of the NIC in the process's NIC table.
    pub nic: u16,
    /// Generation of the object's slot.
    pub generation: u16,
    /// Index of the object in its table.
    pub index: u32,
}

impl Handle {
    /// The pointer-sized value handed to C (never 0).
    pub fn encode(self) -> u64 {
        ((self.kind as u64) << 60)
            | (((self.nic as u64) & 0xfff) << 48)
            | ((self.generation as u64) << 32)
            | self.index as u64
    }

    /// Decodes a value from C; `None` for NULL or an unknown kind.
    pub fn decode(v: u64, want: Kind) -> Option<Handle> {
        let kind = match v >> 60 {
            1 => Kind::Nic,
            2 => Kind::Vi,
            3 => Kind::Cq,
            4 => Kind::Ptag,
            5 => Kind::Conn,
            6 => Kind::Srq,
            _ => return None,
        };
        if kind != want {
            return None;
        }
        Some(Handle {
            kind,
            nic: ((v >> 48) & 0xfff) as u16,
            generation: (v >> 32) as u16,
            index: v as u32,
        })
    }
}

struct Slot<T> {
    generation: u16,
    value: Option<T>,
}

/// A table of objects addressed by (index, generation).
///
/// Freed slots are reused oldest-first, and a slot's generation changes on
/// every reuse (never 0), so a stale handle stays invalid for 65535 reuses
/// of its slot.
pub struct Slab<T> {
    slots: Vec<Slot<T>>,
    free: std::collections::VecDeque<u32>,
    limit: u32,
    len: usize,
}

impl<T> Slab<T> {
    /// An empty table holding at most `limit` objects, indices starting at `first`.
    pub fn new(limit: u32, first: u32) -> Slab<T> {
        let mut slots = Vec::new();
        for _ in 0..first {
            slots.push(Slot {
                generation: 0,
                value: None,
            });
        }
        Slab {
            slots,
            free: std::collections::VecDeque::new(),
            limit,
            len: 0,
        }
    }

    /// Inserts; returns (index, generation), or `None` when full.
    pub fn insert(&mut self, value: T) -> Option<(u32, u16)> {
        let index = match self.free.pop_front() {
            Some(i) => i,
            None => {
                let i = self.slots.len() as u32;
                if i >= self.limit {
                    return None;
                }
                self.slots.push(Slot {
                    generation: 0,
                    value: None,
                });
                i
            }
        };
        let slot = &mut self.slots[index as usize];
        slot.generation = slot.generation.wrapping_add(1).max(1);
        slot.value = Some(value);
        self.len += 1;
        Some((index, slot.generation))
    }

    /// Inserts the value `f(index, generation)`; returns a reference to it, or
    /// `None` when full.
    pub fn insert_with(&mut self, f: impl FnOnce(u32, u16) -> T) -> Option<&T> {
        let index = match self.free.pop_front() {
            Some(i) => i,
            None => {
                let i = self.slots.len() as u32;
                if i >= self.limit {
                    return None;
                }
                self.slots.push(Slot {
                    generation: 0,
                    value: None,
                });
                i
            }
        };
        let slot = &mut self.slots[index as usize];
        slot.generation = slot.generation.wrapping_add(1).max(1);
        slot.value = Some(f(index, slot.generation));
        self.len += 1;
        slot.value.as_ref()
    }

    /// Mutable access to the object at (index, generation), if live.
    pub fn get_mut(&mut self, index: u32, generation: u16) -> Option<&mut T> {
        let s = self.slots.get_mut(index as usize)?;
        if s.generation != generation {
            return None;
        }
        s.value.as_mut()
    }

    /// Removes every object (their slots become free, generations kept).
    pub fn clear(&mut self) {
        for (i, s) in self.slots.iter_mut().enumerate() {
            if s.value.take().is_some() {
                self.free.push_back(i as u32);
            }
        }
        self.len = 0;
    }

    /// The object at (index, generation), if live.
    pub fn get(&self, index: u32, generation: u16) -> Option<&T> {
        let s = self.slots.get(index as usize)?;
        if s.generation != generation {
            return None;
        }
        s.value.as_ref()
    }

    /// Removes the object at (index, generation).
    pub fn remove(&mut self, index: u32, generation: u16) -> Option<T> {
        let s = self.slots.get_mut(index as usize)?;
        if s.generation != generation {
            return None;
        }
        let v = s.value.take()?;
        self.free.push_back(index);
        self.len -= 1;
        Some(v)
    }

    /// Live objects.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no object is live.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Iterates over (index, generation, object).
    pub fn iter(&self) -> impl Iterator<Item = (u32, u16, &T)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.value.as_ref().map(|v| (i as u32, s.generation, v)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_and_check_kind() {
        let h = Handle {
            kind: Kind::Vi,
            nic: 4095,
            generation: 65535,
            index: u32::MAX,
        };
        assert_eq!(Handle::decode(h.encode(), Kind::Vi), Some(h));
        assert_eq!(Handle::decode(h.encode(), Kind::Cq), None);
        assert_eq!(Handle::decode(0, Kind::Vi), None);
        assert_ne!(h.encode(), 0);
    }

    #[test]
    fn stale_generations_are_refused() {
        let mut s = Slab::new(2, 0);
        let (i, g) = s.insert("a").unwrap();
        assert_eq!(s.get(i, g), Some(&"a"));
        assert_eq!(s.remove(i, g), Some("a"));
        assert_eq!(s.get(i, g), None);
        let (i2, g2) = s.insert("b").unwrap();
        let (i3, _) = s.insert("c").unwrap();
        assert!(s.insert("d").is_none(), "limit");
        assert!(i2 != i || g2 != g);
        assert_eq!(s.get(i, g), None);
        assert_eq!(s.len(), 2);
        assert_ne!(i2, i3);
        let mut t: Slab<u8> = Slab::new(10, 1);
        assert_eq!(t.insert(1).unwrap().0, 1, "indices start at `first`");
    }
}
