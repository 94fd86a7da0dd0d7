//! Log entries.
//!
//! ```text
//! 0  magic u32 "DPXL"      4  crc32c u32 (of the entry, this field excluded)
//! 8  seq u64               16 version u64      24 epoch u32    28 op u8
//! 29 flags u8              30 object length u16                32 data length u32
//! 36 pg u32                40 offset u64       48 client u64    56 tid u64
//! 64 object, then data, then snap u64 (flag 1 only); padded to 8 bytes
//! ```
//!
//! `snap` is the snapshot sequence the client wrote under (0: none, and
//! then not encoded, so an entry without one is laid out as before
//! snapshots existed): whoever applies the entry clones the object's head
//! first when the head was last changed under an older sequence.
//!
//! `client` and `tid` are the request id of the client operation the entry
//! came from (0, 0 for none): kept with the entry so that whichever OSD
//! holds it, as primary now or after a failover, recognises a resent request.
//!
//! Per operation, what `offset` and `data` carry:
//!
//! | op | offset | data |
//! | --- | --- | --- |
//! | write | where | the bytes |
//! | truncate | the new size | none |
//! | delete | 0 | none |
//! | set attribute | the name's length | name, then value |
//! | remove attribute | 0 | the name |
//! | create pre-allocated | the size | none |
//! | zero | where | the length, u64 little-endian (8 bytes) |
//! | copy up | where | the bytes (written only if the object is absent) |
//! | elided | 0 | none |
//!
//! An *elided* entry is what a backfill target gets of a write to an
//! object the backfill has not reached yet (docs/QOS.md, step 6): the
//! write's seq, object, request id and snapshot sequence, so that the
//! target's log and history stay whole, but not its effect, which the
//! backfill copies later. Applying it changes nothing.

use num_enum::TryFromPrimitive;

pub const HEADER_LEN: usize = 64;
const MAGIC: u32 = u32::from_le_bytes(*b"DPXL");
/// Entry flag: a snapshot sequence follows the data.
const FLAG_SNAP: u8 = 1;
/// Longest object name in an entry.
pub const MAX_OBJECT_LEN: usize = 256;

#[derive(Clone, Copy, Debug, PartialEq, Eq, TryFromPrimitive)]
#[repr(u8)]
pub enum OpKind {
    Write = 1,
    Truncate = 2,
    Delete = 3,
    SetAttr = 4,
    RemoveAttr = 5,
    /// Create the object pre-allocated, of `offset` bytes, if it is absent.
    CreatePreallocated = 6,
    /// Make the object's bytes from `offset` read as zeros without taking
    /// space (the length is the data: [`zero_length`]).
    Zero = 7,
    /// A write applied only if the object is absent when the entry is
    /// applied (a clone's copy-up of its parent's data).
    CopyUp = 8,
    /// Set omap entries (the data: `duplex_proto::omap` entries).
    OmapSet = 9,
    /// Remove omap entries by key (the data: `duplex_proto::omap` keys).
    OmapRemove = 10,
    /// Remove the omap entries in a key range (the data: a `duplex_proto::omap` range).
    OmapRemoveRange = 11,
    /// A dedup tier's chunk object gains a reference: the data is the
    /// reference (its first `offset` bytes, an omap key) then the chunk's
    /// bytes, written only if the object is absent (a duplicate writes
    /// nothing); both in one store batch.
    ChunkPut = 12,
    /// A chunk object loses the reference in the data, and is deleted if
    /// that was its last (`Op::DeleteIfOmapEmpty`).
    ChunkUnref = 13,
    /// The deduplication engine's change of a base object (the data:
    /// `duplex_proto::tier` actions): chunk map entries set and removed,
    /// bytes zeroed and written, in one store batch.
    TierUpdate = 14,
    /// A write this OSD takes by copy, not by applying it: a backfill
    /// target's entry for an object the walk has not reached (the module
    /// documentation). Applying it changes nothing; it has no data.
    Elided = 15,
}

/// A zero entry's (or request's) length, from its 8 bytes of data; `None`
/// for any other size.
pub fn zero_length(data: &[u8]) -> Option<u64> {
    data.try_into().ok().map(u64::from_le_bytes)
}

impl OpKind {
    /// The variant whose value is `value` (`None` for any other byte).
    pub fn from_u8(value: u8) -> Option<OpKind> {
        OpKind::try_from(value).ok()
    }

    /// Of an entry of this kind with `data_len` bytes of data and this
    /// `offset`: the bytes that go into its object's metadata (attributes,
    /// omap entries, a chunk map) rather than its data, at most. The store
    /// keeps an object's metadata in a chain of onode slots, so this is
    /// what applying the entry may add to that chain besides its extents.
    pub fn metadata_bytes(self, data_len: u64, offset: u64) -> u64 {
        match self {
            OpKind::SetAttr | OpKind::OmapSet | OpKind::TierUpdate => data_len,
            // The reference (an omap key) is the first `offset` bytes; the
            // rest is the chunk's data.
            OpKind::ChunkPut => offset.min(data_len),
            _ => 0,
        }
    }
}

