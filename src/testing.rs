//! Test support, not part of the API: built for the crate's unit tests and with the
//! `test-support` feature, which the integration tests (through the crate's dev-dependency on
//! itself) and the `fuzz/` crate turn on. The library build has none of it.

pub use crate::providers::hostile;
#[cfg(feature = "mlx5")]
pub use crate::providers::hostile_cqes as mlx5_cqes;
/// The siw CQ's hostile-ring harness.
pub use crate::providers::siw_hostile;

/// The seeded generator (splitmix64) of every randomized test: the same seed gives the same
/// sequence.
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator starting from `seed`.
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// True `percent` times in a hundred.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// A fuzz input read as numbers, front to back; zeros once it runs out (the hostile
/// harnesses' decoder of libFuzzer bytes).
#[derive(Debug)]
pub struct FuzzInput<'a> {
    data: &'a [u8],
}

impl<'a> FuzzInput<'a> {
    /// Reads `data`.
    pub fn new(data: &'a [u8]) -> Self {
        Self { data }
    }

    /// The next byte.
    pub fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }

    /// The next four bytes, little-endian.
    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: u8) -> u8 {
        self.u8() % n.max(1)
    }

    /// The next `N` bytes.
    pub fn bytes<const N: usize>(&mut self) -> [u8; N] {
        std::array::from_fn(|_| self.u8())
    }

    /// Whether every byte has been read.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::Rng;

    /// splitmix64's published first outputs for seed 0, so a changed generator cannot
    /// silently change every seeded test's inputs.
    #[test]
    fn splitmix64_reference_values() {
        let mut r = Rng::new(0);
        assert_eq!(r.next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(r.next_u64(), 0x6e78_9e6a_a1b9_65f4);
        assert_eq!(r.next_u64(), 0x06c4_5d18_8009_454f);
    }
}
