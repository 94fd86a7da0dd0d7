//! The OSD's messages: client operations and their replies, and the
//! replication acknowledgement. (A replication request's payload is the
//! operation-log entry itself, in the log's own checksummed encoding, so the
//! replica logs exactly the bytes the primary logged.)
//!
//! Fixed little-endian layouts, decoded as [`Bytes`] slices of the frame
//! payload: object data is never copied on the way in. Every decoder
//! returns an error on malformed input and never panics.
//!
//! ```text
//! OpRequest  0 kind u8   1 flags u8   2 object length u16   4 pool u32   8 pg u32
//!            12 length u32 (bytes to read; else the data's length)   16 map epoch u64
//!            24 offset u64   32 client u64   40 [snap u64, when flags & SNAP]   object   then data
//! OpReply    0 status u8   1..8 reserved   8 map epoch u64   16 data (reads) or error text
//! RepReply   0 status u8   1..4 reserved   4 pg u32   8 seq u64
//! ```
//!
//! `snap` (flag [`FLAG_SNAP`]; absent: 0) is, on a mutation, the newest
//! snapshot sequence of the image the object belongs to: an object whose
//! head was last changed under an older sequence is cloned first
//! (copy-on-write). On a read, stat or attribute read it names the
//! snapshot to read at. An object name never holds a zero byte, and an
//! attribute name never starts with one: those are the OSD's own names
//! (snapshot clones are `name \0 seq`, beside their head; the clone
//! bookkeeping is in attributes).
//!
//! A request's id is (client, the frame's transaction id): a client that
//! resends a request (after a reconnect or to a new primary) keeps both, and
//! the OSD answers a mutation it has already applied without applying it
//! again. Client 0 opts out.
//!
//! Per kind, what `offset`, `length` and the data carry, and what an `Ok`
//! reply's data holds:
//!
//! | kind | offset | length / data | reply data |
//! | --- | --- | --- | --- |
//! | read | where | bytes to read | the bytes (fewer past the end) |
//! | write | where | the bytes | none |
//! | truncate | the new size | none | none |
//! | delete | 0 | none | none |
//! | stat | 0 | none | [`ObjectStat`] |
//! | get attribute | 0 | the name | the value |
//! | set attribute | the name's length | name, then value | none |
//! | remove attribute | 0 | the name | none |
//! | list attributes | 0 | none | [`encode_attrs`] |
//! | create pre-allocated | the size | none | none (absent object only) |
//! | list objects | 0 | a name prefix | [`encode_names`]; the object field is the cursor (may be empty) |
//! | list snapshots | 0 | none | [`SnapList`]: the head and its clones |
//! | trim clone | the clone's sequence | none | none (a clone no snapshot needs is deleted) |
//! | diff | from snapshot (0: from nothing) | none | [`SnapDiff`] from there to `snap` (0: the head) |
//! | copy up | where | the bytes | none (written only if the object is absent) |

use bytes::{BufMut, Bytes, BytesMut};
use num_enum::TryFromPrimitive;

use crate::frame::{Frame, MessageType};

/// Longest object name: the store's 200-byte key less the 4-byte PG prefix.
pub const MAX_OBJECT_NAME: usize = 196;
/// Largest read or write in one request.
pub const MAX_IO_BYTES: u32 = 4 << 20;

/// Names one list-objects reply returns at most.
pub const LIST_LIMIT: usize = 1024;

const REQUEST_HEADER: usize = 40;
/// Request flag: a snapshot sequence follows the header.
pub const FLAG_SNAP: u8 = 1;
/// The byte the OSD's own names use (snapshot clones, attributes it
/// keeps): never in a client's object name, nor first in an attribute name.
pub const RESERVED_NAME_BYTE: u8 = 0;
/// Longest name of an object that can have snapshots: a clone's name adds
/// nine bytes to it (see the OSD's `snaps` module).
pub const MAX_SNAP_OBJECT_NAME: usize = MAX_OBJECT_NAME - 9;
const REPLY_HEADER: usize = 16;
const REP_REPLY_LEN: usize = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, TryFromPrimitive)]
#[repr(u8)]
pub enum OpKind {
    Read = 1,
    Write = 2,
    /// Sets the object's size to `offset`.
    Truncate = 3,
    Delete = 4,
    Stat = 5,
    GetAttr = 6,
    SetAttr = 7,
    RemoveAttr = 8,
    ListAttrs = 9,
    /// Creates the object with `offset` bytes reserved in one extent, if absent.
    CreatePreallocated = 10,
    /// Names in the PG after the cursor (the object field) that start with
    /// the prefix (the data), in order.
    List = 11,
    /// Makes the object's bytes from `offset` read as zeros without taking
    /// space (the length, u64 little-endian, is the 8 bytes of data): held
    /// blocks zeroed in place, holes left, the size kept. Not refused on a
    /// full cluster (a TRIM of part of an object).
    Zero = 12,
    /// The head's and its snapshot clones' sequences ([`SnapList`]).
    ListSnaps = 13,
    /// Deletes the object's clone for snapshots up to `offset` (one no
    /// live snapshot needs any more).
    TrimClone = 14,
    /// The byte ranges in which the object differs between snapshot
    /// `offset` (0: an absent object) and snapshot `snap` (0: the head),
    /// from the store's block maps, without reading data ([`SnapDiff`]).
    Diff = 15,
    /// A write that takes effect only if the object does not exist: a
    /// cloned image copies its parent's data up before its first change
    /// of an object, however many writers race to do it.
    CopyUp = 16,
    /// A long poll: answered once a mutation of the object is accepted
    /// (any but an attribute change whose name does not start with the
    /// data, a prefix), or after `offset` milliseconds (at most
    /// [`MAX_WATCH_MS`]). The reply's data is `[1]` when a mutation woke
    /// it, `[0]` when the time ran out. Who watches an image's header
    /// learns of a snapshot at once instead of at its next renewal.
    Watch = 17,
    /// Trims, in the background, the clones no live snapshot reads of the
    /// PG's objects whose names start with the object field (an image's
    /// prefix; like a listing's, it is not one of the PG's objects). The
    /// data is the image's live snapshot ids, u64 little-endian each, at
    /// most [`MAX_LIVE_SNAPS`]. Answered once queued: `snap remove` sends
    /// one to every PG's primary and returns.
    TrimSnaps = 18,
    /// An erasure-coded PG's primary reads `length` bytes at `offset` of
    /// the receiving member's shard of the object (shard coordinates; past
    /// the shard's end, or an absent object, reads zeros). Served by any
    /// member of the PG's active interval, in the order it took the
    /// primary's earlier entries on that connection.
    ShardRead = 19,
    /// Sets omap entries (the data: [`crate::omap`] entries, sorted, at
    /// most [`crate::omap::MAX_BYTES`]), creating the object if needed.
    /// The primary cannot see the stored omap's total: a set that would
    /// take it past [`crate::omap::MAX_BYTES`] is dropped when applied,
    /// loudly (an error log and `duplex_osd_dropped_entries_total`), as an
    /// attribute past its object's budget is. Keep omaps well within it.
    OmapSet = 20,
    /// Removes the omap entries of the keys in the data ([`crate::omap`] keys).
    OmapRemove = 21,
    /// Removes the omap entries in the key range of the data
    /// ([`crate::omap`] range; an empty start and no end clear it).
    OmapRemoveRange = 22,
    /// The omap entries of the keys in the data ([`crate::omap`] keys);
    /// the reply's data holds those found ([`crate::omap`] entries).
    OmapGet = 23,
    /// At most `offset` (1 to [`MAX_OMAP_LIST`]) omap entries in the key
    /// range of the data, in key order ([`crate::omap`] entries). Fewer
    /// than asked: the range holds no more.
    OmapList = 24,
    /// A dedup tier's chunk object gains a reference (docs/DEDUP.md): the
    /// data is the reference (its first `offset` bytes: 1 to 255, an omap
    /// key) then the chunk (1 byte to [`MAX_CHUNK`]), written only if the
    /// object is absent, so a duplicate costs no data write. Idempotent.
    ChunkPut = 25,
    /// A chunk object loses the reference in the data (1 to 255 bytes),
    /// and is deleted if that was its last. Idempotent.
    ChunkUnref = 26,
    /// A deduplicated pool's read (docs/DEDUP.md): `length` bytes at
    /// `offset`, with the chunk map entries of the chunks they overlap and
    /// the object's generation ([`crate::tier::TierReadReply`]). The
    /// bytes of a chunk whose entry is not cached are in its chunk object.
    TierRead = 27,
    /// The deduplication engine's change of a base object: chunk map
    /// entries set or removed, bytes zeroed or written back, all in one
    /// log entry, applied only if the object is as the guard says
    /// ([`crate::tier`]; a stale guard is answered `Invalid`, naming it).
    TierUpdate = 28,
}

