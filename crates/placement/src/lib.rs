//! # duplex-placement: where data lives
//!
//! Pure, deterministic functions of the cluster map (DESIGN.md §3), with no
//! I/O, so that clients and OSDs compute the same answer independently and
//! no metadata server sits on the data path:
//!
//! - **object → PG**: a stable hash of the object name, reduced with
//!   [`stable_mod`] so that `pg_num` can grow by splitting PGs ([`pg_of`]);
//! - **PG → ordered OSDs**: straw2 selection over root → host → OSD,
//!   replicas on distinct hosts when there are enough hosts, OSDs that are
//!   out skipped ([`Hierarchy::place`]).
//!
//! Every step is integer arithmetic: straw2's logarithm comes from a table
//! computed with integers ([`straw2`]), never from `f64::ln`, whose last bit
//! may differ between platforms and would make two machines disagree.

pub mod hierarchy;
pub mod straw2;

pub use hierarchy::{Hierarchy, HostSpec, OsdSpec};

/// The stable hash of an object name (xxh3, seed 0, low 32 bits).
pub fn object_hash(name: &[u8]) -> u32 {
    xxhash_rust::xxh3::xxh3_64(name) as u32
}

/// The smallest `2^k - 1 >= n - 1`: the mask [`stable_mod`] needs for `n`.
pub fn mask_for(n: u32) -> u32 {
    assert!(n > 0, "pg_num must be positive");
    n.next_power_of_two() - 1
}

/// Ceph's stable modulo: `x mod b` for `b` not a power of two, arranged so
/// that raising `b` towards the next power of two moves only the values of
/// the PGs being split. `mask` is [`mask_for`]`(b)`.
pub fn stable_mod(x: u32, b: u32, mask: u32) -> u32 {
    debug_assert!(b > 0 && mask == mask_for(b));
    if x & mask < b {
        x & mask
    } else {
        x & (mask >> 1)
    }
}

/// The PG of an object in a pool of `pg_num` PGs.
pub fn pg_of(name: &[u8], pg_num: u32) -> u32 {
    stable_mod(object_hash(name), pg_num, mask_for(pg_num))
}

/// The seed straw2 draws with for one PG of one pool: pools with the same
/// PG numbers must not land on the same OSDs.
pub fn pg_seed(pool: u32, pg: u32) -> u32 {
    straw2::hash3(pool, pg, 0x5EED_D0D0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn stable_mod_matches_modulo_at_powers_of_two() {
        for x in 0..10_000u32 {
            assert_eq!(stable_mod(x, 64, mask_for(64)), x % 64);
        }
    }

    /// Changing any of these would move every object of every existing
    /// cluster: a failure here is a compatibility break, not a test to update.
    #[test]
    fn hashes_and_placements_are_pinned() {
        assert_eq!(object_hash(b""), 0x38d3_94c2);
        assert_eq!(object_hash(b"rbd_data.1234.0000000000000001"), 0xb45b_0c9c);
        let spec: Vec<HostSpec> = (0..4u32)
            .map(|h| HostSpec {
                id: 100 + h,
                osds: (0..3).map(|o| OsdSpec { id: h * 3 + o, weight: 1 << 16, is_in: true }).collect(),
            })
            .collect();
        assert_eq!(Hierarchy::new(&spec).place(pg_seed(1, 7), 3), vec![6, 9, 0]);
    }

    proptest! {
        #[test]
        fn growing_pg_num_only_splits(x in any::<u32>(), pg_num in 1u32..5000) {
            let before = stable_mod(x, pg_num, mask_for(pg_num));
            let after = stable_mod(x, pg_num + 1, mask_for(pg_num + 1));
            prop_assert!(before < pg_num && after < pg_num + 1);
            // An object either stays in its PG or moves to the new PG `pg_num`.
            prop_assert!(after == before || after == pg_num, "{} -> {}", before, after);
        }
    }
}
