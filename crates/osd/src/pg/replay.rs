//! Replay: applying a PG's live operation-log entries to the object store.
//!
//! Used at start (before serving) and by the non-priority thread's flush.
//!
//! **Why replaying everything is correct.** An entry leaves the log (trim)
//! only after the store batch holding it has returned from `apply`, that
//! is, after it is durable. Every live entry may therefore be missing from
//! the store, or half there after a crash mid-batch: the store promises
//! all-or-nothing for a batch's metadata, but old-or-new per data block.
//!
//! Each logged operation is absolute: a write sets bytes, a truncate sets
//! the size, a delete removes. Re-applying the live entries in order, over
//! whatever mix of their effects the store holds, ends in the state the
//! whole sequence defines; the property test checks it from random partial
//! states.
//!
//! The tempting shortcut, an "applied through" marker kept in the store, is
//! wrong: it could commit while some of its batch's data blocks were not
//! yet written, and those writes would be skipped forever.

use anyhow::Context;
use duplex_oplog::{Entry, OpKind};
use duplex_store::{Batch, Key, Op, Partition, Store, StoreError};

use crate::pg::SharedPg;
use crate::snaps::{Batches, Planner};

/// Entries per store batch (one device flush each).
pub const REPLAY_BATCH: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("log entry {seq}: object name is not a valid store key")]
    BadKey { seq: u64 },
    #[error("log entry {seq}: a zero without its 8-byte length")]
    BadZero { seq: u64 },
    #[error("log entry {seq}: an omap payload that does not decode: {why}")]
    BadOmap { seq: u64, why: String },
    #[error("applying log entries up to seq {seq}: {source}")]
    Store { seq: u64, source: StoreError },
}

/// The store key of an entry's object: the PG as the group, then the name.
pub fn store_key(entry: &Entry) -> Result<Key, ReplayError> {
    Key::in_group(entry.pg, &entry.object).map_err(|_| ReplayError::BadKey { seq: entry.seq })
}

/// The store operations an entry stands for, in order, each with whether
/// it applies only to an absent object (a copy-up's write, a chunk put's):
/// one for every kind but a chunk put's and unref's two.
pub fn store_ops(entry: Entry) -> Result<Vec<(Op, bool)>, ReplayError> {
    let (seq, kind) = (entry.seq, entry.op);
    Ok(match kind {
        // A backfill target's: the backfill copies the write's effect.
        OpKind::Elided => Vec::new(),
        OpKind::ChunkPut => {
            let key = store_key(&entry)?;
            let mut data = entry.data;
            let reference = (entry.offset as usize).min(data.len());
            let chunk = data.split_off(reference);
            if data.is_empty() {
                return Err(ReplayError::BadOmap { seq, why: "a chunk put without its reference".into() });
            }
            let write = Op::Write { key: key.clone(), offset: 0, data: chunk };
            vec![(write, true), (Op::OmapSet { key, entries: vec![(data, Vec::new())] }, false)]
        }
        OpKind::ChunkUnref => {
            let key = store_key(&entry)?;
            let remove = Op::OmapRemove { key: key.clone(), keys: vec![entry.data] };
            vec![(remove, false), (Op::DeleteIfOmapEmpty { key }, false)]
        }
        OpKind::TierUpdate => {
            use duplex_proto::tier::Action;
            let key = store_key(&entry)?;
            let actions = duplex_proto::tier::decode_actions(&entry.data)
                .map_err(|e| ReplayError::BadOmap { seq, why: e.to_string() })?;
            // Each action is absolute (a set, a removal, bytes): replayed
            // over a store that holds its effect, it changes nothing.
            actions
                .into_iter()
                .map(|action| {
                    let op = match action {
                        Action::SetEntry { key: k, value } => {
                            Op::OmapSet { key: key.clone(), entries: vec![(k, value)] }
                        }
                        Action::RemoveEntry { key: k } => Op::OmapRemove { key: key.clone(), keys: vec![k] },
                        Action::Zero { offset, len } => Op::Zero { key: key.clone(), offset, len },
                        Action::Write { offset, data } => Op::Write { key: key.clone(), offset, data },
                    };
                    (op, false)
                })
                .collect()
        }
        _ => vec![(store_op(entry)?, kind == OpKind::CopyUp)],
    })
}

/// Whether `entry` must wait until the run planned so far is applied
/// ([`Planner::needs_apply`] for the operations it stands for), told
/// without converting it (its data stays where it is).
pub fn entry_needs_apply(planner: &Planner, entry: &Entry, planned: &[Op]) -> bool {
    let if_absent = matches!(entry.op, OpKind::CopyUp | OpKind::ChunkPut);
    // An elided write's snapshot sequence clones nothing here (it stays in
    // the entry for the history's sake: `Pg::touched`).
    if (!if_absent && entry.snap == 0) || entry.op == OpKind::Elided {
        return false;
    }
    let Ok(key) = store_key(entry) else { return false };
    planner.needs_apply(&key, if_absent, entry.snap, planned)
}

