//! On-disk layout. All integers are little-endian; all sizes below are in
//! 4 KiB blocks unless named otherwise.
//!
//! ```text
//! block 0              superblock (one block, crc32c-sealed)
//! per partition p, from geometry[p].start:
//!   2 blocks           partition headers A and B (alternating, crc-sealed, newest valid wins)
//!   journal            metadata journal: records padded to the device sector (journal.rs)
//!   slot bitmap        1 bit per onode slot: in use
//!   claims bitmap      1 bit per data chunk: this partition owns the chunk
//!   onode area         512-byte onode slots, 8 per block (onode.rs)
//! data region, shared by the partitions, in chunks of `chunk_blocks` data blocks:
//!   per chunk c:
//!     alloc page       1 bit per data block of the chunk: allocated to an object
//!     written page     1 bit per data block of the chunk: holds data (clear = reads as zeros)
//!     crc pages        u32 crc32c per data block (meaningful when written)
//!     data blocks      4 KiB each (the last chunk may be shorter)
//! ```
//!
//! **Why chunks.** Format 1 gave each partition its own data area, so one
//! partition (the placement groups that hash to it) filled while the store
//! as a whole had room: a 256 MiB OSD refused writes at 72% raw. Now every
//! data block belongs to a chunk, and a chunk to at most one partition at a
//! time: a partition claims a free chunk when its own are full (the claim is
//! a journal entry of the batch that first allocates in it) and gives a chunk
//! back at a checkpoint once it is empty (its claims bit cleared on disk
//! before any other partition can take it). A chunk carries its own bitmaps
//! and crcs, so the pages a partition writes are always its own and the
//! partitions still share no lock on the data path: the pool of free chunks
//! is the one shared, locked thing, taken only when a chunk changes hands.
//! Chunks are 4–128 MiB (a 64th of the store, rounded down to a power of
//! two), so at most a chunk per partition is stranded when the store fills.
//! Data block numbers are store-wide: a store holds at most 2^32 data blocks (16 TiB).
//!
//! Superblock (4096 bytes):
//! ```text
//! 0   magic "DPLXSTOR"      8   format version u32   12  crc32c u32 (of the block, field excluded)
//! 16  fsid [16]             32  device blocks u64    40  sector size u32
//! 44  partition count u32   48  created (unix seconds) u64
//! 56  data region: start u64, chunk blocks u64, chunk count u64, data blocks u64
//! 88  geometry[count]: 12 u64 each (start, blocks, then (start, blocks) of the 5 areas)
//! ```
//! The superblock is written last by mkfs: a store without a valid one was
//! never made, and mount refuses it.

use crate::codec::{seal, verify_seal, Reader, Writer};
use crate::error::{Result, StoreError};
use crate::{BLOCK_SIZE, MAX_PARTITIONS, SLOTS_PER_PAGE};

pub const SUPERBLOCK_MAGIC: &[u8; 8] = b"DPLXSTOR";
/// 2: data in chunks shared by the partitions (format 1 split it by partition).
pub const FORMAT_VERSION: u32 = 2;
const SUPERBLOCK_CRC_AT: usize = 12;
/// Bytes of the superblock before the partitions' geometry.
pub(crate) const SUPERBLOCK_HEADER_LEN: usize = 88;
/// u64s of geometry per partition in the superblock.
pub(crate) const GEOMETRY_WORDS: usize = 12;
const BITS_PER_PAGE: u64 = (BLOCK_SIZE * 8) as u64;
const CRCS_PER_PAGE: u64 = (BLOCK_SIZE / 4) as u64;
/// Chunk sizes, in data blocks: 4 MiB (one crc page) to 128 MiB (one bitmap page).
pub const MIN_CHUNK_BLOCKS: u64 = CRCS_PER_PAGE;
pub const MAX_CHUNK_BLOCKS: u64 = BITS_PER_PAGE;
/// Fewer data blocks than this in what would be the last chunk: not worth its metadata.
const MIN_LAST_CHUNK_BLOCKS: u64 = 16;

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

/// The data region: chunks of data blocks with their own bitmaps and crcs,
/// each owned by at most one partition. Data block numbers are store-wide.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DataRegion {
    /// First device block of chunk 0.
    pub start: u64,
    /// Data blocks of every chunk but the last (a power of two, at least 1024).
    pub chunk_blocks: u64,
    pub chunks: u64,
    /// Data blocks of the store: the last chunk holds what is left of them.
    pub data_blocks: u64,
}

