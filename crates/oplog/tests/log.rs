//! The log against a model: random appends (the ring wraps many times),
//! trims, rollbacks of the newest entries, "full" back-pressure and
//! reopens after a crash recover exactly the live entries, on both region
//! kinds (a rolled-back entry never comes back, even when the next append
//! is smaller than the entry it replaces). The index cache reads from the
//! log exactly the bytes the log determines.

use std::collections::VecDeque;

use duplex_oplog::{Entry, FileRegion, IndexCache, LogError, MmapRegion, OpKind, PgLog, Region};
use proptest::prelude::*;

fn entry(seq: u64, size: usize, fill: u8) -> Entry {
    Entry {
        pg: 7,
        epoch: 3,
        version: seq * 10,
        seq,
        op: OpKind::Write,
        object: b"obj".to_vec(),
        offset: seq,
        data: vec![fill; size],
        request: Default::default(),
        snap: 0,
    }
}

#[derive(Clone, Debug)]
enum Step {
    Append(usize),
    Trim(usize),
    /// Drop this many of the newest live entries.
    Truncate(usize),
    Reopen,
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    proptest::collection::vec(
        prop_oneof![
            6 => (0usize..1500).prop_map(Step::Append),
            2 => (0usize..8).prop_map(Step::Trim),
            1 => (0usize..4).prop_map(Step::Truncate),
            1 => Just(Step::Reopen)
        ],
        1..120,
    )
}