/// The largest chunk a [`OpKind::ChunkPut`] carries.
pub const MAX_CHUNK: usize = 1 << 20;

/// Omap entries an [`OpKind::OmapList`] returns at most.
pub const MAX_OMAP_LIST: u64 = 1024;

/// Live snapshot ids a [`OpKind::TrimSnaps`] carries at most.
pub const MAX_LIVE_SNAPS: usize = 4096;

/// The longest a [`OpKind::Watch`] waits.
pub const MAX_WATCH_MS: u64 = 30_000;

impl OpKind {
    /// The variant whose value is `value` (`None` for any other byte).
    pub fn from_u8(value: u8) -> Option<OpKind> {
        OpKind::try_from(value).ok()
    }
}

impl OpKind {
    /// Reads an object's bytes: a client's, or a member's shard of an
    /// erasure-coded object.
    pub fn is_data_read(self) -> bool {
        matches!(self, OpKind::Read | OpKind::ShardRead)
    }

    /// Changes the object (goes through the log and the replicas).
    pub fn is_mutation(self) -> bool {
        matches!(
            self,
            OpKind::Write
                | OpKind::Truncate
                | OpKind::Delete
                | OpKind::SetAttr
                | OpKind::RemoveAttr
                | OpKind::CreatePreallocated
                | OpKind::Zero
                | OpKind::TrimClone
                | OpKind::CopyUp
                | OpKind::OmapSet
                | OpKind::OmapRemove
                | OpKind::OmapRemoveRange
                | OpKind::ChunkPut
                | OpKind::ChunkUnref
                | OpKind::TierUpdate
        )
    }

    /// Carries data after the object name (its length in `length`).
    pub fn carries_data(self) -> bool {
        matches!(
            self,
            OpKind::Write
                | OpKind::GetAttr
                | OpKind::SetAttr
                | OpKind::RemoveAttr
                | OpKind::List
                | OpKind::Zero
                | OpKind::CopyUp
                | OpKind::Watch
                | OpKind::TrimSnaps
                | OpKind::OmapSet
                | OpKind::OmapRemove
                | OpKind::OmapRemoveRange
                | OpKind::OmapGet
                | OpKind::OmapList
                | OpKind::ChunkPut
                | OpKind::ChunkUnref
                | OpKind::TierUpdate
        )
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, TryFromPrimitive)]
#[repr(u8)]
pub enum Status {
    Ok = 0,
    /// The object does not exist.
    NotFound = 1,
    /// This OSD is not the PG's primary at its map epoch (in the reply):
    /// fetch a newer map and resend.
    WrongOsd = 2,
    /// Transient (a replica is unreachable, the OSD is starting): resend later.
    Retry = 3,
    /// The request is malformed or out of limits; resending will not help.
    Invalid = 4,
    /// The store failed; the text says how.
    Io = 5,
    /// A member of the PG is full: the write is refused (ENOSPC); deletes,
    /// truncates and discards still go on.
    NoSpace = 6,
}

