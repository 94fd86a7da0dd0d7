//! An in-memory bitmap mirrored by an on-disk area, with the pages changed
//! since the last checkpoint tracked for write-back.
//!
//! On disk: bit `i` is bit `i % 8` of byte `i / 8` of the area.

use std::collections::BTreeSet;

use crate::layout::Area;
use crate::BLOCK_SIZE;

const BITS_PER_PAGE: u64 = (BLOCK_SIZE * 8) as u64;
const WORDS_PER_PAGE: usize = BLOCK_SIZE / 8;

#[derive(Clone, Debug)]
pub struct Bitmap {
    words: Vec<u64>,
    len: u64,
    ones: u64,
    area: Area,
    dirty_pages: BTreeSet<u64>,
}

impl Bitmap {
    /// A bitmap of `len` bits backed by `area`, from the area's bytes.
    /// Bits past `len` in the last page are ignored (and written back as zero).
    pub fn from_bytes(len: u64, area: Area, bytes: &[u8]) -> Bitmap {
        assert!(area.blocks * BITS_PER_PAGE >= len, "area too small for {len} bits");
        assert!(bytes.len() as u64 >= len.div_ceil(8));
        let word_count = len.div_ceil(64) as usize;
        let mut words: Vec<u64> = (0..word_count)
            .map(|i| {
                let mut word = [0u8; 8];
                let start = i * 8;
                let end = (start + 8).min(bytes.len());
                word[..end - start].copy_from_slice(&bytes[start..end]);
                u64::from_le_bytes(word)
            })
            .collect();
        if !len.is_multiple_of(64) {
            if let Some(last) = words.last_mut() {
                *last &= (1u64 << (len % 64)) - 1;
            }
        }
        let ones: u64 = words.iter().map(|w| w.count_ones() as u64).sum();
        assert!(ones <= len, "bits past {len} were not masked off");
        Bitmap { words, len, ones, area, dirty_pages: BTreeSet::new() }
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn count_ones(&self) -> u64 {
        self.ones
    }

    pub fn get(&self, bit: u64) -> bool {
        debug_assert!(bit < self.len, "bit {bit} out of {}", self.len);
        self.words[(bit / 64) as usize] >> (bit % 64) & 1 == 1
    }

    /// Sets `count` bits from `start` to `value`; marks their pages dirty.
    pub fn set_range(&mut self, start: u64, count: u64, value: bool) {
        self.set_range_quiet(start, count, value);
        if count > 0 {
            for page in start / BITS_PER_PAGE..=(start + count - 1) / BITS_PER_PAGE {
                debug_assert!(page < self.area.blocks, "dirty page {page} outside the bitmap's area");
                self.dirty_pages.insert(page);
            }
        }
    }

    /// Sets bits without marking pages dirty: for reservations that will be
    /// undone or made durable through the journal before any write-back.
    pub fn set_range_quiet(&mut self, start: u64, count: u64, value: bool) {
        assert!(
            start.checked_add(count).is_some_and(|end| end <= self.len),
            "range {start}+{count} out of {}",
            self.len
        );
        let mut bit = start;
        let end = start + count;
        while bit < end {
            let word = (bit / 64) as usize;
            let offset = bit % 64;
            let span = (64 - offset).min(end - bit);
            let mask = if span == 64 { u64::MAX } else { ((1u64 << span) - 1) << offset };
            let before = self.words[word];
            let after = if value { before | mask } else { before & !mask };
            self.ones = self.ones + after.count_ones() as u64 - before.count_ones() as u64;
            self.words[word] = after;
            bit += span;
        }
        debug_assert!(self.ones <= self.len, "{} ones in {} bits", self.ones, self.len);
        debug_assert!(count == 0 || (self.get(start) == value && self.get(end - 1) == value), "range not set");
    }

    /// First clear bit at or after `from`, wrapping around once.
    pub fn find_clear(&self, from: u64) -> Option<u64> {
        self.find_clear_run(from, 1)
    }

    /// Start of the first run of `count` clear bits at or after `from`,
    /// wrapping around once (runs do not wrap).
    pub fn find_clear_run(&self, from: u64, count: u64) -> Option<u64> {
        if count == 0 || count > self.len - self.ones {
            return None;
        }
        let from = if from >= self.len { 0 } else { from };
        let found = self
            .scan_clear_run(from, self.len, count)
            .or_else(|| self.scan_clear_run(0, (from + count).min(self.len), count));
        debug_assert!(
            found.is_none_or(|start| start + count <= self.len && (start..start + count).all(|bit| !self.get(bit))),
            "found run {found:?} of {count} is not clear"
        );
        found
    }

    fn scan_clear_run(&self, start: u64, end: u64, count: u64) -> Option<u64> {
        debug_assert!(start <= end && end <= self.len, "scan {start}..{end} outside {} bits", self.len);
        let mut run_start = start;
        let mut bit = start;
        while bit < end {
            let word_index = (bit / 64) as usize;
            let word = self.words[word_index];
            // Skip whole words: all set (restart the run after it) or all clear.
            if bit.is_multiple_of(64) && bit + 64 <= end {
                if word == u64::MAX {
                    bit += 64;
                    run_start = bit;
                    continue;
                }
                if word == 0 {
                    bit += 64;
                    if bit - run_start >= count {
                        return Some(run_start);
                    }
                    continue;
                }
            }
            if word >> (bit % 64) & 1 == 1 {
                run_start = bit + 1;
            } else if bit + 1 - run_start >= count {
                return Some(run_start);
            }
            bit += 1;
        }
        None
    }

    /// The on-disk image of page `page` (4096 bytes).
    pub fn page_bytes(&self, page: u64) -> Vec<u8> {
        debug_assert!(page < self.area.blocks, "page {page} outside the bitmap's {} pages", self.area.blocks);
        let mut out = vec![0u8; BLOCK_SIZE];
        let first = page as usize * WORDS_PER_PAGE;
        for (i, word) in self.words.iter().skip(first).take(WORDS_PER_PAGE).enumerate() {
            out[i * 8..i * 8 + 8].copy_from_slice(&word.to_le_bytes());
        }
        out
    }

    /// Heap bytes held by the bitmap's words.
    pub fn heap_bytes(&self) -> usize {
        self.words.capacity() * 8
    }

    pub fn area(&self) -> Area {
        self.area
    }

    /// Pages changed since the last [`Bitmap::mark_clean`].
    pub fn dirty_pages(&self) -> impl Iterator<Item = u64> + '_ {
        self.dirty_pages.iter().copied()
    }

