//! Data chunks: the pool of free ones, shared by a store's partitions, and
//! the bitmaps of the chunks one partition owns (layout.rs: why chunks).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::bitmap::Bitmap;
use crate::layout::{Area, DataRegion};

/// The chunks no partition owns. The one lock partitions share, taken only
/// when a chunk changes hands (a claim, a release), never per write.
#[derive(Debug)]
pub(crate) struct ChunkPool {
    region: DataRegion,
    free: Mutex<BTreeSet<u32>>,
    /// Data blocks in the free chunks, readable without the lock.
    free_blocks: AtomicU64,
}

impl ChunkPool {
    /// A pool holding no chunk yet ([`ChunkPool::fill`] after mount).
    pub fn new(region: DataRegion) -> ChunkPool {
        ChunkPool { region, free: Mutex::new(BTreeSet::new()), free_blocks: AtomicU64::new(0) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeSet<u32>> {
        // Nothing panics while holding it, but a poisoned set is still a set.
        self.free.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Makes every chunk not in `owned` free.
    pub fn fill(&self, owned: &BTreeSet<u32>) {
        let mut free = self.lock();
        free.clear();
        let mut blocks = 0;
        for chunk in 0..self.region.chunks as u32 {
            if !owned.contains(&chunk) {
                free.insert(chunk);
                blocks += self.region.chunk_len(chunk);
            }
        }
        self.free_blocks.store(blocks, Ordering::Relaxed);
    }

    /// Takes the lowest free chunk (partitions then fill the device from its start).
    pub fn take(&self) -> Option<u32> {
        let mut free = self.lock();
        let chunk = free.pop_first()?;
        self.free_blocks.fetch_sub(self.region.chunk_len(chunk), Ordering::Relaxed);
        Some(chunk)
    }

    /// Returns a chunk its owner no longer holds (durably: see `checkpoint`).
    pub fn give(&self, chunk: u32) {
        let inserted = self.lock().insert(chunk);
        assert!(inserted, "chunk {chunk} returned to the pool twice");
        self.free_blocks.fetch_add(self.region.chunk_len(chunk), Ordering::Relaxed);
    }

    pub fn free_blocks(&self) -> u64 {
        self.free_blocks.load(Ordering::Relaxed)
    }

    pub fn free_chunks(&self) -> usize {
        self.lock().len()
    }
}

/// A bitmap over the store's data blocks of which a partition holds only the
/// chunks it owns; each chunk's bits live in that chunk's own page
/// (`which`: 0 the allocation page, 1 the written page). A block of a chunk
/// not owned reads as clear and is never found free.
#[derive(Clone, Debug)]
pub(crate) struct ChunkedBitmap {
    region: DataRegion,
    which: u64,
    chunks: Vec<Option<Bitmap>>,
    /// The owned chunks, sorted: what searches walk.
    owned: Vec<u32>,
    owned_blocks: u64,
    ones: u64,
    /// Chunks whose page changed since [`ChunkedBitmap::mark_clean`]: kept
    /// so that the per-batch room check never walks every owned chunk.
    dirty: BTreeSet<u32>,
}

impl ChunkedBitmap {
    pub fn new(region: DataRegion, which: u64) -> ChunkedBitmap {
        ChunkedBitmap {
            region,
            which,
            chunks: vec![None; region.chunks as usize],
            owned: Vec::new(),
            owned_blocks: 0,
            ones: 0,
            dirty: BTreeSet::new(),
        }
    }

    /// Takes `chunk` with its bits from `page` (its on-disk page) or all clear.
    pub fn adopt(&mut self, chunk: u32, page: Option<&[u8]>) {
        let slot = &mut self.chunks[chunk as usize];
        assert!(slot.is_none(), "chunk {chunk} adopted twice");
        let len = self.region.chunk_len(chunk);
        let area = Area { start: self.region.bitmap_page(chunk, self.which), blocks: 1 };
        let zeros;
        let bytes = match page {
            Some(bytes) => bytes,
            None => {
                zeros = vec![0u8; crate::BLOCK_SIZE];
                &zeros
            }
        };
        let bitmap = Bitmap::from_bytes(len, area, bytes);
        self.ones += bitmap.count_ones();
        self.owned_blocks += len;
        *slot = Some(bitmap);
        let at = self.owned.partition_point(|c| *c < chunk);
        self.owned.insert(at, chunk);
    }

    /// Gives `chunk` up; it must have no set bit and no page waiting for write-back.
    pub fn release(&mut self, chunk: u32) {
        let bitmap = self.chunks[chunk as usize].take().unwrap_or_else(|| panic!("chunk {chunk} released unowned"));
        assert_eq!(bitmap.count_ones(), 0, "chunk {chunk} released with bits set");
        assert_eq!(bitmap.dirty_page_count(), 0, "chunk {chunk} released before its page was written");
        debug_assert!(!self.dirty.contains(&chunk), "a clean chunk is listed dirty");
        self.owned_blocks -= bitmap.len();
        let at = self.owned.binary_search(&chunk).expect("owned chunks are listed");
        self.owned.remove(at);
    }

    pub fn owns(&self, chunk: u32) -> bool {
        self.chunks.get(chunk as usize).is_some_and(Option::is_some)
    }

    pub fn owns_block(&self, block: u64) -> bool {
        block < self.region.data_blocks && self.owns(self.region.chunk_of(block))
    }

    /// Whether every block of `start..start+count` is in an owned chunk.
    pub fn covers(&self, start: u64, count: u64) -> bool {
        let Some(end) = start.checked_add(count) else { return false };
        if count == 0 || end > self.region.data_blocks {
            return count == 0 && start <= self.region.data_blocks;
        }
        (self.region.chunk_of(start)..=self.region.chunk_of(end - 1)).all(|chunk| self.owns(chunk))
    }

    pub fn owned_chunks(&self) -> &[u32] {
        &self.owned
    }

    /// Set bits in `chunk` (0 if not owned).
    pub fn chunk_ones(&self, chunk: u32) -> u64 {
        self.chunks[chunk as usize].as_ref().map_or(0, Bitmap::count_ones)
    }

    /// Data blocks in the owned chunks.
    pub fn len(&self) -> u64 {
        self.owned_blocks
    }

    pub fn count_ones(&self) -> u64 {
        self.ones
    }

    fn locate(&self, bit: u64) -> Option<(&Bitmap, u64)> {
        if bit >= self.region.data_blocks {
            return None;
        }
        let chunk = self.region.chunk_of(bit);
        let bitmap = self.chunks[chunk as usize].as_ref()?;
        Some((bitmap, bit - self.region.first_block(chunk)))
    }

    pub fn get(&self, bit: u64) -> bool {
        self.locate(bit).is_some_and(|(bitmap, at)| bitmap.get(at))
    }

    fn set(&mut self, start: u64, count: u64, value: bool, quiet: bool) {
        assert!(self.covers(start, count), "bits {start}+{count} are not all in owned chunks");
        let mut bit = start;
        let end = start + count;
        while bit < end {
            let chunk = self.region.chunk_of(bit);
            let first = self.region.first_block(chunk);
            let span = (first + self.region.chunk_len(chunk)).min(end) - bit;
            let bitmap = self.chunks[chunk as usize].as_mut().expect("covered");
            let before = bitmap.count_ones();
            if quiet {
                bitmap.set_range_quiet(bit - first, span, value);
            } else {
                bitmap.set_range(bit - first, span, value);
                self.dirty.insert(chunk);
            }
            self.ones = self.ones + bitmap.count_ones() - before;
            bit += span;
        }
        debug_assert!(self.ones <= self.owned_blocks);
    }

    /// Sets bits (all in owned chunks); marks their pages dirty.
    pub fn set_range(&mut self, start: u64, count: u64, value: bool) {
        self.set(start, count, value, false);
    }

    /// Sets bits without marking pages dirty (see [`Bitmap::set_range_quiet`]).
    pub fn set_range_quiet(&mut self, start: u64, count: u64, value: bool) {
        self.set(start, count, value, true);
    }

    /// The owned chunks in search order: the one holding `from` first, then
    /// those after it, wrapping around.
    fn search_order(&self, from: u64) -> impl Iterator<Item = u32> + '_ {
        let from_chunk = if from < self.region.data_blocks { self.region.chunk_of(from) } else { 0 };
        let at = self.owned.partition_point(|c| *c < from_chunk);
        self.owned[at..].iter().chain(&self.owned[..at]).copied()
    }

    /// A clear bit in an owned chunk, at or after `from` first.
    pub fn find_clear(&self, from: u64) -> Option<u64> {
        self.find_clear_run(from, 1)
    }

    /// Start of `count` clear bits inside one owned chunk (runs never span
    /// chunks: their data blocks are not adjacent on the device).
    pub fn find_clear_run(&self, from: u64, count: u64) -> Option<u64> {
        if count == 0 || count > self.owned_blocks - self.ones {
            return None;
        }
        for chunk in self.search_order(from) {
            let bitmap = self.chunks[chunk as usize].as_ref().expect("listed as owned");
            let first = self.region.first_block(chunk);
            let local_from = from.saturating_sub(first).min(bitmap.len());
            if let Some(at) = bitmap.find_clear_run(local_from, count) {
                return Some(first + at);
            }
        }
        None
    }

    /// The set bits, in order.
    pub fn ones(&self) -> impl Iterator<Item = u64> + '_ {
        self.owned.iter().flat_map(move |&chunk| {
            let first = self.region.first_block(chunk);
            self.chunks[chunk as usize].as_ref().expect("listed as owned").ones().map(move |bit| first + bit)
        })
    }

    /// Device block and image of every page changed since [`ChunkedBitmap::mark_clean`].
    pub fn dirty_pages(&self) -> Vec<(u64, Vec<u8>)> {
        self.dirty
            .iter()
            .map(|&chunk| self.chunks[chunk as usize].as_ref().expect("a dirty chunk is owned"))
            .map(|bitmap| (bitmap.area().start, bitmap.page_bytes(0)))
            .collect()
    }

    pub fn dirty_page_count(&self) -> usize {
        debug_assert!(self
            .dirty
            .iter()
            .all(|&c| self.chunks[c as usize].as_ref().is_some_and(|b| b.dirty_page_count() == 1)));
        self.dirty.len()
    }

    pub fn mark_clean(&mut self) {
        for chunk in std::mem::take(&mut self.dirty) {
            self.chunks[chunk as usize].as_mut().expect("a dirty chunk is owned").mark_clean();
        }
    }

    pub fn heap_bytes(&self) -> usize {
        self.chunks.capacity() * std::mem::size_of::<Option<Bitmap>>()
            + self.chunks.iter().flatten().map(Bitmap::heap_bytes).sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn region() -> DataRegion {
        // Three chunks of 2048 blocks and a last one of 100.
        DataRegion { start: 10, chunk_blocks: 2048, chunks: 4, data_blocks: 3 * 2048 + 100 }
    }

    #[test]
    fn only_owned_chunks_are_searched_and_runs_stay_in_one_chunk() {
        let mut bits = ChunkedBitmap::new(region(), 0);
        assert_eq!(bits.find_clear(0), None, "nothing owned, nothing free");
        bits.adopt(2, None);
        bits.adopt(3, None);
        assert_eq!(bits.len(), 2148);
        assert_eq!(bits.find_clear(0), Some(2 * 2048));
        assert_eq!(bits.find_clear(3 * 2048 + 5), Some(3 * 2048 + 5));
        // Fill chunk 2 but its last 10 blocks: a run of 20 is found in chunk 3.
        bits.set_range(2 * 2048, 2038, true);
        assert_eq!(bits.find_clear_run(2 * 2048, 20), Some(3 * 2048));
        assert_eq!(bits.find_clear_run(2 * 2048, 10), Some(2 * 2048 + 2038));
        assert_eq!(bits.find_clear_run(0, 101), None, "no run spans two chunks");
        assert!(!bits.get(5), "a block of an unowned chunk reads clear");
        assert!(bits.covers(2 * 2048, 2148) && !bits.covers(2047, 2));
        assert_eq!(bits.dirty_pages().len(), 1);
        assert_eq!(bits.dirty_pages()[0].0, region().bitmap_page(2, 0));
        bits.set_range(2 * 2048, 2038, false);
        bits.mark_clean();
        bits.release(2);
        assert_eq!(bits.owned_chunks(), &[3]);
        assert_eq!(bits.len(), 100);
    }

    #[test]
    fn the_pool_hands_out_each_chunk_once() {
        let pool = ChunkPool::new(region());
        pool.fill(&[1].into_iter().collect());
        assert_eq!(pool.free_blocks(), 2 * 2048 + 100);
        assert_eq!(pool.take(), Some(0));
        assert_eq!(pool.take(), Some(2));
        assert_eq!(pool.take(), Some(3));
        assert_eq!(pool.take(), None);
        assert_eq!(pool.free_blocks(), 0);
        pool.give(2);
        assert_eq!(pool.free_blocks(), 2048);
        assert_eq!(pool.take(), Some(2));
    }

    proptest! {
        #[test]
        fn matches_a_model(owned in proptest::collection::btree_set(0u32..4, 0..4),
                           ops in proptest::collection::vec((0u64..6244, 1u64..300, any::<bool>()), 0..30),
                           from in 0u64..6244, want in 1u64..200) {
            let region = region();
            let mut bits = ChunkedBitmap::new(region, 1);
            for &chunk in &owned { bits.adopt(chunk, None); }
            let mut model = vec![false; region.data_blocks as usize];
            for (start, count, value) in ops {
                let count = count.min(region.data_blocks - start);
                if bits.covers(start, count) {
                    bits.set_range(start, count, value);
                    for b in &mut model[start as usize..(start + count) as usize] { *b = value; }
                }
            }
            prop_assert_eq!(bits.count_ones(), model.iter().filter(|b| **b).count() as u64);
            for (i, bit) in model.iter().enumerate() { prop_assert_eq!(bits.get(i as u64), *bit); }
            let ones: Vec<u64> = bits.ones().collect();
            let model_ones: Vec<u64> = model.iter().enumerate().filter(|(_, b)| **b).map(|(i, _)| i as u64).collect();
            prop_assert_eq!(ones, model_ones);
            let in_owned_chunk = |start: u64, len: u64| {
                let chunk = region.chunk_of(start);
                owned.contains(&chunk) && region.chunk_of(start + len - 1) == chunk
            };
            match bits.find_clear_run(from, want) {
                Some(start) => {
                    prop_assert!(in_owned_chunk(start, want));
                    prop_assert!(model[start as usize..(start + want) as usize].iter().all(|b| !b));
                }
                None => {
                    let exists = (0..region.data_blocks.saturating_sub(want - 1)).any(|s| {
                        in_owned_chunk(s, want) && model[s as usize..(s + want) as usize].iter().all(|b| !b)
                    });
                    prop_assert!(!exists, "a run of {} exists but was not found", want);
                }
            }
        }
    }
}
