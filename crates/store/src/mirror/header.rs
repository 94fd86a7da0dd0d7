//! The mirror's own blocks at the end of each device: the dirty-region
//! bitmap and a header. The store's blocks, from offset 0, never reach them.
//!
//! ```text
//! meta_start (a block boundary past the store's last block):
//!   n blocks  dirty-region bitmap: 1 bit per region of `region_bytes`, set
//!             while the devices may differ there
//! the device's last block:
//!   1 block   header (crc32c-sealed), found without knowing the layout
//! ```
//! The layout is planned over the smaller device; on a larger one the
//! header sits past a gap.
//!
//! Header (4096 bytes, little-endian):
//! ```text
//! 0   magic "DPLXMIRR"   8   version u32        12  crc32c u32 (of the block, field excluded)
//! 16  mirror id [16]     32  this device's slot u8 (0 or 1)
//! 33  mode u8 (0 plain, 1 read-flush-split)   34  flush device's slot u8
//! 35  health u8 ×2 (0 in sync, 1 failed, 2 rebuilding)
//! 40  generation u64 (raised by every header write)
//! 48  region bytes u64   56  regions u64        64  store bytes u64
//! 72  meta start u64 (byte offset of the bitmap)
//! 80  member ids [16] ×2: each slot's device, named when it joined (made,
//!     or put in a failed one's place); zero: not named (an older header)
//! ```
//! Both devices get every header write; the one of the higher generation
//! tells the truth about roles and health (a failed device kept an older
//! one). A device whose own member id is not the one that header names for
//! its slot was replaced: it is stale, whatever its own header says.

use crate::codec::{seal, verify_seal, Reader, Writer};
use crate::error::{Result, StoreError};
use crate::BLOCK_SIZE;

pub const MIRROR_MAGIC: &[u8; 8] = b"DPLXMIRR";
pub const MIRROR_VERSION: u32 = 1;
const CRC_AT: usize = 12;

/// How the mirror uses its two devices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MirrorMode {
    /// Both devices take every write and every flush; reads go to either.
    Plain,
    /// Both take every write; only the flush device is flushed in a commit,
    /// and reads go to the other, which a flush never holds up.
    ReadFlushSplit,
}

impl MirrorMode {
    pub fn parse(word: &str) -> Option<MirrorMode> {
        match word {
            "plain" => Some(MirrorMode::Plain),
            "read-flush-split" => Some(MirrorMode::ReadFlushSplit),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            MirrorMode::Plain => "plain",
            MirrorMode::ReadFlushSplit => "read-flush-split",
        }
    }
}

/// One device's standing in the mirror.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Health {
    /// Holds every write the other holds (but for the dirty regions).
    InSync,
    /// Out: it failed, or was never filled. Nothing is read from it.
    Failed,
    /// Being filled from the other (`Mirror::rebuild`); takes writes, serves no reads.
    Rebuilding,
}

impl Health {
    fn code(self) -> u8 {
        match self {
            Health::InSync => 0,
            Health::Failed => 1,
            Health::Rebuilding => 2,
        }
    }

    fn from_code(code: u8) -> Result<Health> {
        match code {
            0 => Ok(Health::InSync),
            1 => Ok(Health::Failed),
            2 => Ok(Health::Rebuilding),
            _ => Err(StoreError::corrupt(format!("mirror header: device health {code}"))),
        }
    }
}

/// Where the mirror's blocks sit on devices of `device_bytes` (the smaller
/// of the two), with regions of `region_bytes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MirrorLayout {
    pub region_bytes: u64,
    pub regions: u64,
    /// Bytes the store may use, from offset 0.
    pub store_bytes: u64,
    /// The bitmap's offset.
    pub meta_start: u64,
    pub bitmap_blocks: u64,
}