fn run<R: Region>(open: impl Fn() -> R, steps: Vec<Step>) -> Result<(), TestCaseError> {
    let (mut log, recovered) = PgLog::open(open(), 7).unwrap();
    prop_assert!(recovered.is_empty());
    let mut model: VecDeque<Entry> = VecDeque::new();
    for step in steps {
        match step {
            Step::Append(size) => {
                // Kinds whose data goes into their object's metadata, and some whose does not.
                let kinds = [OpKind::Write, OpKind::SetAttr, OpKind::OmapSet, OpKind::ChunkPut, OpKind::Zero];
                let e = Entry {
                    op: kinds[log.next_seq() as usize % kinds.len()],
                    ..entry(log.next_seq(), size, log.next_seq() as u8)
                };
                match log.append(&e) {
                    Ok(_) => model.push_back(e),
                    Err(LogError::Full) => {
                        // Back-pressure: flush (trim) the oldest half, then the append fits.
                        let through = model.get(model.len() / 2).map_or(0, |e| e.seq);
                        log.trim(through).unwrap();
                        model.retain(|m| m.seq > through);
                        if log.append(&e).is_ok() {
                            model.push_back(e);
                        } else {
                            let last = model.back().map_or(0, |m| m.seq);
                            log.trim(last).unwrap();
                            model.clear();
                            log.append(&e).unwrap();
                            model.push_back(e);
                        }
                    }
                    Err(other) => return Err(TestCaseError::fail(format!("{other}"))),
                }
            }
            Step::Trim(count) => {
                if let Some(e) = model.get(count.min(model.len().saturating_sub(1))) {
                    let through = e.seq;
                    log.trim(through).unwrap();
                    model.retain(|m| m.seq > through);
                }
            }
            Step::Truncate(count) => {
                let keep = model.len().saturating_sub(count);
                let after = model.get(keep).map_or(log.next_seq() - 1, |e| e.seq - 1);
                let dropped = log.truncate_after(after).unwrap();
                prop_assert_eq!(dropped, model.len() - keep);
                model.truncate(keep);
                prop_assert_eq!(log.next_seq(), after + 1);
            }
            Step::Reopen => {
                drop(log);
                let (reopened, recovered) = PgLog::open(open(), 7).unwrap();
                prop_assert_eq!(&recovered, &model.iter().cloned().collect::<Vec<_>>());
                log = reopened;
            }
        }
        prop_assert_eq!(
            log.entries().collect::<Result<Vec<_>, _>>().unwrap(),
            model.iter().cloned().collect::<Vec<_>>()
        );
        // What the OSD reserves in the store for the log: at least the live entries.
        let live: u64 = model.iter().map(|e| e.encoded_len() as u64).sum();
        prop_assert!(log.live_bytes() >= live && log.live_bytes() <= 16 << 10, "{} for {live}", log.live_bytes());
        prop_assert_eq!(log.live_bytes() == 0, model.is_empty());
        // What it reserves in the store's onodes: the live entries' metadata bytes, exactly.
        let metadata: u64 = model.iter().map(|e| e.op.metadata_bytes(e.data.len() as u64, e.offset)).sum();
        prop_assert_eq!(log.live_metadata_bytes(), metadata);
    }
    drop(log);
    let (_, recovered) = PgLog::open(open(), 7).unwrap();
    prop_assert_eq!(recovered, model.into_iter().collect::<Vec<_>>());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn mmap_log_matches_the_model(steps in steps()) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pg.log");
        run(|| MmapRegion::open(&path, 16 << 10, false).unwrap(), steps)?;
    }

    #[test]
    fn o_dsync_file_log_matches_the_model(steps in steps()) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pg.log");
        run(|| FileRegion::open(&path, 16 << 10).unwrap(), steps)?;
    }

    #[test]
    fn index_reads_exactly_what_the_log_determines(
        ops in proptest::collection::vec((0u8..10, 0u64..60, 1usize..40), 1..25),
        reads in proptest::collection::vec((0u64..80, 1u64..40), 1..10),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = PgLog::open(MmapRegion::open(&dir.path().join("pg.log"), 64 << 10, false).unwrap(), 1).unwrap();
        let mut index = IndexCache::default();
        // Model: per byte, Some(value) if the log determines it since the last truncate/delete.
        let mut known: Vec<Option<u8>> = vec![None; 200];
        for (kind, offset, len) in ops {
            let seq = log.next_seq();
            let (op, data) = match kind {
                0 => (OpKind::Delete, vec![]),
                1 => (OpKind::Truncate, vec![]),
                2 => (OpKind::SetAttr, b"name".to_vec()),
                _ => (OpKind::Write, (0..len).map(|i| (seq as u8).wrapping_mul(31).wrapping_add(i as u8)).collect()),
            };
            let e = Entry { pg: 1, epoch: 1, version: seq, seq, op, object: b"o".to_vec(), offset, data: data.clone(), request: Default::default(), snap: 0 };
            let at = log.append(&e).unwrap();
            index.insert(&e, at);
            match op {
                OpKind::Write => for (i, b) in data.iter().enumerate() { known[offset as usize + i] = Some(*b); },
                // Attributes leave the data as it was.
                OpKind::SetAttr => {}
                _ => known.iter_mut().for_each(|k| *k = None),
            }
        }
        for (offset, len) in reads {
            let expected: Option<Vec<u8>> = known[offset as usize..(offset + len) as usize].iter().copied().collect();
            prop_assert_eq!(index.read(&log, b"o", offset, len), expected);
        }
        index.trim(log.next_seq());
        prop_assert!(index.is_empty());
    }
}

#[test]
fn an_entry_larger_than_half_the_ring_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = PgLog::open(MmapRegion::open(&dir.path().join("pg.log"), 16 << 10, false).unwrap(), 7).unwrap();
    assert!(matches!(log.append(&entry(1, 9000, 1)), Err(LogError::TooLarge(_))));
    assert!(matches!(log.append(&entry(5, 10, 1)), Err(LogError::OutOfOrder { expected: 1, got: 5 })));
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let (mut log, _) = PgLog::open(MmapRegion::open(&dir.path().join("pg.log"), 16 << 10, false).unwrap(), 7).unwrap();
    let mut long = entry(1, 10, 1);
    long.object = vec![b'x'; 300];
    assert!(matches!(log.append(&long), Err(LogError::ObjectTooLong(300))));
    assert!(log.read(1 << 40).is_none());
    assert!(log.read(16 << 10).is_none());
}

