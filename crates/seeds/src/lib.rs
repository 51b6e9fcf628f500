//! Seeded randomness and hashing that mean the same on every platform and Rust release: the SplitMix64
//! generator ([`SplitMix64`], and its one-step mixer [`splitmix`]) and the 64-bit FNV-1a hash
//! ([`fnv1a`]), for seeds derived from text, cache folder names and deterministic fakes.
//!
//! std's hasher and `rand`'s generators may change between releases, and a seed or a cache name must not.
//! It is a leaf crate (`../shared/STYLE.md`): the trainer's sampling, the sim's tasks, the proxy's fake
//! engine and `arena-rl`'s row order and quickstart use this one copy; it depends on nothing.
//! It is not for anything secret: neither the generator nor the hash resists an adversary.

#[cfg(test)]
mod tests;

/// The golden-ratio increment of SplitMix64.
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's output function: mixes `z` into 64 well-spread bits.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// One SplitMix64 step from `state`: the output of a generator whose state was `state`; chaining
/// `state = splitmix(state)` walks a sequence keyed by the first state.
pub fn splitmix(state: u64) -> u64 {
    mix(state.wrapping_add(GOLDEN))
}

/// SplitMix64: a small, fast, statistically sound 64-bit generator whose whole state is one `u64`
/// (which a checkpoint can store).
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator whose whole future is determined by `seed`.
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN);
        mix(self.state)
    }

    /// Uniform in `[0, 1)` with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Standard normal (Box-Muller).
    pub fn next_normal(&mut self) -> f64 {
        let u1 = 1.0 - self.next_f64();
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

/// FNV-1a, 64 bits: a hash of `bytes` that stays the same across platforms and Rust releases.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}
