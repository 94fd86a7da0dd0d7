//! Reed-Solomon coding of a stripe's shards, by `reed-solomon-simd`.
//!
//! Why that crate: both candidates were measured on this machine
//! (`examples/compare_codecs.rs`, docs/BENCHMARKS.md session 20). For the
//! small codes EC pools use, `reed-solomon-erasure` (GF(2^8), its SIMD path
//! C code built with the crate) is as fast or faster: 2+1 with 64 KiB units
//! encodes at 38 GiB/s against 22, and a 4 KiB parity update takes 0.20 µs
//! against 0.36. Both are two orders below a write's CPU cost (tens of µs),
//! so speed does not decide; `reed-solomon-simd` is pure Rust with runtime
//! CPU detection (AVX2, SSSE3, Neon, portable fallback): no C compiler in
//! every build and no C on the data path.
//!
//! Shards are coded column by column: each 64-byte block of a shard is
//! coded with the blocks at the same offset of the other shards only, and
//! the code is linear (a sum of constant multiples in GF(2^16), whose sum
//! is XOR). So a partial overwrite changes each parity shard, over the
//! same 64-byte-aligned range, by the code of the data's change alone
//! ([`Codec::parity_delta`]), and a degraded read of a range decodes that
//! range only.

use reed_solomon_simd::{ReedSolomonDecoder, ReedSolomonEncoder};

use crate::profile::Profile;

/// Shard ranges are coded in blocks of this many bytes.
pub const COLUMN: u64 = 64;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    #[error("shards of a code must be equal, non-empty multiples of {COLUMN} bytes: {0}")]
    Shape(String),
    #[error("{have} of the stripe's shards are readable; {need} are needed")]
    NotEnoughShards { have: usize, need: usize },
    #[error("the Reed-Solomon coder failed: {0}")]
    Coder(String),
}

fn coder(err: reed_solomon_simd::Error) -> CodecError {
    CodecError::Coder(err.to_string())
}

/// The coder of one profile (keeps its working space between calls).
pub struct Codec {
    profile: Profile,
    encoder: Option<ReedSolomonEncoder>,
    zeros: Vec<u8>,
}

impl Codec {
    pub fn new(profile: Profile) -> Codec {
        Codec { profile, encoder: None, zeros: Vec::new() }
    }

    pub fn profile(&self) -> &Profile {
        &self.profile
    }

    fn check_len(len: usize) -> Result<(), CodecError> {
        if len == 0 || !(len as u64).is_multiple_of(COLUMN) {
            return Err(CodecError::Shape(format!("{len} bytes")));
        }
        Ok(())
    }

    fn encoder(&mut self, len: usize) -> Result<&mut ReedSolomonEncoder, CodecError> {
        ready_encoder(&mut self.encoder, &self.profile, len)
    }

    /// The `m` parity shards of `data`, its `k` data shards.
    pub fn encode(&mut self, data: &[&[u8]]) -> Result<Vec<Vec<u8>>, CodecError> {
        if data.len() != self.profile.k() {
            return Err(CodecError::Shape(format!("{} data shards for a k of {}", data.len(), self.profile.k())));
        }
        let len = data[0].len();
        Self::check_len(len)?;
        if data.iter().any(|shard| shard.len() != len) {
            return Err(CodecError::Shape("data shards of different lengths".into()));
        }
        let encoder = self.encoder(len)?;
        for shard in data {
            encoder.add_original_shard(shard).map_err(coder)?;
        }
        let result = encoder.encode().map_err(coder)?;
        Ok(result.recovery_iter().map(<[u8]>::to_vec).collect())
    }

