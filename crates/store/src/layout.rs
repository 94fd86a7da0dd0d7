//! On-disk layout. All integers are little-endian; all sizes below are in
//! 4 KiB blocks unless named otherwise.
//!
//! ```text
//! block 0              superblock (one block, crc32c-sealed)
//! per partition p, from geometry[p].start:
//!   2 blocks           partition headers A and B (alternating, crc-sealed, newest valid wins)
//!   journal            metadata journal: records padded to the device sector (journal.rs)
//!   slot bitmap        1 bit per onode slot: in use
//!   alloc bitmap       1 bit per data block: allocated to an object
//!   written bitmap     1 bit per data block: holds data (clear = reads as zeros)
//!   crc table          u32 crc32c per data block (meaningful when written)
//!   onode area         512-byte onode slots, 8 per block (onode.rs)
//!   data area          4 KiB data blocks
//! ```
//!
//! Superblock (4096 bytes):
//! ```text
//! 0   magic "DPLXSTOR"      8   format version u32   12  crc32c u32 (of the block, field excluded)
//! 16  fsid [16]             32  device blocks u64    40  sector size u32
//! 44  partition count u32   48  created (unix seconds) u64
//! 56  geometry[count]: 18 u64 each (start, blocks, then (start, blocks) of the 8 areas)
//! ```
//! The superblock is written last by mkfs: a store without a valid one was
//! never made, and mount refuses it.

use crate::codec::{seal, verify_seal, Reader, Writer};
use crate::error::{Result, StoreError};
use crate::{BLOCK_SIZE, MAX_PARTITIONS, SLOTS_PER_PAGE};

pub const SUPERBLOCK_MAGIC: &[u8; 8] = b"DPLXSTOR";
pub const FORMAT_VERSION: u32 = 1;
const SUPERBLOCK_CRC_AT: usize = 12;
const BITS_PER_PAGE: u64 = (BLOCK_SIZE * 8) as u64;
const CRCS_PER_PAGE: u64 = (BLOCK_SIZE / 4) as u64;

/// A run of blocks on the device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Area {
    pub start: u64,
    pub blocks: u64,
}

impl Area {
    pub fn end(&self) -> u64 {
        self.start + self.blocks
    }
    pub fn byte_offset(&self) -> u64 {
        self.start * BLOCK_SIZE as u64
    }
}

/// Where each area of one partition lies, in absolute device blocks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PartitionGeometry {
    pub start: u64,
    pub blocks: u64,
    pub headers: Area,
    pub journal: Area,
    pub slot_bitmap: Area,
    pub alloc_bitmap: Area,
    pub written_bitmap: Area,
    pub crc_table: Area,
    pub onodes: Area,
    pub data: Area,
}

impl PartitionGeometry {
    fn areas(&self) -> [Area; 8] {
        [
            self.headers,
            self.journal,
            self.slot_bitmap,
            self.alloc_bitmap,
            self.written_bitmap,
            self.crc_table,
            self.onodes,
            self.data,
        ]
    }

    pub fn slot_count(&self) -> u64 {
        self.onodes.blocks * SLOTS_PER_PAGE as u64
    }

    pub fn data_blocks(&self) -> u64 {
        self.data.blocks
    }

