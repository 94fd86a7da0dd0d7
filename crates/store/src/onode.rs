//! Onodes: an object's metadata, serialised into a blob and stored in a
//! chain of 512-byte slots in the partition's onode area.
//!
//! Slot format (512 bytes, little-endian):
//! ```text
//! 0   magic u16 = 0xD0DE      2  kind u8 (1 head, 2 continuation)   3  flags u8 (head: 1 = deleted)
//! 4   crc32c u32 (of the slot, field excluded)
//! 8   head slot u32           12 next slot u32 (u32::MAX = end)     16 index in chain u16
//! 18  fragment length u16     20 blob length u32 (whole chain)      24 fragment (488 bytes)
//! ```
//! Blob format:
//! ```text
//! key length u8, key, size u64, flags u8 (1 = preallocated),
//! extent count u32, extents (logical block u32, physical data block u32, block count u32)...,
//! attribute count u16, attributes (name length u8, name, value length u16, value)...
//! [omap count u32, omap entries (key length u8, key, value length u16, value)...]
//! ```
//! The omap section (an object's ordered key-value pairs) is present only
//! when the object has entries: a blob without it is one from before omaps
//! existed, and a binary from then refuses one with it (trailing bytes)
//! rather than dropping it. It lives in the blob, not in chains of its own,
//! because what reads it (the dedup tier's chunk maps) reads or rewrites it
//! whole, a few KiB per object, and an object's data writes that change no
//! extent never rewrite the blob.
//! A deleted object keeps its chain (flag on the head) until its space is
//! reclaimed: that is the delayed deallocation of DESIGN.md §7.

use crate::codec::{seal, verify_seal, Reader, Writer};
use crate::error::{Result, StoreError};
use crate::key::Key;
use crate::{
    BLOCK_SIZE, MAX_ATTR_BYTES, MAX_ATTR_NAME_LEN, MAX_ATTR_VALUE_LEN, MAX_OBJECT_SIZE, MAX_OMAP_BYTES,
    MAX_OMAP_KEY_LEN, MAX_OMAP_VALUE_LEN, SLOT_SIZE,
};

pub const SLOT_MAGIC: u16 = 0xD0DE;
pub const KIND_HEAD: u8 = 1;
pub const KIND_CONTINUATION: u8 = 2;
pub const HEAD_FLAG_DELETED: u8 = 1;
pub const NO_SLOT: u32 = u32::MAX;
pub const FRAGMENT_CAPACITY: usize = SLOT_SIZE - 24;
const SLOT_CRC_AT: usize = 4;
pub const OBJECT_FLAG_PREALLOCATED: u8 = 1;
/// Some of the object's blocks may be shared with other objects (it was
/// cloned, or is a clone): mount counts the references of such objects only.
pub const OBJECT_FLAG_SHARES: u8 = 2;
/// Longest chain: bounds the blob (and so one object's metadata). It holds
/// the largest blob the limits allow (`worst_case_blob_len`), so that no
/// metadata change of an object within them can be refused for its size:
/// a logged write the store could not apply would stop its PG. (It was 512
/// before omaps; a build from then refuses a longer chain as corrupt.)
pub const MAX_CHAIN_SLOTS: usize = 1024;

/// The largest blob the limits allow: the longest key, a 64 MiB object
/// mapped one block per extent, and the attribute and omap budgets spent
/// on as many entries as they can name uniquely (the 256 one-byte names,
/// then two-byte ones, with empty values), each paying its 3 bytes of
/// framing.
pub const fn worst_case_blob_len() -> usize {
    const fn most_entries(budget: usize) -> usize {
        256 + (budget - 256) / 2
    }
    let extents = (MAX_OBJECT_SIZE as usize / BLOCK_SIZE) * 12;
    let attrs = MAX_ATTR_BYTES + most_entries(MAX_ATTR_BYTES) * 3;
    let omap = 4 + MAX_OMAP_BYTES + most_entries(MAX_OMAP_BYTES) * 3;
    1 + crate::MAX_KEY_LEN + 8 + 1 + 4 + extents + 2 + attrs + omap
}

const _: () = assert!(
    worst_case_blob_len() <= MAX_CHAIN_SLOTS * FRAGMENT_CAPACITY,
    "an object within every limit could outgrow its onode chain"
);

/// `len` data blocks mapped contiguously: logical block `logical + i` of the
/// object lives in partition data block `physical + i`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub logical: u32,
    pub physical: u32,
    pub len: u32,
}