impl Status {
    /// The variant whose value is `value` (`None` for any other byte).
    pub fn from_u8(value: u8) -> Option<Status> {
        Status::try_from(value).ok()
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("message is {got} bytes, shorter than its {need}-byte layout")]
    Short { need: usize, got: usize },
    #[error("unknown {what} {value}")]
    Unknown { what: &'static str, value: u8 },
    #[error("object name of {0} bytes (limit {MAX_OBJECT_NAME}, at least 1)")]
    ObjectName(usize),
    #[error("I/O of {0} bytes exceeds the {MAX_IO_BYTES}-byte limit")]
    TooLarge(u64),
    #[error("{0}")]
    Inconsistent(&'static str),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpRequest {
    pub kind: OpKind,
    pub pool: u32,
    pub pg: u32,
    /// The client's map epoch when it chose this OSD.
    pub map_epoch: u64,
    pub object: Bytes,
    pub offset: u64,
    /// Bytes to read (reads); other kinds carry `data` instead.
    pub length: u32,
    pub data: Bytes,
    /// The client instance (0: none); with the frame's transaction id, the request id.
    pub client: u64,
    /// Mutations: the image's snapshot sequence (0: none); reads: the
    /// snapshot to read at (0: the head).
    pub snap: u64,
}

impl OpRequest {
    pub fn to_frame(&self, transaction_id: u64) -> Frame {
        let mut out = BytesMut::with_capacity(REQUEST_HEADER + 8 + self.object.len() + self.data.len());
        out.put_u8(self.kind as u8);
        out.put_u8(if self.snap != 0 { FLAG_SNAP } else { 0 });
        out.put_u16_le(self.object.len() as u16);
        out.put_u32_le(self.pool);
        out.put_u32_le(self.pg);
        let length = if self.kind.carries_data() { self.data.len() as u32 } else { self.length };
        out.put_u32_le(length);
        out.put_u64_le(self.map_epoch);
        out.put_u64_le(self.offset);
        out.put_u64_le(self.client);
        if self.snap != 0 {
            out.put_u64_le(self.snap);
        }
        out.put_slice(&self.object);
        out.put_slice(&self.data);
        Frame::new(MessageType::OsdOp, transaction_id, out.freeze())
    }

    pub fn decode(payload: &Bytes) -> Result<OpRequest, DecodeError> {
        if payload.len() < REQUEST_HEADER {
            return Err(DecodeError::Short { need: REQUEST_HEADER, got: payload.len() });
        }
        let kind = OpKind::from_u8(payload[0]).ok_or(DecodeError::Unknown { what: "operation", value: payload[0] })?;
        let object_len = u16::from_le_bytes([payload[2], payload[3]]) as usize;
        // A list's object field is its cursor, empty at the start.
        if (object_len == 0 && kind != OpKind::List) || object_len > MAX_OBJECT_NAME {
            return Err(DecodeError::ObjectName(object_len));
        }
        let length = le_u32(payload, 12);
        if length > MAX_IO_BYTES {
            return Err(DecodeError::TooLarge(length as u64));
        }
        let flags = payload[1];
        if flags & !FLAG_SNAP != 0 {
            return Err(DecodeError::Unknown { what: "request flags", value: flags });
        }
        let object_start = if flags & FLAG_SNAP != 0 { REQUEST_HEADER + 8 } else { REQUEST_HEADER };
        let object_end = object_start + object_len;
        if payload.len() < object_end {
            return Err(DecodeError::Short { need: object_end, got: payload.len() });
        }
        let snap = if flags & FLAG_SNAP != 0 { le_u64(payload, REQUEST_HEADER) } else { 0 };
        if flags & FLAG_SNAP != 0 && snap == 0 {
            return Err(DecodeError::Inconsistent("a snapshot flag with snapshot 0"));
        }
        if snap != 0 && (matches!(kind, OpKind::List | OpKind::TrimClone) || object_len > MAX_SNAP_OBJECT_NAME) {
            return Err(DecodeError::Inconsistent("a snapshot on a listing, or on a name too long to have snapshots"));
        }
        if payload[object_start..object_end].contains(&RESERVED_NAME_BYTE) {
            return Err(DecodeError::Inconsistent("object names with a zero byte are reserved"));
        }
        let data = payload.slice(object_end..);
        if kind.carries_data() && data.len() != length as usize {
            return Err(DecodeError::Inconsistent("length differs from the data carried"));
        }
        if !kind.carries_data() && !data.is_empty() {
            return Err(DecodeError::Inconsistent("this kind of request carries no data"));
        }
        let offset = le_u64(payload, 24);
        if kind == OpKind::SetAttr && offset > data.len() as u64 {
            return Err(DecodeError::Inconsistent("attribute name longer than the data"));
        }
        let attr_name_first = match kind {
            OpKind::SetAttr if offset > 0 => data.first(),
            OpKind::GetAttr | OpKind::RemoveAttr => data.first(),
            _ => None,
        };
        if attr_name_first == Some(&RESERVED_NAME_BYTE) {
            return Err(DecodeError::Inconsistent("attribute names starting with a zero byte are reserved"));
        }
        match kind {
            OpKind::OmapSet => drop(crate::omap::decode_entries_to_set(&data)?),
            OpKind::OmapRemove | OpKind::OmapGet => drop(crate::omap::decode_keys(&data)?),
            OpKind::OmapRemoveRange => drop(crate::omap::decode_range(&data)?),
            OpKind::OmapList => {
                crate::omap::decode_range(&data)?;
                if offset == 0 || offset > MAX_OMAP_LIST {
                    return Err(DecodeError::Inconsistent("an omap listing asks for 1 to 1024 entries"));
                }
            }
            OpKind::ChunkPut => {
                let chunk = data.len().saturating_sub(offset as usize);
                if offset == 0 || offset > crate::omap::MAX_KEY_LEN as u64 || offset >= data.len() as u64 {
                    return Err(DecodeError::Inconsistent("a chunk put carries a 1 to 255-byte reference, then bytes"));
                }
                if chunk > MAX_CHUNK {
                    return Err(DecodeError::Inconsistent("a chunk larger than 1 MiB"));
                }
            }
            OpKind::ChunkUnref if data.is_empty() || data.len() > crate::omap::MAX_KEY_LEN => {
                return Err(DecodeError::Inconsistent("a chunk unref carries a 1 to 255-byte reference"));
            }
            _ => {}
        }
        // (A tier read may read at a snapshot: a clone, or the head unchanged since.)
        if matches!(kind, OpKind::ChunkPut | OpKind::ChunkUnref | OpKind::TierUpdate) && snap != 0 {
            return Err(DecodeError::Inconsistent("the deduplication tier's changes are to heads"));
        }
        if kind == OpKind::TierUpdate {
            crate::tier::split_update(&data)?;
        }
        if kind == OpKind::Zero && data.len() != 8 {
            return Err(DecodeError::Inconsistent("a zero carries its length in 8 bytes"));
        }
        if kind == OpKind::TrimClone && offset == 0 {
            return Err(DecodeError::Inconsistent("a trim names a clone's sequence"));
        }
        if kind == OpKind::ShardRead && snap != 0 {
            return Err(DecodeError::Inconsistent("a shard read reads the head"));
        }
        if kind == OpKind::Watch && (offset > MAX_WATCH_MS || snap != 0) {
            return Err(DecodeError::Inconsistent("a watch waits at most MAX_WATCH_MS, on the head"));
        }
        if kind == OpKind::TrimSnaps && (!data.len().is_multiple_of(8) || data.len() > MAX_LIVE_SNAPS * 8 || snap != 0)
        {
            return Err(DecodeError::Inconsistent("a trim carries whole snapshot ids, at most MAX_LIVE_SNAPS"));
        }
        if offset.checked_add(length as u64).is_none() {
            return Err(DecodeError::Inconsistent("offset + length overflows"));
        }
        Ok(OpRequest {
            kind,
            pool: le_u32(payload, 4),
            pg: le_u32(payload, 8),
            map_epoch: le_u64(payload, 16),
            object: payload.slice(object_start..object_end),
            offset,
            length,
            data,
            client: le_u64(payload, 32),
            snap,
        })
    }
}

/// An object's snapshot state: its head and its clones, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SnapList {
    /// The head exists (a deleted head may leave clones behind).
    pub head_exists: bool,
    /// The snapshot sequence the head was last changed under (0: none).
    pub head_seq: u64,
    pub head_size: u64,
    pub clones: Vec<CloneInfo>,
}

/// One clone: the object as snapshots `from < S <= seq` saw it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CloneInfo {
    pub seq: u64,
    pub from: u64,
    pub size: u64,
}

