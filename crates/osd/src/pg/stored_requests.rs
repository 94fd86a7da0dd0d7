//! The request ids of a PG's flushed entries, kept in the store (Ceph's
//! persisted "dup" entries).
//!
//! An id lives in the PG log with its entry, and in the in-memory
//! [`crate::pg::requests::RequestTable`]. A flush trims the entry from the log;
//! a restart then rebuilt the table from the log alone, so the id was gone.
//! The simulator found what that costs (seeds 4 and 65, size 2, two faults
//! at once): a write logged by the one member left was answered `Retry`;
//! the member flushed, trimmed and restarted; peering kept the write, but
//! the client's resend found no id and ran it again, after newer writes, so
//! a value already overwritten came back.
//!
//! So every flush also writes its entries' ids here, in the same flush
//! (before the log is trimmed). The record is loaded into the table once
//! ([`crate::pg::Pg::load_stored_ids`]: at start before replaying the log,
//! or at the PG's first peering query when it had no log then), so the
//! table a member reports to peering holds it. The record is a ring of
//! [`TRACKED_REQUESTS`] slots indexed by seq, the same bound as the
//! in-memory table, pre-allocated in one extent. A flush writes the slots
//! of its seqs only, through the store's journal: see [`record`] for why.
//!
//! A slot is 32 bytes: client, tid and seq (little-endian u64s), a crc32c of
//! those 24 bytes, and 4 zero bytes. A slot whose crc, or whose seq's
//! position, does not match is ignored, like one never written (client 0).
//!
//! Only this member's history is in its ring. When activation replaces that
//! history (the member was rebuilt by recovery, or its log diverged), the
//! ring is rewritten whole with the authoritative ids peering sent, so ids
//! of rolled-back entries never come back as "already applied".
//!
//! The record is an object in the store group of pool 0, next to the
//! last-active interval (`stored_interval.rs` says why that group).

use std::ops::RangeInclusive;

use duplex_oplog::RequestId;
use duplex_proto::peering::LoggedRequest;
use duplex_store::{Batch, Key, Op, Partition, ReadRequest, StoreError};

use crate::pg::requests::{RequestTable, TRACKED_REQUESTS};

const SLOT_BYTES: usize = 32;
/// The whole record: one slot per tracked id.
pub const RECORD_BYTES: usize = TRACKED_REQUESTS * SLOT_BYTES;
/// The store's data block: what one write replaces whole.
const BLOCK_BYTES: usize = duplex_store::BLOCK_SIZE;
const BLOCKS: usize = RECORD_BYTES / BLOCK_BYTES;
const NAME: &[u8] = b"requests";

const _: () =
    assert!(BLOCK_BYTES.is_multiple_of(SLOT_BYTES) && RECORD_BYTES.is_multiple_of(BLOCK_BYTES), "slots tile blocks");

/// The object that holds PG `pg`'s ids, on partition `partition`.
fn key(partition: u32, pg: u32) -> Key {
    let mut name = pg.to_be_bytes().to_vec();
    name.extend_from_slice(NAME);
    Key::in_group(partition, &name).expect("a 12-byte name in a group is a valid key")
}

fn slot_of(seq: u64) -> usize {
    (seq % TRACKED_REQUESTS as u64) as usize
}

fn encode_slot(id: RequestId, seq: u64) -> [u8; SLOT_BYTES] {
    let mut slot = [0u8; SLOT_BYTES];
    if id.is_none() {
        // An entry without a client clears its slot: nothing to answer.
        return slot;
    }
    slot[0..8].copy_from_slice(&id.client.to_le_bytes());
    slot[8..16].copy_from_slice(&id.tid.to_le_bytes());
    slot[16..24].copy_from_slice(&seq.to_le_bytes());
    let crc = crc32c::crc32c(&slot[..24]);
    slot[24..28].copy_from_slice(&crc.to_le_bytes());
    slot
}

fn decode_slot(slot: &[u8], index: usize) -> Option<LoggedRequest> {
    debug_assert!(slot.len() == SLOT_BYTES && index < TRACKED_REQUESTS, "slot {index} is not one of the ring's");
    let word = |at: usize| u64::from_le_bytes(slot[at..at + 8].try_into().expect("8 bytes"));
    let client = word(0);
    if client == 0 {
        return None;
    }
    let crc = u32::from_le_bytes(slot[24..28].try_into().expect("4 bytes"));
    let seq = word(16);
    if crc != crc32c::crc32c(&slot[..24]) || slot_of(seq) != index {
        return None;
    }
    Some(LoggedRequest { client, tid: word(8), seq })
}