impl Extent {
    pub fn logical_end(&self) -> u32 {
        self.logical + self.len
    }
    pub fn physical_for(&self, logical: u32) -> Option<u32> {
        (self.logical..self.logical_end()).contains(&logical).then(|| self.physical + (logical - self.logical))
    }
}

/// Everything stored about one object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectMeta {
    pub key: Key,
    pub size: u64,
    pub flags: u8,
    /// Sorted by logical block, non-overlapping.
    pub extents: Vec<Extent>,
    /// Sorted by name, names unique.
    pub attrs: Vec<(Vec<u8>, Vec<u8>)>,
    /// The omap: sorted by key, keys unique.
    pub omap: Vec<(Vec<u8>, Vec<u8>)>,
}

impl ObjectMeta {
    pub fn new(key: Key) -> ObjectMeta {
        ObjectMeta { key, size: 0, flags: 0, extents: Vec::new(), attrs: Vec::new(), omap: Vec::new() }
    }

    /// Bytes of [`ObjectMeta::encode`]'s blob.
    pub fn encoded_len(&self) -> usize {
        let attr_bytes: usize = self.attrs.iter().map(|(n, v)| 3 + n.len() + v.len()).sum();
        let omap_bytes: usize = match self.omap.is_empty() {
            true => 0,
            false => 4 + self.omap.iter().map(|(k, v)| 3 + k.len() + v.len()).sum::<usize>(),
        };
        1 + self.key.as_bytes().len() + 8 + 1 + 4 + 12 * self.extents.len() + 2 + attr_bytes + omap_bytes
    }

    pub fn encode(&self) -> Vec<u8> {
        debug_assert!(self.size <= MAX_OBJECT_SIZE, "object of {} bytes", self.size);
        debug_assert!(
            self.extents.windows(2).all(|w| w[0].logical_end() <= w[1].logical)
                && self.extents.iter().all(|e| e.len > 0),
            "extents unsorted, overlapping or empty: {:?}",
            self.extents
        );
        debug_assert!(self.attrs.windows(2).all(|w| w[0].0 < w[1].0), "attributes unsorted or duplicated");
        debug_assert!(self.omap.windows(2).all(|w| w[0].0 < w[1].0), "omap keys unsorted or duplicated");
        let key = self.key.as_bytes();
        let mut blob = vec![0u8; self.encoded_len()];
        let mut w = Writer::new(&mut blob);
        w.u8(key.len() as u8);
        w.bytes(key);
        w.u64(self.size);
        w.u8(self.flags);
        w.u32(self.extents.len() as u32);
        for e in &self.extents {
            w.u32(e.logical);
            w.u32(e.physical);
            w.u32(e.len);
        }
        w.u16(self.attrs.len() as u16);
        for (name, value) in &self.attrs {
            w.u8(name.len() as u8);
            w.bytes(name);
            w.u16(value.len() as u16);
            w.bytes(value);
        }
        if !self.omap.is_empty() {
            w.u32(self.omap.len() as u32);
            for (key, value) in &self.omap {
                w.u8(key.len() as u8);
                w.bytes(key);
                w.u16(value.len() as u16);
                w.bytes(value);
            }
        }
        debug_assert_eq!(w.pos(), blob.len());
        debug_assert!(
            ObjectMeta::decode(&blob, u64::MAX).is_ok_and(|decoded| decoded == *self),
            "an encoded onode does not decode to itself: {self:?}"
        );
        blob
    }

