//! `java.util.Random`, bit for bit: the generator Weka shuffles and stratifies with, so cloakd's
//! folds are Weka's folds for the same seed.
//!
//! Invariants: a 48-bit linear congruential generator with Java's multiplier, increment, seed
//! scrambling and `nextInt(bound)` rejection rule; every output equals Java's for the same seed and
//! call sequence.

const MULTIPLIER: u64 = 0x5_DEEC_E66D;
const INCREMENT: u64 = 0xB;
const MASK: u64 = (1 << 48) - 1;

/// Java's `java.util.Random`.
#[derive(Debug, Clone)]
pub struct JavaRandom {
    state: u64,
}

impl JavaRandom {
    /// `new Random(seed)`.
    pub fn new(seed: i64) -> JavaRandom {
        JavaRandom {
            state: (seed as u64 ^ MULTIPLIER) & MASK,
        }
    }

    /// `next(bits)`: the top `bits` bits of the next state, as Java's (signed) `int`.
    fn next(&mut self, bits: u32) -> i32 {
        self.state = (self.state.wrapping_mul(MULTIPLIER).wrapping_add(INCREMENT)) & MASK;
        (self.state >> (48 - bits)) as i64 as i32
    }

    /// `nextInt()`.
    pub fn next_int(&mut self) -> i32 {
        self.next(32)
    }

    /// `nextInt(bound)`, uniform in `0..bound`; `bound` must be positive.
    pub fn next_int_below(&mut self, bound: i32) -> i32 {
        assert!(bound > 0, "bound must be positive");
        if bound & bound.wrapping_neg() == bound {
            return ((bound as i64 * self.next(31) as i64) >> 31) as i32;
        }
        loop {
            let bits = self.next(31);
            let value = bits % bound;
            if bits.wrapping_sub(value).wrapping_add(bound - 1) >= 0 {
                return value;
            }
        }
    }

    /// `nextDouble()`, uniform in [0, 1).
    pub fn next_double(&mut self) -> f64 {
        let high = (self.next(26) as i64) << 27;
        let low = self.next(27) as i64;
        (high + low) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// `nextLong()`.
    pub fn next_long(&mut self) -> i64 {
        ((self.next(32) as i64) << 32).wrapping_add(self.next(32) as i64)
    }
}

#[cfg(test)]
mod tests {
    use super::JavaRandom;

    /// Values printed by OpenJDK 17 for `new Random(1)` and `new Random(42)`.
    #[test]
    fn matches_java() {
        let mut r = JavaRandom::new(1);
        assert_eq!(r.next_int(), -1155869325);
        assert_eq!(r.next_int(), 431529176);
        let mut r = JavaRandom::new(1);
        assert_eq!(r.next_int_below(10), 5);
        assert_eq!(r.next_int_below(10), 8);
        assert_eq!(r.next_int_below(10), 7);
        let mut r = JavaRandom::new(42);
        assert_eq!(r.next_int_below(100), 30);
        assert_eq!(r.next_int_below(100), 63);
        let mut r = JavaRandom::new(1);
        assert_eq!(r.next_double(), 0.7308781907032909);
        let mut r = JavaRandom::new(1);
        assert_eq!(r.next_long(), -4964420948893066024);
        let mut r = JavaRandom::new(7);
        assert_eq!(r.next_int_below(16), 11);
    }
}
