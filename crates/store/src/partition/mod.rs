//! One partition of the store, owned and driven by exactly one thread.
//!
//! A `Partition` owns its I/O queue, its index, bitmaps, page cache and
//! journal position; it shares nothing mutable with other partitions, so it
//! needs no lock (it is `Send`, and deliberately not shared).
//!
//! - [`mount`](self::mount): header, bitmaps, journal replay, last-record recovery, index rebuild.
//! - [`plan`]: turns a [`Batch`](crate::Batch) into a journal record and staged data blocks.
//! - [`commit`]: writes record, data, flush; applies the record in memory; checkpoints.
//! - [`read`]: reads (batched, crc32c-verified), stat, attributes, listing.

pub(crate) mod commit;
mod extents;
pub(crate) mod mount;
mod plan;
mod read;

use std::collections::{BTreeMap, HashSet};

use crate::bitmap::Bitmap;
use crate::blockio::{AlignedBuf, BlockIo, IoStats};
use crate::chunks::{ChunkPool, ChunkedBitmap};
use crate::error::{Result, StoreError};
use crate::key::Key;
use crate::layout::{DataRegion, PartitionGeometry};
use crate::onode::{decode_slot, ObjectMeta, KIND_HEAD, MAX_CHAIN_SLOTS, NO_SLOT};
use crate::pages::PageCache;
use crate::{BLOCK_SIZE, SLOTS_PER_PAGE, SLOT_SIZE};

pub use commit::Unsynced;
pub(crate) use extents::Extents;
pub use read::ReadRequest;

/// What the index keeps per object: enough to serve reads and pre-allocated
/// overwrites without touching the onode (attributes stay on disk).
#[derive(Clone, Debug)]
pub(crate) struct IndexEntry {
    pub head_slot: u32,
    pub size: u64,
    pub flags: u8,
    pub extents: Extents,
}

impl IndexEntry {
    pub fn from_meta(head_slot: u32, meta: &ObjectMeta) -> IndexEntry {
        debug_assert!(
            meta.extents.last().is_none_or(|e| e.logical_end() as u64 <= meta.size.div_ceil(BLOCK_SIZE as u64)),
            "{:?} maps blocks past its size {}",
            meta.key,
            meta.size
        );
        IndexEntry { head_slot, size: meta.size, flags: meta.flags, extents: Extents::from_vec(&meta.extents) }
    }

    /// The data block holding logical block `logical`, if allocated.
    pub fn physical_for(&self, logical: u32) -> Option<u32> {
        self.extents.physical_for(logical)
    }
}

/// A deleted object whose blocks and slots a later commit will free.
#[derive(Clone, Debug)]
pub(crate) struct Reclaim {
    pub runs: Vec<(u32, u32)>,
    pub slots: Vec<u32>,
}

/// Counters of one partition since mount.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct PartitionStats {
    /// Batches committed (refused batches are not counted).
    pub batches: u64,
    pub ops: u64,
    /// Bytes callers asked to write (the denominator of write amplification).
    pub user_bytes_written: u64,
    pub data_blocks_written: u64,
    pub journal_bytes_written: u64,
    pub metadata_bytes_written: u64,
    pub checkpoints: u64,
    /// Deferred blocks written in place by checkpoints.
    pub deferred_bytes_written: u64,
    /// Batches whose record was flushed before their data was written (they
    /// overwrote a block the previous record wrote for the first time).
    pub ordered_commits: u64,
    /// Batches that copied shared blocks on write, and wrote and flushed
    /// the copies before their record (one more flush each).
    pub copies_flushed_first: u64,
    /// Time spent in each commit stage, summed over batches (nanoseconds).
    pub plan_ns: u64,
    /// The record alone and its flush: ordered commits only (the others
    /// submit the record with their data, counted in `data_write_ns`).
    pub record_write_ns: u64,
    pub data_write_ns: u64,
    pub flush_ns: u64,
    pub checkpoint_ns: u64,
    pub io: IoStats,
    pub cache_misses: u64,
}

/// What a committed batch cost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CommitInfo {
    /// Journal sequence number of the batch's record (0 if nothing changed).
    pub seq: u64,
    pub data_blocks: usize,
    pub journal_bytes: usize,
    /// Whether a checkpoint ran before this batch to make room.
    pub checkpointed: bool,
}

