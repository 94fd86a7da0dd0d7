//! Snapshots in the store: copy-on-write clones of an object's head.
//!
//! A client writes an image's objects under the image's newest snapshot
//! sequence (`snap` on the request and on the log entry; 0: the image has
//! no snapshot). The head keeps, in the attribute [`SNAPSEQ_ATTR`], the
//! sequence its contents were last changed under. Whoever applies an entry
//! (the flusher, the sync path, replay at start) compares the two: when
//! the entry's is newer and the head exists, the head is first cloned to
//! `name \0 seq` (big-endian, so an object's clones sort by sequence, right
//! after the head and before any other name, as client names hold no zero
//! byte). The clone shares the head's blocks ([`duplex_store::Op::Clone`]):
//! only the blocks written afterwards are copied, one 4 KiB block at a time.
//!
//! The decision is made from the store's state when the entry is applied,
//! not when it is logged, so every member of a PG, which applies the same
//! entries to the same state, makes the same clones, and a replay after a
//! crash makes none twice (the head's attribute already says so).
//!
//! **What a clone stands for.** A clone `name@s` copied a head last changed
//! under `f` (its own [`SNAPSEQ_ATTR`], copied with it): it holds the
//! object as every snapshot in `f < S <= s` saw it. Reading at snapshot
//! `S` ([`resolve`]): the first clone with `s >= S` if its `f < S`; with no
//! such clone, the head if its `f < S`; otherwise the object did not exist
//! at `S`. No "whiteout" objects are needed.
//!
//! A feature nobody turned on costs nothing: an entry with `snap == 0`
//! takes no lookup, and a flush without clones batches as before.

use std::collections::{HashMap, HashSet};

use duplex_store::{Batch, Key, Op, Partition, StoreError};

/// Head and clone attribute: the snapshot sequence the contents were last
/// changed under (u64 little-endian). Clients cannot name it (a leading
/// zero byte is reserved).
pub const SNAPSEQ_ATTR: &[u8] = b"\0snapseq";

/// The object name of `name`'s clone for snapshots up to `seq`.
pub fn clone_name(name: &[u8], seq: u64) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(name.len() + 9);
    bytes.extend_from_slice(name);
    bytes.push(0);
    bytes.extend_from_slice(&seq.to_be_bytes());
    bytes
}

/// The store key of `name`'s clone for snapshots up to `seq`.
pub fn clone_key(group: u32, name: &[u8], seq: u64) -> Result<Key, StoreError> {
    Key::in_group(group, &clone_name(name, seq))
}

/// Whether an object name (without its group) is a clone's.
pub fn is_clone_name(name: &[u8]) -> bool {
    name.contains(&0)
}

/// The head's name and the clone's sequence of a clone's name.
pub fn split_clone_name(name: &[u8]) -> Option<(&[u8], u64)> {
    let at = name.iter().position(|b| *b == 0)?;
    let seq: [u8; 8] = name.get(at + 1..)?.try_into().ok()?;
    Some((&name[..at], u64::from_be_bytes(seq)))
}

/// The store keys of `name`'s clones: `[start, end)`.
pub fn clone_range(group: u32, name: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let mut start = Vec::with_capacity(4 + name.len() + 1);
    start.extend_from_slice(&group.to_be_bytes());
    start.extend_from_slice(name);
    let mut end = start.clone();
    start.push(0);
    end.push(1);
    (start, end)
}

/// The sequence a head or clone was last changed under (0: none recorded).
pub fn snapseq_of(partition: &mut Partition, key: &[u8]) -> Result<u64, StoreError> {
    match partition.get_attr(key, SNAPSEQ_ATTR) {
        Ok(value) => Ok(value.try_into().map(u64::from_le_bytes).unwrap_or(0)),
        Err(StoreError::AttrNotFound) => Ok(0),
        Err(err) => Err(err),
    }
}

fn exists(partition: &Partition, key: &[u8]) -> Result<bool, StoreError> {
    match partition.stat(key) {
        Ok(_) => Ok(true),
        Err(StoreError::NotFound) => Ok(false),
        Err(err) => Err(err),
    }
}

