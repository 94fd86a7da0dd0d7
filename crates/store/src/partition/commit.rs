//! Committing a planned batch, applying records to memory, and checkpoints.
//!
//! Commit order (the durability contract of the crate docs):
//! record write → (wait) → data writes → (wait) → apply in memory → one flush.
//! Applied before it is durable, a batch's effect is what reads see while
//! the device flushes ([`Partition::apply_unsynced`]): the device returns
//! completed writes to reads whether they are durable or not, and a flush
//! that fails stops the partition.
//! The record goes first so that, after a crash, the last record names every
//! block the batch may have touched, with its old and new crc32c.
//!
//! A device's write cache may still land the data before the record. That
//! is harmless but for one case: a batch overwriting in place a block the
//! previous record wrote for the first time. Landed without its record,
//! its data would make mount take the previous record's first write for
//! one that never landed, and turn the block back into a hole (zeros that
//! pass every check). Such a batch flushes its record before writing its
//! data: a second flush, for that batch only.

use super::plan::{Planned, Prepared};
use super::{CommitInfo, Partition};
use crate::batch::Batch;
use crate::blockio::AlignedBuf;
use crate::error::{Result, StoreError};
use crate::journal::{BitmapKind, Entry, Record};
use crate::layout::PartitionHeader;
use crate::BLOCK_SIZE;

impl Partition {
    /// Applies `batch` and makes it durable with one device flush.
    ///
    /// `Ok`: every operation is durable (survives a process crash and a power
    /// loss). `Err` other than [`StoreError::Io`]: nothing was applied
    /// (validation, space, or a checksum error while reading a block to
    /// merge a partial write). `Err(Io)`: the device failed mid-commit; the
    /// partition has stopped ([`StoreError::PartitionFailed`] from then on)
    /// and must be remounted, which replays the journal.
    pub fn apply(&mut self, batch: &Batch) -> Result<CommitInfo> {
        let unsynced = self.apply_unsynced(batch)?;
        if unsynced.info.seq == 0 {
            // Nothing was written: nothing to flush.
            return self.end_commit(unsynced, Ok(()));
        }
        let flushing = std::time::Instant::now();
        let flushed = self.io.flush();
        self.stats.flush_ns += flushing.elapsed().as_nanos() as u64;
        self.end_commit(unsynced, flushed)
    }

    /// [`Partition::apply`] but for its last device flush, which the caller
    /// makes, on any thread, with the partition's [`Partition::flush_handle`],
    /// and reports to [`Partition::synced`]. Until then the partition
    /// answers reads (they see the batch) and refuses every change.
    pub fn apply_unsynced(&mut self, batch: &Batch) -> Result<Unsynced> {
        self.check_usable()?;
        assert!(!self.unsynced, "a change while the last commit's flush is out");
        if self.config.read_only {
            return Err(StoreError::ReadOnly);
        }
        let planning = std::time::Instant::now();
        let (mut prepared, mut checkpointed) = loop {
            match self.plan(batch) {
                // Blocks of deleted objects are freed by the record after
                // their delete's, and planning allocates before it frees: on
                // a full partition every batch that needs a block would be
                // refused, so nothing would ever commit the frees. Commit
                // them alone, then plan again.
                Err(StoreError::NoSpace { .. }) if !self.reclaim.is_empty() => {
                    let reclaims = self.reclaim.len();
                    self.commit_reclaims()?;
                    debug_assert!(self.reclaim.len() < reclaims, "a reclaim commit freed nothing");
                }
                planned => break planned?,
            }
        };
        self.stats.plan_ns += planning.elapsed().as_nanos() as u64;
        if self.needs_room(&prepared) {
            // Checkpoint outside any plan: its bitmap pages must not carry the
            // plan's quiet reservations, so undo them and plan again after.
            self.rollback(&prepared.reserved_blocks, &prepared.reserved_slots, &prepared.claimed_chunks);
            self.checkpoint()?;
            checkpointed = true;
            prepared = self.plan(batch)?.0;
        }
        let result = self.commit(prepared).map(|info| CommitInfo { checkpointed, ..info });
        self.stats.batches += 1;
        self.stats.ops += batch.len() as u64;
        self.pages.trim();
        let info = result?;
        self.unsynced = info.seq != 0;
        Ok(Unsynced { info })
    }

    /// A handle to flush the partition's device from another thread.
    pub fn flush_handle(&self) -> std::sync::Arc<dyn crate::blockio::FlushHandle> {
        self.io.flush_handle()
    }