/// Where [`record`] finds the id of the entry at a seq.
pub trait IdsBySeq {
    fn at_seq(&self, seq: u64) -> Option<RequestId>;
}

impl IdsBySeq for RequestTable {
    fn at_seq(&self, seq: u64) -> Option<RequestId> {
        RequestTable::at_seq(self, seq)
    }
}

/// Ids given with their seqs (peering's recovery installs them with an
/// object): the last one given for a seq wins, as `RequestTable::set`
/// would make it.
impl IdsBySeq for [LoggedRequest] {
    fn at_seq(&self, seq: u64) -> Option<RequestId> {
        self.iter().rev().find(|request| request.seq == seq).map(|r| RequestId { client: r.client, tid: r.tid })
    }
}

/// The store operations that record `ids` (peering's recovery installs
/// them with an object, in the same batch): the slots of their own seqs,
/// one op per run of consecutive seqs. Other slots keep what they hold, so
/// this needs nothing from the table (whose stored ids may not be loaded
/// yet).
pub fn record_ids(partition: u32, pg: u32, ids: &[LoggedRequest]) -> Vec<Op> {
    let mut seqs: Vec<u64> = ids.iter().map(|request| request.seq).collect();
    seqs.sort_unstable();
    seqs.dedup();
    seqs.chunk_by(|a, b| a.checked_add(1) == Some(*b))
        .flat_map(|run| record(partition, pg, ids, run[0]..=run[run.len() - 1]))
        .collect()
}

/// The store operations that record the ids of the entries `flushed`
/// (seqs, in log order, all of them now in the store): each seq's slot,
/// through the store's journal ([`Op::WriteJournaled`]), one op per run of
/// adjacent slots. A flush of a few entries then costs the store a few
/// dozen journal bytes, where whole 4 KiB blocks per PG per flush doubled
/// the bytes written at queue depth 1 (issue 22). The blocks themselves
/// are written in place by the store's checkpoints; a power cut cannot
/// tear them, since replay rebuilds them from the journal.
///
/// Only these slots change: a seq without an id clears its slot, and of
/// more than a ring of seqs only the last ring's are written.
pub fn record(partition: u32, pg: u32, table: &(impl IdsBySeq + ?Sized), flushed: RangeInclusive<u64>) -> Vec<Op> {
    let (first, newest) = (*flushed.start(), *flushed.end());
    if first > newest {
        return Vec::new();
    }
    let first = first.max(newest.saturating_sub(TRACKED_REQUESTS as u64 - 1));
    let mut ops = Vec::new();
    let mut run: Option<(usize, Vec<u8>)> = None;
    for seq in first..=newest {
        let slot = slot_of(seq);
        let bytes = encode_slot(table.at_seq(seq).unwrap_or_default(), seq);
        match run.as_mut() {
            Some((start, data)) if *start + data.len() / SLOT_BYTES == slot => data.extend_from_slice(&bytes),
            _ => {
                // The first seq, or the ring wrapped to slot 0.
                if let Some((start, data)) = run.replace((slot, bytes.to_vec())) {
                    ops.push(slots_op(partition, pg, start, data));
                }
            }
        }
    }
    if let Some((start, data)) = run {
        ops.push(slots_op(partition, pg, start, data));
    }
    debug_assert!(ops.len() <= 2, "at most one lap of the ring: its end, then its start");
    ops
}

fn slots_op(partition: u32, pg: u32, first_slot: usize, data: Vec<u8>) -> Op {
    debug_assert!(first_slot * SLOT_BYTES + data.len() <= RECORD_BYTES, "slots written past the record's end");
    Op::WriteJournaled { key: key(partition, pg), offset: (first_slot * SLOT_BYTES) as u64, data }
}

/// The store operation that gives PG `pg` its whole record up front, in
/// one extent, so that every later [`record`] goes through the journal
/// (a no-op when the record exists).
pub fn create(partition: u32, pg: u32) -> Op {
    Op::CreatePreallocated { key: key(partition, pg), size: RECORD_BYTES as u64 }
}