    /// Lays out a partition of `blocks` blocks starting at `start`, with a
    /// journal of `journal_blocks` and one onode slot per `bytes_per_onode`
    /// bytes of data: the most data blocks whose metadata still fits.
    pub fn plan(start: u64, blocks: u64, journal_blocks: u64, bytes_per_onode: u64) -> Result<PartitionGeometry> {
        let fixed = 2 + journal_blocks;
        let overhead = |data: u64| {
            let slots = (data * BLOCK_SIZE as u64).div_ceil(bytes_per_onode).max(SLOTS_PER_PAGE as u64);
            let slot_bitmap = slots.div_ceil(BITS_PER_PAGE);
            let bitmaps = 2 * data.div_ceil(BITS_PER_PAGE).max(1);
            let crc = data.div_ceil(CRCS_PER_PAGE).max(1);
            let onodes = slots.div_ceil(SLOTS_PER_PAGE as u64);
            fixed + slot_bitmap + bitmaps + crc + onodes
        };
        // The largest data block count whose overhead fits (overhead grows with data).
        let (mut low, mut high) = (0u64, blocks);
        while low < high {
            let mid = low + (high - low).div_ceil(2);
            if mid + overhead(mid) <= blocks {
                low = mid;
            } else {
                high = mid - 1;
            }
        }
        let data_blocks = low;
        // The largest count that fits: overhead grows with the data it describes.
        assert!(data_blocks == 0 || data_blocks + overhead(data_blocks) <= blocks, "planned data does not fit");
        assert!(
            data_blocks == blocks || data_blocks + 1 + overhead(data_blocks + 1) > blocks,
            "planned data not maximal"
        );
        if data_blocks < 16 {
            return Err(StoreError::invalid(format!(
                "partition of {blocks} blocks is too small for its metadata ({journal_blocks}-block journal)"
            )));
        }
        if data_blocks > u32::MAX as u64 {
            return Err(StoreError::invalid(
                "a partition may hold at most 2^32 data blocks (16 TiB); use more partitions",
            ));
        }
        let slots = (data_blocks * BLOCK_SIZE as u64).div_ceil(bytes_per_onode).max(SLOTS_PER_PAGE as u64);
        let mut next = start;
        let mut take = |n: u64| {
            let area = Area { start: next, blocks: n };
            next += n;
            area
        };
        let geometry = PartitionGeometry {
            start,
            blocks,
            headers: take(2),
            journal: take(journal_blocks),
            slot_bitmap: take(slots.div_ceil(BITS_PER_PAGE)),
            alloc_bitmap: take(data_blocks.div_ceil(BITS_PER_PAGE).max(1)),
            written_bitmap: take(data_blocks.div_ceil(BITS_PER_PAGE).max(1)),
            crc_table: take(data_blocks.div_ceil(CRCS_PER_PAGE).max(1)),
            onodes: take(slots.div_ceil(SLOTS_PER_PAGE as u64)),
            data: take(data_blocks),
        };
        assert!(geometry.data.end() <= start + blocks, "areas overrun the partition: {geometry:?}");
        geometry.validate(u64::MAX)?;
        Ok(geometry)
    }

    /// Areas are in order, contiguous, inside the partition and the device, and big enough.
    pub fn validate(&self, device_blocks: u64) -> Result<()> {
        let bad = |what: &str| Err(StoreError::corrupt(format!("partition geometry: {what}: {self:?}")));
        if self.start == 0 || self.start.checked_add(self.blocks).is_none_or(|end| end > device_blocks) {
            return bad("partition outside the device");
        }
        let mut next = self.start;
        for area in self.areas() {
            if area.start != next || area.blocks == 0 {
                return bad("areas not contiguous or empty");
            }
            next = match area.start.checked_add(area.blocks) {
                Some(end) => end,
                None => return bad("area overflows"),
            };
        }
        if next > self.start + self.blocks {
            return bad("areas overrun the partition");
        }
        if self.headers.blocks != 2
            || self.slot_bitmap.blocks * BITS_PER_PAGE < self.slot_count()
            || self.alloc_bitmap.blocks * BITS_PER_PAGE < self.data.blocks
            || self.written_bitmap.blocks * BITS_PER_PAGE < self.data.blocks
            || self.crc_table.blocks * CRCS_PER_PAGE < self.data.blocks
            || self.data.blocks > u32::MAX as u64
            || self.slot_count() > u32::MAX as u64
        {
            return bad("metadata area too small for the data it describes");
        }
        Ok(())
    }
}

/// Parameters of `mkfs`.
#[derive(Clone, Debug)]
pub struct MkfsOptions {
    /// Number of partitions (one non-priority thread each).
    pub partitions: u32,
    /// Journal size per partition; `None` picks 1/128 of the partition, 1..=64 MiB.
    pub journal_bytes: Option<u64>,
    /// Data bytes per onode slot: the object count a partition can hold is
    /// its data size divided by this.
    pub bytes_per_onode: u64,
    /// For a regular file: create or extend it to this size first.
    pub size_bytes: Option<u64>,
}