    pub fn dirty_page_count(&self) -> usize {
        self.dirty_pages.len()
    }

    pub fn mark_clean(&mut self) {
        self.dirty_pages.clear();
    }

    /// Iterates over the indexes of set bits.
    pub fn ones(&self) -> impl Iterator<Item = u64> + '_ {
        self.words.iter().enumerate().flat_map(|(i, &word)| {
            let mut rest = word;
            std::iter::from_fn(move || {
                if rest == 0 {
                    return None;
                }
                let bit = rest.trailing_zeros() as u64;
                rest &= rest - 1;
                Some(i as u64 * 64 + bit)
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn empty(len: u64) -> Bitmap {
        let area = Area { start: 0, blocks: len.div_ceil(BITS_PER_PAGE).max(1) };
        Bitmap::from_bytes(len, area, &vec![0u8; len.div_ceil(8) as usize])
    }

    proptest! {
        #[test]
        fn matches_a_vec_of_bools(len in 1u64..700, ops in proptest::collection::vec((0u64..700, 0u64..80, any::<bool>()), 0..40), want in 1u64..70, from in 0u64..700) {
            let mut bitmap = empty(len);
            let mut model = vec![false; len as usize];
            for (start, count, value) in ops {
                let start = start % len;
                let count = count.min(len - start);
                bitmap.set_range(start, count, value);
                for b in &mut model[start as usize..(start + count) as usize] { *b = value; }
            }
            for (i, bit) in model.iter().enumerate() { prop_assert_eq!(bitmap.get(i as u64), *bit); }
            prop_assert_eq!(bitmap.count_ones(), model.iter().filter(|b| **b).count() as u64);
            if let Some(start) = bitmap.find_clear_run(from, want) {
                prop_assert!(model[start as usize..(start + want) as usize].iter().all(|b| !b));
            } else {
                let exists = (0..len.saturating_sub(want - 1)).any(|s| model[s as usize..(s + want) as usize].iter().all(|b| !b));
                prop_assert!(!exists, "a run of {} exists but was not found", want);
            }
            let ones: Vec<u64> = bitmap.ones().collect();
            let model_ones: Vec<u64> = model.iter().enumerate().filter(|(_, b)| **b).map(|(i, _)| i as u64).collect();
            prop_assert_eq!(ones, model_ones);
            // Round trip through the page images.
            let mut bytes = Vec::new();
            for page in 0..bitmap.area().blocks { bytes.extend(bitmap.page_bytes(page)); }
            let reloaded = Bitmap::from_bytes(len, bitmap.area(), &bytes);
            for i in 0..len { prop_assert_eq!(reloaded.get(i), bitmap.get(i)); }
        }
    }
}
