//! Straw2 draws with integer arithmetic only.
//!
//! Each candidate item draws `log2(u) / weight`, where `u` in `(0, 1]` comes
//! from a hash of (PG seed, item, round); the largest draw wins. Taking the
//! top `k` draws is weighted sampling without replacement (exponential keys):
//! an item's chance follows its weight, and changing one item's weight only
//! moves the choices that item wins or loses.
//!
//! `u` has 16 bits, like Ceph's straw2. Its log2 comes from a 65,536-entry
//! table built with integer arithmetic ([`log2_fixed`]), so every machine
//! builds the same table.

use std::sync::OnceLock;

/// Fractional bits of [`log2_fixed`].
pub const LOG2_FRACTION_BITS: u32 = 32;

/// `log2(x) * 2^32` for `x >= 1`, bit-exact everywhere (integer only).
pub fn log2_fixed(x: u64) -> i64 {
    assert!(x >= 1, "log2 of zero");
    let integer = 63 - x.leading_zeros() as i64;
    // y = x / 2^integer in [1, 2), as a Q32 fixed-point number.
    let mut y: u128 = if integer <= 32 { (x as u128) << (32 - integer) } else { (x as u128) >> (integer - 32) };
    let mut result = integer << LOG2_FRACTION_BITS;
    for bit in (0..LOG2_FRACTION_BITS).rev() {
        y = (y * y) >> 32;
        if y >= 2u128 << 32 {
            y >>= 1;
            result |= 1 << bit;
        }
    }
    result
}

fn log2_table() -> &'static [i64] {
    static TABLE: OnceLock<Vec<i64>> = OnceLock::new();
    // Entry u is log2((u + 1) / 65536): from -16 (u = 0) to 0 (u = 65535).
    TABLE.get_or_init(|| (1..=65536u64).map(|v| log2_fixed(v) - (16 << LOG2_FRACTION_BITS)).collect())
}

/// A 32-bit mix of three words (splitmix64 finaliser): fast, well spread, stable.
pub fn hash3(a: u32, b: u32, c: u32) -> u32 {
    let mut x = ((a as u64) << 32 | b as u64) ^ (c as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 31;
    (x >> 32) as u32
}

/// The straw2 draw of `item` (weight in 16.16 fixed point, > 0) for `seed`
/// in round `round`; larger wins. Always <= 0.
pub fn draw(seed: u32, item: u32, round: u32, weight: u64) -> i64 {
    debug_assert!(weight > 0, "zero-weight items never draw");
    let u = hash3(seed, item, round) & 0xffff;
    // Scaled so the quotient keeps resolution: log2 is in Q32, weight in Q16.
    (log2_table()[u as usize] << 16) / weight as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log2_is_exact_at_powers_of_two_and_monotonic() {
        for k in 0..63 {
            assert_eq!(log2_fixed(1 << k), (k as i64) << 32);
        }
        let table = log2_table();
        assert_eq!(table[65535], 0);
        assert_eq!(table[0], -16 << 32);
        assert!(table.windows(2).all(|w| w[0] < w[1]));
        // log2(3) = 1.5849625007...
        let three = log2_fixed(3) as f64 / (1u64 << 32) as f64;
        assert!((three - 1.584_962_500_7).abs() < 1e-8, "{three}");
    }

    /// A change here would move data on every cluster: it must never happen silently.
    #[test]
    fn the_table_and_the_mix_are_pinned() {
        let sum = (1..=65536u64).map(log2_fixed).fold(0i64, |a, v| a.wrapping_add(v));
        assert_eq!(sum, 4_097_557_128_077_168);
        assert_eq!(log2_table()[32767], -(1 << 32));
        assert_eq!(hash3(1, 2, 3), 0xfd60_ee20);
    }

    #[test]
    fn heavier_items_win_proportionally_more() {
        let mut wins = [0u32; 2];
        for seed in 0..200_000 {
            let a = draw(seed, 1, 0, 1 << 16);
            let b = draw(seed, 2, 0, 3 << 16);
            wins[(b > a) as usize] += 1;
        }
        let share = wins[1] as f64 / 200_000.0;
        assert!((share - 0.75).abs() < 0.01, "weight 3 of 4 won {share}");
    }
}