    /// Ends [`Partition::apply_unsynced`] with the flush's result: `Ok`,
    /// the batch is durable; `Err`, the partition has stopped, as a failed
    /// commit stops it.
    pub fn synced(&mut self, unsynced: Unsynced, flushed: std::io::Result<()>) -> Result<CommitInfo> {
        if unsynced.info.seq != 0 {
            self.flushes_by_handle += 1;
        }
        self.end_commit(unsynced, flushed)
    }

    fn end_commit(&mut self, unsynced: Unsynced, flushed: std::io::Result<()>) -> Result<CommitInfo> {
        let Unsynced { info } = unsynced;
        if info.seq == 0 {
            // Nothing was written: no flush was needed.
            debug_assert!(!self.unsynced, "an empty batch left the partition waiting for a flush");
            return Ok(info);
        }
        assert!(self.unsynced, "a flush reported for no commit");
        self.unsynced = false;
        match flushed {
            Ok(()) => Ok(info),
            Err(err) => {
                self.failed = true;
                tracing::error!(partition = self.index, error = %err, "device error flushing a commit; partition stopped");
                Err(StoreError::io(format!("flushing batch {} of partition {}", info.seq, self.index), err))
            }
        }
    }

    /// Whether deleted objects' blocks wait for a later record to be freed
    /// (delayed deallocation): until one commits, that space is not free.
    pub fn reclaims_owed(&self) -> bool {
        !self.reclaim.is_empty()
    }

    /// Commits a record of nothing but the frees the reclaim queue owes
    /// (up to the planner's per-record share). A caller that writes nothing
    /// more for a while (a full cluster refusing writes after deletes)
    /// calls it so the space shows free.
    pub fn commit_reclaims(&mut self) -> Result<CommitInfo> {
        self.check_usable()?;
        if self.config.read_only {
            return Err(StoreError::ReadOnly);
        }
        let (mut prepared, _) = self.plan(&Batch::new())?;
        debug_assert!(prepared.reclaimed > 0, "a reclaim commit with nothing to free");
        if self.needs_room(&prepared) {
            self.rollback(&prepared.reserved_blocks, &prepared.reserved_slots, &prepared.claimed_chunks);
            self.checkpoint()?;
            prepared = self.plan(&Batch::new())?.0;
        }
        let info = self.commit(prepared)?;
        self.unsynced = info.seq != 0;
        let flushed = if info.seq == 0 { Ok(()) } else { self.io.flush() };
        self.end_commit(Unsynced { info }, flushed)
    }

    /// Plans `batch`, deferring journaled writes where they fit; whether it
    /// took a checkpoint for that. Patches too many for the journal: a
    /// checkpoint writes the deferred blocks back, and the batch is planned
    /// again with every block in place.
    fn plan(&mut self, batch: &Batch) -> Result<(Prepared, bool)> {
        match self.prepare(batch, true) {
            Planned::Ready(prepared) => Ok((prepared, false)),
            Planned::Failed(err) => Err(err),
            Planned::TooManyPatches => {
                self.checkpoint()?;
                match self.prepare(batch, false) {
                    Planned::Ready(prepared) => Ok((prepared, true)),
                    Planned::Failed(err) => Err(err),
                    Planned::TooManyPatches => unreachable!("a plan in place has no patches"),
                }
            }
        }
    }

    /// Convenience: a batch of one write.
    pub fn write(&mut self, key: &crate::Key, offset: u64, data: &[u8]) -> Result<CommitInfo> {
        let mut batch = Batch::new();
        batch.write(key.clone(), offset, data);
        self.apply(&batch)
    }

