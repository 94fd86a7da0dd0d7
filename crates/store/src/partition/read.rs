//! Reads (crc32c-verified, batched), stat, attributes and key listing.

use std::collections::BTreeSet;
use std::ops::Bound;

use super::{GroupUsage, ObjectInfo, Partition};
use crate::blockio::AlignedBuf;
use crate::error::{Result, StoreError};
use crate::key::Key;
use crate::onode::OBJECT_FLAG_PREALLOCATED;
use crate::BLOCK_SIZE;

/// One read of a batch: `len` bytes of `key` from `offset`, cut at the object's end.
#[derive(Clone, Copy, Debug)]
pub struct ReadRequest<'a> {
    pub key: &'a [u8],
    pub offset: u64,
    pub len: u64,
}

/// A planned read: the byte range to return and, per logical block, the
/// data block its bytes come from (`None`: zeros).
type ReadPlan = (u64, u64, Vec<(u64, Option<u32>)>);

impl Partition {
    /// Reads `len` bytes from `offset`; the result is shorter when it passes
    /// the object's end. Holes and unwritten pre-allocated blocks read as
    /// zeros. Each block read is checked against its crc32c.
    pub fn read(&mut self, key: &[u8], offset: u64, len: u64) -> Result<Vec<u8>> {
        self.read_many(&[ReadRequest { key, offset, len }]).pop().expect("one result per request")
    }