/// One group's share of a partition ([`Partition::usage_by_group`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupUsage {
    pub group: u32,
    pub objects: u64,
    /// The objects' sizes: what clients stored (holes included).
    pub logical_bytes: u64,
    /// Data blocks mapped to them, in bytes: what the store spends.
    pub allocated_bytes: u64,
}

/// What [`Partition::stat`] reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObjectInfo {
    pub size: u64,
    pub preallocated: bool,
    /// Bytes of data blocks mapped to the object.
    pub allocated_bytes: u64,
}

/// Where a partition's memory goes (for the memory report).
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct PartitionMemory {
    pub objects: usize,
    /// Slot, allocation and written bitmaps: fixed by the partition's size.
    pub bitmap_bytes: usize,
    /// Cached crc-table and onode pages (bounded by `metadata_cache_bytes`).
    pub page_cache_bytes: usize,
    /// Images of blocks changed through the journal, until the next checkpoint.
    pub deferred_bytes: usize,
}

/// Tunables of a mounted partition.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PartitionConfig {
    pub cache_pages: usize,
    pub max_dirty_pages: usize,
    pub read_only: bool,
}

pub struct Partition {
    pub(crate) index: u32,
    pub(crate) partition_count: u32,
    pub(crate) fsid: [u8; 16],
    pub(crate) geometry: PartitionGeometry,
    pub(crate) sector: u32,
    pub(crate) io: Box<dyn BlockIo>,
    pub(crate) objects: BTreeMap<Key, IndexEntry>,
    pub(crate) slots: Bitmap,
    /// The store's shared data region; this partition allocates only in
    /// the chunks it owns (`alloc` and `written` hold exactly those).
    pub(crate) region: DataRegion,
    pub(crate) alloc: ChunkedBitmap,
    pub(crate) written: ChunkedBitmap,
    /// The chunks this partition owns as of the last checkpoint, plus the
    /// claims applied since (its on-disk page is written at checkpoints).
    pub(crate) claims: Bitmap,
    pub(crate) pool: std::sync::Arc<ChunkPool>,
    pub(crate) pages: PageCache,
    pub(crate) header_seq: u64,
    pub(crate) next_seq: u64,
    pub(crate) journal_used_bytes: u64,
    pub(crate) reclaim: Vec<Reclaim>,
    /// Data blocks referenced by more than one object ([`crate::Op::Clone`]),
    /// and how many references each has beyond the first. Not on disk:
    /// mount counts them from the onodes of objects that share.
    pub(crate) shared: BTreeMap<u32, u32>,
    pub(crate) alloc_hint: u64,
    pub(crate) slot_hint: u64,
    pub(crate) failed: bool,
    /// A commit's last flush is out ([`Partition::apply_unsynced`]).
    pub(crate) unsynced: bool,
    /// Flushes made through [`Partition::flush_handle`] (the queue counts its own).
    pub(crate) flushes_by_handle: u64,
    pub(crate) config: PartitionConfig,
    pub(crate) stats: PartitionStats,
    /// Onode chains that could not be read at mount (reported by fsck).
    pub(crate) mount_issues: Vec<String>,
    /// Spare 4 KiB block buffers, reused by commits and reads instead of
    /// allocating and zeroing one per block (bounded by `SPARE_BLOCKS_MAX`).
    pub(crate) spare_blocks: Vec<AlignedBuf>,
    /// Blocks the journal's last record wrote for the first time. Mount
    /// treats a block of the last record whose contents match neither crc
    /// as one whose write never landed, and a first write's block then
    /// reads as a hole again. That is right only if nothing wrote the block
    /// since: so a batch that overwrites one of these in place makes its
    /// own record durable before its data can land (see `commit`).
    pub(crate) last_record_fresh: HashSet<u32>,
    /// Data blocks changed through the journal since the last checkpoint
    /// ([`crate::Op::WriteJournaled`]): their current images, which reads
    /// serve and the next checkpoint writes in place. Counted as dirty pages.
    pub(crate) deferred: BTreeMap<u32, AlignedBuf>,
}

/// Most spare block buffers kept per partition (4 MiB).
const SPARE_BLOCKS_MAX: usize = 1024;

