//! Reading and writing an object with shards missing (their OSDs down):
//! any `k` shards of a stripe decode it.
//!
//! - A **degraded read** of object bytes `[offset, offset + len)` reads the
//!   stripes they touch from `k` present shards and decodes the data
//!   shards from them ([`ReadPlan`]).
//! - A **degraded write** whose read-modify-write would read a missing
//!   shard rewrites the stripes it touches whole instead: it reads them as
//!   a degraded read does, lays the write over them, and encodes every
//!   shard anew (`WritePlan::degraded`). The writes to missing shards are
//!   dropped by the caller; those shards are rebuilt when they return.

use crate::codec::{Codec, CodecError};
use crate::layout::Layout;
use crate::plan::ShardRange;
use crate::profile::Profile;

/// The stripes `[from, to)` (object offsets, whole stripes) read from `k`
/// present shards, and decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadPlan {
    profile: Profile,
    from: u64,
    to: u64,
    /// One read per shard it decodes from: the same shard range of each.
    pub reads: Vec<ShardRange>,
}

/// Why a degraded plan cannot be made.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{present} of {shards} shards present; {k} are needed to decode")]
pub struct TooFewShards {
    pub present: usize,
    pub shards: usize,
    pub k: usize,
}

impl ReadPlan {
    /// Reads of the stripes under object bytes `[offset, offset + len)`
    /// from the first `k` shards whose `present[shard]` is true (data
    /// shards first: when they are all there, nothing is decoded).
    pub fn new(profile: Profile, offset: u64, len: u64, present: &[bool]) -> Result<ReadPlan, TooFewShards> {
        let k = profile.k();
        let chosen: Vec<usize> = (0..profile.shards()).filter(|s| present.get(*s) == Some(&true)).take(k).collect();
        if chosen.len() < k {
            let present = present.iter().filter(|p| **p).count();
            return Err(TooFewShards { present, shards: profile.shards(), k });
        }
        let width = profile.stripe_width();
        let (from, to) =
            if len == 0 { (offset, offset) } else { (offset / width * width, (offset + len).div_ceil(width) * width) };
        let unit = u64::from(profile.stripe_unit());
        let (shard_from, shard_len) = (from / width * unit, (to - from) / width * unit);
        let reads = if len == 0 {
            Vec::new()
        } else {
            chosen.into_iter().map(|shard| ShardRange { shard, offset: shard_from, len: shard_len }).collect()
        };
        Ok(ReadPlan { profile, from, to, reads })
    }

    /// The object bytes of the whole stripes read (`[from, to)`), from what
    /// each read returned (short: the shard ends there, zeros follow).
    pub fn stripes(&self, codec: &mut Codec, read: &[Vec<u8>]) -> Result<Vec<u8>, CodecError> {
        if read.len() != self.reads.len() {
            return Err(CodecError::Shape(format!("{} answers for {} reads", read.len(), self.reads.len())));
        }
        let Some(first) = self.reads.first() else { return Ok(Vec::new()) };
        let (shard_from, shard_len) = (first.offset, first.len as usize);
        let mut shards: Vec<Option<Vec<u8>>> = vec![None; self.profile.shards()];
        for (range, bytes) in self.reads.iter().zip(read) {
            let mut bytes = bytes[..bytes.len().min(shard_len)].to_vec();
            bytes.resize(shard_len, 0);
            shards[range.shard] = Some(bytes);
        }
        codec.reconstruct(&mut shards)?;
        let layout = Layout::new(&self.profile);
        let mut object = vec![0; (self.to - self.from) as usize];
        for piece in layout.pieces(self.from, self.to - self.from) {
            let shard = shards[piece.shard].as_ref().expect("reconstructed");
            let at = (piece.shard_offset - shard_from) as usize;
            let into = (piece.object_offset - self.from) as usize;
            object[into..into + piece.len as usize].copy_from_slice(&shard[at..at + piece.len as usize]);
        }
        Ok(object)
    }

    /// Object bytes `[offset, offset + len)` (within the plan's stripes).
    pub fn range(&self, codec: &mut Codec, read: &[Vec<u8>], offset: u64, len: u64) -> Result<Vec<u8>, CodecError> {
        if offset < self.from || offset + len > self.to.max(self.from) {
            return Err(CodecError::Shape(format!(
                "bytes {offset}+{len} outside the stripes {}..{}",
                self.from, self.to
            )));
        }
        let stripes = self.stripes(codec, read)?;
        let at = (offset - self.from) as usize;
        Ok(stripes[at..at + len as usize].to_vec())
    }

    pub fn profile(&self) -> &Profile {
        &self.profile
    }

    /// The object offsets of the stripes it reads.
    pub fn span(&self) -> (u64, u64) {
        (self.from, self.to)
    }
}
