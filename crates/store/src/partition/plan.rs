//! Planning a batch: apply its operations, in order, to working copies of
//! the objects they touch; produce one journal record (the metadata redo),
//! the data blocks to write, and the index changes to make once durable.
//!
//! Planning reserves blocks and slots in the in-memory bitmaps *quietly*
//! (no dirty pages) so that two operations of one batch never get the same
//! block; if an operation fails, [`Plan::rollback`] releases them and nothing
//! of the batch happened. Frees are never visible to the allocator before
//! the commit that frees them is durable: a block still holding an old
//! object's data is not reused by a batch that might not commit.

use std::collections::{BTreeMap, HashSet};

use super::{IndexEntry, Partition, Reclaim};
use crate::batch::{Batch, Op};
use crate::blockio::AlignedBuf;
use crate::error::{Result, StoreError};
use crate::journal::{BitmapKind, Entry, Record};
use crate::key::Key;
use crate::onode::{
    encode_chain, slots_needed, ObjectMeta, MAX_CHAIN_SLOTS, OBJECT_FLAG_PREALLOCATED, OBJECT_FLAG_SHARES,
};
use crate::{BLOCK_SIZE, MAX_OBJECT_SIZE, SLOT_SIZE};

/// Shortest run a pre-allocated object is split into when no longer one is free.
const MIN_PREALLOCATED_RUN: u64 = 16;

/// The new contents of one data block.
pub(crate) struct StagedBlock {
    pub buf: AlignedBuf,
    pub was_written: bool,
    pub old_crc: u32,
    /// Where the pre-batch object's visible bytes end in this block, if this
    /// is its partial last block (0: it is not). Recovery zeroes the rest of
    /// the old contents if the new ones did not land.
    pub zero_from: u16,
}

/// A block changed by deferred writes ([`Op::WriteJournaled`]): its new
/// image, and the byte ranges the journal record carries.
pub(crate) struct PatchedBlock {
    pub image: AlignedBuf,
    /// The block held no data before this batch: replay starts from zeros.
    pub base_zero: bool,
    pub pieces: Vec<(u16, Vec<u8>)>,
}

/// One object as the batch sees it.
struct Working {
    /// The object now (`None`: absent at this point of the batch).
    current: Option<ObjectMeta>,
    /// Whether `current.attrs` and `current.omap` hold the stored ones.
    attrs_loaded: bool,
    /// Head slot of the object as it was before the batch.
    original_head: Option<u32>,
    /// `current` is the pre-batch object (not deleted and recreated).
    original_alive: bool,
    meta_dirty: bool,
    /// Blocks reserved by this batch and still mapped.
    new_blocks: HashSet<u32>,
    /// The pre-batch object was deleted: what its deleted onode must record,
    /// exactly the blocks a later reclaim will free (not those the batch
    /// already freed or only reserved).
    tombstone: Option<ObjectMeta>,
    /// The pre-batch object's partial last block and where its visible bytes end.
    original_tail: Option<(u32, u16)>,
    /// `current.extents` is left empty and the index entry's extents stand
    /// for it, until the batch changes the mapping ([`Partition::own_extents`]).
    /// An in-place overwrite never copies an extent map, which after copies
    /// on write may map each of an object's 1,024 blocks on its own.
    extents_in_index: bool,
}

#[derive(Default)]
pub(crate) struct Plan {
    objects: BTreeMap<Key, Working>,
    pub staged: BTreeMap<u32, StagedBlock>,
    /// Blocks written through the journal; never also in `staged`.
    patched: BTreeMap<u32, PatchedBlock>,
    /// Journaled writes may be deferred (false: every block is written in
    /// place, for a batch whose patches would not fit the journal, planned
    /// again after a checkpoint emptied the deferred blocks).
    defer: bool,
    /// The record was too large because of its patches: worth planning
    /// again without them.
    patches_overflowed: bool,
    /// Blocks and slots reserved quietly, to undo on failure.
    reserved_blocks: Vec<u32>,
    reserved_slots: Vec<u32>,
    /// Chunks taken from the pool for this batch (the record claims them).
    claimed_chunks: Vec<u32>,
    /// Changes to shared blocks' reference counts (clones add, copies on
    /// write, truncates and reclaims drop), applied once the record is durable.
    ref_delta: BTreeMap<u32, i32>,
    /// Blocks this batch reserved as copies on write of shared blocks.
    copies: Vec<u32>,
    /// Blocks freed by truncation (cleared on disk by the record).
    freed_blocks: Vec<u32>,
    freed_slots: Vec<u32>,
    pub user_bytes: u64,
}

/// What a commit applies once its record is durable.
/// What planning a batch gave.
// Returned once per batch and matched at once: boxing `Prepared` would cost
// an allocation per batch, which the per-write budget counts.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Planned {
    Ready(Prepared),
    /// Its journal record would be too large because of the patches of
    /// deferred writes: after a checkpoint, planned in place it may fit
    /// (a journaled write means the same as a plain one, at another cost).
    TooManyPatches,
    Failed(StoreError),
}

pub(crate) struct Prepared {
    pub record: Record,
    pub staged: BTreeMap<u32, StagedBlock>,
    pub patched: BTreeMap<u32, PatchedBlock>,
    pub index_updates: Vec<(Key, Option<IndexEntry>)>,
    pub new_reclaims: Vec<Reclaim>,
    pub user_bytes: u64,
    pub reserved_blocks: Vec<u32>,
    pub reserved_slots: Vec<u32>,
    pub claimed_chunks: Vec<u32>,
    pub ref_delta: BTreeMap<u32, i32>,
    /// Copies on write still staged, sorted: written and flushed before the record.
    pub copies: Vec<u32>,
    /// How many entries of the partition's reclaim queue the record frees.
    pub reclaimed: usize,
}

impl Partition {
    /// Plans `batch`; on error nothing is reserved and nothing changed.
    /// With `defer` false every block is written in place, which needs no
    /// deferred block (a checkpoint empties them): see [`Planned`].
    pub(crate) fn prepare(&mut self, batch: &Batch, defer: bool) -> Planned {
        debug_assert!(defer || self.deferred.is_empty(), "a deferred block changes only by patches");
        let mut plan = Plan { defer, ..Plan::default() };
        let result = self.plan_ops(&mut plan, batch).and_then(|()| self.finish(&mut plan));
        match result {
            Ok(prepared) => {
                debug_assert!(
                    prepared.reserved_blocks.iter().all(|b| self.alloc.get(*b as u64))
                        && prepared.reserved_slots.iter().all(|s| self.slots.get(*s as u64)),
                    "a reservation of the plan is not set in its bitmap"
                );
                Planned::Ready(prepared)
            }
            Err(err) => {
                self.rollback(&plan.reserved_blocks, &plan.reserved_slots, &plan.claimed_chunks);
                if plan.patches_overflowed {
                    Planned::TooManyPatches
                } else {
                    Planned::Failed(err)
                }
            }
        }
    }