/// The key to read `name` at snapshot `snap` from: a clone, the head, or
/// none (the object did not exist then).
pub fn resolve(partition: &mut Partition, group: u32, name: &[u8], snap: u64) -> Result<Option<Key>, StoreError> {
    debug_assert!(snap != 0, "a read at no snapshot reads the head");
    let start = clone_key(group, name, snap)?;
    let (_, end) = clone_range(group, name);
    if let Some(clone) = partition.list(start.as_bytes(), Some(&end), 1).into_iter().next() {
        debug_assert!(clone.as_bytes().len() == start.as_bytes().len(), "a clone key of another shape");
        let from = snapseq_of(partition, clone.as_bytes())?;
        return Ok((from < snap).then_some(clone));
    }
    let head = Key::in_group(group, name)?;
    if !exists(partition, head.as_bytes())? {
        return Ok(None);
    }
    Ok((snapseq_of(partition, head.as_bytes())? < snap).then_some(head))
}

/// A head as the planner knows it part-way through a run of entries.
#[derive(Clone, Copy, Debug)]
pub struct Head {
    exists: bool,
    seq: u64,
}

/// Turns entries' store operations into what applying them under their
/// snapshot sequences takes, over one run of entries applied in order
/// (one flush, one replay). Heads are read from the store once, then
/// followed through the run.
#[derive(Debug, Default)]
pub struct Planner {
    heads: HeadCache,
    /// A clone was planned: batches must be cut before it (see [`Batches`]).
    pub cloned: bool,
    /// Objects a conditional delete (`Op::DeleteIfOmapEmpty`) of this run
    /// may have removed: whether they exist is known only once the run's
    /// operations are applied ([`Planner::needs_apply`]).
    uncertain: HashSet<Key>,
}

/// Heads as the store holds them after the last run applied whole: kept
/// by a flusher between flushes, so that an object written under a
/// snapshot is not looked up in the store (its attribute is on disk) for
/// every flush. Whoever changes the store otherwise (recovery, backfill,
/// stray removal), or sees a run fail, drops it.
pub type HeadCache = HashMap<Key, Head>;

/// Heads a flusher remembers at most (then it starts over).
pub const HEAD_CACHE_LIMIT: usize = 1 << 16;

impl Planner {
    /// A planner that starts from what `cache` knows of the heads.
    pub fn with_cache(cache: HeadCache) -> Planner {
        Planner { heads: cache, cloned: false, uncertain: HashSet::new() }
    }

    /// Whether an operation on `key` (`if_absent`, under snapshot `snap`)
    /// must wait until the run so far (`planned`) is applied: it depends on
    /// whether the object exists (and on its snapshot sequence), and either
    /// a conditional delete of this run left that to the store, or an
    /// operation of this run on an object the heads did not know changed
    /// it where the store does not show it yet (a write creating an object
    /// followed by a copy-up of it, or by a write under a snapshot, in one
    /// flush: the copy-up would land over the write, the snapshot would
    /// miss its clone). The caller applies what it planned and starts a
    /// new run with that entry. Only copy-ups and writes under snapshots
    /// ask, and only the first time for an object the heads do not know.
    pub fn needs_apply(&self, key: &Key, if_absent: bool, snap: u64, planned: &[Op]) -> bool {
        if !(if_absent || snap != 0) {
            return false;
        }
        self.uncertain.contains(key) || (!self.heads.contains_key(key) && planned.iter().any(|op| op.key() == key))
    }

    /// What it knows of the heads, once its run is applied whole.
    pub fn into_cache(mut self) -> HeadCache {
        if self.heads.len() > HEAD_CACHE_LIMIT {
            self.heads.clear();
        }
        self.heads
    }

