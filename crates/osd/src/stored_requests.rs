//! The request ids of a PG's flushed entries, kept in the store (Ceph's
//! persisted "dup" entries).
//!
//! An id lives in the PG log with its entry, and in the in-memory
//! [`crate::requests::RequestTable`]. A flush trims the entry from the log;
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
//! table a member reports to peering holds it. The record is a ring of [`TRACKED_REQUESTS`] slots indexed
//! by seq, the same bound as the in-memory table. A flush writes the whole
//! 4 KiB blocks its seqs fall in (usually one), their other slots taken
//! from the table, never part of a block: see [`record`] for why.
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
use duplex_store::{Key, Op, Partition, ReadRequest, StoreError};

use crate::requests::{RequestTable, TRACKED_REQUESTS};

const SLOT_BYTES: usize = 32;
/// The whole record: one slot per tracked id.
pub const RECORD_BYTES: usize = TRACKED_REQUESTS * SLOT_BYTES;
/// The store's data block: what one write replaces whole.
const BLOCK_BYTES: usize = duplex_store::BLOCK_SIZE;
const SLOTS_PER_BLOCK: usize = BLOCK_BYTES / SLOT_BYTES;
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

/// The block of a PG's record that the last flush wrote, and the last seq
/// it covers. The next flush usually falls in the same block and goes on
/// right after: it then changes only its new slots, instead of building
/// all 128 from the table, which costs more than the rest of a flush of
/// one or two entries.
#[derive(Debug, Default)]
pub struct LastBlock {
    block: usize,
    through: u64,
    /// Empty: none.
    bytes: Vec<u8>,
}

impl LastBlock {
    /// The table changed other than by flushes (activation): build anew.
    pub fn forget(&mut self) {
        self.bytes.clear();
    }
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

/// A table with ids laid over it (peering's recovery installs them with an
/// object, and the table takes them only once that batch applied): an id
/// at a seq of `over` wins, as `RequestTable::set` would make it.
pub struct Overlay<'a> {
    pub table: &'a RequestTable,
    pub over: &'a [LoggedRequest],
}

impl IdsBySeq for Overlay<'_> {
    fn at_seq(&self, seq: u64) -> Option<RequestId> {
        match self.over.iter().rev().find(|request| request.seq == seq) {
            Some(request) => Some(RequestId { client: request.client, tid: request.tid }),
            None => self.table.at_seq(seq),
        }
    }
}

/// The store operations that record the ids of the entries `flushed`
/// (seqs, in log order, all of them now in the store) whole 4 KiB blocks
/// at a time, one write per run of adjacent blocks. A block's other slots
/// come from `table`: for each, the newest seq at most `flushed.end()` that
/// maps to it (or from `last`, the block the previous flush wrote, when
/// this flush continues it). Whole blocks, because a partial write reads
/// the old block first, and a block a power cut left failing its checksum
/// would then fail every flush of the PG; a whole one simply replaces it.
///
/// `table` must hold every id of the PG's history up to `flushed.end()`
/// that this OSD knows, the stored ones too (loaded at start, or given by
/// peering at activation), or the write would clear their slots.
pub fn record(
    partition: u32,
    pg: u32,
    table: &impl IdsBySeq,
    flushed: RangeInclusive<u64>,
    last: &mut LastBlock,
) -> Vec<Op> {
    let (first, newest) = (*flushed.start(), *flushed.end());
    if first > newest {
        return Vec::new();
    }
    let blocks: Vec<usize> = if newest - first >= (TRACKED_REQUESTS - SLOTS_PER_BLOCK) as u64 {
        (0..BLOCKS).collect()
    } else {
        let (from, to) = (slot_of(first) / SLOTS_PER_BLOCK, slot_of(newest) / SLOTS_PER_BLOCK);
        if from <= to {
            (from..=to).collect()
        } else {
            // The flushed seqs wrap around the ring.
            (from..BLOCKS).chain(0..=to).collect()
        }
    };
    let mut continued = if !last.bytes.is_empty() && last.through.checked_add(1) == Some(first) {
        Some((last.block, std::mem::take(&mut last.bytes)))
    } else {
        None
    };
    let mut ops = Vec::new();
    let mut run: Option<(usize, Vec<u8>)> = None;
    for block in blocks {
        let bytes = if let Some((_, mut bytes)) = continued.take_if(|(cached, _)| *cached == block) {
            // Only the new seqs' slots change (the range is short here).
            for seq in first..=newest {
                let slot = slot_of(seq);
                if slot / SLOTS_PER_BLOCK == block {
                    let at = (slot % SLOTS_PER_BLOCK) * SLOT_BYTES;
                    let id = table.at_seq(seq).unwrap_or_default();
                    bytes[at..at + SLOT_BYTES].copy_from_slice(&encode_slot(id, seq));
                }
            }
            bytes
        } else {
            let mut bytes = Vec::with_capacity(BLOCK_BYTES);
            for slot in block * SLOTS_PER_BLOCK..(block + 1) * SLOTS_PER_BLOCK {
                let seq = newest_seq_in_slot(slot, newest);
                let id = seq.and_then(|seq| table.at_seq(seq)).unwrap_or_default();
                bytes.extend_from_slice(&encode_slot(id, seq.unwrap_or(0)));
            }
            bytes
        };
        debug_assert_eq!(bytes.len(), BLOCK_BYTES);
        if block == slot_of(newest) / SLOTS_PER_BLOCK {
            *last = LastBlock { block, through: newest, bytes: bytes.clone() };
        }
        match run.as_mut() {
            Some((start, data)) if *start + data.len() / BLOCK_BYTES == block => data.extend_from_slice(&bytes),
            _ => {
                if let Some((start, data)) = run.replace((block, bytes)) {
                    ops.push(Op::Write { key: key(partition, pg), offset: (start * BLOCK_BYTES) as u64, data });
                }
            }
        }
    }
    if let Some((start, data)) = run {
        ops.push(Op::Write { key: key(partition, pg), offset: (start * BLOCK_BYTES) as u64, data });
    }
    ops
}

