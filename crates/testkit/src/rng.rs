//! A small deterministic generator (xorshift64) for seeded test traffic
//! and benchmark traces: the same seed gives the same sequence on every
//! machine, and no dependency is needed for it.

/// xorshift64 (13, 7, 17). The seed must not be 0.
#[derive(Clone, Debug)]
pub struct Xorshift(pub u64);

impl Xorshift {
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Below `n` (not quite uniform; enough for traffic).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// One of `from`, which must not be empty.
    pub fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        from[self.below(from.len() as u64) as usize]
    }

    /// Uniform in (0, 1].
    pub fn unit(&mut self) -> f64 {
        ((self.next() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }
}