impl MirrorLayout {
    pub fn plan(device_bytes: u64, region_bytes: u64) -> Result<MirrorLayout> {
        if !region_bytes.is_power_of_two() || region_bytes < BLOCK_SIZE as u64 {
            return Err(StoreError::invalid(format!("mirror region of {region_bytes} bytes: a power of two ≥ 4 KiB")));
        }
        let device_blocks = device_bytes / BLOCK_SIZE as u64;
        // Regions over the whole device: a few too many, never too few.
        let regions = (device_blocks * BLOCK_SIZE as u64).div_ceil(region_bytes);
        let bitmap_blocks = regions.div_ceil(BLOCK_SIZE as u64 * 8);
        let meta_blocks = 1 + bitmap_blocks;
        if device_blocks < meta_blocks + 16 {
            return Err(StoreError::invalid(format!("a mirror device of {device_bytes} bytes is too small")));
        }
        let meta_start = (device_blocks - meta_blocks) * BLOCK_SIZE as u64;
        Ok(MirrorLayout { region_bytes, regions, store_bytes: meta_start, meta_start, bitmap_blocks })
    }

    /// Where a device of `device_bytes` keeps its header: its last block.
    pub fn header_offset(device_bytes: u64) -> u64 {
        (device_bytes / BLOCK_SIZE as u64 - 1) * BLOCK_SIZE as u64
    }

    /// The byte offset of bitmap page `page`.
    pub fn page_offset(&self, page: u64) -> u64 {
        debug_assert!(page < self.bitmap_blocks, "bitmap page {page} of {}", self.bitmap_blocks);
        self.meta_start + page * BLOCK_SIZE as u64
    }