/// Clones one listing names at most (one per snapshot the object was
/// written after: an image has far fewer snapshots).
pub const MAX_CLONES_LISTED: usize = 4096;

impl SnapList {
    pub fn encode(&self) -> Bytes {
        let mut out = BytesMut::with_capacity(21 + 24 * self.clones.len());
        out.put_u8(self.head_exists as u8);
        out.put_u64_le(self.head_seq);
        out.put_u64_le(self.head_size);
        out.put_u32_le(self.clones.len() as u32);
        for clone in &self.clones {
            out.put_u64_le(clone.seq);
            out.put_u64_le(clone.from);
            out.put_u64_le(clone.size);
        }
        out.freeze()
    }

    pub fn decode(bytes: &[u8]) -> Result<SnapList, DecodeError> {
        if bytes.len() < 21 {
            return Err(DecodeError::Short { need: 21, got: bytes.len() });
        }
        let count = le_u32(bytes, 17) as usize;
        if count > MAX_CLONES_LISTED {
            return Err(DecodeError::Inconsistent("more clones than a listing holds"));
        }
        let need = 21 + 24 * count;
        if bytes.len() != need {
            return Err(DecodeError::Short { need, got: bytes.len() });
        }
        let clones: Vec<CloneInfo> = (0..count)
            .map(|i| {
                let at = 21 + 24 * i;
                CloneInfo { seq: le_u64(bytes, at), from: le_u64(bytes, at + 8), size: le_u64(bytes, at + 16) }
            })
            .collect();
        if clones.windows(2).any(|w| w[0].seq >= w[1].seq) || clones.iter().any(|c| c.from >= c.seq) {
            return Err(DecodeError::Inconsistent("clones out of order, or covering no snapshot"));
        }
        Ok(SnapList { head_exists: bytes[0] != 0, head_seq: le_u64(bytes, 1), head_size: le_u64(bytes, 9), clones })
    }
}

/// Where an object differs between two snapshots: byte ranges, sorted and
/// apart, and the object at the later one (`exists`, `size`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SnapDiff {
    pub exists: bool,
    pub size: u64,
    pub ranges: Vec<(u64, u64)>,
}

impl SnapDiff {
    pub fn encode(&self) -> Bytes {
        let mut out = BytesMut::with_capacity(13 + 16 * self.ranges.len());
        out.put_u8(self.exists as u8);
        out.put_u64_le(self.size);
        out.put_u32_le(self.ranges.len() as u32);
        for (offset, len) in &self.ranges {
            out.put_u64_le(*offset);
            out.put_u64_le(*len);
        }
        out.freeze()
    }

    pub fn decode(bytes: &[u8]) -> Result<SnapDiff, DecodeError> {
        if bytes.len() < 13 {
            return Err(DecodeError::Short { need: 13, got: bytes.len() });
        }
        let count = le_u32(bytes, 9) as usize;
        let need = 13usize.saturating_add(count.saturating_mul(16));
        if bytes.len() != need {
            return Err(DecodeError::Short { need, got: bytes.len() });
        }
        let ranges: Vec<(u64, u64)> =
            (0..count).map(|i| (le_u64(bytes, 13 + 16 * i), le_u64(bytes, 21 + 16 * i))).collect();
        let ordered = ranges.windows(2).all(|w| w[0].0.checked_add(w[0].1).is_some_and(|end| end <= w[1].0));
        if !ordered || ranges.iter().any(|(offset, len)| *len == 0 || offset.checked_add(*len).is_none()) {
            return Err(DecodeError::Inconsistent("diff ranges empty, overlapping or out of order"));
        }
        Ok(SnapDiff { exists: bytes[0] != 0, size: le_u64(bytes, 1), ranges })
    }
}

/// An OSD's counters, for `duplex status`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OsdStats {
    pub capacity_bytes: u64,
    pub used_bytes: u64,
    /// Client operations since the OSD started.
    pub writes: u64,
    pub reads: u64,
    pub write_bytes: u64,
    pub read_bytes: u64,
    pub log_entries: u64,
    /// Devices of a mirrored store that are out (degraded until replaced).
    pub failed_devices: u64,
    /// The replication lag of each PG of an eventual pool this OSD is the
    /// primary of (at most [`MAX_LAGS_REPORTED`], the largest).
    pub lags: Vec<PgLagStat>,
}

/// An eventual pool's PG's replication lag, as its primary reports it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PgLagStat {
    /// The PG's key (pool and PG number).
    pub pg: u32,
    /// The age of the oldest acknowledged write a replica lacks.
    pub lag_us: u64,
    /// Acknowledged writes a replica lacks.
    pub unreplicated: u64,
}

const OSD_STATS_LEN: usize = 64;
/// The reply before `failed_devices` (an older OSD's).
const OSD_STATS_LEN_V1: usize = 56;
/// The PG lags one reply carries at most (a count, then 20 bytes each).
pub const MAX_LAGS_REPORTED: usize = 4096;
const LAG_LEN: usize = 20;