impl DataRegion {
    /// Blocks a full chunk spans: two bitmap pages, its crc pages, its data.
    pub fn span(&self) -> u64 {
        2 + self.chunk_blocks / CRCS_PER_PAGE + self.chunk_blocks
    }

    pub fn end(&self) -> u64 {
        if self.chunks == 0 {
            return self.start;
        }
        let last = self.chunks - 1;
        self.chunk_start(last as u32)
            + 2
            + self.chunk_len(last as u32).div_ceil(CRCS_PER_PAGE)
            + self.chunk_len(last as u32)
    }

    pub fn chunk_start(&self, chunk: u32) -> u64 {
        debug_assert!((chunk as u64) < self.chunks, "chunk {chunk} of {}", self.chunks);
        self.start + chunk as u64 * self.span()
    }

    /// Data blocks in `chunk`.
    pub fn chunk_len(&self, chunk: u32) -> u64 {
        debug_assert!((chunk as u64) < self.chunks, "chunk {chunk} of {}", self.chunks);
        self.chunk_blocks.min(self.data_blocks - chunk as u64 * self.chunk_blocks)
    }

    /// The first data block of `chunk`.
    pub fn first_block(&self, chunk: u32) -> u64 {
        chunk as u64 * self.chunk_blocks
    }

    pub fn chunk_of(&self, block: u64) -> u32 {
        debug_assert!(block < self.data_blocks, "data block {block} of {}", self.data_blocks);
        (block / self.chunk_blocks) as u32
    }

    /// Device block of the allocation (`which` 0) or written (1) page of `chunk`.
    pub fn bitmap_page(&self, chunk: u32, which: u64) -> u64 {
        debug_assert!(which < 2);
        self.chunk_start(chunk) + which
    }

    /// Device block of the crc page covering data block `block`, and the byte offset in it.
    pub fn crc_location(&self, block: u64) -> (u64, usize) {
        let chunk = self.chunk_of(block);
        let within = block - self.first_block(chunk);
        (self.chunk_start(chunk) + 2 + within / CRCS_PER_PAGE, (within % CRCS_PER_PAGE) as usize * 4)
    }

    /// Device block holding data block `block`.
    pub fn data_block(&self, block: u64) -> u64 {
        let chunk = self.chunk_of(block);
        let within = block - self.first_block(chunk);
        self.chunk_start(chunk) + 2 + self.chunk_len(chunk).div_ceil(CRCS_PER_PAGE) + within
    }

    /// The region that fits in `blocks` device blocks from `start`.
    pub fn plan(start: u64, blocks: u64) -> DataRegion {
        let sixty_fourth = (blocks / 64).max(1);
        let chunk_blocks = (1u64 << (63 - sixty_fourth.leading_zeros())).clamp(MIN_CHUNK_BLOCKS, MAX_CHUNK_BLOCKS);
        let mut region = DataRegion { start, chunk_blocks, chunks: 0, data_blocks: 0 };
        let full = blocks / region.span();
        let rest = blocks - full * region.span();
        // The last chunk: the most data blocks whose bitmaps and crcs fit too.
        let last = (0..=rest.saturating_sub(2))
            .rev()
            .find(|&data| 2 + data.div_ceil(CRCS_PER_PAGE) + data <= rest)
            .unwrap_or(0)
            .min(chunk_blocks);
        region.chunks = full + u64::from(last >= MIN_LAST_CHUNK_BLOCKS);
        region.data_blocks = full * chunk_blocks + if last >= MIN_LAST_CHUNK_BLOCKS { last } else { 0 };
        debug_assert!(region.end() <= start + blocks, "the region overruns its {blocks} blocks: {region:?}");
        region
    }

