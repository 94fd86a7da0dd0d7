//! Mounting a partition: headers, bitmaps, journal replay, recovery of the
//! last record's data blocks, and the index rebuild from the onode area.

use std::collections::BTreeMap;

use super::{IndexEntry, Partition, PartitionConfig, PartitionStats, Reclaim};
use crate::bitmap::Bitmap;
use crate::blockio::{AlignedBuf, BlockIo};
use crate::chunks::{ChunkPool, ChunkedBitmap};
use crate::error::{Result, StoreError};
use crate::journal::{BitmapKind, Entry, Record};
use crate::key::Key;
use crate::layout::{Area, DataRegion, PartitionGeometry, PartitionHeader};
use crate::onode::{decode_slot, ObjectMeta, HEAD_FLAG_DELETED, KIND_HEAD, NO_SLOT, OBJECT_FLAG_SHARES};
use crate::pages::PageCache;
use crate::{BLOCK_SIZE, SLOTS_PER_PAGE};

/// Largest single read at mount.
const MOUNT_READ_BYTES: usize = 1 << 20;

fn read_area(io: &mut dyn BlockIo, area: Area, what: &str) -> Result<Vec<u8>> {
    let total = (area.blocks * BLOCK_SIZE as u64) as usize;
    let mut out = Vec::with_capacity(total);
    let mut offset = 0usize;
    while offset < total {
        let len = (total - offset).min(MOUNT_READ_BYTES);
        let mut buf = AlignedBuf::zeroed(len);
        io.read_many(&mut [(area.byte_offset() + offset as u64, &mut buf[..])])
            .map_err(|e| StoreError::io(format!("reading the {what}"), e))?;
        out.extend_from_slice(&buf);
        offset += len;
    }
    Ok(out)
}

pub(crate) struct MountParams {
    pub index: u32,
    pub partition_count: u32,
    pub fsid: [u8; 16],
    pub geometry: PartitionGeometry,
    pub region: DataRegion,
    pub pool: std::sync::Arc<ChunkPool>,
    pub sector: u32,
    pub config: PartitionConfig,
}

/// Chunk bitmap pages read per batch at mount.
const MOUNT_CHUNK_BATCH: usize = 128;

/// The allocation and written bitmaps of the chunks `claims` names, from
/// their pages.
fn load_chunk_bitmaps(
    io: &mut dyn BlockIo,
    region: DataRegion,
    claims: &Bitmap,
) -> Result<(ChunkedBitmap, ChunkedBitmap)> {
    let mut alloc = ChunkedBitmap::new(region, 0);
    let mut written = ChunkedBitmap::new(region, 1);
    let owned: Vec<u32> = claims.ones().map(|chunk| chunk as u32).collect();
    for batch in owned.chunks(MOUNT_CHUNK_BATCH) {
        let mut bufs: Vec<AlignedBuf> = (0..batch.len() * 2).map(|_| AlignedBuf::zeroed(BLOCK_SIZE)).collect();
        {
            let mut requests: Vec<(u64, &mut [u8])> = bufs
                .iter_mut()
                .enumerate()
                .map(|(i, buf)| (region.bitmap_page(batch[i / 2], (i % 2) as u64) * BLOCK_SIZE as u64, &mut buf[..]))
                .collect();
            io.read_many(&mut requests).map_err(|e| StoreError::io("reading the chunks' bitmaps", e))?;
        }
        for (i, &chunk) in batch.iter().enumerate() {
            alloc.adopt(chunk, Some(&bufs[2 * i]));
            written.adopt(chunk, Some(&bufs[2 * i + 1]));
        }
    }
    debug_assert_eq!(alloc.owned_chunks().len() as u64, claims.count_ones());
    Ok((alloc, written))
}