impl OsdStats {
    pub fn to_frame(&self, transaction_id: u64) -> Frame {
        debug_assert!(self.lags.len() <= MAX_LAGS_REPORTED, "{} lags in one reply", self.lags.len());
        let lags = &self.lags[..self.lags.len().min(MAX_LAGS_REPORTED)];
        let tail = if lags.is_empty() { 0 } else { 4 + lags.len() * LAG_LEN };
        let mut out = BytesMut::with_capacity(OSD_STATS_LEN + tail);
        for value in [
            self.capacity_bytes,
            self.used_bytes,
            self.writes,
            self.reads,
            self.write_bytes,
            self.read_bytes,
            self.log_entries,
            self.failed_devices,
        ] {
            out.put_u64_le(value);
        }
        if !lags.is_empty() {
            out.put_u32_le(lags.len() as u32);
            for lag in lags {
                out.put_u32_le(lag.pg);
                out.put_u64_le(lag.lag_us);
                out.put_u64_le(lag.unreplicated);
            }
        }
        debug_assert_eq!(out.len(), OSD_STATS_LEN + tail);
        Frame::new(MessageType::OsdStatsReply, transaction_id, out.freeze())
    }

    pub fn decode(payload: &[u8]) -> Result<OsdStats, DecodeError> {
        if payload.len() != OSD_STATS_LEN && payload.len() != OSD_STATS_LEN_V1 && payload.len() < OSD_STATS_LEN + 4 {
            return Err(DecodeError::Short { need: OSD_STATS_LEN, got: payload.len() });
        }
        let mut lags = Vec::new();
        if payload.len() > OSD_STATS_LEN {
            // Bounded before it is multiplied: a hostile count cannot overflow.
            let count = (le_u32(payload, OSD_STATS_LEN) as usize).min(MAX_LAGS_REPORTED + 1);
            let need = OSD_STATS_LEN + 4 + count * LAG_LEN;
            if count > MAX_LAGS_REPORTED || payload.len() != need {
                return Err(DecodeError::Short { need, got: payload.len() });
            }
            for i in 0..count {
                let at = OSD_STATS_LEN + 4 + i * LAG_LEN;
                lags.push(PgLagStat {
                    pg: le_u32(payload, at),
                    lag_us: le_u64(payload, at + 4),
                    unreplicated: le_u64(payload, at + 12),
                });
            }
        }
        let at = |i: usize| le_u64(payload, i * 8);
        Ok(OsdStats {
            capacity_bytes: at(0),
            used_bytes: at(1),
            writes: at(2),
            reads: at(3),
            write_bytes: at(4),
            read_bytes: at(5),
            log_entries: at(6),
            failed_devices: if payload.len() >= OSD_STATS_LEN { at(7) } else { 0 },
            lags,
        })
    }
}

/// One PG's share of one OSD's store, for `duplex df`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PgUsage {
    /// The PG's key (pool and PG number, as the store groups it).
    pub pg: u32,
    pub objects: u64,
    /// The objects' sizes: what clients stored.
    pub logical_bytes: u64,
    /// Store blocks mapped to them, in bytes.
    pub allocated_bytes: u64,
}

/// What one store partition of an OSD holds, per PG, and its space. An
/// OSD answers an `OsdUsage` with one of these per partition, all with the
/// request's transaction id; `partitions` says how many to wait for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UsageReply {
    pub partition: u32,
    pub partitions: u32,
    /// The store's data space (the partitions share it: every partition
    /// reports the same) and the bytes this partition holds of it.
    pub capacity_bytes: u64,
    pub used_bytes: u64,
    pub pgs: Vec<PgUsage>,
    /// This partition's onode slots (objects' metadata), and those in use:
    /// many small objects fill them before the data. A trailing section
    /// (after the rows), so a reply without it decodes, as zeros.
    pub onode_slots: u64,
    pub used_onode_slots: u64,
}

const USAGE_HEADER_LEN: usize = 28;
const USAGE_ONODES_LEN: usize = 16;
const PG_USAGE_LEN: usize = 28;
/// The most PG rows one reply carries (a partition with more sends the
/// first ones): 1 MiB of rows, well inside a frame.
pub const MAX_USAGE_ROWS: usize = (1 << 20) / PG_USAGE_LEN;

impl UsageReply {
    pub fn to_frame(&self, transaction_id: u64) -> Frame {
        let rows = &self.pgs[..self.pgs.len().min(MAX_USAGE_ROWS)];
        let mut out = BytesMut::with_capacity(USAGE_HEADER_LEN + rows.len() * PG_USAGE_LEN + USAGE_ONODES_LEN);
        out.put_u32_le(self.partition);
        out.put_u32_le(self.partitions);
        out.put_u64_le(self.capacity_bytes);
        out.put_u64_le(self.used_bytes);
        out.put_u32_le(rows.len() as u32);
        for row in rows {
            out.put_u32_le(row.pg);
            out.put_u64_le(row.objects);
            out.put_u64_le(row.logical_bytes);
            out.put_u64_le(row.allocated_bytes);
        }
        out.put_u64_le(self.onode_slots);
        out.put_u64_le(self.used_onode_slots);
        Frame::new(MessageType::OsdUsageReply, transaction_id, out.freeze())
    }

    pub fn decode(payload: &[u8]) -> Result<UsageReply, DecodeError> {
        if payload.len() < USAGE_HEADER_LEN {
            return Err(DecodeError::Short { need: USAGE_HEADER_LEN, got: payload.len() });
        }
        let le_u32 = |at: usize| u32::from_le_bytes(payload[at..at + 4].try_into().expect("4 bytes"));
        let (partition, partitions) = (le_u32(0), le_u32(4));
        let (capacity_bytes, used_bytes, count) = (le_u64(payload, 8), le_u64(payload, 16), le_u32(24) as usize);
        if partition >= partitions {
            return Err(DecodeError::Inconsistent("usage of a partition past the partition count"));
        }
        if used_bytes > capacity_bytes {
            return Err(DecodeError::Inconsistent("a partition uses more than it holds"));
        }
        if count > MAX_USAGE_ROWS {
            return Err(DecodeError::Inconsistent("more usage rows than a reply carries"));
        }
        let need = USAGE_HEADER_LEN + count * PG_USAGE_LEN;
        let (onode_slots, used_onode_slots) = match payload.len() {
            len if len == need => (0, 0),
            len if len == need + USAGE_ONODES_LEN => (le_u64(payload, need), le_u64(payload, need + 8)),
            len => return Err(DecodeError::Short { need: need + USAGE_ONODES_LEN, got: len }),
        };
        if used_onode_slots > onode_slots {
            return Err(DecodeError::Inconsistent("a partition uses more onode slots than it has"));
        }
        let pgs = (0..count)
            .map(|i| {
                let at = USAGE_HEADER_LEN + i * PG_USAGE_LEN;
                PgUsage {
                    pg: le_u32(at),
                    objects: le_u64(payload, at + 4),
                    logical_bytes: le_u64(payload, at + 12),
                    allocated_bytes: le_u64(payload, at + 20),
                }
            })
            .collect();
        Ok(UsageReply { partition, partitions, capacity_bytes, used_bytes, pgs, onode_slots, used_onode_slots })
    }
}