/// The newest seq at most `last` whose entry's id goes in `slot` (none
/// when `last` comes before the slot's first seq).
fn newest_seq_in_slot(slot: usize, last: u64) -> Option<u64> {
    let slot = slot as u64;
    (last >= slot).then(|| last - (last - slot) % TRACKED_REQUESTS as u64)
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
    Op::Write { key: key(partition, pg), offset: 0, data }
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
/// A block the store finds damaged holds none, loudly: a resend of one of
/// its writes then runs again, which is what happened before ids were
/// kept, rather than the PG never peering again.
pub fn read(partition: &mut Partition, pg: u32) -> Result<Vec<LoggedRequest>, StoreError> {
    let key = key(partition.index(), pg);
    let blocks: Vec<ReadRequest<'_>> = (0..BLOCKS)
        .map(|block| ReadRequest { key: key.as_bytes(), offset: (block * BLOCK_BYTES) as u64, len: BLOCK_BYTES as u64 })
        .collect();
    let mut bytes = vec![0u8; RECORD_BYTES];
    for (block, result) in partition.read_many(&blocks).into_iter().enumerate() {
        match result {
            Ok(data) => {
                let at = block * BLOCK_BYTES;
                let len = data.len().min(BLOCK_BYTES);
                bytes[at..at + len].copy_from_slice(&data[..len]);
            }
            Err(StoreError::NotFound) => return Ok(Vec::new()),
            Err(err @ StoreError::ChecksumMismatch { .. }) => {
                // A power cut in a flush can leave this: the next flush of
                // the block replaces it whole.
                tracing::warn!(pg, block, %err, "a block of the PG's stored request ids is damaged; its ids are lost (resends of those writes run again)");
            }
            Err(err) => return Err(err),
        }
    }
    Ok(decode(&bytes))
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
            let Op::Write { offset, data, .. } = op else { panic!("only writes: {op:?}") };
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
            table.set(id(seq % 3 + 1, seq * 2), crate::requests::RequestState::Committed, seq);
        }
        table
    }

    fn logged(seqs: impl IntoIterator<Item = u64>) -> Vec<LoggedRequest> {
        seqs.into_iter().map(|seq| LoggedRequest { client: seq % 3 + 1, tid: seq * 2, seq }).collect()
    }

    #[test]
    fn a_flush_writes_whole_blocks_and_wraps() {
        let last = TRACKED_REQUESTS as u64;
        let table = table_of(last - 2..last + 3);
        let ops = record(0, 9, &table, last - 2..=last + 2, &mut LastBlock::default());
        assert_eq!(ops.len(), 2, "the end of the ring, then its start");
        assert!(ops.iter().all(|op| matches!(op, Op::Write { offset, data, .. }
            if (*offset as usize).is_multiple_of(BLOCK_BYTES) && data.len() == BLOCK_BYTES)));
        let mut bytes = Vec::new();
        apply(&mut bytes, &ops);
        assert_eq!(decode(&bytes), logged(last - 2..last + 3));
    }

    #[test]
    fn a_block_keeps_the_ids_of_earlier_flushes_and_clears_ids_past_its_window() {
        let mut bytes = Vec::new();
        apply(&mut bytes, &record(0, 9, &table_of(1..=10), 1..=10, &mut LastBlock::default()));
        let table = table_of((1..=12).filter(|seq| *seq != 11));
        let ops = record(0, 9, &table, 11..=12, &mut LastBlock::default());
        assert_eq!(ops.len(), 1);
        apply(&mut bytes, &ops);
        assert_eq!(decode(&bytes), logged((1..=12).filter(|seq| *seq != 11)), "11 had no client");
        // Seq 1 + TRACKED_REQUESTS takes slot 1: seq 1 goes.
        let next = 1 + TRACKED_REQUESTS as u64;
        apply(&mut bytes, &record(0, 9, &table_of([next]), next..=next, &mut LastBlock::default()));
        assert_eq!(
            decode(&bytes).first(),
            logged([next]).first(),
            "and so does every id of that block the table lacks"
        );
        assert_eq!(decode(&bytes).len(), 1);
    }

    #[test]
    fn a_rewrite_keeps_exactly_the_given_ids() {
        let mut bytes = Vec::new();
        apply(&mut bytes, &record(0, 9, &table_of(3..=5), 3..=5, &mut LastBlock::default()));
        let authoritative = [logged([3])[0], LoggedRequest { client: 3, tid: 1, seq: 9 }];
        apply(&mut bytes, &[rewrite(0, 9, &authoritative)]);
        assert_eq!(decode(&bytes), authoritative.to_vec(), "4 and 5 were rolled back");
    }

    #[test]
    fn a_torn_or_misplaced_slot_is_ignored() {
        let mut bytes = Vec::new();
        apply(&mut bytes, &record(0, 9, &table_of(1..=2), 1..=2, &mut LastBlock::default()));
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
        for op in record(partition.index(), pg, &table_of(7..=8), 7..=8, &mut LastBlock::default()) {
            batch.push(op);
        }
        partition.apply(&batch).unwrap();
        assert_eq!(read(partition, pg).unwrap(), logged(7..=8));
        let other = crate::pg::pg_key(1, 7).unwrap();
        assert!(read(partition, other).unwrap().is_empty(), "each PG has its own record");
    }

    #[test]
    fn a_damaged_block_loses_only_its_ids_and_the_next_flush_replaces_it() {
        use std::os::unix::fs::FileExt;
        let test_store = crate::TestStore::new(1);
        let pg = crate::pg::pg_key(1, 5).unwrap();
        // Slots 1..=200: block 0 holds seqs 1..=127, block 1 the rest.
        let table = table_of(1..=200);
        let mut store = test_store.open();
        let mut batch = duplex_store::Batch::new();
        for op in record(0, pg, &table, 1..=200, &mut LastBlock::default()) {
            batch.push(op);
        }
        store.partition_mut(0).apply(&batch).unwrap();
        let offset = store.partition_mut(0).locate_data(key(0, pg).as_bytes(), 0).unwrap();
        store.close().unwrap();
        let file = std::fs::OpenOptions::new().read(true).write(true).open(&test_store.path).unwrap();
        let mut byte = [0u8; 1];
        file.read_exact_at(&mut byte, offset + 100).unwrap();
        file.write_all_at(&[byte[0] ^ 1], offset + 100).unwrap();
        drop(file);

        let mut store = test_store.open();
        let partition = store.partition_mut(0);
        assert_eq!(read(partition, pg).unwrap(), logged(128..=200), "block 0's ids are lost, not the rest");
        // Seq 4097 falls in block 0: the flush writes the block whole, so it
        // does not read the bad one first (a partial write would fail).
        let table = table_of((1..=200).chain([4097]));
        let mut batch = duplex_store::Batch::new();
        for op in record(0, pg, &table, 4097..=4097, &mut LastBlock::default()) {
            batch.push(op);
        }
        partition.apply(&batch).unwrap();
        assert_eq!(read(partition, pg).unwrap(), logged((2..=200).chain([4097])), "seq 1's slot holds 4097 now");
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
            let mut cached = LastBlock::default();
            for step in steps {
                let ops = record(0, 1, &table, last + 1..=last + step, &mut cached);
                let built = record(0, 1, &table, last + 1..=last + step, &mut LastBlock::default());
                prop_assert_eq!(&ops, &built, "continuing the last block writes what building it writes");
                apply(&mut bytes, &ops);
                last += step;
            }
            let window = last.saturating_sub(TRACKED_REQUESTS as u64);
            let expected = logged(with_ids.iter().copied().filter(|seq| *seq > window && *seq <= last));
            prop_assert_eq!(decode(&bytes), expected);
        }
    }
}