    pub(crate) fn rollback(&mut self, blocks: &[u32], slots: &[u32], chunks: &[u32]) {
        for &block in blocks {
            debug_assert!(self.alloc.get(block as u64), "rolling back block {block}, which is not reserved");
            self.alloc.set_range_quiet(block as u64, 1, false);
        }
        for &slot in slots {
            debug_assert!(self.slots.get(slot as u64), "rolling back slot {slot}, which is not reserved");
            self.slots.set_range_quiet(slot as u64, 1, false);
        }
        // Claimed by this plan alone: nothing on disk or in a record names them.
        for &chunk in chunks {
            self.alloc.release(chunk);
            self.written.release(chunk);
            self.pool.give(chunk);
        }
    }

    /// Takes a free chunk from the store's pool for this batch, if one is left.
    fn claim_chunk(&mut self, plan: &mut Plan) -> Option<u32> {
        let chunk = self.pool.take()?;
        // Free chunks are all clear on disk: a checkpoint wrote their pages
        // before giving them back, and mkfs zeroed them.
        self.alloc.adopt(chunk, None);
        self.written.adopt(chunk, None);
        plan.claimed_chunks.push(chunk);
        self.alloc_hint = self.region.first_block(chunk);
        Some(chunk)
    }

    fn plan_ops(&mut self, plan: &mut Plan, batch: &Batch) -> Result<()> {
        for op in &batch.ops {
            self.check_key(op.key().as_bytes())?;
            if let Op::Clone { key, source } = op {
                self.check_key(source.as_bytes())?;
                // Then the source has no block staged, patched or reserved by
                // this batch, and the copy none either (one deleted earlier
                // in the batch gave its blocks back: a rollback replaces an
                // object with a copy of its snapshot in one batch).
                let copy_absent = plan.objects.get(key).is_none_or(|w| w.current.is_none() && w.new_blocks.is_empty());
                if plan.objects.contains_key(source) || !copy_absent {
                    return Err(StoreError::invalid(
                        "a clone must come before every other operation of its batch on its source, \
                         and on its copy unless the batch deleted it",
                    ));
                }
            }
            self.load_working(plan, op.key());
            match op {
                Op::Write { key, offset, data } => {
                    plan.user_bytes += data.len() as u64;
                    self.plan_write(plan, key, *offset, data, false)?
                }
                Op::WriteJournaled { key, offset, data } => {
                    plan.user_bytes += data.len() as u64;
                    self.plan_write(plan, key, *offset, data, true)?
                }
                Op::Truncate { key, size } => self.plan_truncate(plan, key, *size)?,
                Op::Zero { key, offset, len } => self.plan_zero(plan, key, *offset, *len)?,
                Op::Delete { key } => self.plan_delete(plan, key),
                Op::CreatePreallocated { key, size } => self.plan_preallocate(plan, key, *size)?,
                Op::Clone { key, source } => self.plan_clone(plan, source, key)?,
                Op::SetAttr { key, name, value } => {
                    ObjectMeta::check_attr(name, value)?;
                    self.ensure_attrs(plan, key)?;
                    let w = plan.objects.get_mut(key).expect("loaded");
                    let meta = w.current.get_or_insert_with(|| ObjectMeta::new(key.clone()));
                    meta.set_attr(name, value)?;
                    w.meta_dirty = true;
                }
                Op::RemoveAttr { key, name } => {
                    if plan.objects[key].current.is_some() {
                        self.ensure_attrs(plan, key)?;
                        let w = plan.objects.get_mut(key).expect("loaded");
                        let meta = w.current.as_mut().expect("present");
                        if meta.attr(name).is_some() {
                            meta.remove_attr(name);
                            w.meta_dirty = true;
                        }
                    }
                }
                Op::OmapSet { key, entries } => {
                    self.ensure_attrs(plan, key)?;
                    let w = plan.objects.get_mut(key).expect("loaded");
                    let meta = w.current.get_or_insert_with(|| ObjectMeta::new(key.clone()));
                    meta.set_omap(entries)?;
                    w.meta_dirty = true;
                }
                Op::OmapRemove { key, keys } => {
                    if plan.objects[key].current.is_some() {
                        self.ensure_attrs(plan, key)?;
                        let w = plan.objects.get_mut(key).expect("loaded");
                        if w.current.as_mut().expect("present").remove_omap(keys) {
                            w.meta_dirty = true;
                        }
                    }
                }
                Op::DeleteIfOmapEmpty { key } => {
                    if plan.objects[key].current.is_some() {
                        self.ensure_attrs(plan, key)?;
                        if plan.objects[key].current.as_ref().expect("present").omap.is_empty() {
                            self.plan_delete(plan, key);
                        }
                    }
                }
                Op::OmapRemoveRange { key, start, end } => {
                    if plan.objects[key].current.is_some() {
                        self.ensure_attrs(plan, key)?;
                        let w = plan.objects.get_mut(key).expect("loaded");
                        if w.current.as_mut().expect("present").remove_omap_range(start, end.as_deref()) {
                            w.meta_dirty = true;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn load_working(&mut self, plan: &mut Plan, key: &Key) {
        if plan.objects.contains_key(key) {
            return;
        }
        let working = match self.objects.get(key.as_bytes()) {
            Some(entry) => Working {
                original_tail: {
                    let tail = (entry.size % BLOCK_SIZE as u64) as u16;
                    let last = (entry.size / BLOCK_SIZE as u64) as u32;
                    if tail == 0 {
                        None
                    } else {
                        entry.physical_for(last).map(|block| (block, tail))
                    }
                },
                current: Some(ObjectMeta {
                    key: key.clone(),
                    size: entry.size,
                    flags: entry.flags,
                    extents: Vec::new(),
                    attrs: Vec::new(),
                    omap: Vec::new(),
                }),
                extents_in_index: true,
                attrs_loaded: false,
                original_head: Some(entry.head_slot),
                original_alive: true,
                meta_dirty: false,
                new_blocks: HashSet::new(),
                tombstone: None,
            },
            None => Working {
                current: None,
                attrs_loaded: true,
                original_head: None,
                original_alive: false,
                meta_dirty: false,
                new_blocks: HashSet::new(),
                tombstone: None,
                original_tail: None,
                extents_in_index: false,
            },
        };
        plan.objects.insert(key.clone(), working);
    }

    /// The block `key` maps at `logical` as of this plan (`key` is present).
    fn mapped(&self, plan: &Plan, key: &Key, logical: u32) -> Option<u32> {
        let w = &plan.objects[key];
        debug_assert!(w.current.is_some(), "{key:?} is absent");
        if w.extents_in_index {
            self.objects
                .get(key.as_bytes())
                .expect("an object whose extents are in the index is indexed")
                .physical_for(logical)
        } else {
            w.current.as_ref().and_then(|meta| meta.physical_for(logical))
        }
    }

    /// Gives `key`'s working object its own copy of its extents, before the
    /// batch changes or records them.
    fn own_extents(&self, plan: &mut Plan, key: &Key) {
        let w = plan.objects.get_mut(key).expect("loaded");
        if std::mem::take(&mut w.extents_in_index) {
            let entry = self.objects.get(key.as_bytes()).expect("an object whose extents are in the index is indexed");
            let meta = w.current.as_mut().expect("only a present object's extents are in the index");
            debug_assert!(meta.extents.is_empty());
            meta.extents = entry.extents.to_vec();
        }
    }

    /// Makes `current.attrs` and `current.omap` hold the stored ones
    /// (reads the onode).
    fn ensure_attrs(&mut self, plan: &mut Plan, key: &Key) -> Result<()> {
        let w = &plan.objects[key];
        if w.attrs_loaded || !w.original_alive {
            return Ok(());
        }
        let head = w.original_head.expect("alive original has a head");
        let (_, _, stored) = self.read_chain(head)?;
        let w = plan.objects.get_mut(key).expect("loaded");
        let current = w.current.as_mut().expect("alive");
        current.attrs = stored.attrs;
        current.omap = stored.omap;
        w.attrs_loaded = true;
        Ok(())
    }

    fn reserve_block(&mut self, plan: &mut Plan, hint: Option<u32>) -> Result<u32> {
        let hinted = hint.filter(|&h| self.alloc.owns_block(h as u64) && !self.alloc.get(h as u64));
        let block = match hinted.map(u64::from).or_else(|| self.alloc.find_clear(self.alloc_hint)) {
            Some(block) => block,
            None => {
                let chunk = self.claim_chunk(plan).ok_or_else(|| StoreError::NoSpace {
                    partition: self.index,
                    detail: "every data block of the store is allocated".into(),
                })?;
                let block = self.region.first_block(chunk);
                debug_assert!(!self.alloc.get(block), "a claimed chunk starts clear");
                block
            }
        };
        self.alloc.set_range_quiet(block, 1, true);
        self.alloc_hint = block + 1;
        plan.reserved_blocks.push(block as u32);
        Ok(block as u32)
    }

    /// Releases a block reserved by this batch (it never reached the disk).
    fn release_reserved(&mut self, plan: &mut Plan, block: u32) {
        debug_assert!(plan.reserved_blocks.contains(&block), "block {block} is not this batch's to release");
        debug_assert!(self.alloc.get(block as u64), "block {block} released twice");
        self.alloc.set_range_quiet(block as u64, 1, false);
        plan.reserved_blocks.retain(|b| *b != block);
        plan.staged.remove(&block);
    }

    /// Whether bytes written to `block` go through the journal: always when
    /// it already has a deferred image (it must change only by patches until
    /// a checkpoint writes it back, or replay would rebuild it from a base
    /// that moved), and for a journaled write when the block held its place
    /// before this batch and no in-place write of this batch staged it.
    /// Whether bytes written to `block` go through the journal: always when
    /// it has a deferred image (it must change only by patches until a
    /// checkpoint writes it back, or replay would rebuild it from a base
    /// that moved), and for a journaled write when the block held its place
    /// before this batch and no in-place write of this batch staged it.
    /// Whole blocks too: an in-place overwrite that a power cut interrupts
    /// before its record lands leaves the block failing its checksum, and
    /// a journaled write is for data nothing else can rebuild (the OSD's
    /// request ids), so it is never overwritten in place.
    fn goes_to_journal(&self, plan: &Plan, block: u32, newly_reserved: bool, journaled: bool) -> bool {
        if newly_reserved || !plan.defer {
            return false;
        }
        plan.patched.contains_key(&block)
            || (!self.deferred.is_empty() && self.deferred.contains_key(&block))
            || (journaled && !plan.staged.contains_key(&block))
    }

    /// Writes `bytes` at `at` of `block` through the journal.
    fn patch(&mut self, plan: &mut Plan, block: u32, at: usize, bytes: &[u8]) -> Result<()> {
        debug_assert!(!plan.staged.contains_key(&block), "a block is staged or patched, never both");
        debug_assert!(at + bytes.len() <= BLOCK_SIZE);
        let patched = match plan.patched.entry(block) {
            std::collections::btree_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::btree_map::Entry::Vacant(entry) => {
                let whole = at == 0 && bytes.len() == BLOCK_SIZE;
                let (image, base_zero) = match self.deferred.get(&block) {
                    // Replaced whole: neither the old image nor the disk is
                    // read (the block may fail its checksum), and replay
                    // starts from zeros.
                    _ if whole => (self.take_block(false), true),
                    Some(_) => {
                        // From the spare buffers: no allocation per flush.
                        let mut copy = self.take_block(false);
                        copy.copy_from_slice(&self.deferred[&block]);
                        (copy, false)
                    }
                    None if self.written.get(block as u64) => {
                        let crc = self.crc_get(block)?;
                        (self.read_block_verified(block, crc)?, false)
                    }
                    None => (self.take_block(true), true),
                };
                entry.insert(PatchedBlock { image, base_zero, pieces: Vec::new() })
            }
        };
        patched.image[at..at + bytes.len()].copy_from_slice(bytes);
        patched.pieces.push((at as u16, bytes.to_vec()));
        Ok(())
    }

    /// The staged buffer for `block`, created from its current contents.
    fn stage(&mut self, plan: &mut Plan, block: u32, fully_overwritten: bool, newly_reserved: bool) -> Result<()> {
        if plan.staged.contains_key(&block) {
            return Ok(());
        }
        let was_written = !newly_reserved && self.written.get(block as u64);
        let old_crc = if was_written { self.crc_get(block)? } else { 0 };
        let buf = if was_written && !fully_overwritten {
            self.read_block_verified(block, old_crc)?
        } else {
            // A fully overwritten block needs no zeroing: the write covers it.
            self.take_block(!fully_overwritten)
        };
        debug_assert!(!plan.patched.contains_key(&block), "a block is staged or patched, never both");
        plan.staged.insert(block, StagedBlock { buf, was_written, old_crc, zero_from: 0 });
        Ok(())
    }

    fn plan_write(&mut self, plan: &mut Plan, key: &Key, offset: u64, data: &[u8], journaled: bool) -> Result<()> {
        let end = offset.checked_add(data.len() as u64).filter(|end| *end <= MAX_OBJECT_SIZE).ok_or_else(|| {
            StoreError::invalid(format!("write past the maximum object size ({MAX_OBJECT_SIZE} bytes)"))
        })?;
        {
            let w = plan.objects.get_mut(key).expect("loaded");
            if w.current.is_none() {
                w.current = Some(ObjectMeta::new(key.clone()));
                w.meta_dirty = true;
            }
        }
        let old_size = plan.objects[key].current.as_ref().expect("present").size;
        if end > old_size {
            self.zero_tail_for_growth(plan, key, old_size)?;
        }
        let block_size = BLOCK_SIZE as u64;
        let mut position = offset;
        while position < end {
            let logical = (position / block_size) as u32;
            let block_start = logical as u64 * block_size;
            let from = (position - block_start) as usize;
            let to = (end.min(block_start + block_size) - block_start) as usize;
            debug_assert!(from < to && to <= BLOCK_SIZE, "piece {from}..{to} of block {logical}");
            let (block, newly_reserved) = match self.mapped(plan, key, logical) {
                Some(block) => {
                    let newly_reserved = plan.objects[key].new_blocks.contains(&block);
                    if !newly_reserved && self.must_copy(plan, key, block) {
                        (self.copy_on_write(plan, key, logical, block, from == 0 && to == BLOCK_SIZE)?, true)
                    } else {
                        (block, newly_reserved)
                    }
                }
                None => match self.map_freed_again(plan, key, logical, journaled)? {
                    Some(block) => (block, false),
                    None => (self.map_new_block(plan, key, logical)?, true),
                },
            };
            let source = (block_start + from as u64 - offset) as usize;
            let bytes = &data[source..source + (to - from)];
            if self.goes_to_journal(plan, block, newly_reserved, journaled) {
                self.patch(plan, block, from, bytes)?;
            } else {
                self.stage(plan, block, from == 0 && to == BLOCK_SIZE, newly_reserved)?;
                plan.staged.get_mut(&block).expect("staged").buf[from..to].copy_from_slice(bytes);
            }
            position = block_start + to as u64;
        }
        debug_assert_eq!(position, end, "the pieces cover the write exactly");
        let w = plan.objects.get_mut(key).expect("loaded");
        let meta = w.current.as_mut().expect("present");
        if end > meta.size {
            meta.size = end;
            w.meta_dirty = true;
        }
        Ok(())
    }

    /// Maps a block reserved now at logical block `logical` of `key`
    /// (unmapped at this point of the batch) and returns it.
    fn map_new_block(&mut self, plan: &mut Plan, key: &Key, logical: u32) -> Result<u32> {
        let replaces_data = self.held_data_before(plan, key, logical);
        let hint = logical.checked_sub(1).and_then(|l| self.mapped(plan, key, l)).map(|p| p + 1);
        let block = self.reserve_block(plan, hint)?;
        self.own_extents(plan, key);
        let w = plan.objects.get_mut(key).expect("loaded");
        w.current.as_mut().expect("present").map_block(logical, block);
        w.new_blocks.insert(block);
        w.meta_dirty = true;
        if replaces_data {
            // The block the object held here before the batch is still
            // another's (a clone's): as a copy on write, the new one starts
            // from zeros and is made durable before the record that maps it.
            self.stage(plan, block, false, true)?;
            plan.copies.push(block);
        }
        Ok(block)
    }

    /// A write into logical block `logical` of `key`, unmapped at this point
    /// of the batch, where the object held a block before the batch that
    /// this batch freed (a `Zero` that covered it whole, a `Truncate` that
    /// cut it off): maps that same block again, in place, starting from
    /// zeros (what the zero or the truncate left there), and returns it.
    ///
    /// A fresh block would do for the batch, but not for a crash: with its
    /// record durable and its data not (an ordered commit cut before its
    /// last flush, a write cache that lands the record early), mount takes
    /// a fresh block whose crc32c does not match for a first write that
    /// never landed, a hole, and the block reads as zeros: neither what it
    /// held (acknowledged data) nor what the batch wrote, with no checksum
    /// to fail. In place, it is its old contents (the old crc32c matches),
    /// its new ones, or torn (a checksum error), as any in-place overwrite.
    fn map_freed_again(&mut self, plan: &mut Plan, key: &Key, logical: u32, journaled: bool) -> Result<Option<u32>> {
        if !plan.objects[key].original_alive || plan.freed_blocks.is_empty() {
            return Ok(None);
        }
        let Some(block) = self.objects.get(key.as_bytes()).and_then(|entry| entry.physical_for(logical)) else {
            return Ok(None);
        };
        let Some(at) = plan.freed_blocks.iter().position(|b| *b == block) else {
            return Ok(None);
        };
        debug_assert!(
            self.alloc.get(block as u64),
            "block {block}, freed by this batch, is allocated until it commits"
        );
        debug_assert!(
            !plan.staged.contains_key(&block) && !plan.patched.contains_key(&block),
            "a freed block keeps no staged or patched contents"
        );
        plan.freed_blocks.swap_remove(at);
        // Freeing it dropped its last reference; the object takes it back.
        if let Some(delta) = plan.ref_delta.get_mut(&block) {
            *delta += 1;
        }
        self.own_extents(plan, key);
        let w = plan.objects.get_mut(key).expect("loaded");
        w.current.as_mut().expect("present").map_block(logical, block);
        w.meta_dirty = true;
        debug_assert!(!w.new_blocks.contains(&block), "a block held before the batch is not one it reserved");
        if self.goes_to_journal(plan, block, false, journaled) {
            // Replay starts it from zeros too: neither its deferred image
            // nor the disk is read.
            let image = self.take_block(true);
            plan.patched.insert(block, PatchedBlock { image, base_zero: true, pieces: Vec::new() });
        } else {
            self.stage(plan, block, true, false)?;
            plan.staged.get_mut(&block).expect("staged").buf.fill(0);
        }
        Ok(Some(block))
    }

    /// Whether the object `key` held data at logical block `logical` before
    /// the batch, and is the same object still (not deleted and made again
    /// by the batch: a new object's blocks are all new).
    fn held_data_before(&self, plan: &Plan, key: &Key, logical: u32) -> bool {
        // A block leaves the object it was in before the batch only by a
        // zero or a truncate, which frees it or drops a reference to it: a
        // batch that did neither (an append, say) needs no index lookup.
        if plan.freed_blocks.is_empty() && plan.ref_delta.is_empty() {
            return false;
        }
        plan.objects[key].original_alive
            && self
                .objects
                .get(key.as_bytes())
                .and_then(|entry| entry.physical_for(logical))
                .is_some_and(|block| self.written.get(block as u64) || self.deferred.contains_key(&block))
    }

    /// Makes `offset..offset + len` (clipped to the object's size, which
    /// does not change) read as zeros without allocating: the
    /// whole blocks of the range are unmapped (their space freed, as a
    /// truncate frees the tail's) unless the object is preallocated, and
    /// the mapped parts of blocks at its ends are written with zeros.
    fn plan_zero(&mut self, plan: &mut Plan, key: &Key, offset: u64, len: u64) -> Result<()> {
        let Some((size, preallocated)) =
            plan.objects[key].current.as_ref().map(|meta| (meta.size, meta.is_preallocated()))
        else {
            return Ok(());
        };
        let end = offset.saturating_add(len).min(size);
        let block_size = BLOCK_SIZE as u64;
        let zeros = [0u8; BLOCK_SIZE];
        let mut position = offset;
        while position < end {
            let logical = (position / block_size) as u32;
            let piece_end = end.min((logical as u64 + 1) * block_size);
            let whole = position.is_multiple_of(block_size) && piece_end - position == block_size;
            if whole && !preallocated {
                self.unmap(plan, key, logical);
            } else if let Some(block) = self.mapped(plan, key, logical) {
                let reserved = plan.reserved_blocks.len();
                // A block shared with a clone (or one from a clone made by
                // this batch) is copied first, as any write's.
                let copied = !plan.objects[key].new_blocks.contains(&block) && self.must_copy(plan, key, block);
                self.plan_write(plan, key, position, &zeros[..(piece_end - position) as usize], false)?;
                debug_assert!(copied || plan.reserved_blocks.len() == reserved, "zeroing a mapped block allocated one");
            }
            position = piece_end;
        }
        debug_assert!(plan.objects[key].current.as_ref().is_some_and(|meta| meta.size == size), "a zero resized");
        Ok(())
    }

    /// Unmaps logical block `logical` of `key` (if mapped) and frees its
    /// data block, as a truncate frees those past the end.
    fn unmap(&mut self, plan: &mut Plan, key: &Key, logical: u32) {
        if self.mapped(plan, key, logical).is_none() {
            return;
        }
        self.own_extents(plan, key);
        let w = plan.objects.get_mut(key).expect("loaded");
        let meta = w.current.as_mut().expect("a mapped block's object is present");
        let Some(block) = meta.unmap_block(logical) else { return };
        w.meta_dirty = true;
        if w.new_blocks.remove(&block) {
            self.release_reserved(plan, block);
        } else if self.drop_reference(plan, block) {
            // A block a clone still maps only loses this reference.
            plan.staged.remove(&block);
            plan.patched.remove(&block);
            plan.freed_blocks.push(block);
        }
    }

    fn plan_truncate(&mut self, plan: &mut Plan, key: &Key, size: u64) -> Result<()> {
        if size > MAX_OBJECT_SIZE {
            return Err(StoreError::invalid(format!(
                "size {size} exceeds the maximum object size ({MAX_OBJECT_SIZE} bytes)"
            )));
        }
        if plan.objects[key].current.is_some() {
            self.own_extents(plan, key);
        }
        let (to_release, to_free) = {
            let w = plan.objects.get_mut(key).expect("loaded");
            if w.current.is_none() {
                w.current = Some(ObjectMeta::new(key.clone()));
                w.meta_dirty = true;
            }
            let meta = w.current.as_mut().expect("present");
            if size == meta.size {
                return Ok(());
            }
            w.meta_dirty = true;
            if size > meta.size {
                let old_size = meta.size;
                meta.size = size;
                return self.zero_tail_for_growth(plan, key, old_size);
            }
            let freed = meta.unmap_from(size.div_ceil(BLOCK_SIZE as u64) as u32);
            meta.size = size;
            let (mut to_release, mut to_free) = (Vec::new(), Vec::new());
            for (start, count) in freed {
                for block in start..start + count {
                    if w.new_blocks.remove(&block) {
                        to_release.push(block);
                    } else {
                        to_free.push(block);
                    }
                }
            }
            (to_release, to_free)
        };
        for block in to_release {
            self.release_reserved(plan, block);
        }
        for block in to_free {
            // A block a clone still maps only loses this reference.
            if self.drop_reference(plan, block) {
                plan.staged.remove(&block);
                plan.patched.remove(&block);
                plan.freed_blocks.push(block);
            }
        }
        Ok(())
    }

    /// Bytes past an object's size inside its last block are undefined on
    /// disk (a shrink does not rewrite them, and a crash may leave either
    /// version), so growing the object zeroes them first.
    fn zero_tail_for_growth(&mut self, plan: &mut Plan, key: &Key, old_size: u64) -> Result<()> {
        let tail = (old_size % BLOCK_SIZE as u64) as usize;
        if tail == 0 {
            return Ok(());
        }
        let logical = (old_size / BLOCK_SIZE as u64) as u32;
        let Some(mut block) = self.mapped(plan, key, logical) else {
            return Ok(());
        };
        let mut newly_reserved = plan.objects[key].new_blocks.contains(&block);
        // As for a write into the block (a clone then grown past a partial
        // last block met this: the simulator-free store model, session 34).
        if !newly_reserved && self.must_copy(plan, key, block) {
            if !self.written.get(block as u64) && !self.deferred.contains_key(&block) {
                return Ok(()); // reads as zeros already
            }
            block = self.copy_on_write(plan, key, logical, block, false)?;
            newly_reserved = true;
        }
        if self.goes_to_journal(plan, block, newly_reserved, false) {
            return self.patch(plan, block, tail, &[0u8; BLOCK_SIZE][tail..]);
        }
        if !plan.staged.contains_key(&block) && (newly_reserved || !self.written.get(block as u64)) {
            return Ok(()); // reads as zeros already
        }
        self.stage(plan, block, false, newly_reserved)?;
        plan.staged.get_mut(&block).expect("staged").buf[tail..].fill(0);
        Ok(())
    }

    fn plan_delete(&mut self, plan: &mut Plan, key: &Key) {
        if plan.objects[key].current.is_some() {
            self.own_extents(plan, key);
        }
        let w = plan.objects.get_mut(key).expect("loaded");
        let Some(meta) = w.current.take() else { return };
        let new_blocks = std::mem::take(&mut w.new_blocks);
        let was_original = w.original_alive;
        w.original_alive = false;
        w.meta_dirty = false;
        w.attrs_loaded = true;
        let mut tombstone = ObjectMeta::new(key.clone());
        tombstone.size = meta.size;
        tombstone.flags = meta.flags;
        for extent in &meta.extents {
            for (offset, block) in (extent.physical..extent.physical + extent.len).enumerate() {
                if new_blocks.contains(&block) {
                    self.release_reserved(plan, block);
                } else {
                    if !self.is_shared(plan, block) {
                        plan.staged.remove(&block);
                        plan.patched.remove(&block);
                    }
                    tombstone.map_block(extent.logical + offset as u32, block);
                }
            }
        }
        if was_original {
            plan.objects.get_mut(key).expect("loaded").tombstone = Some(tombstone);
        } else {
            // Created by this batch: it owns only blocks it reserved, and
            // (a clone) blocks it shares, whose references it drops now.
            for extent in &tombstone.extents {
                for block in extent.physical..extent.physical + extent.len {
                    debug_assert!(self.references(plan, block) >= 1, "block {block} of a clone has no reference");
                    if self.drop_reference(plan, block) {
                        plan.staged.remove(&block);
                        plan.patched.remove(&block);
                        plan.freed_blocks.push(block);
                    }
                }
            }
        }
    }

    /// `key` becomes a copy of `source` mapping the same blocks; both are
    /// flagged as sharing (mount counts their references).
    fn plan_clone(&mut self, plan: &mut Plan, source: &Key, key: &Key) -> Result<()> {
        self.load_working(plan, source);
        if plan.objects[source].current.is_none() || plan.objects[key].current.is_some() {
            return Ok(()); // replayed, or nothing to copy
        }
        self.ensure_attrs(plan, source)?;
        self.own_extents(plan, source);
        let mut meta = plan.objects[source].current.clone().expect("present");
        debug_assert!(plan.objects[source].new_blocks.is_empty(), "a clone's source has no block of this batch");
        meta.key = key.clone();
        meta.flags |= OBJECT_FLAG_SHARES;
        for extent in &meta.extents {
            for block in extent.physical..extent.physical + extent.len {
                *plan.ref_delta.entry(block).or_default() += 1;
            }
        }
        let copy = plan.objects.get_mut(key).expect("loaded");
        copy.current = Some(meta);
        copy.attrs_loaded = true;
        copy.meta_dirty = true;
        let original = plan.objects.get_mut(source).expect("loaded").current.as_mut().expect("present");
        if original.flags & OBJECT_FLAG_SHARES == 0 {
            original.flags |= OBJECT_FLAG_SHARES;
            plan.objects.get_mut(source).expect("loaded").meta_dirty = true;
        }
        Ok(())
    }

    /// Whether any block is shared (or this plan shares one): without
    /// clones every reference count is 1 and nothing is looked up.
    fn sharing(shared: &BTreeMap<u32, u32>, plan: &Plan) -> bool {
        !shared.is_empty() || !plan.ref_delta.is_empty()
    }

    /// How many objects map `block` (one some object maps), as of this plan.
    fn references(&self, plan: &Plan, block: u32) -> i64 {
        if !Self::sharing(&self.shared, plan) {
            return 1; // no clone anywhere: one lookup-free test per block
        }
        1 + i64::from(self.shared.get(&block).copied().unwrap_or(0))
            + i64::from(plan.ref_delta.get(&block).copied().unwrap_or(0))
    }

    fn is_shared(&self, plan: &Plan, block: u32) -> bool {
        self.references(plan, block) > 1
    }

    /// Whether a change to `key`'s `block` (one the batch did not reserve)
    /// must go to a copy. A shared block, of course. And an object made
    /// (again) by this batch maps blocks it did not hold before only
    /// through a clone: their durable contents are another object's, even
    /// when the batch has since dropped that object's reference (a
    /// truncate or a write of the source). Changed in place, a crash with
    /// the record durable and the data not would show the source's bytes
    /// here: copy them instead.
    fn must_copy(&self, plan: &Plan, key: &Key, block: u32) -> bool {
        !plan.objects[key].original_alive || self.is_shared(plan, block)
    }

    /// Drops one object's reference to `block`; whether it was the last
    /// (the block is then the caller's to free).
    fn drop_reference(&mut self, plan: &mut Plan, block: u32) -> bool {
        let before = self.references(plan, block);
        debug_assert!(before >= 1, "block {block} has {before} references");
        if before > 1 || plan.ref_delta.contains_key(&block) || self.shared.contains_key(&block) {
            *plan.ref_delta.entry(block).or_default() -= 1;
        }
        before == 1
    }

    /// Logical block `logical` of `key` maps a block it shares: map it to a
    /// new block holding the same bytes (staged; not read when the write
    /// covers it `whole`) and drop the shared one. Returns the new block.
    fn copy_on_write(&mut self, plan: &mut Plan, key: &Key, logical: u32, shared: u32, whole: bool) -> Result<u32> {
        debug_assert!(
            !plan.staged.contains_key(&shared) && !plan.patched.contains_key(&shared),
            "a shared block changed in place by this batch"
        );
        let copy = self.reserve_block(plan, None)?;
        self.own_extents(plan, key);
        let buf = if whole {
            self.take_block(false)
        } else if self.deferred.contains_key(&shared) {
            let mut buf = self.take_block(false);
            buf.copy_from_slice(&self.deferred[&shared]);
            buf
        } else if self.written.get(shared as u64) {
            let crc = self.crc_get(shared)?;
            self.read_block_verified(shared, crc)?
        } else {
            self.take_block(true)
        };
        plan.staged.insert(copy, StagedBlock { buf, was_written: false, old_crc: 0, zero_from: 0 });
        // Flushed before the record (commit.rs), even a copy the write
        // covers whole: the record maps the logical block to it, so a crash
        // after the record and before the copy's bytes would leave the block
        // neither old nor new (the crash test with a volatile write cache
        // found exactly that when whole copies went with the batch's data).
        plan.copies.push(copy);
        let w = plan.objects.get_mut(key).expect("loaded");
        let meta = w.current.as_mut().expect("present");
        let unmapped = meta.unmap_block(logical);
        debug_assert_eq!(unmapped, Some(shared));
        meta.map_block(logical, copy);
        w.new_blocks.insert(copy);
        w.meta_dirty = true;
        let last = self.drop_reference(plan, shared);
        if last {
            // Held only through a clone this batch made (its source let go
            // of it earlier in the batch): nothing maps it once the record
            // is in, and it is freed with it.
            debug_assert!(
                !plan.objects[key].original_alive,
                "block {shared} was shared, yet a copy dropped its last reference"
            );
            plan.freed_blocks.push(shared);
        }
        Ok(copy)
    }

    fn plan_preallocate(&mut self, plan: &mut Plan, key: &Key, size: u64) -> Result<()> {
        if plan.objects[key].current.is_some() {
            // Whatever its layout: a replayed create must never fail.
            return Ok(());
        }
        if size > MAX_OBJECT_SIZE {
            return Err(StoreError::invalid(format!(
                "size {size} exceeds the maximum object size ({MAX_OBJECT_SIZE} bytes)"
            )));
        }
        let blocks = size.div_ceil(BLOCK_SIZE as u64);
        let mut meta = ObjectMeta::new(key.clone());
        meta.size = size;
        meta.flags = OBJECT_FLAG_PREALLOCATED;
        let mut new_blocks = HashSet::new();
        let mut logical = 0u64;
        while logical < blocks {
            let (start, len) = self.reserve_run(plan, blocks - logical)?;
            for block in start..start + len {
                new_blocks.insert(block as u32);
            }
            meta.extents.push(crate::onode::Extent {
                logical: logical as u32,
                physical: start as u32,
                len: len as u32,
            });
            logical += len;
        }
        let w = plan.objects.get_mut(key).expect("loaded");
        w.current = Some(meta);
        w.new_blocks = new_blocks;
        w.meta_dirty = true;
        Ok(())
    }

    /// Reserves a run of up to `want` blocks for a pre-allocated object: the
    /// whole run in one chunk if one has room, else the longest run found
    /// down to `MIN_PREALLOCATED_RUN` (an object's extents stay few, its
    /// onode small). Returns the run's start and length.
    fn reserve_run(&mut self, plan: &mut Plan, want: u64) -> Result<(u64, u64)> {
        let mut len = want.min(self.region.chunk_blocks);
        let start = loop {
            if let Some(start) = self.alloc.find_clear_run(self.alloc_hint, len) {
                break start;
            }
            if let Some(chunk) = self.claim_chunk(plan) {
                // A whole chunk is free: the run starts it.
                len = len.min(self.region.chunk_len(chunk));
                break self.region.first_block(chunk);
            }
            if len <= MIN_PREALLOCATED_RUN.min(want) {
                return Err(StoreError::NoSpace {
                    partition: self.index,
                    detail: format!("no run of {len} free blocks left for a pre-allocated object"),
                });
            }
            len = (len / 2).max(MIN_PREALLOCATED_RUN.min(want));
        };
        self.alloc.set_range_quiet(start, len, true);
        self.alloc_hint = start + len;
        plan.reserved_blocks.extend((start..start + len).map(|block| block as u32));
        Ok((start, len))
    }

    fn reserve_slots(&mut self, plan: &mut Plan, count: usize) -> Result<Vec<u32>> {
        let mut out = Vec::with_capacity(count);
        for _ in 0..count {
            let slot = self.slots.find_clear(self.slot_hint).ok_or_else(|| StoreError::NoSpace {
                partition: self.index,
                detail: "every onode slot is in use (mkfs with a smaller bytes-per-onode for more objects)".into(),
            })?;
            self.slots.set_range_quiet(slot, 1, true);
            self.slot_hint = slot + 1;
            plan.reserved_slots.push(slot as u32);
            out.push(slot as u32);
        }
        Ok(out)
    }

    /// Stores `blob` in `chain` (reusing its slots, reserving or freeing
    /// slots to fit) and adds the slot images to `entries`.
    fn write_chain(
        &mut self,
        plan: &mut Plan,
        entries: &mut Vec<Entry>,
        mut chain: Vec<u32>,
        blob: &[u8],
        deleted: bool,
    ) -> Result<Vec<u32>> {
        let needed = slots_needed(blob.len());
        if needed > MAX_CHAIN_SLOTS {
            return Err(StoreError::invalid(format!(
                "an object's metadata may not exceed {} bytes ({} asked)",
                MAX_CHAIN_SLOTS * crate::onode::FRAGMENT_CAPACITY,
                blob.len()
            )));
        }
        if chain.len() > needed {
            plan.freed_slots.extend(chain.split_off(needed));
        } else if chain.len() < needed {
            let extra = self.reserve_slots(plan, needed - chain.len())?;
            for &slot in &extra {
                entries.push(Entry::SetBits { map: BitmapKind::Slots, start: slot as u64, count: 1, value: true });
            }
            chain.extend(extra);
        }
        debug_assert!(chain.iter().all(|s| self.slots.get(*s as u64)), "a chain slot is not in use");
        for (slot, image) in chain.iter().zip(encode_chain(blob, &chain, deleted)) {
            entries.push(Entry::WriteSlot { slot: *slot, image: Box::new(image) });
        }
        Ok(chain)
    }

    /// Turns the working objects into the record, staged data and index changes.
    fn finish(&mut self, plan: &mut Plan) -> Result<Prepared> {
        // Claims first: replay takes a chunk before anything touches it.
        let mut entries: Vec<Entry> = plan.claimed_chunks.iter().map(|&chunk| Entry::Claim { chunk }).collect();
        let mut index_updates = Vec::new();
        let mut new_reclaims = Vec::new();
        let mut new_block_runs: Vec<u32> = Vec::new();

        // Delayed deallocation: free what earlier deletes left behind.
        let reclaimed = self.reclaim.len().min(64);
        let mut reclaim_slots: Vec<u32> = Vec::new();
        let mut reclaim_runs: Vec<(u64, u64)> = Vec::new();
        if !Self::sharing(&self.shared, plan) {
            for reclaim in &self.reclaim[..reclaimed] {
                reclaim_slots.extend_from_slice(&reclaim.slots);
                reclaim_runs.extend(reclaim.runs.iter().map(|&(start, count)| (start as u64, count as u64)));
            }
        } else {
            // A block a clone still maps only loses the deleted object's reference.
            for index in 0..reclaimed {
                let runs = self.reclaim[index].runs.clone();
                reclaim_slots.extend_from_slice(&self.reclaim[index].slots);
                let mut freed: Vec<u32> = Vec::new();
                for (start, count) in runs {
                    freed.extend((start..start + count).filter(|&block| self.drop_reference(plan, block)));
                }
                freed.sort_unstable();
                reclaim_runs.extend(runs_of(&freed));
            }
        }
        for (start, count) in reclaim_runs {
            entries.push(Entry::SetBits { map: BitmapKind::Alloc, start, count, value: false });
            entries.push(Entry::SetBits { map: BitmapKind::Written, start, count, value: false });
        }
        for slot in reclaim_slots {
            entries.push(Entry::SetBits { map: BitmapKind::Slots, start: slot as u64, count: 1, value: false });
        }

        for (block, tail) in plan.objects.values().filter_map(|w| w.original_tail) {
            if let Some(staged) = plan.staged.get_mut(&block) {
                staged.zero_from = tail;
            }
        }
        let keys: Vec<Key> = plan.objects.keys().cloned().collect();
        for key in keys {
            if let Some(tombstone) = plan.objects.get_mut(&key).expect("present").tombstone.take() {
                let head = plan.objects[&key].original_head.expect("deleted original has a head");
                let chain = self.read_chain(head)?.0;
                let chain = self.write_chain(plan, &mut entries, chain, &tombstone.encode(), true)?;
                let runs = tombstone.extents.iter().map(|e| (e.physical, e.len)).collect();
                new_reclaims.push(Reclaim { runs, slots: chain });
            }
            let w = &plan.objects[&key];
            new_block_runs.extend(w.new_blocks.iter().copied());
            match (&w.current, w.meta_dirty) {
                (Some(_), true) => {
                    self.ensure_attrs(plan, &key)?;
                    self.own_extents(plan, &key);
                    let w = &plan.objects[&key];
                    let blob = w.current.as_ref().expect("present").encode();
                    let chain = match (w.original_alive, w.original_head) {
                        (true, Some(head)) => self.read_chain(head)?.0,
                        _ => Vec::new(),
                    };
                    let chain = self.write_chain(plan, &mut entries, chain, &blob, false)?;
                    let meta = plan.objects[&key].current.as_ref().expect("present");
                    index_updates.push((key.clone(), Some(IndexEntry::from_meta(chain[0], meta))));
                }
                (None, _) if w.original_head.is_some() => index_updates.push((key.clone(), None)),
                _ => {}
            }
        }

        new_block_runs.sort_unstable();
        plan.freed_blocks.sort_unstable();
        // A block is reserved by one object at most, and a block freed by
        // this batch was held before it (a reserved one is released instead).
        debug_assert!(new_block_runs.windows(2).all(|w| w[0] < w[1]), "a block reserved twice");
        debug_assert!(plan.freed_blocks.windows(2).all(|w| w[0] < w[1]), "a block freed twice");
        debug_assert!(
            plan.freed_blocks.iter().all(|b| new_block_runs.binary_search(b).is_err()),
            "a block both reserved and freed"
        );
        debug_assert!(plan.staged.keys().all(|b| !plan.patched.contains_key(b)), "a block both staged and patched");
        for (start, count) in runs_of(&new_block_runs) {
            entries.push(Entry::SetBits { map: BitmapKind::Alloc, start, count, value: true });
        }
        for (start, count) in runs_of(&plan.freed_blocks) {
            entries.push(Entry::SetBits { map: BitmapKind::Alloc, start, count, value: false });
            entries.push(Entry::SetBits { map: BitmapKind::Written, start, count, value: false });
        }
        for &slot in &plan.freed_slots {
            entries.push(Entry::SetBits { map: BitmapKind::Slots, start: slot as u64, count: 1, value: false });
        }
        for (&block, staged) in &plan.staged {
            debug_assert!(self.alloc.get(block as u64), "staged block {block} is not allocated");
            entries.push(Entry::DataWrite {
                block,
                was_written: staged.was_written,
                old_crc: staged.old_crc,
                new_crc: crate::crc32c(&staged.buf),
                zero_from: staged.zero_from,
            });
        }
        for (&block, patched) in &mut plan.patched {
            debug_assert!(self.alloc.get(block as u64), "patched block {block} is not allocated");
            debug_assert!(!patched.pieces.is_empty(), "patched block {block} has no patch for the record");
            let new_crc = crate::crc32c(&patched.image);
            for (index, (at, bytes)) in patched.pieces.drain(..).enumerate() {
                entries.push(Entry::Patch { block, at, base_zero: patched.base_zero && index == 0, new_crc, bytes });
            }
        }
        let record = crate::journal::Record { entries };
        let capacity = self.geometry.journal.blocks * BLOCK_SIZE as u64;
        if record.padded_len(self.sector) as u64 > capacity / 2 {
            plan.patches_overflowed = record.entries.iter().any(|e| matches!(e, Entry::Patch { .. }));
            return Err(StoreError::invalid(format!(
                "batch too large: its journal record needs {} bytes, more than half the {capacity}-byte journal",
                record.padded_len(self.sector)
            )));
        }
        debug_assert!(record
            .entries
            .iter()
            .all(|e| !matches!(e, Entry::WriteSlot { image, .. } if image.len() != SLOT_SIZE)));
        // A copy released again by the batch (its object deleted or cut) is not staged.
        let mut copies: Vec<u32> =
            plan.copies.iter().copied().filter(|block| plan.staged.contains_key(block)).collect();
        copies.sort_unstable();
        copies.dedup();
        Ok(Prepared {
            record,
            staged: std::mem::take(&mut plan.staged),
            patched: std::mem::take(&mut plan.patched),
            index_updates,
            new_reclaims,
            user_bytes: plan.user_bytes,
            reserved_blocks: std::mem::take(&mut plan.reserved_blocks),
            reserved_slots: std::mem::take(&mut plan.reserved_slots),
            claimed_chunks: std::mem::take(&mut plan.claimed_chunks),
            ref_delta: std::mem::take(&mut plan.ref_delta),
            copies,
            reclaimed,
        })
    }
}

/// Sorted, distinct values as `(start, count)` runs.
fn runs_of(sorted: &[u32]) -> Vec<(u64, u64)> {
    debug_assert!(sorted.windows(2).all(|w| w[0] < w[1]), "runs of unsorted or repeated values");
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for &value in sorted {
        match runs.last_mut() {
            Some((start, count)) if *start + *count == value as u64 => *count += 1,
            _ => runs.push((value as u64, 1)),
        }
    }
    debug_assert_eq!(runs.iter().map(|(_, count)| count).sum::<u64>(), sorted.len() as u64);
    runs
}