/// What a stat returns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ObjectStat {
    pub size: u64,
    /// Bytes of storage mapped to the object.
    pub allocated_bytes: u64,
    pub preallocated: bool,
}

const STAT_LEN: usize = 24;

impl ObjectStat {
    pub fn encode(&self) -> Bytes {
        let mut out = BytesMut::with_capacity(STAT_LEN);
        out.put_u64_le(self.size);
        out.put_u64_le(self.allocated_bytes);
        out.put_u8(self.preallocated as u8);
        out.put_bytes(0, 7);
        out.freeze()
    }

    pub fn decode(bytes: &[u8]) -> Result<ObjectStat, DecodeError> {
        if bytes.len() != STAT_LEN {
            return Err(DecodeError::Short { need: STAT_LEN, got: bytes.len() });
        }
        Ok(ObjectStat { size: le_u64(bytes, 0), allocated_bytes: le_u64(bytes, 8), preallocated: bytes[16] & 1 == 1 })
    }
}

/// Attributes as a list-attributes reply carries them: per attribute, a
/// u16 name length, the name, a u32 value length, the value.
pub fn encode_attrs(attrs: &[(Vec<u8>, Vec<u8>)]) -> Bytes {
    let mut out = BytesMut::new();
    for (name, value) in attrs {
        out.put_u16_le(name.len() as u16);
        out.put_slice(name);
        out.put_u32_le(value.len() as u32);
        out.put_slice(value);
    }
    out.freeze()
}

/// An object's attributes: (name, value) pairs.
pub type Attrs = Vec<(Vec<u8>, Vec<u8>)>;

pub fn decode_attrs(mut bytes: &[u8]) -> Result<Attrs, DecodeError> {
    let mut attrs = Vec::new();
    while !bytes.is_empty() {
        let name = take(&mut bytes, 2)?;
        let name = take(&mut bytes, u16::from_le_bytes([name[0], name[1]]) as usize)?.to_vec();
        let len = take(&mut bytes, 4)?;
        let value = take(&mut bytes, le_u32(len, 0) as usize)?.to_vec();
        attrs.push((name, value));
    }
    Ok(attrs)
}

/// Object names as a list-objects reply carries them: a u8 "more may
/// follow" flag, then per name a u16 length and the name.
pub fn encode_names(names: &[Vec<u8>], more: bool) -> Bytes {
    let mut out = BytesMut::new();
    out.put_u8(more as u8);
    for name in names {
        out.put_u16_le(name.len() as u16);
        out.put_slice(name);
    }
    out.freeze()
}

/// The names, and whether more may follow after the last one.
pub fn decode_names(mut bytes: &[u8]) -> Result<(Vec<Vec<u8>>, bool), DecodeError> {
    let more = take(&mut bytes, 1)?[0] == 1;
    let mut names = Vec::new();
    while !bytes.is_empty() {
        let len = take(&mut bytes, 2)?;
        names.push(take(&mut bytes, u16::from_le_bytes([len[0], len[1]]) as usize)?.to_vec());
    }
    Ok((names, more))
}

fn take<'a>(bytes: &mut &'a [u8], n: usize) -> Result<&'a [u8], DecodeError> {
    if bytes.len() < n {
        return Err(DecodeError::Short { need: n, got: bytes.len() });
    }
    let (head, rest) = bytes.split_at(n);
    *bytes = rest;
    Ok(head)
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpReply {
    pub status: Status,
    /// The OSD's map epoch.
    pub map_epoch: u64,
    /// Read data, or the error's text.
    pub data: Bytes,
}

impl OpReply {
    /// Success with nothing to return (a write's answer).
    pub fn ok(map_epoch: u64) -> OpReply {
        OpReply { status: Status::Ok, map_epoch, data: Bytes::new() }
    }

    pub fn error(status: Status, map_epoch: u64, message: impl std::fmt::Display) -> OpReply {
        OpReply { status, map_epoch, data: Bytes::from(message.to_string()) }
    }

    pub fn to_frame(&self, transaction_id: u64) -> Frame {
        let mut out = BytesMut::with_capacity(REPLY_HEADER + self.data.len());
        out.put_u8(self.status as u8);
        out.put_bytes(0, 7);
        out.put_u64_le(self.map_epoch);
        out.put_slice(&self.data);
        Frame::new(MessageType::OsdOpReply, transaction_id, out.freeze())
    }

    pub fn decode(payload: &Bytes) -> Result<OpReply, DecodeError> {
        if payload.len() < REPLY_HEADER {
            return Err(DecodeError::Short { need: REPLY_HEADER, got: payload.len() });
        }
        let status = Status::from_u8(payload[0]).ok_or(DecodeError::Unknown { what: "status", value: payload[0] })?;
        Ok(OpReply { status, map_epoch: le_u64(payload, 8), data: payload.slice(REPLY_HEADER..) })
    }