    /// Appends to `ops` what applying `op` (an entry's, logged under
    /// snapshot sequence `snap`) takes. `if_absent`: a copy-up, dropped
    /// if the object exists by then.
    pub fn push(
        &mut self,
        partition: &mut Partition,
        op: Op,
        snap: u64,
        if_absent: bool,
        ops: &mut Vec<Op>,
    ) -> Result<(), StoreError> {
        debug_assert!(
            !self.needs_apply(op.key(), if_absent, snap, ops),
            "{op:?} planned on an object of unknown existence"
        );
        if let Op::DeleteIfOmapEmpty { key } = &op {
            // The store decides: until the run is applied, nothing here knows.
            self.heads.remove(key);
            self.uncertain.insert(key.clone());
            ops.push(op);
            return Ok(());
        }
        if if_absent && self.head(partition, op.key())?.exists {
            return Ok(());
        }
        if snap == 0 {
            if let Some(head) = self.heads.get_mut(op.key()) {
                follow(head, &op);
            }
            ops.push(op);
            return Ok(());
        }
        // The common case, a head already changed under `snap`, clones no
        // key and allocates nothing.
        let mut head = self.head(partition, op.key())?;
        let newer = snap > head.seq;
        if newer && head.exists {
            let key = op.key();
            let name = &key.as_bytes()[4..];
            ops.push(Op::Clone { key: clone_key(key.group(), name, snap)?, source: key.clone() });
            self.cloned = true;
        }
        follow(&mut head, &op);
        let set_seq = newer && head.exists;
        if set_seq {
            head.seq = snap;
        }
        *self.heads.get_mut(op.key()).expect("head() keeps what it read") = head;
        let key = set_seq.then(|| op.key().clone());
        ops.push(op);
        if let Some(key) = key {
            ops.push(Op::SetAttr { key, name: SNAPSEQ_ATTR.to_vec(), value: snap.to_le_bytes().to_vec() });
        }
        Ok(())
    }
}

impl Planner {
    /// The head as the run left it so far (read from the store the first time).
    fn head(&mut self, partition: &mut Partition, key: &Key) -> Result<Head, StoreError> {
        if let Some(head) = self.heads.get(key) {
            return Ok(*head);
        }
        let bytes = key.as_bytes();
        let exists = exists(partition, bytes)?;
        let head = Head { exists, seq: if exists { snapseq_of(partition, bytes)? } else { 0 } };
        self.heads.insert(key.clone(), head);
        Ok(head)
    }
}

/// What `op` leaves of a head.
fn follow(head: &mut Head, op: &Op) {
    match op {
        Op::Delete { .. } => *head = Head { exists: false, seq: 0 },
        Op::Write { .. }
        | Op::WriteJournaled { .. }
        | Op::Truncate { .. }
        | Op::CreatePreallocated { .. }
        | Op::SetAttr { .. }
        | Op::OmapSet { .. } => head.exists = true,
        Op::Zero { .. } | Op::RemoveAttr { .. } | Op::OmapRemove { .. } | Op::OmapRemoveRange { .. } => {}
        Op::DeleteIfOmapEmpty { .. } => unreachable!("Planner::push follows no conditional delete"),
        // A head made from a snapshot (a rollback): its sequence comes next.
        Op::Clone { .. } => head.exists = true,
    }
}

/// Cuts a run of operations into store batches of at most `max`, and,
/// when the run holds clones, before a clone whose source or key an
/// earlier operation of the batch touched: the store applies a clone
/// against the state the batch started from.
pub struct Batches<I: Iterator<Item = Op>> {
    ops: std::iter::Peekable<I>,
    max: usize,
    clones: bool,
    touched: HashSet<Key>,
}

impl<I: Iterator<Item = Op>> Batches<I> {
    pub fn new(ops: I, max: usize, clones: bool) -> Batches<I> {
        assert!(max > 0, "batches of no operation");
        Batches { ops: ops.peekable(), max, clones, touched: HashSet::new() }
    }
}

impl<I: Iterator<Item = Op>> Iterator for Batches<I> {
    type Item = Batch;