impl Partition {
    pub(crate) fn mount(mut io: Box<dyn BlockIo>, params: MountParams) -> Result<Partition> {
        let MountParams { index, partition_count, fsid, geometry, region, pool, sector, config } = params;
        let headers = read_area(io.as_mut(), geometry.headers, "partition headers")?;
        let header = [0usize, BLOCK_SIZE]
            .iter()
            .filter_map(|&at| PartitionHeader::decode(&headers[at..at + 512], &fsid, index))
            .max_by_key(|h| h.header_seq)
            .ok_or_else(|| StoreError::corrupt(format!("partition {index}: neither partition header is valid")))?;
        let g = geometry;
        let slots =
            Bitmap::from_bytes(g.slot_count(), g.slot_bitmap, &read_area(io.as_mut(), g.slot_bitmap, "slot bitmap")?);
        let claims = Bitmap::from_bytes(region.chunks, g.claims, &read_area(io.as_mut(), g.claims, "claims bitmap")?);
        let (alloc, written) = load_chunk_bitmaps(io.as_mut(), region, &claims)?;
        let mut partition = Partition {
            index,
            partition_count,
            fsid,
            geometry,
            sector,
            io,
            objects: BTreeMap::new(),
            slots,
            region,
            alloc,
            written,
            claims,
            pool,
            pages: PageCache::new(config.cache_pages),
            header_seq: header.header_seq,
            next_seq: header.journal_start_seq,
            journal_used_bytes: 0,
            reclaim: Vec::new(),
            shared: BTreeMap::new(),
            alloc_hint: 0,
            slot_hint: 0,
            failed: false,
            unsynced: false,
            flushes_by_handle: 0,
            config,
            stats: PartitionStats::default(),
            mount_issues: Vec::new(),
            spare_blocks: Vec::new(),
            last_record_fresh: std::collections::HashSet::new(),
            deferred: BTreeMap::new(),
        };
        let replayed = partition.replay_journal()?;
        partition.rebuild_index()?;
        if replayed > 0 && !config.read_only {
            partition.checkpoint()?;
        }
        tracing::debug!(partition = index, replayed, objects = partition.objects.len(), "partition mounted");
        Ok(partition)
    }

    /// Replays the journal's valid records in order; returns how many.
    fn replay_journal(&mut self) -> Result<u64> {
        let journal = read_area(self.io.as_mut(), self.geometry.journal, "journal")?;
        let mut position = 0usize;
        let mut last: Option<Record> = None;
        let mut count = 0;
        while position < journal.len() {
            let Some((record, len)) =
                Record::decode(&journal[position..], &self.fsid, self.index, self.next_seq, self.sector)
            else {
                break;
            };
            self.adopt_chunks_touched_by(&record)?;
            self.apply_record(&record)?;
            self.next_seq += 1;
            position += len;
            count += 1;
            last = Some(record);
        }
        // Decoded records end inside the journal and are padded to sectors.
        assert!(position <= journal.len() && position.is_multiple_of(self.sector as usize), "journal end {position}");
        self.journal_used_bytes = position as u64;
        if let Some(record) = last {
            self.recover_last_record(&record)?;
        }
        self.check_deferred()?;
        Ok(count)
    }

    /// Replay: takes every chunk `record` touches that the claims page does
    /// not name. The journal since the last completed checkpoint is the
    /// truth for them: a checkpoint that gave a chunk back clears its claims
    /// bit in the pages it writes before its new header, and a crash between
    /// the two leaves the page saying "not ours" under records that use the
    /// chunk. No other partition can have it (the pool gets a chunk only
    /// after the header is durable), and it ended empty (that is why it was
    /// given back), so its bits start clear and the records set the rest.
    fn adopt_chunks_touched_by(&mut self, record: &Record) -> Result<()> {
        for entry in &record.entries {
            let (start, count) = match entry {
                Entry::SetBits { map: BitmapKind::Alloc | BitmapKind::Written, start, count, .. } => (*start, *count),
                Entry::DataWrite { block, .. } | Entry::Patch { block, .. } => (*block as u64, 1),
                Entry::SetBits { map: BitmapKind::Slots, .. } | Entry::WriteSlot { .. } | Entry::Claim { .. } => {
                    continue
                }
            };
            if count == 0 || start.checked_add(count).is_none_or(|end| end > self.region.data_blocks) {
                return Err(StoreError::corrupt(format!(
                    "partition {}: journal names data blocks {start}+{count} of {}",
                    self.index, self.region.data_blocks
                )));
            }
            for chunk in self.region.chunk_of(start)..=self.region.chunk_of(start + count - 1) {
                if !self.alloc.owns(chunk) {
                    self.alloc.adopt(chunk, None);
                    self.written.adopt(chunk, None);
                    self.claims.set_range(chunk as u64, 1, true);
                }
            }
        }
        Ok(())
    }

    /// Every block rebuilt from journal patches must match its crc32c. One
    /// that does not had its base damaged on disk: it is dropped, so that it
    /// reads from the disk and fails its checksum, as any damaged block does.
    fn check_deferred(&mut self) -> Result<()> {
        let blocks: Vec<u32> = self.deferred.keys().copied().collect();
        for block in blocks {
            let expected = self.crc_get(block)?;
            let computed = crate::crc32c(&self.deferred[&block]);
            if computed != expected {
                tracing::warn!(
                    partition = self.index,
                    block,
                    "a block rebuilt from the journal fails its checksum (its base on disk is damaged); it reads as a checksum error until rewritten"
                );
                let image = self.deferred.remove(&block).expect("listed");
                self.give_blocks([image]);
            }
        }
        Ok(())
    }