    /// Decodes and validates a blob against `data_blocks` (the partition's
    /// data area size): extents sorted, disjoint, inside the object and the area.
    pub fn decode(blob: &[u8], data_blocks: u64) -> Result<ObjectMeta> {
        let mut r = Reader::new(blob, "onode");
        let key_len = r.u8()? as usize;
        let key = Key::new(r.bytes(key_len)?).map_err(|_| StoreError::corrupt("onode: bad key length"))?;
        let size = r.u64()?;
        let flags = r.u8()?;
        if size > MAX_OBJECT_SIZE {
            return Err(StoreError::corrupt(format!("onode: size {size} exceeds the maximum")));
        }
        let extent_count = r.u32()? as usize;
        if extent_count * 12 > r.remaining() {
            return Err(StoreError::corrupt("onode: extent count exceeds the blob"));
        }
        let mut extents = Vec::with_capacity(extent_count);
        let size_blocks = size.div_ceil(BLOCK_SIZE as u64);
        for _ in 0..extent_count {
            let e = Extent { logical: r.u32()?, physical: r.u32()?, len: r.u32()? };
            if e.len == 0
                || e.logical as u64 + e.len as u64 > size_blocks
                || e.physical as u64 + e.len as u64 > data_blocks
                || extents.last().is_some_and(|p: &Extent| p.logical_end() > e.logical)
            {
                return Err(StoreError::corrupt(format!("onode: bad extent {e:?} (size {size})")));
            }
            extents.push(e);
        }
        let attr_count = r.u16()? as usize;
        let mut attrs: Vec<(Vec<u8>, Vec<u8>)> = Vec::with_capacity(attr_count.min(256));
        for _ in 0..attr_count {
            let name_len = r.u8()? as usize;
            let name = r.bytes(name_len)?.to_vec();
            let value_len = r.u16()? as usize;
            let value = r.bytes(value_len)?.to_vec();
            if name.is_empty() || value.len() > MAX_ATTR_VALUE_LEN || attrs.last().is_some_and(|(p, _)| *p >= name) {
                return Err(StoreError::corrupt("onode: attributes unsorted, duplicated or oversized"));
            }
            attrs.push((name, value));
        }
        let mut omap: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        if r.remaining() != 0 {
            let count = r.u32()? as usize;
            // Each entry takes 4 bytes at least: a count past that is a lie.
            if count == 0 || count.saturating_mul(4) > r.remaining() {
                return Err(StoreError::corrupt("onode: bad omap entry count"));
            }
            omap.reserve(count);
            let mut bytes = 0usize;
            for _ in 0..count {
                let key_len = r.u8()? as usize;
                let key = r.bytes(key_len)?.to_vec();
                let value_len = r.u16()? as usize;
                let value = r.bytes(value_len)?.to_vec();
                bytes += key.len() + value.len();
                if key.is_empty()
                    || value.len() > MAX_OMAP_VALUE_LEN
                    || bytes > MAX_OMAP_BYTES
                    || omap.last().is_some_and(|(p, _)| *p >= key)
                {
                    return Err(StoreError::corrupt("onode: omap unsorted, duplicated or oversized"));
                }
                omap.push((key, value));
            }
        }
        if r.remaining() != 0 {
            return Err(StoreError::corrupt("onode: trailing bytes"));
        }
        let meta = ObjectMeta { key, size, flags, extents, attrs, omap };
        // Every field read back is one the encoder writes: the sizes agree.
        debug_assert_eq!(meta.encoded_len(), blob.len());
        Ok(meta)
    }

    pub fn is_preallocated(&self) -> bool {
        self.flags & OBJECT_FLAG_PREALLOCATED != 0
    }

    /// The data block holding logical block `logical`, if allocated.
    pub fn physical_for(&self, logical: u32) -> Option<u32> {
        let index = self.extents.partition_point(|e| e.logical_end() <= logical);
        self.extents.get(index).and_then(|e| e.physical_for(logical))
    }

    /// Maps logical block `logical` to `physical`, merging with neighbours.
    pub fn map_block(&mut self, logical: u32, physical: u32) {
        debug_assert!(self.physical_for(logical).is_none(), "block {logical} mapped twice");
        let index = self.extents.partition_point(|e| e.logical_end() <= logical);
        if index > 0 {
            let previous = &mut self.extents[index - 1];
            if previous.logical_end() == logical && previous.physical + previous.len == physical {
                previous.len += 1;
                if let Some(next) = self.extents.get(index).copied() {
                    let previous = &mut self.extents[index - 1];
                    if next.logical == logical + 1 && next.physical == physical + 1 {
                        previous.len += next.len;
                        self.extents.remove(index);
                    }
                }
                return;
            }
        }
        if let Some(next) = self.extents.get_mut(index) {
            if next.logical == logical + 1 && next.physical == physical + 1 {
                next.logical -= 1;
                next.physical -= 1;
                next.len += 1;
                return;
            }
        }
        self.extents.insert(index, Extent { logical, physical, len: 1 });
        debug_assert_eq!(self.physical_for(logical), Some(physical));
    }

