//! The per-partition metadata journal: one record per committed batch.
//!
//! Records are physical redo: absolute bitmap values, per-block crc32c values
//! and whole onode slot images, so replaying a record twice, or replaying it
//! over pages that already hold its effect, is harmless. A record is padded
//! to the device sector size: a batch of 16 pre-allocated 4 KiB overwrites
//! costs one 512-byte journal write.
//!
//! The journal is a linear log from sector 0. A checkpoint writes every dirty
//! metadata page in place, flushes, and then writes the partition header with
//! the next sequence number, which empties the journal; appending restarts at
//! sector 0. Replay reads records from sector 0 while each one is valid and
//! carries the next expected sequence number: stale records from before the
//! last checkpoint carry smaller ones, a torn record fails its crc32c.
//!
//! Record format (little-endian):
//! ```text
//! 0  magic u32 = "DPXJ"   4  crc32c u32 (header and payload, field excluded)
//! 8  partition u32        12 payload length u32    16 sequence u64    24 fsid [16]
//! 40 payload: entries, each a tag byte then fields:
//!    1 SetBits   map u8 (0 slots, 1 alloc, 2 written), start u64, count u64, value u8
//!    2 DataWrite block u32, was written u8, old crc u32, new crc u32, zero from u16
//!    3 WriteSlot slot u32, image [512]
//!    4 Patch     block u32, at u16, len u16, base zero u8, new crc u32, bytes [len]
//!    5 Claim     chunk u32
//! ```
//! `Claim` makes a data chunk this partition's (layout.rs: why chunks). It
//! comes before every entry that touches the chunk: replay takes the chunk,
//! all clear, unless the partition already owns it. Chunks are given back
//! by checkpoints, never by a record.
//! `DataWrite` sets the block's written bit and crc. It carries the old state
//! so that mount can tell, for the last record, whether each block's data
//! landed (see `Partition::recover_last_record`). `zero from` (0: none) is
//! set when the batch grew the object past its old size inside this block:
//! bytes from there on were never visible, and if the new data did not land,
//! recovery zeroes them in the old contents so that they never become visible.
//!
//! `Patch` is a deferred write ([`crate::Op::WriteJournaled`]): `len` bytes
//! at `at` of data block `block`, carried whole by the record. The block is
//! written in place only by the next checkpoint, so every change to it since
//! the last checkpoint is in the journal, and replay rebuilds it from the
//! block on disk (or zeros, when `base zero`: the block held no data before)
//! whatever part of an interrupted checkpoint's write of it landed. `new crc`
//! is the block's crc32c once the record applied (every patch of the block in
//! one record carries the same).
use crate::blockio::AlignedBuf;
use crate::codec::{seal, verify_seal, Reader, Writer};
use crate::error::Result;
use crate::SLOT_SIZE;