    /// Writes a planned batch and applies it in memory; the caller flushes.
    fn commit(&mut self, prepared: Prepared) -> Result<CommitInfo> {
        debug_assert!(!self.unsynced, "a commit while the last one's flush is out");
        if prepared.record.entries.is_empty() {
            debug_assert!(prepared.staged.is_empty() && prepared.patched.is_empty());
            return Ok(CommitInfo::default());
        }
        let record_len = prepared.record.padded_len(self.sector) as u64;
        // Pages the record will touch, loaded now so applying it cannot fail.
        if let Err(err) = self.preload_for(&prepared.record) {
            self.rollback(&prepared.reserved_blocks, &prepared.reserved_slots, &prepared.claimed_chunks);
            return Err(err);
        }

        let seq = self.next_seq;
        let record_buf = prepared.record.encode(seq, &self.fsid, self.index, self.sector);
        let record_offset = self.geometry.journal.byte_offset() + self.journal_used_bytes;
        debug_assert_eq!(record_buf.len() as u64, record_len, "the record's length is what was planned");
        debug_assert!(record_offset.is_multiple_of(self.sector as u64), "journal record at {record_offset}");
        debug_assert!(
            record_offset + record_len <= self.geometry.journal.end() * BLOCK_SIZE as u64,
            "the record passes the journal's end (needs_room was not asked)"
        );
        // Copies on write go first, flushed: the block a copy was made
        // from may be written in place or freed by this same batch (its
        // other object now holds it alone), so after a crash nothing could
        // give the copy its old bytes back. Durable before its record, a
        // copy the record maps always holds its new bytes. Only batches that
        // copy pay this flush; a store without clones never does.
        if !prepared.copies.is_empty() {
            let stage = std::time::Instant::now();
            let copies: Vec<(u64, &[u8])> = prepared
                .copies
                .iter()
                .map(|block| (self.data_offset(*block), &prepared.staged[block].buf[..]))
                .collect();
            let written = self.io.write_many(&copies).and_then(|()| self.io.flush());
            if let Err(err) = written {
                self.failed = true;
                tracing::error!(partition = self.index, error = %err, "device error writing copies; partition stopped");
                return Err(StoreError::io(
                    format!("writing the copies of batch {} of partition {}", self.next_seq, self.index),
                    err,
                ));
            }
            self.stats.copies_flushed_first += 1;
            self.stats.data_write_ns += stage.elapsed().as_nanos() as u64;
        }
        let data: Vec<(u64, &[u8])> = prepared
            .staged
            .iter()
            .filter(|(block, _)| prepared.copies.binary_search(block).is_err())
            .map(|(block, staged)| (self.data_offset(*block), &staged.buf[..]))
            .collect();
        // A block this batch writes for the first time was free until it
        // reserved it, so it cannot be one of the last record's first writes.
        debug_assert!(
            prepared.staged.iter().all(|(block, s)| s.was_written || !self.last_record_fresh.contains(block)),
            "a block the last record wrote first is never reserved again before a commit frees it"
        );
        // Most batches follow one that wrote nothing for the first time.
        let ordered = !self.last_record_fresh.is_empty()
            && prepared.staged.keys().any(|block| self.last_record_fresh.contains(block));
        let stage = std::time::Instant::now();
        // The last flush is the caller's (`apply`, or `synced`).
        let io_result = if ordered {
            self.io.write_many(&[(record_offset, &record_buf[..])]).and_then(|()| {
                self.io.flush()?;
                let record_done = std::time::Instant::now();
                self.stats.record_write_ns += (record_done - stage).as_nanos() as u64;
                self.io.write_many(&data)?;
                self.stats.data_write_ns += record_done.elapsed().as_nanos() as u64;
                Ok(())
            })
        } else {
            // The record and the data in one submission: no order between
            // them is needed, since mount tells by each block's crc32c
            // whether the last record's data landed (recover_last_record).
            let mut writes = Vec::with_capacity(1 + data.len());
            writes.push((record_offset, &record_buf[..]));
            writes.extend_from_slice(&data);
            self.io.write_many(&writes).map(|()| {
                self.stats.data_write_ns += stage.elapsed().as_nanos() as u64;
            })
        };

        if let Err(err) = io_result {
            self.failed = true;
            tracing::error!(partition = self.index, error = %err, "device error during commit; partition stopped");
            return Err(StoreError::io(format!("committing batch {seq} of partition {}", self.index), err));
        }
        self.next_seq += 1;
        self.journal_used_bytes += record_len;
        debug_assert!(self.journal_used_bytes <= self.geometry.journal.blocks * BLOCK_SIZE as u64);
        self.stats.ordered_commits += u64::from(ordered);
        self.last_record_fresh.clear();
        self.last_record_fresh.extend(prepared.staged.iter().filter(|(_, s)| !s.was_written).map(|(block, _)| *block));
        for (block, patched) in prepared.patched {
            // The record's patches then apply to the image that already holds them.
            if let Some(old) = self.deferred.insert(block, patched.image) {
                self.give_blocks([old]);
            }
        }
        self.apply_record(&prepared.record)?;
        debug_assert!(
            prepared.staged.keys().all(|b| self.alloc.get(*b as u64) && self.written.get(*b as u64)),
            "a block written by the batch is not allocated and written"
        );
        for (key, entry) in prepared.index_updates {
            match entry {
                Some(entry) => self.objects.insert(key, entry),
                None => self.objects.remove(key.as_bytes()),
            };
        }
        for (block, delta) in prepared.ref_delta {
            let references = 1 + i64::from(self.shared.get(&block).copied().unwrap_or(0)) + i64::from(delta);
            debug_assert!(references >= 0, "block {block} left with {references} references");
            if references > 1 {
                self.shared.insert(block, (references - 1) as u32);
            } else {
                self.shared.remove(&block);
            }
        }
        debug_assert!(prepared.reclaimed <= self.reclaim.len(), "the reclaim queue shrank since planning");
        self.reclaim.drain(..prepared.reclaimed);
        self.reclaim.extend(prepared.new_reclaims);
        self.stats.user_bytes_written += prepared.user_bytes;
        self.stats.data_blocks_written += prepared.staged.len() as u64;
        self.stats.journal_bytes_written += record_len;
        let data_blocks = prepared.staged.len();
        self.give_blocks(prepared.staged.into_values().map(|staged| staged.buf));
        Ok(CommitInfo { seq, data_blocks, journal_bytes: record_len as usize, checkpointed: false })
    }