    /// Unmaps logical block `logical`; returns the data block it mapped.
    pub fn unmap_block(&mut self, logical: u32) -> Option<u32> {
        let index = self.extents.partition_point(|e| e.logical_end() <= logical);
        let extent = *self.extents.get(index)?;
        let physical = extent.physical_for(logical)?;
        let before = logical - extent.logical;
        let after = extent.len - before - 1;
        let mut pieces = Vec::with_capacity(2);
        if before > 0 {
            pieces.push(Extent { logical: extent.logical, physical: extent.physical, len: before });
        }
        if after > 0 {
            pieces.push(Extent { logical: logical + 1, physical: physical + 1, len: after });
        }
        self.extents.splice(index..=index, pieces);
        debug_assert!(self.physical_for(logical).is_none(), "block {logical} still mapped");
        Some(physical)
    }

    /// Unmaps every block at or past logical block `first`; returns the freed
    /// physical runs as `(start, count)`.
    pub fn unmap_from(&mut self, first: u32) -> Vec<(u32, u32)> {
        let mut freed = Vec::new();
        self.extents.retain_mut(|e| {
            if e.logical >= first {
                freed.push((e.physical, e.len));
                false
            } else if e.logical_end() > first {
                let keep = first - e.logical;
                freed.push((e.physical + keep, e.len - keep));
                e.len = keep;
                true
            } else {
                true
            }
        });
        debug_assert!(
            self.extents.last().is_none_or(|e| e.logical_end() <= first),
            "a block past {first} stays mapped"
        );
        debug_assert!(freed.iter().all(|(_, count)| *count > 0), "an empty freed run");
        freed
    }

    /// Validates a change to the attributes against the limits.
    pub fn check_attr(name: &[u8], value: &[u8]) -> Result<()> {
        if name.is_empty() || name.len() > MAX_ATTR_NAME_LEN {
            return Err(StoreError::invalid(format!(
                "attribute name length {} is outside 1..={MAX_ATTR_NAME_LEN}",
                name.len()
            )));
        }
        if value.len() > MAX_ATTR_VALUE_LEN {
            return Err(StoreError::invalid(format!(
                "attribute value of {} bytes exceeds {MAX_ATTR_VALUE_LEN}",
                value.len()
            )));
        }
        Ok(())
    }

    pub fn attr_bytes(&self) -> usize {
        self.attrs.iter().map(|(n, v)| n.len() + v.len()).sum()
    }

    pub fn set_attr(&mut self, name: &[u8], value: &[u8]) -> Result<()> {
        Self::check_attr(name, value)?;
        let index = self.attrs.partition_point(|(n, _)| n.as_slice() < name);
        let replaced = match self.attrs.get(index) {
            Some((n, _)) if n.as_slice() == name => Some(index),
            _ => None,
        };
        let old_len = replaced.map_or(0, |i| self.attrs[i].0.len() + self.attrs[i].1.len());
        if self.attr_bytes() - old_len + name.len() + value.len() > MAX_ATTR_BYTES {
            return Err(StoreError::invalid(format!(
                "attributes of one object may total at most {MAX_ATTR_BYTES} bytes"
            )));
        }
        match replaced {
            Some(i) => self.attrs[i].1 = value.to_vec(),
            None => self.attrs.insert(index, (name.to_vec(), value.to_vec())),
        }
        debug_assert!(self.attr_bytes() <= MAX_ATTR_BYTES);
        debug_assert!(self.attrs.windows(2).all(|w| w[0].0 < w[1].0), "attributes unsorted or duplicated");
        Ok(())
    }

    pub fn remove_attr(&mut self, name: &[u8]) {
        self.attrs.retain(|(n, _)| n.as_slice() != name);
    }

    pub fn attr(&self, name: &[u8]) -> Option<&[u8]> {
        self.attrs.iter().find(|(n, _)| n.as_slice() == name).map(|(_, v)| v.as_slice())
    }

    /// Validates one omap entry against the limits.
    pub fn check_omap_entry(key: &[u8], value: &[u8]) -> Result<()> {
        if key.is_empty() || key.len() > MAX_OMAP_KEY_LEN {
            return Err(StoreError::invalid(format!(
                "omap key length {} is outside 1..={MAX_OMAP_KEY_LEN}",
                key.len()
            )));
        }
        if value.len() > MAX_OMAP_VALUE_LEN {
            return Err(StoreError::invalid(format!(
                "omap value of {} bytes exceeds {MAX_OMAP_VALUE_LEN}",
                value.len()
            )));
        }
        Ok(())
    }

    /// Key and value bytes of the omap.
    pub fn omap_bytes(&self) -> usize {
        self.omap.iter().map(|(k, v)| k.len() + v.len()).sum()
    }

