//! Reading structured values from fuzzer bytes.
//!
//! Past the end of the input every read returns zeros: every input is
//! valid and a short input is a short scenario.

/// A cursor over the input.
pub struct Input<'a>(pub &'a [u8]);

impl<'a> Input<'a> {
    /// Whether every byte was consumed.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Up to `n` bytes.
    pub fn take(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.0.len());
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        a
    }

    /// Exactly `N` bytes, zero-padded.
    pub fn array<const N: usize>(&mut self) -> [u8; N] {
        let mut a = [0u8; N];
        let b = self.take(N);
        a[..b.len()].copy_from_slice(b);
        a
    }

    pub fn u8(&mut self) -> u8 {
        self.array::<1>()[0]
    }

    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.array())
    }

    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.array())
    }

    pub fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.array())
    }

    /// One of `options`, chosen by the next byte.
    pub fn pick<T: Clone>(&mut self, options: &[T]) -> T {
        options[self.u8() as usize % options.len()].clone()
    }
}

/// Appends values in the layout [`Input`] reads (for seeds).
#[derive(Default)]
pub struct Output(pub Vec<u8>);

impl Output {
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
}
