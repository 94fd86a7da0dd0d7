//! What a write to an EC object takes: the shard bytes to read first, and
//! from them the writes to each shard.
//!
//! - A write that covers whole stripes reads nothing: its data shards'
//!   bytes are the write's, and its parity their code.
//! - Any other write is a read-modify-write of the bytes it changes only:
//!   it reads the old bytes of each data shard it touches (whole 64-byte
//!   columns around them) and each parity shard's bytes over the same
//!   columns, then writes the new data, and each parity shard's old bytes
//!   XOR the code of the data's change ([`Codec::parity_delta`]). The
//!   rest of the stripe is neither read nor written: a 4 KiB write to a
//!   2+1 object reads 4 KiB of data and 4 KiB of parity, and writes both.
//!
//! Bytes past a shard's end read as zeros (a thin object, or one growing).
//! Every shard write of one client write must land together or not at all
//! (the OSD's log holds them as one transaction): a reader must never see
//! a stripe whose data and parity disagree.

use crate::codec::{align, apply_delta, Codec, CodecError};
use crate::degraded::{ReadPlan, TooFewShards};
use crate::layout::Layout;
use crate::profile::Profile;

/// Bytes `[offset, offset + len)` of shard `shard` (data shards first,
/// then parity).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardRange {
    pub shard: usize,
    pub offset: u64,
    pub len: u64,
}

/// New bytes for shard `shard` at `offset`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardWrite {
    pub shard: usize,
    pub offset: u64,
    pub data: Vec<u8>,
}

/// The plan of one write of `len` bytes at object offset `offset`.
#[derive(Clone, Debug)]
pub struct WritePlan {
    profile: Profile,
    offset: u64,
    len: u64,
    /// The shard bytes to read first, in the order [`WritePlan::shard_writes`] takes them.
    pub reads: Vec<ShardRange>,
    /// A degraded write's stripes, read whole and decoded (`None`: a
    /// read-modify-write of the changed columns, or whole stripes).
    stripes: Option<ReadPlan>,
}

impl WritePlan {
    pub fn new(profile: Profile, offset: u64, len: u64) -> WritePlan {
        let width = profile.stripe_width();
        let whole_stripes = len > 0 && offset.is_multiple_of(width) && len.is_multiple_of(width);
        let mut reads = Vec::new();
        if !whole_stripes && len > 0 {
            let touched = touched_columns(&profile, offset, len);
            reads.extend(touched.iter().map(|&(shard, from, to)| ShardRange { shard, offset: from, len: to - from }));
            let (from, to) = parity_columns(&touched);
            reads.extend((0..profile.m()).map(|j| ShardRange { shard: profile.k() + j, offset: from, len: to - from }));
        }
        WritePlan { profile, offset, len, reads, stripes: None }
    }

    /// The plan of a write to an object whose shards `present[shard]` says
    /// are there: [`WritePlan::new`]'s when it reads no missing shard, else
    /// a rewrite of the stripes it touches, decoded from `k` present shards
    /// (`crate::degraded`). Its writes cover every shard, missing ones too:
    /// the caller drops those.
    pub fn degraded(profile: Profile, offset: u64, len: u64, present: &[bool]) -> Result<WritePlan, TooFewShards> {
        let plan = WritePlan::new(profile, offset, len);
        if plan.reads.iter().all(|r| present.get(r.shard) == Some(&true)) {
            return Ok(plan);
        }
        let stripes = ReadPlan::new(profile, offset, len, present)?;
        Ok(WritePlan { reads: stripes.reads.clone(), stripes: Some(stripes), ..plan })
    }

    /// Whether it rewrites whole stripes decoded from the shards present.
    pub fn is_degraded(&self) -> bool {
        self.stripes.is_some()
    }

    /// Whether the write covers whole stripes (and reads nothing).
    pub fn whole_stripes(&self) -> bool {
        self.len > 0 && self.reads.is_empty()
    }