    /// Sets omap entries (each replaces one with its key). All or none:
    /// an entry past the limits, or a total past [`MAX_OMAP_BYTES`],
    /// changes nothing.
    pub fn set_omap(&mut self, entries: &[(Vec<u8>, Vec<u8>)]) -> Result<()> {
        for (key, value) in entries {
            Self::check_omap_entry(key, value)?;
        }
        let mut next = self.omap.clone();
        for (key, value) in entries {
            match next.binary_search_by(|(k, _)| k.as_slice().cmp(key)) {
                Ok(i) => next[i].1 = value.clone(),
                Err(i) => next.insert(i, (key.clone(), value.clone())),
            }
        }
        if next.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>() > MAX_OMAP_BYTES {
            return Err(StoreError::invalid(format!("an object's omap may total at most {MAX_OMAP_BYTES} bytes")));
        }
        debug_assert!(next.windows(2).all(|w| w[0].0 < w[1].0), "omap keys unsorted or duplicated");
        self.omap = next;
        Ok(())
    }

    /// Removes the omap entries of `keys` (absent ones are skipped);
    /// whether any was there.
    pub fn remove_omap(&mut self, keys: &[Vec<u8>]) -> bool {
        let before = self.omap.len();
        let keys: std::collections::HashSet<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        self.omap.retain(|(k, _)| !keys.contains(k.as_slice()));
        self.omap.len() != before
    }

    /// Removes the omap entries with keys in `[start, end)` (`end = None`:
    /// to the last); whether any was there.
    pub fn remove_omap_range(&mut self, start: &[u8], end: Option<&[u8]>) -> bool {
        let before = self.omap.len();
        self.omap.retain(|(k, _)| k.as_slice() < start || end.is_some_and(|end| k.as_slice() >= end));
        self.omap.len() != before
    }

    /// The omap entries with keys in `[start, end)`, at most `limit`.
    pub fn omap_range(&self, start: &[u8], end: Option<&[u8]>, limit: usize) -> &[(Vec<u8>, Vec<u8>)] {
        let from = self.omap.partition_point(|(k, _)| k.as_slice() < start);
        let to = end.map_or(self.omap.len(), |end| self.omap.partition_point(|(k, _)| k.as_slice() < end));
        &self.omap[from..to.max(from).min(from.saturating_add(limit))]
    }
}

/// The header fields of a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotHeader {
    pub kind: u8,
    pub flags: u8,
    pub head: u32,
    pub next: u32,
    pub index: u16,
    pub fragment_len: u16,
    pub blob_len: u32,
}

/// Number of slots a blob of `blob_len` bytes needs.
pub fn slots_needed(blob_len: usize) -> usize {
    blob_len.div_ceil(FRAGMENT_CAPACITY).max(1)
}

/// The slot images of `blob` stored in `slots` (head first).
pub fn encode_chain(blob: &[u8], slots: &[u32], deleted: bool) -> Vec<[u8; SLOT_SIZE]> {
    assert_eq!(slots.len(), slots_needed(blob.len()), "chain length must fit the blob");
    // decode_slot refuses longer chains, and NO_SLOT ends one.
    debug_assert!(slots.len() <= MAX_CHAIN_SLOTS, "a chain of {} slots", slots.len());
    debug_assert!(!slots.contains(&NO_SLOT), "slot {NO_SLOT} in a chain");
    let mut chunks = blob.chunks(FRAGMENT_CAPACITY);
    (0..slots.len())
        .map(|i| {
            let fragment = chunks.next().unwrap_or(&[]);
            let header = SlotHeader {
                kind: if i == 0 { KIND_HEAD } else { KIND_CONTINUATION },
                flags: if i == 0 && deleted { HEAD_FLAG_DELETED } else { 0 },
                head: slots[0],
                next: slots.get(i + 1).copied().unwrap_or(NO_SLOT),
                index: i as u16,
                fragment_len: fragment.len() as u16,
                blob_len: blob.len() as u32,
            };
            encode_slot(&header, fragment)
        })
        .collect()
}