    /// Fills in every missing shard (`None`) of a stripe's `k + m` from any
    /// `k` present ones (data shards first, then parity, in shard order).
    pub fn reconstruct(&mut self, shards: &mut [Option<Vec<u8>>]) -> Result<(), CodecError> {
        let (k, m) = (self.profile.k(), self.profile.m());
        if shards.len() != k + m {
            return Err(CodecError::Shape(format!("{} shards for {k}+{m}", shards.len())));
        }
        let present = shards.iter().filter(|s| s.is_some()).count();
        if present < k {
            return Err(CodecError::NotEnoughShards { have: present, need: k });
        }
        let len = shards.iter().flatten().map(Vec::len).next().expect("k >= 2 present");
        Self::check_len(len)?;
        if shards.iter().flatten().any(|s| s.len() != len) {
            return Err(CodecError::Shape("shards of different lengths".into()));
        }
        if shards[..k].iter().any(Option::is_none) {
            let mut decoder = ReedSolomonDecoder::new(k, m, len).map_err(coder)?;
            for (index, shard) in shards.iter().enumerate() {
                match shard {
                    Some(bytes) if index < k => decoder.add_original_shard(index, bytes).map_err(coder)?,
                    Some(bytes) => decoder.add_recovery_shard(index - k, bytes).map_err(coder)?,
                    None => {}
                }
            }
            let restored: Vec<(usize, Vec<u8>)> =
                decoder.decode().map_err(coder)?.restored_original_iter().map(|(i, s)| (i, s.to_vec())).collect();
            for (index, bytes) in restored {
                shards[index] = Some(bytes);
            }
        }
        if shards[k..].iter().any(Option::is_none) {
            let (data, coding) = shards.split_at_mut(k);
            let refs: Vec<&[u8]> = data.iter().map(|s| s.as_deref().expect("restored")).collect();
            let parity = self.encode(&refs)?;
            for (slot, bytes) in coding.iter_mut().zip(parity) {
                if slot.is_none() {
                    *slot = Some(bytes);
                }
            }
        }
        debug_assert!(shards.iter().all(Option::is_some));
        Ok(())
    }

    /// What each parity shard's bytes over a range XOR with when data
    /// shard `shard`'s bytes over the same range change from `old` to
    /// `new` (the range is [`align`]ed: whole 64-byte columns).
    pub fn parity_delta(&mut self, shard: usize, old: &[u8], new: &[u8]) -> Result<Vec<Vec<u8>>, CodecError> {
        let k = self.profile.k();
        if shard >= k {
            return Err(CodecError::Shape(format!("shard {shard} is not one of the {k} data shards")));
        }
        if old.len() != new.len() {
            return Err(CodecError::Shape("old and new bytes of different lengths".into()));
        }
        Self::check_len(old.len())?;
        let change: Vec<u8> = old.iter().zip(new).map(|(a, b)| a ^ b).collect();
        if self.zeros.len() < change.len() {
            self.zeros.resize(change.len(), 0);
        }
        // The code of the change alone: the other data shards count as zeros.
        let Codec { profile, encoder, zeros } = self;
        let encoder = ready_encoder(encoder, profile, change.len())?;
        for index in 0..k {
            let bytes = if index == shard { &change[..] } else { &zeros[..change.len()] };
            encoder.add_original_shard(bytes).map_err(coder)?;
        }
        let result = encoder.encode().map_err(coder)?;
        Ok(result.recovery_iter().map(<[u8]>::to_vec).collect())
    }
}

/// `slot`'s encoder (made the first time) set for shards of `len` bytes.
fn ready_encoder<'a>(
    slot: &'a mut Option<ReedSolomonEncoder>,
    profile: &Profile,
    len: usize,
) -> Result<&'a mut ReedSolomonEncoder, CodecError> {
    let (k, m) = (profile.k(), profile.m());
    match slot {
        Some(encoder) => encoder.reset(k, m, len).map_err(coder)?,
        None => *slot = Some(ReedSolomonEncoder::new(k, m, len).map_err(coder)?),
    }
    Ok(slot.as_mut().expect("set above"))
}

/// `into ^= delta`: a parity delta applied.
pub fn apply_delta(into: &mut [u8], delta: &[u8]) {
    assert_eq!(into.len(), delta.len(), "a delta of another length");
    for (byte, change) in into.iter_mut().zip(delta) {
        *byte ^= change;
    }
}