    /// The regions bytes `[offset, offset + len)` touch.
    pub fn regions_of(&self, offset: u64, len: u64) -> std::ops::Range<u64> {
        debug_assert!(len > 0 && offset + len <= self.store_bytes, "{offset}+{len} outside the store's bytes");
        offset / self.region_bytes..(offset + len).div_ceil(self.region_bytes)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MirrorHeader {
    pub id: [u8; 16],
    pub slot: u8,
    pub mode: MirrorMode,
    pub flush_slot: u8,
    pub health: [Health; 2],
    pub generation: u64,
    pub layout: MirrorLayout,
    pub members: [[u8; 16]; 2],
}

impl MirrorHeader {
    pub fn encode(&self) -> Vec<u8> {
        let mut buf = vec![0u8; BLOCK_SIZE];
        let mut w = Writer::new(&mut buf);
        w.bytes(MIRROR_MAGIC);
        w.u32(MIRROR_VERSION);
        w.u32(0);
        w.bytes(&self.id);
        w.u8(self.slot);
        w.u8(match self.mode {
            MirrorMode::Plain => 0,
            MirrorMode::ReadFlushSplit => 1,
        });
        w.u8(self.flush_slot);
        w.u8(self.health[0].code());
        w.u8(self.health[1].code());
        w.bytes(&[0; 3]);
        w.u64(self.generation);
        w.u64(self.layout.region_bytes);
        w.u64(self.layout.regions);
        w.u64(self.layout.store_bytes);
        w.u64(self.layout.meta_start);
        w.bytes(&self.members[0]);
        w.bytes(&self.members[1]);
        seal(&mut buf, CRC_AT);
        buf
    }

    /// Decodes a header block; `None` if the block holds none (never a
    /// mirror device), an error if it holds a damaged or inconsistent one.
    pub fn decode(buf: &[u8]) -> Result<Option<MirrorHeader>> {
        if buf.len() < BLOCK_SIZE || &buf[..8] != MIRROR_MAGIC {
            return Ok(None);
        }
        let buf = &buf[..BLOCK_SIZE];
        if !verify_seal(buf, CRC_AT) {
            return Err(StoreError::corrupt("mirror header: checksum mismatch"));
        }
        let mut r = Reader::new(buf, "mirror header");
        r.bytes(8)?;
        let version = r.u32()?;
        if version != MIRROR_VERSION {
            return Err(StoreError::corrupt(format!(
                "mirror header: version {version}, this build reads {MIRROR_VERSION}"
            )));
        }
        r.u32()?;
        let id = r.array::<16>()?;
        let slot = r.u8()?;
        let mode = match r.u8()? {
            0 => MirrorMode::Plain,
            1 => MirrorMode::ReadFlushSplit,
            other => return Err(StoreError::corrupt(format!("mirror header: mode {other}"))),
        };
        let flush_slot = r.u8()?;
        let health = [Health::from_code(r.u8()?)?, Health::from_code(r.u8()?)?];
        r.bytes(3)?;
        let generation = r.u64()?;
        let (region_bytes, regions, store_bytes, meta_start) = (r.u64()?, r.u64()?, r.u64()?, r.u64()?);
        let members = [r.array::<16>()?, r.array::<16>()?];
        if slot > 1 || flush_slot > 1 {
            return Err(StoreError::corrupt(format!("mirror header: slot {slot}, flush slot {flush_slot}")));
        }
        if health[flush_slot as usize] != Health::InSync {
            return Err(StoreError::corrupt("mirror header: the flush device is not in sync"));
        }
        // The smaller device's size, as `plan` was given it.
        let device_bytes = meta_start
            .checked_add(BLOCK_SIZE as u64)
            .and_then(|end| end.checked_add(regions.div_ceil(BLOCK_SIZE as u64 * 8).checked_mul(BLOCK_SIZE as u64)?))
            .ok_or_else(|| StoreError::corrupt("mirror header: sizes overflow"))?;
        if !meta_start.is_multiple_of(BLOCK_SIZE as u64) {
            return Err(StoreError::corrupt(format!("mirror header: bitmap at {meta_start}")));
        }
        let layout = MirrorLayout::plan(device_bytes, region_bytes)?;
        if layout
            != (MirrorLayout { region_bytes, regions, store_bytes, meta_start, bitmap_blocks: layout.bitmap_blocks })
        {
            return Err(StoreError::corrupt(format!(
                "mirror header: a layout of {regions} regions of {region_bytes} bytes, store {store_bytes}, \
                 meta at {meta_start} is not one this build makes"
            )));
        }
        Ok(Some(MirrorHeader { id, slot, mode, flush_slot, health, generation, layout, members }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn header() -> MirrorHeader {
        MirrorHeader {
            id: [7; 16],
            slot: 1,
            mode: MirrorMode::ReadFlushSplit,
            flush_slot: 0,
            health: [Health::InSync, Health::Rebuilding],
            generation: 42,
            layout: MirrorLayout::plan(1 << 30, 1 << 20).unwrap(),
            members: [[1; 16], [2; 16]],
        }
    }

    #[test]
    fn a_header_reads_back_and_a_zeroed_block_is_no_header() {
        let h = header();
        assert_eq!(MirrorHeader::decode(&h.encode()).unwrap(), Some(h));
        assert_eq!(MirrorHeader::decode(&[0u8; BLOCK_SIZE]).unwrap(), None);
        let layout = MirrorLayout::plan(1 << 30, 1 << 20).unwrap();
        assert_eq!(layout.regions, 1024);
        assert_eq!(layout.bitmap_blocks, 1);
        assert_eq!(layout.store_bytes, (1 << 30) - 2 * BLOCK_SIZE as u64);
        assert_eq!(layout.regions_of(0, 1), 0..1);
        assert_eq!(layout.regions_of((1 << 20) - 4096, 8192), 0..2);
    }

    proptest! {
        /// Hostile input: any change to a header block is refused or read
        /// as no header, never a panic, and never a different header.
        #[test]
        fn a_damaged_header_is_refused(at in 0usize..128, bit in 0u8..8) {
            let h = header();
            let mut block = h.encode();
            block[at] ^= 1 << bit;
            if let Ok(Some(decoded)) = MirrorHeader::decode(&block) {
                prop_assert_eq!(decoded, h);
            }
        }

        #[test]
        fn any_block_decodes_without_panic(mut bytes in proptest::collection::vec(any::<u8>(), BLOCK_SIZE)) {
            bytes[..8].copy_from_slice(MIRROR_MAGIC);
            let _ = MirrorHeader::decode(&bytes);
        }
    }
}