impl Partition {
    /// A block buffer from the spares, zeroed if `zeroed` (else its contents
    /// are stale and the caller overwrites all of it).
    pub(crate) fn take_block(&mut self, zeroed: bool) -> AlignedBuf {
        match self.spare_blocks.pop() {
            Some(mut buf) => {
                if zeroed {
                    buf.fill(0);
                }
                buf
            }
            None => AlignedBuf::zeroed(BLOCK_SIZE),
        }
    }

    /// Returns block buffers to the spares.
    pub(crate) fn give_blocks(&mut self, bufs: impl IntoIterator<Item = AlignedBuf>) {
        for buf in bufs {
            if self.spare_blocks.len() >= SPARE_BLOCKS_MAX {
                break;
            }
            debug_assert_eq!(buf.len(), BLOCK_SIZE);
            self.spare_blocks.push(buf);
        }
    }

    pub fn index(&self) -> u32 {
        self.index
    }

    /// How many partitions the store has (this one among them).
    pub fn partition_count(&self) -> u32 {
        self.partition_count
    }

    pub fn object_count(&self) -> usize {
        self.objects.len()
    }

    /// Data blocks this partition can still allocate: free ones in the
    /// chunks it owns and every block of the chunks no partition owns.
    pub fn free_blocks(&self) -> u64 {
        debug_assert!(self.alloc.count_ones() <= self.alloc.len(), "more blocks allocated than exist");
        self.alloc.len() - self.alloc.count_ones() + self.pool.free_blocks()
    }

    /// The store's data blocks, which every partition may come to use.
    pub fn data_blocks(&self) -> u64 {
        self.region.data_blocks
    }

    /// Data blocks allocated in this partition's chunks.
    pub fn used_blocks(&self) -> u64 {
        self.alloc.count_ones()
    }

    /// This partition's onode slots: each object's metadata takes a chain
    /// of them (`MkfsOptions::bytes_per_onode` sized the area).
    pub fn onode_slots(&self) -> u64 {
        self.slots.len()
    }

    /// Onode slots in use, a deleted object's included until the commit
    /// that frees its blocks frees them too.
    pub fn used_onode_slots(&self) -> u64 {
        self.slots.count_ones()
    }

    /// Chunks this partition owns, and the data blocks in them.
    pub fn owned_chunks(&self) -> (usize, u64) {
        (self.alloc.owned_chunks().len(), self.alloc.len())
    }

    /// Chunks no partition owns.
    pub fn free_chunks(&self) -> usize {
        self.pool.free_chunks()
    }