    /// The last record's flush may not have completed before the crash, so
    /// each of its data blocks may hold old or new contents. Keep whichever
    /// crc32c matches: new data keeps the new crc; old data gets its old crc
    /// back (or reads as zeros again if it never held data). Old data of a
    /// block the batch grew past has its never-visible tail zeroed (written
    /// back, except on a read-only mount, which only keeps the old crc).
    /// A block that matches neither (torn by a power loss) keeps the new crc
    /// and reads as a checksum error until rewritten; fsck reports it.
    /// (Copies on write never need recovering: `commit` makes them durable
    /// before their record, since the block they copy may change or be
    /// freed by the same batch.)
    fn recover_last_record(&mut self, record: &Record) -> Result<()> {
        let writes: Vec<(u32, bool, u32, u32, u16)> = record
            .entries
            .iter()
            .filter_map(|e| match e {
                Entry::DataWrite { block, was_written, old_crc, new_crc, zero_from } => {
                    Some((*block, *was_written, *old_crc, *new_crc, *zero_from))
                }
                _ => None,
            })
            .collect();
        if writes.is_empty() {
            return Ok(());
        }
        let mut bufs: Vec<AlignedBuf> = writes.iter().map(|_| AlignedBuf::zeroed(BLOCK_SIZE)).collect();
        {
            let mut requests: Vec<(u64, &mut [u8])> = writes
                .iter()
                .zip(bufs.iter_mut())
                .map(|((block, ..), buf)| (self.data_offset(*block), &mut buf[..]))
                .collect();
            self.io
                .read_many(&mut requests)
                .map_err(|e| StoreError::io("reading the last journaled batch's blocks", e))?;
        }
        let mut rewrites: Vec<(u64, AlignedBuf)> = Vec::new();
        for ((block, was_written, old_crc, new_crc, zero_from), mut buf) in writes.into_iter().zip(bufs) {
            let actual = crate::crc32c(&buf);
            if actual == new_crc {
                continue;
            }
            if was_written && actual == old_crc {
                if zero_from > 0 && (zero_from as usize) < BLOCK_SIZE && !self.config.read_only {
                    buf[zero_from as usize..].fill(0);
                    self.crc_set(block, crate::crc32c(&buf))?;
                    rewrites.push((self.data_offset(block), buf));
                } else {
                    self.crc_set(block, old_crc)?;
                }
            } else if !was_written {
                self.written.set_range(block as u64, 1, false);
            } else {
                tracing::warn!(
                    partition = self.index,
                    block,
                    "block of the interrupted batch is torn; it reads as a checksum error until rewritten"
                );
            }
        }
        if !rewrites.is_empty() {
            let requests: Vec<(u64, &[u8])> = rewrites.iter().map(|(offset, buf)| (*offset, &buf[..])).collect();
            // The checkpoint that follows mount flushes these before the journal is emptied.
            self.io.write_many(&requests).map_err(|e| StoreError::io("zeroing the tail of a recovered block", e))?;
        }
        Ok(())
    }

    /// The references of blocks shared between objects: those of objects
    /// flagged as sharing (live ones and deleted ones awaiting reclaim) are
    /// counted, and a block referenced more than once is shared. Objects
    /// never cloned are not looked at: a store without clones pays nothing.
    fn count_shared_blocks(&mut self, sharing_tombstones: &[Vec<(u32, u32)>]) {
        let mut references: BTreeMap<u32, u32> = BTreeMap::new();
        let live = self
            .objects
            .values()
            .filter(|entry| entry.flags & OBJECT_FLAG_SHARES != 0)
            .flat_map(|entry| entry.extents.to_vec().into_iter().map(|e| (e.physical, e.len)));
        for (start, count) in live.chain(sharing_tombstones.iter().flatten().copied()) {
            for block in start..start + count {
                *references.entry(block).or_default() += 1;
            }
        }
        self.shared = references.into_iter().filter(|(_, n)| *n > 1).map(|(block, n)| (block, n - 1)).collect();
    }

    /// Whether every block `meta` maps lies in a chunk this partition holds.
    /// One that does not is corrupt (a chunk is one partition's at a time):
    /// it is left out of the index, so nothing writes another's chunk.
    fn maps_owned_chunks(&self, meta: &ObjectMeta) -> bool {
        meta.extents.iter().all(|e| self.alloc.covers(e.physical as u64, e.len as u64))
    }

