//! A bounded cache of 4 KiB metadata pages (crc table and onode area) for
//! one partition. Dirty pages stay until the next checkpoint writes them
//! back; clean pages are evicted by [`PageCache::trim`] when the cache is
//! over its capacity.

use std::collections::HashMap;

use crate::blockio::{AlignedBuf, BlockIo};
use crate::error::{Result, StoreError};
use crate::BLOCK_SIZE;

struct Page {
    buf: AlignedBuf,
    dirty: bool,
}

pub struct PageCache {
    pages: HashMap<u64, Page>,
    capacity_pages: usize,
    dirty_count: usize,
    pub misses: u64,
}

impl PageCache {
    pub fn new(capacity_pages: usize) -> PageCache {
        PageCache { pages: HashMap::new(), capacity_pages: capacity_pages.max(16), dirty_count: 0, misses: 0 }
    }

    /// Loads every listed page (absolute device block numbers) that is not
    /// cached, with one batch of reads.
    pub fn load(&mut self, io: &mut dyn BlockIo, blocks: &[u64]) -> Result<()> {
        let mut missing: Vec<u64> = blocks.iter().copied().filter(|b| !self.pages.contains_key(b)).collect();
        if missing.is_empty() {
            return Ok(());
        }
        missing.sort_unstable();
        missing.dedup();
        let mut bufs: Vec<AlignedBuf> = missing.iter().map(|_| AlignedBuf::zeroed(BLOCK_SIZE)).collect();
        {
            let mut requests: Vec<(u64, &mut [u8])> =
                missing.iter().zip(bufs.iter_mut()).map(|(b, buf)| (b * BLOCK_SIZE as u64, &mut buf[..])).collect();
            io.read_many(&mut requests).map_err(|e| StoreError::io("reading metadata pages", e))?;
        }
        self.misses += missing.len() as u64;
        for (block, buf) in missing.into_iter().zip(bufs) {
            let previous = self.pages.insert(block, Page { buf, dirty: false });
            debug_assert!(previous.is_none(), "metadata page {block} loaded over a cached one");
        }
        debug_assert!(blocks.iter().all(|b| self.pages.contains_key(b)), "a listed page was not loaded");
        Ok(())
    }

    /// A cached page's bytes; the page must have been loaded.
    pub fn get(&self, block: u64) -> &[u8] {
        &self.pages.get(&block).unwrap_or_else(|| panic!("metadata page {block} used before it was loaded")).buf
    }

    pub fn get_mut(&mut self, block: u64) -> &mut [u8] {
        debug_assert!(self.dirty_count <= self.pages.len(), "more dirty pages than pages");
        let page =
            self.pages.get_mut(&block).unwrap_or_else(|| panic!("metadata page {block} used before it was loaded"));
        if !page.dirty {
            page.dirty = true;
            self.dirty_count += 1;
        }
        &mut page.buf
    }

    pub fn is_cached(&self, block: u64) -> bool {
        self.pages.contains_key(&block)
    }

    pub fn dirty_count(&self) -> usize {
        self.dirty_count
    }

    pub fn len(&self) -> usize {
        self.pages.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pages.is_empty()
    }

    /// The dirty pages, sorted by block, for write-back.
    pub fn dirty_pages(&self) -> Vec<(u64, &[u8])> {
        let mut dirty: Vec<(u64, &[u8])> =
            self.pages.iter().filter(|(_, p)| p.dirty).map(|(b, p)| (*b, &p.buf[..])).collect();
        dirty.sort_unstable_by_key(|(b, _)| *b);
        debug_assert_eq!(dirty.len(), self.dirty_count, "the dirty counter lost track");
        dirty
    }

    pub fn mark_clean(&mut self) {
        for page in self.pages.values_mut() {
            page.dirty = false;
        }
        self.dirty_count = 0;
    }

    /// Drops the cached pages in `blocks`, which must be clean: their area
    /// changed hands (a data chunk given back to the store's pool).
    pub fn forget(&mut self, blocks: std::ops::RangeInclusive<u64>) {
        for block in blocks {
            if let Some(page) = self.pages.remove(&block) {
                assert!(!page.dirty, "metadata page {block} dropped before it was written back");
            }
        }
    }

    /// Drops clean pages while the cache is over its capacity. Called between
    /// operations only, so a page loaded for an operation stays while it runs.
    pub fn trim(&mut self) {
        if self.pages.len() <= self.capacity_pages {
            return;
        }
        let target = self.capacity_pages * 7 / 8;
        let excess = self.pages.len().saturating_sub(target);
        let victims: Vec<u64> = self.pages.iter().filter(|(_, p)| !p.dirty).map(|(b, _)| *b).take(excess).collect();
        for block in victims {
            self.pages.remove(&block);
        }
        debug_assert_eq!(
            self.pages.values().filter(|p| p.dirty).count(),
            self.dirty_count,
            "trim evicted a dirty page"
        );
    }
}