    /// The writes to each shard, given `data` (the write's `len` bytes)
    /// and what each of [`WritePlan::reads`] returned (short reads: the
    /// shard ends there, and the rest reads as zeros).
    pub fn shard_writes(
        &self,
        codec: &mut Codec,
        data: &[u8],
        read: &[Vec<u8>],
    ) -> Result<Vec<ShardWrite>, CodecError> {
        if data.len() as u64 != self.len || read.len() != self.reads.len() {
            return Err(CodecError::Shape(format!(
                "{} bytes and {} reads for a plan of {} bytes and {} reads",
                data.len(),
                read.len(),
                self.len,
                self.reads.len()
            )));
        }
        if self.len == 0 {
            return Ok(Vec::new());
        }
        let layout = Layout::new(&self.profile);
        if let Some(stripes) = &self.stripes {
            let (from, to) = stripes.span();
            let mut object = stripes.stripes(codec, read)?;
            debug_assert_eq!(object.len() as u64, to - from);
            let at = (self.offset - from) as usize;
            object[at..at + data.len()].copy_from_slice(data);
            return self.encode_stripes(codec, &layout, from, &object);
        }
        if self.whole_stripes() {
            return self.encode_stripes(codec, &layout, self.offset, data);
        }
        let (k, m) = (self.profile.k(), self.profile.m());
        let padded = |bytes: &[u8], len: u64| {
            let mut out = bytes[..bytes.len().min(len as usize)].to_vec();
            out.resize(len as usize, 0);
            out
        };
        let touched = &self.reads[..self.reads.len() - m];
        let parity_range = self.reads[self.reads.len() - m];
        let mut parity: Vec<Vec<u8>> =
            read[touched.len()..].iter().map(|bytes| padded(bytes, parity_range.len)).collect();
        let pieces = layout.pieces(self.offset, self.len);
        let mut writes = Vec::new();
        for (range, old) in touched.iter().zip(read) {
            let old = padded(old, range.len);
            let mut new = old.clone();
            // The write's bytes in this shard: one contiguous run of it.
            let mut written: Option<(u64, u64)> = None;
            for piece in pieces.iter().filter(|p| p.shard == range.shard) {
                let at = (piece.shard_offset - range.offset) as usize;
                let from = (piece.object_offset - self.offset) as usize;
                new[at..at + piece.len as usize].copy_from_slice(&data[from..from + piece.len as usize]);
                let end = piece.shard_offset + piece.len;
                written =
                    Some(written.map_or((piece.shard_offset, end), |(a, b)| (a.min(piece.shard_offset), b.max(end))));
            }
            let (from, to) = written.expect("a touched shard has a piece of the write");
            debug_assert!(range.offset <= from && to <= range.offset + range.len);
            let deltas = codec.parity_delta(range.shard, &old, &new)?;
            let at = (range.offset - parity_range.offset) as usize;
            for (parity, delta) in parity.iter_mut().zip(&deltas) {
                apply_delta(&mut parity[at..at + delta.len()], delta);
            }
            let cut = (from - range.offset) as usize..(to - range.offset) as usize;
            writes.push(ShardWrite { shard: range.shard, offset: from, data: new[cut].to_vec() });
        }
        debug_assert_eq!(parity.len(), m);
        for (j, bytes) in parity.into_iter().enumerate() {
            writes.push(ShardWrite { shard: k + j, offset: parity_range.offset, data: bytes });
        }
        Ok(writes)
    }

