//! Operations and batches: what a caller asks a partition to do.

use crate::key::Key;

/// One operation on one object. Every operation is idempotent when replayed
/// in order, so the OSD's operation log can redo a batch after a crash.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Write `data` at `offset`, creating the object if needed and extending
    /// its size; gaps read as zeros.
    Write { key: Key, offset: u64, data: Vec<u8> },
    /// A `Write` whose bytes, where they fall in blocks the object already
    /// holds, travel in the batch's journal record: those blocks are written
    /// in place only at the next checkpoint (a deferred write, as BlueStore
    /// does for small ones). Many small updates of the same blocks (the
    /// OSD's request-id ring) then cost tens of journal bytes each instead
    /// of a 4 KiB block each. Elsewhere (new blocks, holes) it is a `Write`.
    /// The result is exactly that of a `Write`; only the cost differs.
    WriteJournaled { key: Key, offset: u64, data: Vec<u8> },
    /// Set the size, creating the object if needed; bytes past a new,
    /// smaller size are discarded and read as zeros if the object grows again.
    Truncate { key: Key, size: u64 },
    /// Make the object's bytes in `offset..offset + len` read as zeros
    /// without taking space: blocks it holds there are zeroed in place,
    /// holes stay holes, bytes past its size are left alone (they read as
    /// zeros already), and an absent object stays absent. Never allocates
    /// a block, so it goes on when the partition is full (an NBD TRIM of a
    /// part of an object on a full cluster).
    Zero { key: Key, offset: u64, len: u64 },
    /// Remove the object (no-op if absent). Its space is reclaimed by a later
    /// commit: delayed deallocation.
    Delete { key: Key },
    /// Create an object of `size` bytes (reading as zeros) backed by one
    /// contiguous extent, so that overwrites inside it change no metadata.
    /// No-op if the object exists, whatever its size and layout, so that
    /// replaying a logged create never fails.
    CreatePreallocated { key: Key, size: u64 },
    /// Set an attribute, creating the object if needed.
    SetAttr { key: Key, name: Vec<u8>, value: Vec<u8> },
    /// Remove an attribute (no-op if absent or if the object is absent).
    RemoveAttr { key: Key, name: Vec<u8> },
    /// Set omap entries (each replaces the one with its key), creating the
    /// object if needed. Limits: [`crate::MAX_OMAP_KEY_LEN`],
    /// [`crate::MAX_OMAP_VALUE_LEN`], [`crate::MAX_OMAP_BYTES`].
    OmapSet { key: Key, entries: Vec<(Vec<u8>, Vec<u8>)> },
    /// Remove the omap entries of `keys` (absent ones, or an absent
    /// object, are no-ops).
    OmapRemove { key: Key, keys: Vec<Vec<u8>> },
    /// Remove the omap entries with keys in `[start, end)` (`end = None`:
    /// to the last; an empty `start` and no `end` clears the omap).
    OmapRemoveRange { key: Key, start: Vec<u8>, end: Option<Vec<u8>> },
    /// Delete the object if it exists and its omap is empty at this point
    /// of the batch (a chunk object whose last reference went: the dedup
    /// tier's). Evaluated when the batch is planned, against what the
    /// operations before it left, so replaying it in order ends the same.
    DeleteIfOmapEmpty { key: Key },
    /// Make `key` a copy of `source` (size, data, attributes, omap) that shares
    /// its data blocks: O(its extents), no data copied. A later write to a
    /// shared block of either object copies that one 4 KiB block first
    /// (copy-on-write), so the other keeps its contents. Both keys are in
    /// this partition, and the clone comes before any other operation of
    /// the batch on `source`, and on `key` unless one deleted it (a
    /// rollback: `Delete(head)`, `Clone { key: head, source: snapshot }`);
    /// `InvalidArgument` otherwise. No-op if `key` exists or `source` does
    /// not, so that replaying it never fails.
    Clone { key: Key, source: Key },
}

impl Op {
    pub fn key(&self) -> &Key {
        match self {
            Op::Write { key, .. }
            | Op::WriteJournaled { key, .. }
            | Op::Truncate { key, .. }
            | Op::Zero { key, .. }
            | Op::Delete { key }
            | Op::CreatePreallocated { key, .. }
            | Op::SetAttr { key, .. }
            | Op::RemoveAttr { key, .. }
            | Op::OmapSet { key, .. }
            | Op::OmapRemove { key, .. }
            | Op::OmapRemoveRange { key, .. }
            | Op::DeleteIfOmapEmpty { key }
            | Op::Clone { key, .. } => key,
        }
    }
}

/// Operations applied in order and made durable together by
/// [`crate::Partition::apply`] with one device flush.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Batch {
    pub ops: Vec<Op>,
}

impl Batch {
    pub fn new() -> Batch {
        Batch::default()
    }

    pub fn push(&mut self, op: Op) -> &mut Self {
        self.ops.push(op);
        self
    }

    pub fn write(&mut self, key: Key, offset: u64, data: impl Into<Vec<u8>>) -> &mut Self {
        self.push(Op::Write { key, offset, data: data.into() })
    }

    pub fn write_journaled(&mut self, key: Key, offset: u64, data: impl Into<Vec<u8>>) -> &mut Self {
        self.push(Op::WriteJournaled { key, offset, data: data.into() })
    }

    pub fn zero(&mut self, key: Key, offset: u64, len: u64) -> &mut Self {
        self.push(Op::Zero { key, offset, len })
    }

    pub fn truncate(&mut self, key: Key, size: u64) -> &mut Self {
        self.push(Op::Truncate { key, size })
    }

    pub fn delete(&mut self, key: Key) -> &mut Self {
        self.push(Op::Delete { key })
    }

    pub fn create_preallocated(&mut self, key: Key, size: u64) -> &mut Self {
        self.push(Op::CreatePreallocated { key, size })
    }

    pub fn set_attr(&mut self, key: Key, name: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> &mut Self {
        self.push(Op::SetAttr { key, name: name.into(), value: value.into() })
    }

    pub fn remove_attr(&mut self, key: Key, name: impl Into<Vec<u8>>) -> &mut Self {
        self.push(Op::RemoveAttr { key, name: name.into() })
    }

    pub fn omap_set(&mut self, key: Key, entries: Vec<(Vec<u8>, Vec<u8>)>) -> &mut Self {
        self.push(Op::OmapSet { key, entries })
    }

    pub fn omap_remove(&mut self, key: Key, keys: Vec<Vec<u8>>) -> &mut Self {
        self.push(Op::OmapRemove { key, keys })
    }

    pub fn omap_remove_range(&mut self, key: Key, start: impl Into<Vec<u8>>, end: Option<Vec<u8>>) -> &mut Self {
        self.push(Op::OmapRemoveRange { key, start: start.into(), end })
    }

    /// `key` becomes a copy of `source` sharing its blocks ([`Op::Clone`]).
    pub fn clone_object(&mut self, source: Key, key: Key) -> &mut Self {
        self.push(Op::Clone { key, source })
    }

    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}