    /// The error text of a failed reply.
    pub fn message(&self) -> String {
        String::from_utf8_lossy(&self.data).into_owned()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RepReply {
    pub status: Status,
    pub pg: u32,
    pub seq: u64,
}

impl RepReply {
    pub fn to_frame(&self, transaction_id: u64) -> Frame {
        let mut out = BytesMut::with_capacity(REP_REPLY_LEN);
        out.put_u8(self.status as u8);
        out.put_bytes(0, 3);
        out.put_u32_le(self.pg);
        out.put_u64_le(self.seq);
        Frame::new(MessageType::RepOpReply, transaction_id, out.freeze())
    }

    pub fn decode(payload: &[u8]) -> Result<RepReply, DecodeError> {
        if payload.len() != REP_REPLY_LEN {
            return Err(DecodeError::Short { need: REP_REPLY_LEN, got: payload.len() });
        }
        let status = Status::from_u8(payload[0]).ok_or(DecodeError::Unknown { what: "status", value: payload[0] })?;
        Ok(RepReply { status, pg: le_u32(payload, 4), seq: le_u64(payload, 8) })
    }
}

fn le_u32(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

fn le_u64(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn request_strategy() -> impl Strategy<Value = OpRequest> {
        (
            1u8..20,
            any::<u32>(),
            any::<u32>(),
            any::<u64>(),
            proptest::collection::vec(any::<u8>(), 1..MAX_OBJECT_NAME),
            0u64..1 << 40,
            0u32..1 << 20,
            proptest::collection::vec(any::<u8>(), 0..300),
            (any::<u64>(), any::<u64>()),
        )
            .prop_map(|(kind, pool, pg, map_epoch, mut object, offset, length, mut data, (client, snap))| {
                let kind = OpKind::from_u8(kind).expect("1..20");
                // Reserved names are refused; that has its own test.
                object.iter_mut().for_each(|b| *b |= 1);
                if let Some(first) = data.first_mut() {
                    *first |= 1;
                }
                let snap = if matches!(
                    kind,
                    OpKind::List | OpKind::TrimClone | OpKind::Watch | OpKind::TrimSnaps | OpKind::ShardRead
                ) || object.len() > MAX_SNAP_OBJECT_NAME
                {
                    0
                } else {
                    snap
                };
                let offset = match kind {
                    OpKind::TrimClone => offset.max(1),
                    OpKind::Watch => offset % (MAX_WATCH_MS + 1),
                    _ => offset,
                };
                let (length, data) = match kind {
                    OpKind::Zero => (8, Bytes::copy_from_slice(&u64::from(length).to_le_bytes())),
                    OpKind::TrimSnaps => {
                        let ids = &data[..data.len() / 8 * 8];
                        (ids.len() as u32, Bytes::copy_from_slice(ids))
                    }
                    _ if kind.carries_data() => (data.len() as u32, Bytes::from(data)),
                    OpKind::Read | OpKind::ShardRead => (length, Bytes::new()),
                    _ => (0, Bytes::new()),
                };
                let offset = if kind == OpKind::SetAttr { offset % (data.len() as u64 + 1) } else { offset };
                OpRequest { kind, pool, pg, map_epoch, object: Bytes::from(object), offset, length, data, client, snap }
            })
    }

    proptest! {
        #[test]
        fn requests_round_trip(request in request_strategy(), txid in any::<u64>()) {
            let frame = request.to_frame(txid);
            prop_assert_eq!(frame.header.transaction_id, txid);
            prop_assert_eq!(OpRequest::decode(&frame.payload), Ok(request));
        }

        #[test]
        fn replies_round_trip(status in 0u8..6, epoch in any::<u64>(), data in proptest::collection::vec(any::<u8>(), 0..100)) {
            let reply = OpReply { status: Status::from_u8(status).expect("0..6"), map_epoch: epoch, data: Bytes::from(data) };
            prop_assert_eq!(OpReply::decode(&reply.to_frame(1).payload), Ok(reply));
            let rep = RepReply { status: Status::Ok, pg: status as u32, seq: epoch };
            prop_assert_eq!(RepReply::decode(&rep.to_frame(1).payload), Ok(rep));
        }

        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let bytes = Bytes::from(bytes);
            let _ = OpRequest::decode(&bytes);
            let _ = OpReply::decode(&bytes);
            let _ = RepReply::decode(&bytes);
            let _ = ObjectStat::decode(&bytes);
            let _ = OsdStats::decode(&bytes);
            let _ = UsageReply::decode(&bytes);
            let _ = decode_attrs(&bytes);
            let _ = decode_names(&bytes);
            let _ = SnapList::decode(&bytes);
            let _ = SnapDiff::decode(&bytes);
        }

        #[test]
        fn snapshot_listings_and_diffs_round_trip(
            exists in any::<bool>(),
            size in any::<u64>(),
            steps in proptest::collection::vec((1u64..1000, 1u64..1000), 0..20),
        ) {
            let mut clones = Vec::new();
            let mut ranges = Vec::new();
            let mut at = 0u64;
            for (gap, len) in steps {
                clones.push(CloneInfo { seq: at + gap, from: at, size: len });
                ranges.push((at + gap, len));
                at += gap + len;
            }
            let list = SnapList { head_exists: exists, head_seq: at, head_size: size, clones };
            prop_assert_eq!(SnapList::decode(&list.encode()), Ok(list));
            let diff = SnapDiff { exists, size, ranges };
            prop_assert_eq!(SnapDiff::decode(&diff.encode()), Ok(diff));
        }

        #[test]
        fn usage_replies_round_trip(
            rows in proptest::collection::vec((any::<u32>(), any::<u64>(), any::<u64>(), any::<u64>()), 0..50),
            partition in 0u32..28,
            txid in any::<u64>(),
            slots in any::<u64>(),
        ) {
            let pgs = rows.into_iter().map(|(pg, objects, logical_bytes, allocated_bytes)| PgUsage { pg, objects, logical_bytes, allocated_bytes }).collect();
            let reply = UsageReply {
                partition,
                partitions: partition + 1,
                capacity_bytes: txid,
                used_bytes: txid / 2,
                pgs,
                onode_slots: slots,
                used_onode_slots: slots / 3,
            };
            let frame = reply.to_frame(txid);
            prop_assert_eq!(frame.header.message_type, MessageType::OsdUsageReply as u8);
            prop_assert_eq!(UsageReply::decode(&frame.payload), Ok(reply));
        }

        #[test]
        fn listings_round_trip(
            attrs in proptest::collection::vec((proptest::collection::vec(any::<u8>(), 0..20), proptest::collection::vec(any::<u8>(), 0..50)), 0..8),
            names in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..30), 0..8),
            more in any::<bool>(),
            size in any::<u64>(),
        ) {
            prop_assert_eq!(decode_attrs(&encode_attrs(&attrs)), Ok(attrs));
            prop_assert_eq!(decode_names(&encode_names(&names, more)), Ok((names.clone(), more)));
            let stat = ObjectStat { size, allocated_bytes: size / 2, preallocated: more };
            prop_assert_eq!(ObjectStat::decode(&stat.encode()), Ok(stat));
            let lags = names.iter().enumerate().map(|(i, n)| PgLagStat { pg: i as u32, lag_us: size ^ n.len() as u64, unreplicated: n.len() as u64 }).collect();
            let stats = OsdStats { capacity_bytes: size, used_bytes: size / 3, writes: 1, reads: 2, write_bytes: 3, read_bytes: 4, log_entries: 5, failed_devices: 1, lags };
            prop_assert_eq!(OsdStats::decode(&stats.to_frame(1).payload), Ok(stats));
        }
    }

    #[test]
    fn a_zero_carries_exactly_its_8_byte_length() {
        let mut request = OpRequest {
            kind: OpKind::Zero,
            pool: 1,
            pg: 2,
            map_epoch: 3,
            object: Bytes::from_static(b"obj"),
            offset: 4096,
            length: 8,
            data: Bytes::copy_from_slice(&8192u64.to_le_bytes()),
            client: 9,
            snap: 0,
        };
        assert_eq!(OpRequest::decode(&request.to_frame(1).payload), Ok(request.clone()));
        request.data = Bytes::from_static(b"1234");
        request.length = 4;
        assert!(matches!(OpRequest::decode(&request.to_frame(1).payload), Err(DecodeError::Inconsistent(_))));
    }