    /// Whole stripes `data` at object offset `offset`: each data shard's
    /// run of units, and their code.
    fn encode_stripes(
        &self,
        codec: &mut Codec,
        layout: &Layout,
        offset: u64,
        data: &[u8],
    ) -> Result<Vec<ShardWrite>, CodecError> {
        let k = self.profile.k();
        let unit = self.profile.stripe_unit() as u64;
        let len = data.len() as u64;
        debug_assert!(
            offset.is_multiple_of(self.profile.stripe_width()) && len.is_multiple_of(self.profile.stripe_width())
        );
        let stripes = len / self.profile.stripe_width();
        let shard_offset = offset / self.profile.stripe_width() * unit;
        let mut shards = vec![Vec::with_capacity((stripes * unit) as usize); k];
        for piece in layout.pieces(offset, len) {
            let from = (piece.object_offset - offset) as usize;
            shards[piece.shard].extend_from_slice(&data[from..from + piece.len as usize]);
        }
        let refs: Vec<&[u8]> = shards.iter().map(Vec::as_slice).collect();
        let parity = codec.encode(&refs)?;
        Ok(shards
            .into_iter()
            .chain(parity)
            .enumerate()
            .map(|(shard, data)| ShardWrite { shard, offset: shard_offset, data })
            .collect())
    }
}

/// Each touched data shard and the whole columns around the bytes the
/// write changes in it: `(shard, from, to)`, by shard.
fn touched_columns(profile: &Profile, offset: u64, len: u64) -> Vec<(usize, u64, u64)> {
    let layout = Layout::new(profile);
    let mut spans: Vec<Option<(u64, u64)>> = vec![None; profile.k()];
    for piece in layout.pieces(offset, len) {
        let end = piece.shard_offset + piece.len;
        let span = &mut spans[piece.shard];
        *span = Some(span.map_or((piece.shard_offset, end), |(a, b)| (a.min(piece.shard_offset), b.max(end))));
    }
    spans
        .into_iter()
        .enumerate()
        .filter_map(|(shard, span)| {
            let (from, to) = align(span?.0, span?.1);
            Some((shard, from, to))
        })
        .collect()
}