    /// Several reads with one batch of device I/O; one result per request.
    /// A checksum error fails only the reads that touch the bad block.
    pub fn read_many(&mut self, requests: &[ReadRequest<'_>]) -> Vec<Result<Vec<u8>>> {
        if self.failed {
            return requests.iter().map(|_| Err(StoreError::PartitionFailed(self.index))).collect();
        }
        // Per request: the byte range to return and, per block, where its bytes come from.
        let mut plans: Vec<Result<ReadPlan>> = Vec::with_capacity(requests.len());
        let mut blocks: BTreeSet<u32> = BTreeSet::new();
        for request in requests {
            plans.push(self.plan_read(request, &mut blocks));
        }
        let block_list: Vec<u32> = blocks.into_iter().collect();
        let mut data: Vec<Result<AlignedBuf>> = Vec::new();
        if !block_list.is_empty() {
            match self.read_blocks(&block_list) {
                Ok(results) => data = results,
                Err(err) => {
                    let message = err.to_string();
                    return plans
                        .into_iter()
                        .map(|p| {
                            p.and_then(|_| {
                                Err(StoreError::io("reading data blocks", std::io::Error::other(message.clone())))
                            })
                        })
                        .collect();
                }
            }
        }
        self.pages.trim();
        let results: Vec<Result<Vec<u8>>> = plans
            .into_iter()
            .map(|plan| {
                let (start, end, pieces) = plan?;
                let mut out = vec![0u8; (end - start) as usize];
                for (logical, block) in pieces {
                    let Some(block) = block else { continue };
                    let position = block_list.binary_search(&block).expect("every planned block was read");
                    let buf = data[position].as_ref().map_err(clone_error)?;
                    let block_start = logical * BLOCK_SIZE as u64;
                    let from = start.max(block_start);
                    let to = end.min(block_start + BLOCK_SIZE as u64);
                    debug_assert!(from < to, "block {logical} is outside the read {start}..{end}");
                    out[(from - start) as usize..(to - start) as usize]
                        .copy_from_slice(&buf[(from - block_start) as usize..(to - block_start) as usize]);
                }
                Ok(out)
            })
            .collect();
        self.give_blocks(data.into_iter().filter_map(Result::ok));
        debug_assert_eq!(results.len(), requests.len(), "one result per request");
        results
    }

    fn plan_read(&self, request: &ReadRequest<'_>, blocks: &mut BTreeSet<u32>) -> Result<ReadPlan> {
        self.check_key(request.key)?;
        let entry = self.objects.get(request.key).ok_or(StoreError::NotFound)?;
        let start = request.offset.min(entry.size);
        let end = request.offset.saturating_add(request.len).min(entry.size);
        debug_assert!(start <= end);
        let mut pieces = Vec::new();
        if start < end {
            for logical in start / BLOCK_SIZE as u64..end.div_ceil(BLOCK_SIZE as u64) {
                let block = entry.physical_for(logical as u32).filter(|b| self.written.get(*b as u64));
                if let Some(block) = block {
                    blocks.insert(block);
                }
                pieces.push((logical, block));
            }
        }
        Ok((start, end, pieces))
    }

    /// Reads and verifies `list` (sorted); results are indexed like the list.
    fn read_blocks(&mut self, list: &[u32]) -> Result<Vec<Result<AlignedBuf>>> {
        // read_many finds each block's result by binary search.
        debug_assert!(list.windows(2).all(|w| w[0] < w[1]), "block list unsorted or repeated");
        let crc_pages: Vec<u64> = list.iter().map(|b| self.crc_location(*b).0).collect();
        self.pages.load(self.io.as_mut(), &crc_pages)?;
        // Every byte is read from the device or copied from a deferred
        // image: the buffers need no zeroing.
        let mut bufs: Vec<AlignedBuf> = list.iter().map(|_| self.take_block(false)).collect();
        let deferred = |block: &u32| !self.deferred.is_empty() && self.deferred.contains_key(block);
        {
            let mut requests: Vec<(u64, &mut [u8])> = list
                .iter()
                .zip(bufs.iter_mut())
                .filter(|(b, _)| !deferred(b))
                .map(|(b, buf)| (self.data_offset(*b), &mut buf[..]))
                .collect();
            self.io.read_many(&mut requests).map_err(|e| StoreError::io("reading data blocks", e))?;
        }
        let mut out = Vec::with_capacity(list.len());
        for (block, mut buf) in list.iter().zip(bufs) {
            if let Some(image) = self.deferred.get(block) {
                // Newer than the disk, and checked when it was built.
                buf.copy_from_slice(image);
                out.push(Ok(buf));
                continue;
            }
            let stored = self.crc_get(*block)?;
            out.push(self.verify(*block, stored, buf));
        }
        debug_assert_eq!(out.len(), list.len());
        Ok(out)
    }

    fn verify(&mut self, block: u32, stored: u32, buf: AlignedBuf) -> Result<AlignedBuf> {
        let computed = crate::crc32c(&buf);
        if computed != stored {
            if let Some(good) = self.good_copy(block, stored) {
                self.give_blocks([buf]);
                return Ok(good);
            }
            return Err(StoreError::ChecksumMismatch {
                partition: self.index,
                block: block as u64,
                device_offset: self.data_offset(block),
                stored,
                computed,
            });
        }
        Ok(buf)
    }

    /// Another copy of a block that failed its checksum (a mirror's other
    /// device) that passes it, written over the bad one.
    fn good_copy(&mut self, block: u32, stored: u32) -> Option<AlignedBuf> {
        let copies = self.io.copies();
        if copies < 2 {
            return None;
        }
        let offset = self.data_offset(block);
        for copy in 0..copies {
            let mut buf = self.take_block(false);
            if self.io.read_copy(copy, &mut [(offset, &mut buf[..])]).is_ok() && crate::crc32c(&buf) == stored {
                // Rewritten to every copy: the good one gets its own bytes again.
                match self.io.write_many(&[(offset, &buf[..])]) {
                    Ok(()) => {
                        self.io.note_repair();
                        tracing::warn!(
                            partition = self.index,
                            block,
                            copy,
                            "a block failed its checksum on one mirror device; repaired from the other"
                        );
                    }
                    Err(err) => {
                        tracing::error!(partition = self.index, block, %err, "rewriting a damaged block failed")
                    }
                }
                return Some(buf);
            }
            self.give_blocks([buf]);
        }
        None
    }

    /// Reads one block and checks it against `crc` (for read-modify-write).
    pub(crate) fn read_block_verified(&mut self, block: u32, crc: u32) -> Result<AlignedBuf> {
        let mut buf = self.take_block(false);
        let offset = self.data_offset(block);
        self.io.read_many(&mut [(offset, &mut buf[..])]).map_err(|e| StoreError::io("reading a data block", e))?;
        self.verify(block, crc, buf)
    }

    pub fn exists(&self, key: &[u8]) -> bool {
        self.objects.contains_key(key)
    }

    pub fn stat(&self, key: &[u8]) -> Result<ObjectInfo> {
        let entry = self.objects.get(key).ok_or(StoreError::NotFound)?;
        Ok(ObjectInfo {
            size: entry.size,
            preallocated: entry.flags & OBJECT_FLAG_PREALLOCATED != 0,
            allocated_bytes: entry.extents.mapped_blocks() * BLOCK_SIZE as u64,
        })
    }

    /// The byte ranges in which `key` and `other` may differ, found from
    /// their block maps alone, without reading data: a block both map to
    /// the same data block (a clone's untouched block) is equal, and so is
    /// one that reads as zeros in both (a hole, or never written); past the
    /// smaller size everything differs. Ranges are block-aligned (the last
    /// clipped to the larger size), sorted and merged: what changed since a
    /// clone was taken, in time proportional to the objects' blocks, as an
    /// incremental export wants. An absent object reads as empty.
    pub fn diff(&self, key: &[u8], other: &[u8]) -> Vec<(u64, u64)> {
        let empty = super::IndexEntry { head_slot: 0, size: 0, flags: 0, extents: super::Extents::Empty };
        let a = self.objects.get(key).unwrap_or(&empty);
        let b = self.objects.get(other).unwrap_or(&empty);
        let block_size = BLOCK_SIZE as u64;
        let (common, larger) = (a.size.min(b.size), a.size.max(b.size));
        let reads_zeros = |physical: Option<u32>| {
            physical.is_none_or(|p| !self.written.get(p as u64) && !self.deferred.contains_key(&p))
        };
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        let mut push = |start: u64, end: u64| match ranges.last_mut() {
            Some((from, len)) if *from + *len == start => *len = end - *from,
            _ => ranges.push((start, end - start)),
        };
        for logical in 0..common.div_ceil(block_size) {
            let (pa, pb) = (a.physical_for(logical as u32), b.physical_for(logical as u32));
            if pa != pb && !(reads_zeros(pa) && reads_zeros(pb)) {
                push(logical * block_size, ((logical + 1) * block_size).min(common));
            }
        }
        if larger > common {
            push(common, larger);
        }
        debug_assert!(ranges.windows(2).all(|w| w[0].0 + w[0].1 < w[1].0), "ranges sorted and merged");
        debug_assert!(ranges.last().is_none_or(|(from, len)| from + len <= larger), "a range past both objects");
        ranges
    }

    pub fn get_attr(&mut self, key: &[u8], name: &[u8]) -> Result<Vec<u8>> {
        self.check_usable()?;
        let head = self.objects.get(key).ok_or(StoreError::NotFound)?.head_slot;
        let (_, _, meta) = self.read_chain(head)?;
        self.pages.trim();
        meta.attr(name).map(<[u8]>::to_vec).ok_or(StoreError::AttrNotFound)
    }

    /// All attributes of `key`, sorted by name.
    pub fn list_attrs(&mut self, key: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.check_usable()?;
        let head = self.objects.get(key).ok_or(StoreError::NotFound)?.head_slot;
        let (_, _, meta) = self.read_chain(head)?;
        self.pages.trim();
        Ok(meta.attrs)
    }

    /// All attributes (sorted by name) and the whole omap (sorted by key)
    /// of `key`, from one read of its onode.
    #[allow(clippy::type_complexity)]
    pub fn attrs_and_omap(&mut self, key: &[u8]) -> Result<(Vec<(Vec<u8>, Vec<u8>)>, Vec<(Vec<u8>, Vec<u8>)>)> {
        self.check_usable()?;
        let head = self.objects.get(key).ok_or(StoreError::NotFound)?.head_slot;
        let (_, _, meta) = self.read_chain(head)?;
        self.pages.trim();
        Ok((meta.attrs, meta.omap))
    }

    /// The omap value of `name` in `key` (`Ok(None)`: no such entry).
    pub fn omap_get(&mut self, key: &[u8], name: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.omap_range(key, name, None, 1)?.into_iter().next().filter(|(k, _)| k == name).map(|(_, v)| v))
    }