#[test]
fn a_torn_header_write_leaves_the_previous_header() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pg.log");
    {
        let (mut log, _) = PgLog::open(MmapRegion::open(&path, 16 << 10, false).unwrap(), 7).unwrap();
        for seq in 1..=3 {
            log.append(&entry(seq, 100, seq as u8)).unwrap();
        }
        log.trim(1).unwrap(); // generation 2
    }
    // Tear generation 2's header: generation 1's must still be there.
    let mut region = MmapRegion::open(&path, 16 << 10, false).unwrap();
    for slot in [0u64, 64] {
        let header = region.read(slot, 64).to_vec();
        if u64::from_le_bytes(header[8..16].try_into().unwrap()) == 2 {
            region.write(slot + 20, &[0xFF; 20]).unwrap();
        }
    }
    let (_, entries) = PgLog::open(region, 7).unwrap();
    // From generation 1's tail: the trimmed entry comes back too (replay is idempotent), none is lost.
    assert_eq!(entries.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![1, 2, 3]);
}

#[test]
fn a_log_of_another_size_is_refused_not_cut() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pg.log");
    {
        let (mut log, _) = PgLog::open(MmapRegion::open(&path, 16 << 10, false).unwrap(), 7).unwrap();
        log.append(&entry(1, 100, 1)).unwrap();
    }
    assert!(MmapRegion::open(&path, 8 << 10, false).is_err());
    assert!(FileRegion::open(&path, 32 << 10).is_err());
    let (_, entries) = PgLog::open(MmapRegion::open(&path, 16 << 10, false).unwrap(), 7).unwrap();
    assert_eq!(entries.len(), 1);
}

#[test]
fn a_damaged_live_entry_is_an_error_not_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pg.log");
    let (mut log, _) = PgLog::open(MmapRegion::open(&path, 16 << 10, false).unwrap(), 7).unwrap();
    for seq in 1..=3 {
        log.append(&entry(seq, 100, seq as u8)).unwrap();
    }
    // A stray write into the shared memory, through another mapping of the file.
    let second = log.offsets().nth(1).unwrap();
    let mut stray = MmapRegion::open(&path, 16 << 10, false).unwrap();
    stray.write(second + 40, &[0xff; 8]).unwrap();
    let entries: Vec<_> = log.entries().collect();
    assert!(entries[0].is_ok() && entries[2].is_ok());
    assert!(matches!(entries[1], Err(LogError::Damaged { seq: 2 })), "{:?}", entries[1]);
}

#[test]
fn peering_sets_the_position_and_the_last_active_interval_durably() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pg.log");
    {
        let (mut log, _) = PgLog::open(MmapRegion::open(&path, 16 << 10, false).unwrap(), 7).unwrap();
        assert_eq!(log.last_active(), 0, "a new log was never active");
        for seq in 1..=5 {
            log.append(&entry(seq, 100, seq as u8)).unwrap();
        }
        log.trim(5).unwrap();
        // Entries 4 and 5 were divergent: the authority ends at 3.
        log.set_position(4, 3, 12).unwrap();
        assert_eq!((log.next_seq(), log.last_active(), log.last_epoch()), (4, 12, 3));
        let mut next = entry(4, 10, 9);
        next.epoch = 13;
        log.append(&next).unwrap();
        assert_eq!(log.last_epoch(), 13, "the newest live entry's");
        log.trim(4).unwrap();
        assert_eq!(log.last_active(), 12, "a trim keeps the interval");
    }
    let (log, entries) = PgLog::open(MmapRegion::open(&path, 16 << 10, false).unwrap(), 7).unwrap();
    assert!(entries.is_empty());
    assert_eq!((log.next_seq(), log.last_active(), log.last_epoch()), (5, 12, 13), "an empty log still names its end");
}
