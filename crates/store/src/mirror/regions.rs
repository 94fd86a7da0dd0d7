//! Which regions of the mirror may differ between its devices: the bits
//! in memory, the bits on disk, and what a clean may clear. Pure
//! bookkeeping, under the mirror's state lock; the I/O is the caller's.
//!
//! The rules (`mirror/mod.rs` says why they keep the devices' contents
//! recoverable):
//! - a region's bit is durable before any write to it goes out;
//! - a clean, once the read device is flushed, clears the bits of regions
//!   no write touched (began or ended) since the clean before it. A region
//!   written in every interval keeps its bit: no bitmap write, no flush.

use crate::BLOCK_SIZE;

const BITS_PER_PAGE: u64 = BLOCK_SIZE as u64 * 8;
const WORDS_PER_PAGE: usize = BLOCK_SIZE / 8;

#[derive(Debug)]
pub(crate) struct Regions {
    count: u64,
    /// Set: the devices may differ there.
    dirty: Vec<u64>,
    /// The bits the bitmap holds on disk once the page write in flight (if
    /// any) lands; while one is in flight, only the bits it keeps.
    disk: Vec<u64>,
    /// Touched by a write since the last clean.
    touched: Vec<u64>,
}

fn bit(words: &[u64], region: u64) -> bool {
    words[(region / 64) as usize] & (1 << (region % 64)) != 0
}

fn set(words: &mut [u64], region: u64) {
    words[(region / 64) as usize] |= 1 << (region % 64);
}

impl Regions {
    pub(crate) fn new(count: u64) -> Regions {
        let words = count.div_ceil(BITS_PER_PAGE) as usize * WORDS_PER_PAGE;
        Regions { count, dirty: vec![0; words], disk: vec![0; words], touched: vec![0; words] }
    }

    /// A write to `regions` begins: marks them dirty and touched; whether
    /// every bit is on disk already.
    pub(crate) fn write(&mut self, regions: impl Iterator<Item = u64>) -> bool {
        let mut on_disk = true;
        for region in regions {
            debug_assert!(region < self.count, "region {region} of {}", self.count);
            set(&mut self.dirty, region);
            set(&mut self.touched, region);
            on_disk &= bit(&self.disk, region);
        }
        on_disk
    }

    /// A write to `regions` ended (a clean whose flush began before it
    /// landed must not clear them).
    pub(crate) fn touch(&mut self, regions: impl Iterator<Item = u64>) {
        for region in regions {
            set(&mut self.touched, region);
        }
    }

    /// The devices are flushed since the last clean ended: clears the bits
    /// of regions untouched since, and starts the next interval; how many.
    pub(crate) fn clean(&mut self) -> u64 {
        let mut cleared = 0;
        let before = self.dirty_count();
        for (dirty, touched) in self.dirty.iter_mut().zip(self.touched.iter_mut()) {
            let clear = *dirty & !*touched;
            cleared += clear.count_ones() as u64;
            *dirty &= !clear;
            *touched = 0;
        }
        debug_assert_eq!(self.dirty_count() + cleared, before, "a clean sets no bit");
        cleared
    }

    /// Bitmap pages whose disk image differs from memory, with the image
    /// to write; the disk bits become what both keep until
    /// [`Regions::written`] says the writes landed.
    pub(crate) fn pages_to_write(&mut self) -> Vec<(u64, Vec<u8>)> {
        let mut pages = Vec::new();
        for (page, (memory, disk)) in
            self.dirty.chunks(WORDS_PER_PAGE).zip(self.disk.chunks_mut(WORDS_PER_PAGE)).enumerate()
        {
            if memory == disk {
                continue;
            }
            let image: Vec<u8> = memory.iter().flat_map(|word| word.to_le_bytes()).collect();
            disk.iter_mut().zip(memory).for_each(|(d, m)| *d &= *m);
            debug_assert!(disk.iter().zip(memory).all(|(d, m)| d & !m == 0), "a bit on disk that memory lacks");
            pages.push((page as u64, image));
        }
        pages
    }