    fn validate(&self, after: u64, device_blocks: u64) -> Result<()> {
        let bad = |what: &str| Err(StoreError::corrupt(format!("data region: {what}: {self:?}")));
        if self.start < after {
            return bad("overlaps the partitions");
        }
        if !self.chunk_blocks.is_power_of_two() || !(MIN_CHUNK_BLOCKS..=MAX_CHUNK_BLOCKS).contains(&self.chunk_blocks) {
            return bad("chunk size");
        }
        if self.chunks == 0
            || self.chunks > u32::MAX as u64
            || self.data_blocks > u32::MAX as u64
            || self.data_blocks <= (self.chunks - 1) * self.chunk_blocks
            || self.data_blocks > self.chunks * self.chunk_blocks
        {
            return bad("chunk count and data blocks disagree");
        }
        if self.start.checked_add(self.chunks.saturating_mul(self.span())).is_none() || self.end() > device_blocks {
            return bad("passes the device's end");
        }
        Ok(())
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
    pub claims: Area,
    pub onodes: Area,
}

impl PartitionGeometry {
    fn areas(&self) -> [Area; 5] {
        [self.headers, self.journal, self.slot_bitmap, self.claims, self.onodes]
    }

    pub fn slot_count(&self) -> u64 {
        self.onodes.blocks * SLOTS_PER_PAGE as u64
    }

    /// Lays out a partition's metadata from `start`: a journal of
    /// `journal_blocks`, `slots` onode slots and a claims bit per chunk.
    pub fn plan(start: u64, journal_blocks: u64, slots: u64, chunks: u64) -> PartitionGeometry {
        let slots = slots.max(SLOTS_PER_PAGE as u64);
        let mut next = start;
        let mut take = |n: u64| {
            let area = Area { start: next, blocks: n };
            next += n;
            area
        };
        let mut geometry = PartitionGeometry {
            start,
            blocks: 0,
            headers: take(2),
            journal: take(journal_blocks),
            slot_bitmap: take(slots.div_ceil(BITS_PER_PAGE)),
            claims: take(chunks.div_ceil(BITS_PER_PAGE).max(1)),
            onodes: take(slots.div_ceil(SLOTS_PER_PAGE as u64)),
        };
        geometry.blocks = next - start;
        geometry
    }

    /// Areas are in order, contiguous, inside the partition and the device, and big enough.
    pub fn validate(&self, device_blocks: u64, chunks: u64) -> Result<()> {
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
            || self.journal.blocks < 4
            || self.slot_bitmap.blocks * BITS_PER_PAGE < self.slot_count()
            || self.claims.blocks * BITS_PER_PAGE < chunks
            || self.slot_count() > u32::MAX as u64
        {
            return bad("metadata area too small for what it describes");
        }
        Ok(())
    }
}

/// Parameters of `mkfs`.
#[derive(Clone, Debug)]
pub struct MkfsOptions {
    /// Number of partitions (one non-priority thread each).
    pub partitions: u32,
    /// Journal size per partition; `None` picks 1/128 of a partition's
    /// share of the data, 1..=64 MiB.
    pub journal_bytes: Option<u64>,
    /// Data bytes per onode slot: a partition has slots for its share of
    /// the data divided by this (twice that share, since data is shared
    /// and one partition may hold more than its share).
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
    pub data: DataRegion,
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
        let count = options.partitions as u64;
        let usable = device_blocks.saturating_sub(1);
        let share = usable / count;
        let journal_bytes =
            options.journal_bytes.unwrap_or_else(|| (share * BLOCK_SIZE as u64 / 128).clamp(1 << 20, 64 << 20));
        let journal_blocks = journal_bytes.div_ceil(BLOCK_SIZE as u64).max(4);
        // Metadata is sized before the region is: from an upper bound of it.
        let chunks_bound = usable.div_ceil(MIN_CHUNK_BLOCKS);
        let slots = (2 * share * BLOCK_SIZE as u64)
            .div_ceil(options.bytes_per_onode)
            .min((usable * BLOCK_SIZE as u64).div_ceil(options.bytes_per_onode));
        let mut partitions = Vec::with_capacity(count as usize);
        let mut next = 1u64;
        for _ in 0..count {
            let g = PartitionGeometry::plan(next, journal_blocks, slots, chunks_bound);
            next = g.start + g.blocks;
            partitions.push(g);
        }
        if next >= device_blocks {
            return Err(StoreError::invalid(format!(
                "{device_bytes} bytes are too small for {count} partitions' metadata ({journal_blocks}-block journals)"
            )));
        }
        let data = DataRegion::plan(next, device_blocks - next);
        if data.chunks == 0 || data.data_blocks < 16 * count {
            return Err(StoreError::invalid(format!(
                "{device_bytes} bytes leave no room for data after {count} partitions' metadata"
            )));
        }
        if data.data_blocks > u32::MAX as u64 {
            return Err(StoreError::invalid(
                "a store may hold at most 2^32 data blocks (16 TiB); make two OSDs of the device",
            ));
        }
        assert!(data.end() <= device_blocks, "the planned data region passes the device's end");
        let created_unix =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        let superblock =
            Superblock { version: FORMAT_VERSION, fsid, device_blocks, sector_size, created_unix, data, partitions };
        superblock.validate()?;
        Ok(superblock)
    }

