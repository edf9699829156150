//! Tables keyed by device address.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Hashes a device address (a `u64` key) with one multiply: the tables keyed by allocation base
/// are looked up on every bind and access, and their keys are not attacker-chosen.
#[derive(Debug, Default, Clone, Copy)]
pub struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, n: u64) {
        // Fibonacci hashing; the high bits (which hashbrown uses) depend on every input bit.
        self.0 = (self.0 ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// A map keyed by device address.
pub type AddrMap<V> = HashMap<u64, V, BuildHasherDefault<AddrHasher>>;