    /// Every bitmap page's image (for a device that is to keep the bitmap
    /// from now on); the disk bits as [`Regions::pages_to_write`] leaves them.
    pub(crate) fn every_page(&mut self) -> Vec<(u64, Vec<u8>)> {
        let mut pages = Vec::new();
        for (page, (memory, disk)) in
            self.dirty.chunks(WORDS_PER_PAGE).zip(self.disk.chunks_mut(WORDS_PER_PAGE)).enumerate()
        {
            disk.iter_mut().zip(memory).for_each(|(d, m)| *d &= *m);
            pages.push((page as u64, memory.iter().flat_map(|word| word.to_le_bytes()).collect()));
        }
        pages
    }

    /// The page images [`Regions::pages_to_write`] gave are on disk.
    pub(crate) fn written(&mut self, pages: &[(u64, Vec<u8>)]) {
        for (page, image) in pages {
            debug_assert_eq!(image.len(), BLOCK_SIZE, "a bitmap page image is a block");
            let at = *page as usize * WORDS_PER_PAGE;
            for (word, bytes) in self.disk[at..at + WORDS_PER_PAGE].iter_mut().zip(image.chunks(8)) {
                *word = u64::from_le_bytes(bytes.try_into().expect("8 bytes"));
            }
        }
    }

    /// Every bit clear (a clean stop: both devices flushed, nothing in flight).
    pub(crate) fn clear_all(&mut self) {
        self.dirty.iter_mut().for_each(|word| *word = 0);
        self.touched.iter_mut().for_each(|word| *word = 0);
    }

    /// Dirty regions, in order (for a resync).
    pub(crate) fn dirty_regions(&self) -> Vec<u64> {
        (0..self.count).filter(|&region| bit(&self.dirty, region)).collect()
    }

    pub(crate) fn dirty_count(&self) -> u64 {
        self.dirty.iter().map(|word| word.count_ones() as u64).sum()
    }

    /// Loads a bitmap read from disk (memory and disk agree after).
    pub(crate) fn load(&mut self, bitmap: &[u8]) {
        for (index, bytes) in bitmap.chunks(8).take(self.dirty.len()).enumerate() {
            let word = u64::from_le_bytes(bytes.try_into().expect("8 bytes"));
            self.dirty[index] = word;
            self.disk[index] = word;
        }
        // Bits past the last region mean nothing: keep them clear.
        for region in self.count..self.dirty.len() as u64 * 64 {
            let (index, mask) = ((region / 64) as usize, !(1u64 << (region % 64)));
            self.dirty[index] &= mask;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clean_keeps_the_bits_of_regions_written_since_the_last() {
        let mut regions = Regions::new(100);
        assert!(!regions.write([1, 2, 3].into_iter()), "nothing is on disk yet");
        let pages = regions.pages_to_write();
        assert_eq!(pages.len(), 1);
        regions.written(&pages);
        assert!(regions.write([1].into_iter()), "on disk now");
        assert_eq!(regions.clean(), 0, "all three were written in this interval");
        regions.touch([2].into_iter());
        assert_eq!(regions.clean(), 2, "only region 2 was touched (a write that ended) since");
        assert_eq!(regions.dirty_regions(), vec![2]);
        let pages = regions.pages_to_write();
        assert!(!regions.write([1].into_iter()), "its bit is being cleared on disk");
        regions.written(&pages);
        assert!(!regions.write([1].into_iter()), "and is clear there now");
        assert_eq!(regions.clean(), 1, "region 2 untouched in the last interval");
        assert_eq!(regions.dirty_regions(), vec![1]);
    }

    #[test]
    fn a_loaded_bitmap_keeps_bits_past_the_last_region_clear() {
        let mut regions = Regions::new(10);
        regions.load(&[0xff; BLOCK_SIZE]);
        assert_eq!(regions.dirty_count(), 10);
        assert!(regions.write([9].into_iter()));
    }
}