    /// The omap entries of `key` with keys in `[start, end)` in order
    /// (`end = None`: to the last), at most `limit`. A listing continues
    /// after its last key `k` from `k` followed by a zero byte.
    pub fn omap_range(
        &mut self,
        key: &[u8],
        start: &[u8],
        end: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.check_usable()?;
        let head = self.objects.get(key).ok_or(StoreError::NotFound)?.head_slot;
        let (_, _, meta) = self.read_chain(head)?;
        self.pages.trim();
        Ok(meta.omap_range(start, end, limit).to_vec())
    }

    /// Keys in `[start, end)` in order (`end = None`: to the last key), at most `limit`.
    pub fn list(&self, start: &[u8], end: Option<&[u8]>, limit: usize) -> Vec<Key> {
        let upper = end.map_or(Bound::Unbounded, Bound::Excluded);
        self.objects.range::<[u8], _>((Bound::Included(start), upper)).take(limit).map(|(k, _)| k.clone()).collect()
    }

    /// What each group (placement group) holds here: objects, their sizes
    /// and the data blocks mapped to them, in group order. A walk of the
    /// in-memory index, O(objects): for an operator's `df`, not the I/O path.
    pub fn usage_by_group(&self) -> Vec<GroupUsage> {
        let mut usage: Vec<GroupUsage> = Vec::new();
        for (key, entry) in &self.objects {
            let group = key.group();
            if usage.last().is_none_or(|last| last.group != group) {
                usage.push(GroupUsage { group, ..GroupUsage::default() });
            }
            let last = usage.last_mut().expect("pushed above");
            last.objects += 1;
            last.logical_bytes += entry.size;
            last.allocated_bytes += entry.extents.mapped_blocks() * BLOCK_SIZE as u64;
        }
        debug_assert!(usage.windows(2).all(|w| w[0].group < w[1].group), "keys are ordered by group first");
        usage
    }