/// The store operation an entry of a one-operation kind stands for (its
/// data moves into the op); [`store_ops`] for any kind.
pub fn store_op(entry: Entry) -> Result<Op, ReplayError> {
    let key = store_key(&entry)?;
    let seq = entry.seq;
    let bad = move |e: duplex_proto::osd::DecodeError| ReplayError::BadOmap { seq, why: e.to_string() };
    Ok(match entry.op {
        // A copy-up is a write the planner drops if the object exists.
        OpKind::Write | OpKind::CopyUp => Op::Write { key, offset: entry.offset, data: entry.data },
        OpKind::Truncate => Op::Truncate { key, size: entry.offset },
        OpKind::Delete => Op::Delete { key },
        OpKind::SetAttr => {
            let mut name = entry.data;
            let split = (entry.offset as usize).min(name.len());
            let value = name.split_off(split);
            Op::SetAttr { key, name, value }
        }
        OpKind::RemoveAttr => Op::RemoveAttr { key, name: entry.data },
        OpKind::CreatePreallocated => Op::CreatePreallocated { key, size: entry.offset },
        OpKind::Zero => {
            let len = duplex_oplog::zero_length(&entry.data).ok_or(ReplayError::BadZero { seq: entry.seq })?;
            Op::Zero { key, offset: entry.offset, len }
        }
        OpKind::OmapSet => Op::OmapSet { key, entries: duplex_proto::omap::decode_entries(&entry.data).map_err(bad)? },
        OpKind::OmapRemove => Op::OmapRemove { key, keys: duplex_proto::omap::decode_keys(&entry.data).map_err(bad)? },
        OpKind::OmapRemoveRange => {
            let range = duplex_proto::omap::decode_range(&entry.data).map_err(bad)?;
            Op::OmapRemoveRange { key, start: range.start, end: range.end }
        }
        OpKind::ChunkPut | OpKind::ChunkUnref | OpKind::TierUpdate | OpKind::Elided => {
            return Err(ReplayError::BadOmap {
                seq: entry.seq,
                why: "a tier operation is several store operations, an elided write none".into(),
            })
        }
    })
}

/// Applies `entries` (in log order) to `partition`, [`REPLAY_BATCH`] per
/// batch. When it returns `Ok`, all of them are durable in the store and the
/// log may be trimmed through the last one. Returns how many were applied.
pub fn replay(entries: &[Entry], partition: &mut Partition) -> Result<usize, ReplayError> {
    debug_assert!(entries.windows(2).all(|w| w[0].seq < w[1].seq), "replay wants entries in log order");
    let mut rest = entries;
    while !rest.is_empty() {
        let mut planner = Planner::default();
        let mut ops = Vec::with_capacity(REPLAY_BATCH.min(rest.len()));
        let mut taken = 0;
        for entry in rest.iter().take(REPLAY_BATCH) {
            // Whether the object exists is up to the store after a
            // conditional delete of this run: apply the run first.
            if entry_needs_apply(&planner, entry, &ops) {
                break;
            }
            for (op, if_absent) in store_ops(entry.clone())? {
                planner
                    .push(partition, op, entry.snap, if_absent, &mut ops)
                    .map_err(|source| ReplayError::Store { seq: entry.seq, source })?;
            }
            taken += 1;
        }
        debug_assert!(taken > 0, "a fresh planner with nothing planned needs nothing applied first");
        let last = rest[taken - 1].seq;
        for batch in Batches::new(ops.into_iter(), REPLAY_BATCH, planner.cloned) {
            partition.apply(&batch).map_err(|source| ReplayError::Store { seq: last, source })?;
        }
        rest = &rest[taken..];
    }
    Ok(entries.len())
}

/// What an OSD does with the logs it found before it serves: applies each
/// PG's live entries to the store and trims them (the store holds them
/// now). Returns how many entries were replayed.
pub fn replay_recovered(recovered: &[(SharedPg, Vec<Entry>)], store: &mut Store) -> anyhow::Result<usize> {
    let mut replayed = 0usize;
    for (pg, entries) in recovered {
        let key = pg.lock().expect("PG lock").key;
        let partition = store.partition_mut(store.partition_of(&key.to_be_bytes()));
        replayed += replay_recovered_pg(pg, entries, partition)?;
    }
    Ok(replayed)
}

/// [`replay_recovered`] of one PG, whose objects `partition` holds.
pub fn replay_recovered_pg(pg: &SharedPg, entries: &[Entry], partition: &mut Partition) -> anyhow::Result<usize> {
    let mut guard = pg.lock().expect("PG lock");
    let key = guard.key;
    // The ids of entries flushed before the stop join the log's
    // (stored_requests.rs): the table is what later flushes record.
    let last = guard.last_seq();
    // A copy a recovery changed holds ids past its log's end (stored_interval.rs).
    let recovered = crate::pg::stored_interval::recovered(partition, key)
        .with_context(|| format!("reading the recovery mark of PG {key:#x}"))?;
    let ids_through = if recovered { u64::MAX } else { last };
    guard.load_stored_ids(partition, ids_through).with_context(|| format!("reading the request ids of PG {key:#x}"))?;
    // An erasure-coded tail past the apply limit stays in the log (and
    // its index) for peering to settle (Pg::apply_limit).
    let limit = guard.apply_limit;
    let applicable = entries.partition_point(|entry| entry.seq <= limit);
    let entries = &entries[..applicable];
    let replayed = replay(entries, partition).with_context(|| format!("replaying the log of PG {key:#x}"))?;
    if let (Some(first), Some(newest)) = (entries.first(), entries.last()) {
        // Their ids outlive the trim too.
        let batch = Batch { ops: guard.record_flushed_ids(partition.index(), first.seq..=newest.seq) };
        partition.apply(&batch).with_context(|| format!("recording the request ids of PG {key:#x}"))?;
        guard.trim(newest.seq).with_context(|| format!("trimming the log of PG {key:#x}"))?;
    }
    assert!(!guard.has_applicable_entries(), "PG {key:#x} serves with entries its replay left in the log");
    Ok(replayed)
}