    /// Whether the journal or the dirty-page budget lacks room for `prepared`.
    fn needs_room(&self, prepared: &Prepared) -> bool {
        let record_len = prepared.record.padded_len(self.sector) as u64;
        let journal_capacity = self.geometry.journal.blocks * BLOCK_SIZE as u64;
        self.journal_used_bytes + record_len > journal_capacity
            || self.dirty_pages() + prepared.record.entries.len() > self.config.max_dirty_pages
    }

    pub(crate) fn dirty_pages(&self) -> usize {
        self.deferred.len()
            + self.pages.dirty_count()
            + self.slots.dirty_page_count()
            + self.claims.dirty_page_count()
            + self.alloc.dirty_page_count()
            + self.written.dirty_page_count()
    }

    fn preload_for(&mut self, record: &Record) -> Result<()> {
        let pages: Vec<u64> = record
            .entries
            .iter()
            .filter_map(|entry| match entry {
                Entry::DataWrite { block, .. } | Entry::Patch { block, .. } => Some(self.crc_location(*block).0),
                Entry::WriteSlot { slot, .. } => Some(self.slot_location(*slot).0),
                Entry::SetBits { .. } | Entry::Claim { .. } => None,
            })
            .collect();
        self.pages.load(self.io.as_mut(), &pages)
    }