/// The store operation that replaces the whole record with `requests`
/// (the authoritative ids peering sent): every other slot is cleared.
pub fn rewrite(partition: u32, pg: u32, requests: &[LoggedRequest]) -> Op {
    let mut data = vec![0u8; RECORD_BYTES];
    let mut sorted: Vec<&LoggedRequest> = requests.iter().collect();
    // By seq, so that of two ids in one slot the newer stays.
    sorted.sort_by_key(|request| request.seq);
    for request in sorted {
        let at = slot_of(request.seq) * SLOT_BYTES;
        let id = RequestId { client: request.client, tid: request.tid };
        data[at..at + SLOT_BYTES].copy_from_slice(&encode_slot(id, request.seq));
    }
    // Journaled like the flushes' slots: never overwritten in place.
    Op::WriteJournaled { key: key(partition, pg), offset: 0, data }
}

/// The ids a record's bytes hold, by seq. Any bytes decode: a slot that is
/// not a valid id is skipped, and so is a partial slot at the end.
pub fn decode(bytes: &[u8]) -> Vec<LoggedRequest> {
    let mut requests: Vec<LoggedRequest> = bytes
        .chunks_exact(SLOT_BYTES)
        .take(TRACKED_REQUESTS)
        .enumerate()
        .filter_map(|(index, slot)| decode_slot(slot, index))
        .collect();
    requests.sort_by_key(|request| request.seq);
    requests
}

/// The ids this OSD's store holds for `pg`, by seq (none: never flushed).
pub fn read(partition: &mut Partition, pg: u32) -> Result<Vec<LoggedRequest>, StoreError> {
    read_record(partition, pg).map(Option::unwrap_or_default)
}