/// The parity columns a write changes: those of every touched data shard.
fn parity_columns(touched: &[(usize, u64, u64)]) -> (u64, u64) {
    let from = touched.iter().map(|t| t.1).min().expect("a write touches a shard");
    let to = touched.iter().map(|t| t.2).max().expect("a write touches a shard");
    (from, to)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use rand::{Rng, SeedableRng};

    use super::*;

    /// An object's shards in memory, and the object they must read as.
    struct Model {
        profile: Profile,
        shards: Vec<Vec<u8>>,
        object: Vec<u8>,
    }

    impl Model {
        /// An object of `size` random bytes, encoded.
        fn new(profile: Profile, size: u64, seed: u64) -> Model {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let object: Vec<u8> = (0..size).map(|_| rng.gen()).collect();
            let mut model = Model { profile, shards: vec![Vec::new(); profile.shards()], object: Vec::new() };
            if size > 0 {
                // A first write of the whole object, as any write: stripes then a tail.
                model.write(0, &object);
            }
            model
        }

        fn read(&self, range: &ShardRange) -> Vec<u8> {
            let shard = &self.shards[range.shard];
            let from = (range.offset as usize).min(shard.len());
            let to = ((range.offset + range.len) as usize).min(shard.len());
            shard[from..to].to_vec() // short past the end, as a store read
        }

        fn write(&mut self, offset: u64, data: &[u8]) -> WritePlan {
            // Every shard present: the plan is `WritePlan::new`'s.
            let present = vec![true; self.profile.shards()];
            self.write_degraded(offset, data, &present)
        }

        /// A write with the shards `present` says are missing left alone,
        /// and the plan (which never reads a missing shard).
        fn write_degraded(&mut self, offset: u64, data: &[u8], present: &[bool]) -> WritePlan {
            let plan = WritePlan::degraded(self.profile, offset, data.len() as u64, present).unwrap();
            assert!(plan.reads.iter().all(|r| present[r.shard]), "a degraded plan reads a missing shard");
            let read: Vec<Vec<u8>> = plan.reads.iter().map(|r| self.read(r)).collect();
            let mut codec = Codec::new(self.profile);
            for write in plan.shard_writes(&mut codec, data, &read).unwrap() {
                if !present[write.shard] {
                    continue;
                }
                let shard = &mut self.shards[write.shard];
                let end = write.offset as usize + write.data.len();
                if shard.len() < end {
                    shard.resize(end, 0);
                }
                shard[write.offset as usize..end].copy_from_slice(&write.data);
            }
            let end = offset as usize + data.len();
            if self.object.len() < end {
                self.object.resize(end, 0);
            }
            self.object[offset as usize..end].copy_from_slice(data);
            plan
        }

        /// The missing shards, decoded whole from the present ones (as
        /// recovery rebuilds them).
        fn rebuild(&mut self, present: &[bool]) {
            let len = self.shards.iter().map(Vec::len).max().unwrap_or(0);
            let len = len.div_ceil(self.profile.stripe_unit() as usize) * self.profile.stripe_unit() as usize;
            if len == 0 {
                return;
            }
            let mut shards: Vec<Option<Vec<u8>>> = self
                .shards
                .iter()
                .zip(present)
                .map(|(s, p)| {
                    p.then(|| {
                        let mut s = s.clone();
                        s.resize(len, 0);
                        s
                    })
                })
                .collect();
            Codec::new(self.profile).reconstruct(&mut shards).unwrap();
            for (shard, bytes) in self.shards.iter_mut().zip(shards) {
                *shard = bytes.unwrap();
            }
            let stripes = Layout::new(&self.profile).shard_size(self.object.len() as u64) as usize;
            for shard in &mut self.shards {
                shard.truncate(stripes.max(shard.iter().rposition(|b| *b != 0).map_or(0, |p| p + 1)));
            }
        }

        /// The object through the layout, and whether every stripe's
        /// parity is the code of its data (shards padded with zeros).
        fn check(&self) -> Result<(), TestCaseError> {
            let layout = Layout::new(&self.profile);
            let shard_len = layout.shard_size(self.object.len() as u64) as usize;
            let padded: Vec<Vec<u8>> = self
                .shards
                .iter()
                .map(|s| {
                    prop_assert!(s.len() <= shard_len, "a shard past the object's stripes");
                    let mut s = s.clone();
                    s.resize(shard_len, 0);
                    Ok(s)
                })
                .collect::<Result<_, TestCaseError>>()?;
            for piece in layout.pieces(0, self.object.len() as u64) {
                let at = piece.shard_offset as usize;
                let want = &self.object[piece.object_offset as usize..(piece.object_offset + piece.len) as usize];
                prop_assert_eq!(&padded[piece.shard][at..at + piece.len as usize], want);
            }
            if shard_len > 0 {
                let k = self.profile.k();
                let refs: Vec<&[u8]> = padded[..k].iter().map(Vec::as_slice).collect();
                let parity = Codec::new(self.profile).encode(&refs).unwrap();
                prop_assert!(parity == padded[k..], "a stripe whose parity is not its data's code");
            }
            Ok(())
        }
    }

    fn codes() -> impl Strategy<Value = Profile> {
        prop_oneof![Just((2, 1)), Just((2, 2)), Just((4, 2))].prop_map(|(k, m)| Profile::new(k, m, 4096).unwrap())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]

        /// Any sequence of writes, planned and applied shard by shard,
        /// leaves shards that read as the object and parity that is the
        /// code of the data (the brute-force model: a full re-encode).
        #[test]
        fn planned_writes_keep_every_stripe_consistent(
            profile in codes(),
            size in 0u64..100_000,
            seed in any::<u64>(),
            writes in prop::collection::vec((0u64..120_000, 1u64..40_000, any::<u8>()), 1..6),
        ) {
            let mut model = Model::new(profile, size, seed);
            model.check()?;
            for (offset, len, fill) in writes {
                let data: Vec<u8> = (0..len).map(|i| fill ^ (i as u8)).collect();
                model.write(offset, &data);
                model.check()?;
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// With up to `m` shards missing, reads decode the object and
        /// writes keep the present shards such that the missing ones,
        /// decoded from them, complete consistent stripes.
        #[test]
        fn degraded_reads_and_writes_match_the_model(
            profile in codes(),
            size in 0u64..60_000,
            seed in any::<u64>(),
            missing in prop::collection::vec(0usize..6, 1..3),
            writes in prop::collection::vec((0u64..70_000, 1u64..20_000, any::<u8>()), 1..5),
            reads in prop::collection::vec((0u64..80_000, 0u64..20_000), 1..4),
        ) {
            let mut model = Model::new(profile, size, seed);
            let mut present = vec![true; profile.shards()];
            for shard in missing.iter().take(profile.m()) {
                present[shard % profile.shards()] = false;
            }
            for (offset, len, fill) in writes {
                let data: Vec<u8> = (0..len).map(|i| fill ^ (i as u8)).collect();
                model.write_degraded(offset, &data, &present);
            }
            for (offset, len) in reads {
                let plan = ReadPlan::new(profile, offset, len, &present).unwrap();
                prop_assert!(plan.reads.iter().all(|r| present[r.shard]));
                let read: Vec<Vec<u8>> = plan.reads.iter().map(|r| model.read(r)).collect();
                let got = plan.range(&mut Codec::new(profile), &read, offset, len).unwrap();
                let mut want = model.object.get(offset as usize..).unwrap_or(&[]).to_vec();
                want.truncate(len as usize);
                want.resize(len as usize, 0);
                prop_assert!(got == want, "a degraded read of {}+{} differs from the object", offset, len);
            }
            model.rebuild(&present);
            model.check()?;
        }
    }

    #[test]
    fn a_degraded_write_reads_the_stripe_from_k_present_shards_only_when_it_must() {
        let profile = Profile::new(2, 1, 4096).unwrap();
        // Data shard 1 missing: a write to it rewrites its stripe from shards 0 and 2.
        let plan = WritePlan::degraded(profile, 12 << 10, 4096, &[true, false, true]).unwrap();
        assert!(plan.is_degraded());
        assert_eq!(
            plan.reads,
            vec![ShardRange { shard: 0, offset: 4096, len: 4096 }, ShardRange { shard: 2, offset: 4096, len: 4096 }]
        );
        // Shard 0 missing: a write to shard 1 reads only shard 1 and parity, as usual.
        assert!(!WritePlan::degraded(profile, 12 << 10, 4096, &[false, true, true]).unwrap().is_degraded());
        // Fewer than k: no plan.
        let err = WritePlan::degraded(profile, 12 << 10, 4096, &[false, false, true]).unwrap_err();
        assert_eq!(err, TooFewShards { present: 1, shards: 3, k: 2 });
    }

    #[test]
    fn a_small_write_reads_and_writes_only_its_columns() {
        let profile = Profile::new(2, 1, 4096).unwrap();
        let mut model = Model::new(profile, 64 << 10, 7);
        // 4 KiB at 12 KiB: the second unit of stripe 1, data shard 1.
        let plan = model.write(12 << 10, &[9u8; 4096]);
        assert!(!plan.whole_stripes());
        assert_eq!(
            plan.reads,
            vec![ShardRange { shard: 1, offset: 4096, len: 4096 }, ShardRange { shard: 2, offset: 4096, len: 4096 }],
            "the old data of the range and the parity over it, nothing else"
        );
        // A whole stripe reads nothing.
        let plan = model.write(8 << 10, &[3u8; 8192]);
        assert!(plan.whole_stripes() && plan.reads.is_empty());
        let mut codec = Codec::new(profile);
        let writes = plan.shard_writes(&mut codec, &[3u8; 8192], &[]).unwrap();
        assert_eq!(
            writes.iter().map(|w| (w.shard, w.offset, w.data.len())).collect::<Vec<_>>(),
            vec![(0, 4096, 4096), (1, 4096, 4096), (2, 4096, 4096)]
        );
        // Wrong inputs are errors.
        assert!(matches!(plan.shard_writes(&mut codec, &[0u8; 10], &[]), Err(CodecError::Shape(_))));
    }
}