    /// Reads every in-use onode slot and rebuilds the ordered index; deleted
    /// objects go to the reclaim queue, unreadable chains to `mount_issues`.
    fn rebuild_index(&mut self) -> Result<()> {
        let mut entries: Vec<(Key, IndexEntry)> = Vec::new();
        // Runs of deleted objects that shared blocks: their references count until reclaimed.
        let mut sharing_tombstones: Vec<Vec<(u32, u32)>> = Vec::new();
        // Heads of onodes longer than one slot, read through the page cache after the scan.
        let mut heads: Vec<u32> = Vec::new();
        let pages_per_window = (MOUNT_READ_BYTES / BLOCK_SIZE) as u64;
        let used: Vec<u64> = self.slots.ones().collect();
        let mut cursor = 0usize;
        while cursor < used.len() {
            let window_start = used[cursor] / SLOTS_PER_PAGE as u64 / pages_per_window * pages_per_window;
            assert!(window_start < self.geometry.onodes.blocks, "in-use slot {} past the onode area", used[cursor]);
            let window_pages = pages_per_window.min(self.geometry.onodes.blocks - window_start);
            let area = Area { start: self.geometry.onodes.start + window_start, blocks: window_pages };
            let bytes = read_area(self.io.as_mut(), area, "onode area")?;
            let window_end_slot = (window_start + window_pages) * SLOTS_PER_PAGE as u64;
            while cursor < used.len() && used[cursor] < window_end_slot {
                let slot = used[cursor] as u32;
                cursor += 1;
                let (page, at) = self.slot_location(slot);
                assert!(page >= area.start && page < area.end(), "slot {slot} outside the window read");
                // Pages changed by replay are newer in the cache than on disk.
                let image = if self.pages.is_cached(page) {
                    self.pages.get(page)[at..at + crate::SLOT_SIZE].to_vec()
                } else {
                    let local = ((page - area.start) as usize) * BLOCK_SIZE + at;
                    bytes[local..local + crate::SLOT_SIZE].to_vec()
                };
                match decode_slot(&image) {
                    // The common case, a one-slot onode, is decoded right here.
                    Ok((header, fragment))
                        if header.kind == KIND_HEAD
                            && header.next == NO_SLOT
                            && header.head == slot
                            && header.index == 0
                            && header.blob_len as usize == fragment.len() =>
                    {
                        match ObjectMeta::decode(fragment, self.region.data_blocks) {
                            Ok(meta) if !self.maps_owned_chunks(&meta) => self.mount_issues.push(format!(
                                "onode at slot {slot} ({:?}) maps data blocks outside this partition's chunks",
                                meta.key
                            )),
                            Ok(meta) if header.flags & HEAD_FLAG_DELETED != 0 => {
                                let runs: Vec<(u32, u32)> = meta.extents.iter().map(|e| (e.physical, e.len)).collect();
                                if meta.flags & OBJECT_FLAG_SHARES != 0 {
                                    sharing_tombstones.push(runs.clone());
                                }
                                self.reclaim.push(Reclaim { runs, slots: vec![slot] });
                            }
                            Ok(meta) => entries.push((meta.key.clone(), IndexEntry::from_meta(slot, &meta))),
                            Err(err) => self.mount_issues.push(format!("onode at slot {slot}: {err}")),
                        }
                    }
                    Ok((header, _)) if header.kind == KIND_HEAD => heads.push(slot),
                    Ok(_) => {}
                    Err(err) => self.mount_issues.push(format!("onode slot {slot}: {err}")),
                }
            }
        }
        for head in heads {
            match self.read_chain(head) {
                Ok((_, _, meta)) if !self.maps_owned_chunks(&meta) => self.mount_issues.push(format!(
                    "onode at slot {head} ({:?}) maps data blocks outside this partition's chunks",
                    meta.key
                )),
                Ok((chain, true, meta)) => {
                    let runs: Vec<(u32, u32)> = meta.extents.iter().map(|e| (e.physical, e.len)).collect();
                    if meta.flags & OBJECT_FLAG_SHARES != 0 {
                        sharing_tombstones.push(runs.clone());
                    }
                    self.reclaim.push(Reclaim { runs, slots: chain });
                }
                Ok((_, false, meta)) => entries.push((meta.key.clone(), IndexEntry::from_meta(head, &meta))),
                Err(err) => self.mount_issues.push(err.to_string()),
            }
            self.pages.trim();
        }
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        for pair in entries.windows(2) {
            if pair[0].0 == pair[1].0 {
                self.mount_issues.push(format!(
                    "key {:?} has two live onodes (slots {} and {})",
                    pair[0].0, pair[0].1.head_slot, pair[1].1.head_slot
                ));
            }
        }
        entries.dedup_by(|later, earlier| later.0 == earlier.0);
        // Built from sorted input, the map's nodes are packed full.
        self.objects = entries.into_iter().collect();
        self.count_shared_blocks(&sharing_tombstones);
        // Decoded extents are never empty: every reclaim frees real runs.
        assert!(self.reclaim.iter().all(|r| r.runs.iter().all(|(_, count)| *count > 0)));
        for issue in &self.mount_issues {
            tracing::warn!(partition = self.index, issue, "onode problem found at mount; run fsck");
        }
        Ok(())
    }
}
