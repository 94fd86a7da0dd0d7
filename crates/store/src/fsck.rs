//! `fsck`: checks every invariant of a store without changing it.
//!
//! Per partition: every in-use onode slot is sound (checksum, chain shape)
//! and belongs to exactly one chain; a data block is referenced by two
//! objects only if both are flagged as sharing, and shared blocks' counts
//! are the references the onodes make; the
//! allocation bitmap equals the set of blocks onodes reference (deleted
//! onodes awaiting reclaim included); no written bit outside allocated
//! blocks; the index agrees with the onodes; no key has two live onodes;
//! and, unless skipped, every written block matches its crc32c.

use std::path::Path;

use serde::Serialize;

use crate::blockio::AlignedBuf;
use crate::onode::{decode_slot, KIND_HEAD};
use crate::partition::Partition;
use crate::store::{Store, StoreConfig};
use crate::BLOCK_SIZE;

const MAX_ISSUES_PER_PARTITION: usize = 1000;

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct FsckIssue {
    /// Machine-readable class: `mount`, `onode_corrupt`, `slot_shared`,
    /// `slot_leaked`, `block_owned_twice`, `block_referenced_but_free`,
    /// `block_leaked`, `written_but_free`, `duplicate_key`, `index_mismatch`,
    /// `chunk_claims`, `block_refcount`, `data_checksum`, `io`.
    pub kind: String,
    pub detail: String,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct PartitionFsck {
    pub partition: u32,
    pub objects: u64,
    pub deleted_awaiting_reclaim: u64,
    pub slots_in_use: u64,
    pub blocks_allocated: u64,
    pub blocks_written: u64,
    pub blocks_verified: u64,
    pub issues: Vec<FsckIssue>,
    pub issues_suppressed: u64,
}

impl PartitionFsck {
    fn issue(&mut self, kind: &str, detail: String) {
        if self.issues.len() < MAX_ISSUES_PER_PARTITION {
            self.issues.push(FsckIssue { kind: kind.into(), detail });
        } else {
            self.issues_suppressed += 1;
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct FsckReport {
    pub path: String,
    pub clean: bool,
    pub verified_data: bool,
    pub issues: Vec<FsckIssue>,
    pub partitions: Vec<PartitionFsck>,
}

/// Checks the store at `path` (mounted read-only: nothing is written).
pub fn fsck(path: &Path, config: &StoreConfig, verify_data: bool) -> FsckReport {
    let config = StoreConfig { read_only: true, ..config.clone() };
    let mut report = FsckReport {
        path: path.display().to_string(),
        clean: false,
        verified_data: verify_data,
        issues: Vec::new(),
        partitions: Vec::new(),
    };
    match Store::open(path, &config) {
        Ok(store) => {
            for mut partition in store.into_partitions() {
                report.partitions.push(partition.fsck(verify_data));
            }
        }
        Err(err) => report.issues.push(FsckIssue { kind: "mount".into(), detail: err.to_string() }),
    }
    report.clean =
        report.issues.is_empty() && report.partitions.iter().all(|p| p.issues.is_empty() && p.issues_suppressed == 0);
    report
}

struct Bits(Vec<u64>);

impl Bits {
    fn new(len: u64) -> Bits {
        Bits(vec![0; len.div_ceil(64) as usize])
    }
    /// Sets the bit; returns whether it was already set.
    fn test_and_set(&mut self, bit: u64) -> bool {
        let word = &mut self.0[(bit / 64) as usize];
        let mask = 1u64 << (bit % 64);
        let was = *word & mask != 0;
        *word |= mask;
        was
    }
    fn get(&self, bit: u64) -> bool {
        self.0[(bit / 64) as usize] & (1u64 << (bit % 64)) != 0
    }
}

impl Partition {
    /// Checks this partition's invariants (see the module docs).
    pub fn fsck(&mut self, verify_data: bool) -> PartitionFsck {
        let mut report = PartitionFsck {
            partition: self.index,
            slots_in_use: self.slots.count_ones(),
            blocks_allocated: self.alloc.count_ones(),
            blocks_written: self.written.count_ones(),
            ..Default::default()
        };
        let mut slot_owned = Bits::new(self.geometry.slot_count());
        let mut block_owned = Bits::new(self.region.data_blocks);
        // References beyond the first, per block: what clones share.
        let mut extra_references: std::collections::BTreeMap<u32, u32> = std::collections::BTreeMap::new();
        let mut live: Vec<(crate::Key, u32)> = Vec::new();
        let used: Vec<u64> = self.slots.ones().collect();
        for &slot in &used {
            let image = match self.slot_image(slot as u32) {
                Ok(image) => image,
                Err(err) => {
                    report.issue("io", format!("reading onode slot {slot}: {err}"));
                    continue;
                }
            };
            match decode_slot(&image) {
                Err(err) => report.issue("onode_corrupt", format!("slot {slot}: {err}")),
                Ok((header, _)) if header.kind == KIND_HEAD => match self.read_chain(slot as u32) {
                    Err(err) => report.issue("onode_corrupt", err.to_string()),
                    Ok((chain, deleted, meta)) => {
                        for &s in &chain {
                            if slot_owned.test_and_set(s as u64) {
                                report.issue("slot_shared", format!("slot {s} is in two onode chains"));
                            }
                        }
                        for extent in &meta.extents {
                            for block in extent.physical..extent.physical + extent.len {
                                if block_owned.test_and_set(block as u64) {
                                    *extra_references.entry(block).or_default() += 1;
                                    if meta.flags & crate::onode::OBJECT_FLAG_SHARES == 0 {
                                        report.issue(
                                            "block_owned_twice",
                                            format!("data block {block} (second owner {:?}, not a clone)", meta.key),
                                        );
                                    }
                                }
                                if !self.alloc.get(block as u64) {
                                    report.issue(
                                        "block_referenced_but_free",
                                        format!("data block {block} of {:?}", meta.key),
                                    );
                                }
                            }
                        }
                        if deleted {
                            report.deleted_awaiting_reclaim += 1;
                        } else {
                            report.objects += 1;
                            self.check_index_entry(&mut report, slot as u32, &meta);
                            live.push((meta.key, slot as u32));
                        }
                    }
                },
                Ok(_) => {}
            }
            self.pages.trim();
        }
        for &slot in &used {
            if !slot_owned.get(slot) {
                report.issue("slot_leaked", format!("slot {slot} is in use but in no readable onode chain"));
            }
        }
        if extra_references != self.shared {
            let differing: Vec<u32> = extra_references
                .keys()
                .chain(self.shared.keys())
                .filter(|block| extra_references.get(block) != self.shared.get(block))
                .copied()
                .take(10)
                .collect();
            report.issue(
                "block_refcount",
                format!("shared blocks' reference counts differ from the onodes' (blocks {differing:?}, ...)"),
            );
        }
        for block in self.alloc.ones() {
            if !block_owned.get(block) {
                report.issue("block_leaked", format!("data block {block} is allocated but no onode references it"));
            }
        }
        let claimed: Vec<u32> = self.claims.ones().map(|chunk| chunk as u32).collect();
        if claimed != self.alloc.owned_chunks() {
            report.issue(
                "chunk_claims",
                format!("claims bitmap names chunks {claimed:?}, the partition holds {:?}", self.alloc.owned_chunks()),
            );
        }
        for block in self.written.ones() {
            if !self.alloc.get(block) {
                report.issue("written_but_free", format!("data block {block} is marked written but not allocated"));
            }
        }
        live.sort();
        for pair in live.windows(2) {
            if pair[0].0 == pair[1].0 {
                report.issue(
                    "duplicate_key",
                    format!("{:?} has live onodes at slots {} and {}", pair[0].0, pair[0].1, pair[1].1),
                );
            }
        }
        if live.len() != self.objects.len() {
            report.issue(
                "index_mismatch",
                format!("{} live onodes but {} index entries", live.len(), self.objects.len()),
            );
        }
        if verify_data {
            self.verify_all_data(&mut report);
        }
        assert!(report.issues.len() <= MAX_ISSUES_PER_PARTITION);
        assert!(
            report.slots_in_use <= self.geometry.slot_count()
                && report.blocks_allocated <= self.region.data_blocks
                && report.blocks_written <= self.region.data_blocks,
            "bitmap counts exceed their bitmaps"
        );
        report
    }

    fn check_index_entry(&self, report: &mut PartitionFsck, head: u32, meta: &crate::onode::ObjectMeta) {
        match self.objects.get(meta.key.as_bytes()) {
            Some(entry) if entry.head_slot == head => {
                if entry.size != meta.size
                    // The same map in the index's form (a table merges neighbours).
                    || entry.extents.to_vec() != crate::partition::Extents::from_vec(&meta.extents).to_vec()
                    || entry.flags != meta.flags
                {
                    report.issue("index_mismatch", format!("{:?}: index disagrees with its onode", meta.key));
                }
            }
            Some(_) => {} // a duplicate; reported with duplicate_key
            None => report.issue("index_mismatch", format!("{:?} has an onode but no index entry", meta.key)),
        }
    }

    fn verify_all_data(&mut self, report: &mut PartitionFsck) {
        let written: Vec<u32> = self.written.ones().map(|b| b as u32).collect();
        for chunk in written.chunks(256) {
            let crc_pages: Vec<u64> = chunk.iter().map(|b| self.crc_location(*b).0).collect();
            if let Err(err) = self.pages.load(self.io.as_mut(), &crc_pages) {
                report.issue("io", format!("reading crc pages: {err}"));
                return;
            }
            let mut bufs: Vec<AlignedBuf> = chunk.iter().map(|_| AlignedBuf::zeroed(BLOCK_SIZE)).collect();
            {
                let mut requests: Vec<(u64, &mut [u8])> =
                    chunk.iter().zip(bufs.iter_mut()).map(|(b, buf)| (self.data_offset(*b), &mut buf[..])).collect();
                if let Err(err) = self.io.read_many(&mut requests) {
                    report.issue("io", format!("reading data blocks: {err}"));
                    return;
                }
            }
            for (block, disk) in chunk.iter().zip(bufs) {
                // A block changed through the journal is what replay rebuilt
                // (mount already dropped one that failed its crc).
                let stored = match self.crc_get(*block) {
                    Ok(crc) => crc,
                    Err(err) => {
                        report.issue("io", err.to_string());
                        return;
                    }
                };
                let computed = crate::crc32c(self.deferred.get(block).map_or(&disk[..], |image| &image[..]));
                if computed != stored {
                    report.issue(
                        "data_checksum",
                        format!(
                            "data block {block} (device offset {}): stored {stored:#010x}, computed {computed:#010x}",
                            self.data_offset(*block)
                        ),
                    );
                }
                report.blocks_verified += 1;
            }
            self.pages.trim();
        }
        assert_eq!(report.blocks_verified, written.len() as u64, "every written block was verified");
    }
}