/// Who asked for an operation: the client instance and its transaction id.
/// A resent request carries the same id. `client == 0`: no id.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId {
    pub client: u64,
    pub tid: u64,
}

impl RequestId {
    pub fn is_none(&self) -> bool {
        self.client == 0
    }
}

/// One logged operation. For `Truncate`, `offset` is the new size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub pg: u32,
    pub epoch: u32,
    pub version: u64,
    pub seq: u64,
    pub op: OpKind,
    pub object: Vec<u8>,
    pub offset: u64,
    pub data: Vec<u8>,
    pub request: RequestId,
    /// The snapshot sequence the client wrote under (0: none).
    pub snap: u64,
}

/// An entry by reference: what the OSD encodes straight from a request's
/// buffers, without first copying them into an [`Entry`].
#[derive(Clone, Copy, Debug)]
pub struct EntryRef<'a> {
    pub pg: u32,
    pub epoch: u32,
    pub version: u64,
    pub seq: u64,
    pub op: OpKind,
    pub object: &'a [u8],
    pub offset: u64,
    pub data: &'a [u8],
    pub request: RequestId,
    pub snap: u64,
}

impl<'a> EntryRef<'a> {
    /// This entry as a backfill target gets it when the backfill has not
    /// reached its object yet: [`OpKind::Elided`], with its seq, object,
    /// request id and snapshot sequence, without its data.
    pub fn elided(&self) -> EntryRef<'a> {
        EntryRef { op: OpKind::Elided, offset: 0, data: &[], ..*self }
    }

    /// The bytes the checksum covers: header, object, data and snap.
    fn used_len(&self) -> usize {
        HEADER_LEN + self.object.len() + self.data.len() + if self.snap != 0 { 8 } else { 0 }
    }

    pub fn encoded_len(&self) -> usize {
        self.used_len().div_ceil(8) * 8
    }

    pub fn encode(&self) -> Vec<u8> {
        assert!(self.object.len() <= MAX_OBJECT_LEN, "object name too long for the log");
        debug_assert!(u32::try_from(self.data.len()).is_ok(), "entry data of {} bytes", self.data.len());
        let mut out = vec![0u8; self.encoded_len()];
        out[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        out[8..16].copy_from_slice(&self.seq.to_le_bytes());
        out[16..24].copy_from_slice(&self.version.to_le_bytes());
        out[24..28].copy_from_slice(&self.epoch.to_le_bytes());
        out[28] = self.op as u8;
        out[29] = if self.snap != 0 { FLAG_SNAP } else { 0 };
        out[30..32].copy_from_slice(&(self.object.len() as u16).to_le_bytes());
        out[32..36].copy_from_slice(&(self.data.len() as u32).to_le_bytes());
        out[36..40].copy_from_slice(&self.pg.to_le_bytes());
        out[40..48].copy_from_slice(&self.offset.to_le_bytes());
        out[48..56].copy_from_slice(&self.request.client.to_le_bytes());
        out[56..64].copy_from_slice(&self.request.tid.to_le_bytes());
        let object_end = HEADER_LEN + self.object.len();
        out[HEADER_LEN..object_end].copy_from_slice(self.object);
        let data_end = object_end + self.data.len();
        out[object_end..data_end].copy_from_slice(self.data);
        if self.snap != 0 {
            out[data_end..data_end + 8].copy_from_slice(&self.snap.to_le_bytes());
        }
        let crc = checksum(&out, self.used_len());
        out[4..8].copy_from_slice(&crc.to_le_bytes());
        debug_assert!(
            EntryRef::decode(&out).is_some_and(|e| e.seq == self.seq && e.encoded_len() == out.len()),
            "an encoded entry does not decode to itself"
        );
        out
    }
}

impl Entry {
    pub fn as_ref(&self) -> EntryRef<'_> {
        EntryRef {
            pg: self.pg,
            epoch: self.epoch,
            version: self.version,
            seq: self.seq,
            op: self.op,
            object: &self.object,
            offset: self.offset,
            data: &self.data,
            request: self.request,
            snap: self.snap,
        }
    }

    pub fn encoded_len(&self) -> usize {
        self.as_ref().encoded_len()
    }

    pub fn encode(&self) -> Vec<u8> {
        self.as_ref().encode()
    }

    /// The entry at the start of `bytes`, if it is whole and its checksum
    /// holds; `None` otherwise (never a panic).
    pub fn decode(bytes: &[u8]) -> Option<Entry> {
        EntryRef::decode(bytes).map(|e| e.to_owned())
    }
}