impl Default for MkfsOptions {
    fn default() -> Self {
        MkfsOptions { partitions: 1, journal_bytes: None, bytes_per_onode: 64 << 10, size_bytes: None }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    pub version: u32,
    pub fsid: [u8; 16],
    pub device_blocks: u64,
    pub sector_size: u32,
    pub created_unix: u64,
    pub partitions: Vec<PartitionGeometry>,
}

impl Superblock {
    /// Plans a store of `device_bytes` bytes.
    pub fn plan(device_bytes: u64, sector_size: u32, options: &MkfsOptions, fsid: [u8; 16]) -> Result<Superblock> {
        if options.partitions == 0 || options.partitions > MAX_PARTITIONS {
            return Err(StoreError::invalid(format!("partition count must be 1..={MAX_PARTITIONS}")));
        }
        if options.bytes_per_onode < BLOCK_SIZE as u64 {
            return Err(StoreError::invalid("bytes_per_onode must be at least 4096"));
        }
        let device_blocks = device_bytes / BLOCK_SIZE as u64;
        let per_partition = device_blocks.saturating_sub(1) / options.partitions as u64;
        let journal_bytes =
            options.journal_bytes.unwrap_or_else(|| (per_partition * BLOCK_SIZE as u64 / 128).clamp(1 << 20, 64 << 20));
        let journal_blocks = journal_bytes.div_ceil(BLOCK_SIZE as u64).max(4);
        let partitions = (0..options.partitions as u64)
            .map(|p| {
                PartitionGeometry::plan(1 + p * per_partition, per_partition, journal_blocks, options.bytes_per_onode)
            })
            .collect::<Result<Vec<_>>>()?;
        assert!(partitions.windows(2).all(|w| w[0].start + w[0].blocks <= w[1].start), "planned partitions overlap");
        assert!(
            partitions.last().is_some_and(|last| last.start + last.blocks <= device_blocks),
            "planned partitions pass the device's end"
        );
        let created_unix =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        Ok(Superblock { version: FORMAT_VERSION, fsid, device_blocks, sector_size, created_unix, partitions })
    }

    pub fn encode(&self) -> [u8; BLOCK_SIZE] {
        let mut buf = [0u8; BLOCK_SIZE];
        let mut w = Writer::new(&mut buf);
        w.bytes(SUPERBLOCK_MAGIC);
        w.u32(self.version);
        w.u32(0); // crc, sealed below
        w.bytes(&self.fsid);
        w.u64(self.device_blocks);
        w.u32(self.sector_size);
        w.u32(self.partitions.len() as u32);
        w.u64(self.created_unix);
        for g in &self.partitions {
            w.u64(g.start);
            w.u64(g.blocks);
            for area in g.areas() {
                w.u64(area.start);
                w.u64(area.blocks);
            }
        }
        seal(&mut buf, SUPERBLOCK_CRC_AT);
        assert!(
            Superblock::decode(&buf).is_ok_and(|sb| sb == *self),
            "an encoded superblock does not decode to itself"
        );
        buf
    }

    pub fn decode(buf: &[u8]) -> Result<Superblock> {
        if buf.len() < BLOCK_SIZE || &buf[..8] != SUPERBLOCK_MAGIC {
            return Err(StoreError::corrupt("no Duplex store here (superblock magic missing); run mkfs first"));
        }
        let buf = &buf[..BLOCK_SIZE];
        if !verify_seal(buf, SUPERBLOCK_CRC_AT) {
            return Err(StoreError::corrupt("superblock checksum mismatch"));
        }
        let mut r = Reader::new(buf, "superblock");
        r.bytes(8)?;
        let version = r.u32()?;
        if version != FORMAT_VERSION {
            return Err(StoreError::corrupt(format!(
                "superblock format version {version}; this build reads version {FORMAT_VERSION}"
            )));
        }
        r.u32()?;
        let fsid = r.array()?;
        let device_blocks = r.u64()?;
        let sector_size = r.u32()?;
        let count = r.u32()?;
        let created_unix = r.u64()?;
        if count == 0 || count > MAX_PARTITIONS {
            return Err(StoreError::corrupt(format!("superblock: {count} partitions")));
        }
        if !(512..=BLOCK_SIZE as u32).contains(&sector_size) || !sector_size.is_power_of_two() {
            return Err(StoreError::corrupt(format!("superblock: sector size {sector_size}")));
        }
        let mut partitions = Vec::with_capacity(count as usize);
        for _ in 0..count {
            let start = r.u64()?;
            let blocks = r.u64()?;
            let mut areas = [Area::default(); 8];
            for area in areas.iter_mut() {
                *area = Area { start: r.u64()?, blocks: r.u64()? };
            }
            let [headers, journal, slot_bitmap, alloc_bitmap, written_bitmap, crc_table, onodes, data] = areas;
            let g = PartitionGeometry {
                start,
                blocks,
                headers,
                journal,
                slot_bitmap,
                alloc_bitmap,
                written_bitmap,
                crc_table,
                onodes,
                data,
            };
            g.validate(device_blocks)?;
            if let Some(previous) = partitions.last() {
                let previous: &PartitionGeometry = previous;
                if g.start < previous.start + previous.blocks {
                    return Err(StoreError::corrupt("superblock: partitions overlap"));
                }
            }
            partitions.push(g);
        }
        Ok(Superblock { version, fsid, device_blocks, sector_size, created_unix, partitions })
    }
}

/// One of a partition's two alternating headers: where journal replay starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartitionHeader {
    pub fsid: [u8; 16],
    pub partition: u32,
    /// Increases with every header write; the valid header with the larger one wins.
    pub header_seq: u64,
    /// Sequence number of the first journal record to replay (at journal sector 0).
    pub journal_start_seq: u64,
}