const MAGIC: u32 = u32::from_le_bytes(*b"DPXJ");
pub const HEADER_LEN: usize = 40;
const CRC_AT: usize = 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BitmapKind {
    Slots = 0,
    Alloc = 1,
    Written = 2,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry {
    SetBits { map: BitmapKind, start: u64, count: u64, value: bool },
    DataWrite { block: u32, was_written: bool, old_crc: u32, new_crc: u32, zero_from: u16 },
    WriteSlot { slot: u32, image: Box<[u8; SLOT_SIZE]> },
    Patch { block: u32, at: u16, base_zero: bool, new_crc: u32, bytes: Vec<u8> },
    Claim { chunk: u32 },
}

impl Entry {
    fn encoded_len(&self) -> usize {
        match self {
            Entry::SetBits { .. } => 1 + 1 + 8 + 8 + 1,
            Entry::DataWrite { .. } => 1 + 4 + 1 + 4 + 4 + 2,
            Entry::WriteSlot { .. } => 1 + 4 + SLOT_SIZE,
            Entry::Patch { bytes, .. } => 1 + 4 + 2 + 2 + 1 + 4 + bytes.len(),
            Entry::Claim { .. } => 1 + 4,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Record {
    pub entries: Vec<Entry>,
}

impl Record {
    pub fn payload_len(&self) -> usize {
        self.entries.iter().map(Entry::encoded_len).sum()
    }

    /// Bytes on disk once padded to `sector`.
    pub fn padded_len(&self, sector: u32) -> usize {
        (HEADER_LEN + self.payload_len()).div_ceil(sector as usize) * sector as usize
    }

    pub fn encode(&self, seq: u64, fsid: &[u8; 16], partition: u32, sector: u32) -> AlignedBuf {
        debug_assert!(sector.is_power_of_two() && sector >= 512, "sector size {sector}");
        let payload_len = self.payload_len();
        debug_assert!(u32::try_from(payload_len).is_ok(), "payload of {payload_len} bytes");
        let mut buf = AlignedBuf::zeroed(self.padded_len(sector));
        let used = HEADER_LEN + payload_len;
        {
            let mut w = Writer::new(&mut buf[..used]);
            w.u32(MAGIC);
            w.u32(0);
            w.u32(partition);
            w.u32(payload_len as u32);
            w.u64(seq);
            w.bytes(fsid);
            for entry in &self.entries {
                match entry {
                    Entry::SetBits { map, start, count, value } => {
                        // Replay clears deferred images over start..=start+count-1.
                        debug_assert!(*count > 0, "an empty SetBits at {start}");
                        w.u8(1);
                        w.u8(*map as u8);
                        w.u64(*start);
                        w.u64(*count);
                        w.u8(*value as u8);
                    }
                    Entry::DataWrite { block, was_written, old_crc, new_crc, zero_from } => {
                        debug_assert!(
                            (*zero_from as usize) < crate::BLOCK_SIZE,
                            "zero_from {zero_from} past its block"
                        );
                        w.u8(2);
                        w.u32(*block);
                        w.u8(*was_written as u8);
                        w.u32(*old_crc);
                        w.u32(*new_crc);
                        w.u16(*zero_from);
                    }
                    Entry::WriteSlot { slot, image } => {
                        w.u8(3);
                        w.u32(*slot);
                        w.bytes(&image[..]);
                    }
                    Entry::Patch { block, at, base_zero, new_crc, bytes } => {
                        debug_assert!(*at as usize + bytes.len() <= crate::BLOCK_SIZE, "a patch stays in its block");
                        w.u8(4);
                        w.u32(*block);
                        w.u16(*at);
                        w.u16(bytes.len() as u16);
                        w.u8(*base_zero as u8);
                        w.u32(*new_crc);
                        w.bytes(bytes);
                    }
                    Entry::Claim { chunk } => {
                        w.u8(5);
                        w.u32(*chunk);
                    }
                }
            }
            debug_assert_eq!(w.pos(), used);
        }
        seal(&mut buf[..used], CRC_AT);
        debug_assert!(buf.len().is_multiple_of(sector as usize) && buf.len() >= used);
        debug_assert!(
            Record::decode(&buf, fsid, partition, seq, sector)
                .is_some_and(|(record, len)| len == buf.len() && record.entries.len() == self.entries.len()),
            "an encoded journal record does not decode to itself"
        );
        buf
    }

    /// Decodes the record at the start of `bytes` if it is valid, belongs to
    /// this store and partition, and carries `expected_seq`. Returns the
    /// record and its padded length; `None` marks the end of the journal.
    pub fn decode(
        bytes: &[u8],
        fsid: &[u8; 16],
        partition: u32,
        expected_seq: u64,
        sector: u32,
    ) -> Option<(Record, usize)> {
        let mut r = Reader::new(bytes, "journal record");
        if r.u32().ok()? != MAGIC {
            return None;
        }
        r.u32().ok()?;
        let record_partition = r.u32().ok()?;
        let payload_len = r.u32().ok()? as usize;
        let seq = r.u64().ok()?;
        let record_fsid: [u8; 16] = r.array().ok()?;
        if record_partition != partition || seq != expected_seq || record_fsid != *fsid {
            return None;
        }
        let used = HEADER_LEN.checked_add(payload_len)?;
        if used > bytes.len() || !verify_seal(&bytes[..used], CRC_AT) {
            return None;
        }
        let record = Self::decode_payload(&bytes[HEADER_LEN..used]).ok()?;
        Some((record, used.div_ceil(sector as usize) * sector as usize))
    }

    fn decode_payload(payload: &[u8]) -> Result<Record> {
        let mut r = Reader::new(payload, "journal payload");
        let mut entries = Vec::new();
        while r.remaining() > 0 {
            let entry = match r.u8()? {
                1 => {
                    let map = match r.u8()? {
                        0 => BitmapKind::Slots,
                        1 => BitmapKind::Alloc,
                        2 => BitmapKind::Written,
                        other => return Err(crate::StoreError::corrupt(format!("journal: bitmap kind {other}"))),
                    };
                    Entry::SetBits { map, start: r.u64()?, count: r.u64()?, value: r.u8()? != 0 }
                }
                2 => Entry::DataWrite {
                    block: r.u32()?,
                    was_written: r.u8()? != 0,
                    old_crc: r.u32()?,
                    new_crc: r.u32()?,
                    zero_from: r.u16()?,
                },
                3 => {
                    let slot = r.u32()?;
                    Entry::WriteSlot { slot, image: Box::new(r.array()?) }
                }
                4 => {
                    let block = r.u32()?;
                    let at = r.u16()?;
                    let len = r.u16()? as usize;
                    let base_zero = r.u8()? != 0;
                    let new_crc = r.u32()?;
                    if at as usize + len > crate::BLOCK_SIZE {
                        return Err(crate::StoreError::corrupt(format!(
                            "journal: a patch of {len} bytes at {at} passes its block"
                        )));
                    }
                    Entry::Patch { block, at, base_zero, new_crc, bytes: r.bytes(len)?.to_vec() }
                }
                5 => Entry::Claim { chunk: r.u32()? },
                other => return Err(crate::StoreError::corrupt(format!("journal: entry tag {other}"))),
            };
            entries.push(entry);
        }
        let record = Record { entries };
        // Each entry consumed exactly its encoded length, whatever the input.
        debug_assert_eq!(record.payload_len(), payload.len());
        Ok(record)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn entry_strategy() -> impl Strategy<Value = Entry> {
        prop_oneof![
            (0u8..3, any::<u64>(), 1..=u64::MAX, any::<bool>()).prop_map(|(m, start, count, value)| Entry::SetBits {
                map: [BitmapKind::Slots, BitmapKind::Alloc, BitmapKind::Written][m as usize],
                start,
                count,
                value
            }),
            (any::<u32>(), any::<bool>(), any::<u32>(), any::<u32>(), 0u16..crate::BLOCK_SIZE as u16).prop_map(
                |(block, was_written, old_crc, new_crc, zero_from)| Entry::DataWrite {
                    block,
                    was_written,
                    old_crc,
                    new_crc,
                    zero_from
                }
            ),
            (any::<u32>(), any::<u8>())
                .prop_map(|(slot, fill)| Entry::WriteSlot { slot, image: Box::new([fill; SLOT_SIZE]) }),
            (any::<u32>(), 0u16..4096, any::<bool>(), any::<u32>(), proptest::collection::vec(any::<u8>(), 0..64))
                .prop_map(|(block, at, base_zero, new_crc, mut bytes)| {
                    bytes.truncate(crate::BLOCK_SIZE - at as usize);
                    Entry::Patch { block, at, base_zero, new_crc, bytes }
                }),
            any::<u32>().prop_map(|chunk| Entry::Claim { chunk }),
        ]
    }

    proptest! {
        #[test]
        fn round_trips_and_rejects_other_seq(entries in proptest::collection::vec(entry_strategy(), 0..20), seq in 1u64..1000) {
            let record = Record { entries };
            let fsid = [3u8; 16];
            let bytes = record.encode(seq, &fsid, 2, 512);
            let (decoded, len) = Record::decode(&bytes, &fsid, 2, seq, 512).unwrap();
            prop_assert_eq!(decoded, record.clone());
            prop_assert_eq!(len, bytes.len());
            prop_assert!(Record::decode(&bytes, &fsid, 2, seq + 1, 512).is_none());
            prop_assert!(Record::decode(&bytes, &fsid, 1, seq, 512).is_none());
            prop_assert!(Record::decode(&bytes, &[4u8; 16], 2, seq, 512).is_none());
        }

        #[test]
        fn torn_record_is_rejected(entries in proptest::collection::vec(entry_strategy(), 1..20), flip in any::<usize>()) {
            let record = Record { entries };
            let mut bytes = record.encode(9, &[0; 16], 0, 512);
            let used = HEADER_LEN + record.payload_len();
            let at = flip % used;
            if at != CRC_AT && at != CRC_AT + 1 && at != CRC_AT + 2 && at != CRC_AT + 3 {
                bytes[at] ^= 0x01;
                prop_assert!(Record::decode(&bytes, &[0; 16], 0, 9, 512).is_none());
            }
        }

        #[test]
        fn decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..2000), seq in 0u64..3) {
            let _ = Record::decode(&bytes, &[0; 16], 0, seq, 512);
        }
    }
}