    fn validate(&self) -> Result<()> {
        let mut end = 1;
        for g in &self.partitions {
            g.validate(self.device_blocks, self.data.chunks)?;
            if g.start < end {
                return Err(StoreError::corrupt("superblock: partitions overlap"));
            }
            end = g.start + g.blocks;
        }
        self.data.validate(end, self.device_blocks)
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
        w.u64(self.data.start);
        w.u64(self.data.chunk_blocks);
        w.u64(self.data.chunks);
        w.u64(self.data.data_blocks);
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
                "superblock format version {version}; this build reads version {FORMAT_VERSION} \
                 (format 1 split data by partition; drain the OSD and make it again with mkfs)"
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
        let data = DataRegion { start: r.u64()?, chunk_blocks: r.u64()?, chunks: r.u64()?, data_blocks: r.u64()? };
        let mut partitions = Vec::with_capacity(count as usize);
        for _ in 0..count {
            let start = r.u64()?;
            let blocks = r.u64()?;
            let mut areas = [Area::default(); 5];
            for area in areas.iter_mut() {
                *area = Area { start: r.u64()?, blocks: r.u64()? };
            }
            let [headers, journal, slot_bitmap, claims, onodes] = areas;
            partitions.push(PartitionGeometry { start, blocks, headers, journal, slot_bitmap, claims, onodes });
        }
        let superblock = Superblock { version, fsid, device_blocks, sector_size, created_unix, data, partitions };
        superblock.validate()?;
        Ok(superblock)
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
    fn the_data_region_uses_nearly_all_blocks_and_maps_blocks_inside_their_chunk() {
        for blocks in [70_000u64, 262_144, 1_000_003, 40_000_000] {
            let region = DataRegion::plan(100, blocks);
            assert!(region.end() <= 100 + blocks, "{region:?}");
            assert!(region.data_blocks as f64 > 0.99 * blocks as f64, "{region:?}");
            assert!(region.chunks >= 16 || region.chunk_blocks == MIN_CHUNK_BLOCKS, "{region:?}");
            region.validate(100, 100 + blocks).unwrap();
            let last = region.data_blocks - 1;
            for block in [0, 1, 1023, 1024, region.chunk_blocks - 1, region.chunk_blocks, last] {
                if block >= region.data_blocks {
                    continue;
                }
                let chunk = region.chunk_of(block);
                let data = region.data_block(block);
                let (crc_page, at) = region.crc_location(block);
                assert!(data >= region.chunk_start(chunk) + 2 && data < region.end(), "{block}: {data}");
                assert!(
                    crc_page > region.bitmap_page(chunk, 1) && crc_page < region.data_block(region.first_block(chunk))
                );
                assert!(at < BLOCK_SIZE);
            }
            assert_eq!(region.data_block(last) + 1, region.end(), "the last data block ends the region");
        }
    }

    #[test]
    fn partitions_share_the_data_and_their_metadata_stays_small() {
        let options = MkfsOptions { partitions: 4, ..Default::default() };
        let sb = Superblock::plan(256 << 20, 512, &options, [1; 16]).unwrap();
        let device = sb.device_blocks;
        assert!(sb.data.data_blocks as f64 > 0.95 * device as f64, "{sb:?}");
        assert_eq!(sb.data.chunk_blocks, MIN_CHUNK_BLOCKS);
        assert!(sb.data.chunks >= 30);
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
        fn planned_stores_are_valid(mib in 8u64..40_000, partitions in 1u32..8, per_onode in 4096u64..(1 << 20)) {
            let options = MkfsOptions { partitions, bytes_per_onode: per_onode, ..Default::default() };
            if let Ok(sb) = Superblock::plan(mib << 20, 512, &options, [3; 16]) {
                prop_assert!(sb.validate().is_ok());
                prop_assert!(sb.data.end() <= sb.device_blocks);
                prop_assert_eq!(Superblock::decode(&sb.encode()).unwrap(), sb);
            }
        }
    }
}