    #[test]
    fn snapshots_travel_only_where_they_mean_something_and_reserved_names_are_refused() {
        let write = OpRequest {
            kind: OpKind::Write,
            pool: 1,
            pg: 2,
            map_epoch: 3,
            object: Bytes::from_static(b"rbd_data.7.0000000000000001"),
            offset: 0,
            length: 4,
            data: Bytes::from_static(b"data"),
            client: 9,
            snap: 5,
        };
        let frame = write.to_frame(1);
        assert_eq!(frame.payload[1], FLAG_SNAP);
        assert_eq!(frame.payload.len(), REQUEST_HEADER + 8 + write.object.len() + 4);
        assert_eq!(OpRequest::decode(&frame.payload), Ok(write.clone()));
        // Without a snapshot the layout is the one older clients send.
        let plain = OpRequest { snap: 0, ..write.clone() };
        assert_eq!(plain.to_frame(1).payload.len(), REQUEST_HEADER + plain.object.len() + 4);
        let mut zero_snap = BytesMut::from(&frame.payload[..]);
        zero_snap[REQUEST_HEADER..REQUEST_HEADER + 8].fill(0);
        assert!(matches!(OpRequest::decode(&zero_snap.freeze()), Err(DecodeError::Inconsistent(_))));
        let mut unknown_flag = BytesMut::from(&frame.payload[..]);
        unknown_flag[1] |= 0x80;
        assert!(matches!(OpRequest::decode(&unknown_flag.freeze()), Err(DecodeError::Unknown { .. })));
        let long = OpRequest { object: Bytes::from(vec![b'a'; MAX_SNAP_OBJECT_NAME + 1]), ..write.clone() };
        assert!(matches!(OpRequest::decode(&long.to_frame(1).payload), Err(DecodeError::Inconsistent(_))));
        let listing = OpRequest { kind: OpKind::List, data: Bytes::new(), length: 0, ..write.clone() };
        assert!(matches!(OpRequest::decode(&listing.to_frame(1).payload), Err(DecodeError::Inconsistent(_))));
        let reserved = OpRequest { object: Bytes::from_static(b"head\0\0\0\0\0\0\0\0\x05"), snap: 0, ..write.clone() };
        assert!(matches!(OpRequest::decode(&reserved.to_frame(1).payload), Err(DecodeError::Inconsistent(_))));
        let attr =
            OpRequest { kind: OpKind::GetAttr, data: Bytes::from_static(b"\0snapseq"), snap: 0, ..write.clone() };
        assert!(matches!(OpRequest::decode(&attr.to_frame(1).payload), Err(DecodeError::Inconsistent(_))));
        // The tier reads at a snapshot; its changes are to heads.
        let tier_read = OpRequest { kind: OpKind::TierRead, data: Bytes::new(), ..write.clone() };
        assert_eq!(OpRequest::decode(&tier_read.to_frame(1).payload), Ok(tier_read.clone()));
        let guard = crate::tier::Guard { interval: 1, generation: 2 };
        let data = Bytes::from(crate::tier::encode_update(&guard, &[]));
        let update = OpRequest { kind: OpKind::TierUpdate, data, ..write };
        assert!(matches!(OpRequest::decode(&update.to_frame(1).payload), Err(DecodeError::Inconsistent(_))));
    }

    #[test]
    fn usage_replies_that_lie_are_refused() {
        let reply = UsageReply {
            partition: 1,
            partitions: 2,
            capacity_bytes: 1 << 30,
            used_bytes: 1 << 20,
            pgs: vec![PgUsage { pg: 7, objects: 1, logical_bytes: 2, allocated_bytes: 3 }],
            onode_slots: 4096,
            used_onode_slots: 100,
        };
        let good = reply.to_frame(1).payload;
        assert_eq!(UsageReply::decode(&good), Ok(reply.clone()));
        // From an OSD before the onode section: zeros.
        let without = UsageReply::decode(&good[..good.len() - 16]).unwrap();
        assert_eq!((without.onode_slots, without.used_onode_slots, without.pgs), (0, 0, reply.pgs));
        let mut slots_overused = BytesMut::from(&good[..]);
        let at = good.len() - 8;
        slots_overused[at..].copy_from_slice(&5000u64.to_le_bytes());
        assert!(matches!(UsageReply::decode(&slots_overused), Err(DecodeError::Inconsistent(_))));
        assert!(matches!(UsageReply::decode(&good[..good.len() - 1]), Err(DecodeError::Short { .. })));
        let mut past = BytesMut::from(&good[..]);
        past[0] = 2; // partition 2 of 2
        assert!(matches!(UsageReply::decode(&past), Err(DecodeError::Inconsistent(_))));
        let mut overused = BytesMut::from(&good[..]);
        overused[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(UsageReply::decode(&overused), Err(DecodeError::Inconsistent(_))));
        let mut more = BytesMut::from(&good[..]);
        more[24] = 2; // two rows claimed, one sent
        assert!(matches!(UsageReply::decode(&more), Err(DecodeError::Short { .. })));
        let mut huge = BytesMut::from(&good[..]);
        huge[24..28].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(UsageReply::decode(&huge), Err(DecodeError::Inconsistent(_))));
        assert!(matches!(UsageReply::decode(&good[..27]), Err(DecodeError::Short { .. })));
    }

    #[test]
    fn refuses_lies_about_lengths() {
        let request = OpRequest {
            kind: OpKind::Write,
            pool: 1,
            pg: 2,
            map_epoch: 3,
            object: Bytes::from_static(b"obj"),
            offset: 0,
            length: 0,
            data: Bytes::from_static(b"data"),
            client: 9,
            snap: 0,
        };
        let mut payload = BytesMut::from(&request.to_frame(1).payload[..]);
        payload[12] = 9; // claims 9 bytes of data, carries 4
        assert!(matches!(OpRequest::decode(&payload.freeze()), Err(DecodeError::Inconsistent(_))));
        let mut payload = BytesMut::from(&request.to_frame(1).payload[..]);
        payload[2] = 0; // empty object name
        payload[3] = 0;
        assert_eq!(OpRequest::decode(&payload.freeze()), Err(DecodeError::ObjectName(0)));
    }
}