    fn next(&mut self) -> Option<Batch> {
        let mut batch = Batch::new();
        self.touched.clear();
        while batch.len() < self.max {
            let Some(op) = self.ops.peek() else { break };
            if self.clones {
                if let Op::Clone { key, source } = op {
                    if self.touched.contains(source) || self.touched.contains(key) {
                        debug_assert!(!batch.is_empty(), "a clone cut from an empty batch");
                        break;
                    }
                }
                self.touched.insert(op.key().clone());
            }
            batch.push(self.ops.next().expect("peeked"));
        }
        debug_assert!(batch.len() <= self.max, "a batch of {} ops", batch.len());
        (!batch.is_empty()).then_some(batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(name: &[u8]) -> Key {
        Key::in_group(7, name).expect("key")
    }

    fn write(name: &[u8], offset: u64, data: &[u8]) -> Op {
        Op::Write { key: head(name), offset, data: data.to_vec() }
    }

    /// Applies `(op, snap)` runs the way the flusher does, one run per flush.
    fn flush(partition: &mut Partition, run: Vec<(Op, u64)>) {
        let mut planner = Planner::default();
        let mut ops = Vec::new();
        for (op, snap) in run {
            planner.push(partition, op, snap, false, &mut ops).expect("plan");
        }
        for batch in Batches::new(ops.into_iter(), 64, planner.cloned) {
            partition.apply(&batch).expect("apply");
        }
    }

    fn read_at(partition: &mut Partition, name: &[u8], snap: u64) -> Option<Vec<u8>> {
        let key = if snap == 0 { Some(head(name)) } else { resolve(partition, 7, name, snap).expect("resolve") };
        let key = key?;
        match partition.read(key.as_bytes(), 0, 8) {
            Ok(data) => Some(data),
            Err(StoreError::NotFound) => None,
            Err(err) => panic!("{err}"),
        }
    }

    #[test]
    fn each_snapshot_reads_what_the_object_held_when_it_was_taken() {
        let store = crate::TestStore::new(1);
        let mut store = store.open();
        let partition = store.partition_mut(0);
        // Before any snapshot: written with no sequence.
        flush(partition, vec![(write(b"o", 0, b"v0v0v0v0"), 0)]);
        // Snapshot 1 taken; two writes under it in one flush (one clone).
        flush(partition, vec![(write(b"o", 0, b"v1"), 1), (write(b"o", 2, b"V1"), 1)]);
        // Snapshots 2 and 3 taken with no write between; then a write and
        // a write of a new object, in one flush with a write under an
        // older sequence (a client that had not heard of 3 yet).
        flush(
            partition,
            vec![(write(b"o", 0, b"v3"), 3), (write(b"n", 0, b"new3new3"), 3), (write(b"o", 6, b"x1"), 1)],
        );
        // Snapshot 4: the object is deleted under it, then made again.
        flush(partition, vec![(Op::Delete { key: head(b"o") }, 4)]);
        flush(partition, vec![(write(b"o", 0, b"again44"), 4)]);
        assert_eq!(read_at(partition, b"o", 1).as_deref(), Some(&b"v0v0v0v0"[..]));
        assert_eq!(read_at(partition, b"o", 2).as_deref(), Some(&b"v1V1v0v0"[..]));
        assert_eq!(read_at(partition, b"o", 3).as_deref(), Some(&b"v1V1v0v0"[..]));
        assert_eq!(read_at(partition, b"o", 4).as_deref(), Some(&b"v3V1v0x1"[..]));
        assert_eq!(read_at(partition, b"o", 5).as_deref(), Some(&b"again44"[..]));
        assert_eq!(read_at(partition, b"o", 0).as_deref(), Some(&b"again44"[..]));
        // `n` was made after snapshot 3: absent at 1..=3, there at 4.
        for snap in 1..=3 {
            assert_eq!(read_at(partition, b"n", snap), None, "snapshot {snap}");
        }
        assert_eq!(read_at(partition, b"n", 4).as_deref(), Some(&b"new3new3"[..]));
        // One clone per snapshot interval written in: @1, @3, @4.
        let clones: Vec<u64> = partition
            .list(&7u32.to_be_bytes(), Some(&8u32.to_be_bytes()), 100)
            .iter()
            .filter_map(|k| split_clone_name(&k.as_bytes()[4..]).map(|(_, seq)| seq))
            .collect();
        assert_eq!(clones, vec![1, 3, 4]);
    }

    /// A new object written before a snapshot and again under it, in one
    /// flush: the heads did not know it, and the store did not hold it yet,
    /// so the planner took it for absent and made no clone (the snapshot
    /// read the later write). The run is now cut before the second write
    /// (`Planner::needs_apply`), as the flusher and replay do.
    #[test]
    fn an_object_made_and_written_under_a_snapshot_in_one_flush_keeps_its_clone() {
        let store = crate::TestStore::new(1);
        let mut store = store.open();
        let partition = store.partition_mut(0);
        let run = vec![(write(b"p", 0, b"before00"), 0), (write(b"p", 0, b"after111"), 1)];
        let mut planner = Planner::default();
        let mut ops = Vec::new();
        let mut cuts = 0;
        for (op, snap) in run {
            if planner.needs_apply(op.key(), false, snap, &ops) {
                cuts += 1;
                for batch in Batches::new(std::mem::take(&mut ops).into_iter(), 64, planner.cloned) {
                    partition.apply(&batch).expect("apply");
                }
                planner = Planner::default();
            }
            planner.push(partition, op, snap, false, &mut ops).expect("plan");
        }
        for batch in Batches::new(ops.into_iter(), 64, planner.cloned) {
            partition.apply(&batch).expect("apply");
        }
        assert_eq!(cuts, 1, "the write under the snapshot waits for the one before");
        assert_eq!(read_at(partition, b"p", 1).as_deref(), Some(&b"before00"[..]));
        assert_eq!(read_at(partition, b"p", 0).as_deref(), Some(&b"after111"[..]));
    }

    #[test]
    fn zeroing_truncating_and_deleting_a_head_leave_its_snapshot_whole() {
        let store = crate::TestStore::new(1);
        let mut store = store.open();
        let partition = store.partition_mut(0);
        let old: Vec<u8> = (0..3 * 4096u32).map(|i| (i % 251) as u8 + 1).collect();
        flush(partition, vec![(write(b"o", 0, &old), 0)]);
        // Under snapshot 1: zero the middle block in place, cut the tail.
        flush(partition, vec![(Op::Zero { key: head(b"o"), offset: 4096, len: 4096 }, 1)]);
        flush(partition, vec![(Op::Truncate { key: head(b"o"), size: 4096 }, 1)]);
        let at = |partition: &mut Partition, snap| {
            let key = resolve(partition, 7, b"o", snap).expect("resolve").expect("exists");
            partition.read(key.as_bytes(), 0, 3 * 4096).expect("read")
        };
        assert_eq!(at(partition, 1), old, "zeroing the head changed the snapshot's shared block");
        assert_eq!(partition.read(head(b"o").as_bytes(), 0, 3 * 4096).expect("read"), &old[..4096]);
        // Under snapshot 2, the head goes: both snapshots still read.
        flush(partition, vec![(Op::Delete { key: head(b"o") }, 2)]);
        assert_eq!(at(partition, 1), old);
        assert_eq!(at(partition, 2), &old[..4096]);
        assert_eq!(resolve(partition, 7, b"o", 3).expect("resolve"), None);
    }

    #[test]
    fn replaying_a_run_makes_no_second_clone_and_ends_in_the_same_state() {
        let store = crate::TestStore::new(1);
        let mut store = store.open();
        let partition = store.partition_mut(0);
        flush(partition, vec![(write(b"o", 0, b"before"), 0)]);
        let run = vec![(write(b"o", 0, b"after1"), 1), (write(b"o", 0, b"after2"), 2)];
        flush(partition, run.clone());
        // A crash before the trim: the same entries are applied again.
        flush(partition, run);
        assert_eq!(read_at(partition, b"o", 1).as_deref(), Some(&b"before"[..]));
        assert_eq!(read_at(partition, b"o", 2).as_deref(), Some(&b"after1"[..]));
        assert_eq!(read_at(partition, b"o", 3).as_deref(), Some(&b"after2"[..]));
    }

    #[test]
    fn batches_are_cut_before_a_clone_of_something_the_batch_touched() {
        let ops = vec![
            write(b"a", 0, b"1"),
            Op::Clone { key: clone_key(7, b"a", 1).expect("key"), source: head(b"a") },
            write(b"b", 0, b"1"),
            write(b"b", 0, b"2"),
        ];
        let sizes: Vec<usize> = Batches::new(ops.clone().into_iter(), 64, true).map(|b| b.len()).collect();
        assert_eq!(sizes, vec![1, 3]);
        let sizes: Vec<usize> = Batches::new(ops.into_iter(), 3, false).map(|b| b.len()).collect();
        assert_eq!(sizes, vec![3, 1]);
    }

    #[test]
    fn clone_names_split_back_and_sort_beside_their_head() {
        let key = clone_key(7, b"rbd_data.1.0", 0x0102).expect("key");
        assert_eq!(split_clone_name(&key.as_bytes()[4..]), Some((&b"rbd_data.1.0"[..], 0x0102)));
        assert!(is_clone_name(&key.as_bytes()[4..]) && !is_clone_name(b"rbd_data.1.0"));
        assert!(head(b"rbd_data.1.0") < key && key < head(b"rbd_data.1.00"));
        assert_eq!(split_clone_name(b"plain"), None);
    }
}