    /// Applies a durable record to the in-memory metadata (marking pages
    /// dirty). Used after a commit and by journal replay; idempotent.
    pub(crate) fn apply_record(&mut self, record: &Record) -> Result<()> {
        for entry in &record.entries {
            match entry {
                Entry::SetBits { map, start, count, value } => {
                    let covered = match map {
                        BitmapKind::Slots => start.checked_add(*count).is_some_and(|end| end <= self.slots.len()),
                        BitmapKind::Alloc | BitmapKind::Written => self.alloc.covers(*start, *count),
                    };
                    if !covered {
                        return Err(StoreError::corrupt(format!(
                            "partition {}: journal entry sets {map:?} bits {start}+{count}, outside what the partition holds",
                            self.index
                        )));
                    }
                    match map {
                        BitmapKind::Slots => self.slots.set_range(*start, *count, *value),
                        BitmapKind::Alloc => self.alloc.set_range(*start, *count, *value),
                        BitmapKind::Written => self.written.set_range(*start, *count, *value),
                    }
                    if *map == BitmapKind::Alloc && !*value && !self.deferred.is_empty() {
                        // A freed block's deferred image must never be written
                        // back over whatever the block holds next.
                        let freed: Vec<u32> = self
                            .deferred
                            .range(*start as u32..=(*start + *count - 1) as u32)
                            .map(|(b, _)| *b)
                            .collect();
                        for block in freed {
                            let image = self.deferred.remove(&block).expect("listed");
                            self.give_blocks([image]);
                        }
                    }
                }
                Entry::Claim { chunk } => {
                    if *chunk as u64 >= self.region.chunks {
                        return Err(StoreError::corrupt(format!(
                            "partition {}: journal claims chunk {chunk} of {}",
                            self.index, self.region.chunks
                        )));
                    }
                    // After a commit the plan took it already; replay takes it here.
                    if !self.alloc.owns(*chunk) {
                        self.alloc.adopt(*chunk, None);
                        self.written.adopt(*chunk, None);
                    }
                    self.claims.set_range(*chunk as u64, 1, true);
                }
                Entry::DataWrite { block, new_crc, .. } => {
                    if !self.alloc.owns_block(*block as u64) {
                        return Err(StoreError::corrupt(format!(
                            "partition {}: journal names data block {block}",
                            self.index
                        )));
                    }
                    self.written.set_range(*block as u64, 1, true);
                    self.crc_set(*block, *new_crc)?;
                    // Written in place: the disk holds it (and it had no
                    // deferred image: such a block changes only by patches).
                    debug_assert!(
                        !self.deferred.contains_key(block),
                        "block {block} was written in place while deferred"
                    );
                }
                Entry::Patch { block, at, base_zero, new_crc, bytes } => {
                    if !self.alloc.owns_block(*block as u64) || *at as usize + bytes.len() > BLOCK_SIZE {
                        return Err(StoreError::corrupt(format!(
                            "partition {}: journal patches {} bytes at {at} of data block {block}",
                            self.index,
                            bytes.len()
                        )));
                    }
                    if *base_zero {
                        let zeros = self.take_block(true);
                        if let Some(old) = self.deferred.insert(*block, zeros) {
                            self.give_blocks([old]);
                        }
                    } else if !self.deferred.contains_key(block) {
                        // Replay: the block as the last checkpoint left it.
                        // Had a checkpoint that wrote it back been cut
                        // short, every byte it changed is in a later patch.
                        let mut base = self.take_block(false);
                        let offset = self.data_offset(*block);
                        self.io
                            .read_many(&mut [(offset, &mut base[..])])
                            .map_err(|e| StoreError::io("reading a deferred block's base", e))?;
                        self.deferred.insert(*block, base);
                    }
                    let image = self.deferred.get_mut(block).expect("present");
                    image[*at as usize..*at as usize + bytes.len()].copy_from_slice(bytes);
                    self.written.set_range(*block as u64, 1, true);
                    self.crc_set(*block, *new_crc)?;
                }
                Entry::WriteSlot { slot, image } => {
                    if *slot as u64 >= self.geometry.slot_count() {
                        return Err(StoreError::corrupt(format!(
                            "partition {}: journal names onode slot {slot}",
                            self.index
                        )));
                    }
                    let (page, at) = self.slot_location(*slot);
                    self.pages.load(self.io.as_mut(), &[page])?;
                    self.pages.get_mut(page)[at..at + image.len()].copy_from_slice(&image[..]);
                }
            }
        }
        Ok(())
    }