/// The whole 64-byte columns covering shard bytes `[from, to)`.
pub fn align(from: u64, to: u64) -> (u64, u64) {
    (from - from % COLUMN, to.div_ceil(COLUMN) * COLUMN)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use rand::{Rng, SeedableRng};

    use super::*;

    fn stripe(profile: &Profile, len: usize, seed: u64) -> Vec<Vec<u8>> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        (0..profile.k()).map(|_| (0..len).map(|_| rng.gen()).collect()).collect()
    }

    fn codes() -> impl Strategy<Value = Profile> {
        prop_oneof![Just((2, 1)), Just((2, 2)), Just((4, 2)), Just((3, 2))]
            .prop_map(|(k, m)| Profile::new(k, m, 4096).unwrap())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Any k of the k+m shards give back all of them.
        #[test]
        fn any_k_shards_rebuild_the_stripe(profile in codes(), columns in 1usize..80, seed in any::<u64>(), lost in any::<u64>()) {
            let len = columns * COLUMN as usize;
            let data = stripe(&profile, len, seed);
            let mut codec = Codec::new(profile);
            let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
            let parity = codec.encode(&refs).unwrap();
            prop_assert_eq!(parity.len(), profile.m());
            let whole: Vec<Vec<u8>> = data.iter().cloned().chain(parity).collect();
            // Lose m shards chosen by `lost`.
            let mut shards: Vec<Option<Vec<u8>>> = whole.iter().cloned().map(Some).collect();
            let mut order: Vec<usize> = (0..profile.shards()).collect();
            let mut rng = rand::rngs::StdRng::seed_from_u64(lost);
            for i in (1..order.len()).rev() {
                order.swap(i, rng.gen_range(0..=i));
            }
            for &index in &order[..profile.m()] {
                shards[index] = None;
            }
            codec.reconstruct(&mut shards).unwrap();
            let rebuilt: Vec<Vec<u8>> = shards.into_iter().map(Option::unwrap).collect();
            prop_assert_eq!(rebuilt, whole);
        }

        /// A partial overwrite's parity, by delta, equals the parity of the
        /// whole new stripe encoded afresh (the brute-force model).
        #[test]
        fn a_parity_delta_updates_parity_as_a_full_encode_would(
            profile in codes(),
            seed in any::<u64>(),
            shard_pick in any::<usize>(),
            from in 0u64..4096,
            len in 1u64..4096,
        ) {
            let unit = 4096usize;
            let mut data = stripe(&profile, unit, seed);
            let mut codec = Codec::new(profile);
            let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
            let mut parity = codec.encode(&refs).unwrap();
            // Overwrite [from, to) of one data shard.
            let shard = shard_pick % profile.k();
            let to = (from + len).min(unit as u64);
            let (a, b) = align(from, to);
            let old = data[shard][a as usize..b as usize].to_vec();
            for byte in &mut data[shard][from as usize..to as usize] {
                *byte = byte.wrapping_mul(31).wrapping_add(7);
            }
            let new = data[shard][a as usize..b as usize].to_vec();
            let deltas = codec.parity_delta(shard, &old, &new).unwrap();
            for (parity_shard, delta) in parity.iter_mut().zip(&deltas) {
                apply_delta(&mut parity_shard[a as usize..b as usize], delta);
            }
            let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
            prop_assert_eq!(parity, codec.encode(&refs).unwrap());
        }
    }

    #[test]
    fn bad_shapes_are_errors_not_panics() {
        let profile = Profile::new(2, 1, 4096).unwrap();
        let mut codec = Codec::new(profile);
        assert!(matches!(codec.encode(&[&[0u8; 64]]), Err(CodecError::Shape(_))));
        assert!(matches!(codec.encode(&[&[0u8; 64], &[0u8; 100]]), Err(CodecError::Shape(_))));
        assert!(matches!(codec.encode(&[&[0u8; 65], &[0u8; 65]]), Err(CodecError::Shape(_))));
        let mut two_lost = vec![Some(vec![0u8; 64]), None, None];
        assert_eq!(codec.reconstruct(&mut two_lost), Err(CodecError::NotEnoughShards { have: 1, need: 2 }));
        assert!(matches!(codec.parity_delta(2, &[0; 64], &[1; 64]), Err(CodecError::Shape(_))));
        assert_eq!(align(65, 129), (64, 192));
        assert_eq!(align(0, 64), (0, 64));
    }
}