pub fn encode_slot(header: &SlotHeader, fragment: &[u8]) -> [u8; SLOT_SIZE] {
    assert!(fragment.len() <= FRAGMENT_CAPACITY);
    debug_assert_eq!(header.fragment_len as usize, fragment.len());
    let mut slot = [0u8; SLOT_SIZE];
    let mut w = Writer::new(&mut slot);
    w.u16(SLOT_MAGIC);
    w.u8(header.kind);
    w.u8(header.flags);
    w.u32(0);
    w.u32(header.head);
    w.u32(header.next);
    w.u16(header.index);
    w.u16(header.fragment_len);
    w.u32(header.blob_len);
    w.bytes(fragment);
    seal(&mut slot, SLOT_CRC_AT);
    debug_assert!(
        decode_slot(&slot).is_ok_and(|(decoded, bytes)| decoded == *header && bytes == fragment),
        "an encoded onode slot does not decode to itself"
    );
    slot
}

/// Decodes a slot's header and fragment; errors on a bad checksum or fields.
pub fn decode_slot(slot: &[u8]) -> Result<(SlotHeader, &[u8])> {
    if slot.len() != SLOT_SIZE {
        return Err(StoreError::corrupt("onode slot: wrong size"));
    }
    let mut r = Reader::new(slot, "onode slot");
    if r.u16()? != SLOT_MAGIC {
        return Err(StoreError::corrupt("onode slot: bad magic"));
    }
    if !verify_seal(slot, SLOT_CRC_AT) {
        return Err(StoreError::corrupt("onode slot: checksum mismatch"));
    }
    let kind = r.u8()?;
    let flags = r.u8()?;
    r.u32()?;
    let header = SlotHeader {
        kind,
        flags,
        head: r.u32()?,
        next: r.u32()?,
        index: r.u16()?,
        fragment_len: r.u16()?,
        blob_len: r.u32()?,
    };
    if !(kind == KIND_HEAD || kind == KIND_CONTINUATION) || header.fragment_len as usize > FRAGMENT_CAPACITY {
        return Err(StoreError::corrupt("onode slot: bad kind or fragment length"));
    }
    if header.blob_len as usize > MAX_CHAIN_SLOTS * FRAGMENT_CAPACITY {
        return Err(StoreError::corrupt("onode slot: blob too long"));
    }
    let fragment = r.bytes(header.fragment_len as usize)?;
    Ok((header, fragment))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn meta_strategy() -> impl Strategy<Value = ObjectMeta> {
        (
            proptest::collection::vec(any::<u8>(), 1..60),
            proptest::collection::btree_map(
                proptest::collection::vec(any::<u8>(), 1..20),
                proptest::collection::vec(any::<u8>(), 0..300),
                0..12,
            ),
            proptest::collection::vec(0u32..4, 0..40),
            proptest::collection::btree_map(
                proptest::collection::vec(any::<u8>(), 1..40),
                proptest::collection::vec(any::<u8>(), 0..200),
                0..20,
            ),
        )
            .prop_map(|(key, attrs, gaps, omap)| {
                let mut meta = ObjectMeta::new(Key::new(&key).unwrap());
                let mut logical = 0;
                for (i, gap) in gaps.into_iter().enumerate() {
                    logical += gap;
                    meta.extents.push(Extent { logical, physical: i as u32 * 100, len: 2 });
                    logical += 2;
                }
                meta.size = logical as u64 * BLOCK_SIZE as u64;
                meta.attrs = attrs.into_iter().collect();
                meta.omap = omap.into_iter().collect();
                meta
            })
    }

    /// An omap against a model: sets, removals and ranges.
    #[derive(Debug, Clone)]
    enum OmapChange {
        Set(Vec<(Vec<u8>, Vec<u8>)>),
        Remove(Vec<Vec<u8>>),
        RemoveRange(Vec<u8>, Option<Vec<u8>>),
    }

    fn omap_key() -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(0u8..4, 1..4)
    }

    fn omap_change() -> impl Strategy<Value = OmapChange> {
        prop_oneof![
            proptest::collection::vec((omap_key(), proptest::collection::vec(any::<u8>(), 0..8)), 1..5)
                .prop_map(OmapChange::Set),
            proptest::collection::vec(omap_key(), 1..4).prop_map(OmapChange::Remove),
            (omap_key(), proptest::option::of(omap_key())).prop_map(|(s, e)| OmapChange::RemoveRange(s, e)),
        ]
    }

    proptest! {
        #[test]
        fn blob_and_chain_round_trip(meta in meta_strategy()) {
            let blob = meta.encode();
            prop_assert_eq!(ObjectMeta::decode(&blob, 1 << 20).unwrap(), meta.clone());
            let slots: Vec<u32> = (0..slots_needed(blob.len()) as u32).map(|i| i * 3 + 1).collect();
            let images = encode_chain(&blob, &slots, false);
            let mut rebuilt = Vec::new();
            for (i, image) in images.iter().enumerate() {
                let (header, fragment) = decode_slot(image).unwrap();
                prop_assert_eq!(header.index as usize, i);
                prop_assert_eq!(header.head, slots[0]);
                rebuilt.extend_from_slice(fragment);
            }
            prop_assert_eq!(rebuilt, blob);
        }

        #[test]
        fn omap_changes_match_a_model_and_ranges_read_it_in_order(
            changes in proptest::collection::vec(omap_change(), 1..30),
            start in proptest::collection::vec(0u8..4, 0..3),
            end in proptest::option::of(proptest::collection::vec(0u8..4, 0..3)),
            limit in 0usize..8,
        ) {
            let mut meta = ObjectMeta::new(Key::new(b"o").unwrap());
            let mut model = std::collections::BTreeMap::new();
            for change in changes {
                match change {
                    OmapChange::Set(entries) => {
                        meta.set_omap(&entries).unwrap();
                        model.extend(entries);
                    }
                    OmapChange::Remove(keys) => {
                        let had = keys.iter().any(|k| model.contains_key(k));
                        prop_assert_eq!(meta.remove_omap(&keys), had);
                        for k in &keys {
                            model.remove(k);
                        }
                    }
                    OmapChange::RemoveRange(s, e) => {
                        let gone: Vec<Vec<u8>> = model
                            .keys()
                            .filter(|k| **k >= s && e.as_ref().is_none_or(|e| *k < e))
                            .cloned()
                            .collect();
                        prop_assert_eq!(meta.remove_omap_range(&s, e.as_deref()), !gone.is_empty());
                        for k in gone {
                            model.remove(&k);
                        }
                    }
                }
                let flat: Vec<(Vec<u8>, Vec<u8>)> = model.clone().into_iter().collect();
                prop_assert_eq!(&meta.omap, &flat);
                prop_assert_eq!(ObjectMeta::decode(&meta.encode(), 1).unwrap(), meta.clone());
            }
            let expected: Vec<(Vec<u8>, Vec<u8>)> = model
                .into_iter()
                .filter(|(k, _)| *k >= start && end.as_ref().is_none_or(|e| k < e))
                .take(limit)
                .collect();
            prop_assert_eq!(meta.omap_range(&start, end.as_deref(), limit), &expected[..]);
        }

        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..1200)) {
            let _ = ObjectMeta::decode(&bytes, 1 << 20);
            let _ = decode_slot(&bytes);
            let mut slot = [0u8; SLOT_SIZE];
            let n = bytes.len().min(SLOT_SIZE);
            slot[..n].copy_from_slice(&bytes[..n]);
            let _ = decode_slot(&slot);
        }

        #[test]
        fn map_and_unmap_keep_extents_sorted_and_minimal(blocks in proptest::collection::btree_map(0u32..200, 0u32..400, 0..100), cut in 0u32..210) {
            let mut meta = ObjectMeta::new(Key::new(b"k").unwrap());
            let mut used = std::collections::HashSet::new();
            for (logical, physical) in &blocks {
                if used.insert(*physical) { meta.map_block(*logical, *physical); }
            }
            for w in meta.extents.windows(2) {
                prop_assert!(w[0].logical_end() <= w[1].logical);
                prop_assert!(!(w[0].logical_end() == w[1].logical && w[0].physical + w[0].len == w[1].physical), "unmerged neighbours");
            }
            let before: Vec<(u32, Option<u32>)> = (0..210).map(|l| (l, meta.physical_for(l))).collect();
            let freed = meta.unmap_from(cut);
            let freed_count: u32 = freed.iter().map(|(_, n)| n).sum();
            prop_assert_eq!(freed_count as usize, before.iter().filter(|(l, p)| *l >= cut && p.is_some()).count());
            for (l, p) in before {
                prop_assert_eq!(meta.physical_for(l), if l < cut { p } else { None });
            }
            // One block out of the middle of a run, then back: the same mapping.
            let kept: Vec<(u32, Option<u32>)> = (0..210).map(|l| (l, meta.physical_for(l))).collect();
            if let Some((logical, Some(physical))) = kept.iter().copied().find(|(_, p)| p.is_some()) {
                prop_assert_eq!(meta.unmap_block(logical), Some(physical));
                for (l, p) in &kept {
                    prop_assert_eq!(meta.physical_for(*l), if *l == logical { None } else { *p });
                }
                meta.map_block(logical, physical);
                for (l, p) in &kept {
                    prop_assert_eq!(meta.physical_for(*l), *p);
                }
            }
        }
    }

    #[test]
    fn omap_limits_are_refused_whole_and_bad_omap_sections_are_corrupt() {
        let mut meta = ObjectMeta::new(Key::new(b"o").unwrap());
        assert!(meta.set_omap(&[(Vec::new(), b"v".to_vec())]).is_err(), "an empty key");
        assert!(meta.set_omap(&[(vec![1; MAX_OMAP_KEY_LEN + 1], Vec::new())]).is_err());
        assert!(meta.set_omap(&[(b"k".to_vec(), vec![0; MAX_OMAP_VALUE_LEN + 1])]).is_err());
        // 16 full values are 64 KiB of values alone: past the total.
        let big: Vec<(Vec<u8>, Vec<u8>)> = (0..16u8).map(|i| (vec![b'k', i], vec![i; MAX_OMAP_VALUE_LEN])).collect();
        assert!(meta.set_omap(&big).is_err());
        assert!(meta.omap.is_empty(), "a refused set changed the omap");
        meta.set_omap(&big[..15]).unwrap();
        assert_eq!(meta.omap.len(), 15);
        // A blob without an omap section (as before omaps) decodes to none.
        let plain = ObjectMeta::new(Key::new(b"p").unwrap());
        let blob = plain.encode();
        assert!(ObjectMeta::decode(&blob, 1).unwrap().omap.is_empty());
        // An omap section that claims no entries, or is unsorted, is corrupt.
        let mut zero = blob.clone();
        zero.extend_from_slice(&0u32.to_le_bytes());
        assert!(ObjectMeta::decode(&zero, 1).is_err());
        let mut two = ObjectMeta::new(Key::new(b"p").unwrap());
        two.set_omap(&[(b"a".to_vec(), b"1".to_vec()), (b"b".to_vec(), b"2".to_vec())]).unwrap();
        let mut unsorted = two.encode();
        let at = unsorted.len() - 4; // key "b" of the second entry, then its value
        assert_eq!(unsorted[at], b'b');
        unsorted[at] = b'a';
        assert!(matches!(ObjectMeta::decode(&unsorted, 1), Err(StoreError::Corrupt(m)) if m.contains("omap unsorted")));
    }

    /// The worst case `MAX_CHAIN_SLOTS` is sized for is a real blob: built,
    /// it is that long, decodes, and fits a chain.
    #[test]
    fn the_largest_blob_the_limits_allow_fits_one_chain() {
        fn names(budget: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
            let one = (0..=255u8).map(|b| vec![b]);
            let two = (0..(budget - 256) / 2).map(|i| (i as u16 + 256).to_be_bytes().to_vec());
            let mut all: Vec<(Vec<u8>, Vec<u8>)> = one.chain(two).map(|n| (n, Vec::new())).collect();
            all.sort();
            all
        }
        let mut meta = ObjectMeta::new(Key::new(&[b'k'; crate::MAX_KEY_LEN]).unwrap());
        meta.size = MAX_OBJECT_SIZE;
        let blocks = (MAX_OBJECT_SIZE / BLOCK_SIZE as u64) as u32;
        meta.extents = (0..blocks).map(|i| Extent { logical: i, physical: i * 2, len: 1 }).collect();
        meta.attrs = names(MAX_ATTR_BYTES);
        meta.omap = names(MAX_OMAP_BYTES);
        assert_eq!(meta.attr_bytes(), MAX_ATTR_BYTES);
        assert_eq!(meta.omap_bytes(), MAX_OMAP_BYTES);
        let blob = meta.encode();
        assert_eq!(blob.len(), worst_case_blob_len());
        assert!(slots_needed(blob.len()) <= MAX_CHAIN_SLOTS);
        assert_eq!(ObjectMeta::decode(&blob, u64::from(blocks) * 2).unwrap(), meta);
    }

    #[test]
    fn corrupt_slot_is_detected() {
        let blob = ObjectMeta::new(Key::new(b"key").unwrap()).encode();
        let mut image = encode_chain(&blob, &[5], false)[0];
        assert!(decode_slot(&image).is_ok());
        image[100] ^= 0x20;
        assert!(matches!(decode_slot(&image), Err(StoreError::Corrupt(_))));
    }
}