    pub fn io_engine(&self) -> &'static str {
        self.io.engine()
    }

    pub fn memory(&self) -> PartitionMemory {
        PartitionMemory {
            objects: self.objects.len(),
            bitmap_bytes: self.slots.heap_bytes()
                + self.claims.heap_bytes()
                + self.alloc.heap_bytes()
                + self.written.heap_bytes(),
            page_cache_bytes: self.pages.len() * BLOCK_SIZE,
            deferred_bytes: self.deferred.len() * BLOCK_SIZE,
        }
    }

    pub fn stats(&self) -> PartitionStats {
        let mut io = self.io.stats();
        io.flushes += self.flushes_by_handle;
        PartitionStats { io, cache_misses: self.pages.misses, ..self.stats }
    }

    /// Fails unless `key` belongs here (its group modulo the partition count).
    pub fn check_key(&self, key: &[u8]) -> Result<()> {
        let expected = crate::key::group_of(key) % self.partition_count;
        if expected != self.index {
            return Err(StoreError::WrongPartition { expected, actual: self.index });
        }
        Ok(())
    }

    fn check_usable(&self) -> Result<()> {
        if self.failed {
            return Err(StoreError::PartitionFailed(self.index));
        }
        Ok(())
    }

    /// Device byte offset of a data block.
    pub(crate) fn data_offset(&self, block: u32) -> u64 {
        debug_assert!(self.alloc.owns_block(block as u64), "data block {block} is not in a chunk this partition owns");
        self.region.data_block(block as u64) * BLOCK_SIZE as u64
    }

    /// Device block of the crc page covering data block `block`, and the byte offset in it.
    pub(crate) fn crc_location(&self, block: u32) -> (u64, usize) {
        debug_assert!((block as u64) < self.region.data_blocks, "data block {block} has no crc");
        self.region.crc_location(block as u64)
    }

    /// Device block of the onode page holding `slot`, and the byte offset in it.
    pub(crate) fn slot_location(&self, slot: u32) -> (u64, usize) {
        debug_assert!((slot as u64) < self.geometry.slot_count(), "onode slot {slot} outside the onode area");
        (self.geometry.onodes.start + slot as u64 / SLOTS_PER_PAGE as u64, (slot as usize % SLOTS_PER_PAGE) * SLOT_SIZE)
    }

    pub(crate) fn crc_get(&mut self, block: u32) -> Result<u32> {
        let (page, at) = self.crc_location(block);
        self.pages.load(self.io.as_mut(), &[page])?;
        let bytes = &self.pages.get(page)[at..at + 4];
        Ok(u32::from_le_bytes(bytes.try_into().expect("4 bytes")))
    }

    pub(crate) fn crc_set(&mut self, block: u32, crc: u32) -> Result<()> {
        let (page, at) = self.crc_location(block);
        self.pages.load(self.io.as_mut(), &[page])?;
        self.pages.get_mut(page)[at..at + 4].copy_from_slice(&crc.to_le_bytes());
        Ok(())
    }

    pub(crate) fn slot_image(&mut self, slot: u32) -> Result<[u8; SLOT_SIZE]> {
        let (page, at) = self.slot_location(slot);
        self.pages.load(self.io.as_mut(), &[page])?;
        Ok(self.pages.get(page)[at..at + SLOT_SIZE].try_into().expect("slot size"))
    }

    /// Follows the chain from `head`; returns its slots, whether the head is
    /// marked deleted, and the decoded metadata.
    pub(crate) fn read_chain(&mut self, head: u32) -> Result<(Vec<u32>, bool, ObjectMeta)> {
        let mut slots = Vec::new();
        let mut blob = Vec::new();
        let mut deleted = false;
        let mut expected_len = None;
        let mut current = head;
        while current != NO_SLOT {
            if slots.len() >= MAX_CHAIN_SLOTS
                || current as u64 >= self.geometry.slot_count()
                || !self.slots.get(current as u64)
            {
                return Err(StoreError::corrupt(format!(
                    "partition {}: onode chain from slot {head} reaches slot {current}, which is not in use",
                    self.index
                )));
            }
            let image = self.slot_image(current)?;
            let (header, fragment) = decode_slot(&image)
                .map_err(|e| StoreError::corrupt(format!("partition {}: onode slot {current}: {e}", self.index)))?;
            let kind_ok = if slots.is_empty() { header.kind == KIND_HEAD } else { header.kind != KIND_HEAD };
            if !kind_ok || header.head != head || header.index as usize != slots.len() {
                return Err(StoreError::corrupt(format!(
                    "partition {}: onode slot {current} does not continue the chain of slot {head}",
                    self.index
                )));
            }
            if slots.is_empty() {
                deleted = header.flags & crate::onode::HEAD_FLAG_DELETED != 0;
                expected_len = Some(header.blob_len as usize);
            }
            blob.extend_from_slice(fragment);
            slots.push(current);
            current = header.next;
        }
        if Some(blob.len()) != expected_len {
            return Err(StoreError::corrupt(format!(
                "partition {}: onode chain of slot {head} is truncated",
                self.index
            )));
        }
        let meta = ObjectMeta::decode(&blob, self.region.data_blocks)
            .map_err(|e| StoreError::corrupt(format!("partition {}: onode at slot {head}: {e}", self.index)))?;
        Ok((slots, deleted, meta))
    }

    /// Diagnostics: the device byte offset of the data block holding byte
    /// `offset` of `key`, if that block holds data.
    pub fn locate_data(&self, key: &[u8], offset: u64) -> Option<u64> {
        let entry = self.objects.get(key)?;
        let block = entry.physical_for(u32::try_from(offset / BLOCK_SIZE as u64).ok()?)?;
        self.written.get(block as u64).then(|| self.data_offset(block))
    }

    /// Diagnostics: the device byte offset of `key`'s head onode slot.
    pub fn locate_onode(&self, key: &[u8]) -> Option<u64> {
        let entry = self.objects.get(key)?;
        let (page, at) = self.slot_location(entry.head_slot);
        Some(page * BLOCK_SIZE as u64 + at as u64)
    }
}