    /// Writes every dirty metadata page in place, flushes, then moves the
    /// journal's start past everything written so far (new header, flush).
    pub fn checkpoint(&mut self) -> Result<()> {
        self.check_usable()?;
        assert!(!self.unsynced, "a checkpoint while a commit's flush is out");
        if self.config.read_only {
            return Err(StoreError::ReadOnly);
        }
        let started = std::time::Instant::now();
        // Empty chunks go back to the pool: their claims bits clear in the
        // pages written below, and the pool gets them only once the new
        // header is durable (the journal then no longer claims them), so
        // no other partition can take one that a remount would give back here.
        let releasing = self.empty_chunks();
        for &chunk in &releasing {
            self.claims.set_range(chunk as u64, 1, false);
        }
        let mut writes: Vec<(u64, AlignedBuf)> = Vec::new();
        for bitmap in [&self.slots, &self.claims] {
            for page in bitmap.dirty_pages() {
                writes.push((
                    (bitmap.area().start + page) * BLOCK_SIZE as u64,
                    AlignedBuf::from_slice(&bitmap.page_bytes(page)),
                ));
            }
        }
        for bitmap in [&self.alloc, &self.written] {
            for (page, bytes) in bitmap.dirty_pages() {
                writes.push((page * BLOCK_SIZE as u64, AlignedBuf::from_slice(&bytes)));
            }
        }
        let deferred_bytes = (self.deferred.len() * BLOCK_SIZE) as u64;
        let requests: Vec<(u64, &[u8])> = writes
            .iter()
            .map(|(offset, buf)| (*offset, &buf[..]))
            .chain(self.pages.dirty_pages().into_iter().map(|(block, bytes)| (block * BLOCK_SIZE as u64, bytes)))
            .chain(self.deferred.iter().map(|(block, image)| (self.data_offset(*block), &image[..])))
            .collect();
        let metadata_bytes: u64 = requests.iter().map(|(_, b)| b.len() as u64).sum::<u64>() - deferred_bytes;
        let header = PartitionHeader {
            fsid: self.fsid,
            partition: self.index,
            header_seq: self.header_seq + 1,
            journal_start_seq: self.next_seq,
        };
        let header_buf = AlignedBuf::from_slice(&pad_to_block(&header.encode()));
        let header_offset = (self.geometry.headers.start + header.header_seq % 2) * BLOCK_SIZE as u64;
        let result = (if requests.is_empty() { Ok(()) } else { self.io.write_many(&requests) })
            .and_then(|()| self.io.flush())
            .and_then(|()| self.io.write_many(&[(header_offset, &header_buf[..])]))
            .and_then(|()| self.io.flush());
        drop(requests);
        if let Err(err) = result {
            self.failed = true;
            for &chunk in &releasing {
                self.claims.set_range(chunk as u64, 1, true);
            }
            tracing::error!(partition = self.index, error = %err, "device error during checkpoint; partition stopped");
            return Err(StoreError::io(format!("checkpointing partition {}", self.index), err));
        }
        self.header_seq = header.header_seq;
        self.journal_used_bytes = 0;
        // The journal is empty: mount recovers no last record.
        self.last_record_fresh.clear();
        self.slots.mark_clean();
        self.claims.mark_clean();
        self.alloc.mark_clean();
        self.written.mark_clean();
        self.pages.mark_clean();
        for &chunk in &releasing {
            self.release_chunk(chunk);
        }
        self.pages.trim();
        let written_back = std::mem::take(&mut self.deferred);
        self.give_blocks(written_back.into_values());
        self.stats.deferred_bytes_written += deferred_bytes;
        self.stats.checkpoints += 1;
        self.stats.checkpoint_ns += started.elapsed().as_nanos() as u64;
        self.stats.metadata_bytes_written += metadata_bytes + BLOCK_SIZE as u64;
        assert_eq!(self.dirty_pages(), 0, "a checkpoint leaves no dirty metadata");
        Ok(())
    }

    /// Owned chunks with no block allocated (and so none written, deferred
    /// or waiting for recovery): what a checkpoint gives back.
    fn empty_chunks(&self) -> Vec<u32> {
        self.alloc
            .owned_chunks()
            .iter()
            .copied()
            .filter(|&chunk| self.alloc.chunk_ones(chunk) == 0 && self.written.chunk_ones(chunk) == 0)
            .collect()
    }

    /// Gives a chunk whose release is durable back to the pool.
    fn release_chunk(&mut self, chunk: u32) {
        debug_assert!(!self.claims.get(chunk as u64), "chunk {chunk} released while claimed on disk");
        debug_assert!(
            self.reclaim.iter().all(|r| r.runs.iter().all(|&(start, count)| {
                let (first, len) = (self.region.first_block(chunk), self.region.chunk_len(chunk));
                start as u64 + count as u64 <= first || start as u64 >= first + len
            })),
            "chunk {chunk} released with blocks a reclaim still frees"
        );
        self.alloc.release(chunk);
        self.written.release(chunk);
        // Its crc pages are the next owner's now: drop this cache's copies.
        let first_crc = self.region.crc_location(self.region.first_block(chunk)).0;
        let last_crc = self.region.crc_location(self.region.first_block(chunk) + self.region.chunk_len(chunk) - 1).0;
        self.pages.forget(first_crc..=last_crc);
        if self.alloc_hint >= self.region.first_block(chunk)
            && self.alloc_hint < self.region.first_block(chunk) + self.region.chunk_len(chunk)
        {
            self.alloc_hint = 0;
        }
        if !self.config.read_only {
            self.pool.give(chunk);
        }
    }

    /// Checkpoints (so the next mount replays nothing) and releases the partition.
    pub fn close(mut self) -> Result<()> {
        if self.failed || self.config.read_only {
            return Ok(());
        }
        self.checkpoint()
    }
}

/// A batch [`Partition::apply_unsynced`] applied, waiting for its flush.
#[must_use = "hand the flush's result to Partition::synced"]
#[derive(Debug)]
pub struct Unsynced {
    info: CommitInfo,
}

pub(crate) fn pad_to_block(bytes: &[u8]) -> Vec<u8> {
    let mut block = vec![0u8; BLOCK_SIZE];
    block[..bytes.len()].copy_from_slice(bytes);
    block
}