impl<'a> EntryRef<'a> {
    /// The entry at the start of `bytes`, borrowing its object and data,
    /// if it is whole and its checksum holds; `None` otherwise (never a panic).
    pub fn decode(bytes: &'a [u8]) -> Option<EntryRef<'a>> {
        let header = bytes.get(..HEADER_LEN)?;
        let word = |at: usize| u32::from_le_bytes(header[at..at + 4].try_into().expect("4 bytes"));
        let long = |at: usize| u64::from_le_bytes(header[at..at + 8].try_into().expect("8 bytes"));
        if word(0) != MAGIC {
            return None;
        }
        let object_len = u16::from_le_bytes([header[30], header[31]]) as usize;
        let data_len = word(32) as usize;
        if object_len > MAX_OBJECT_LEN {
            return None;
        }
        let flags = header[29];
        if flags & !FLAG_SNAP != 0 {
            return None;
        }
        let data_end = HEADER_LEN.checked_add(object_len)?.checked_add(data_len)?;
        let used = if flags & FLAG_SNAP != 0 { data_end.checked_add(8)? } else { data_end };
        if used > bytes.len() || checksum(bytes, used) != word(4) {
            return None;
        }
        let op = OpKind::from_u8(header[28])?;
        let snap = if flags & FLAG_SNAP != 0 {
            u64::from_le_bytes(bytes[data_end..used].try_into().expect("8 bytes"))
        } else {
            0
        };
        if flags & FLAG_SNAP != 0 && snap == 0 {
            return None;
        }
        Some(EntryRef {
            pg: word(36),
            epoch: word(24),
            version: long(16),
            seq: long(8),
            op,
            object: &bytes[HEADER_LEN..HEADER_LEN + object_len],
            offset: long(40),
            data: &bytes[HEADER_LEN + object_len..data_end],
            request: RequestId { client: long(48), tid: long(56) },
            snap,
        })
    }

    pub fn to_owned(&self) -> Entry {
        Entry {
            pg: self.pg,
            epoch: self.epoch,
            version: self.version,
            seq: self.seq,
            op: self.op,
            object: self.object.to_vec(),
            offset: self.offset,
            data: self.data.to_vec(),
            request: self.request,
            snap: self.snap,
        }
    }
}

/// The seq field of an encoded entry, unverified.
pub fn peek_seq(bytes: &[u8]) -> Option<u64> {
    bytes.get(8..16).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
}

/// The PG field of an encoded entry, unverified: for routing an entry
/// before whoever handles it checks it.
pub fn peek_pg(bytes: &[u8]) -> Option<u32> {
    bytes.get(36..40).map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
}

fn checksum(bytes: &[u8], used: usize) -> u32 {
    debug_assert!((HEADER_LEN..=bytes.len()).contains(&used), "checksum over {used} of {} bytes", bytes.len());
    crc32c::crc32c_append(crc32c::crc32c(&bytes[..4]), &bytes[8..used])
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn entry_strategy() -> impl Strategy<Value = Entry> {
        (
            any::<u32>(),
            any::<u32>(),
            any::<u64>(),
            any::<u64>(),
            1u8..16,
            proptest::collection::vec(any::<u8>(), 0..40),
            any::<u64>(),
            proptest::collection::vec(any::<u8>(), 0..600),
            (any::<u64>(), any::<u64>(), prop_oneof![Just(0u64), any::<u64>()]),
        )
            .prop_map(|(pg, epoch, version, seq, op, object, offset, data, (client, tid, snap))| Entry {
                pg,
                epoch,
                version,
                seq,
                op: OpKind::from_u8(op).expect("every value in 1..16 is a kind"),
                object,
                offset,
                data,
                request: RequestId { client, tid },
                snap,
            })
    }

    #[test]
    fn op_kind_from_u8_inverts_the_discriminants() {
        for byte in 0..=u8::MAX {
            match OpKind::from_u8(byte) {
                Some(op) => assert_eq!(op as u8, byte),
                None => assert!(!(1..=15).contains(&byte), "{byte}"),
            }
            assert_eq!(OpKind::try_from(byte).ok(), OpKind::from_u8(byte));
        }
    }

    #[test]
    fn an_elided_entry_keeps_the_writes_place_and_id_but_not_its_effect() {
        let write = Entry {
            pg: 7,
            epoch: 3,
            version: 41,
            seq: 41,
            op: OpKind::Write,
            object: b"rbd_data.1.0000000000000002".to_vec(),
            offset: 8192,
            data: vec![0xab; 4096],
            request: RequestId { client: 9, tid: 12 },
            snap: 5,
        };
        let encoded = write.as_ref().elided().encode();
        assert_eq!(peek_seq(&encoded), Some(41));
        let elided = Entry::decode(&encoded).expect("decodes");
        assert_eq!(elided, Entry { op: OpKind::Elided, offset: 0, data: Vec::new(), ..write.clone() });
        assert!(elided.encoded_len() < 128, "no data travels: {} bytes", elided.encoded_len());
        assert_eq!(OpKind::Elided.metadata_bytes(0, 0), 0);
    }

    proptest! {
        #[test]
        fn round_trips_and_detects_any_flip(entry in entry_strategy(), flip in any::<usize>()) {
            let mut bytes = entry.encode();
            prop_assert_eq!(Entry::decode(&bytes), Some(entry.clone()));
            let used = entry.as_ref().used_len();
            let at = flip % used;
            if !(4..8).contains(&at) {
                bytes[at] ^= 0x10;
                prop_assert_ne!(Entry::decode(&bytes), Some(entry));
            }
        }

        #[test]
        fn decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..800)) {
            let _ = Entry::decode(&bytes);
        }
    }
}