/// [`read`], and whether the record exists (`None`: this PG never flushed
/// here, so its first flush allocates the record, [`RECORD_BYTES`]).
/// A block the store finds damaged holds none, loudly: a resend of one of
/// its writes then runs again, which is what happened before ids were
/// kept, rather than the PG never peering again. The block is replaced
/// (zeros: its ids are gone) so that the next flush's slots, which the
/// store merges into the block, do not fail on it.
pub fn read_record(partition: &mut Partition, pg: u32) -> Result<Option<Vec<LoggedRequest>>, StoreError> {
    let key = key(partition.index(), pg);
    let blocks: Vec<ReadRequest<'_>> = (0..BLOCKS)
        .map(|block| ReadRequest { key: key.as_bytes(), offset: (block * BLOCK_BYTES) as u64, len: BLOCK_BYTES as u64 })
        .collect();
    let mut bytes = vec![0u8; RECORD_BYTES];
    let mut repair = Batch::new();
    for (block, result) in partition.read_many(&blocks).into_iter().enumerate() {
        match result {
            Ok(data) => {
                let at = block * BLOCK_BYTES;
                let len = data.len().min(BLOCK_BYTES);
                bytes[at..at + len].copy_from_slice(&data[..len]);
            }
            Err(StoreError::NotFound) => return Ok(None),
            Err(err @ StoreError::ChecksumMismatch { .. }) => {
                tracing::warn!(pg, block, %err, "a block of the PG's stored request ids is damaged; its ids are lost (resends of those writes run again)");
                repair.write_journaled(key.clone(), (block * BLOCK_BYTES) as u64, vec![0u8; BLOCK_BYTES]);
            }
            Err(err) => return Err(err),
        }
    }
    if !repair.is_empty() {
        partition.apply(&repair)?;
    }
    Ok(Some(decode(&bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn id(client: u64, tid: u64) -> RequestId {
        RequestId { client, tid }
    }

    /// The record's bytes after applying `ops` (writes only) to an empty record.
    fn apply(bytes: &mut Vec<u8>, ops: &[Op]) {
        for op in ops {
            let (Op::Write { offset, data, .. } | Op::WriteJournaled { offset, data, .. }) = op else {
                panic!("only writes: {op:?}")
            };
            let end = *offset as usize + data.len();
            assert!(end <= RECORD_BYTES, "a write past the record");
            if bytes.len() < end {
                bytes.resize(end, 0);
            }
            bytes[*offset as usize..end].copy_from_slice(data);
        }
    }

    fn table_of(seqs: impl IntoIterator<Item = u64>) -> RequestTable {
        let mut table = RequestTable::default();
        for seq in seqs {
            table.set(id(seq % 3 + 1, seq * 2), crate::pg::requests::RequestState::Committed, seq);
        }
        table
    }

    fn logged(seqs: impl IntoIterator<Item = u64>) -> Vec<LoggedRequest> {
        seqs.into_iter().map(|seq| LoggedRequest { client: seq % 3 + 1, tid: seq * 2, seq }).collect()
    }

    #[test]
    fn a_flush_writes_its_slots_through_the_journal_and_wraps() {
        let last = TRACKED_REQUESTS as u64;
        let table = table_of(last - 2..last + 3);
        let ops = record(0, 9, &table, last - 2..=last + 2);
        assert_eq!(ops.len(), 2, "the end of the ring, then its start");
        assert!(ops.iter().all(|op| matches!(op, Op::WriteJournaled { data, .. } if data.len() < BLOCK_BYTES)));
        let mut bytes = Vec::new();
        apply(&mut bytes, &ops);
        assert_eq!(decode(&bytes), logged(last - 2..last + 3));
    }

    #[test]
    fn a_flush_keeps_the_ids_of_earlier_flushes_and_a_new_lap_replaces_a_slot() {
        let mut bytes = Vec::new();
        apply(&mut bytes, &record(0, 9, &table_of(1..=10), 1..=10));
        let table = table_of((1..=12).filter(|seq| *seq != 11));
        let ops = record(0, 9, &table, 11..=12);
        assert_eq!(ops.len(), 1);
        assert!(
            matches!(&ops[0], Op::WriteJournaled { offset, data, .. }
            if *offset == 11 * SLOT_BYTES as u64 && data.len() == 2 * SLOT_BYTES),
            "{:?}",
            ops[0]
        );
        apply(&mut bytes, &ops);
        assert_eq!(decode(&bytes), logged((1..=12).filter(|seq| *seq != 11)), "11 had no client");
        // Seq 1 + TRACKED_REQUESTS takes slot 1: seq 1 goes, the rest stay.
        let next = 1 + TRACKED_REQUESTS as u64;
        apply(&mut bytes, &record(0, 9, &table_of([next]), next..=next));
        let expected: Vec<u64> = (2..=12).filter(|seq| *seq != 11).chain([next]).collect();
        assert_eq!(decode(&bytes), logged(expected));
    }

    #[test]
    fn an_install_writes_only_the_slots_of_its_ids() {
        let mut bytes = Vec::new();
        apply(&mut bytes, &record(0, 9, &table_of(1..=10), 1..=10));
        let installed = [
            LoggedRequest { client: 7, tid: 70, seq: 4 },
            LoggedRequest { client: 7, tid: 71, seq: 5 },
            LoggedRequest { client: 8, tid: 1, seq: 9 },
        ];
        let ops = record_ids(0, 9, &installed);
        assert_eq!(ops.len(), 2, "one op per run of seqs: 4-5, then 9");
        apply(&mut bytes, &ops);
        let mut expected = logged((1..=10).filter(|seq| ![4, 5, 9].contains(seq)));
        expected.extend(installed);
        expected.sort_by_key(|request| request.seq);
        assert_eq!(decode(&bytes), expected, "the other slots keep what they held");
    }

    #[test]
    fn a_rewrite_keeps_exactly_the_given_ids() {
        let mut bytes = Vec::new();
        apply(&mut bytes, &record(0, 9, &table_of(3..=5), 3..=5));
        let authoritative = [logged([3])[0], LoggedRequest { client: 3, tid: 1, seq: 9 }];
        apply(&mut bytes, &[rewrite(0, 9, &authoritative)]);
        assert_eq!(decode(&bytes), authoritative.to_vec(), "4 and 5 were rolled back");
    }

    #[test]
    fn a_torn_or_misplaced_slot_is_ignored() {
        let mut bytes = Vec::new();
        apply(&mut bytes, &record(0, 9, &table_of(1..=2), 1..=2));
        bytes[SLOT_BYTES + 9] ^= 1;
        assert_eq!(decode(&bytes), logged([2]), "slot 1's crc fails");
        let moved = bytes[2 * SLOT_BYTES..3 * SLOT_BYTES].to_vec();
        bytes.resize(6 * SLOT_BYTES, 0);
        bytes[5 * SLOT_BYTES..6 * SLOT_BYTES].copy_from_slice(&moved);
        assert_eq!(decode(&bytes).len(), 1, "a valid slot in the wrong place does not count");
    }

    #[test]
    fn the_record_round_trips_through_a_store() {
        let test_store = crate::TestStore::new(2);
        let mut store = test_store.open();
        let pg = crate::pg::pg_key(1, 5).unwrap();
        let partition = store.partition_mut((pg % 2) as usize);
        assert!(read(partition, pg).unwrap().is_empty(), "nothing flushed yet");
        let mut batch = duplex_store::Batch::new();
        for op in record(partition.index(), pg, &table_of(7..=8), 7..=8) {
            batch.push(op);
        }
        partition.apply(&batch).unwrap();
        assert_eq!(read(partition, pg).unwrap(), logged(7..=8));
        let other = crate::pg::pg_key(1, 7).unwrap();
        assert!(read(partition, other).unwrap().is_empty(), "each PG has its own record");
    }

    #[test]
    fn flushes_cost_journal_bytes_not_blocks_and_survive_a_crash() {
        let test_store = crate::TestStore::new(1);
        let pg = crate::pg::pg_key(1, 5).unwrap();
        let mut store = test_store.open();
        let partition = store.partition_mut(0);
        let mut batch = duplex_store::Batch::new();
        batch.push(create(0, pg));
        partition.apply(&batch).unwrap();
        let before = partition.stats();
        for seq in 1..=40u64 {
            let mut batch = duplex_store::Batch::new();
            for op in record(0, pg, &table_of(1..=seq), seq..=seq) {
                batch.push(op);
            }
            let info = partition.apply(&batch).unwrap();
            assert_eq!(info.data_blocks, 0, "seq {seq}: no data block is written in place");
            assert_eq!(info.journal_bytes, 512, "seq {seq}: one sector of journal");
        }
        assert_eq!(partition.stats().data_blocks_written, before.data_blocks_written);
        assert_eq!(read(partition, pg).unwrap(), logged(1..=40));
        // Dropped without a checkpoint: the ids are in the journal alone.
        drop(store);
        let mut store = test_store.open();
        assert_eq!(read(store.partition_mut(0), pg).unwrap(), logged(1..=40));
    }

    #[test]
    fn a_damaged_block_loses_only_its_ids_and_reading_replaces_it() {
        use std::os::unix::fs::FileExt;
        let test_store = crate::TestStore::new(1);
        let pg = crate::pg::pg_key(1, 5).unwrap();
        // Slots 1..=200: block 0 holds seqs 1..=127, block 1 the rest.
        let table = table_of(1..=200);
        let mut store = test_store.open();
        let mut batch = duplex_store::Batch::new();
        batch.push(create(0, pg));
        for op in record(0, pg, &table, 1..=200) {
            batch.push(op);
        }
        store.partition_mut(0).apply(&batch).unwrap();
        // The checkpoint of close writes the blocks in place.
        store.close().unwrap();
        let mut store = test_store.open();
        let offset = store.partition_mut(0).locate_data(key(0, pg).as_bytes(), 0).unwrap();
        drop(store);
        let file = std::fs::OpenOptions::new().read(true).write(true).open(&test_store.path).unwrap();
        let mut byte = [0u8; 1];
        file.read_exact_at(&mut byte, offset + 100).unwrap();
        file.write_all_at(&[byte[0] ^ 1], offset + 100).unwrap();
        drop(file);

        let mut store = test_store.open();
        let partition = store.partition_mut(0);
        assert_eq!(read(partition, pg).unwrap(), logged(128..=200), "block 0's ids are lost, not the rest");
        // Seq 4097 falls in block 0: the store merges the slot into the
        // block, which reading replaced, so the flush does not fail on it.
        let table = table_of((1..=200).chain([4097]));
        let mut batch = duplex_store::Batch::new();
        for op in record(0, pg, &table, 4097..=4097) {
            batch.push(op);
        }
        partition.apply(&batch).unwrap();
        assert_eq!(read(partition, pg).unwrap(), logged((128..=200).chain([4097])));
    }

    proptest! {
        #[test]
        fn any_bytes_decode_to_valid_ids_without_panicking(bytes in proptest::collection::vec(any::<u8>(), 0..4 * SLOT_BYTES + 7)) {
            let requests = decode(&bytes);
            prop_assert!(requests.windows(2).all(|w| w[0].seq <= w[1].seq));
            prop_assert!(requests.iter().all(|r| r.client != 0));
        }

        #[test]
        fn flushes_in_any_steps_leave_the_ids_of_the_last_ring_of_seqs(
            with_ids in proptest::collection::btree_set(1u64..3 * TRACKED_REQUESTS as u64, 0..300),
            steps in proptest::collection::vec(1u64..2 * TRACKED_REQUESTS as u64, 1..6),
        ) {
            let table = table_of(with_ids.iter().copied());
            let mut bytes = Vec::new();
            let mut last = 0u64;
            for step in steps {
                let ops = record(0, 1, &table, last + 1..=last + step);
                apply(&mut bytes, &ops);
                last += step;
            }
            let window = last.saturating_sub(TRACKED_REQUESTS as u64);
            let expected = logged(with_ids.iter().copied().filter(|seq| *seq > window && *seq <= last));
            prop_assert_eq!(decode(&bytes), expected);
        }
    }
}