pub const HEADER_MAGIC: &[u8; 8] = b"DPLXPHDR";
const HEADER_CRC_AT: usize = 8;

impl PartitionHeader {
    pub fn encode(&self) -> [u8; 512] {
        let mut buf = [0u8; 512];
        let mut w = Writer::new(&mut buf);
        w.bytes(HEADER_MAGIC);
        w.u32(0);
        w.bytes(&self.fsid);
        w.u32(self.partition);
        w.u64(self.header_seq);
        w.u64(self.journal_start_seq);
        seal(&mut buf, HEADER_CRC_AT);
        debug_assert_eq!(PartitionHeader::decode(&buf, &self.fsid, self.partition), Some(*self));
        buf
    }

    /// `None` when the bytes are not a valid header (never written, torn, or stale).
    pub fn decode(buf: &[u8], fsid: &[u8; 16], partition: u32) -> Option<PartitionHeader> {
        let buf = buf.get(..512)?;
        if &buf[..8] != HEADER_MAGIC || !verify_seal(buf, HEADER_CRC_AT) {
            return None;
        }
        let mut r = Reader::new(buf, "partition header");
        r.bytes(12).ok()?;
        let header = PartitionHeader {
            fsid: r.array().ok()?,
            partition: r.u32().ok()?,
            header_seq: r.u64().ok()?,
            journal_start_seq: r.u64().ok()?,
        };
        (header.fsid == *fsid && header.partition == partition).then_some(header)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_most_partitions_the_superblock_holds_encode_and_one_more_is_refused() {
        let options = |partitions| MkfsOptions { partitions, ..MkfsOptions::default() };
        let most = Superblock::plan(64 << 30, 512, &options(MAX_PARTITIONS), [7; 16]).unwrap();
        assert_eq!(Superblock::decode(&most.encode()).unwrap(), most);
        assert!(Superblock::plan(64 << 30, 512, &options(MAX_PARTITIONS + 1), [7; 16]).is_err());
    }

    #[test]
    fn superblock_round_trips_and_detects_corruption() {
        let options = MkfsOptions { partitions: 3, ..Default::default() };
        let sb = Superblock::plan(1 << 30, 512, &options, [7; 16]).unwrap();
        let mut bytes = sb.encode();
        assert_eq!(Superblock::decode(&bytes).unwrap(), sb);
        bytes[100] ^= 1;
        assert!(matches!(Superblock::decode(&bytes), Err(StoreError::Corrupt(_))));
    }

    #[test]
    fn geometry_uses_nearly_all_blocks_for_data() {
        let g = PartitionGeometry::plan(1, 262_144, 256, 64 << 10).unwrap();
        let used = g.data.end() - g.start;
        assert!(used <= g.blocks);
        assert!(g.data.blocks as f64 > 0.98 * (g.blocks - 258) as f64, "{g:?}");
    }

    proptest! {
        #[test]
        fn superblock_decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..4200)) {
            let _ = Superblock::decode(&bytes);
        }

        #[test]
        fn header_decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = PartitionHeader::decode(&bytes, &[0; 16], 0);
        }

        #[test]
        fn planned_geometry_is_valid(blocks in 300u64..10_000_000, journal in 4u64..256, per_onode in 4096u64..(1 << 20)) {
            if let Ok(g) = PartitionGeometry::plan(1, blocks, journal, per_onode) {
                prop_assert!(g.validate(blocks + 1).is_ok());
            }
        }
    }
}