    /// The groups (placement groups) with an object here, in order: one
    /// seek per group, not a walk of every object.
    pub fn groups(&self) -> Vec<u32> {
        let mut groups = Vec::new();
        let mut from = Some(0u32);
        while let Some(start) = from {
            let Some((key, _)) =
                self.objects.range::<[u8], _>((Bound::Included(&start.to_be_bytes()[..]), Bound::Unbounded)).next()
            else {
                break;
            };
            let group = key.group();
            debug_assert!(group >= start, "a key before its seek");
            groups.push(group);
            from = group.checked_add(1);
        }
        groups
    }

    /// Keys of one group (placement group), in order, at most `limit`.
    pub fn list_group(&self, group: u32, limit: usize) -> Vec<Key> {
        let start = group.to_be_bytes();
        match group.checked_add(1) {
            Some(next) => self.list(&start, Some(&next.to_be_bytes()), limit),
            None => self.list(&start, None, limit),
        }
    }
}

fn clone_error(err: &StoreError) -> StoreError {
    match err {
        StoreError::ChecksumMismatch { partition, block, device_offset, stored, computed } => {
            StoreError::ChecksumMismatch {
                partition: *partition,
                block: *block,
                device_offset: *device_offset,
                stored: *stored,
                computed: *computed,
            }
        }
        other => StoreError::io("reading data blocks", std::io::Error::other(other.to_string())),
    }
}
